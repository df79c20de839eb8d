/* test_engine.c - the engine over the fake model (engine/executor.h), whose logits depend on
 * the whole context read back through the block tables the engine hands it. A workload of 64
 * mixed requests (prompt lengths 1..300, shared prefixes, greedy and seeded sampling with
 * filters and penalties, n = 1..3, EOS / length endings) must produce, per request, exactly
 * the tokens of the reference generator (the sampler over directly computed logits, no cache)
 * when run alone, all in one batch, with the prefix cache off, with a KV pool so small that
 * preemption happens, with token budgets from 1 to 512 (chunked prefill), and with few seats,
 * all of it also with a fake whose decode entries write other KV values than prefill chunks
 * (the engine's exact recompute must then keep every token's KV as it was first computed).
 * After every run no block is held. Also: prefix-cache reuse of exactly a 3-block prefix
 * (counted, same tokens, only new tokens computed), copy-on-write for n > 1, abort, stop token
 * ids, min_tokens, logprobs, usage and timing fields, di_generate order, request errors, and
 * which requests each step reports (streaming or not). */
#include <stdint.h>
#include <stdlib.h>

#include "test_engine_fake.h"

enum { NREQ = 64 };

typedef struct workload {
    di_request_input in[NREQ];
    int32_t prompts[NREQ][320];
    int32_t stop_ids[NREQ][2];
} workload;

static int32_t base_token(int i) { return (int32_t)(1 + di_rng_mix64((uint64_t)i * 3 + 11) % (FAKE_VOCAB - 1)); }

static void make_workload(workload *w) {
    memset(w, 0, sizeof *w);
    for (int i = 0; i < NREQ; i++) {
        uint64_t h = di_rng_mix64((uint64_t)i + 1000);
        int len = 1 + (int)(h % 300);
        if (i == 3) len = 64;  /* exactly one block */
        if (i == 4) len = 128; /* exactly two blocks */
        int shift = (i % 4 == 0) ? 0 : (i % 4 == 1) ? 64 : -1;
        for (int k = 0; k < len; k++)
            w->prompts[i][k] = shift >= 0 ? base_token(shift + k) : (int32_t)(1 + di_rng_mix64(h + (uint64_t)k) % 255);
        di_request_input *r = &w->in[i];
        di_request_input_init(r);
        r->prompt_ids = w->prompts[i];
        r->n_prompt_ids = (size_t)len;
        di_sampling_params *p = &r->sampling;
        p->max_tokens = 1 + (int)((h >> 20) % 40);
        p->has_seed = 1;
        p->seed = h >> 7;
        switch (i % 8) {
        case 0: p->temperature = 0; break;
        case 1: p->temperature = 0.8f; p->top_p = 0.9f; break;
        case 2: p->temperature = 1.0f; p->top_k = 20; p->n = 3; break;
        case 3: p->temperature = 0; p->repetition_penalty = 1.3f; p->presence_penalty = 0.5f; break;
        case 4: p->temperature = 1.2f; p->min_p = 0.1f; p->frequency_penalty = 0.7f; p->n = 2; break;
        case 5: p->temperature = 0; p->n = 2; p->logprobs = 3; break;
        case 6: p->temperature = 0.7f; p->ignore_eos = 1; p->min_tokens = 3; break;
        case 7:
            p->temperature = 0.9f;
            w->stop_ids[i][0] = 7;
            w->stop_ids[i][1] = 9;
            p->stop_token_ids = w->stop_ids[i];
            p->n_stop_token_ids = 2;
            break;
        }
        r->priority = (int)(h % 3) - 1;
    }
}

/* what each request produced */
typedef struct result {
    int n_choices;
    int32_t toks[3][512];
    int n[3];
    di_finish_reason fin[3];
    size_t cached;
} result;

typedef struct run_info {
    di_engine_stats st;
    di_fake_model_stats fs;
} run_info;

static void capture(const di_request_output *o, result *r) {
    r->n_choices = (int)o->n_choices;
    r->cached = o->cached_tokens;
    for (size_t k = 0; k < o->n_choices && k < 3; k++) {
        r->n[k] = (int)o->choices[k].n_tokens;
        r->fin[k] = o->choices[k].finish_reason;
        memcpy(r->toks[k], o->choices[k].token_ids, o->choices[k].n_tokens * sizeof(int32_t));
    }
}

/* Runs requests [from, to) of w in one engine with the step API; checks streaming outputs
 * grow monotonically and that no block is held at the end. */
static void run_engine(const engine_setup *s, const workload *w, int from, int to, result *res, run_info *info) {
    di_engine *e = make_engine(s);
    if (!e) return;
    int64_t first = -1;
    for (int i = from; i < to; i++) {
        int64_t id;
        CHECK_OK(di_engine_add_request(e, &w->in[i], &id));
        if (first < 0) first = id;
    }
    size_t *seen = calloc((size_t)(to - from) * 3, sizeof *seen);
    int steps = 0, monotone = 1;
    while (di_engine_has_unfinished(e) && steps < 100000) {
        const di_request_output *const *outs;
        size_t n;
        di_status st = di_engine_step(e, &outs, &n);
        CHECK_OK(st);
        if (st != DI_OK) break;
        steps++;
        for (size_t j = 0; j < n; j++) {
            int i = (int)(outs[j]->request_id - first);
            for (size_t k = 0; k < outs[j]->n_choices; k++) {
                monotone &= outs[j]->choices[k].n_tokens >= seen[i * 3 + k];
                seen[i * 3 + k] = outs[j]->choices[k].n_tokens;
            }
            if (outs[j]->finished) capture(outs[j], &res[from + i]);
        }
        CHECK_OK(di_block_manager_check(e->bm));
    }
    CHECK(monotone);
    di_engine_get_stats(e, &info->st);
    di_executor_fake_stats(&e->ex, &info->fs);
    CHECK_EQ_INT(info->st.kv_blocks_free, info->st.kv_blocks_total);
    CHECK_EQ_INT(info->st.running + info->st.waiting, 0);
    free(seen);
    di_engine_free(e);
}

static int same_results(const result *a, const result *b, int i, const char *what) {
    int ok = a->n_choices == b->n_choices;
    for (int k = 0; ok && k < a->n_choices; k++) {
        ok &= a->n[k] == b->n[k] && a->fin[k] == b->fin[k];
        ok &= ok && memcmp(a->toks[k], b->toks[k], (size_t)a->n[k] * sizeof(int32_t)) == 0;
    }
    if (!ok) fprintf(stderr, "request %d differs: %s\n", i, what);
    return ok;
}

/* decode_differs: the fake's decode entries write other KV values than its prefill chunks
 * (exact recompute on) */
static void invariance(int decode_differs) {
    static workload w;
    make_workload(&w);
    static result ref[NREQ], alone[NREQ], batch[NREQ], tmp[NREQ];
    fprintf(stderr, "   decode_differs %d\n", decode_differs);
    /* the reference, computed without the engine */
    engine_setup big = {.blocks = 512, .budget = 512, .max_seqs = 64, .prefix = 1, .decode_differs = decode_differs};
    di_fake_model_config fc = fake_cfg(&big);
    for (int i = 0; i < NREQ; i++) {
        const di_sampling_params *p = &w.in[i].sampling;
        ref[i].n_choices = p->n;
        for (int k = 0; k < p->n; k++) {
            ref_out ro;
            ref_generate(&fc, w.in[i].prompt_ids, (int)w.in[i].n_prompt_ids, p, p->seed, k, p->max_tokens, &ro);
            ref[i].n[k] = ro.n;
            ref[i].fin[k] = ro.finish;
            memcpy(ref[i].toks[k], ro.toks, (size_t)ro.n * sizeof(int32_t));
        }
    }
    int eos_endings = 0, length_endings = 0;
    for (int i = 0; i < NREQ; i++)
        for (int k = 0; k < ref[i].n_choices; k++) {
            eos_endings += ref[i].fin[k] == DI_FINISH_STOP;
            length_endings += ref[i].fin[k] == DI_FINISH_LENGTH;
        }
    fprintf(stderr, "   reference: %d stop endings, %d length endings\n", eos_endings, length_endings);
    CHECK(eos_endings > 0 && length_endings > 0);

    run_info info;
    int ok = 1;
    for (int i = 0; i < NREQ; i++) {
        run_engine(&big, &w, i, i + 1, alone, &info);
        ok &= same_results(&alone[i], &ref[i], i, "alone vs reference");
    }
    CHECK(ok);

    run_engine(&big, &w, 0, NREQ, batch, &info);
    ok = 1;
    for (int i = 0; i < NREQ; i++) ok &= same_results(&batch[i], &ref[i], i, "batch of 64 vs reference");
    CHECK(ok);
    CHECK(info.st.prefix_hit_tokens > 0); /* the shared prefixes were reused */
    CHECK(info.fs.block_copies > 0);      /* n > 1 forks copied shared partial blocks */
    fprintf(stderr, "   batch: %llu steps, %llu prefix-hit tokens, %llu block copies\n", (unsigned long long)info.st.steps,
            (unsigned long long)info.st.prefix_hit_tokens, (unsigned long long)info.fs.block_copies);

    struct {
        engine_setup s;
        const char *name;
    } cfgs[] = {
        {{.blocks = 512, .budget = 512, .max_seqs = 64, .prefix = 0}, "prefix cache off"},
        {{.blocks = 8, .budget = 512, .max_seqs = 64, .prefix = 1}, "8-block KV pool (preemption)"},
        {{.blocks = 10, .budget = 96, .max_seqs = 64, .prefix = 0}, "10 blocks, budget 96, no cache"},
        {{.blocks = 512, .budget = 1, .max_seqs = 64, .prefix = 1}, "budget 1"},
        {{.blocks = 512, .budget = 7, .max_seqs = 64, .prefix = 1}, "budget 7"},
        {{.blocks = 512, .budget = 100, .max_seqs = 64, .prefix = 1}, "budget 100"},
        {{.blocks = 512, .budget = 512, .max_seqs = 4, .prefix = 1}, "4 seats"},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        memset(tmp, 0, sizeof tmp);
        cfgs[c].s.decode_differs = decode_differs;
        run_engine(&cfgs[c].s, &w, 0, NREQ, tmp, &info);
        ok = 1;
        for (int i = 0; i < NREQ; i++) ok &= same_results(&tmp[i], &ref[i], i, cfgs[c].name);
        CHECK_MSG(ok, "%s", cfgs[c].name);
        fprintf(stderr, "   %-32s %6llu steps, %4llu preemptions, %6llu prefix-hit tokens\n", cfgs[c].name,
                (unsigned long long)info.st.steps, (unsigned long long)info.st.preemptions,
                (unsigned long long)info.st.prefix_hit_tokens);
        if (cfgs[c].s.blocks <= 10) CHECK(info.st.preemptions > 0);
        if (!cfgs[c].s.prefix) CHECK_EQ_INT(info.st.prefix_hit_tokens, 0);
    }
}

static void test_invariance(void) {
    invariance(0);
    invariance(1);
}

/* A prompt that continues an earlier request's prompt and output (a chat's next turn): with a
 * fake whose decode entries write other KV values (exact recompute), the prefix cache must not
 * hand it the blocks holding the earlier request's generated tokens (their KV came from decode
 * steps, the new prompt's is computed in prefill), so its tokens equal a cold engine's; without
 * exact recompute those blocks are reused. */
static void test_prefix_generated(void) {
    for (int dd = 0; dd < 2; dd++) {
        engine_setup s = {.blocks = 64, .budget = 512, .max_seqs = 8, .prefix = 1, .decode_differs = dd};
        int32_t a[100], b[100 + 60 + 40];
        for (int i = 0; i < 100; i++) a[i] = base_token(700 + i);
        di_request_input ra;
        di_request_input_init(&ra);
        ra.prompt_ids = a;
        ra.n_prompt_ids = 100;
        ra.sampling.temperature = 0;
        ra.sampling.max_tokens = 60;
        ra.sampling.ignore_eos = 1;
        di_engine *e = make_engine(&s);
        di_request_output *res_a = NULL, *res_b = NULL, *res_cold = NULL;
        CHECK_OK(di_generate(e, &ra, 1, &res_a));
        CHECK_EQ_INT((int)res_a[0].choices[0].n_tokens, 60);
        memcpy(b, a, sizeof a);
        memcpy(b + 100, res_a[0].choices[0].token_ids, 60 * sizeof *b);
        for (int i = 160; i < 200; i++) b[i] = base_token(1900 + i);
        di_request_input rb = ra;
        rb.prompt_ids = b;
        rb.n_prompt_ids = 200;
        rb.sampling.max_tokens = 30;
        di_engine_stats before, after;
        di_engine_get_stats(e, &before);
        CHECK_OK(di_generate(e, &rb, 1, &res_b));
        di_engine_get_stats(e, &after);
        di_engine *cold = make_engine(&s);
        CHECK_OK(di_generate(cold, &rb, 1, &res_cold));
        CHECK_EQ_INT((int)res_b[0].choices[0].n_tokens, 30);
        CHECK_MSG(res_b[0].choices[0].n_tokens == res_cold[0].choices[0].n_tokens &&
                      !memcmp(res_b[0].choices[0].token_ids, res_cold[0].choices[0].token_ids, 30 * sizeof(int32_t)),
                  "decode_differs %d: the continuation's tokens differ from a cold engine's", dd);
        /* blocks 0 (prompt) and, without exact recompute, 1 (prompt and generated) reused */
        CHECK_EQ_INT((int)(after.prefix_hit_tokens - before.prefix_hit_tokens), dd ? 64 : 128);
        di_generate_results_free(res_a, 1);
        di_generate_results_free(res_b, 1);
        di_generate_results_free(res_cold, 1);
        di_engine_free(e);
        di_engine_free(cold);
    }
}

static void test_prefix_cache_reuse(void) {
    engine_setup s = {.blocks = 64, .budget = 512, .max_seqs = 8, .prefix = 1};
    int32_t a[3 * 64 + 10], b[3 * 64 + 25];
    for (int i = 0; i < 3 * 64 + 10; i++) a[i] = base_token(500 + i);
    memcpy(b, a, 3 * 64 * sizeof *b);
    for (int i = 3 * 64; i < 3 * 64 + 25; i++) b[i] = base_token(900 + i);
    di_request_input ra, rb;
    di_request_input_init(&ra);
    ra.prompt_ids = a;
    ra.n_prompt_ids = 3 * 64 + 10;
    ra.sampling.temperature = 0;
    ra.sampling.max_tokens = 5;
    rb = ra;
    rb.prompt_ids = b;
    rb.n_prompt_ids = 3 * 64 + 25;
    rb.sampling.max_tokens = 6;
    rb.sampling.ignore_eos = 1;

    /* B alone, cold */
    di_engine *cold = make_engine(&s);
    di_request_output *rcold = NULL;
    CHECK_OK(di_generate(cold, &rb, 1, &rcold));
    di_fake_model_stats fs_cold;
    di_executor_fake_stats(&cold->ex, &fs_cold);

    di_engine *e = make_engine(&s);
    di_request_output *r1 = NULL, *r2 = NULL;
    CHECK_OK(di_generate(e, &ra, 1, &r1));
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.kv_blocks_cached, 3); /* A's three full blocks stay cached */
    di_fake_model_stats f1, f2;
    di_executor_fake_stats(&e->ex, &f1);
    CHECK_OK(di_generate(e, &rb, 1, &r2));
    di_executor_fake_stats(&e->ex, &f2);
    di_engine_get_stats(e, &st);
    CHECK_EQ_INT(r2[0].cached_tokens, 192);
    CHECK_EQ_INT(st.prefix_hit_tokens, 192);
    /* only the new tokens: 25 prompt tokens + 5 decode steps (the 6th token needs no KV) */
    CHECK_EQ_INT(f2.tokens - f1.tokens, 25 + 5);
    CHECK_EQ_INT(fs_cold.tokens, 3 * 64 + 25 + 5);
    CHECK_EQ_INT(r2[0].choices[0].n_tokens, rcold[0].choices[0].n_tokens);
    CHECK(memcmp(r2[0].choices[0].token_ids, rcold[0].choices[0].token_ids, 6 * sizeof(int32_t)) == 0);
    CHECK_EQ_INT(rcold[0].cached_tokens, 0);
    di_generate_results_free(r1, 1);
    di_generate_results_free(r2, 1);
    di_generate_results_free(rcold, 1);
    di_engine_free(e);
    di_engine_free(cold);
}

static void test_n_completions(void) {
    engine_setup s = {.blocks = 64, .budget = 256, .max_seqs = 16, .prefix = 1};
    di_engine *e = make_engine(&s);
    int32_t prompt[100];
    for (int i = 0; i < 100; i++) prompt[i] = base_token(2000 + i);
    di_request_input r;
    di_request_input_init(&r);
    r.prompt_ids = prompt;
    r.n_prompt_ids = 100;
    r.sampling.n = 5;
    r.sampling.temperature = 1.0f;
    r.sampling.max_tokens = 12;
    r.sampling.ignore_eos = 1;
    r.sampling.has_seed = 1;
    r.sampling.seed = 77;
    di_request_input g = r;
    g.sampling.temperature = 0;
    g.sampling.n = 3;
    di_request_input both[2] = {r, g};
    di_request_output *res = NULL;
    CHECK_OK(di_generate(e, both, 2, &res));
    di_fake_model_stats fs;
    di_executor_fake_stats(&e->ex, &fs);
    /* prompt computed once per request (100 + 100), then 11 decode tokens per completion */
    CHECK_EQ_INT(fs.tokens, 200 + 5 * 11 + 3 * 11);
    CHECK(fs.block_copies >= 4 + 2); /* shared partial block copied on first write */
    di_fake_model_config fc = fake_cfg(&s);
    int distinct = 0;
    for (int k = 0; k < 5; k++) {
        ref_out ro;
        ref_generate(&fc, prompt, 100, &r.sampling, 77, k, 12, &ro);
        CHECK_EQ_INT(res[0].choices[k].n_tokens, 12);
        CHECK(memcmp(res[0].choices[k].token_ids, ro.toks, 12 * sizeof(int32_t)) == 0);
        CHECK_EQ_INT(res[0].choices[k].index, k);
        if (k && memcmp(res[0].choices[k].token_ids, res[0].choices[0].token_ids, 12 * sizeof(int32_t))) distinct++;
    }
    CHECK(distinct >= 3);
    for (int k = 1; k < 3; k++) /* greedy completions are identical */
        CHECK(memcmp(res[1].choices[k].token_ids, res[1].choices[0].token_ids, 12 * sizeof(int32_t)) == 0);
    CHECK_EQ_INT(res[0].completion_tokens, 60);
    CHECK_EQ_INT(res[0].prompt_tokens, 100);
    di_generate_results_free(res, 2);
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.kv_blocks_free, 64);
    di_engine_free(e);
}

static void test_abort(void) {
    engine_setup s = {.blocks = 64, .budget = 64, .max_seqs = 2, .prefix = 1};
    di_engine *e = make_engine(&s);
    int32_t prompt[200];
    for (int i = 0; i < 200; i++) prompt[i] = base_token(3000 + i);
    di_request_input r;
    di_request_input_init(&r);
    r.prompt_ids = prompt;
    r.n_prompt_ids = 200;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 30;
    r.sampling.ignore_eos = 1;
    int64_t id[3];
    for (int i = 0; i < 3; i++) CHECK_OK(di_engine_add_request(e, &r, &id[i]));
    const di_request_output *const *outs;
    size_t n;
    for (int k = 0; k < 5; k++) CHECK_OK(di_engine_step(e, &outs, &n));
    /* id0 is decoding, id1 is in its prefill, id2 waits (2 seats) */
    CHECK_OK(di_engine_abort(e, id[0]));
    CHECK_OK(di_engine_abort(e, id[2]));
    CHECK(di_engine_abort(e, id[2]) == DI_ERR_NOT_FOUND);
    CHECK(di_engine_abort(e, 999) == DI_ERR_NOT_FOUND);
    int aborted = 0, finished1 = 0, tokens0 = -1;
    while (di_engine_has_unfinished(e)) {
        CHECK_OK(di_engine_step(e, &outs, &n));
        for (size_t j = 0; j < n; j++) {
            if (outs[j]->request_id != id[1] && outs[j]->finished) {
                aborted++;
                CHECK_EQ_INT(outs[j]->choices[0].finish_reason, DI_FINISH_ABORT);
                if (outs[j]->request_id == id[0]) tokens0 = (int)outs[j]->choices[0].n_tokens;
                if (outs[j]->request_id == id[2]) CHECK_EQ_INT(outs[j]->choices[0].n_tokens, 0);
            }
            if (outs[j]->request_id == id[1] && outs[j]->finished) {
                finished1 = 1;
                CHECK_EQ_INT(outs[j]->choices[0].finish_reason, DI_FINISH_LENGTH);
                CHECK_EQ_INT(outs[j]->choices[0].n_tokens, 30);
            }
        }
    }
    CHECK_EQ_INT(aborted, 2);
    CHECK(finished1);
    CHECK(tokens0 > 0 && tokens0 < 30);
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.kv_blocks_free, 64);
    CHECK_OK(di_block_manager_check(e->bm));
    di_engine_free(e);
}

static void test_fields(void) {
    engine_setup s = {.blocks = 64, .budget = 256, .max_seqs = 8, .prefix = 1};
    di_engine *e = make_engine(&s);
    di_fake_model_config fc = fake_cfg(&s);
    int32_t prompt[30];
    for (int i = 0; i < 30; i++) prompt[i] = base_token(4000 + i);
    di_request_input r;
    di_request_input_init(&r);
    r.prompt_ids = prompt;
    r.n_prompt_ids = 30;
    r.sampling.temperature = 0.9f;
    r.sampling.max_tokens = 20;
    r.sampling.ignore_eos = 1;
    r.sampling.logprobs = 2;
    /* unseeded: the engine derives the seed from its own seed and the request id */
    di_request_output *res = NULL;
    CHECK_OK(di_generate(e, &r, 1, &res));
    ref_out ro;
    ref_generate(&fc, prompt, 30, &r.sampling, engine_seed_for(5, 0), 0, 20, &ro);
    CHECK(res[0].choices[0].n_tokens == 20 && memcmp(res[0].choices[0].token_ids, ro.toks, 20 * 4) == 0);
    /* logprobs: raw log-softmax of the fake model's row for each context */
    int lp_ok = 1;
    int32_t ctx[64];
    memcpy(ctx, prompt, sizeof prompt);
    for (int t = 0; t < 20; t++) {
        float row[FAKE_VOCAB];
        di_fake_model_logits(&fc, di_fake_model_context_hash(&fc, ctx, 30, 30 + t), row);
        double m = -1e30, sum = 0;
        for (int v = 0; v < FAKE_VOCAB; v++) m = row[v] > m ? row[v] : m;
        for (int v = 0; v < FAKE_VOCAB; v++) sum += exp(row[v] - m);
        const di_token_logprob *lp = &res[0].choices[0].logprobs[t];
        int32_t tok = res[0].choices[0].token_ids[t];
        lp_ok &= lp->token == tok && fabs(lp->logprob - (row[tok] - m - log(sum))) < 1e-5 && lp->n_top == 2;
        ctx[30 + t] = tok;
    }
    CHECK(lp_ok);
    CHECK(res[0].timing.ttft_s >= res[0].timing.queue_s && res[0].timing.e2e_s >= res[0].timing.ttft_s);
    CHECK(res[0].timing.tpot_s >= 0);
    CHECK_EQ_INT(res[0].completion_tokens, 20);
    di_generate_results_free(res, 1);

    /* stop token ids end generation; the id is kept in token_ids; min_tokens masks it */
    di_request_input st = r;
    st.sampling.logprobs = -1;
    st.sampling.ignore_eos = 0;
    int32_t stop_id[1] = {ro.toks[4]};
    st.sampling.stop_token_ids = stop_id;
    st.sampling.n_stop_token_ids = 1;
    st.sampling.temperature = 0;
    ref_out g;
    ref_generate(&fc, prompt, 30, &st.sampling, 0, 0, 20, &g);
    CHECK_OK(di_generate(e, &st, 1, &res));
    CHECK_EQ_INT(res[0].choices[0].n_tokens, g.n);
    CHECK(memcmp(res[0].choices[0].token_ids, g.toks, (size_t)g.n * 4) == 0);
    if (g.finish == DI_FINISH_STOP) CHECK_EQ_INT(res[0].choices[0].stop_token, g.toks[g.n - 1]);
    CHECK_EQ_INT(res[0].choices[0].finish_reason, g.finish);
    di_generate_results_free(res, 1);
    st.sampling.min_tokens = 15;
    ref_generate(&fc, prompt, 30, &st.sampling, 0, 0, 20, &g);
    CHECK_OK(di_generate(e, &st, 1, &res));
    CHECK(res[0].choices[0].n_tokens >= 15 && (int)res[0].choices[0].n_tokens == g.n);
    for (int t = 0; t < 14 && t < g.n; t++) CHECK(g.toks[t] != stop_id[0] && g.toks[t] != FAKE_EOS);
    di_generate_results_free(res, 1);
    di_engine_free(e);
}

static void test_request_errors(void) {
    engine_setup s = {.blocks = 4, .budget = 64, .max_seqs = 4, .prefix = 1, .max_model_len = 200};
    di_engine *e = make_engine(&s);
    int32_t ids[300] = {0};
    di_request_input r;
    di_request_input_init(&r);
    int64_t id;
    CHECK(di_engine_add_request(e, &r, &id) == DI_ERR_INVALID_ARG); /* neither prompt */
    r.prompt_ids = ids;
    r.n_prompt_ids = 0;
    CHECK(di_engine_add_request(e, &r, &id) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "empty") != NULL);
    r.n_prompt_ids = 200; /* context limit 200: no room for a generated token */
    CHECK(di_engine_add_request(e, &r, &id) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "200 tokens") != NULL);
    r.n_prompt_ids = 3;
    ids[1] = FAKE_VOCAB;
    CHECK(di_engine_add_request(e, &r, &id) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "prompt_token_ids[1]") != NULL);
    ids[1] = 1;
    r.prompt = "abc";
    CHECK(di_engine_add_request(e, &r, &id) == DI_ERR_INVALID_ARG); /* both */
    r.prompt_ids = NULL;
    CHECK(di_engine_add_request(e, &r, &id) == DI_ERR_UNSUPPORTED); /* text without a codec */
    r.prompt = NULL;
    r.prompt_ids = ids;
    r.sampling.n = 5;
    CHECK(di_engine_add_request(e, &r, &id) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "'n'") != NULL);
    r.sampling.n = 1;
    r.sampling.top_k = -3;
    CHECK(di_engine_add_request(e, &r, &id) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "request") && strstr(di_last_error(), "'top_k'"));
    r.sampling.top_k = 0;
    const char *stops[1] = {"x"};
    r.sampling.stop = stops;
    r.sampling.n_stop = 1;
    CHECK(di_engine_add_request(e, &r, &id) == DI_ERR_UNSUPPORTED);
    r.sampling.n_stop = 0;
    /* di_generate validates everything before queueing anything */
    di_request_input two[2] = {r, r};
    two[1].sampling.temperature = -1;
    di_request_output *res = (di_request_output *)1;
    CHECK(di_generate(e, two, 2, &res) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "request 1") != NULL);
    CHECK(res == NULL);
    CHECK(!di_engine_has_unfinished(e));
    /* max_tokens larger than the room is clamped: finish "length" at the context limit */
    r.sampling.max_tokens = 1000;
    r.sampling.ignore_eos = 1;
    r.n_prompt_ids = 190;
    CHECK_OK(di_generate(e, &r, 1, &res));
    CHECK_EQ_INT(res[0].choices[0].n_tokens, 10);
    CHECK_EQ_INT(res[0].choices[0].finish_reason, DI_FINISH_LENGTH);
    di_generate_results_free(res, 1);
    di_engine_free(e);
    di_engine_free(NULL);
}

static void test_generate_order(void) {
    engine_setup s = {.blocks = 128, .budget = 128, .max_seqs = 8, .prefix = 1};
    di_engine *e = make_engine(&s);
    di_fake_model_config fc = fake_cfg(&s);
    static int32_t prompts[12][80];
    di_request_input r[12];
    for (int i = 0; i < 12; i++) {
        int len = 5 + i * 6;
        for (int k = 0; k < len; k++) prompts[i][k] = base_token(7000 + i * 100 + k);
        di_request_input_init(&r[i]);
        r[i].prompt_ids = prompts[i];
        r[i].n_prompt_ids = (size_t)len;
        r[i].sampling.temperature = 0;
        r[i].sampling.max_tokens = 40 - 3 * i; /* later ones finish first */
        r[i].priority = i % 3;
    }
    di_request_output *res = NULL;
    CHECK_OK(di_generate(e, r, 12, &res));
    for (int i = 0; i < 12; i++) {
        ref_out ro;
        ref_generate(&fc, prompts[i], 5 + i * 6, &r[i].sampling, 0, 0, 40 - 3 * i, &ro);
        CHECK_EQ_INT(res[i].prompt_tokens, (size_t)(5 + i * 6));
        CHECK((int)res[i].choices[0].n_tokens == ro.n && memcmp(res[i].choices[0].token_ids, ro.toks, (size_t)ro.n * 4) == 0);
        CHECK(res[i].finished);
    }
    di_generate_results_free(res, 12);
    di_engine_free(e);
}

/* The report of every step against the engine's own counters read after the previous one:
 * with stream_outputs exactly the requests whose completions gained tokens or finished
 * (an abort between steps included) are reported, in id order, with their current counts;
 * without it each request exactly once, in the step where its last completion finished. */
static void test_reporting(void) {
    static workload w;
    make_workload(&w);
    enum { N = 24 };
    for (int stream = 0; stream < 2; stream++) {
        engine_setup s = {.blocks = 40, .budget = 96, .max_seqs = 6, .prefix = 1, .with_codec = 1};
        di_fake_model_config fc = fake_cfg(&s);
        di_executor ex;
        CHECK_OK(di_executor_fake_create(&fc, &ex));
        di_engine_params p;
        di_engine_params_init(&p);
        p.max_batch_tokens = s.budget;
        p.max_seqs = s.max_seqs;
        p.seed = 5;
        p.stream_outputs = stream;
        di_codec codec = toy_codec();
        di_engine *e = NULL;
        CHECK_OK(di_engine_create_with(&p, &ex, &codec, &e));
        if (!e) continue;
        int64_t ids[N];
        for (int i = 0; i < N; i++) CHECK_OK(di_engine_add_request(e, &w.in[i], &ids[i]));
        int prev_gen[N][3], prev_fin[N], final_seen[N], reports = 0, wrong = 0, steps = 0, aborted = 0;
        memset(prev_gen, 0, sizeof prev_gen);
        memset(prev_fin, 0, sizeof prev_fin);
        memset(final_seen, 0, sizeof final_seen);
        while (di_engine_has_unfinished(e) && steps < 10000) {
            if (steps == 6 || steps == 9) /* one running, one perhaps still waiting */
                aborted += di_engine_abort(e, ids[steps == 6 ? 1 : N - 1]) == DI_OK;
            const di_request_output *const *outs;
            size_t n;
            di_status st = di_engine_step(e, &outs, &n);
            CHECK_OK(st);
            if (st != DI_OK) break;
            steps++;
            int expect[N] = {0}, n_expect = 0;
            for (int a = 0; a < e->n_active; a++) {
                const di_req *q = e->active[a];
                int i = (int)(q->id - ids[0]);
                int changed = q->n_finished != prev_fin[i];
                for (int k = 0; k < q->n; k++) changed |= q->comp[k].n_gen != prev_gen[i][k];
                expect[i] = stream ? changed : q->n_finished == q->n && !final_seen[i];
                n_expect += expect[i];
                prev_fin[i] = q->n_finished;
                for (int k = 0; k < q->n; k++) prev_gen[i][k] = q->comp[k].n_gen;
            }
            wrong += (int)n != n_expect;
            for (size_t j = 0; j < n; j++) {
                int i = (int)(outs[j]->request_id - ids[0]);
                wrong += i < 0 || i >= N || !expect[i] || final_seen[i];
                if (i < 0 || i >= N) continue;
                wrong += j > 0 && outs[j]->request_id <= outs[j - 1]->request_id;
                for (size_t k = 0; k < outs[j]->n_choices && k < 3; k++)
                    wrong += outs[j]->choices[k].n_tokens != (size_t)prev_gen[i][k];
                wrong += outs[j]->finished != (prev_fin[i] == (int)outs[j]->n_choices);
                if (outs[j]->finished) final_seen[i] = 1;
                reports++;
            }
        }
        int all_final = 1;
        for (int i = 0; i < N; i++) all_final &= final_seen[i];
        CHECK_MSG(wrong == 0 && all_final, "stream %d: %d wrong reports of %d, all final %d", stream, wrong, reports, all_final);
        CHECK(aborted >= 1);
        CHECK(stream ? reports > 3 * N : reports == N);
        di_engine_free(e);
    }
}

TEST_MAIN(test_invariance, test_prefix_generated, test_prefix_cache_reuse, test_n_completions, test_abort, test_fields, test_request_errors,
          test_generate_order, test_reporting)
