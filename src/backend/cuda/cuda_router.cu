/* cuda_router.cu - the MoE router on the GPU: fp32 logits from the fp32 normed hidden state and
 * the bf16-stored gate weight with fp32 arithmetic (as HF's DeepseekV3TopkRouter), then one warp
 * per token (k_route) for sigmoid / softmax, correction bias and group-limited top-k.
 *
 * Owner: cuda. Semantics follow backend.h / cpu_moe.c (HF transformers 5.17): ties pick the lower
 * expert index; outputs sorted by expert index; weights renormalised with a double sum plus 1e-20
 * when norm_topk_prob. Every router-logits kernel computes each (token, expert) logit with the
 * same operations in the same order, so a token's routing never depends on its batch
 * (test_cuda_attn route checks the bits). */
#include <float.h>

#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_pdl.cuh"

/* Router logits in fp32: out[t, e] = Σ_d x[t, d] · W[e, d], x f32 [T, D], W bf16 [E, D].
 * One kernel for every T. A block of RT_Q = 4 warps computes EE experts x TT tokens; warp q,
 * lane l owns the columns (q·32 + l)·4 + 512·i + c, c < 4 (vec: D % 4 == 0, aligned rows) or
 * q·32 + l + 128·i (scalar) of every row. Its partial sums run in column order with fmaf, then
 * a shuffle tree per warp, then the four warps' partials are added in q order. So each
 * (t, e) is summed in the same order whatever T and EE are: the router is batch-invariant (a
 * token's routing never depends on what else is in its batch), and the dispatch below may pick
 * EE by T freely. EE = 1 spreads decode over E blocks with the row's loads all in flight;
 * EE = 8 reuses each x load for 8 experts (prefill). x rows are read from global memory (f32,
 * L2-resident: T x D x 4 bytes, read E / EE times). */
enum { RT_TOK = 8, RT_Q = 4, RT_MID_MAX_T = 512 };

/* One column step of the vectorised router sum: thread (q, lane) adds columns d..d+3 of the EE
 * experts' rows (from e0; the first ne exist) times the nt token rows r0.. of x (row stride D,
 * global or shared memory) into acc, with one fixed fmaf nesting. Shared by both router kernels so
 * their sums are the same operations. */
template <int EE, int TT>
static __device__ __forceinline__ void rt_step_vec(float (&acc)[EE][TT], const bf16 *W, int e0, int ne, int D, int d,
                                                   const float *x, int r0, int nt) {
    float w[EE][4];
#pragma unroll
    for (int j = 0; j < EE; j++) {
        uint2 u = make_uint2(0u, 0u);
        if (j < ne) u = *(const uint2 *)(W + (long)(e0 + j) * D + d);
        const bf16 *b = (const bf16 *)&u;
#pragma unroll
        for (int c = 0; c < 4; c++) w[j][c] = __bfloat162float(b[c]);
    }
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
        if (tt < nt) {
            float4 v = *(const float4 *)(x + (long)(r0 + tt) * D + d);
#pragma unroll
            for (int j = 0; j < EE; j++)
                acc[j][tt] = fmaf(w[j][3], v.w, fmaf(w[j][2], v.z, fmaf(w[j][1], v.y, fmaf(w[j][0], v.x, acc[j][tt]))));
        }
}

/* The end of both router kernels: each warp's shuffle tree per (expert, token), then the four
 * warps' partials added in q order into out[t0 + tt, e0 + j]. REUSE: end with a barrier, so
 * `part` may be written again. */
template <int EE, int TT, bool REUSE>
static __device__ __forceinline__ void rt_reduce_store(float (&acc)[EE][TT], float (*part)[EE][TT], float *out, int E,
                                                       int e0, int ne, int t0, int nt) {
    const int lane = threadIdx.x & 31, q = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < EE; j++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            float v = acc[j][tt];
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) part[q][j][tt] = v;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < EE * TT; i += RT_Q * 32) {
        int j = i / TT, tt = i % TT;
        if (j < ne && tt < nt)
            out[(long)(t0 + tt) * E + e0 + j] = ((part[0][j][tt] + part[1][j][tt]) + part[2][j][tt]) + part[3][j][tt];
    }
    if (REUSE) __syncthreads();
}

template <int EE, int UNROLL, int TT = RT_TOK>
__global__ void __launch_bounds__(RT_Q * 32) k_router_logits(float *out, const float *x, const bf16 *W, int T, int E,
                                                             int D, int vec, int pdl) {
    __shared__ float part[RT_Q][EE][TT];
    if (pdl) { /* launched with PDL; k_route (one block per 4 tokens) released at once (st->route_pdl) */
        pdl_launch_dependents();
        pdl_wait();
    }
    const int lane = threadIdx.x & 31, q = threadIdx.x >> 5;
    int eb = blockIdx.y, tb = blockIdx.x;
    if (EE > 1) { /* expert groups vary fastest in launch order (see launch_router_logits) */
        long flat = (long)blockIdx.y * gridDim.x + blockIdx.x;
        eb = (int)(flat % gridDim.y);
        tb = (int)(flat / gridDim.y);
    }
    const int e0 = eb * EE, t0 = tb * TT;
    const int nt = min(TT, T - t0), ne = min(EE, E - e0);
    float acc[EE][TT];
#pragma unroll
    for (int j = 0; j < EE; j++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++) acc[j][tt] = 0.f;
    if (vec) {
#pragma unroll UNROLL
        for (int d = (q * 32 + lane) * 4; d < D; d += RT_Q * 128)
            rt_step_vec<EE, TT>(acc, W, e0, ne, D, d, x, t0, nt);
    } else {
#pragma unroll UNROLL
        for (int d = q * 32 + lane; d < D; d += RT_Q * 32) {
            float w[EE];
#pragma unroll
            for (int j = 0; j < EE; j++) w[j] = j < ne ? __bfloat162float(W[(long)(e0 + j) * D + d]) : 0.f;
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                if (tt < nt) {
                    float v = x[(long)(t0 + tt) * D + d];
#pragma unroll
                    for (int j = 0; j < EE; j++) acc[j][tt] = fmaf(w[j], v, acc[j][tt]);
                }
        }
    }
    rt_reduce_store<EE, TT, false>(acc, part, out, E, e0, ne, t0, nt);
}

/* Prefill variant (T > 32, vec): a block stages its TT tokens' x rows in shared memory once
 * (cp.async, every load in flight together) and then walks all expert groups of EE, reading each
 * group's W rows from global (L2-resident) memory. Thread (q, lane) owns exactly the columns it
 * owns in k_router_logits and every (t, e) goes through the same fmaf nesting, shuffle tree and
 * warp order, so the logits are bit-identical to k_router_logits' (tested: a token alone vs in
 * its batch). */
template <int EE, int TT>
__global__ void __launch_bounds__(RT_Q * 32) k_router_logits_smem(float *out, const float *x, const bf16 *W, int T,
                                                                  int E, int D) {
    extern __shared__ __align__(16) float xs[]; /* [TT][D] */
    __shared__ float part[RT_Q][EE][TT];
    const int lane = threadIdx.x & 31, q = threadIdx.x >> 5;
    const int t0 = blockIdx.x * TT, nt = min(TT, T - t0);
    for (int i = threadIdx.x; i < nt * (D / 4); i += RT_Q * 32)
        cp_async16(xs + (long)i * 4, x + (long)t0 * D + (long)i * 4, 16);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    for (int e0 = 0; e0 < E; e0 += EE) {
        const int ne = min(EE, E - e0);
        float acc[EE][TT];
#pragma unroll
        for (int j = 0; j < EE; j++)
#pragma unroll
            for (int tt = 0; tt < TT; tt++) acc[j][tt] = 0.f;
        for (int d = (q * 32 + lane) * 4; d < D; d += RT_Q * 128) rt_step_vec<EE, TT>(acc, W, e0, ne, D, d, xs, 0, nt);
        rt_reduce_store<EE, TT, true>(acc, part, out, E, e0, ne, t0, nt);
    }
}

/* Whether the router-logits kernels may take the vectorised column steps (float4 x, 4 bf16 of W). */
static int router_vec(const float *x, const di_weight *W) {
    return W->cols % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)W->data & 7) == 0;
}

static void launch_router_logits(cuda_state *st, float *out, const float *x, const di_weight *W, int T) {
    int E = W->rows, D = W->cols, vec = router_vec(x, W);
    const bf16 *w = (const bf16 *)W->data;
    /* tokens on x (no 65535 limit), experts on y (E <= DI_MAX_EXPERTS) */
    if (T <= 32) {
        /* st->router_tt tokens per block (the same sums whatever the grouping; fewer tokens per
         * block: fewer x loads and registers per thread, more blocks) */
        const int tt = st->router_tt;
        dim3 grid(ceil_div_i(T, tt), E);
        bool pdl = pdl_with(st, st->route_pdl);
        auto kern = tt == 1   ? k_router_logits<1, 4, 1>
                    : tt == 2 ? k_router_logits<1, 4, 2>
                    : tt == 4 ? k_router_logits<1, 4, 4>
                              : k_router_logits<1, 4, 8>;
        cuda_launch_pdl(st, pdl, kern, grid, dim3(RT_Q * 32), 0, out, x, w, T, E, D, vec, (int)pdl);
    } else if (vec && st->router_smem && (long)RT_TOK * D * 4 <= 160 * 1024 && ceil_div_i(T, RT_TOK) >= 2 * st->n_sm) {
        /* large prefills only: a block walks every expert group, so it needs >= 2 blocks per SM
         * (2112 tokens on 132 SMs); below that the one-group blocks keep more SMs busy (measured:
         * batch 64 decode 19.3k -> 18.2k tok/s, prefill 512 93.5k -> 89.3k with this kernel) */
        size_t smem = (size_t)RT_TOK * D * 4;
        static bool attr = false; /* host-only, set once */
        if (!attr && smem > 48 * 1024) {
            if (cuda_note(st, cudaFuncSetAttribute(k_router_logits_smem<8, RT_TOK>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024),
                          "router_logits smem attribute"))
                return;
            attr = true;
        }
        k_router_logits_smem<8, RT_TOK><<<ceil_div_i(T, RT_TOK), RT_Q * 32, smem, st->stream>>>(out, x, w, T, E, D);
    } else if (T <= RT_MID_MAX_T && st->router_mid) {
        /* decode batches of 33-512 tokens: blocks of 4 experts x 4 tokens, so a batch of 64
         * tokens over 64 experts has 256 blocks where 8 x 8 groups gave 64 (16 us per layer on
         * an H100; docs/PERF.md 2026-12-05); x (T x D x 4 bytes, L2-resident) is read E / 4 times */
        dim3 grid(ceil_div_i(T, 4), ceil_div_i(E, 4));
        k_router_logits<4, 1, 4><<<grid, RT_Q * 32, 0, st->stream>>>(out, x, w, T, E, D, vec, 0);
    } else {
        /* prefill: the blocks of one token group (all expert groups) adjacent in launch order, so
         * the group's x rows come from HBM once and then from L2 (x is T x D x 4 bytes: 64 MB at
         * 8192 tokens, more than L2, so with tokens varying fastest every expert group re-read it
         * from HBM). The expert-group index is derived from the flat block index; the kernel's
         * arithmetic is unchanged. */
        dim3 grid(ceil_div_i(T, RT_TOK), ceil_div_i(E, 8));
        k_router_logits<8, 1><<<grid, RT_Q * 32, 0, st->stream>>>(out, x, w, T, E, D, vec, 0);
    }
    CUDA_LAUNCHED(st, "router_logits");
}

struct arg_best {
    float v;
    int e; /* -1: none */
};

static __device__ __forceinline__ arg_best better(arg_best a, arg_best b) {
    if (a.e < 0) return b;
    if (b.e < 0) return a;
    if (b.v > a.v) return b;
    if (a.v > b.v) return a;
    return b.e < a.e ? b : a;
}

/* Warp-wide argmax over v[0..n) skipping taken[i]; lowest index on ties. */
static __device__ int warp_argmax(const float *v, const unsigned char *taken, int n) {
    int lane = threadIdx.x & 31;
    arg_best b = {0.f, -1};
    for (int i = lane; i < n; i += 32)
        if (!taken[i] && (b.e < 0 || v[i] > b.v)) b = arg_best{v[i], i};
    for (int o = 16; o > 0; o >>= 1) {
        arg_best x;
        x.v = __shfl_xor_sync(0xffffffffu, b.v, o);
        x.e = __shfl_xor_sync(0xffffffffu, b.e, o);
        b = better(b, x);
    }
    return b.e;
}

/* Top-k on warp reductions (steps of at most st->route_redux tokens, DEEPINFER_CUDA_ROUTE_REDUX): the k
 * experts (or groups) that k warp_argmax calls with taken[] would pick, without a shared-memory
 * scan and a 10-shuffle tree per pick.
 * Keys: lane l holds its candidates v[l + 32 j], j < NJ, in registers as 32-bit keys whose
 * unsigned order is the float order of `>`:
 *     key(x) = bits(x) | 0x80000000 for x >= +0,  ~bits(x) for x < 0,  after -0.0 -> +0.0,
 * so key(a) > key(b) exactly when a > b (IEEE compare; this build flushes no denormals, so they
 * keep their order as under `>`), and key(-0.0) == key(+0.0) as -0.0 == +0.0 (a tie: the lower
 * index wins, as in warp_argmax). A slot taken or past n reads as key 0, below every non-NaN
 * value (key(-INF) = 0x007fffff): so an untaken -INF (an expert of a group that noaux_tc masked
 * out) or 0 (one masked by group_limited_greedy) is still picked, lowest index first, once nothing
 * larger is left, as warp_argmax accepts the first untaken element whatever its value.
 * One pick: each lane's largest untaken key (the lowest j among equal keys, i.e. the lowest
 * index, as warp_argmax's ascending scan with `>` keeps), __reduce_max_sync of those, then
 * __reduce_min_sync of the index over the lanes holding that maximum; the owning lane sets the
 * slot's bit in its pick mask. That is the largest value, lowest index among equal ones: what
 * warp_argmax returns when no candidate is NaN (`>` is then a total preorder, so the shape of
 * its shuffle tree does not matter).
 * NaN: warp_argmax's answer then depends on where the NaN sits (a lane's first untaken NaN is
 * never replaced by its scan, and `better` keeps the lower index against a NaN), which no
 * max-reduction reproduces; so if any of the n candidates is NaN this returns false, having
 * picked nothing, and the caller runs warp_argmax: the same ids and weight bits in every case.
 * Returns true with *picked: bit j set when v[lane + 32 j] was picked (each lane its own bits). */
static __device__ __forceinline__ unsigned route_key(float x) {
    unsigned b = __float_as_uint(x);
    if ((b << 1) == 0u) b = 0u; /* -0.0 -> +0.0 */
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

template <int NJ>
static __device__ __forceinline__ bool warp_topk_redux_nj(const float *v, int n, int k, unsigned *picked) {
    const int lane = threadIdx.x & 31;
    unsigned key[NJ];
    bool nan = false;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int i = lane + 32 * j;
        const float x = i < n ? v[i] : 0.0f;
        nan |= isnan(x);
        key[j] = i < n ? route_key(x) : 0u;
    }
    if (__any_sync(0xffffffffu, nan)) return false;
    unsigned mask = 0u;
    for (int p = 0; p < k; p++) {
        unsigned bk = 0u;
        int bi = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const unsigned kj = (mask >> j) & 1u ? 0u : key[j]; /* taken: 0 (keys stay read-only, */
            if (kj > bk) {                                       /* so they stay in registers)    */
                bk = kj;
                bi = lane + 32 * j;
            }
        }
        const unsigned mx = __reduce_max_sync(0xffffffffu, bk);
        if (mx == 0u) break; /* nothing left (k > n): warp_argmax's -1 */
        const int win = __reduce_min_sync(0xffffffffu, bk == mx ? bi : 0x7fffffff);
        if ((win & 31) == lane) mask |= 1u << (win >> 5);
    }
    *picked = mask;
    return true;
}

/* The top k of v[0..n), n <= 32 NJ (NJ a power of two), as k warp_argmax calls with taken[] would
 * pick them; false (nothing picked) when a candidate is NaN. Runs with the fewest slots per lane
 * that hold n (NJ halved while n fits). */
template <int NJ>
static __device__ __forceinline__ bool warp_topk_redux(const float *v, int n, int k, unsigned *picked) {
    if constexpr (NJ > 1) {
        if (n <= 16 * NJ) return warp_topk_redux<NJ / 2>(v, n, k, picked);
    }
    return warp_topk_redux_nj<NJ>(v, n, k, picked);
}

/* The top k of v[0..n) as k warp_argmax calls with taken[] pick them: with `redux`, through
 * warp_topk_redux (true: the picks in *pick, taken[] untouched); otherwise, or when a value is
 * NaN, warp_argmax marking taken[] (false). */
template <int NJ>
static __device__ __forceinline__ bool route_topk(const float *v, unsigned char *taken, int n, int k, int redux,
                                                  unsigned *pick) {
    if (redux && warp_topk_redux<NJ>(v, n, k, pick)) return true;
    const int lane = threadIdx.x & 31;
    for (int p = 0; p < k; p++) {
        int best = warp_argmax(v, taken, n);
        if (lane == 0 && best >= 0) taken[best] = 1;
        __syncwarp();
    }
    return false;
}

/* k_route's shared memory per warp: s, sel [E] and gscore [G] and the selected weights [k]
 * (floats), then taken [E] and gtaken [G] (bytes), rounded to 16 */
static __host__ __device__ size_t route_smem_per_warp(int E, int G, int k) {
    return ((size_t)E * 8 + (size_t)G * 4 + (size_t)k * 4 + (size_t)E + (size_t)G + 15) & ~(size_t)15;
}

/* redux: T <= st->route_redux, the picks through warp_topk_redux (warp_argmax when a value is NaN);
 * NJ: its slots per lane, E <= 32 NJ (see cuda_moe_route) */
template <int NJ>
__global__ void k_route(const float *logits, const float *bias, di_route_params rp, int T, int32_t *idx_out,
                        float *w_out, int redux, int release) {
    extern __shared__ unsigned char smem[];
    pdl_wait(); /* st->route_pdl: launched early; the logits come from the router-logits kernel */
    if (release) pdl_launch_dependents(); /* the padded experts' permute (PDL, st->moe_pdl) may launch */
    const int E = rp.n_experts, k = rp.top_k, G = rp.n_group > 0 ? rp.n_group : 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    size_t per_warp = route_smem_per_warp(E, G, k);
    unsigned char *base = smem + per_warp * warp;
    float *s = (float *)base, *sel = s + E, *gscore = sel + E, *wsel = gscore + G;
    unsigned char *taken = (unsigned char *)(wsel + k), *gtaken = taken + E;
    int t = blockIdx.x * (blockDim.x >> 5) + warp;
    if (t >= T) return;
    const float *lg = logits + (long)t * E;
    const bool noaux = rp.method == DI_ROUTE_NOAUX_TC;
    /* lane l's logits e = l + 32 j (E <= 32 NJ) in registers, all loads in flight at once (one
     * memory round trip on the step's critical path, not one per pass); each lane then works
     * through its e in ascending order, as a `for (e = lane; e < E; e += 32)` loop would */
    float lv[NJ];
#pragma unroll
    for (int j = 0; j < NJ; j++) lv[j] = lane + 32 * j < E ? lg[lane + 32 * j] : 0.0f;
    if (noaux) {
        float bv[NJ];
#pragma unroll
        for (int j = 0; j < NJ; j++) bv[j] = bias && lane + 32 * j < E ? bias[lane + 32 * j] : 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int e = lane + 32 * j;
            if (e >= E) continue;
            const float sv = 1.0f / (1.0f + expf(-lv[j]));
            s[e] = sv;
            sel[e] = sv + bv[j];
        }
    } else {
        float mx = -FLT_MAX;
#pragma unroll
        for (int j = 0; j < NJ; j++)
            if (lane + 32 * j < E) mx = fmaxf(mx, lv[j]);
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        double sum = 0.0;
#pragma unroll
        for (int j = 0; j < NJ; j++)
            if (lane + 32 * j < E) {
                lv[j] = expf(lv[j] - mx);
                sum += lv[j];
            }
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
        for (int j = 0; j < NJ; j++)
            if (lane + 32 * j < E) sel[lane + 32 * j] = s[lane + 32 * j] = (float)((double)lv[j] / sum);
    }
    for (int e = lane; e < E; e += 32) taken[e] = 0;
    __syncwarp();
    int gs = E / G;
    if (G > 1 && rp.method != DI_ROUTE_GREEDY && rp.topk_group < G) {
        for (int gi = lane; gi < G; gi += 32) {
            const float *v = sel + (long)gi * gs;
            if (noaux) { /* sum of the two largest */
                float a = -INFINITY, b = -INFINITY;
                for (int i = 0; i < gs; i++) {
                    if (v[i] > a) {
                        b = a;
                        a = v[i];
                    } else if (v[i] > b) {
                        b = v[i];
                    }
                }
                gscore[gi] = gs >= 2 ? a + b : a;
            } else { /* max */
                float a = v[0];
                for (int i = 1; i < gs; i++) a = v[i] > a ? v[i] : a;
                gscore[gi] = a;
            }
            gtaken[gi] = 0;
        }
        __syncwarp();
        unsigned gpick;
        if (route_topk<NJ>(gscore, gtaken, G, rp.topk_group, redux, &gpick)) {
            for (int gi = lane; gi < G; gi += 32) gtaken[gi] = (gpick >> (gi >> 5)) & 1u;
            __syncwarp();
        }
        float fill = noaux ? -INFINITY : 0.0f;
        for (int e = lane; e < E; e += 32)
            if (!gtaken[e / gs]) sel[e] = fill;
        __syncwarp();
    }
    unsigned pick = 0u; /* the fast path's picks: bit j for expert lane + 32 j */
    const bool fast = route_topk<NJ>(sel, taken, E, k, redux, &pick);
    /* emit in ascending expert order */
    int32_t *io = idx_out + (long)t * k;
    float *wo = w_out + (long)t * k;
    int n = 0;
    for (int b0 = 0; b0 < E && n < k; b0 += 32) {
        int e = b0 + lane;
        bool f = e < E && (fast ? ((pick >> (b0 >> 5)) & 1u) != 0u : taken[e] != 0);
        unsigned m = __ballot_sync(0xffffffffu, f);
        if (f) {
            int r = n + __popc(m & ((1u << lane) - 1u));
            if (r < k) {
                io[r] = e;
                wsel[r] = noaux ? s[e] : sel[e];
            }
        }
        n += __popc(m);
    }
    __syncwarp();
    /* the selected weights from shared memory (not read back from wo: one memory round trip
     * less on the step's critical path), summed in rank order by every lane (the same sum),
     * then lane i < k divides weight i: the divisions side by side, not one after another */
    double sum = 0.0;
    for (int i = 0; i < k; i++) sum += wsel[i];
    const float denom = (float)sum + 1e-20f;
    for (int i = lane; i < k; i += 32) {
        float w = wsel[i];
        if (rp.norm_topk_prob) w /= denom;
        wo[i] = w * rp.routed_scaling_factor;
    }
}

/* k_route over fp32 logits already in scratch [T, E] (the selection half of moe_route);
 * release: PDL-release the next kernel early (see cuda_moe_route). */
static void launch_route(cuda_state *st, const float *scratch, const di_weight *bias, const di_route_params *rp,
                         int T, int32_t *topk_idx, float *topk_w, int pdl, int release) {
    int E = rp->n_experts, k = rp->top_k, G = rp->n_group > 0 ? rp->n_group : 1;
    int warps = E > 512 ? 2 : 4;
    size_t per_warp = route_smem_per_warp(E, G, k);
    /* the fewest register slots per lane (the logits, warp_topk_redux's keys): the larger
     * variants hold more registers (ptxas: 32 / 47 / 78 per thread at 8 / 16 / 32), which would
     * cut large prefills' occupancy, and run more predicated slots */
    static_assert(DI_MAX_EXPERTS <= 32 * 32, "k_route: at most 32 slots per lane (one 32-bit pick mask)");
    auto route = E <= 64 ? k_route<2> : E <= 256 ? k_route<8> : E <= 512 ? k_route<16> : k_route<32>;
    cuda_launch_pdl(st, pdl, route, dim3(ceil_div_i(T, warps)), dim3(warps * 32), per_warp * warps, scratch,
                    bias ? (const float *)bias->data : NULL, *rp, T, topk_idx, topk_w, (int)(T <= st->route_redux),
                    release);
    CUDA_LAUNCHED(st, "moe_route");
}

void cuda_route_select(cuda_state *st, const float *logits, const di_weight *bias, const di_route_params *rp, int T,
                       int32_t *topk_idx, float *topk_w) {
    int E = rp->n_experts, k = rp->top_k, G = rp->n_group > 0 ? rp->n_group : 1;
    DI_ASSERT(E <= DI_MAX_EXPERTS && k >= 1 && k <= E && E % G == 0);
    DI_ASSERT(!bias || (bias->cols == E && bias->dtype == DI_DTYPE_F32));
    if (T <= 0) return;
    launch_route(st, logits, bias, rp, T, topk_idx, topk_w, 0, 0);
}

void cuda_moe_route(di_backend *be, int32_t *topk_idx, float *topk_w, const float *x, const di_weight *W_g,
                    const di_weight *bias, const di_route_params *rp, int T, float *scratch) {
    cuda_state *st = cst(be);
    int E = rp->n_experts, k = rp->top_k, G = rp->n_group > 0 ? rp->n_group : 1;
    DI_ASSERT(W_g->rows == E && W_g->n == 1 && W_g->dtype == DI_DTYPE_BF16);
    DI_ASSERT(E <= DI_MAX_EXPERTS && k >= 1 && k <= E && E % G == 0);
    DI_ASSERT(!bias || (bias->cols == E && bias->dtype == DI_DTYPE_F32));
    if (T <= 0) return;
    launch_router_logits(st, scratch, x, W_g, T);
    /* release: past the small experts' sizes (whose k_small_gu, released early, took slots from
     * the work beside it) the next kernel is the permutation, one block that waits resident */
    int release = pdl_with(st, st->moe_pdl) && T > st->moe_small;
    launch_route(st, scratch, bias, rp, T, topk_idx, topk_w, pdl_with(st, st->route_pdl && T <= 32), release);
}
