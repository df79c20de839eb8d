/* exec_synthetic.c - synthetic executors: a deterministic fake model for testing the engine's
 * bookkeeping, and the null executor (fixed logits, no KV) for the overhead benchmark.
 *
 * The fake model has its own paged "KV pool": one 64-bit value per slot (n_kv_blocks * 64 slots) plus a
 * written flag. A forward pass
 *   1. validates the batch (counts within limits, seq_start monotone, positions consecutive
 *      and ending at seq_ctx_len - 1, every slot equal to block_table[seq][pos / 64] * 64 +
 *      pos % 64, block ids inside the pool) and fails with DI_ERR_INTERNAL naming the field;
 *   2. writes value(token, position) into the slot of every batch token (with decode_differs,
 *      a different value for tokens of decode entries: the real model's decode and prefill
 *      paths round differently, and the engine must not mix them up);
 *   3. for each requested row, folds the values of the whole context (positions 0 .. pos)
 *      read back through the block table (reading a never-written slot, or a slot that holds
 *      another position, is an error) into a
 *      context hash, and makes a peaked logits row from it.
 * So a wrong slot, a wrong block table, a bad prefix-cache reuse, a missing copy-on-write or a
 * broken preemption changes the outputs, and invariance tests catch it.
 * di_fake_model_context_hash computes the same hash directly from a token list. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/executor.h"
#include "sampling/rng.h"

typedef struct fake {
    di_fake_model_config cfg;
    uint64_t *kv;        /* [n_kv_blocks * 64] */
    int32_t *kv_pos;     /* [n_kv_blocks * 64] position whose value the slot holds */
    uint8_t *written;    /* [n_kv_blocks * 64] */
    float *logits;       /* [max_seqs * vocab] */
    di_fake_model_stats st;
} fake;

static inline uint64_t token_value(const di_fake_model_config *c, int32_t token, int32_t pos) {
    return di_rng_mix64(c->seed ^ ((uint64_t)(uint32_t)token * 0x9E3779B97F4A7C15ull) ^
                        ((uint64_t)(uint32_t)pos * 0xC2B2AE3D27D4EB4Full));
}

/* value(token, position) of a token computed by a decode entry, with decode_differs */
static inline uint64_t decode_value(const di_fake_model_config *c, uint64_t v) {
    return c->decode_differs ? di_rng_mix64(v ^ 0xDEC0DEDEC0DEull) : v;
}

static inline uint64_t fold(uint64_t h, uint64_t v) { return di_rng_mix64(h ^ v); }

uint64_t di_fake_model_context_hash(const di_fake_model_config *c, const int32_t *tokens, int n_prompt, int n) {
    uint64_t h = c->seed * 31 + 7;
    for (int i = 0; i < n; i++) {
        uint64_t v = token_value(c, tokens[i], i);
        h = fold(h, i < n_prompt ? v : decode_value(c, v));
    }
    return h;
}

void di_fake_model_logits(const di_fake_model_config *c, uint64_t h, float *row) {
    const int V = c->vocab_size;
    for (int v = 0; v < V; v++) {
        uint64_t u = di_rng_mix64(h + (uint64_t)v * 0xD6E8FEB86659FD93ull);
        row[v] = 4.0f * (float)((double)(u >> 40) / 16777216.0);
    }
    row[h % (uint64_t)V] += 3.0f;
}

static di_status bad(const char *what, int i, long got, long want) {
    return di_error(DI_ERR_INTERNAL, "fake model: batch field '%s'[%d] = %ld, expected %ld", what, i, got, want);
}

static di_status validate(const fake *f, const di_batch *b) {
    const di_fake_model_config *c = &f->cfg;
    if (b->n_tokens < 1 || b->n_tokens > c->max_batch_tokens) return bad("n_tokens", 0, b->n_tokens, c->max_batch_tokens);
    if (b->n_seqs < 1 || b->n_seqs > c->max_seqs) return bad("n_seqs", 0, b->n_seqs, c->max_seqs);
    if (b->n_decode_seqs < 0 || b->n_decode_seqs > b->n_seqs) return bad("n_decode_seqs", 0, b->n_decode_seqs, b->n_seqs);
    if (b->n_logits < 0 || b->n_logits > c->max_seqs) return bad("n_logits", 0, b->n_logits, c->max_seqs);
    if (b->seq_start[0] != 0) return bad("seq_start", 0, b->seq_start[0], 0);
    if (b->seq_start[b->n_seqs] != b->n_tokens) return bad("seq_start", b->n_seqs, b->seq_start[b->n_seqs], b->n_tokens);
    for (int i = 0; i < b->n_seqs; i++) {
        int q = b->seq_start[i + 1] - b->seq_start[i], ctx = b->seq_ctx_len[i];
        if (q < 1) return bad("seq_start (q_len)", i, q, 1);
        if (ctx < q || ctx > c->max_model_len || ctx > b->max_blocks * 64) return bad("seq_ctx_len", i, ctx, q);
        for (int k = 0; k < (ctx + 63) / 64; k++) {
            int32_t blk = b->block_table[(size_t)i * b->max_blocks + k];
            if (blk < 0 || blk >= c->n_kv_blocks) return bad("block_table", i * b->max_blocks + k, blk, 0);
        }
        for (int t = b->seq_start[i]; t < b->seq_start[i + 1]; t++) {
            int32_t pos = ctx - q + (t - b->seq_start[i]);
            if (b->positions[t] != pos) return bad("positions", t, b->positions[t], pos);
            if (b->token_ids[t] < 0 || b->token_ids[t] >= c->vocab_size) return bad("token_ids", t, b->token_ids[t], 0);
            int32_t slot = b->block_table[(size_t)i * b->max_blocks + pos / 64] * 64 + pos % 64;
            if (b->slot_mapping[t] != slot) return bad("slot_mapping", t, b->slot_mapping[t], slot);
        }
    }
    for (int r = 0; r < b->n_logits; r++)
        if (b->logits_rows[r] < 0 || b->logits_rows[r] >= b->n_tokens) return bad("logits_rows", r, b->logits_rows[r], 0);
    return DI_OK;
}

static int seq_of_token(const di_batch *b, int t) {
    int lo = 0, hi = b->n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b->seq_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static di_status forward(void *ctx, const di_batch *b, const float **logits) {
    fake *f = ctx;
    DI_TRY(validate(f, b));
    f->st.forwards++;
    f->st.tokens += (uint64_t)b->n_tokens;
    f->st.logits_rows += (uint64_t)b->n_logits;
    const int n_decode_tokens = b->seq_start[b->n_decode_seqs];
    for (int t = 0; t < b->n_tokens; t++) {
        uint64_t v = token_value(&f->cfg, b->token_ids[t], b->positions[t]);
        f->kv[b->slot_mapping[t]] = t < n_decode_tokens ? decode_value(&f->cfg, v) : v;
        f->kv_pos[b->slot_mapping[t]] = b->positions[t];
        f->written[b->slot_mapping[t]] = 1;
    }
    for (int r = 0; r < b->n_logits; r++) {
        int t = b->logits_rows[r], i = seq_of_token(b, t);
        const int32_t *table = b->block_table + (size_t)i * b->max_blocks;
        uint64_t h = f->cfg.seed * 31 + 7;
        for (int pos = 0; pos <= b->positions[t]; pos++) {
            int32_t slot = table[pos / 64] * 64 + pos % 64;
            if (!f->written[slot])
                return di_error(DI_ERR_INTERNAL, "fake model: sequence %d reads position %d from slot %d, never written", i,
                                pos, slot);
            if (f->kv_pos[slot] != pos)
                return di_error(DI_ERR_INTERNAL, "fake model: sequence %d reads position %d from slot %d, which holds position %d",
                                i, pos, slot, f->kv_pos[slot]);
            h = fold(h, f->kv[slot]);
        }
        di_fake_model_logits(&f->cfg, h, f->logits + (size_t)r * f->cfg.vocab_size);
    }
    *logits = f->logits;
    return DI_OK;
}

static di_status copy_blocks(void *ctx, const int32_t *src, const int32_t *dst, int n) {
    fake *f = ctx;
    for (int i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= f->cfg.n_kv_blocks || dst[i] < 0 || dst[i] >= f->cfg.n_kv_blocks)
            return di_error(DI_ERR_INTERNAL, "fake model: copy %d: block %d -> %d outside the pool", i, src[i], dst[i]);
        memcpy(f->kv + (size_t)dst[i] * 64, f->kv + (size_t)src[i] * 64, 64 * sizeof *f->kv);
        memcpy(f->written + (size_t)dst[i] * 64, f->written + (size_t)src[i] * 64, 64);
        memcpy(f->kv_pos + (size_t)dst[i] * 64, f->kv_pos + (size_t)src[i] * 64, 64 * sizeof *f->kv_pos);
    }
    f->st.block_copies += (uint64_t)n;
    return DI_OK;
}

static void destroy(void *ctx) {
    fake *f = ctx;
    if (!f) return;
    free(f->kv);
    free(f->written);
    free(f->kv_pos);
    free(f->logits);
    free(f);
}

di_status di_executor_fake_create(const di_fake_model_config *cfg, di_executor *out) {
    memset(out, 0, sizeof *out);
    if (cfg->vocab_size < 2 || cfg->n_kv_blocks < 1 || cfg->max_model_len < 1 || cfg->max_batch_tokens < 1 ||
        cfg->max_seqs < 1)
        return di_error(DI_ERR_INVALID_ARG, "fake model: vocab, blocks, max_model_len, max_batch_tokens, max_seqs must be positive");
    fake *f = calloc(1, sizeof *f);
    if (!f) return di_error(DI_ERR_NOMEM, "fake model: out of memory");
    f->cfg = *cfg;
    size_t slots = (size_t)cfg->n_kv_blocks * 64;
    f->kv = calloc(slots, sizeof *f->kv);
    f->written = calloc(slots, 1);
    f->kv_pos = calloc(slots, sizeof *f->kv_pos);
    f->logits = malloc((size_t)cfg->max_seqs * cfg->vocab_size * sizeof *f->logits);
    if (!f->kv || !f->written || !f->kv_pos || !f->logits) {
        destroy(f);
        return di_error(DI_ERR_NOMEM, "fake model: out of memory for %d blocks", cfg->n_kv_blocks);
    }
    out->ctx = f;
    out->vocab_size = cfg->vocab_size;
    out->n_kv_blocks = cfg->n_kv_blocks;
    out->max_model_len = cfg->max_model_len;
    if (cfg->eos_id >= 0) {
        out->n_eos = 1;
        out->eos_ids[0] = cfg->eos_id;
    }
    out->forward = forward;
    out->copy_blocks = copy_blocks;
    out->destroy = destroy;
    out->exact_recompute = cfg->decode_differs;
    return DI_OK;
}

void di_executor_fake_stats(const di_executor *ex, di_fake_model_stats *st) {
    const fake *f = ex->ctx;
    *st = f->st;
}

/* ---- the null executor ---- */

typedef struct null_exec {
    float *logits; /* [max_seqs * vocab], filled once */
} null_exec;

static di_status null_forward(void *ctx, const di_batch *b, const float **logits) {
    (void)b;
    *logits = ((null_exec *)ctx)->logits;
    return DI_OK;
}

static di_status null_copy(void *ctx, const int32_t *src, const int32_t *dst, int n) { return DI_OK; }

static void null_destroy(void *ctx) {
    null_exec *x = ctx;
    if (!x) return;
    free(x->logits);
    free(x);
}

di_status di_executor_null_create(int vocab_size, int n_kv_blocks, int max_model_len, int max_seqs, di_executor *out) {
    memset(out, 0, sizeof *out);
    if (vocab_size < 2 || n_kv_blocks < 1 || max_model_len < 1 || max_seqs < 1)
        return di_error(DI_ERR_INVALID_ARG, "null executor: sizes must be positive");
    null_exec *x = calloc(1, sizeof *x);
    if (!x) return di_error(DI_ERR_NOMEM, "null executor: out of memory");
    x->logits = malloc((size_t)max_seqs * vocab_size * sizeof *x->logits);
    if (!x->logits) {
        free(x);
        return di_error(DI_ERR_NOMEM, "null executor: out of memory for %d x %d logits", max_seqs, vocab_size);
    }
    for (int v = 0; v < vocab_size; v++) x->logits[v] = (float)((di_rng_mix64((uint64_t)v) >> 40) / 16777216.0) * 8.0f;
    for (int r = 1; r < max_seqs; r++) memcpy(x->logits + (size_t)r * vocab_size, x->logits, (size_t)vocab_size * sizeof(float));
    out->ctx = x;
    out->vocab_size = vocab_size;
    out->n_kv_blocks = n_kv_blocks;
    out->max_model_len = max_model_len;
    out->forward = null_forward;
    out->copy_blocks = null_copy;
    out->destroy = null_destroy;
    return DI_OK;
}

void di_executor_destroy(di_executor *ex) {
    if (ex && ex->destroy && ex->ctx) ex->destroy(ex->ctx);
    if (ex) memset(ex, 0, sizeof *ex);
}
