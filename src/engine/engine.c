/* engine.c - the engine's life cycle and step loop (public API in deepinfer.h).
 *
 * di_engine_step reads like the story it tells: reap the requests reported last time,
 * schedule, run (copies + forward), commit the filled blocks to the prefix cache, sample and
 * append each sampled token (forking the completions of n > 1 requests off the leader's
 * logits row), then report every request that changed. When the executor can sample (the
 * model on the GPU) and every row of the step needs only what di_sample_row carries, the
 * forward and the sampling run together in the executor and only token ids come back; the
 * tokens are the same either way (same sampler specification, same (seed, position, stream)).
 *
 * Owns: the executor, the optional codec, the block manager, scheduler, runner, sampler and
 * the active requests. Invariant: a request is in `active` from enqueue until the step after
 * its final report. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/mmap_file.h"
#include "core/status.h"
#include "core/timer.h"
#include "engine/engine_internal.h"
#include "sampling/rng.h"

void di_engine_params_init(di_engine_params *p) {
    memset(p, 0, sizeof *p);
    p->max_batch_tokens = 2048;
    p->max_seqs = 256;
    p->enable_prefix_cache = 1;
    p->stream_outputs = 1;
}

void di_request_input_init(di_request_input *r) {
    memset(r, 0, sizeof *r);
    di_sampling_params_init(&r->sampling);
}

/* ---- life cycle ---- */

di_status di_engine_create_with(const di_engine_params *p, di_executor *ex, di_codec *codec, di_engine **out) {
    *out = NULL;
    di_engine *e = calloc(1, sizeof *e);
    if (!e) {
        di_executor_destroy(ex);
        if (codec) di_codec_destroy(codec);
        return di_error(DI_ERR_NOMEM, "engine: out of memory");
    }
    e->ex = *ex;
    memset(ex, 0, sizeof *ex);
    if (codec && codec->ctx) {
        e->codec = *codec;
        e->has_codec = 1;
        memset(codec, 0, sizeof *codec);
    }
    e->params = *p;
    e->params.model_dir = e->params.tokenizer_dir = NULL; /* not owned */
    di_status s = DI_OK;
    if (p->max_batch_tokens < 0 || p->max_seqs < 0 || p->kv_blocks < 0 || p->max_model_len < 0)
        s = di_error(DI_ERR_INVALID_ARG, "engine: max_batch_tokens, max_seqs, kv_blocks and max_model_len must be >= 0");
    e->max_batch_tokens = p->max_batch_tokens > 0 ? p->max_batch_tokens : 2048;
    e->max_seqs = p->max_seqs > 0 ? p->max_seqs : 256;
    e->max_model_len = e->ex.max_model_len;
    if (p->max_model_len > 0 && p->max_model_len < e->max_model_len) e->max_model_len = p->max_model_len;
    int max_blocks_per_seq = (e->max_model_len + DI_BLOCK_TOKENS - 1) / DI_BLOCK_TOKENS;
    if (s == DI_OK) s = di_block_manager_create(e->ex.n_kv_blocks, &e->bm);
    di_scheduler_config sc = {e->max_batch_tokens, e->max_seqs, p->enable_prefix_cache, e->ex.exact_recompute};
    if (s == DI_OK) s = di_scheduler_create(&sc, e->bm, &e->sched);
    if (s == DI_OK) s = di_runner_create(e->max_batch_tokens, e->max_seqs, max_blocks_per_seq, &e->runner);
    if (s == DI_OK) s = di_sampler_create(e->ex.vocab_size, &e->sampler);
    if (s == DI_OK && e->ex.forward_sample) {
        e->srows = calloc((size_t)e->max_seqs, sizeof *e->srows);
        e->stokens = calloc((size_t)e->max_seqs, sizeof *e->stokens);
        e->sstatus = calloc((size_t)e->max_seqs, sizeof *e->sstatus);
        e->row_ident = calloc((size_t)e->max_seqs, sizeof *e->row_ident);
        e->chain_map = calloc((size_t)e->max_seqs, sizeof *e->chain_map);
        e->chain_keep = calloc((size_t)e->max_seqs, 1);
        if (!e->srows || !e->stokens || !e->sstatus || !e->row_ident || !e->chain_map || !e->chain_keep)
            s = di_error(DI_ERR_NOMEM, "engine: out of memory");
        for (int i = 0; s == DI_OK && i < e->max_seqs; i++) e->row_ident[i] = i;
    }
    if (s == DI_OK && !(e->ex.launch_sample && e->ex.collect_sample && e->ex.device_sampling)) {
        e->ex.launch_sample = NULL; /* asynchronous steps only with both calls and executor sampling */
        e->ex.collect_sample = NULL;
    }
    if (s != DI_OK) {
        di_engine_free(e);
        return s;
    }
    e->stats.kv_blocks_total = e->ex.n_kv_blocks;
    *out = e;
    return DI_OK;
}

di_status di_engine_create(const di_engine_params *p, di_engine **out) {
    *out = NULL;
    if (!p || !p->model_dir) return di_error(DI_ERR_INVALID_ARG, "engine: model_dir is required");
    if (p->device != DI_DEVICE_CPU && p->device != DI_DEVICE_CUDA)
        return di_error(DI_ERR_INVALID_ARG, "engine: device %d: expected 0 (cpu) or 1 (cuda)", p->device);
    di_model_options mo = {0};
    mo.device = (di_device)p->device;
    mo.precision = (di_precision)p->precision;
    mo.n_threads = p->n_threads;
    mo.max_batch_tokens = p->max_batch_tokens > 0 ? p->max_batch_tokens : 2048;
    mo.max_seqs = p->max_seqs > 0 ? p->max_seqs : 256;
    mo.kv_blocks = p->kv_blocks;
    mo.kv_memory_bytes = p->kv_memory_bytes;
    mo.max_context = p->max_model_len;
    di_executor ex;
    di_status s = di_executor_model_create(p->model_dir, &mo, &ex);
    if (s != DI_OK) return di_error_context(s, "engine: loading model %s", p->model_dir);
    /* the tokenizer: an explicit tokenizer_dir must load; a model directory without
     * tokenizer.json gives an engine for token-id prompts only */
    di_codec codec = {0};
    const char *tdir = p->tokenizer_dir ? p->tokenizer_dir : p->model_dir;
    char *tjson = di_path_join(tdir, "tokenizer.json");
    int present = p->tokenizer_dir || (tjson && di_file_exists(tjson));
    free(tjson);
    if (present) {
        s = di_codec_tokenizer_create(tdir, &codec);
        if (s != DI_OK) {
            di_executor_destroy(&ex);
            return di_error_context(s, "engine: loading the tokenizer from %s", tdir);
        }
    } else {
        DI_LOG_W("engine: no tokenizer.json in %s: only token-id prompts are accepted", tdir);
    }
    return di_engine_create_with(p, &ex, &codec, out);
}

void di_engine_free(di_engine *e) {
    if (!e) return;
    for (int i = 0; i < e->n_active; i++) di_req_free(e, e->active[i]);
    free(e->active);
    free(e->outs);
    free(e->srows);
    free(e->stokens);
    free(e->row_ident);
    free(e->chain_map);
    free(e->chain_keep);
    free(e->sstatus);
    di_sampler_free(e->sampler);
    di_runner_free(e->runner);
    di_scheduler_free(e->sched);
    di_block_manager_free(e->bm);
    di_executor_destroy(&e->ex);
    if (e->has_codec) di_codec_destroy(&e->codec);
    free(e);
}

/* ---- requests ---- */

void di_req_free(di_engine *e, di_req *q) {
    if (!q) return;
    for (int k = 0; k < q->n && q->comp; k++) {
        di_completion *c = &q->comp[k];
        if (c->seq.state == DI_SEQ_RUNNING || c->seq.state == DI_SEQ_WAITING) di_scheduler_finish(e->sched, &c->seq);
        di_seq_release(&c->seq);
        di_token_counts_free(&c->counts);
        free(c->logprobs);
        free(c->text);
        if (c->detok) e->codec.detok_free(c->detok);
    }
    free(q->comp);
    free(q->outc);
    for (int i = 0; i < q->params.n_stop; i++) free(q->stop_strs ? q->stop_strs[i] : NULL);
    free(q->stop_strs);
    free(q->stop_ids);
    free(q->bias_ids);
    free(q->bias_vals);
    di_token_counts_free(&q->prompt_counts);
    free(q);
}

/* n zeroed objects of `size` bytes starting on a 64-byte boundary, or NULL. */
static void *calloc_lines(size_t n, size_t size) {
    if (n == 0 || size > (SIZE_MAX - 63) / n) return NULL;
    size_t bytes = (n * size + 63) / 64 * 64;
    void *p = aligned_alloc(64, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

/* Deep-copies the arrays of the sampling params into q. */
static di_status copy_params(di_req *q, const di_sampling_params *sp) {
    q->params = *sp;
    di_sampling_params *p = &q->params;
    p->stop = NULL;
    p->stop_token_ids = NULL;
    p->logit_bias_ids = NULL;
    p->logit_bias_values = NULL;
    if (sp->n_stop > 0) {
        q->stop_strs = calloc((size_t)sp->n_stop, sizeof *q->stop_strs);
        if (!q->stop_strs) return di_error(DI_ERR_NOMEM, "out of memory");
        for (int i = 0; i < sp->n_stop; i++)
            if (!(q->stop_strs[i] = strdup(sp->stop[i]))) return di_error(DI_ERR_NOMEM, "out of memory");
        p->stop = (const char *const *)q->stop_strs;
    }
    if (sp->n_stop_token_ids > 0) {
        if (!(q->stop_ids = malloc((size_t)sp->n_stop_token_ids * sizeof *q->stop_ids))) return di_error(DI_ERR_NOMEM, "out of memory");
        memcpy(q->stop_ids, sp->stop_token_ids, (size_t)sp->n_stop_token_ids * sizeof *q->stop_ids);
        p->stop_token_ids = q->stop_ids;
    }
    if (sp->n_logit_bias > 0) {
        q->bias_ids = malloc((size_t)sp->n_logit_bias * sizeof *q->bias_ids);
        q->bias_vals = malloc((size_t)sp->n_logit_bias * sizeof *q->bias_vals);
        if (!q->bias_ids || !q->bias_vals) return di_error(DI_ERR_NOMEM, "out of memory");
        memcpy(q->bias_ids, sp->logit_bias_ids, (size_t)sp->n_logit_bias * sizeof *q->bias_ids);
        memcpy(q->bias_vals, sp->logit_bias_values, (size_t)sp->n_logit_bias * sizeof *q->bias_vals);
        p->logit_bias_ids = q->bias_ids;
        p->logit_bias_values = q->bias_vals;
    }
    return DI_OK;
}

static di_status build_request(di_engine *e, const di_request_input *r, const int32_t *ids, int n_ids, di_req *q) {
    const int limit_pool = e->ex.n_kv_blocks * DI_BLOCK_TOKENS;
    const int limit = e->max_model_len < limit_pool ? e->max_model_len : limit_pool;
    if (n_ids < 1) return di_error(DI_ERR_INVALID_ARG, "the prompt is empty (no tokens)");
    if (n_ids >= limit)
        return di_error(DI_ERR_INVALID_ARG,
                        "the prompt has %d tokens; at most %d fit (max_model_len %d, KV pool %d tokens) with one generated token",
                        n_ids, limit - 1, e->max_model_len, limit_pool);
    for (int i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= e->ex.vocab_size)
            return di_error(DI_ERR_INVALID_ARG, "field 'prompt_token_ids[%d]': token id %d is outside [0, %d)", i, (int)ids[i],
                            e->ex.vocab_size);
    const di_sampling_params *sp = &r->sampling;
    if (sp->n > e->max_seqs)
        return di_error(DI_ERR_INVALID_ARG, "field 'n': %d completions exceed max_seqs %d", sp->n, e->max_seqs);
    if (sp->n_stop > 0 && !e->has_codec)
        return di_error(DI_ERR_UNSUPPORTED, "field 'stop': stop strings need a tokenizer (this engine has none)");
    DI_TRY(copy_params(q, sp));
    int room = limit - n_ids;
    q->max_new = sp->max_tokens > 0 && sp->max_tokens < room ? sp->max_tokens : room;
    q->prompt_len = n_ids;
    q->n = (int16_t)sp->n;
    q->comp = calloc_lines((size_t)q->n, sizeof *q->comp);
    q->outc = calloc_lines((size_t)q->n, sizeof *q->outc);
    if (!q->comp || !q->outc) return di_error(DI_ERR_NOMEM, "out of memory for %d completions", q->n);
    for (int k = 0; k < q->n; k++) {
        di_completion *c = &q->comp[k];
        c->stop_index = -1;
        c->stop_token = -1;
        c->max_new = q->max_new;
        c->min_tokens = sp->min_tokens;
        c->plain_greedy = (uint8_t)di_sampler_plain_greedy(&q->params);
        c->penalized = (uint8_t)di_penalties_active(&q->params);
        c->check_stop_ids = sp->n_stop_token_ids > 0 || !sp->ignore_eos;
        c->has_stop_strs = sp->n_stop > 0;
        c->fork_pending = k == 0 && q->n > 1;
        c->sched_seen = k > 0; /* only completion 0 is scheduled before the request is */
        DI_TRY(di_seq_init(&c->seq, ids, n_ids, n_ids + q->max_new));
        c->seq.req = q;
        c->seq.index = k;
        c->seq.priority = r->priority;
        if (k > 0) c->seq.state = DI_SEQ_FORK_PENDING;
        if (sp->logprobs >= 0 && !(c->logprobs = calloc((size_t)q->max_new, sizeof *c->logprobs)))
            return di_error(DI_ERR_NOMEM, "out of memory for logprobs");
        if (e->has_codec && !(c->detok = e->codec.detok_create(e->codec.ctx, sp->skip_special_tokens)))
            return di_error(DI_ERR_NOMEM, "out of memory for a detokenizer");
    }
    q->comp[0].seq.seats = q->n;
    if (sp->repetition_penalty != 1.0f) {
        DI_TRY(di_token_counts_reserve(&q->prompt_counts, (uint32_t)n_ids));
        for (int i = 0; i < n_ids; i++) DI_TRY(di_token_counts_add(&q->prompt_counts, ids[i]));
    }
    return DI_OK;
}

di_status di_engine_prepare_request(di_engine *e, const di_request_input *r, const char *where, di_req **out) {
    *out = NULL;
    if (!r) return di_error(DI_ERR_INVALID_ARG, "%s: NULL request", where);
    di_status s = di_sampling_params_validate(&r->sampling, e->ex.vocab_size);
    if (s != DI_OK) return di_error_context(s, "%s", where);
    if ((r->prompt != NULL) == (r->prompt_ids != NULL))
        return di_error(DI_ERR_INVALID_ARG, "%s: give exactly one of 'prompt' (text) and 'prompt_token_ids'", where);
    int32_t *ids = NULL;
    size_t n_ids = r->n_prompt_ids;
    if (r->prompt) {
        if (!e->has_codec) return di_error(DI_ERR_UNSUPPORTED, "%s: a text prompt needs a tokenizer (this engine has none)", where);
        s = e->codec.encode(e->codec.ctx, r->prompt, strlen(r->prompt), &ids, &n_ids);
        if (s != DI_OK) return di_error_context(s, "%s: field 'prompt'", where);
    }
    if (n_ids > (size_t)INT32_MAX) n_ids = (size_t)INT32_MAX;
    di_req *q = calloc_lines(1, sizeof *q);
    if (!q) s = di_error(DI_ERR_NOMEM, "out of memory");
    else s = build_request(e, r, ids ? ids : r->prompt_ids, (int)n_ids, q);
    free(ids);
    if (s != DI_OK) {
        di_req_free(e, q);
        return di_error_context(s, "%s", where);
    }
    *out = q;
    return DI_OK;
}

di_status di_engine_enqueue(di_engine *e, di_req *q) {
    if (e->n_active == e->cap_active) {
        int cap = e->cap_active ? e->cap_active * 2 : 64;
        di_req **a = realloc(e->active, (size_t)cap * sizeof *a);
        if (!a) return di_error(DI_ERR_NOMEM, "engine: out of memory for %d requests", cap);
        e->active = a;
        const di_request_output **o = realloc(e->outs, (size_t)cap * sizeof *o);
        if (!o) return di_error(DI_ERR_NOMEM, "engine: out of memory for %d requests", cap);
        e->outs = o;
        e->cap_active = cap;
    }
    q->id = e->next_id;
    q->seed = q->params.has_seed ? q->params.seed : di_rng_mix64(e->params.seed ^ di_rng_mix64((uint64_t)q->id + 1));
    for (int k = 0; k < q->n; k++) q->comp[k].seq.arrival = (uint64_t)q->id;
    q->arrival_ns = di_now_ns();
    DI_TRY(di_scheduler_add(e->sched, &q->comp[0].seq));
    e->next_id++;
    e->active[e->n_active++] = q;
    e->stats.prompt_tokens += (uint64_t)q->prompt_len;
    return DI_OK;
}

di_status di_engine_add_request(di_engine *e, const di_request_input *r, int64_t *request_id) {
    di_req *q;
    DI_TRY(di_engine_prepare_request(e, r, "request", &q));
    di_status s = di_engine_enqueue(e, q);
    if (s != DI_OK) {
        di_req_free(e, q);
        return s;
    }
    if (request_id) *request_id = q->id;
    return DI_OK;
}

static di_req *find_request(di_engine *e, int64_t id) {
    int lo = 0, hi = e->n_active - 1; /* active is in id order */
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (e->active[mid]->id == id) return e->active[mid];
        if (e->active[mid]->id < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

di_status di_engine_abort(di_engine *e, int64_t id) {
    di_req *q = find_request(e, id);
    if (!q || q->n_finished == q->n) return di_error(DI_ERR_NOT_FOUND, "engine: no unfinished request with id %lld", (long long)id);
    uint64_t now = di_now_ns();
    for (int k = 0; k < q->n; k++) di_engine_finish_completion(e, q, k, DI_FINISH_ABORT, now);
    return DI_OK;
}

int di_engine_has_unfinished(const di_engine *e) { return e->n_active > 0; }

const struct di_tokenizer *di_engine_tokenizer(const di_engine *e) { return e->has_codec ? e->codec.tokenizer : NULL; }

void di_engine_get_stats(const di_engine *e, di_engine_stats *s) {
    *s = e->stats;
    s->preemptions = di_scheduler_preemptions(e->sched);
    s->kv_blocks_total = di_block_manager_total(e->bm);
    s->kv_blocks_free = di_block_manager_n_free(e->bm);
    s->kv_blocks_cached = di_block_manager_n_cached(e->bm);
    s->running = di_scheduler_n_running(e->sched);
    s->waiting = di_scheduler_n_waiting(e->sched);
}

/* ---- the step ---- */

/* Frees requests whose final output was reported by the previous step. */
static void reap(di_engine *e) {
    if (e->n_to_reap == 0) return;
    e->n_to_reap = 0;
    int w = 0;
    for (int i = 0; i < e->n_active; i++) {
        di_req *q = e->active[i];
        if (q->reported_final) di_req_free(e, q);
        else e->active[w++] = q;
    }
    e->n_active = w;
}

/* Samples the token(s) of plan entry i from its logits row; forks n > 1 requests. */
static di_status sample_entry(di_engine *e, di_seq *seq, const float *row, uint64_t now) {
    di_req *q = seq->req;
    di_completion *c = &q->comp[seq->index];
    di_sample_request rq = {
        .params = &q->params,
        .seed = q->seed,
        .position = (uint32_t)seq->len,
        .stream = (uint32_t)seq->index,
        .n_generated = c->n_gen,
        .prompt_counts = q->prompt_counts.cap ? &q->prompt_counts : NULL,
        .output_counts = c->counts.cap ? &c->counts : NULL,
        .eos_ids = e->ex.eos_ids,
        .n_eos = e->ex.n_eos,
    };
    di_token_logprob lp;
    int32_t tok;
    if (seq->index == 0 && q->n > 1 && !q->forked) {
        /* completions 1..n-1 draw their first token from the same row (own streams), then
         * share the leader's blocks; tokens are appended after all forks (an append may
         * finish a completion and release its references) */
        int32_t toks[128];
        di_token_logprob *lps = q->params.logprobs >= 0 ? calloc((size_t)q->n, sizeof *lps) : NULL;
        if (q->params.logprobs >= 0 && !lps) return di_error(DI_ERR_NOMEM, "out of memory");
        di_status s = DI_OK;
        for (int k = 0; k < q->n && s == DI_OK; k++) {
            rq.stream = (uint32_t)k;
            s = di_sampler_sample(e->sampler, row, &rq, &toks[k], lps ? &lps[k] : NULL);
        }
        for (int k = 1; k < q->n && s == DI_OK; k++) {
            di_seq *child = &q->comp[k].seq;
            di_seq_copy_tokens(child, seq);
            s = di_scheduler_fork(e->sched, seq, child);
        }
        if (s == DI_OK) {
            q->forked = 1;
            c->fork_pending = 0;
        }
        for (int k = 0; k < q->n && s == DI_OK; k++)
            s = di_engine_append_token(e, q, &q->comp[k], toks[k], lps ? &lps[k] : NULL, now);
        free(lps);
        return s;
    }
    DI_TRY(di_sampler_sample(e->sampler, row, &rq, &tok, q->params.logprobs >= 0 ? &lp : NULL));
    return di_engine_append_token(e, q, c, tok, q->params.logprobs >= 0 ? &lp : NULL, now);
}

/* Whether seq's token after `ahead` more (not yet appended) can be drawn from a di_sample_row
 * alone: no penalties, logit bias, logprobs, active min_tokens mask, and not the first draw of
 * an n > 1 request (all of its completions draw from one row). */
static int draw_fits_executor(const di_engine *e, const di_seq *seq, int ahead) {
    const di_req *q = seq->req;
    const di_sampling_params *p = &q->params;
    const int n_gen = q->comp[seq->index].n_gen + ahead; /* ahead: tokens in flight */
    if (p->logprobs >= 0 || di_penalties_active(p) || p->n_logit_bias > 0) return 0;
    if (n_gen < p->min_tokens && (p->n_stop_token_ids > 0 || (!p->ignore_eos && e->ex.n_eos > 0))) return 0;
    return !(seq->index == 0 && q->n > 1 && !q->forked);
}

/* The same for a planned row now (a finished completion's row is computed, not sampled). */
static int row_fits_executor(const di_engine *e, const di_seq *seq) {
    if (seq->req->comp[seq->index].finish != DI_FINISH_NONE) return 1; /* computed, not sampled */
    return draw_fits_executor(e, seq, 0);
}

static int step_fits_executor(const di_engine *e, const di_step_plan *plan) {
    if (!e->ex.forward_sample || !e->ex.device_sampling) return 0;
    for (int i = 0; i < plan->n_seqs; i++)
        if (plan->sample[i] && !row_fits_executor(e, plan->seqs[i])) return 0;
    return 1;
}

static const char *sample_failure(int32_t code) {
    return code == DI_SAMPLE_ERR_NAN ? "a logit is NaN or +inf"
           : code == DI_SAMPLE_ERR_MASKED ? "every token is masked (all logits -inf)"
                                          : "no token has a non-zero probability";
}

/* The sampling parameters of the plan's sampled rows, in row order, into e->srows (the
 * position keys the RNG: the index of the token being sampled). */
static void fill_rows(di_engine *e, const di_step_plan *plan) {
    int k = 0;
    for (int i = 0; i < plan->n_seqs; i++) {
        if (!plan->sample[i]) continue;
        const di_seq *seq = plan->seqs[i];
        const di_req *q = seq->req;
        const di_sampling_params *p = &q->params;
        e->srows[k++] = (di_sample_row){p->temperature, p->top_p, p->min_p, p->top_k, q->seed,
                                        (uint32_t)(plan->start[i] + plan->n_new[i]), (uint32_t)seq->index};
    }
}

/* The step's forward with the sampling inside the executor; on success e->stokens[row] and
 * e->sstatus[row] hold each sampled row's outcome (rows numbered as the runner's row_of). */
static di_status run_sampling_step(di_engine *e, const di_step_plan *plan, const int32_t **row_of) {
    fill_rows(e, plan);
    DI_TRY(di_runner_run_sample(e->runner, &e->ex, plan, e->srows, e->stokens, e->sstatus, row_of));
    return DI_OK;
}

/* Whether a plan's step may run asynchronously: the executor can launch steps, and every row
 * is a one-token decode row sampled in the executor (so the next step can be chained to it). */
static int plan_async(const di_engine *e, const di_step_plan *plan) {
    if (!e->ex.launch_sample || plan->n_decode != plan->n_seqs || plan->n_tokens != plan->n_seqs || plan->n_copies > 0)
        return 0;
    for (int i = 0; i < plan->n_seqs; i++)
        if (!plan->sample[i]) return 0;
    return 1;
}

/* Which rows of plan (in flight) go on into a step chained to it, before plan's tokens are
 * known: keep[i] and e->chain_map (the kept rows' indices in plan); returns how many, 0 when
 * no chained step should be made. Nothing waiting may be admissible (a free seat and a waiting
 * request: the next step plans it instead). A row is left out when its completion has
 * finished (in the step before plan, whose results came after plan was launched) or plan's
 * token is its last (max_new); any kept row must have its next token drawable in the
 * executor (no logprobs, penalties, bias, active min_tokens mask, first draw of n > 1). */
static int chain_rows(di_engine *e, const di_step_plan *plan, uint8_t *keep) {
    if (di_scheduler_n_waiting(e->sched) > 0 && di_scheduler_free_seats(e->sched) > 0) return 0;
    int n = 0;
    for (int i = 0; i < plan->n_seqs; i++) {
        const di_seq *seq = plan->seqs[i];
        const di_completion *c = &seq->req->comp[seq->index];
        keep[i] = 0;
        if (c->finish != DI_FINISH_NONE || c->n_gen + 1 >= c->max_new) continue;
        if (!draw_fits_executor(e, seq, 1)) return 0;
        keep[i] = 1;
        e->chain_map[n++] = i;
    }
    return n;
}

/* Plans and launches the step after `plan` (in flight) chained to it; the chained plan, or
 * NULL when it cannot be made (nothing changed then). */
static const di_step_plan *launch_chained(di_engine *e, const di_step_plan *plan) {
    if (chain_rows(e, plan, e->chain_keep) == 0) return NULL;
    const di_step_plan *next = di_scheduler_schedule_chained(e->sched, plan, e->chain_keep);
    if (!next) return NULL;
    fill_rows(e, next);
    if (di_runner_launch_sample(e->runner, &e->ex, next, e->srows, e->chain_map) != DI_OK) {
        /* not queued: take the plan back; a device failure shows again at the collect */
        DI_LOG_W("engine: chained step not launched: %s", di_last_error());
        di_error_clear();
        di_scheduler_unplan(e->sched, next);
        return NULL;
    }
    e->steps_chained++;
    return next;
}

/* After a step's forward: per planned sequence, registers filled blocks and appends its
 * token (from the executor's e->stokens, or sampled here from the logits); a request that
 * cannot continue is aborted and named in the returned error, the others go on. */
static di_status process_step(di_engine *e, const di_step_plan *plan, const int32_t *row_of, const float *logits,
                              int in_executor) {
    di_status err = DI_OK;
    e->stats.steps++;
    if (in_executor) e->steps_sampled_in_executor++;
    else e->steps_sampled_on_host++;
    e->stats.computed_tokens += (uint64_t)plan->n_tokens;
    e->stats.prefix_hit_tokens += (uint64_t)plan->prefix_hit_tokens;
    uint64_t now = di_now_ns();
    const int V = e->ex.vocab_size;
    for (int i = 0; i < plan->n_seqs; i++) {
        di_seq *seq = plan->seqs[i];
        di_req *q = seq->req;
        di_completion *c = di_seq_completion(seq);
        if (di_scheduler_commit_due(plan, i)) di_scheduler_commit_entry(e->sched, plan, i); /* -> prefix cache */
        if (!c->sched_seen) {
            c->sched_seen = 1;
            if (!q->first_sched_ns) {
                q->first_sched_ns = now;
                q->cached_tokens = seq->n_cached_first;
            }
        }
        if (row_of[i] < 0 || c->finish != DI_FINISH_NONE) continue;
        di_status s;
        if (in_executor) {
            s = e->stokens[row_of[i]] >= 0
                    ? di_engine_append_token(e, q, c, e->stokens[row_of[i]], NULL, now)
                    : di_error(DI_ERR_BACKEND, "sampling in the executor: %s", sample_failure(e->sstatus[row_of[i]]));
        } else if (c->plain_greedy && c->n_gen >= c->min_tokens && !c->fork_pending) {
            /* what di_sampler_sample would do for this row, without its per-row setup */
            int32_t tok;
            s = di_sampler_argmax(logits + (size_t)row_of[i] * V, V, &tok);
            if (s == DI_OK) s = di_engine_append_token(e, q, c, tok, NULL, now);
        } else {
            s = sample_entry(e, seq, logits + (size_t)row_of[i] * V, now);
        }
        if (s != DI_OK) {
            /* this request cannot continue; the others go on */
            if (err == DI_OK) err = di_error_context(s, "engine: request %lld", (long long)q->id);
            for (int k = 0; k < q->n; k++) di_engine_finish_completion(e, q, k, DI_FINISH_ABORT, now);
        }
    }
    return err;
}

/* The in-flight step: the next one chained to it is launched first when it can be, then its
 * tokens are collected and appended. A failed collect drops the chained step too and takes
 * both plans back (nothing of them was computed as far as the engine knows). */
static di_status finish_flight(di_engine *e) {
    const di_step_plan *plan = e->flight;
    const di_step_plan *next = launch_chained(e, plan);
    e->flight = next;
    di_status s = e->ex.collect_sample(e->ex.ctx, e->stokens, e->sstatus);
    if (s != DI_OK) {
        s = di_error_context(s, "engine: forward pass of step %llu", (unsigned long long)e->stats.steps);
        if (next) {
            if (e->ex.collect_sample(e->ex.ctx, e->stokens, e->sstatus) != DI_OK) di_error_clear();
            di_scheduler_unplan(e->sched, next);
            e->flight = NULL;
        }
        di_scheduler_unplan(e->sched, plan);
        return s;
    }
    return process_step(e, plan, e->row_ident, NULL, 1);
}

/* A step call with a step in flight: finish_flight, then the requests reported finished in
 * the previous call are freed (after the in-flight step, whose plan may name them), then the
 * report. */
static di_status flight_step(di_engine *e, size_t *n_outs) {
    di_status err = finish_flight(e);
    reap(e);
    di_engine_report(e, n_outs);
    return err;
}

di_status di_engine_step(di_engine *e, const di_request_output *const **outs, size_t *n_outs) {
    *outs = e->outs;
    *n_outs = 0;
    di_status err = DI_OK;
    if (e->flight) return flight_step(e, n_outs);
    reap(e);
    const di_step_plan *plan = di_scheduler_schedule(e->sched);
    if (plan->n_seqs == 0) {
        if (di_scheduler_n_waiting(e->sched) + di_scheduler_n_running(e->sched) > 0)
            return di_error(DI_ERR_INTERNAL, "engine: no sequence could be scheduled (%d waiting, %d running)",
                            di_scheduler_n_waiting(e->sched), di_scheduler_n_running(e->sched));
    } else {
        const float *logits = NULL;
        const int32_t *row_of;
        const int in_executor = step_fits_executor(e, plan);
        di_status s;
        if (in_executor && plan_async(e, plan)) {
            fill_rows(e, plan);
            s = di_runner_launch_sample(e->runner, &e->ex, plan, e->srows, NULL);
            if (s == DI_OK) {
                e->flight = plan;
                return flight_step(e, n_outs);
            }
        } else {
            s = in_executor ? run_sampling_step(e, plan, &row_of)
                            : di_runner_run(e->runner, &e->ex, plan, &logits, &row_of);
        }
        if (s != DI_OK) {
            /* nothing was computed: take back the plan's progress so the state stays consistent */
            di_scheduler_unplan(e->sched, plan);
            return di_error_context(s, "engine: forward pass of step %llu", (unsigned long long)e->stats.steps);
        }
        err = process_step(e, plan, row_of, logits, in_executor);
    }
    di_engine_report(e, n_outs);
    return err;
}
