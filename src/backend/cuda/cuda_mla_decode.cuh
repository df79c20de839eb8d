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
    /* k_mla_decode_fast (dense) only (NULL / 0 elsewhere; backend.h di_mla_pre):
     * - rope_q: q_pe is read un-rotated and rotated in shared memory as rope(q_pe, positions)
     *   would (cuda_rope.cuh);
     * - kv_new: the step's own latent rows (a sequence's positions from its first token of the
     *   step on) are not read from the cache but made from kv_new (one row per batch token,
     *   stride ldkv_new) in shared memory, normed (kv_norm, kv_eps) and k_pe rotated as
     *   k_rope_kv_write would; the block of the row's own token (head group 0) writes it to the
     *   cache (cache_w, slot_mapping) */
    const int32_t *rope_pos;
    const float *rope_inv_freq;
    float rope_mscale;
    int rope_interleave, rope_q;
    const bf16 *kv_new;
    long ldkv_new;
    const float *kv_norm;
    float kv_eps;
    const int32_t *slots;
    bf16 *cache_w;
} dec_args;

static __device__ __forceinline__ long cache_slot(const dec_args &a, int seq, int p) {
    int blk = a.block_table[(long)seq * a.max_blocks + p / DI_KV_BLOCK_SIZE];
    return (long)blk * DI_KV_BLOCK_SIZE + p % DI_KV_BLOCK_SIZE;
}

/* k_mla_decode_wg (cuda_mla_decode_wgmma.cu): r = 512, rope 64, heads a multiple of 64;
 * pv_mma = 1 runs O += P V on mma.sync instead of wgmma (DEEPINFER_CUDA_MLA_WGMMA=2, A/B). */
enum { MLA_WG_KT = 64 };
void mla_decode_wg_launch(cuda_state *st, const dec_args &a, int n_tokens, int pv_mma);
#endif
