/* config.h - the model configuration (config.json of deepseek_v2 / deepseek_v3 / deepseek_v32).
 *
 * Owner: io. di_config_load parses and validates config.json: both `rope_scaling` (v4 style)
 * and transformers-v5 `rope_parameters`, `quantization_config` (fp8, 128x128 blocks, ue8m0),
 * V2 routing fields. Every nonsense value (non-positive sizes, heads not dividing, top-k > experts,
 * groups not dividing experts, unknown topk_method/scoring_func, ...) is an error that names
 * the file and field. Fields absent from a file take the transformers defaults for that
 * model_type. This struct is the contract between io, model, engine and backends. */
#ifndef DI_IO_CONFIG_H
#define DI_IO_CONFIG_H
#include <jansson.h>
#include "core/dtype.h"
#include "deepinfer.h"

typedef enum { DI_ARCH_DEEPSEEK_V2 = 0, DI_ARCH_DEEPSEEK_V3, DI_ARCH_DEEPSEEK_V32 } di_arch;
typedef enum { DI_SCORE_SIGMOID = 0, DI_SCORE_SOFTMAX } di_score_func;
typedef enum { DI_TOPK_NOAUX_TC = 0, DI_TOPK_GREEDY, DI_TOPK_GROUP_LIMITED_GREEDY } di_topk_method;
typedef enum { DI_ROPE_DEFAULT = 0, DI_ROPE_YARN } di_rope_type;

#define DI_MAX_EOS_IDS 8

typedef struct di_rope_config {
    di_rope_type type;
    double theta;                    /* rope_theta */
    double factor;                   /* YaRN scaling factor s (1 = none) */
    int original_max_position;       /* original_max_position_embeddings (L0) */
    double beta_fast, beta_slow;     /* YaRN ramp bounds (defaults 32 / 1) */
    double mscale, mscale_all_dim;   /* YaRN magnitude scales (defaults 1 / 0) */
    int truncate;                    /* HF v5 `truncate` (default 1: floor/ceil of corr dims) */
    int interleave;                  /* HF `rope_interleave` (default 1 for V3, pairs (2i,2i+1)) */
} di_rope_config;

typedef struct di_model_config {
    di_arch arch;
    char model_type[32];
    int vocab_size;
    int hidden_size;                 /* D */
    int intermediate_size;           /* dense MLP width */
    int moe_intermediate_size;       /* routed expert width */
    int num_hidden_layers;           /* main layers (MTP layers come after these) */
    int num_attention_heads;         /* H */
    int q_lora_rank;                 /* 0 = no q-LoRA: a single q_proj */
    int kv_lora_rank;                /* r */
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    /* MoE */
    int n_routed_experts;            /* 0 = dense model */
    int n_shared_experts;
    int num_experts_per_tok;
    int n_group, topk_group;
    di_topk_method topk_method;
    di_score_func scoring_func;
    int norm_topk_prob;
    double routed_scaling_factor;
    int first_k_dense_replace;
    int moe_layer_freq;
    /* norms, positions, vocab */
    double rms_norm_eps;
    int max_position_embeddings;
    di_rope_config rope;
    int tie_word_embeddings;
    int bos_token_id;
    int n_eos;                       /* eos_token_id may be an int or a list */
    int eos_token_ids[DI_MAX_EOS_IDS];
    int num_nextn_predict_layers;    /* MTP layers stored after the main layers */
    di_dtype torch_dtype;            /* declared dtype of the unquantized tensors */
    /* quantization_config (fp8) */
    int fp8;                         /* 1 if quant_method == fp8 */
    int weight_block[2];             /* [128, 128] */
    int scale_ue8m0;                 /* scale_fmt == "ue8m0" */
    /* V3.2 indexer */
    int index_n_heads, index_head_dim, index_topk;
} di_model_config;

/* Parses and validates `path` (a config.json). */
di_status di_config_load(const char *path, di_model_config *cfg);
/* Same from a parsed object; `where` names the source in messages. */
di_status di_config_from_json(const json_t *root, const char *where, di_model_config *cfg);
/* Checks invariants of a filled struct (also used by mkmodel before writing). */
di_status di_config_validate(const di_model_config *cfg, const char *where);

/* Derived quantities. */
static inline int di_config_qk_head_dim(const di_model_config *c) { return c->qk_nope_head_dim + c->qk_rope_head_dim; }
/* Latent KV cache width per token per layer: kv_lora_rank + qk_rope_head_dim (576 for V3). */
static inline int di_config_kv_width(const di_model_config *c) { return c->kv_lora_rank + c->qk_rope_head_dim; }
/* 1 if layer l (0-based, main layers and MTP layers) uses MoE. */
int di_config_layer_is_moe(const di_model_config *c, int layer);
/* Softmax scale sigma = qk_head_dim^-0.5 * mscale(factor, mscale_all_dim)^2 (YaRN). */
double di_config_softmax_scale(const di_model_config *c);
/* YaRN / default inverse frequencies, rope_dim/2 values, and the cos/sin multiplier
 * (HF attention_factor). */
void di_config_rope_inv_freq(const di_model_config *c, double *inv_freq /* [rope_dim/2] */, double *cos_sin_scale);
#endif
