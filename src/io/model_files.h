/* model_files.h - the exact tensor layout of a DeepSeek checkpoint (Hugging Face Hub names),
 * derived from a di_model_config, and the check that a set of safetensors matches it.
 *
 * Owner: io. di_model_tensor_specs lists every tensor a checkpoint of that config holds, in Hub
 * order (embeddings, layers 0..L-1, final norm, lm_head, then MTP layers L..L+n-1), with its
 * shape and role. mkmodel writes exactly this list; the model loader calls
 * di_model_files_check before uploading anything, so a checkpoint with a missing, misshapen,
 * wrongly typed or unexpected tensor is refused with the names.
 *
 * Dtype rules: projections (role DI_TROLE_LINEAR) may be F32/BF16/F16, or F8_E4M3 when
 * config.json has an fp8 quantization_config and the sibling `<name>_scale_inv` (".weight" ->
 * ".weight_scale_inv") is F32 of shape [ceil(out/block0), ceil(in/block1)]. Everything else is
 * F32/BF16/F16 (the router bias is conventionally F32). */
#ifndef DI_IO_MODEL_FILES_H
#define DI_IO_MODEL_FILES_H
#include <stddef.h>
#include <stdint.h>
#include "deepinfer.h"
#include "io/config.h"
#include "io/safetensors.h"

typedef enum di_tensor_role {
    DI_TROLE_EMBED = 0,     /* [vocab, D] token embeddings (main and MTP copies) */
    DI_TROLE_LM_HEAD,       /* [vocab, D] output projection (lm_head, MTP shared_head.head) */
    DI_TROLE_NORM,          /* [n] RMSNorm / LayerNorm weights */
    DI_TROLE_NORM_BIAS,     /* [n] LayerNorm bias (V3.2 indexer k_norm) */
    DI_TROLE_LINEAR,        /* [out, in] projection that FP8 checkpoints quantize */
    DI_TROLE_LINEAR_KEEP,   /* [out, in] projection never quantized (MTP eh_proj, indexer weights_proj) */
    DI_TROLE_ROUTER,        /* [E, D] MoE router gate.weight (never FP8) */
    DI_TROLE_ROUTER_BIAS,   /* [E] e_score_correction_bias (F32) */
} di_tensor_role;

#define DI_TENSOR_NAME_MAX 128

typedef struct di_tensor_spec {
    char name[DI_TENSOR_NAME_MAX];
    int ndim;                 /* 1 or 2 */
    int64_t shape[2];
    di_tensor_role role;
    int layer;                /* decoder layer index, -1 for model-level tensors */
    int mtp;                  /* 1 if it belongs to an MTP layer (layer >= num_hidden_layers) */
    int optional;             /* may be absent (MTP embed_tokens / shared_head.head, tied lm_head) */
} di_tensor_spec;

/* Which MTP tensors a check requires. */
typedef enum di_mtp_mode {
    DI_MTP_OPTIONAL = 0,      /* MTP tensors may be absent; present ones are checked */
    DI_MTP_REQUIRED = 1       /* every MTP tensor must be there (loading the MTP head) */
} di_mtp_mode;

/* All tensors of a checkpoint for `c` (MTP layers included). *out is malloc'd (free()). */
di_status di_model_tensor_specs(const di_model_config *c, di_tensor_spec **out, size_t *n);
/* 1 if role r may be stored as F8_E4M3 with a block scale. */
static inline int di_tensor_role_quantizable(di_tensor_role r) { return r == DI_TROLE_LINEAR; }
/* "<prefix>.weight" -> "<prefix>.weight_scale_inv" into buf; returns buf, or NULL if it does not fit. */
char *di_scale_name(const char *weight_name, char *buf, size_t len);
/* Scale-block grid of a [rows, cols] weight: [ceil(rows/block0), ceil(cols/block1)]. */
void di_scale_shape(const di_model_config *c, const int64_t shape[2], int64_t out[2]);

/* Checks that `w` holds exactly the tensors of `c`: every required tensor present with its
 * shape and an allowed dtype, FP8 weights with valid scales, nothing unexpected. `where`
 * (the model directory) prefixes messages, which list the offending tensor names (the first
 * few and how many in all). */
di_status di_model_files_check(const di_model_config *c, const di_weights *w, di_mtp_mode mtp, const char *where);
#endif
