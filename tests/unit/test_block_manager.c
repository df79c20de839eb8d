/* test_block_manager.c - the KV block allocator: counts, LRU order of reuse (uncached first,
 * then least recently freed cached), eviction removing hashes, exact-match lookups (hash +
 * parent + tokens), duplicate registration, and a randomized run against a shadow model that
 * checks every invariant after every operation (refcounts never negative, no leaks). */
#include <stdint.h>
#include <stdlib.h>

#include "core/status.h"
#include "engine/block_manager.h"
#include "sampling/rng.h"
#include "test_util.h"

static void fill_tokens(int32_t *t, int seed) {
    for (int i = 0; i < DI_BLOCK_TOKENS; i++) t[i] = seed * 1000 + i;
}

static void test_alloc_free(void) {
    di_block_manager *bm;
    CHECK(di_block_manager_create(0, &bm) == DI_ERR_INVALID_ARG);
    CHECK_OK(di_block_manager_create(4, &bm));
    CHECK_EQ_INT(di_block_manager_n_free(bm), 4);
    int32_t b[4];
    for (int i = 0; i < 4; i++) {
        b[i] = di_block_manager_alloc(bm);
        CHECK(b[i] >= 0 && b[i] < 4);
        CHECK_EQ_INT(di_block_manager_refcount(bm, b[i]), 1);
    }
    CHECK_EQ_INT(di_block_manager_alloc(bm), -1);
    CHECK_EQ_INT(di_block_manager_n_free(bm), 0);
    di_block_manager_ref(bm, b[2]);
    CHECK_EQ_INT(di_block_manager_refcount(bm, b[2]), 2);
    di_block_manager_unref(bm, b[2]);
    CHECK_EQ_INT(di_block_manager_n_free(bm), 0);
    for (int i = 0; i < 4; i++) di_block_manager_unref(bm, b[i]);
    CHECK_EQ_INT(di_block_manager_n_free(bm), 4);
    CHECK_OK(di_block_manager_check(bm));
    di_block_manager_free(bm);
    di_block_manager_free(NULL);
}

static void test_prefix_lru(void) {
    di_block_manager *bm;
    CHECK_OK(di_block_manager_create(4, &bm));
    int32_t t[4][DI_BLOCK_TOKENS];
    uint64_t h[4], parent = DI_PREFIX_HASH_ROOT;
    int32_t b[4];
    for (int i = 0; i < 4; i++) {
        fill_tokens(t[i], i);
        h[i] = di_block_manager_hash(parent, t[i]);
        b[i] = di_block_manager_alloc(bm);
        CHECK_EQ_INT(di_block_manager_register(bm, b[i], h[i], parent, t[i]), 1);
        parent = h[i];
    }
    /* chain hash depends on the parent */
    CHECK(di_block_manager_hash(DI_PREFIX_HASH_ROOT, t[1]) != h[1]);
    /* lookup: exact triple only */
    CHECK_EQ_INT(di_block_manager_lookup(bm, h[1], h[0], t[1]), b[1]);
    CHECK_EQ_INT(di_block_manager_lookup(bm, h[1], DI_PREFIX_HASH_ROOT, t[1]), -1);
    int32_t other[DI_BLOCK_TOKENS];
    fill_tokens(other, 1);
    other[63] = -5;
    CHECK_EQ_INT(di_block_manager_lookup(bm, h[1], h[0], other), -1); /* simulated collision */
    /* duplicate hash on another block: no-op */
    CHECK_EQ_INT(di_block_manager_register(bm, b[2], h[1], h[0], t[1]), 0);
    /* free in order 3,2,1,0 (a sequence frees last block first): cached, at the tail */
    for (int i = 3; i >= 0; i--) di_block_manager_unref(bm, b[i]);
    CHECK_EQ_INT(di_block_manager_n_cached(bm), 4);
    CHECK_EQ_INT(di_block_manager_n_free(bm), 4);
    /* still found while free */
    CHECK_EQ_INT(di_block_manager_lookup(bm, h[2], h[1], t[2]), b[2]);
    /* taking a cached free block back removes it from the free queue */
    di_block_manager_ref(bm, b[0]);
    CHECK_EQ_INT(di_block_manager_n_free(bm), 3);
    CHECK_EQ_INT(di_block_manager_n_cached(bm), 2 + 1);
    CHECK_OK(di_block_manager_check(bm));
    /* eviction order: the least recently freed first: b3 (freed first), then b2, b1 */
    int32_t e = di_block_manager_alloc(bm);
    CHECK_EQ_INT(e, b[3]);
    CHECK_EQ_INT(di_block_manager_lookup(bm, h[3], h[2], t[3]), -1);
    CHECK_EQ_INT(di_block_manager_evictions(bm), 1);
    /* an uncached free block is reused before any cached one */
    di_block_manager_unref(bm, e);
    CHECK_EQ_INT(di_block_manager_alloc(bm), b[3]);
    CHECK_EQ_INT(di_block_manager_lookup(bm, h[2], h[1], t[2]), b[2]);
    CHECK_EQ_INT(di_block_manager_alloc(bm), b[2]);
    CHECK_EQ_INT(di_block_manager_alloc(bm), b[1]);
    CHECK_EQ_INT(di_block_manager_alloc(bm), -1);
    CHECK_EQ_INT(di_block_manager_lookup(bm, h[0], DI_PREFIX_HASH_ROOT, t[0]), b[0]); /* held: kept */
    CHECK_OK(di_block_manager_check(bm));
    di_block_manager_free(bm);
}

/* Random operations against a shadow model. */
static void test_random(void) {
    enum { N = 37, KEYS = 60 };
    di_block_manager *bm;
    CHECK_OK(di_block_manager_create(N, &bm));
    int shadow_ref[N] = {0};
    int shadow_key[N]; /* key index registered on the block, -1 none */
    for (int i = 0; i < N; i++) shadow_key[i] = -1;
    int32_t toks[KEYS][DI_BLOCK_TOKENS];
    uint64_t hash[KEYS];
    for (int k = 0; k < KEYS; k++) {
        fill_tokens(toks[k], k + 7);
        /* force many table collisions: few distinct low bits */
        hash[k] = ((uint64_t)k << 40) | (uint64_t)(k % 3);
    }
    uint64_t x = 99;
    int bad = 0;
    for (int it = 0; it < 20000 && !bad; it++) {
        x = di_rng_mix64(x);
        int op = (int)(x % 5), b = (int)((x >> 8) % N), k = (int)((x >> 20) % KEYS);
        if (op == 0) {
            int32_t a = di_block_manager_alloc(bm);
            int nfree = 0;
            for (int i = 0; i < N; i++) nfree += shadow_ref[i] == 0;
            if (nfree == 0) bad |= a != -1;
            else {
                bad |= a < 0 || shadow_ref[a] != 0;
                if (a >= 0) {
                    shadow_ref[a] = 1;
                    shadow_key[a] = -1;
                }
            }
        } else if (op == 1 && shadow_ref[b] > 0) {
            di_block_manager_unref(bm, b);
            shadow_ref[b]--;
        } else if (op == 2 && (shadow_ref[b] > 0 || shadow_key[b] >= 0)) {
            di_block_manager_ref(bm, b);
            shadow_ref[b]++;
        } else if (op == 3 && shadow_ref[b] > 0) {
            int holder = -1;
            for (int i = 0; i < N; i++)
                if (shadow_key[i] == k) holder = i;
            int r = di_block_manager_register(bm, b, hash[k], 0, toks[k]);
            int expect = holder < 0 && shadow_key[b] < 0;
            bad |= r != expect;
            if (expect) shadow_key[b] = k;
        } else if (op == 4) {
            int holder = -1;
            for (int i = 0; i < N; i++)
                if (shadow_key[i] == k) holder = i;
            bad |= di_block_manager_lookup(bm, hash[k], 0, toks[k]) != holder;
        }
        if (di_block_manager_check(bm) != DI_OK) {
            fprintf(stderr, "iteration %d: %s\n", it, di_last_error());
            bad = 1;
        }
        for (int i = 0; i < N; i++) bad |= di_block_manager_refcount(bm, i) != shadow_ref[i];
        if (bad) fprintf(stderr, "mismatch at iteration %d (op %d)\n", it, op);
    }
    CHECK(!bad);
    for (int i = 0; i < N; i++)
        while (shadow_ref[i]-- > 0) di_block_manager_unref(bm, i);
    CHECK_EQ_INT(di_block_manager_n_free(bm), N);
    CHECK_OK(di_block_manager_check(bm));
    di_block_manager_free(bm);
}

TEST_MAIN(test_alloc_free, test_prefix_lru, test_random)
