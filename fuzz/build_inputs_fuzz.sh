#!/usr/bin/env bash
# Builds the libFuzzer targets of what users hand the engine (clang 14 with libclang-rt-14-dev)
# into build-fuzz/:
#   build-fuzz/fuzz_inputs   safetensors files, config.json, `generate --input` request lines
#   build-fuzz/fuzz_engine   request lines run on a tiny generated model beside a control request
# Run e.g.: build-fuzz/fuzz_inputs -max_total_time=60 -rss_limit_mb=4096 fuzz/corpus/inputs
#           build-fuzz/fuzz_engine -max_total_time=60 -rss_limit_mb=4096 -dict=fuzz/inputs.dict fuzz/corpus/engine
# (seed corpora: fuzz/seed_inputs.py and fuzz/seed_engine.py remake them). Arguments: the targets
# to build (default both).
set -euo pipefail
cd "$(dirname "$0")/.."
CC=${CC:-clang-14}
OUT=build-fuzz
mkdir -p "$OUT"
# the library's C sources (the engine, model, CPU backend, tokenizer, recipe, mkmodel); no CLI,
# no CUDA
SRCS=$(find src -name '*.c' -not -path 'src/cli/*' | sort)
FLAGS="-g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc"
LIBS="$(pkg-config --cflags --libs jansson libpcre2-8 libutf8proc) -lpthread -lm"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_inputs fuzz_engine)
for t in "${targets[@]}"; do
    # shellcheck disable=SC2086
    $CC $FLAGS "fuzz/$t.c" $SRCS $LIBS -o "$OUT/$t"
    echo "built $OUT/$t"
done
