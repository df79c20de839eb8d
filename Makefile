# deepinfer top-level Makefile: thin wrapper around CMake.
#   make demo   install missing Debian packages, build, make/find the demo model, generate text
#   make test   install missing Debian packages, build (CUDA backend too when nvcc exists),
#               run every ctest test, then the unit tests again under ASan+UBSan
# Other targets: build, asan, clean. The GPU build for the device machine: scripts/gpu/build.sh.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
CMAKE_FLAGS ?=

.PHONY: all deps build demo test test-release test-asan asan clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)/bin/deepinfer

test: build
	@$(MAKE) --no-print-directory test-release test-asan

test-release:
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

asan:
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DDI_SANITIZE=ON -DDI_CUDA=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

test-asan: asan
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -L unit

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
