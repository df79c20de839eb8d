/* tok_normalize.c - HF normalizers: NFC, NFD, NFKC, NFKD (utf8proc), Lowercase (Rust
 * char::to_lowercase per character), Replace (regex or literal), Prepend, Strip, and Sequence
 * (the list in di_tokenizer.norms, applied in order).
 *
 * Unicode versions: HF's normalization tables are older than utf8proc's. Code points HF's
 * tables do not know (di_tok_uc_norm_opaque) are left untouched by HF, which makes them act as
 * starters that compose with nothing; we copy them through and normalize the runs between
 * them, which gives HF's result. Text is normalized in units that start at a "boundary"
 * character (see boundary()); units of one unchanged character (most of ASCII, CJK, ...) are
 * copied without calling utf8proc.
 *
 * Invariant: input and output are valid UTF-8; the output buffer is replaced. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/utf8.h"
#include "tokenizer/tok_internal.h"

static int is_hangul(uint32_t cp) {
    return (cp >= 0x1100 && cp <= 0x11FF) || (cp >= 0xA960 && cp <= 0xA97F) || (cp >= 0xAC00 && cp <= 0xD7FF);
}

/* A "boundary" character starts a new normalization unit: combining class 0, no (canonical or
 * compatibility) decomposition, and never the second character of a composition. Nothing
 * before it can combine with it or move past it, so NFx(a + b) = NFx(a) + NFx(b) when b starts
 * with one. Hangul is composed algorithmically: treat it all as non-boundary. */
static int boundary(uint32_t cp) {
    if (cp < 0x80) return 1;
    if (is_hangul(cp)) return 0;
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
    return p->combining_class == 0 && p->decomp_seqindex == UINT16_MAX &&
           (p->comb_index == UINT16_MAX || p->comb_index < 0x8000);
}

/* Normalizes one run without opaque code points, appending to out. */
static di_status unicode_run(const char *s, size_t n, int opts, di_tok_buf *tmp, di_tok_buf *out) {
    if (n == 0) return DI_OK;
    utf8proc_ssize_t need = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, NULL, 0,
                                               (utf8proc_option_t)opts);
    if (need < 0) return di_error(DI_ERR_INTERNAL, "tokenizer: utf8proc: %s", utf8proc_errmsg(need));
    tmp->n = 0;
    DI_TRY(di_tok_buf_reserve(tmp, ((size_t)need + 1) * sizeof(utf8proc_int32_t)));
    utf8proc_int32_t *buf = (utf8proc_int32_t *)(void *)tmp->p;
    utf8proc_ssize_t got = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, buf, need,
                                              (utf8proc_option_t)opts);
    if (got < 0 || got > need) return di_error(DI_ERR_INTERNAL, "tokenizer: utf8proc decompose failed");
    utf8proc_ssize_t len = utf8proc_reencode(buf, got, (utf8proc_option_t)opts);
    if (len < 0) return di_error(DI_ERR_INTERNAL, "tokenizer: utf8proc: %s", utf8proc_errmsg(len));
    return di_tok_buf_put(out, tmp->p, (size_t)len);
}

static di_status unicode_norm(di_tok_norm_kind kind, const char *s, size_t n, di_tok_buf *tmp, di_tok_buf *out) {
    int opts = UTF8PROC_STABLE;
    switch (kind) {
    case DI_TOK_NORM_NFC: opts |= UTF8PROC_COMPOSE; break;
    case DI_TOK_NORM_NFD: opts |= UTF8PROC_DECOMPOSE; break;
    case DI_TOK_NORM_NFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    /* A boundary character followed by another boundary character (or the end) is unchanged
     * and is copied; everything else is normalized by utf8proc one unit at a time, a unit being
     * a boundary character (or the start) and the non-boundary characters after it.
     * HF-opaque code points are copied as they are and end a unit (HF sees them as starters
     * that compose with nothing). */
    out->n = 0;
    DI_TRY(di_tok_buf_reserve(out, n));
    size_t i = 0;
    while (i < n) {
        uint32_t cp, nx = 0;
        int l = di_tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (!l) return di_error(DI_ERR_INTERNAL, "tokenizer: invalid UTF-8 reached the normalizer");
        int opaque = cp >= 0x80 && di_tok_uc_norm_opaque(cp);
        int b = opaque || boundary(cp);
        size_t j = i + (size_t)l;
        int ln = j < n ? di_tok_utf8_next((const unsigned char *)s + j, n - j, &nx) : 0;
        if (b && (opaque || !ln || di_tok_uc_norm_opaque(nx) || boundary(nx))) { /* unchanged */
            DI_TRY(di_tok_buf_put(out, s + i, (size_t)l));
            i = j;
            continue;
        }
        /* a unit: this character and the non-boundary characters after it */
        while (j < n) {
            int lj = di_tok_utf8_next((const unsigned char *)s + j, n - j, &nx);
            if (!lj) return di_error(DI_ERR_INTERNAL, "tokenizer: invalid UTF-8 reached the normalizer");
            if (di_tok_uc_norm_opaque(nx) || boundary(nx)) break;
            j += (size_t)lj;
        }
        DI_TRY(unicode_run(s + i, j - i, opts, tmp, out));
        i = j;
    }
    return DI_OK;
}

static di_status lowercase(const char *s, size_t n, di_tok_buf *out) {
    out->n = 0;
    DI_TRY(di_tok_buf_reserve(out, n));
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            char l = (char)((c >= 'A' && c <= 'Z') ? c + 32 : c);
            DI_TRY(di_tok_buf_put(out, &l, 1));
            i++;
            continue;
        }
        uint32_t cp, m[3];
        int l = di_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!l) return di_error(DI_ERR_INTERNAL, "tokenizer: invalid UTF-8 reached the normalizer");
        int k = di_tok_uc_lower_exception(cp, m);
        if (k < 0) { m[0] = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp); k = 1; }
        for (int j = 0; j < k; j++) {
            char enc[4];
            int e = di_utf8_encode(m[j], enc);
            DI_TRY(di_tok_buf_put(out, enc, (size_t)e));
        }
        i += (size_t)l;
    }
    if (!out->p) DI_TRY(di_tok_buf_put(out, "", 0));
    return DI_OK;
}

static di_status replace(const di_tok_norm *nz, di_tok_match *m, const char *s, size_t n, di_tok_buf *out) {
    out->n = 0;
    DI_TRY(di_tok_buf_reserve(out, n));
    di_tok_find_iter it = {0};
    size_t prev = 0, ms, me;
    for (;;) {
        int r = di_tok_regex_next(nz->re, m, s, n, &it, &ms, &me);
        if (r < 0) return DI_ERR_INTERNAL;
        if (r == 0) break;
        DI_TRY(di_tok_buf_put(out, s + prev, ms - prev));
        DI_TRY(di_tok_buf_put(out, nz->str, nz->str_len));
        prev = me;
    }
    return di_tok_buf_put(out, s + prev, n - prev);
}

static di_status strip(const di_tok_norm *nz, const char *s, size_t n, di_tok_buf *out) {
    size_t a = 0, b = n;
    if (nz->left) {
        while (a < b) {
            uint32_t cp;
            int l = di_utf8_decode((const unsigned char *)s + a, b - a, &cp);
            if (!l || !di_tok_uc_is_whitespace(cp)) break;
            a += (size_t)l;
        }
    }
    if (nz->right) {
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)s[k] & 0xc0) == 0x80) k--;
            uint32_t cp;
            int l = di_utf8_decode((const unsigned char *)s + k, b - k, &cp);
            if (!l || !di_tok_uc_is_whitespace(cp)) break;
            b = k;
        }
    }
    out->n = 0;
    return di_tok_buf_put(out, s + a, b - a);
}

static di_status apply_one(const di_tok_norm *nz, di_tok_ws *ws, const char *s, size_t n, di_tok_buf *out) {
    switch (nz->kind) {
    case DI_TOK_NORM_NFC: case DI_TOK_NORM_NFD: case DI_TOK_NORM_NFKC: case DI_TOK_NORM_NFKD:
        return unicode_norm(nz->kind, s, n, &ws->tmp, out);
    case DI_TOK_NORM_LOWERCASE: return lowercase(s, n, out);
    case DI_TOK_NORM_REPLACE: return replace(nz, &ws->match, s, n, out);
    case DI_TOK_NORM_PREPEND:
        out->n = 0;
        if (n) DI_TRY(di_tok_buf_put(out, nz->str, nz->str_len));
        return di_tok_buf_put(out, s, n);
    case DI_TOK_NORM_STRIP: return strip(nz, s, n, out);
    }
    return di_error(DI_ERR_INTERNAL, "tokenizer: unknown normalizer");
}

di_status di_tok_normalize(const di_tokenizer *t, const char *s, size_t n, di_tok_ws *ws, di_tok_buf *out) {
    di_tok_buf *bufs[2] = {out, &ws->norm2};
    /* with an even count the chain must end in `out`: start in the scratch buffer */
    int cur = t->n_norms % 2 == 0 ? 1 : 0;
    const char *src = s;
    size_t len = n;
    if (t->n_norms == 0) {
        out->n = 0;
        return di_tok_buf_put(out, s, n);
    }
    for (size_t i = 0; i < t->n_norms; i++) {
        di_tok_buf *dst = bufs[cur];
        DI_TRY(apply_one(&t->norms[i], ws, src, len, dst));
        src = dst->p;
        len = dst->n;
        cur ^= 1;
    }
    return DI_OK;
}

/* ---- on a thread pool ---- */
typedef struct {
    const di_tokenizer *t;
    di_tok_ws **wss;
    const char *s;
    const size_t *cut; /* chunk k = s[cut[k], cut[k + 1]) */
    di_tok_buf *outs;
    di_status *st;
} nctx;

static void norm_chunk(void *vc, size_t k, int tid) {
    nctx *c = vc;
    c->st[k] = di_tok_normalize(c->t, c->s + c->cut[k], c->cut[k + 1] - c->cut[k], c->wss[tid], &c->outs[k]);
}

/* Whether NFx(a + b) = NFx(a) + NFx(b) (or the same for Lowercase) when b starts at s[i]. */
static int safe_cut(const di_tokenizer *t, const char *s, size_t n, size_t i) {
    if (i >= n) return 1;
    if (((unsigned char)s[i] & 0xc0) == 0x80) return 0;
    if (t->norms[0].kind == DI_TOK_NORM_LOWERCASE) return 1;
    uint32_t cp;
    if (!di_tok_utf8_next((const unsigned char *)s + i, n - i, &cp)) return 0;
    return di_tok_uc_norm_opaque(cp) || boundary(cp);
}

di_status di_tok_normalize_parallel(const di_tokenizer *t, di_tok_ws **wss, int n_ws, di_threadpool *pool, const char *s,
                                 size_t n, di_tok_buf *out) {
    /* chunking is exact for one Unicode normalization form or Lowercase alone */
    int chunkable = t->n_norms == 1 && t->norms[0].kind != DI_TOK_NORM_REPLACE && t->norms[0].kind != DI_TOK_NORM_PREPEND &&
                    t->norms[0].kind != DI_TOK_NORM_STRIP;
    size_t k = (size_t)n_ws * 4;
    if (!chunkable || n_ws < 2 || n < k * 4096) return di_tok_normalize(t, s, n, wss[0], out);
    size_t *cut = malloc((k + 1) * sizeof *cut);
    di_tok_buf *outs = calloc(k, sizeof *outs);
    di_status *st = calloc(k, sizeof *st);
    di_status rc = cut && outs && st ? DI_OK : di_error(DI_ERR_NOMEM, "tokenizer: out of memory");
    if (rc == DI_OK) {
        cut[0] = 0;
        for (size_t i = 1; i < k; i++) {
            size_t p = i * (n / k);
            if (p < cut[i - 1]) p = cut[i - 1];
            while (p < n && !safe_cut(t, s, n, p)) p++;
            cut[i] = p;
        }
        cut[k] = n;
        nctx c = {t, wss, s, cut, outs, st};
        di_threadpool_run(pool, k, norm_chunk, &c);
        out->n = 0;
        for (size_t i = 0; i < k && rc == DI_OK; i++) rc = st[i];
        for (size_t i = 0; i < k && rc == DI_OK; i++) rc = di_tok_buf_put(out, outs[i].p ? outs[i].p : "", outs[i].n);
    }
    for (size_t i = 0; outs && i < k; i++) di_tok_buf_free(&outs[i]);
    free(outs);
    free(cut);
    free(st);
    return rc;
}
