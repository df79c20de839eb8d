/* scheduler.c - continuous batching: decode first, then chunked prefill, then admission with
 * prefix-cache lookups; preemption by recompute; copy-on-write of shared partial blocks (see
 * scheduler.h for the policy).
 *
 * Owns: the waiting queue and the running list, both kept sorted by di_seq_before (so the
 * lowest-priority running sequence is the last one), and the plan arrays (sized max_seqs at
 * create; planning allocates nothing). Invariant: seats_used = sum of seats of running
 * sequences <= max_seqs; a sequence is in exactly one of waiting / running, or neither
 * (fork-pending or finished). */
#include "engine/scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

struct di_scheduler {
    di_scheduler_config cfg;
    di_block_manager *bm;
    const int32_t *ref;     /* bm's refcounts */
    di_seq **waiting;
    int n_waiting, cap_waiting;
    di_seq **running;       /* [max_seqs] */
    int n_running, seats_used;
    di_step_plan plans[2];  /* alternate: a plan stays valid while the next one is made */
    di_step_plan *plan;     /* the current one */
    uint32_t stamp;
    uint64_t preemptions;
    uint64_t versions;      /* source of di_seq.table_version values */
};

di_status di_scheduler_create(const di_scheduler_config *cfg, di_block_manager *bm, di_scheduler **out) {
    *out = NULL;
    if (cfg->max_batch_tokens < 1) return di_error(DI_ERR_INVALID_ARG, "scheduler: max_batch_tokens %d: expected >= 1", cfg->max_batch_tokens);
    if (cfg->max_seqs < 1) return di_error(DI_ERR_INVALID_ARG, "scheduler: max_seqs %d: expected >= 1", cfg->max_seqs);
    di_scheduler *s = calloc(1, sizeof *s);
    if (!s) return di_error(DI_ERR_NOMEM, "scheduler: out of memory");
    s->cfg = *cfg;
    s->bm = bm;
    s->ref = di_block_manager_refcounts(bm);
    size_t m = (size_t)cfg->max_seqs;
    s->running = malloc(m * sizeof *s->running);
    for (int k = 0; k < 2; k++) {
        di_step_plan *p = &s->plans[k];
        p->seqs = malloc(m * sizeof *p->seqs);
        p->start = malloc(m * sizeof *p->start);
        p->n_new = malloc(m * sizeof *p->n_new);
        p->sample = malloc(m);
        p->copy_src = malloc(m * sizeof *p->copy_src);
        p->copy_dst = malloc(m * sizeof *p->copy_dst);
        p->preempted = malloc(m * sizeof *p->preempted);
        if (!p->seqs || !p->start || !p->n_new || !p->sample || !p->copy_src || !p->copy_dst || !p->preempted) {
            di_scheduler_free(s);
            return di_error(DI_ERR_NOMEM, "scheduler: out of memory for %d sequences", cfg->max_seqs);
        }
    }
    if (!s->running) {
        di_scheduler_free(s);
        return di_error(DI_ERR_NOMEM, "scheduler: out of memory for %d sequences", cfg->max_seqs);
    }
    s->plan = &s->plans[0];
    *out = s;
    return DI_OK;
}

void di_scheduler_free(di_scheduler *s) {
    if (!s) return;
    free(s->waiting);
    free(s->running);
    for (int k = 0; k < 2; k++) {
        di_step_plan *p = &s->plans[k];
        free(p->seqs);
        free(p->start);
        free(p->n_new);
        free(p->sample);
        free(p->copy_src);
        free(p->copy_dst);
        free(p->preempted);
    }
    free(s);
}

int di_scheduler_n_waiting(const di_scheduler *s) { return s->n_waiting; }
int di_scheduler_n_running(const di_scheduler *s) { return s->n_running; }
uint64_t di_scheduler_preemptions(const di_scheduler *s) { return s->preemptions; }
di_block_manager *di_scheduler_blocks(di_scheduler *s) { return s->bm; }

/* ---- sorted arrays ---- */

static int sorted_pos(di_seq *const *a, int n, const di_seq *q) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (di_seq_before(a[mid], q)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void sorted_insert(di_seq **a, int *n, di_seq *q) {
    int at = sorted_pos(a, *n, q);
    memmove(a + at + 1, a + at, (size_t)(*n - at) * sizeof *a);
    a[at] = q;
    (*n)++;
}

static void remove_at(di_seq **a, int *n, int at) {
    memmove(a + at, a + at + 1, (size_t)(*n - at - 1) * sizeof *a);
    (*n)--;
}

static int index_of(di_seq *const *a, int n, const di_seq *q) {
    for (int i = n - 1; i >= 0; i--)
        if (a[i] == q) return i;
    return -1;
}

static di_status reserve_waiting(di_scheduler *s, int extra) {
    int need = s->n_waiting + s->n_running + extra;
    if (need <= s->cap_waiting) return DI_OK;
    int cap = s->cap_waiting ? s->cap_waiting : 64;
    while (cap < need) cap *= 2;
    di_seq **w = realloc(s->waiting, (size_t)cap * sizeof *w);
    if (!w) return di_error(DI_ERR_NOMEM, "scheduler: out of memory for %d queued sequences", cap);
    s->waiting = w;
    s->cap_waiting = cap;
    return DI_OK;
}

di_status di_scheduler_add(di_scheduler *s, di_seq *q) {
    if (q->seats > s->cfg.max_seqs)
        return di_error(DI_ERR_INVALID_ARG, "scheduler: a request with n = %d needs more than max_seqs = %d running slots",
                        q->seats, s->cfg.max_seqs);
    DI_TRY(reserve_waiting(s, 1));
    DI_ASSERT(q->n_blocks == 0);
    q->state = DI_SEQ_WAITING;
    sorted_insert(s->waiting, &s->n_waiting, q);
    return DI_OK;
}

/* ---- blocks of one sequence ---- */

static void release_blocks(di_scheduler *s, di_seq *q) {
    for (int j = q->n_blocks - 1; j >= 0; j--) di_block_manager_unref(s->bm, q->blocks[j]);
    q->n_blocks = 0;
    q->tail_shared = 0;
    q->n_registered = 0;
    q->table_version = ++s->versions;
}

/* 1 if computing the next token writes into a block shared with another sequence */
static int needs_cow(const di_scheduler *s, const di_seq *q) {
    int first = q->n_computed;
    if (first % DI_BLOCK_TOKENS == 0 || first / DI_BLOCK_TOKENS >= q->n_blocks) return 0;
    return s->ref[q->blocks[first / DI_BLOCK_TOKENS]] > 1;
}

/* How many of `want` next tokens fit if `avail` free blocks may be used; *cow = needs_cow. */
static int fit_tokens(const di_scheduler *s, const di_seq *q, int want, int avail, int *cow) {
    *cow = needs_cow(s, q);
    if (avail < *cow) return 0;
    long room = (long)q->n_blocks * DI_BLOCK_TOKENS - q->n_computed + (long)(avail - *cow) * DI_BLOCK_TOKENS;
    if (room < 0) room = 0;
    return want < room ? want : (int)room;
}

/* Records plan entry (q, n) and advances n_computed (blocks already in place). */
static inline void add_entry(di_scheduler *s, di_seq *q, int n) {
    di_step_plan *p = s->plan;
    if (q->n_blocks > p->max_blocks) p->max_blocks = q->n_blocks;
    int k = p->n_seqs++;
    p->seqs[k] = q;
    p->start[k] = q->n_computed;
    p->n_new[k] = n;
    q->n_computed += n;
    p->sample[k] = q->n_computed == q->len;
    p->n_tokens += n;
    q->plan_stamp = s->stamp;
}

/* Allocates (and copies-on-write, when cow = needs_cow(q) says so) the blocks for tokens
 * [n_computed, n_computed + n); the caller has checked they fit. Advances n_computed and
 * records the plan entry. */
static void plan_tokens(di_scheduler *s, di_seq *q, int n, int cow) {
    di_step_plan *p = s->plan;
    if (cow) {
        int j = q->n_computed / DI_BLOCK_TOKENS;
        int32_t nb = di_block_manager_alloc(s->bm);
        DI_ASSERT(nb >= 0);
        p->copy_src[p->n_copies] = q->blocks[j];
        p->copy_dst[p->n_copies] = nb;
        p->n_copies++;
        di_block_manager_unref(s->bm, q->blocks[j]);
        q->blocks[j] = nb;
        q->table_version = ++s->versions;
        q->tail_shared = 0; /* the copy, and any block allocated below, are its own */
    }
    int need = (q->n_computed + n + DI_BLOCK_TOKENS - 1) / DI_BLOCK_TOKENS;
    DI_ASSERT(need <= q->cap_blocks);
    while (q->n_blocks < need) {
        int32_t nb = di_block_manager_alloc(s->bm);
        DI_ASSERT(nb >= 0);
        q->blocks[q->n_blocks++] = nb;
    }
    add_entry(s, q, n);
}

/* The decode token of q (at n_computed) if its blocks fit in the free ones: 1 = planned, 0 =
 * nothing changed. The same decision as fit_tokens(q, 1, n_free) == 1 followed by
 * plan_tokens(q, 1): given n_blocks * 64 >= n_computed, the token needs a copy-on-write block
 * when it lands inside a shared block, or a new block when it starts one past the table;
 * otherwise (63 steps in 64) it only becomes a plan entry.
 * A partly filled block can only be shared through a fork (the prefix cache shares full
 * blocks, which their holders never write again), so the refcount is read only while
 * tail_shared (set by di_scheduler_fork) says a fork may still share it; once it reads 1 the
 * block stays this sequence's alone until the next fork. */
static inline int plan_decode(di_scheduler *s, di_seq *q) {
    const int pos = q->n_computed, j = pos / DI_BLOCK_TOKENS;
    const int inside = j < q->n_blocks, partial = inside && pos % DI_BLOCK_TOKENS != 0;
#ifndef NDEBUG
    DI_ASSERT(!partial || q->tail_shared || s->ref[q->blocks[j]] == 1);
#endif
    int cow = 0;
    if (partial && q->tail_shared) {
        cow = s->ref[q->blocks[j]] > 1;
        if (!cow) q->tail_shared = 0;
    }
    if (inside && !cow) {
        add_entry(s, q, 1);
        return 1;
    }
    if (cow + !inside > di_block_manager_n_free(s->bm)) return 0;
    plan_tokens(s, q, 1, cow);
    return 1;
}

/* The end of q's next prefill chunk: its length, but with exact recompute the prompt's end when
 * q was preempted after generating (its generated tokens are recomputed by decode entries). */
static inline int prefill_end(const di_scheduler *s, const di_seq *q) {
    return s->cfg.exact_recompute && q->len > q->prompt_len ? q->prompt_len : q->len;
}

/* Whether q's next tokens are decode work: its newest token (di_seq_is_decode), or with exact
 * recompute any generated tokens not computed yet, once its prompt is. */
static inline int in_decode(const di_scheduler *s, const di_seq *q) {
    if (!s->cfg.exact_recompute) return di_seq_is_decode(q);
    return q->len > q->prompt_len && q->n_computed >= q->prompt_len && q->n_computed < q->len;
}

static void preempt(di_scheduler *s, int running_index) {
    di_seq *q = s->running[running_index];
    remove_at(s->running, &s->n_running, running_index);
    s->seats_used -= q->seats;
    release_blocks(s, q);
    q->n_computed = 0;
    q->n_preempted++;
    q->state = DI_SEQ_WAITING;
    sorted_insert(s->waiting, &s->n_waiting, q); /* capacity: reserve_waiting covers all sequences */
    s->plan->preempted[s->plan->n_preempted++] = q;
    s->preemptions++;
}

/* Lowest-priority running sequence after index i that is not in this plan, or -1. */
static int victim_after(const di_scheduler *s, int i) {
    for (int j = s->n_running - 1; j > i; j--)
        if (s->running[j]->plan_stamp != s->stamp) return j;
    return -1;
}

/* ---- admission ---- */

/* Tries to admit waiting sequence q with up to `budget` tokens; returns tokens planned (0 =
 * not admitted, nothing changed). The prefix cache serves full blocks before the last token up
 * to prefill_end(q) (all of q's tokens; with exact recompute, its prompt's), so the chunk
 * planned is never empty. */
static int admit(di_scheduler *s, di_seq *q, int budget) {
    DI_ASSERT(q->n_blocks == 0);
    int hits = 0, free_hits = 0;
    if (s->cfg.enable_prefix_cache) {
        int n_look = (prefill_end(s, q) - 1) / DI_BLOCK_TOKENS;
        di_seq_hash_blocks(q, n_look);
        for (; hits < n_look; hits++) {
            int32_t b = di_block_manager_lookup(s->bm, q->hashes[hits], di_seq_parent_hash(q, hits),
                                                q->tokens + (size_t)hits * DI_BLOCK_TOKENS);
            if (b < 0) break;
            q->blocks[hits] = b;
            free_hits += di_block_manager_refcount(s->bm, b) == 0;
        }
    }
    int hit_tokens = hits * DI_BLOCK_TOKENS;
    int want = prefill_end(s, q) - hit_tokens;
    if (want > budget) want = budget;
    int avail = di_block_manager_n_free(s->bm) - free_hits;
    long room = (long)avail * DI_BLOCK_TOKENS;
    int n = want < room ? want : (int)(room > 0 ? room : 0);
    if (n <= 0) return 0;
    for (int j = 0; j < hits; j++) di_block_manager_ref(s->bm, q->blocks[j]);
    q->n_blocks = hits;
    q->table_version = ++s->versions;
    q->n_registered = hits;
    q->n_computed = hit_tokens;
    if (q->n_cached_first < 0) q->n_cached_first = hit_tokens;
    s->plan->prefix_hit_tokens += hit_tokens;
    plan_tokens(s, q, n, needs_cow(s, q));
    return n;
}

/* ---- the plan ---- */

/* The other plan buffer, emptied, as the current plan (the previous one stays valid). */
static di_step_plan *next_plan(di_scheduler *s) {
    di_step_plan *p = s->plan = &s->plans[s->plan == &s->plans[0]];
    p->n_seqs = p->n_decode = p->n_tokens = p->n_copies = p->n_preempted = p->prefix_hit_tokens = 0;
    p->max_blocks = 1;
    s->stamp++;
    return p;
}

const di_step_plan *di_scheduler_schedule_chained(di_scheduler *s, const di_step_plan *prev, const uint8_t *keep) {
    if (prev != s->plan || prev->n_seqs == 0 || prev->n_decode != prev->n_seqs) return NULL;
    /* check every kept row first, so that a refusal changes nothing */
    int need = 0, kept = 0;
    for (int i = 0; i < prev->n_seqs; i++) {
        if (keep && !keep[i]) continue;
        const di_seq *q = prev->seqs[i];
        const int pos = q->n_computed, j = pos / DI_BLOCK_TOKENS;
        if (q->state != DI_SEQ_RUNNING || !prev->sample[i] || pos != prev->start[i] + 1 || pos != q->len ||
            pos + 1 >= q->cap)
            return NULL;
        if (j >= q->n_blocks) need++;
        else if (pos % DI_BLOCK_TOKENS != 0 && q->tail_shared && s->ref[q->blocks[j]] > 1)
            return NULL; /* copy-on-write */
        kept++;
    }
    if (kept == 0 || need > di_block_manager_n_free(s->bm)) return NULL;
    di_step_plan *p = next_plan(s);
    for (int i = 0; i < prev->n_seqs; i++) {
        if (keep && !keep[i]) continue;
        di_seq *q = prev->seqs[i];
        if (q->n_computed / DI_BLOCK_TOKENS >= q->n_blocks) {
            int32_t nb = di_block_manager_alloc(s->bm);
            DI_ASSERT(nb >= 0);
            q->blocks[q->n_blocks++] = nb;
        }
        add_entry(s, q, 1);
        p->sample[p->n_seqs - 1] = 1; /* the in-flight token is the sequence's last */
    }
    p->n_decode = p->n_seqs;
    return p;
}

void di_scheduler_unplan(di_scheduler *s, const di_step_plan *plan) {
    (void)s;
    for (int i = 0; i < plan->n_seqs; i++)
        if (plan->seqs[i]->state == DI_SEQ_RUNNING) plan->seqs[i]->n_computed = plan->start[i];
}

int di_scheduler_free_seats(const di_scheduler *s) { return s->cfg.max_seqs - s->seats_used; }

const di_step_plan *di_scheduler_schedule(di_scheduler *s) {
    di_step_plan *p = next_plan(s);
    int budget = s->cfg.max_batch_tokens;
    di_block_manager *bm = s->bm;

    /* 1. decode (and, with exact recompute, resumed sequences' generated tokens) */
    int prefilling = 0; /* running sequences left for step 2 */
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        di_seq *q = s->running[i];
        if (!in_decode(s, q)) {
            prefilling = 1;
            continue;
        }
        const int want = q->len - q->n_computed < budget ? q->len - q->n_computed : budget;
        for (;;) {
            int cow, n = want == 1 ? plan_decode(s, q) : fit_tokens(s, q, want, di_block_manager_n_free(bm), &cow);
            if (n > 0) {
                if (want > 1) plan_tokens(s, q, n, cow);
                budget -= n;
                break;
            }
            int v = victim_after(s, i);
            if (v < 0) {
                preempt(s, i);
                i--;
                break;
            }
            preempt(s, v);
        }
    }
    p->n_decode = p->n_seqs;

    /* 2. running prefill chunks (when step 1 saw any: it visits every running sequence
     * unless the budget ran out, and then this step has none left either) */
    for (int i = 0; prefilling && i < s->n_running && budget > 0; i++) {
        di_seq *q = s->running[i];
        if (q->plan_stamp == s->stamp || in_decode(s, q)) continue;
        int want = prefill_end(s, q) - q->n_computed;
        if (want > budget) want = budget;
        if (want <= 0) continue; /* nothing to compute until a token is appended */
        for (;;) {
            int cow, n = fit_tokens(s, q, want, di_block_manager_n_free(bm), &cow);
            if (n > 0) {
                plan_tokens(s, q, n, cow);
                budget -= n;
                break;
            }
            int v = victim_after(s, i);
            if (v < 0) break;
            preempt(s, v);
        }
    }

    /* 3. admission, unless this step had to preempt (it would only thrash) */
    while (p->n_preempted == 0 && s->n_waiting > 0 && budget > 0) {
        di_seq *q = s->waiting[0];
        if (s->seats_used + q->seats > s->cfg.max_seqs) break;
        int n = admit(s, q, budget);
        if (n == 0) break;
        budget -= n;
        remove_at(s->waiting, &s->n_waiting, 0);
        q->state = DI_SEQ_RUNNING;
        sorted_insert(s->running, &s->n_running, q);
        s->seats_used += q->seats;
    }
    return p;
}

void di_scheduler_commit_entry(di_scheduler *s, const di_step_plan *p, int i) {
    di_seq *q = p->seqs[i];
    int full = (p->start[i] + p->n_new[i]) / DI_BLOCK_TOKENS;
    /* exact recompute: only blocks of prompt tokens (a block holding generated tokens has KV
     * from decode steps, which no prompt's prefill would reproduce) */
    if (s->cfg.exact_recompute && full > q->prompt_len / DI_BLOCK_TOKENS) full = q->prompt_len / DI_BLOCK_TOKENS;
    if (!s->cfg.enable_prefix_cache || full <= q->n_registered) return;
    if (q->state != DI_SEQ_RUNNING || full > q->n_blocks) return; /* preempted since planning */
    di_seq_hash_blocks(q, full);
    for (int j = q->n_registered; j < full; j++)
        di_block_manager_register(s->bm, q->blocks[j], q->hashes[j], di_seq_parent_hash(q, j),
                                  q->tokens + (size_t)j * DI_BLOCK_TOKENS);
    q->n_registered = full;
}

void di_scheduler_commit(di_scheduler *s, const di_step_plan *p) {
    for (int i = 0; i < p->n_seqs; i++) di_scheduler_commit_entry(s, p, i);
}

di_status di_scheduler_fork(di_scheduler *s, di_seq *parent, di_seq *child) {
    DI_ASSERT(parent->state == DI_SEQ_RUNNING && parent->seats > 1);
    DI_TRY(reserve_waiting(s, 1)); /* a forked sequence may later be preempted into waiting */
    DI_ASSERT(child->cap_blocks >= parent->n_blocks);
    for (int j = 0; j < parent->n_blocks; j++) {
        child->blocks[j] = parent->blocks[j];
        di_block_manager_ref(s->bm, parent->blocks[j]);
    }
    child->n_blocks = parent->n_blocks;
    child->table_version = ++s->versions;
    child->n_computed = parent->n_computed;
    child->n_registered = parent->n_registered;
    child->n_cached_first = parent->n_cached_first;
    child->seats = 1;
    parent->seats--;
    parent->tail_shared = child->tail_shared = 1; /* their partly filled block is shared now */
    child->state = DI_SEQ_RUNNING;
    sorted_insert(s->running, &s->n_running, child);
    return DI_OK;
}

void di_scheduler_finish(di_scheduler *s, di_seq *q) {
    if (q->state == DI_SEQ_RUNNING) {
        int i = index_of(s->running, s->n_running, q);
        DI_ASSERT(i >= 0);
        remove_at(s->running, &s->n_running, i);
        s->seats_used -= q->seats;
        release_blocks(s, q);
    } else if (q->state == DI_SEQ_WAITING) {
        int i = index_of(s->waiting, s->n_waiting, q);
        DI_ASSERT(i >= 0);
        remove_at(s->waiting, &s->n_waiting, i);
    }
    q->n_computed = 0;
    q->state = DI_SEQ_FINISHED;
}
