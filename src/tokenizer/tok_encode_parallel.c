/* tok_encode_parallel.c - segment-parallel encoding (di_tokenizer_encode_parallel): the same ids
 * as di_tokenizer_encode, computed on a di_threadpool.
 *
 * The text is cut where HF itself processes parts independently:
 *   1. at added tokens with normalized=false (serial scan): the raw pieces;
 *   2. each raw piece is normalized and cut at normalized added tokens on its own.
 * Raw pieces are batched into tasks of about PAR_TASK_BYTES. A raw piece too large to balance the
 * pool ("huge": >= PAR_MIN_BYTES and >= 1/(2T) of the input) is normalized in parallel chunks
 * (di_tok_normalize_parallel), cut at normalized added tokens, and its text segments are batched
 * again; a huge segment goes through the pre-tokenizer on chunks with exact stitching
 * (tok_pretok.c) and its pieces are BPE-encoded in parallel ranges. Results are concatenated in
 * input order, so the output is identical to serial encoding.
 *
 * Invariant: one caller per pool (di_threadpool_run is not reentrant); every task uses the
 * workspace of the pool thread running it (wss[thread index]). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "tokenizer/tok_internal.h"

/* below PAR_MIN_BYTES encode serially; PAR_TASK_BYTES of work per task (tests lower both) */
static atomic_size_t g_min_bytes = 64u << 10, g_task_bytes = 16u << 10;
#define PAR_MIN_BYTES atomic_load_explicit(&g_min_bytes, memory_order_relaxed)
#define PAR_TASK_BYTES atomic_load_explicit(&g_task_bytes, memory_order_relaxed)

void di_tok_parallel_set_sizes(size_t min_bytes, size_t task_bytes, size_t batch_bytes, size_t big_piece) {
    atomic_store(&g_min_bytes, min_bytes ? min_bytes : 64u << 10);
    atomic_store(&g_task_bytes, task_bytes ? task_bytes : 16u << 10);
    di_tok_pretok_set_sizes(batch_bytes, big_piece);
}

/* ---- input validation ---- */
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
    size_t r = b > a ? di_tok_utf8_first_invalid(c->s + a, b - a) : 0;
    c->bad[i] = b > a && r < b - a ? a + r : SIZE_MAX;
}

static di_status check_input_parallel(const char *text, size_t len, unsigned flags, di_threadpool *pool) {
    DI_TRY(di_tok_check_flags(text, len, flags));
    size_t k = (size_t)di_threadpool_size(pool) * 4, chunk = (len + k - 1) / k;
    if (chunk < 4096) return di_tok_check_input(text, len, flags);
    size_t *bad = malloc(k * sizeof *bad);
    if (!bad) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory");
    vctx c = {text, len, chunk, bad};
    di_threadpool_run(pool, k, validate_chunk, &c);
    size_t first = SIZE_MAX;
    for (size_t i = 0; i < k; i++)
        if (bad[i] < first) first = bad[i];
    free(bad);
    return first == SIZE_MAX ? DI_OK : di_tok_utf8_error(text, first);
}


/* ---- tasks ---- */
typedef struct {
    size_t lo, hi; /* raw splits, segments or pieces [lo, hi) */
    di_ids ids;
} etask;

typedef struct {
    const di_tokenizer *t;
    di_tok_ws **wss;
    const char *text;
    int safe;
    const di_tok_split *raw;         /* raw mode */
    const di_tok_segments *segs;     /* segment mode */
    const char *seg;              /* piece mode: the segment text */
    const di_tok_pieces *pieces;     /* piece mode */
    etask *tasks;
    char err[512];
    atomic_int failed;
} ectx;

static void task_done(ectx *c, di_status st) {
    int expected = 0;
    if (st != DI_OK && atomic_compare_exchange_strong(&c->failed, &expected, 1))
        snprintf(c->err, sizeof c->err, "%s", di_last_error());
}

static void run_raw(void *vc, size_t i, int tid) {
    ectx *c = vc;
    etask *tk = &c->tasks[i];
    task_done(c, di_tok_encode_raw(c->t, c->wss[tid], c->raw, tk->lo, tk->hi, c->text, c->safe, &tk->ids));
}

static void run_segments(void *vc, size_t i, int tid) {
    ectx *c = vc;
    etask *tk = &c->tasks[i];
    task_done(c, di_tok_encode_segments(c->t, c->wss[tid], c->segs, tk->lo, tk->hi, c->text, &tk->ids));
}

static void run_pieces(void *vc, size_t i, int tid) {
    ectx *c = vc;
    etask *tk = &c->tasks[i];
    di_status st = DI_OK;
    for (size_t k = tk->lo; k < tk->hi && st == DI_OK; k++)
        st = di_tok_bpe_piece(c->t, c->wss[tid], c->seg, c->pieces->v[k], &tk->ids);
    task_done(c, st);
}

/* Runs tasks[0..n) on the pool and appends their ids in order. */
static di_status run_tasks(ectx *c, di_threadpool *pool, etask *tasks, size_t n, di_parallel_fn fn, di_ids *out) {
    c->tasks = tasks;
    atomic_store(&c->failed, 0);
    di_threadpool_run(pool, n, fn, c);
    di_status st = atomic_load(&c->failed) ? di_error(DI_ERR_INTERNAL, "%s", c->err) : DI_OK;
    for (size_t i = 0; i < n; i++) {
        if (st == DI_OK) st = di_tok_ids_append(out, tasks[i].ids.data, tasks[i].ids.n);
        di_ids_free(&tasks[i].ids);
    }
    return st;
}

/* Cuts items [0, n) with sizes size(i) into tasks of about PAR_TASK_BYTES, stopping before a
 * huge item; returns the number of tasks and advances *i. */
typedef size_t (*size_fn)(const ectx *c, size_t i);
static size_t plan(const ectx *c, size_fn size, size_t n, size_t huge, size_t *i, etask *tasks) {
    size_t n_tasks = 0;
    while (*i < n && size(c, *i) < huge) {
        size_t lo = *i, bytes = 0;
        while (*i < n && bytes < PAR_TASK_BYTES && size(c, *i) < huge) bytes += size(c, (*i)++) + 1;
        tasks[n_tasks++] = (etask){.lo = lo, .hi = *i};
    }
    return n_tasks;
}

static size_t raw_size(const ectx *c, size_t i) { return c->raw[i].token >= 0 ? 0 : c->raw[i].len; }
static size_t seg_size(const ectx *c, size_t i) { return c->segs->v[i].token >= 0 ? 0 : c->segs->v[i].len; }

/* One huge text segment: parallel pre-tokenization, then BPE of piece ranges in parallel. */
static di_status encode_long_segment(ectx *c, di_threadpool *pool, int n_ws, const char *seg, size_t n, di_ids *out) {
    di_tok_pieces *pieces;
    DI_TRY(di_tok_pretokenize_parallel(c->t, c->wss, n_ws, pool, seg, n, &pieces));
    size_t n_tasks = n / PAR_TASK_BYTES + 1;
    etask *tasks = calloc(n_tasks, sizeof *tasks);
    if (!tasks) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (tasks)");
    size_t k = 0, i = 0;
    while (i < pieces->n && k < n_tasks) {
        size_t lo = i, bytes = 0;
        while (i < pieces->n && (bytes < PAR_TASK_BYTES || k + 1 == n_tasks)) bytes += (pieces->v[i++].len & ~DI_TOK_PIECE_SPACE) + 1;
        tasks[k++] = (etask){.lo = lo, .hi = i};
    }
    c->seg = seg;
    c->pieces = pieces;
    di_status st = run_tasks(c, pool, tasks, k, run_pieces, out);
    free(tasks);
    return st;
}

/* One huge raw piece: normalize in parallel, cut at normalized added tokens, encode. */
static di_status encode_huge_piece(ectx *c, di_threadpool *pool, int n_ws, di_tok_split sp, size_t huge, di_ids *out) {
    const di_tokenizer *t = c->t;
    di_tok_segments segs = {0};
    di_status st = DI_OK;
    if (t->n_norms) {
        st = di_tok_normalize_parallel(t, c->wss, n_ws, pool, c->text + sp.off, sp.len, &segs.normtext);
        if (st == DI_OK) st = di_tok_cut_normalized(t, c->wss[0], segs.normtext.p, segs.normtext.n, 1, 0, c->safe, &segs);
    } else {
        st = di_tok_cut_normalized(t, c->wss[0], c->text + sp.off, sp.len, 0, sp.off, c->safe, &segs);
    }
    etask *tasks = st == DI_OK ? calloc(segs.n + 1, sizeof *tasks) : NULL;
    if (st == DI_OK && !tasks) st = di_error(DI_ERR_NOMEM, "tokenizer: out of memory (tasks)");
    c->segs = &segs;
    size_t i = 0;
    while (st == DI_OK && i < segs.n) {
        size_t n_tasks = plan(c, seg_size, segs.n, huge, &i, tasks);
        if (n_tasks) st = run_tasks(c, pool, tasks, n_tasks, run_segments, out);
        if (st == DI_OK && i < segs.n) {
            di_tok_segment *g = &segs.v[i++];
            st = encode_long_segment(c, pool, n_ws, g->norm ? segs.normtext.p + g->off : c->text + g->off, g->len, out);
        }
    }
    c->segs = NULL;
    free(tasks);
    free(segs.v);
    di_tok_buf_free(&segs.normtext);
    return st;
}

static di_status encode_parallel(const di_tokenizer *t, di_tok_ws **wss, int n_ws, di_threadpool *pool, const char *text,
                                 size_t len, unsigned flags, di_ids *out) {
    DI_TRY(di_tok_cut_raw(t, wss[0], text, len, flags));
    di_tok_splits raw = wss[0]->raw_splits; /* owned by wss[0]; nothing else touches raw_splits meanwhile */
    ectx c = {.t = t, .wss = wss, .text = text, .safe = di_tok_is_safe(t, flags), .raw = raw.v};
    atomic_init(&c.failed, 0);
    size_t huge = len / (2 * (size_t)n_ws);
    if (huge < PAR_MIN_BYTES) huge = PAR_MIN_BYTES;
    etask *tasks = calloc(raw.n + 1, sizeof *tasks);
    if (!tasks) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (tasks)");
    di_status st = DI_OK;
    size_t i = 0;
    while (st == DI_OK && i < raw.n) {
        size_t n_tasks = plan(&c, raw_size, raw.n, huge, &i, tasks);
        if (n_tasks) st = run_tasks(&c, pool, tasks, n_tasks, run_raw, out);
        if (st == DI_OK && i < raw.n) st = encode_huge_piece(&c, pool, n_ws, raw.v[i++], huge, out);
    }
    free(tasks);
    return st;
}

di_status di_tokenizer_encode_parallel(const di_tokenizer *t, const char *text, size_t len, unsigned flags,
                                       di_threadpool *pool, di_ids *out) {
    int n_ws = di_threadpool_size(pool);
    if (n_ws <= 1 || len < PAR_MIN_BYTES) return di_tokenizer_encode(t, text, len, flags, out);
    DI_TRY(check_input_parallel(text, len, flags, pool));
    di_tok_ws **wss = calloc((size_t)n_ws, sizeof *wss);
    if (!wss) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (workspaces)");
    di_status st = DI_OK;
    for (int i = 0; i < n_ws && st == DI_OK; i++)
        if (!(wss[i] = di_tok_ws_acquire(t))) st = di_error(DI_ERR_NOMEM, "tokenizer: out of memory (workspace)");
    size_t n0 = out->n;
    if (st == DI_OK) st = di_tok_wrap(t, flags, 1, out);
    if (st == DI_OK) st = encode_parallel(t, wss, n_ws, pool, text, len, flags, out);
    if (st == DI_OK) st = di_tok_wrap(t, flags, 0, out);
    if (st != DI_OK) out->n = n0;
    for (int i = 0; i < n_ws; i++) di_tok_ws_release(t, wss[i]);
    free(wss);
    return st;
}
