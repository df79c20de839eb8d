/* cuda_sample_greedy.cu - the greedy rows of the sample op (temperature < 1e-5): the lowest id
 * among the maxima of each row, or the CPU sampler's refusals (a NaN / +inf logit: ERR_NAN;
 * every logit -inf: ERR_MASKED), bit for bit as the CPU sampler and the other kernels decide.
 *
 * Owner: cuda. One 8-block cluster of 256-thread blocks per row streams the row once from
 * global memory (no shared-memory copy, so many clusters share an SM); each thread keeps the
 * largest (y desc, id asc) key of its elements (cuda_sample.cuh key_of: the max of the keys is
 * the lowest id among the maxima, in any order of visiting), the block reduces, and block 0
 * combines the cluster's 8 keys through distributed shared memory. Rows that are not greedy
 * return at once; cuda_sample_cluster.cu then samples them and skips the greedy ones. Against
 * the cluster sampler's own greedy branch (4-8 blocks of 1024 threads with the row's slice in
 * shared memory), this costs a few SMs for a few microseconds per row, so a batch of greedy rows
 * no longer occupies the GPU for several waves (docs/PERF.md, 2026-12-01 "before midnight"). */
#include <cooperative_groups.h>

#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_sample.cuh"

namespace cg = cooperative_groups;

enum { GR_BLOCKS = 8, GR_THREADS = 256, GR_WARPS = GR_THREADS / 32, GR_UNROLL = 8 };

typedef struct gr_smem {
    unsigned long long wkey[GR_WARPS];
    int wbad[GR_WARPS];
    unsigned long long key; /* the block's result, read by block 0 of the cluster */
    int bad;
} gr_smem;

static __device__ __forceinline__ void gr_take(float y, int id, unsigned long long *best, int *bad) {
    if (isnan(y) || y == INFINITY) *bad = 1;
    unsigned long long k = key_of(y, id);
    *best = k > *best ? k : *best;
}

__global__ void __launch_bounds__(GR_THREADS)
    k_sample_greedy(const float *logits, int V, const di_sample_row *rows, int32_t *tokens, int32_t *status) {
    __shared__ gr_smem S;
    cg::cluster_group cl = cg::this_cluster();
    const int row = blockIdx.x / GR_BLOCKS, rank = (int)cl.block_rank(), tid = threadIdx.x;
    pdl_launch_dependents(); /* st->sample_pdl: the cluster sampler (few blocks) may start */
    const bool mine = rows[row].temperature < 1e-5f; /* the step's upload: before the wait */
    pdl_wait(); /* the logits come from the lm_head GEMV */
    if (!mine) return; /* the whole cluster: same row */
    const float *x = logits + (long)row * V;
    unsigned long long best = 0; /* below every key of a valid id */
    int bad = 0;
    if ((V & 3) == 0 && ((uintptr_t)logits & 15) == 0) {
        const int n4 = V / 4, per = (n4 + GR_BLOCKS - 1) / GR_BLOCKS;
        const int lo = rank * per, hi = min(n4, lo + per);
        const float4 *x4 = (const float4 *)x;
        for (int b = lo + tid; b < hi; b += GR_THREADS * GR_UNROLL) {
            float4 v[GR_UNROLL];
#pragma unroll
            for (int u = 0; u < GR_UNROLL; u++) {
                int c = b + u * GR_THREADS;
                v[u] = c < hi ? __ldg(x4 + c) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
            }
#pragma unroll
            for (int u = 0; u < GR_UNROLL; u++) {
                int c = b + u * GR_THREADS;
                if (c >= hi) break;
                gr_take(v[u].x, 4 * c, &best, &bad);
                gr_take(v[u].y, 4 * c + 1, &best, &bad);
                gr_take(v[u].z, 4 * c + 2, &best, &bad);
                gr_take(v[u].w, 4 * c + 3, &best, &bad);
            }
        }
    } else {
        const int per = (V + GR_BLOCKS - 1) / GR_BLOCKS, lo = rank * per, hi = min(V, lo + per);
        for (int b = lo + tid; b < hi; b += GR_THREADS * GR_UNROLL) {
            float v[GR_UNROLL];
#pragma unroll
            for (int u = 0; u < GR_UNROLL; u++) {
                int i = b + u * GR_THREADS;
                v[u] = i < hi ? __ldg(x + i) : -INFINITY;
            }
#pragma unroll
            for (int u = 0; u < GR_UNROLL; u++) {
                int i = b + u * GR_THREADS;
                if (i >= hi) break;
                gr_take(v[u], i, &best, &bad);
            }
        }
    }
    /* block: warp shuffles, then warp 0 over the warps' results */
    const int lane = tid & 31, w = tid >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long k = __shfl_xor_sync(0xffffffffu, best, o);
        best = k > best ? k : best;
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    if (lane == 0) {
        S.wkey[w] = best;
        S.wbad[w] = bad;
    }
    __syncthreads();
    if (tid == 0) {
        unsigned long long k = 0;
        int b = 0;
        for (int i = 0; i < GR_WARPS; i++) {
            k = S.wkey[i] > k ? S.wkey[i] : k;
            b |= S.wbad[i];
        }
        S.key = k;
        S.bad = b;
    }
    cl.sync();
    if (rank == 0 && tid == 0) {
        unsigned long long k = 0;
        int b = 0;
        for (int r = 0; r < GR_BLOCKS; r++) {
            const gr_smem *R = cl.map_shared_rank(&S, r);
            k = R->key > k ? R->key : k;
            b |= R->bad;
        }
        /* the key's high word is y's orderable bits: 0x007fffff is -inf (every id masked) */
        int32_t tok = -1, st = DI_SAMPLE_OK;
        if (b) st = DI_SAMPLE_ERR_NAN;
        else if ((uint32_t)(k >> 32) <= 0x007fffffu) st = DI_SAMPLE_ERR_MASKED;
        else tok = (int32_t)(0xffffffffu - (uint32_t)k);
        tokens[row] = tok;
        status[row] = st;
    }
    cl.sync(); /* no block leaves while block 0 may still read its shared memory */
}

void cuda_sample_greedy(cuda_state *st, int32_t *tokens, int32_t *status, const float *logits, int n, int V,
                        const di_sample_row *rows) {
    cuda_launch_cluster(st, pdl_with(st, st->sample_pdl), GR_BLOCKS, "sample_greedy launch", k_sample_greedy,
                        dim3((unsigned)(n * GR_BLOCKS)), dim3(GR_THREADS), 0, logits, V, rows, tokens, status);
    CUDA_LAUNCHED(st, "sample_greedy");
}
