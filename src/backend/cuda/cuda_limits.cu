/* cuda_limits.cu - which model shapes the CUDA kernels can run, checked once at model load.
 *
 * Owner: cuda. Every DeepSeek-family checkpoint (latent 512, rope 64, nope / value heads 128,
 * indexer heads of 128) fits; an unusual config.json (e.g. kv_lora_rank 1024) is refused here
 * with a message naming the field, its value and the limit, instead of failing an assertion in
 * the first step. The limits come from the kernels' own files (per-lane register arrays of the
 * generic attention kernels, shared memory of the fp32 attention and the generic indexer), so
 * they move with the kernels. Host arithmetic only: di_cuda_check_dims runs without a device. */
#include "backend/cuda/cuda_internal.h"

static di_status too_wide(const char *where, const char *field, int value, int limit, const char *kernel) {
    return di_error(DI_ERR_UNSUPPORTED,
                    "%s: field '%s': %d is wider than the CUDA backend's %s kernels take (at most %d); use --device cpu",
                    where, field, value, kernel, limit);
}

extern "C" di_status di_cuda_check_dims(int precision, const char *where, const di_mla_dims *mla,
                                        const di_indexer_dims *ix) {
    if (!where) where = "config.json";
    const int f32 = precision == DI_PRECISION_F32;
    if (mla) {
        if (f32) { /* the absorbed fp32 attention (decode and prefill) keeps q, acc, scores in shared memory */
            size_t smem = cuda_f32_attend_smem(mla->kv_rank, mla->rope_dim);
            if (smem > CUDA_MAX_SMEM)
                return di_error(DI_ERR_UNSUPPORTED,
                                "%s: fields 'kv_lora_rank' (%d) and 'qk_rope_head_dim' (%d): the CUDA fp32 attention "
                                "needs %zu bytes of shared memory per block, more than the %d the GPU has (2 x "
                                "kv_lora_rank + qk_rope_head_dim at most %d); use --device cpu",
                                where, mla->kv_rank, mla->rope_dim, smem, (int)CUDA_MAX_SMEM,
                                (int)(CUDA_MAX_SMEM / sizeof(float)) - 64);
        } else {
            int max_rank, max_rope, max_v, max_qk;
            cuda_mla_decode_limits(&max_rank, &max_rope);
            cuda_mla_prefill_limits(&max_v, &max_qk);
            if (mla->kv_rank > max_rank) return too_wide(where, "kv_lora_rank", mla->kv_rank, max_rank, "MLA decode");
            if (mla->rope_dim > max_rope)
                return too_wide(where, "qk_rope_head_dim", mla->rope_dim, max_rope, "MLA decode");
            if (mla->v_dim > max_v) return too_wide(where, "v_head_dim", mla->v_dim, max_v, "MLA prefill");
            if (mla->nope_dim + mla->rope_dim > max_qk)
                return di_error(DI_ERR_UNSUPPORTED,
                                "%s: fields 'qk_nope_head_dim' + 'qk_rope_head_dim': %d + %d = %d is wider than the CUDA "
                                "backend's MLA prefill kernels take (at most %d); use --device cpu",
                                where, mla->nope_dim, mla->rope_dim, mla->nope_dim + mla->rope_dim, max_qk);
        }
    }
    if (ix) { /* the generic indexer kernel: the fp32 table's, and the bf16 one's where the fast one does not
               * serve (its shapes, 128-wide heads, fit this kernel too) */
        size_t smem = cuda_indexer_generic_smem(ix);
        if (smem > CUDA_MAX_SMEM)
            return di_error(DI_ERR_UNSUPPORTED,
                            "%s: fields 'index_n_heads' (%d) and 'index_head_dim' (%d): the CUDA indexer needs %zu bytes "
                            "of shared memory per block, more than the %d the GPU has; use --device cpu",
                            where, ix->n_heads, ix->head_dim, smem, (int)CUDA_MAX_SMEM);
    }
    return DI_OK;
}

di_status cuda_check_dims(di_backend *be, const char *where, const di_mla_dims *mla, const di_indexer_dims *ix) {
    return di_cuda_check_dims(cst(be)->f32 ? DI_PRECISION_F32 : DI_PRECISION_BF16, where, mla, ix);
}
