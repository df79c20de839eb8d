/* block_manager.h - the KV cache's block allocator: refcounted 64-token blocks and the prefix
 * cache. It never touches tensors: it hands out block ids in [0, n_blocks) of the model's
 * paged latent KV pool and remembers which full blocks hold which token prefix.
 *
 * Owner: engine. States of a block:
 *   used    refcount >= 1 (held by running sequences; shared blocks have refcount > 1)
 *   free    refcount == 0, in the free queue. A free block that still has a hash is "cached":
 *           its KV stays valid and a later request with the same prefix takes it back.
 * The free queue is an LRU: di_block_manager_alloc takes its head (evicting the block's hash if
 * it had one); blocks freed without a hash go to the head (reused first), cached blocks to the
 * tail (reused last). Callers free a sequence's blocks last-to-first so that a prefix's first
 * blocks are evicted last.
 *
 * Prefix hashes are a chain: h_j = di_hash64_chain(h_{j-1}, tokens of block j) with h_{-1} =
 * DI_PREFIX_HASH_ROOT. A registered block stores its hash, its parent hash and its 64 token
 * ids; lookups compare all three, so a 64-bit hash collision cannot return a wrong block.
 * One block per hash: registering a hash that another block already holds is a no-op.
 * Invariants (di_block_manager_check): refcount >= 0; refcount == 0 <=> in the free queue;
 * n_free == queue length; every hash-table entry names a block whose stored hash equals it. */
#ifndef DI_ENGINE_BLOCK_MANAGER_H
#define DI_ENGINE_BLOCK_MANAGER_H
#include <stdint.h>
#include "deepinfer.h"

#define DI_BLOCK_TOKENS 64
#define DI_PREFIX_HASH_ROOT 0x6465657069666572ull

typedef struct di_block_manager di_block_manager;

di_status di_block_manager_create(int n_blocks, di_block_manager **out);
void di_block_manager_free(di_block_manager *bm);

int di_block_manager_total(const di_block_manager *bm);
int di_block_manager_n_free(const di_block_manager *bm);    /* refcount 0, including cached */
int di_block_manager_n_cached(const di_block_manager *bm);  /* refcount 0 and hashed */
int di_block_manager_refcount(const di_block_manager *bm, int32_t block);
/* The refcounts of all blocks ([total], read-only, valid for the manager's lifetime): lets a
 * per-sequence hot loop read a refcount without a call. */
const int32_t *di_block_manager_refcounts(const di_block_manager *bm);
uint64_t di_block_manager_evictions(const di_block_manager *bm);

/* A block with refcount 1 and no hash, or -1 if every block is in use. */
int32_t di_block_manager_alloc(di_block_manager *bm);
/* Adds a reference (sharing; a free cached block leaves the free queue). */
void di_block_manager_ref(di_block_manager *bm, int32_t block);
/* Drops a reference; at zero the block joins the free queue (tail if hashed, else head). */
void di_block_manager_unref(di_block_manager *bm, int32_t block);

/* Chain hash of one full block of tokens. */
uint64_t di_block_manager_hash(uint64_t parent, const int32_t *tokens);
/* The block holding exactly (hash, parent, tokens[64]), or -1. Does not change refcounts. */
int32_t di_block_manager_lookup(const di_block_manager *bm, uint64_t hash, uint64_t parent, const int32_t *tokens);
/* Marks a used, full block as holding (hash, parent, tokens). Returns 1 if registered, 0 if
 * another block already holds that hash (or the block already has one). */
int di_block_manager_register(di_block_manager *bm, int32_t block, uint64_t hash, uint64_t parent,
                              const int32_t *tokens);

/* Checks every invariant; on violation returns DI_ERR_INTERNAL naming it. */
di_status di_block_manager_check(const di_block_manager *bm);
#endif
