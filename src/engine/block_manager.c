/* block_manager.c - refcounted KV blocks, the LRU free queue and the prefix-hash table
 * (see block_manager.h for the states and invariants).
 *
 * Layout: per-block arrays (refcount, hash, parent, has_hash, LRU prev/next, 64 token ids);
 * the hash table is open addressing with linear probing over block ids, capacity a power of
 * two >= 2 * n_blocks, deletion by backward shift (no tombstones). Everything is allocated
 * at create; no operation allocates. */
#include "engine/block_manager.h"

#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/status.h"

struct di_block_manager {
    int n;
    int32_t *ref;        /* [n] */
    uint64_t *hash;      /* [n] valid when has_hash */
    uint64_t *parent;    /* [n] */
    uint8_t *has_hash;   /* [n] */
    int32_t *prev, *next;/* [n] free-queue links, -1 = none */
    int32_t *tokens;     /* [n * 64] ids of a hashed block */
    int32_t head, tail;  /* free queue: head = next to reuse */
    int n_free, n_cached;
    int32_t *table;      /* [tcap] block id or -1 */
    uint32_t tcap;
    uint64_t evictions;
};

di_status di_block_manager_create(int n_blocks, di_block_manager **out) {
    *out = NULL;
    if (n_blocks <= 0) return di_error(DI_ERR_INVALID_ARG, "block manager: %d blocks: expected > 0", n_blocks);
    di_block_manager *bm = calloc(1, sizeof *bm);
    if (!bm) return di_error(DI_ERR_NOMEM, "block manager: out of memory");
    size_t n = (size_t)n_blocks;
    uint32_t tcap = 16;
    while (tcap < 2 * n) tcap <<= 1;
    bm->n = n_blocks;
    bm->ref = calloc(n, sizeof *bm->ref);
    bm->hash = calloc(n, sizeof *bm->hash);
    bm->parent = calloc(n, sizeof *bm->parent);
    bm->has_hash = calloc(n, 1);
    bm->prev = malloc(n * sizeof *bm->prev);
    bm->next = malloc(n * sizeof *bm->next);
    bm->tokens = malloc(n * DI_BLOCK_TOKENS * sizeof *bm->tokens);
    bm->table = malloc((size_t)tcap * sizeof *bm->table);
    if (!bm->ref || !bm->hash || !bm->parent || !bm->has_hash || !bm->prev || !bm->next || !bm->tokens ||
        !bm->table) {
        di_block_manager_free(bm);
        return di_error(DI_ERR_NOMEM, "block manager: out of memory for %d blocks", n_blocks);
    }
    bm->tcap = tcap;
    memset(bm->table, 0xff, (size_t)tcap * sizeof *bm->table);
    for (int i = 0; i < n_blocks; i++) {
        bm->prev[i] = i - 1;
        bm->next[i] = i + 1 < n_blocks ? i + 1 : -1;
    }
    bm->head = 0;
    bm->tail = n_blocks - 1;
    bm->n_free = n_blocks;
    *out = bm;
    return DI_OK;
}

void di_block_manager_free(di_block_manager *bm) {
    if (!bm) return;
    free(bm->ref);
    free(bm->hash);
    free(bm->parent);
    free(bm->has_hash);
    free(bm->prev);
    free(bm->next);
    free(bm->tokens);
    free(bm->table);
    free(bm);
}

int di_block_manager_total(const di_block_manager *bm) { return bm->n; }
int di_block_manager_n_free(const di_block_manager *bm) { return bm->n_free; }
int di_block_manager_n_cached(const di_block_manager *bm) { return bm->n_cached; }
uint64_t di_block_manager_evictions(const di_block_manager *bm) { return bm->evictions; }

int di_block_manager_refcount(const di_block_manager *bm, int32_t b) {
    DI_ASSERT(b >= 0 && b < bm->n);
    return bm->ref[b];
}

const int32_t *di_block_manager_refcounts(const di_block_manager *bm) { return bm->ref; }

/* ---- free queue ---- */

static void queue_remove(di_block_manager *bm, int32_t b) {
    int32_t p = bm->prev[b], n = bm->next[b];
    if (p >= 0) bm->next[p] = n;
    else bm->head = n;
    if (n >= 0) bm->prev[n] = p;
    else bm->tail = p;
    bm->prev[b] = bm->next[b] = -1;
    bm->n_free--;
    if (bm->has_hash[b]) bm->n_cached--;
}

static void queue_push_head(di_block_manager *bm, int32_t b) {
    bm->prev[b] = -1;
    bm->next[b] = bm->head;
    if (bm->head >= 0) bm->prev[bm->head] = b;
    else bm->tail = b;
    bm->head = b;
    bm->n_free++;
}

static void queue_push_tail(di_block_manager *bm, int32_t b) {
    bm->next[b] = -1;
    bm->prev[b] = bm->tail;
    if (bm->tail >= 0) bm->next[bm->tail] = b;
    else bm->head = b;
    bm->tail = b;
    bm->n_free++;
    bm->n_cached++;
}

/* ---- hash table ---- */

static inline uint32_t home(const di_block_manager *bm, uint64_t h) { return (uint32_t)(h ^ (h >> 32)) & (bm->tcap - 1); }

static int32_t table_find(const di_block_manager *bm, uint64_t h) {
    for (uint32_t j = home(bm, h);; j = (j + 1) & (bm->tcap - 1)) {
        int32_t b = bm->table[j];
        if (b < 0) return -1;
        if (bm->hash[b] == h) return b;
    }
}

static void table_insert(di_block_manager *bm, int32_t b) {
    uint32_t j = home(bm, bm->hash[b]);
    while (bm->table[j] >= 0) j = (j + 1) & (bm->tcap - 1);
    bm->table[j] = b;
}

static void table_remove(di_block_manager *bm, int32_t b) {
    const uint32_t mask = bm->tcap - 1;
    uint32_t j = home(bm, bm->hash[b]);
    while (bm->table[j] != b) {
        DI_ASSERT(bm->table[j] >= 0);
        j = (j + 1) & mask;
    }
    /* backward-shift deletion: move later entries of the cluster into the hole when their
     * home position does not lie cyclically in (hole, their slot] */
    uint32_t hole = j;
    for (uint32_t k = (j + 1) & mask; bm->table[k] >= 0; k = (k + 1) & mask) {
        uint32_t h = home(bm, bm->hash[bm->table[k]]);
        int movable = hole <= k ? (h <= hole || h > k) : (h <= hole && h > k);
        if (movable) {
            bm->table[hole] = bm->table[k];
            hole = k;
        }
    }
    bm->table[hole] = -1;
}

/* ---- public ---- */

int32_t di_block_manager_alloc(di_block_manager *bm) {
    int32_t b = bm->head;
    if (b < 0) return -1;
    queue_remove(bm, b);
    if (bm->has_hash[b]) {
        table_remove(bm, b);
        bm->has_hash[b] = 0;
        bm->evictions++;
    }
    bm->ref[b] = 1;
    return b;
}

void di_block_manager_ref(di_block_manager *bm, int32_t b) {
    DI_ASSERT(b >= 0 && b < bm->n);
    if (bm->ref[b] == 0) queue_remove(bm, b);
    bm->ref[b]++;
}

void di_block_manager_unref(di_block_manager *bm, int32_t b) {
    DI_ASSERT(b >= 0 && b < bm->n);
    DI_ASSERT(bm->ref[b] > 0);
    if (--bm->ref[b] > 0) return;
    if (bm->has_hash[b]) queue_push_tail(bm, b);
    else queue_push_head(bm, b);
}

uint64_t di_block_manager_hash(uint64_t parent, const int32_t *tokens) {
    return di_hash64_chain(parent, tokens, DI_BLOCK_TOKENS * sizeof *tokens);
}

int32_t di_block_manager_lookup(const di_block_manager *bm, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    int32_t b = table_find(bm, hash);
    if (b < 0) return -1;
    if (bm->parent[b] != parent) return -1;
    if (memcmp(bm->tokens + (size_t)b * DI_BLOCK_TOKENS, tokens, DI_BLOCK_TOKENS * sizeof *tokens) != 0) return -1;
    return b;
}

int di_block_manager_register(di_block_manager *bm, int32_t b, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    DI_ASSERT(b >= 0 && b < bm->n && bm->ref[b] > 0);
    if (bm->has_hash[b]) return 0;
    if (table_find(bm, hash) >= 0) return 0;
    bm->hash[b] = hash;
    bm->parent[b] = parent;
    bm->has_hash[b] = 1;
    memcpy(bm->tokens + (size_t)b * DI_BLOCK_TOKENS, tokens, DI_BLOCK_TOKENS * sizeof *tokens);
    table_insert(bm, b);
    return 1;
}

di_status di_block_manager_check(const di_block_manager *bm) {
    int in_queue = 0, cached = 0;
    for (int32_t b = bm->head, p = -1; b >= 0; p = b, b = bm->next[b]) {
        if (++in_queue > bm->n) return di_error(DI_ERR_INTERNAL, "block manager: free queue has a cycle");
        if (bm->prev[b] != p) return di_error(DI_ERR_INTERNAL, "block manager: block %d: broken prev link", b);
        if (bm->ref[b] != 0) return di_error(DI_ERR_INTERNAL, "block manager: block %d queued with refcount %d", b, bm->ref[b]);
        cached += bm->has_hash[b];
    }
    if (in_queue != bm->n_free) return di_error(DI_ERR_INTERNAL, "block manager: free queue %d != n_free %d", in_queue, bm->n_free);
    if (cached != bm->n_cached) return di_error(DI_ERR_INTERNAL, "block manager: cached %d != n_cached %d", cached, bm->n_cached);
    int zero = 0, hashed = 0;
    for (int b = 0; b < bm->n; b++) {
        if (bm->ref[b] < 0) return di_error(DI_ERR_INTERNAL, "block manager: block %d refcount %d", b, bm->ref[b]);
        zero += bm->ref[b] == 0;
        if (bm->has_hash[b]) {
            hashed++;
            if (table_find(bm, bm->hash[b]) != b)
                return di_error(DI_ERR_INTERNAL, "block manager: block %d hash not in the table", b);
        }
    }
    if (zero != bm->n_free) return di_error(DI_ERR_INTERNAL, "block manager: %d blocks at refcount 0, n_free %d", zero, bm->n_free);
    int entries = 0;
    for (uint32_t j = 0; j < bm->tcap; j++) {
        int32_t b = bm->table[j];
        if (b < 0) continue;
        entries++;
        if (!bm->has_hash[b]) return di_error(DI_ERR_INTERNAL, "block manager: table names unhashed block %d", b);
    }
    if (entries != hashed) return di_error(DI_ERR_INTERNAL, "block manager: table has %d entries, %d hashed blocks", entries, hashed);
    return DI_OK;
}
