/* test_engine_model.c - the engine end to end on a real tiny model (mkmodel preset tiny-v3,
 * written into the build directory at test time) through the public API (di_engine_create,
 * di_generate, the step API): greedy outputs of 64 mixed-length requests are identical when
 * each runs alone, all in one batch, with the prefix cache off, with a KV pool so small that
 * preemption happens, and with small token budgets (chunked prefill), down to the bits of their
 * logprobs (the engine's exact recompute on the CPU backend); the first requests
 * also match an independent greedy reference (argmax of di_model_forward over the whole
 * context, no cache, one sequence). Seeded sampling is batch-independent and n > 1
 * completions (copy-on-write through di_model_copy_blocks) match single runs. Text: a text
 * prompt is encoded by the model's tokenizer (BOS added), the output text is the tokenizer's
 * decode of the output ids, and a stop string taken from that text cuts it exactly there. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "core/status.h"
#include "deepinfer.h"
#include "io/mkmodel.h"
#include "model/model.h"
#include "sampling/rng.h"
#include "test_util.h"
#include "cli_test_util.h"
#include "tokenizer/tokenizer.h"

enum { NREQ = 64, MAXP = 160, MAXNEW = 12 };

/* Under AddressSanitizer (an unoptimized build) the same checks run on fewer requests alone and
 * fewer engine configurations; the optimized build runs everything. */
#ifdef __SANITIZE_ADDRESS__
enum { N_ALONE = 4, N_CFGS = 3, PLEN = 40, SHARED = 70, TINY_POOL = 3 };
#else
enum { N_ALONE = NREQ, N_CFGS = 5, PLEN = MAXP, SHARED = 130, TINY_POOL = 6 };
#endif

static char g_dir[1024];

static const char *make_model(void) {
    const char *root = getenv("DI_BUILD_DIR");
    snprintf(g_dir, sizeof g_dir, "%s/test_engine_model", root ? root : "/tmp");
    mkdir(g_dir, 0755);
    snprintf(g_dir, sizeof g_dir, "%s/test_engine_model/tiny-v3", root ? root : "/tmp");
    test_make_model("tiny-v3", 11, g_dir);
    return g_dir;
}

typedef struct workload {
    di_request_input in[NREQ];
    int32_t prompts[NREQ][MAXP];
} workload;

static void make_workload(workload *w, int vocab) {
    for (int i = 0; i < NREQ; i++) {
        uint64_t h = di_rng_mix64((uint64_t)i + 77);
        int len = 1 + (int)(h % PLEN);
        if (i % 3 == 0 && len < SHARED + 1) len = SHARED + 1 + (int)(h % 20);
        if (i % 3 == 1) len = 56 + (int)(h % 8); /* decode crosses into a second block */
        for (int k = 0; k < len; k++) {
            /* a third share a SHARED-token prefix (one or two full blocks) */
            uint64_t src = (i % 3 == 0 && k < SHARED) ? (uint64_t)k : h + (uint64_t)k * 7919;
            w->prompts[i][k] = (int32_t)(2 + di_rng_mix64(src) % (uint64_t)(vocab - 2));
        }
        di_request_input_init(&w->in[i]);
        w->in[i].prompt_ids = w->prompts[i];
        w->in[i].n_prompt_ids = (size_t)len;
        w->in[i].sampling.temperature = 0;
        w->in[i].sampling.max_tokens = 1 + (int)((h >> 24) % ((int)PLEN < (int)MAXP ? 6 : MAXNEW));
        if (i % 3 == 1) w->in[i].sampling.max_tokens = 10;
        w->in[i].sampling.ignore_eos = i % 2;
        w->in[i].sampling.logprobs = 2; /* the raw logits' log-softmax: compared bit for bit */
    }
}

typedef struct result {
    int32_t toks[4][MAXNEW];
    float lp[4][MAXNEW][3]; /* with logprobs: the token's, then the two most likely tokens' */
    int n[4];
    int n_choices;
} result;

static void keep(const di_request_output *o, result *r) {
    memset(r, 0, sizeof *r);
    r->n_choices = (int)o->n_choices;
    for (size_t k = 0; k < o->n_choices && k < 4; k++) {
        r->n[k] = (int)o->choices[k].n_tokens;
        memcpy(r->toks[k], o->choices[k].token_ids, o->choices[k].n_tokens * sizeof(int32_t));
        const di_token_logprob *lp = o->choices[k].logprobs;
        for (size_t t = 0; lp && t < o->choices[k].n_tokens && t < MAXNEW; t++) {
            r->lp[k][t][0] = lp[t].logprob;
            r->lp[k][t][1] = lp[t].n_top > 0 ? lp[t].top_logprobs[0] : 0;
            r->lp[k][t][2] = lp[t].n_top > 1 ? lp[t].top_logprobs[1] : 0;
        }
    }
}

static di_engine *engine_at(const char *dir, int kv_blocks, int budget, int max_seqs, int prefix) {
    di_engine_params p;
    di_engine_params_init(&p);
    p.model_dir = dir;
    p.kv_blocks = kv_blocks;
    p.max_batch_tokens = budget;
    p.max_seqs = max_seqs;
    p.enable_prefix_cache = prefix;
    p.n_threads = 2;
    di_engine *e = NULL;
    CHECK_OK(di_engine_create(&p, &e));
    return e;
}
static di_engine *engine(int kv_blocks, int budget, int max_seqs, int prefix) {
    return engine_at(g_dir, kv_blocks, budget, max_seqs, prefix);
}

static void run(di_engine *e, const di_request_input *in, int n, result *out, di_engine_stats *st) {
    di_request_output *res = NULL;
    CHECK_OK(di_generate(e, in, (size_t)n, &res));
    if (res)
        for (int i = 0; i < n; i++) keep(&res[i], &out[i]);
    di_generate_results_free(res, (size_t)n);
    di_engine_get_stats(e, st);
    CHECK_EQ_INT(st->kv_blocks_free, st->kv_blocks_total);
}

/* the same tokens, and with lp the same logprob bits (the CPU backend's rows do not depend on
 * the batch, and the engine's exact recompute keeps every token's KV as first computed) */
static int same_lp(const result *a, const result *b, int lp) {
    if (a->n_choices != b->n_choices) return 0;
    for (int k = 0; k < a->n_choices; k++)
        if (a->n[k] != b->n[k] || memcmp(a->toks[k], b->toks[k], (size_t)a->n[k] * 4) ||
            (lp && memcmp(a->lp[k], b->lp[k], (size_t)a->n[k] * sizeof a->lp[k][0])))
            return 0;
    return 1;
}
static int same(const result *a, const result *b) { return same_lp(a, b, 1); }

/* greedy by full forward passes over the whole context (naive prefill path, no reuse) */
static void reference(di_model *m, const int32_t *prompt, int len, int max_new, int ignore_eos, result *r) {
    const di_model_config *c = di_model_config_of(m);
    int32_t ctx[MAXP + MAXNEW], pos[MAXP + MAXNEW], slots[MAXP + MAXNEW], table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
    memcpy(ctx, prompt, (size_t)len * 4);
    r->n_choices = 1;
    r->n[0] = 0;
    for (int t = 0; t < max_new; t++) {
        int n = len + t;
        for (int i = 0; i < n; i++) pos[i] = slots[i] = i;
        int32_t start[2] = {0, n}, ctx_len = n, row = n - 1;
        di_batch b = {.n_tokens = n, .token_ids = ctx, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                      .n_decode_seqs = 0, .seq_start = start, .seq_ctx_len = &ctx_len, .block_table = table,
                      .max_blocks = 8, .n_logits = 1, .logits_rows = &row};
        CHECK_OK(di_model_forward(m, &b, logits));
        int best = 0;
        for (int v = 1; v < c->vocab_size; v++)
            if (logits[v] > logits[best]) best = v;
        r->toks[0][r->n[0]++] = best;
        ctx[n] = best;
        int eos = 0;
        for (int k = 0; k < c->n_eos; k++) eos |= c->eos_token_ids[k] == best;
        if (eos && !ignore_eos) break;
    }
    free(logits);
}

static void test_greedy_invariance(void) {
    make_model();
    static workload w;
    di_model_options mo = {0};
    mo.kv_blocks = 8;
    mo.n_threads = 2;
    di_model *m = NULL;
    CHECK_OK(di_model_load(g_dir, &mo, &m));
    if (!m) return;
    int vocab = di_model_config_of(m)->vocab_size;
    make_workload(&w, vocab);

    static result alone[NREQ], got[NREQ], ref;
    di_engine_stats st;
    int ok = 1;
    for (int i = 0; i < N_ALONE; i++) {
        di_engine *e = engine(16, 512, 8, 1);
        if (!e) return;
        run(e, &w.in[i], 1, &alone[i], &st);
        di_engine_free(e);
        if (i < 6) {
            reference(m, w.prompts[i], (int)w.in[i].n_prompt_ids, w.in[i].sampling.max_tokens, w.in[i].sampling.ignore_eos, &ref);
            ok &= same_lp(&alone[i], &ref, 0); /* the reference has no logprobs */
        }
    }
    CHECK_MSG(ok, "engine alone vs full-forward greedy reference");
    di_model_free(m);

    struct {
        int blocks, budget, seqs, prefix;
        const char *name;
    } cfgs[] = {
        {256, 512, 64, 1, "batch of 64"},
        {TINY_POOL, 512, 64, 1, "tiny KV pool (preemption)"},
        {256, 16, 64, 1, "budget 16"},
        {256, 512, 64, 0, "prefix cache off"},
        {256, 100, 64, 0, "budget 100, no cache"},
    };
    for (size_t c = 0; c < N_CFGS; c++) {
        di_engine *e = engine(cfgs[c].blocks, cfgs[c].budget, cfgs[c].seqs, cfgs[c].prefix);
        if (!e) return;
        memset(got, 0, sizeof got);
        run(e, w.in, NREQ, got, &st);
        ok = 1;
        if (c == 0) /* requests not run alone are compared with the batch of 64 */
            for (int i = N_ALONE; i < NREQ; i++) alone[i] = got[i];
        for (int i = 0; i < NREQ; i++)
            if (!same(&got[i], &alone[i])) {
                fprintf(stderr, "request %d differs (%s)\n", i, cfgs[c].name);
                ok = 0;
            }
        CHECK_MSG(ok, "%s", cfgs[c].name);
        fprintf(stderr, "   %-30s %5llu steps %4llu preemptions %5llu prefix-hit tokens\n", cfgs[c].name,
                (unsigned long long)st.steps, (unsigned long long)st.preemptions, (unsigned long long)st.prefix_hit_tokens);
        if (cfgs[c].blocks < 16) CHECK(st.preemptions > 0);
        if (cfgs[c].prefix) CHECK(st.prefix_hit_tokens > 0);
        di_engine_free(e);
    }
}

static void test_sampling_and_n(void) {
    int32_t prompt[70];
    for (int k = 0; k < 70; k++) prompt[k] = (int32_t)(2 + di_rng_mix64((uint64_t)k + 900) % 400);
    di_request_input r;
    di_request_input_init(&r);
    r.prompt_ids = prompt;
    r.n_prompt_ids = 70;
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.95f;
    r.sampling.max_tokens = MAXNEW;
    r.sampling.ignore_eos = 1;
    r.sampling.has_seed = 1;
    r.sampling.seed = 1234;
    r.sampling.n = 3;
    /* alone with n = 3 */
    result a, b[6];
    di_engine_stats st;
    di_engine *e = engine(16, 512, 8, 1);
    if (!e) return;
    run(e, &r, 1, &a, &st);
    di_engine_free(e);
    int differ = memcmp(a.toks[0], a.toks[1], sizeof a.toks[0]) || memcmp(a.toks[0], a.toks[2], sizeof a.toks[0]);
    CHECK(differ); /* distinct streams */
    /* the same request among others, budget small: identical completions */
    di_request_input mix[6];
    for (int i = 0; i < 6; i++) {
        mix[i] = r;
        if (i != 2) {
            mix[i].sampling.seed = (uint64_t)i;
            mix[i].n_prompt_ids = (size_t)(10 + 9 * i);
        }
    }
    e = engine(16, 24, 8, 1);
    if (!e) return;
    run(e, mix, 6, b, &st);
    di_engine_free(e);
    CHECK(same(&a, &b[2]));
    /* greedy n = 3: every completion equals the n = 1 greedy result */
    di_request_input g = r;
    g.sampling.temperature = 0;
    g.sampling.n = 1;
    result g1, g3;
    e = engine(16, 512, 8, 1);
    run(e, &g, 1, &g1, &st);
    g.sampling.n = 3;
    run(e, &g, 1, &g3, &st);
    di_engine_free(e);
    for (int k = 0; k < 3; k++) CHECK(g3.n[k] == g1.n[0] && !memcmp(g3.toks[k], g1.toks[0], (size_t)g1.n[0] * 4));
}

static void test_text_and_stops(void) {
    di_tokenizer *tok = NULL;
    CHECK_OK(di_tokenizer_load(g_dir, &tok));
    if (!tok) return;
    di_engine *e = engine(16, 512, 8, 1);
    if (!e) return;
    di_request_input r;
    di_request_input_init(&r);
    r.prompt = "Once upon a time, there was a tiny model.";
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 24;
    r.sampling.ignore_eos = 1;
    di_request_output *full = NULL;
    CHECK_OK(di_generate(e, &r, 1, &full));
    di_ids ids = {0};
    CHECK_OK(di_tokenizer_encode(tok, r.prompt, strlen(r.prompt), DI_TOK_HF | DI_TOK_ADD_SPECIAL, &ids));
    if (!full) return;
    CHECK_EQ_INT(full[0].prompt_tokens, ids.n);
    char *dec = NULL;
    size_t dlen = 0;
    CHECK_OK(di_tokenizer_decode(tok, full[0].choices[0].token_ids, full[0].choices[0].n_tokens, DI_TOK_SKIP_SPECIAL, &dec,
                                 &dlen));
    CHECK_EQ_STR(full[0].choices[0].text, dec);
    /* a two-letter stop string from the middle of the text */
    const char *T = full[0].choices[0].text;
    size_t tl = full[0].choices[0].text_len, at = tl;
    for (size_t i = tl / 3; i + 1 < tl; i++)
        if (T[i] >= 'a' && T[i] <= 'z' && T[i + 1] >= 'a' && T[i + 1] <= 'z') {
            at = i;
            break;
        }
    CHECK(at < tl);
    if (at < tl) {
        char stop[3] = {T[at], T[at + 1], 0};
        size_t first = (size_t)(strstr(T, stop) - T);
        const char *stops[1] = {stop};
        di_request_input rs = r;
        rs.sampling.stop = stops;
        rs.sampling.n_stop = 1;
        di_request_output *cut = NULL;
        CHECK_OK(di_generate(e, &rs, 1, &cut));
        if (cut) {
            const di_completion_output *c = &cut[0].choices[0];
            CHECK_EQ_INT(c->finish_reason, DI_FINISH_STOP);
            CHECK_EQ_STR(c->stop_reason, stop);
            CHECK_EQ_INT(c->text_len, first);
            CHECK(strncmp(c->text, T, first) == 0);
            CHECK(c->n_tokens <= full[0].choices[0].n_tokens &&
                  memcmp(c->token_ids, full[0].choices[0].token_ids, c->n_tokens * 4) == 0);
        }
        di_generate_results_free(cut, 1);
    }
    free(dec);
    di_ids_free(&ids);
    di_generate_results_free(full, 1);
    di_engine_free(e);
    di_tokenizer_free(tok);
}

/* di_engine_params.precision: the CPU's own (f32) loads; bf16 on the CPU and values outside the
 * enum are refused with a message naming them, and no engine is returned. */
static void test_precision(void) {
    const int bad[3] = {DI_PRECISION_BF16, 7, -1};
    const char *needle[3] = {"bf16", "precision 7", "precision -1"};
    for (int i = 0; i < 4; i++) {
        di_engine_params p;
        di_engine_params_init(&p);
        p.model_dir = g_dir;
        p.kv_blocks = 8;
        p.n_threads = 2;
        p.precision = i < 3 ? bad[i] : DI_PRECISION_F32;
        di_engine *e = NULL;
        di_status s = di_engine_create(&p, &e);
        if (i == 3) {
            CHECK_OK(s);
            CHECK(e != NULL);
        } else {
            CHECK(s != DI_OK && e == NULL);
            CHECK_MSG(strstr(di_last_error(), needle[i]) != NULL, "error '%s' lacks '%s'", di_last_error(), needle[i]);
        }
        di_engine_free(e);
    }
}

/* DeepSeek-V3.2 (tiny-v32, index_topk 64): a short request batched with one whose context
 * passes index_topk (so the indexer selects, and its batch takes the absorbed path) gives the
 * bits it gives alone, where no selection happens: on the CPU every V3.2 token takes the
 * absorbed path in every batch. */
static void test_v32_batch_paths(void) {
    char dir[1024];
    const char *root = getenv("DI_BUILD_DIR");
    snprintf(dir, sizeof dir, "%s/test_engine_model/tiny-v32", root ? root : "/tmp");
    test_make_model("tiny-v32", 11, dir);
    int32_t shortp[20], longp[150];
    for (int k = 0; k < 150; k++) longp[k] = (int32_t)(2 + di_rng_mix64((uint64_t)k + 4242) % 400);
    for (int k = 0; k < 20; k++) shortp[k] = (int32_t)(2 + di_rng_mix64((uint64_t)k + 99) % 400);
    di_request_input in[2];
    di_request_input_init(&in[0]);
    in[0].prompt_ids = shortp;
    in[0].n_prompt_ids = 20;
    in[0].sampling.temperature = 0;
    in[0].sampling.max_tokens = 6;
    in[0].sampling.ignore_eos = 1;
    in[0].sampling.logprobs = 2;
    in[1] = in[0];
    in[1].prompt_ids = longp;
    in[1].n_prompt_ids = 150;
    result alone, both[2];
    di_engine_stats st;
    for (int pass = 0; pass < 2; pass++) {
        di_engine *e = engine_at(dir, 16, 512, 8, 1);
        if (!e) return;
        if (pass == 0) run(e, in, 1, &alone, &st);
        else run(e, in, 2, both, &st);
        di_engine_free(e);
    }
    CHECK_MSG(same(&alone, &both[0]), "V3.2: the short request's tokens / logprobs changed beside a long one");
}

TEST_MAIN(test_greedy_invariance, test_sampling_and_n, test_text_and_stops, test_precision, test_v32_batch_paths)
