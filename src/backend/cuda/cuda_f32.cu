/* cuda_f32.cu - the CUDA backend's fp32 op table (DI_PRECISION_F32, `--dtype f32`): weights,
 * activations and the KV cache all in fp32, each op the CPU backend's arithmetic (src/backend/
 * cpu) on the GPU. It is the reproducible reference mode: the bf16 path's end-to-end misses
 * against transformers are bf16 routing flips (docs/cuda.md "Which roundings flip the routing"),
 * and this table computes like the CPU, which matches transformers to ~1e-6.
 *
 * Owner: cuda. Plain SIMT kernels, not tuned: a 64 x 64-tile GEMM and a skinny one for <= 64
 * rows (each output summed over k in order 0..K-1 with fmaf by both, so the same row gives the
 * same bits in any batch), the grouped expert
 * GEMM over a device-side permutation (one block plans counts, offsets and row tiles; no host
 * synchronisation), one block per (token, head) for MLA (the weight-absorbed form for decode and
 * prefill alike: prefill's W_UK / W_UV are the rows of W_kvb, applied per token chunk, so
 * memory stays linear in context), the router's logits in fp32 then the bf16 table's top-k
 * selection (cuda_router.cu, shared), and kv_write / kv_copy_blocks, the V3.2 indexer / layernorm
 * and the sampler shared with the bf16 table (templated on the element type or sized by it, or f32
 * already). Memory, streams, lanes, graphs
 * and async copies are the bf16 table's (cuda_backend.cu). Reductions that the CPU does in double
 * (RMSNorm's sum of squares, RoPE's cos / sin) are in double here too. */
#include <math.h>

#include "backend/cuda/cuda_internal.h"

enum { F32_TILE = 64, F32_BK = 16, F32_GEMM_THREADS = 256, F32_ATT_THREADS = 128, F32_PREFILL_CHUNK = 256 };
/* the skinny GEMM: up to SK_M rows x SK_N outputs per block, SK_K columns of W staged at a time
 * by SK_THREADS threads; used for at most SK_MAX_ROWS rows (plain) or (token, expert) rows
 * (grouped) */
enum { SK_M = 4, SK_N = 32, SK_K = 256, SK_THREADS = 256, SK_MAX_ROWS = 64 };

static inline size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static int row_threads(int D) {
    int th = 32;
    while (th < 256 && th < D) th *= 2;
    return th;
}

/* ---------------------------------------------------------------- rows ---- */

__global__ void k32_embed(float *out, const float *tab, const int32_t *ids, int D) {
    const float *src = tab + (long)ids[blockIdx.x] * D;
    float *dst = out + (long)blockIdx.x * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) dst[i] = src[i];
}

static void f32_embed(di_backend *be, float *out, const di_weight *table, const int32_t *ids, int T) {
    cuda_state *st = cst(be);
    DI_ASSERT(table->dtype == DI_DTYPE_F32 && table->n == 1);
    if (T <= 0) return;
    k32_embed<<<T, row_threads(table->cols), 0, st->stream>>>(out, (const float *)table->data, ids, table->cols);
    CUDA_LAUNCHED(st, "embed (f32)");
}

/* y = w ⊙ (x / sqrt(mean(x²) + eps)), the sum of squares in double (as cpu_ops.c norm_row);
 * out may alias x: every thread reads and writes only its own elements, the second pass after
 * the reduction. h != NULL: h += delta first (add_rmsnorm), then the norm of h; out_f32 gets
 * the same values (act is f32). */
__global__ void k32_norm(float *out, long ldo, const float *x, long ldx, float *h, const float *delta, float *out_f32,
                         const float *w, float eps, int D) {
    __shared__ double red[32];
    const long t = blockIdx.x;
    const float *xr = h ? h + t * D : x + t * ldx;
    double ss = 0.0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = xr[i];
        if (h && delta) {
            v += delta[t * D + i];
            h[t * D + i] = v;
        }
        ss += (double)v * v;
    }
    ss = block_sum(ss, red);
    float inv = (float)(1.0 / sqrt(ss / D + (double)eps));
    float *o = out + t * ldo;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float y = w[i] * (xr[i] * inv);
        o[i] = y;
        if (out_f32) out_f32[t * D + i] = y;
    }
}

static void f32_rmsnorm(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w, float eps,
                        int T, int D) {
    cuda_state *st = cst(be);
    DI_ASSERT(w->cols == D && w->n == 1 && w->dtype == DI_DTYPE_F32);
    if (T <= 0) return;
    k32_norm<<<T, row_threads(D), 0, st->stream>>>((float *)out, ldo, (const float *)x, ldx, NULL, NULL, NULL,
                                                    (const float *)w->data, eps, D);
    CUDA_LAUNCHED(st, "rmsnorm (f32)");
}

static void f32_add_rmsnorm(di_backend *be, float *h, const void *delta, void *out, float *out_f32, const di_weight *w,
                            float eps, int T, int D) {
    cuda_state *st = cst(be);
    DI_ASSERT(w->cols == D && w->n == 1 && w->dtype == DI_DTYPE_F32 && (void *)h != out && h != out_f32);
    if (T <= 0) return;
    k32_norm<<<T, row_threads(D), 0, st->stream>>>((float *)out, D, NULL, 0, h, (const float *)delta, out_f32,
                                                    (const float *)w->data, eps, D);
    CUDA_LAUNCHED(st, "add_rmsnorm (f32)");
}

/* out[t, i] = silu(g) * u as cpu_ops.c: g / (1 + exp(-g)) * u. */
__global__ void k32_silu_mul(float *out, const float *gu, long T, int I) {
    long n = T * I;
    for (long j = (long)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (long)gridDim.x * blockDim.x) {
        long t = j / I;
        int i = (int)(j % I);
        float g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
        out[j] = g / (1.0f + expf(-g)) * u;
    }
}

static unsigned grid_for(long n, int threads) {
    long b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535L * 8 ? 65535L * 8 : b);
}

static void f32_silu_mul(di_backend *be, void *out, const void *gu, int T, int I) {
    cuda_state *st = cst(be);
    if (T <= 0 || I <= 0) return;
    k32_silu_mul<<<grid_for((long)T * I, 256), 256, 0, st->stream>>>((float *)out, (const float *)gu, T, I);
    CUDA_LAUNCHED(st, "silu_mul (f32)");
}

__global__ void k32_add(float *y, const float *x, long n) {
    for (long j = (long)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (long)gridDim.x * blockDim.x) y[j] += x[j];
}

static void f32_add(di_backend *be, float *y, const void *x, size_t n) {
    cuda_state *st = cst(be);
    if (!n) return;
    k32_add<<<grid_for((long)n, 256), 256, 0, st->stream>>>(y, (const float *)x, (long)n);
    CUDA_LAUNCHED(st, "add (f32)");
}

/* One block per token: angles in fp32 (pos · inv_freq, as HF), cos / sin in double rounded once,
 * times mscale (cpu_ops.c di_cpu_rope); threads over (head, pair). */
__global__ void k32_rope(float *x, long ldx, int n_heads, long hs, const int32_t *positions, int dim, int interleave,
                         float mscale, const float *inv_freq) {
    const int half = dim / 2;
    const float pos = (float)positions[blockIdx.x];
    for (int j = threadIdx.x; j < n_heads * half; j += blockDim.x) {
        int h = j / half, i = j % half;
        float phi = pos * inv_freq[i];
        float c = (float)cos((double)phi) * mscale, s = (float)sin((double)phi) * mscale;
        float *v = x + (long)blockIdx.x * ldx + (long)h * hs;
        int a = interleave ? 2 * i : i, b = interleave ? 2 * i + 1 : i + half;
        float xa = v[a], xb = v[b];
        v[a] = xa * c - xb * s;
        v[b] = xb * c + xa * s;
    }
}

static void f32_rope(di_backend *be, void *x, int ldx, int n_heads, int hs, const int32_t *positions, int T,
                     const di_rope_params *rp) {
    cuda_state *st = cst(be);
    DI_ASSERT(rp->dim % 2 == 0);
    if (T <= 0 || n_heads <= 0) return;
    k32_rope<<<T, 128, 0, st->stream>>>((float *)x, ldx, n_heads, hs, positions, rp->dim, rp->interleave, rp->mscale,
                                        rp->inv_freq);
    CUDA_LAUNCHED(st, "rope (f32)");
}

/* ---------------------------------------------------------------- GEMM ---- */

/* y[m, n] (+)= Σ_k x[m, k] · W(n, k) for one batch entry (blockIdx.z), W(n, k) = W[n·ldw + k]
 * (W_KN == 0, a linear layer's [out, in]) or W[k·ldw + n] (W_KN == 1). Rows: m < M read x row m
 * and write y row m. Grouped (offsets != NULL): blockIdx.x is a row tile of the whole
 * permutation, mapped through the per-matrix tile prefix mtiles to matrix e, whose rows are
 * [offsets[e], offsets[e + 1]); x row = perm[row] (perm NULL: row); W = matrix e. Token range
 * (tok_lo != NULL): row m is token row_base + m and is stored only if *tok_lo <= it < *tok_hi. */
typedef struct f32_gemm {
    float *y;
    long ldy, y_bs;
    const float *x;
    long ldx, x_bs;
    const float *W;
    long ldw, w_bs;
    int M, N, K, accumulate;
    const int32_t *offsets, *mtiles, *perm; /* grouped */
    int n_mat;
    const int32_t *tok_lo, *tok_hi;         /* token-range store mask */
    int row_base;
} f32_gemm;

/* Rows per row tile for a GEMM of M rows (in all, for grouped ones): the skinny kernel's up to
 * SK_MAX_ROWS, k32_gemm's above. The expert plan builds its tile prefix with the same choice. */
static inline int gemm_tile_rows(int M) { return M <= SK_MAX_ROWS ? (int)SK_M : (int)F32_TILE; }

/* Whether output row `row` is stored (the token-range mask; none: every row). */
static __device__ inline bool row_stored(const f32_gemm &g, long row) {
    if (!g.tok_lo) return true;
    int tok = g.row_base + (int)row;
    return tok >= *g.tok_lo && tok < *g.tok_hi;
}

/* The rows of this block's row tile of `tile` rows: returns how many (m; 0: none) and sets *r0
 * (the first) and *W (its weight matrix). Plain: tile blockIdx.x of the M rows, matrix
 * blockIdx.z. Grouped: blockIdx.x through the per-matrix tile prefix mtiles to matrix e, rows
 * [offsets[e], offsets[e + 1]). */
static __device__ int tile_span(const f32_gemm &g, int tile, int *r0, const float **W) {
    const int bx = blockIdx.x;
    if (!g.offsets) {
        *r0 = bx * tile;
        *W = g.W + (long)blockIdx.z * g.w_bs;
        return min(tile, g.M - *r0);
    }
    if (bx >= g.mtiles[g.n_mat]) return 0;
    int lo = 0, hi = g.n_mat; /* the largest e with mtiles[e] <= bx */
    while (hi - lo > 1) {
        int mid = (lo + hi) >> 1;
        if (g.mtiles[mid] <= bx) lo = mid;
        else hi = mid;
    }
    *r0 = g.offsets[lo] + (bx - g.mtiles[lo]) * tile;
    *W = g.W + (long)lo * g.w_bs;
    return min(tile, g.offsets[lo + 1] - *r0);
}

/* tile_span, then the block's shared row table: rows[i] = the x row of tile row i (through
 * perm when there is one), -1 past the tile; ends with a block barrier. An empty tile returns 0
 * before it (the whole block, so no thread waits). */
static __device__ int tile_rows(const f32_gemm &g, int tile, int *rows, int *r0, const float **W) {
    const int m = tile_span(g, tile, r0, W), tid = threadIdx.x;
    if (m <= 0) return 0;
    if (tid < tile) rows[tid] = tid < m ? (g.perm ? g.perm[*r0 + tid] : *r0 + tid) : -1;
    __syncthreads();
    return m;
}

/* Element i of a TN x TK weight tile at (n0, k0), numbered so that a warp's loads are
 * contiguous in the stored layout (W_KN: [K, N], n fastest; else [N, K], k fastest): sets *n, *k
 * (its place in the tile) and returns W(n0 + n, k0 + k) of the logical N x K matrix, 0 outside
 * it. Shared by k32_gemm and k32_gemm_skinny. */
template <int W_KN, int TN, int TK>
static __device__ __forceinline__ float w_tile_elem(const f32_gemm &g, const float *W, int i, int n0, int k0, int *n,
                                                    int *k) {
    *n = W_KN ? i % TN : i / TK;
    *k = W_KN ? i / TN : i % TK;
    const int gn = n0 + *n, gk = k0 + *k;
    if (gn >= g.N || gk >= g.K) return 0.f;
    return W_KN ? W[(long)gk * g.ldw + gn] : W[(long)gn * g.ldw + gk];
}

template <int W_KN>
__global__ void __launch_bounds__(F32_GEMM_THREADS) k32_gemm(f32_gemm g) {
    __shared__ float As[F32_BK][F32_TILE + 4];
    __shared__ float Bs[F32_BK][F32_TILE + 4];
    __shared__ int rows[F32_TILE];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int n0 = blockIdx.y * F32_TILE;
    const float *x = g.x + (long)blockIdx.z * g.x_bs, *W;
    float *y = g.y + (long)blockIdx.z * g.y_bs;
    int r0;
    const int m = tile_rows(g, F32_TILE, rows, &r0, &W);
    if (m <= 0) return;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < g.K; k0 += F32_BK) {
        for (int i = tid; i < F32_TILE * F32_BK; i += F32_GEMM_THREADS) {
            int r = i / F32_BK, kk = i % F32_BK, k = k0 + kk;
            int xr = rows[r];
            As[kk][r] = xr >= 0 && k < g.K ? x[(long)xr * g.ldx + k] : 0.f;
            int n, kb;
            const float wv = w_tile_elem<W_KN, F32_TILE, F32_BK>(g, W, i, n0, k0, &n, &kb);
            Bs[kb][n] = wv;
        }
        __syncthreads();
        const int kn = min(F32_BK, g.K - k0);
        for (int kk = 0; kk < kn; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = As[kk][ty + 16 * i];
                b[i] = Bs[kk][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int r = ty + 16 * i;
        if (r >= m) continue;
        long row = r0 + r;
        if (!row_stored(g, row)) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int n = n0 + tx + 16 * j;
            if (n >= g.N) continue;
            float *p = y + row * g.ldy + n;
            *p = g.accumulate ? *p + acc[i][j] : acc[i][j];
        }
    }
}

/* The same GEMM for few rows (decode): a block computes SK_M rows x SK_N outputs. Its SK_THREADS
 * threads stage W through shared memory SK_K columns at a time (each warp loads one 128-byte
 * piece of a row), so a step moves 32 KB per block and a 2048-column GEMM is 8 steps (the
 * loop's round trips, not the bytes, bounded the first version of 32 columns per step); the
 * first warp then sums, one output column per lane. Each output is the same fmaf chain over
 * k = 0..K-1 from 0 as in k32_gemm, so the two kernels give the same bits and the choice (by
 * row count only, gemm_tile_rows) keeps the table batch-invariant. Grouped: blockIdx.x is an
 * SK_M-row tile through mtiles. */
template <int W_KN>
__global__ void __launch_bounds__(SK_THREADS) k32_gemm_skinny(f32_gemm g) {
    __shared__ float Ws[SK_K][SK_N + 1];
    __shared__ float Xs[SK_M][SK_K];
    __shared__ int rows[SK_M];
    const int tid = threadIdx.x, n0 = blockIdx.y * SK_N;
    const float *x = g.x + (long)blockIdx.z * g.x_bs, *W;
    float *y = g.y + (long)blockIdx.z * g.y_bs;
    int r0;
    const int m = tile_rows(g, SK_M, rows, &r0, &W);
    if (m <= 0) return;
    float acc[SK_M] = {};
    for (int k0 = 0; k0 < g.K; k0 += SK_K) {
        const int kn = min(SK_K, g.K - k0);
        for (int i = tid; i < SK_M * SK_K; i += SK_THREADS) {
            int r = i / SK_K, kk = i % SK_K, xr = rows[r];
            Xs[r][kk] = xr >= 0 && kk < kn ? x[(long)xr * g.ldx + k0 + kk] : 0.f;
        }
#pragma unroll 4
        for (int i = tid; i < SK_N * SK_K; i += SK_THREADS) {
            int nn, kk;
            const float wv = w_tile_elem<W_KN, SK_N, SK_K>(g, W, i, n0, k0, &nn, &kk);
            Ws[kk][nn] = wv;
        }
        __syncthreads();
        if (tid < SK_N)
            for (int kk = 0; kk < kn; kk++) {
                float b = Ws[kk][tid];
#pragma unroll
                for (int r = 0; r < SK_M; r++) acc[r] = fmaf(Xs[r][kk], b, acc[r]);
            }
        __syncthreads();
    }
    const int n = n0 + tid;
    if (tid >= SK_N || n >= g.N) return;
#pragma unroll
    for (int r = 0; r < SK_M; r++) {
        if (r >= m) break;
        long row = r0 + r;
        if (!row_stored(g, row)) continue;
        float *p = y + row * g.ldy + n;
        *p = g.accumulate ? *p + acc[r] : acc[r];
    }
}

/* Launches g over `batch` entries, on the skinny kernel for at most SK_MAX_ROWS rows (in all,
 * for grouped GEMMs, whose mtiles prefix was built for gemm_tile_rows(M)), else on k32_gemm
 * (the same bits). Grouped grids span the most row tiles M rows can make over n_mat matrices. */
static void f32_gemm_launch(cuda_state *st, const f32_gemm &g, int batch, int w_kn, const char *what) {
    if (g.N <= 0 || batch <= 0 || g.M <= 0) return;
    const int tile = gemm_tile_rows(g.M), skinny = tile == SK_M;
    const int cols = skinny ? (int)SK_N : (int)F32_TILE;
    dim3 grid((unsigned)(ceil_div_i(g.M, tile) + (g.offsets ? g.n_mat : 0)), (unsigned)ceil_div_i(g.N, cols),
              (unsigned)batch);
    if (skinny) {
        if (w_kn) k32_gemm_skinny<1><<<grid, SK_THREADS, 0, st->stream>>>(g);
        else k32_gemm_skinny<0><<<grid, SK_THREADS, 0, st->stream>>>(g);
    } else {
        if (w_kn) k32_gemm<1><<<grid, F32_GEMM_THREADS, 0, st->stream>>>(g);
        else k32_gemm<0><<<grid, F32_GEMM_THREADS, 0, st->stream>>>(g);
    }
    CUDA_LAUNCHED(st, what);
}

static f32_gemm gemm_plain(float *y, long ldy, const float *x, long ldx, const float *W, long ldw, int M, int N, int K) {
    f32_gemm g;
    memset(&g, 0, sizeof g);
    g.y = y;
    g.ldy = ldy;
    g.x = x;
    g.ldx = ldx;
    g.W = W;
    g.ldw = ldw;
    g.M = M;
    g.N = N;
    g.K = K;
    return g;
}

static void f32_matmul(di_backend *be, void *y, int ldy, const void *x, int ldx, const di_weight *W, int T,
                       unsigned flags) {
    cuda_state *st = cst(be);
    DI_ASSERT(W && W->n == 1 && W->dtype == DI_DTYPE_F32 && ldx >= W->cols && ldy >= W->rows);
    if (T <= 0) return;
    f32_gemm g = gemm_plain((float *)y, ldy, (const float *)x, ldx, (const float *)W->data, W->cols, T, W->rows,
                            W->cols);
    g.accumulate = (flags & DI_MM_ACCUMULATE) != 0;
    f32_gemm_launch(st, g, 1, 0, "matmul (f32)");
}

static void f32_bmm(di_backend *be, void *y, int ldy, int hsy, const void *x, int ldx, int hsx, const di_weight *W,
                    int T) {
    cuda_state *st = cst(be);
    DI_ASSERT(W && W->dtype == DI_DTYPE_F32);
    if (T <= 0) return;
    f32_gemm g = gemm_plain((float *)y, ldy, (const float *)x, ldx, (const float *)W->data, W->cols, T, W->rows,
                            W->cols);
    g.y_bs = hsy;
    g.x_bs = hsx;
    g.w_bs = (long)W->rows * W->cols;
    f32_gemm_launch(st, g, W->n, 0, "bmm (f32)");
}

/* ---------------------------------------------------------------- MoE ---- */

static void f32_moe_route(di_backend *be, int32_t *topk_idx, float *topk_w, const float *x, const di_weight *W_g,
                          const di_weight *bias, const di_route_params *rp, int T, float *scratch) {
    cuda_state *st = cst(be);
    int E = rp->n_experts;
    DI_ASSERT(W_g->rows == E && W_g->n == 1 && W_g->dtype == DI_DTYPE_F32);
    if (T <= 0) return;
    f32_gemm g = gemm_plain(scratch, E, x, W_g->cols, (const float *)W_g->data, W_g->cols, T, E, W_g->cols);
    f32_gemm_launch(st, g, 1, 0, "moe_route logits (f32)");
    cuda_route_select(st, scratch, bias, rp, T, topk_idx, topk_w);
}

/* Scratch of moe_experts (64-byte aligned pieces): offsets, mtiles [E + 1] i32,
 * perm_tok / slot_of [T·k] i32, then f32 Hgu [T·k, 2I], A [T·k, I], Y [T·k, D]. */
typedef struct f32_moe_scratch {
    int32_t *offsets, *mtiles, *perm_tok, *slot_of; /* mtiles: tiles of gemm_tile_rows(T·k) rows */
    float *Hgu, *A, *Y;
} f32_moe_scratch;

static size_t f32_moe_carve(f32_moe_scratch *ms, void *base, long Tk, int D, int I, int E) {
    char *p = (char *)base;
    size_t off = 0;
#define TAKE(field, type, count)                                                                                       \
    do {                                                                                                               \
        if (ms) ms->field = (type *)(p + off);                                                                         \
        off += align64((size_t)(count) * sizeof(type));                                                                \
    } while (0)
    TAKE(offsets, int32_t, E + 1);
    TAKE(mtiles, int32_t, E + 1);
    TAKE(perm_tok, int32_t, Tk);
    TAKE(slot_of, int32_t, Tk);
    TAKE(Hgu, float, Tk * 2 * I);
    TAKE(A, float, Tk * I);
    TAKE(Y, float, Tk * D);
#undef TAKE
    return off;
}

static size_t f32_moe_scratch_bytes(di_backend *be, int max_tokens, int k, int D, int I, int E) {
    (void)be;
    return f32_moe_carve(NULL, NULL, (long)max_tokens * k, D, I, E);
}

/* One block: counts of (token, j) pairs per expert, their offsets and tile prefix (tiles of
 * `tile` rows: the GEMMs' gemm_tile_rows(Tk)), then
 * each pair's slot (the order within an expert's rows is free: every row is computed alone,
 * with the same arithmetic wherever it lands). An expert id out of range gets no slot (-1). */
__global__ void __launch_bounds__(1024) k32_moe_plan(const int32_t *idx, int Tk, int k, int E, int tile,
                                                     f32_moe_scratch ms) {
    __shared__ int cnt[DI_MAX_EXPERTS], off[DI_MAX_EXPERTS];
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < Tk; i += blockDim.x) {
        int e = idx[i];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int o = 0, tiles = 0;
        for (int e = 0; e < E; e++) {
            off[e] = o;
            ms.offsets[e] = o;
            ms.mtiles[e] = tiles;
            o += cnt[e];
            tiles += (cnt[e] + tile - 1) / tile;
        }
        ms.offsets[E] = o;
        ms.mtiles[E] = tiles;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < Tk; i += blockDim.x) {
        int e = idx[i], pos = -1;
        if (e >= 0 && e < E) {
            pos = off[e] + atomicAdd(&cnt[e], 1);
            ms.perm_tok[pos] = i / k;
        }
        ms.slot_of[i] = pos;
    }
}

/* out[t, :] = Σ_j w[t, j] · Y[slot_of[t·k + j], :] in j order (fmaf, as the CPU's axpy). */
__global__ void k32_moe_combine(float *out, const float *Y, const int32_t *slot_of, const float *w, int k, int D) {
    const long t = blockIdx.x;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; j++) {
            int s = slot_of[t * k + j];
            if (s >= 0) acc = fmaf(w[t * k + j], Y[(long)s * D + d], acc);
        }
        out[t * D + d] = acc;
    }
}

static void f32_moe_experts(di_backend *be, void *out, const void *x, const int32_t *topk_idx, const float *topk_w,
                            int k, const di_weight *gate_up, const di_weight *down, int T, void *scratch,
                            size_t scratch_bytes) {
    cuda_state *st = cst(be);
    int E = gate_up->n, D = gate_up->cols, I = down->cols;
    DI_ASSERT(gate_up->dtype == DI_DTYPE_F32 && down->dtype == DI_DTYPE_F32);
    DI_ASSERT(gate_up->rows == 2 * I && down->n == E && down->rows == D && E <= DI_MAX_EXPERTS);
    DI_ASSERT(scratch_bytes >= f32_moe_scratch_bytes(be, T, k, D, I, E));
    if (T <= 0) return;
    long Tk = (long)T * k;
    f32_moe_scratch ms;
    f32_moe_carve(&ms, scratch, Tk, D, I, E);
    k32_moe_plan<<<1, 1024, 0, st->stream>>>(topk_idx, (int)Tk, k, E, gemm_tile_rows((int)Tk), ms);
    CUDA_LAUNCHED(st, "moe plan (f32)");
    f32_gemm g = gemm_plain(ms.Hgu, 2 * I, (const float *)x, D, (const float *)gate_up->data, D, (int)Tk, 2 * I, D);
    g.offsets = ms.offsets;
    g.mtiles = ms.mtiles;
    g.perm = ms.perm_tok;
    g.n_mat = E;
    g.w_bs = (long)gate_up->rows * gate_up->cols;
    f32_gemm_launch(st, g, 1, 0, "moe gate_up (f32)");
    k32_silu_mul<<<grid_for(Tk * I, 256), 256, 0, st->stream>>>(ms.A, ms.Hgu, Tk, I);
    CUDA_LAUNCHED(st, "moe silu (f32)");
    g = gemm_plain(ms.Y, D, ms.A, I, (const float *)down->data, I, (int)Tk, D, I);
    g.offsets = ms.offsets;
    g.mtiles = ms.mtiles;
    g.n_mat = E;
    g.w_bs = (long)down->rows * down->cols;
    f32_gemm_launch(st, g, 1, 0, "moe down (f32)");
    k32_moe_combine<<<T, row_threads(D), 0, st->stream>>>((float *)out, ms.Y, ms.slot_of, topk_w, k, D);
    CUDA_LAUNCHED(st, "moe combine (f32)");
}

/* ---------------------------------------------------------------- MLA ---- */

/* Weight-absorbed attention of one (token, head) per block over the paged latent cache, the
 * CPU decode path's arithmetic (cpu_attention.c decode_item): 64-position tiles in order,
 * score = σ (q̃ · c_s + q_pe · k_pe_s), online softmax, out = Σ p c_s / l. Tokens t in
 * [t0, t0 + gridDim.x) of sequences [seq_begin, seq_end) (others: nothing written); q̃ and
 * out rows are token t - qo_base of [.., H, r] buffers. */
typedef struct f32_att {
    float *out;
    const float *qt, *qpe, *cache;
    long ldqpe, hsqpe;
    int qo_base, t0;
    const int32_t *seq_start, *ctx_len, *block_table, *sel_pos, *sel_count;
    int max_blocks, sel_stride, seq_begin, seq_end, H, r, dr;
    float sigma;
} f32_att;

__global__ void __launch_bounds__(F32_ATT_THREADS) k32_mla_attend(f32_att a) {
    extern __shared__ float sm[]; /* q [r + dr], acc [r], score [64] */
    __shared__ long rowoff[64];   /* the tile's cache rows (element offsets), looked up once */
    const int t = a.t0 + blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int seq = seq_of(a.seq_start, a.seq_begin, a.seq_end, t);
    if (seq < 0) return;
    const int pos = token_pos(a.seq_start, a.ctx_len, seq, t);
    const int r = a.r, dr = a.dr, W = r + dr;
    float *q = sm, *acc = q + W, *score = acc + r;
    const float *qt = a.qt + ((long)(t - a.qo_base) * a.H + h) * r;
    const float *qp = a.qpe + (long)t * a.ldqpe + (long)h * a.hsqpe;
    for (int i = tid; i < r; i += blockDim.x) {
        q[i] = qt[i];
        acc[i] = 0.f;
    }
    for (int i = tid; i < dr; i += blockDim.x) q[r + i] = qp[i];
    const int32_t *sel = a.sel_pos ? a.sel_pos + (long)t * a.sel_stride : NULL;
    const int n_att = sel ? a.sel_count[t] : pos + 1;
    float m = -INFINITY, l = 0.f;
    __syncthreads();
    for (int c0 = 0; c0 < n_att; c0 += 64) {
        const int n = min(64, n_att - c0);
        if (tid < n) {
            int p = sel ? sel[c0 + tid] : c0 + tid;
            int blk = a.block_table[(long)seq * a.max_blocks + p / DI_KV_BLOCK_SIZE];
            rowoff[tid] = ((long)blk * DI_KV_BLOCK_SIZE + p % DI_KV_BLOCK_SIZE) * W;
        }
        __syncthreads();
        for (int s = warp; s < n; s += F32_ATT_THREADS / 32) {
            const float *row = a.cache + rowoff[s];
            float d1 = 0.f, d2 = 0.f;
            for (int i = lane; i < r; i += 32) d1 = fmaf(q[i], row[i], d1);
            for (int i = lane; i < dr; i += 32) d2 = fmaf(q[r + i], row[r + i], d2);
            for (int o = 16; o > 0; o >>= 1) {
                d1 += __shfl_xor_sync(0xffffffffu, d1, o);
                d2 += __shfl_xor_sync(0xffffffffu, d2, o);
            }
            if (lane == 0) score[s] = a.sigma * (d1 + d2);
        }
        __syncthreads();
        float mx = m;
        for (int s = 0; s < n; s++) mx = fmaxf(mx, score[s]);
        const float corr = expf(m - mx);
        __syncthreads(); /* every thread has read the raw scores */
        if (tid < n) score[tid] = expf(score[tid] - mx);
        __syncthreads();
        float lsum = l * corr;
        for (int s = 0; s < n; s++) lsum += score[s];
        for (int i = tid; i < r; i += blockDim.x) {
            float v = acc[i] * corr;
            for (int s = 0; s < n; s++) v = fmaf(score[s], a.cache[rowoff[s] + i], v);
            acc[i] = v;
        }
        m = mx;
        l = lsum;
        __syncthreads(); /* score and rowoff are rewritten by the next tile */
    }
    const float inv = 1.0f / l;
    float *o = a.out + ((long)(t - a.qo_base) * a.H + h) * r;
    for (int i = tid; i < r; i += blockDim.x) o[i] = acc[i] * inv;
}

static f32_att att_args(const di_attn_batch *ab, int seq_begin, int seq_end, const di_mla_dims *d) {
    f32_att a;
    memset(&a, 0, sizeof a);
    a.seq_start = ab->seq_start;
    a.ctx_len = ab->seq_ctx_len;
    a.block_table = ab->block_table;
    a.sel_pos = ab->sel_pos;
    a.sel_count = ab->sel_count;
    a.max_blocks = ab->max_blocks;
    a.sel_stride = ab->sel_stride;
    a.seq_begin = seq_begin;
    a.seq_end = seq_end;
    a.H = d->n_heads;
    a.r = d->kv_rank;
    a.dr = d->rope_dim;
    a.sigma = d->softmax_scale;
    return a;
}

/* Shared memory of k32_mla_attend: q [r + dr], acc [r], score [64] */
size_t cuda_f32_attend_smem(int kv_rank, int rope_dim) { return ((size_t)2 * kv_rank + rope_dim + 64) * sizeof(float); }

static void launch_attend(cuda_state *st, const f32_att &a, int n_tokens) {
    size_t smem = cuda_f32_attend_smem(a.r, a.dr);
    static size_t smem_set = 48 * 1024;
    if (smem > smem_set) {
        if (cuda_note(st, cudaFuncSetAttribute(k32_mla_attend, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                      "mla attend smem attribute (f32)"))
            return;
        smem_set = smem;
    }
    k32_mla_attend<<<dim3((unsigned)n_tokens, (unsigned)a.H), F32_ATT_THREADS, smem, st->stream>>>(a);
    CUDA_LAUNCHED(st, "mla attend (f32)");
}

static void f32_mla_decode(di_backend *be, void *out, const void *qt, const void *qpe, int ldqpe, int hsqpe,
                           const void *cache, const di_attn_batch *ab, int seq_begin, int seq_end,
                           const di_mla_dims *d) {
    cuda_state *st = cst(be);
    if (seq_end <= seq_begin || ab->n_tokens <= 0) return;
    f32_att a = att_args(ab, seq_begin, seq_end, d);
    a.out = (float *)out;
    a.qt = (const float *)qt;
    a.qpe = (const float *)qpe;
    a.ldqpe = ldqpe;
    a.hsqpe = hsqpe;
    a.cache = (const float *)cache;
    launch_attend(st, a, ab->n_tokens);
}

static int prefill_chunk(int max_tokens) { return max_tokens < F32_PREFILL_CHUNK ? max_tokens : F32_PREFILL_CHUNK; }

static size_t f32_mla_prefill_scratch_bytes(di_backend *be, const di_mla_dims *d, int max_tokens) {
    (void)be;
    int ch = prefill_chunk(max_tokens > 0 ? max_tokens : 1);
    return 2 * align64((size_t)ch * d->n_heads * d->kv_rank * sizeof(float));
}

/* Prefill as absorbed attention, per chunk of batch tokens: q̃_h = q_nope_h · W_UK_h (W_UK_h =
 * W_kvb rows h·(dn+dv) .. + dn, read [K = dn, N = r]), the latent attention above, then
 * out_h = ō_h · W_UV_hᵀ (rows h·(dn+dv) + dn .. + dv), stored for this call's tokens only. */
static void f32_mla_prefill(di_backend *be, void *out, const void *q, int ldq, const void *cache,
                            const di_weight *W_kvb, const di_attn_batch *ab, int seq_begin, int seq_end,
                            const di_mla_dims *d, void *scratch, size_t scratch_bytes) {
    cuda_state *st = cst(be);
    int H = d->n_heads, dn = d->nope_dim, dr = d->rope_dim, dv = d->v_dim, r = d->kv_rank;
    DI_ASSERT(W_kvb->dtype == DI_DTYPE_F32 && W_kvb->rows == H * (dn + dv) && W_kvb->cols == r);
    if (seq_end <= seq_begin || ab->n_tokens <= 0) return;
    int ch = prefill_chunk(ab->n_tokens);
    DI_ASSERT(scratch_bytes >= f32_mla_prefill_scratch_bytes(be, d, ab->n_tokens));
    float *qt = (float *)scratch;
    float *ol = (float *)((char *)scratch + align64((size_t)ch * H * r * sizeof(float)));
    const float *Wk = (const float *)W_kvb->data;
    for (int c0 = 0; c0 < ab->n_tokens; c0 += ch) {
        int n = ab->n_tokens - c0 < ch ? ab->n_tokens - c0 : ch;
        f32_gemm g = gemm_plain(qt, (long)H * r, (const float *)q + (long)c0 * ldq, ldq, Wk, r, n, r, dn);
        g.x_bs = dn + dr;
        g.y_bs = r;
        g.w_bs = (long)(dn + dv) * r;
        f32_gemm_launch(st, g, H, 1, "mla prefill W_UK (f32)");
        f32_att a = att_args(ab, seq_begin, seq_end, d);
        a.out = ol;
        a.qt = qt;
        a.qpe = (const float *)q + dn;
        a.ldqpe = ldq;
        a.hsqpe = dn + dr;
        a.cache = (const float *)cache;
        a.qo_base = c0;
        a.t0 = c0;
        launch_attend(st, a, n);
        g = gemm_plain((float *)out + (long)c0 * H * dv, (long)H * dv, ol, (long)H * r, Wk + (long)dn * r, r, n, dv, r);
        g.x_bs = r;
        g.y_bs = dv;
        g.w_bs = (long)(dn + dv) * r;
        g.tok_lo = ab->seq_start + seq_begin;
        g.tok_hi = ab->seq_start + seq_end;
        g.row_base = c0;
        f32_gemm_launch(st, g, H, 0, "mla prefill W_UV (f32)");
    }
}

/* ---------------------------------------------------------------- the table ---- */

void cuda_f32_install(di_backend *be) {
    cst(be)->f32 = 1;
    be->caps.act_dtype = DI_DTYPE_F32;
    be->caps.keeps_fp8 = 0;
    be->embed = f32_embed;
    be->rmsnorm = f32_rmsnorm;
    be->add_rmsnorm = f32_add_rmsnorm;
    be->silu_mul = f32_silu_mul;
    be->add = f32_add;
    /* gather_rows is f32 on every table; kv_write and kv_copy_blocks (cuda_ops.cu) and layernorm,
     * indexer_topk (cuda_indexer.cu) take the element size from st->f32; sample reads f32 logits */
    be->matmul = f32_matmul;
    be->bmm = f32_bmm;
    be->rope = f32_rope;
    be->mla_prefill = f32_mla_prefill;
    be->mla_prefill_scratch_bytes = f32_mla_prefill_scratch_bytes;
    be->mla_decode = f32_mla_decode;
    be->moe_route = f32_moe_route;
    be->moe_experts = f32_moe_experts;
    be->moe_scratch_bytes = f32_moe_scratch_bytes;
    be->rope_kv_write = NULL;
    be->mla_decode_uv = NULL;
    be->moe_experts_shared = NULL;
    be->moe_experts_defer = NULL;
    be->add_rmsnorm_experts = NULL;
    be->matmul_silu = NULL;
}
