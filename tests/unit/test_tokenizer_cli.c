/* test_tokenizer_cli.c - `deepinfer tokenize` / `deepinfer detokenize` through the real binary
 * ($DI_BIN): ids equal HF's (values from HF `tokenizers`), --safe, --add-special, --jsonl in
 * order, detokenize of plain and JSONL ids, --help, and clear failures (exit status and
 * message) for a missing tokenizer, invalid UTF-8 and malformed JSONL lines. */
#include <unistd.h>

#include "test_util.h"
#include "cli_test_util.h"
#include "tok_test_util.h"

/* Runs `sh -c cmd` with `in` on stdin; returns the exit status, stdout in *out (malloc'd). */
static int run(const char *cmd, const char *in, size_t in_len, char **out, char **err) {
    char inpath[256], outpath[256], errpath[256];
    const char *b = getenv("DI_BUILD_DIR") ? getenv("DI_BUILD_DIR") : ".";
    snprintf(inpath, sizeof inpath, "%s/tests/tok_cli_in_%d", b, (int)getpid());
    snprintf(outpath, sizeof outpath, "%s/tests/tok_cli_out_%d", b, (int)getpid());
    snprintf(errpath, sizeof errpath, "%s/tests/tok_cli_err_%d", b, (int)getpid());
    di_write_file(inpath, in, in_len);
    char full[4096];
    snprintf(full, sizeof full, "%s < '%s' > '%s' 2> '%s'", cmd, inpath, outpath, errpath);
    int rc = test_run(full);
    size_t n;
    *out = NULL;
    di_read_file(outpath, out, &n, 0);
    if (err) { *err = NULL; di_read_file(errpath, err, &n, 0); }
    unlink(inpath);
    unlink(outpath);
    unlink(errpath);
    return rc;
}

static void test_cli(void) {
    const char *bin = getenv("DI_BIN");
    CHECK(bin != NULL);
    if (!bin) return;
    char cmd[2048], *out, *err;
    const char *ds = tt_build_path("tests/data/tokenizers/deepseek-v3");
    const char *qw = tt_build_path("tests/data/tokenizers/qwen3");
    /* HF: DeepSeek "hello world" -> 33310 2058; "<｜User｜>" -> 128803 */
    snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s'", bin, ds);
    CHECK_EQ_INT(run(cmd, "hello world", 11, &out, NULL), 0);
    CHECK_EQ_STR(out, "33310 2058\n");
    free(out);
    const char *inj = "a<｜User｜>";
    CHECK_EQ_INT(run(cmd, inj, strlen(inj), &out, NULL), 0);
    CHECK(out && strstr(out, "128803") != NULL);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s' --safe", bin, ds);
    CHECK_EQ_INT(run(cmd, inj, strlen(inj), &out, NULL), 0);
    CHECK(out && strstr(out, "128803") == NULL);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s' --add-special --threads 2", bin, ds);
    CHECK_EQ_INT(run(cmd, "hello world", 11, &out, NULL), 0);
    CHECK_EQ_STR(out, "0 33310 2058\n");
    free(out);
    /* JSONL in order; Qwen3: "hello world" -> 14990 1879, "</think>" -> 151668 */
    const char *jl = "{\"text\": \"hello world\"}\n\n{\"text\": \"</think>\"}\r\n{\"text\": \"\"}\n";
    snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s' --jsonl", bin, qw);
    CHECK_EQ_INT(run(cmd, jl, strlen(jl), &out, NULL), 0);
    CHECK_EQ_STR(out, "{\"ids\": [14990, 1879]}\n{\"ids\": [151668]}\n{\"ids\": []}\n");
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s' --jsonl --safe", bin, qw);
    CHECK_EQ_INT(run(cmd, jl, strlen(jl), &out, NULL), 0);
    CHECK(out && strstr(out, "151668") == NULL);
    free(out);
    /* detokenize */
    snprintf(cmd, sizeof cmd, "'%s' detokenize --tokenizer '%s'", bin, ds);
    CHECK_EQ_INT(run(cmd, "0, 33310 2058\n", 14, &out, NULL), 0);
    CHECK_EQ_STR(out, "<｜begin▁of▁sentence｜>hello world");
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' detokenize --tokenizer '%s' --skip-special", bin, ds);
    CHECK_EQ_INT(run(cmd, "[0, 33310, 2058]", 16, &out, NULL), 0);
    CHECK_EQ_STR(out, "hello world");
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' detokenize --tokenizer '%s' --jsonl", bin, qw);
    const char *dj = "{\"ids\": [14990, 1879]}\n{\"ids\": [151668, 220]}\n";
    CHECK_EQ_INT(run(cmd, dj, strlen(dj), &out, NULL), 0);
    CHECK_EQ_STR(out, "{\"text\":\"hello world\"}\n{\"text\":\"</think> \"}\n");
    free(out);
    /* errors */
    snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer /nonexistent", bin);
    CHECK_EQ_INT(run(cmd, "x", 1, &out, &err), 1);
    CHECK(err && strstr(err, "/nonexistent"));
    free(out); free(err);
    snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s'", bin, ds);
    CHECK_EQ_INT(run(cmd, "ab\xff", 3, &out, &err), 1);
    CHECK(err && strstr(err, "byte offset 2"));
    free(out); free(err);
    snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s' --jsonl", bin, ds);
    CHECK_EQ_INT(run(cmd, "{\"text\": \"ok\"}\n{\"txt\": 1}\n", 26, &out, &err), 1);
    CHECK(err && strstr(err, "line 2"));
    CHECK(out && strstr(out, "{\"ids\": [")); /* the first line was answered */
    free(out); free(err);
    snprintf(cmd, sizeof cmd, "'%s' detokenize --tokenizer '%s'", bin, ds);
    CHECK_EQ_INT(run(cmd, "12 x", 4, &out, &err), 1);
    CHECK(err && strstr(err, "byte 3"));
    free(out); free(err);
    snprintf(cmd, sizeof cmd, "'%s' tokenize", bin);
    CHECK_EQ_INT(run(cmd, "", 0, &out, &err), 2);
    CHECK(err && strstr(err, "--tokenizer"));
    free(out); free(err);
    snprintf(cmd, sizeof cmd, "'%s' tokenize --help", bin);
    CHECK_EQ_INT(run(cmd, "", 0, &out, NULL), 0);
    CHECK(out && strstr(out, "--jsonl"));
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' detokenize --help", bin);
    CHECK_EQ_INT(run(cmd, "", 0, &out, NULL), 0);
    CHECK(out && strstr(out, "--skip-special"));
    free(out);
}

TEST_MAIN(test_cli)
