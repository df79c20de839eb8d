/* cuda_blaslt.cu - cuBLASLt GEMMs of the CUDA backend: bf16, and fp8 e4m3 with DeepSeek's
 * block scales (weights 128x128 blocks: CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
 * activations 1x128 groups: VEC128_32F, quantized by k_act_quant below), plus a small plan
 * cache (descriptors + heuristic algorithm per shape; pointer-array plans pick among the
 * heuristic's results by tile, ptr_pick). Batches are strided, or (the routed
 * experts of decode steps, cuda_moe.cu) pointer arrays: A / B / C are device arrays of one
 * pointer per batch instance, written on the device.
 *
 * Owner: cuda. Row-major y[T, N] = x[T, K] · W[N, K]ᵀ is computed as the column-major
 * "TN" product yᵀ = W · xᵀ (A = W transposed, B = x), the layout fp8 requires on Hopper.
 * Scale layouts (cuBLASLt's, as PyTorch's scaled_mm checks them): weight scales row-major
 * [ceil(N/128)][roundup(ceil(K/128), 4)] (our upload layout), activation scales
 * [ceil(K/128)][T] (token fastest). Invariants: plans are created on first use (host only,
 * also valid during graph capture) and keyed by every parameter that changes the descriptor
 * or the algorithm; a shape cuBLASLt has no algorithm for is remembered and returns 0. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

/* ---------------------------------------------------------------- act quant ---- */

/* One warp per (token, 128-column group): amax -> scale = max(amax, 1e-4) / 448,
 * q = fp8(x / scale) (round to nearest even, saturating). scale layout [K/128][scale_ld]. */
__global__ void k_act_quant(const bf16 *x, long ldx, int T, int K, uint8_t *q, float *scale, int scale_ld) {
    int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
    int G = (K + 127) / 128;
    long item = (long)blockIdx.x * warps + (threadIdx.x >> 5);
    if (item >= (long)T * G) return;
    int t = (int)(item / G), gi = (int)(item % G);
    float v[4];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int k = gi * 128 + lane * 4 + i;
        v[i] = k < K ? __bfloat162float(x[(long)t * ldx + k]) : 0.f;
        amax = fmaxf(amax, fabsf(v[i]));
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float s = fmaxf(amax, 1e-4f) / 448.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int k = gi * 128 + lane * 4 + i;
        if (k < K) q[(long)t * K + k] = (uint8_t)__nv_cvt_float_to_fp8(v[i] / s, __NV_SATFINITE, __NV_E4M3);
    }
    if (lane == 0) scale[(long)gi * scale_ld + t] = s;
}

void launch_act_quant(const bf16 *x, long ldx, int T, int K, uint8_t *q, float *scale, int scale_ld, cudaStream_t s) {
    long items = (long)T * ((K + 127) / 128);
    if (items <= 0) return;
    k_act_quant<<<(unsigned)((items + 7) / 8), 256, 0, s>>>(x, ldx, T, K, q, scale, scale_ld);
}

/* ---------------------------------------------------------------- plans ---- */

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xbf58476d1ce4e5b9ull;
}

static void plan_destroy(lt_plan *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    memset(p, 0, sizeof *p);
}

void lt_free_plans(cuda_state *st) {
    for (int i = 0; i < LT_CACHE; i++)
        if (st->plans[i].key) plan_destroy(&st->plans[i]);
}

#define LT_OK(call) ((call) == CUBLAS_STATUS_SUCCESS)

/* Strided batch (stride in elements), or with ptr_array a batch whose matrices' addresses come
 * from a device array of pointers (CUBLASLT_BATCH_MODE_POINTER_ARRAY; set even for one matrix). */
static int set_batch(cublasLtMatrixLayout_t l, int batch, long stride, int ptr_array) {
    int32_t b = batch;
    if (ptr_array) {
        uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
        return LT_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b)) &&
               LT_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode));
    }
    if (batch <= 1) return 1;
    int64_t st = stride;
    return LT_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b)) &&
           LT_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st, sizeof st));
}

/* The rows x columns of a cuBLASLt tile (0 x 0: one this table does not list) */
static void tile_dims(uint32_t tile, int *m, int *n) {
#define DI_TILE(M, N) \
    case CUBLASLT_MATMUL_TILE_##M##x##N: *m = M; *n = N; return;
#define DI_TILES(M) DI_TILE(M, 8) DI_TILE(M, 16) DI_TILE(M, 24) DI_TILE(M, 32) DI_TILE(M, 48) DI_TILE(M, 64)
    switch (tile) {
        DI_TILES(64) DI_TILES(128) DI_TILES(192) DI_TILES(256) DI_TILES(384) DI_TILES(512)
    default: *m = *n = 0;
    }
#undef DI_TILES
#undef DI_TILE
}

/* An algorithm's tile id, with its rows x columns (tile_dims; 0 x 0 if unknown) */
static uint32_t algo_tile(const cublasLtMatmulAlgo_t *algo, int *m, int *n) {
    uint32_t tile = 0;
    size_t w;
    if (cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w) !=
        CUBLAS_STATUS_SUCCESS)
        tile = 0;
    tile_dims(tile, m, n);
    return tile;
}

/* Which of the heuristic's results a pointer-array plan (the experts' grouped GEMMs) takes. The
 * heuristic does not know how many of the batch's slots carry rows: for a layer's down
 * projection (N = hidden) it offers tall tiles (512x16 .. 512x64: 4 per expert), which over
 * all 64 slots make under 2 waves of the SMs, and with ~50 active experts the second wave is
 * mostly idle. So when the first result's tiles over all slots would make fewer than 4 waves,
 * the plan takes the first result whose tiles have at most M = st->lt_ptr_tile_m rows, else
 * the first with at most 2M. Measured (H100, v2lite-8l, 2026-12-05, docs/PERF.md), M = 64:
 * the down GEMM on 64x16 / 64x32 / 128x64 tiles at batch 16 / 32 / 64: +1.2% / +1.2% / +0.9%
 * decode; the gate/up GEMMs keep their first result (128x16 .. 176x64: >= 7 waves). */
static int ptr_pick(const cuda_state *st, const lt_shape *g, const cublasLtMatmulHeuristicResult_t *all, int n) {
    if (st->lt_ptr_tile_m <= 0 || n < 2) return 0;
    int best = -1, second = -1;
    for (int r = 0; r < n; r++) {
        int tm, tn;
        algo_tile(&all[r].algo, &tm, &tn);
        if (r == 0) { /* the first result's grid over all slots: 4 waves or more, or an unknown tile, keep it */
            if (!tm || (double)((g->N + tm - 1) / tm) * ((g->T + tn - 1) / tn) * g->batch >= 4.0 * st->n_sm) return 0;
        }
        if (tm && tm <= st->lt_ptr_tile_m && best < 0) best = r;
        if (tm && tm <= 2 * st->lt_ptr_tile_m && second < 0) second = r;
    }
    return best >= 0 ? best : second >= 0 ? second : 0;
}

/* The SM count a plan built now is chosen for (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET; 0: all):
 * side-lane plans leave the rest to the main lane's GEMMs beside them (st->side_sms). Part of
 * the plan's cache key, since it changes the plan. */
static int32_t plan_sm_target(const cuda_state *st) { return st->on_side ? st->side_sms : 0; }

static int plan_build(cuda_state *st, lt_plan *p, const lt_shape *g, int align_bits) {
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType_t ab_t = g->fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF, c_t = g->f32 ? CUDA_R_32F : CUDA_R_16BF;
    int ok = LT_OK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    ok = ok && LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    ok = ok && LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (ok && g->fp8) {
        int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        ok = LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
        ok = ok && LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
        /* placeholder scale pointers for the heuristic; the real ones are set per call */
        const void *dummy = st->aq_scale;
        ok = ok && LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy, sizeof dummy));
        ok = ok && LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy, sizeof dummy));
    }
    int32_t sms = plan_sm_target(st);
    if (ok && sms > 0)
        ok = LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof sms));
    ok = ok && LT_OK(cublasLtMatrixLayoutCreate(&p->a, ab_t, g->K, g->N, g->K)) &&
         set_batch(p->a, g->batch, g->sa, g->ptr_array);
    ok = ok && LT_OK(cublasLtMatrixLayoutCreate(&p->b, ab_t, g->K, g->T, g->fp8 ? g->K : g->ldx)) &&
         set_batch(p->b, g->batch, g->sb, g->ptr_array);
    ok = ok && LT_OK(cublasLtMatrixLayoutCreate(&p->c, c_t, g->N, g->T, g->ldy)) &&
         set_batch(p->c, g->batch, g->sc, g->ptr_array);
    if (!ok) return 0;
    cublasLtMatmulPreference_t pref = NULL;
    if (!LT_OK(cublasLtMatmulPreferenceCreate(&pref))) return 0;
    uint64_t ws = st->lt_ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    uint32_t al = (uint32_t)align_bits;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al);
    if (g->ptr_array) /* the weight pointers are the array's, aligned as lt_ptr's caller says */
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
    enum { NRES = 8 };
    cublasLtMatmulHeuristicResult_t all[NRES];
    /* plain plans: the heuristic's first result, or st->lt_algo (an experiment switch; the first
     * result that fills a wave of the SMs where the first does not lost 1.3-1.8% at batch 128 /
     * 256, the second everywhere 1.7% at batch 16: H100, docs/PERF.md 2026-12-05) */
    int n = 0, pick = g->ptr_array ? st->lt_ptr_algo : st->lt_algo;
    /* all results: for ptr_pick, and for the LT_LOG listing (LT_PTR_ALGO, when set, asks for
     * just enough) */
    int ask = g->ptr_array && pick ? (pick + 1 > NRES ? NRES : pick + 1) : NRES;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st->lt, p->op, p->a, p->b, p->c, p->c, pref, ask, all, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || n < 1) {
        if (g->ptr_array) /* host-only note: the caller falls back to the strided batch */
            fprintf(stderr, "deepinfer cuda: cuBLASLt has no pointer-array algorithm for N=%d K=%d T=%d batch=%d (status %d)\n",
                    g->N, g->K, g->T, g->batch, (int)hs);
        return 0;
    }
    if (g->ptr_array && !pick) pick = ptr_pick(st, g, all, n); /* LT_PTR_ALGO, when set, wins */
    if (pick >= n) pick = n - 1; /* fewer results than asked for: the last */
    const cublasLtMatmulHeuristicResult_t res = all[pick];
    p->algo = res.algo;
    for (int r = 0; st->lt_log && r < n; r++) {
        int tm, tn;
        uint32_t tile = algo_tile(&all[r].algo, &tm, &tn);
        fprintf(stderr, "deepinfer cuda:   %s N=%d K=%d T=%d batch=%d: result %d tile %u (%dx%d), waves %.2f, workspace %zu%s\n",
                g->ptr_array ? "pointer-array" : "plain", g->N, g->K, g->T, g->batch, r, tile, tm, tn,
                (double)all[r].wavesCount, all[r].workspaceSize, r == pick ? " (taken)" : "");
    }
    if (st->lt_log) {
        int32_t id = -1, splitk = -1;
        uint32_t tile = 0, red = 0, stages = 0;
        uint16_t cluster = 0;
        size_t w;
        cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster,
                                             &w);
        fprintf(stderr,
                "deepinfer cuda: cuBLASLt plan N=%d K=%d T=%d batch=%d%s fp8=%d f32=%d: result %d of %d, algo %d tile %u "
                "split-K %d reduction %u stages %u cluster %u, workspace %zu bytes, waves %.2f\n",
                g->N, g->K, g->T, g->batch, g->ptr_array ? " (pointer array)" : "", g->fp8, g->f32, pick, n, (int)id,
                tile, (int)splitk, red, stages, (unsigned)cluster, res.workspaceSize, (double)res.wavesCount);
    }
    return 1;
}

static int align_of(const void *p, long ld, int es) {
    uintptr_t u = (uintptr_t)p | (uintptr_t)(ld * es);
    int a = 16;
    while (a > 1 && (u & (uintptr_t)(a - 1))) a >>= 1;
    return a;
}

/* The cached plan for a shape, built on first use; NULL if cuBLASLt has no algorithm. */
static lt_plan *plan_for(cuda_state *st, const lt_shape *g, int align) {
    uint64_t key = 1469598103934665603ull;
    key = mix(key, (uint64_t)g->N);
    key = mix(key, (uint64_t)g->K);
    key = mix(key, (uint64_t)g->T);
    key = mix(key, (uint64_t)g->ldx);
    key = mix(key, (uint64_t)g->ldy);
    key = mix(key, (uint64_t)(g->f32 | g->fp8 << 1 | g->accumulate << 2 | g->ptr_array << 3));
    key = mix(key, (uint64_t)g->batch);
    key = mix(key, (uint64_t)g->sa);
    key = mix(key, (uint64_t)g->sb);
    key = mix(key, (uint64_t)g->sc);
    key = mix(key, (uint64_t)align);
    key = mix(key, (uint64_t)plan_sm_target(st));
    if (!key) key = 1;
    lt_plan *p = &st->plans[key % LT_CACHE];
    if (p->key != key) {
        if (p->key) plan_destroy(p);
        p->key = key;
        p->valid = plan_build(st, p, g, align);
    }
    return p->valid ? p : NULL;
}

/* byte alignment the plan may assume for this call's pointers / strides */
static int plan_align(const lt_shape *g, const void *x, const void *y) {
    int al = align_of(y, g->ldy, g->f32 ? 4 : 2), alx = g->fp8 ? 16 : align_of(x, g->ldx, 2);
    if (g->batch > 1 || g->ptr_array) {
        int as = align_of(NULL, g->sb, 2), cs = align_of(NULL, g->sc, g->f32 ? 4 : 2);
        alx = alx < as ? alx : as;
        al = al < cs ? al : cs;
    }
    if (g->ptr_array) { /* weight matrices at multiples of sa from a 256-byte aligned base */
        int aw = align_of(NULL, g->sa, g->fp8 ? 1 : 2);
        al = al < aw ? al : aw;
    }
    return alx < al ? alx : al;
}

int lt_ready(cuda_state *st, const lt_shape *g, const void *x, const void *y) {
    if (!st->lt || !st->lt_ws) return 0;
    return plan_for(st, g, plan_align(g, x, y)) != NULL;
}

/* Runs the GEMM with the shape's plan (for byte alignment `align`); fp8 sets the block-scale
 * pointers first. 0: no plan. */
static int lt_exec(cuda_state *st, const lt_shape *g, int align, const void *W, const void *x, void *y,
                   const void *sa, const void *sb) {
    if (!st->lt || !st->lt_ws) return 0;
    lt_plan *p = plan_for(st, g, align);
    if (!p) return 0;
    if (g->fp8) {
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    }
    float alpha = 1.0f, beta = g->accumulate ? 1.0f : 0.0f;
    cublasStatus_t s = cublasLtMatmul(st->lt, p->op, &alpha, W, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo,
                                      st->on_side ? st->lt_ws_side : st->lt_ws, st->lt_ws_bytes, st->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        char msg[160];
        snprintf(msg, sizeof msg, "cublasLtMatmul failed (status %d) for N=%d K=%d T=%d batch=%d fp8=%d", (int)s, g->N,
                 g->K, g->T, g->batch, g->fp8);
        cuda_note_msg(st, msg);
    }
    return 1;
}

int lt_run(cuda_state *st, const lt_shape *g, const void *W, const void *x, void *y) {
    return lt_exec(st, g, plan_align(g, x, y), W, x, y, NULL, NULL);
}

int lt_run_ptr(cuda_state *st, const lt_shape *g, const void *x_base, const void *y_base, const void *W_arr,
               const void *x_arr, void *y_arr) {
    return lt_exec(st, g, plan_align(g, x_base, y_base), W_arr, x_arr, y_arr, NULL, NULL);
}

int lt_gemm(cuda_state *st, const gemm_args *a) {
    if (!st->lt || !st->lt_ws || a->r.offsets || a->o.silu_I > 0) return 0;
    const wview &w = a->w;
    int N = w.rows, K = w.cols, T = a->r.T, fp8 = w.fp8, batch = a->n_mat;
    if (fp8) {
        /* st->aq is one buffer: activation quantization runs on the main lane only */
        if (batch != 1 || !st->fp8_act_quant || st->on_side || a->o.f32 || T % 4 != 0 || w.br != 128 ||
            w.bc != 128 || K % 16 != 0 || !st->aq || T > st->max_tokens || K > st->max_fp8_cols)
            return 0;
    }
    if (batch > 1 && (a->x_mat_stride <= 0 || a->o.y_mat_stride <= 0)) return 0;
    lt_shape g = {N, K, T, a->ldx, a->o.ldy, a->o.f32, fp8, a->o.accumulate, batch, w.mat_stride, a->x_mat_stride,
                  a->o.y_mat_stride, 0};
    if (!fp8) return lt_exec(st, &g, plan_align(&g, a->x, a->o.y), w.data, a->x, a->o.y, NULL, NULL);
    if (!lt_ready(st, &g, st->aq, a->o.y)) return 0;
    launch_act_quant(a->x, a->ldx, T, K, st->aq, st->aq_scale, T, st->stream);
    if (CUDA_LAUNCHED(st, "act_quant")) return 1;
    return lt_exec(st, &g, plan_align(&g, st->aq, a->o.y), w.data, st->aq, a->o.y, w.scale, st->aq_scale);
}
