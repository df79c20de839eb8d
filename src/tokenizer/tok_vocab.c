/* tok_vocab.c - the tokenizer's lookup tables: growable buffers, the model vocabulary map
 * (string -> id), the merge map ((left, right) -> (rank, merged id)) and the GPT-2 byte-level
 * alphabet (bytes <-> printable code points).
 *
 * Invariants: vmap holds id + 1 of every model vocab entry (0 = empty slot), keyed by the
 * entry's string in mstr_blob; mkeys holds (left << 32 | right) with UINT64_MAX = empty, and
 * mvals the matching (rank << 32 | merged id). Both tables are at most half full. */
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "tokenizer/tok_internal.h"

di_status di_tok_buf_grow(di_tok_buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return DI_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
    return DI_OK;
}

void di_tok_buf_free(di_tok_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

di_status di_tok_pieces_push(di_tok_pieces *l, uint32_t off, uint32_t len) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        di_tok_piece *v = realloc(l->v, cap * sizeof *v);
        if (!v) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (%zu pieces)", cap);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (di_tok_piece){off, len};
    return DI_OK;
}

/* ---- model vocab map ---- */
/* Slots hold (hash tag << 32) | (id + 1); the tag avoids touching the strings of most
 * non-matching entries. */
static inline uint64_t str_hash(const char *s, size_t n) { return di_hash64(s, n, 0x746f6b656e); }

di_status di_tok_vocab_build_map(di_tokenizer *t) {
    size_t cap = 16;
    while (cap < (size_t)t->n_model_vocab * 2 + 2) cap <<= 1;
    t->vmap = calloc(cap, sizeof *t->vmap);
    if (!t->vmap) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (vocab map)");
    t->vmap_mask = cap - 1;
    for (uint32_t id = 0; id < t->n_model_ids; id++) {
        if (t->mstr_len[id] == UINT32_MAX) continue;
        const char *s = t->mstr_blob + t->mstr_off[id];
        size_t n = t->mstr_len[id];
        uint64_t h = str_hash(s, n);
        uint32_t tag = (uint32_t)(h >> 32);
        size_t j = (size_t)h & t->vmap_mask;
        while (t->vmap[j]) {
            uint32_t o = (uint32_t)t->vmap[j] - 1;
            if ((uint32_t)(t->vmap[j] >> 32) == tag && t->mstr_len[o] == n && memcmp(t->mstr_blob + t->mstr_off[o], s, n) == 0)
                return di_error(DI_ERR_FORMAT, "%s: model.vocab: token '%.*s' appears twice (ids %u and %u)",
                                t->path, (int)n, s, o, id);
            j = (j + 1) & t->vmap_mask;
        }
        t->vmap[j] = ((uint64_t)tag << 32) | (id + 1);
    }
    return DI_OK;
}

int32_t di_tok_vocab_lookup(const di_tokenizer *t, const char *s, size_t n) {
    if (!t->vmap) return -1;
    uint64_t h = str_hash(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    size_t j = (size_t)h & t->vmap_mask;
    for (;;) {
        uint64_t v = t->vmap[j];
        if (!v) return -1;
        if ((uint32_t)(v >> 32) == tag) {
            uint32_t id = (uint32_t)v - 1;
            if (t->mstr_len[id] == n && memcmp(t->mstr_blob + t->mstr_off[id], s, n) == 0) return (int32_t)id;
        }
        j = (j + 1) & t->vmap_mask;
    }
}

/* ---- merges ---- */
di_status di_tok_merges_init(di_tokenizer *t, size_t n_merges) {
    size_t cap = 16;
    while (cap < n_merges * 2 + 2) cap <<= 1;
    free(t->merges);
    t->merges = malloc(cap * sizeof *t->merges);
    if (!t->merges) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (merge table)");
    for (size_t i = 0; i < cap; i++) t->merges[i].key = UINT64_MAX;
    t->mmask = cap - 1;
    t->n_merges = 0;
    return DI_OK;
}

/* A later duplicate of a pair replaces the earlier one (HF collects the merges into a map). */
di_status di_tok_merges_add(di_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    if ((t->n_merges + 1) * 2 > t->mmask + 1) return di_error(DI_ERR_INTERNAL, "tokenizer: merge table full");
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t j = di_tok_merge_slot(key, t->mmask);
    while (t->merges[j].key != UINT64_MAX && t->merges[j].key != key) j = (j + 1) & t->mmask;
    if (t->merges[j].key == UINT64_MAX) t->n_merges++;
    t->merges[j].key = key;
    t->merges[j].rank = rank;
    t->merges[j].merged = merged;
    return DI_OK;
}

/* ---- byte-level alphabet (GPT-2 bytes_to_unicode) ---- */
static int printable_byte(unsigned b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174); }

uint32_t di_tok_bytelevel_char(uint8_t b) {
    if (printable_byte(b)) return b;
    /* the non-printable bytes take 256, 257, ... in increasing byte order */
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++) n += !printable_byte(x);
    return 256 + n;
}

int di_tok_bytelevel_byte(uint32_t cp) {
    if (cp < 256) return printable_byte(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    /* the non-printable bytes in increasing order: 0-32, 127-160, 173 */
    unsigned k = cp - 256;
    if (k < 33) return (int)k;
    if (k < 33 + 34) return (int)(127 + k - 33);
    return 173;
}
