#!/usr/bin/env bash
# scripts/gpu/remote.sh - runs on the GPU machine, over the tree staged by scripts/gpu/build.sh:
# the CPU-vs-CUDA op parity tests, the golden-logits and greedy-generation checks on the GPU
# (random tiny models, and the trained models/pycoder-moe), the engine with device sampling, the
# op benchmarks (ceilings, MLA decode, small GEMMs, MoE) and the end-to-end benchmarks on the
# v2lite-8l model (bench_cuda_e2e and `deepinfer generate`), which it generates there with
# `deepinfer mkmodel` (never carried).
#
# usage (from the repository root):  bash .gpu/src/scripts/gpu/remote.sh [STEP ...]
#   steps: info pycoder ops attn small ropekv model modelvariants bench e2e variants breakdown decode
#          engine compare hf e2ebase pbreakdown pkernel
#          f32 (the fp32 op table: test_cuda_f32 F32_GROUPS, then test_cuda_model golden-f32 and
#              generate-f32, F32_MODEL_GROUPS, and test_cuda_pycoder golden-f32 greedy-f32,
#              F32_PYCODER_GROUPS)
#          moelt (decode with each DEEPINFER_CUDA_MOE_LT value; MOELT_VALUES, MOELT_BATCHES,
#              MOELT_NCU: values whose batch-16 step also runs under ncu)
#          benchv32 (bench_cuda_ops v32: V3.2 indexer / sparse MLA times)
#          pfbench (bench_cuda_ops prefill: MLA prefill at 512 and 8192 tokens, every variant)
#          benchv32base (the same from another staged tree V32_BASE, e.g. main's carried as
#              .gpu-v32, for before/after numbers in one call); modelv32: test_cuda_model v32 only
#          benchv32sp: benchv32 with DEEPINFER_CUDA_SPARSE_MIN_TILES = each of SPARSE_TILES (1 2 8)
#          attnsp1: test_cuda_attn indexer with DEEPINFER_CUDA_SPARSE_MIN_TILES=1 (up to 64 splits)
#          mlabench (bench_cuda_ops mladec: MLA decode at V3 / 64-head / V2-Lite shapes, and the
#          V3 shapes with DEEPINFER_CUDA_MLA_WGMMA=0: before / after in one call; then one-token
#          decode + W_UV at 256-32K context, default vs DEEPINFER_CUDA_MLA_WIDE=0)
#          smpbench (bench_cuda_ops sample: the device sampler, 1 / 16 / 64 / 256 rows, six settings)
#          l2pin (bench_cuda_l2pin L2PIN_ARGS: does a persisting L2 window survive a step's streaming)
#          pdljoin (bench_cuda_pdl_join: when a PDL kernel after a join of two lanes starts)
#          ltsearch (bench_cuda_lt: cuBLASLt's configurations for the 8-16-row bf16 GEMMs, LT_T rows
#              (16), at most LT_MAX (400) timed per shape -> lt.txt)
#          (default: info pycoder ops attn model bench e2e engine)
#          trace: the GPU timeline of decode steps in graph replay (CUPTI; trace.txt; TRACE_BATCHES,
#              TRACE_STEPS, TRACE_ENV: settings, several separated by '|')
#          dkernel: ncu sections of the decode kernels matching DKERNEL (dkernel.txt);
#          abvar: A/B of environment settings (AB_VARIANTS separated by '|', AB_ROUNDS, AB_ARGS,
#          AB_DECODE=1 adds bench_cuda_decode moe (AB_DECODE_ARGS, e.g. "moe --fp8"); AB_BASE: another staged tree's bench_cuda_e2e
#          as the first variant), each variant's bench_cuda_e2e in alternation;
#          ropekv: batch-1 decode with and without the fused rope + cache write
#          (DEEPINFER_CUDA_ROPE_KV=0);
#          model: test_cuda_model limits, v32 (DeepSeek-V3.2 sparse attention), golden, generate, async and routing;
#          small: the 1-4-token expert kernels' parity; modelvariants: test_cuda_model generate
#          and routing with DEEPINFER_CUDA_PDL=1 / 0 and DEEPINFER_CUDA_MOE_SMALL=0; decode: bench_cuda_decode (GEMVs and
#          experts of small steps, bf16 and fp8, with PDL off and other split-K settings); variants: batch-1/16 decode with
#          DEEPINFER_CUDA_MOE_SMALL / DEEPINFER_CUDA_PDL off, and a staged baseline binary
#          (bin/bench_cuda_e2e_base) if any; breakdown: per-kernel times of one decode step under
#          ncu (breakdown.txt; scripts/gpu/breakdown.py); pbreakdown: the same for one prefill
#          of PBREAKDOWN_LEN (8192) tokens; pkernel: ncu sections of the kernels matching PKERNEL
#          (default k_gemm_wgmma) in that prefill (pkernel.txt)
#          pfbench: bench_cuda_ops prefill (MLA prefill at 512 and 8192 tokens with every
#          variant of the fast attention kernel)
#          hf: tools/golden/hf_bf16_error.py, transformers running the golden checkpoints in bf16
#              and fp32 on the GPU vs the committed fp32 goldens (needs python3 with torch and
#              transformers on the machine) -> hf.log, hf_bf16.json
#          hfgreedy: tools/golden/hf_greedy_agreement.py, transformers' own greedy agreement in bf16
#              vs fp32 on the pycoder greedy prompts, beside deepinfer's CPU and CUDA outputs
#              (runs `test_cuda_pycoder greedy` first unless its outputs exist) -> hf.log
#          peer: llama.cpp on the same card and model (staged by scripts/gpu/build_llamacpp.sh into
#              .peer, carried in pieces over two calls): v2lite-8l converted to GGUF here, then
#              llama-batched-bench at PEER_NPL sequences (prompt 128, 128 new tokens) and
#              llama-bench pp512 -> bench.log; scripts/gpu/peer_ratio.py: the ratios against the
#              call's e2e runs -> peer.txt
#          e2ebase: bench_cuda_e2e of another staged tree E2E_BASE (e.g. a build of main carried
#              as .gpu-base) with the same BENCH_ARGS, for before/after numbers in one call
#   env:   OUT (logs; default /tmp/gpu-out), DI_GPU_TMP (scratch; default /tmp/di-gpu),
#          BENCH_ARGS (extra bench_cuda_e2e arguments), STEP_TIMEOUT (seconds per step, 300),
#          DEADLINE (seconds from the start after which no step starts and running steps are
#          cut; 0 = none), ENGINE_BATCHES (default "1 16 64 256"), ENGINE_HOST=0 (skip the
#          host-sampling runs of the engine step), ENGINE_MODEL / ENGINE_DEVICE (default: the
#          v2lite-8l made here, cuda; a tiny model and cpu dry-run the step on any machine),
#          PYCODER_TIMEOUT / ENGINE_TIMEOUT (seconds per step of those groups; 120 / 90),
#          PYCODER_GROUPS / ATTN_GROUPS / OPS_GROUPS / MODEL_GROUPS (subsets of those tests' groups),
#          HF_TIMEOUT (seconds of the hf step; 240), E2E_BASE (staged tree of e2ebase)
# Output: $OUT/summary.txt (one line per step with its exit code and time), $OUT/tests.log,
# $OUT/bench.log, $OUT/sanitizer.log (compute-sanitizer rerun of a step that faulted).
# The staged binaries may come packed in DEST/bundle.tar.xz (build.sh does that: the CUDA code
# in every binary is the same, and xz's window removes the repeats); it is unpacked in place.
set -uo pipefail
CALLER_PWD=$(pwd)
here=$(cd "$(dirname "$0")" && pwd)
G=$(cd "$here/../../.." && pwd)
[ -f "$G/bundle.tar.xz" ] || [ -x "$G/bin/deepinfer" ] || G=$(pwd)/.gpu
if [ -f "$G/bundle.tar.xz" ] && [ ! -x "$G/bin/deepinfer" ]; then
    tar -xJf "$G/bundle.tar.xz" -C "$G" 2>/dev/null ||
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$G/bundle.tar.xz" "$G"
fi
[ -x "$G/bin/deepinfer" ] || { echo "remote.sh: no staged tree (run scripts/gpu/build.sh and carry .gpu)" >&2; exit 1; }
ROOT=$(cd "$G/.." && pwd)
OUT=${OUT:-/tmp/gpu-out}
TMP=${DI_GPU_TMP:-/tmp/di-gpu}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
DEADLINE=${DEADLINE:-0}
T_START=$(date +%s)
mkdir -p "$OUT" "$TMP"

# cuBLASLt 13 from the machine's own CUDA install (not shipped)
lt=$(ldconfig -p 2>/dev/null | awk '/libcublasLt\.so\.13/ { print $NF; exit }')
if [ -z "$lt" ]; then
    lt=$(find /usr/local /usr/lib /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
fi
export LD_LIBRARY_PATH="$G/lib${lt:+:$(dirname "$lt")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DI_SOURCE_DIR="$G/src" DI_BIN="$G/bin/deepinfer" DI_BUILD_DIR="$TMP"
# the trained model travels with the checkout; its golden logits are staged unpacked
[ -d "$ROOT/models/pycoder-moe" ] && export DI_PYCODER_MODEL="$ROOT/models/pycoder-moe"
export DI_GOLDEN_PYCODER_DIR="$G/src/tests/data/golden_pycoder"
cd "$G/src"

summary() { echo "$*" | tee -a "$OUT/summary.txt"; }

# run_step NAME LOG CMD...: time-limited, output appended to LOG; a device fault is rerun under
# compute-sanitizer (memcheck) into sanitizer.log so one call both finds and locates it
# seconds a step may take: STEP_TIMEOUT, cut to what DEADLINE leaves (0: do not start)
step_limit() {
    local lim=$1
    if [ "$DEADLINE" -gt 0 ]; then
        local left=$((DEADLINE - ($(date +%s) - T_START) - 5))
        [ "$left" -lt "$lim" ] && lim=$left
        [ "$lim" -lt 10 ] && lim=0
    fi
    echo "$lim"
}

run_step() {
    local name=$1 log=$2
    shift 2
    local lim
    lim=$(step_limit "$STEP_TIMEOUT")
    if [ "$lim" -le 0 ]; then
        summary "$(printf '%-28s skipped (deadline)' "$name")"
        return 0
    fi
    echo "==== $name: $*" >>"$OUT/$log"
    local t0=$(date +%s%N)
    timeout -k 5 "$lim" "$@" >>"$OUT/$log" 2>&1
    local rc=$?
    LAST_RC=$rc
    local ms=$((($(date +%s%N) - t0) / 1000000))
    summary "$(printf '%-28s rc=%-3s %4d.%03ds' "$name" "$rc" $((ms / 1000)) $((ms % 1000)))"
    if [ "$rc" -ne 0 ] && tail -n 60 "$OUT/$log" | grep -qiE 'illegal|misaligned|out of bounds|unspecified launch|cuda backend:'; then
        lim=$(step_limit 240)
        if command -v compute-sanitizer >/dev/null && [ "$lim" -gt 0 ]; then
            echo "==== $name under compute-sanitizer" >>"$OUT/sanitizer.log"
            timeout -k 5 "$lim" compute-sanitizer --tool memcheck --print-limit 20 "$@" 2>&1 | head -n 300 >>"$OUT/sanitizer.log"
        fi
    fi
    return 0
}

# v2lite-8l (DeepSeek-V2-Lite shapes, 8 layers, V3 vocabulary; ~9.4 GB), made here once
v2lite() {
    if [ ! -f "$TMP/v2lite-8l/config.json" ]; then
        run_step mkmodel.v2lite-8l bench.log "$G/bin/deepinfer" mkmodel --preset v2lite-8l --seed 1 --out "$TMP/v2lite-8l"
    fi
    [ -f "$TMP/v2lite-8l/config.json" ]
}

steps=${*:-info pycoder ops attn model bench e2e engine}
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
        for g in ${OPS_GROUPS:-rows gemm bmm graph lanes}; do run_step "ops.$g" tests.log "$G/bin/test_cuda_ops" "$g"; done
        ;;
    f32)
        # the fp32 op table (`--dtype f32`): op parity with the CPU at fp32 tolerances, then the
        # golden logits and greedy generations through it
        for g in ${F32_GROUPS:-rows gemm route experts decode prefill indexer graph}; do
            run_step "f32.$g" tests.log "$G/bin/test_cuda_f32" "$g"
        done
        for g in ${F32_MODEL_GROUPS:-golden-f32 generate-f32}; do run_step "model.$g" tests.log "$G/bin/test_cuda_model" "$g"; done
        for g in ${F32_PYCODER_GROUPS:-golden-f32 greedy-f32}; do
            STEP_TIMEOUT=${PYCODER_TIMEOUT:-120} run_step "pycoder.$g" tests.log "$G/bin/test_cuda_pycoder" "$g"
        done
        ;;
    attn)
        for g in ${ATTN_GROUPS:-decode prefill route experts defer sample indexer}; do run_step "attn.$g" tests.log "$G/bin/test_cuda_attn" "$g"; done
        ;;
    pycoder)
        for g in ${PYCODER_GROUPS:-golden routing greedy sampling}; do
            STEP_TIMEOUT=${PYCODER_TIMEOUT:-120} run_step "pycoder.$g" tests.log "$G/bin/test_cuda_pycoder" "$g"
        done
        ;;
    model)
        for g in ${MODEL_GROUPS:-limits v32 golden generate async routing}; do run_step "model.$g" tests.log "$G/bin/test_cuda_model" "$g"; done
        ;;
    modelvariants)
        # the decode-sensitive model checks (greedy generations, with the CPU's routing injected
        # too) with the decode-speed switches lowered, to tell which one a difference comes from
        for v in "DEEPINFER_CUDA_PDL=1" "DEEPINFER_CUDA_PDL=0" "DEEPINFER_CUDA_PDL=0 DEEPINFER_CUDA_MOE_SMALL=0"; do
            echo "(variant: $v)" >>"$OUT/tests.log"
            run_step "model.generate.variant" tests.log env $v "$G/bin/test_cuda_model" generate
            run_step "model.routing.variant" tests.log env $v "$G/bin/test_cuda_model" routing
        done
        ;;
    bench)
        run_step bench.ops bench.log "$G/bin/bench_cuda_ops"
        ;;
    benchv32)
        run_step bench.v32 bench.log "$G/bin/bench_cuda_ops" v32
        ;;
    pfbench)
        run_step bench.prefill bench.log "$G/bin/bench_cuda_ops" prefill
        ;;
    mlabench)
        run_step bench.mladec bench.log "$G/bin/bench_cuda_ops" mladec
        ;;
    smpbench)
        run_step bench.sample bench.log "$G/bin/bench_cuda_ops" sample
        ;;
    l2pin)
        run_step bench.l2pin bench.log "$G/bin/bench_cuda_l2pin" ${L2PIN_ARGS:-}
        ;;
    pdljoin)
        run_step bench.pdljoin bench.log "$G/bin/bench_cuda_pdl_join"
        ;;
    engine)
        # the real engine (`deepinfer generate`) at batch B: B random 128-token prompts, 128 new
        # tokens each (greedy, EOS ignored), all prefilled in one step; the summary line gives
        # tok/s over the whole run and TPOT (B / TPOT = decode tok/s). Device sampling (default
        # on CUDA), then host sampling (DEEPINFER_DEVICE_SAMPLING=0) for comparison. ENGINE_SAMPLING
        # replaces "--temperature 0" (e.g. "--temperature 0.8 --top-p 0.95 --seed 7"); ENGINE_ENV
        # is set for every run (e.g. DEEPINFER_CUDA_SAMPLE_CLUSTER=0).
        emodel=${ENGINE_MODEL:-$TMP/v2lite-8l}
        [ -n "${ENGINE_MODEL:-}" ] || v2lite || continue
        vocab=$(grep -o '"vocab_size": *[0-9]*' "$emodel/config.json" | grep -o '[0-9]*$')
        awk -v V="${vocab:-1000}" 'BEGIN { srand(1); for (i = 0; i < 256; i++) { printf "{\"prompt_token_ids\": ["; \
             for (j = 0; j < 128; j++) printf "%s%d", (j ? "," : ""), 2 + int(rand() * (V - 2)); print "]}" } }' \
            >"$TMP/engine_prompts.jsonl"
        LAST_RC=0
        for sampling in device host; do
            [ "$sampling" = host ] && [ "${ENGINE_HOST:-1}" = 0 ] && continue
            for b in ${ENGINE_BATCHES:-1 16 64 256}; do
                head -n "$b" "$TMP/engine_prompts.jsonl" >"$TMP/engine_p$b.jsonl"
                [ "$LAST_RC" = 124 ] || [ "$LAST_RC" = 137 ] && continue # a run hung: skip the rest
                echo "(engine: batch $b, $sampling sampling)" >>"$OUT/bench.log"
                # shellcheck disable=SC2086
                STEP_TIMEOUT=${ENGINE_TIMEOUT:-90} DEEPINFER_DEVICE_SAMPLING=$([ "$sampling" = device ] && echo 1 || echo 0) \
                    run_step "engine.b$b.$sampling" bench.log env ${ENGINE_ENV:-} "$G/bin/deepinfer" generate --device "${ENGINE_DEVICE:-cuda}" \
                    --model "$emodel" --input "$TMP/engine_p$b.jsonl" --output "$TMP/engine_o$b.jsonl" \
                    --max-tokens 128 --ignore-eos ${ENGINE_SAMPLING:---temperature 0} --max-batch-tokens 32768 \
                    --max-seqs 256 --kv-blocks 1100 --max-model-len 320
            done
        done
        ;;
    small)
        run_step attn.small tests.log "$G/bin/test_cuda_attn" small
        ;;
    decode)
        # decode-sized GEMVs and the experts of 1-4-token steps, graph-replayed over rotating
        # weight copies; then the same with PDL off and with other GEMV split-K settings
        run_step bench.decode bench.log "$G/bin/bench_cuda_decode"
        run_step bench.decode.fp8 bench.log "$G/bin/bench_cuda_decode" moe --fp8
        for v in "DEEPINFER_CUDA_PDL=0" ${DECODE_VARIANTS:-"DEEPINFER_CUDA_GEMV_WANT=64" "DEEPINFER_CUDA_GEMV_WANT=128 DEEPINFER_CUDA_GEMV_MIN_K=256"}; do
            echo "(variant: $v)" >>"$OUT/bench.log"
            run_step "bench.decode.variant" bench.log env $v "$G/bin/bench_cuda_decode" gemv
        done
        ;;
    abvar)
        # A/B of environment settings in one call: AB_VARIANTS = settings separated by '|' (e.g.
        # "DEEPINFER_CUDA_GEMV_WANT=16|DEEPINFER_CUDA_GEMV_WANT=32"), each run AB_ROUNDS (2) times
        # in alternation: bench_cuda_e2e with AB_ARGS (default: batch-1 decode only), and
        # bench_cuda_decode moe when AB_DECODE=1
        # AB_BASE (a staged tree, e.g. an older build carried as .gpu-baseN holding bundle.tar.xz
        # or b.tar.xz with bin/bench_cuda_e2e and lib/) adds its bench_cuda_e2e as the first
        # variant of every round, for before / after numbers of a code change in alternation
        v2lite || continue
        IFS='|' read -r -a abv <<<"${AB_VARIANTS:-DEEPINFER_CUDA_PDL=1}"
        AB_B=${AB_BASE:-}
        if [ -n "$AB_B" ]; then
            case $AB_B in /*) ;; *) AB_B=$CALLER_PWD/$AB_B ;; esac
            for pk in bundle.tar.xz b.tar.xz; do
                if [ -f "$AB_B/$pk" ] && [ ! -x "$AB_B/bin/bench_cuda_e2e" ]; then tar -xJf "$AB_B/$pk" -C "$AB_B"; fi
            done
            [ -x "$AB_B/bin/bench_cuda_e2e" ] || { summary "abvar: AB_BASE $AB_B has no bin/bench_cuda_e2e"; AB_B=; }
        fi
        for r in $(seq 1 "${AB_ROUNDS:-2}"); do
            if [ -n "$AB_B" ]; then
                echo "(variant: base $AB_BASE, round $r)" >>"$OUT/bench.log"
                # shellcheck disable=SC2086
                LD_LIBRARY_PATH="$AB_B/lib${lt:+:$(dirname "$lt")}" run_step "e2e.ab.base" bench.log \
                    "$AB_B/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" ${AB_ARGS:---batches 1 --prefill none --ceilings 0}
            fi
            for v in "${abv[@]}"; do
                echo "(variant: $v, round $r)" >>"$OUT/bench.log"
                # shellcheck disable=SC2086
                run_step "e2e.ab" bench.log env $v "$G/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" \
                    ${AB_ARGS:---batches 1 --prefill none --ceilings 0}
                if [ "${AB_DECODE:-0}" = 1 ] && [ "$r" = 1 ]; then
                    # shellcheck disable=SC2086
                    run_step "decode.ab" bench.log env $v "$G/bin/bench_cuda_decode" ${AB_DECODE_ARGS:-moe}
                fi
            done
        done
        ;;
    trace)
        # the GPU timeline of decode steps in their real graph replay (CUPTI; bench/cuda_trace.h):
        # TRACE_BATCHES (1,16), TRACE_STEPS (8 traced steps per batch), TRACE_ENV (settings; several
        # separated by '|' trace once each); TRACE_ASYNC=K: instead the last K chained steps of the
        # asynchronous loop as one window (the transitions between steps)
        v2lite || continue
        IFS='|' read -r -a trv <<<"${TRACE_ENV:-DI_TRACE=1}"
        for v in "${trv[@]}"; do
            echo "(trace variant: $v)" >>"$OUT/trace.txt"
            # shellcheck disable=SC2086
            run_step "trace" trace.txt env $v "$G/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" \
                --batches "${TRACE_BATCHES:-1,16}" --prefill none --ceilings 0 \
                $([ -n "${TRACE_ASYNC:-}" ] && echo "--trace-async $TRACE_ASYNC" || echo "--trace ${TRACE_STEPS:-8}")
        done
        ;;
    ropekv)
        # batch-1 decode without the fused rope + cache write (DEEPINFER_CUDA_ROPE_KV=0), then the default
        v2lite || continue
        for v in "DEEPINFER_CUDA_ROPE_KV=0" "DEEPINFER_CUDA_ROPE_KV=1"; do
            echo "(variant: $v)" >>"$OUT/bench.log"
            run_step "e2e.b1.variant" bench.log env $v "$G/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" \
                --batches 1 --prefill none --ceilings 0
        done
        ;;
    variants)
        # decode at batch 1 and 16 with the decode-speed switches off one by one (A/B in one call)
        v2lite || continue
        for v in "DEEPINFER_CUDA_MOE_SMALL=0 DEEPINFER_CUDA_PDL=0" "DEEPINFER_CUDA_MOE_SMALL=0" "DEEPINFER_CUDA_PDL=0" \
            "DEEPINFER_CUDA_PDL=1"; do
            echo "(variant: $v)" >>"$OUT/bench.log"
            run_step "e2e.variant" bench.log env $v "$G/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" \
                --batches "${VARIANT_BATCHES:-1,16}" --prefill none --ceilings 0
        done
        # the baseline binary, when one is staged as bin/bench_cuda_e2e_base (main's build)
        if [ -x "$G/bin/bench_cuda_e2e_base" ]; then
            echo "(variant: baseline binary bench_cuda_e2e_base)" >>"$OUT/bench.log"
            run_step "e2e.base" bench.log "$G/bin/bench_cuda_e2e_base" --model "$TMP/v2lite-8l" --prefill 512
        fi
        ;;
    breakdown)
        # per-kernel durations of one decode step (eager: the kernels a graph replays) under Nsight
        # Compute, caches flushed before each kernel; BREAKDOWN_BATCHES (default 1) and the
        # baseline kernels (small experts and PDL off) for comparison (BREAKDOWN_CFGS="new base")
        v2lite || continue
        ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        [ -n "$ncu" ] || { summary "breakdown: ncu not found"; continue; }
        for b in ${BREAKDOWN_BATCHES:-1}; do
            for cfg in ${BREAKDOWN_CFGS:-new base}; do
                envs="DEEPINFER_CUDA_GRAPHS=0"
                [ "$cfg" = base ] && envs="$envs DEEPINFER_CUDA_MOE_SMALL=0 DEEPINFER_CUDA_PDL=0"
                log="$TMP/ncu_b${b}_$cfg.csv"
                run_step "breakdown.b$b.$cfg" ncu.log env $envs "$ncu" --clock-control none --metrics gpu__time_duration.sum \
                    --csv --print-units base --log-file "$log" "$G/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" \
                    --batches "$b" --prompt 16 --gen 4 --prefill none --ceilings 0
                python3 "$G/src/scripts/gpu/breakdown.py" "$log" "b$b $cfg" >>"$OUT/breakdown.txt" 2>&1
            done
        done
        ;;
    ltsearch)
        # every cuBLASLt configuration (algorithm, tile, stages, split-K, reduction) that passes
        # its check for the decode-sized bf16 GEMMs, timed over rotating weights (bench_cuda_lt)
        run_step "ltsearch" lt.txt "$G/bin/bench_cuda_lt" "${LT_T:-16}" "${LT_MAX:-400}"
        ;;
    dkernel)
        # ncu sections (speed of light, occupancy, warp states, memory) of the decode kernels
        # whose names match DKERNEL (regex, default k_small|k_gemv|k_route) in one eager
        # decode step at DKERNEL_BATCH (1) tokens after a DKERNEL_PROMPT (16) token prompt -> dkernel.txt
        v2lite || continue
        ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        [ -n "$ncu" ] || { summary "dkernel: ncu not found"; continue; }
        run_step "dkernel" dkernel.txt env DEEPINFER_CUDA_GRAPHS=0 "$ncu" --clock-control none \
            --kernel-name "regex:${DKERNEL:-k_small|k_gemv|k_route}" --launch-skip "${DKERNEL_SKIP:-40}" \
            --launch-count "${DKERNEL_COUNT:-12}" --section SpeedOfLight --section Occupancy \
            --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats \
            "$G/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" --batches "${DKERNEL_BATCH:-1}" --prompt "${DKERNEL_PROMPT:-16}" --gen 4 \
            --prefill none --ceilings 0
        ;;
    pbreakdown)
        # the same for one prefill of PBREAKDOWN_LEN tokens (default 8192; bench_cuda_e2e runs it
        # four times, the last one is reported)
        v2lite || continue
        ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        [ -n "$ncu" ] || { summary "pbreakdown: ncu not found"; continue; }
        L=${PBREAKDOWN_LEN:-8192}
        log="$TMP/ncu_prefill$L.csv"
        run_step "pbreakdown.$L" ncu.log "$ncu" --clock-control none --metrics gpu__time_duration.sum \
            --csv --print-units base --log-file "$log" "$G/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" \
            --batches none --prefill "$L" --ceilings 0
        python3 "$G/src/scripts/gpu/breakdown.py" "$log" "prefill $L" >>"$OUT/breakdown.txt" 2>&1
        ;;
    pkernel)
        # ncu sections (speed of light, memory, warp stalls) of the first PKERNEL_COUNT (2) launches
        # of the kernels matching PKERNEL (regex, default k_gemm_wgmma) in one prefill of
        # PBREAKDOWN_LEN tokens -> pkernel.txt
        v2lite || continue
        ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        [ -n "$ncu" ] || { summary "pkernel: ncu not found"; continue; }
        run_step pkernel pkernel.txt "$ncu" --clock-control none -k "regex:${PKERNEL:-k_gemm_wgmma}" \
            -c "${PKERNEL_COUNT:-2}" --section SpeedOfLight --section MemoryWorkloadAnalysis \
            --section WarpStateStats --section ComputeWorkloadAnalysis "$G/bin/bench_cuda_e2e" \
            --model "$TMP/v2lite-8l" --batches none --prefill "${PBREAKDOWN_LEN:-8192}" --ceilings 0
        ;;
    moelt)
        # decode at MOELT_BATCHES (default 8,16,32,64,128) once per DEEPINFER_CUDA_MOE_LT value of
        # MOELT_VALUES (default "1 2 3": strided cuBLASLt experts, pointer arrays, pointer arrays
        # from 8 tokens; 0: our grouped kernels), before / after in one call; then, for each value
        # of MOELT_NCU (default none), one batch-16 decode step's kernels under ncu (breakdown.txt)
        v2lite || continue
        for v in ${MOELT_VALUES:-1 2 3}; do
            echo "(variant: DEEPINFER_CUDA_MOE_LT=$v)" >>"$OUT/bench.log"
            run_step "e2e.moelt$v" bench.log env DEEPINFER_CUDA_MOE_LT="$v" "$G/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" \
                --batches "${MOELT_BATCHES:-8,16,32,64,128}" --prefill none --ceilings 0
        done
        ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        for v in ${MOELT_NCU:-}; do
            [ -n "$ncu" ] || break
            log="$TMP/ncu_b16_lt$v.csv"
            run_step "breakdown.b16.lt$v" ncu.log env DEEPINFER_CUDA_GRAPHS=0 DEEPINFER_CUDA_MOE_LT="$v" "$ncu" \
                --clock-control none --metrics gpu__time_duration.sum --csv --print-units base --log-file "$log" \
                "$G/bin/bench_cuda_e2e" --model "$TMP/v2lite-8l" --batches 16 --prompt 16 --gen 4 --prefill none --ceilings 0
            python3 "$G/src/scripts/gpu/breakdown.py" "$log" "b16 MOE_LT=$v" >>"$OUT/breakdown.txt" 2>&1
        done
        ;;
    e2e | compare)
        v2lite || continue
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
    hf)
        STEP_TIMEOUT=${HF_TIMEOUT:-240} run_step hf.bf16 hf.log python3 "$G/src/tools/golden/hf_bf16_error.py" \
            --bin "$G/bin/deepinfer" --golden "$G/src/tests/data/golden" \
            ${DI_PYCODER_MODEL:+--pycoder-model "$DI_PYCODER_MODEL" --pycoder-golden "$DI_GOLDEN_PYCODER_DIR"} \
            --device cuda --out "$OUT/hf_bf16.json"
        ;;
    hfgreedy)
        [ -f "$TMP/pycoder_greedy.gpu.jsonl" ] ||
            STEP_TIMEOUT=${PYCODER_TIMEOUT:-120} run_step pycoder.greedy tests.log "$G/bin/test_cuda_pycoder" greedy
        STEP_TIMEOUT=${HF_TIMEOUT:-240} run_step hf.greedy hf.log python3 "$G/src/tools/golden/hf_greedy_agreement.py" \
            --model "$DI_PYCODER_MODEL" --dir "$TMP" --device cuda --out "$OUT/hf_greedy.json"
        ;;
    peer)
        # the peer on the same card and model: llama.cpp, staged by scripts/gpu/build_llamacpp.sh
        # into .peer (PEER_DIR to override): tools.tar.xz and the CUDA library in two pieces,
        # cuda.xz.00 / .01, which may come in two calls on the same machine (the call's 64 MiB
        # limit). With tools.tar.xz the v2lite-8l made here is converted once to a bf16 GGUF by
        # llama.cpp's own converter (the same weights, with DeepSeek-V3's real tokenizer so the
        # converter knows it); with both pieces: llama-batched-bench at PEER_NPL (1,16,64,128,256)
        # concurrent sequences, prompt 128, 128 new tokens, flash attention, every layer on the
        # GPU (its S_TG column is decode tok/s), llama-bench's pp512 (prefill of one 512-token
        # prompt) and tg128 (one sequence's decode, a second batch-1 number), and peer_ratio.py
        # against this call's e2e runs (-> peer.txt; each side's best run).
        P=${PEER_DIR:-$ROOT/.peer}
        case $P in /*) ;; *) P=$CALLER_PWD/$P ;; esac
        if [ -f "$P/tools.tar.xz" ] && [ ! -x "$P/bin/llama-batched-bench" ]; then
            tar -xJf "$P/tools.tar.xz" -C "$P" 2>/dev/null ||
                python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$P/tools.tar.xz" "$P"
        fi
        [ -x "$P/bin/llama-batched-bench" ] || { summary "peer: no llama.cpp tools in $P (scripts/gpu/build_llamacpp.sh; carry .peer/tools.tar.xz)"; continue; }
        cso=$(cat "$P/cuda.name" 2>/dev/null)
        if [ -n "$cso" ] && [ ! -f "$P/lib/$cso" ] && [ -f "$P/cuda.xz.00" ] && [ -f "$P/cuda.xz.01" ]; then
            cat "$P"/cuda.xz.0[01] | xz -dc >"$P/lib/$cso.part" && mv "$P/lib/$cso.part" "$P/lib/$cso"
        fi
        v2lite || continue
        echo "(peer: $(cat "$P/VERSION" 2>/dev/null))" >>"$OUT/bench.log"
        if [ ! -f "$TMP/v2lite-8l.gguf" ]; then
            hfd=$TMP/v2lite-8l-hf
            mkdir -p "$hfd"
            for f in "$TMP"/v2lite-8l/*; do ln -sf "$f" "$hfd/"; done
            rm -f "$hfd/tokenizer.json" "$hfd/tokenizer_config.json"
            tar -xJf "$ROOT/tests/data/tokenizers/tokenizers.tar.xz" -C "$TMP" tokenizers/deepseek-v3
            cp "$TMP/tokenizers/deepseek-v3/tokenizer.json" "$TMP/tokenizers/deepseek-v3/tokenizer_config.json" "$hfd/"
            STEP_TIMEOUT=${PEER_CONVERT_TIMEOUT:-300} run_step peer.convert bench.log python3 "$P/py/convert_hf_to_gguf.py" \
                "$hfd" --outtype bf16 --outfile "$TMP/v2lite-8l.gguf.part"
            [ "$LAST_RC" = 0 ] && mv "$TMP/v2lite-8l.gguf.part" "$TMP/v2lite-8l.gguf"
        fi
        [ -f "$TMP/v2lite-8l.gguf" ] || { summary "peer: the GGUF conversion failed (bench.log)"; continue; }
        [ -n "$cso" ] && [ -f "$P/lib/$cso" ] || { summary "peer: the CUDA library's pieces are not all here yet (converted only)"; continue; }
        pld="$P/lib${lt:+:$(dirname "$lt")}" # llama.cpp's libraries, then the machine's CUDA ones
        LD_LIBRARY_PATH="$pld" ldd "$P/bin/llama-batched-bench" | grep 'not found' >>"$OUT/bench.log"
        # one run per batch size, each with a KV cache of just its B x 256 cells (one shared
        # 65K-cell cache measured batch 1 at 585 tok/s against 656 with its own, H100)
        for b in $(echo "${PEER_NPL:-1,16,64,128,256}" | tr ',' ' '); do
            LD_LIBRARY_PATH="$pld" run_step "peer.batched.b$b" bench.log "$P/bin/llama-batched-bench" \
                -m "$TMP/v2lite-8l.gguf" -ngl 99 -fa on -c $((b * 256)) -b 2048 -ub 512 -npp 128 -ntg 128 -npl "$b"
        done
        LD_LIBRARY_PATH="$pld" run_step peer.bench bench.log "$P/bin/llama-bench" \
            -m "$TMP/v2lite-8l.gguf" -ngl 99 -fa 1 -p 512 -n 128 -r 5
        python3 "$G/src/scripts/gpu/peer_ratio.py" "$OUT/bench.log" >"$OUT/peer.txt" 2>&1
        ;;
    e2ebase)
        B=${E2E_BASE:-}
        case $B in /* | '') ;; *) B=$CALLER_PWD/$B ;; esac
        [ -n "$B" ] && [ -d "$B" ] || { summary "e2ebase: E2E_BASE not set or missing"; continue; }
        B=$(cd "$B" && pwd)
        if [ -f "$B/bundle.tar.xz" ] && [ ! -x "$B/bin/bench_cuda_e2e" ]; then tar -xJf "$B/bundle.tar.xz" -C "$B"; fi
        v2lite || continue
        echo "(e2ebase: $B)" >>"$OUT/bench.log"
        # shellcheck disable=SC2086
        LD_LIBRARY_PATH="$B/lib${lt:+:$(dirname "$lt")}" run_step bench.e2e.base bench.log "$B/bin/bench_cuda_e2e" \
            --model "$TMP/v2lite-8l" ${BENCH_ARGS:-}
        ;;
    benchv32sp)
        for v in ${SPARSE_TILES:-1 2 8}; do
            echo "(DEEPINFER_CUDA_SPARSE_MIN_TILES=$v)" >>"$OUT/bench.log"
            run_step "bench.v32.tiles$v" bench.log env DEEPINFER_CUDA_SPARSE_MIN_TILES=$v "$G/bin/bench_cuda_ops" v32
        done
        ;;
    attnsp1)
        run_step attn.indexer.tiles1 tests.log env DEEPINFER_CUDA_SPARSE_MIN_TILES=1 "$G/bin/test_cuda_attn" indexer
        ;;
    modelv32)
        run_step model.v32 tests.log "$G/bin/test_cuda_model" v32
        ;;
    benchv32base)
        B=${V32_BASE:-}
        case $B in /* | '') ;; *) B=$CALLER_PWD/$B ;; esac
        [ -n "$B" ] && [ -d "$B" ] || { summary "benchv32base: V32_BASE not set or missing"; continue; }
        B=$(cd "$B" && pwd)
        if [ -f "$B/bundle.tar.xz" ] && [ ! -x "$B/bin/bench_cuda_ops" ]; then tar -xJf "$B/bundle.tar.xz" -C "$B"; fi
        echo "(benchv32base: $B)" >>"$OUT/bench.log"
        LD_LIBRARY_PATH="$B/lib${lt:+:$(dirname "$lt")}" run_step bench.v32.base bench.log "$B/bin/bench_cuda_ops" v32
        ;;
    *) summary "unknown step $s" ;;
    esac
done
# the last lines of each log, so the call's own output shows the outcome
[ -f "$OUT/peer.txt" ] && { echo "---- peer.txt (the same call's e2e against llama.cpp)"; cat "$OUT/peer.txt"; }
[ -f "$OUT/breakdown.txt" ] && { echo "---- breakdown (by kernel)"; grep -A 40 '== by kernel' "$OUT/breakdown.txt" | head -n 90; }
for f in tests.log bench.log hf.log; do
    [ -f "$OUT/$f" ] && { echo "---- $f (failures and tables)"; grep -E 'FAIL|failed|ceiling|tok/s|of roofline|checks,|golden:|generate:|routing|pycoder|sampling|differ from|TPOT|\(engine|\(e2ebase|\(peer|^\| +[0-9]+ \||^\| +[a-z].*pp|^\| +[a-z].*tg|\(variant|flipped|bfloat16|==== |us/op| [0-9]+ +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+%' "$OUT/$f" | tail -n 150; }
done
echo "---- summary"
cat "$OUT/summary.txt"
