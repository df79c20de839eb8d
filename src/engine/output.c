/* output.c - what happens to a sampled token: it joins the sequence, the penalty counts and
 * the logprobs; it is decoded into the completion's text by the streaming detokenizer; then
 * the stop conditions are checked in this order: EOS / stop token id (kept in token_ids, not
 * in text), stop string (text cut before it, OpenAI semantics; only from min_tokens on),
 * max_tokens / context limit. Also the step's report: which requests are reported and their
 * refreshed outputs: with stream_outputs every request that produced tokens (its completions'
 * counts differ from those it last reported) or finished (touched), else the finished ones.
 *
 * Owner: engine. Text invariants: text[text_len] == 0; visible <= text_len, and while running
 * the bytes past `visible` are a possible start of a stop string (held back). Counters:
 * e->n_final_unreported = requests whose completions all finished and whose final output
 * was not reported yet (each has touched set); e->n_to_reap = requests reported final by
 * the last report (freed at the next step). */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/engine_internal.h"
#include "engine/stop.h"

static int is_stop_token(const di_engine *e, const di_req *q, int32_t t) {
    for (int i = 0; i < q->params.n_stop_token_ids; i++)
        if (q->params.stop_token_ids[i] == t) return 1;
    if (!q->params.ignore_eos)
        for (int i = 0; i < e->ex.n_eos; i++)
            if (e->ex.eos_ids[i] == t) return 1;
    return 0;
}

static di_status ensure_text(di_completion *c) {
    if (c->text) return DI_OK;
    c->text_cap = 64;
    if (!(c->text = malloc(c->text_cap))) return di_error(DI_ERR_NOMEM, "out of memory for output text");
    c->text[0] = '\0';
    return DI_OK;
}

void di_engine_finish_completion(di_engine *e, di_req *q, int k, di_finish_reason reason, uint64_t now) {
    di_completion *c = &q->comp[k];
    if (c->finish != DI_FINISH_NONE) return;
    c->finish = reason;
    q->n_finished++;
    q->touched = 1;
    if (c->stop_index < 0 && c->detok && ensure_text(c) == DI_OK) {
        /* emit bytes of an incomplete character held by the detokenizer (as U+FFFD) */
        if (e->codec.detok_flush(c->detok, &c->text, &c->text_len, &c->text_cap) != DI_OK) c->text[c->text_len] = '\0';
    }
    c->visible = c->text_len;
    if (c->seq.state == DI_SEQ_RUNNING || c->seq.state == DI_SEQ_WAITING) di_scheduler_finish(e->sched, &c->seq);
    c->seq.state = DI_SEQ_FINISHED;
    if (q->n_finished == q->n) {
        q->finish_ns = now;
        e->n_final_unreported++;
    }
}

di_status di_engine_append_token(di_engine *e, di_req *q, di_completion *c, int32_t token, const di_token_logprob *lp,
                                 uint64_t now) {
    di_seq *s = &c->seq;
    const di_sampling_params *p = &q->params;
    const int k = s->index;
    DI_ASSERT(c->n_gen < c->max_new && c->finish == DI_FINISH_NONE); /* so s->len < s->cap */
    s->tokens[s->len++] = token;
    c->n_gen++;
    e->stats.generated_tokens++;
    if (c->n_gen == 1 && !q->first_token_ns) q->first_token_ns = now;
    c->last_token_ns = now;
    if (lp && c->logprobs) c->logprobs[c->n_gen - 1] = *lp;
    if (c->penalized) DI_TRY(di_token_counts_add(&c->counts, token));

    if (c->check_stop_ids && is_stop_token(e, q, token)) {
        c->stop_token = token;
        di_engine_finish_completion(e, q, k, DI_FINISH_STOP, now);
        return DI_OK;
    }
    if (c->detok) {
        DI_TRY(ensure_text(c));
        DI_TRY(e->codec.detok_push(c->detok, token, &c->text, &c->text_len, &c->text_cap));
        if (c->has_stop_strs) {
            size_t at = 0;
            int idx = c->n_gen >= c->min_tokens
                          ? di_stop_find(c->text, c->text_len, c->stop_checked, p->stop, p->n_stop, &at)
                          : -1;
            c->stop_checked = c->text_len;
            if (idx >= 0) {
                c->text_len = at;
                c->text[at] = '\0';
                c->stop_index = idx;
                di_engine_finish_completion(e, q, k, DI_FINISH_STOP, now);
                return DI_OK;
            }
        }
    }
    if (c->n_gen >= c->max_new) {
        di_engine_finish_completion(e, q, k, DI_FINISH_LENGTH, now);
        return DI_OK;
    }
    c->visible = c->text_len;
    if (c->has_stop_strs && c->text) c->visible -= di_stop_holdback(c->text, c->text_len, p->stop, p->n_stop);
    return DI_OK;
}

static double secs(uint64_t a, uint64_t b) { return b > a ? (double)(b - a) * 1e-9 : 0.0; }

/* Called for every request that changed in a step, so the fields that never change are set
 * once (out_ready), those fixed once known (cached tokens, queue time, TTFT) until then
 * (out_timed), those of a completion's end when it ends, and the per-step work is a few
 * stores per completion. */
static void fill_output(di_req *q) {
    di_request_output *o = &q->out;
    if (!q->out_ready) {
        o->request_id = q->id;
        o->n_choices = (size_t)q->n;
        o->choices = q->outc;
        o->prompt_tokens = (size_t)q->prompt_len;
        for (int k = 0; k < q->n; k++) {
            q->outc[k].index = k;
            q->outc[k].token_ids = q->comp[k].seq.tokens + q->prompt_len;
            q->outc[k].logprobs = q->comp[k].logprobs;
            q->outc[k].finish_reason = DI_FINISH_NONE;
            q->outc[k].stop_reason = NULL;
            q->outc[k].stop_token = -1;
        }
        q->out_ready = 1;
    }
    o->finished = q->n_finished == q->n;
    size_t total = 0;
    for (int k = 0; k < q->n; k++) {
        const di_completion *c = &q->comp[k];
        di_completion_output *co = &q->outc[k];
        co->text = c->text ? c->text : "";
        co->text_len = c->visible;
        co->n_tokens = (size_t)c->n_gen;
        total += (size_t)c->n_gen;
        if (c->finish != DI_FINISH_NONE) {
            co->finish_reason = c->finish;
            co->stop_reason = c->stop_index >= 0 ? q->params.stop[c->stop_index] : NULL;
            co->stop_token = c->stop_token;
        }
    }
    o->completion_tokens = total;
    /* cached tokens and queue time once scheduled, TTFT once there is a token */
    if (!q->out_timed) {
        o->cached_tokens = q->cached_tokens > 0 ? (size_t)q->cached_tokens : 0;
        if (o->timing.queue_s == 0.0 && q->first_sched_ns) o->timing.queue_s = secs(q->arrival_ns, q->first_sched_ns);
        if (o->timing.ttft_s == 0.0 && q->first_token_ns) o->timing.ttft_s = secs(q->arrival_ns, q->first_token_ns);
        q->out_timed = q->first_sched_ns && q->first_token_ns;
    }
    /* TPOT and end-to-end when finished (0 while running) */
    if (o->finished) {
        int longest = 0;
        uint64_t last = 0;
        for (int k = 0; k < q->n; k++) {
            const di_completion *c = &q->comp[k];
            if (c->n_gen > longest) longest = c->n_gen;
            if (c->last_token_ns > last) last = c->last_token_ns;
        }
        if (!q->first_sched_ns) o->timing.queue_s = secs(q->arrival_ns, q->finish_ns);
        o->timing.tpot_s = longest > 1 ? secs(q->first_token_ns, last) / (longest - 1) : 0.0;
        o->timing.e2e_s = secs(q->arrival_ns, q->finish_ns);
    }
}

/* Whether a completion of q produced tokens since q's last report (which left each
 * completion's count in its reported output). */
static int has_new_tokens(const di_req *q) {
    for (int k = 0; k < q->n; k++)
        if ((size_t)q->comp[k].n_gen != q->outc[k].n_tokens) return 1;
    return 0;
}

void di_engine_report(di_engine *e, size_t *n_outs) {
    *n_outs = 0;
    const int stream = e->params.stream_outputs;
    if (!stream && e->n_final_unreported == 0) return; /* nothing to report */
    size_t n = 0;
    for (int i = 0; i < e->n_active; i++) {
        di_req *q = e->active[i];
        if (!q->touched && !(stream && has_new_tokens(q))) continue;
        if (!stream && q->n_finished < q->n) {
            q->touched = 0;
            continue;
        }
        fill_output(q);
        q->touched = 0;
        if (q->n_finished == q->n) {
            q->reported_final = 1;
            e->n_final_unreported--;
            e->n_to_reap++;
        }
        e->outs[n++] = &q->out;
    }
    *n_outs = n;
}
