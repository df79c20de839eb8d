/* scheduler.h - continuous batching: which sequences run in the next step and how many
 * tokens each, within a token budget and a limit on running sequences.
 *
 * Owner: engine. Its only output is a step plan; it never touches tensors or token values
 * beyond hashing full blocks for the prefix cache. Policy of di_scheduler_schedule:
 *   1. decode: every running sequence in the decode phase gets 1 token, in priority order
 *      (priority, then arrival). When a block is needed and none is free, the lowest-priority
 *      running sequence not yet planned is preempted (recompute: blocks released, generated
 *      tokens kept, back to waiting); if that is the sequence itself, it is preempted.
 *   2. chunked prefill of running sequences whose prompt (or recompute) is unfinished: as
 *      many tokens as the budget and free blocks allow (preempting lower-priority, unplanned
 *      sequences only when not even one block is available).
 *   3. admission from the waiting queue (priority order, head-of-line): prefix-cache lookup of
 *      full blocks within the first len - 1 tokens, then a chunk of the rest. Admission stops
 *      at the first sequence that does not fit (seats, budget, or blocks); it never preempts,
 *      and it is skipped in a step that preempted (the freed blocks would only thrash).
 * Copy-on-write: a sequence about to write into a block shared with another sequence gets a
 * fresh block and the plan lists the copy (src -> dst) the runner performs before the forward.
 * Exact recompute (config exact_recompute, for executors whose rows do not depend on the rest
 * of the batch but whose decode and prefill paths round differently, e.g. the CPU backend's
 * absorbed vs naive MLA): every token's KV is computed the way it was the first time. A
 * preempted sequence recomputes its prompt in prefill chunks that stop at prompt_len and its
 * generated tokens as decode entries of several tokens (step 1: the tokens from n_computed to
 * len, budget and blocks allowing), and only blocks of prompt tokens enter the prefix cache (a
 * block holding generated tokens has KV from decode steps, which no prefill of a prompt, nor a
 * resumed sequence's prefill, reproduces). Preemption and cache reuse then change no bit.
 *
 * Overlap: planning advances n_computed (and allocates blocks) as if the step ran, and needs
 * no token values of the step being planned; di_scheduler_commit (registering newly full
 * blocks in the prefix cache) uses the plan's own counts, so it can run after the next plan
 * has been made. di_scheduler_schedule_chained plans the next decode step of the same rows
 * while the current one is still computing (its token in flight: n_computed = len + 1 until
 * the engine appends it). See docs/engine.md "Step loop". */
#ifndef DI_ENGINE_SCHEDULER_H
#define DI_ENGINE_SCHEDULER_H
#include <stdint.h>
#include "deepinfer.h"
#include "engine/block_manager.h"
#include "engine/sequence.h"

typedef struct di_scheduler_config {
    int max_batch_tokens;      /* token budget per step (>= 1) */
    int max_seqs;              /* running seats (>= 1) */
    int enable_prefix_cache;
    int exact_recompute;       /* see "Exact recompute" above (0: a preempted sequence's prompt and
                                * generated tokens are recomputed together in prefill chunks) */
} di_scheduler_config;

/* One step's work. Sequences [0, n_decode) are decode (1 token each; with exact_recompute
 * also a resumed sequence's generated tokens, several at once), the rest prefill chunks. Arrays are owned by the scheduler; the scheduler alternates between two plans, so
 * a plan stays valid until the second schedule call after the one that made it. */
typedef struct di_step_plan {
    int n_seqs, n_decode, n_tokens;
    di_seq **seqs;             /* [n_seqs] */
    int32_t *start;            /* [n_seqs] first position computed (n_computed before the step) */
    int32_t *n_new;            /* [n_seqs] tokens computed */
    uint8_t *sample;           /* [n_seqs] 1 if the step reaches the sequence's end (a token is sampled) */
    int n_copies;              /* copy-on-write block copies to run before the forward */
    int32_t *copy_src, *copy_dst;
    int n_preempted;           /* sequences preempted while planning (now waiting) */
    di_seq **preempted;
    int prefix_hit_tokens;     /* tokens admitted from the prefix cache in this plan */
    int max_blocks;            /* the largest n_blocks among seqs (>= 1): block-table width */
} di_step_plan;

typedef struct di_scheduler di_scheduler;

di_status di_scheduler_create(const di_scheduler_config *cfg, di_block_manager *bm, di_scheduler **out);
void di_scheduler_free(di_scheduler *s);

/* Queues a new (or resumed) sequence. Its state becomes WAITING. */
di_status di_scheduler_add(di_scheduler *s, di_seq *seq);
/* Plans the next step. */
const di_step_plan *di_scheduler_schedule(di_scheduler *s);
/* The next decode step of prev's sequences i with keep[i] (keep NULL: all; prev: the latest
 * plan, all decode rows, each sampling a token that is still being computed, i.e. not
 * appended yet), one token further, in prev's order, every row sampled. NULL, with nothing
 * changed, when no row is kept or it cannot be made without preempting or copying: a kept row
 * would need a free block and there are too few, would write into a shared block, is no longer
 * running, or has no room for two more tokens. */
const di_step_plan *di_scheduler_schedule_chained(di_scheduler *s, const di_step_plan *prev, const uint8_t *keep);
/* Takes back a plan whose step did not run: n_computed of its running sequences returns to
 * the plan's start (blocks it allocated stay with their sequences). */
void di_scheduler_unplan(di_scheduler *s, const di_step_plan *plan);
/* Running seats not taken (max_seqs - seats used). */
int di_scheduler_free_seats(const di_scheduler *s);
/* After the planned step's forward pass: registers blocks it filled in the prefix cache. */
void di_scheduler_commit(di_scheduler *s, const di_step_plan *plan);
/* The same for plan entry i only (to fuse with other per-sequence work; must run before the
 * sequence can be finished or preempted). */
void di_scheduler_commit_entry(di_scheduler *s, const di_step_plan *plan, int i);
/* Whether plan entry i filled a block that di_scheduler_commit_entry may register (a cheap
 * test that lets the caller skip the call; commit_entry itself checks everything). */
static inline int di_scheduler_commit_due(const di_step_plan *plan, int i) {
    return (plan->start[i] + plan->n_new[i]) / DI_BLOCK_TOKENS > plan->seqs[i]->n_registered;
}
/* child (tokens already copied, not queued) shares all of parent's blocks and computed
 * prefix and joins the running list; parent gives up one seat to it. */
di_status di_scheduler_fork(di_scheduler *s, di_seq *parent, di_seq *child);
/* Removes a sequence from the waiting queue or running list and releases its blocks (last
 * block first, so the prefix's head stays cached longest). State becomes FINISHED. */
void di_scheduler_finish(di_scheduler *s, di_seq *seq);

int di_scheduler_n_waiting(const di_scheduler *s);
int di_scheduler_n_running(const di_scheduler *s);
uint64_t di_scheduler_preemptions(const di_scheduler *s);
di_block_manager *di_scheduler_blocks(di_scheduler *s);
#endif
