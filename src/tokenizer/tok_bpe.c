/* tok_bpe.c - the BPE model: one pre-token -> ids, as HF `BPE::tokenize` does it.
 *
 * 1. ignore_merges: a pre-token that is itself in the vocab is emitted as that one token.
 * 2. Initial symbols: one per character of the pre-token (for byte-level tokenizers: one per
 *    byte, whose symbol is the byte's alphabet character), with continuing_subword_prefix on
 *    all but the first and end_of_word_suffix on the last; characters missing from the vocab
 *    become byte_fallback tokens "<0xNN>" when all exist, else unk_token (fused when fuse_unk),
 *    else are dropped.
 * 3. Merges: repeatedly merge the adjacent pair with the lowest rank, leftmost first. Short
 *    words use a linear scan over cached pair ranks; long ones a binary heap keyed by
 *    (rank, position) with lazy invalidation - both give the same result.
 * A per-workspace word cache maps short pre-tokens (bytes + virtual-space flag) to their ids;
 * it is cleared when full, so the hot path does no allocation once warm. */
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/utf8.h"
#include "tokenizer/tok_internal.h"

#define CACHE_MAX_KEY 64
#define CACHE_SLOTS (1u << 15)
#define CACHE_KEY_BYTES (1u << 20)
#define CACHE_IDS (256u << 10)
#define SCAN_MAX 48 /* words up to this many symbols use the linear scan */

di_status di_tok_ws_sym_reserve(di_tok_ws *ws, size_t n) {
    if (n <= ws->sym_cap) return DI_OK;
    size_t cap = ws->sym_cap ? ws->sym_cap : 64;
    while (cap < n) cap *= 2;
    int32_t *id = realloc(ws->sym_id, cap * sizeof *id);
    if (id) ws->sym_id = id;
    int32_t *pr = id ? realloc(ws->sym_prev, cap * sizeof *pr) : NULL;
    if (pr) ws->sym_prev = pr;
    int32_t *nx = pr ? realloc(ws->sym_next, cap * sizeof *nx) : NULL;
    if (nx) ws->sym_next = nx;
    uint32_t *rk = nx ? realloc(ws->sym_rank, cap * sizeof *rk) : NULL;
    if (rk) ws->sym_rank = rk;
    uint64_t *hp = rk ? realloc(ws->heap, cap * 2 * sizeof *hp) : NULL;
    if (!hp) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (BPE word of %zu symbols)", n);
    ws->heap = hp;
    ws->sym_cap = cap;
    return DI_OK;
}

/* ---- word cache ---- */
static uint64_t cache_hash(const char *s, size_t n, int sp) { return di_hash64(s, n, sp ? 0x5350 : 0x4e53); }

static int cache_get(di_tok_ws *ws, uint64_t h, const char *s, size_t n, di_ids *out) {
    if (!ws->cache) return 0;
    size_t j = (size_t)h & (CACHE_SLOTS - 1);
    for (int probe = 0; probe < 8; probe++) {
        di_tok_cache_slot *c = &ws->cache[j];
        if (c->key_len == UINT32_MAX) return 0;
        if (c->hash == h && c->key_len == n && memcmp(ws->cache_keys + c->key_off, s, n) == 0) {
            for (uint32_t i = 0; i < c->ids_len; i++)
                if (di_ids_push(out, ws->cache_ids[c->ids_off + i]) != DI_OK) return -1;
            return 1;
        }
        j = (j + 1) & (CACHE_SLOTS - 1);
    }
    return 0;
}

static void cache_clear(di_tok_ws *ws) {
    for (size_t i = 0; i < CACHE_SLOTS; i++) ws->cache[i].key_len = UINT32_MAX;
    ws->cache_n = ws->cache_keys_n = ws->cache_ids_n = 0;
}

static void cache_put(di_tok_ws *ws, uint64_t h, const char *s, size_t n, const int32_t *ids, size_t k) {
    if (!ws->cache) {
        ws->cache = malloc(CACHE_SLOTS * sizeof *ws->cache);
        ws->cache_keys = malloc(CACHE_KEY_BYTES);
        ws->cache_ids = malloc(CACHE_IDS * sizeof *ws->cache_ids);
        if (!ws->cache || !ws->cache_keys || !ws->cache_ids) {
            free(ws->cache); free(ws->cache_keys); free(ws->cache_ids);
            ws->cache = NULL; ws->cache_keys = NULL; ws->cache_ids = NULL;
            return; /* no cache: still correct, just slower */
        }
        cache_clear(ws);
    }
    if (ws->cache_n * 2 >= CACHE_SLOTS || ws->cache_keys_n + n > CACHE_KEY_BYTES || ws->cache_ids_n + k > CACHE_IDS)
        cache_clear(ws);
    size_t j = (size_t)h & (CACHE_SLOTS - 1);
    for (int probe = 0; probe < 8; probe++) {
        di_tok_cache_slot *c = &ws->cache[j];
        if (c->key_len == UINT32_MAX) {
            memcpy(ws->cache_keys + ws->cache_keys_n, s, n);
            if (k) memcpy(ws->cache_ids + ws->cache_ids_n, ids, k * sizeof *ids);
            *c = (di_tok_cache_slot){h, (uint32_t)ws->cache_keys_n, (uint32_t)n, (uint32_t)ws->cache_ids_n, (uint32_t)k};
            ws->cache_keys_n += n;
            ws->cache_ids_n += k;
            ws->cache_n++;
            return;
        }
        j = (j + 1) & (CACHE_SLOTS - 1);
    }
}

/* ---- merging ---- */
static void merge_scan(const di_tokenizer *t, di_tok_ws *ws, size_t n) {
    int32_t *id = ws->sym_id, *nx = ws->sym_next, *pv = ws->sym_prev;
    uint32_t *rk = ws->sym_rank;
    int32_t merged_id = -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t r = UINT32_MAX;
        if (i + 1 < n && !di_tok_merges_get(t, id[i], id[i + 1], &r, &merged_id)) r = UINT32_MAX;
        rk[i] = r;
    }
    for (;;) {
        uint32_t best = UINT32_MAX;
        int32_t bi = -1;
        for (int32_t i = 0; i >= 0; i = nx[i])
            if (rk[i] < best) { best = rk[i]; bi = i; }
        if (bi < 0) break;
        int32_t j = nx[bi];
        uint32_t r;
        di_tok_merges_get(t, id[bi], id[j], &r, &merged_id);
        id[bi] = merged_id;
        nx[bi] = nx[j];
        if (nx[j] >= 0) pv[nx[j]] = bi;
        rk[bi] = UINT32_MAX;
        if (nx[bi] >= 0 && !di_tok_merges_get(t, id[bi], id[nx[bi]], &rk[bi], &merged_id)) rk[bi] = UINT32_MAX;
        int32_t p = pv[bi];
        if (p >= 0 && !di_tok_merges_get(t, id[p], id[bi], &rk[p], &merged_id)) rk[p] = UINT32_MAX;
    }
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (h[c] >= last) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = last;
    return top;
}

static void merge_heap(const di_tokenizer *t, di_tok_ws *ws, size_t n) {
    int32_t *id = ws->sym_id, *nx = ws->sym_next, *pv = ws->sym_prev;
    uint64_t *h = ws->heap;
    size_t hn = 0;
    uint32_t r;
    int32_t m;
    for (size_t i = 0; i + 1 < n; i++)
        if (di_tok_merges_get(t, id[i], id[i + 1], &r, &m)) heap_push(h, &hn, ((uint64_t)r << 32) | i);
    while (hn) {
        uint64_t top = heap_pop(h, &hn);
        int32_t i = (int32_t)(uint32_t)top;
        uint32_t rank = (uint32_t)(top >> 32);
        if (id[i] < 0) continue; /* merged into its left neighbour */
        int32_t j = nx[i];
        if (j < 0) continue;
        if (!di_tok_merges_get(t, id[i], id[j], &r, &m) || r != rank) continue; /* stale entry */
        id[i] = m;
        id[j] = -1;
        nx[i] = nx[j];
        if (nx[j] >= 0) pv[nx[j]] = i;
        /* size <= (n - 1) initial + 2 per merge - 1 per merge <= 2n: the heap never overflows */
        DI_ASSERT(hn + 2 <= 2 * ws->sym_cap);
        if (pv[i] >= 0 && di_tok_merges_get(t, id[pv[i]], id[i], &r, &m))
            heap_push(h, &hn, ((uint64_t)r << 32) | (uint32_t)pv[i]);
        if (nx[i] >= 0 && di_tok_merges_get(t, id[i], id[nx[i]], &r, &m))
            heap_push(h, &hn, ((uint64_t)r << 32) | (uint32_t)i);
    }
}

/* ---- initial symbols ---- */
typedef struct { int32_t id; size_t len; } unk_state;

static di_status add_sym(di_tok_ws *ws, size_t *n, int32_t id) {
    DI_TRY(di_tok_ws_sym_reserve(ws, *n + 1));
    ws->sym_id[(*n)++] = id;
    return DI_OK;
}

static di_status flush_unk(di_tok_ws *ws, size_t *n, unk_state *u) {
    if (u->len) DI_TRY(add_sym(ws, n, u->id));
    u->len = 0;
    return DI_OK;
}

/* A character (string `s` after prefix/suffix) that is not in the vocab. */
static di_status missing_char(const di_tokenizer *t, di_tok_ws *ws, size_t *n, unk_state *u, const char *s, size_t sn,
                              size_t byte_len) {
    if (t->byte_fallback) {
        size_t k;
        for (k = 0; k < sn; k++)
            if (t->fallback_id[(uint8_t)s[k]] < 0) break;
        if (k == sn) { /* HF adds these without flushing a pending unk first: keep that order */
            for (k = 0; k < sn; k++) DI_TRY(add_sym(ws, n, t->fallback_id[(uint8_t)s[k]]));
            return DI_OK;
        }
    }
    if (!t->unk_token) return DI_OK; /* dropped, as HF does without an unk token */
    if (t->unk_id < 0)
        return di_error(DI_ERR_FORMAT, "%s: unk_token '%s' is needed but is not in model.vocab", t->path, t->unk_token);
    if (u->len && t->fuse_unk) { u->len += byte_len; return DI_OK; }
    DI_TRY(flush_unk(ws, n, u));
    u->id = t->unk_id;
    u->len = byte_len;
    return DI_OK;
}

/* Generic path: the pre-token's vocab-form string w[0..wn), one symbol per character. */
static di_status initial_generic(const di_tokenizer *t, di_tok_ws *ws, const char *w, size_t wn, size_t *n) {
    unk_state u = {-1, 0};
    size_t plen = t->cont_prefix ? strlen(t->cont_prefix) : 0, slen = t->end_suffix ? strlen(t->end_suffix) : 0;
    size_t i = 0;
    while (i < wn) {
        uint32_t cp;
        int l = di_utf8_decode((const unsigned char *)w + i, wn - i, &cp);
        if (!l) l = 1;
        int first = i == 0, last = i + (size_t)l == wn;
        const char *s = w + i;
        size_t sn = (size_t)l;
        if ((!first && plen) || (last && slen)) {
            ws->tmp.n = 0;
            if (!first && plen) DI_TRY(di_tok_buf_put(&ws->tmp, t->cont_prefix, plen));
            DI_TRY(di_tok_buf_put(&ws->tmp, w + i, (size_t)l));
            if (last && slen) DI_TRY(di_tok_buf_put(&ws->tmp, t->end_suffix, slen));
            s = ws->tmp.p;
            sn = ws->tmp.n;
        }
        int32_t id = di_tok_vocab_lookup(t, s, sn);
        if (id >= 0) {
            DI_TRY(flush_unk(ws, n, &u));
            DI_TRY(add_sym(ws, n, id));
        } else {
            DI_TRY(missing_char(t, ws, n, &u, s, sn, (size_t)l));
        }
        i += (size_t)l;
    }
    return flush_unk(ws, n, &u);
}

/* The vocab form of a piece: byte-level mapped when the pre-tokenizer is ByteLevel. */
static di_status vocab_form(const di_tokenizer *t, di_tok_ws *ws, int sp, const char *s, size_t len) {
    ws->word.n = 0;
    DI_TRY(di_tok_buf_reserve(&ws->word, (len + 1) * 2));
    if (!t->byte_level) {
        if (sp) DI_TRY(di_tok_buf_put(&ws->word, " ", 1));
        return di_tok_buf_put(&ws->word, s, len);
    }
    if (sp) DI_TRY(di_tok_buf_put(&ws->word, t->bl_str[' '], t->bl_len[' ']));
    for (size_t i = 0; i < len; i++) DI_TRY(di_tok_buf_put(&ws->word, t->bl_str[(uint8_t)s[i]], t->bl_len[(uint8_t)s[i]]));
    return DI_OK;
}

di_status di_tok_bpe_piece(const di_tokenizer *t, di_tok_ws *ws, const char *seg, di_tok_piece p, di_ids *out) {
    int sp = (p.len & DI_TOK_PIECE_SPACE) != 0;
    size_t len = p.len & ~DI_TOK_PIECE_SPACE;
    const char *s = seg + p.off;
    if (len + (size_t)sp == 0) return DI_OK;
    if (t->ignore_merges) {
        DI_TRY(vocab_form(t, ws, sp, s, len));
        int32_t id = di_tok_vocab_lookup(t, ws->word.p, ws->word.n);
        if (id >= 0) return di_ids_push(out, id);
    }
    uint64_t h = 0;
    int cacheable = len <= CACHE_MAX_KEY;
    if (cacheable) {
        h = cache_hash(s, len, sp);
        int r = cache_get(ws, h, s, len, out);
        if (r < 0) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (ids)");
        if (r) return DI_OK;
    }
    size_t n = 0;
    if (t->simple_bpe) {
        DI_TRY(di_tok_ws_sym_reserve(ws, len + 1));
        int missing = 0;
        if (sp) missing |= (ws->sym_id[n++] = t->byte_id[' ']) < 0;
        for (size_t i = 0; i < len; i++) missing |= (ws->sym_id[n++] = t->byte_id[(uint8_t)s[i]]) < 0;
        if (missing) { /* some byte symbol is not in the vocab: take the careful path */
            n = 0;
            DI_TRY(vocab_form(t, ws, sp, s, len));
            DI_TRY(initial_generic(t, ws, ws->word.p, ws->word.n, &n));
        }
    } else {
        DI_TRY(vocab_form(t, ws, sp, s, len));
        DI_TRY(initial_generic(t, ws, ws->word.p, ws->word.n, &n));
    }
    if (n > 1) {
        for (size_t i = 0; i < n; i++) {
            ws->sym_prev[i] = (int32_t)i - 1;
            ws->sym_next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        }
        if (n <= SCAN_MAX) merge_scan(t, ws, n);
        else merge_heap(t, ws, n);
    }
    size_t before = out->n;
    for (int32_t i = n ? 0 : -1; i >= 0; i = n > 1 ? ws->sym_next[i] : -1)
        DI_TRY(di_ids_push(out, ws->sym_id[i]));
    if (cacheable) cache_put(ws, h, s, len, out->n > before ? out->data + before : NULL, out->n - before);
    return DI_OK;
}
