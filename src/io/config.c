/* config.c - config.json -> di_model_config: parsing, transformers 5.17 defaults, validation.
 *
 * Parsing only checks JSON types and spellings; every range / consistency rule lives in
 * di_config_validate so that mkmodel (which fills the struct itself) gets the same checks.
 * Messages name the file and the config.json field ("config.json: field 'n_group': ...").
 * RoPE parameters: `rope_scaling` wins over `rope_parameters` when both are present (HF
 * convert_rope_params_to_dict), `rope_theta` inside the dict wins over the top-level one, a
 * missing yarn original_max_position_embeddings is max_position_embeddings, a missing yarn
 * factor is max_position_embeddings / original_max_position_embeddings. */
#include "io/config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json_util.h"
#include "core/status.h"

const char *di_arch_name(di_arch a) {
    switch (a) {
    case DI_ARCH_DEEPSEEK_V2: return "deepseek_v2";
    case DI_ARCH_DEEPSEEK_V3: return "deepseek_v3";
    case DI_ARCH_DEEPSEEK_V32: return "deepseek_v32";
    }
    return "?";
}

const char *di_topk_method_name(di_topk_method m) {
    switch (m) {
    case DI_TOPK_NOAUX_TC: return "noaux_tc";
    case DI_TOPK_GREEDY: return "greedy";
    case DI_TOPK_GROUP_LIMITED_GREEDY: return "group_limited_greedy";
    }
    return "?";
}

const char *di_score_func_name(di_score_func f) { return f == DI_SCORE_SOFTMAX ? "softmax" : "sigmoid"; }

void di_config_defaults(di_arch arch, di_model_config *c) {
    memset(c, 0, sizeof *c);
    c->arch = arch;
    snprintf(c->model_type, sizeof c->model_type, "%s", di_arch_name(arch));
    c->rms_norm_eps = 1e-6;
    c->rope.type = DI_ROPE_DEFAULT;
    c->rope.theta = 10000.0;
    c->rope.factor = 1.0;
    c->rope.beta_fast = 32.0;
    c->rope.beta_slow = 1.0;
    c->rope.truncate = 1;
    c->rope.interleave = 1;
    c->tie_word_embeddings = 0;
    c->moe_layer_freq = 1;
    c->torch_dtype = DI_DTYPE_BF16;
    c->weight_block[0] = c->weight_block[1] = 128;
    c->kv_lora_rank = 512;
    c->qk_nope_head_dim = 128;
    c->qk_rope_head_dim = 64;
    c->v_head_dim = 128;
    if (arch == DI_ARCH_DEEPSEEK_V2) { /* configuration_deepseek_v2.py */
        c->vocab_size = 102400;
        c->hidden_size = 4096;
        c->intermediate_size = 11008;
        c->moe_intermediate_size = 1407;
        c->num_hidden_layers = 32;
        c->num_attention_heads = 32;
        c->q_lora_rank = 1536;
        c->n_routed_experts = 64;
        c->n_shared_experts = 2;
        c->num_experts_per_tok = 0;   /* None in HF: must be given */
        c->n_group = 1;               /* None in HF */
        c->topk_group = 1;
        c->topk_method = DI_TOPK_GREEDY;
        c->scoring_func = DI_SCORE_SOFTMAX;
        c->norm_topk_prob = 0;
        c->routed_scaling_factor = 1.0;
        c->first_k_dense_replace = 0;
        c->max_position_embeddings = 2048;
        c->bos_token_id = 1;
        c->n_eos = 1;
        c->eos_token_ids[0] = 2;
        c->num_nextn_predict_layers = 0;
    } else { /* configuration_deepseek_v3.py / _v32.py */
        c->vocab_size = 129280;
        c->hidden_size = 7168;
        c->intermediate_size = 18432;
        c->moe_intermediate_size = 2048;
        c->num_hidden_layers = 61;
        c->num_attention_heads = 128;
        c->q_lora_rank = 1536;
        c->n_routed_experts = 256;
        c->n_shared_experts = 1;
        c->num_experts_per_tok = 8;
        c->n_group = 8;
        c->topk_group = 4;
        c->topk_method = DI_TOPK_NOAUX_TC;
        c->scoring_func = DI_SCORE_SIGMOID;
        c->norm_topk_prob = 1;
        c->routed_scaling_factor = 2.5;
        c->first_k_dense_replace = 3;
        c->bos_token_id = 0;
        c->n_eos = 1;
        c->eos_token_ids[0] = 1;
        if (arch == DI_ARCH_DEEPSEEK_V3) {
            c->max_position_embeddings = 4096;
            c->num_nextn_predict_layers = 1;   /* num_mtp_layers = 1 */
        } else {
            c->max_position_embeddings = 163840;
            c->num_nextn_predict_layers = 0;
            c->index_n_heads = 64;
            c->index_head_dim = 128;
            c->index_topk = 2048;
        }
    }
}

/* ---- typed field readers (absent or null -> untouched unless noted) ---- */

static di_status get_int(const json_t *o, const char *key, const char *where, int *out) {
    int64_t v;
    const json_t *j = json_object_get(o, key);
    if (!j || json_is_null(j)) return DI_OK;
    if (json_is_real(j) && !(fabs(json_real_value(j)) < 2147483648.0)) /* before any float->int conversion */
        return di_error(DI_ERR_FORMAT, "%s: field '%s': expected a 32-bit integer, got %g", where, key, json_real_value(j));
    DI_TRY(di_json_opt_int(o, key, where, &v));
    if (v < INT32_MIN || v > INT32_MAX)
        return di_error(DI_ERR_FORMAT, "%s: field '%s': value %lld does not fit a 32-bit integer", where, key, (long long)v);
    *out = (int)v;
    return DI_OK;
}

/* An integer field where JSON null means 0 (q_lora_rank: null = no q-LoRA). */
static di_status get_int_null0(const json_t *o, const char *key, const char *where, int *out) {
    const json_t *j = json_object_get(o, key);
    if (j && json_is_null(j)) { *out = 0; return DI_OK; }
    return get_int(o, key, where, out);
}

static di_status get_double(const json_t *o, const char *key, const char *where, double *out) {
    DI_TRY(di_json_opt_double(o, key, where, out));
    if (!isfinite(*out))
        return di_error(DI_ERR_FORMAT, "%s: field '%s': expected a finite number", where, key);
    return DI_OK;
}

static di_status get_bool(const json_t *o, const char *key, const char *where, int *out) {
    return di_json_opt_bool(o, key, where, out);
}

/* A field whose only supported value is `want` (e.g. hidden_act "silu"). */
static di_status require_string(const json_t *o, const char *key, const char *where, const char *want) {
    const char *s = NULL;
    DI_TRY(di_json_opt_string(o, key, where, &s));
    if (s && strcmp(s, want) != 0)
        return di_error(DI_ERR_UNSUPPORTED, "%s: field '%s': only \"%s\" is supported, got \"%s\"", where, key, want, s);
    return DI_OK;
}

static di_status require_false(const json_t *o, const char *key, const char *where) {
    int b = 0;
    DI_TRY(get_bool(o, key, where, &b));
    if (b) return di_error(DI_ERR_UNSUPPORTED, "%s: field '%s': only false is supported", where, key);
    return DI_OK;
}

static di_status parse_dtype(const json_t *root, const char *where, di_model_config *c) {
    const char *keys[2] = {"dtype", "torch_dtype"}; /* transformers v5 writes `dtype` */
    for (int k = 0; k < 2; k++) {
        const char *s = NULL;
        DI_TRY(di_json_opt_string(root, keys[k], where, &s));
        if (!s) continue;
        if (!strcmp(s, "bfloat16")) c->torch_dtype = DI_DTYPE_BF16;
        else if (!strcmp(s, "float16")) c->torch_dtype = DI_DTYPE_F16;
        else if (!strcmp(s, "float32")) c->torch_dtype = DI_DTYPE_F32;
        else
            return di_error(DI_ERR_FORMAT, "%s: field '%s': expected \"bfloat16\", \"float16\" or \"float32\", got \"%s\"",
                            where, keys[k], s);
        return DI_OK;
    }
    return DI_OK;
}

static di_status parse_eos(const json_t *root, const char *where, di_model_config *c) {
    const json_t *j = json_object_get(root, "eos_token_id");
    if (!j) return DI_OK;
    if (json_is_null(j)) { c->n_eos = 0; return DI_OK; }
    if (json_is_integer(j)) {
        json_int_t v = json_integer_value(j);
        if (v < 0 || v > INT32_MAX)
            return di_error(DI_ERR_FORMAT, "%s: field 'eos_token_id': expected a token id >= 0, got %lld", where, (long long)v);
        c->n_eos = 1;
        c->eos_token_ids[0] = (int)v;
        return DI_OK;
    }
    if (!json_is_array(j))
        return di_error(DI_ERR_FORMAT, "%s: field 'eos_token_id': expected an integer or a list of integers, got %s",
                        where, di_json_type_name(j));
    size_t n = json_array_size(j);
    if (n == 0 || n > DI_MAX_EOS_IDS)
        return di_error(DI_ERR_FORMAT, "%s: field 'eos_token_id': expected 1 to %d ids, got %zu", where, DI_MAX_EOS_IDS, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(j, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return di_error(DI_ERR_FORMAT, "%s: field 'eos_token_id'[%zu]: expected a token id >= 0", where, i);
        c->eos_token_ids[i] = (int)json_integer_value(e);
    }
    c->n_eos = (int)n;
    return DI_OK;
}

static di_status parse_bos(const json_t *root, const char *where, di_model_config *c) {
    const json_t *j = json_object_get(root, "bos_token_id");
    if (j && json_is_null(j)) { c->bos_token_id = -1; return DI_OK; }
    return get_int(root, "bos_token_id", where, &c->bos_token_id);
}

/* rope_scaling (v4) or rope_parameters (v5), plus top-level rope_theta. */
static di_status parse_rope(const json_t *root, const char *where, di_model_config *c) {
    char w[512];
    const json_t *rs = json_object_get(root, "rope_scaling");
    const char *name = "rope_scaling";
    if (!rs || json_is_null(rs) || (json_is_object(rs) && json_object_size(rs) == 0)) {
        rs = json_object_get(root, "rope_parameters");
        name = "rope_parameters";
    }
    DI_TRY(get_double(root, "rope_theta", where, &c->rope.theta));
    c->rope.type = DI_ROPE_DEFAULT;
    if (!rs || json_is_null(rs)) return DI_OK;
    if (!json_is_object(rs))
        return di_error(DI_ERR_FORMAT, "%s: field '%s': expected an object, got %s", where, name, di_json_type_name(rs));
    snprintf(w, sizeof w, "%s: field '%s'", where, name);
    const char *type = NULL;
    DI_TRY(di_json_opt_string(rs, "type", w, &type));
    DI_TRY(di_json_opt_string(rs, "rope_type", w, &type)); /* rope_type wins over the v4 `type` */
    DI_TRY(get_double(rs, "rope_theta", w, &c->rope.theta));
    double prf = 1.0;
    DI_TRY(get_double(rs, "partial_rotary_factor", w, &prf));
    if (prf != 1.0)
        return di_error(DI_ERR_UNSUPPORTED, "%s: 'partial_rotary_factor' %g is not supported (expected 1)", w, prf);
    if (!type || !strcmp(type, "default")) return DI_OK;
    if (strcmp(type, "yarn") != 0)
        return di_error(DI_ERR_UNSUPPORTED, "%s: rope type \"%s\" is not supported (expected \"default\" or \"yarn\")", w, type);
    c->rope.type = DI_ROPE_YARN;
    /* Position limits first: the factor defaults to their ratio. */
    c->rope.original_max_position = c->max_position_embeddings;
    DI_TRY(get_int(rs, "original_max_position_embeddings", w, &c->rope.original_max_position));
    c->rope.factor = 0;
    DI_TRY(get_double(rs, "factor", w, &c->rope.factor));
    if (c->rope.factor == 0 && c->rope.original_max_position > 0)
        c->rope.factor = (double)c->max_position_embeddings / (double)c->rope.original_max_position;
    double bf = 0, bs = 0;
    DI_TRY(get_double(rs, "beta_fast", w, &bf));
    DI_TRY(get_double(rs, "beta_slow", w, &bs));
    c->rope.beta_fast = bf != 0 ? bf : 32.0; /* HF: `get("beta_fast") or 32` */
    c->rope.beta_slow = bs != 0 ? bs : 1.0;
    DI_TRY(get_double(rs, "mscale", w, &c->rope.mscale));
    DI_TRY(get_double(rs, "mscale_all_dim", w, &c->rope.mscale_all_dim));
    DI_TRY(get_double(rs, "attention_factor", w, &c->rope.attention_factor));
    DI_TRY(get_bool(rs, "truncate", w, &c->rope.truncate));
    return DI_OK;
}

static di_status parse_quant(const json_t *root, const char *where, di_model_config *c) {
    const json_t *q = json_object_get(root, "quantization_config");
    if (!q || json_is_null(q)) return DI_OK;
    char w[512];
    snprintf(w, sizeof w, "%s: field 'quantization_config'", where);
    if (!json_is_object(q)) return di_error(DI_ERR_FORMAT, "%s: expected an object, got %s", w, di_json_type_name(q));
    const char *method = NULL, *fmt = NULL, *scale_fmt = NULL, *act = NULL;
    DI_TRY(di_json_req_string(q, "quant_method", w, &method));
    if (strcmp(method, "fp8") != 0)
        return di_error(DI_ERR_UNSUPPORTED, "%s: quant_method \"%s\" is not supported (expected \"fp8\")", w, method);
    DI_TRY(di_json_opt_string(q, "fmt", w, &fmt));
    if (fmt && strcmp(fmt, "e4m3") != 0)
        return di_error(DI_ERR_UNSUPPORTED, "%s: fmt \"%s\" is not supported (expected \"e4m3\")", w, fmt);
    DI_TRY(di_json_opt_string(q, "activation_scheme", w, &act));
    if (act && strcmp(act, "dynamic") != 0)
        return di_error(DI_ERR_UNSUPPORTED, "%s: activation_scheme \"%s\" is not supported (expected \"dynamic\")", w, act);
    DI_TRY(di_json_opt_string(q, "scale_fmt", w, &scale_fmt));
    if (scale_fmt && strcmp(scale_fmt, "ue8m0") != 0)
        return di_error(DI_ERR_UNSUPPORTED, "%s: scale_fmt \"%s\" is not supported (expected \"ue8m0\" or absent)", w, scale_fmt);
    c->scale_ue8m0 = scale_fmt != NULL;
    const json_t *b = json_object_get(q, "weight_block_size");
    if (b && !json_is_null(b)) {
        if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_integer(json_array_get(b, 0)) ||
            !json_is_integer(json_array_get(b, 1)))
            return di_error(DI_ERR_FORMAT, "%s: 'weight_block_size': expected a list of two integers", w);
        for (int i = 0; i < 2; i++) {
            json_int_t v = json_integer_value(json_array_get(b, (size_t)i));
            if (v < 1 || v > 65536)
                return di_error(DI_ERR_FORMAT, "%s: 'weight_block_size'[%d]: expected 1..65536, got %lld", w, i, (long long)v);
            c->weight_block[i] = (int)v;
        }
    }
    c->fp8 = 1;
    return DI_OK;
}

/* V3.2 `mlp_layer_types`, if given, must be the pattern first_k_dense_replace implies. */
static di_status check_mlp_layer_types(const json_t *root, const char *where, const di_model_config *c) {
    const json_t *t = json_object_get(root, "mlp_layer_types");
    if (!t || json_is_null(t)) return DI_OK;
    if (!json_is_array(t) || json_array_size(t) != (size_t)c->num_hidden_layers)
        return di_error(DI_ERR_FORMAT, "%s: field 'mlp_layer_types': expected a list of %d strings", where, c->num_hidden_layers);
    for (size_t i = 0; i < json_array_size(t); i++) {
        const char *s = json_string_value(json_array_get(t, i));
        const char *want = (int)i < c->first_k_dense_replace ? "dense" : "sparse";
        if (!s || strcmp(s, want) != 0)
            return di_error(DI_ERR_UNSUPPORTED, "%s: field 'mlp_layer_types'[%zu]: expected \"%s\" (only the pattern of "
                            "first_k_dense_replace = %d is supported)", where, i, want, c->first_k_dense_replace);
    }
    return DI_OK;
}

static di_status parse_routing(const json_t *root, const char *where, di_model_config *c) {
    const char *tm = NULL, *sf = NULL;
    DI_TRY(di_json_opt_string(root, "topk_method", where, &tm));
    DI_TRY(di_json_opt_string(root, "scoring_func", where, &sf));
    if (c->arch == DI_ARCH_DEEPSEEK_V2) {
        if (tm) {
            if (!strcmp(tm, "greedy")) c->topk_method = DI_TOPK_GREEDY;
            else if (!strcmp(tm, "group_limited_greedy")) c->topk_method = DI_TOPK_GROUP_LIMITED_GREEDY;
            else
                return di_error(DI_ERR_UNSUPPORTED, "%s: field 'topk_method': deepseek_v2 supports \"greedy\" or "
                                "\"group_limited_greedy\", got \"%s\"", where, tm);
        }
        if (sf && strcmp(sf, "softmax") != 0)
            return di_error(DI_ERR_UNSUPPORTED, "%s: field 'scoring_func': deepseek_v2 routes with \"softmax\", got \"%s\"", where, sf);
        c->scoring_func = DI_SCORE_SOFTMAX;
        /* n_group / topk_group are None by default in HF; null keeps our 1 */
        DI_TRY(get_int(root, "n_group", where, &c->n_group));
        DI_TRY(get_int(root, "topk_group", where, &c->topk_group));
        int ntp = 0;
        DI_TRY(get_bool(root, "norm_topk_prob", where, &ntp)); /* type-checked, ignored as HF V2 does */
        c->norm_topk_prob = 0;
    } else {
        if (tm && strcmp(tm, "noaux_tc") != 0)
            return di_error(DI_ERR_UNSUPPORTED, "%s: field 'topk_method': %s routes with \"noaux_tc\", got \"%s\"",
                            where, c->model_type, tm);
        if (sf && strcmp(sf, "sigmoid") != 0)
            return di_error(DI_ERR_UNSUPPORTED, "%s: field 'scoring_func': %s routes with \"sigmoid\", got \"%s\"",
                            where, c->model_type, sf);
        c->topk_method = DI_TOPK_NOAUX_TC;
        c->scoring_func = DI_SCORE_SIGMOID;
        DI_TRY(get_int(root, "n_group", where, &c->n_group));
        DI_TRY(get_int(root, "topk_group", where, &c->topk_group));
        DI_TRY(get_bool(root, "norm_topk_prob", where, &c->norm_topk_prob));
    }
    return DI_OK;
}

di_status di_config_from_json(const json_t *root, const char *where, di_model_config *c) {
    if (!json_is_object(root))
        return di_error(DI_ERR_FORMAT, "%s: expected a JSON object, got %s", where, di_json_type_name(root));
    const char *mt = NULL;
    DI_TRY(di_json_req_string(root, "model_type", where, &mt));
    di_arch arch;
    if (!strcmp(mt, "deepseek_v2")) arch = DI_ARCH_DEEPSEEK_V2;
    else if (!strcmp(mt, "deepseek_v3") || !strcmp(mt, "kimi_k2")) arch = DI_ARCH_DEEPSEEK_V3;
    else if (!strcmp(mt, "deepseek_v32")) arch = DI_ARCH_DEEPSEEK_V32;
    else
        return di_error(DI_ERR_UNSUPPORTED, "%s: field 'model_type': \"%s\" is not supported (expected \"deepseek_v2\", "
                        "\"deepseek_v3\" or \"deepseek_v32\")", where, mt);
    di_config_defaults(arch, c);
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);

    static const struct { const char *key; size_t off; } ints[] = {
        {"vocab_size", offsetof(di_model_config, vocab_size)},
        {"hidden_size", offsetof(di_model_config, hidden_size)},
        {"intermediate_size", offsetof(di_model_config, intermediate_size)},
        {"moe_intermediate_size", offsetof(di_model_config, moe_intermediate_size)},
        {"num_hidden_layers", offsetof(di_model_config, num_hidden_layers)},
        {"num_attention_heads", offsetof(di_model_config, num_attention_heads)},
        {"kv_lora_rank", offsetof(di_model_config, kv_lora_rank)},
        {"qk_nope_head_dim", offsetof(di_model_config, qk_nope_head_dim)},
        {"qk_rope_head_dim", offsetof(di_model_config, qk_rope_head_dim)},
        {"v_head_dim", offsetof(di_model_config, v_head_dim)},
        {"n_routed_experts", offsetof(di_model_config, n_routed_experts)},
        {"num_experts_per_tok", offsetof(di_model_config, num_experts_per_tok)},
        {"first_k_dense_replace", offsetof(di_model_config, first_k_dense_replace)},
        {"moe_layer_freq", offsetof(di_model_config, moe_layer_freq)},
        {"max_position_embeddings", offsetof(di_model_config, max_position_embeddings)},
        {"num_nextn_predict_layers", offsetof(di_model_config, num_nextn_predict_layers)},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        DI_TRY(get_int(root, ints[i].key, where, (int *)((char *)c + ints[i].off)));
    DI_TRY(get_int_null0(root, "q_lora_rank", where, &c->q_lora_rank));
    DI_TRY(get_int_null0(root, "n_shared_experts", where, &c->n_shared_experts));
    int kvh = c->num_attention_heads;
    DI_TRY(get_int(root, "num_key_value_heads", where, &kvh));
    if (kvh != c->num_attention_heads)
        return di_error(DI_ERR_UNSUPPORTED, "%s: field 'num_key_value_heads': MLA needs it equal to num_attention_heads "
                        "(%d), got %d", where, c->num_attention_heads, kvh);
    DI_TRY(get_double(root, "routed_scaling_factor", where, &c->routed_scaling_factor));
    DI_TRY(get_double(root, "rms_norm_eps", where, &c->rms_norm_eps));
    DI_TRY(get_bool(root, "tie_word_embeddings", where, &c->tie_word_embeddings));
    DI_TRY(parse_routing(root, where, c));
    DI_TRY(parse_bos(root, where, c));
    DI_TRY(parse_eos(root, where, c));
    DI_TRY(parse_dtype(root, where, c));
    DI_TRY(parse_rope(root, where, c));
    if (arch == DI_ARCH_DEEPSEEK_V3) DI_TRY(get_bool(root, "rope_interleave", where, &c->rope.interleave));
    DI_TRY(parse_quant(root, where, c));
    DI_TRY(require_string(root, "hidden_act", where, "silu"));
    DI_TRY(require_false(root, "attention_bias", where));
    DI_TRY(require_false(root, "mlp_bias", where));
    if (arch == DI_ARCH_DEEPSEEK_V32) {
        DI_TRY(get_int(root, "index_n_heads", where, &c->index_n_heads));
        DI_TRY(get_int(root, "index_head_dim", where, &c->index_head_dim));
        DI_TRY(get_int(root, "index_topk", where, &c->index_topk));
        DI_TRY(check_mlp_layer_types(root, where, c));
    }
    return di_config_validate(c, where);
}

di_status di_config_load(const char *path, di_model_config *cfg) {
    json_t *root = NULL;
    DI_TRY(di_json_load_file(path, &root));
    di_status s = di_config_from_json(root, path, cfg);
    json_decref(root);
    return s;
}

/* ---- validation ---- */

#define RANGE(field, lo, hi) do { long long v_ = (long long)c->field; \
    if (v_ < (long long)(lo) || v_ > (long long)(hi)) \
        return di_error(DI_ERR_FORMAT, "%s: field '" #field "': expected an integer in [%lld, %lld], got %lld", \
                        where, (long long)(lo), (long long)(hi), v_); } while (0)

static di_status validate_moe(const di_model_config *c, const char *where) {
    RANGE(n_routed_experts, 1, DI_CONFIG_MAX_EXPERTS);
    RANGE(n_shared_experts, 0, 1024);
    RANGE(num_experts_per_tok, 1, c->n_routed_experts);
    RANGE(moe_intermediate_size, 1, DI_CONFIG_MAX_DIM);
    RANGE(n_group, 1, c->n_routed_experts);
    RANGE(topk_group, 1, c->n_group);
    if (c->n_routed_experts % c->n_group != 0)
        return di_error(DI_ERR_FORMAT, "%s: field 'n_group': %d does not divide n_routed_experts (%d)", where, c->n_group,
                        c->n_routed_experts);
    int per_group = c->n_routed_experts / c->n_group;
    if (c->topk_method == DI_TOPK_NOAUX_TC && per_group < 2)
        return di_error(DI_ERR_FORMAT, "%s: field 'n_group': noaux_tc scores a group by its two best experts, so every "
                        "group needs >= 2 experts (n_routed_experts %d / n_group %d)", where, c->n_routed_experts, c->n_group);
    if (c->topk_method != DI_TOPK_GREEDY && c->topk_group * per_group < c->num_experts_per_tok)
        return di_error(DI_ERR_FORMAT, "%s: field 'topk_group': %d groups of %d experts hold fewer than "
                        "num_experts_per_tok (%d) experts", where, c->topk_group, per_group, c->num_experts_per_tok);
    if (c->arch == DI_ARCH_DEEPSEEK_V2 && c->topk_method == DI_TOPK_NOAUX_TC)
        return di_error(DI_ERR_UNSUPPORTED, "%s: field 'topk_method': deepseek_v2 does not route with noaux_tc", where);
    if (c->arch != DI_ARCH_DEEPSEEK_V2 && (c->topk_method != DI_TOPK_NOAUX_TC || c->scoring_func != DI_SCORE_SIGMOID))
        return di_error(DI_ERR_UNSUPPORTED, "%s: field 'topk_method': %s routes with sigmoid noaux_tc", where, c->model_type);
    if (c->arch == DI_ARCH_DEEPSEEK_V2 && c->scoring_func != DI_SCORE_SOFTMAX)
        return di_error(DI_ERR_UNSUPPORTED, "%s: field 'scoring_func': deepseek_v2 routes with softmax", where);
    if (!isfinite(c->routed_scaling_factor) || c->routed_scaling_factor <= 0 || c->routed_scaling_factor > 1e6)
        return di_error(DI_ERR_FORMAT, "%s: field 'routed_scaling_factor': expected a positive number, got %g", where,
                        c->routed_scaling_factor);
    RANGE(first_k_dense_replace, 0, DI_CONFIG_MAX_LAYERS);
    if (c->moe_layer_freq != 1)
        return di_error(DI_ERR_UNSUPPORTED, "%s: field 'moe_layer_freq': only 1 is supported (got %d)", where, c->moe_layer_freq);
    return DI_OK;
}

static di_status validate_rope(const di_model_config *c, const char *where) {
    const di_rope_config *r = &c->rope;
    if (!isfinite(r->theta) || r->theta <= 1.0)
        return di_error(DI_ERR_FORMAT, "%s: field 'rope_theta': expected a number > 1, got %g", where, r->theta);
    if (r->type == DI_ROPE_DEFAULT) return DI_OK;
    if (r->type != DI_ROPE_YARN) return di_error(DI_ERR_FORMAT, "%s: field 'rope_scaling': unknown rope type", where);
    if (r->original_max_position < 1 || r->original_max_position > INT32_MAX / 2)
        return di_error(DI_ERR_FORMAT, "%s: field 'rope_scaling.original_max_position_embeddings': expected a positive "
                        "integer, got %d", where, r->original_max_position);
    if (!isfinite(r->factor) || r->factor < 1.0 || r->factor > 1e6)
        return di_error(DI_ERR_FORMAT, "%s: field 'rope_scaling.factor': expected a number >= 1, got %g", where, r->factor);
    if (!isfinite(r->beta_fast) || !isfinite(r->beta_slow) || r->beta_fast <= 0 || r->beta_slow <= 0 ||
        r->beta_fast < r->beta_slow)
        return di_error(DI_ERR_FORMAT, "%s: field 'rope_scaling': expected beta_fast >= beta_slow > 0, got beta_fast %g, "
                        "beta_slow %g", where, r->beta_fast, r->beta_slow);
    if (!isfinite(r->mscale) || !isfinite(r->mscale_all_dim) || r->mscale < 0 || r->mscale_all_dim < 0 ||
        r->mscale > 1e3 || r->mscale_all_dim > 1e3)
        return di_error(DI_ERR_FORMAT, "%s: field 'rope_scaling': expected mscale and mscale_all_dim in [0, 1000], got %g "
                        "and %g", where, r->mscale, r->mscale_all_dim);
    if (!isfinite(r->attention_factor) || r->attention_factor < 0)
        return di_error(DI_ERR_FORMAT, "%s: field 'rope_scaling.attention_factor': expected a number >= 0, got %g", where,
                        r->attention_factor);
    return DI_OK;
}

static int token_ok(const di_model_config *c, int id) { return id >= 0 && id < c->vocab_size; }

di_status di_config_validate(const di_model_config *c, const char *where) {
    RANGE(vocab_size, 1, DI_CONFIG_MAX_VOCAB);
    RANGE(hidden_size, 1, DI_CONFIG_MAX_DIM);
    RANGE(intermediate_size, 1, DI_CONFIG_MAX_DIM);
    RANGE(num_hidden_layers, 1, DI_CONFIG_MAX_LAYERS);
    RANGE(num_attention_heads, 1, DI_CONFIG_MAX_HEADS);
    RANGE(q_lora_rank, 0, DI_CONFIG_MAX_DIM);
    RANGE(kv_lora_rank, 1, DI_CONFIG_MAX_DIM);
    RANGE(qk_nope_head_dim, 1, DI_CONFIG_MAX_DIM);
    RANGE(qk_rope_head_dim, 2, DI_CONFIG_MAX_DIM);
    RANGE(v_head_dim, 1, DI_CONFIG_MAX_DIM);
    RANGE(max_position_embeddings, 1, INT32_MAX / 2);
    RANGE(num_nextn_predict_layers, 0, 64);
    if (c->qk_rope_head_dim % 2 != 0)
        return di_error(DI_ERR_FORMAT, "%s: field 'qk_rope_head_dim': expected an even number (RoPE rotates pairs), got %d",
                        where, c->qk_rope_head_dim);
    if (c->arch == DI_ARCH_DEEPSEEK_V2 && c->hidden_size % c->num_attention_heads != 0)
        return di_error(DI_ERR_FORMAT, "%s: field 'hidden_size': deepseek_v2 needs it to be a multiple of "
                        "num_attention_heads (%d), got %d", where, c->num_attention_heads, c->hidden_size);
    if (c->arch == DI_ARCH_DEEPSEEK_V32 && c->q_lora_rank == 0)
        return di_error(DI_ERR_FORMAT, "%s: field 'q_lora_rank': deepseek_v32 needs q-LoRA (its indexer reads the q latent)", where);
    if (!isfinite(c->rms_norm_eps) || c->rms_norm_eps <= 0 || c->rms_norm_eps >= 1)
        return di_error(DI_ERR_FORMAT, "%s: field 'rms_norm_eps': expected a number in (0, 1), got %g", where, c->rms_norm_eps);
    DI_TRY(validate_moe(c, where));
    DI_TRY(validate_rope(c, where));
    if (c->bos_token_id != -1 && !token_ok(c, c->bos_token_id))
        return di_error(DI_ERR_FORMAT, "%s: field 'bos_token_id': %d is outside the vocabulary [0, %d)", where,
                        c->bos_token_id, c->vocab_size);
    if (c->n_eos < 0 || c->n_eos > DI_MAX_EOS_IDS)
        return di_error(DI_ERR_FORMAT, "%s: field 'eos_token_id': expected at most %d ids", where, DI_MAX_EOS_IDS);
    for (int i = 0; i < c->n_eos; i++)
        if (!token_ok(c, c->eos_token_ids[i]))
            return di_error(DI_ERR_FORMAT, "%s: field 'eos_token_id': %d is outside the vocabulary [0, %d)", where,
                            c->eos_token_ids[i], c->vocab_size);
    if (c->torch_dtype != DI_DTYPE_BF16 && c->torch_dtype != DI_DTYPE_F16 && c->torch_dtype != DI_DTYPE_F32)
        return di_error(DI_ERR_FORMAT, "%s: field 'torch_dtype': expected bfloat16, float16 or float32", where);
    if (c->fp8 && (c->weight_block[0] < 1 || c->weight_block[1] < 1 || c->weight_block[0] > 65536 ||
                   c->weight_block[1] > 65536))
        return di_error(DI_ERR_FORMAT, "%s: field 'quantization_config.weight_block_size': expected positive sizes", where);
    if (c->arch == DI_ARCH_DEEPSEEK_V32) {
        RANGE(index_n_heads, 1, DI_CONFIG_MAX_HEADS);
        RANGE(index_head_dim, 2, DI_CONFIG_MAX_DIM);
        RANGE(index_topk, 1, INT32_MAX / 2);
        if (c->index_head_dim < c->qk_rope_head_dim)
            return di_error(DI_ERR_FORMAT, "%s: field 'index_head_dim': %d is smaller than qk_rope_head_dim (%d), which "
                            "the indexer rotates", where, c->index_head_dim, c->qk_rope_head_dim);
    }
    return DI_OK;
}

int di_config_layer_is_moe(const di_model_config *c, int layer) {
    return layer >= c->first_k_dense_replace && c->n_routed_experts > 0;
}
