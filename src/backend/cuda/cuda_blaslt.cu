/* cuda_blaslt.cu - cuBLASLt GEMMs of the CUDA backend: bf16, and fp8 e4m3 with DeepSeek's
 * block scales (weights 128x128 blocks: CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
 * activations 1x128 groups: VEC128_32F, quantized by k_act_quant below), plus a small plan
 * cache (descriptors + heuristic algorithm per shape).
 *
 * Owner: cuda. Row-major y[T, N] = x[T, K] · W[N, K]ᵀ is computed as the column-major
 * "TN" product yᵀ = W · xᵀ (A = W transposed, B = x), the layout fp8 requires on Hopper.
 * Scale layouts (cuBLASLt's, as PyTorch's scaled_mm checks them): weight scales row-major
 * [ceil(N/128)][roundup(ceil(K/128), 4)] (our upload layout), activation scales
 * [ceil(K/128)][T] (token fastest). Invariants: plans are created on first use (host only,
 * also valid during graph capture) and keyed by every parameter that changes the descriptor
 * or the algorithm; a shape cuBLASLt has no algorithm for is remembered and returns 0. */
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

static int plan_build(cuda_state *st, lt_plan *p, int N, int K, int T, long ldx, long ldy, int f32, int fp8,
                      int accumulate, int align_bits) {
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType_t ab_t = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF, c_t = f32 ? CUDA_R_32F : CUDA_R_16BF;
    int ok = LT_OK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    ok = ok && LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    ok = ok && LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (ok && fp8) {
        int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        ok = LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
        ok = ok && LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
        /* placeholder scale pointers for the heuristic; the real ones are set per call */
        const void *dummy = st->aq_scale;
        ok = ok && LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy, sizeof dummy));
        ok = ok && LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy, sizeof dummy));
    }
    ok = ok && LT_OK(cublasLtMatrixLayoutCreate(&p->a, ab_t, K, N, K));
    ok = ok && LT_OK(cublasLtMatrixLayoutCreate(&p->b, ab_t, K, T, fp8 ? K : ldx));
    ok = ok && LT_OK(cublasLtMatrixLayoutCreate(&p->c, c_t, N, T, ldy));
    if (!ok) return 0;
    cublasLtMatmulPreference_t pref = NULL;
    if (!LT_OK(cublasLtMatmulPreferenceCreate(&pref))) return 0;
    uint64_t ws = st->lt_ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    uint32_t al = (uint32_t)align_bits;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al);
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    (void)accumulate;
    if (hs != CUBLAS_STATUS_SUCCESS || n < 1) return 0;
    p->algo = res.algo;
    return 1;
}

static int align_of(const void *p, long ld, int es) {
    uintptr_t u = (uintptr_t)p | (uintptr_t)(ld * es);
    int a = 16;
    while (a > 1 && (u & (uintptr_t)(a - 1))) a >>= 1;
    return a;
}

int lt_gemm(cuda_state *st, const gemm_args *a) {
    if (!st->lt || !st->lt_ws || a->r.offsets || a->n_mat != 1 || a->o.silu_I > 0) return 0;
    const wview &w = a->w;
    int N = w.rows, K = w.cols, T = a->r.T, fp8 = w.fp8;
    if (fp8) {
        if (!st->fp8_act_quant || a->o.f32 || T % 4 != 0 || w.br != 128 || w.bc != 128 || K % 16 != 0 || !st->aq ||
            T > st->max_tokens || K > st->max_fp8_cols)
            return 0;
    }
    int al = align_of(a->o.y, a->o.ldy, a->o.f32 ? 4 : 2);
    int alx = fp8 ? 16 : align_of(a->x, a->ldx, 2);
    if (alx < al) al = alx;
    uint64_t key = 1469598103934665603ull;
    key = mix(key, (uint64_t)N);
    key = mix(key, (uint64_t)K);
    key = mix(key, (uint64_t)T);
    key = mix(key, (uint64_t)a->ldx);
    key = mix(key, (uint64_t)a->o.ldy);
    key = mix(key, (uint64_t)(a->o.f32 | fp8 << 1 | a->o.accumulate << 2));
    key = mix(key, (uint64_t)al);
    if (!key) key = 1;
    lt_plan *p = &st->plans[key % LT_CACHE];
    if (p->key != key) {
        if (p->key) plan_destroy(p);
        p->key = key;
        p->valid = plan_build(st, p, N, K, T, a->ldx, a->o.ldy, a->o.f32, fp8, a->o.accumulate, al);
    }
    if (!p->valid) return 0;
    const void *B = a->x;
    if (fp8) {
        launch_act_quant(a->x, a->ldx, T, K, st->aq, st->aq_scale, T, st->stream);
        if (CUDA_LAUNCHED(st, "act_quant")) return 1;
        const void *sa = w.scale, *sb = st->aq_scale;
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
        B = st->aq;
    }
    float alpha = 1.0f, beta = a->o.accumulate ? 1.0f : 0.0f;
    cublasStatus_t s = cublasLtMatmul(st->lt, p->op, &alpha, w.data, p->a, B, p->b, &beta, a->o.y, p->c, a->o.y, p->c,
                                      &p->algo, st->lt_ws, st->lt_ws_bytes, st->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        char msg[128];
        snprintf(msg, sizeof msg, "cublasLtMatmul failed (status %d) for N=%d K=%d T=%d fp8=%d", (int)s, N, K, T, fp8);
        cuda_note_msg(st, msg);
    }
    return 1;
}
