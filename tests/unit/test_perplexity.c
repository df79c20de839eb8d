/* test_perplexity.c - the shipped model (models/pycoder-moe, FP8) through `deepinfer
 * perplexity` on a committed held-out slice, against the numbers PyTorch computed for the same
 * slice on the GPU machine at training time (tests/data/ppl/slice.json, from the same FP8
 * files dequantized, fp32 math, same window protocol):
 *   - our tokenizer gives exactly the ids PyTorch's tokenizer gave;
 *   - perplexity agrees within 1e-4 relative (the issue asks for 1%);
 *   - MTP acceptance agrees within 0.5 percentage points (argmax near-ties may flip);
 *   - bad invocations fail with a named error. */
#include <jansson.h>
#include <stdio.h>

#include "core/json_util.h"
#include "core/mmap_file.h"
#include "core/status.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"
#include "cli_test_util.h"

static json_t *g_ref;

static void load_reference(void) {
    CHECK_OK(di_json_load_file(test_src_path("tests/data/ppl/slice.json"), &g_ref));
}

static void test_slice_tokens_match_pytorch(void) {
    if (!g_ref) return;
    di_tokenizer *tok = NULL;
    CHECK_OK(di_tokenizer_load(test_src_path("models/pycoder-moe"), &tok));
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(di_read_file(test_src_path("tests/data/ppl/slice.txt"), &text, &len, 0));
    if (!tok || !text) { di_tokenizer_free(tok); free(text); return; }
    di_ids ids = {0};
    CHECK_OK(di_tokenizer_encode(tok, text, len, DI_TOK_HF, &ids));
    const json_t *want = json_object_get(g_ref, "token_ids");
    CHECK(json_is_array(want));
    CHECK_EQ_INT(ids.n, json_array_size(want));
    size_t mismatches = 0;
    for (size_t i = 0; i < ids.n && i < json_array_size(want); i++)
        mismatches += ids.data[i] != (int32_t)json_integer_value(json_array_get(want, i));
    CHECK_EQ_INT(mismatches, 0);
    di_ids_free(&ids);
    free(text);
    di_tokenizer_free(tok);
}

/* Runs the CLI; returns its exit status and the captured stdout (malloc'd) in *out. */
static int run(const char *args, char **out) {
    const char *bin = getenv("DI_BIN"), *bd = getenv("DI_BUILD_DIR");
    char outp[600], cmd[4096];
    snprintf(outp, sizeof outp, "%s/test_perplexity.out", bd ? bd : "/tmp");
    snprintf(cmd, sizeof cmd, "%s perplexity %s >%s 2>&1", bin ? bin : "deepinfer", args, outp);
    int rc = test_run(cmd);
    *out = NULL;
    di_read_file(outp, out, NULL, 0);
    return rc;
}

static void test_slice_perplexity_matches_pytorch(void) {
    if (!g_ref) return;
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "--model %s --file %s --window %d --mtp --json", test_src_path("models/pycoder-moe"),
             test_src_path("tests/data/ppl/slice.txt"), (int)json_integer_value(json_object_get(g_ref, "window")));
    CHECK_EQ_INT(run(args, &out), 0);
    if (!out) return;
    json_t *got = NULL;
    CHECK_OK(di_json_loadb(out, strlen(out), "perplexity output", &got));
    if (got) {
        double ppl = json_real_value(json_object_get(got, "ppl"));
        double ref = json_real_value(json_object_get(g_ref, "ppl"));
        fprintf(stderr, "   deepinfer ppl %.6f, PyTorch ppl %.6f\n", ppl, ref);
        CHECK(ref > 1.0);
        CHECK_NEAR(ppl / ref, 1.0, 1e-4);
        CHECK_EQ_INT(json_integer_value(json_object_get(got, "predicted_tokens")),
                     json_integer_value(json_object_get(g_ref, "predicted_tokens")));
        double acc = json_real_value(json_object_get(got, "mtp_acceptance"));
        double acc_ref = json_real_value(json_object_get(g_ref, "mtp_acceptance"));
        fprintf(stderr, "   deepinfer MTP acceptance %.4f, PyTorch %.4f\n", acc, acc_ref);
        CHECK(acc_ref > 0.5);
        CHECK_NEAR(acc, acc_ref, 0.005);
        json_decref(got);
    } else {
        fprintf(stderr, "   output was: %s\n", out);
    }
    free(out);
}

static void test_bad_invocations(void) {
    char *out = NULL;
    CHECK(run("--model /nonexistent/model --file x.txt", &out) != 0);
    CHECK(out && strstr(out, "/nonexistent/model") != NULL);
    free(out);
    char args[1024];
    snprintf(args, sizeof args, "--model %s --file /nonexistent/text.txt", test_src_path("models/pycoder-moe"));
    CHECK(run(args, &out) != 0);
    CHECK(out && strstr(out, "/nonexistent/text.txt") != NULL);
    free(out);
    snprintf(args, sizeof args, "--model %s --file x --window 1", test_src_path("models/pycoder-moe"));
    CHECK(run(args, &out) != 0);
    CHECK(out && strstr(out, "--window") != NULL);
    free(out);
}

static void cleanup(void) { json_decref(g_ref); }

TEST_MAIN(load_reference, test_slice_tokens_match_pytorch, test_slice_perplexity_matches_pytorch,
          test_bad_invocations, cleanup)
