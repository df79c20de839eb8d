/* cuda_mla_decode.cuh - what the MLA decode kernels share: their argument block (dec_args), the
 * paged-cache slot of a position, and the wgmma kernel's launcher (the token -> sequence lookup
 * seq_of is in cuda_internal.h, shared with the indexer and the sparse kernels).
 *
 * Owner: cuda. cuda_mla_decode.cu (mma.sync / generic kernels, split choice, k_mla_combine,
 * dispatch) and cuda_mla_decode_wgmma.cu (the Hopper kernel for 64-head groups). */
#ifndef DI_BACKEND_CUDA_MLA_DECODE_CUH
#define DI_BACKEND_CUDA_MLA_DECODE_CUH
#include "backend/cuda/cuda_internal.h"

typedef struct dec_args {
    bf16 *out;
    const bf16 *qt, *qpe, *cache;
    long ldqpe, hsqpe;
    const int32_t *seq_start, *ctx_len, *block_table;
    int max_blocks, seq_begin, seq_end, n_heads, r, dr;
    float scale;
    int nsplit;
    int kt;      /* keys per tile of the kernel that wrote the partials (k_mla_combine's split math) */
    float *part; /* [n_tokens * H * nsplit][r] */
    float *ml;   /* [n_tokens * H * nsplit][2] */
    int early;   /* k_mla_decode_fast (dense): metadata and earlier steps' cache rows before the PDL
                  * wait, launched with PDL (DEEPINFER_CUDA_MLA_EARLY) */
} dec_args;

/* Tiles per split of a token with ntiles tiles: ceil(ntiles / nsplit), but at least 2 once the
 * token has more than MLA_NARROW tiles when the launch has more than MLA_NARROW splits (one-token
 * steps, st->mla_wide): so up to 2 * MLA_NARROW tiles the splits are those of MLA_NARROW splits
 * (more splits of one tile each measured slower: their merge costs more than they save), and
 * beyond it the extra splits share the keys. Every kernel that splits or merges uses this. */
enum { MLA_NARROW = 64 };
static __host__ __device__ __forceinline__ int split_tiles_of(int ntiles, int nsplit) {
    int tps = (ntiles + nsplit - 1) / nsplit;
    return nsplit > MLA_NARROW && ntiles > MLA_NARROW && tps < 2 ? 2 : tps;
}
static __device__ __forceinline__ int split_tiles(const dec_args &a, int ntiles) {
    return split_tiles_of(ntiles, a.nsplit);
}

static __device__ __forceinline__ long cache_slot(const dec_args &a, int seq, int p) {
    int blk = a.block_table[(long)seq * a.max_blocks + p / DI_KV_BLOCK_SIZE];
    return (long)blk * DI_KV_BLOCK_SIZE + p % DI_KV_BLOCK_SIZE;
}

/* k_mla_decode_wg (cuda_mla_decode_wgmma.cu): r = 512, rope 64, heads a multiple of 64 */
enum { MLA_WG_KT = 64 };
void mla_decode_wg_launch(cuda_state *st, const dec_args &a, int n_tokens);
#endif
