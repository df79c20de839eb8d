/* hash.c - di_hash64 (a 64-bit multiply-xorshift hash in the style of wyhash/xxh3 mixing,
 * written for deepinfer) and di_strmap (string -> int64 open addressing map). */
#include "core/hash.h"

#include <stdlib.h>
#include <string.h>

static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint64_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

static inline uint64_t mix(uint64_t a, uint64_t b) {
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

#define P0 0xa0761d6478bd642full
#define P1 0xe7037ed1a0b428dbull
#define P2 0x8ebc6af09c88c6e3ull
#define P3 0x589965cc75374cc3ull

uint64_t di_hash64(const void *data, size_t len, uint64_t seed) {
    const uint8_t *p = (const uint8_t *)data;
    uint64_t h = seed ^ mix(seed ^ P0, P1) ^ (uint64_t)len;
    size_t i = len;
    while (i >= 16) {
        h = mix(rd64(p) ^ P1 ^ h, rd64(p + 8) ^ P2);
        p += 16;
        i -= 16;
    }
    uint64_t a = 0, b = 0;
    if (i >= 8) {
        a = rd64(p);
        b = rd64(p + i - 8);
    } else if (i >= 4) {
        a = rd32(p);
        b = rd32(p + i - 4);
    } else if (i > 0) {
        a = ((uint64_t)p[0] << 16) | ((uint64_t)p[i >> 1] << 8) | p[i - 1];
    }
    h = mix(a ^ P1 ^ h, b ^ P3);
    return mix(h ^ P0, (uint64_t)len ^ P1);
}

/* ---- di_strmap ---- */
typedef struct {
    char *key;      /* NULL = empty slot */
    size_t len;
    uint64_t hash;
    int64_t value;
} slot;

struct di_strmap {
    slot *slots;
    size_t cap;  /* power of two */
    size_t n;
};

di_strmap *di_strmap_create(size_t expected) {
    di_strmap *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    m->slots = calloc(cap, sizeof(slot));
    if (!m->slots) { free(m); return NULL; }
    m->cap = cap;
    return m;
}

void di_strmap_free(di_strmap *m) {
    if (!m) return;
    for (size_t i = 0; i < m->cap; i++) free(m->slots[i].key);
    free(m->slots);
    free(m);
}

static int grow(di_strmap *m) {
    size_t ncap = m->cap * 2;
    slot *ns = calloc(ncap, sizeof(slot));
    if (!ns) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key) continue;
        size_t j = m->slots[i].hash & (ncap - 1);
        while (ns[j].key) j = (j + 1) & (ncap - 1);
        ns[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return 0;
}

int di_strmap_put(di_strmap *m, const char *key, size_t len, int64_t value) {
    if ((m->n + 1) * 4 > m->cap * 3 && grow(m) != 0) return -1;
    uint64_t h = di_hash64(key, len, 0);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].key) {
        if (m->slots[j].hash == h && m->slots[j].len == len && memcmp(m->slots[j].key, key, len) == 0) {
            m->slots[j].value = value;
            return 0;
        }
        j = (j + 1) & (m->cap - 1);
    }
    char *k = malloc(len + 1);
    if (!k) return -1;
    memcpy(k, key, len);
    k[len] = '\0';
    m->slots[j] = (slot){k, len, h, value};
    m->n++;
    return 0;
}

int di_strmap_get(const di_strmap *m, const char *key, size_t len, int64_t *value) {
    uint64_t h = di_hash64(key, len, 0);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].key) {
        if (m->slots[j].hash == h && m->slots[j].len == len && memcmp(m->slots[j].key, key, len) == 0) {
            if (value) *value = m->slots[j].value;
            return 1;
        }
        j = (j + 1) & (m->cap - 1);
    }
    return 0;
}

size_t di_strmap_size(const di_strmap *m) { return m->n; }
