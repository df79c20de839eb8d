/* hash.h - 64-bit non-cryptographic hashing (for prefix-cache block hashes, hash tables)
 * and a generic open-addressing string->int map used by loaders and the tokenizer.
 * di_hash64 is stable across machines and runs (same bytes, same seed -> same value). */
#ifndef DI_CORE_HASH_H
#define DI_CORE_HASH_H
#include <stddef.h>
#include <stdint.h>

uint64_t di_hash64(const void *data, size_t len, uint64_t seed);
/* Combine a parent hash with more data (chain hashing). */
static inline uint64_t di_hash64_chain(uint64_t parent, const void *data, size_t len) {
    return di_hash64(data, len, parent ^ 0x9e3779b97f4a7c15ull);
}

/* String -> int64 map with owned copies of keys (open addressing, power-of-two capacity). */
typedef struct di_strmap di_strmap;
di_strmap *di_strmap_create(size_t expected);
void di_strmap_free(di_strmap *m);
/* Inserts or replaces. Returns 0 on success, -1 on out-of-memory. */
int di_strmap_put(di_strmap *m, const char *key, size_t key_len, int64_t value);
/* Returns 1 and sets *value if found, else 0. */
int di_strmap_get(const di_strmap *m, const char *key, size_t key_len, int64_t *value);
size_t di_strmap_size(const di_strmap *m);
#endif
