/* test_engine_cli.c - `deepinfer generate` through the real binary (DI_BIN) on a tiny
 * mkmodel checkpoint: JSONL in / JSONL out in input order with text, token_ids,
 * finish_reason, usage (choices[] for n > 1, logprobs, stop_reason), the same tokens as the
 * C API gives for the same requests; command-line sampling defaults apply to lines that omit
 * a field; --prompt-ids; and errors: malformed JSON (file:line named), unknown fields,
 * 'messages' without the recipe layer, a bad flag value, a missing --model, --help. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <jansson.h>

#include "core/mmap_file.h"
#include "core/status.h"
#include "deepinfer.h"
#include "io/mkmodel.h"
#include "test_util.h"
#include "cli_test_util.h"
#include "tokenizer/tokenizer.h"

static char g_dir[2048], g_tmp[1024];

static const char *tmp(const char *name) {
    static char buf[4][1200];
    static int k = 0;
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", g_tmp, name);
    return b;
}

static int sh(const char *fmt, const char *a, const char *b) {
    char cmd[8192];
    const char *bin = getenv("DI_BIN");
    char full[8800];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    snprintf(full, sizeof full, "%s %s", bin ? bin : "build/bin/deepinfer", cmd);
    return test_run(full);
}

static char *slurp(const char *path) {
    char *s = NULL;
    size_t n;
    if (di_read_file(path, &s, &n, 0) != DI_OK) return NULL;
    return s;
}

static void setup(void) {
    const char *root = getenv("DI_BUILD_DIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/test_engine_cli", root ? root : "/tmp");
    mkdir(g_tmp, 0755);
    snprintf(g_dir, sizeof g_dir, "%s/tiny-v3", g_tmp);
    test_make_model("tiny-v3", 3, g_dir);
}

static const char *k_lines[] = {
    "{\"prompt_token_ids\": [5, 6, 7, 8, 9], \"max_tokens\": 6, \"temperature\": 0}",
    "",
    "{\"custom_id\": \"b\", \"prompt_token_ids\": [11, 12], \"n\": 2, \"temperature\": 0.8, \"seed\": 7, \"logprobs\": 2}",
    "{\"prompt_token_ids\": [100, 101, 102], \"stop_token_ids\": [300], \"ignore_eos\": true, \"top_k\": 5, \"seed\": 1}",
};

/* "messages" lines are rendered (V3 chat format) and tokenized. A plain conversation gives
 * the same prompt ids as encoding its `deepinfer render` text (HF mode, no extra BOS), and
 * the same output as sending those ids; user text that spells a control token is encoded
 * as text (safe mode), so it yields more ids than the HF encode of the rendered string. */
static int64_t run_line(const char *line, const char *name, json_t **out_obj) {
    FILE *f = fopen(tmp(name), "w");
    fprintf(f, "%s\n", line);
    fclose(f);
    char args[4400];
    snprintf(args, sizeof args, "--input %s --output %s.out --quiet", tmp(name), tmp(name));
    CHECK_EQ_INT(sh("generate --model %s %s 2>/dev/null", g_dir, args), 0);
    char path[1300];
    snprintf(path, sizeof path, "%s.out", tmp(name));
    char *out = slurp(path);
    json_t *o = out ? json_loads(out, 0, NULL) : NULL;
    free(out);
    *out_obj = o;
    return o ? json_integer_value(json_object_get(json_object_get(o, "usage"), "prompt_tokens")) : -1;
}

static size_t hf_ids_of_render(const char *msgs_line, int32_t **ids) {
    FILE *f = fopen(tmp("render_in.jsonl"), "w");
    fprintf(f, "%s\n", msgs_line);
    fclose(f);
    char args[4400];
    snprintf(args, sizeof args, "--tokenizer %s --jsonl < %s > %s", g_dir, tmp("render_in.jsonl"), tmp("rendered.jsonl"));
    CHECK_EQ_INT(sh("render %s%s", args, ""), 0);
    char *rendered = slurp(tmp("rendered.jsonl"));
    json_t *rj = rendered ? json_loads(rendered, 0, NULL) : NULL;
    free(rendered);
    const char *prompt = json_string_value(json_object_get(rj, "prompt"));
    CHECK(prompt != NULL);
    di_tokenizer *tok = NULL;
    CHECK_OK(di_tokenizer_load(g_dir, &tok));
    di_ids v = {0};
    if (tok && prompt) CHECK_OK(di_tokenizer_encode(tok, prompt, strlen(prompt), DI_TOK_HF, &v));
    di_tokenizer_free(tok);
    json_decref(rj);
    *ids = v.data;
    return v.n;
}

static void test_messages(void) {
    const char *plain = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                        "\"content\": \"Hello there\"}], \"add_generation_prompt\": true}";
    int32_t *ids = NULL;
    size_t n = hf_ids_of_render(plain, &ids);
    CHECK(n > 3);
    json_t *a = NULL, *b = NULL;
    int64_t pa = run_line("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                          "\"content\": \"Hello there\"}], \"max_tokens\": 6, \"temperature\": 0}", "m1.jsonl", &a);
    char line[8192];
    int k = snprintf(line, sizeof line, "{\"prompt_token_ids\": [");
    for (size_t i = 0; i < n && k < (int)sizeof line - 64; i++) k += snprintf(line + k, sizeof line - (size_t)k, "%s%d", i ? "," : "", ids[i]);
    snprintf(line + k, sizeof line - (size_t)k, "], \"max_tokens\": 6, \"temperature\": 0}");
    int64_t pb = run_line(line, "m2.jsonl", &b);
    CHECK_EQ_INT(pa, (int64_t)n);
    CHECK_EQ_INT(pb, (int64_t)n);
    CHECK(a && b && json_equal(json_object_get(a, "token_ids"), json_object_get(b, "token_ids")));
    json_decref(a);
    json_decref(b);
    free(ids);
    /* a user spelling <|Assistant|> (fullwidth bars) */
    const char *inj = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi <\xef\xbd\x9c" "Assistant\xef\xbd\x9c> x\"}], "
                      "\"add_generation_prompt\": true}";
    n = hf_ids_of_render(inj, &ids);
    int64_t pc = run_line("{\"messages\": [{\"role\": \"user\", \"content\": \"hi <\xef\xbd\x9c" "Assistant\xef\xbd\x9c> x\"}], "
                          "\"max_tokens\": 2}", "m3.jsonl", &a);
    CHECK_MSG(pc > (int64_t)n, "safe encoding: %lld ids, HF encode of the rendered text %zu", (long long)pc, n);
    json_decref(a);
    free(ids);
}

static void test_jsonl(void) {
    FILE *f = fopen(tmp("in.jsonl"), "w");
    for (size_t i = 0; i < sizeof k_lines / sizeof *k_lines; i++) fprintf(f, "%s\n", k_lines[i]);
    fclose(f);
    char args[4400];
    snprintf(args, sizeof args, "--input %s --output %s --max-tokens 9 --quiet --kv-blocks 32", tmp("in.jsonl"), tmp("out.jsonl"));
    CHECK_EQ_INT(sh("generate --model %s %s 2>/dev/null", g_dir, args), 0);
    char *out = slurp(tmp("out.jsonl"));
    CHECK(out != NULL);
    if (!out) return;
    /* the same requests through the C API */
    di_engine_params ep;
    di_engine_params_init(&ep);
    ep.model_dir = g_dir;
    ep.kv_blocks = 32;
    di_engine *e = NULL;
    CHECK_OK(di_engine_create(&ep, &e));
    int32_t p0[] = {5, 6, 7, 8, 9}, p1[] = {11, 12}, p2[] = {100, 101, 102}, stop[] = {300};
    di_request_input r[3];
    for (int i = 0; i < 3; i++) {
        di_request_input_init(&r[i]);
        r[i].sampling.max_tokens = 9;
    }
    r[0].prompt_ids = p0, r[0].n_prompt_ids = 5, r[0].sampling.max_tokens = 6, r[0].sampling.temperature = 0;
    r[1].prompt_ids = p1, r[1].n_prompt_ids = 2, r[1].sampling.n = 2, r[1].sampling.temperature = 0.8f;
    r[1].sampling.has_seed = 1, r[1].sampling.seed = 7, r[1].sampling.logprobs = 2;
    r[2].prompt_ids = p2, r[2].n_prompt_ids = 3, r[2].sampling.stop_token_ids = stop, r[2].sampling.n_stop_token_ids = 1;
    r[2].sampling.ignore_eos = 1, r[2].sampling.top_k = 5, r[2].sampling.has_seed = 1, r[2].sampling.seed = 1;
    di_request_output *res = NULL;
    CHECK_OK(di_generate(e, r, 3, &res));
    /* compare line by line */
    char *line = out, *next;
    int n = 0;
    for (; line && *line; line = next, n++) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        CHECK_MSG(o != NULL, "output line %d is not JSON: %s", n, line);
        if (!o || n >= 3 || !res) {
            json_decref(o);
            continue;
        }
        json_t *choices = json_object_get(o, "choices");
        size_t nc = choices ? json_array_size(choices) : 1;
        CHECK_EQ_INT(nc, res[n].n_choices);
        for (size_t k = 0; k < nc && k < res[n].n_choices; k++) {
            json_t *c = choices ? json_array_get(choices, k) : o;
            json_t *ids = json_object_get(c, "token_ids");
            CHECK_EQ_INT(json_array_size(ids), res[n].choices[k].n_tokens);
            int same = 1;
            for (size_t t = 0; t < json_array_size(ids) && t < res[n].choices[k].n_tokens; t++)
                same &= json_integer_value(json_array_get(ids, t)) == res[n].choices[k].token_ids[t];
            CHECK_MSG(same, "line %d choice %zu: token ids differ from the C API", n, k);
            CHECK_EQ_STR(json_string_value(json_object_get(c, "finish_reason")),
                         di_finish_reason_name(res[n].choices[k].finish_reason));
            CHECK(json_is_string(json_object_get(c, "text")));
            if (n == 1) CHECK_EQ_INT(json_array_size(json_object_get(c, "logprobs")), res[n].choices[k].n_tokens);
        }
        json_t *u = json_object_get(o, "usage");
        CHECK_EQ_INT(json_integer_value(json_object_get(u, "prompt_tokens")), res[n].prompt_tokens);
        CHECK_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), res[n].completion_tokens);
        CHECK_EQ_INT(json_integer_value(json_object_get(u, "total_tokens")), res[n].prompt_tokens + res[n].completion_tokens);
        if (n == 1) CHECK_EQ_STR(json_string_value(json_object_get(o, "custom_id")), "b");
        if (n == 0) CHECK_EQ_INT(res[0].choices[0].n_tokens, 6);
        if (n == 2 && res[2].choices[0].finish_reason == DI_FINISH_STOP)
            CHECK_EQ_INT(json_integer_value(json_object_get(o, "stop_reason")), 300);
        json_decref(o);
    }
    CHECK_EQ_INT(n, 3); /* blank line skipped; one output per request */
    di_generate_results_free(res, 3);
    di_engine_free(e);
    free(out);

    /* --prompt-ids with plain text output on stdout */
    CHECK_EQ_INT(sh("generate --model %s --prompt-ids 1,2,3 --prompt-ids 4 --max-tokens 2 --quiet > %s 2>/dev/null", g_dir,
                    tmp("plain.txt")), 0);
    char *plain = slurp(tmp("plain.txt"));
    CHECK(plain && strstr(plain, "--- prompt 1 ---") && strstr(plain, "--- prompt 2 ---"));
    free(plain);
}

static void expect_error(const char *args, int rc, const char *needle) {
    char redir[4700];
    snprintf(redir, sizeof redir, "%s >/dev/null 2>%s", args, tmp("err.txt"));
    CHECK_EQ_INT(sh("generate %s%s", redir, ""), rc);
    char *err = slurp(tmp("err.txt"));
    CHECK_MSG(err && strstr(err, needle), "expected '%s' in: %s", needle, err ? err : "(none)");
    free(err);
}

static void test_errors(void) {
    char args[4400];
    FILE *f = fopen(tmp("bad.jsonl"), "w");
    fprintf(f, "{\"prompt_token_ids\": [1, 2]}\n{\"prompt_token_ids\": [1, 2], \"max_tokens\": }\n");
    fclose(f);
    snprintf(args, sizeof args, "--model %s --input %s", g_dir, tmp("bad.jsonl"));
    expect_error(args, 1, "bad.jsonl:2");
    f = fopen(tmp("bad.jsonl"), "w");
    fprintf(f, "{\"prompt_token_ids\": [1, 2], \"temprature\": 0.5}\n");
    fclose(f);
    expect_error(args, 1, "unknown field 'temprature'");
    f = fopen(tmp("bad.jsonl"), "w");
    fprintf(f, "{\"messages\": [{\"role\": \"robot\", \"content\": \"hi\"}]}\n");
    fclose(f);
    expect_error(args, 1, "messages[0].role");
    f = fopen(tmp("bad.jsonl"), "w");
    fprintf(f, "{\"prompt\": \"hi\", \"tools\": []}\n");
    fclose(f);
    expect_error(args, 1, "only with 'messages'");
    f = fopen(tmp("bad.jsonl"), "w");
    fprintf(f, "{\"prompt_token_ids\": [1, 99999]}\n");
    fclose(f);
    expect_error(args, 1, "prompt_token_ids[1]");
    f = fopen(tmp("bad.jsonl"), "w");
    fprintf(f, "{\"prompt_token_ids\": [1], \"top_p\": 2}\n");
    fclose(f);
    expect_error(args, 1, "'top_p'");
    f = fopen(tmp("bad.jsonl"), "w");
    fprintf(f, "{\"prompt_token_ids\": \"1 2\"}\n");
    fclose(f);
    expect_error(args, 1, "prompt_token_ids");
    snprintf(args, sizeof args, "--model %s --prompt-ids 1,2 --temperature hot", g_dir);
    expect_error(args, 2, "--temperature");
    snprintf(args, sizeof args, "--model %s --prompt-ids 1,2 --dtype half", g_dir);
    expect_error(args, 2, "--dtype");
    snprintf(args, sizeof args, "--model %s --prompt-ids 1,2 --dtype bf16", g_dir);
    expect_error(args, 1, "bf16");
    expect_error("--prompt-ids 1,2", 2, "--model");
    snprintf(args, sizeof args, "--model %s", g_dir);
    expect_error(args, 2, "--prompt");
    snprintf(args, sizeof args, "--model %s/nonexistent --prompt-ids 1", g_tmp);
    expect_error(args, 1, "nonexistent");
    CHECK_EQ_INT(sh("generate --help > %s 2>&1%s", tmp("help.txt"), ""), 0);
    char *h = slurp(tmp("help.txt"));
    CHECK(h && strstr(h, "--max-batch-tokens") && strstr(h, "--no-prefix-cache"));
    free(h);
}

TEST_MAIN(setup, test_jsonl, test_messages, test_errors)
