/* config.h - the model configuration (config.json of deepseek_v2 / deepseek_v3 / deepseek_v32).
 *
 * Owner: io. di_config_load parses and validates config.json: both `rope_scaling` (v4 style)
 * and transformers-v5 `rope_parameters`, `quantization_config` (fp8, 128x128 blocks, ue8m0),
 * V2 routing fields. Every nonsense value (non-positive sizes, heads not dividing, top-k > experts,
 * groups not dividing experts, unknown topk_method/scoring_func, ...) is an error that names
 * the file and field. Fields absent from a file take the transformers 5.17 defaults for that
 * model_type (configuration_deepseek_v2/_v3/_v32.py). This struct is the contract between io,
 * model, engine and backends.
 *
 * Semantics follow transformers 5.17 where the three architectures differ:
 *   - deepseek_v3 / v32 route with sigmoid + e_score_correction_bias + group-limited top-k
 *     (noaux_tc) whatever `topk_method` says; a config naming another method is rejected.
 *   - deepseek_v2 routes with softmax, `greedy` or `group_limited_greedy`, and never
 *     renormalises the top-k weights (HF ignores norm_topk_prob for V2; we store 0).
 *   - RoPE pairs are interleaved (2i, 2i+1) for V2 and V3.2 always, for V3 unless
 *     `rope_interleave` is false (then NeoX halves (i, i+d/2)). */
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
/* Upper bounds that catch absurd (or overflow-provoking) values in a config file. */
#define DI_CONFIG_MAX_DIM (1 << 20)      /* any width / rank / head dim */
#define DI_CONFIG_MAX_VOCAB (1 << 24)
#define DI_CONFIG_MAX_LAYERS 4096
#define DI_CONFIG_MAX_EXPERTS 65536
#define DI_CONFIG_MAX_HEADS 4096

typedef struct di_rope_config {
    di_rope_type type;
    double theta;                    /* rope_theta (default 10000) */
    double factor;                   /* YaRN scaling factor s (1 = none) */
    int original_max_position;       /* original_max_position_embeddings (L0) */
    double beta_fast, beta_slow;     /* YaRN ramp bounds (defaults 32 / 1; 0 in a file means default) */
    double mscale, mscale_all_dim;   /* YaRN magnitude scales; 0 = absent (HF treats both as falsy) */
    double attention_factor;         /* explicit cos/sin multiplier; 0 = derive (see rope_inv_freq) */
    int truncate;                    /* HF v5 `truncate` (default 1: floor/ceil of corr dims) */
    int interleave;                  /* 1: pairs (2i,2i+1) (HF rope_interleave); 0: NeoX halves */
} di_rope_config;

typedef struct di_model_config {
    di_arch arch;
    char model_type[32];
    int vocab_size;
    int hidden_size;                 /* D */
    int intermediate_size;           /* dense MLP width */
    int moe_intermediate_size;       /* routed expert width (shared experts: x n_shared_experts) */
    int num_hidden_layers;           /* main layers (MTP layers come after these) */
    int num_attention_heads;         /* H */
    int q_lora_rank;                 /* 0 = no q-LoRA: a single q_proj */
    int kv_lora_rank;                /* r */
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    /* MoE */
    int n_routed_experts;            /* > 0 (every supported architecture has MoE layers) */
    int n_shared_experts;            /* may be 0 */
    int num_experts_per_tok;         /* top-k */
    int n_group, topk_group;         /* groups of n_routed_experts/n_group consecutive experts */
    di_topk_method topk_method;
    di_score_func scoring_func;
    int norm_topk_prob;              /* renormalise top-k weights (sum + 1e-20); always 0 for V2 */
    double routed_scaling_factor;
    int first_k_dense_replace;       /* layers [0, k) are dense */
    int moe_layer_freq;              /* parsed and validated == 1 (HF ignores it; others unsupported) */
    /* norms, positions, vocab */
    double rms_norm_eps;
    int max_position_embeddings;
    di_rope_config rope;
    int tie_word_embeddings;         /* lm_head shares embed_tokens (then no lm_head.weight) */
    int bos_token_id;                /* -1 if null */
    int n_eos;                       /* eos_token_id may be an int or a list (0 if null) */
    int eos_token_ids[DI_MAX_EOS_IDS];
    int num_nextn_predict_layers;    /* MTP layers stored after the main layers */
    di_dtype torch_dtype;            /* declared dtype of the unquantized tensors (`dtype`/`torch_dtype`) */
    /* quantization_config (fp8) */
    int fp8;                         /* 1 if quant_method == fp8 */
    int weight_block[2];             /* [128, 128]: rows, columns of one scale block */
    int scale_ue8m0;                 /* scale_fmt == "ue8m0" */
    /* V3.2 indexer (0 for other architectures) */
    int index_n_heads, index_head_dim, index_topk;
} di_model_config;

/* Parses and validates `path` (a config.json). */
di_status di_config_load(const char *path, di_model_config *cfg);
/* Same from a parsed object; `where` names the source in messages. */
di_status di_config_from_json(const json_t *root, const char *where, di_model_config *cfg);
/* Checks invariants of a filled struct (also used by mkmodel before writing). */
di_status di_config_validate(const di_model_config *cfg, const char *where);
/* Fills the transformers 5.17 defaults for `arch` (what an empty config.json of that
 * model_type would give). */
void di_config_defaults(di_arch arch, di_model_config *cfg);
/* Serialises to a Hub-style config.json object (v4 `rope_scaling` spelling, which every
 * transformers version reads; `quantization_config` when fp8). Caller json_decref()s. */
json_t *di_config_to_json(const di_model_config *cfg);

/* Derived quantities. */
static inline int di_config_qk_head_dim(const di_model_config *c) { return c->qk_nope_head_dim + c->qk_rope_head_dim; }
/* Latent KV cache width per token per layer: kv_lora_rank + qk_rope_head_dim (576 for V3). */
static inline int di_config_kv_width(const di_model_config *c) { return c->kv_lora_rank + c->qk_rope_head_dim; }
/* Total number of decoder layers stored: main + MTP. */
static inline int di_config_total_layers(const di_model_config *c) { return c->num_hidden_layers + c->num_nextn_predict_layers; }
/* 1 if layer l (0-based, main layers and MTP layers) uses MoE: l >= first_k_dense_replace. */
int di_config_layer_is_moe(const di_model_config *c, int layer);
/* YaRN magnitude m(s, a) = 0.1 * a * ln(s) + 1 for s > 1, else 1 (HF yarn_get_mscale). */
double di_config_yarn_mscale(double scale, double a);
/* Softmax scale sigma = qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 for YaRN when
 * mscale_all_dim != 0 (HF yarn_apply_mscale). */
double di_config_softmax_scale(const di_model_config *c);
/* Inverse frequencies, rope_dim/2 values, computed exactly as transformers 5.17 does (in
 * float32, same operation order: default RoPE or _compute_yarn_parameters), and the cos/sin
 * multiplier (HF attention_factor / attention_scaling; 1 for default RoPE). */
void di_config_rope_inv_freq(const di_model_config *c, double *inv_freq /* [rope_dim/2] */, double *cos_sin_scale);
/* Names for messages and config.json. */
const char *di_arch_name(di_arch a);                 /* "deepseek_v3" */
const char *di_topk_method_name(di_topk_method m);   /* "noaux_tc" */
const char *di_score_func_name(di_score_func f);     /* "sigmoid" */
#endif
