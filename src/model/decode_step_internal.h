/* decode_step_internal.h - what the model's sampling step (decode_step.c: graph steps, the
 * synchronous path, warm-up) and its asynchronous launch / collect (decode_async.c) share: the
 * batch-size buckets, the packed metadata layout of a graph step, the step state with its
 * graphs and in-flight steps, and the helpers each side calls of the other.
 *
 * Owner: cuda (model extension). Private to src/model. */
#ifndef DI_MODEL_DECODE_STEP_INTERNAL_H
#define DI_MODEL_DECODE_STEP_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "model/model_internal.h"
#include "sampling/sampler.h"

enum { N_BUCKETS = 14 };
extern const int di_step_buckets[N_BUCKETS]; /* 1, 2, 4, .. 256 (decode_step.c) */

/* A graph step's metadata, packed: one upload per step (each upload is a host API call and a
 * copy on the GPU's timeline before the graph can start). Byte offsets into the host and device
 * buffers for bucket B; every array 16-byte aligned. */
typedef struct step_layout {
    size_t ids, stat, pos, slots, start, ctx, bt, rows, total;
} step_layout;

static inline size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

static inline step_layout layout_of(int B, int mb) {
    step_layout L;
    size_t i32 = sizeof(int32_t), at = 0;
    L.ids = at, at = align16(at + (size_t)B * i32); /* ids, stat: written by the previous step's */
    L.stat = at, at = align16(at + (size_t)B * i32); /* sampler (parity 1 - p) when chained */
    L.pos = at, at = align16(at + (size_t)B * i32);
    L.slots = at, at = align16(at + (size_t)B * i32);
    L.start = at, at = align16(at + (size_t)(B + 1) * i32);
    L.ctx = at, at = align16(at + (size_t)B * i32);
    L.bt = at, at = align16(at + (size_t)B * mb * i32);
    L.rows = at, at = align16(at + (size_t)B * sizeof(di_sample_row));
    L.total = at;
    return L;
}

/* Bytes from the start of a step's tokens + status: the ids field and the first B entries of stat */
static inline size_t out_bytes(const step_layout *L, int B) { return L->stat + (size_t)B * sizeof(int32_t); }

/* A launched step not collected yet: its results arrive by copy_out under fence `slot`
 * into h_out[slot] (device), or were stored in res_tok / res_stat[slot] at launch (host). */
typedef struct pending_step {
    int n;                          /* rows to report */
    int device;
    int slot;                       /* 0 / 1: ring position, the fence and result buffers */
    size_t stat_off;                /* device: byte offset of the status in h_out[slot] */
    int bucket, parity;             /* device: the graph step (a chained step must match it) */
    int32_t *at;                    /* device: the bucket position of each row (s->at[slot]) */
    int lost;                       /* its wait failed: no results */
} pending_step;

_Static_assert(2 <= DI_BACKEND_FENCES, "a fence per in-flight slot");

typedef struct di_step_state {
    int max_bucket;                 /* largest bucket this model can replay */
    int graphs_on;
    int async_on;                   /* the backend has asynchronous copies (backend.h) */
    int replays;                    /* DEEPINFER_STEP_REPLAYS=N (a measurement probe, default 1): each
                                     * graph launched N times per step (docs/cuda.md) */
    unsigned char *d_meta[2], *h_meta[2]; /* packed metadata (step_layout) per parity; h_meta pinned
                                           * when async_on */
    unsigned char *h_out[2];        /* pinned tokens + status of a device step in flight (async_on) */
    unsigned char *h_res;           /* tokens + status of a synchronous graph step */
    void *graph[N_BUCKETS][2];      /* the step graph of (bucket, parity): body and sampling */
    unsigned char warm[N_BUCKETS][2]; /* the step ran eagerly once (its graph may then be captured:
                                     * its lazily built plans exist) */
    int parity;                     /* of the next graph step */
    pending_step q[2];              /* launched, not collected: q[(head + i) % 2], i < n_q */
    int q_head, n_q;
    int32_t *res_tok[2], *res_stat[2]; /* host results of synchronously run launches [max_tokens] */
    int32_t *chain_ids;             /* [max_tokens] input ids of a chained step run synchronously */
    int32_t *zero_ids;              /* [max_tokens] zeros: what a chained batch is validated with */
    int32_t *at[2];                 /* [max_tokens] bucket positions of a device step's rows, per slot */
    unsigned char *seen;            /* [max_tokens] scratch: chain maps must not repeat a row */
    int32_t *d_tokens, *d_status;   /* device [max_tokens] (eager steps) */
    di_sample_row *d_rows;          /* device [max_tokens] */
    int32_t *status;
    /* host fallback */
    float *h_logits;                /* [h_logits_rows, vocab] */
    int h_logits_rows;
    di_sampler *sampler;
} di_step_state;

/* decode_step.c */
int di_step_bucket_of(const di_step_state *s, int n);
/* a pure decode step (one token and one logits row per sequence, rows 0..n-1) of a bucket */
int di_step_graph_eligible(const di_model *m, const di_batch *b);
void di_step_put_meta(di_model *m, const di_batch *b, const di_sample_row *rows, int bi, int chained,
                      const int32_t *at, int p);
di_status di_step_graph(di_model *m, const di_batch *b, const di_sample_row *rows, int bi, int chained,
                        const int32_t *at, int *parity);
di_status di_step_check(di_model *m, const di_batch *batch, const di_sample_row *rows, int need_tokens,
                        const int32_t *tokens, const char *fn);
di_status di_step_run(di_model *m, const di_batch *batch, const di_sample_row *rows, int32_t *tokens,
                      int32_t *status, const int32_t *ids_override);
#endif
