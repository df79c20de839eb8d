/* utf8.c - see utf8.h. */
#include "core/utf8.h"

int di_utf8_decode(const unsigned char *s, size_t len, uint32_t *cp) {
    if (len == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    int n;
    uint32_t v, min;
    if (c >= 0xc2 && c <= 0xdf) { n = 2; v = c & 0x1f; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { n = 3; v = c & 0x0f; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { n = 4; v = c & 0x07; min = 0x10000; }
    else return 0;
    if (len < (size_t)n) return 0;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return n;
}

int di_utf8_valid(const char *s, size_t len, size_t *bad_offset) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        if (p[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int n = di_utf8_decode(p + i, len - i, &cp);
        if (!n) {
            if (bad_offset) *bad_offset = i;
            return 0;
        }
        i += (size_t)n;
    }
    return 1;
}

int di_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = 0xc0 | (cp >> 6); o[1] = 0x80 | (cp & 0x3f); return 2; }
    if (cp >= 0xd800 && cp <= 0xdfff) return 0;
    if (cp < 0x10000) {
        o[0] = 0xe0 | (cp >> 12); o[1] = 0x80 | ((cp >> 6) & 0x3f); o[2] = 0x80 | (cp & 0x3f);
        return 3;
    }
    if (cp > 0x10ffff) return 0;
    o[0] = 0xf0 | (cp >> 18); o[1] = 0x80 | ((cp >> 12) & 0x3f);
    o[2] = 0x80 | ((cp >> 6) & 0x3f); o[3] = 0x80 | (cp & 0x3f);
    return 4;
}

size_t di_utf8_complete_prefix(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    /* look back at most 3 bytes for a lead byte whose sequence is not complete */
    size_t back = 0;
    while (back < 4 && back < len) {
        unsigned c = p[len - 1 - back];
        if ((c & 0xc0) != 0x80) {
            int need = c < 0x80 ? 1 : (c >= 0xf0 ? 4 : (c >= 0xe0 ? 3 : (c >= 0xc0 ? 2 : 1)));
            if ((size_t)need > back + 1) return len - 1 - back;
            return len;
        }
        back++;
    }
    return len;
}
