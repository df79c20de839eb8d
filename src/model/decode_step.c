/* decode_step.c - the sampling step of the model (di_model_forward_sample): logits sampled on
 * the device when the backend can (only tokens cross to the host), on the host otherwise; and
 * CUDA-graph replay of pure decode steps, one graph per batch-size bucket and parity (the
 * asynchronous launch / collect of such steps: decode_async.c).
 *
 * Owner: cuda (model extension). A decode step of n sequences with one token each is padded to
 * the smallest bucket B >= n (padding tokens write no cache slot, attend to one position and
 * are sampled greedily, their results dropped), its metadata packed at the bucket's fixed
 * offsets (step_layout) and uploaded with one copy, and the graph of (bucket, parity)
 * launched. Graph steps alternate between two metadata buffers (the parity): a step of
 * parity p reads meta[p] and its sampler writes the tokens and status into meta[1 - p]'s ids
 * and stat fields, which are exactly where the next step (parity 1 - p) reads its input ids.
 * A step graph holds the body (embed .. final norm, left in m->x) and the sampling (lm_head
 * and sampler); the tokens stay on the device (decode_async.c copies them out after the
 * graph). The first step of a (bucket, parity) runs eagerly (creating every lazily built
 * plan), the next captures the graph. Invariants: a graph depends only on (B, parity), never
 * on contexts or tokens (the ops read those from device memory); everything here is allocated
 * in di_model_step_setup at load. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "model/decode_step_internal.h"

const int di_step_buckets[N_BUCKETS] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256};


di_status di_model_step_setup(di_model *m) {
    di_backend *be = m->be;
    if (be->reserve) {
        di_backend_reserve r = {m->max_tokens, m->max_seqs, m->cfg.vocab_size, m->mla};
        DI_TRY(be->reserve(be, &r));
    }
    di_step_state *s = calloc(1, sizeof *s);
    if (!s) return di_error(DI_ERR_NOMEM, "out of memory (step state)");
    m->step = s;
    int mb = 0;
    for (int i = 0; i < N_BUCKETS; i++)
        if (di_step_buckets[i] <= m->max_seqs && di_step_buckets[i] <= m->max_tokens &&
            di_step_buckets[i] <= m->logits_chunk)
            mb = di_step_buckets[i];
    s->max_bucket = mb;
    const char *env = getenv("DEEPINFER_CUDA_GRAPHS");
    s->graphs_on = be->graph_begin && mb > 0 && !(env && env[0] == '0');
    const char *rp = getenv("DEEPINFER_STEP_REPLAYS");
    s->replays = rp && atoi(rp) > 1 ? atoi(rp) : 1;
    size_t T = (size_t)m->max_tokens;
    for (int k = 0; k < 2; k++) {
        s->res_tok[k] = calloc(T, sizeof(int32_t));
        s->res_stat[k] = calloc(T, sizeof(int32_t));
        if (!s->res_tok[k] || !s->res_stat[k]) return di_error(DI_ERR_NOMEM, "out of memory (step results)");
    }
    s->chain_ids = calloc(T, sizeof(int32_t));
    s->zero_ids = calloc(T, sizeof(int32_t));
    s->at[0] = calloc(T, sizeof(int32_t));
    s->at[1] = calloc(T, sizeof(int32_t));
    s->seen = calloc(T, 1);
    if (!s->chain_ids || !s->zero_ids || !s->at[0] || !s->at[1] || !s->seen)
        return di_error(DI_ERR_NOMEM, "out of memory (step results)");
    if (!be->sample) return DI_OK;
    size_t B = (size_t)(mb > 0 ? mb : 1);
    DI_TRY(be->alloc(be, T * sizeof(int32_t), (void **)&s->d_tokens));
    DI_TRY(be->alloc(be, T * sizeof(int32_t), (void **)&s->d_status));
    DI_TRY(be->alloc(be, T * sizeof(di_sample_row), (void **)&s->d_rows));
    step_layout L = layout_of((int)B, m->max_blocks_per_seq);
    s->async_on = s->graphs_on && be->host_alloc && be->copy_in && be->copy_out && be->fence_wait;
    for (int k = 0; k < 2; k++) {
        DI_TRY(be->alloc(be, L.total, (void **)&s->d_meta[k]));
        if (s->async_on) {
            DI_TRY(be->host_alloc(be, L.total, (void **)&s->h_meta[k]));
            DI_TRY(be->host_alloc(be, L.pos, (void **)&s->h_out[k]));
        } else {
            s->h_meta[k] = calloc(1, L.total);
            if (!s->h_meta[k]) return di_error(DI_ERR_NOMEM, "out of memory (step staging)");
        }
    }
    s->h_res = calloc(1, L.pos);
    s->status = calloc(T, sizeof(int32_t));
    if (!s->h_res || !s->status) return di_error(DI_ERR_NOMEM, "out of memory (step staging)");
    return DI_OK;
}

void di_model_step_free(di_model *m) {
    di_step_state *s = m->step;
    if (!s) return;
    di_backend *be = m->be;
    if (s->n_q > 0 && be->sync) { /* launched and never collected: let it finish before freeing */
        if (be->sync(be) != DI_OK) di_error_clear();
        for (int i = 0; i < s->n_q; i++) {
            int slot = (s->q_head + i) % 2;
            const pending_step *p = &s->q[slot];
            if (p->device && be->fence_wait(be, p->slot) != DI_OK) di_error_clear();
        }
    }
    for (int i = 0; i < N_BUCKETS; i++)
        for (int k = 0; k < 2; k++)
            if (s->graph[i][k] && be->graph_free) be->graph_free(be, s->graph[i][k]);
    be->free(be, s->d_tokens);
    be->free(be, s->d_status);
    be->free(be, s->d_rows);
    for (int k = 0; k < 2; k++) {
        be->free(be, s->d_meta[k]);
        if (s->async_on) {
            be->host_free(be, s->h_meta[k]);
            be->host_free(be, s->h_out[k]);
        } else {
            free(s->h_meta[k]);
        }
        free(s->res_tok[k]);
        free(s->res_stat[k]);
    }
    free(s->chain_ids);
    free(s->zero_ids);
    free(s->at[0]);
    free(s->at[1]);
    free(s->seen);
    free(s->h_res);
    free(s->status);
    free(s->h_logits);
    di_sampler_free(s->sampler);
    free(s);
    m->step = NULL;
}

static di_status check_rows(const di_sample_row *rows, int n) {
    for (int j = 0; j < n; j++) {
        const di_sample_row *r = &rows[j];
        if (!(r->temperature >= 0.0f) || !(r->top_p > 0.0f && r->top_p <= 1.0f) || !(r->min_p >= 0.0f && r->min_p <= 1.0f))
            return di_error(DI_ERR_INVALID_ARG,
                            "di_model_forward_sample: rows[%d]: temperature %g (expected >= 0), top_p %g (expected in (0, 1]), "
                            "min_p %g (expected in [0, 1])", j, (double)r->temperature, (double)r->top_p, (double)r->min_p);
    }
    return DI_OK;
}

static di_status sample_status(const int32_t *status, int n) {
    for (int j = 0; j < n; j++)
        if (status[j] != DI_SAMPLE_OK)
            return di_error(DI_ERR_BACKEND, "sampling row %d: %s", j,
                            status[j] == DI_SAMPLE_ERR_NAN      ? "a logit is NaN or +inf"
                            : status[j] == DI_SAMPLE_ERR_MASKED ? "every logit is -inf"
                                                                : "no token has a non-zero probability");
    return DI_OK;
}

/* Copies the sampled tokens back (one synchronisation); a failed row has token -1, and only
 * then are the status codes fetched (into status, or to name the reason of the error). */
static di_status fetch_tokens(di_model *m, int32_t *tokens, int32_t *status, int n) {
    di_backend *be = m->be;
    di_step_state *s = m->step;
    DI_TRY(be->download(be, tokens, s->d_tokens, (size_t)n * sizeof(int32_t)));
    if (status) memset(status, 0, (size_t)n * sizeof(int32_t));
    for (int j = 0; j < n; j++)
        if (tokens[j] < 0) {
            DI_TRY(be->download(be, status ? status : s->status, s->d_status, (size_t)n * sizeof(int32_t)));
            return status ? DI_OK : sample_status(s->status, n);
        }
    return DI_OK;
}

/* ---------------------------------------------------------------- host fallback ---- */

/* The DI_SAMPLE_ERR_* code of a row the host sampler refused (it refuses only these three). */
static int32_t host_failure(const float *x, int V) {
    int all_masked = 1;
    for (int i = 0; i < V; i++) {
        if (x[i] != x[i] || x[i] == INFINITY) return DI_SAMPLE_ERR_NAN;
        all_masked &= x[i] == -INFINITY;
    }
    return all_masked ? DI_SAMPLE_ERR_MASKED : DI_SAMPLE_ERR_ZERO;
}

di_status di_step_sample_rows_host(di_sampler *smp, const float *logits, int n, int V, const di_sample_row *rows,
                                   int32_t *tokens, int32_t *status) {
    for (int j = 0; j < n; j++) {
        di_sampling_params p;
        di_sampling_params_init(&p);
        p.temperature = rows[j].temperature;
        p.top_p = rows[j].top_p;
        p.top_k = rows[j].top_k;
        p.min_p = rows[j].min_p;
        di_sample_request rq = {&p, rows[j].seed, rows[j].position, rows[j].stream, 0, NULL, NULL, NULL, 0};
        const float *x = logits + (size_t)j * V;
        di_status st = di_sampler_sample(smp, x, &rq, &tokens[j], NULL);
        if (status) status[j] = DI_SAMPLE_OK;
        if (st == DI_OK) continue;
        if (!status) return st;
        di_error_clear();
        tokens[j] = -1;
        status[j] = host_failure(x, V);
    }
    return DI_OK;
}

static di_status sample_host(di_model *m, const di_batch *b, const di_sample_row *rows, int32_t *tokens,
                             int32_t *status) {
    di_step_state *s = m->step;
    int V = m->cfg.vocab_size;
    if (!s->sampler) DI_TRY(di_sampler_create(V, &s->sampler));
    if (b->n_logits > s->h_logits_rows) { /* grows to the largest step seen, then stays */
        float *p = realloc(s->h_logits, (size_t)b->n_logits * V * sizeof(float));
        if (!p) return di_error(DI_ERR_NOMEM, "out of memory for %d x %d logits", b->n_logits, V);
        s->h_logits = p;
        s->h_logits_rows = b->n_logits;
    }
    DI_TRY(di_deepseek_forward(m, b, s->h_logits, NULL));
    return di_step_sample_rows_host(s->sampler, s->h_logits, b->n_logits, V, rows, tokens, status);
}

/* ---------------------------------------------------------------- device ---- */

/* lm_head for batch rows 0..n-1 (all tokens, in order; x = their final norm, which
 * di_deepseek_layers left there) and the sample op with the rows' parameters at d_rows
 * (device), into d_tokens / d_status (device) */
static void logits_and_sample(di_model *m, int n, const di_sample_row *d_rows, int32_t *d_tokens,
                              int32_t *d_status) {
    di_backend *be = m->be;
    int D = m->cfg.hidden_size, V = m->cfg.vocab_size;
    const di_weight *head = m->lm_head_tied ? &m->embed : &m->lm_head;
    be->matmul(be, m->logits, V, m->x, D, head, n, DI_MM_OUT_F32);
    be->sample(be, d_tokens, d_status, m->logits, n, V, d_rows);
}

int di_step_bucket_of(const di_step_state *s, int n) {
    for (int i = 0; i < N_BUCKETS; i++)
        if (di_step_buckets[i] >= n && di_step_buckets[i] <= s->max_bucket) return i;
    return -1;
}

int di_step_graph_eligible(const di_model *m, const di_batch *b) {
    const di_step_state *s = m->step;
    if (!s->graphs_on || b->n_decode_seqs != b->n_seqs || b->n_tokens != b->n_seqs || b->n_logits != b->n_seqs)
        return 0;
    for (int j = 0; j < b->n_logits; j++)
        if (b->logits_rows[j] != j) return 0;
    return di_step_bucket_of(s, b->n_seqs) >= 0;
}

/* Packs the metadata of a decode step padded to bucket bi into h_meta[p] and sends it to
 * meta[p]. Row i of the batch sits at position at[i] of the bucket (at NULL: at i); the other
 * positions are padding. chained: the input ids are already in meta[p] (the previous graph
 * step's sampler wrote them), so only the rest is sent, on the copy lane while the previous
 * step still runs (meta[p] is free: the step that read it last has been collected); any other
 * step's upload is simply ordered after everything queued. */
void di_step_put_meta(di_model *m, const di_batch *b, const di_sample_row *rows, int bi, int chained,
                      const int32_t *at, int p) {
    di_backend *be = m->be;
    di_step_state *s = m->step;
    int n = b->n_seqs, B = di_step_buckets[bi], mb = m->max_blocks_per_seq;
    step_layout L = layout_of(B, mb);
    unsigned char *h = s->h_meta[p], *d = s->d_meta[p];
    int32_t *ids = (int32_t *)(h + L.ids), *pos = (int32_t *)(h + L.pos), *slots = (int32_t *)(h + L.slots);
    int32_t *start = (int32_t *)(h + L.start), *ctx = (int32_t *)(h + L.ctx), *bt = (int32_t *)(h + L.bt);
    di_sample_row *hrows = (di_sample_row *)(h + L.rows);
    for (int i = 0; i <= B; i++) start[i] = i;
    for (int i = at ? 0 : n; i < B; i++) { /* padding: no cache write, one position, greedy */
        if (!chained) ids[i] = 0;
        pos[i] = 0;
        slots[i] = -1;
        ctx[i] = 1;
        bt[(size_t)i * mb] = 0;
        hrows[i] = (di_sample_row){0.0f, 1.0f, 0.0f, 0, 0, 0, 0};
    }
    for (int i = 0; i < n; i++) {
        int q = at ? at[i] : i, used = (b->seq_ctx_len[i] + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
        if (!chained) ids[q] = b->token_ids[i];
        pos[q] = b->positions[i];
        slots[q] = b->slot_mapping[i];
        ctx[q] = b->seq_ctx_len[i];
        hrows[q] = rows[i];
        memcpy(bt + (size_t)q * mb, b->block_table + (size_t)i * b->max_blocks, (size_t)used * sizeof(int32_t));
    }
    if (chained) be->copy_in(be, d + L.pos, h + L.pos, L.total - L.pos);
    else be->upload(be, d, h, L.total);
}

/* body(bi, p): the layers of the bucket-bi step whose metadata is in meta[p], up to the final
 * norm (left in m->x). max_ctx_len: a graph must not depend on the step's contexts. */
static void run_body(di_model *m, int bi, int p) {
    int B = di_step_buckets[bi], mb = m->max_blocks_per_seq;
    step_layout L = layout_of(B, mb);
    const unsigned char *d = m->step->d_meta[p];
    di_attn_batch ab = {.positions = (const int32_t *)(d + L.pos), .slot_mapping = (const int32_t *)(d + L.slots),
                        .seq_start = (const int32_t *)(d + L.start), .seq_ctx_len = (const int32_t *)(d + L.ctx),
                        .block_table = (const int32_t *)(d + L.bt), .n_tokens = B, .n_seqs = B, .max_blocks = mb,
                        .max_q_len = 1, .max_ctx_len = mb * DI_KV_BLOCK_SIZE};
    di_deepseek_layers(m, (const int32_t *)(d + L.ids), &ab, B, B, &m->final_norm);
}

/* The sampling of the bucket-bi step of parity p (its final norm in m->x) with the rows of
 * meta[p]; tokens and status go to meta[1 - p]'s ids and stat (where the next step reads its
 * ids). */
static void run_sample(di_model *m, int bi, int p) {
    step_layout L = layout_of(di_step_buckets[bi], m->max_blocks_per_seq);
    unsigned char *out = m->step->d_meta[1 - p];
    logits_and_sample(m, di_step_buckets[bi], (const di_sample_row *)(m->step->d_meta[p] + L.rows),
                      (int32_t *)(out + L.ids), (int32_t *)(out + L.stat));
}

/* The ops of the step of (bi, p): body, then sampling */
static void run_step(di_model *m, int bi, int p) {
    run_body(m, bi, p);
    run_sample(m, bi, p);
}

/* Captures the step graph of (bi, p) (nothing runs) once its ops have run eagerly; on a failed
 * capture graphs are turned off. Errors: graph_begin's (an earlier asynchronous error it
 * reports, which must not be lost) */
static di_status capture(di_model *m, int bi, int p) {
    di_step_state *s = m->step;
    void **g = &s->graph[bi][p];
    if (*g || !s->graphs_on || !s->warm[bi][p]) return DI_OK;
    DI_TRY(m->be->graph_begin(m->be));
    run_step(m, bi, p);
    if (m->be->graph_end(m->be, g) != DI_OK) {
        *g = NULL;
        s->graphs_on = 0; /* capture failed (nothing ran): later steps run eagerly */
        di_error_clear();
    }
    return DI_OK;
}

/* Queues the step of (bi, p): its graph replayed, captured first when its ops have run once,
 * else its ops run eagerly */
static di_status issue(di_model *m, int bi, int p) {
    di_step_state *s = m->step;
    if (!s->graph[bi][p]) DI_TRY(capture(m, bi, p));
    void *g = s->graph[bi][p];
    if (g) {
        for (int r = 0; r < s->replays; r++) DI_TRY(m->be->graph_launch(m->be, g));
        return DI_OK;
    }
    run_step(m, bi, p);
    s->warm[bi][p] = 1;
    return DI_OK;
}

/* Queues a decode step padded to bucket bi (put_meta), replayed from (or captured into) the
 * step graph of (bi, parity), body and sampling; the parity then flips. *parity: the parity
 * used. */
di_status di_step_graph(di_model *m, const di_batch *b, const di_sample_row *rows, int bi, int chained,
                        const int32_t *at, int *parity) {
    di_step_state *s = m->step;
    int p = s->parity;
    di_step_put_meta(m, b, rows, bi, chained, at, p);
    DI_TRY(issue(m, bi, p));
    s->parity = 1 - p;
    *parity = p;
    return DI_OK;
}

/* The tokens / status of a graph step of parity p, n rows of bucket bi, copied from the
 * other parity's meta (one synchronisation). */
static di_status fetch_graph(di_model *m, int p, int bi, int n, int32_t *tokens, int32_t *status) {
    di_step_state *s = m->step;
    step_layout L = layout_of(di_step_buckets[bi], m->max_blocks_per_seq);
    DI_TRY(m->be->download(m->be, s->h_res, s->d_meta[1 - p], out_bytes(&L, n)));
    memcpy(tokens, s->h_res + L.ids, (size_t)n * sizeof(int32_t));
    memcpy(status ? status : s->status, s->h_res + L.stat, (size_t)n * sizeof(int32_t));
    return status ? DI_OK : sample_status(s->status, n);
}

/* Any batch: eager forward, then per chunk of logits rows: gather, norm, lm_head, sample. */
static di_status step_eager(di_model *m, const di_batch *b, const di_sample_row *rows, int32_t *tokens,
                            int32_t *status) {
    di_backend *be = m->be;
    di_step_state *s = m->step;
    int D = m->cfg.hidden_size, V = m->cfg.vocab_size;
    const di_weight *head = m->lm_head_tied ? &m->embed : &m->lm_head;
    di_attn_batch ab;
    di_deepseek_upload_batch(m, b, &ab);
    di_deepseek_layers(m, m->d_ids, &ab, b->n_decode_seqs, b->seq_start[b->n_decode_seqs], NULL);
    be->upload(be, s->d_rows, rows, (size_t)b->n_logits * sizeof(di_sample_row));
    for (int r0 = 0; r0 < b->n_logits; r0 += m->logits_chunk) {
        int n = b->n_logits - r0 < m->logits_chunk ? b->n_logits - r0 : m->logits_chunk;
        be->upload(be, m->d_rows, b->logits_rows + r0, (size_t)n * sizeof(int32_t));
        be->gather_rows(be, m->xg, m->h, m->d_rows, n, D);
        be->add_rmsnorm(be, m->xg, NULL, m->x, NULL, &m->final_norm, (float)m->cfg.rms_norm_eps, n, D);
        be->matmul(be, m->logits, V, m->x, D, head, n, DI_MM_OUT_F32);
        be->sample(be, s->d_tokens + r0, s->d_status + r0, m->logits, n, V, s->d_rows + r0);
    }   /* reusing m->logits / d_rows per chunk is safe: the stream orders every op */
    return fetch_tokens(m, tokens, status, b->n_logits);
}

di_status di_model_warmup_decode(di_model *m, int max_batch, int *n_captured) {
    if (n_captured) *n_captured = 0;
    if (!m) return di_error(DI_ERR_INVALID_ARG, "di_model_warmup_decode: NULL model");
    di_step_state *s = m->step;
    if (!s || !s->graphs_on || !m->be->sample || max_batch < 1) return DI_OK;
    if (s->n_q > 0)
        return di_error(DI_ERR_INVALID_ARG, "di_model_warmup_decode: %d launched steps not collected", s->n_q);
    int32_t none = 0, tok, st;
    di_sample_row no_row = {0.0f, 1.0f, 0.0f, 0, 0, 0, 0};
    /* zero real sequences: step_graph pads the whole bucket (slot -1, context 1, greedy) */
    di_batch b = {0, &none, &none, &none, 0, 0, &none, &none, &none, 1, 0, &none};
    int n = 0;
    for (int bi = 0; bi < N_BUCKETS && di_step_buckets[bi] <= s->max_bucket; bi++) {
        /* both parities: an eager step and a capture each */
        for (int rep = 0; rep < 4 && !(s->graph[bi][0] && s->graph[bi][1]) && s->graphs_on; rep++) {
            int p = 0;
            di_status st2 = di_step_graph(m, &b, &no_row, bi, 0, NULL, &p);
            if (st2 == DI_OK) st2 = fetch_graph(m, p, bi, 0, &tok, &st);
            if (st2 != DI_OK)
                return di_error_context(st2, "warming up the decode graph of %d sequences", di_step_buckets[bi]);
        }
        n += s->graph[bi][0] && s->graph[bi][1];
        if (di_step_buckets[bi] >= max_batch) break;
    }
    if (m->be->sync) DI_TRY(m->be->sync(m->be));
    if (n_captured) *n_captured = n;
    return DI_OK;
}

/* Arguments and batch of a sampling step (nothing runs on error). */
di_status di_step_check(di_model *m, const di_batch *batch, const di_sample_row *rows, int need_tokens,
                        const int32_t *tokens, const char *fn) {
    if (!m || !batch || (batch->n_logits && (!rows || (need_tokens && !tokens))))
        return di_error(DI_ERR_INVALID_ARG, "%s: NULL argument", fn);
    DI_TRY(di_model_validate_batch(m, batch));
    return check_rows(rows, batch->n_logits);
}

/* One step run now, its tokens and status into tokens / status (status NULL: a failed row is
 * an error). ids_override: the input ids instead of batch->token_ids (NULL: none). */
di_status di_step_run(di_model *m, const di_batch *batch, const di_sample_row *rows, int32_t *tokens,
                      int32_t *status, const int32_t *ids_override) {
    di_batch b = *batch;
    if (ids_override) b.token_ids = ids_override;
    if (b.n_logits == 0) return di_deepseek_forward(m, &b, NULL, NULL);
    if (!m->be->sample) return sample_host(m, &b, rows, tokens, status);
    if (di_step_graph_eligible(m, &b)) {
        int bi = di_step_bucket_of(m->step, b.n_seqs), p = 0;
        DI_TRY(di_step_graph(m, &b, rows, bi, 0, NULL, &p));
        return fetch_graph(m, p, bi, b.n_seqs, tokens, status);
    }
    return step_eager(m, &b, rows, tokens, status);
}

static di_status forward_sample(di_model *m, const di_batch *batch, const di_sample_row *rows, int32_t *tokens,
                                int32_t *status) {
    DI_TRY(di_step_check(m, batch, rows, 1, tokens, "di_model_forward_sample"));
    if (m->step->n_q > 0)
        return di_error(DI_ERR_INVALID_ARG, "di_model_forward_sample: %d launched steps not collected", m->step->n_q);
    return di_step_run(m, batch, rows, tokens, status, NULL);
}

di_status di_model_forward_sample(di_model *m, const di_batch *batch, const di_sample_row *rows, int32_t *tokens) {
    return forward_sample(m, batch, rows, tokens, NULL);
}

di_status di_model_forward_sample_rows(di_model *m, const di_batch *batch, const di_sample_row *rows, int32_t *tokens,
                                       int32_t *status) {
    if (batch && batch->n_logits && !status)
        return di_error(DI_ERR_INVALID_ARG, "di_model_forward_sample_rows: NULL status");
    return forward_sample(m, batch, rows, tokens, status);
}
