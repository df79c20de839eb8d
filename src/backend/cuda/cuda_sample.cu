/* cuda_sample.cu - token sampling on the GPU, bit-identical to the CPU sampler of
 * src/sampling (docs/engine.md "Sampler") for greedy / temperature / top-k / top-p / min-p:
 *   greedy = lowest id among the maxima                       (temperature < 1e-5)
 *   y_i = x_i / T (skipped when T == 1);  m = max y;  p_i = exp_fixed(y_i - m) (0 below -23)
 *   q_i = (uint64)(p_i * 2^32);  C = top_k by (y desc, id asc) (all if off)
 *   top_p: in (y desc, id asc) order keep i iff i == 0 or excl_i * 2^24 < floor(top_p * 2^24)
 *          * sum_C q;  min_p: keep iff p_i >= min_p;  W = sum_K q
 *   draw: r = Philox4x32-10(seed, position, stream, 0) word 0; t = (r * W) >> 32; first id in
 *          ascending order whose running sum of q exceeds t.
 *
 * Owner: cuda. cuda_sample() dispatches: the greedy rows to cuda_sample_greedy.cu (unless
 * DEEPINFER_CUDA_SAMPLE_GREEDY=0), the others to the thread-block-cluster kernel of
 * cuda_sample_cluster.cu by default; this file's kernel (one block of 1024 threads per row, tens
 * to thousands of microseconds per row with top-k / top-p; docs/PERF.md) for vocabularies too
 * large for the cluster's shared memory (V > 262,144) and DEEPINFER_CUDA_SAMPLE_CLUSTER=0.
 * The order (y desc, id asc) is the order of the unique 64-bit key (orderable bits of y) << 32
 * | (0xffffffff - id), so top-k is a radix select (8 passes of 8 bits) and the top-p cut is a
 * radix descent on the same keys weighted by q; both are exact integer computations. Every fp32 operation uses explicit round-to-nearest
 * intrinsics (no contraction) so it matches the CPU's separately rounded operations. */
#include "backend/cuda/cuda_sample.cuh"

/* ---------------------------------------------------------------- block helpers ---- */

enum { SBT = 1024, SNW = SBT / 32 };

typedef struct sample_smem {
    unsigned long long hq[256];
    unsigned int hc[256];
    unsigned long long wsum[SNW];
    float wv[SNW];
    int wi[SNW];
    int flag;
    int chosen;
    unsigned long long chosen_above;
    unsigned long long bcast;
    int answer;
} sample_smem;

static __device__ unsigned long long block_sum_u64(unsigned long long v, sample_smem *s) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s->wsum[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned long long t = 0;
    for (int i = 0; i < SNW; i++) t += s->wsum[i];
    return t;
}

/* Inclusive scan over the block; *total gets the block sum. */
static __device__ unsigned long long block_scan_u64(unsigned long long v, sample_smem *s, unsigned long long *total) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    unsigned long long x = v;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned long long u = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += u;
    }
    __syncthreads();
    if (lane == 31) s->wsum[w] = x;
    __syncthreads();
    unsigned long long before = 0, t = 0;
    for (int i = 0; i < SNW; i++) {
        if (i < w) before += s->wsum[i];
        t += s->wsum[i];
    }
    *total = t;
    return before + x;
}

/* ---------------------------------------------------------------- kernel ---- */

__global__ void __launch_bounds__(SBT) k_sample(const float *logits, int V, const di_sample_row *rows,
                                                int32_t *tokens, int32_t *status, int skip_greedy) {
    __shared__ sample_smem S;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int row = blockIdx.x;
    const float *x = logits + (long)row * V;
    const di_sample_row P = rows[row];
    const bool greedy = P.temperature < 1e-5f;
    if (greedy && skip_greedy) return; /* cuda_sample_greedy.cu has it */
    const float T = greedy ? 1.0f : P.temperature;

    /* pass 1: validity, max (lowest id among the maxima); unrolled so that several loads are
     * in flight per thread (each thread still visits its ids in ascending order) */
    int bad = 0;
    float bv = -INFINITY;
    int bi = -1;
#pragma unroll 8
    for (int i = tid; i < V; i += SBT) {
        float y = y_of(x, i, T);
        if (isnan(y) || y == INFINITY) bad = 1;
        if (bi < 0 || y > bv) {
            bv = y;
            bi = i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
            bv = ov;
            bi = oi;
        }
    }
    bad = __syncthreads_or(bad);
    if (lane == 0) {
        S.wv[w] = bv;
        S.wi[w] = bi;
    }
    __syncthreads();
    float m = -INFINITY;
    int mid = -1;
    for (int i = 0; i < SNW; i++) {
        int oi = S.wi[i];
        float ov = S.wv[i];
        if (oi >= 0 && (mid < 0 || ov > m || (ov == m && oi < mid))) {
            m = ov;
            mid = oi;
        }
    }
    if (bad || m == -INFINITY) {
        if (tid == 0) {
            tokens[row] = -1;
            status[row] = bad ? DI_SAMPLE_ERR_NAN : DI_SAMPLE_ERR_MASKED;
        }
        return;
    }
    if (greedy) {
        if (tid == 0) {
            tokens[row] = mid;
            status[row] = DI_SAMPLE_OK;
        }
        return;
    }
    const bool use_k = P.top_k > 0 && P.top_k < V, use_p = P.top_p < 1.0f;

    /* top-k: the key of the k-th element in (y desc, id asc) order */
    uint64_t kth = 0;
    if (use_k) {
        uint64_t prefix = 0, mask = 0;
        unsigned need = (unsigned)P.top_k;
        for (int shift = 56; shift >= 0; shift -= 8) {
            for (int i = tid; i < 256; i += SBT) S.hc[i] = 0;
            __syncthreads();
            for (int i = tid; i < V; i += SBT) {
                uint64_t k = key_of(y_of(x, i, T), i);
                if ((k & mask) == prefix) atomicAdd(&S.hc[(k >> shift) & 255], 1u);
            }
            __syncthreads();
            if (tid == 0) {
                int d = 255;
                for (; d > 0; d--) {
                    if (need <= S.hc[d]) break;
                    need -= S.hc[d];
                }
                S.chosen = d;
            }
            __syncthreads();
            prefix |= (uint64_t)S.chosen << shift;
            mask |= (uint64_t)255 << shift;
            __syncthreads();
        }
        kth = prefix;
    }
    /* total weight of C */
    unsigned long long tot = 0;
    for (int i = tid; i < V; i += SBT) {
        float y = y_of(x, i, T), pr;
        if (key_of(y, i) >= kth) tot += weight_of(y, m, &pr);
    }
    tot = block_sum_u64(tot, &S);

    /* top-p: the key of the last kept element */
    uint64_t kp = kth;
    if (use_p) {
        unsigned long long tp24 = (unsigned long long)__fmul_rn(P.top_p, 16777216.0f);
        /* Lc = ceil(tp24 * tot / 2^24) with a 128-bit product */
        unsigned long long lo = tp24 * tot, hi = __umul64hi(tp24, tot);
        unsigned long long q24 = (lo >> 24) | (hi << 40), rem = lo & 0xffffffull;
        unsigned long long Lc = q24 + (rem ? 1 : 0);
        if (Lc == 0) {
            kp = key_of(m, mid);
        } else {
            uint64_t prefix = 0, mask = 0;
            unsigned long long above = 0;
            for (int shift = 56; shift >= 0; shift -= 8) {
                for (int i = tid; i < 256; i += SBT) {
                    S.hc[i] = 0;
                    S.hq[i] = 0;
                }
                __syncthreads();
                for (int i = tid; i < V; i += SBT) {
                    float y = y_of(x, i, T), pr;
                    uint64_t k = key_of(y, i);
                    if (k >= kth && (k & mask) == prefix) {
                        int d = (int)((k >> shift) & 255);
                        atomicAdd(&S.hc[d], 1u);
                        unsigned long long q = weight_of(y, m, &pr);
                        if (q) atomicAdd(&S.hq[d], q);
                    }
                }
                __syncthreads();
                if (tid == 0) {
                    unsigned long long run = above, ca = above;
                    int ch = -1;
                    for (int d = 255; d >= 0; d--) {
                        if (!S.hc[d]) continue;
                        if (run < Lc) {
                            ch = d;
                            ca = run;
                            run += S.hq[d];
                        } else {
                            break;
                        }
                    }
                    S.chosen = ch < 0 ? 0 : ch;
                    S.chosen_above = ca;
                }
                __syncthreads();
                prefix |= (uint64_t)S.chosen << shift;
                mask |= (uint64_t)255 << shift;
                above = S.chosen_above;
                __syncthreads();
            }
            kp = prefix;
        }
    }
    /* W over the kept set K */
    const float min_p = P.min_p;
    unsigned long long W = 0;
    for (int i = tid; i < V; i += SBT) {
        float y = y_of(x, i, T), pr;
        if (key_of(y, i) < kp) continue;
        unsigned long long q = weight_of(y, m, &pr);
        if (min_p > 0.0f && !(pr >= min_p)) q = 0;
        W += q;
    }
    W = block_sum_u64(W, &S);
    if (W == 0) {
        if (tid == 0) {
            tokens[row] = -1;
            status[row] = DI_SAMPLE_ERR_ZERO;
        }
        return;
    }
    uint32_t r = philox_u32(P.seed, P.position, P.stream, 0);
    unsigned long long lo = (unsigned long long)r * W, hi = __umul64hi((unsigned long long)r, W);
    unsigned long long tdraw = (lo >> 32) | (hi << 32); /* < W */
    /* walk ids in ascending order */
    if (tid == 0) S.answer = -1;
    unsigned long long carry = 0;
    for (int base = 0; base < V; base += SBT) {
        int i = base + tid;
        unsigned long long q = 0;
        if (i < V) {
            float y = y_of(x, i, T), pr;
            if (key_of(y, i) >= kp) {
                q = weight_of(y, m, &pr);
                if (min_p > 0.0f && !(pr >= min_p)) q = 0;
            }
        }
        unsigned long long chunk;
        unsigned long long incl = block_scan_u64(q, &S, &chunk);
        if (q && carry + incl > tdraw && carry + incl - q <= tdraw) S.answer = i;
        __syncthreads();
        if (S.answer >= 0) break;
        carry += chunk;
    }
    if (tid == 0) {
        tokens[row] = S.answer;
        status[row] = S.answer >= 0 ? DI_SAMPLE_OK : DI_SAMPLE_ERR_ZERO;
    }
}

void cuda_sample(di_backend *be, int32_t *tokens, int32_t *status, const float *logits, int n, int V,
                 const di_sample_row *rows) {
    cuda_state *st = cst(be);
    if (n <= 0) return;
    if (st->sample_greedy) cuda_sample_greedy(st, tokens, status, logits, n, V, rows);
    if (st->sample_cluster && cuda_sample_cluster(st, tokens, status, logits, n, V, rows, st->sample_greedy)) return;
    k_sample<<<n, SBT, 0, st->stream>>>(logits, V, rows, tokens, status, st->sample_greedy);
    CUDA_LAUNCHED(st, "sample");
}
