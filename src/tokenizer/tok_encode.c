/* tok_encode.c - text -> ids: the HF encode pipeline (serial; see tok_encode_parallel.c).
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
 * The building blocks (cut at raw added tokens, normalize + cut at normalized added tokens,
 * encode text segments) are shared with the segment-parallel encoder (tok_encode_parallel.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

di_status di_tok_ids_append(di_ids *dst, const int32_t *src, size_t n) {
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
size_t di_tok_utf8_first_invalid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (!(w & 0x8080808080808080ull)) { i += 8; continue; }
        }
        uint32_t cp;
        int l = di_tok_utf8_next(p + i, n - i, &cp);
        if (!l) return i;
        i += (size_t)l;
    }
    return n;
}

di_status di_tok_check_flags(const char *text, size_t len, unsigned flags) {
    if (flags & ~(unsigned)(DI_TOK_SAFE | DI_TOK_ADD_SPECIAL))
        return di_error(DI_ERR_INVALID_ARG, "tokenizer: unknown encode flags 0x%x", flags);
    if (!text && len) return di_error(DI_ERR_INVALID_ARG, "tokenizer: NULL text with length %zu", len);
    return DI_OK;
}

di_status di_tok_utf8_error(const char *text, size_t bad) {
    return di_error(DI_ERR_FORMAT, "tokenizer: input is not valid UTF-8: invalid byte 0x%02x at byte offset %zu",
                    (unsigned char)text[bad], bad);
}

di_status di_tok_check_input(const char *text, size_t len, unsigned flags) {
    DI_TRY(di_tok_check_flags(text, len, flags));
    size_t bad = len ? di_tok_utf8_first_invalid(text, len) : 0;
    return bad < len ? di_tok_utf8_error(text, bad) : DI_OK;
}

/* One text segment (no added tokens in it): pre-tokenize, then BPE each piece. */
di_status di_tok_encode_segment(const di_tokenizer *t, di_tok_ws *ws, const char *seg, size_t n, di_ids *out) {
    di_tok_pieces *pieces;
    DI_TRY(di_tok_pretokenize(t, ws, seg, n, &pieces));
    for (size_t i = 0; i < pieces->n; i++) DI_TRY(di_tok_bpe_piece(t, ws, seg, pieces->v[i], out));
    return DI_OK;
}

/* ---- segments: the text cut at added tokens ---- */
di_status di_tok_seg_push(di_tok_segments *s, int32_t token, int norm, size_t off, size_t len) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        di_tok_segment *v = realloc(s->v, cap * sizeof *v);
        if (!v) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (segments)");
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (di_tok_segment){token, norm, off, len};
    return DI_OK;
}

int di_tok_is_safe(const di_tokenizer *t, unsigned flags) { return (flags & DI_TOK_SAFE) || t->n_added == 0; }

/* Step 1 of HF's extract_and_normalize: added tokens with normalized=false, on the raw text
 * (safe mode: none - the whole text is one piece). */
di_status di_tok_cut_raw(const di_tokenizer *t, di_tok_ws *ws, const char *text, size_t len, unsigned flags) {
    di_tok_splits *raw = &ws->raw_splits;
    raw->n = 0;
    return di_tok_added_split(t, di_tok_is_safe(t, flags) ? &t->empty_trie : &t->raw_trie, text, len, raw);
}

/* Step 2 on text that is already normalized (at normtext offset `base` when norm = 1, else at
 * input offset `base`): added tokens with normalized=true. */
di_status di_tok_cut_normalized(const di_tokenizer *t, di_tok_ws *ws, const char *s, size_t n, int norm, size_t base, int safe,
                             di_tok_segments *out) {
    if (safe || t->norm_trie.count == 0) return n ? di_tok_seg_push(out, -1, norm, base, n) : DI_OK;
    di_tok_splits *ns = &ws->norm_splits;
    ns->n = 0;
    DI_TRY(di_tok_added_split(t, &t->norm_trie, s, n, ns));
    for (size_t k = 0; k < ns->n; k++) {
        if (ns->v[k].token >= 0) DI_TRY(di_tok_seg_push(out, t->added[ns->v[k].token].id, 0, 0, 0));
        else DI_TRY(di_tok_seg_push(out, -1, norm, base + ns->v[k].off, ns->v[k].len));
    }
    return DI_OK;
}

/* Step 2 for one raw split: the added token itself, or the normalized text cut at normalized
 * added tokens. Normalized text goes to out->normtext. */
di_status di_tok_cut_piece(const di_tokenizer *t, di_tok_ws *ws, const char *text, di_tok_split sp, int safe, di_tok_segments *out) {
    if (sp.token >= 0) return di_tok_seg_push(out, t->added[sp.token].id, 0, 0, 0);
    if (t->n_norms == 0) return di_tok_cut_normalized(t, ws, text + sp.off, sp.len, 0, sp.off, safe, out);
    DI_TRY(di_tok_normalize(t, text + sp.off, sp.len, ws, &ws->norm));
    size_t base = out->normtext.n;
    DI_TRY(di_tok_buf_put(&out->normtext, ws->norm.p, ws->norm.n));
    return di_tok_cut_normalized(t, ws, out->normtext.p + base, ws->norm.n, 1, base, safe, out);
}

/* Encodes segments [lo, hi) of segs (text from `text` or segs->normtext). */
di_status di_tok_encode_segments(const di_tokenizer *t, di_tok_ws *ws, const di_tok_segments *segs, size_t lo, size_t hi,
                              const char *text, di_ids *out) {
    for (size_t i = lo; i < hi; i++) {
        const di_tok_segment *g = &segs->v[i];
        if (g->token >= 0) DI_TRY(di_ids_push(out, g->token));
        else DI_TRY(di_tok_encode_segment(t, ws, g->norm ? segs->normtext.p + g->off : text + g->off, g->len, out));
    }
    return DI_OK;
}

/* Encodes raw splits [lo, hi) of `raw` one by one (each normalized and cut on its own). */
di_status di_tok_encode_raw(const di_tokenizer *t, di_tok_ws *ws, const di_tok_split *raw, size_t lo, size_t hi, const char *text,
                         int safe, di_ids *out) {
    for (size_t i = lo; i < hi; i++) {
        ws->segs.n = 0;
        ws->segs.normtext.n = 0;
        DI_TRY(di_tok_cut_piece(t, ws, text, raw[i], safe, &ws->segs));
        DI_TRY(di_tok_encode_segments(t, ws, &ws->segs, 0, ws->segs.n, text, out));
    }
    return DI_OK;
}

static di_status encode_serial(const di_tokenizer *t, di_tok_ws *ws, const char *text, size_t len, unsigned flags,
                               di_ids *out) {
    DI_TRY(di_tok_cut_raw(t, ws, text, len, flags));
    return di_tok_encode_raw(t, ws, ws->raw_splits.v, 0, ws->raw_splits.n, text, di_tok_is_safe(t, flags), out);
}

di_status di_tok_wrap(const di_tokenizer *t, unsigned flags, int pre, di_ids *out) {
    if (!(flags & DI_TOK_ADD_SPECIAL)) return DI_OK;
    return pre ? di_tok_ids_append(out, t->pre_ids, t->n_pre) : di_tok_ids_append(out, t->post_ids, t->n_post);
}

di_status di_tokenizer_encode(const di_tokenizer *t, const char *text, size_t len, unsigned flags, di_ids *out) {
    DI_TRY(di_tok_check_input(text, len, flags));
    di_tok_ws *ws = di_tok_ws_acquire(t);
    if (!ws) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (workspace)");
    size_t n0 = out->n;
    di_status st = di_tok_wrap(t, flags, 1, out);
    if (st == DI_OK) st = encode_serial(t, ws, text, len, flags, out);
    if (st == DI_OK) st = di_tok_wrap(t, flags, 0, out);
    if (st != DI_OK) out->n = n0;
    di_tok_ws_release(t, ws);
    return st;
}

