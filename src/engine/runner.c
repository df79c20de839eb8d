/* runner.c - builds the di_batch of a step plan and runs the executor (see runner.h).
 *
 * Block table: rows of `width` columns (the widest sequence of the step rounded up to 16,
 * kept while it is wide enough and not more than twice what is needed), unused entries -1.
 * Row i remembers which sequence (and table_version) it holds and how many entries it has
 * (one row_state, so the check reads one cache line);
 * when plan entry i is the same sequence with the same version, only appended block ids are
 * written, so a steady decode batch costs O(new blocks), not O(context). */
#include "engine/runner.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

typedef struct row_state {
    const di_seq *seq;                        /* NULL: the row must be rewritten */
    uint64_t version;                         /* seq->table_version when written */
    int32_t n;                                /* entries written */
} row_state;

struct di_runner {
    int max_tokens, max_seqs, max_blocks;
    int32_t *token_ids, *positions, *slots;   /* [max_tokens] */
    int32_t *seq_start;                       /* [max_seqs + 1] */
    int32_t *ctx_len, *logits_rows, *row_of;  /* [max_seqs] */
    int32_t *block_table;                     /* [max_seqs * max_blocks] */
    int width;                                /* current row width (0 = rows invalid) */
    row_state *rows;                          /* [max_seqs] what each row holds */
    di_batch batch;
};

di_status di_runner_create(int max_batch_tokens, int max_seqs, int max_blocks_per_seq, di_runner **out) {
    *out = NULL;
    if (max_batch_tokens < 1 || max_seqs < 1 || max_blocks_per_seq < 1)
        return di_error(DI_ERR_INVALID_ARG, "runner: limits must be positive");
    di_runner *r = calloc(1, sizeof *r);
    if (!r) return di_error(DI_ERR_NOMEM, "runner: out of memory");
    r->max_tokens = max_batch_tokens;
    r->max_seqs = max_seqs;
    r->max_blocks = max_blocks_per_seq;
    size_t T = (size_t)max_batch_tokens, S = (size_t)max_seqs;
    r->token_ids = malloc(T * sizeof(int32_t));
    r->positions = malloc(T * sizeof(int32_t));
    r->slots = malloc(T * sizeof(int32_t));
    r->seq_start = malloc((S + 1) * sizeof(int32_t));
    r->ctx_len = malloc(S * sizeof(int32_t));
    r->logits_rows = malloc(S * sizeof(int32_t));
    r->row_of = malloc(S * sizeof(int32_t));
    r->block_table = malloc(S * (size_t)max_blocks_per_seq * sizeof(int32_t));
    r->rows = calloc(S, sizeof *r->rows);
    if (!r->token_ids || !r->positions || !r->slots || !r->seq_start || !r->ctx_len || !r->logits_rows || !r->row_of ||
        !r->block_table || !r->rows) {
        di_runner_free(r);
        return di_error(DI_ERR_NOMEM, "runner: out of memory for %d tokens x %d sequences", max_batch_tokens, max_seqs);
    }
    *out = r;
    return DI_OK;
}

void di_runner_free(di_runner *r) {
    if (!r) return;
    free(r->token_ids);
    free(r->positions);
    free(r->slots);
    free(r->seq_start);
    free(r->ctx_len);
    free(r->logits_rows);
    free(r->row_of);
    free(r->block_table);
    free(r->rows);
    free(r);
}

/* Row width for `need` columns: rounded up to 16, the current width kept while it fits and
 * is not more than twice the need (so rows stay valid across steps). */
static int choose_width(const di_runner *r, int need) {
    int w = (need + 15) / 16 * 16;
    if (w > r->max_blocks) w = r->max_blocks;
    if (r->width >= need && r->width <= 2 * w) return r->width;
    return w;
}

static inline void write_row(di_runner *r, int i, const di_seq *q) {
    DI_ASSERT(q->n_blocks <= r->width);
    int32_t *row = r->block_table + (size_t)i * r->width;
    row_state *st = &r->rows[i];
    if (st->seq == q && st->version == q->table_version && st->n <= q->n_blocks) {
        for (int j = st->n; j < q->n_blocks; j++) row[j] = q->blocks[j];
    } else {
        memcpy(row, q->blocks, (size_t)q->n_blocks * sizeof *row);
        for (int j = q->n_blocks; j < r->width; j++) row[j] = -1;
        st->seq = q;
        st->version = q->table_version;
    }
    st->n = q->n_blocks;
}

const di_batch *di_runner_prepare(di_runner *r, const di_step_plan *p) {
    DI_ASSERT(p->n_tokens <= r->max_tokens && p->n_seqs <= r->max_seqs);
    DI_ASSERT(p->max_blocks >= 1 && p->max_blocks <= r->max_blocks);
    int width = choose_width(r, p->max_blocks);
    if (width != r->width) {
        r->width = width;
        memset(r->rows, 0, (size_t)r->max_seqs * sizeof *r->rows); /* every row is rewritten */
    }
    int t = 0, n_logits = 0;
    /* decode entries: one token each, at batch index i (an entry of several tokens, a resumed
     * sequence's generated tokens under exact recompute, takes the general loop below) */
    int i_general = p->n_decode;
    for (int i = 0; i < p->n_decode; i++, t++) {
        const di_seq *q = p->seqs[i];
        const uint32_t pos = (uint32_t)p->start[i];
        if (p->n_new[i] != 1) {
            i_general = i;
            break;
        }
        r->seq_start[i] = t;
        r->token_ids[t] = q->tokens[pos];
        r->positions[t] = (int32_t)pos;
        r->slots[t] = q->blocks[pos / DI_BLOCK_TOKENS] * DI_BLOCK_TOKENS + (int32_t)(pos % DI_BLOCK_TOKENS);
        r->ctx_len[i] = (int32_t)pos + 1;
        write_row(r, i, q);
        if (p->sample[i]) {
            r->row_of[i] = n_logits;
            r->logits_rows[n_logits++] = t;
        } else {
            r->row_of[i] = -1;
        }
    }
    for (int i = i_general; i < p->n_seqs; i++) {
        const di_seq *q = p->seqs[i];
        const int32_t *blocks = q->blocks;
        r->seq_start[i] = t;
        for (int k = 0, pos = p->start[i]; k < p->n_new[i]; k++, pos++, t++) {
            r->token_ids[t] = q->tokens[pos];
            r->positions[t] = pos;
            r->slots[t] = blocks[pos / DI_BLOCK_TOKENS] * DI_BLOCK_TOKENS + pos % DI_BLOCK_TOKENS;
        }
        r->ctx_len[i] = p->start[i] + p->n_new[i];
        write_row(r, i, q);
        if (p->sample[i]) {
            r->row_of[i] = n_logits;
            r->logits_rows[n_logits++] = t - 1;
        } else {
            r->row_of[i] = -1;
        }
    }
    r->seq_start[p->n_seqs] = t;
    r->batch = (di_batch){
        .n_tokens = t,
        .token_ids = r->token_ids,
        .positions = r->positions,
        .slot_mapping = r->slots,
        .n_seqs = p->n_seqs,
        .n_decode_seqs = p->n_decode,
        .seq_start = r->seq_start,
        .seq_ctx_len = r->ctx_len,
        .block_table = r->block_table,
        .max_blocks = r->width,
        .n_logits = n_logits,
        .logits_rows = r->logits_rows,
    };
    return &r->batch;
}

di_status di_runner_run(di_runner *r, di_executor *ex, const di_step_plan *p, const float **logits,
                        const int32_t **row_of) {
    *logits = NULL;
    *row_of = r->row_of;
    if (p->n_copies > 0) DI_TRY(ex->copy_blocks(ex->ctx, p->copy_src, p->copy_dst, p->n_copies));
    if (p->n_seqs == 0) return DI_OK;
    const di_batch *b = di_runner_prepare(r, p);
    return ex->forward(ex->ctx, b, logits);
}

di_status di_runner_run_sample(di_runner *r, di_executor *ex, const di_step_plan *p, const di_sample_row *rows,
                               int32_t *tokens, int32_t *status, const int32_t **row_of) {
    *row_of = r->row_of;
    if (!ex->forward_sample) return di_error(DI_ERR_UNSUPPORTED, "runner: the executor cannot sample");
    if (p->n_copies > 0) DI_TRY(ex->copy_blocks(ex->ctx, p->copy_src, p->copy_dst, p->n_copies));
    if (p->n_seqs == 0) return DI_OK;
    const di_batch *b = di_runner_prepare(r, p);
    return ex->forward_sample(ex->ctx, b, rows, tokens, status);
}

di_status di_runner_launch_sample(di_runner *r, di_executor *ex, const di_step_plan *p, const di_sample_row *rows,
                                  const int32_t *chain) {
    if (!ex->launch_sample) return di_error(DI_ERR_UNSUPPORTED, "runner: the executor cannot launch steps");
    if (p->n_copies > 0) DI_TRY(ex->copy_blocks(ex->ctx, p->copy_src, p->copy_dst, p->n_copies));
    const di_batch *b = di_runner_prepare(r, p);
    return ex->launch_sample(ex->ctx, b, rows, chain);
}
