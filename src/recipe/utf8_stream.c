/* utf8_stream.c - see utf8_stream.h. Invariant: tail holds a proper prefix of a valid UTF-8
 * sequence (never a complete character, never an invalid prefix). */
#include "recipe/utf8_stream.h"

static const char REPLACEMENT[3] = {(char)0xef, (char)0xbf, (char)0xbd};

/* Expected length of the sequence led by c (0 = c cannot start one). */
static int seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) return 2;
    if (c >= 0xe0 && c <= 0xef) return 3;
    if (c >= 0xf0 && c <= 0xf4) return 4;
    return 0;
}

/* Whether b may follow lead byte c at position 1 of a sequence (the second byte carries the
 * overlong / surrogate / range restrictions); later positions only need 80..BF. */
static int second_ok(unsigned char c, unsigned char b) {
    switch (c) {
    case 0xe0: return b >= 0xa0 && b <= 0xbf;
    case 0xed: return b >= 0x80 && b <= 0x9f;
    case 0xf0: return b >= 0x90 && b <= 0xbf;
    case 0xf4: return b >= 0x80 && b <= 0x8f;
    default: return b >= 0x80 && b <= 0xbf;
    }
}

/* Length of the valid prefix of s[0..len) as the start of one sequence (maximal subpart),
 * capped at the sequence length; *need = the full sequence length (0 if s[0] is no lead). */
static int valid_prefix(const unsigned char *s, size_t len, int *need) {
    int n = seq_len(s[0]);
    *need = n;
    if (n <= 1) return n;
    int k = 1;
    while (k < n && (size_t)k < len) {
        int ok = k == 1 ? second_ok(s[0], s[1]) : (s[k] >= 0x80 && s[k] <= 0xbf);
        if (!ok) break;
        k++;
    }
    return k;
}

int di_utf8_stream_push(di_utf8_stream *u, const char *bytes, size_t len, di_utf8_sink sink, void *ud) {
    const unsigned char *s = (const unsigned char *)bytes;
    size_t i = 0;
    /* complete (or reject) a held tail first */
    while (u->n_tail > 0 && i < len) {
        u->tail[u->n_tail] = s[i];
        int need, k = valid_prefix(u->tail, u->n_tail + 1, &need);
        if (k == (int)u->n_tail + 1) {  /* still valid */
            i++;
            u->n_tail++;
            if ((int)u->n_tail == need) {
                if (sink(ud, (const char *)u->tail, u->n_tail)) return -1;
                u->n_tail = 0;
            }
        } else {  /* the tail was a maximal invalid subpart; reprocess s[i] normally */
            if (sink(ud, REPLACEMENT, 3)) return -1;
            u->n_tail = 0;
        }
    }
    size_t run = i;  /* start of a run of valid bytes not yet given to the sink */
    while (i < len) {
        if (s[i] < 0x80) { i++; continue; }
        int need, k = valid_prefix(s + i, len - i, &need);
        if (need > 1 && k == need) { i += (size_t)k; continue; }
        if (run < i && sink(ud, (const char *)s + run, i - run)) return -1;
        if (need > 1 && i + (size_t)k == len) {  /* incomplete at the end: hold */
            for (int j = 0; j < k; j++) u->tail[j] = s[i + (size_t)j];
            u->n_tail = (size_t)k;
            return 0;
        }
        if (sink(ud, REPLACEMENT, 3)) return -1;
        i += k > 0 ? (size_t)k : 1;
        run = i;
    }
    if (run < len && sink(ud, (const char *)s + run, len - run)) return -1;
    return 0;
}

int di_utf8_stream_flush(di_utf8_stream *u, di_utf8_sink sink, void *ud) {
    if (u->n_tail == 0) return 0;
    u->n_tail = 0;
    return sink(ud, REPLACEMENT, 3);
}
