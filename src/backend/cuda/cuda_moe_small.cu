/* cuda_moe_small.cu - the experts of a decode step with at most 4 tokens (T * k <= 32), without
 * permutation: two launches read each selected expert's weights once, straight from the router's
 * device top-k ids / weights. moe_experts and moe_experts_shared take this path for steps of at
 * most st->moe_small tokens (DEEPINFER_CUDA_MOE_SMALL, default 1: measured faster than the
 * permuted path at one token, slower at 2-4; docs/PERF.md, "Small-batch decode").
 *
 *   k_small_gu:   one block of 256 threads per (expert pair, R = 4 intermediate rows) plus the
 *                 blocks of the shared experts; the K = D columns are split over the block's
 *                 threads in 8-column pieces, each thread loading its piece of the 4 gate rows,
 *                 the 4 up rows and of x (once for the 4 rows) together, so a block at D = 2048
 *                 is one memory round trip; FMA in fp32 against every token that picked the
 *                 expert, warp partials added in warp order, then A[pair, i] = silu(g) * u
 *                 (fp32). A pair whose expert already appears at a lower pair index returns at
 *                 once: the block of the first occurrence computes all tokens of that expert.
 *   k_small_down: one block of 256 threads per R = 8 output rows (4 at 2-4 tokens); the
 *                 pieces of every unit (the distinct experts, then the shared experts) are
 *                 dealt out over the threads, so the work is balanced for any number of
 *                 units; each thread loads its pieces of the R rows at once and adds
 *                 w[pair] * (row piece . A piece) into one sum per (row, token); warp partials
 *                 added in warp order, one rounding to bf16.
 *   Measured on the V2-Lite experts of one token with the shared experts (bench_cuda_decode
 *   moe, 2026-12-02): 34.9-35.4 us (3.9-4.0 TB/s, 93-94% of the copy rate), against 47.1 us
 *   for the earlier kernels (a warp per weight row or row pair, K streamed in 512-column
 *   steps, 1024 blocks for the down rows in two waves); docs/PERF.md.
 *
 * Owner: cuda. Invariants: which thread adds which piece, the xor-shuffle tree and the warp
 * order of the final sums are fixed by the shapes, so results are bit-reproducible run to
 * run; no atomics. A token picks an expert at most once (the router's top-k), so an expert
 * has at most T tokens. Both kernels use programmatic dependent launch (cuda_pdl.cuh):
 * activations and routing weights of the step are read after pdl_wait() with coherent loads;
 * before it, k_small_gu loads only the shared experts' gate/up weights, and k_small_down
 * (a.early) the router's ids and its first round of down weights (k_small_gu releases it only
 * after its own wait, see there). An expert id outside [0, E) contributes zero. The path is
 * chosen from shapes only (T, k, dims, dtype, scratch size), so a CUDA graph captured for a
 * batch-size bucket replays the same kernels. Weights: bf16, or fp8 e4m3 with block scales
 * (block cols a multiple of 8, so a piece's 8 elements share one scale). Scratch: A [T*k, I]
 * and As [T, Is] fp32, from the moe_experts scratch (cuda_moe_small_fits says whether it is
 * big enough). */
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

/* ------------------------------------------------------------------ gate + up ---- */

/* k_small_gu's PDL wait. With a.early its dependent (k_small_down) is released only here, once
 * this block has waited, so that k_small_down starts after every block of this kernel saw the
 * router's ids (k_small_down reads them before its own wait). */
static __device__ __forceinline__ void gu_wait(const small_args &a) {
    pdl_wait();
    if (a.early) pdl_launch_dependents();
}

/* Blocks [0, Tk * gr): pair p = b / gr, rows i0 = (b % gr) * R ..; then the shared experts'
 * blocks. Thread t takes the 8-column pieces t, t + 256, ... of the block's rows (P per round):
 * the piece of all R gate rows and R up rows, and each token's x piece, loaded once for the R
 * rows; partial sums per warp (xor tree), then added in warp order. fp8: one scale load per
 * piece for the R gate rows and one for the R up rows when each group lies in one block of
 * scale rows (DeepSeek's 128-row blocks), else one per row. */
template <int MT, bool FP8, int R, int P>
__global__ void __launch_bounds__(256) k_small_gu(small_args a, int gr) {
    __shared__ float part[8][R][2][MT];
    if (!a.early) pdl_launch_dependents(); /* early: released in gu_wait instead */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, Tk = a.T * a.k;
    const int b = blockIdx.x;
    const bool shared = b >= Tk * gr;
    const int p = shared ? -1 : b / gr;
    const int i0 = (shared ? b - Tk * gr : b % gr) * R;
    const int I = shared ? a.Is : a.I, K = a.D;
    const wview &W = shared ? a.sgu : a.gu;
    int mat = 0, nm = 0, orow[MT], xrow[MT];
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
    const int ilast = min(i0 + R, I) - 1;
    const bool sh_g = FP8 && scale_row(W, i0) == scale_row(W, ilast);
    const bool sh_u = FP8 && scale_row(W, I + i0) == scale_row(W, I + ilast);
    float g[R][MT], u[R][MT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) g[r][m] = u[r][m] = 0.f;
    const int np = K / 8;
    for (int base = 0; base < np; base += 256 * P) {
        uint4 wg[P][R], wu[P][R];
        float sg[P], su[P]; /* fp8: the shared scales (the rare per-row ones are read when used) */
#pragma unroll
        for (int j = 0; j < P; j++) {
            int f = base + j * 256 + tid, kk = f * 8;
#pragma unroll
            for (int r = 0; r < R; r++) {
                bool ok = f < np && i0 + r < I;
                wg[j][r] = wp_load<FP8>(W, mat, i0 + r, kk, ok);
                wu[j][r] = wp_load<FP8>(W, mat, I + i0 + r, kk, ok);
            }
            if (FP8) {
                sg[j] = sh_g ? wp_scale(W, mat, i0, kk, f < np) : 0.f;
                su[j] = sh_u ? wp_scale(W, mat, I + i0, kk, f < np) : 0.f;
            }
        }
        if (!waited) {
            gu_wait(a);
            waited = true;
        }
        uint4 xr[P][MT];
#pragma unroll
        for (int j = 0; j < P; j++) {
            int f = base + j * 256 + tid;
#pragma unroll
            for (int m = 0; m < MT; m++)
                xr[j][m] = f < np && m < nm ? ld_act16(a.x + (long)xrow[m] * K + f * 8) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < P; j++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                float fg[8], fu[8], s0 = 0.f, s1 = 0.f;
                if (FP8) {
                    int kk = (base + j * 256 + tid) * 8;
                    bool ok = kk < K && i0 + r < I;
                    s0 = sh_g ? sg[j] : wp_scale(W, mat, i0 + r, kk, ok);
                    s1 = sh_u ? su[j] : wp_scale(W, mat, I + i0 + r, kk, ok);
                }
                wp_float<FP8>(wg[j][r], s0, fg);
                wp_float<FP8>(wu[j][r], s1, fu);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    float xf[8];
                    bf16x8_float(xr[j][m], xf);
#pragma unroll
                    for (int c = 0; c < 8; c++) {
                        g[r][m] = fmaf(fg[c], xf[c], g[r][m]);
                        u[r][m] = fmaf(fu[c], xf[c], u[r][m]);
                    }
                }
            }
    }
    if (!waited) gu_wait(a);
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) {
            float gs = warp_sum(g[r][m]), us = warp_sum(u[r][m]);
            if (lane == 0) {
                part[warp][r][0][m] = gs;
                part[warp][r][1][m] = us;
            }
        }
    __syncthreads();
    if (tid < R * MT) {
        int r = tid / MT, m = tid % MT;
        if (m < nm && i0 + r < I) {
            float gs = 0.f, us = 0.f;
#pragma unroll
            for (int w = 0; w < 8; w++) {
                gs += part[w][r][0][m];
                us += part[w][r][1][m];
            }
            float *dst = shared ? a.As : a.A;
            dst[(long)orow[m] * I + i0 + r] = silu_f(gs) * us;
        }
    }
}

/* ------------------------------------------------------------------ down + combine ---- */

/* One block per R output rows n0 ... The pieces of all units (unit u < nf: the u-th distinct
 * routed expert, in first-pair order; u = nf: the shared experts), in that order, go to thread
 * t as pieces t, t + 256, ... (P per round, every load of a round issued before the first FMA);
 * a thread adds w[pair] * (its piece of the R rows . the pair's A piece) into one sum per (row,
 * token), whatever unit the piece belongs to. a.early: the expert ids come from the router,
 * which finished before any k_small_gu block passed its wait, and k_small_gu releases this
 * kernel only after that wait; so the ids are read, and the first round's weights loaded,
 * before this kernel's wait, overlapping k_small_gu's tail. Only A / As (k_small_gu's output)
 * and the routing weights are read after it. */
template <int MT, bool FP8, int R, int P>
__global__ void __launch_bounds__(256) k_small_down(small_args a) {
    __shared__ float part[8][R][MT];
    pdl_launch_dependents();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, Tk = a.T * a.k;
    const int n0 = blockIdx.x * R;
    if (!a.early) pdl_wait(); /* A, As, the expert ids and weights come from earlier kernels */
    int e;
    unsigned same;
    pair_info(a.idx, Tk, a.E, lane, &e, &same);
    const unsigned firsts = __ballot_sync(0xffffffffu, same != 0u && (__ffs(same) - 1) == lane);
    const int nf = __popc(firsts);
    /* lane u < nf describes unit u: its expert and the mask of its pairs */
    const int fp = lane < nf ? (int)__fns(firsts, 0, lane + 1) : 0;
    const int umat = __shfl_sync(0xffffffffu, e, fp);
    unsigned umask = __shfl_sync(0xffffffffu, same, fp);
    if (lane >= nf) umask = 0u;
    const int pr = a.I / 8, nr = nf * pr, total = nr + a.Is / 8;
    /* fp8: the R rows share one scale row (DeepSeek's 128-row blocks), else a scale per row */
    const int nlast = min(n0 + R, a.D) - 1;
    const bool sh_r = FP8 && scale_row(a.dn, n0) == scale_row(a.dn, nlast);
    const bool sh_s = FP8 && scale_row(a.sdn, n0) == scale_row(a.sdn, nlast);
    float acc[R][MT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) acc[r][m] = 0.f;
    bool waited = !a.early;
    for (int base = 0; base < total; base += 256 * P) {
        uint4 w[P][R];
        float sc[P]; /* fp8: the rows' shared scale (the rare per-row ones are read when used) */
        int pu[P], pk[P], pm[P];
#pragma unroll
        for (int j = 0; j < P; j++) {
            int f = base + j * 256 + tid;
            int u = f < nr ? f / pr : (f < total ? nf : -1);
            int kk = f < nr ? (f - u * pr) * 8 : (f - nr) * 8;
            int mat = __shfl_sync(0xffffffffu, umat, u >= 0 && u < nf ? u : 0);
            const wview &W = u == nf ? a.sdn : a.dn;
            if (u == nf) mat = 0;
            pu[j] = u;
            pk[j] = kk;
            pm[j] = mat;
#pragma unroll
            for (int r = 0; r < R; r++) w[j][r] = wp_load<FP8>(W, mat, n0 + r, kk, u >= 0 && n0 + r < a.D);
            if (FP8) sc[j] = (u == nf ? sh_s : sh_r) ? wp_scale(W, mat, n0, kk, u >= 0) : 0.f;
        }
        if (!waited) {
            pdl_wait(); /* A and As come from k_small_gu */
            waited = true;
        }
        /* every piece's A rows and routing weights, then the FMAs */
        float4 av[P][MT][2];
        float cw[P][MT];
        int tok[P][MT];
#pragma unroll
        for (int j = 0; j < P; j++) {
            int u = pu[j], kk = pk[j];
            unsigned mine = __shfl_sync(0xffffffffu, umask, u >= 0 && u < nf ? u : 0);
            if (!(u >= 0 && u < nf)) mine = 0;
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const float *src = NULL;
                float c = 0.f;
                int t = 0;
                if (u == nf) {
                    if (m < a.T) {
                        t = m;
                        src = a.As + (long)m * a.Is + kk;
                        c = 1.f;
                    }
                } else if (mine) {
                    int q = __ffs(mine) - 1;
                    mine &= mine - 1u;
                    t = q / a.k;
                    src = a.A + (long)q * a.I + kk;
                    c = a.w[q];
                }
                tok[j][m] = t;
                cw[j][m] = c;
                av[j][m][0] = src ? ld_act16f(src) : make_float4(0.f, 0.f, 0.f, 0.f);
                av[j][m][1] = src ? ld_act16f(src + 4) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
#pragma unroll
        for (int j = 0; j < P; j++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                float f[8], s0 = 0.f;
                if (FP8) {
                    int u = pu[j];
                    if (u == nf ? sh_s : sh_r) s0 = sc[j];
                    else /* rows of several scale blocks: their scales are read here */
                        s0 = wp_scale(u == nf ? a.sdn : a.dn, pm[j], n0 + r, pk[j], u >= 0 && n0 + r < a.D);
                }
                wp_float<FP8>(w[j][r], s0, f);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    const float x[8] = {av[j][m][0].x, av[j][m][0].y, av[j][m][0].z, av[j][m][0].w,
                                        av[j][m][1].x, av[j][m][1].y, av[j][m][1].z, av[j][m][1].w};
                    float d = 0.f;
#pragma unroll
                    for (int c = 0; c < 8; c++) d = fmaf(f[c], x[c], d);
#pragma unroll
                    for (int t = 0; t < MT; t++)
                        if (tok[j][m] == t) acc[r][t] = fmaf(cw[j][m], d, acc[r][t]);
                }
            }
    }
    if (!waited) pdl_wait();
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) {
            float s = warp_sum(acc[r][m]);
            if (lane == 0) part[warp][r][m] = s;
        }
    __syncthreads();
    if (tid < R * MT) {
        int r = tid / MT, t = tid % MT, n = n0 + r;
        if (t < a.T && n < a.D) {
            float s = 0.f;
#pragma unroll
            for (int w = 0; w < 8; w++) s += part[w][r][t];
            a.out[(long)t * a.D + n] = __float2bfloat16_rn(s);
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

/* gate+up (with the shared experts), then down + combine; chosen from shapes only. Rows per
 * block and pieces per round, measured (docs/PERF.md, 2026-12-02 late morning): at one
 * token gate/up R = 4 (2 the same, 8 slower) and down R = 8 with P = 2 (the A pieces a block
 * reads serve more rows; R = 2 / 4 / 16 and P = 1 / 3 slower); at 2-4 tokens (registers) down
 * R = 4, P = 1, the best of three settings but slower than the earlier warp kernels at 3-4
 * tokens (bench_cuda_decode moe; those steps take the permuted path unless
 * DEEPINFER_CUDA_MOE_SMALL says otherwise). fp8 weights take the same settings: gate/up 8 rows
 * with down 8 x 2, 8 x 4 or 16 x 2 were all slower at one token. A thread's pieces and the warp
 * order are fixed, so the bits do not depend on timing. */
template <int MT, bool FP8>
static void launch_small(cuda_state *st, const small_args &a) {
    constexpr int RG = 4, RD = MT == 1 ? 8 : 4, PD = MT == 1 ? 2 : 1;
    int gr = ceil_div_i(a.I, RG), gs = a.Is > 0 ? ceil_div_i(a.Is, RG) : 0;
    cuda_launch_pdl(st, st->pdl >= 1, k_small_gu<MT, FP8, RG, 1>, dim3(a.T * a.k * gr + gs), dim3(256), 0, a, gr);
    CUDA_LAUNCHED(st, "moe_small_gu");
    cuda_launch_pdl(st, st->pdl >= 1, k_small_down<MT, FP8, RD, PD>, dim3(ceil_div_i(a.D, RD)), dim3(256), 0, a);
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
