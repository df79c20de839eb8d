/* decode_async.c - asynchronous sampling steps (di_model_sample_launch / _collect): a step is
 * queued while the previous one still runs, so the GPU never waits for the host between
 * decode steps.
 *
 * Owner: cuda (model extension). A chained step (row j's input = the token just sampled for
 * row chain[j] of the previous step) continues a graph step of decode_step.c in place: row j
 * takes that row's position in the bucket (the others are padding), its input id is already in
 * its metadata buffer (the previous step's sampler wrote it), and the rest of its metadata goes
 * in on the backend's copy lane while the previous step still runs; its tokens come back on
 * the other copy lane under a fence, issued after the step's graph. (Deferring the lm_head +
 * sampler into the next step's graph, or capturing the tokens' copy inside the graph, was
 * measured and lost: docs/PERF.md, 2026-12-05.)
 * Invariants: at most two steps are in flight; meta[p] is rewritten only when the step that
 * last read it has been collected. */
#include <string.h>

#include "core/status.h"
#include "model/decode_step_internal.h"

int di_model_sample_in_flight(const di_model *m) { return m && m->step ? m->step->n_q : 0; }

/* Waits for device step p and moves its results into the host arrays of its slot. */
static di_status settle(di_model *m, pending_step *p) {
    di_step_state *s = m->step;
    if (!p->device) return DI_OK;
    di_status st = p->lost ? di_error(DI_ERR_BACKEND, "the step's results could not be waited for") : DI_OK;
    if (st == DI_OK) st = m->be->fence_wait(m->be, p->slot);
    if (st != DI_OK) { /* no results: its collect (settling it again) reports an error, not stale tokens */
        p->lost = 1;
        return st;
    }
    p->device = 0;
    const unsigned char *res = s->h_out[p->slot];
    const int32_t *tok = (const int32_t *)res, *code = (const int32_t *)(res + p->stat_off);
    for (int i = 0; i < p->n; i++) {
        s->res_tok[p->slot][i] = tok[p->at[i]];
        s->res_stat[p->slot][i] = code[p->at[i]];
    }
    return DI_OK;
}

di_status di_model_sample_launch(di_model *m, const di_batch *batch_in, const di_sample_row *rows,
                                 const int32_t *chain) {
    if (!m || !m->step || !batch_in) return di_error(DI_ERR_INVALID_ARG, "di_model_sample_launch: NULL argument");
    di_step_state *s = m->step;
    di_batch chained_batch = *batch_in; /* a chained step's ids are not the caller's: checked as zeros */
    if (chain && batch_in->n_tokens >= 0 && batch_in->n_tokens <= m->max_tokens) chained_batch.token_ids = s->zero_ids;
    const di_batch *batch = chain ? &chained_batch : batch_in;
    DI_TRY(di_step_check(m, batch, rows, 0, NULL, "di_model_sample_launch"));
    if (s->n_q == 2) return di_error(DI_ERR_INVALID_ARG, "di_model_sample_launch: two steps already in flight");
    pending_step *prev = s->n_q > 0 ? &s->q[(s->q_head + s->n_q - 1) % 2] : NULL;
    int n = batch->n_logits;
    if (chain) {
        if (!prev) return di_error(DI_ERR_INVALID_ARG, "di_model_sample_launch: chained, but no step in flight");
        int decode = batch->n_decode_seqs == batch->n_seqs && batch->n_tokens == batch->n_seqs && n == batch->n_seqs;
        for (int j = 0; decode && j < n; j++) decode = batch->logits_rows[j] == j;
        if (!decode || n > prev->n)
            return di_error(DI_ERR_INVALID_ARG,
                            "di_model_sample_launch: a chained step must be a decode step of at most the previous "
                            "step's %d rows (got %d sequences, %d tokens, %d logits rows)", prev->n, batch->n_seqs,
                            batch->n_tokens, n);
        memset(s->seen, 0, (size_t)prev->n);
        for (int j = 0; j < n; j++) {
            if (chain[j] < 0 || chain[j] >= prev->n || s->seen[chain[j]])
                return di_error(DI_ERR_INVALID_ARG, "di_model_sample_launch: chain[%d] = %d: not a distinct row of the "
                                "previous step's %d", j, chain[j], prev->n);
            s->seen[chain[j]] = 1;
        }
    } else if (prev) {
        return di_error(DI_ERR_INVALID_ARG, "di_model_sample_launch: an unchained step with %d steps in flight",
                        s->n_q);
    }
    int slot = (s->q_head + s->n_q) % 2;
    pending_step *p = &s->q[slot];
    int32_t *at = s->at[slot];
    int device = s->async_on && m->be->sample && n > 0 && di_step_graph_eligible(m, batch);
    int bi = device ? di_step_bucket_of(s, batch->n_seqs) : -1;
    /* a chained device step continues a device step in its bucket, each row at the position of
     * the row that feeds it (its id is in place there); otherwise the ids go from the host */
    int in_place = device && chain && prev->device && prev->parity == 1 - s->parity;
    if (chain && !in_place) {
        DI_TRY(settle(m, prev));
        for (int j = 0; j < n; j++) {
            int32_t t = s->res_tok[prev->slot][chain[j]];
            s->chain_ids[j] = t >= 0 && t < m->cfg.vocab_size ? t : 0;
        }
    }
    const int32_t *ids = chain && !in_place ? s->chain_ids : NULL;
    if (device) {
        di_batch b = *batch;
        if (ids) b.token_ids = ids;
        if (in_place) bi = prev->bucket;
        for (int j = 0; j < n; j++) at[j] = in_place ? prev->at[chain[j]] : j;
        step_layout L = layout_of(di_step_buckets[bi], m->max_blocks_per_seq);
        int par = 0;
        DI_TRY(di_step_graph(m, &b, rows, bi, in_place, at, &par));
        m->be->copy_out(m->be, s->h_out[slot], s->d_meta[1 - par], out_bytes(&L, di_step_buckets[bi]), slot);
        *p = (pending_step){n, 1, slot, L.stat, bi, par, at, 0};
    } else {
        DI_TRY(di_step_run(m, batch, rows, s->res_tok[slot], s->res_stat[slot], ids));
        *p = (pending_step){n, 0, slot, 0, -1, 0, at, 0};
    }
    s->n_q++;
    return DI_OK;
}

di_status di_model_sample_collect(di_model *m, int32_t *tokens, int32_t *status) {
    if (!m || !m->step) return di_error(DI_ERR_INVALID_ARG, "di_model_sample_collect: NULL model");
    di_step_state *s = m->step;
    if (s->n_q == 0) return di_error(DI_ERR_INVALID_ARG, "di_model_sample_collect: no step in flight");
    pending_step *p = &s->q[s->q_head];
    if (p->n > 0 && (!tokens || !status)) return di_error(DI_ERR_INVALID_ARG, "di_model_sample_collect: NULL argument");
    di_status st = settle(m, p);
    s->q_head = (s->q_head + 1) % 2;
    s->n_q--;
    if (st != DI_OK) return di_error_context(st, "di_model_sample_collect");
    memcpy(tokens, s->res_tok[p->slot], (size_t)p->n * sizeof(int32_t));
    memcpy(status, s->res_stat[p->slot], (size_t)p->n * sizeof(int32_t));
    return DI_OK;
}
