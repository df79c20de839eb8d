/* kmp.h - incremental Knuth-Morris-Pratt matching of a short delimiter in a byte stream.
 *
 * The matcher keeps only its automaton state (how many pattern bytes the stream currently ends
 * with), so a delimiter split across any number of chunks is found without re-scanning: each
 * input byte is examined once. Patterns are at most DI_KMP_MAX bytes. */
#ifndef DI_RECIPE_KMP_H
#define DI_RECIPE_KMP_H
#include <stddef.h>

#define DI_KMP_MAX 32

typedef struct di_kmp {
    unsigned char pat[DI_KMP_MAX];
    size_t m;                    /* pattern length, 1..DI_KMP_MAX */
    unsigned char fail[DI_KMP_MAX]; /* fail[i] = longest proper border of pat[0..i] */
    size_t state;                /* bytes of pat matched at the end of the stream so far */
} di_kmp;

/* Returns 0, or -1 if the pattern is empty or longer than DI_KMP_MAX. */
int di_kmp_init(di_kmp *k, const char *pat, size_t m);
/* Advances by one byte; returns 1 when the byte completes a match (state is then the border
 * length, so overlapping matches are found), else 0. */
int di_kmp_step(di_kmp *k, unsigned char c);
static inline void di_kmp_reset(di_kmp *k) { k->state = 0; }
#endif
