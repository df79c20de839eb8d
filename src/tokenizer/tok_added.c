/* tok_added.c - finding added tokens (special or not) in text, with HF `AddedVocabulary` rules.
 *
 * HF builds an Aho-Corasick automaton (MatchKind::LeftmostLongest) over the token patterns and
 * iterates non-overlapping matches: the match starting earliest wins, the longest one at that
 * position, and the search resumes at the end of the match. For each match:
 *   single_word: dropped (and not retried inside) if a word character (Rust regex \w) touches it;
 *   lstrip: the split starts at the whitespace run before it (not before the previous split);
 *   rstrip: the split extends over the whitespace run after it (the search still resumes at the
 *           match end).
 * A byte trie gives the same matches: at each position the longest pattern starting there.
 * Invariant: patterns are valid UTF-8 and so is the text, so matches fall on character
 * boundaries. */
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"
#include "tokenizer/tok_internal.h"

void di_tok_trie_init(di_tok_trie *tr) {
    memset(tr, 0, sizeof *tr);
    for (int i = 0; i < 256; i++) tr->root[i] = -1;
    tr->first_byte = -1;
}

static di_status new_node(di_tok_trie *tr, uint8_t byte, int32_t *out) {
    if (tr->n == tr->cap) {
        size_t cap = tr->cap ? tr->cap * 2 : 256;
        di_tok_trie_node *v = realloc(tr->nodes, cap * sizeof *v);
        if (!v) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (added-token trie)");
        tr->nodes = v;
        tr->cap = cap;
    }
    tr->nodes[tr->n] = (di_tok_trie_node){-1, -1, -1, byte};
    *out = (int32_t)tr->n++;
    return DI_OK;
}

/* The first pattern added wins when two tokens have the same pattern. */
di_status di_tok_trie_add(di_tok_trie *tr, const char *s, size_t n, int32_t token) {
    if (n == 0) return DI_OK;
    int32_t cur = tr->root[(uint8_t)s[0]];
    if (cur < 0) {
        DI_TRY(new_node(tr, (uint8_t)s[0], &cur));
        tr->root[(uint8_t)s[0]] = cur;
    }
    for (size_t i = 1; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = tr->nodes[cur].child, prev = -1;
        while (c >= 0 && tr->nodes[c].byte != b) { prev = c; c = tr->nodes[c].sibling; }
        if (c < 0) {
            DI_TRY(new_node(tr, b, &c));
            if (prev < 0) tr->nodes[cur].child = c;
            else tr->nodes[prev].sibling = c;
        }
        cur = c;
    }
    if (tr->nodes[cur].token < 0) tr->nodes[cur].token = token;
    tr->count++;
    int firsts = 0, last = -1;
    for (int b = 0; b < 256; b++)
        if (tr->root[b] >= 0) { firsts++; last = b; }
    tr->first_byte = firsts == 1 ? last : -1;
    return DI_OK;
}

void di_tok_trie_free(di_tok_trie *tr) {
    free(tr->nodes);
    tr->nodes = NULL;
    tr->n = tr->cap = 0;
}

/* Longest pattern starting at text[pos]; returns its token index and sets *end, or -1. */
static int32_t longest_at(const di_tok_trie *tr, const char *text, size_t n, size_t pos, size_t *end) {
    int32_t cur = tr->root[(uint8_t)text[pos]], best = -1;
    size_t i = pos + 1;
    while (cur >= 0) {
        if (tr->nodes[cur].token >= 0) { best = tr->nodes[cur].token; *end = i; }
        if (i >= n) break;
        uint8_t b = (uint8_t)text[i];
        int32_t c = tr->nodes[cur].child;
        while (c >= 0 && tr->nodes[c].byte != b) c = tr->nodes[c].sibling;
        cur = c;
        i++;
    }
    return best;
}

/* Last / first code point around a position (text is valid UTF-8). */
static uint32_t cp_before(const char *text, size_t pos) {
    size_t i = pos;
    while (i > 0 && ((unsigned char)text[i - 1] & 0xc0) == 0x80) i--;
    if (i > 0) i--;
    uint32_t cp = 0;
    if (!di_utf8_decode((const unsigned char *)text + i, pos - i, &cp)) cp = 0;
    return cp;
}

static uint32_t cp_at(const char *text, size_t n, size_t pos, int *len) {
    uint32_t cp = 0;
    *len = di_utf8_decode((const unsigned char *)text + pos, n - pos, &cp);
    if (!*len) { *len = 1; cp = (unsigned char)text[pos]; }
    return cp;
}

static di_status push_split(di_tok_splits *o, size_t off, size_t len, int32_t token) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 16;
        di_tok_split *v = realloc(o->v, cap * sizeof *v);
        if (!v) return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (added-token splits)");
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = (di_tok_split){(uint32_t)off, (uint32_t)len, token};
    return DI_OK;
}

di_status di_tok_added_split(const di_tokenizer *t, const di_tok_trie *trie, const char *text, size_t n, di_tok_splits *out) {
    size_t start_offset = 0, pos = 0;
    if (trie->count == 0) {
        if (n) DI_TRY(push_split(out, 0, n, -1));
        return DI_OK;
    }
    /* most tokenizers start every added token with the same byte ('<'): memchr finds candidates */
    int single = trie->first_byte >= 0;
    while (pos < n) {
        if (single) {
            const char *q = memchr(text + pos, trie->first_byte, n - pos);
            if (!q) break;
            pos = (size_t)(q - text);
        } else if (trie->root[(uint8_t)text[pos]] < 0) {
            pos++;
            continue;
        }
        size_t end = 0;
        int32_t k = longest_at(trie, text, n, pos, &end);
        if (k < 0) { pos++; continue; }
        const di_tok_added *a = &t->added[k];
        size_t start = pos, stop = end;
        pos = end; /* the automaton resumes after the match, whatever happens to it below */
        if (a->single_word) {
            int l;
            int start_space = start == 0 || !di_tok_uc_is_word(cp_before(text, start));
            int stop_space = stop == n || !di_tok_uc_is_word(cp_at(text, n, stop, &l));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t s = start;
            while (s > 0) {
                size_t b = s;
                while (b > 0 && ((unsigned char)text[b - 1] & 0xc0) == 0x80) b--;
                if (b > 0) b--;
                int l;
                if (!di_tok_uc_is_whitespace(cp_at(text, n, b, &l))) break;
                s = b;
            }
            start = s > start_offset ? s : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                int l;
                if (!di_tok_uc_is_whitespace(cp_at(text, n, stop, &l))) break;
                stop += (size_t)l;
            }
        }
        if (start_offset < start) DI_TRY(push_split(out, start_offset, start - start_offset, -1));
        DI_TRY(push_split(out, start, stop - start, k));
        start_offset = stop;
    }
    if (start_offset < n) DI_TRY(push_split(out, start_offset, n - start_offset, -1));
    return DI_OK;
}
