/* tok_decode.c - ids -> text, whole or streamed, as HF `Tokenizer::decode` does it.
 *
 * HF drops ids that have no token, drops special tokens when asked, then decodes:
 *   ByteLevel decoder: each token's characters map back to bytes (a token with a character
 *     outside the byte alphabet, e.g. "<｜User｜>", contributes its UTF-8 as is); the bytes of
 *     all tokens are concatenated and converted with String::from_utf8_lossy, which replaces
 *     each maximal invalid subsequence by one U+FFFD;
 *   no decoder: the token strings joined with " ".
 * The streaming detokenizer applies the same lossy conversion incrementally: complete
 * characters and subsequences already known to be invalid are emitted, a trailing sequence
 * that may still complete is held back. Hence concat(push outputs) + flush == decode(all). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

/* Length of the valid UTF-8 character at s[0..n), 0 if invalid; *prefix receives the length of
 * the longest valid prefix of a (possibly truncated) sequence (>= 1). *incomplete is set when
 * the sequence is a valid prefix cut short by the end of the buffer. */
static int utf8_step(const unsigned char *s, size_t n, int *prefix, int *incomplete) {
    unsigned b0 = s[0];
    *incomplete = 0;
    *prefix = 1;
    if (b0 < 0x80) return 1;
    int width;
    unsigned lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) width = 2;
    else if (b0 == 0xE0) { width = 3; lo = 0xA0; }
    else if (b0 == 0xED) { width = 3; hi = 0x9F; }
    else if (b0 >= 0xE1 && b0 <= 0xEF) width = 3;
    else if (b0 == 0xF0) { width = 4; lo = 0x90; }
    else if (b0 == 0xF4) { width = 4; hi = 0x8F; }
    else if (b0 >= 0xF1 && b0 <= 0xF3) width = 4;
    else return 0;
    for (int k = 1; k < width; k++) {
        if ((size_t)k >= n) { *prefix = k; *incomplete = 1; return 0; }
        unsigned b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) { *prefix = k; return 0; }
    }
    return width;
}

/* Converts in[0..n) lossily, appending to out. Without `final`, a trailing incomplete sequence
 * is left unconsumed; returns the number of bytes consumed. */
static di_status lossy(const char *in, size_t n, int final, di_tok_buf *out, size_t *consumed) {
    const unsigned char *s = (const unsigned char *)in;
    size_t i = 0, run = 0;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        int prefix, incomplete;
        int w = utf8_step(s + i, n - i, &prefix, &incomplete);
        if (w) { i += (size_t)w; continue; }
        DI_TRY(di_tok_buf_put(out, in + run, i - run));
        if (incomplete && !final) { *consumed = i; return DI_OK; }
        DI_TRY(di_tok_buf_put(out, REPL, 3));
        i += (size_t)prefix;
        run = i;
    }
    DI_TRY(di_tok_buf_put(out, in + run, n - run));
    *consumed = n;
    return DI_OK;
}

static int keep(const di_tokenizer *t, int32_t id, unsigned flags) {
    if (id < 0 || (uint32_t)id >= t->n_ids || t->str_len[id] == UINT32_MAX) return 0;
    if ((flags & DI_TOK_SKIP_SPECIAL) && (t->id_flags[id] & DI_TOK_ID_SPECIAL)) return 0;
    return 1;
}

di_status di_tokenizer_decode(const di_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **text,
                              size_t *len) {
    di_tok_buf raw = {0}, out = {0};
    di_status st = di_tok_buf_reserve(&raw, n * 4);
    int first = 1;
    for (size_t i = 0; i < n && st == DI_OK; i++) {
        int32_t id = ids[i];
        if (!keep(t, id, flags)) continue;
        if (t->decoder == DI_TOK_DEC_BYTELEVEL) {
            st = di_tok_buf_put(&raw, t->dec_blob + t->dec_off[id], t->dec_len[id]);
        } else {
            if (!first) st = di_tok_buf_put(&raw, " ", 1);
            if (st == DI_OK) st = di_tok_buf_put(&raw, t->str_blob + t->str_off[id], t->str_len[id]);
        }
        first = 0;
    }
    if (st == DI_OK && t->decoder == DI_TOK_DEC_BYTELEVEL) {
        size_t used;
        st = di_tok_buf_reserve(&out, raw.n + 8);
        if (st == DI_OK) st = lossy(raw.p, raw.n, 1, &out, &used);
        di_tok_buf_free(&raw);
        raw = out;
    }
    if (st == DI_OK && !raw.p) st = di_tok_buf_put(&raw, "", 0);
    if (st != DI_OK) { di_tok_buf_free(&raw); return st; }
    *text = raw.p;
    if (len) *len = raw.n;
    return DI_OK;
}

/* ---- streaming ---- */
struct di_detok {
    const di_tokenizer *t;
    unsigned flags;
    di_tok_buf pending; /* bytes of an incomplete character */
    di_tok_buf conv;
    int first;
};

di_detok *di_detok_create(const di_tokenizer *t, unsigned flags) {
    di_detok *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->t = t;
    d->flags = flags;
    d->first = 1;
    return d;
}

void di_detok_free(di_detok *d) {
    if (!d) return;
    di_tok_buf_free(&d->pending);
    di_tok_buf_free(&d->conv);
    free(d);
}

static di_status append_out(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (!*buf || *len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *len + n + 1) c *= 2;
        char *p = realloc(*buf, c);
        if (!p) return di_error(DI_ERR_NOMEM, "detokenizer: out of memory");
        *buf = p;
        *cap = c;
    }
    if (n) memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return DI_OK;
}

static di_status drain(di_detok *d, int final, char **buf, size_t *len, size_t *cap) {
    size_t used = 0;
    d->conv.n = 0;
    DI_TRY(lossy(d->pending.p ? d->pending.p : "", d->pending.n, final, &d->conv, &used));
    memmove(d->pending.p, d->pending.p + used, d->pending.n - used);
    d->pending.n -= used;
    return append_out(buf, len, cap, d->conv.p ? d->conv.p : "", d->conv.n);
}

di_status di_detok_push(di_detok *d, int32_t id, char **buf, size_t *len, size_t *cap) {
    const di_tokenizer *t = d->t;
    if (!keep(t, id, d->flags)) return append_out(buf, len, cap, "", 0);
    if (t->decoder != DI_TOK_DEC_BYTELEVEL) {
        if (!d->first) DI_TRY(append_out(buf, len, cap, " ", 1));
        d->first = 0;
        return append_out(buf, len, cap, t->str_blob + t->str_off[id], t->str_len[id]);
    }
    d->first = 0;
    DI_TRY(di_tok_buf_put(&d->pending, t->dec_blob + t->dec_off[id], t->dec_len[id]));
    return drain(d, 0, buf, len, cap);
}

di_status di_detok_flush(di_detok *d, char **buf, size_t *len, size_t *cap) {
    if (d->pending.n == 0) return append_out(buf, len, cap, "", 0);
    return drain(d, 1, buf, len, cap);
}
