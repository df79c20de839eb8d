/* test_engine_sample_path.c - the engine's two sampling paths give the same tokens.
 *
 * With an executor that can sample (di_executor.forward_sample, the real model through
 * di_model_forward_sample_rows; on the CPU backend it samples on the host with the model's own
 * sampler from a di_sample_row, on CUDA on the device), the engine samples inside the executor
 * whenever every row of the step fits di_sample_row, and on the host (logits back, the engine's
 * sampler with penalties / bias / masks / logprobs / n > 1 forks) otherwise. On the shipped
 * model (models/pycoder-moe, CPU) this test runs the same seeded requests through an engine with
 * executor sampling on and one with it off and requires identical tokens and finish reasons:
 *   - requests that all fit (greedy, temperature, top-k, top-p, min-p, seeded and derived
 *     seeds): every step is sampled in the executor;
 *   - a mix with logprobs, penalties, logit bias, min_tokens and n = 3 that finish early: the
 *     steps they take part in fall back to the host, the later ones do not;
 *   - a row the executor fails to sample (status NaN, injected): only that request is aborted,
 *     with an error naming the reason, and the others finish unchanged (synchronous and
 *     asynchronous steps);
 *   - asynchronous steps (the next decode step launched chained to the one in flight,
 *     executor.h launch_sample) give the tokens of synchronous ones, also with requests
 *     arriving and aborted while a chained step is in flight.
 * The asynchronous tests run again with the executor's model on the fake asynchronous stream
 * (fake_stream_backend.h: the CPU backend with queued ops, graphs, copy lanes and fences), so
 * that its steps take the device path of model/decode_async.c, in three configurations (plain;
 * the decode graphs captured up front and the side lane run late; the side lane run early;
 * both with the side lane also with CUDA's fused ops): host-
 * sampled steps between device steps, chained steps, arrivals, aborts and an injected failed
 * row must give the same tokens there too, and the fake must see no contract violation.
 * The same comparison on the GPU (device sampler, CUDA graphs) is tests/ops/test_cuda_pycoder.c. */
#include "core/status.h"
#include "deepinfer.h"
#include "engine/engine_internal.h"
#include "model/model_internal.h"
#include "test_util.h"
#include "fake_stream_backend.h"

enum { N_REQ = 12, MAX_NEW = 12 };

static int32_t g_prompts[N_REQ][24];
static int g_plen[N_REQ];

static void make_prompts(void) {
    /* short Python-like id runs from the model's vocabulary (BOS first) */
    for (int r = 0; r < N_REQ; r++) {
        g_plen[r] = 5 + (r * 7) % 17;
        g_prompts[r][0] = 0;
        for (int j = 1; j < g_plen[r]; j++) g_prompts[r][j] = 200 + (r * 131 + j * 977) % 7000;
    }
}

/* Request r of a set: mixed = 0 only executor-compatible parameters; 1 adds host-only ones. */
static void request(int r, int mixed, di_request_input *in) {
    di_request_input_init(in);
    in->prompt_ids = g_prompts[r];
    in->n_prompt_ids = (size_t)g_plen[r];
    di_sampling_params *p = &in->sampling;
    p->max_tokens = MAX_NEW;
    p->has_seed = r % 4 != 3; /* every 4th: seed derived from the engine seed and request id */
    p->seed = 1000 + (uint64_t)r * 7919;
    p->ignore_eos = r % 2;
    switch (r % 6) {
    case 0: p->temperature = 0.0f; break;
    case 1: p->temperature = 0.8f; p->top_p = 0.95f; break;
    case 2: p->temperature = 1.0f; break;
    case 3: p->temperature = 0.7f; p->top_k = 20; break;
    case 4: p->temperature = 1.3f; p->min_p = 0.05f; break;
    default: p->temperature = 0.9f; p->top_k = 50; p->top_p = 0.9f; p->min_p = 0.02f; break;
    }
    if (!mixed) return;
    static const int32_t bias_ids[2] = {261, 262};
    static const float bias_vals[2] = {3.0f, -5.0f};
    switch (r) {
    case 1: p->logprobs = 2; p->max_tokens = 3; break;
    case 2: p->presence_penalty = 0.5f; p->frequency_penalty = 0.3f; p->max_tokens = 4; break;
    case 5: p->repetition_penalty = 1.2f; p->max_tokens = 2; break;
    case 7: p->logit_bias_ids = bias_ids; p->logit_bias_values = bias_vals; p->n_logit_bias = 2; p->max_tokens = 3; break;
    case 8: p->min_tokens = 4; p->ignore_eos = 0; break; /* host until 4 tokens, then the executor */
    case 10: p->n = 3; p->temperature = 1.0f; break;     /* the first draw (fork) on the host */
    default: break;
    }
}

static di_status (*g_orig_fs)(void *, const di_batch *, const di_sample_row *, int32_t *, int32_t *);
static int g_fail_row = -1; /* inject a NaN status into this logits row of the next step */

static di_status failing_fs(void *ctx, const di_batch *b, const di_sample_row *rows, int32_t *tok, int32_t *st) {
    DI_TRY(g_orig_fs(ctx, b, rows, tok, st));
    if (g_fail_row >= 0 && g_fail_row < b->n_logits) {
        tok[g_fail_row] = -1;
        st[g_fail_row] = DI_SAMPLE_ERR_NAN;
        g_fail_row = -1;
    }
    return DI_OK;
}

/* the same injection on the asynchronous path (the row of the next collected step) */
static di_status (*g_orig_collect)(void *, int32_t *, int32_t *);
static di_status failing_collect(void *ctx, int32_t *tok, int32_t *st) {
    DI_TRY(g_orig_collect(ctx, tok, st));
    if (g_fail_row >= 0) {
        tok[g_fail_row] = -1;
        st[g_fail_row] = DI_SAMPLE_ERR_NAN;
        g_fail_row = -1;
    }
    return DI_OK;
}

static int g_fake = -1; /* >= 0: asynchronous engines run on the fake stream in this configuration */

/* The executor's model on the fake stream (one at a time), its step state rebuilt for it;
 * configuration 0: plain, 1: the decode graphs captured up front (as on CUDA) and the side lane
 * run late, 2: the side lane run early; 1 and 2 with CUDA's fused ops. */
static void use_fake_stream(di_executor *ex, int config, int max_seqs) {
    di_model *m = di_executor_model_of(ex);
    CHECK_OK(fs_model_install(m));
    g_fs.lanes = config == 1 ? FS_LANES_LATE : config == 2 ? FS_LANES_EARLY : FS_LANES_OFF;
    if (config) fs_extensions(di_model_backend(m));
    if (config == 1) CHECK_OK(di_model_warmup_decode(m, max_seqs, NULL));
}

/* After an engine on the fake stream is freed: no contract violation, device steps ran. */
static void fake_stream_done(const char *what) {
    CHECK_MSG(g_fs.violations == 0, "%s on the fake stream (configuration %d): %d violations (first: %s)", what, g_fake,
              g_fs.violations, g_fs.why);
    CHECK_MSG(g_fs.launches > 0 && g_fs.copies_out > 0 && g_fs.fence_waits > 0 && (g_fake == 0) == (g_fs.forks == 0) &&
                  (g_fake == 0) == (g_fs.fused[0] == 0),
              "%s on the fake stream: no device steps (launches %ld, copies out %ld, side-lane forks %ld)", what,
              g_fs.launches, g_fs.copies_out, g_fs.forks);
    fs_release();
}

/* An engine over the CPU model: executor_sampling on / off, a failure injected into the
 * executor's sampling (inject), asynchronous launch / collect steps kept (async) or removed;
 * with g_fake >= 0, an asynchronous engine's model on the fake stream. */
static di_engine *engine(int executor_sampling, int inject, int async) {
    di_model_options mo = {0};
    mo.device = DI_DEVICE_CPU;
    mo.max_batch_tokens = 512;
    mo.max_seqs = 32;
    mo.kv_blocks = 64;
    di_executor ex;
    if (di_executor_model_create(test_src_path("models/pycoder-moe"), &mo, &ex) != DI_OK) {
        CHECK_MSG(0, "loading models/pycoder-moe: %s", di_last_error());
        return NULL;
    }
    CHECK(ex.forward_sample != NULL);
    if (!getenv("DEEPINFER_DEVICE_SAMPLING")) CHECK_EQ_INT(ex.device_sampling, 0); /* off on the CPU by default */
    ex.device_sampling = executor_sampling;
    CHECK(ex.launch_sample != NULL && ex.collect_sample != NULL);
    if (!async) ex.launch_sample = NULL, ex.collect_sample = NULL;
    if (async && g_fake >= 0) use_fake_stream(&ex, g_fake, mo.max_seqs);
    if (inject) {
        g_orig_fs = ex.forward_sample;
        ex.forward_sample = failing_fs;
        if (async) {
            g_orig_collect = ex.collect_sample;
            ex.collect_sample = failing_collect;
        }
    }
    di_engine_params ep;
    di_engine_params_init(&ep);
    ep.max_batch_tokens = mo.max_batch_tokens;
    ep.max_seqs = mo.max_seqs;
    ep.seed = 77;
    di_engine *e = NULL;
    CHECK_OK(di_engine_create_with(&ep, &ex, NULL, &e));
    return e;
}

/* Runs set `mixed` on an engine; fills tokens / finish per completion (3 per request). */
static void run_set(di_engine *e, int mixed, int32_t tok[N_REQ][3][MAX_NEW], int ntok[N_REQ][3], int fin[N_REQ][3]) {
    di_request_input in[N_REQ];
    for (int r = 0; r < N_REQ; r++) request(r, mixed, &in[r]);
    di_request_output *out = NULL;
    CHECK_OK(di_generate(e, in, N_REQ, &out));
    memset(ntok, 0, sizeof(int) * N_REQ * 3);
    for (int r = 0; out && r < N_REQ; r++)
        for (size_t k = 0; k < out[r].n_choices && k < 3; k++) {
            const di_completion_output *c = &out[r].choices[k];
            ntok[r][k] = (int)c->n_tokens;
            fin[r][k] = c->finish_reason;
            for (size_t j = 0; j < c->n_tokens && j < MAX_NEW; j++) tok[r][k][j] = c->token_ids[j];
        }
    if (out) di_generate_results_free(out, N_REQ);
}

/* Executor sampling (asynchronous steps when async) against host sampling. */
static void compare_paths(int mixed, int async) {
    static int32_t ta[N_REQ][3][MAX_NEW], tb[N_REQ][3][MAX_NEW];
    int na[N_REQ][3], nb[N_REQ][3], fa[N_REQ][3], fb[N_REQ][3];
    di_engine *a = engine(1, 0, async), *b = engine(0, 0, 0);
    if (!a || !b) {
        di_engine_free(a);
        di_engine_free(b);
        return;
    }
    run_set(a, mixed, ta, na, fa);
    run_set(b, mixed, tb, nb, fb);
    int same = 0, total = 0;
    for (int r = 0; r < N_REQ; r++)
        for (int k = 0; k < 3; k++) {
            if (!na[r][k] && !nb[r][k]) continue;
            total++;
            int eq = na[r][k] == nb[r][k] && fa[r][k] == fb[r][k] &&
                     !memcmp(ta[r][k], tb[r][k], (size_t)na[r][k] * sizeof(int32_t));
            same += eq;
            CHECK_MSG(eq, "set %d request %d completion %d: executor sampling gives %d tokens (finish %d), host %d (%d)",
                      mixed, r, k, na[r][k], fa[r][k], nb[r][k], fb[r][k]);
        }
    fprintf(stderr, "  set %s%s: %d/%d completions identical; steps sampled in the executor %llu (%llu chained), on "
                    "the host %llu (host-only engine: %llu / %llu)\n", mixed ? "mixed" : "executor-only",
            async ? ", asynchronous" : "", same, total, (unsigned long long)a->steps_sampled_in_executor,
            (unsigned long long)a->steps_chained, (unsigned long long)a->steps_sampled_on_host,
            (unsigned long long)b->steps_sampled_in_executor, (unsigned long long)b->steps_sampled_on_host);
    CHECK(total >= N_REQ);
    CHECK_EQ_INT(b->steps_sampled_in_executor, 0);
    CHECK(a->steps_sampled_in_executor > 0);
    if (async) CHECK(a->steps_chained > 0);
    if (mixed) CHECK(a->steps_sampled_on_host > 0); /* the host-only requests' steps */
    else CHECK_EQ_INT(a->steps_sampled_on_host, 0);
    /* the test must not pass on a degenerate generation: sampled completions differ between requests */
    int distinct = 0;
    for (int r = 1; r < N_REQ; r++) distinct += memcmp(ta[r][0], ta[0][0], sizeof ta[0][0]) != 0;
    CHECK(distinct >= N_REQ / 2);
    di_engine_free(a);
    di_engine_free(b);
    if (async && g_fake >= 0) fake_stream_done("mixed set");
}

static void test_same_tokens_executor_only(void) { compare_paths(0, 0); }
static void test_same_tokens_mixed(void) { compare_paths(1, 0); }
static void test_same_tokens_mixed_async(void) { compare_paths(1, 1); }

static void failed_row_aborts_one_request(int async) {
    di_engine *e = engine(1, 1, async), *ref = engine(1, 0, 0);
    if (!e || !ref) {
        di_engine_free(e);
        di_engine_free(ref);
        return;
    }
    static int32_t tr[N_REQ][3][MAX_NEW];
    int nr[N_REQ][3], fr[N_REQ][3];
    run_set(ref, 0, tr, nr, fr);
    di_request_input in[4];
    for (int r = 0; r < 4; r++) {
        request(r, 0, &in[r]);
        CHECK_OK(di_engine_add_request(e, &in[r], NULL));
    }
    int step = 0, errors = 0, finished = 0, aborted = -1;
    while (di_engine_has_unfinished(e) && step < 100) {
        if (step == 3) g_fail_row = 1; /* the second sampled row of the fourth step */
        const di_request_output *const *outs;
        size_t n;
        di_status s = di_engine_step(e, &outs, &n);
        if (s != DI_OK) {
            errors++;
            CHECK_MSG(strstr(di_last_error(), "a logit is NaN") != NULL, "error: %s", di_last_error());
        }
        for (size_t i = 0; i < n; i++) {
            if (!outs[i]->finished) continue;
            finished++;
            const di_completion_output *c = &outs[i]->choices[0];
            int r = (int)outs[i]->request_id;
            if (c->finish_reason == DI_FINISH_ABORT) {
                aborted = r;
                continue;
            }
            CHECK_MSG(c->n_tokens == (size_t)nr[r][0] && !memcmp(c->token_ids, tr[r][0], c->n_tokens * sizeof(int32_t)),
                      "request %d changed by another request's failure", r);
        }
        step++;
    }
    CHECK_EQ_INT(errors, 1);
    CHECK_EQ_INT(finished, 4);
    CHECK(aborted >= 0);
    if (async) CHECK(e->steps_chained > 0);
    di_engine_free(e);
    di_engine_free(ref);
    if (async && g_fake >= 0) fake_stream_done("a failed row");
}

static void test_failed_row_aborts_one_request(void) { failed_row_aborts_one_request(0); }
static void test_failed_row_aborts_one_request_async(void) { failed_row_aborts_one_request(1); }

/* Asynchronous steps (the next decode step launched chained to the one in flight) give the
 * tokens of synchronous ones: all-executor requests, greedy and seeded, half of them ending
 * at EOS (so chained steps of finished rows are discarded). */
static void test_async_same_tokens(void) {
    static int32_t ta[N_REQ][3][MAX_NEW], tb[N_REQ][3][MAX_NEW];
    int na[N_REQ][3], nb[N_REQ][3], fa[N_REQ][3], fb[N_REQ][3];
    di_engine *a = engine(1, 0, 1), *b = engine(1, 0, 0);
    if (!a || !b) {
        di_engine_free(a);
        di_engine_free(b);
        return;
    }
    run_set(a, 0, ta, na, fa);
    run_set(b, 0, tb, nb, fb);
    int same = 0;
    for (int r = 0; r < N_REQ; r++) {
        int eq = na[r][0] == nb[r][0] && fa[r][0] == fb[r][0] && !memcmp(ta[r][0], tb[r][0], (size_t)na[r][0] * 4);
        same += eq;
        CHECK_MSG(eq, "request %d: async %d tokens (finish %d), sync %d (%d)", r, na[r][0], fa[r][0], nb[r][0], fb[r][0]);
    }
    fprintf(stderr, "  %d/%d identical; async engine: %llu steps, %llu of them chained; sync engine %llu steps\n", same,
            N_REQ, (unsigned long long)a->stats.steps, (unsigned long long)a->steps_chained,
            (unsigned long long)b->stats.steps);
    CHECK(a->steps_chained > 0);
    CHECK_EQ_INT(b->steps_chained, 0);
    CHECK_EQ_INT(a->stats.steps, b->stats.steps); /* one step per call either way */
    di_engine_free(a);
    di_engine_free(b);
    if (g_fake >= 0) fake_stream_done("asynchronous steps");
}

/* Requests arriving and aborted while a chained step is in flight: the others' tokens are
 * those of an undisturbed run, an aborted request's tokens a prefix of its own. */
static void test_async_arrivals_and_aborts(void) {
    static int32_t tr[N_REQ][3][MAX_NEW];
    int nr[N_REQ][3], fr[N_REQ][3];
    di_engine *ref = engine(1, 0, 0), *e = engine(1, 0, 1);
    if (!e || !ref) {
        di_engine_free(e);
        di_engine_free(ref);
        return;
    }
    run_set(ref, 0, tr, nr, fr);
    di_request_input in[N_REQ];
    for (int r = 0; r < N_REQ; r++) request(r, 0, &in[r]);
    int64_t id[N_REQ];
    for (int r = 0; r < 4; r++) CHECK_OK(di_engine_add_request(e, &in[r], &id[r]));
    int step = 0, finished = 0, next = 4, aborted[N_REQ] = {0};
    int32_t got[N_REQ][MAX_NEW];
    int ngot[N_REQ] = {0};
    while ((di_engine_has_unfinished(e) || next < N_REQ) && step < 200) {
        if (step >= 3 && step % 3 == 0 && next < N_REQ) {
            CHECK_OK(di_engine_add_request(e, &in[next], &id[next]));
            next++;
        }
        if (step == 4 || step == 9) { /* abort the oldest unfinished request */
            for (int r = 0; r < next; r++)
                if (ngot[r] < nr[r][0] && !aborted[r]) {
                    CHECK_OK(di_engine_abort(e, id[r]));
                    aborted[r] = 1;
                    break;
                }
        }
        const di_request_output *const *outs;
        size_t n;
        CHECK_OK(di_engine_step(e, &outs, &n));
        for (size_t i = 0; i < n; i++) {
            int r = -1;
            for (int k = 0; k < next; k++)
                if (id[k] == outs[i]->request_id) r = k;
            if (r < 0) continue;
            const di_completion_output *c = &outs[i]->choices[0];
            ngot[r] = (int)c->n_tokens;
            memcpy(got[r], c->token_ids, c->n_tokens * sizeof(int32_t));
            finished += outs[i]->finished;
        }
        step++;
    }
    CHECK_EQ_INT(finished, N_REQ);
    int n_aborted = 0;
    for (int r = 0; r < N_REQ; r++) {
        n_aborted += aborted[r];
        int ok = aborted[r] ? ngot[r] <= nr[r][0] && !memcmp(got[r], tr[r][0], (size_t)ngot[r] * 4)
                            : ngot[r] == nr[r][0] && !memcmp(got[r], tr[r][0], (size_t)ngot[r] * 4);
        CHECK_MSG(ok, "request %d (%s): %d tokens, reference %d", r, aborted[r] ? "aborted" : "kept", ngot[r], nr[r][0]);
    }
    CHECK_EQ_INT(n_aborted, 2);
    fprintf(stderr, "  %d steps, %llu chained, %d aborted\n", step, (unsigned long long)e->steps_chained, n_aborted);
    CHECK(e->steps_chained > 0);
    di_engine_free(e);
    di_engine_free(ref);
    if (g_fake >= 0) fake_stream_done("arrivals and aborts");
}

int main(void) {
    make_prompts();
    RUN(test_same_tokens_executor_only);
    RUN(test_same_tokens_mixed);
    RUN(test_same_tokens_mixed_async);
    RUN(test_failed_row_aborts_one_request);
    RUN(test_failed_row_aborts_one_request_async);
    RUN(test_async_same_tokens);
    RUN(test_async_arrivals_and_aborts);
    for (g_fake = 0; g_fake < 3; g_fake++) { /* the asynchronous tests on the fake stream */
        fprintf(stderr, "-- on the fake asynchronous stream, configuration %d (side lane %s)\n", g_fake,
                g_fake == 0 ? "off" : g_fake == 1 ? "late, graphs warmed up" : "early");
        RUN(test_same_tokens_mixed_async);
        RUN(test_failed_row_aborts_one_request_async);
        RUN(test_async_same_tokens);
        RUN(test_async_arrivals_and_aborts);
    }
    fprintf(stderr, "%d checks, %d failures\n", g_test_checks, g_test_failures);
    return g_test_failures ? 1 : (g_test_checks ? 0 : 1);
}
