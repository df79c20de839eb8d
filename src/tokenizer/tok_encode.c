/* tok_encode.c - text -> ids: the HF encode pipeline, serial and segment-parallel.
 *
 *   HF mode (DI_TOK_HF): added tokens with normalized=false are found in the raw text; the
 *     text between them is normalized; added tokens with normalized=true are found in that
 *     normalized text; what remains is pre-tokenized and run through BPE. This is HF
 *     `encode(text, add_special_tokens=False)`.
 *   Safe mode (DI_TOK_SAFE): no added-token matching at all - the whole text is normalized,
 *     pre-tokenized and BPE-encoded, so "<｜User｜>" or "</think>" typed by a user become
 *     ordinary text tokens, never control tokens.
 *   DI_TOK_ADD_SPECIAL wraps the result with the post-processor's (or tokenizer_config's)
 *     BOS/EOS ids.
 * Invalid UTF-8 is rejected with DI_ERR_FORMAT naming the byte offset; nothing is appended then.
 *
 * Segment-parallel encoding (di_tokenizer_encode_parallel) cuts the work at added-token
 * boundaries (always safe: HF encodes the pieces between added tokens independently) and, for
 * long text segments, inside the pre-tokenizer with exact chunk stitching (tok_pretok.c); BPE
 * of the resulting pieces is independent per piece. The output is identical to serial. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "core/utf8.h"
#include "tokenizer/tok_internal.h"

di_status di_ids_push(di_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *d = realloc(v->data, cap * sizeof *d);
        if (!d) return di_error(DI_ERR_NOMEM, "out of memory (%zu token ids)", cap);
        v->data = d;
        v->cap = cap;
    }
    v->data[v->n++] = id;
    return DI_OK;
}

void di_ids_free(di_ids *v) {
    if (!v) return;
    free(v->data);
    v->data = NULL;
    v->n = v->cap = 0;
}

static di_status ids_append(di_ids *dst, const int32_t *src, size_t n) {
    if (dst->n + n > dst->cap) {
        size_t cap = dst->cap ? dst->cap : 64;
        while (cap < dst->n + n) cap *= 2;
        int32_t *d = realloc(dst->data, cap * sizeof *d);
        if (!d) return di_error(DI_ERR_NOMEM, "out of memory (%zu token ids)", cap);
        dst->data = d;
        dst->cap = cap;
    }
    if (n) memcpy(dst->data + dst->n, src, n * sizeof *src);
    dst->n += n;
    return DI_OK;
}

/* Offset of the first invalid UTF-8 byte in s[0..n), or n; 8 ASCII bytes per step. */
static size_t utf8_first_invalid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (!(w & 0x8080808080808080ull)) { i += 8; continue; }
        }
        uint32_t cp;
        int l = tok_utf8_next(p + i, n - i, &cp);
        if (!l) return i;
        i += (size_t)l;
    }
    return n;
}

static di_status check_flags(const char *text, size_t len, unsigned flags) {
    if (flags & ~(unsigned)(DI_TOK_SAFE | DI_TOK_ADD_SPECIAL))
        return di_error(DI_ERR_INVALID_ARG, "tokenizer: unknown encode flags 0x%x", flags);
    if (!text && len) return di_error(DI_ERR_INVALID_ARG, "tokenizer: NULL text with length %zu", len);
    return DI_OK;
}

static di_status utf8_error(const char *text, size_t bad) {
    return di_error(DI_ERR_FORMAT, "tokenizer: input is not valid UTF-8: invalid byte 0x%02x at byte offset %zu",
                    (unsigned char)text[bad], bad);
}

static di_status check_input(const char *text, size_t len, unsigned flags) {
    DI_TRY(check_flags(text, len, flags));
    size_t bad = len ? utf8_first_invalid(text, len) : 0;
    return bad < len ? utf8_error(text, bad) : DI_OK;
}

/* The same check on a thread pool: chunks start at non-continuation bytes, so a sequence is
 * never split; the first invalid byte of the earliest bad chunk is reported. */
typedef struct { const char *s; size_t n, chunk; size_t *bad; } vctx;

/* Chunk boundary i: i * chunk moved back to the start of its character (at most 3 bytes, which
 * is all a valid character needs; both neighbours compute the same boundary). */
static size_t vbound(const vctx *c, size_t i) {
    size_t x = i * c->chunk;
    if (x >= c->n) return c->n;
    for (int k = 0; k < 3 && x > 0 && ((unsigned char)c->s[x] & 0xc0) == 0x80; k++) x--;
    return x;
}

static void validate_chunk(void *vc, size_t i, int tid) {
    vctx *c = vc;
    (void)tid;
    size_t a = vbound(c, i), b = vbound(c, i + 1);
    size_t r = b > a ? utf8_first_invalid(c->s + a, b - a) : 0;
    c->bad[i] = b > a && r < b - a ? a + r : SIZE_MAX;
}

static di_status check_input_parallel(const char *text, size_t len, unsigned flags, di_threadpool *pool) {
    DI_TRY(check_flags(text, len, flags));
    size_t k = (size_t)di_threadpool_size(pool) * 4, chunk = (len + k - 1) / k;
    if (chunk < 4096) return check_input(text, len, flags);
    size_t *bad = malloc(k * sizeof *bad);
    if (!bad) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory");
    vctx c = {text, len, chunk, bad};
    di_threadpool_run(pool, k, validate_chunk, &c);
    size_t first = SIZE_MAX;
    for (size_t i = 0; i < k; i++)
        if (bad[i] < first) first = bad[i];
    free(bad);
    return first == SIZE_MAX ? DI_OK : utf8_error(text, first);
}

/* One text segment (no added tokens in it): pre-tokenize, then BPE each piece. */
static di_status encode_segment(const di_tokenizer *t, tok_ws *ws, const char *seg, size_t n, di_ids *out) {
    tok_pieces *pieces;
    DI_TRY(tok_pretokenize(t, ws, seg, n, &pieces));
    for (size_t i = 0; i < pieces->n; i++) DI_TRY(tok_bpe_piece(t, ws, seg, pieces->v[i], out));
    return DI_OK;
}

/* ---- segments: the text cut at added tokens ---- */
typedef tok_segment segment;
typedef tok_segments segments;

static di_status seg_push(segments *s, int32_t token, int norm, size_t off, size_t len) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        segment *v = realloc(s->v, cap * sizeof *v);
        if (!v) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (segments)");
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (segment){token, norm, off, len};
    return DI_OK;
}

/* Cuts text into added tokens and normalized text segments, as HF extract_and_normalize. */
static di_status cut_segments(const di_tokenizer *t, tok_ws *ws, const char *text, size_t len, unsigned flags,
                              segments *out) {
    int safe = (flags & DI_TOK_SAFE) || t->n_added == 0;
    tok_splits *raw = &ws->raw_splits;
    raw->n = 0;
    if (safe) {
        if (len) DI_TRY(tok_added_split(t, &t->empty_trie, text, len, raw));
    } else {
        DI_TRY(tok_added_split(t, &t->raw_trie, text, len, raw));
    }
    for (size_t i = 0; i < raw->n; i++) {
        tok_split sp = raw->v[i];
        if (sp.token >= 0) { DI_TRY(seg_push(out, t->added[sp.token].id, 0, 0, 0)); continue; }
        if (t->n_norms == 0) {
            /* no normalizer: normalized tokens match the raw text */
            if (safe || t->norm_trie.count == 0) { DI_TRY(seg_push(out, -1, 0, sp.off, sp.len)); continue; }
            tok_splits *ns = &ws->norm_splits;
            ns->n = 0;
            DI_TRY(tok_added_split(t, &t->norm_trie, text + sp.off, sp.len, ns));
            for (size_t k = 0; k < ns->n; k++) {
                if (ns->v[k].token >= 0) DI_TRY(seg_push(out, t->added[ns->v[k].token].id, 0, 0, 0));
                else DI_TRY(seg_push(out, -1, 0, sp.off + ns->v[k].off, ns->v[k].len));
            }
            continue;
        }
        DI_TRY(tok_normalize(t, text + sp.off, sp.len, ws, &ws->norm));
        size_t base = out->normtext.n;
        DI_TRY(tok_buf_put(&out->normtext, ws->norm.p, ws->norm.n));
        if (safe || t->norm_trie.count == 0) { DI_TRY(seg_push(out, -1, 1, base, ws->norm.n)); continue; }
        tok_splits *ns = &ws->norm_splits;
        ns->n = 0;
        DI_TRY(tok_added_split(t, &t->norm_trie, ws->norm.p, ws->norm.n, ns));
        for (size_t k = 0; k < ns->n; k++) {
            if (ns->v[k].token >= 0) DI_TRY(seg_push(out, t->added[ns->v[k].token].id, 0, 0, 0));
            else DI_TRY(seg_push(out, -1, 1, base + ns->v[k].off, ns->v[k].len));
        }
    }
    return DI_OK;
}

static const char *seg_text(const segments *s, const char *text, const segment *g) {
    return g->norm ? s->normtext.p + g->off : text + g->off;
}

/* Segments live in the workspace and are reused by the next call. */
static segments *segments_reset(tok_ws *ws) {
    ws->segs.n = 0;
    ws->segs.normtext.n = 0;
    return &ws->segs;
}

static di_status encode_serial(const di_tokenizer *t, tok_ws *ws, const char *text, size_t len, unsigned flags,
                               di_ids *out) {
    segments *segs = segments_reset(ws);
    di_status st = cut_segments(t, ws, text, len, flags, segs);
    for (size_t i = 0; i < segs->n && st == DI_OK; i++) {
        segment *g = &segs->v[i];
        if (g->token >= 0) st = di_ids_push(out, g->token);
        else st = encode_segment(t, ws, seg_text(segs, text, g), g->len, out);
    }
    return st;
}

static di_status wrap(const di_tokenizer *t, unsigned flags, int pre, di_ids *out) {
    if (!(flags & DI_TOK_ADD_SPECIAL)) return DI_OK;
    return pre ? ids_append(out, t->pre_ids, t->n_pre) : ids_append(out, t->post_ids, t->n_post);
}

di_status di_tokenizer_encode(const di_tokenizer *t, const char *text, size_t len, unsigned flags, di_ids *out) {
    DI_TRY(check_input(text, len, flags));
    tok_ws *ws = tok_ws_acquire(t);
    if (!ws) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (workspace)");
    size_t n0 = out->n;
    di_status st = wrap(t, flags, 1, out);
    if (st == DI_OK) st = encode_serial(t, ws, text, len, flags, out);
    if (st == DI_OK) st = wrap(t, flags, 0, out);
    if (st != DI_OK) out->n = n0;
    tok_ws_release(t, ws);
    return st;
}

/* ================= segment-parallel ================= */

/* below PAR_MIN_BYTES encode serially; PAR_TASK_BYTES of work per task (tests lower both) */
static atomic_size_t g_min_bytes = 64u << 10, g_task_bytes = 32u << 10;
#define PAR_MIN_BYTES atomic_load_explicit(&g_min_bytes, memory_order_relaxed)
#define PAR_TASK_BYTES atomic_load_explicit(&g_task_bytes, memory_order_relaxed)

void tok_parallel_set_sizes(size_t min_bytes, size_t task_bytes, size_t batch_bytes, size_t big_piece) {
    atomic_store(&g_min_bytes, min_bytes ? min_bytes : 64u << 10);
    atomic_store(&g_task_bytes, task_bytes ? task_bytes : 32u << 10);
    tok_pretok_set_sizes(batch_bytes, big_piece);
}

typedef struct {
    size_t lo, hi;  /* segments [lo, hi) or pieces [lo, hi) */
    di_ids ids;
    di_status st;
} etask;

typedef struct {
    const di_tokenizer *t;
    tok_ws **wss;
    const segments *segs;
    const char *text;
    const char *seg;          /* piece mode: the segment text */
    const tok_pieces *pieces; /* piece mode */
    etask *tasks;
    char err[512];
    atomic_int failed;
} ectx;

static void task_fail(ectx *c, etask *tk) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&c->failed, &expected, 1)) snprintf(c->err, sizeof c->err, "%s", di_last_error());
    (void)tk;
}

static void run_segments(void *vc, size_t i, int tid) {
    ectx *c = vc;
    etask *tk = &c->tasks[i];
    tk->st = DI_OK;
    for (size_t k = tk->lo; k < tk->hi && tk->st == DI_OK; k++) {
        const segment *g = &c->segs->v[k];
        if (g->token >= 0) tk->st = di_ids_push(&tk->ids, g->token);
        else tk->st = encode_segment(c->t, c->wss[tid], seg_text(c->segs, c->text, g), g->len, &tk->ids);
    }
    if (tk->st != DI_OK) task_fail(c, tk);
}

static void run_pieces(void *vc, size_t i, int tid) {
    ectx *c = vc;
    etask *tk = &c->tasks[i];
    tk->st = DI_OK;
    for (size_t k = tk->lo; k < tk->hi && tk->st == DI_OK; k++)
        tk->st = tok_bpe_piece(c->t, c->wss[tid], c->seg, c->pieces->v[k], &tk->ids);
    if (tk->st != DI_OK) task_fail(c, tk);
}

static di_status run_tasks(ectx *c, di_threadpool *pool, etask *tasks, size_t n, di_parallel_fn fn, di_ids *out) {
    c->tasks = tasks;
    atomic_store(&c->failed, 0);
    di_threadpool_run(pool, n, fn, c);
    di_status st = atomic_load(&c->failed) ? di_error(DI_ERR_INTERNAL, "%s", c->err) : DI_OK;
    for (size_t i = 0; i < n; i++) {
        if (st == DI_OK) st = ids_append(out, tasks[i].ids.data, tasks[i].ids.n);
        di_ids_free(&tasks[i].ids);
    }
    return st;
}

/* One long text segment: parallel pre-tokenization, then BPE of piece ranges in parallel. */
static di_status encode_long_segment(ectx *c, di_threadpool *pool, int n_ws, const char *seg, size_t n, di_ids *out) {
    tok_pieces *pieces;
    DI_TRY(tok_pretokenize_parallel(c->t, c->wss, n_ws, pool, seg, n, &pieces));
    size_t n_tasks = n / PAR_TASK_BYTES + 1;
    etask *tasks = calloc(n_tasks, sizeof *tasks);
    if (!tasks) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (tasks)");
    size_t k = 0, i = 0;
    while (i < pieces->n && k < n_tasks) {
        size_t lo = i, bytes = 0;
        while (i < pieces->n && (bytes < PAR_TASK_BYTES || k + 1 == n_tasks)) bytes += (pieces->v[i++].len & ~TOK_PIECE_SPACE) + 1;
        tasks[k].lo = lo;
        tasks[k].hi = i;
        k++;
    }
    c->seg = seg;
    c->pieces = pieces;
    di_status st = run_tasks(c, pool, tasks, k, run_pieces, out);
    free(tasks);
    return st;
}

static di_status encode_parallel(const di_tokenizer *t, tok_ws **wss, int n_ws, di_threadpool *pool, const char *text,
                                 size_t len, unsigned flags, di_ids *out) {
    segments *sp = segments_reset(wss[0]);
    di_status st = cut_segments(t, wss[0], text, len, flags, sp);
    segments segs = *sp; /* read-only from here on */
    ectx c = {.t = t, .wss = wss, .segs = &segs, .text = text};
    atomic_init(&c.failed, 0);
    etask *tasks = st == DI_OK ? calloc(segs.n + 1, sizeof *tasks) : NULL;
    if (st == DI_OK && !tasks) st = di_error(DI_ERR_NOMEM, "tokenizer: out of memory (tasks)");
    size_t i = 0;
    while (st == DI_OK && i < segs.n) {
        /* batch consecutive short segments into tasks, then handle one long segment */
        size_t n_tasks = 0;
        while (i < segs.n && !(segs.v[i].token < 0 && segs.v[i].len >= PAR_MIN_BYTES)) {
            size_t lo = i, bytes = 0;
            while (i < segs.n && bytes < PAR_TASK_BYTES && !(segs.v[i].token < 0 && segs.v[i].len >= PAR_MIN_BYTES))
                bytes += segs.v[i++].len + 1;
            tasks[n_tasks++] = (etask){.lo = lo, .hi = i};
        }
        if (n_tasks) st = run_tasks(&c, pool, tasks, n_tasks, run_segments, out);
        if (st == DI_OK && i < segs.n) {
            segment *g = &segs.v[i++];
            st = encode_long_segment(&c, pool, n_ws, seg_text(&segs, text, g), g->len, out);
        }
    }
    free(tasks);
    return st;
}

di_status di_tokenizer_encode_parallel(const di_tokenizer *t, const char *text, size_t len, unsigned flags,
                                       di_threadpool *pool, di_ids *out) {
    int n_ws = di_threadpool_size(pool);
    if (n_ws <= 1 || len < PAR_MIN_BYTES) return di_tokenizer_encode(t, text, len, flags, out);
    DI_TRY(check_input_parallel(text, len, flags, pool));
    tok_ws **wss = calloc((size_t)n_ws, sizeof *wss);
    if (!wss) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (workspaces)");
    di_status st = DI_OK;
    for (int i = 0; i < n_ws && st == DI_OK; i++)
        if (!(wss[i] = tok_ws_acquire(t))) st = di_error(DI_ERR_NOMEM, "tokenizer: out of memory (workspace)");
    size_t n0 = out->n;
    if (st == DI_OK) st = wrap(t, flags, 1, out);
    if (st == DI_OK) st = encode_parallel(t, wss, n_ws, pool, text, len, flags, out);
    if (st == DI_OK) st = wrap(t, flags, 0, out);
    if (st != DI_OK) out->n = n0;
    for (int i = 0; i < n_ws; i++) tok_ws_release(t, wss[i]);
    free(wss);
    return st;
}
