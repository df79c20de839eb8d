/* cuda_moe_small.cu - the experts of a decode step with at most 4 tokens (T * k <= 32), without
 * permutation: two launches read each selected expert's weights once, straight from the router's
 * device top-k ids / weights. moe_experts and moe_experts_shared take this path for steps of at
 * most st->moe_small tokens (DEEPINFER_CUDA_MOE_SMALL, default 1: measured faster than the
 * permuted path at one token, slower at 2-4; docs/PERF.md, "Small-batch decode").
 *
 *   k_small_gu:   one block per (expert pair, 8 intermediate rows) plus the blocks of the shared
 *                 experts; each warp owns one intermediate index i and streams gate row i and
 *                 up row I + i (512 contiguous bytes per load instruction), FMA in fp32 against
 *                 every token that picked the expert, then A[pair, i] = silu(g) * u (fp32).
 *                 A pair whose expert already appears at a lower pair index returns at once: the
 *                 block of the first occurrence computes all tokens of that expert.
 *   k_small_down: one block of 8 warps per two output rows; the distinct experts (pairs in
 *                 index order) and the shared experts are spread over the warps, each streaming
 *                 its two down rows once and dotting them with the A rows of every token that
 *                 picked the expert (partials in shared memory); then, per token, out = sum_j
 *                 w[t, j] * dot[t, j] in j order, plus the shared experts' dot, all fp32, one
 *                 rounding to bf16. (A variant staging all A rows in shared memory, 8-16
 *                 output rows per block, measured slower: 55.0 vs 53.6 us for the V2-Lite
 *                 experts of one token; docs/PERF.md, "Batch-1 decode, second pass".)
 *   Both stream K in steps of U 256-column chunks; at 1-2 bf16 tokens every activation load of
 *   a step (x rows, A rows) is issued together with the step's weight loads, before the first
 *   FMA, so a step costs one memory round trip, not one per chunk.
 *
 * Owner: cuda. Invariants: every dot product is computed by exactly one warp with a fixed
 * summation order (lane-strided partial sums, xor-shuffle tree), and each output by one thread
 * summing them in j order, so results are bit-reproducible run to run; no atomics. A token
 * picks an expert at most once (the router's top-k), so an expert has at most T tokens. Both
 * kernels use programmatic dependent launch (cuda_pdl.cuh): activations and routing weights
 * of the step are read after pdl_wait() with coherent loads; before it, k_small_gu loads only
 * the shared experts' gate/up weights, and k_small_down (a.early) the router's ids and each
 * warp's first down weights (k_small_gu releases it only after its own wait, see there). An
 * expert id outside [0, E) contributes zero. The path is chosen from shapes only (T, k, dims,
 * dtype, scratch size), so a CUDA graph captured for a batch-size bucket replays the same
 * kernels. Weights: bf16, or fp8 e4m3 with block scales (block cols a multiple of 8, so a
 * lane's 8 elements share one scale). Scratch: A [T*k, I] and As [T, Is] fp32, from the
 * moe_experts scratch (cuda_moe_small_fits says whether it is big enough). */
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_wload.cuh"

enum { SMALL_MAX_T = 4, SMALL_MAX_PAIRS = 32 };

typedef struct small_args {
    const bf16 *x;          /* [T, D] */
    const int32_t *idx;     /* [T * k] */
    const float *w;         /* [T * k] */
    int T, k, E, D, I, Is;  /* Is = 0: no shared experts */
    wview gu, dn;           /* routed: [E][2I][D], [E][D][I] */
    wview sgu, sdn;         /* shared: [2Is][D], [D][Is] */
    float *A, *As;          /* [T*k][I], [T][Is] */
    bf16 *out;              /* [T, D] */
    int early;              /* k_small_down loads its first weights before its wait (see there) */
} small_args;

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The pairs (token t, slot j) -> p = t * k + j: lane p reads its expert id; `same` = mask of the
 * lanes (pairs) with the same valid expert. */
static __device__ __forceinline__ void pair_info(const int32_t *idx, int Tk, int E, int lane, int *e_out,
                                                 unsigned *same_out) {
    int e = lane < Tk ? idx[lane] : -1;
    if (e >= E) e = -1;
    unsigned same = __match_any_sync(0xffffffffu, e);
    *e_out = e;
    *same_out = e >= 0 ? same : 0u;
}

/* Whether a K step issues its activation loads (x rows, A rows) together with its weight loads,
 * before the first FMA (one round trip per step instead of one per chunk): bf16 at up to 2
 * tokens, measured (docs/PERF.md 2026-12-02); more tokens or fp8's U = 4 would need too many
 * registers (3-4 tokens measured slower, fp8 not measured). */
template <bool FP8, int MT>
struct acts_early {
    static constexpr bool on = !FP8 && MT <= 2;
};

/* ------------------------------------------------------------------ gate + up ---- */

/* k_small_gu's PDL wait. With a.early its dependent (k_small_down) is released only here, once
 * this block has waited, so that k_small_down starts after every block of this kernel saw the
 * router's ids (k_small_down reads them before its own wait). */
static __device__ __forceinline__ void gu_wait(const small_args &a) {
    pdl_wait();
    if (a.early) pdl_launch_dependents();
}

/* blocks [0, Tk * gr): pair p = b / gr, rows i = (b % gr) * 8 + warp; then the shared blocks. */
template <int MT, bool FP8, int U>
__global__ void __launch_bounds__(256) k_small_gu(small_args a, int gr) {
    if (!a.early) pdl_launch_dependents(); /* early: released in gu_wait instead */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, Tk = a.T * a.k;
    int b = blockIdx.x;
    bool shared = b >= Tk * gr;
    int p = shared ? -1 : b / gr;
    int i = (shared ? b - Tk * gr : b % gr) * 8 + warp;
    int I = shared ? a.Is : a.I, K = a.D;
    const wview &W = shared ? a.sgu : a.gu;
    int mat = 0;
    /* members: the output rows (pairs, or tokens for the shared experts) and their x rows */
    int nm = 0, orow[MT], xrow[MT];
    bool waited = false;
    if (shared) {
        nm = a.T;
#pragma unroll
        for (int m = 0; m < MT; m++) orow[m] = xrow[m] = m < a.T ? m : 0;
    } else {
        gu_wait(a); /* the expert ids come from the router */
        waited = true;
        int e;
        unsigned same;
        pair_info(a.idx, Tk, a.E, lane, &e, &same);
        unsigned mine = __shfl_sync(0xffffffffu, same, p);
        if (mine == 0 || (__ffs(mine) - 1) != p) return; /* invalid expert, or not its first pair */
        mat = __shfl_sync(0xffffffffu, e, p);
#pragma unroll
        for (int m = 0; m < MT; m++) {
            int q = mine ? __ffs(mine) - 1 : 0;
            orow[m] = q;
            xrow[m] = q / a.k;
            if (mine) nm++;
            mine &= mine - 1u;
        }
    }
    if (i >= I) {
        gu_wait(a);
        return;
    }
    /* weights first (constant): their loads may start before the previous kernel has finished */
    constexpr bool PRE = acts_early<FP8, MT>::on;
    float g[MT], u[MT];
#pragma unroll
    for (int m = 0; m < MT; m++) g[m] = u[m] = 0.f;
    for (int k0 = lane * 8; k0 < K; k0 += 256 * U) {
        wraw<FP8> wg[U], wu[U];
#pragma unroll
        for (int v = 0; v < U; v++) {
            int kk = k0 + v * 256;
            wg[v] = wload<FP8>(W, mat, i, kk, kk < K);
            wu[v] = wload<FP8>(W, mat, I + i, kk, kk < K);
        }
        if (!waited) {
            gu_wait(a);
            waited = true;
        }
        /* acts_early: this step's x loads before the first weight is used */
        uint4 xr[U][MT];
        if (PRE)
#pragma unroll
            for (int v = 0; v < U; v++) {
                int kk = k0 + v * 256;
#pragma unroll
                for (int m = 0; m < MT; m++)
                    xr[v][m] = kk < K && m < nm ? ld_act16(a.x + (long)xrow[m] * K + kk) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int v = 0; v < U; v++) {
            int kk = k0 + v * 256;
            if (kk >= K) continue;
            float fg[8], fu[8];
            wfloat<FP8>(wg[v], fg);
            wfloat<FP8>(wu[v], fu);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (m >= nm) continue;
                float xf[8];
                bf16x8_float(PRE ? xr[v][m] : ld_act16(a.x + (long)xrow[m] * K + kk), xf);
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    g[m] = fmaf(fg[c], xf[c], g[m]);
                    u[m] = fmaf(fu[c], xf[c], u[m]);
                }
            }
        }
    }
    if (!waited) gu_wait(a);
#pragma unroll
    for (int m = 0; m < MT; m++) {
        g[m] = warp_sum(g[m]);
        u[m] = warp_sum(u[m]);
    }
    if (lane == 0) {
        float *dst = shared ? a.As : a.A;
#pragma unroll
        for (int m = 0; m < MT; m++)
            if (m < nm) dst[(long)orow[m] * I + i] = silu_f(g[m]) * u[m];
    }
}

/* ------------------------------------------------------------------ down + combine ---- */

/* The weights of one K step of dot2_rows (columns k0 + v * 256 of rows n0, n0 + 1). */
template <bool FP8, int U>
static __device__ __forceinline__ void dot2_load(const wview &W, int mat, int n0, int D, int K, int k0,
                                                 wraw<FP8> (&w0)[U], wraw<FP8> (&w1)[U]) {
    const bool ok0 = n0 < D, ok1 = n0 + 1 < D;
#pragma unroll
    for (int v = 0; v < U; v++) {
        int kk = k0 + v * 256;
        w0[v] = wload<FP8>(W, mat, n0, kk, kk < K && ok0);
        w1[v] = wload<FP8>(W, mat, n0 + 1, kk, kk < K && ok1);
    }
}

/* Rows n0 and n0 + 1 of matrix `mat` of W dotted with the fp32 rows src[rows[m]] (K wide):
 * acc[r][m], summed over the warp (lane-strided partial sums, then an xor tree). w0 / w1 hold
 * the first K step's weights on entry (dot2_load at k0 = lane * 8). */
template <int MT, bool FP8, int U>
static __device__ __forceinline__ void dot2_rows(const wview &W, int mat, int n0, int D, const float *src,
                                                 const int *rows, int nm, int K, float (*acc)[MT],
                                                 wraw<FP8> (&w0)[U], wraw<FP8> (&w1)[U]) {
    const int lane = threadIdx.x & 31;
    constexpr bool PRE = acts_early<FP8, MT>::on;
#pragma unroll
    for (int m = 0; m < MT; m++) acc[0][m] = acc[1][m] = 0.f;
    for (int k0 = lane * 8; k0 < K; k0 += 256 * U) {
        if (k0 != lane * 8) dot2_load<FP8, U>(W, mat, n0, D, K, k0, w0, w1);
        /* acts_early: this step's A loads before the first weight is used */
        float4 av[U][MT][2];
        if (PRE)
#pragma unroll
            for (int v = 0; v < U; v++) {
                int kk = k0 + v * 256;
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    const float *ap = src + (long)rows[m] * K + kk;
                    bool in = kk < K && m < nm;
                    av[v][m][0] = in ? ld_act16f(ap) : make_float4(0.f, 0.f, 0.f, 0.f);
                    av[v][m][1] = in ? ld_act16f(ap + 4) : make_float4(0.f, 0.f, 0.f, 0.f);
                }
            }
#pragma unroll
        for (int v = 0; v < U; v++) {
            int kk = k0 + v * 256;
            if (kk >= K) continue;
            float f0[8], f1[8];
            wfloat<FP8>(w0[v], f0);
            wfloat<FP8>(w1[v], f1);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (m >= nm) continue;
                const float *ap = src + (long)rows[m] * K + kk;
                float4 a0 = PRE ? av[v][m][0] : ld_act16f(ap), a1 = PRE ? av[v][m][1] : ld_act16f(ap + 4);
                float x[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    acc[0][m] = fmaf(f0[c], x[c], acc[0][m]);
                    acc[1][m] = fmaf(f1[c], x[c], acc[1][m]);
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MT; m++) {
        acc[0][m] = warp_sum(acc[0][m]);
        acc[1][m] = warp_sum(acc[1][m]);
    }
}

/* The unit of work u of k_small_down: the u-th distinct routed expert (its first pair in index
 * order; `firsts` = mask of first pairs) or, for u = nf, the shared experts. */
template <int MT>
struct down_unit {
    bool shared;
    int mat, nm, rows[MT];
    __device__ __forceinline__ down_unit(const small_args &a, int u, int nf, unsigned firsts, unsigned same, int e) {
        shared = u >= nf;
        mat = 0;
        nm = 0;
        if (shared) {
            nm = a.T;
#pragma unroll
            for (int m = 0; m < MT; m++) rows[m] = m < a.T ? m : 0;
        } else {
            unsigned f = firsts;
            for (int i = 0; i < u; i++) f &= f - 1u;
            int p = __ffs(f) - 1;
            unsigned mine = __shfl_sync(0xffffffffu, same, p);
            mat = __shfl_sync(0xffffffffu, e, p);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                rows[m] = mine ? __ffs(mine) - 1 : 0;
                if (mine) nm++;
                mine &= mine - 1u;
            }
        }
    }
};

/* One block (8 warps) per pair of output rows n0, n0 + 1. The units of work are the distinct
 * routed experts (their first pairs in index order) and then the shared experts; warp w takes
 * units w, w + 8, ...: it streams the unit's two down rows once and dots them with the A rows
 * of every token of that unit, into shared memory. Then one thread per (token, row) sums its k
 * slots in j order, adds the shared experts, and rounds once.
 * a.early: the expert ids come from the router, which finished before any k_small_gu block
 * passed its wait, and k_small_gu releases this kernel only after that wait; so the ids are
 * read, and each warp's first unit's first K step of weights loaded, before this kernel's
 * wait, overlapping k_small_gu's tail. Only A / As (k_small_gu's output) and the routing
 * weights are read after it. */
template <int MT, bool FP8, int U>
__global__ void __launch_bounds__(256) k_small_down(small_args a) {
    __shared__ float pdot[SMALL_MAX_PAIRS][2], sdot[SMALL_MAX_T][2];
    pdl_launch_dependents();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, Tk = a.T * a.k;
    const int n0 = blockIdx.x * 2;
    for (int i = threadIdx.x; i < SMALL_MAX_PAIRS * 2; i += blockDim.x) (&pdot[0][0])[i] = 0.f;
    if (!a.early) pdl_wait(); /* A, As, the expert ids and weights come from earlier kernels */
    int e;
    unsigned same;
    pair_info(a.idx, Tk, a.E, lane, &e, &same);
    unsigned firsts = __ballot_sync(0xffffffffu, same != 0u && (__ffs(same) - 1) == lane);
    const int nf = __popc(firsts), nu = nf + (a.Is > 0 ? 1 : 0);
    wraw<FP8> w0[U], w1[U];
    if (warp < nu) { /* the first unit's first weights */
        down_unit<MT> du(a, warp, nf, firsts, same, e);
        dot2_load<FP8, U>(du.shared ? a.sdn : a.dn, du.mat, n0, a.D, du.shared ? a.Is : a.I, lane * 8, w0, w1);
    }
    if (a.early) pdl_wait(); /* A and As come from k_small_gu */
    __syncthreads(); /* pdot zeroed before any warp stores its dots */
    for (int u = warp; u < nu; u += 8) {
        down_unit<MT> du(a, u, nf, firsts, same, e);
        const wview &W = du.shared ? a.sdn : a.dn;
        const int K = du.shared ? a.Is : a.I;
        if (u != warp) dot2_load<FP8, U>(W, du.mat, n0, a.D, K, lane * 8, w0, w1);
        float d[2][MT];
        dot2_rows<MT, FP8, U>(W, du.mat, n0, a.D, du.shared ? a.As : a.A, du.rows, du.nm, K, d, w0, w1);
        if (lane == 0)
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (m >= du.nm) continue;
                float *dst = du.shared ? sdot[du.rows[m]] : pdot[du.rows[m]];
                dst[0] = d[0][m];
                dst[1] = d[1][m];
            }
    }
    __syncthreads();
    const int tid = threadIdx.x;
    if (tid < a.T * 2) { /* per token: its k slots in j order, then the shared experts; one rounding */
        int t = tid >> 1, r = tid & 1, n = n0 + r;
        if (n < a.D) {
            float acc = 0.f;
            for (int j = 0; j < a.k; j++) acc += a.w[t * a.k + j] * pdot[t * a.k + j][r];
            if (a.Is > 0) acc += sdot[t][r];
            a.out[(long)t * a.D + n] = __float2bfloat16_rn(acc);
        }
    }
}

/* ------------------------------------------------------------------ host ---- */

static size_t small_need(int T, int k, int I, int Is) {
    return align256((size_t)T * k * I * sizeof(float)) + align256((size_t)T * (Is > 0 ? Is : 1) * sizeof(float));
}

static bool w_ok(const di_weight *w, int n, int rows, int cols) {
    if (!w || w->n != n || w->rows != rows || w->cols != cols) return false;
    if (((uintptr_t)w->data & 15) != 0) return false;
    if (w->dtype == DI_DTYPE_BF16) return true;
    return w->dtype == DI_DTYPE_F8_E4M3 && w->scale && w->block_rows > 0 && w->block_cols % 8 == 0;
}

int cuda_moe_small_fits(int T, int k, const di_weight *gate_up, const di_weight *down, const di_weight *sh_gate_up,
                        const di_weight *sh_down, size_t scratch_bytes) {
    if (T < 1 || T > SMALL_MAX_T || k < 1 || T * k > SMALL_MAX_PAIRS) return 0;
    int E = gate_up->n, D = gate_up->cols, I = down->cols;
    if (D % 8 != 0 || I % 8 != 0 || gate_up->rows != 2 * I) return 0;
    if (!w_ok(gate_up, E, 2 * I, D) || !w_ok(down, E, D, I) || gate_up->dtype != down->dtype) return 0;
    int Is = 0;
    if (sh_gate_up) {
        Is = sh_down ? sh_down->cols : 0;
        if (Is <= 0 || Is % 8 != 0 || !w_ok(sh_gate_up, 1, 2 * Is, D) || !w_ok(sh_down, 1, D, Is) ||
            sh_gate_up->dtype != gate_up->dtype || sh_down->dtype != gate_up->dtype)
            return 0;
    }
    return scratch_bytes >= small_need(T, k, I, Is);
}

/* gate+up (with the shared experts), then down + combine; chosen from shapes only. U = 16-byte
 * weight loads in flight per lane and row in one K step: bf16 2 (v2lite-8l batch-1 decode,
 * 2026-12-01: 1092-1097 tok/s against 1046-1066 with 4; 1 and 8 were slower: fewer loads per
 * warp and more resident warps win, down to 2), fp8 (8-byte loads) 4. A lane sums its columns
 * in the same order for every U, so U never changes the bits. */
template <int MT, bool FP8>
static void launch_small(cuda_state *st, const small_args &a) {
    constexpr int U = FP8 ? 4 : 2;
    int gr = ceil_div_i(a.I, 8), gs = a.Is > 0 ? ceil_div_i(a.Is, 8) : 0;
    cuda_launch_pdl(st, st->pdl >= 1, k_small_gu<MT, FP8, U>, dim3(a.T * a.k * gr + gs), dim3(256), 0, a, gr);
    CUDA_LAUNCHED(st, "moe_small_gu");
    cuda_launch_pdl(st, st->pdl >= 1, k_small_down<MT, FP8, U>, dim3(ceil_div_i(a.D, 2)), dim3(256), 0, a);
    CUDA_LAUNCHED(st, "moe_small_down");
}

void cuda_moe_small(cuda_state *st, void *out, const void *x, const int32_t *topk_idx, const float *topk_w, int k,
                    const di_weight *gate_up, const di_weight *down, const di_weight *sh_gate_up,
                    const di_weight *sh_down, int T, void *scratch) {
    small_args a;
    a.x = (const bf16 *)x;
    a.idx = topk_idx;
    a.w = topk_w;
    a.T = T;
    a.k = k;
    a.E = gate_up->n;
    a.D = gate_up->cols;
    a.I = down->cols;
    a.Is = sh_gate_up ? sh_down->cols : 0;
    a.gu = wview_of(gate_up);
    a.dn = wview_of(down);
    a.sgu = sh_gate_up ? wview_of(sh_gate_up) : a.gu;
    a.sdn = sh_gate_up ? wview_of(sh_down) : a.dn;
    a.A = (float *)scratch;
    a.As = (float *)((char *)scratch + align256((size_t)T * k * a.I * sizeof(float)));
    a.out = (bf16 *)out;
    a.early = st->down_early;
    bool fp8 = gate_up->dtype == DI_DTYPE_F8_E4M3;
    if (T == 1) fp8 ? launch_small<1, true>(st, a) : launch_small<1, false>(st, a);
    else if (T == 2) fp8 ? launch_small<2, true>(st, a) : launch_small<2, false>(st, a);
    else fp8 ? launch_small<4, true>(st, a) : launch_small<4, false>(st, a);
}

int cuda_moe_experts_shared(di_backend *be, void *out, const void *x, const int32_t *topk_idx, const float *topk_w,
                            int k, const di_weight *gate_up, const di_weight *down, const di_weight *sh_gate_up,
                            const di_weight *sh_down, int T, void *scratch, size_t scratch_bytes) {
    cuda_state *st = cst(be);
    if (T > st->moe_small || !cuda_moe_small_fits(T, k, gate_up, down, sh_gate_up, sh_down, scratch_bytes)) return 0;
    cuda_moe_small(st, out, x, topk_idx, topk_w, k, gate_up, down, sh_gate_up, sh_down, T, scratch);
    return 1;
}
