/* cuda_gemm.cu - GEMM dispatch of the CUDA backend (matmul, bmm, and the grouped expert GEMMs
 * of cuda_moe.cu), plus the generic fallback kernel for shapes the fast kernels do not take.
 *
 * Owner: cuda. Paths, chosen per call on the host from shapes only (never from data, so a
 * decode step captured in a CUDA graph replays the same kernels):
 *   - gemv:    one row (or up to 4 rows of a narrow weight): FMA, coalesced weight rows;
 *   - cuBLASLt: plain and strided-batched bf16 GEMMs from two rows on; fp8 with 128x128 weight
 *              block scales and 1x128 activation quantization when DEEPINFER_FP8_ACT_QUANT=1
 *              (cuda_blaslt.cu);
 *   - small:   up to 32 rows per matrix otherwise (fp8 decode, experts with few tokens):
 *              tensor cores (mma.sync) with tokens as the narrow dimension (cuda_gemm_small.cu);
 *   - wgmma:   grouped bf16 expert GEMMs with many rows per expert (tile table of BM = 128):
 *              Hopper warpgroup MMA, 128x256x64 tiles (cuda_gemm_wgmma.cu);
 *   - tiled:   everything else with 16-byte-aligned rows: grouped / batched / fp8 weight-only
 *              128x128x32 tiles, cp.async pipeline, mma.sync (cuda_gemm_tiled.cu);
 *   - generic: any shape (one thread per output, fp32), for odd dimensions of tiny models.
 * Every path accumulates in fp32; fp8 weights are dequantized with their block scales
 * (weight-only semantics) except on the opt-in cuBLASLt fp8 path, which also quantizes
 * activations (DeepSeek's recipe; off by default: it measured ~200 TFLOP/s here and adds
 * ~2-3% error per GEMM). */
#include "backend/cuda/cuda_internal.h"

/* ---------------------------------------------------------------- generic ---- */

static __device__ __forceinline__ float w_at(const wview &w, int mat, int n, int k) {
    if (w.fp8) {
        const __nv_fp8_e4m3 *p = (const __nv_fp8_e4m3 *)w.data + mat * w.mat_stride + (long)n * w.cols + k;
        float s = w.scale[wscale_at(w, mat, n, k)];
        return float(*p) * s;
    }
    return __bfloat162float(((const bf16 *)w.data)[mat * w.mat_stride + (long)n * w.cols + k]);
}

/* One block per (row j of matrix mat); threads over outputs. */
__global__ void k_gemm_generic(gemm_args a) {
    int mat = blockIdx.y, j = blockIdx.x;
    int r0 = 0, cnt = a.r.T;
    if (a.r.offsets) {
        r0 = a.r.offsets[mat];
        cnt = a.r.offsets[mat + 1] - r0;
    }
    if (j >= cnt) return;
    int xrow = a.r.offsets ? (a.r.perm ? a.r.perm[r0 + j] : r0 + j) : j;
    int yrow = a.r.offsets ? r0 + j : j;
    const bf16 *x = a.x + mat * a.x_mat_stride + (long)xrow * a.ldx;
    int K = a.w.cols, I = a.o.silu_I, N = I > 0 ? I : a.w.rows;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        float acc = 0.f, acc2 = 0.f;
        for (int k = 0; k < K; k++) {
            float xv = __bfloat162float(x[k]);
            acc += xv * w_at(a.w, mat, n, k);
            if (I > 0) acc2 += xv * w_at(a.w, mat, I + n, k);
        }
        if (I > 0) {
            if (a.o.silu_round) { /* the bits of a bf16 GEMM output, then silu_mul */
                acc = __bfloat162float(__float2bfloat16_rn(acc));
                acc2 = __bfloat162float(__float2bfloat16_rn(acc2));
            }
            acc = acc / (1.0f + expf(-acc)) * acc2;
        }
        long off = mat * a.o.y_mat_stride + (long)yrow * a.o.ldy + n;
        if (a.o.f32) {
            float *y = (float *)a.o.y + off;
            *y = a.o.accumulate ? *y + acc : acc;
        } else {
            bf16 *y = (bf16 *)a.o.y + off;
            *y = __float2bfloat16_rn(a.o.accumulate ? __bfloat162float(*y) + acc : acc);
        }
    }
}

void launch_gemm_generic(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    int rows = a->r.offsets ? a->r.max_per_mat : a->r.T;
    if (rows <= 0) return;
    dim3 grid(rows, a->n_mat);
    k_gemm_generic<<<grid, 128, 0, s>>>(*a);
    CUDA_LAUNCHED(st, "gemm_generic");
}

/* ---------------------------------------------------------------- dispatch ---- */

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* 1 if the fast kernels can read x and W with 16-byte accesses. */
static int fast_ok(const gemm_args *a) {
    const wview &w = a->w;
    if (w.cols % 8 != 0 || a->ldx % 8 != 0 || a->x_mat_stride % 8 != 0 || !aligned16(a->x) || !aligned16(w.data))
        return 0;
    if (w.fp8 && (w.bc % 16 != 0 || w.br <= 0)) return 0;
    return 1;
}

void cuda_gemm(cuda_state *st, const gemm_out *o, const bf16 *x, long ldx, long x_mat_stride, const di_weight *W,
               const gemm_rows *rows) {
    gemm_args a;
    a.x = x;
    a.ldx = ldx;
    a.x_mat_stride = x_mat_stride;
    a.o = *o;
    a.w = wview_of(W);
    a.r = *rows;
    a.n_mat = W->n;
    DI_ASSERT(W->dtype == DI_DTYPE_BF16 || W->dtype == DI_DTYPE_F8_E4M3);
    DI_ASSERT(o->silu_I <= 0 || W->rows == 2 * o->silu_I);
    if (a.r.T <= 0) return;
    if (!fast_ok(&a)) {
        launch_gemm_generic(st, &a, st->stream);
        return;
    }
    int grouped = a.r.offsets != NULL;
    int per = grouped ? a.r.max_per_mat : a.r.T;
    if (grouped) {
        /* average rows per matrix decides: weights dominate when experts see few tokens */
        int avg = (a.r.T + a.n_mat - 1) / a.n_mat;
        if (st->gemv && avg <= 2) launch_gemv(st, &a, st->stream);
        else if (st->wgmma && gemm_wgmma_ok(&a) && (a.r.tile_bm == 128 || wgmma_bm64(st, avg)))
            launch_gemm_wgmma(st, &a, st->stream);
        else if (avg <= 16 || per <= 32 || !a.r.tile_off) launch_gemm_small(st, &a, st->stream);
        else launch_gemm_tiled(st, &a, st->stream);
        return;
    }
    /* plain or batched (bmm): an FMA GEMV wins at one row, for narrow weights up to 4 rows (H200,
     * 2026-11-29) and since the GEMV's later tuning at two rows of any width (st->gemv_rows;
     * H100, 2026-12-06); cuBLASLt for bf16 from three rows on (>= 93% of copy bandwidth on the
     * 129280 x 2048 lm_head at 4..32 rows, where our mma kernel reached 41%) */
    if (st->gemv && (per == 1 || (per <= 4 && (a.w.rows <= 1024 || a.w.fp8)) || per <= st->gemv_rows)) {
        launch_gemv(st, &a, st->stream);
        return;
    }
    if (!a.w.fp8 && o->silu_I <= 0 && per >= st->lt_min_rows && lt_gemm(st, &a)) return;
    if (per <= 32) {
        launch_gemm_small(st, &a, st->stream);
        return;
    }
    if (a.w.fp8 && a.n_mat == 1 && o->silu_I <= 0 && lt_gemm(st, &a)) return; /* act-quant, opt-in */
    launch_gemm_tiled(st, &a, st->stream);
}

void cuda_linear(cuda_state *st, void *y, long ldy, int y_f32, int accumulate, const bf16 *x, long ldx,
                 const di_weight *W, int T) {
    gemm_out o = {y, ldy, 0, y_f32, accumulate, 0, 0};
    gemm_rows r = {NULL, NULL, NULL, 0, T, T, NULL, NULL};
    cuda_gemm(st, &o, x, ldx, 0, W, &r);
}

void cuda_matmul(di_backend *be, void *y, int ldy, const void *x, int ldx, const di_weight *W, int T,
                 unsigned flags) {
    DI_ASSERT(W && W->n == 1);
    DI_ASSERT(ldx >= W->cols && ldy >= W->rows);
    cuda_linear(cst(be), y, ldy, (flags & DI_MM_OUT_F32) != 0, (flags & DI_MM_ACCUMULATE) != 0, (const bf16 *)x,
                ldx, W, T);
}

/* backend.h matmul_silu: one token on the main lane (st->gu_silu, an experiment): the gate/up GEMV
 * with the SiLU-mul in its epilogue, gate and up rounded to bf16 first, so the bits of matmul +
 * silu_mul without the silu_mul launch. Not on the side lane: the shared experts' GEMV with the
 * SiLU-mul epilogue measured slower there (docs/PERF.md, 2026-12-02 early morning). */
int cuda_matmul_silu(di_backend *be, void *act, const void *x, int ldx, const di_weight *W, int I, int T) {
    cuda_state *st = cst(be);
    if (!st->gu_silu || T != 1 || st->on_side || !st->gemv || I <= 0 || W->n != 1 || W->rows != 2 * I ||
        ldx < W->cols || (W->dtype != DI_DTYPE_BF16 && W->dtype != DI_DTYPE_F8_E4M3))
        return 0;
    gemm_out o = {act, I, 0, 0, 0, I, 1};
    gemm_rows r = {NULL, NULL, NULL, 0, T, T, NULL, NULL};
    cuda_gemm(st, &o, (const bf16 *)x, ldx, 0, W, &r);
    return 1;
}

void cuda_bmm(di_backend *be, void *y, int ldy, int hsy, const void *x, int ldx, int hsx, const di_weight *W,
              int T) {
    if (T <= 0) return;
    gemm_out o = {y, ldy, hsy, 0, 0, 0, 0};
    gemm_rows r = {NULL, NULL, NULL, 0, T, T, NULL, NULL};
    cuda_gemm(cst(be), &o, (const bf16 *)x, ldx, hsx, W, &r);
}
