/* test_mkmodel.c - mkmodel checkpoints: every preset is valid; output bytes do not depend on the
 * thread count; the Hub layout (per-expert tensors, fp32 non-zero correction bias, bf16 router,
 * MTP layer) passes di_model_files_check; values equal those of an independent Python
 * implementation of the generator spec (tools/golden/mkmodel_check.py printed the pinned
 * numbers); FP8 weights dequantize to the generated values within FP8 precision with
 * scale = block amax / 448; sharded output holds the same tensors; the tokenizer is consistent;
 * the CLI rejects bad arguments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/json_util.h"
#include "core/mmap_file.h"
#include "core/status.h"
#include "io/config.h"
#include "io/mkmodel.h"
#include "io/model_files.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "cli_test_util.h"

static const char *out_dir(const char *name) {
    static char buf[4][4096];
    static int k = 0;
    const char *dir = getenv("DI_BUILD_DIR");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/test_mkmodel/%s", dir ? dir : "/tmp", name);
    return b;
}

static int files_equal(const char *a, const char *b) {
    di_mmap x, y;
    if (di_mmap_open(&x, a) != DI_OK) return 0;
    if (di_mmap_open(&y, b) != DI_OK) { di_mmap_close(&x); return 0; }
    int eq = x.size == y.size && (x.size == 0 || memcmp(x.data, y.data, x.size) == 0);
    di_mmap_close(&x);
    di_mmap_close(&y);
    return eq;
}

static void test_presets(void) {
    int n = 0;
    const char *name;
    for (; (name = di_mkmodel_preset_name((size_t)n)) != NULL; n++) {
        di_model_config c;
        di_mk_dtype dt;
        CHECK_OK(di_mkmodel_preset(name, &c, &dt));
        CHECK(di_mkmodel_preset_help(name) != NULL);
        if (strncmp(name, "tiny", 4) == 0) { /* small enough for CI */
            CHECK(c.vocab_size <= 1024 && c.hidden_size >= 64 && c.hidden_size <= 256);
            CHECK(c.num_hidden_layers >= 2 && c.num_hidden_layers <= 4);
            CHECK(c.n_routed_experts >= 8 && c.n_routed_experts <= 16);
        }
    }
    CHECK(n >= 8);
    di_model_config c;
    CHECK(di_mkmodel_preset("no-such", &c, NULL) == DI_ERR_INVALID_ARG);
    /* the embedded benchmark config is bench/models/v2lite-8l.config.json */
    di_model_config a, b;
    CHECK_OK(di_mkmodel_preset("v2lite-8l", &a, NULL));
    CHECK_OK(di_config_load(test_src_path("bench/models/v2lite-8l.config.json"), &b));
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    CHECK_EQ_INT(a.vocab_size, 129280);
    /* paths the presets must cover */
    di_model_config v3, v3n, v2, v2g;
    CHECK_OK(di_mkmodel_preset("tiny-v3", &v3, NULL));
    CHECK_OK(di_mkmodel_preset("tiny-v3-nolora", &v3n, NULL));
    CHECK_OK(di_mkmodel_preset("tiny-v2-lite", &v2, NULL));
    CHECK_OK(di_mkmodel_preset("tiny-v2-grouped", &v2g, NULL));
    CHECK(v3.q_lora_rank > 0 && v3.rope.type == DI_ROPE_YARN && v3.n_group > 1 && v3.topk_group < v3.n_group);
    CHECK(v3.max_position_embeddings == (int)(v3.rope.factor * v3.rope.original_max_position));
    CHECK(v3.hidden_size % 128 != 0 && v3.hidden_size > 128);
    CHECK(v3n.q_lora_rank == 0 && v3n.rope.type == DI_ROPE_DEFAULT);
    CHECK(v2.topk_method == DI_TOPK_GREEDY && v2.n_shared_experts == 2 && v2.rope.mscale == 0.707);
    CHECK(v2g.topk_method == DI_TOPK_GROUP_LIMITED_GREEDY);
}

static di_status mk(const char *preset, di_mk_dtype dt, int mtp, uint64_t seed, int threads, size_t shard, const char *dir) {
    di_model_config c;
    DI_TRY(di_mkmodel_preset(preset, &c, NULL));
    di_mkmodel_opts o = {seed, dt, mtp, shard, NULL, threads};
    return di_mkmodel_write(&c, &o, dir);
}

static void check_dir_equal(const char *a, const char *b) {
    const char *files[] = {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        char pa[4200], pb[4200];
        snprintf(pa, sizeof pa, "%s/%s", a, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[i]);
        CHECK_MSG(files_equal(pa, pb), "%s differs between %s and %s", files[i], a, b);
    }
}

static void test_determinism(void) {
    const char *d1 = out_dir("det1"), *d2 = out_dir("det3");
    CHECK_OK(mk("tiny-v3-fp8", DI_MK_FP8, 1, 7, 1, 0, d1));
    CHECK_OK(mk("tiny-v3-fp8", DI_MK_FP8, 1, 7, 3, 0, d2));
    check_dir_equal(d1, d2);
    /* another seed gives other bytes */
    const char *d3 = out_dir("det_seed8");
    CHECK_OK(mk("tiny-v3-fp8", DI_MK_FP8, 1, 8, 2, 0, d3));
    char pa[4200], pb[4200];
    snprintf(pa, sizeof pa, "%s/model.safetensors", d1);
    snprintf(pb, sizeof pb, "%s/model.safetensors", d3);
    CHECK(!files_equal(pa, pb));
}

/* Values printed by tools/golden/mkmodel_check.py --print-values for tiny-v3, seed 7. */
static void test_values_and_layout(void) {
    const char *dir = out_dir("v3_mtp");
    CHECK_OK(mk("tiny-v3", DI_MK_BF16, 1, 7, 2, 0, dir));
    di_model_config c;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK_OK(di_config_load(path, &c));
    CHECK_EQ_INT(c.num_nextn_predict_layers, 1);
    CHECK_EQ_INT(c.fp8, 0);
    di_weights *w = NULL;
    CHECK_OK(di_weights_open(dir, &w));
    if (!w) return;
    CHECK_OK(di_model_files_check(&c, w, DI_MTP_REQUIRED, dir));
    const di_tensor_info *e = di_weights_find(w, "model.embed_tokens.weight");
    const di_tensor_info *b = di_weights_find(w, "model.layers.1.mlp.gate.e_score_correction_bias");
    const di_tensor_info *g = di_weights_find(w, "model.layers.1.mlp.gate.weight");
    const di_tensor_info *x = di_weights_find(w, "model.layers.2.mlp.experts.15.down_proj.weight");
    const di_tensor_info *me = di_weights_find(w, "model.layers.3.embed_tokens.weight");
    CHECK(e && b && g && x && me);
    if (e && b && g && x && me) {
        const float want_e[4] = {-0.412109375f, -0.99609375f, 0.400390625f, -0.2578125f};
        const double want_b[4] = {0.17708131670951843, 0.10113486647605896, 0.06543794274330139, -0.1561024785041809};
        for (int i = 0; i < 4; i++) {
            CHECK(di_bf16_to_f32(((const uint16_t *)e->data)[i]) == want_e[i]);
            CHECK(((const float *)b->data)[i] == (float)want_b[i]);
        }
        CHECK_EQ_INT(b->dtype, DI_DTYPE_F32);
        int zeros = 0;
        for (int i = 0; i < c.n_routed_experts; i++) zeros += ((const float *)b->data)[i] == 0.0f;
        CHECK_EQ_INT(zeros, 0);
        CHECK_EQ_INT(g->dtype, DI_DTYPE_BF16);
        CHECK_EQ_INT(x->shape[0], c.hidden_size);
        CHECK_EQ_INT(x->shape[1], c.moe_intermediate_size);
        CHECK(me->nbytes == e->nbytes && memcmp(me->data, e->data, e->nbytes) == 0);
    }
    const char *mtp_names[] = {"model.layers.3.enorm.weight", "model.layers.3.hnorm.weight", "model.layers.3.eh_proj.weight",
                               "model.layers.3.shared_head.norm.weight", "model.layers.3.shared_head.head.weight",
                               "model.layers.3.self_attn.kv_b_proj.weight", "model.layers.3.mlp.experts.0.up_proj.weight"};
    for (int i = 0; i < 7; i++) CHECK_MSG(di_weights_find(w, mtp_names[i]) != NULL, "missing %s", mtp_names[i]);
    const di_tensor_info *eh = di_weights_find(w, "model.layers.3.eh_proj.weight");
    if (eh) CHECK(eh->shape[0] == c.hidden_size && eh->shape[1] == 2 * c.hidden_size);
    /* one tensor per expert, none fused */
    CHECK(di_weights_find(w, "model.layers.1.mlp.experts.gate_up_proj") == NULL);
    /* without MTP in the config the MTP tensors are unexpected */
    di_model_config c0 = c;
    c0.num_nextn_predict_layers = 0;
    CHECK(di_model_files_check(&c0, w, DI_MTP_OPTIONAL, dir) == DI_ERR_FORMAT);
    CHECK_MSG(strstr(di_last_error(), "unexpected") && strstr(di_last_error(), "model.layers.3."), "%s", di_last_error());
    /* a config with one more layer: the check names what is missing */
    di_model_config c4 = c;
    c4.num_hidden_layers = 4;
    c4.num_nextn_predict_layers = 0;
    CHECK(di_model_files_check(&c4, w, DI_MTP_OPTIONAL, dir) == DI_ERR_FORMAT); /* layer 3 is MTP-shaped */
    di_model_config cs = c;
    cs.hidden_size = 168;
    CHECK(di_model_files_check(&cs, w, DI_MTP_OPTIONAL, dir) == DI_ERR_FORMAT);
    CHECK_MSG(strstr(di_last_error(), "model.embed_tokens.weight") && strstr(di_last_error(), "expected [512, 168]"), "%s",
              di_last_error());
    di_weights_free(w);
}

static void test_fp8(void) {
    const char *dir = out_dir("fp8");
    CHECK_OK(mk("tiny-v3-fp8", DI_MK_FP8, 0, 3, 2, 0, dir));
    di_model_config c;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK_OK(di_config_load(path, &c));
    CHECK_EQ_INT(c.fp8, 1);
    di_weights *w = NULL;
    CHECK_OK(di_weights_open(dir, &w));
    if (!w) return;
    CHECK_OK(di_model_files_check(&c, w, DI_MTP_OPTIONAL, dir));
    const char *name = "model.layers.0.self_attn.q_b_proj.weight"; /* [160, 72]: 2 x 1 blocks, the first row block full */
    const di_tensor_info *q = di_weights_find(w, name);
    const di_tensor_info *s = di_weights_find(w, "model.layers.0.self_attn.q_b_proj.weight_scale_inv");
    CHECK(q && s && q->dtype == DI_DTYPE_F8_E4M3 && s->dtype == DI_DTYPE_F32);
    if (q && s) {
        CHECK_EQ_INT(s->shape[0], 2);
        CHECK_EQ_INT(s->shape[1], 1);
        const int64_t R = q->shape[0], C = q->shape[1];
        const float a = sqrtf(3.0f / (float)C);
        uint64_t key = di_mk_key(name, 3);
        float amax[2] = {0, 0};
        int bad = 0;
        for (int64_t r = 0; r < R; r++)
            for (int64_t k = 0; k < C; k++) {
                float v = di_mk_uniform(key, (uint64_t)(r * C + k)) * a;
                if (fabsf(v) > amax[r / 128]) amax[r / 128] = fabsf(v);
                float sc = ((const float *)s->data)[r / 128];
                float deq = di_fp8e4m3_to_f32(((const uint8_t *)q->data)[r * C + k]) * sc;
                /* e4m3 keeps 3 mantissa bits: error <= 2^-4 relative, or half the smallest step */
                if (fabsf(deq - v) > fmaxf(fabsf(v) * 0.0625f, sc * 0.001f)) bad++;
            }
        CHECK_EQ_INT(bad, 0);
        CHECK_NEAR(((const float *)s->data)[0], amax[0] / 448.0f, 1e-6 * amax[0]);
        CHECK_NEAR(((const float *)s->data)[1], amax[1] / 448.0f, 1e-6 * amax[1]);
    }
    /* router, norms, embeddings, lm_head are never FP8 */
    const char *keep[] = {"model.layers.1.mlp.gate.weight", "model.embed_tokens.weight", "lm_head.weight",
                          "model.norm.weight", "model.layers.0.input_layernorm.weight"};
    for (int i = 0; i < 5; i++) {
        const di_tensor_info *t = di_weights_find(w, keep[i]);
        CHECK_MSG(t && t->dtype == DI_DTYPE_BF16, "%s", keep[i]);
    }
    /* an FP8 weight without its scale is refused, naming both */
    di_model_config nofp8 = c;
    nofp8.fp8 = 0;
    CHECK(di_model_files_check(&nofp8, w, DI_MTP_OPTIONAL, dir) == DI_ERR_FORMAT);
    CHECK_MSG(strstr(di_last_error(), "quantization_config") != NULL, "%s", di_last_error());
    di_weights_free(w);
}

static void test_sharded(void) {
    const char *d1 = out_dir("single"), *d2 = out_dir("sharded");
    CHECK_OK(mk("tiny-v2-grouped", DI_MK_F32, 0, 5, 2, 0, d1));
    CHECK_OK(mk("tiny-v2-grouped", DI_MK_F32, 0, 5, 2, 300 << 10, d2));
    char idx[4200];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", d2);
    CHECK(di_file_exists(idx));
    di_weights *a = NULL, *b = NULL;
    int files = 0;
    CHECK_OK(di_weights_open(d1, &a));
    CHECK_OK(di_weights_open(d2, &b));
    if (a && b) {
        CHECK_EQ_INT(di_weights_count(a), di_weights_count(b));
        int same = 1;
        const char *last = "";
        for (size_t i = 0; i < di_weights_count(a); i++) {
            const di_tensor_info *x = di_weights_at(a, i), *y = di_weights_find(b, x->name);
            same &= y && y->nbytes == x->nbytes && y->dtype == DI_DTYPE_F32 && memcmp(x->data, y->data, x->nbytes) == 0;
            if (y && strcmp(y->file, last) != 0) { files++; last = y->file; }
        }
        CHECK(same);
        CHECK(files >= 3);
        di_model_config c;
        char cp[4200];
        snprintf(cp, sizeof cp, "%s/config.json", d2);
        CHECK_OK(di_config_load(cp, &c));
        CHECK_EQ_INT(c.torch_dtype, DI_DTYPE_F32);
        CHECK_OK(di_model_files_check(&c, b, DI_MTP_OPTIONAL, d2));
    }
    di_weights_free(a);
    di_weights_free(b);
    /* rewriting a directory single-file removes the old index and shards */
    CHECK_OK(mk("tiny-v2-grouped", DI_MK_F32, 0, 5, 2, 0, d2));
    CHECK(!di_file_exists(idx));
    char shard1[4200];
    snprintf(shard1, sizeof shard1, "%s/model-00001-of-%05d.safetensors", d2, files);
    CHECK(!di_file_exists(shard1));
}

static void test_tokenizer(void) {
    const char *dir = out_dir("v3_mtp");
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_t *t = NULL;
    CHECK_OK(di_json_load_file(path, &t));
    if (!t) return;
    json_t *vocab = json_object_get(json_object_get(t, "model"), "vocab");
    json_t *merges = json_object_get(json_object_get(t, "model"), "merges");
    json_t *added = json_object_get(t, "added_tokens");
    CHECK(json_is_object(vocab) && json_is_array(merges) && json_is_array(added));
    size_t nv = json_object_size(vocab), na = json_array_size(added);
    CHECK(nv + na - 3 <= 512); /* ids 0..2 are both in the vocab and added */
    CHECK(json_array_size(merges) > 100);
    CHECK_EQ_INT(json_integer_value(json_object_get(vocab, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>")), 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(vocab, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>")), 1);
    /* every merge joins two vocab tokens into a vocab token */
    int bad = 0;
    for (size_t i = 0; i < json_array_size(merges); i++) {
        const char *m = json_string_value(json_array_get(merges, i));
        const char *sp = m ? strchr(m, ' ') : NULL;
        if (!sp) { bad++; continue; }
        char l[256], r[256], lr[512];
        snprintf(l, sizeof l, "%.*s", (int)(sp - m), m);
        snprintf(r, sizeof r, "%s", sp + 1);
        snprintf(lr, sizeof lr, "%s%s", l, r);
        bad += !json_object_get(vocab, l) || !json_object_get(vocab, r) || !json_object_get(vocab, lr);
    }
    CHECK_EQ_INT(bad, 0);
    /* ids are 0..n-1 without gaps: vocab then added tokens */
    int maxid = -1, found_user = 0, found_think = 0;
    for (size_t i = 0; i < na; i++) {
        json_t *a = json_array_get(added, i);
        int id = (int)json_integer_value(json_object_get(a, "id"));
        if (id > maxid) maxid = id;
        const char *content = json_string_value(json_object_get(a, "content"));
        found_user |= !strcmp(content, "<\xef\xbd\x9cUser\xef\xbd\x9c>");
        found_think |= !strcmp(content, "<think>");
    }
    CHECK(found_user && found_think);
    CHECK_EQ_INT(maxid, (int)(nv + na - 3) - 1);
    json_decref(t);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    CHECK_OK(di_json_load_file(path, &t));
    const char *tmpl = NULL;
    CHECK_OK(di_json_req_string(t, "chat_template", path, &tmpl));
    CHECK(tmpl && strstr(tmpl, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>") != NULL);
    json_decref(t);
}

static int run_cli(const char *args) {
    const char *bin = getenv("DI_BIN");
    if (!bin) return -1;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' mkmodel %s >/dev/null 2>&1", bin, args);
    return test_run(cmd);
}

static void test_cli(void) {
    CHECK_MSG(getenv("DI_BIN") != NULL, "DI_BIN is not set (run through ctest)");
    char args[8192];
    CHECK_EQ_INT(run_cli("--help"), 0);
    CHECK(run_cli("--preset tiny-v3") != 0);                         /* no --out */
    snprintf(args, sizeof args, "--preset nope --out '%s'", out_dir("cli"));
    CHECK(run_cli(args) != 0);
    snprintf(args, sizeof args, "--preset tiny-v3 --dtype int4 --out '%s'", out_dir("cli"));
    CHECK(run_cli(args) != 0);
    snprintf(args, sizeof args, "--preset tiny-v3 --seed -1 --out '%s'", out_dir("cli"));
    CHECK(run_cli(args) != 0);
    snprintf(args, sizeof args, "--preset tiny-v3 --config x.json --out '%s'", out_dir("cli"));
    CHECK(run_cli(args) != 0);
    snprintf(args, sizeof args, "--config /nonexistent/config.json --out '%s'", out_dir("cli"));
    CHECK(run_cli(args) != 0);
    /* a vocabulary too small for the built-in tokenizer is refused before anything is written */
    di_model_config small;
    CHECK_OK(di_mkmodel_preset("tiny-v3", &small, NULL));
    small.vocab_size = 200;
    di_mkmodel_opts o = {0, DI_MK_BF16, 0, 0, NULL, 1};
    CHECK(di_mkmodel_write(&small, &o, out_dir("small_vocab")) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "vocab_size 200") != NULL);
    CHECK(!di_file_exists(out_dir("small_vocab")));
    /* --config with a file written by mkmodel itself reproduces the checkpoint */
    snprintf(args, sizeof args, "--preset tiny-v2-lite --seed 4 --out '%s'", out_dir("cli_a"));
    CHECK_EQ_INT(run_cli(args), 0);
    snprintf(args, sizeof args, "--config '%s/config.json' --seed 4 --out '%s'", out_dir("cli_a"), out_dir("cli_b"));
    CHECK_EQ_INT(run_cli(args), 0);
    check_dir_equal(out_dir("cli_a"), out_dir("cli_b"));
}

static void test_fp8_encoder(void) {
    /* the fast encoder equals the reference one on a sweep of bit patterns (both signs, every
     * exponent, subnormals, ties) and on the special values */
    int bad = 0;
    for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) {
        uint32_t b = (uint32_t)u;
        float f;
        memcpy(&f, &b, 4);
        bad += di_mk_f32_to_fp8(f) != di_f32_to_fp8e4m3(f);
    }
    const float special[] = {0.0f, -0.0f, 448.0f, 449.0f, 464.0f, 1e30f, INFINITY, -INFINITY, NAN, 0.001953125f,
                             0.0009765625f, 0.00146484375f, 0.0029296875f, 1.0625f, 1.1875f, 0.015625f, 0.0146484375f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        bad += di_mk_f32_to_fp8(special[i]) != di_f32_to_fp8e4m3(special[i]);
        bad += di_mk_f32_to_fp8(-special[i]) != di_f32_to_fp8e4m3(-special[i]);
    }
    CHECK_EQ_INT(bad, 0);
}

/* Copies the tensors of `w` into a new file, dropping `drop` and replacing `swap` (if not NULL)
 * by a tensor of dtype `t` and shape shape[0..ndim). */
static void rewrite(const di_weights *w, const char *path, const char *drop, const char *swap, di_dtype t, int ndim,
                    const int64_t *shape, const char *extra) {
    di_st_writer *wr = di_st_writer_create();
    static unsigned char zeros[1 << 20];
    for (size_t i = 0; i < di_weights_count(w); i++) {
        const di_tensor_info *x = di_weights_at(w, i);
        if (drop && !strcmp(x->name, drop)) continue;
        if (swap && !strcmp(x->name, swap)) {
            size_t nb = di_dtype_size(t);
            for (int d = 0; d < ndim; d++) nb *= (size_t)shape[d];
            CHECK_OK(di_st_writer_add(wr, x->name, t, ndim, shape, zeros, nb));
            continue;
        }
        CHECK_OK(di_st_writer_add(wr, x->name, x->dtype, x->ndim, x->shape, x->data, x->nbytes));
    }
    if (extra) {
        int64_t one = 1;
        CHECK_OK(di_st_writer_add(wr, extra, DI_DTYPE_F32, 1, &one, zeros, 4));
    }
    CHECK_OK(di_st_writer_write(wr, path));
    di_st_writer_free(wr);
}

static void expect_check(const di_model_config *c, const char *path, di_status code, const char *f1, const char *f2) {
    di_weights *w = NULL;
    CHECK_OK(di_weights_open(path, &w));
    if (!w) return;
    di_status s = di_model_files_check(c, w, DI_MTP_OPTIONAL, "ckpt");
    CHECK_MSG(s == code, "expected %s, got %s: %s", di_status_name(code), di_status_name(s), di_last_error());
    if (f1) CHECK_MSG(strstr(di_last_error(), f1) != NULL, "'%s' not in: %s", f1, di_last_error());
    if (f2) CHECK_MSG(strstr(di_last_error(), f2) != NULL, "'%s' not in: %s", f2, di_last_error());
    di_weights_free(w);
}

/* di_model_files_check on checkpoints broken one tensor at a time. */
static void test_files_check(void) {
    const char *dir = out_dir("fp8_check");
    CHECK_OK(mk("tiny-v3-fp8", DI_MK_FP8, 0, 3, 2, 0, dir));
    di_model_config c;
    char path[4200], bad[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK_OK(di_config_load(path, &c));
    di_weights *w = NULL;
    CHECK_OK(di_weights_open(dir, &w));
    if (!w) return;
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    const int64_t s16[1] = {16}, s3x4[2] = {3, 4}, s2x2[2] = {2, 2}, s160[1] = {160}, s72x160[2] = {72, 160};
    rewrite(w, bad, "model.layers.2.mlp.experts.7.up_proj.weight", NULL, DI_DTYPE_F32, 0, NULL, NULL);
    expect_check(&c, bad, DI_ERR_NOT_FOUND, "1 tensor missing", "'model.layers.2.mlp.experts.7.up_proj.weight'");
    rewrite(w, bad, "model.layers.1.mlp.gate.e_score_correction_bias", NULL, DI_DTYPE_F32, 0, NULL, NULL);
    expect_check(&c, bad, DI_ERR_NOT_FOUND, "e_score_correction_bias", NULL);
    rewrite(w, bad, "model.layers.0.self_attn.o_proj.weight_scale_inv", NULL, DI_DTYPE_F32, 0, NULL, NULL);
    expect_check(&c, bad, DI_ERR_NOT_FOUND, "'model.layers.0.self_attn.o_proj.weight'", "weight_scale_inv");
    rewrite(w, bad, NULL, "model.layers.0.self_attn.o_proj.weight_scale_inv", DI_DTYPE_F32, 2, s2x2, NULL);
    expect_check(&c, bad, DI_ERR_FORMAT, "o_proj.weight_scale_inv", "expected F32 [2, 1]");
    rewrite(w, bad, NULL, "model.layers.1.mlp.gate.e_score_correction_bias", DI_DTYPE_I32, 1, s16, NULL);
    expect_check(&c, bad, DI_ERR_FORMAT, "e_score_correction_bias", "I32");
    rewrite(w, bad, NULL, "model.layers.1.mlp.gate.weight", DI_DTYPE_F8_E4M3, 2, (const int64_t[]){16, 160}, NULL);
    expect_check(&c, bad, DI_ERR_FORMAT, "mlp.gate.weight", "F8_E4M3");
    rewrite(w, bad, NULL, "model.norm.weight", DI_DTYPE_BF16, 2, s3x4, NULL);
    expect_check(&c, bad, DI_ERR_FORMAT, "'model.norm.weight' has shape [3, 4], expected [160]", NULL);
    rewrite(w, bad, NULL, "model.layers.0.input_layernorm.weight", DI_DTYPE_F8_E4M3, 1, s160, NULL);
    expect_check(&c, bad, DI_ERR_FORMAT, "input_layernorm", "F8_E4M3");
    /* a bf16 projection in an FP8 checkpoint is fine; its stale scale is not */
    rewrite(w, bad, NULL, "model.layers.1.mlp.experts.0.gate_proj.weight", DI_DTYPE_BF16, 2, s72x160, NULL);
    expect_check(&c, bad, DI_ERR_FORMAT, "unexpected", "experts.0.gate_proj.weight_scale_inv");
    rewrite(w, bad, "model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv", "model.layers.1.mlp.experts.0.gate_proj.weight",
            DI_DTYPE_BF16, 2, s72x160, NULL);
    expect_check(&c, bad, DI_OK, NULL, NULL);
    rewrite(w, bad, NULL, NULL, DI_DTYPE_F32, 0, NULL, "model.layers.0.mlp.experts.0.up_proj.weight");
    expect_check(&c, bad, DI_ERR_FORMAT, "unexpected", "model.layers.0.mlp.experts.0.up_proj.weight");
    rewrite(w, bad, NULL, NULL, DI_DTYPE_F32, 0, NULL, "lm_head.bias");
    expect_check(&c, bad, DI_ERR_FORMAT, "unexpected", "'lm_head.bias'");
    di_weights_free(w);
    remove(bad);
}

TEST_MAIN(test_fp8_encoder, test_files_check, test_presets, test_determinism, test_values_and_layout, test_fp8, test_sharded, test_tokenizer, test_cli)
