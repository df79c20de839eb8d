/* sequence.h - one sequence: a prompt and the tokens generated after it, how much of it has
 * KV in the cache, and the KV blocks that hold it. A request with n completions has n
 * sequences (they share the prompt's blocks after the fork).
 *
 * Owner: engine. The scheduler reads and advances n_computed and the block table; the engine
 * appends sampled tokens. Invariants:
 *   prompt_len <= len <= cap;  0 <= n_computed <= len
 *   blocks[0 .. n_blocks) hold positions [0, n_blocks * 64) and n_blocks * 64 >= n_computed
 *   hashes[j] (j < n_hashed) is the chain hash of the full block j of tokens
 *   n_registered <= n_computed / 64: blocks known to the prefix cache (or already in it)
 *   n_computed counts tokens whose KV is written or scheduled to be written by a planned step
 *   (advanced when a step is planned, so a later plan can be made before the step finishes).
 * A sequence is in the decode phase when everything but its newest generated token is computed. */
#ifndef DI_ENGINE_SEQUENCE_H
#define DI_ENGINE_SEQUENCE_H
#include <stdint.h>
#include "deepinfer.h"
#include "engine/block_manager.h"

typedef enum di_seq_state {
    DI_SEQ_NEW = 0,         /* not queued yet */
    DI_SEQ_WAITING,         /* in the scheduler's waiting queue (no blocks) */
    DI_SEQ_RUNNING,         /* in the running list (holds blocks) */
    DI_SEQ_FORK_PENDING,    /* completion k > 0 of an n > 1 request before its prompt is done */
    DI_SEQ_FINISHED
} di_seq_state;

struct di_req;

typedef struct di_seq {
    /* hot: read by every step's planning, batch assembly and token append; these first 64
       bytes share one cache line where the owner aligns the sequence (di_completion does) */
    int32_t *tokens;        /* [cap] prompt then generated ids */
    int32_t *blocks;        /* [cap_blocks] */
    struct di_req *req;     /* owning request (NULL in scheduler-only tests) */
    int len, prompt_len;
    int n_computed;
    int n_blocks;
    int n_registered;
    uint32_t plan_stamp;    /* scheduler scratch: the plan that last included it */
    uint64_t table_version; /* changes whenever blocks[0 .. n_blocks) change other than by
                               appending (release, copy-on-write, admission, fork); lets the
                               runner copy only appended entries of a block table */
    int index;              /* completion index; the sampler's RNG stream */
    uint8_t state;          /* di_seq_state */
    uint8_t tail_shared;    /* scheduler: set by a fork; 0 promises that a block holding
                               computed tokens that the next token is written after is this
                               sequence's alone (no refcount lookup needed) */
    /* cold: admission, preemption, prefix hashing */
    uint64_t arrival;       /* order among equal priorities (request id) */
    uint64_t *hashes;       /* [cap_blocks] */
    int priority;           /* lower = more important */
    int seats;              /* running slots held: 1 + completions that will fork from it */
    int cap, cap_blocks;
    int n_hashed;
    int n_cached_first;     /* prefix-cache hit tokens at first admission, -1 before it */
    int n_preempted;        /* times preempted */
} di_seq;

/* Allocates room for `cap` tokens (>= prompt_len) and copies the prompt. */
di_status di_seq_init(di_seq *s, const int32_t *prompt, int prompt_len, int cap);
/* Frees the arrays (the blocks must have been released by the scheduler). */
void di_seq_release(di_seq *s);
/* dst (initialized with the same cap) takes src's tokens and hashes; no blocks. */
void di_seq_copy_tokens(di_seq *dst, const di_seq *src);
/* Computes chain hashes of full blocks up to n_full (<= len / 64). */
void di_seq_hash_blocks(di_seq *s, int n_full);
static inline uint64_t di_seq_parent_hash(const di_seq *s, int block) {
    return block == 0 ? DI_PREFIX_HASH_ROOT : s->hashes[block - 1];
}
static inline int di_seq_is_decode(const di_seq *s) {
    return s->len > s->prompt_len && s->n_computed == s->len - 1;
}
/* Order of scheduling: priority, then arrival, then completion index. */
static inline int di_seq_before(const di_seq *a, const di_seq *b) {
    if (a->priority != b->priority) return a->priority < b->priority;
    if (a->arrival != b->arrival) return a->arrival < b->arrival;
    return a->index < b->index;
}
#endif
