#!/usr/bin/env bash
# scripts/gpu/remote.sh - runs on the GPU machine, over the tree staged by scripts/gpu/build.sh:
# the CPU-vs-CUDA op parity tests, the golden-logits and greedy-generation checks on the GPU,
# the op benchmarks (ceilings, MLA decode, small GEMMs, MoE) and the end-to-end benchmark on the
# v2lite-8l model, which it generates there with `deepinfer mkmodel` (never carried).
#
# usage (from the repository root):  bash .gpu/src/scripts/gpu/remote.sh [STEP ...]
#   steps: info ops attn model bench e2e compare    (default: info ops attn model bench e2e)
#   env:   OUT (logs; default /tmp/gpu-out), DI_GPU_TMP (scratch; default /tmp/di-gpu),
#          BENCH_ARGS (extra bench_cuda_e2e arguments), STEP_TIMEOUT (seconds per step, 300)
# Output: $OUT/summary.txt (one line per step with its exit code and time), $OUT/tests.log,
# $OUT/bench.log, $OUT/sanitizer.log (compute-sanitizer rerun of a step that faulted).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
G=$(cd "$here/../../.." && pwd)
[ -x "$G/bin/deepinfer" ] || G=$(pwd)/.gpu
[ -x "$G/bin/deepinfer" ] || { echo "remote.sh: no staged tree (run scripts/gpu/build.sh and carry .gpu)" >&2; exit 1; }
OUT=${OUT:-/tmp/gpu-out}
TMP=${DI_GPU_TMP:-/tmp/di-gpu}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
mkdir -p "$OUT" "$TMP"

# cuBLASLt 13 from the machine's own CUDA install (not shipped)
lt=$(ldconfig -p 2>/dev/null | awk '/libcublasLt\.so\.13/ { print $NF; exit }')
if [ -z "$lt" ]; then
    lt=$(find /usr/local /usr/lib /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
fi
export LD_LIBRARY_PATH="$G/lib${lt:+:$(dirname "$lt")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DI_SOURCE_DIR="$G/src" DI_BIN="$G/bin/deepinfer" DI_BUILD_DIR="$TMP"
cd "$G/src"

summary() { echo "$*" | tee -a "$OUT/summary.txt"; }

# run_step NAME LOG CMD...: time-limited, output appended to LOG; a device fault is rerun under
# compute-sanitizer (memcheck) into sanitizer.log so one call both finds and locates it
run_step() {
    local name=$1 log=$2
    shift 2
    echo "==== $name: $*" >>"$OUT/$log"
    local t0=$(date +%s%N)
    timeout -k 10 "$STEP_TIMEOUT" "$@" >>"$OUT/$log" 2>&1
    local rc=$?
    local ms=$((($(date +%s%N) - t0) / 1000000))
    summary "$(printf '%-28s rc=%-3s %4d.%03ds' "$name" "$rc" $((ms / 1000)) $((ms % 1000)))"
    if [ "$rc" -ne 0 ] && tail -n 60 "$OUT/$log" | grep -qiE 'illegal|misaligned|out of bounds|unspecified launch|cuda backend:'; then
        if command -v compute-sanitizer >/dev/null; then
            echo "==== $name under compute-sanitizer" >>"$OUT/sanitizer.log"
            timeout -k 10 240 compute-sanitizer --tool memcheck --print-limit 20 "$@" 2>&1 | head -n 300 >>"$OUT/sanitizer.log"
        fi
    fi
    return 0
}

steps=${*:-info ops attn model bench e2e}
for s in $steps; do
    case $s in
    info)
        {
            date -u
            nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
            echo "cublasLt: ${lt:-not found}"
            nproc
        } >>"$OUT/summary.txt" 2>&1
        ;;
    ops)
        for g in rows gemm bmm graph; do run_step "ops.$g" tests.log "$G/bin/test_cuda_ops" "$g"; done
        ;;
    attn)
        for g in decode prefill route experts sample; do run_step "attn.$g" tests.log "$G/bin/test_cuda_attn" "$g"; done
        ;;
    model)
        run_step model.golden tests.log "$G/bin/test_cuda_model" golden
        run_step model.generate tests.log "$G/bin/test_cuda_model" generate
        run_step model.routing tests.log "$G/bin/test_cuda_model" routing
        ;;
    bench)
        run_step bench.ops bench.log "$G/bin/bench_cuda_ops"
        ;;
    e2e | compare)
        if [ ! -f "$TMP/v2lite-8l/config.json" ]; then
            run_step mkmodel.v2lite-8l bench.log "$G/bin/deepinfer" mkmodel --preset v2lite-8l --seed 1 --out "$TMP/v2lite-8l"
        fi
        if [ "$s" = e2e ]; then
            # shellcheck disable=SC2086
            run_step bench.e2e bench.log "$G/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" ${BENCH_ARGS:-}
            if [ -n "${E2E_VARIANTS:-}" ]; then # what the batched-cuBLASLt experts and the graphs buy
                echo "(variant: DEEPINFER_CUDA_MOE_LT=0)" >>"$OUT/bench.log"
                DEEPINFER_CUDA_MOE_LT=0 run_step bench.e2e.no-moe-lt bench.log "$G/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" --prefill 512
                echo "(variant: DEEPINFER_CUDA_GRAPHS=0)" >>"$OUT/bench.log"
                DEEPINFER_CUDA_GRAPHS=0 run_step bench.e2e.no-graphs bench.log "$G/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" --prefill 512
            fi
        else
            run_step model.compare tests.log "$G/bin/test_cuda_model" compare "$TMP/v2lite-8l"
        fi
        ;;
    *) summary "unknown step $s" ;;
    esac
done
# the last lines of each log, so the call's own output shows the outcome
for f in tests.log bench.log; do
    [ -f "$OUT/$f" ] && { echo "---- $f (failures and tables)"; grep -E 'FAIL|failed|ceiling|tok/s|of roofline|checks,|golden:|generate:|routing|==== ' "$OUT/$f" | tail -n 150; }
done
echo "---- summary"
cat "$OUT/summary.txt"
