/* kmp.c - see kmp.h. */
#include "recipe/kmp.h"

#include <string.h>

int di_kmp_init(di_kmp *k, const char *pat, size_t m) {
    if (m == 0 || m > DI_KMP_MAX) return -1;
    memcpy(k->pat, pat, m);
    k->m = m;
    k->state = 0;
    k->fail[0] = 0;
    size_t b = 0;
    for (size_t i = 1; i < m; i++) {
        while (b > 0 && k->pat[i] != k->pat[b]) b = k->fail[b - 1];
        if (k->pat[i] == k->pat[b]) b++;
        k->fail[i] = (unsigned char)b;
    }
    return 0;
}

int di_kmp_step(di_kmp *k, unsigned char c) {
    size_t s = k->state;
    while (s > 0 && k->pat[s] != c) s = k->fail[s - 1];
    if (k->pat[s] == c) s++;
    if (s == k->m) {
        k->state = k->fail[k->m - 1];
        return 1;
    }
    k->state = s;
    return 0;
}
