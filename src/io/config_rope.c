/* config_rope.c - quantities derived from a di_model_config: RoPE inverse frequencies (default
 * and YaRN), the cos/sin multiplier and the attention softmax scale, all as transformers 5.17
 * computes them (modeling_rope_utils._compute_yarn_parameters, compute_default_rope_parameters,
 * modeling_deepseek_v3.yarn_apply_mscale); and di_config_to_json, the config.json writer.
 *
 * transformers computes inv_freq in float32 tensor arithmetic, one rounding per operation, and
 * the correction range / attention factor / softmax scale in Python doubles. We do the same:
 * float32 variables, one operation per statement, and FP contraction off so no compiler fuses
 * a multiply and an add into an FMA (which would round differently). */
#pragma GCC optimize("fp-contract=off")
#include <math.h>
#include <stdio.h>

#include "io/config.h"

double di_config_yarn_mscale(double scale, double a) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * a * log(scale) + 1.0;
}

double di_config_softmax_scale(const di_model_config *c) {
    double s = pow((double)di_config_qk_head_dim(c), -0.5);
    if (c->rope.type != DI_ROPE_DEFAULT && c->rope.mscale_all_dim != 0.0) {
        double m = di_config_yarn_mscale(c->rope.factor, c->rope.mscale_all_dim);
        s = s * m * m;
    }
    return s;
}

/* base ** (arange(0, dim, 2) / dim) in float32, as torch evaluates it. */
static float pos_freq(double base, int i, int dim) {
    float e = (float)(2 * i) / (float)dim;
    return powf((float)base, e);
}

static double correction_dim(double n_rot, int dim, double base, int max_pos) {
    return ((double)dim * log((double)max_pos / (n_rot * 2.0 * M_PI))) / (2.0 * log(base));
}

void di_config_rope_inv_freq(const di_model_config *c, double *inv_freq, double *cos_sin_scale) {
    const di_rope_config *r = &c->rope;
    const int dim = c->qk_rope_head_dim, half = dim / 2;
    if (r->type == DI_ROPE_DEFAULT) {
        for (int i = 0; i < half; i++) inv_freq[i] = (double)(1.0f / pos_freq(r->theta, i, dim));
        if (cos_sin_scale) *cos_sin_scale = 1.0;
        return;
    }
    const double factor = r->factor;
    /* attention factor (cos/sin multiplier) */
    double att = r->attention_factor;
    if (att == 0.0) {
        if (r->mscale != 0.0 && r->mscale_all_dim != 0.0)
            att = di_config_yarn_mscale(factor, r->mscale) / di_config_yarn_mscale(factor, r->mscale_all_dim);
        else
            att = di_config_yarn_mscale(factor, 1.0);
    }
    if (cos_sin_scale) *cos_sin_scale = att;
    /* correction range, in doubles; `high` is clamped to dim - 1 (not half - 1), as in HF */
    double low = correction_dim(r->beta_fast, dim, r->theta, r->original_max_position);
    double high = correction_dim(r->beta_slow, dim, r->theta, r->original_max_position);
    if (r->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001;
    const float flow = (float)low, fden = (float)(high - low), ffactor = (float)factor;
    for (int i = 0; i < half; i++) {
        float pf = pos_freq(r->theta, i, dim);
        float extrap = 1.0f / pf;
        float scaled = ffactor * pf;
        float interp = 1.0f / scaled;
        float ramp = ((float)i - flow) / fden;
        if (ramp < 0.0f) ramp = 0.0f;
        if (ramp > 1.0f) ramp = 1.0f;
        float ef = 1.0f - ramp;             /* inv_freq_extrapolation_factor */
        float one_m_ef = 1.0f - ef;
        float a = interp * one_m_ef;
        float b = extrap * ef;
        inv_freq[i] = (double)(a + b);
    }
}

/* ---- config.json writer ---- */

static void set_int(json_t *o, const char *k, long long v) { json_object_set_new(o, k, json_integer(v)); }
static void set_real(json_t *o, const char *k, double v) { json_object_set_new(o, k, json_real(v)); }
static void set_str(json_t *o, const char *k, const char *v) { json_object_set_new(o, k, json_string(v)); }
static void set_bool(json_t *o, const char *k, int v) { json_object_set_new(o, k, json_boolean(v)); }

static const char *dtype_torch_name(di_dtype t) {
    return t == DI_DTYPE_F32 ? "float32" : t == DI_DTYPE_F16 ? "float16" : "bfloat16";
}

static json_t *rope_json(const di_model_config *c) {
    const di_rope_config *r = &c->rope;
    if (r->type == DI_ROPE_DEFAULT) return json_null();
    json_t *o = json_object();
    set_str(o, "type", "yarn");
    set_real(o, "factor", r->factor);
    set_int(o, "original_max_position_embeddings", r->original_max_position);
    set_real(o, "beta_fast", r->beta_fast);
    set_real(o, "beta_slow", r->beta_slow);
    if (r->mscale != 0) set_real(o, "mscale", r->mscale);
    if (r->mscale_all_dim != 0) set_real(o, "mscale_all_dim", r->mscale_all_dim);
    if (r->attention_factor != 0) set_real(o, "attention_factor", r->attention_factor);
    if (!r->truncate) set_bool(o, "truncate", 0);
    return o;
}

json_t *di_config_to_json(const di_model_config *c) {
    json_t *o = json_object();
    const char *arch_cls = c->arch == DI_ARCH_DEEPSEEK_V2    ? "DeepseekV2ForCausalLM"
                           : c->arch == DI_ARCH_DEEPSEEK_V32 ? "DeepseekV32ForCausalLM"
                                                             : "DeepseekV3ForCausalLM";
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(arch_cls));
    json_object_set_new(o, "architectures", archs);
    set_str(o, "model_type", c->model_type);
    set_int(o, "vocab_size", c->vocab_size);
    set_int(o, "hidden_size", c->hidden_size);
    set_int(o, "intermediate_size", c->intermediate_size);
    set_int(o, "moe_intermediate_size", c->moe_intermediate_size);
    set_int(o, "num_hidden_layers", c->num_hidden_layers);
    set_int(o, "num_nextn_predict_layers", c->num_nextn_predict_layers);
    set_int(o, "num_attention_heads", c->num_attention_heads);
    set_int(o, "num_key_value_heads", c->num_attention_heads);
    set_int(o, "n_shared_experts", c->n_shared_experts);
    set_int(o, "n_routed_experts", c->n_routed_experts);
    set_real(o, "routed_scaling_factor", c->routed_scaling_factor);
    set_int(o, "kv_lora_rank", c->kv_lora_rank);
    if (c->q_lora_rank > 0) set_int(o, "q_lora_rank", c->q_lora_rank);
    else json_object_set_new(o, "q_lora_rank", json_null());
    set_int(o, "qk_rope_head_dim", c->qk_rope_head_dim);
    set_int(o, "v_head_dim", c->v_head_dim);
    set_int(o, "qk_nope_head_dim", c->qk_nope_head_dim);
    set_str(o, "topk_method", di_topk_method_name(c->topk_method));
    set_int(o, "n_group", c->n_group);
    set_int(o, "topk_group", c->topk_group);
    set_int(o, "num_experts_per_tok", c->num_experts_per_tok);
    set_int(o, "moe_layer_freq", c->moe_layer_freq);
    set_int(o, "first_k_dense_replace", c->first_k_dense_replace);
    set_bool(o, "norm_topk_prob", c->norm_topk_prob);
    set_str(o, "scoring_func", di_score_func_name(c->scoring_func));
    set_str(o, "hidden_act", "silu");
    set_int(o, "max_position_embeddings", c->max_position_embeddings);
    set_real(o, "rms_norm_eps", c->rms_norm_eps);
    set_real(o, "rope_theta", c->rope.theta);
    json_object_set_new(o, "rope_scaling", rope_json(c));
    if (c->arch == DI_ARCH_DEEPSEEK_V3) set_bool(o, "rope_interleave", c->rope.interleave);
    set_bool(o, "attention_bias", 0);
    set_real(o, "attention_dropout", 0.0);
    if (c->bos_token_id >= 0) set_int(o, "bos_token_id", c->bos_token_id);
    else json_object_set_new(o, "bos_token_id", json_null());
    if (c->n_eos == 0) {
        json_object_set_new(o, "eos_token_id", json_null());
    } else if (c->n_eos == 1) {
        set_int(o, "eos_token_id", c->eos_token_ids[0]);
    } else {
        json_t *e = json_array();
        for (int i = 0; i < c->n_eos; i++) json_array_append_new(e, json_integer(c->eos_token_ids[i]));
        json_object_set_new(o, "eos_token_id", e);
    }
    set_bool(o, "tie_word_embeddings", c->tie_word_embeddings);
    set_str(o, "torch_dtype", dtype_torch_name(c->torch_dtype));
    set_bool(o, "use_cache", 1);
    if (c->arch == DI_ARCH_DEEPSEEK_V32) {
        set_int(o, "index_n_heads", c->index_n_heads);
        set_int(o, "index_head_dim", c->index_head_dim);
        set_int(o, "index_topk", c->index_topk);
    }
    if (c->fp8) {
        json_t *q = json_object();
        set_str(q, "activation_scheme", "dynamic");
        set_str(q, "fmt", "e4m3");
        set_str(q, "quant_method", "fp8");
        json_t *b = json_array();
        json_array_append_new(b, json_integer(c->weight_block[0]));
        json_array_append_new(b, json_integer(c->weight_block[1]));
        json_object_set_new(q, "weight_block_size", b);
        if (c->scale_ue8m0) set_str(q, "scale_fmt", "ue8m0");
        json_object_set_new(o, "quantization_config", q);
    }
    return o;
}
