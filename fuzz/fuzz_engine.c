/* fuzz_engine.c - libFuzzer target for the engine under hostile requests: a fuzzed request
 * line (or an array of up to three) is parsed as `deepinfer generate --input` parses it, queued
 * beside a fixed control request on a tiny generated model (CPU backend, a KV pool of a few
 * blocks, so admission limits, preemption by recompute and prefix-cache reuse all happen), and
 * the engine is stepped until every request is finished, with an optional abort of a fuzzed
 * request part-way. Checked on every input:
 *   - nothing crashes, leaks or reads out of bounds (ASan + UBSan), every error has a message;
 *   - the engine finishes within a bounded number of steps (no livelock under preemption);
 *   - the control request's output (tokens, logprobs, text, finish reasons) is bit for bit the
 *     output it had alone on a fresh engine, and so is every fuzzed request's that draws
 *     reproducibly (a seed, or greedy) and was not aborted, against its own run alone: no
 *     request may change what another one gets.
 * Fuzzed requests are capped at 8 new tokens and 4 completions so an input runs in milliseconds.
 *
 *   bash fuzz/build_inputs_fuzz.sh fuzz_engine && build-fuzz/fuzz_engine -max_total_time=60 -rss_limit_mb=4096 \
 *       -dict=fuzz/inputs.dict fuzz/corpus/engine
 * Input: byte 0 = flags (bit 0: control request queued last; bits 1-3: abort the first fuzzed
 * request after that many steps, 0 = never), then a JSON request object or array of objects.
 * Environment: DI_FUZZ_PRESET (mkmodel preset, default tiny-v3), DI_FUZZ_KV_BLOCKS (default 6),
 * DI_FUZZ_BATCH_TOKENS (default 96), DI_FUZZ_DIR (where the model is written, default /tmp).
 * The CPU suite replays fuzz/corpus/engine through this file (tests/unit/test_fuzz_engine_corpus.c). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"
#include "deepinfer.h"
#include "engine/engine_internal.h"
#include "engine/request_json.h"
#include "io/mkmodel.h"

enum { MAX_FUZZ_REQS = 3, MAX_NEW = 8, MAX_N = 4, MAX_STEPS = 400, CONTROL_N = 2, MAX_TOK = 64 };
enum { CONTROL_LEN = 80 }; /* a full block the prefix cache keeps between inputs, and a tail */

/* One completion's result, deep-copied from the engine's output. */
typedef struct result {
    int n_tokens;
    int32_t tokens[MAX_TOK];
    float logprob[MAX_TOK];
    int32_t top_tokens[MAX_TOK][3];
    float top_logprobs[MAX_TOK][3];
    char text[1024];
    int finish;
} result;

/* A request the run follows: its id and, once finished, its completions. */
typedef struct tracked {
    int64_t id;
    int done;
    int n_choices;
    result choice[MAX_N];
} tracked;

static di_engine *g_engine; /* the engine the inputs share (its prefix cache lives on) */
static di_engine *g_alone;  /* the engine each deterministic request also runs on alone */
static tracked g_control_ref;
static int32_t g_control_ids[CONTROL_LEN];

static void fail(const char *what) {
    fprintf(stderr, "fuzz_engine: %s\n", what);
    abort();
}

static void check_message(di_status s) {
    if (s != DI_OK && !di_last_error()[0]) {
        fprintf(stderr, "fuzz_engine: error %d without a message\n", (int)s);
        abort();
    }
    di_error_clear();
}

static void control_request(di_request_input *r) {
    di_request_input_init(r);
    r->prompt_ids = g_control_ids;
    r->n_prompt_ids = CONTROL_LEN;
    r->sampling.n = CONTROL_N;
    r->sampling.max_tokens = MAX_NEW;
    r->sampling.temperature = 0.8f;
    r->sampling.top_p = 0.9f;
    r->sampling.has_seed = 1;
    r->sampling.seed = 1234;
    r->sampling.logprobs = 3;
    r->sampling.ignore_eos = 1;
}

static void copy_result(const di_completion_output *c, result *out) {
    memset(out, 0, sizeof *out);
    if (c->n_tokens > MAX_TOK) fail("a request produced more tokens than it asked for");
    out->n_tokens = (int)c->n_tokens;
    for (size_t i = 0; i < c->n_tokens; i++) {
        out->tokens[i] = c->token_ids[i];
        if (!c->logprobs) continue;
        out->logprob[i] = c->logprobs[i].logprob;
        for (int j = 0; j < c->logprobs[i].n_top && j < 3; j++) {
            out->top_tokens[i][j] = c->logprobs[i].top_tokens[j];
            out->top_logprobs[i][j] = c->logprobs[i].top_logprobs[j];
        }
    }
    snprintf(out->text, sizeof out->text, "%.*s", (int)c->text_len, c->text);
    out->finish = (int)c->finish_reason;
}

static di_engine *make_engine(void) {
    static char dir[256];
    if (!dir[0]) {
        const char *preset = getenv("DI_FUZZ_PRESET") ? getenv("DI_FUZZ_PRESET") : "tiny-v3";
        const char *root = getenv("DI_FUZZ_DIR");
        if (root) snprintf(dir, sizeof dir, "%s/fuzz_engine_%s", root, preset); /* rewritten each run */
        else snprintf(dir, sizeof dir, "/tmp/deepinfer_fuzz_engine_%d_%s", (int)getpid(), preset);
        di_model_config cfg;
        di_mk_dtype dt;
        if (di_mkmodel_preset(preset, &cfg, &dt) != DI_OK) fail(di_last_error());
        di_mkmodel_opts o = {0};
        o.seed = 1;
        o.dtype = DI_MK_BF16;
        o.n_threads = 1;
        if (di_mkmodel_write(&cfg, &o, dir) != DI_OK) fail(di_last_error());
    }
    di_engine_params ep;
    di_engine_params_init(&ep);
    ep.model_dir = dir;
    ep.n_threads = 1;
    /* 384 tokens: a few long requests preempt each other */
    ep.kv_blocks = getenv("DI_FUZZ_KV_BLOCKS") ? atoi(getenv("DI_FUZZ_KV_BLOCKS")) : 6;
    ep.max_model_len = 256;
    ep.max_seqs = 8;
    /* chunked prefill of longer prompts */
    ep.max_batch_tokens = getenv("DI_FUZZ_BATCH_TOKENS") ? atoi(getenv("DI_FUZZ_BATCH_TOKENS")) : 96;
    di_engine *e = NULL;
    if (di_engine_create(&ep, &e) != DI_OK) fail(di_last_error());
    return e;
}

/* Steps e until nothing is unfinished, recording the finished outputs of the n tracked
 * requests; aborts request abort_id before step abort_after (0: never). Every output must
 * serialise as `generate --output` writes it. */
static void run_to_end(di_engine *e, tracked *t, int n, int64_t abort_id, int abort_after) {
    for (int step = 0; di_engine_has_unfinished(e); step++) {
        if (step == MAX_STEPS) fail("the engine did not finish within the step bound");
        if (abort_after && step == abort_after) check_message(di_engine_abort(e, abort_id));
        const di_request_output *const *outs = NULL;
        size_t n_outs = 0;
        di_status s = di_engine_step(e, &outs, &n_outs);
        if (s != DI_OK) {
            fprintf(stderr, "fuzz_engine: step %d failed: %s\n", step, di_last_error());
            abort();
        }
        for (size_t i = 0; i < n_outs; i++) {
            const di_request_output *o = outs[i];
            for (int k = 0; k < n && o->finished; k++) {
                if (t[k].id != o->request_id) continue;
                if (o->n_choices > MAX_N) fail("more completions than asked for");
                t[k].n_choices = (int)o->n_choices;
                for (size_t c = 0; c < o->n_choices; c++) copy_result(&o->choices[c], &t[k].choice[c]);
                t[k].done = 1;
            }
            json_t *j = di_request_output_json(o, NULL);
            if (!j) fail("output JSON failed");
            char *txt = json_dumps(j, JSON_COMPACT);
            if (!txt) fail("output JSON did not serialise");
            free(txt);
            json_decref(j);
        }
    }
}

/* Runs r alone on g_alone into *t. */
static void run_alone(const di_request_input *r, tracked *t) {
    memset(t, 0, sizeof *t);
    if (di_engine_add_request(g_alone, r, &t->id) != DI_OK) fail(di_last_error());
    run_to_end(g_alone, t, 1, -1, 0);
    if (!t->done) fail("a request did not finish alone");
}

static void init_once(void) {
    if (g_engine) return;
    for (int i = 0; i < CONTROL_LEN; i++) g_control_ids[i] = 3 + (i * 37 + 11) % 250;
    g_alone = make_engine();
    di_request_input r;
    control_request(&r);
    run_alone(&r, &g_control_ref);
    g_engine = make_engine();
}

static int same(const result *a, const result *b) {
    return a->n_tokens == b->n_tokens && a->finish == b->finish && !strcmp(a->text, b->text) &&
           !memcmp(a->tokens, b->tokens, sizeof a->tokens) && !memcmp(a->logprob, b->logprob, sizeof a->logprob) &&
           !memcmp(a->top_tokens, b->top_tokens, sizeof a->top_tokens) &&
           !memcmp(a->top_logprobs, b->top_logprobs, sizeof a->top_logprobs);
}

/* got (batched) must equal ref (alone) completion by completion */
static void compare(const char *what, const tracked *got, const tracked *ref) {
    if (got->n_choices != ref->n_choices) {
        fprintf(stderr, "fuzz_engine: %s: %d completions batched, %d alone\n", what, got->n_choices, ref->n_choices);
        abort();
    }
    for (int c = 0; c < got->n_choices; c++) {
        const result *g = &got->choice[c], *f = &ref->choice[c];
        if (same(g, f)) continue;
        fprintf(stderr, "fuzz_engine: %s, completion %d differs from its run alone (%d vs %d tokens)\n", what, c,
                g->n_tokens, f->n_tokens);
        for (int i = 0; i < g->n_tokens || i < f->n_tokens; i++)
            fprintf(stderr, "  %d: token %d vs %d, logprob %.9g vs %.9g, top %d/%d/%d vs %d/%d/%d\n", i, g->tokens[i],
                    f->tokens[i], g->logprob[i], f->logprob[i], g->top_tokens[i][0], g->top_tokens[i][1],
                    g->top_tokens[i][2], f->top_tokens[i][0], f->top_tokens[i][1], f->top_tokens[i][2]);
        fprintf(stderr, "  text \"%s\" vs \"%s\", finish %d vs %d\n", g->text, f->text, g->finish, f->finish);
        abort();
    }
}

/* Parses one fuzzed request object into *rj and caps its size; 0 when it does not parse. */
static int parse_fuzzed(const json_t *obj, int k, di_request_json *rj) {
    di_request_input def;
    di_request_input_init(&def);
    def.sampling.max_tokens = MAX_NEW;
    char where[32];
    snprintf(where, sizeof where, "fuzz request %d", k);
    di_status s = di_request_json_parse(obj, &def, where, di_engine_tokenizer(g_engine), 0, rj);
    check_message(s);
    if (s != DI_OK) return 0;
    di_sampling_params *p = &rj->in.sampling;
    if (p->max_tokens <= 0 || p->max_tokens > MAX_NEW) p->max_tokens = MAX_NEW;
    if (p->n > MAX_N) p->n = MAX_N;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    init_once();
    const int control_last = data[0] & 1, abort_after = (data[0] >> 1) & 7;
    json_error_t je;
    json_t *root = json_loadb((const char *)data + 1, size - 1, 0, &je);
    if (!root) return 0;
    di_request_json rj[MAX_FUZZ_REQS];
    int parsed[MAX_FUZZ_REQS] = {0}, n_fuzz = 0;
    if (json_is_array(root)) {
        for (size_t i = 0; i < json_array_size(root) && n_fuzz < MAX_FUZZ_REQS; i++, n_fuzz++)
            parsed[n_fuzz] = parse_fuzzed(json_array_get(root, i), n_fuzz, &rj[n_fuzz]);
    } else {
        parsed[0] = parse_fuzzed(root, 0, &rj[0]);
        n_fuzz = 1;
    }
    json_decref(root);

    /* t[0]: the control; t[1 + k]: fuzzed request k (id -1: refused) */
    tracked t[1 + MAX_FUZZ_REQS];
    memset(t, 0, sizeof t);
    for (int k = 0; k <= MAX_FUZZ_REQS; k++) t[k].id = -1;
    di_request_input ctl_req;
    control_request(&ctl_req);
    if (!control_last && di_engine_add_request(g_engine, &ctl_req, &t[0].id) != DI_OK) fail(di_last_error());
    for (int k = 0; k < n_fuzz; k++)
        if (parsed[k]) check_message(di_engine_add_request(g_engine, &rj[k].in, &t[1 + k].id));
    if (control_last && di_engine_add_request(g_engine, &ctl_req, &t[0].id) != DI_OK) fail(di_last_error());
    const int64_t aborted = t[1].id;
    run_to_end(g_engine, t, 1 + n_fuzz, aborted, aborted >= 0 ? abort_after : 0);
    if (!t[0].done) fail("the control request did not finish");
    compare("the control request", &t[0], &g_control_ref);
    /* every fuzzed request that ran whole and draws reproducibly (a seed, or greedy) gets what
     * it gets alone */
    for (int k = 0; k < n_fuzz; k++) {
        if (!parsed[k]) continue;
        const di_sampling_params *p = &rj[k].in.sampling;
        if (t[1 + k].id >= 0 && t[1 + k].done && !(abort_after && t[1 + k].id == aborted) &&
            (p->has_seed || p->temperature < 1e-5f)) {
            tracked alone;
            run_alone(&rj[k].in, &alone);
            char what[40];
            snprintf(what, sizeof what, "fuzzed request %d", k);
            compare(what, &t[1 + k], &alone);
        }
        di_request_json_free(&rj[k]);
    }
    return 0;
}
