#!/usr/bin/env bash
# scripts/gpu/build.sh - build the CUDA variant on this (GPU-less) machine and stage everything
# the GPU machine needs into one ignored folder, DEST (default: .gpu in the repo root):
#   DEST/bin/   deepinfer, the GPU tests (test_cuda_*), the CUDA benchmarks (bench_cuda_*),
#               linked with RPATH $ORIGIN/../lib
#   DEST/lib/   the Debian shared libraries they need (jansson, pcre2-8, utf8proc; found by ldd), and
#               CUPTI (bench_cuda_e2e --trace; the GPU machine's toolkit may lack it)
#   DEST/src/   a source-tree stand-in: tests/data/golden, tests/data/golden_pycoder (manifest and
#               the unpacked logits), tests/data/ppl/slice.json, scripts/gpu (remote.sh) and
#               tools/golden/{hf_bf16_error,hf_greedy_agreement,checksum}.py (remote.sh's `hf` and
#               `hfgreedy` steps)
# bin/, lib/ and the data are then packed into DEST/bundle.tar.xz (~4 MB instead of ~45 MB: every
# binary holds the same CUDA code, which xz's window stores once) and only DEST/src/scripts stays
# unpacked; remote.sh unpacks the bundle in place. DI_GPU_NO_BUNDLE=1 keeps the plain tree.
# The trained model models/pycoder-moe is not staged: it travels with the checkout.
# cuBLASLt is NOT shipped (500 MB): remote.sh finds the GPU machine's own.
# Then, on the GPU machine, from the repository root:  bash DEST/src/scripts/gpu/remote.sh [what]
# (with the device tool: carry DEST; see docs/cuda.md "Device workflow").
#
# usage: scripts/gpu/build.sh [DEST]          env: DI_GPU_BUILD (build dir, default build-gpu),
#        DI_GPU_BASE_BENCH (a bench_cuda_e2e built from another commit, staged as bench_cuda_e2e_base),
#        DI_GPU_BINS (stage only these binaries and no test data, e.g. "bench_cuda_e2e": a ~4 MB
#        tree to carry beside .peer for remote.sh's e2e and peer steps; deepinfer is always staged,
#        remote.sh makes the benchmark model with it)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$root/.gpu}
build=${DI_GPU_BUILD:-$root/build-gpu}
command -v nvcc >/dev/null || { echo "build.sh: nvcc not found (CUDA toolkit needed to build the CUDA variant)" >&2; exit 1; }
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDI_CUDA=ON '-DCMAKE_BUILD_RPATH=$ORIGIN/../lib' >/dev/null
cmake --build "$build" -j "$(nproc)"
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/src/tests/data" "$dest/src/scripts/gpu"
if [ -n "${DI_GPU_BINS:-}" ]; then
    cp "$build/bin/deepinfer" "$dest/bin/"
    for b in $DI_GPU_BINS; do cp "$build/gpu/$b" "$dest/bin/" 2>/dev/null || cp "$build/bench/$b" "$dest/bin/"; done
else
    cp "$build/bin/deepinfer" "$build"/gpu/test_cuda_* "$build"/bench/bench_cuda_* "$dest/bin/"
fi
# the Debian libraries any staged binary needs (the linker drops unused ones, so ask ldd)
for bin in "$dest"/bin/*; do
    ldd "$bin" | awk '$1 ~ /^lib(jansson|pcre2-8|utf8proc|cupti)\.so/ && $3 ~ /^\// { print $3 }'
done | sort -u | while read -r path; do cp -L "$path" "$dest/lib/$(basename "$path")"; done
[ -f "$dest/lib/libjansson.so.4" ] || { echo "build.sh: libjansson not found by ldd" >&2; exit 1; }
cp "$root"/scripts/gpu/*.sh "$root"/scripts/gpu/*.py "$dest/src/scripts/gpu/"
if [ -z "${DI_GPU_BINS:-}" ]; then
    cp -r "$root/tests/data/golden" "$dest/src/tests/data/"
    mkdir -p "$dest/src/tests/data/golden_pycoder" "$dest/src/tests/data/ppl"
    cp "$root/tests/data/golden_pycoder/golden_pycoder.json" "$build"/tests/data/golden_pycoder/*.bin \
        "$dest/src/tests/data/golden_pycoder/"
    cp "$root/tests/data/ppl/slice.json" "$dest/src/tests/data/ppl/"
    mkdir -p "$dest/src/tools/golden" "$dest/src/tools/train"
    cp "$root/tools/golden/hf_bf16_error.py" "$root/tools/golden/hf_greedy_agreement.py" "$root/tools/golden/checksum.py" \
        "$root/tools/golden/make_golden.py" \
        "$dest/src/tools/golden/"
    cp "$root/tools/train/export.py" "$dest/src/tools/train/"
fi
# a baseline benchmark binary to compare against in the same call (remote.sh `variants`)
[ -n "${DI_GPU_BASE_BENCH:-}" ] && cp "$DI_GPU_BASE_BENCH" "$dest/bin/bench_cuda_e2e_base"
if [ "${DI_GPU_NO_BUNDLE:-0}" != 1 ]; then
    (cd "$dest" && tar -cf - bin lib src/tests | xz -9 -T1 >bundle.tar.xz && rm -rf bin lib src/tests)
fi
echo "staged $(du -sh "$dest" | cut -f1) into $dest"
