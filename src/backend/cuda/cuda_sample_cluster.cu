/* cuda_sample_cluster.cu - the device sampler with one thread-block cluster per row: the same
 * results as the CPU sampler (and the one-block kernel of cuda_sample.cu) bit for bit, in a few
 * tens of microseconds per row instead of hundreds (docs/cuda.md, "sample").
 *
 * Owner: cuda. A cluster of NB blocks shares one row of V logits (NB = 8; 4 when the batch
 * has more rows than 8-block clusters fit on the GPU at once and 4 blocks hold a row): block
 * r keeps the slice [r * S, (r + 1) * S) of y = x / T in shared memory (S = CS_THREADS * E),
 * and thread t owns the E contiguous ids [t * E, t * E + E) of its block's slice, so ids
 * ascend with (block, thread, element), the order of the final draw; element j of thread t is
 * stored at ys[j * CS_THREADS + t], so a warp's accesses hit 32 banks. Cluster-wide
 * quantities are integer sums or a max, exchanged through distributed shared memory: each
 * block publishes into x[p], cluster barrier, then every block reads all NB copies and
 * computes the same answer. p alternates, so a buffer is rewritten only after a later
 * barrier, when every block has finished reading it.
 *
 * The top-k key (k-th largest in (y desc, id asc) order) and the top-p cut (the smallest key
 * whose exclusive weight in that order is below Lc) are both "the smallest candidate key whose
 * exclusive sum of v over larger candidate keys is below L" (v = 1 or q), found in two steps:
 *   1. coarse: one pass builds a histogram of counts and weights over CS_COARSE bins of
 *      d = m - y (width 23 / 510; d >= 23, where q = 0, in the last bin). Bins are monotone in
 *      the key, so the bin holding the answer and the exact sum above it follow from the
 *      histogram alone (top-k and top-p share the pass);
 *   2. exact: that bin's candidates are gathered into block 0 (at most CS_CAP; remote atomics
 *      on its counter), which runs a radix descent on their 64-bit keys (8 bits per level)
 *      with block barriers only (up to CS_RANK_MAX candidates: each thread sums the weights of
 *      the keys above its own, one pass), and publishes the key. A bin with more candidates (flat rows,
 *      huge k) takes the same descent spread over the cluster, one cluster barrier per level.
 * Counts and weights are exact integers, so no order of accumulation changes the result. */
#include <cooperative_groups.h>

#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_sample.cuh"

namespace cg = cooperative_groups;

enum {
    CS_BLOCKS = 8, /* the most blocks per cluster (NB is 4 or 8) */
    CS_THREADS = 1024,
    CS_WARPS = CS_THREADS / 32,
    CS_COARSE = 512, /* coarse bins of d; the last one holds d >= 23 */
    CS_DIGITS = 256, /* radix of the exact descent */
    CS_CAP = 4096,   /* candidates block 0 takes for the exact descent */
    CS_RANK_MAX = 256 /* up to this many: ranked directly instead of the radix descent */
};

/* what a block publishes to its cluster in one exchange */
typedef struct cs_pub {
    unsigned int hc[CS_COARSE]; /* candidates per bin */
    unsigned int hh[CS_COARSE]; /* their weight per bin: sum of q >> 16 */
    unsigned int hl[CS_COARSE]; /* and sum of q & 0xffff (32-bit shared atomics, which are
                                 * native; a block's sums stay below 2^32 for E <= 32) */
    unsigned long long u;             /* a u64 partial: a sum, or a found key */
    float v;                          /* a max and its id, with the NaN / +inf flag */
    int i;
    int bad;
} cs_pub;

typedef struct cs_smem {
    cs_pub x[2];
    unsigned int rc[CS_COARSE]; /* the cluster's coarse histogram (every block's own copy) */
    unsigned long long rq[CS_COARSE];
    unsigned int lc[CS_DIGITS]; /* block 0's histogram of one exact level (weights as in cs_pub) */
    unsigned int lh[CS_DIGITS], ll[CS_DIGITS];
    unsigned long long wsum[CS_WARPS]; /* per-warp partials of the block helpers */
    unsigned long long wpre[CS_WARPS]; /* their exclusive prefix (cs_block_excl) */
    float wv[CS_WARPS];
    int wi[CS_WARPS];
    unsigned long long ru; /* a block helper's result */
    float rv;              /* cs_block_argmax's result; then the row's max and its id, */
    int ri;
    int rbad;              /* and whether the row holds a NaN / +inf */
    int pick;
    unsigned int pick_cnt;
    unsigned long long pick_above;
    unsigned long long bc[2];  /* block broadcast */
    unsigned int lcount;       /* block 0: candidates gathered */
    unsigned long long dkey;   /* block 0: the key it found, */
    unsigned long long dsum;   /* and the weight of the candidates at or above it */
} cs_smem;

/* ---------------------------------------------------------------- block helpers ---- */

/* a weight into a (q >> 16, q & 0xffff) pair of 32-bit bins, and the pair's sum */
static __device__ __forceinline__ void cs_add_q(unsigned int *hh, unsigned int *hl, unsigned long long q) {
    if (!q) return;
    atomicAdd(hh, (unsigned int)(q >> 16));
    atomicAdd(hl, (unsigned int)(q & 0xffffu));
}
static __device__ __forceinline__ unsigned long long cs_q(unsigned int hh, unsigned int hl) {
    return ((unsigned long long)hh << 16) + hl;
}

static __device__ __forceinline__ bool cs_better(float ov, int oi, float v, int i) {
    return oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i));
}

/* Block-wide reductions: each warp reduces with shuffles, warp 0 combines the CS_WARPS partials
 * the same way, every thread reads the result (two block barriers; the partials and the result
 * live in separate slots, so a helper may follow another at once). */

static __device__ __forceinline__ void cs_warp_argmax(float *v, int *i) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, *v, o);
        int oi = __shfl_xor_sync(0xffffffffu, *i, o);
        if (cs_better(ov, oi, *v, *i)) {
            *v = ov;
            *i = oi;
        }
    }
}

/* argmax (lowest id among the maxima; bi < 0: none) */
static __device__ void cs_block_argmax(float *bv, int *bi, cs_smem *S) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    cs_warp_argmax(bv, bi);
    if (lane == 0) {
        S->wv[w] = *bv;
        S->wi[w] = *bi;
    }
    __syncthreads();
    if (w == 0) {
        float v = S->wv[lane];
        int i = S->wi[lane];
        cs_warp_argmax(&v, &i);
        if (lane == 0) {
            S->rv = v;
            S->ri = i;
        }
    }
    __syncthreads();
    *bv = S->rv;
    *bi = S->ri;
}

static __device__ unsigned long long cs_block_sum(unsigned long long v, cs_smem *S) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) S->wsum[w] = v;
    __syncthreads();
    if (w == 0) {
        unsigned long long t = S->wsum[lane];
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0) S->ru = t;
    }
    __syncthreads();
    return S->ru;
}

static __device__ unsigned long long cs_block_max(unsigned long long v, cs_smem *S) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    if (lane == 0) S->wsum[w] = v;
    __syncthreads();
    if (w == 0) {
        unsigned long long t = S->wsum[lane];
        for (int o = 16; o > 0; o >>= 1) {
            unsigned long long u = __shfl_xor_sync(0xffffffffu, t, o);
            t = u > t ? u : t;
        }
        if (lane == 0) S->ru = t;
    }
    __syncthreads();
    return S->ru;
}

/* The draw weight of logit y at id in a kept set: 0 unless its key reaches the cut kp and, with
 * min-p, its probability reaches min_p. The sum pass and the draw pass both use it. */
static __device__ __forceinline__ unsigned long long cs_kept_weight(float y, int id, uint64_t kp, float m,
                                                                   float min_p) {
    float pr;
    if (key_of(y, id) < kp) return 0;
    unsigned long long q = weight_of(y, m, &pr);
    if (min_p > 0.0f && !(pr >= min_p)) q = 0;
    return q;
}

/* exclusive scan over the block in thread order */
static __device__ unsigned long long cs_block_excl(unsigned long long v, cs_smem *S) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    unsigned long long x = v;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned long long u = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += u;
    }
    if (lane == 31) S->wsum[w] = x;
    __syncthreads();
    if (w == 0) {
        unsigned long long t = S->wsum[lane], y = t;
        for (int o = 1; o < 32; o <<= 1) {
            unsigned long long u = __shfl_up_sync(0xffffffffu, y, o);
            if (lane >= o) y += u;
        }
        S->wpre[lane] = y - t;
    }
    __syncthreads();
    return S->wpre[w] + x - v;
}

/* Over nb bins (thread t = bin t, bin 0 = the largest keys) with counts c and sums v: the
 * highest bin with c > 0 whose exclusive sum above + sum_{b' < b} v stays below L. Sets
 * S->pick (-1: none), S->pick_above and S->pick_cnt; every thread sees them on return. */
static __device__ void cs_pick(unsigned int c, unsigned long long v, int nb, unsigned long long above,
                               unsigned long long L, cs_smem *S) {
    const int tid = threadIdx.x;
    if (tid == 0) S->pick = -1;
    unsigned long long ex = above + cs_block_excl(tid < nb ? v : 0, S); /* its barriers publish pick = -1 */
    if (tid < nb && c > 0 && ex < L) atomicMax(&S->pick, tid);
    __syncthreads();
    if (tid == S->pick) {
        S->pick_above = ex;
        S->pick_cnt = c;
    }
    __syncthreads();
}

/* ---------------------------------------------------------------- cluster helpers ---- */

/* Sum of v over the cluster; *pre gets the sum over the blocks of lower rank. */
static __device__ unsigned long long cs_cluster_sum(unsigned long long v, unsigned long long *pre, cs_smem *S,
                                                    int *xp, cg::cluster_group &cl) {
    unsigned long long b = cs_block_sum(v, S);
    if (threadIdx.x == 0) S->x[*xp].u = b;
    cl.sync();
    if (threadIdx.x < 32) { /* lane r reads block r's partial */
        const int lane = threadIdx.x, me = (int)cl.block_rank();
        unsigned long long u = lane < (int)cl.num_blocks() ? cl.map_shared_rank(&S->x[*xp], lane)->u : 0;
        unsigned long long t = u, p = lane < me ? u : 0;
        for (int o = 16; o > 0; o >>= 1) {
            t += __shfl_xor_sync(0xffffffffu, t, o);
            p += __shfl_xor_sync(0xffffffffu, p, o);
        }
        if (lane == 0) {
            S->bc[0] = t;
            S->bc[1] = p;
        }
    }
    __syncthreads();
    *xp ^= 1;
    if (pre) *pre = S->bc[1];
    unsigned long long t = S->bc[0];
    __syncthreads();
    return t;
}

/* the key published by one thread of the cluster (0 from every other) */
static __device__ uint64_t cs_cluster_found(uint64_t mine, bool have, cs_smem *S, int *xp, cg::cluster_group &cl) {
    if (threadIdx.x == 0) S->x[*xp].u = 0;
    __syncthreads();
    if (have) S->x[*xp].u = mine;
    cl.sync();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        unsigned long long u = lane < (int)cl.num_blocks() ? cl.map_shared_rank(&S->x[*xp], lane)->u : 0;
        for (int o = 16; o > 0; o >>= 1) {
            unsigned long long w = __shfl_xor_sync(0xffffffffu, u, o);
            u = w > u ? w : u;
        }
        if (lane == 0) S->bc[0] = u;
    }
    __syncthreads();
    *xp ^= 1;
    uint64_t k = S->bc[0];
    __syncthreads();
    return k;
}

/* the first nb bins of a histogram this block is about to publish, zeroed (then a block barrier) */
static __device__ cs_pub *cs_pub_clear(cs_pub *X, int nb) {
    for (int b = threadIdx.x; b < nb; b += CS_THREADS) {
        X->hc[b] = 0;
        X->hh[b] = 0;
        X->hl[b] = 0;
    }
    __syncthreads();
    return X;
}

/* coarse bin of d = m - y >= 0: non-decreasing in d, so bin order is key order (bin 0 on top) */
static __device__ __forceinline__ int cs_coarse(float d) {
    if (!(d < 23.0f)) return CS_COARSE - 1;
    int b = (int)__fmul_rn(d, (float)(CS_COARSE - 2) / 23.0f);
    return b < CS_COARSE - 2 ? b : CS_COARSE - 2;
}

/* The row's coarse histogram (count and weight per bin of every valid id) into S->rc / S->rq of
 * every block. */
static __device__ void cs_coarse_hist(const float *ys, int E, int gid0, int V, float m, cs_smem *S, int *xp,
                                      cg::cluster_group &cl) {
    const int tid = threadIdx.x, lane = tid & 31;
    cs_pub *X = cs_pub_clear(&S->x[*xp], CS_COARSE);
    unsigned far = 0; /* this thread's ids in the last bin (d >= 23, zero weight: most of a peaked row) */
    for (int j = 0; j < E; j++) {
        int id = gid0 + tid * E + j;
        if (id >= V) break;
        float y = ys[j * CS_THREADS + tid];
        int b = cs_coarse(__fsub_rn(m, y));
        if (b == CS_COARSE - 1) {
            far++;
            continue;
        }
        float pr;
        atomicAdd(&X->hc[b], 1u);
        cs_add_q(&X->hh[b], &X->hl[b], weight_of(y, m, &pr));
    }
    far = __reduce_add_sync(0xffffffffu, far); /* one atomic per warp */
    if (lane == 0 && far) atomicAdd(&X->hc[CS_COARSE - 1], far);
    cl.sync();
    /* thread t sums bin t % CS_COARSE over half of the blocks; the halves meet in S->rc / rq */
    const int b = tid % CS_COARSE, h = tid / CS_COARSE, half = (int)cl.num_blocks() / 2;
    unsigned int c = 0;
    unsigned long long q = 0;
    if (h < 2) {
#pragma unroll
        for (int r = 0; r < CS_BLOCKS / 2; r++) {
            if (r >= half) break;
            const cs_pub *rx = cl.map_shared_rank(X, h * half + r);
            c += rx->hc[b];
            q += cs_q(rx->hh[b], rx->hl[b]);
        }
    }
    if (h == 0) {
        S->rc[b] = c;
        S->rq[b] = q;
    }
    __syncthreads();
    if (h == 1) {
        S->rc[b] += c;
        S->rq[b] += q;
    }
    __syncthreads();
    *xp ^= 1;
}

/* ---------------------------------------------------------------- exact descent ---- */

/* Block 0 alone: the answer among the n gathered candidates (keys lk, weights lw), starting
 * from the exclusive sum `above`. Writes S->dkey, and S->dsum = the weight of the candidates
 * with a key >= it. */
template <bool WEIGHTED>
static __device__ void cs_exact_local(const unsigned long long *lk, const unsigned long long *lw, unsigned int n,
                                      unsigned long long above, unsigned long long L, cs_smem *S) {
    const int tid = threadIdx.x;
    uint64_t prefix = 0, mask = 0;
    unsigned int cnt = n;
    if (n <= CS_RANK_MAX) {
        /* few candidates: each thread ranks its own against all (broadcast reads) and the answer is
         * the smallest key whose exclusive sum stays below L: the radix descent's answer, without
         * its levels of block barriers */
        unsigned long long take = 0; /* ~key of a valid candidate (0: none) */
        if ((unsigned)tid < n) {
            const unsigned long long k = lk[tid];
            unsigned long long ex = above;
            for (unsigned int j = 0; j < n; j++)
                if (lk[j] > k) ex += WEIGHTED ? lw[j] : 1ull;
            if (ex < L) take = ~k;
        }
        take = cs_block_max(take, S);
        const unsigned long long key = take ? ~take : 0;
        unsigned long long sum = (unsigned)tid < n && lk[tid] >= key ? lw[tid] : 0;
        sum = cs_block_sum(sum, S);
        if (tid == 0) {
            S->dkey = key;
            S->dsum = sum;
            S->lcount = 0; /* ready for the next gather */
        }
        return;
    }
    for (int shift = 56; cnt > 1 && shift >= 0; shift -= 8) {
        if (tid < CS_DIGITS) {
            S->lc[tid] = 0;
            S->lh[tid] = 0;
            S->ll[tid] = 0;
        }
        __syncthreads();
        for (unsigned int i = tid; i < n; i += CS_THREADS) {
            uint64_t k = lk[i];
            if ((k & mask) != prefix) continue;
            int b = CS_DIGITS - 1 - (int)((k >> shift) & 255);
            atomicAdd(&S->lc[b], 1u);
            if (WEIGHTED) cs_add_q(&S->lh[b], &S->ll[b], lw[i]);
        }
        __syncthreads();
        unsigned int c = tid < CS_DIGITS ? S->lc[tid] : 0;
        cs_pick(c, WEIGHTED ? (tid < CS_DIGITS ? cs_q(S->lh[tid], S->ll[tid]) : 0) : c, CS_DIGITS, above, L, S);
        prefix |= (uint64_t)(CS_DIGITS - 1 - S->pick) << shift;
        mask |= (uint64_t)255 << shift;
        above = S->pick_above;
        cnt = S->pick_cnt;
    }
    /* one candidate matches prefix / mask (or the prefix is the whole key) */
    unsigned long long key = 0, sum = 0;
    for (unsigned int i = tid; i < n; i += CS_THREADS)
        if ((lk[i] & mask) == prefix) key = lk[i];
    key = cs_block_max(key, S);
    for (unsigned int i = tid; i < n; i += CS_THREADS)
        if (lk[i] >= key) sum += lw[i];
    sum = cs_block_sum(sum, S);
    if (tid == 0) {
        S->dkey = key;
        S->dsum = sum;
        S->lcount = 0; /* ready for the next gather */
    }
}

/* The same descent spread over the cluster, for a coarse bin with more than CS_CAP candidates:
 * one cluster exchange per level over every block's own ids. */
template <bool WEIGHTED>
static __device__ uint64_t cs_exact_cluster(const float *ys, int E, int gid0, int V, float m, uint64_t lo, int cb,
                                            unsigned long long above, unsigned int cnt, unsigned long long L,
                                            cs_smem *S, int *xp, cg::cluster_group &cl) {
    const int tid = threadIdx.x;
    uint64_t prefix = 0, mask = 0;
    for (int shift = 56; cnt > 1 && shift >= 0; shift -= 8) {
        cs_pub *X = cs_pub_clear(&S->x[*xp], CS_DIGITS);
        for (int j = 0; j < E; j++) {
            int id = gid0 + tid * E + j;
            if (id >= V) break;
            float y = ys[j * CS_THREADS + tid];
            uint64_t k = key_of(y, id);
            if (k < lo || (k & mask) != prefix || cs_coarse(__fsub_rn(m, y)) != cb) continue;
            int b = CS_DIGITS - 1 - (int)((k >> shift) & 255);
            atomicAdd(&X->hc[b], 1u);
            if (WEIGHTED) {
                float pr;
                cs_add_q(&X->hh[b], &X->hl[b], weight_of(y, m, &pr));
            }
        }
        cl.sync();
        unsigned int c = 0;
        unsigned long long q = 0;
        if (tid < CS_DIGITS) {
#pragma unroll
            for (int r = 0; r < CS_BLOCKS; r++) {
                if (r >= (int)cl.num_blocks()) break;
                const cs_pub *rx = cl.map_shared_rank(X, r);
                c += rx->hc[tid];
                q += cs_q(rx->hh[tid], rx->hl[tid]);
            }
        }
        cs_pick(c, WEIGHTED ? q : c, CS_DIGITS, above, L, S);
        *xp ^= 1;
        prefix |= (uint64_t)(CS_DIGITS - 1 - S->pick) << shift;
        mask |= (uint64_t)255 << shift;
        above = S->pick_above;
        cnt = S->pick_cnt;
    }
    uint64_t mine = 0;
    bool have = false;
    for (int j = 0; j < E; j++) {
        int id = gid0 + tid * E + j;
        if (id >= V) break;
        float y = ys[j * CS_THREADS + tid];
        uint64_t k = key_of(y, id);
        if (k >= lo && (k & mask) == prefix && cs_coarse(__fsub_rn(m, y)) == cb) {
            mine = k;
            have = true;
        }
    }
    return cs_cluster_found(mine, have, S, xp, cl);
}

/* The answer inside coarse bin cb (cnt candidates with key >= lo; `above` = the exclusive sum of
 * the bins before it). *bin_sum (optional) gets the weight of cb's candidates with a key >= the
 * answer. */
template <bool WEIGHTED>
static __device__ uint64_t cs_exact(const float *ys, unsigned long long *lk, unsigned long long *lw, int E, int gid0,
                                    int V, float m, uint64_t lo, int cb, unsigned long long above, unsigned int cnt,
                                    unsigned long long L, unsigned long long *bin_sum, cs_smem *S, int *xp,
                                    cg::cluster_group &cl) {
    const int tid = threadIdx.x, lane = tid & 31;
    if (cnt > CS_CAP) {
        uint64_t key = cs_exact_cluster<WEIGHTED>(ys, E, gid0, V, m, lo, cb, above, cnt, L, S, xp, cl);
        if (bin_sum) {
            unsigned long long s = 0;
            for (int j = 0; j < E; j++) {
                int id = gid0 + tid * E + j;
                if (id >= V) break;
                float y = ys[j * CS_THREADS + tid], pr;
                if (key_of(y, id) >= key && cs_coarse(__fsub_rn(m, y)) == cb) s += weight_of(y, m, &pr);
            }
            *bin_sum = cs_cluster_sum(s, NULL, S, xp, cl);
        }
        return key;
    }
    /* gather cb's candidates into block 0 (warp-aggregated remote atomics on its counter) */
    unsigned int *rcount = cl.map_shared_rank(&S->lcount, 0);
    unsigned long long *rk = cl.map_shared_rank(lk, 0), *rw = cl.map_shared_rank(lw, 0);
    for (int j = 0; j < E; j++) {
        int id = gid0 + tid * E + j;
        bool ok = id < V;
        float y = ok ? ys[j * CS_THREADS + tid] : 0.0f;
        uint64_t k = ok ? key_of(y, id) : 0;
        ok = ok && k >= lo && cs_coarse(__fsub_rn(m, y)) == cb;
        unsigned bal = __ballot_sync(0xffffffffu, ok);
        if (!bal) continue;
        unsigned base = 0;
        if (lane == __ffs(bal) - 1) base = atomicAdd(rcount, (unsigned)__popc(bal));
        base = __shfl_sync(0xffffffffu, base, __ffs(bal) - 1);
        if (ok) {
            unsigned at = base + __popc(bal & ((1u << lane) - 1u));
            float pr;
            rk[at] = k;
            rw[at] = weight_of(y, m, &pr);
        }
    }
    cl.sync(); /* every candidate is in block 0 */
    if (cl.block_rank() == 0) cs_exact_local<WEIGHTED>(lk, lw, S->lcount, above, L, S);
    cl.sync(); /* block 0's answer is published */
    if (tid == 0) {
        const cs_smem *S0 = cl.map_shared_rank(S, 0);
        S->bc[0] = S0->dkey;
        S->bc[1] = S0->dsum;
    }
    __syncthreads();
    uint64_t key = S->bc[0];
    if (bin_sum) *bin_sum = S->bc[1];
    __syncthreads();
    return key;
}

/* ---------------------------------------------------------------- kernel ---- */

/* One loaded logit x of id `id`: y = x / T into its shared-memory slot, the row's NaN / +inf
 * flag and this thread's running argmax (lowest id among the maxima: ids ascend per thread) */
static __device__ __forceinline__ void cs_take(float x, float T, int id, float *slot, int *bad, float *bv, int *bi) {
    float y = T != 1.0f ? __fdiv_rn(x, T) : x;
    *slot = y;
    if (isnan(y) || y == INFINITY) *bad = 1;
    if (*bi < 0 || y > *bv) {
        *bv = y;
        *bi = id;
    }
}

__global__ void __launch_bounds__(CS_THREADS, 1)
    k_sample_cluster(const float *logits, int V, int E, const di_sample_row *rows, int32_t *tokens, int32_t *status,
                     int skip_greedy) {
    extern __shared__ __align__(16) unsigned char dyn[];
    __shared__ cs_smem S;
    cg::cluster_group cl = cg::this_cluster();
    const int tid = threadIdx.x;
    const int row = blockIdx.x / (int)cl.num_blocks(), rank = (int)cl.block_rank();
    const int slice = CS_THREADS * E, gid0 = rank * slice; /* id of this block's first element */
    unsigned long long *lk = (unsigned long long *)dyn, *lw = lk + CS_CAP; /* block 0's candidates */
    float *ys = (float *)(lw + CS_CAP);                                  /* [slice]: this block's y */
    const float *x = logits + (long)row * V;
    const di_sample_row P = rows[row]; /* the step's upload: readable before the PDL wait */
    const bool greedy = P.temperature < 1e-5f;
    pdl_wait(); /* st->sample_pdl: the logits (and the greedy kernel's rows) come from earlier kernels */
    if (greedy && skip_greedy) return; /* the whole cluster (same row): cuda_sample_greedy.cu has it */
    const float T = greedy ? 1.0f : P.temperature;
    int xp = 0;
    if (tid == 0) S.lcount = 0; /* published by the first cluster barrier */

    /* load: thread t reads its E contiguous logits (16-byte loads, several in flight), computes
     * y and its running argmax, and stores y at ys[j * CS_THREADS + t] (conflict-free) */
    int bad = 0, bi = -1;
    float bv = -INFINITY;
    const int first = gid0 + tid * E; /* this thread's first id */
    if ((V & 3) == 0 && (E & 3) == 0 && ((uintptr_t)logits & 15) == 0) {
        for (int j0 = 0; j0 < E; j0 += 16) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int j = j0 + 4 * u;
                v[u] = j < E && first + j < V ? __ldg((const float4 *)(x + first + j)) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const float e4[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int j = j0 + 4 * u + e, id = first + j;
                    if (j >= E || id >= V) continue;
                    cs_take(e4[e], T, id, &ys[j * CS_THREADS + tid], &bad, &bv, &bi);
                }
            }
        }
    } else {
        for (int j0 = 0; j0 < E; j0 += 8) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int j = j0 + u;
                v[u] = j < E && first + j < V ? __ldg(x + first + j) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int j = j0 + u, id = first + j;
                if (j >= E || id >= V) continue;
                cs_take(v[u], T, id, &ys[j * CS_THREADS + tid], &bad, &bv, &bi);
            }
        }
    }
    bad = __syncthreads_or(bad);
    cs_block_argmax(&bv, &bi, &S);
    if (tid == 0) {
        S.x[xp].v = bv;
        S.x[xp].i = bi;
        S.x[xp].bad = bad;
    }
    cl.sync();
    if (tid < 32) { /* lane r reads block r's max */
        float v = -INFINITY;
        int i = -1, b = 0;
        if (tid < (int)cl.num_blocks()) {
            const cs_pub *rx = cl.map_shared_rank(&S.x[xp], tid);
            v = rx->v;
            i = rx->i;
            b = rx->bad;
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, v, o);
            int oi = __shfl_xor_sync(0xffffffffu, i, o);
            b |= __shfl_xor_sync(0xffffffffu, b, o);
            if (cs_better(ov, oi, v, i)) {
                v = ov;
                i = oi;
            }
        }
        if (tid == 0) {
            S.rv = v;
            S.ri = i;
            S.rbad = b;
        }
    }
    __syncthreads();
    const float m = S.rv;
    const int mid = S.ri;
    bad = S.rbad;
    __syncthreads();
    xp ^= 1;
    int32_t tok = -1, stat = DI_SAMPLE_OK;
    if (bad || m == -INFINITY) {
        stat = bad ? DI_SAMPLE_ERR_NAN : DI_SAMPLE_ERR_MASKED;
    } else if (greedy) {
        tok = mid;
    } else {
        const bool use_k = P.top_k > 0 && P.top_k < V, use_p = P.top_p < 1.0f;
        if (use_k || use_p) cs_coarse_hist(ys, E, gid0, V, m, &S, &xp, cl);
        /* top-k: the key of the k-th element in (y desc, id asc) order; its coarse bin ck holds
         * the candidates with a key >= kth whose weight is ck_sum */
        uint64_t kth = 0;
        int ck = CS_COARSE;
        unsigned int ck_cnt = 0;
        unsigned long long ck_sum = 0;
        if (use_k) {
            unsigned int c = tid < CS_COARSE ? S.rc[tid] : 0;
            const unsigned long long k = (unsigned long long)P.top_k;
            cs_pick(c, c, CS_COARSE, 0, k, &S);
            ck = S.pick;
            unsigned long long above = S.pick_above;
            kth = cs_exact<false>(ys, lk, lw, E, gid0, V, m, 0, ck, above, S.pick_cnt, k, use_p ? &ck_sum : NULL, &S,
                                  &xp, cl);
            ck_cnt = (unsigned int)(k - above);
        }
        uint64_t kp = kth;
        if (use_p) {
            /* the candidates: bins before ck whole, ck's keys >= kth, nothing after ck */
            unsigned int c = 0;
            unsigned long long q = 0;
            if (tid < ck) {
                c = S.rc[tid];
                q = S.rq[tid];
            } else if (tid == ck) {
                c = ck_cnt;
                q = ck_sum;
            }
            if (tid >= CS_COARSE) c = 0, q = 0;
            const unsigned long long tot = cs_block_sum(q, &S);
            unsigned long long tp24 = (unsigned long long)__fmul_rn(P.top_p, 16777216.0f);
            /* Lc = ceil(tp24 * tot / 2^24) with a 128-bit product */
            unsigned long long lo = tp24 * tot, hi = __umul64hi(tp24, tot);
            unsigned long long Lc = ((lo >> 24) | (hi << 40)) + ((lo & 0xffffffull) ? 1 : 0);
            if (Lc == 0) {
                kp = key_of(m, mid);
            } else {
                cs_pick(c, q, CS_COARSE, 0, Lc, &S);
                kp = cs_exact<true>(ys, lk, lw, E, gid0, V, m, kth, S.pick, S.pick_above, S.pick_cnt, Lc, NULL, &S,
                                    &xp, cl);
            }
        }
        /* the kept weights of this thread's ids, then the draw in ascending id order */
        const float min_p = P.min_p;
        unsigned long long own = 0;
        for (int j = 0; j < E; j++) {
            int id = gid0 + tid * E + j;
            if (id >= V) break;
            own += cs_kept_weight(ys[j * CS_THREADS + tid], id, kp, m, min_p);
        }
        unsigned long long before_block = 0;
        unsigned long long W = cs_cluster_sum(own, &before_block, &S, &xp, cl);
        if (W == 0) {
            stat = DI_SAMPLE_ERR_ZERO;
        } else {
            uint32_t r = philox_u32(P.seed, P.position, P.stream, 0);
            unsigned long long lo = (unsigned long long)r * W, hi = __umul64hi((unsigned long long)r, W);
            unsigned long long tdraw = (lo >> 32) | (hi << 32); /* < W */
            unsigned long long carry = before_block + cs_block_excl(own, &S);
            if (own && carry <= tdraw && tdraw < carry + own) { /* the one thread holding the draw */
                for (int j = 0; j < E; j++) {
                    int id = gid0 + tid * E + j;
                    if (id >= V) break;
                    unsigned long long q = cs_kept_weight(ys[j * CS_THREADS + tid], id, kp, m, min_p);
                    if (q && carry + q > tdraw) {
                        tokens[row] = id;
                        status[row] = DI_SAMPLE_OK;
                        break;
                    }
                    carry += q;
                }
            }
            cl.sync(); /* no block leaves while another may still read its shared memory */
            return;
        }
    }
    if (rank == 0 && tid == 0) {
        tokens[row] = tok;
        status[row] = stat;
    }
    cl.sync();
}

/* Dynamic shared memory one block of an nb-block cluster needs for V (0: too much) */
static size_t cs_smem_bytes(int V, int nb, int *E) {
    int e = (V + nb * CS_THREADS - 1) / (nb * CS_THREADS);
    size_t b = (size_t)CS_THREADS * e * sizeof(float) + (size_t)CS_CAP * 16;
    *E = e;
    return e <= 32 && b + sizeof(cs_smem) <= 220 * 1024 ? b : 0; /* e <= 32: see cs_pub */
}

int cuda_sample_cluster(cuda_state *st, int32_t *tokens, int32_t *status, const float *logits, int n, int V,
                        const di_sample_row *rows, int skip_greedy) {
    /* 8 blocks per row while the rows' clusters fit on the GPU at once (one block per SM, two
     * 8-block clusters per 16-SM GPC), 4 above that when a row fits in 4 blocks (or when forced:
     * DEEPINFER_CUDA_SAMPLE_CLUSTER=4 / 8) */
    int nb = st->sample_cluster == 4 || st->sample_cluster == 8 ? st->sample_cluster : n * 8 > st->n_sm ? 4 : 8;
    int E = 0;
    size_t smem = cs_smem_bytes(V, nb, &E);
    if (!smem && nb == 4) smem = cs_smem_bytes(V, nb = 8, &E);
    if (!smem) return 0;
    static size_t attr = 0; /* host-only: the largest size set so far */
    if (smem > attr) {
        if (cuda_note(st, cudaFuncSetAttribute(k_sample_cluster, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                      "sample cluster smem attribute"))
            return 1;
        attr = smem;
    }
    cuda_launch_cluster(st, pdl_with(st, st->sample_pdl), (unsigned)nb, "sample_cluster launch", k_sample_cluster,
                        dim3((unsigned)(n * nb)), dim3(CS_THREADS), smem, logits, V, E, rows, tokens, status,
                        skip_greedy);
    CUDA_LAUNCHED(st, "sample_cluster");
    return 1;
}
