/* mkmodel_presets.c - the named model configurations of `deepinfer mkmodel --preset`.
 *
 * The tiny presets are small enough for CI (vocab 512, hidden 96-160, 2-3 layers, 8-16
 * experts) but together cover every code path of the forward pass: q-LoRA and plain q_proj,
 * YaRN (with positions beyond original_max_position_embeddings, attention factor != 1) and
 * plain RoPE, interleaved and NeoX RoPE pairs, grouped noaux_tc, V2 softmax greedy and
 * group_limited_greedy routing, 0/1/2 shared experts, dense first layers, and the V3.2 indexer
 * tensors. Dimensions are
 * deliberately not multiples of 128 (and several exceed 128), so FP8 checkpoints have partial
 * scale blocks in both directions; v_head_dim differs from qk_nope_head_dim. `v2lite-8l` is the
 * benchmark model (bench/models/v2lite-8l.config.json, embedded verbatim below).
 * One table (k_presets) lists every preset once: name, implied dtype, builder, help line. */
#include <stdio.h>
#include <string.h>

#include "core/json_util.h"
#include "core/status.h"
#include "io/mkmodel.h"

static const char k_v2lite_8l_json[] =
    "{\n"
    "  \"architectures\": [\"DeepseekV2ForCausalLM\"],\n"
    "  \"model_type\": \"deepseek_v2\",\n"
    "  \"vocab_size\": 129280,\n"
    "  \"hidden_size\": 2048,\n"
    "  \"intermediate_size\": 10944,\n"
    "  \"moe_intermediate_size\": 1408,\n"
    "  \"num_hidden_layers\": 8,\n"
    "  \"num_attention_heads\": 16,\n"
    "  \"num_key_value_heads\": 16,\n"
    "  \"n_shared_experts\": 2,\n"
    "  \"n_routed_experts\": 64,\n"
    "  \"num_experts_per_tok\": 6,\n"
    "  \"n_group\": 1,\n"
    "  \"topk_group\": 1,\n"
    "  \"topk_method\": \"greedy\",\n"
    "  \"scoring_func\": \"softmax\",\n"
    "  \"first_k_dense_replace\": 1,\n"
    "  \"moe_layer_freq\": 1,\n"
    "  \"q_lora_rank\": null,\n"
    "  \"kv_lora_rank\": 512,\n"
    "  \"qk_nope_head_dim\": 128,\n"
    "  \"qk_rope_head_dim\": 64,\n"
    "  \"v_head_dim\": 128,\n"
    "  \"routed_scaling_factor\": 1.0,\n"
    "  \"norm_topk_prob\": false,\n"
    "  \"max_position_embeddings\": 163840,\n"
    "  \"rope_theta\": 10000,\n"
    "  \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"original_max_position_embeddings\": 4096, \"beta_fast\": 32, "
    "\"beta_slow\": 1, \"mscale\": 0.707, \"mscale_all_dim\": 0.707},\n"
    "  \"rms_norm_eps\": 1e-06,\n"
    "  \"bos_token_id\": 0,\n"
    "  \"eos_token_id\": 1,\n"
    "  \"tie_word_embeddings\": false,\n"
    "  \"torch_dtype\": \"bfloat16\"\n"
    "}\n";

/* YaRN RoPE with DeepSeek's ramp (beta_fast 32, beta_slow 1). */
static void yarn(di_model_config *c, double factor, int original_max_position, double mscale, double mscale_all_dim) {
    c->rope.type = DI_ROPE_YARN;
    c->rope.factor = factor;
    c->rope.original_max_position = original_max_position;
    c->rope.beta_fast = 32.0;
    c->rope.beta_slow = 1.0;
    c->rope.mscale = mscale;
    c->rope.mscale_all_dim = mscale_all_dim;
}

static void tiny_common(di_model_config *c) {
    c->vocab_size = 512;
    c->max_position_embeddings = 512;
    c->bos_token_id = 0;
    c->n_eos = 1;
    c->eos_token_ids[0] = 1;
    c->num_nextn_predict_layers = 0;
    c->rms_norm_eps = 1e-6;
    c->rope.type = DI_ROPE_DEFAULT;
    c->rope.theta = 10000.0;
}

static di_status tiny_v3(di_model_config *c) {
    di_config_defaults(DI_ARCH_DEEPSEEK_V3, c);
    tiny_common(c);
    c->hidden_size = 160;
    c->intermediate_size = 224;
    c->moe_intermediate_size = 72;
    c->num_hidden_layers = 3;
    c->num_attention_heads = 4;
    c->q_lora_rank = 72;
    c->kv_lora_rank = 40;
    c->qk_nope_head_dim = 24;
    c->qk_rope_head_dim = 16;
    c->v_head_dim = 20;
    c->n_routed_experts = 16;
    c->n_shared_experts = 1;
    c->num_experts_per_tok = 4;
    c->n_group = 4;
    c->topk_group = 2;
    c->routed_scaling_factor = 2.5;
    c->norm_topk_prob = 1;
    c->first_k_dense_replace = 1;
    yarn(c, 8.0, 64, 1.0, 0.8);
    return DI_OK;
}

static di_status tiny_v3_nolora(di_model_config *c) {
    di_config_defaults(DI_ARCH_DEEPSEEK_V3, c);
    tiny_common(c);
    c->hidden_size = 136;
    c->intermediate_size = 200;
    c->moe_intermediate_size = 48;
    c->num_hidden_layers = 2;
    c->num_attention_heads = 2;
    c->q_lora_rank = 0;
    c->kv_lora_rank = 64;
    c->qk_nope_head_dim = 32;
    c->qk_rope_head_dim = 32;
    c->v_head_dim = 32;
    c->n_routed_experts = 8;
    c->n_shared_experts = 2;
    c->num_experts_per_tok = 2;
    c->n_group = 2;
    c->topk_group = 1;
    c->routed_scaling_factor = 1.5;
    c->norm_topk_prob = 1;
    c->first_k_dense_replace = 1;
    return DI_OK;
}

static di_status tiny_v2_lite(di_model_config *c) {
    di_config_defaults(DI_ARCH_DEEPSEEK_V2, c);
    tiny_common(c);
    c->hidden_size = 128;
    c->intermediate_size = 192;
    c->moe_intermediate_size = 40;
    c->num_hidden_layers = 3;
    c->num_attention_heads = 4;
    c->q_lora_rank = 0;
    c->kv_lora_rank = 48;
    c->qk_nope_head_dim = 32;
    c->qk_rope_head_dim = 16;
    c->v_head_dim = 24;
    c->n_routed_experts = 12;
    c->n_shared_experts = 2;
    c->num_experts_per_tok = 3;
    c->n_group = 1;
    c->topk_group = 1;
    c->topk_method = DI_TOPK_GREEDY;
    c->routed_scaling_factor = 1.0;
    c->first_k_dense_replace = 1;
    yarn(c, 4.0, 128, 0.707, 0.707);
    return DI_OK;
}

static di_status tiny_v2_grouped(di_model_config *c) {
    di_config_defaults(DI_ARCH_DEEPSEEK_V2, c);
    tiny_common(c);
    c->hidden_size = 96;
    c->intermediate_size = 160;
    c->moe_intermediate_size = 32;
    c->num_hidden_layers = 2;
    c->num_attention_heads = 3;
    c->q_lora_rank = 56;
    c->kv_lora_rank = 36;
    c->qk_nope_head_dim = 16;
    c->qk_rope_head_dim = 8;
    c->v_head_dim = 16;
    c->n_routed_experts = 16;
    c->n_shared_experts = 1;
    c->num_experts_per_tok = 3;
    c->n_group = 4;
    c->topk_group = 2;
    c->topk_method = DI_TOPK_GROUP_LIMITED_GREEDY;
    c->routed_scaling_factor = 2.0;
    c->first_k_dense_replace = 0;
    return DI_OK;
}

static di_status demo_v3(di_model_config *c) {
    di_config_defaults(DI_ARCH_DEEPSEEK_V3, c);
    tiny_common(c);
    c->vocab_size = 1024;
    c->max_position_embeddings = 4096;
    c->hidden_size = 512;
    c->intermediate_size = 1408;
    c->moe_intermediate_size = 256;
    c->num_hidden_layers = 4;
    c->num_attention_heads = 8;
    c->q_lora_rank = 256;
    c->kv_lora_rank = 160;
    c->qk_nope_head_dim = 48;
    c->qk_rope_head_dim = 32;
    c->v_head_dim = 48;
    c->n_routed_experts = 16;
    c->n_shared_experts = 1;
    c->num_experts_per_tok = 4;
    c->n_group = 4;
    c->topk_group = 2;
    c->routed_scaling_factor = 2.5;
    c->first_k_dense_replace = 1;
    yarn(c, 4.0, 1024, 1.0, 1.0);
    return DI_OK;
}

static di_status tiny_v3_neox(di_model_config *c) {
    DI_TRY(tiny_v3(c));
    c->rope.interleave = 0;
    return DI_OK;
}

static di_status tiny_v32(di_model_config *c) {
    DI_TRY(tiny_v3(c));
    c->arch = DI_ARCH_DEEPSEEK_V32;
    snprintf(c->model_type, sizeof c->model_type, "%s", "deepseek_v32");
    c->num_nextn_predict_layers = 0;
    c->index_n_heads = 4;
    c->index_head_dim = 32;
    c->index_topk = 64;
    return DI_OK;
}

static di_status v2lite_8l(di_model_config *c) {
    json_t *root = NULL;
    DI_TRY(di_json_loadb(k_v2lite_8l_json, sizeof k_v2lite_8l_json - 1, "preset v2lite-8l", &root));
    di_status s = di_config_from_json(root, "preset v2lite-8l", c);
    json_decref(root);
    return s;
}

/* The presets: name, the checkpoint dtype it implies, its configuration, --help line. */
static const struct preset {
    const char *name;
    di_mk_dtype dtype;
    di_status (*build)(di_model_config *c);
    const char *help;
} k_presets[] = {
    {"tiny-v3", DI_MK_BF16, tiny_v3,
     "V3: q-LoRA, YaRN (x8 over 64 positions, attention factor != 1), noaux_tc 16 experts in 4 groups (2 kept), "
     "top-4, 1 shared, 3 layers (1 dense)"},
    {"tiny-v3-nolora", DI_MK_BF16, tiny_v3_nolora,
     "V3: no q-LoRA, plain RoPE, 8 experts in 2 groups (1 kept), top-2, 2 shared, 2 layers (1 dense)"},
    {"tiny-v3-fp8", DI_MK_FP8, tiny_v3,
     "tiny-v3 with FP8 128x128 block-quantized projections (partial blocks both ways)"},
    {"tiny-v3-neox", DI_MK_BF16, tiny_v3_neox, "tiny-v3 with rope_interleave = false (NeoX RoPE pairs)"},
    {"tiny-v2-lite", DI_MK_BF16, tiny_v2_lite,
     "V2-Lite-like: no q-LoRA, softmax greedy top-3 of 12, 2 shared, YaRN mscale 0.707, 3 layers (1 dense)"},
    {"tiny-v2-grouped", DI_MK_BF16, tiny_v2_grouped,
     "V2: q-LoRA, softmax group_limited_greedy (16 experts, 4 groups, 2 kept), top-3, plain RoPE, 2 MoE layers"},
    {"tiny-v32", DI_MK_BF16, tiny_v32, "V3.2: tiny-v3 + the DSA indexer tensors (4 heads x 32, index_topk 64)"},
    {"demo-v3", DI_MK_FP8, demo_v3,
     "demo model (26.1M params, +9.0M with --mtp): V3, FP8, hidden 512, 16 experts, 4 layers"},
    {"v2lite-8l", DI_MK_BF16, v2lite_8l,
     "benchmark model: DeepSeek-V2-Lite shapes, 8 layers, vocab 129280 (~4.7B params, 9.4 GB bf16)"},
};

static const struct preset *find(const char *name) {
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (!strcmp(k_presets[i].name, name)) return &k_presets[i];
    return NULL;
}

const char *di_mkmodel_preset_name(size_t i) {
    return i < sizeof k_presets / sizeof k_presets[0] ? k_presets[i].name : NULL;
}

const char *di_mkmodel_preset_help(const char *name) {
    const struct preset *p = find(name);
    return p ? p->help : NULL;
}

di_status di_mkmodel_preset(const char *name, di_model_config *c, di_mk_dtype *default_dtype) {
    const struct preset *p = find(name);
    if (!p) return di_error(DI_ERR_INVALID_ARG, "unknown preset '%s' (see deepinfer mkmodel --help)", name);
    DI_TRY(p->build(c));
    if (default_dtype) *default_dtype = p->dtype;
    return di_config_validate(c, name);
}
