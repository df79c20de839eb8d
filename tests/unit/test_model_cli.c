/* test_model_cli.c - `deepinfer logits` through the real binary ($DI_BIN): the output file is
 * float32 LE [n_ids, vocab] and equals the in-process forward pass bit for bit in both modes;
 * every kind of bad invocation exits non-zero with a message naming the problem. */
#include <stdio.h>
#include <sys/stat.h>

#include "core/mmap_file.h"
#include "core/status.h"
#include "io/mkmodel.h"
#include "model/model.h"
#include "test_util.h"
#include "cli_test_util.h"

static char g_model[512], g_tmp[256];

/* Runs `$DI_BIN logits <args>`; returns the exit status; stderr goes to g_tmp/err.txt,
 * stdout to g_tmp/out.txt. */
static int run_cli(const char *args) {
    const char *bin = getenv("DI_BIN");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s logits %s 2>%s/err.txt >%s/out.txt", bin ? bin : "deepinfer", args, g_tmp, g_tmp);
    return test_run(cmd);
}
static int err_has(const char *needle) {
    char p[600], *txt = NULL;
    size_t n = 0;
    snprintf(p, sizeof p, "%s/err.txt", g_tmp);
    if (di_read_file(p, &txt, &n, 0) != DI_OK) return 0;
    int ok = strstr(txt, needle) != NULL;
    if (!ok) fprintf(stderr, "   stderr was: %s\n", txt);
    free(txt);
    return ok;
}

static void setup(void) {
    const char *root = getenv("DI_BUILD_DIR");
    snprintf(g_tmp, sizeof g_tmp, "%.200s/test_model_cli", root ? root : "/tmp");
    mkdir(g_tmp, 0755);
    snprintf(g_model, sizeof g_model, "%s/tiny-v3", g_tmp);
    test_make_model("tiny-v3", 3, g_model);
}

static void test_output_matches_library(void) {
    const int32_t ids[5] = {0, 17, 511, 42, 42};
    di_model *m = NULL;
    di_model_options o = {0};
    o.kv_blocks = 1;
    CHECK_OK(di_model_load(g_model, &o, &m));
    if (!m) return;
    int V = di_model_config_of(m)->vocab_size;
    float *want = malloc((size_t)5 * V * 4);
    int32_t pos[5] = {0, 1, 2, 3, 4}, bt[1] = {0}, ss[2] = {0, 5}, ctx = 5;
    di_batch b = {5, ids, pos, pos, 1, 0, ss, &ctx, bt, 1, 5, pos};
    CHECK_OK(di_model_forward(m, &b, want));
    for (int mode = 0; mode < 2; mode++) {
        char args[4096], out[600];
        snprintf(out, sizeof out, "%s/out%d.bin", g_tmp, mode);
        snprintf(args, sizeof args, "--model %s --ids 0,17,511,42,42 --mode %s --threads 2 --out %s", g_model,
                 mode ? "decode" : "prefill", out);
        CHECK_EQ_INT(run_cli(args), 0);
        char *data = NULL;
        size_t n = 0;
        CHECK_OK(di_read_file(out, &data, &n, 0));
        CHECK_EQ_INT(n, (size_t)5 * V * 4);
        if (data && n == (size_t)5 * V * 4) {
            if (mode == 0) CHECK_MSG(memcmp(data, want, n) == 0, "CLI prefill logits differ from di_model_forward");
            double md = 0, mr = 0;
            const float *f = (const float *)data;
            for (int i = 0; i < 5 * V; i++) {
                md = fmax(md, fabs(f[i] - want[i]));
                mr = fmax(mr, fabs(want[i]));
            }
            CHECK_MSG(md / mr < 1e-5, "mode %d: rel diff %g", mode, md / mr);
        }
        free(data);
    }
    /* --dtype f32 (spelled float32) is the CPU's own precision: the same bits as the library */
    {
        char args[4096], out[600], *data = NULL;
        size_t n = 0;
        snprintf(out, sizeof out, "%s/out_f32.bin", g_tmp);
        snprintf(args, sizeof args, "--model %s --ids 0,17,511,42,42 --dtype float32 --threads 2 --out %s", g_model, out);
        CHECK_EQ_INT(run_cli(args), 0);
        CHECK_OK(di_read_file(out, &data, &n, 0));
        CHECK_MSG(data && n == (size_t)5 * V * 4 && memcmp(data, want, n) == 0, "--dtype f32 logits differ");
        free(data);
    }
    free(want);
    di_model_free(m);
}

/* --generate: the printed ids are the argmax continuation (checked by re-running the whole
 * sequence through the library in one prefill). */
static void test_generate(void) {
    char a[4096], p[600], *txt = NULL;
    snprintf(a, sizeof a, "--model %s --ids 5,6,7 --out %s/g.bin --generate 6", g_model, g_tmp);
    CHECK_EQ_INT(run_cli(a), 0);
    snprintf(p, sizeof p, "%s/out.txt", g_tmp);
    size_t len = 0;
    CHECK_OK(di_read_file(p, &txt, &len, 0));
    if (!txt) return;
    int32_t ids[16] = {5, 6, 7};
    int n = 3;
    for (char *q = txt; *q && *q != '\n' && n < 16;) {
        ids[n++] = (int32_t)strtol(q, &q, 10);
        if (*q == ',') q++;
    }
    free(txt);
    CHECK(n > 3);
    di_model *m = NULL;
    di_model_options o = {0};
    o.kv_blocks = 1;
    CHECK_OK(di_model_load(g_model, &o, &m));
    if (!m) return;
    int V = di_model_config_of(m)->vocab_size;
    float *lg = malloc((size_t)n * V * 4);
    int32_t pos[16], bt[1] = {0}, ss[2] = {0, n}, ctx = n;
    for (int i = 0; i < n; i++) pos[i] = i;
    di_batch b = {n, ids, pos, pos, 1, 0, ss, &ctx, bt, 1, n, pos};
    CHECK_OK(di_model_forward(m, &b, lg));
    for (int i = 2; i + 1 < n; i++) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (lg[(size_t)i * V + v] > lg[(size_t)i * V + best]) best = v;
        CHECK_EQ_INT(ids[i + 1], best);
    }
    free(lg);
    di_model_free(m);
}

static void test_bad_invocations(void) {
    char a[4096];
    CHECK_EQ_INT(run_cli("--help"), 0);
    snprintf(a, sizeof a, "--model %s --ids 1,2", g_model);
    CHECK(run_cli(a) != 0 && err_has("--out"));
    snprintf(a, sizeof a, "--model %s --ids 1,2 --mode sideways --out %s/x.bin", g_model, g_tmp);
    CHECK(run_cli(a) != 0 && err_has("sideways"));
    snprintf(a, sizeof a, "--model %s --ids 1,x --out %s/x.bin", g_model, g_tmp);
    CHECK(run_cli(a) != 0 && err_has("--ids"));
    snprintf(a, sizeof a, "--model %s --ids 1,512 --out %s/x.bin", g_model, g_tmp);
    CHECK(run_cli(a) != 0 && err_has("512"));
    snprintf(a, sizeof a, "--model %s --ids 1,2, --out %s/x.bin", g_model, g_tmp);
    CHECK(run_cli(a) != 0 && err_has("--ids"));
    snprintf(a, sizeof a, "--model %s/nope --ids 1 --out %s/x.bin", g_tmp, g_tmp);
    CHECK(run_cli(a) != 0 && err_has("nope"));
    snprintf(a, sizeof a, "--model %s --ids 1 --out %s/no/such/dir/x.bin", g_model, g_tmp);
    CHECK(run_cli(a) != 0 && err_has("no/such/dir"));
    snprintf(a, sizeof a, "--model %s --ids 1 --bogus 3 --out %s/x.bin", g_model, g_tmp);
    CHECK(run_cli(a) != 0 && err_has("--bogus"));
    snprintf(a, sizeof a, "--model %s --ids 1 --generate -1 --out %s/x.bin", g_model, g_tmp);
    CHECK(run_cli(a) != 0 && err_has("--generate"));
    /* --dtype: an unknown name is a usage error; bf16 on the CPU is refused by name */
    snprintf(a, sizeof a, "--model %s --ids 1 --dtype fp16 --out %s/x.bin", g_model, g_tmp);
    CHECK(run_cli(a) == 2 && err_has("--dtype") && err_has("fp16"));
    snprintf(a, sizeof a, "--model %s --ids 1 --dtype bf16 --out %s/x.bin", g_model, g_tmp);
    CHECK(run_cli(a) != 0 && err_has("bf16") && err_has("CPU"));
#ifndef DI_HAVE_CUDA
    snprintf(a, sizeof a, "--model %s --ids 1 --device cuda --out %s/x.bin", g_model, g_tmp);
    CHECK(run_cli(a) != 0 && err_has("cuda"));
#endif
}

TEST_MAIN(setup, test_output_matches_library, test_generate, test_bad_invocations)
