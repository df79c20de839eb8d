/* cuda_moe.cu - mixture-of-experts on the GPU: the router (fp32 logits from the fp32 normed
 * hidden state and the bf16-stored gate weight with fp32 arithmetic, as HF's
 * DeepseekV3TopkRouter; then one warp per token for sigmoid/softmax, correction bias,
 * group-limited top-k), and all routed experts of
 * a layer without host synchronisation: a one-block kernel counts tokens per expert and
 * builds the permutation, offsets, active-expert list and GEMM tile table on the device; two
 * grouped GEMMs (gate+up with SiLU-mul fused into the epilogue, then down) run over every expert
 * in one launch each; a combine kernel sums each token's experts in its top-k order with the
 * routing weights. Steps of 16..128 tokens with bf16 experts instead pad every expert to T rows
 * (a token picks an expert at most once, so none overflows) and run the two GEMMs as cuBLASLt
 * batched calls (gather, GEMM, SiLU-mul, GEMM, combine): by default over min(E, T*k) slots whose
 * matrices come from pointer arrays the permutation kernel writes (only experts with tokens are
 * read from HBM), or strided over all experts (DEEPINFER_CUDA_MOE_LT=1, or when cuBLASLt has no
 * pointer-array algorithm). Steps of at most DEEPINFER_CUDA_MOE_SMALL tokens (default 1) go to
 * cuda_moe_small.cu instead.
 *
 * Owner: cuda. Semantics follow backend.h / cpu_moe.c (HF transformers 5.17): ties pick the
 * lower expert index; outputs sorted by expert index; weights renormalised with a double sum
 * plus 1e-20 when norm_topk_prob. The permutation order inside an expert comes from shared
 * atomics (not deterministic), but every output row depends only on its own input row, so
 * results are. Scratch layout (256-byte aligned): offsets [E+1] i32, tile_off [E+1] i32,
 * active [E+1] i32 (count last), perm [T*k] i32 (position -> token), slot_of [T*k] i32 (pair ->
 * position), A [T*k, I] bf16, Y [T*k, D] bf16, then the padded path's pointer arrays [6][E] and
 * Xp / Hp / Ap / Yp [E*cap] x D / 2I / I / D bf16 (Hp and Yp with cap spare rows more; cap =
 * min(max_tokens, 128)). */
#include <float.h>

#include "backend/cuda/cuda_mma.cuh"

/* ---------------------------------------------------------------- router ---- */

/* Router logits in fp32: out[t, e] = Σ_d x[t, d] · W[e, d], x f32 [T, D], W bf16 [E, D].
 * One kernel for every T. A block of RT_Q = 4 warps computes EE experts x RT_TOK tokens; warp q,
 * lane l owns the columns (q·32 + l)·4 + 512·i + c, c < 4 (vec: D % 4 == 0, aligned rows) or
 * q·32 + l + 128·i (scalar) of every row. Its partial sums run in column order with fmaf, then
 * a shuffle tree per warp, then the four warps' partials are added in q order. So each
 * (t, e) is summed in the same order whatever T and EE are: the router is batch-invariant (a
 * token's routing never depends on what else is in its batch), and the dispatch below may pick
 * EE by T freely. EE = 1 spreads decode over E blocks with the row's loads all in flight;
 * EE = 8 reuses each x load for 8 experts (prefill). x rows are read from global memory (f32,
 * L2-resident: T x D x 4 bytes, read E / EE times). */
enum { RT_TOK = 8, RT_Q = 4 };

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

template <int EE, int UNROLL>
__global__ void __launch_bounds__(RT_Q * 32) k_router_logits(float *out, const float *x, const bf16 *W, int T, int E,
                                                             int D, int vec) {
    __shared__ float part[RT_Q][EE][RT_TOK];
    const int lane = threadIdx.x & 31, q = threadIdx.x >> 5;
    int eb = blockIdx.y, tb = blockIdx.x;
    if (EE > 1) { /* expert groups vary fastest in launch order (see launch_router_logits) */
        long flat = (long)blockIdx.y * gridDim.x + blockIdx.x;
        eb = (int)(flat % gridDim.y);
        tb = (int)(flat / gridDim.y);
    }
    const int e0 = eb * EE, t0 = tb * RT_TOK;
    const int nt = min(RT_TOK, T - t0), ne = min(EE, E - e0);
    float acc[EE][RT_TOK];
#pragma unroll
    for (int j = 0; j < EE; j++)
#pragma unroll
        for (int tt = 0; tt < RT_TOK; tt++) acc[j][tt] = 0.f;
    if (vec) {
#pragma unroll UNROLL
        for (int d = (q * 32 + lane) * 4; d < D; d += RT_Q * 128)
            rt_step_vec<EE, RT_TOK>(acc, W, e0, ne, D, d, x, t0, nt);
    } else {
#pragma unroll UNROLL
        for (int d = q * 32 + lane; d < D; d += RT_Q * 32) {
            float w[EE];
#pragma unroll
            for (int j = 0; j < EE; j++) w[j] = j < ne ? __bfloat162float(W[(long)(e0 + j) * D + d]) : 0.f;
#pragma unroll
            for (int tt = 0; tt < RT_TOK; tt++)
                if (tt < nt) {
                    float v = x[(long)(t0 + tt) * D + d];
#pragma unroll
                    for (int j = 0; j < EE; j++) acc[j][tt] = fmaf(w[j], v, acc[j][tt]);
                }
        }
    }
    rt_reduce_store<EE, RT_TOK, false>(acc, part, out, E, e0, ne, t0, nt);
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

static void launch_router_logits(cuda_state *st, float *out, const float *x, const di_weight *W, int T) {
    int E = W->rows, D = W->cols;
    int vec = D % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)W->data & 7) == 0;
    const bf16 *w = (const bf16 *)W->data;
    /* tokens on x (no 65535 limit), experts on y (E <= DI_MAX_EXPERTS) */
    if (T <= 32) {
        dim3 grid(ceil_div_i(T, RT_TOK), E);
        k_router_logits<1, 4><<<grid, RT_Q * 32, 0, st->stream>>>(out, x, w, T, E, D, vec);
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
    } else {
        /* prefill: the blocks of one token group (all expert groups) adjacent in launch order, so
         * the group's x rows come from HBM once and then from L2 (x is T x D x 4 bytes: 64 MB at
         * 8192 tokens, more than L2, so with tokens varying fastest every expert group re-read it
         * from HBM). The expert-group index is derived from the flat block index; the kernel's
         * arithmetic is unchanged. */
        dim3 grid(ceil_div_i(T, RT_TOK), ceil_div_i(E, 8));
        k_router_logits<8, 1><<<grid, RT_Q * 32, 0, st->stream>>>(out, x, w, T, E, D, vec);
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

__global__ void k_route(const float *logits, const float *bias, di_route_params rp, int T, int32_t *idx_out,
                        float *w_out) {
    extern __shared__ unsigned char smem[];
    const int E = rp.n_experts, k = rp.top_k, G = rp.n_group > 0 ? rp.n_group : 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    size_t per_warp = ((size_t)E * 8 + (size_t)G * 4 + (size_t)E + (size_t)G + 15) & ~(size_t)15;
    unsigned char *base = smem + per_warp * warp;
    float *s = (float *)base, *sel = s + E, *gscore = sel + E;
    unsigned char *taken = (unsigned char *)(gscore + G), *gtaken = taken + E;
    int t = blockIdx.x * (blockDim.x >> 5) + warp;
    if (t >= T) return;
    const float *lg = logits + (long)t * E;
    const bool noaux = rp.method == DI_ROUTE_NOAUX_TC;
    if (noaux) {
        for (int e = lane; e < E; e += 32) {
            s[e] = 1.0f / (1.0f + expf(-lg[e]));
            sel[e] = s[e] + (bias ? bias[e] : 0.0f);
        }
    } else {
        float mx = -FLT_MAX;
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lg[e]);
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        double sum = 0.0;
        for (int e = lane; e < E; e += 32) sum += (s[e] = expf(lg[e] - mx));
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        for (int e = lane; e < E; e += 32) sel[e] = s[e] = (float)((double)s[e] / sum);
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
        for (int n = 0; n < rp.topk_group; n++) {
            int best = warp_argmax(gscore, gtaken, G);
            if (lane == 0 && best >= 0) gtaken[best] = 1;
            __syncwarp();
        }
        float fill = noaux ? -INFINITY : 0.0f;
        for (int e = lane; e < E; e += 32)
            if (!gtaken[e / gs]) sel[e] = fill;
        __syncwarp();
    }
    for (int n = 0; n < k; n++) {
        int best = warp_argmax(sel, taken, E);
        if (lane == 0 && best >= 0) taken[best] = 1;
        __syncwarp();
    }
    /* emit in ascending expert order */
    int32_t *io = idx_out + (long)t * k;
    float *wo = w_out + (long)t * k;
    int n = 0;
    for (int b0 = 0; b0 < E && n < k; b0 += 32) {
        int e = b0 + lane;
        bool f = e < E && taken[e];
        unsigned m = __ballot_sync(0xffffffffu, f);
        if (f) {
            int r = n + __popc(m & ((1u << lane) - 1u));
            if (r < k) {
                io[r] = e;
                wo[r] = noaux ? s[e] : sel[e];
            }
        }
        n += __popc(m);
    }
    __syncwarp();
    if (lane == 0) {
        double sum = 0.0;
        for (int i = 0; i < k; i++) sum += wo[i];
        float denom = (float)sum + 1e-20f;
        for (int i = 0; i < k; i++) {
            float w = wo[i];
            if (rp.norm_topk_prob) w /= denom;
            wo[i] = w * rp.routed_scaling_factor;
        }
    }
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
    int warps = E > 512 ? 2 : 4;
    size_t per_warp = ((size_t)E * 8 + (size_t)G * 4 + (size_t)E + (size_t)G + 15) & ~(size_t)15;
    k_route<<<ceil_div_i(T, warps), warps * 32, per_warp * warps, st->stream>>>(
        scratch, bias ? (const float *)bias->data : NULL, *rp, T, topk_idx, topk_w);
    CUDA_LAUNCHED(st, "moe_route");
}

/* ---------------------------------------------------------------- experts ---- */

typedef struct moe_scratch {
    int32_t *offsets, *tile_off, *active, *perm, *slot_of;
    bf16 *A, *Y;
    /* batched path: every expert owns `cap` padded rows (cap <= MOE_LT_MAX_CAP); Hp and Yp have
     * cap more rows after the E experts' (the pointer-array path's unused slots write there) */
    const void **ptrs;       /* [6][E]: pointer arrays of the two pointer-array GEMMs */
    bf16 *Xp, *Hp, *Ap, *Yp; /* [E * cap (+ cap)] x [D], [2I], [I], [D] */
} moe_scratch;

enum { MOE_LT_MIN_T = 16, MOE_LT_PTR_MIN_T = 8, MOE_LT_MAX_CAP = 128 };

static size_t carve(moe_scratch *ms, void *base, int Tk, int D, int I, int E, int cap) {
    char *p = (char *)base;
    size_t off = 0;
#define TAKE(field, type, count)                                                                                       \
    do {                                                                                                               \
        if (ms) ms->field = (type *)(p + off);                                                                         \
        off += align256((size_t)(count) * sizeof(type));                                                               \
    } while (0)
    TAKE(offsets, int32_t, E + 1);
    TAKE(tile_off, int32_t, E + 1);
    TAKE(active, int32_t, E + 1);
    TAKE(perm, int32_t, Tk);
    TAKE(slot_of, int32_t, Tk);
    TAKE(A, bf16, (size_t)Tk * I);
    TAKE(Y, bf16, (size_t)Tk * D);
    size_t ec = (size_t)E * cap;
    TAKE(ptrs, const void *, (size_t)6 * E);
    TAKE(Xp, bf16, ec * D);
    TAKE(Hp, bf16, (ec + cap) * 2 * I);
    TAKE(Ap, bf16, ec * I);
    TAKE(Yp, bf16, (ec + cap) * D);
#undef TAKE
    return off;
}

static int lt_cap(int max_tokens) { return max_tokens < MOE_LT_MAX_CAP ? max_tokens : MOE_LT_MAX_CAP; }

size_t cuda_moe_scratch_bytes(di_backend *be, int max_tokens, int k, int D, int I, int E) {
    (void)be;
    return carve(NULL, NULL, max_tokens * k, D, I, E, lt_cap(max_tokens));
}

/* The pointer arrays of the padded path's two cuBLASLt GEMMs (gate+up: W1, Xp -> Hp; down: W2,
 * Ap -> Yp), arr[m * nb + i] for matrix m of slot i < nb. The n active experts (active[], in
 * expert order) take n of the nb slots (their weights and their padded rows at e * cap); each
 * spare slot points at the weights and inputs of the active expert just before it (read at
 * about the same time: L2 hits) and writes the spare cap rows after the E experts' in Hp / Yp,
 * which nobody reads. spread: active j sits in slot floor(j * nb / n), so the spare slots are
 * spread among the active ones (their L2 reads overlap the HBM-bound ones); else active j in
 * slot j and the spare slots after the last (all re-reading its weights at the end). */
typedef struct moe_ptr_args {
    const void **arr; /* NULL: no pointer arrays (strided or grouped path) */
    const bf16 *w1, *w2;
    bf16 *xp, *hp, *ap, *yp;
    int nb, cap, D, I, spread;
} moe_ptr_args;

/* One block: counts per expert, offsets, tile table (tiles of bm rows), the list of experts
 * with tokens (active[0..n), n in active[E]), permutation (perm: position -> token, unless NULL;
 * slot_of: pair -> position); cap > 0: positions are padded rows (expert e owns e*cap..);
 * pa.arr: also the pointer arrays (moe_ptr_args). */
__global__ void __launch_bounds__(1024) k_moe_permute(const int32_t *idx, int Tk, int k, int E, int bm,
                                                      int32_t *offsets, int32_t *tile_off, int32_t *active,
                                                      int32_t *perm, int32_t *slot_of, int cap, moe_ptr_args pa) {
    __shared__ int cnt[DI_MAX_EXPERTS], cur[DI_MAX_EXPERTS];
    int tid = threadIdx.x;
    for (int e = tid; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = tid; i < Tk; i += blockDim.x) {
        int e = idx[i];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (tid < 32) { /* warp 0: exclusive scans of counts and tile counts, active list */
        int run = 0, trun = 0, arun = 0;
        for (int b = 0; b < E; b += 32) {
            int e = b + tid;
            int c = e < E ? cnt[e] : 0, tc = (c + bm - 1) / bm;
            unsigned has = __ballot_sync(0xffffffffu, c > 0);
            if (c > 0) active[arun + __popc(has & ((1u << tid) - 1u))] = e;
            arun += __popc(has);
            int inc = c, tinc = tc;
            for (int o = 1; o < 32; o <<= 1) {
                int u = __shfl_up_sync(0xffffffffu, inc, o), tu = __shfl_up_sync(0xffffffffu, tinc, o);
                if (tid >= o) {
                    inc += u;
                    tinc += tu;
                }
            }
            if (e < E) {
                offsets[e] = run + inc - c;
                cur[e] = run + inc - c;
                tile_off[e] = trun + tinc - tc;
            }
            run += __shfl_sync(0xffffffffu, inc, 31);
            trun += __shfl_sync(0xffffffffu, tinc, 31);
        }
        if (tid == 0) {
            offsets[E] = run;
            tile_off[E] = trun;
            active[E] = arun;
        }
    }
    __syncthreads(); /* also makes warp 0's global writes (active) visible to the block */
    if (pa.arr && tid < pa.nb) {
        int n = active[E], i = tid, nb = pa.nb, j = -1;
        bool spare = true;
        if (n > 0 && pa.spread) { /* the last active j with floor(j * nb / n) <= i (n <= nb) */
            j = (int)(((long)(i + 1) * n + nb - 1) / nb) - 1;
            spare = (int)((long)j * nb / n) != i;
        } else if (n > 0) {
            j = i < n ? i : n - 1;
            spare = i >= n;
        }
        int e = j >= 0 ? active[j] : 0;
        long cap = pa.cap, D = pa.D, I = pa.I;
        const void **a = pa.arr;
        a[i] = pa.w1 + (long)e * 2 * I * D;
        a[nb + i] = pa.xp + (long)e * cap * D;
        a[2 * nb + i] = pa.hp + (spare ? (long)E : (long)e) * cap * 2 * I;
        a[3 * nb + i] = pa.w2 + (long)e * D * I;
        a[4 * nb + i] = pa.ap + (long)e * cap * I;
        a[5 * nb + i] = pa.yp + (spare ? (long)E : (long)e) * cap * D;
    }
    for (int i = tid; i < Tk; i += blockDim.x) {
        int e = idx[i];
        if (e < 0 || e >= E) continue;
        int pos = atomicAdd(&cur[e], 1);
        if (cap > 0) pos = e * cap + (pos - offsets[e]); /* padded: expert e owns rows e*cap.. */
        if (perm) perm[pos] = i / k;
        slot_of[i] = pos;
    }
}

/* Padded path, one block per (token, expert) pair i: Xp[slot_of[i]] = x[i / k] (D % 8 == 0).
 * Padded rows without a token are never written (nor read back). */
__global__ void k_moe_gather(bf16 *Xp, const bf16 *x, const int32_t *slot_of, int k, int D) {
    int i = blockIdx.x;
    const uint4 *s = (const uint4 *)(x + (long)(i / k) * D);
    uint4 *d = (uint4 *)(Xp + (long)slot_of[i] * D);
    for (int c = threadIdx.x; c < D / 8; c += blockDim.x) d[c] = s[c];
}

/* Padded path, one block per pair i: Ap[r] = silu(Hp[r, :I]) * Hp[r, I:] for r = slot_of[i]
 * (I % 8 == 0), the arithmetic of cuda_ops.cu's k_silu_mul (same bits); only rows with a token. */
__global__ void k_moe_silu_rows(bf16 *Ap, const bf16 *Hp, const int32_t *slot_of, int I) {
    long r = slot_of[blockIdx.x];
    int I8 = I / 8;
    const uint4 *row = (const uint4 *)(Hp + r * 2 * I);
    uint4 *o = (uint4 *)(Ap + r * I);
    for (int c = threadIdx.x; c < I8; c += blockDim.x) o[c] = silu_mul_bf16x8(row[c], row[I8 + c]);
}

/* out[t, :] = sum_j w[t, j] * Y[slot_of[t*k + j], :] in j order (fp32). */
__global__ void k_moe_combine(bf16 *out, const bf16 *Y, const int32_t *slot_of, const float *w, int k, int D) {
    int t = blockIdx.x;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; j++) {
            long row = slot_of[(long)t * k + j];
            acc += w[(long)t * k + j] * __bfloat162float(Y[row * D + d]);
        }
        out[(long)t * D + d] = __float2bfloat16_rn(acc);
    }
}

/* The same with 8 columns per thread (D % 8 == 0): the k rows' 16-byte loads are all issued
 * before the sums, which run in j order as above (same bits). */
enum { COMBINE_MAXK = 16 };
__global__ void k_moe_combine_v8(bf16 *out, const bf16 *Y, const int32_t *slot_of, const float *w, int k, int D) {
    int t = blockIdx.x, D8 = D / 8;
    for (int c = threadIdx.x; c < D8; c += blockDim.x) {
        uint4 r[COMBINE_MAXK];
#pragma unroll
        for (int j = 0; j < COMBINE_MAXK; j++)
            if (j < k) r[j] = ((const uint4 *)(Y + (long)slot_of[(long)t * k + j] * D))[c];
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = 0.f;
#pragma unroll
        for (int j = 0; j < COMBINE_MAXK; j++)
            if (j < k) {
                float wj = w[(long)t * k + j];
                const bf16 *b = (const bf16 *)&r[j];
#pragma unroll
                for (int i = 0; i < 8; i++) acc[i] += wj * __bfloat162float(b[i]);
            }
        uint4 o;
        bf16 *ob = (bf16 *)&o;
#pragma unroll
        for (int i = 0; i < 8; i++) ob[i] = __float2bfloat16_rn(acc[i]);
        ((uint4 *)(out + (long)t * D))[c] = o;
    }
}

static void launch_combine(cuda_state *st, bf16 *out, const bf16 *Y, const int32_t *slot_of, const float *w, int k,
                           int D, int T) {
    if (D % 8 == 0 && k <= COMBINE_MAXK && ((uintptr_t)out & 15) == 0 && ((uintptr_t)Y & 15) == 0)
        k_moe_combine_v8<<<T, D / 8 < 256 ? (D / 8 + 31) / 32 * 32 : 256, 0, st->stream>>>(out, Y, slot_of, w, k, D);
    else
        k_moe_combine<<<T, 256, 0, st->stream>>>(out, Y, slot_of, w, k, D);
    CUDA_LAUNCHED(st, "moe_combine");
}

/* Decode-sized steps (st->moe_lt >= 1, MOE_LT_MIN_T (moe_lt 3: MOE_LT_PTR_MIN_T) .. 128
 * tokens, bf16, 8-aligned dims): both expert GEMMs on cuBLASLt with cap = T padded rows per
 * expert (a token picks an expert at most once, so none overflows): permute (padded), gather,
 * gate+up GEMM, SiLU-mul of the rows with a token, down GEMM, combine. moe_lt >= 2: batches of
 * nb = min(E, T*k) slots through pointer arrays written by k_moe_permute, so only the experts
 * with tokens stream their weights from HBM (the spare slots re-read an active expert's from
 * L2; moe_ptr_args); if cuBLASLt has no pointer-array algorithm (or moe_lt 1), strided batches over all E
 * experts. 0: not taken (the grouped kernels run). */
static int moe_padded(cuda_state *st, void *out, const void *x, const int32_t *topk_idx,
                      const float *topk_w, int k, const di_weight *gate_up, const di_weight *down, int T,
                      moe_scratch *ms, int bm) {
    int E = gate_up->n, D = gate_up->cols, I = down->cols, Tk = T * k, mode = st->moe_lt;
    int min_t = mode == 3 ? MOE_LT_PTR_MIN_T : MOE_LT_MIN_T; /* 4: as 2, spare slots at the end */
    if (mode < 1 || T < min_t || T > MOE_LT_MAX_CAP || gate_up->dtype != DI_DTYPE_BF16 ||
        down->dtype != DI_DTYPE_BF16 || D % 8 != 0 || I % 8 != 0)
        return 0;
    int cap = T, nb = E < Tk ? E : Tk;
    lt_shape g1 = {2 * I, D, cap, D, 2 * I, 0, 0, 0, E, (long)2 * I * D, (long)cap * D, (long)cap * 2 * I, 0};
    lt_shape g2 = {D, I, cap, I, D, 0, 0, 0, E, (long)D * I, (long)cap * I, (long)cap * D, 0};
    moe_ptr_args pa = {};
    /* pointer arrays: plan_align (cuda_blaslt.cu) takes the weight bases as 256-byte aligned */
    if (mode >= 2 && ((uintptr_t)gate_up->data & 255) == 0 && ((uintptr_t)down->data & 255) == 0) {
        g1.batch = g2.batch = nb;
        g1.ptr_array = g2.ptr_array = 1;
        if (lt_ready(st, &g1, ms->Xp, ms->Hp) && lt_ready(st, &g2, ms->Ap, ms->Yp))
            pa = moe_ptr_args{ms->ptrs, (const bf16 *)gate_up->data, (const bf16 *)down->data,
                              ms->Xp, ms->Hp, ms->Ap, ms->Yp, nb, cap, D, I, mode != 4};
    }
    if (!pa.arr) { /* strided over all experts */
        if (T < MOE_LT_MIN_T) return 0;
        g1.batch = g2.batch = E;
        g1.ptr_array = g2.ptr_array = 0;
        if (!lt_ready(st, &g1, ms->Xp, ms->Hp) || !lt_ready(st, &g2, ms->Ap, ms->Yp)) return 0;
    }
    k_moe_permute<<<1, 1024, 0, st->stream>>>(topk_idx, Tk, k, E, bm, ms->offsets, ms->tile_off, ms->active, NULL,
                                              ms->slot_of, cap, pa);
    CUDA_LAUNCHED(st, "moe_permute");
    k_moe_gather<<<Tk, 128, 0, st->stream>>>(ms->Xp, (const bf16 *)x, ms->slot_of, k, D);
    CUDA_LAUNCHED(st, "moe_gather");
    if (pa.arr) {
        const void **a = ms->ptrs;
        lt_run_ptr(st, &g1, ms->Xp, ms->Hp, a, a + nb, (void *)(a + 2 * nb));
    } else {
        lt_run(st, &g1, gate_up->data, ms->Xp, ms->Hp);
    }
    k_moe_silu_rows<<<Tk, I / 8 < 128 ? (I / 8 + 31) / 32 * 32 : 128, 0, st->stream>>>(ms->Ap, ms->Hp, ms->slot_of,
                                                                                       I);
    CUDA_LAUNCHED(st, "moe_silu_rows");
    if (pa.arr) {
        const void **a = ms->ptrs;
        lt_run_ptr(st, &g2, ms->Ap, ms->Yp, a + 3 * nb, a + 4 * nb, (void *)(a + 5 * nb));
    } else {
        lt_run(st, &g2, down->data, ms->Ap, ms->Yp);
    }
    launch_combine(st, (bf16 *)out, ms->Yp, ms->slot_of, topk_w, k, D, T);
    return 1;
}

void cuda_moe_experts(di_backend *be, void *out, const void *x, const int32_t *topk_idx, const float *topk_w, int k,
                      const di_weight *gate_up, const di_weight *down, int T, void *scratch, size_t scratch_bytes) {
    cuda_state *st = cst(be);
    int E = gate_up->n, D = gate_up->cols, I = down->cols;
    DI_ASSERT(gate_up->rows == 2 * I && down->n == E && down->rows == D && E <= DI_MAX_EXPERTS);
    DI_ASSERT(scratch_bytes >= cuda_moe_scratch_bytes(be, T, k, D, I, E));
    if (T <= 0) return;
    /* up to st->moe_small (<= 4) tokens: no permutation, each selected expert read once
     * (cuda_moe_small.cu) */
    if (T <= st->moe_small && cuda_moe_small_fits(T, k, gate_up, down, NULL, NULL, scratch_bytes)) {
        cuda_moe_small(st, out, x, topk_idx, topk_w, k, gate_up, down, NULL, NULL, T, scratch);
        return;
    }
    int Tk = T * k;
    moe_scratch ms;
    /* the caller sized the scratch for some max_tokens >= T: the padded area holds lt_cap(T)
     * rows per expert at least */
    carve(&ms, scratch, Tk, D, I, E, lt_cap(T));
    int avg = ceil_div_i(Tk, E);
    int bm = avg >= 96 ? 128 : 64;
    moe_ptr_args no_ptrs = {};
    if (moe_padded(st, out, x, topk_idx, topk_w, k, gate_up, down, T, &ms, bm)) return;
    k_moe_permute<<<1, 1024, 0, st->stream>>>(topk_idx, Tk, k, E, bm, ms.offsets, ms.tile_off, ms.active, ms.perm,
                                              ms.slot_of, 0, no_ptrs);
    CUDA_LAUNCHED(st, "moe_permute");
    gemm_rows r1 = {ms.offsets, ms.perm, ms.tile_off, bm, Tk, T, ms.active, ms.active + E};
    gemm_out o1 = {ms.A, I, 0, 0, 0, I};
    cuda_gemm(st, &o1, (const bf16 *)x, D, 0, gate_up, &r1);
    gemm_rows r2 = {ms.offsets, NULL, ms.tile_off, bm, Tk, T, ms.active, ms.active + E};
    gemm_out o2 = {ms.Y, D, 0, 0, 0, 0};
    cuda_gemm(st, &o2, ms.A, I, 0, down, &r2);
    launch_combine(st, (bf16 *)out, ms.Y, ms.slot_of, topk_w, k, D, T);
}
