/* tok_pretok.c - pre-tokenizer stages over lists of pieces: Split (regex, with every HF
 * behavior and `invert`), Digits (char::is_numeric, isolated or contiguous), Whitespace,
 * WhitespaceSplit and the ByteLevel prefix space. The ByteLevel byte mapping itself happens in the BPE step.
 *
 * Each stage maps every input piece to sub-pieces exactly as HF's NormalizedString::split does:
 * the pattern's matches and the gaps between them cover the piece, `invert` swaps the two,
 * the behavior decides what is kept or merged, and empty pieces are dropped.
 *
 * Whitespace (runs of \\w / of [^\\w\\s], whitespace dropped) and WhitespaceSplit (whitespace
 * dropped) use the Rust regex / char::is_whitespace character sets HF uses.
 *
 * Segment-parallel mode (di_tok_pretokenize_parallel): pieces are processed in batches on the
 * thread pool, and a large piece is cut into chunks that are scanned concurrently. Each chunk
 * worker records its matches from the chunk start; a serial pass then stitches them: starting
 * from the true scan position e, a chunk's recorded match is reused when the chunk's own search
 * that found it began at or before e (no match can start in between, and an attempt at a
 * position does not depend on where the search began); otherwise the true scan searches from e
 * itself. The result is the serial match list exactly. Regexes that can match the empty string
 * or use \G are scanned serially.
 *
 * Invariants: offsets are relative to the segment buffer; a piece with DI_TOK_PIECE_SPACE has a
 * virtual ' ' before seg[off] and its length excludes that space. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "core/utf8.h"
#include "tokenizer/tok_internal.h"

#define PIECE_LEN(p) ((p).len & ~DI_TOK_PIECE_SPACE)
#define PIECE_SP(p) (((p).len & DI_TOK_PIECE_SPACE) != 0)


static di_status mlist_push(di_tok_mlist *m, size_t s, size_t e) {
    if (m->n + 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 512;
        uint32_t *v = realloc(m->v, cap * sizeof *v);
        if (!v) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (matches)");
        m->v = v;
        m->cap = cap;
    }
    m->v[m->n++] = (uint32_t)s;
    m->v[m->n++] = (uint32_t)e;
    return DI_OK;
}

static int char_pred(di_tok_char_pred pred, uint32_t cp) {
    if (pred == DI_TOK_PRED_NUMERIC) return (cp >= '0' && cp <= '9') || (cp >= 0x80 && di_tok_uc_is_numeric(cp));
    return cp == ' ' || (cp >= 9 && cp <= 13) || (cp >= 0x80 && di_tok_uc_is_whitespace(cp));
}

/* All matches of the stage's pattern in subj[from..to) (the subject is subj[0..n)). */
static di_status find_matches(const di_tok_stage *st, di_tok_ws *ws, const char *subj, size_t n, size_t from, size_t to,
                              di_tok_mlist *out) {
    if (st->kind == DI_TOK_ST_CHARS || st->kind == DI_TOK_ST_WORDS) {
        size_t i = from, run = 0;
        int run_class = 0; /* DI_TOK_ST_WORDS: 0 none, 1 word run, 2 other run */
        while (i < to) {
            uint32_t cp;
            int l = di_tok_utf8_next((const unsigned char *)subj + i, n - i, &cp);
            if (!l) { l = 1; cp = 0xFFFD; }
            if (st->kind == DI_TOK_ST_CHARS) {
                if (char_pred(st->pred, cp)) DI_TRY(mlist_push(out, i, i + (size_t)l));
            } else {
                int cls = char_pred(DI_TOK_PRED_WHITESPACE, cp) ? 0 : di_tok_uc_is_word(cp) ? 1 : 2;
                if (cls != run_class) {
                    if (run_class) DI_TRY(mlist_push(out, run, i));
                    run_class = cls;
                    run = i;
                }
            }
            i += (size_t)l;
        }
        if (st->kind == DI_TOK_ST_WORDS && run_class) DI_TRY(mlist_push(out, run, i));
        return DI_OK;
    }
    di_tok_find_iter it = {from, 0, 0};
    size_t ms, me;
    for (;;) {
        int r = di_tok_regex_next(st->re, &ws->match, subj, n, &it, &ms, &me);
        if (r < 0) return DI_ERR_INTERNAL;
        if (r == 0) break;
        DI_TRY(mlist_push(out, ms, me));
    }
    return DI_OK;
}

/* ---- behaviors ---- */

static di_status elist_push(di_tok_elist *l, size_t s, size_t e, int match) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 512;
        di_tok_entry *v = realloc(l->v, cap * sizeof *v);
        if (!v) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (splits)");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (di_tok_entry){(uint32_t)s, (uint32_t)e, (uint8_t)match};
    return DI_OK;
}

/* Maps a sub-range [a, b) of a subject back to a piece and appends it (empty ones dropped). */
static di_status emit(di_tok_pieces *out, di_tok_piece p, size_t a, size_t b) {
    if (b <= a) return DI_OK;
    if (!PIECE_SP(p)) return di_tok_pieces_push(out, p.off + (uint32_t)a, (uint32_t)(b - a));
    if (a == 0) return di_tok_pieces_push(out, p.off, (uint32_t)(b - 1) | DI_TOK_PIECE_SPACE);
    return di_tok_pieces_push(out, p.off + (uint32_t)(a - 1), (uint32_t)(b - a));
}

/* Applies HF's split behavior to the matches of piece p (subject length n) and emits pieces. */
static di_status apply_behavior(const di_tok_stage *st, const uint32_t *m, size_t nm, size_t n, di_tok_piece p,
                                di_tok_elist *tmp, di_tok_pieces *out) {
    int inv = st->invert;
    if (n == 0) return DI_OK; /* HF yields one empty split, which is dropped */
    if (st->behavior == DI_TOK_SPLIT_ISOLATED || st->behavior == DI_TOK_SPLIT_REMOVED) {
        int keep_match = st->behavior == DI_TOK_SPLIT_ISOLATED || inv; /* Removed drops "matches" */
        int keep_gap = st->behavior == DI_TOK_SPLIT_ISOLATED || !inv;
        size_t prev = 0;
        for (size_t i = 0; i < nm; i++) {
            size_t s = m[2 * i], e = m[2 * i + 1];
            if (prev != s && keep_gap) DI_TRY(emit(out, p, prev, s));
            if (keep_match) DI_TRY(emit(out, p, s, e));
            prev = e;
        }
        if (prev != n && keep_gap) DI_TRY(emit(out, p, prev, n));
        return DI_OK;
    }
    /* the covering list with match flags (after invert), empty matches included */
    tmp->n = 0;
    size_t prev = 0;
    for (size_t i = 0; i < nm; i++) {
        size_t s = m[2 * i], e = m[2 * i + 1];
        if (prev != s) DI_TRY(elist_push(tmp, prev, s, inv));
        DI_TRY(elist_push(tmp, s, e, !inv));
        prev = e;
    }
    if (prev != n) DI_TRY(elist_push(tmp, prev, n, inv));
    di_tok_entry *v = tmp->v;
    size_t k = 0; /* merged entries are compacted into v[0..k) */
    int previous = 0;
    if (st->behavior == DI_TOK_SPLIT_CONTIGUOUS) {
        for (size_t i = 0; i < tmp->n; i++) {
            if (v[i].match == previous && k > 0) v[k - 1].e = v[i].e;
            else v[k++] = v[i];
            previous = v[i].match;
        }
    } else if (st->behavior == DI_TOK_SPLIT_MERGED_PREV) {
        for (size_t i = 0; i < tmp->n; i++) {
            if (v[i].match && !previous && k > 0) v[k - 1].e = v[i].e;
            else v[k++] = v[i];
            previous = v[i].match;
        }
    } else { /* MergedWithNext: the same fold from the end */
        size_t w = tmp->n;
        for (size_t i = tmp->n; i-- > 0;) {
            if (v[i].match && !previous && w < tmp->n) v[w].s = v[i].s;
            else v[--w] = v[i];
            previous = v[i].match;
        }
        for (size_t i = w; i < tmp->n; i++) DI_TRY(emit(out, p, v[i].s, v[i].e));
        return DI_OK;
    }
    for (size_t i = 0; i < k; i++) DI_TRY(emit(out, p, v[i].s, v[i].e));
    return DI_OK;
}

/* The subject text of a piece: the segment itself, or " " + text for a virtual space. */
static di_status subject(di_tok_ws *ws, const char *seg, di_tok_piece p, const char **s, size_t *n) {
    size_t len = PIECE_LEN(p);
    if (!PIECE_SP(p)) {
        *s = seg + p.off;
        *n = len;
        return DI_OK;
    }
    ws->vspace.n = 0;
    DI_TRY(di_tok_buf_put(&ws->vspace, " ", 1));
    DI_TRY(di_tok_buf_put(&ws->vspace, seg + p.off, len));
    *s = ws->vspace.p;
    *n = len + 1;
    return DI_OK;
}

static di_status stage_piece(const di_tok_stage *st, di_tok_ws *ws, const char *seg, di_tok_piece p, di_tok_mlist *ml, di_tok_elist *el,
                             di_tok_pieces *out) {
    size_t len = PIECE_LEN(p);
    if (st->kind == DI_TOK_ST_PREFIX_SPACE) {
        if (!PIECE_SP(p) && len > 0 && seg[p.off] != ' ') p.len |= DI_TOK_PIECE_SPACE;
        return di_tok_pieces_push(out, p.off, p.len);
    }
    const char *s;
    size_t n;
    DI_TRY(subject(ws, seg, p, &s, &n));
    ml->n = 0;
    DI_TRY(find_matches(st, ws, s, n, 0, n, ml));
    return apply_behavior(st, ml->v, ml->n / 2, n, p, el, out);
}

di_status di_tok_stage_apply(const di_tok_stage *st, di_tok_ws *ws, const char *seg, const di_tok_piece *in, size_t n_in,
                          di_tok_pieces *out) {
    di_tok_mlist *ml = &ws->ml;
    di_tok_elist *el = &ws->el;
    for (size_t i = 0; i < n_in; i++) DI_TRY(stage_piece(st, ws, seg, in[i], ml, el, out));
    return DI_OK;
}


/* ================= segment-parallel pre-tokenization ================= */

/* work per task for lists of small pieces; pieces at least BIG_PIECE long are chunked
 * (tests lower both to put chunk boundaries everywhere) */
static atomic_size_t g_batch_bytes = 32u << 10, g_big_piece = 128u << 10;
#define BATCH_BYTES atomic_load_explicit(&g_batch_bytes, memory_order_relaxed)
#define BIG_PIECE atomic_load_explicit(&g_big_piece, memory_order_relaxed)

void di_tok_pretok_set_sizes(size_t batch_bytes, size_t big_piece) {
    atomic_store(&g_batch_bytes, batch_bytes ? batch_bytes : 32u << 10);
    atomic_store(&g_big_piece, big_piece >= 8 ? big_piece : 128u << 10);
}

typedef struct {
    int big;                 /* 0: pieces [lo, hi) of the input; 1: chunk [lo, hi) of a big piece */
    size_t lo, hi, piece;
    di_tok_pieces out;          /* small-piece batch result */
    di_tok_mlist m;                 /* chunk result: matches */
    di_status st;
} ptask;

typedef struct {
    const di_tok_stage *st;
    di_tok_ws **wss;
    const char *seg;
    const di_tok_piece *in;
    ptask *tasks;
    char err[512];
    atomic_int failed;
} pctx;

static void record_error(pctx *c, di_status st) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&c->failed, &expected, 1))
        snprintf(c->err, sizeof c->err, "%s", di_last_error());
    (void)st;
}

static void run_task(void *vctx, size_t i, int tid) {
    pctx *c = vctx;
    ptask *tk = &c->tasks[i];
    di_tok_ws *ws = c->wss[tid];
    if (atomic_load(&c->failed)) return;
    if (!tk->big) {
        tk->st = di_tok_stage_apply(c->st, ws, c->seg, c->in + tk->lo, tk->hi - tk->lo, &tk->out);
    } else {
        /* scan from the chunk start, stop at the first match starting at or after the chunk end */
        di_tok_piece p = c->in[tk->piece];
        const char *s = c->seg + p.off;
        size_t n = PIECE_LEN(p), pos = tk->lo;
        tk->st = DI_OK;
        if (c->st->kind == DI_TOK_ST_CHARS) {
            tk->st = find_matches(c->st, ws, s, n, tk->lo, tk->hi, &tk->m);
        } else {
            for (;;) {
                size_t ms, me;
                int r = di_tok_regex_search(c->st->re, &ws->match, s, n, pos, &ms, &me);
                if (r < 0) { tk->st = DI_ERR_INTERNAL; break; }
                if (r == 0 || ms >= tk->hi) break;
                if ((tk->st = mlist_push(&tk->m, ms, me)) != DI_OK) break;
                pos = me;
            }
        }
    }
    if (tk->st != DI_OK) record_error(c, tk->st);
}

/* Stitches the chunk scans of one big piece into its exact serial match list (see top). */
static di_status stitch(const di_tok_stage *st, di_tok_ws *ws, const char *s, size_t n, ptask *chunks, size_t k,
                        di_tok_mlist *out) {
    out->n = 0;
    if (st->kind == DI_TOK_ST_CHARS) { /* per-character matches: concatenation is exact */
        for (size_t j = 0; j < k; j++)
            for (size_t i = 0; i + 1 < chunks[j].m.n; i += 2) DI_TRY(mlist_push(out, chunks[j].m.v[i], chunks[j].m.v[i + 1]));
        return DI_OK;
    }
    size_t e = 0, j = 0;
    while (e < n) {
        while (j + 1 < k && chunks[j + 1].lo <= e) j++;
        ptask *c = &chunks[j];
        const uint32_t *m = c->m.v;
        size_t cnt = c->m.n / 2;
        /* first recorded match starting at or after e */
        size_t lo = 0, hi = cnt;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (m[2 * mid] < e) lo = mid + 1;
            else hi = mid;
        }
        size_t searched_from = lo == 0 ? c->lo : m[2 * (lo - 1) + 1];
        if (searched_from <= e) {
            if (lo < cnt) { /* the true scan finds exactly this chunk's remaining matches */
                for (size_t i = lo; i < cnt; i++) DI_TRY(mlist_push(out, m[2 * i], m[2 * i + 1]));
                e = m[2 * cnt - 1];
            }
            /* no match starts in [e, chunk end): continue from the next chunk's start */
            if (j + 1 < k) { if (chunks[j + 1].lo > e) e = chunks[j + 1].lo; }
            else break;
            continue;
        }
        /* e lies inside a match this chunk found from a wrong start: search from e itself */
        size_t ms, me;
        int r = di_tok_regex_search(st->re, &ws->match, s, n, e, &ms, &me);
        if (r < 0) return DI_ERR_INTERNAL;
        if (r == 0) break;
        DI_TRY(mlist_push(out, ms, me));
        e = me;
    }
    return DI_OK;
}

static size_t char_start(const char *s, size_t pos) {
    while (pos > 0 && ((unsigned char)s[pos] & 0xc0) == 0x80) pos--;
    return pos;
}

static di_status stage_parallel(const di_tok_stage *st, di_tok_ws **wss, int n_ws, di_threadpool *pool, const char *seg,
                                const di_tok_pieces *in, di_tok_pieces *out) {
    if (st->kind == DI_TOK_ST_PREFIX_SPACE) return di_tok_stage_apply(st, wss[0], seg, in->v, in->n, out);
    int chunkable = st->kind == DI_TOK_ST_CHARS ||
                    (st->kind == DI_TOK_ST_SPLIT && !st->re->can_be_empty && !st->re->anchored_g);
#define IS_BIG(p) (chunkable && PIECE_LEN(p) >= BIG_PIECE && !PIECE_SP(p))
    /* plan tasks */
    size_t n_tasks = 0, cap = 64;
    ptask *tasks = calloc(cap, sizeof *tasks);
    if (!tasks) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (tasks)");
    di_status rc = DI_OK;
    size_t i = 0;
    while (i < in->n && rc == DI_OK) {
        size_t len = PIECE_LEN(in->v[i]);
        int big = IS_BIG(in->v[i]);
        size_t chunk = 0, need = 1;
        if (big) {
            chunk = len / ((size_t)n_ws * 4);
            if (chunk < BIG_PIECE / 4) chunk = BIG_PIECE / 4;
            need = (len + chunk - 1) / chunk;
        }
        if (n_tasks + need > cap) {
            while (n_tasks + need > cap) cap *= 2;
            ptask *v = realloc(tasks, cap * sizeof *v);
            if (!v) { rc = di_error(DI_ERR_NOMEM, "tokenizer: out of memory (tasks)"); break; }
            tasks = v;
        }
        if (big) { /* chunks of one big piece, cut at character starts */
            const char *s = seg + in->v[i].off;
            size_t a = 0;
            for (size_t q = 0; q < need; q++) {
                size_t b = q + 1 == need ? len : char_start(s, (q + 1) * chunk);
                if (b <= a) continue;
                tasks[n_tasks++] = (ptask){.big = 1, .piece = i, .lo = a, .hi = b};
                a = b;
            }
            i++;
            continue;
        }
        size_t lo = i, bytes = 0;
        while (i < in->n && bytes < BATCH_BYTES && !IS_BIG(in->v[i])) bytes += PIECE_LEN(in->v[i++]) + 1;
        tasks[n_tasks++] = (ptask){.big = 0, .lo = lo, .hi = i};
    }
    if (rc == DI_OK) {
        pctx c = {.st = st, .wss = wss, .seg = seg, .in = in->v, .tasks = tasks};
        atomic_init(&c.failed, 0);
        di_threadpool_run(pool, n_tasks, run_task, &c);
        if (atomic_load(&c.failed)) rc = di_error(DI_ERR_INTERNAL, "%s", c.err);
    }
    /* gather in order */
    di_tok_mlist *ml = &wss[0]->ml;
    di_tok_elist *el = &wss[0]->el;
    for (size_t t = 0; t < n_tasks && rc == DI_OK; t++) {
        if (!tasks[t].big) {
            for (size_t q = 0; q < tasks[t].out.n && rc == DI_OK; q++)
                rc = di_tok_pieces_push(out, tasks[t].out.v[q].off, tasks[t].out.v[q].len);
            continue;
        }
        size_t u = t;
        while (u < n_tasks && tasks[u].big && tasks[u].piece == tasks[t].piece) u++;
        di_tok_piece p = in->v[tasks[t].piece];
        rc = stitch(st, wss[0], seg + p.off, PIECE_LEN(p), tasks + t, u - t, ml);
        if (rc == DI_OK) rc = apply_behavior(st, ml->v, ml->n / 2, PIECE_LEN(p), p, el, out);
        t = u - 1;
    }
    for (size_t t = 0; t < n_tasks; t++) {
        free(tasks[t].out.v);
        free(tasks[t].m.v);
    }
    free(tasks);
    return rc;
}

/* The pipeline over one segment: each stage maps the previous stage's pieces (at first the whole
 * segment), ping-ponging between wss[0]'s two piece lists; with a pool, stage_parallel. */
static di_status run_stages(const di_tokenizer *t, di_tok_ws **wss, int n_ws, di_threadpool *pool, const char *seg,
                            size_t n, di_tok_pieces **out) {
    di_tok_ws *ws = wss[0];
    di_tok_pieces *a = &ws->pa, *b = &ws->pb;
    a->n = 0;
    if (n > 0x7fffffff) return di_error(DI_ERR_UNSUPPORTED, "tokenizer: text segment longer than 2 GB");
    if (n) DI_TRY(di_tok_pieces_push(a, 0, (uint32_t)n));
    for (size_t i = 0; i < t->n_stages; i++) {
        b->n = 0;
        DI_TRY(pool ? stage_parallel(&t->stages[i], wss, n_ws, pool, seg, a, b)
                    : di_tok_stage_apply(&t->stages[i], ws, seg, a->v, a->n, b));
        di_tok_pieces *x = a; a = b; b = x;
    }
    *out = a;
    return DI_OK;
}

di_status di_tok_pretokenize(const di_tokenizer *t, di_tok_ws *ws, const char *seg, size_t n, di_tok_pieces **out) {
    return run_stages(t, &ws, 1, NULL, seg, n, out);
}

di_status di_tok_pretokenize_parallel(const di_tokenizer *t, di_tok_ws **wss, int n_ws, di_threadpool *pool,
                                   const char *seg, size_t n, di_tok_pieces **out) {
    return run_stages(t, wss, n_ws, pool, seg, n, out);
}
