/* cuda_ops.cu - the CUDA backend's row-wise ops: embedding, RMSNorm (plain and fused with the
 * residual add), SiLU-mul, add, row gather, RoPE, and the paged latent-cache write / block copy.
 *
 * Owner: cuda. All memory-bound; one block (or warp) per row, 16-byte accesses when the row
 * layout allows, fp32 arithmetic, bf16 activations. The residual stream h is fp32 (backend.h):
 * embed widens bf16 table rows into it, add / add_rmsnorm add bf16 deltas to it in fp32, and
 * gather_rows copies its rows; rope_kv_write is the latent's rmsnorm, rope(q), rope(k_pe) and
 * kv_write in one launch, with the same arithmetic. Semantics match the CPU backend
 * (cpu_ops.c): RMSNorm statistics in fp32, y = w * (x * inv) rounded once to bf16 (add_rmsnorm
 * can also write y unrounded in fp32, the router's input); RoPE angles are fp32 pos * inv_freq
 * with cos/sin in double. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_rope.cuh"

/* ---------------------------------------------------------------- embed / gather ---- */

/* One block per output row: out[t, :] = fp32(table[ids[t], :]) (exact widening). */
__global__ void k_embed(float *out, const bf16 *table, const int32_t *ids, int D, int rows) {
    int t = blockIdx.x;
    /* an id outside the table (only a failed sample fed to the next step of an asynchronous
     * chain, whose results the engine discards, can be one) reads row 0 */
    unsigned id = (unsigned)ids[t];
    const bf16 *s = table + (long)(id < (unsigned)rows ? id : 0u) * D;
    float *o = out + (long)t * D;
    if ((D & 7) == 0) {
        const uint4 *s4 = (const uint4 *)s;
        for (int i = threadIdx.x; i < D / 8; i += blockDim.x) {
            uint4 u = s4[i];
            const bf16 *b = (const bf16 *)&u;
            float4 lo = make_float4(__bfloat162float(b[0]), __bfloat162float(b[1]), __bfloat162float(b[2]),
                                    __bfloat162float(b[3]));
            float4 hi = make_float4(__bfloat162float(b[4]), __bfloat162float(b[5]), __bfloat162float(b[6]),
                                    __bfloat162float(b[7]));
            ((float4 *)o)[2 * i] = lo;
            ((float4 *)o)[2 * i + 1] = hi;
        }
    } else {
        for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = __bfloat162float(s[i]);
    }
}

void cuda_embed(di_backend *be, float *out, const di_weight *table, const int32_t *ids, int T) {
    cuda_state *st = cst(be);
    DI_ASSERT(table->dtype == DI_DTYPE_BF16 && table->n == 1);
    if (T <= 0) return;
    k_embed<<<T, 128, 0, st->stream>>>(out, (const bf16 *)table->data, ids, table->cols, table->rows);
    CUDA_LAUNCHED(st, "embed");
}

/* One block per output row of f32 values. */
__global__ void k_copy_rows_f32(float *out, const float *src, const int32_t *rows, int D) {
    int t = blockIdx.x;
    const float *s = src + (long)rows[t] * D;
    float *o = out + (long)t * D;
    if ((D & 3) == 0) {
        for (int i = threadIdx.x; i < D / 4; i += blockDim.x) ((float4 *)o)[i] = ((const float4 *)s)[i];
    } else {
        for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = s[i];
    }
}

void cuda_gather_rows(di_backend *be, float *out, const float *x, const int32_t *rows, int n, int D) {
    cuda_state *st = cst(be);
    if (n <= 0) return;
    k_copy_rows_f32<<<n, 128, 0, st->stream>>>(out, x, rows, D);
    CUDA_LAUNCHED(st, "gather_rows");
}

/* ---------------------------------------------------------------- rmsnorm ---- */

/* One block per row of bf16 activations (strided; in place allowed). */
__global__ void k_rmsnorm(bf16 *out, long ldo, const bf16 *x, long ldx, const float *w, float eps, int D) {
    __shared__ float red[32];
    extern __shared__ float row[];  /* [D] fp32 copy of the row */
    int t = blockIdx.x;
    const bf16 *xr = x + (long)t * ldx;
    float ss = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = __bfloat162float(xr[i]);
        row[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red);
    float inv = (float)(1.0 / sqrt((double)ss / D + (double)eps));
    bf16 *o = out + (long)t * ldo;
    for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = __float2bfloat16_rn(w[i] * (row[i] * inv));
}

/* One block per row of the fp32 residual stream: h += delta (fp32 add; delta may be NULL),
 * then out = bf16(w * (h * inv)) and, if out_f32, the same product unrounded. */
__global__ void k_add_rmsnorm(bf16 *out, float *out_f32, float *h, const bf16 *delta, const float *w, float eps,
                              int D) {
    __shared__ float red[32];
    extern __shared__ float row[];  /* [D] the updated row */
    int t = blockIdx.x;
    float *hr = h + (long)t * D;
    float ss = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = hr[i];
        if (delta) {
            v += __bfloat162float(delta[(long)t * D + i]);
            hr[i] = v;
        }
        row[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red);
    float inv = (float)(1.0 / sqrt((double)ss / D + (double)eps));
    bf16 *o = out + (long)t * D;
    float *of = out_f32 ? out_f32 + (long)t * D : NULL;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float y = w[i] * (row[i] * inv);
        o[i] = __float2bfloat16_rn(y);
        if (of) of[i] = y;
    }
}

/* Vectorised forms for the model's shapes (16-byte rows, D <= 8192): each thread keeps at most
 * two 16-byte pieces of its row and of w in registers, loaded before the reduction, so a row is
 * one round of loads, a block sum and one round of stores (the generic kernels above stage the
 * row in shared memory and reload w after the sum). Same arithmetic per element; the sum of
 * squares is added in another order. */
static __device__ __forceinline__ float sq4(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }

/* COMB (add_rmsnorm_experts): delta is the routed experts' combine mc, computed here with
 * k_moe_combine_v8's arithmetic (fp32 in j order, rounded to bf16) instead of read. Its rows and
 * weights take registers, so it is a variant of its own: the plain kernel keeps its register
 * count, which V3's 896 threads per row (D = 7168) need (add_rmsnorm_vec checks the variant's
 * thread limit). */
template <bool COMB>
__global__ void k_add_rmsnorm_v4(bf16 *out, float *out_f32, float *h, const bf16 *delta, const float *w, float eps,
                                 int D, int pdl, moe_comb mc) {
    __shared__ float red[32];
    const int t = blockIdx.x, D4 = D >> 2;
    float4 *hr = (float4 *)(h + (long)t * D);
    float4 v[2], wv[2];
    float ss = 0.f;
#pragma unroll
    for (int q = 0; q < 2; q++) { /* the norm weights (constant) first: before the wait under PDL */
        int i = threadIdx.x + q * blockDim.x;
        if (i < D4) wv[q] = __ldg((const float4 *)w + i);
    }
    /* the combine's rows and weights too: the permutation and the router wrote them before the
     * down GEMM, the plain launch this PDL chain starts after (cuda_pdl.cuh) */
    int crow[COMB ? COMBINE_MAXK : 1];
    float cw[COMB ? COMBINE_MAXK : 1];
    if constexpr (COMB)
#pragma unroll
        for (int j = 0; j < COMBINE_MAXK; j++)
            if (j < mc.k) {
                crow[j] = mc.slot_of[(long)t * mc.k + j];
                cw[j] = mc.w[(long)t * mc.k + j];
            }
    if (pdl) {
        pdl_launch_dependents();
        pdl_wait();
    }
#pragma unroll
    for (int q = 0; q < 2; q++) {
        int i = threadIdx.x + q * blockDim.x;
        if (i >= D4) continue;
        v[q] = hr[i];
        if constexpr (COMB) {
            uint2 r[COMBINE_MAXK];
#pragma unroll
            for (int j = 0; j < COMBINE_MAXK; j++)
                if (j < mc.k) r[j] = *(const uint2 *)(mc.Y + (long)crow[j] * D + 4 * i);
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int j = 0; j < COMBINE_MAXK; j++)
                if (j < mc.k) {
                    float wj = cw[j];
                    const bf16 *b = (const bf16 *)&r[j];
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[c] += wj * __bfloat162float(b[c]);
                }
            v[q].x += __bfloat162float(__float2bfloat16_rn(acc[0]));
            v[q].y += __bfloat162float(__float2bfloat16_rn(acc[1]));
            v[q].z += __bfloat162float(__float2bfloat16_rn(acc[2]));
            v[q].w += __bfloat162float(__float2bfloat16_rn(acc[3]));
            hr[i] = v[q];
        } else if (delta) {
            uint2 u = *(const uint2 *)(delta + (long)t * D + 4 * i);
            const bf16 *b = (const bf16 *)&u;
            v[q].x += __bfloat162float(b[0]);
            v[q].y += __bfloat162float(b[1]);
            v[q].z += __bfloat162float(b[2]);
            v[q].w += __bfloat162float(b[3]);
            hr[i] = v[q];
        }
        ss += sq4(v[q]);
    }
    ss = block_sum(ss, red);
    float inv = (float)(1.0 / sqrt((double)ss / D + (double)eps));
#pragma unroll
    for (int q = 0; q < 2; q++) {
        int i = threadIdx.x + q * blockDim.x;
        if (i >= D4) continue;
        float4 y = make_float4(wv[q].x * (v[q].x * inv), wv[q].y * (v[q].y * inv), wv[q].z * (v[q].z * inv),
                               wv[q].w * (v[q].w * inv));
        __nv_bfloat162 lo = __floats2bfloat162_rn(y.x, y.y), hi = __floats2bfloat162_rn(y.z, y.w);
        uint2 u;
        u.x = *(const uint32_t *)&lo;
        u.y = *(const uint32_t *)&hi;
        *(uint2 *)(out + (long)t * D + 4 * i) = u;
        if (out_f32) ((float4 *)(out_f32 + (long)t * D))[i] = y;
    }
}

__global__ void k_rmsnorm_v8(bf16 *out, long ldo, const bf16 *x, long ldx, const float *w, float eps, int D,
                             int pdl) {
    __shared__ float red[32];
    if (pdl) { /* launched with PDL (st->norm_pdl) */
        pdl_launch_dependents();
        pdl_wait();
    }
    const int t = blockIdx.x, D8 = D >> 3;
    float v[2][8];
    float ss = 0.f;
#pragma unroll
    for (int q = 0; q < 2; q++) {
        int i = threadIdx.x + q * blockDim.x;
        if (i >= D8) continue;
        norm8_in(*(const uint4 *)(x + (long)t * ldx + 8 * i), v[q], ss);
    }
    ss = block_sum(ss, red); /* its barriers also order an in-place row's reads before the writes */
    float inv = norm_inv(ss, D, eps);
#pragma unroll
    for (int q = 0; q < 2; q++) {
        int i = threadIdx.x + q * blockDim.x;
        if (i >= D8) continue;
        *(uint4 *)(out + (long)t * ldo + 8 * i) = norm8_out(w, i, v[q], inv);
    }
}

/* Threads for a vectorised norm of n pieces, two per thread; 0 if the row is too long. */
static int norm_threads_vec(int n) {
    int th = ((n + 1) / 2 + 31) / 32 * 32;
    return th <= 1024 ? th : 0;
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static int norm_threads(int D) {
    int t = 128;
    while (t < 1024 && t * 8 < D) t *= 2;
    return t;
}

void cuda_rmsnorm(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w, float eps, int T,
                  int D) {
    cuda_state *st = cst(be);
    DI_ASSERT(w->dtype == DI_DTYPE_F32 && w->cols == D);
    if (T <= 0) return;
    /* in place is fine: each thread reads its elements into `row` before any write */
    int vt = norm_threads_vec(D / 8);
    bool pdl = pdl_with(st, st->norm_pdl);
    if (D % 8 == 0 && ldo % 8 == 0 && ldx % 8 == 0 && vt && aligned16(out) && aligned16(x) && aligned16(w->data))
        cuda_launch_pdl(st, pdl, k_rmsnorm_v8, dim3(T), dim3(vt), 0, (bf16 *)out, (long)ldo, (const bf16 *)x, (long)ldx,
                        (const float *)w->data, eps, D, (int)pdl);
    else
        k_rmsnorm<<<T, norm_threads(D), (size_t)D * sizeof(float), st->stream>>>(
            (bf16 *)out, ldo, (const bf16 *)x, ldx, (const float *)w->data, eps, D);
    CUDA_LAUNCHED(st, "rmsnorm");
}

/* The most threads a block of the combining variant may have (its registers), once. */
static int comb_max_threads(void) {
    static int max_threads = -1; /* host-only, set once */
    if (max_threads < 0) {
        cudaFuncAttributes fa;
        max_threads = cudaFuncGetAttributes(&fa, k_add_rmsnorm_v4<true>) == cudaSuccess ? fa.maxThreadsPerBlock : 0;
        cudaGetLastError();
    }
    return max_threads;
}

/* The vectorised kernel's conditions (mc: with a combine, whose rows are 8-byte aligned when
 * Y is and D % 4 == 0) */
static bool add_rmsnorm_vec(const float *h, const void *delta, const void *out, const float *out_f32,
                            const di_weight *w, int D, const moe_comb *mc) {
    return D % 4 == 0 && norm_threads_vec(D / 4) && aligned16(h) && aligned16(w->data) &&
           (!out_f32 || aligned16(out_f32)) && ((uintptr_t)out & 7) == 0 && (!delta || ((uintptr_t)delta & 7) == 0) &&
           (!mc || (mc->k <= COMBINE_MAXK && ((uintptr_t)mc->Y & 7) == 0 &&
                    norm_threads_vec(D / 4) <= comb_max_threads()));
}

static void launch_add_rmsnorm_v4(cuda_state *st, float *h, const void *delta, void *out, float *out_f32,
                                  const di_weight *w, float eps, int T, int D, moe_comb mc) {
    bool pdl = pdl_with(st, st->norm_pdl);
    cuda_launch_pdl(st, pdl, mc.Y ? k_add_rmsnorm_v4<true> : k_add_rmsnorm_v4<false>, dim3(T),
                    dim3(norm_threads_vec(D / 4)), 0, (bf16 *)out, out_f32, h, (const bf16 *)delta,
                    (const float *)w->data, eps, D, (int)pdl, mc);
}

void cuda_add_rmsnorm(di_backend *be, float *h, const void *delta, void *out, float *out_f32, const di_weight *w,
                      float eps, int T, int D) {
    cuda_state *st = cst(be);
    DI_ASSERT(w->dtype == DI_DTYPE_F32 && w->cols == D && out != (void *)h && out_f32 != h);
    if (T <= 0) return;
    if (add_rmsnorm_vec(h, delta, out, out_f32, w, D, NULL))
        launch_add_rmsnorm_v4(st, h, delta, out, out_f32, w, eps, T, D, moe_comb{});
    else
        k_add_rmsnorm<<<T, norm_threads(D), (size_t)D * sizeof(float), st->stream>>>(
            (bf16 *)out, out_f32, h, (const bf16 *)delta, (const float *)w->data, eps, D);
    CUDA_LAUNCHED(st, "add_rmsnorm");
}

/* backend.h add_rmsnorm_experts: the combine inside the vectorised add + RMSNorm; where that
 * kernel cannot run, the combine kernel into the scratch's spare rows, then add_rmsnorm. */
void cuda_add_rmsnorm_experts(di_backend *be, float *h, const void *scratch, const float *topk_w, int k, void *out,
                              float *out_f32, const di_weight *w, float eps, int T, int D) {
    cuda_state *st = cst(be);
    DI_ASSERT(st->deferred.scratch == scratch && st->deferred.c.w == topk_w && st->deferred.c.k == k &&
              st->deferred.T == T && st->deferred.D == D);
    DI_ASSERT(w->dtype == DI_DTYPE_F32 && w->cols == D && out != (void *)h && out_f32 != h);
    moe_comb mc = st->deferred.c;
    st->deferred.scratch = NULL;
    if (T <= 0) return;
    if (add_rmsnorm_vec(h, NULL, out, out_f32, w, D, &mc)) {
        launch_add_rmsnorm_v4(st, h, NULL, out, out_f32, w, eps, T, D, mc);
        CUDA_LAUNCHED(st, "add_rmsnorm_experts");
        return;
    }
    cuda_moe_combine_launch(st, st->deferred.spare, &mc, D, T);
    cuda_add_rmsnorm(be, h, st->deferred.spare, out, out_f32, w, eps, T, D);
}

/* ---------------------------------------------------------------- silu_mul / add ---- */

__global__ void k_silu_mul(bf16 *out, const bf16 *gu, int T, int I) {
    long n = (long)T * I;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long t = i / I, c = i % I;
        float g = __bfloat162float(gu[t * 2 * I + c]), u = __bfloat162float(gu[t * 2 * I + I + c]);
        out[i] = __float2bfloat16_rn(silu_f(g) * u);
    }
}

/* The same, 8 outputs per thread (I % 8 == 0, 16-byte aligned rows): one 16-byte load of gate,
 * one of up, one store; same arithmetic per element, so the same bits. */
__global__ void k_silu_mul_v8(bf16 *out, const bf16 *gu, int T, int I8) {
    pdl_wait(); /* st->silu_pdl; it releases nothing early (the down GEMV's many blocks would wait on SMs) */
    long n = (long)T * I8;
    for (long v = blockIdx.x * (long)blockDim.x + threadIdx.x; v < n; v += (long)gridDim.x * blockDim.x) {
        long t = v / I8;
        int c = (int)(v - t * I8);
        const uint4 *row = (const uint4 *)(gu + t * 16 * I8);
        ((uint4 *)out)[v] = silu_mul_bf16x8(row[c], row[I8 + c]);
    }
}

static int grid_for(long n, int threads) {
    long b = (n + threads - 1) / threads;
    return (int)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

void cuda_silu_mul(di_backend *be, void *out, const void *gu, int T, int I) {
    cuda_state *st = cst(be);
    if (T <= 0 || I <= 0) return;
    if (I % 8 == 0 && aligned16(out) && aligned16(gu))
        /* PDL for the GEMV-sized steps (measured at one token; larger steps not measured) */
        cuda_launch_pdl(st, pdl_with(st, st->silu_pdl && T <= 4), k_silu_mul_v8,
                        dim3(grid_for((long)T * I / 8, 256)), dim3(256), 0, (bf16 *)out, (const bf16 *)gu, T, I / 8);
    else
        k_silu_mul<<<grid_for((long)T * I, 256), 256, 0, st->stream>>>((bf16 *)out, (const bf16 *)gu, T, I);
    CUDA_LAUNCHED(st, "silu_mul");
}

__global__ void k_add(float *y, const bf16 *x, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        y[i] += __bfloat162float(x[i]);
}

/* The same, 4 elements per thread (n % 4 == 0, y 16-byte and x 8-byte aligned). */
__global__ void k_add_v4(float4 *y, const uint2 *x, long n4) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        uint2 xr = x[i];
        const bf16 *b = (const bf16 *)&xr;
        float4 v = y[i];
        v.x += __bfloat162float(b[0]);
        v.y += __bfloat162float(b[1]);
        v.z += __bfloat162float(b[2]);
        v.w += __bfloat162float(b[3]);
        y[i] = v;
    }
}

void cuda_add(di_backend *be, float *y, const void *x, size_t n) {
    cuda_state *st = cst(be);
    if (!n) return;
    if (n % 4 == 0 && aligned16(y) && ((uintptr_t)x & 7) == 0)
        k_add_v4<<<grid_for((long)n / 4, 256), 256, 0, st->stream>>>((float4 *)y, (const uint2 *)x, (long)n / 4);
    else
        k_add<<<grid_for((long)n, 256), 256, 0, st->stream>>>(y, (const bf16 *)x, (long)n);
    CUDA_LAUNCHED(st, "add");
}

/* ---------------------------------------------------------------- rope ---- */

/* One block per token; threads over (head, pair). */
__global__ void k_rope(bf16 *x, long ldx, int n_heads, int hs, const int32_t *positions, int dim, int interleave,
                       float mscale, const float *inv_freq) {
    extern __shared__ float cs[]; /* [half] cos, then [half] sin */
    pdl_launch_dependents();
    pdl_wait(); /* PDL (cuda_pdl.cuh): everything below reads the step's data */
    int t = blockIdx.x, half = dim / 2;
    float pos = (float)positions[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) rope_cos_sin(pos, inv_freq[i], mscale, &cs[i], &cs[half + i]);
    __syncthreads();
    for (int j = threadIdx.x; j < n_heads * half; j += blockDim.x) {
        int h = j / half, i = j % half;
        bf16 *v = x + (long)t * ldx + (long)h * hs;
        int a = interleave ? 2 * i : i, b = interleave ? 2 * i + 1 : i + half;
        rope_pair(__bfloat162float(v[a]), __bfloat162float(v[b]), cs[i], cs[half + i], &v[a], &v[b]);
    }
}

void cuda_rope(di_backend *be, void *x, int ldx, int n_heads, int hs, const int32_t *positions, int T,
               const di_rope_params *rp) {
    cuda_state *st = cst(be);
    DI_ASSERT(rp->dim % 2 == 0);
    if (T <= 0) return;
    cuda_launch_pdl(st, st->pdl >= 2, k_rope, dim3(T), dim3(128), (size_t)rp->dim * sizeof(float), (bf16 *)x, (long)ldx,
                    n_heads, hs, positions, rp->dim, rp->interleave, rp->mscale, rp->inv_freq);
    CUDA_LAUNCHED(st, "rope");
}

/* The latent's RMSNorm (optional), rope of q, rope of k_pe and the cache write in one launch
 * (backend.h rope_kv_write): one block per token.
 *  - norm (nw != NULL): the first nvt threads do k_rmsnorm_v8's work for the row's first
 *    kv_rope elements with k_rmsnorm_v8's arithmetic and reduction order at block size nvt
 *    (the size cuda_rmsnorm launches it with), writing the normed values to kv and the cache row;
 *  - rope: threads over the (head, pair)s of q and then the pairs of k_pe, whose rotated values
 *    go to kv and to the cache row, in chunks of RKV_U pairs per thread whose loads are all
 *    issued before the first store (the pairs are distinct elements, so this is the same as
 *    one pair at a time); k_rope's arithmetic. The first chunk, the norm's pieces, the position
 *    and the slot are all loaded before anything is stored: one memory round trip;
 *  - the rest of the kv row (the latent when not normed, anything outside k_pe) copied as is.
 * So the results are those of the separate launches, bit for bit (test_cuda_ops rows). */
enum { RKV_U = 4 };
__global__ void k_rope_kv_write(bf16 *q, long ldq, int n_heads, int hsq, bf16 *kv, long ldkv, int kv_rope,
                                bf16 *cache, const int32_t *slots, int W, const int32_t *positions, int dim,
                                int interleave, float mscale, const float *inv_freq, const float *nw, float eps,
                                int nvt, int early, int late) {
    extern __shared__ float cs[]; /* [half] cos, then [half] sin */
    __shared__ float red[32];
    if (!late) pdl_launch_dependents(); /* late: after the wait below (its dependent's blocks would
                                         * hold SM slots beside the GEMV this one waits for) */
    if (!early) pdl_wait();
    /* kv == NULL: q only (nw and cache unused); n_heads == 0: the kv part only */
    const int t = blockIdx.x, half = dim / 2, tid = threadIdx.x, np = (n_heads + (kv ? 1 : 0)) * half;
    bf16 *krow = kv ? kv + (long)t * ldkv : NULL;
    /* a chunk of RKV_U rope pairs per thread (pair j: head j / half, or k_pe for the last) */
    bf16 *vp[RKV_U];
    int ia[RKV_U], ib[RKV_U], ii[RKV_U];
    float xa[RKV_U], xb[RKV_U];
    auto load_chunk = [&](int j0) {
#pragma unroll
        for (int u = 0; u < RKV_U; u++) {
            int j = j0 + u * blockDim.x;
            if (j >= np) continue;
            int h = j / half, i = j % half;
            vp[u] = h == n_heads ? krow + kv_rope : q + (long)t * ldq + (long)h * hsq;
            ii[u] = i;
            ia[u] = interleave ? 2 * i : i;
            ib[u] = interleave ? 2 * i + 1 : i + half;
            xa[u] = __bfloat162float(vp[u][ia[u]]);
            xb[u] = __bfloat162float(vp[u][ib[u]]);
        }
    };
    /* every first-round load before anything is stored (one memory round trip): the step's
     * position and slot, the first rope chunk (q and k_pe, which the norm does not touch) and
     * the norm's pieces of the latent */
    const int pos_raw = positions[t], slot = slots[t];
    float pos = (float)pos_raw;
    auto cos_sin = [&]() {
        for (int i = tid; i < half; i += blockDim.x) rope_cos_sin(pos, inv_freq[i], mscale, &cs[i], &cs[half + i]);
    };
    if (early) { /* the position is the step's upload: the cos / sin table before the wait */
        cos_sin();
        pdl_wait();
    }
    if (late) pdl_launch_dependents();
    load_chunk(tid);
    const int D8 = kv_rope >> 3;
    uint4 nraw[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
    if (nw)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int i = tid + r * nvt;
            if (tid < nvt && i < D8) nraw[r] = *(const uint4 *)(krow + 8 * i);
        }
    bf16 *crow = kv && slot >= 0 ? cache + (long)slot * W : NULL;
    if (!early) cos_sin();
    const int copy_from = nw ? kv_rope : 0; /* the normed latent is written by the norm below */
    if (crow)
        for (int i = copy_from + tid; i < W; i += blockDim.x)
            if (i < kv_rope || i >= kv_rope + dim) crow[i] = krow[i];
    if (nw) {
        float v[2][8];
        float ss = 0.f;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int i = tid + r * nvt;
            if (tid >= nvt || i >= D8) continue;
            norm8_in(nraw[r], v[r], ss);
        }
        /* block_sum over the first nvt / 32 warps, in warp order */
        ss = warp_sum(ss);
        __syncthreads();
        if ((tid & 31) == 0 && tid < nvt) red[tid >> 5] = ss;
        __syncthreads();
        float sum = 0.f;
        for (int w = 0; w < nvt >> 5; w++) sum += red[w];
        float inv = norm_inv(sum, kv_rope, eps);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int i = tid + r * nvt;
            if (tid >= nvt || i >= D8) continue;
            uint4 o = norm8_out(nw, i, v[r], inv);
            *(uint4 *)(krow + 8 * i) = o;
            if (crow) *(uint4 *)(crow + 8 * i) = o;
        }
    }
    __syncthreads();
    for (int j0 = tid; j0 < np; j0 += RKV_U * blockDim.x) {
        if (j0 != tid) load_chunk(j0);
#pragma unroll
        for (int u = 0; u < RKV_U; u++) {
            int j = j0 + u * blockDim.x;
            if (j >= np) continue;
            bf16 ya, yb;
            rope_pair(xa[u], xb[u], cs[ii[u]], cs[half + ii[u]], &ya, &yb);
            vp[u][ia[u]] = ya;
            vp[u][ib[u]] = yb;
            if (j / half == n_heads && crow) {
                crow[kv_rope + ia[u]] = ya;
                crow[kv_rope + ib[u]] = yb;
            }
        }
    }
}

void cuda_rope_kv_write(di_backend *be, void *q, int ldq, int n_heads, int hsq, void *kv, int ldkv, int kv_rope,
                        void *cache, const int32_t *slot_mapping, int W, const int32_t *positions, int T,
                        const di_rope_params *rp, const di_weight *kv_norm, float eps) {
    cuda_state *st = cst(be);
    DI_ASSERT(rp->dim % 2 == 0 && (!kv || (kv_rope >= 0 && kv_rope + rp->dim <= W)) && (kv || n_heads > 0));
    if (T <= 0) return;
    enum { THREADS = 256 };
    const float *nw = NULL;
    int nvt = 0;
    if (!kv) kv_norm = NULL;
    if (kv_norm) {
        DI_ASSERT(kv_norm->dtype == DI_DTYPE_F32 && kv_norm->cols == kv_rope);
        /* in the launch when cuda_rmsnorm would take k_rmsnorm_v8 with at most THREADS threads;
         * else the separate norm first (the same bits either way) */
        nvt = norm_threads_vec(kv_rope / 8);
        if (kv_rope % 8 == 0 && ldkv % 8 == 0 && nvt && nvt <= THREADS && aligned16(kv) && aligned16(kv_norm->data)) {
            nw = (const float *)kv_norm->data;
        } else {
            cuda_rmsnorm(be, kv, ldkv, kv, ldkv, kv_norm, eps, T, kv_rope);
            nvt = 0;
        }
    }
    /* measured (v2lite-8l): the whole op forked onto the side lane after the query GEMV, -1.3%
     * at one token, +1.1% at 16; a half (the model's split) follows its producer in the same
     * lane, so it can start early at one token too; larger steps not measured */
    bool half_op = !kv || n_heads == 0;
    bool early = pdl_with(st, st->rope_pdl && T <= 16 && (T >= 2 || half_op));
    /* the q-only half (the model's split: followed by the W_UK GEMV on the same lane while the
     * side lane's latent GEMV still needs SM slots) releases its dependent after its wait */
    bool late = st->rope_late && !kv;
    cuda_launch_pdl(st, st->pdl >= 2 || early, k_rope_kv_write, dim3(T), dim3(THREADS), (size_t)rp->dim * sizeof(float),
                    (bf16 *)q, (long)ldq, n_heads, hsq, (bf16 *)kv, (long)ldkv, kv_rope, (bf16 *)cache, slot_mapping, W,
                    positions, rp->dim, rp->interleave, rp->mscale, rp->inv_freq, nw, eps, nvt, (int)early, (int)late);
    CUDA_LAUNCHED(st, "rope_kv_write");
}

/* ---------------------------------------------------------------- KV cache ---- */

/* T: the cache's element type (bf16, or float for the f32 op table, st->f32) */
template <typename T>
__global__ void k_kv_write(T *cache, const T *kv, long ldkv, const int32_t *slots, int W) {
    pdl_launch_dependents(); /* the next GEMV may start loading its weights */
    pdl_wait();
    int t = blockIdx.x;
    int slot = slots[t];
    if (slot < 0) return;
    T *d = cache + (long)slot * W;
    const T *s = kv + (long)t * ldkv;
    for (int i = threadIdx.x; i < W; i += blockDim.x) d[i] = s[i];
}

void cuda_kv_write(di_backend *be, void *cache, const void *kv, int ldkv, const int32_t *slot_mapping, int T,
                   int W) {
    cuda_state *st = cst(be);
    if (T <= 0) return;
    if (st->f32)
        cuda_launch_pdl(st, st->pdl >= 2, k_kv_write<float>, dim3(T), dim3(128), 0, (float *)cache, (const float *)kv,
                        (long)ldkv, slot_mapping, W);
    else
        cuda_launch_pdl(st, st->pdl >= 2, k_kv_write<bf16>, dim3(T), dim3(128), 0, (bf16 *)cache, (const bf16 *)kv,
                        (long)ldkv, slot_mapping, W);
    CUDA_LAUNCHED(st, "kv_write");
}

void cuda_kv_copy_blocks(di_backend *be, void *cache, size_t layer_stride, int n_layers, int W, const int32_t *src,
                         const int32_t *dst, int n) {
    cuda_state *st = cst(be);
    size_t es = st->f32 ? sizeof(float) : sizeof(bf16), block = (size_t)DI_KV_BLOCK_SIZE * W * es;
    for (int l = 0; l < n_layers; l++) {
        char *base = (char *)cache + (size_t)l * layer_stride * es;
        for (int i = 0; i < n; i++)
            if (src[i] != dst[i])
                cuda_note(st, cudaMemcpyAsync(base + (size_t)dst[i] * block, base + (size_t)src[i] * block, block,
                                              cudaMemcpyDeviceToDevice, st->stream),
                          "kv_copy_blocks");
    }
}
