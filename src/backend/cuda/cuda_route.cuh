/* cuda_route.cuh - one token's MoE routing on one warp (scores, group-limited top-k, weights),
 * the device code shared by the router's k_route (cuda_router.cu) and the experts' fused routing +
 * token permutation (k_moe_route_permute, cuda_moe.cu), so both give the same ids and weight bits.
 *
 * Owner: cuda. Semantics: backend.h moe_route / cpu_moe.c (HF transformers 5.17): ties pick the
 * lower expert index; outputs sorted by expert index; weights renormalised with a double sum
 * plus 1e-20 when norm_topk_prob. */
#ifndef DI_CUDA_ROUTE_CUH
#define DI_CUDA_ROUTE_CUH
#include <float.h>

#include "backend/cuda/cuda_internal.h"

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

/* Routes token t on the calling warp (all 32 lanes): its E logits at logits[t * E..], the
 * optional correction bias, rp's scoring and top-k; writes idx_out[t * k..] (ascending expert
 * ids) and w_out[t * k..]. base: the warp's route_smem_per_warp(E, G, k) bytes of shared
 * memory. redux: the picks through warp_topk_redux (warp_argmax when a value is NaN); NJ: its
 * slots per lane, E <= 32 NJ. */
template <int NJ>
static __device__ __forceinline__ void route_token(const float *logits, const float *bias, const di_route_params &rp,
                                                   int t, int32_t *idx_out, float *w_out, int redux,
                                                   unsigned char *base) {
    const int E = rp.n_experts, k = rp.top_k, G = rp.n_group > 0 ? rp.n_group : 1;
    const int lane = threadIdx.x & 31;
    float *s = (float *)base, *sel = s + E, *gscore = sel + E, *wsel = gscore + G;
    unsigned char *taken = (unsigned char *)(wsel + k), *gtaken = taken + E;
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

#endif
