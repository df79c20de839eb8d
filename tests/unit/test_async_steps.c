/* test_async_steps.c - asynchronous decode steps and the decode-step graphs, on the CPU.
 *
 * Only the CUDA backend has graphs, asynchronous copies and a device sampler, so the code that
 * uses them (model/decode_step.c, model/decode_async.c: graph capture per bucket and parity,
 * chained launches) otherwise runs only on the GPU.
 * Here the CPU backend is wrapped as a fake asynchronous stream (fake_stream_backend.h: every op
 * queued and run only when the host waits, as on a GPU that is always behind; graphs captured
 * and replayed; copies on lanes with fences; the host sampler as the device sampler) and the
 * GPU test's scenario runs on it (async_steps_util.h): for each order a copy lane may take
 * (copy_in ahead of the queued ops, or in queue order reading its source only then) and each
 * way the graphs come about (a synchronous run first, captured up front, the asynchronous run
 * first), and with the side lane run late or early, chained steps with prompts leaving the
 * batch and a forward between two steps give the tokens of steps run one by one and of the
 * plain CPU model, bit for bit; the fake sees no contract violation (a fence waited on before
 * any copy marked it, an upload, copy or wait inside a capture); graphs were captured and
 * replayed and copies went both ways. And a steady-state asynchronous step costs the host one
 * metadata copy, one graph launch and one fence wait: no upload, download, sync, allocation or
 * capture. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "core/status.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "test_util.h"
#include "cli_test_util.h"
#include "fake_stream_backend.h"
#include "async_steps_util.h"

static unsigned long long g_rs = 0x9e3779b97f4a7c15ull; /* the prompts' random stream */

/* A tiny checkpoint made once per test run in the build directory. */
static const char *model_dir(const char *preset, char *dir, size_t n) {
    const char *root = getenv("DI_BUILD_DIR");
    snprintf(dir, n, "%s/test_async_steps", root ? root : "/tmp");
    mkdir(dir, 0755);
    snprintf(dir, n, "%s/test_async_steps/%s", root ? root : "/tmp", preset);
    test_make_model(preset, 5, dir);
    return dir;
}

/* The checkpoint on the CPU, sized for the scenario. */
static di_model *load_cpu(const char *dir) {
    di_model_options o = {0};
    o.device = DI_DEVICE_CPU;
    o.n_threads = 2;
    o.max_batch_tokens = GEN_PROMPTS * GEN_MAXP;
    o.max_seqs = 16;
    o.max_context = 128;
    o.kv_blocks = GEN_PROMPTS * 2 + 1; /* + SCRATCH_BLOCK */
    di_model *m = NULL;
    CHECK_OK(di_model_load(dir, &o, &m));
    return m;
}

/* The model on the CPU with its backend turned into the fake stream and its step state rebuilt
 * for it (graphs and asynchronous steps on). */
static di_model *load_fake(const char *dir) {
    di_model *m = load_cpu(dir);
    if (m) CHECK_OK(fs_model_install(m));
    return m;
}

/* One fake-stream configuration: the scenario on a fresh model, then the fake's own checks. */
static void run_config(const char *preset, const char *dir, int lanes, int deferred_in, int how, int *runs,
                       int *same) {
    di_model *m = load_fake(dir);
    if (!m) return;
    const int fused = lanes != FS_LANES_OFF || deferred_in; /* CUDA's fused ops too */
    g_fs.copy_in_deferred = deferred_in;
    g_fs.lanes = lanes;
    if (fused) fs_extensions(di_model_backend(m));
    char label[200];
    snprintf(label, sizeof label, "%s, side lane %s, copy_in %s, %s%s", preset,
             lanes == FS_LANES_OFF ? "off" : lanes == FS_LANES_LATE ? "late" : "early",
             deferred_in ? "in order" : "ahead", how == 0 ? "sync first" : how == 1 ? "warmed up" : "async first",
             fused ? ", fused ops" : "");
    async_model_runs(m, &g_rs, how, label, runs, same);
    CHECK_MSG(g_fs.violations == 0, "%s: %d contract violations (first: %s)", label, g_fs.violations, g_fs.why);
    /* each fused op taken: with the side lane the deferred experts, else the shared ones; the
     * dense layers' one-token SwiGLU as matmul_silu */
    const int dense = di_model_config_of(m)->first_k_dense_replace > 0;
    if (fused)
        CHECK_MSG(g_fs.fused[0] > 0 && g_fs.fused[1] > 0 &&
                      (lanes != FS_LANES_OFF ? g_fs.fused[3] > 0 && g_fs.fused[4] == g_fs.fused[3] : g_fs.fused[2] > 0) &&
                      (g_fs.fused[5] > 0) == dense,
                  "%s: fused ops taken: rope_kv_write %ld, mla_decode_uv %ld, shared %ld, defer %ld / %ld, "
                  "matmul_silu %ld (dense layers: %d)", label, g_fs.fused[0], g_fs.fused[1], g_fs.fused[2],
                  g_fs.fused[3], g_fs.fused[4], g_fs.fused[5], dense);
    CHECK_MSG(g_fs.captures > 0 && g_fs.launches > 0 && g_fs.copies_out > 0 && g_fs.copies_in > 0 &&
                  g_fs.fence_waits > 0 && (lanes == FS_LANES_OFF) == (g_fs.forks == 0),
              "%s: the asynchronous paths did not run (captures %ld, launches %ld, copies out %ld, in %ld, fence "
              "waits %ld, side-lane forks %ld)", label, g_fs.captures, g_fs.launches, g_fs.copies_out, g_fs.copies_in,
              g_fs.fence_waits, g_fs.forks);
    di_model_free(m);
    fs_release();
}

static void test_async_steps(void) {
#ifdef __SANITIZE_ADDRESS__
    static const char *const presets[] = {"tiny-v3"}; /* the unoptimized build: one checkpoint */
#else
    static const char *const presets[] = {"tiny-v3", "tiny-v2-lite"};
#endif
    const int n_presets = (int)(sizeof presets / sizeof presets[0]);
    int runs = 0, same = 0, configs = 0;
    for (int pi = 0; pi < n_presets; pi++) {
        char dir[1024];
        model_dir(presets[pi], dir, sizeof dir);
        /* the reference: the plain CPU model (no fake), whose synchronous tokens every run of the
         * fake must match (so a side-lane race cannot hide in the fake's own synchronous run) */
        g_async_ref = load_cpu(dir);
#ifdef __SANITIZE_ADDRESS__
        /* the unoptimized build: each copy order, each lane order, each way the graphs come
         * about once */
        run_config(presets[pi], dir, FS_LANES_OFF, 0, 1, &runs, &same);
        run_config(presets[pi], dir, FS_LANES_OFF, 1, 2, &runs, &same);
        run_config(presets[pi], dir, FS_LANES_LATE, 0, 0, &runs, &same);
        run_config(presets[pi], dir, FS_LANES_EARLY, 1, 2, &runs, &same);
        configs += 4;
#else
        /* no side lane: both copy orders x three ways the graphs come about */
        for (int deferred_in = 0; deferred_in < 2; deferred_in++)
            for (int how = 0; how < 3; how++, configs++)
                run_config(presets[pi], dir, FS_LANES_OFF, deferred_in, how, &runs, &same);
        /* the side lane run late (synchronous run first, and asynchronous first) and early;
         * each also with the other copy order */
        run_config(presets[pi], dir, FS_LANES_LATE, 0, 0, &runs, &same);
        run_config(presets[pi], dir, FS_LANES_LATE, 1, 2, &runs, &same);
        run_config(presets[pi], dir, FS_LANES_EARLY, 0, 1, &runs, &same);
        run_config(presets[pi], dir, FS_LANES_EARLY, 1, 2, &runs, &same);
        configs += 4;
#endif
        di_model_free(g_async_ref);
        g_async_ref = NULL;
    }
    fprintf(stderr, "  async steps on the fake stream: %d/%d runs identical to synchronous steps and to the plain "
                    "CPU model\n", same, runs);
#ifdef __SANITIZE_ADDRESS__
    CHECK(runs == configs * 8 && configs == n_presets * 4);
#else
    CHECK(runs == configs * 8 && configs == n_presets * 10);
#endif
    CHECK_EQ_INT(same, runs);
}

/* What a steady-state asynchronous decode step costs the host (issue 6: "a step loop with no
 * device allocation and no needless host-device synchronisation"): between steps 4 and
 * GEN_NEW - 2 of a second generation (the graphs captured in the first), each step is one
 * metadata copy in, one graph launch and one fence wait for the previous step's tokens; no
 * upload, download, sync, allocation or capture. */
static struct { long in, launches, waits, up, down, syncs, allocs, host_allocs, captures; } g_cost[2];
static int g_cost_on;
static void cost_hook(int step) {
    if (!g_cost_on || (step != 4 && step != GEN_NEW - 2)) return;
    int k = step != 4;
    g_cost[k].in = g_fs.copies_in;
    g_cost[k].launches = g_fs.launches;
    g_cost[k].waits = g_fs.fence_waits;
    g_cost[k].up = g_fs.uploads;
    g_cost[k].down = g_fs.downloads;
    g_cost[k].syncs = g_fs.syncs;
    g_cost[k].allocs = g_fs.allocs;
    g_cost[k].host_allocs = g_fs.host_allocs;
    g_cost[k].captures = g_fs.captures;
}

static void test_step_cost(void) {
    char dir[1024];
    model_dir("tiny-v3", dir, sizeof dir);
    g_async_step_hook = cost_hook;
    for (int lanes = 0; lanes < 2; lanes++) { /* without and with the side lane and the fused ops */
        di_model *m = load_fake(dir);
        if (!m) continue;
        g_fs.lanes = lanes ? FS_LANES_LATE : FS_LANES_OFF;
        if (lanes) fs_extensions(di_model_backend(m));
        static int32_t prompts[GEN_PROMPTS][GEN_MAXP], out[GEN_PROMPTS][GEN_NEW];
        int plen[GEN_PROMPTS];
        async_make_prompts(prompts, plen, di_model_config_of(m)->vocab_size, &g_rs);
        g_cost_on = 0;
        CHECK_OK(generate_steps(m, prompts, plen, GEN_PROMPTS, 0.0f, 1, out)); /* captures the graphs */
        g_cost_on = 1;
        CHECK_OK(generate_steps(m, prompts, plen, GEN_PROMPTS, 0.9f, 1, out));
        g_cost_on = 0;
        const long n = GEN_NEW - 2 - 4;
        fprintf(stderr, "  side lane %s: over %ld steady steps: copies in %ld, graph launches %ld, fence waits %ld, "
                        "uploads %ld, downloads %ld, syncs %ld, allocations %ld + %ld pinned, captures %ld\n",
                lanes ? "on" : "off", n,
                g_cost[1].in - g_cost[0].in, g_cost[1].launches - g_cost[0].launches, g_cost[1].waits - g_cost[0].waits,
                g_cost[1].up - g_cost[0].up, g_cost[1].down - g_cost[0].down, g_cost[1].syncs - g_cost[0].syncs,
                g_cost[1].allocs - g_cost[0].allocs, g_cost[1].host_allocs - g_cost[0].host_allocs,
                g_cost[1].captures - g_cost[0].captures);
        CHECK_EQ_INT(g_cost[1].in - g_cost[0].in, n);
        CHECK_EQ_INT(g_cost[1].launches - g_cost[0].launches, n);
        CHECK_EQ_INT(g_cost[1].waits - g_cost[0].waits, n);
        CHECK_EQ_INT(g_cost[1].up - g_cost[0].up, 0);
        CHECK_EQ_INT(g_cost[1].down - g_cost[0].down, 0);
        CHECK_EQ_INT(g_cost[1].syncs - g_cost[0].syncs, 0);
        CHECK_EQ_INT(g_cost[1].allocs - g_cost[0].allocs, 0);
        CHECK_EQ_INT(g_cost[1].host_allocs - g_cost[0].host_allocs, 0);
        CHECK_EQ_INT(g_cost[1].captures - g_cost[0].captures, 0);
        CHECK(g_fs.violations == 0);
        di_model_free(m);
        fs_release();
    }
    g_async_step_hook = NULL;
}

TEST_MAIN(test_async_steps, test_step_cost)
