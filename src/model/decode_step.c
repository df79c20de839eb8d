/* decode_step.c - the sampling step of the model (di_model_forward_sample): logits sampled on
 * the device when the backend can (only tokens cross to the host), on the host otherwise; and
 * CUDA-graph replay of pure decode steps, one graph per batch-size bucket.
 *
 * Owner: cuda (model extension). A decode step of n sequences with one token each is padded to
 * the smallest bucket B >= n (padding tokens write no cache slot, attend to one position and
 * are sampled greedily, their results dropped), its metadata packed at the bucket's fixed
 * offsets (step_layout) and uploaded with one copy, and the bucket's graph launched. The first
 * step of a bucket runs eagerly (creating every lazily built plan), the second captures the
 * graph. Invariants: a graph depends only on B, never on contexts or tokens (the ops read all
 * of those from device memory); everything here is allocated in di_model_step_setup at load. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "model/model_internal.h"
#include "sampling/sampler.h"

enum { N_BUCKETS = 14 };
static const int k_buckets[N_BUCKETS] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256};

/* A graph step's metadata, packed: one upload per step (each upload is a host API call and a
 * copy on the GPU's timeline before the graph can start). Byte offsets into the host and device
 * buffers for bucket B; every array 16-byte aligned. */
typedef struct step_layout {
    size_t ids, pos, slots, start, ctx, bt, rows, total;
} step_layout;

static size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

static step_layout layout_of(int B, int mb) {
    step_layout L;
    size_t i32 = sizeof(int32_t), at = 0;
    L.ids = at, at = align16(at + (size_t)B * i32);
    L.pos = at, at = align16(at + (size_t)B * i32);
    L.slots = at, at = align16(at + (size_t)B * i32);
    L.start = at, at = align16(at + (size_t)(B + 1) * i32);
    L.ctx = at, at = align16(at + (size_t)B * i32);
    L.bt = at, at = align16(at + (size_t)B * mb * i32);
    L.rows = at, at = align16(at + (size_t)B * sizeof(di_sample_row));
    L.total = at;
    return L;
}

typedef struct di_step_state {
    int max_bucket;                 /* largest bucket this model can replay */
    int graphs_on;
    int replays;                    /* DEEPINFER_STEP_REPLAYS=N (a measurement probe, default 1): each
                                     * graph launched N times per step (docs/cuda.md) */
    unsigned char *d_meta, *h_meta; /* a graph step's packed metadata (step_layout), device / host */
    void *graph[N_BUCKETS];
    unsigned char warm[N_BUCKETS];
    int32_t *d_tokens, *d_status;   /* device [max_tokens] */
    di_sample_row *d_rows;          /* device [max_tokens] */
    int32_t *status;
    /* host fallback */
    float *h_logits;                /* [h_logits_rows, vocab] */
    int h_logits_rows;
    di_sampler *sampler;
} di_step_state;

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
        if (k_buckets[i] <= m->max_seqs && k_buckets[i] <= m->max_tokens && k_buckets[i] <= m->logits_chunk)
            mb = k_buckets[i];
    s->max_bucket = mb;
    const char *env = getenv("DEEPINFER_CUDA_GRAPHS");
    s->graphs_on = be->graph_begin && mb > 0 && !(env && env[0] == '0');
    const char *rp = getenv("DEEPINFER_STEP_REPLAYS");
    s->replays = rp && atoi(rp) > 1 ? atoi(rp) : 1;
    if (!be->sample) return DI_OK;
    size_t T = (size_t)m->max_tokens, B = (size_t)(mb > 0 ? mb : 1);
    DI_TRY(be->alloc(be, T * sizeof(int32_t), (void **)&s->d_tokens));
    DI_TRY(be->alloc(be, T * sizeof(int32_t), (void **)&s->d_status));
    DI_TRY(be->alloc(be, T * sizeof(di_sample_row), (void **)&s->d_rows));
    size_t meta = layout_of((int)B, m->max_blocks_per_seq).total;
    DI_TRY(be->alloc(be, meta, (void **)&s->d_meta));
    s->h_meta = calloc(1, meta);
    s->status = calloc(T, sizeof(int32_t));
    if (!s->h_meta || !s->status) return di_error(DI_ERR_NOMEM, "out of memory (step staging)");
    return DI_OK;
}

void di_model_step_free(di_model *m) {
    di_step_state *s = m->step;
    if (!s) return;
    di_backend *be = m->be;
    for (int i = 0; i < N_BUCKETS; i++)
        if (s->graph[i] && be->graph_free) be->graph_free(be, s->graph[i]);
    be->free(be, s->d_tokens);
    be->free(be, s->d_status);
    be->free(be, s->d_rows);
    be->free(be, s->d_meta);
    free(s->h_meta);
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
    for (int j = 0; j < b->n_logits; j++) {
        di_sampling_params p;
        di_sampling_params_init(&p);
        p.temperature = rows[j].temperature;
        p.top_p = rows[j].top_p;
        p.top_k = rows[j].top_k;
        p.min_p = rows[j].min_p;
        di_sample_request rq = {&p, rows[j].seed, rows[j].position, rows[j].stream, 0, NULL, NULL, NULL, 0};
        const float *x = s->h_logits + (size_t)j * V;
        di_status st = di_sampler_sample(s->sampler, x, &rq, &tokens[j], NULL);
        if (status) status[j] = DI_SAMPLE_OK;
        if (st == DI_OK) continue;
        if (!status) return st;
        di_error_clear();
        tokens[j] = -1;
        status[j] = host_failure(x, V);
    }
    return DI_OK;
}

/* ---------------------------------------------------------------- device ---- */

/* final norm + lm_head for batch rows 0..n-1 (all tokens, in order) and the sample op with
 * the rows' parameters at d_rows (device) */
static void logits_and_sample(di_model *m, int n, const di_sample_row *d_rows) {
    di_backend *be = m->be;
    di_step_state *s = m->step;
    int D = m->cfg.hidden_size, V = m->cfg.vocab_size;
    const di_weight *head = m->lm_head_tied ? &m->embed : &m->lm_head;
    be->add_rmsnorm(be, m->h, NULL, m->x, NULL, &m->final_norm, (float)m->cfg.rms_norm_eps, n, D);
    be->matmul(be, m->logits, V, m->x, D, head, n, DI_MM_OUT_F32);
    be->sample(be, s->d_tokens, s->d_status, m->logits, n, V, d_rows);
}

static int bucket_of(const di_step_state *s, int n) {
    for (int i = 0; i < N_BUCKETS; i++)
        if (k_buckets[i] >= n && k_buckets[i] <= s->max_bucket) return i;
    return -1;
}

static int graph_eligible(const di_model *m, const di_batch *b) {
    const di_step_state *s = m->step;
    if (!s->graphs_on || b->n_decode_seqs != b->n_seqs || b->n_tokens != b->n_seqs || b->n_logits != b->n_seqs)
        return 0;
    for (int j = 0; j < b->n_logits; j++)
        if (b->logits_rows[j] != j) return 0;
    return bucket_of(s, b->n_seqs) >= 0;
}

/* A decode step padded to bucket bi, replayed from (or captured into) its graph. */
static di_status step_graph(di_model *m, const di_batch *b, const di_sample_row *rows, int32_t *tokens,
                            int32_t *status, int bi) {
    di_backend *be = m->be;
    di_step_state *s = m->step;
    int n = b->n_seqs, B = k_buckets[bi], mb = m->max_blocks_per_seq;
    step_layout L = layout_of(B, mb);
    unsigned char *h = s->h_meta, *d = s->d_meta;
    int32_t *ids = (int32_t *)(h + L.ids), *pos = (int32_t *)(h + L.pos), *slots = (int32_t *)(h + L.slots);
    int32_t *start = (int32_t *)(h + L.start), *ctx = (int32_t *)(h + L.ctx), *bt = (int32_t *)(h + L.bt);
    di_sample_row *hrows = (di_sample_row *)(h + L.rows);
    memcpy(ids, b->token_ids, (size_t)n * sizeof(int32_t));
    memcpy(pos, b->positions, (size_t)n * sizeof(int32_t));
    memcpy(slots, b->slot_mapping, (size_t)n * sizeof(int32_t));
    memcpy(ctx, b->seq_ctx_len, (size_t)n * sizeof(int32_t));
    memcpy(hrows, rows, (size_t)n * sizeof(di_sample_row));
    for (int i = 0; i <= B; i++) start[i] = i;
    for (int i = 0; i < n; i++) {
        int used = (b->seq_ctx_len[i] + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
        memcpy(bt + (size_t)i * mb, b->block_table + (size_t)i * b->max_blocks, (size_t)used * sizeof(int32_t));
    }
    for (int i = n; i < B; i++) { /* padding: no cache write, one position, greedy */
        ids[i] = 0;
        pos[i] = 0;
        slots[i] = -1;
        ctx[i] = 1;
        bt[(size_t)i * mb] = 0;
        hrows[i] = (di_sample_row){0.0f, 1.0f, 0.0f, 0, 0, 0, 0};
    }
    be->upload(be, d, h, L.total);
    const int32_t *d_ids = (const int32_t *)(d + L.ids);
    const di_sample_row *d_rows = (const di_sample_row *)(d + L.rows);
    /* max_ctx_len: a graph must not depend on the step's contexts */
    di_attn_batch ab = {.positions = (const int32_t *)(d + L.pos), .slot_mapping = (const int32_t *)(d + L.slots),
                        .seq_start = (const int32_t *)(d + L.start), .seq_ctx_len = (const int32_t *)(d + L.ctx),
                        .block_table = (const int32_t *)(d + L.bt), .n_tokens = B, .n_seqs = B, .max_blocks = mb,
                        .max_q_len = 1, .max_ctx_len = mb * DI_KV_BLOCK_SIZE};
    if (!s->graph[bi] && s->warm[bi] && be->graph_begin(be) == DI_OK) {
        di_deepseek_layers(m, d_ids, &ab, B, B);
        logits_and_sample(m, B, d_rows);
        if (be->graph_end(be, &s->graph[bi]) != DI_OK) {
            s->graph[bi] = NULL;
            s->graphs_on = 0; /* capture failed (nothing ran): this and later steps run eagerly */
            di_error_clear();
        }
    }
    if (s->graph[bi]) {
        for (int r = 0; r < s->replays; r++) DI_TRY(be->graph_launch(be, s->graph[bi]));
    } else {
        di_deepseek_layers(m, d_ids, &ab, B, B);
        logits_and_sample(m, B, d_rows);
        s->warm[bi] = 1;
    }
    return fetch_tokens(m, tokens, status, n);
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
    di_deepseek_layers(m, m->d_ids, &ab, b->n_decode_seqs, b->seq_start[b->n_decode_seqs]);
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
    int32_t none = 0;
    di_sample_row no_row = {0.0f, 1.0f, 0.0f, 0, 0, 0, 0};
    /* zero real sequences: step_graph pads the whole bucket (slot -1, context 1, greedy) */
    di_batch b = {0, &none, &none, &none, 0, 0, &none, &none, &none, 1, 0, &none};
    int n = 0;
    for (int bi = 0; bi < N_BUCKETS && k_buckets[bi] <= s->max_bucket; bi++) {
        for (int rep = 0; rep < 2 && !s->graph[bi] && s->graphs_on; rep++) {
            di_status st = step_graph(m, &b, &no_row, &none, &none, bi);
            if (st != DI_OK) return di_error_context(st, "warming up the decode graph of %d sequences", k_buckets[bi]);
        }
        n += s->graph[bi] != NULL;
        if (k_buckets[bi] >= max_batch) break;
    }
    if (m->be->sync) DI_TRY(m->be->sync(m->be));
    if (n_captured) *n_captured = n;
    return DI_OK;
}

static di_status forward_sample(di_model *m, const di_batch *batch, const di_sample_row *rows, int32_t *tokens,
                                int32_t *status) {
    if (!m || !batch || (batch->n_logits && (!rows || !tokens)))
        return di_error(DI_ERR_INVALID_ARG, "di_model_forward_sample: NULL argument");
    DI_TRY(di_model_validate_batch(m, batch));
    DI_TRY(check_rows(rows, batch->n_logits));
    if (batch->n_logits == 0) return di_deepseek_forward(m, batch, NULL, NULL);
    if (!m->be->sample) return sample_host(m, batch, rows, tokens, status);
    if (graph_eligible(m, batch)) return step_graph(m, batch, rows, tokens, status, bucket_of(m->step, batch->n_seqs));
    return step_eager(m, batch, rows, tokens, status);
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
