/* test_config.c - config.json parsing (both RoPE spellings, defaults per model_type, eos forms,
 * quantization_config), validation errors that name the field, and the derived RoPE / softmax
 * quantities against numbers printed by transformers 5.17 (tools/golden/rope_reference.py). */
#include <math.h>
#include <string.h>

#include "core/json_util.h"
#include "core/status.h"
#include "io/config.h"
#include "io/mkmodel.h"
#include "test_util.h"

/* Parses `text` as config.json; returns the status. */
static di_status parse(const char *text, di_model_config *c) {
    json_t *root = NULL;
    di_status s = di_json_loadb(text, strlen(text), "test/config.json", &root);
    if (s != DI_OK) return s;
    s = di_config_from_json(root, "test/config.json", c);
    json_decref(root);
    return s;
}

/* Expects parsing to fail with a message containing every NULL-terminated fragment. */
static void expect_error(const char *text, di_status code, const char *frag1, const char *frag2) {
    di_model_config c;
    di_status s = parse(text, &c);
    CHECK_MSG(s == code, "expected %s, got %s (%s) for %s", di_status_name(code), di_status_name(s), di_last_error(), text);
    CHECK_MSG(strstr(di_last_error(), "test/config.json") != NULL, "no file name in: %s", di_last_error());
    if (frag1) CHECK_MSG(strstr(di_last_error(), frag1) != NULL, "'%s' not in: %s", frag1, di_last_error());
    if (frag2) CHECK_MSG(strstr(di_last_error(), frag2) != NULL, "'%s' not in: %s", frag2, di_last_error());
}

static void check_rel(double got, double want, double rel, const char *what, int i) {
    g_test_checks++;
    if (!(fabs(got - want) <= rel * fabs(want))) {
        g_test_failures++;
        fprintf(stderr, "%s[%d] = %.10g, transformers says %.10g\n", what, i, got, want);
    }
}

/* Numbers printed by tools/golden/rope_reference.py (transformers 5.17.0). */
static const double k_v3_inv_freq[32] = {
    1.0, 0.7498942017555237, 0.5623413324356079, 0.4216965138912201, 0.3162277638912201, 0.23713736236095428,
    0.17782793939113617, 0.1333521455526352, 0.10000000149011612, 0.07498941570520401, 0.05623412877321243,
    0.039006926119327545, 0.026879360899329185, 0.01837814413011074, 0.012447956018149853, 0.0083345090970397,
    0.005500000435858965, 0.0035619973205029964, 0.002249365206807852, 0.0013705134624615312, 0.0007905694073997438,
    0.0004149904125370085, 0.00017782794020604342, 3.333803397254087e-05, 2.499999936844688e-05,
    1.8747354260995053e-05, 1.4058532542549074e-05, 1.0542412383074407e-05, 7.905694474175107e-06,
    5.928434347879374e-06, 4.445698323252145e-06, 3.3338035336782923e-06};
static const double k_nomscale_inv_freq[16] = {
    1.0, 0.556778609752655, 0.2952757477760315, 0.14442992210388184, 0.060098692774772644, 0.03585187345743179,
    0.02431231178343296, 0.016486961394548416, 0.011180340312421322, 0.007581748999655247, 0.005141428206115961,
    0.0034865678753703833, 0.0023643539752811193, 0.00160334468819201, 0.0010872796410694718, 0.0007373193511739373};
static const double k_small_inv_freq[8] = {1.0, 0.23717081546783447, 0.04999999701976776, 0.007905694656074047,
                                           0.0024999999441206455, 0.0007905694656074047, 0.0002500000118743628,
                                           7.905694656074047e-05};
static const double k_default_inv_freq[12] = {
    1.0, 0.49175918102264404, 0.2418271005153656, 0.1189207136631012, 0.05848035216331482, 0.028758253902196884,
    0.014142136089503765, 0.006954526528716087, 0.0034199513029307127, 0.0016817927826195955, 0.000827037263661623,
    0.00040670306771062315};

#define SMALL "\"hidden_size\": 64, \"intermediate_size\": 64, \"moe_intermediate_size\": 32, \"num_hidden_layers\": 1, " \
    "\"num_attention_heads\": 2, \"n_routed_experts\": 8, \"n_group\": 2, \"topk_group\": 1, \"num_experts_per_tok\": 2, " \
    "\"kv_lora_rank\": 32, \"q_lora_rank\": null, \"v_head_dim\": 16, \"vocab_size\": 64"

static void test_v3_real(void) {
    /* the published DeepSeek-V3 config.json (v4 rope_scaling spelling) */
    const char *text =
        "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", \"vocab_size\": 129280,"
        "\"hidden_size\": 7168, \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_hidden_layers\": 61,"
        "\"num_nextn_predict_layers\": 1, \"num_attention_heads\": 128, \"num_key_value_heads\": 128,"
        "\"n_shared_experts\": 1, \"n_routed_experts\": 256, \"ep_size\": 1, \"routed_scaling_factor\": 2.5,"
        "\"kv_lora_rank\": 512, \"q_lora_rank\": 1536, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,"
        "\"qk_nope_head_dim\": 128, \"topk_method\": \"noaux_tc\", \"n_group\": 8, \"topk_group\": 4,"
        "\"num_experts_per_tok\": 8, \"moe_layer_freq\": 1, \"first_k_dense_replace\": 3, \"norm_topk_prob\": true,"
        "\"scoring_func\": \"sigmoid\", \"hidden_act\": \"silu\", \"max_position_embeddings\": 163840,"
        "\"initializer_range\": 0.02, \"rms_norm_eps\": 1e-06, \"use_cache\": true, \"rope_theta\": 10000,"
        "\"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,"
        "\"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}, \"attention_bias\": false,"
        "\"attention_dropout\": 0.0, \"bos_token_id\": 0, \"eos_token_id\": 1, \"tie_word_embeddings\": false,"
        "\"torch_dtype\": \"bfloat16\", \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\","
        "\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}}";
    di_model_config c;
    CHECK_OK(parse(text, &c));
    CHECK_EQ_INT(c.arch, DI_ARCH_DEEPSEEK_V3);
    CHECK_EQ_INT(c.q_lora_rank, 1536);
    CHECK_EQ_INT(c.n_group, 8);
    CHECK_EQ_INT(c.topk_method, DI_TOPK_NOAUX_TC);
    CHECK_EQ_INT(c.rope.type, DI_ROPE_YARN);
    CHECK_EQ_INT(c.rope.original_max_position, 4096);
    CHECK_EQ_INT(c.rope.interleave, 1);
    CHECK_EQ_INT(c.fp8, 1);
    CHECK_EQ_INT(c.weight_block[0], 128);
    CHECK_EQ_INT(c.scale_ue8m0, 0);
    CHECK_EQ_INT(c.num_nextn_predict_layers, 1);
    CHECK_EQ_INT(di_config_kv_width(&c), 576);
    CHECK_EQ_INT(di_config_layer_is_moe(&c, 2), 0);
    CHECK_EQ_INT(di_config_layer_is_moe(&c, 3), 1);
    CHECK_EQ_INT(di_config_layer_is_moe(&c, 61), 1);
    double inv[32], att = 0;
    di_config_rope_inv_freq(&c, inv, &att);
    for (int i = 0; i < 32; i++) check_rel(inv[i], k_v3_inv_freq[i], 2.5e-7, "v3 inv_freq", i);
    /* the spot values */
    CHECK_NEAR(inv[0], 1.0, 0);
    CHECK_NEAR(inv[10], 0.0562341, 1e-7);
    CHECK_NEAR(inv[23], 3.33380e-5, 1e-10);
    CHECK_NEAR(att, 1.0, 1e-15);
    CHECK_NEAR(di_config_softmax_scale(&c), 0.1352337788608801, 1e-15);
    CHECK_NEAR(di_config_softmax_scale(&c), 0.13523378, 1e-8);
}

static void test_v2lite(void) {
    const char *text =
        "{\"model_type\": \"deepseek_v2\", \"vocab_size\": 102400, \"hidden_size\": 2048, \"intermediate_size\": 10944,"
        "\"moe_intermediate_size\": 1408, \"num_hidden_layers\": 27, \"num_attention_heads\": 16, \"n_shared_experts\": 2,"
        "\"n_routed_experts\": 64, \"num_experts_per_tok\": 6, \"n_group\": 1, \"topk_group\": 1, \"topk_method\": \"greedy\","
        "\"scoring_func\": \"softmax\", \"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"q_lora_rank\": null,"
        "\"kv_lora_rank\": 512, \"norm_topk_prob\": false, \"routed_scaling_factor\": 1.0, \"max_position_embeddings\": 163840,"
        "\"rope_theta\": 10000, \"aux_loss_alpha\": 0.001, \"seq_aux\": true, \"rope_scaling\": {\"beta_fast\": 32,"
        "\"beta_slow\": 1, \"factor\": 40, \"mscale\": 0.707, \"mscale_all_dim\": 0.707,"
        "\"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}, \"bos_token_id\": 100000,"
        "\"eos_token_id\": 100001, \"torch_dtype\": \"bfloat16\"}";
    di_model_config c;
    CHECK_OK(parse(text, &c));
    CHECK_EQ_INT(c.arch, DI_ARCH_DEEPSEEK_V2);
    CHECK_EQ_INT(c.q_lora_rank, 0);
    CHECK_EQ_INT(c.topk_method, DI_TOPK_GREEDY);
    CHECK_EQ_INT(c.scoring_func, DI_SCORE_SOFTMAX);
    CHECK_EQ_INT(c.norm_topk_prob, 0);
    CHECK_EQ_INT(c.rope.interleave, 1);
    CHECK_EQ_INT(c.num_nextn_predict_layers, 0);
    CHECK_NEAR(c.rope.mscale, 0.707, 0);
    double inv[32], att = 0;
    di_config_rope_inv_freq(&c, inv, &att);
    for (int i = 0; i < 32; i++) check_rel(inv[i], k_v3_inv_freq[i], 2.5e-7, "v2lite inv_freq", i);
    CHECK_NEAR(att, 1.0, 1e-15);
    CHECK_NEAR(di_config_softmax_scale(&c), 0.1147213867929261, 1e-15);
    CHECK_NEAR(di_config_yarn_mscale(40, 0.707), 1.2608037774058554, 1e-15); /* python: 0.1*0.707*math.log(40)+1 */
}

static void test_rope_variants(void) {
    di_model_config c;
    double inv[32], att = 0;
    /* v5 rope_parameters, no mscale, truncate false, theta inside the dict */
    CHECK_OK(parse("{\"model_type\": \"deepseek_v3\", " SMALL ", \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 32,"
                   "\"max_position_embeddings\": 256, \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0,"
                   "\"rope_theta\": 500.0, \"original_max_position_embeddings\": 64, \"beta_fast\": 16, \"beta_slow\": 2,"
                   "\"truncate\": false}}", &c));
    CHECK_EQ_INT(c.rope.truncate, 0);
    CHECK_NEAR(c.rope.theta, 500.0, 0);
    di_config_rope_inv_freq(&c, inv, &att);
    for (int i = 0; i < 16; i++) check_rel(inv[i], k_nomscale_inv_freq[i], 2.5e-7, "nomscale inv_freq", i);
    CHECK_NEAR(att, 1.138629436111989, 1e-14);
    CHECK_NEAR(di_config_softmax_scale(&c), 0.14433756729740643, 1e-15);
    /* v4 spelling, mscale_all_dim only, defaults for beta */
    CHECK_OK(parse("{\"model_type\": \"deepseek_v3\", " SMALL ", \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 16,"
                   "\"max_position_embeddings\": 256, \"rope_theta\": 10000, \"rope_scaling\": {\"type\": \"yarn\","
                   "\"factor\": 4, \"original_max_position_embeddings\": 64, \"mscale_all_dim\": 0.8}}", &c));
    di_config_rope_inv_freq(&c, inv, &att);
    for (int i = 0; i < 8; i++) check_rel(inv[i], k_small_inv_freq[i], 2.5e-7, "small inv_freq", i);
    CHECK_NEAR(att, 1.138629436111989, 1e-14);
    CHECK_NEAR(di_config_softmax_scale(&c), 0.21816130317415047, 1e-15);
    /* default rope, top-level rope_theta */
    CHECK_OK(parse("{\"model_type\": \"deepseek_v3\", " SMALL ", \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 24,"
                   "\"rope_theta\": 5000.0}", &c));
    CHECK_EQ_INT(c.rope.type, DI_ROPE_DEFAULT);
    di_config_rope_inv_freq(&c, inv, &att);
    for (int i = 0; i < 12; i++) check_rel(inv[i], k_default_inv_freq[i], 2.5e-7, "default inv_freq", i);
    CHECK_NEAR(att, 1.0, 0);
    CHECK_NEAR(di_config_softmax_scale(&c), 0.15811388300841897, 1e-15);
    /* rope_scaling wins over rope_parameters; a yarn dict without original_max / factor */
    CHECK_OK(parse("{\"model_type\": \"deepseek_v3\", " SMALL ", \"qk_nope_head_dim\": 16, \"max_position_embeddings\": 256,"
                   "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}, \"rope_parameters\": {\"rope_type\": \"default\","
                   "\"rope_theta\": 5.0}, \"rope_theta\": 7}", &c));
    CHECK_EQ_INT(c.rope.type, DI_ROPE_YARN);
    CHECK_NEAR(c.rope.theta, 7.0, 0);
    CHECK_EQ_INT(c.rope.original_max_position, 256);
    CHECK_OK(parse("{\"model_type\": \"deepseek_v3\", " SMALL ", \"qk_nope_head_dim\": 16, \"max_position_embeddings\": 256,"
                   "\"rope_scaling\": {\"type\": \"yarn\", \"original_max_position_embeddings\": 64}}", &c));
    CHECK_NEAR(c.rope.factor, 4.0, 0);
    /* rope_interleave false is honoured for V3 only */
    CHECK_OK(parse("{\"model_type\": \"deepseek_v3\", " SMALL ", \"qk_nope_head_dim\": 16, \"rope_interleave\": false}", &c));
    CHECK_EQ_INT(c.rope.interleave, 0);
}

static void test_defaults_and_forms(void) {
    di_model_config c;
    /* an almost empty V3 config takes transformers' DeepseekV3Config defaults */
    CHECK_OK(parse("{\"model_type\": \"deepseek_v3\"}", &c));
    CHECK_EQ_INT(c.hidden_size, 7168);
    CHECK_EQ_INT(c.num_hidden_layers, 61);
    CHECK_EQ_INT(c.q_lora_rank, 1536);
    CHECK_EQ_INT(c.max_position_embeddings, 4096);
    CHECK_EQ_INT(c.first_k_dense_replace, 3);
    CHECK_EQ_INT(c.num_nextn_predict_layers, 1);
    CHECK_NEAR(c.routed_scaling_factor, 2.5, 0);
    CHECK_EQ_INT(c.bos_token_id, 0);
    CHECK_EQ_INT(c.n_eos, 1);
    CHECK_EQ_INT(c.eos_token_ids[0], 1);
    CHECK_EQ_INT(c.torch_dtype, DI_DTYPE_BF16);
    CHECK_OK(parse("{\"model_type\": \"deepseek_v32\", \"index_topk\": 512}", &c));
    CHECK_EQ_INT(c.arch, DI_ARCH_DEEPSEEK_V32);
    CHECK_EQ_INT(c.max_position_embeddings, 163840);
    CHECK_EQ_INT(c.index_n_heads, 64);
    CHECK_EQ_INT(c.index_topk, 512);
    /* V2 needs num_experts_per_tok (None in transformers) */
    expect_error("{\"model_type\": \"deepseek_v2\"}", DI_ERR_FORMAT, "num_experts_per_tok", NULL);
    CHECK_OK(parse("{\"model_type\": \"deepseek_v2\", \"num_experts_per_tok\": 6}", &c));
    CHECK_EQ_INT(c.first_k_dense_replace, 0);
    CHECK_EQ_INT(c.n_shared_experts, 2);
    CHECK_EQ_INT(c.bos_token_id, 1);
    CHECK_EQ_INT(c.eos_token_ids[0], 2);
    /* eos as a list, bos null, v5 `dtype`, Kimi-K2's model_type, ue8m0 scales */
    CHECK_OK(parse("{\"model_type\": \"kimi_k2\", \"eos_token_id\": [1, 7, 9], \"bos_token_id\": null, \"dtype\": \"float32\","
                   "\"quantization_config\": {\"quant_method\": \"fp8\", \"scale_fmt\": \"ue8m0\","
                   "\"weight_block_size\": [128, 64]}}", &c));
    CHECK_EQ_INT(c.arch, DI_ARCH_DEEPSEEK_V3);
    CHECK_EQ_STR(c.model_type, "kimi_k2");
    CHECK_EQ_INT(c.n_eos, 3);
    CHECK_EQ_INT(c.eos_token_ids[2], 9);
    CHECK_EQ_INT(c.bos_token_id, -1);
    CHECK_EQ_INT(c.torch_dtype, DI_DTYPE_F32);
    CHECK_EQ_INT(c.scale_ue8m0, 1);
    CHECK_EQ_INT(c.weight_block[1], 64);
}

static void test_to_json_roundtrip(void) {
    di_model_config a, b;
    CHECK_OK(parse("{\"model_type\": \"deepseek_v3\", " SMALL ", \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8,"
                   "\"max_position_embeddings\": 256, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4,"
                   "\"original_max_position_embeddings\": 64, \"mscale\": 0.9, \"mscale_all_dim\": 0.7},"
                   "\"eos_token_id\": [1, 3], \"quantization_config\": {\"quant_method\": \"fp8\"}}", &a));
    json_t *j = di_config_to_json(&a);
    CHECK(j != NULL);
    CHECK_OK(di_config_from_json(j, "roundtrip", &b));
    json_decref(j);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
}

static void test_errors(void) {
    expect_error("[1, 2]", DI_ERR_FORMAT, "expected a JSON object", NULL);
    expect_error("{\"hidden_size\": 64}", DI_ERR_FORMAT, "model_type", NULL);
    expect_error("{\"model_type\": \"llama\"}", DI_ERR_UNSUPPORTED, "model_type", "llama");
    expect_error("{\"model_type\": \"deepseek_v3\", \"hidden_size\": -4}", DI_ERR_FORMAT, "'hidden_size'", "-4");
    expect_error("{\"model_type\": \"deepseek_v3\", \"hidden_size\": \"big\"}", DI_ERR_FORMAT, "'hidden_size'", "string");
    expect_error("{\"model_type\": \"deepseek_v3\", \"hidden_size\": 1e30}", DI_ERR_FORMAT, "'hidden_size'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"vocab_size\": 0}", DI_ERR_FORMAT, "'vocab_size'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"num_experts_per_tok\": 300}", DI_ERR_FORMAT, "'num_experts_per_tok'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"n_group\": 7}", DI_ERR_FORMAT, "'n_group'", "does not divide");
    expect_error("{\"model_type\": \"deepseek_v3\", \"topk_group\": 9}", DI_ERR_FORMAT, "'topk_group'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"n_group\": 128, \"topk_group\": 2}", DI_ERR_FORMAT, "'topk_group'",
                 "fewer than");
    expect_error("{\"model_type\": \"deepseek_v3\", \"n_group\": 256, \"topk_group\": 8}", DI_ERR_FORMAT, "'n_group'", ">= 2");
    expect_error("{\"model_type\": \"deepseek_v3\", \"topk_method\": \"greedy\"}", DI_ERR_UNSUPPORTED, "'topk_method'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"scoring_func\": \"softmax\"}", DI_ERR_UNSUPPORTED, "'scoring_func'", NULL);
    expect_error("{\"model_type\": \"deepseek_v2\", \"num_experts_per_tok\": 6, \"topk_method\": \"noaux_tc\"}",
                 DI_ERR_UNSUPPORTED, "'topk_method'", NULL);
    expect_error("{\"model_type\": \"deepseek_v2\", \"num_experts_per_tok\": 6, \"hidden_size\": 100, \"num_attention_heads\": 16}",
                 DI_ERR_FORMAT, "'hidden_size'", "multiple");
    expect_error("{\"model_type\": \"deepseek_v3\", \"qk_rope_head_dim\": 63}", DI_ERR_FORMAT, "'qk_rope_head_dim'", "even");
    expect_error("{\"model_type\": \"deepseek_v3\", \"num_key_value_heads\": 1}", DI_ERR_UNSUPPORTED, "'num_key_value_heads'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"rms_norm_eps\": 0}", DI_ERR_FORMAT, "'rms_norm_eps'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"routed_scaling_factor\": -1}", DI_ERR_FORMAT, "'routed_scaling_factor'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"moe_layer_freq\": 2}", DI_ERR_UNSUPPORTED, "'moe_layer_freq'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"hidden_act\": \"gelu\"}", DI_ERR_UNSUPPORTED, "'hidden_act'", "gelu");
    expect_error("{\"model_type\": \"deepseek_v3\", \"attention_bias\": true}", DI_ERR_UNSUPPORTED, "'attention_bias'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"eos_token_id\": \"x\"}", DI_ERR_FORMAT, "'eos_token_id'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"eos_token_id\": [1, -2]}", DI_ERR_FORMAT, "'eos_token_id'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"eos_token_id\": 200000}", DI_ERR_FORMAT, "'eos_token_id'", "outside");
    expect_error("{\"model_type\": \"deepseek_v3\", \"bos_token_id\": 129280}", DI_ERR_FORMAT, "'bos_token_id'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"torch_dtype\": \"int4\"}", DI_ERR_FORMAT, "'torch_dtype'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}",
                 DI_ERR_UNSUPPORTED, "rope_scaling", "linear");
    expect_error("{\"model_type\": \"deepseek_v3\", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 0.5}}",
                 DI_ERR_FORMAT, "factor", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4, \"beta_fast\": 1,"
                 "\"beta_slow\": 32}}", DI_ERR_FORMAT, "beta_fast", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"rope_scaling\": 5}", DI_ERR_FORMAT, "'rope_scaling'", "object");
    expect_error("{\"model_type\": \"deepseek_v3\", \"rope_theta\": -1}", DI_ERR_FORMAT, "'rope_theta'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"quantization_config\": {\"quant_method\": \"gptq\"}}",
                 DI_ERR_UNSUPPORTED, "quant_method", "gptq");
    expect_error("{\"model_type\": \"deepseek_v3\", \"quantization_config\": {\"quant_method\": \"fp8\", "
                 "\"weight_block_size\": [128]}}", DI_ERR_FORMAT, "weight_block_size", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}}",
                 DI_ERR_UNSUPPORTED, "fmt", NULL);
    expect_error("{\"model_type\": \"deepseek_v32\", \"q_lora_rank\": null}", DI_ERR_FORMAT, "'q_lora_rank'", NULL);
    expect_error("{\"model_type\": \"deepseek_v32\", \"num_hidden_layers\": 2, \"mlp_layer_types\": [\"sparse\", \"sparse\"]}",
                 DI_ERR_UNSUPPORTED, "'mlp_layer_types'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 3000000000}", DI_ERR_FORMAT,
                 "'num_hidden_layers'", NULL);
    expect_error("{\"model_type\": \"deepseek_v3\", \"num_nextn_predict_layers\": -1}", DI_ERR_FORMAT,
                 "'num_nextn_predict_layers'", NULL);
}

static void test_load_file(void) {
    di_model_config c;
    di_status s = di_config_load("/nonexistent/config.json", &c);
    CHECK(s == DI_ERR_IO);
    CHECK(strstr(di_last_error(), "/nonexistent/config.json") != NULL);
    const char *dir = getenv("DI_BUILD_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/test_config_bad.json", dir ? dir : "/tmp");
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("{\"model_type\": \"deepseek_v3\",\n \"hidden_size\": }", f);
    fclose(f);
    s = di_config_load(path, &c);
    CHECK(s == DI_ERR_FORMAT);
    CHECK_MSG(strstr(di_last_error(), "line 2") != NULL, "%s", di_last_error());
    remove(path);
}

/* Every field of a real config replaced by every kind of bad value: each parse either succeeds
 * or fails with a message naming the file and a field; never a crash (ASan/UBSan run this). */
static void test_field_fuzz(void) {
    const char *base =
        "{\"model_type\": \"deepseek_v3\", \"vocab_size\": 512, \"hidden_size\": 160, \"intermediate_size\": 224,"
        "\"moe_intermediate_size\": 72, \"num_hidden_layers\": 3, \"num_nextn_predict_layers\": 1,"
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"n_shared_experts\": 1, \"n_routed_experts\": 16,"
        "\"routed_scaling_factor\": 2.5, \"kv_lora_rank\": 40, \"q_lora_rank\": 72, \"qk_rope_head_dim\": 16,"
        "\"v_head_dim\": 20, \"qk_nope_head_dim\": 24, \"topk_method\": \"noaux_tc\", \"n_group\": 4, \"topk_group\": 2,"
        "\"num_experts_per_tok\": 4, \"moe_layer_freq\": 1, \"first_k_dense_replace\": 1, \"norm_topk_prob\": true,"
        "\"scoring_func\": \"sigmoid\", \"hidden_act\": \"silu\", \"max_position_embeddings\": 512,"
        "\"rms_norm_eps\": 1e-06, \"rope_theta\": 10000, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 8,"
        "\"original_max_position_embeddings\": 64, \"beta_fast\": 32, \"beta_slow\": 1, \"mscale\": 1.0,"
        "\"mscale_all_dim\": 0.8}, \"rope_interleave\": true, \"bos_token_id\": 0, \"eos_token_id\": 1,"
        "\"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"quantization_config\": {\"quant_method\":"
        "\"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}}";
    const char *bad[] = {"-1", "0", "1", "2147483648", "-9223372036854775808", "1e300", "-1e300", "0.5", "\"x\"", "null",
                         "[]", "[1, 2]", "{}", "{\"type\": 5}", "true", "false"};
    json_t *root = NULL;
    CHECK_OK(di_json_loadb(base, strlen(base), "base", &root));
    if (!root) return;
    di_model_config c;
    CHECK_OK(di_config_from_json(root, "test/config.json", &c));
    int ok = 0, refused = 0, unnamed = 0;
    void *iter = json_object_iter(root);
    while (iter) {
        const char *key = json_object_iter_key(iter);
        json_t *val = json_object_iter_value(iter);
        json_incref(val);
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            json_t *nv = json_loads(bad[b], JSON_DECODE_ANY, NULL);
            json_object_iter_set_new(root, iter, nv);
            di_status s = di_config_from_json(root, "test/config.json", &c);
            if (s == DI_OK) ok++;
            else {
                refused++;
                if (!strstr(di_last_error(), "test/config.json") || !strstr(di_last_error(), "field '")) {
                    unnamed++;
                    fprintf(stderr, "%s = %s: %s\n", key, bad[b], di_last_error());
                }
            }
        }
        json_object_iter_set_new(root, iter, val);
        iter = json_object_iter_next(root, iter);
    }
    json_decref(root);
    CHECK_EQ_INT(unnamed, 0);
    CHECK(refused > 300);
    CHECK(ok > 10);
}

/* config.json files re-saved by transformers 5.17 (v5 `rope_parameters` with both `type` and
 * `rope_type`, `dtype`, derived fields such as head_dim / qk_head_dim) from mkmodel presets
 * (tools/golden/save_hf_configs.py) parse into exactly the preset's configuration. */
static void test_hf_saved_configs(void) {
    const char *presets[] = {"tiny-v3", "tiny-v3-nolora", "tiny-v2-lite", "tiny-v2-grouped", "tiny-v32"};
    for (int i = 0; i < 5; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/config/hf_saved_%s.json", presets[i]);
        di_model_config want, got;
        CHECK_OK(di_mkmodel_preset(presets[i], &want, NULL));
        CHECK_OK(di_config_load(test_src_path(rel), &got));
        CHECK_MSG(memcmp(&want, &got, sizeof want) == 0, "%s: parsed config differs from the preset", presets[i]);
    }
}

TEST_MAIN(test_hf_saved_configs, test_field_fuzz, test_v3_real, test_v2lite, test_rope_variants, test_defaults_and_forms, test_to_json_roundtrip, test_errors,
          test_load_file)
