/* stop.c - stop-string search over streamed text (see stop.h). */
#define _GNU_SOURCE /* memmem */
#include "engine/stop.h"

#include <string.h>

int di_stop_find(const char *text, size_t len, size_t old_len, const char *const *stops, int n_stops, size_t *at) {
    int best = -1;
    size_t best_at = 0;
    for (int i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        if (sl == 0 || sl > len) continue;
        /* a new match ends after old_len, so it starts at or after old_len + 1 - sl */
        size_t from = old_len + 1 > sl ? old_len + 1 - sl : 0;
        if (best >= 0 && from > best_at) continue;
        const char *hit = memmem(text + from, len - from, stops[i], sl);
        if (!hit) continue;
        size_t pos = (size_t)(hit - text);
        if (best < 0 || pos < best_at) {
            best = i;
            best_at = pos;
        }
    }
    if (best >= 0) *at = best_at;
    return best;
}

size_t di_stop_holdback(const char *text, size_t len, const char *const *stops, int n_stops) {
    size_t hold = 0;
    for (int i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        size_t k = sl - 1 < len ? sl - 1 : len; /* proper prefixes only */
        for (; k > hold; k--)
            if (memcmp(text + len - k, stops[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}
