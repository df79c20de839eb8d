#!/usr/bin/env bash
# build_llamacpp.sh - builds the peer we compare against (llama.cpp, CUDA) on this machine and
# stages it for the GPU machine, so a device call can measure llama.cpp and deepinfer on the
# same card in the same run (remote.sh's `peer` step).
#
# The GPU machine has no network, so the build happens here. llama.cpp's source comes from PyPI
# (the only registry this machine reaches), vendored in the llama-cpp-python sdist, pinned by
# version and sha256 below; nothing of it is committed to this repository. The build is CUDA for
# sm_90 only (H100 / H200), shared libraries, the two benchmark tools (llama-batched-bench,
# llama-bench), plus convert_hf_to_gguf.py and gguf-py to turn the mkmodel-made benchmark model
# into a GGUF on the device.
#
# Output: .peer/ (ignored by git): .peer/VERSION (what was built) and .peer/bundle.tar.xz holding
#   bin/{llama-batched-bench,llama-bench}  lib/*.so*  py/{convert_hf_to_gguf.py,conversion,gguf-py}
#   tokenizers/deepseek-v3/ (for the converter)
# remote.sh's `peer` step unpacks the bundle in place. The device call's working tree is limited
# to 64 MiB and the checkout alone holds ~49 MB, so carry .peer beside a small staged tree
# (DI_GPU_BINS=bench_cuda_e2e bash scripts/gpu/build.sh .gpu-e2e), not beside the full .gpu.
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
    pip download --no-binary :all: --no-deps --dest "$WORK" "llama-cpp-python==$PY_VERSION"
fi
echo "$PY_SHA256  $TARBALL" | sha256sum -c -
SRC="$WORK/$PY_PKG-$PY_VERSION/vendor/llama.cpp"
[ -d "$SRC" ] || tar -xzf "$TARBALL" -C "$WORK"
COMMIT=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)

BUILD="$WORK/build"
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DCMAKE_BUILD_RPATH='$ORIGIN/../lib' >"$WORK/configure.log"
cmake --build "$BUILD" -j "$JOBS" --target llama-batched-bench llama-bench

rm -rf "$OUTDIR"
mkdir -p "$OUTDIR/bin" "$OUTDIR/lib" "$OUTDIR/py"
cp "$BUILD/bin/llama-batched-bench" "$BUILD/bin/llama-bench" "$OUTDIR/bin/"
find "$BUILD" -name '*.so*' \( -type f -o -type l \) -exec cp -P {} "$OUTDIR/lib/" \;
strip --strip-unneeded "$OUTDIR/bin/"* "$OUTDIR"/lib/*.so* 2>/dev/null || true
cp "$SRC/convert_hf_to_gguf.py" "$OUTDIR/py/"
[ -d "$SRC/conversion" ] && cp -r "$SRC/conversion" "$OUTDIR/py/"
cp -r "$SRC/gguf-py" "$OUTDIR/py/"
# DeepSeek-V3's real tokenizer for the converter (it recognises the pre-tokenizer by hashing
# what the model's tokenizer makes of a test text; mkmodel's generated one is unknown to it)
tar -xJf tests/data/tokenizers/tokenizers.tar.xz -C "$OUTDIR" tokenizers/deepseek-v3
(cd "$OUTDIR" && tar -cf - bin lib py tokenizers | xz -9e -T"$JOBS" >bundle.tar.xz && rm -rf bin lib py tokenizers)
printf 'llama.cpp %s (vendored in %s %s from PyPI), CUDA sm_90, built %s\n' \
    "$COMMIT" "$PY_PKG" "$PY_VERSION" "$(date -u +%Y-%m-%dT%H:%MZ)" >"$OUTDIR/VERSION"
cat "$OUTDIR/VERSION"
du -sh "$OUTDIR"
