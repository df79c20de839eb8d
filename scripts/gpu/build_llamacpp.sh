#!/usr/bin/env bash
# build_llamacpp.sh - builds the peer we compare against (llama.cpp, CUDA) on this machine and
# stages it for the GPU machine, so a device call can measure llama.cpp and deepinfer on the
# same card in the same run (remote.sh's `peer` step).
#
# The GPU machine has no network, so the build happens here. llama.cpp's source comes from PyPI
# (the only registry this machine reaches), vendored in the llama-cpp-python sdist, pinned by
# version and sha256 below; nothing of it is committed to this repository. The build is CUDA for
# sm_90 only (H100 / H200), shared libraries, the two benchmark tools (llama-batched-bench,
# llama-bench; one patch, see below), plus convert_hf_to_gguf.py and gguf-py to turn the
# mkmodel-made benchmark model into a GGUF on the device (with DeepSeek-V3's tokenizer from
# tests/data/tokenizers, which travels with the checkout).
#
# Output: .peer/ (ignored by git):
#   VERSION            what was built
#   tools.tar.xz       bin/{llama-batched-bench,llama-bench}, lib/ (all but the CUDA library's file),
#                      py/{convert_hf_to_gguf.py,conversion,gguf-py} (~3 MB)
#   cuda.xz.00, .01    lib/libggml-cuda.so.* (~40 MB) xz-compressed and cut in two (~9 MB each);
#                      cuda.name: that file's name
# remote.sh's `peer` step unpacks them in place. Why in pieces: a device call's working tree is
# limited to 64 MiB and the checkout alone holds ~49 MB, so the peer travels over two calls on
# the same warm machine (docs/cuda.md, "Device workflow": the first call carries tools.tar.xz and
# cuda.xz.00 and converts the model, the second carries cuda.xz.01 and benchmarks).
# Takes ~30-60 minutes on 2 cores (the CUDA template instances); rerun only when the pin moves.
#
# Usage: bash scripts/gpu/build_llamacpp.sh [jobs]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PY_PKG=llama_cpp_python
PY_VERSION=0.3.36
PY_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
JOBS=${1:-$(nproc)}
WORK=${PEER_WORK:-/tmp/deepinfer-peer}
OUTDIR="$ROOT/.peer"

mkdir -p "$WORK"
TARBALL="$WORK/$PY_PKG-$PY_VERSION.tar.gz"
if [ ! -f "$TARBALL" ]; then
    python3 -m pip --version >/dev/null 2>&1 ||
        { echo "build_llamacpp.sh: needs pip to fetch the source (apt-get install python3-pip)" >&2; exit 1; }
    python3 -m pip download --no-binary :all: --no-deps --dest "$WORK" "llama-cpp-python==$PY_VERSION"
fi
echo "$PY_SHA256  $TARBALL" | sha256sum -c -
SRC="$WORK/$PY_PKG-$PY_VERSION/vendor/llama.cpp"
[ -d "$SRC" ] || tar -xzf "$TARBALL" -C "$WORK"
command -v nvcc >/dev/null || { echo "build_llamacpp.sh: nvcc not found (CUDA toolkit needed)" >&2; exit 1; }
COMMIT=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)
# One change to the source: llama.cpp tells DeepSeek-V2-Lite (no q-LoRA) from V2 by its layer
# count (26 or 27) and otherwise requires the q_lora_rank key, which the 8-layer benchmark model
# cannot have. Make the key optional (absent = no q-LoRA, as the rest of its loader already
# reads n_lora_q == 0); nothing else about the model or its kernels changes.
M="$SRC/src/models/deepseek2.cpp"
if ! grep -q 'deepinfer: optional' "$M"; then
    sed -i 's|ml.get_key(LLM_KV_ATTENTION_Q_LORA_RANK, hparams.n_lora_q);|ml.get_key(LLM_KV_ATTENTION_Q_LORA_RANK, hparams.n_lora_q, false); // deepinfer: optional|' "$M"
    grep -q 'deepinfer: optional' "$M" || { echo "build_llamacpp.sh: the q_lora_rank patch did not apply to $M" >&2; exit 1; }
fi

BUILD="$WORK/build"
# ggml-cuda calls the driver API (libcuda.so.1), which this GPU-less machine lacks: link the
# executables against the toolkit's stub under that name (the GPU machine's driver serves it)
CUDA_LIB=$(dirname "$(readlink -f "$(command -v nvcc)")")/../lib64
mkdir -p "$WORK/stubs"
ln -sf "$CUDA_LIB/stubs/libcuda.so" "$WORK/stubs/libcuda.so.1"
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DCMAKE_BUILD_RPATH='$ORIGIN/../lib' \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$WORK/stubs" >"$WORK/configure.log"
cmake --build "$BUILD" -j "$JOBS" --target llama-batched-bench llama-bench

rm -rf "$OUTDIR"
STAGE="$WORK/stage"
rm -rf "$STAGE"
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/py" "$OUTDIR"
cp "$BUILD/bin/llama-batched-bench" "$BUILD/bin/llama-bench" "$STAGE/bin/"
find "$BUILD" -name '*.so*' \( -type f -o -type l \) -exec cp -P {} "$STAGE/lib/" \;
strip --strip-unneeded "$STAGE/bin/"* "$STAGE"/lib/*.so* 2>/dev/null || true
cp "$SRC/convert_hf_to_gguf.py" "$STAGE/py/"
[ -d "$SRC/conversion" ] && cp -r "$SRC/conversion" "$STAGE/py/"
cp -r "$SRC/gguf-py" "$STAGE/py/"
CUDA_SO=$(cd "$STAGE/lib" && find . -name 'libggml-cuda.so*' -type f | sed 's|^\./||')
(cd "$STAGE" && tar -cf - --exclude="lib/$CUDA_SO" bin lib py | xz -9e -T"$JOBS" >"$OUTDIR/tools.tar.xz")
xz -9e -T"$JOBS" -c "$STAGE/lib/$CUDA_SO" >"$WORK/cuda.xz"
split -n 2 -d "$WORK/cuda.xz" "$OUTDIR/cuda.xz."
echo "$CUDA_SO" >"$OUTDIR/cuda.name"
printf 'llama.cpp %s (vendored in %s %s from PyPI; q_lora_rank optional), CUDA sm_90, built %s\n' \
    "$COMMIT" "$PY_PKG" "$PY_VERSION" "$(date -u +%Y-%m-%dT%H:%MZ)" >"$OUTDIR/VERSION"
cat "$OUTDIR/VERSION"
ls -la "$OUTDIR"
