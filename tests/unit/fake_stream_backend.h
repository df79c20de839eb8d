/* fake_stream_backend.h - the CPU backend made to behave like an asynchronous GPU stream, so that
 * the code only the CUDA backend exercises otherwise (decode-step graphs and asynchronous steps:
 * model/decode_step.c, model/decode_async.c) runs in the CPU test suite.
 *
 * fs_install(be) patches a CPU backend's op table in place:
 *  - compute ops, memset and upload are queued, not run (arguments copied by value, including
 *    the structs they point to; upload's source snapshotted, as the CUDA backend stages it):
 *    the "stream" runs them in order only when the host waits (download, sync, fence_wait), as
 *    a GPU that is always behind the host would;
 *  - graph_begin / graph_end capture the ops issued in between into a graph; graph_launch
 *    queues a copy of them; upload, copy_in, download, sync, fence_wait and kv_copy_blocks
 *    inside a capture are contract violations (the CUDA backend refuses the first five);
 *  - copy_in runs at once, ahead of the queued ops (a copy lane does not wait for them; the
 *    backend.h contract says no queued op touches its destination), or, with
 *    g_fs.copy_in_deferred, in queue order reading its source only then (the contract keeps
 *    the source unchanged until a later op completed): the two orders a GPU may take;
 *  - copy_out is queued with its fence; fence_wait(f) runs the queue up to the last queued
 *    copy_out marked f. Waiting on a fence no copy_out was queued for is a violation (on CUDA it
 *    would return at once and the host would read stale memory);
 *  - host_alloc / host_free: malloc / free (the pinned memory);
 *  - sample: the host sampler row by row (di_step_sample_rows_host; the CUDA sampler is
 *    bit-identical to it);
 *  - with g_fs.lanes set, a side lane (backend.h side_begin / side_end / side_resume /
 *    side_join; sync, download, copies and graph boundaries join it, as on CUDA): the stream
 *    runs the side lane's ops as late as their join allows (FS_LANES_LATE) or as early as their
 *    fork allows (FS_LANES_EARLY), the two extreme orders of two concurrent lanes, so an op that
 *    needs the other lane's result without a join, or writes what the other lane reads,
 *    changes the outcome;
 *  - fs_extensions(be) adds the CUDA backend's optional fused ops as the compositions backend.h
 *    defines them bit for bit (rope_kv_write, mla_decode_uv, moe_experts_shared up to 4 tokens,
 *    moe_experts_defer + add_rmsnorm_experts from 2 tokens, the result kept in a buffer of the
 *    fake's, matmul_silu at one token outside the side lane), so the model takes the paths it
 *    takes on CUDA.
 * Violations are counted in g_fs.violations (first message in g_fs.why) and fail the call that
 * found them. One fake per process (static state); include once per test, after test_util.h. */
#ifndef DI_FAKE_STREAM_BACKEND_H
#define DI_FAKE_STREAM_BACKEND_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/status.h"
#include "model/model_internal.h"
#include "sampling/sampler.h"

typedef enum {
    FS_EMBED, FS_RMSNORM, FS_ADD_RMSNORM, FS_SILU_MUL, FS_ADD, FS_GATHER, FS_MATMUL, FS_BMM, FS_ROPE, FS_KV_WRITE,
    FS_KV_COPY, FS_MLA_PREFILL, FS_MLA_DECODE, FS_ROUTE, FS_EXPERTS, FS_LAYERNORM, FS_INDEXER, FS_SAMPLE,
    FS_MEMSET, FS_COPY, FS_COPY_OUT, FS_FORK, FS_JOIN /* the lane markers */
} fs_kind;

enum { FS_LANES_OFF, FS_LANES_LATE, FS_LANES_EARLY };

/* One queued op: its kind, its arguments by value, and an owned buffer (upload's snapshot,
 * kv_copy_blocks' host block lists). */
typedef struct fs_op {
    fs_kind kind;
    int lane;              /* 1: issued on the side lane */
    int done;              /* ran ahead of its queue position (side lane, FS_LANES_EARLY) */
    void *p[8];            /* pointer arguments in signature order */
    int i[8];              /* int arguments in signature order */
    size_t z[2];           /* size arguments */
    float f;               /* eps */
    unsigned flags;
    di_weight w[3];        /* weight arguments by value */
    int has_w2;            /* moe_route: bias present; layernorm: bias present */
    di_attn_batch ab;
    di_mla_dims md;
    di_indexer_dims idd;
    di_rope_params rp;
    di_route_params rt;
    void *blob;            /* owned */
} fs_op;

typedef struct fs_list {
    fs_op *ops;
    size_t n, cap;
} fs_list;

static struct {
    di_backend orig;        /* the CPU backend's own op table */
    di_backend *be;
    fs_list queue;          /* issued, not run; ops [head, n) pending */
    size_t head;
    fs_list *capture;       /* the graph being captured, or NULL */
    long fence_last[DI_BACKEND_FENCES]; /* queue position + 1 of the last copy_out marked f; 0: none */
    long base;              /* ops dropped from the queue's front (positions stay absolute) */
    int copy_in_deferred;
    int lanes;              /* FS_LANES_*: side lane offered, and how the stream orders it */
    int on_side, forked;    /* ops go to the side lane; a fork not joined yet */
    long forks;
    long captures, launches, ran, copies_in, copies_out, fence_waits;
    long uploads, downloads, syncs, allocs, host_allocs; /* host <-> device traffic and allocations */
    int violations;
    char why[256];
    di_sampler *sampler;
    int sampler_vocab;
    struct { float *p; size_t floats; int slot; } bufs[64]; /* the fused ops' temporaries (kept:
                                                              * captured ops point at them) */
    int n_bufs;
    float *deferred;        /* moe_experts_defer's result, for the next add_rmsnorm_experts */
    const void *def_scratch; /* and the arguments that call must repeat */
    const float *def_w;
    int def_k, def_T;
    long fused[6];          /* calls that took each fused op: rope_kv_write, mla_decode_uv,
                             * moe_experts_shared, moe_experts_defer, add_rmsnorm_experts,
                             * matmul_silu */
} g_fs;

static inline void fs_violation(const char *msg) {
    if (!g_fs.violations++) snprintf(g_fs.why, sizeof g_fs.why, "%s", msg);
    fprintf(stderr, "fake stream: %s\n", msg);
}

static inline void fs_push(fs_list *l, const fs_op *op) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->ops = (fs_op *)realloc(l->ops, l->cap * sizeof(fs_op));
        if (!l->ops) abort(); /* a test helper: out of memory ends the test */
    }
    l->ops[l->n++] = *op;
}

/* Queues op (or adds it to the graph being captured), on the current lane. */
static inline void fs_issue(const fs_op *op) {
    fs_op o = *op;
    o.lane = g_fs.on_side;
    fs_push(g_fs.capture ? g_fs.capture : &g_fs.queue, &o);
}

/* A lane marker (FS_FORK / FS_JOIN) on the main lane. */
static inline void fs_marker(fs_kind k) {
    fs_op o = {.kind = k};
    fs_push(g_fs.capture ? g_fs.capture : &g_fs.queue, &o);
}

/* Joins an unjoined side lane (what sync, download, copies and graph boundaries do on CUDA). */
static inline void fs_rejoin(void) {
    g_fs.on_side = 0;
    if (!g_fs.forked) return;
    g_fs.forked = 0;
    fs_marker(FS_JOIN);
}

static inline void fs_sample_rows(int32_t *tokens, int32_t *status, const float *logits, int n, int V,
                                  const di_sample_row *rows) {
    if (!g_fs.sampler || g_fs.sampler_vocab != V) {
        di_sampler_free(g_fs.sampler);
        g_fs.sampler = NULL;
        if (di_sampler_create(V, &g_fs.sampler) != DI_OK) abort();
        g_fs.sampler_vocab = V;
    }
    (void)di_step_sample_rows_host(g_fs.sampler, logits, n, V, rows, tokens, status); /* (status given: no error) */
}

/* Runs one op with the CPU backend's own ops. */
static inline void fs_run(fs_op *o) {
    di_backend *be = g_fs.be;
    const di_backend *c = &g_fs.orig;
    void **p = o->p;
    int *i = o->i;
    switch (o->kind) {
    case FS_EMBED: c->embed(be, p[0], &o->w[0], p[1], i[0]); break;
    case FS_RMSNORM: c->rmsnorm(be, p[0], i[0], p[1], i[1], &o->w[0], o->f, i[2], i[3]); break;
    case FS_ADD_RMSNORM: c->add_rmsnorm(be, p[0], p[1], p[2], p[3], &o->w[0], o->f, i[0], i[1]); break;
    case FS_SILU_MUL: c->silu_mul(be, p[0], p[1], i[0], i[1]); break;
    case FS_ADD: c->add(be, p[0], p[1], o->z[0]); break;
    case FS_GATHER: c->gather_rows(be, p[0], p[1], p[2], i[0], i[1]); break;
    case FS_MATMUL: c->matmul(be, p[0], i[0], p[1], i[1], &o->w[0], i[2], o->flags); break;
    case FS_BMM: c->bmm(be, p[0], i[0], i[1], p[1], i[2], i[3], &o->w[0], i[4]); break;
    case FS_ROPE: c->rope(be, p[0], i[0], i[1], i[2], p[1], i[3], &o->rp); break;
    case FS_KV_WRITE: c->kv_write(be, p[0], p[1], i[0], p[2], i[1], i[2]); break;
    case FS_KV_COPY:
        c->kv_copy_blocks(be, p[0], o->z[0], i[0], i[1], (const int32_t *)o->blob, (const int32_t *)o->blob + i[2],
                          i[2]);
        break;
    case FS_MLA_PREFILL:
        c->mla_prefill(be, p[0], p[1], i[0], p[2], &o->w[0], &o->ab, i[1], i[2], &o->md, p[3], o->z[0]);
        break;
    case FS_MLA_DECODE: c->mla_decode(be, p[0], p[1], p[2], i[0], i[1], p[3], &o->ab, i[2], i[3], &o->md); break;
    case FS_ROUTE: c->moe_route(be, p[0], p[1], p[2], &o->w[0], o->has_w2 ? &o->w[1] : NULL, &o->rt, i[0], p[3]); break;
    case FS_EXPERTS: c->moe_experts(be, p[0], p[1], p[2], p[3], i[0], &o->w[0], &o->w[1], i[1], p[4], o->z[0]); break;
    case FS_LAYERNORM:
        c->layernorm(be, p[0], i[0], p[1], i[1], &o->w[0], o->has_w2 ? &o->w[1] : NULL, o->f, i[2], i[3]);
        break;
    case FS_INDEXER:
        c->indexer_topk(be, p[0], p[1], p[2], p[3], p[4], &o->ab, i[0], i[1], &o->idd, p[5], o->z[0]);
        break;
    case FS_SAMPLE: fs_sample_rows(p[0], p[1], p[2], i[0], i[1], p[3]); break;
    case FS_MEMSET: memset(p[0], i[0], o->z[0]); break;
    case FS_COPY: memcpy(p[0], o->blob ? o->blob : p[1], o->z[0]); break;
    case FS_COPY_OUT: memcpy(p[0], p[1], o->z[0]); break;
    case FS_FORK:
    case FS_JOIN: break; /* (handled by fs_drain) */
    }
    g_fs.ran++;
}

static inline void fs_run_free(fs_op *o) {
    fs_run(o);
    o->done = 1;
    free(o->blob);
    o->blob = NULL;
}

/* Runs the queue up to absolute position `until` (exclusive), or all of it with -1. Main-lane
 * ops run in queue order; side-lane ops (in their own order) at their join (FS_LANES_LATE:
 * every side op not run yet) or at their fork (FS_LANES_EARLY: the side ops up to the next
 * join or fork, as the ops after a later fork also wait for the main lane up to that fork).
 * A fence or sync position always has the join before it (fs_rejoin), so nothing before
 * `until` is left undone. */
static inline void fs_drain(long until) {
    fs_list *q = &g_fs.queue;
    size_t i = g_fs.head;
    for (; i < q->n && (until < 0 || g_fs.base + (long)i < until); i++) {
        fs_op *o = &q->ops[i];
        if (o->done) continue;
        if (o->kind == FS_FORK) {
            if (g_fs.lanes == FS_LANES_EARLY)
                for (size_t j = i + 1; j < q->n && q->ops[j].kind != FS_JOIN && q->ops[j].kind != FS_FORK; j++)
                    if (q->ops[j].lane && !q->ops[j].done) fs_run_free(&q->ops[j]);
            o->done = 1;
        } else if (o->kind == FS_JOIN) {
            for (size_t j = g_fs.head; j < i; j++)
                if (q->ops[j].lane && !q->ops[j].done) fs_run_free(&q->ops[j]);
            o->done = 1;
        } else if (!(o->lane && g_fs.lanes == FS_LANES_LATE)) {
            fs_run_free(o);
        }
    }
    for (size_t j = g_fs.head; j < i; j++) /* (an unjoined tail: only when the drain ran to the end) */
        if (!q->ops[j].done) fs_run_free(&q->ops[j]);
    g_fs.head = i;
    if (g_fs.head == q->n) { /* empty: restart the array, keep positions absolute */
        g_fs.base += (long)q->n;
        q->n = g_fs.head = 0;
    }
}

static inline di_status fs_refuse_in_capture(const char *what) {
    char msg[128];
    snprintf(msg, sizeof msg, "%s() inside a graph capture", what);
    fs_violation(msg);
    return di_error(DI_ERR_INTERNAL, "fake stream: %s", msg);
}

/* ---- the patched ops ---- */

static void fs_embed(di_backend *be, float *out, const di_weight *table, const int32_t *ids, int T) {
    (void)be;
    fs_op o = {.kind = FS_EMBED, .p = {out, (void *)ids}, .i = {T}, .w = {*table}};
    fs_issue(&o);
}
static void fs_rmsnorm(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w, float eps,
                       int T, int D) {
    (void)be;
    fs_op o = {.kind = FS_RMSNORM, .p = {out, (void *)x}, .i = {ldo, ldx, T, D}, .f = eps, .w = {*w}};
    fs_issue(&o);
}
static void fs_add_rmsnorm(di_backend *be, float *h, const void *delta, void *out, float *out_f32,
                           const di_weight *w, float eps, int T, int D) {
    (void)be;
    fs_op o = {.kind = FS_ADD_RMSNORM, .p = {h, (void *)delta, out, out_f32}, .i = {T, D}, .f = eps, .w = {*w}};
    fs_issue(&o);
}
static void fs_silu_mul(di_backend *be, void *out, const void *gu, int T, int I) {
    (void)be;
    fs_op o = {.kind = FS_SILU_MUL, .p = {out, (void *)gu}, .i = {T, I}};
    fs_issue(&o);
}
static void fs_add(di_backend *be, float *y, const void *x, size_t n) {
    (void)be;
    fs_op o = {.kind = FS_ADD, .p = {y, (void *)x}, .z = {n}};
    fs_issue(&o);
}
static void fs_gather_rows(di_backend *be, float *out, const float *x, const int32_t *rows, int n, int D) {
    (void)be;
    fs_op o = {.kind = FS_GATHER, .p = {out, (void *)x, (void *)rows}, .i = {n, D}};
    fs_issue(&o);
}
static void fs_matmul(di_backend *be, void *y, int ldy, const void *x, int ldx, const di_weight *W, int T,
                      unsigned flags) {
    (void)be;
    fs_op o = {.kind = FS_MATMUL, .p = {y, (void *)x}, .i = {ldy, ldx, T}, .flags = flags, .w = {*W}};
    fs_issue(&o);
}
static void fs_bmm(di_backend *be, void *y, int ldy, int hsy, const void *x, int ldx, int hsx, const di_weight *W,
                   int T) {
    (void)be;
    fs_op o = {.kind = FS_BMM, .p = {y, (void *)x}, .i = {ldy, hsy, ldx, hsx, T}, .w = {*W}};
    fs_issue(&o);
}
static void fs_rope(di_backend *be, void *x, int ldx, int n_heads, int hs, const int32_t *positions, int T,
                    const di_rope_params *rp) {
    (void)be;
    fs_op o = {.kind = FS_ROPE, .p = {x, (void *)positions}, .i = {ldx, n_heads, hs, T}, .rp = *rp};
    fs_issue(&o);
}
static void fs_kv_write(di_backend *be, void *cache, const void *kv, int ldkv, const int32_t *slots, int T, int W) {
    (void)be;
    fs_op o = {.kind = FS_KV_WRITE, .p = {cache, (void *)kv, (void *)slots}, .i = {ldkv, T, W}};
    fs_issue(&o);
}
static void fs_kv_copy_blocks(di_backend *be, void *cache, size_t layer_stride, int n_layers, int W,
                              const int32_t *src, const int32_t *dst, int n) {
    (void)be;
    if (g_fs.capture) { /* its host block lists are the caller's now, not at each replay */
        (void)fs_refuse_in_capture("kv_copy_blocks");
        return;
    }
    fs_op o = {.kind = FS_KV_COPY, .p = {cache}, .i = {n_layers, W, n}, .z = {layer_stride}};
    o.blob = malloc((size_t)(2 * n + 1) * sizeof(int32_t)); /* host arrays: copied now */
    if (!o.blob) abort();
    memcpy(o.blob, src, (size_t)n * sizeof(int32_t));
    memcpy((int32_t *)o.blob + n, dst, (size_t)n * sizeof(int32_t));
    fs_issue(&o);
}
static void fs_mla_prefill(di_backend *be, void *out, const void *q, int ldq, const void *cache,
                           const di_weight *W_kvb, const di_attn_batch *ab, int seq_begin, int seq_end,
                           const di_mla_dims *d, void *scratch, size_t scratch_bytes) {
    (void)be;
    fs_op o = {.kind = FS_MLA_PREFILL, .p = {out, (void *)q, (void *)cache, scratch}, .i = {ldq, seq_begin, seq_end},
               .z = {scratch_bytes}, .w = {*W_kvb}, .ab = *ab, .md = *d};
    fs_issue(&o);
}
static void fs_mla_decode(di_backend *be, void *out, const void *qt, const void *qpe, int ldqpe, int hsqpe,
                          const void *cache, const di_attn_batch *ab, int seq_begin, int seq_end,
                          const di_mla_dims *d) {
    (void)be;
    fs_op o = {.kind = FS_MLA_DECODE, .p = {out, (void *)qt, (void *)qpe, (void *)cache},
               .i = {ldqpe, hsqpe, seq_begin, seq_end}, .ab = *ab, .md = *d};
    fs_issue(&o);
}
static void fs_moe_route(di_backend *be, int32_t *idx, float *w, const float *x, const di_weight *W_g,
                         const di_weight *bias, const di_route_params *rp, int T, float *scratch) {
    (void)be;
    fs_op o = {.kind = FS_ROUTE, .p = {idx, w, (void *)x, scratch}, .i = {T}, .w = {*W_g}, .has_w2 = bias != NULL,
               .rt = *rp};
    if (bias) o.w[1] = *bias;
    fs_issue(&o);
}
static void fs_moe_experts(di_backend *be, void *out, const void *x, const int32_t *idx, const float *w, int k,
                           const di_weight *gate_up, const di_weight *down, int T, void *scratch,
                           size_t scratch_bytes) {
    (void)be;
    fs_op o = {.kind = FS_EXPERTS, .p = {out, (void *)x, (void *)idx, (void *)w, scratch}, .i = {k, T},
               .z = {scratch_bytes}, .w = {*gate_up, *down}};
    fs_issue(&o);
}
static void fs_layernorm(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w,
                         const di_weight *b, float eps, int T, int D) {
    (void)be;
    fs_op o = {.kind = FS_LAYERNORM, .p = {out, (void *)x}, .i = {ldo, ldx, T, D}, .f = eps, .w = {*w},
               .has_w2 = b != NULL};
    if (b) o.w[1] = *b;
    fs_issue(&o);
}
static void fs_indexer_topk(di_backend *be, int32_t *sel_pos, int32_t *sel_count, const void *q, const float *w,
                            const void *index_cache, const di_attn_batch *ab, int seq_begin, int seq_end,
                            const di_indexer_dims *d, void *scratch, size_t scratch_bytes) {
    (void)be;
    fs_op o = {.kind = FS_INDEXER, .p = {sel_pos, sel_count, (void *)q, (void *)w, (void *)index_cache, scratch},
               .i = {seq_begin, seq_end}, .z = {scratch_bytes}, .ab = *ab, .idd = *d};
    fs_issue(&o);
}
static void fs_sample(di_backend *be, int32_t *tokens, int32_t *status, const float *logits, int n, int V,
                      const di_sample_row *rows) {
    (void)be;
    fs_op o = {.kind = FS_SAMPLE, .p = {tokens, status, (void *)logits, (void *)rows}, .i = {n, V}};
    fs_issue(&o);
}
static void fs_memset(di_backend *be, void *dst, int byte, size_t bytes) {
    (void)be;
    fs_op o = {.kind = FS_MEMSET, .p = {dst}, .i = {byte}, .z = {bytes}};
    fs_issue(&o);
}
static void fs_upload(di_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (!bytes) return;
    if (g_fs.capture) {
        (void)fs_refuse_in_capture("upload");
        return;
    }
    g_fs.uploads++;
    fs_op o = {.kind = FS_COPY, .p = {dst}, .z = {bytes}};
    o.blob = malloc(bytes); /* staged now: the caller may reuse src at once */
    if (!o.blob) abort();
    memcpy(o.blob, src, bytes);
    fs_issue(&o);
}
static void fs_copy_in(di_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (g_fs.capture) {
        (void)fs_refuse_in_capture("copy_in");
        return;
    }
    g_fs.copies_in++;
    fs_rejoin();
    if (!bytes) return;
    if (!g_fs.copy_in_deferred) {
        memcpy(dst, src, bytes); /* ahead of every queued op */
        return;
    }
    fs_op o = {.kind = FS_COPY, .p = {dst, (void *)src}, .z = {bytes}}; /* src read when it runs */
    fs_issue(&o);
}
static void fs_copy_out(di_backend *be, void *dst, const void *src, size_t bytes, int fence) {
    (void)be;
    if (fence < 0 || fence >= DI_BACKEND_FENCES) {
        fs_violation("copy_out(): fence out of range");
        return;
    }
    g_fs.copies_out++;
    fs_rejoin();
    fs_op o = {.kind = FS_COPY_OUT, .p = {dst, (void *)src}, .i = {fence}, .z = {bytes}};
    fs_issue(&o);
    if (!g_fs.capture) g_fs.fence_last[fence] = g_fs.base + (long)g_fs.queue.n;
}
static di_status fs_fence_wait(di_backend *be, int fence) {
    (void)be;
    if (g_fs.capture) return fs_refuse_in_capture("fence_wait");
    if (fence < 0 || fence >= DI_BACKEND_FENCES)
        return di_error(DI_ERR_INVALID_ARG, "fake stream: fence %d out of range", fence);
    g_fs.fence_waits++;
    if (!g_fs.fence_last[fence]) {
        char msg[96];
        snprintf(msg, sizeof msg, "fence_wait(%d) on a fence no copy_out marked", fence);
        fs_violation(msg);
        return di_error(DI_ERR_INTERNAL, "fake stream: %s", msg);
    }
    fs_drain(g_fs.fence_last[fence]);
    return DI_OK;
}
static di_status fs_sync(di_backend *be) {
    (void)be;
    if (g_fs.capture) return fs_refuse_in_capture("sync");
    g_fs.syncs++;
    fs_rejoin();
    fs_drain(-1);
    return DI_OK;
}
static di_status fs_download(di_backend *be, void *dst, const void *src, size_t bytes) {
    if (g_fs.capture) return fs_refuse_in_capture("download");
    g_fs.downloads++;
    fs_rejoin();
    fs_drain(-1);
    return g_fs.orig.download(be, dst, src, bytes);
}
static di_status fs_host_alloc(di_backend *be, size_t bytes, void **out) {
    (void)be;
    g_fs.host_allocs++;
    *out = malloc(bytes ? bytes : 1);
    return *out ? DI_OK : di_error(DI_ERR_NOMEM, "fake stream: host_alloc(%zu)", bytes);
}
static void fs_host_free(di_backend *be, void *ptr) {
    (void)be;
    free(ptr);
}
static di_status fs_graph_begin(di_backend *be) {
    (void)be;
    if (g_fs.capture) return fs_refuse_in_capture("graph_begin");
    fs_rejoin();
    g_fs.capture = (fs_list *)calloc(1, sizeof(fs_list));
    return g_fs.capture ? DI_OK : di_error(DI_ERR_NOMEM, "fake stream: graph");
}
static di_status fs_graph_end(di_backend *be, void **graph) {
    (void)be;
    if (!g_fs.capture) return di_error(DI_ERR_INTERNAL, "fake stream: graph_end() without graph_begin()");
    fs_rejoin();
    *graph = g_fs.capture;
    g_fs.capture = NULL;
    g_fs.captures++;
    return DI_OK;
}
static di_status fs_graph_launch(di_backend *be, void *graph) {
    (void)be;
    if (g_fs.capture) return fs_refuse_in_capture("graph_launch");
    const fs_list *gl = (const fs_list *)graph;
    fs_rejoin();
    for (size_t k = 0; k < gl->n; k++) {
        fs_push(&g_fs.queue, &gl->ops[k]); /* graph ops own no blob (no uploads in captures) */
        if (gl->ops[k].kind == FS_COPY_OUT) g_fs.fence_last[gl->ops[k].i[0]] = g_fs.base + (long)g_fs.queue.n;
    }
    g_fs.launches++;
    return DI_OK;
}
static void fs_graph_free(di_backend *be, void *graph) {
    (void)be;
    fs_list *gl = (fs_list *)graph;
    if (!gl) return;
    free(gl->ops);
    free(gl);
}

static di_status fs_alloc(di_backend *be, size_t bytes, void **out) {
    g_fs.allocs++;
    return g_fs.orig.alloc(be, bytes, out);
}

/* The side lane (backend.h), offered when g_fs.lanes is set, for steps of at most 4096 tokens. */
static int fs_side_begin(di_backend *be, int T) {
    (void)be;
    if (!g_fs.lanes || T > 4096 || g_fs.on_side) return 0;
    fs_marker(FS_FORK);
    g_fs.forked = g_fs.on_side = 1;
    g_fs.forks++;
    return 1;
}
static void fs_side_end(di_backend *be) {
    (void)be;
    g_fs.on_side = 0;
}
static void fs_side_resume(di_backend *be) {
    (void)be;
    if (!g_fs.forked || g_fs.on_side) fs_violation("side_resume() without a side lane to resume");
    else g_fs.on_side = 1;
}
static void fs_side_join(di_backend *be) {
    (void)be;
    fs_rejoin();
}

/* Patches be (a CPU backend) into the fake stream; returns it. */
static inline di_backend *fs_install(di_backend *be) {
    memset(&g_fs, 0, sizeof g_fs);
    g_fs.orig = *be;
    g_fs.be = be;
    be->embed = fs_embed;
    be->rmsnorm = fs_rmsnorm;
    be->add_rmsnorm = fs_add_rmsnorm;
    be->silu_mul = fs_silu_mul;
    be->add = fs_add;
    be->gather_rows = fs_gather_rows;
    be->matmul = fs_matmul;
    be->bmm = fs_bmm;
    be->rope = fs_rope;
    be->kv_write = fs_kv_write;
    be->kv_copy_blocks = fs_kv_copy_blocks;
    be->mla_prefill = fs_mla_prefill;
    be->mla_decode = fs_mla_decode;
    be->moe_route = fs_moe_route;
    be->moe_experts = fs_moe_experts;
    be->layernorm = fs_layernorm;
    be->indexer_topk = fs_indexer_topk;
    be->sample = fs_sample;
    be->memset = fs_memset;
    be->upload = fs_upload;
    be->download = fs_download;
    be->sync = fs_sync;
    be->alloc = fs_alloc;
    be->host_alloc = fs_host_alloc;
    be->host_free = fs_host_free;
    be->copy_in = fs_copy_in;
    be->copy_out = fs_copy_out;
    be->fence_wait = fs_fence_wait;
    be->graph_begin = fs_graph_begin;
    be->graph_end = fs_graph_end;
    be->graph_launch = fs_graph_launch;
    be->graph_free = fs_graph_free;
    be->side_begin = fs_side_begin;
    be->side_end = fs_side_end;
    be->side_resume = fs_side_resume;
    be->side_join = fs_side_join;
    return be;
}

/* ---- the CUDA backend's fused ops as their backend.h compositions (fs_extensions) ---- */

/* A temporary of at least n floats for fused op `slot` (0: deferred experts, 1: shared gate/up,
 * 2: shared SiLU-mul, 3: matmul_silu's gate/up): the slot's newest if large enough, else a new one (captured ops keep
 * pointing at the old). */
static inline float *fs_buf(int slot, size_t n) {
    for (int i = g_fs.n_bufs - 1; i >= 0; i--)
        if (g_fs.bufs[i].slot == slot) {
            if (g_fs.bufs[i].floats >= n) return g_fs.bufs[i].p;
            break;
        }
    if (g_fs.n_bufs >= 64) abort(); /* a test helper: more sizes than any test uses */
    float *b = (float *)malloc(n * sizeof(float));
    if (!b) abort();
    g_fs.bufs[g_fs.n_bufs].p = b;
    g_fs.bufs[g_fs.n_bufs].floats = n;
    g_fs.bufs[g_fs.n_bufs++].slot = slot;
    return b;
}

static void fs_rope_kv_write(di_backend *be, void *q, int ldq, int n_heads, int hsq, void *kv, int ldkv, int kv_rope,
                             void *cache, const int32_t *slots, int W, const int32_t *positions, int T,
                             const di_rope_params *rp, const di_weight *kv_norm, float eps) {
    g_fs.fused[0]++;
    if (kv && kv_norm) be->rmsnorm(be, kv, ldkv, kv, ldkv, kv_norm, eps, T, kv_rope);
    if (n_heads > 0) be->rope(be, q, ldq, n_heads, hsq, positions, T, rp);
    if (kv) {
        be->rope(be, (float *)kv + kv_rope, ldkv, 1, ldkv, positions, T, rp);
        be->kv_write(be, cache, kv, ldkv, slots, T, W);
    }
}
static void fs_mla_decode_uv(di_backend *be, void *o, int ldo, int hso, void *olat, const void *qt, const void *qpe,
                             int ldqpe, int hsqpe, const void *cache, const di_attn_batch *ab, int seq_begin,
                             int seq_end, const di_mla_dims *d, const di_weight *w_uv, int n_tokens) {
    g_fs.fused[1]++;
    be->mla_decode(be, olat, qt, qpe, ldqpe, hsqpe, cache, ab, seq_begin, seq_end, d);
    be->bmm(be, o, ldo, hso, olat, d->n_heads * d->kv_rank, d->kv_rank, w_uv, n_tokens);
}
static int fs_moe_experts_shared(di_backend *be, void *out, const void *x, const int32_t *idx, const float *w, int k,
                                 const di_weight *gate_up, const di_weight *down, const di_weight *sh_gate_up,
                                 const di_weight *sh_down, int T, void *scratch, size_t scratch_bytes) {
    if (T > 4) return 0;
    g_fs.fused[2]++;
    const int D = gate_up->cols, Is = sh_down->cols;
    be->moe_experts(be, out, x, idx, w, k, gate_up, down, T, scratch, scratch_bytes);
    float *gu = fs_buf(1, (size_t)T * 2 * Is), *a = fs_buf(2, (size_t)T * Is);
    be->matmul(be, gu, 2 * Is, x, D, sh_gate_up, T, 0);
    be->silu_mul(be, a, gu, T, Is);
    be->matmul(be, out, D, a, Is, sh_down, T, DI_MM_ACCUMULATE);
    return 1;
}
static int fs_moe_experts_defer(di_backend *be, const void *x, const int32_t *idx, const float *w, int k,
                                const di_weight *gate_up, const di_weight *down, int T, void *scratch,
                                size_t scratch_bytes) {
    if (T < 2) return 0;
    g_fs.fused[3]++;
    g_fs.deferred = fs_buf(0, (size_t)T * gate_up->cols);
    g_fs.def_scratch = scratch;
    g_fs.def_w = w;
    g_fs.def_k = k;
    g_fs.def_T = T;
    be->moe_experts(be, g_fs.deferred, x, idx, w, k, gate_up, down, T, scratch, scratch_bytes);
    return 1;
}
static void fs_add_rmsnorm_experts(di_backend *be, float *h, const void *scratch, const float *topk_w, int k,
                                   void *out, float *out_f32, const di_weight *w, float eps, int T, int D) {
    if (!g_fs.deferred || scratch != g_fs.def_scratch || topk_w != g_fs.def_w || k != g_fs.def_k || T != g_fs.def_T) {
        fs_violation("add_rmsnorm_experts() without a moe_experts_defer() of the same scratch, weights, k and T");
        return;
    }
    g_fs.fused[4]++;
    be->add_rmsnorm(be, h, g_fs.deferred, out, out_f32, w, eps, T, D);
    g_fs.deferred = NULL;
}

/* matmul_silu as CUDA takes it (one token, not on the side lane; DEEPINFER_CUDA_GU_SILU): the
 * gate/up projection into a temporary, then silu_mul */
static int fs_matmul_silu(di_backend *be, void *act, const void *x, int ldx, const di_weight *gate_up, int I, int T) {
    if (T != 1 || g_fs.on_side || gate_up->rows != 2 * I) return 0;
    g_fs.fused[5]++;
    float *gu = fs_buf(3, (size_t)T * 2 * I);
    be->matmul(be, gu, 2 * I, x, ldx, gate_up, T, 0);
    be->silu_mul(be, act, gu, T, I);
    return 1;
}

/* Adds the fused ops to a backend fs_install patched. */
static inline void fs_extensions(di_backend *be) {
    be->rope_kv_write = fs_rope_kv_write;
    be->mla_decode_uv = fs_mla_decode_uv;
    be->moe_experts_shared = fs_moe_experts_shared;
    be->moe_experts_defer = fs_moe_experts_defer;
    be->add_rmsnorm_experts = fs_add_rmsnorm_experts;
    be->matmul_silu = fs_matmul_silu;
}

/* A loaded CPU model onto the fake stream: its backend patched (fs_install) and its step state
 * rebuilt for it (graphs and asynchronous steps on); the step state load made was for the
 * plain CPU backend (no graphs, synchronous steps). */
static inline di_status fs_model_install(di_model *m) {
    di_model_step_free(m);
    fs_install(di_model_backend(m));
    return di_model_step_setup(m);
}

/* Frees the fake's own state; after di_model_free (whose step teardown still uses the patched
 * ops: host_free, graph_free, sync). */
static inline void fs_release(void) {
    free(g_fs.queue.ops);
    di_sampler_free(g_fs.sampler);
    g_fs.queue.ops = NULL;
    g_fs.queue.n = g_fs.queue.cap = g_fs.head = 0;
    g_fs.sampler = NULL;
    for (int i = 0; i < g_fs.n_bufs; i++) free(g_fs.bufs[i].p);
    g_fs.n_bufs = 0;
    g_fs.deferred = NULL;
}
#endif
