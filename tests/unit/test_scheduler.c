/* test_scheduler.c - continuous batching without a model: chunked prefill, decode-first
 * plans, preemption order (lowest priority, then latest arrival first), prefix-cache reuse of
 * exactly the shared blocks, copy-on-write after a fork, chained plans (the next decode step
 * planned while the current one computes; also under random chains, EOS and aborts), and a
 * randomized stress run (tiny KV
 * pool, forks, aborts while waiting or running, random budgets) that checks after every step
 * that block refcounts equal the references held by running sequences, no block is leaked and
 * every plan respects the budget and the seat limit. With exact recompute (in some stress
 * rounds, and a direct test) a preempted sequence's prompt comes back in prefill chunks that end
 * at the prompt and its generated tokens as one multi-token decode entry. */
#include <stdint.h>
#include <stdlib.h>

#include "core/status.h"
#include "engine/block_manager.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "sampling/rng.h"
#include "test_util.h"

enum { MAXQ = 96 };

typedef struct sim {
    di_block_manager *bm;
    di_scheduler *s;
    di_scheduler_config cfg;
    di_seq q[MAXQ];
    int target[MAXQ];     /* finish when len reaches this */
    int used[MAXQ];
    int n;
    int steps, bad;
} sim;

/* exact: the scheduler's exact_recompute */
static void sim_init(sim *m, int blocks, int budget, int max_seqs, int prefix, int exact) {
    memset(m, 0, sizeof *m);
    CHECK_OK(di_block_manager_create(blocks, &m->bm));
    m->cfg = (di_scheduler_config){.max_batch_tokens = budget, .max_seqs = max_seqs, .enable_prefix_cache = prefix,
                                   .exact_recompute = exact};
    CHECK_OK(di_scheduler_create(&m->cfg, m->bm, &m->s));
}

static void sim_free(sim *m) {
    for (int i = 0; i < m->n; i++)
        if (m->used[i]) di_seq_release(&m->q[i]);
    di_scheduler_free(m->s);
    di_block_manager_free(m->bm);
}

static int32_t gen_token(int seq, int pos) { return (int32_t)((seq * 7919 + pos * 31) % 500); }

/* adds a sequence with the given prompt; returns its index */
static int sim_add(sim *m, const int32_t *prompt, int len, int gen, int priority, int seats) {
    int i = m->n++;
    CHECK_OK(di_seq_init(&m->q[i], prompt, len, len + gen));
    m->used[i] = 1;
    m->q[i].arrival = (uint64_t)i;
    m->q[i].priority = priority;
    m->q[i].seats = seats;
    m->target[i] = len + gen;
    CHECK_OK(di_scheduler_add(m->s, &m->q[i]));
    return i;
}

static void check_state(sim *m) {
    int total = di_block_manager_total(m->bm);
    int *ref = calloc(total, sizeof *ref);
    int seats = 0;
    for (int i = 0; i < m->n; i++) {
        di_seq *q = &m->q[i];
        if (!m->used[i]) continue;
        if (q->state == DI_SEQ_RUNNING) {
            seats += q->seats;
            int expect_blocks = (q->n_computed + DI_BLOCK_TOKENS - 1) / DI_BLOCK_TOKENS;
            if (m->cfg.exact_recompute && q->n_registered > q->prompt_len / DI_BLOCK_TOKENS) {
                fprintf(stderr, "seq %d: exact recompute registered a block of generated tokens\n", i);
                m->bad = 1;
            }
            if (q->n_registered * DI_BLOCK_TOKENS > q->n_computed) {
                fprintf(stderr, "seq %d: %d blocks registered with %d tokens computed\n", i, q->n_registered, q->n_computed);
                m->bad = 1;
            }
            if (q->n_blocks != expect_blocks) {
                fprintf(stderr, "seq %d: %d blocks for %d computed tokens\n", i, q->n_blocks, q->n_computed);
                m->bad = 1;
            }
            for (int j = 0; j < q->n_blocks; j++) {
                ref[q->blocks[j]]++;
                for (int k = 0; k < j; k++)
                    if (q->blocks[k] == q->blocks[j]) m->bad = 1;
            }
        } else if (q->n_blocks != 0) {
            fprintf(stderr, "seq %d not running but holds %d blocks\n", i, q->n_blocks);
            m->bad = 1;
        }
    }
    for (int b = 0; b < total; b++)
        if (di_block_manager_refcount(m->bm, b) != ref[b]) {
            fprintf(stderr, "block %d: refcount %d, held %d times\n", b, di_block_manager_refcount(m->bm, b), ref[b]);
            m->bad = 1;
        }
    if (di_block_manager_check(m->bm) != DI_OK) {
        fprintf(stderr, "%s\n", di_last_error());
        m->bad = 1;
    }
    if (seats > m->cfg.max_seqs) m->bad = 1;
    free(ref);
}

static void check_plan(sim *m, const di_step_plan *p) {
    int sum = 0;
    for (int i = 0; i < p->n_seqs; i++) {
        di_seq *q = p->seqs[i];
        sum += p->n_new[i];
        /* decode entries: one token, or with exact recompute generated tokens only; prefill
         * chunks then never reach into generated tokens */
        if (i < p->n_decode && p->n_new[i] != 1 && !m->cfg.exact_recompute) m->bad = 1;
        if (m->cfg.exact_recompute && q->len > q->prompt_len &&
            (i < p->n_decode ? p->start[i] < q->prompt_len : p->start[i] + p->n_new[i] > q->prompt_len))
            m->bad = 1;
        if (p->start[i] + p->n_new[i] != q->n_computed || q->n_computed > q->len) m->bad = 1;
        if (p->sample[i] != (q->n_computed == q->len)) m->bad = 1;
        if (p->n_new[i] < 1) m->bad = 1;
    }
    if (sum != p->n_tokens || sum > m->cfg.max_batch_tokens) m->bad = 1;
    if (m->bad) fprintf(stderr, "bad plan at step %d\n", m->steps);
}

/* one step: plan, commit, append a token to every sampled sequence, finish the done ones */
static const di_step_plan *sim_step(sim *m) {
    const di_step_plan *p = di_scheduler_schedule(m->s);
    m->steps++;
    check_plan(m, p);
    di_scheduler_commit(m->s, p);
    for (int i = 0; i < p->n_seqs; i++) {
        if (!p->sample[i]) continue;
        di_seq *q = p->seqs[i];
        int idx = (int)(q - m->q);
        q->tokens[q->len] = gen_token(idx, q->len);
        q->len++;
        if (q->len >= m->target[idx]) di_scheduler_finish(m->s, q);
    }
    check_state(m);
    return p;
}

static void test_chunked_prefill(void) {
    sim m;
    sim_init(&m, 64, 100, 8, 1, 0);
    int32_t prompt[250];
    for (int i = 0; i < 250; i++) prompt[i] = i;
    sim_add(&m, prompt, 250, 3, 0, 1);
    const di_step_plan *p = sim_step(&m);
    CHECK(p->n_seqs == 1 && p->n_new[0] == 100 && p->start[0] == 0 && !p->sample[0] && p->n_decode == 0);
    p = sim_step(&m);
    CHECK(p->n_new[0] == 100 && p->start[0] == 100 && !p->sample[0]);
    p = sim_step(&m);
    CHECK(p->n_new[0] == 50 && p->start[0] == 200 && p->sample[0]);
    /* a second prompt arrives: the decode goes first, the prefill gets the rest of the budget */
    sim_add(&m, prompt + 10, 200, 2, 0, 1);
    p = sim_step(&m);
    CHECK(p->n_seqs == 2 && p->n_decode == 1 && p->seqs[0] == &m.q[0] && p->n_new[0] == 1);
    CHECK(p->seqs[1] == &m.q[1] && p->n_new[1] == 99);
    while (di_scheduler_n_running(m.s) + di_scheduler_n_waiting(m.s) > 0 && m.steps < 100) sim_step(&m);
    CHECK_EQ_INT(di_block_manager_n_free(m.bm), 64);
    CHECK(!m.bad);
    sim_free(&m);
}

static void test_preemption_order(void) {
    sim m;
    /* 3 sequences of 60-token prompts, each needs a 2nd block at token 64; only 3 blocks */
    sim_init(&m, 3, 512, 8, 0, 0);
    int32_t prompt[60];
    for (int i = 0; i < 60; i++) prompt[i] = i;
    sim_add(&m, prompt, 60, 10, 0, 1);   /* A */
    sim_add(&m, prompt, 60, 10, -1, 1);  /* B: more important */
    sim_add(&m, prompt, 60, 10, 0, 1);   /* C: latest arrival */
    const di_step_plan *p = sim_step(&m); /* prefill all three: 3 blocks */
    CHECK_EQ_INT(p->n_seqs, 3);
    CHECK(p->seqs[0] == &m.q[1]); /* admission in priority order: B first */
    for (int k = 0; k < 4; k++) sim_step(&m); /* positions 60..63 */
    /* next decode writes position 64 for all, no block is free: B (first) preempts C (the
     * last) and takes its block; A finds no victim after itself and is preempted */
    p = sim_step(&m);
    CHECK_EQ_INT(p->n_preempted, 2);
    if (p->n_preempted == 2) {
        CHECK(p->preempted[0] == &m.q[2]);
        CHECK(p->preempted[1] == &m.q[0]);
    }
    CHECK(m.q[1].state == DI_SEQ_RUNNING && m.q[0].state == DI_SEQ_WAITING && m.q[2].state == DI_SEQ_WAITING);
    CHECK_EQ_INT(m.q[0].n_blocks, 0);
    CHECK_EQ_INT(m.q[0].len, 65); /* generated tokens kept */
    while (di_scheduler_n_running(m.s) + di_scheduler_n_waiting(m.s) > 0 && m.steps < 500) sim_step(&m);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(m.q[i].len, 70);
        int ok = 1;
        for (int t = 60; t < 70; t++) ok &= m.q[i].tokens[t] == gen_token(i, t);
        CHECK(ok);
    }
    CHECK(m.q[0].n_preempted >= 1 && m.q[2].n_preempted >= 1 && m.q[1].n_preempted == 0);
    CHECK_EQ_INT(di_block_manager_n_free(m.bm), 3);
    CHECK(!m.bad);
    sim_free(&m);
}

static void test_prefix_reuse(void) {
    sim m;
    sim_init(&m, 32, 1024, 8, 1, 0);
    int32_t a[3 * 64 + 10], b[3 * 64 + 30];
    for (int i = 0; i < 3 * 64 + 10; i++) a[i] = 1000 + i;
    memcpy(b, a, 3 * 64 * sizeof *b);
    for (int i = 3 * 64; i < 3 * 64 + 30; i++) b[i] = 5000 + i;
    sim_add(&m, a, 3 * 64 + 10, 4, 0, 1);
    sim_step(&m);
    int32_t a_blocks[3] = {m.q[0].blocks[0], m.q[0].blocks[1], m.q[0].blocks[2]};
    while (m.q[0].state != DI_SEQ_FINISHED) sim_step(&m);
    CHECK_EQ_INT(di_block_manager_n_cached(m.bm), 3); /* the 3 full blocks stay cached */
    int ib = sim_add(&m, b, 3 * 64 + 30, 2, 0, 1);
    const di_step_plan *p = sim_step(&m);
    CHECK_EQ_INT(p->prefix_hit_tokens, 192);
    CHECK(p->n_seqs == 1 && p->start[0] == 192 && p->n_new[0] == 30);
    CHECK_EQ_INT(m.q[ib].n_cached_first, 192);
    for (int j = 0; j < 3; j++) CHECK_EQ_INT(m.q[ib].blocks[j], a_blocks[j]);
    /* an exactly block-aligned identical prompt: the last block is recomputed (logits needed) */
    int ic = sim_add(&m, a, 128, 1, 0, 1);
    p = sim_step(&m);
    CHECK_EQ_INT(m.q[ic].n_cached_first, 64);
    /* prefix cache off: nothing reused */
    sim m2;
    sim_init(&m2, 32, 1024, 8, 0, 0);
    sim_add(&m2, a, 3 * 64 + 10, 1, 0, 1);
    sim_step(&m2);
    sim_add(&m2, b, 3 * 64 + 30, 1, 0, 1);
    p = sim_step(&m2);
    CHECK(p->prefix_hit_tokens == 0 && p->start[0] == 0);
    while (di_scheduler_n_running(m.s) + di_scheduler_n_waiting(m.s) > 0) sim_step(&m);
    CHECK_EQ_INT(di_block_manager_n_free(m.bm), 32);
    CHECK(!m.bad && !m2.bad);
    sim_free(&m);
    sim_free(&m2);
}

static void test_fork_cow(void) {
    sim m;
    sim_init(&m, 16, 512, 8, 1, 0);
    int32_t prompt[100];
    for (int i = 0; i < 100; i++) prompt[i] = i;
    int ip = sim_add(&m, prompt, 100, 5, 0, 3);
    const di_step_plan *p = di_scheduler_schedule(m.s);
    CHECK(p->n_seqs == 1 && p->sample[0]);
    di_scheduler_commit(m.s, p);
    di_seq *par = &m.q[ip];
    int32_t shared_partial = par->blocks[1];
    /* fork two children from the parent's prompt, then each gets its own first token */
    int ic[2];
    for (int c = 0; c < 2; c++) {
        ic[c] = m.n++;
        CHECK_OK(di_seq_init(&m.q[ic[c]], prompt, 100, 105));
        m.used[ic[c]] = 1;
        m.target[ic[c]] = 105;
        m.q[ic[c]].arrival = par->arrival;
        m.q[ic[c]].index = c + 1;
        di_seq_copy_tokens(&m.q[ic[c]], par);
        CHECK_OK(di_scheduler_fork(m.s, par, &m.q[ic[c]]));
    }
    par->tokens[par->len++] = 7;
    for (int c = 0; c < 2; c++) m.q[ic[c]].tokens[m.q[ic[c]].len++] = (int32_t)(8 + c);
    CHECK_EQ_INT(par->seats, 1);
    CHECK_EQ_INT(di_block_manager_refcount(m.bm, shared_partial), 3);
    CHECK_EQ_INT(di_block_manager_refcount(m.bm, par->blocks[0]), 3);
    check_state(&m);
    /* all three write position 100 into the shared partial block: two copies, one in place */
    p = sim_step(&m);
    CHECK_EQ_INT(p->n_decode, 3);
    CHECK_EQ_INT(p->n_copies, 2);
    for (int k = 0; k < p->n_copies; k++) CHECK_EQ_INT(p->copy_src[k], shared_partial);
    CHECK_EQ_INT(di_block_manager_refcount(m.bm, shared_partial), 1);
    CHECK(par->blocks[1] != m.q[ic[0]].blocks[1] && m.q[ic[0]].blocks[1] != m.q[ic[1]].blocks[1]);
    CHECK_EQ_INT(par->blocks[0], m.q[ic[1]].blocks[0]); /* full block stays shared */
    while (di_scheduler_n_running(m.s) + di_scheduler_n_waiting(m.s) > 0) sim_step(&m);
    CHECK_EQ_INT(di_block_manager_n_free(m.bm), 16);
    CHECK(!m.bad);
    sim_free(&m);
}

/* Chained plans (di_scheduler_schedule_chained): the next decode step of the same rows planned
 * while the current one's tokens are still being computed (n_computed = len + 1 until the
 * token is appended); the previous plan stays valid; a new block is taken when a row starts
 * one; refused, with nothing changed, when a block is needed and none is free or when prev is
 * not the latest plan; rows left out by the keep mask; di_scheduler_unplan takes a plan back. */
static void test_chained(void) {
    sim m;
    sim_init(&m, 3, 512, 4, 0, 0);
    int32_t prompt[70];
    for (int i = 0; i < 70; i++) prompt[i] = i;
    int a = sim_add(&m, prompt, 62, 20, 0, 1), b = sim_add(&m, prompt + 5, 10, 60, 0, 1);
    sim_step(&m); /* both prompts, first tokens appended: len 63 / 11 */
    const di_step_plan *p1 = di_scheduler_schedule(m.s);
    CHECK(p1->n_decode == 2 && p1->start[0] == 62 && p1->start[1] == 10);
    const di_step_plan *p2 = di_scheduler_schedule_chained(m.s, p1, NULL);
    CHECK(p2 != NULL && p2 != p1);
    if (!p2) return;
    CHECK(p2->n_seqs == 2 && p2->n_decode == 2 && p2->n_tokens == 2 && p2->n_copies == 0);
    CHECK(p2->seqs[0] == &m.q[a] && p2->seqs[1] == &m.q[b] && p2->start[0] == 63 && p2->start[1] == 11);
    CHECK(p2->sample[0] && p2->sample[1]);
    CHECK(p1->start[0] == 62 && p1->start[1] == 10 && p1->seqs[0] == &m.q[a]); /* still valid */
    CHECK(m.q[a].n_computed == m.q[a].len + 1 && m.q[b].n_computed == m.q[b].len + 1);
    CHECK(di_scheduler_schedule_chained(m.s, p1, NULL) == NULL); /* p1 is not the latest plan */
    /* p1's tokens arrive: the invariant n_computed == len is back */
    m.q[a].tokens[m.q[a].len++] = 1;
    m.q[b].tokens[m.q[b].len++] = 2;
    di_scheduler_commit(m.s, p1);
    /* the next chained step writes position 64 of a: a new block (1 free of 3) */
    CHECK_EQ_INT(di_block_manager_n_free(m.bm), 1);
    const di_step_plan *p3 = di_scheduler_schedule_chained(m.s, p2, NULL);
    CHECK(p3 != NULL);
    if (!p3) return;
    CHECK(m.q[a].n_blocks == 2 && di_block_manager_n_free(m.bm) == 0 && p3->start[0] == 64 && p3->max_blocks == 2);
    /* taken back: n_computed returns, the block stays with a */
    di_scheduler_unplan(m.s, p3);
    CHECK(m.q[a].n_computed == 64 && m.q[b].n_computed == 12 && m.q[a].n_blocks == 2);
    m.q[a].tokens[m.q[a].len++] = 3;
    m.q[b].tokens[m.q[b].len++] = 4;
    di_scheduler_commit(m.s, p2);
    /* b's context runs to 64 while a holds two blocks: b's next chained token needs a block, none is free */
    while (m.q[b].len < 64) {
        m.q[b].tokens[m.q[b].len] = 5;
        m.q[b].len++;
    }
    m.q[b].n_computed = m.q[b].len - 1;
    m.q[a].n_computed = m.q[a].len - 1;
    const di_step_plan *p4 = di_scheduler_schedule(m.s);
    CHECK(p4->n_decode == 2);
    int before_a = m.q[a].n_computed, before_b = m.q[b].n_computed;
    CHECK(di_scheduler_schedule_chained(m.s, p4, NULL) == NULL);
    CHECK(m.q[a].n_computed == before_a && m.q[b].n_computed == before_b); /* nothing changed */
    /* a finished while its chained step was in flight: the plan is not extended with it... */
    di_scheduler_finish(m.s, &m.q[a]);
    CHECK(di_scheduler_schedule_chained(m.s, p4, NULL) == NULL);
    /* ...but without it (b's token now fits in the block a released), and not with no row kept */
    static const uint8_t keep_b[2] = {0, 1}, keep_none[2] = {0, 0};
    CHECK(p4->seqs[1] == &m.q[b]);
    CHECK(di_scheduler_schedule_chained(m.s, p4, keep_none) == NULL);
    const di_step_plan *p5 = di_scheduler_schedule_chained(m.s, p4, keep_b);
    CHECK(p5 != NULL);
    if (p5) CHECK(p5->n_seqs == 1 && p5->seqs[0] == &m.q[b] && p5->start[0] == 64 && m.q[b].n_blocks == 2);
    CHECK_EQ_INT(di_scheduler_free_seats(m.s), 3);
    di_scheduler_finish(m.s, &m.q[b]);
    CHECK_EQ_INT(di_block_manager_n_free(m.bm), 3);
    sim_free(&m);
}

/* The end of a stress round: no failed invariant, nothing left running or waiting, every block
 * free, and every sequence that ran to its length holds exactly its own generated tokens. */
static void check_stress_end(sim *m, int blocks, int round) {
    CHECK_MSG(!m->bad, "round %d", round);
    CHECK_MSG(di_scheduler_n_running(m->s) + di_scheduler_n_waiting(m->s) == 0, "round %d: unfinished after %d steps",
              round, m->steps);
    CHECK_EQ_INT(di_block_manager_n_free(m->bm), blocks);
    int finished_ok = 1;
    for (int i = 0; i < m->n; i++)
        if (m->q[i].state == DI_SEQ_FINISHED && m->q[i].len == m->target[i])
            for (int t = m->q[i].prompt_len + 1; t < m->q[i].len; t++) finished_ok &= m->q[i].tokens[t] == gen_token(i, t);
    CHECK(finished_ok);
}

static void test_stress(void) {
    for (int round = 0; round < 6; round++) {
        sim m;
        uint64_t x = 1234 + (uint64_t)round;
        int blocks = 6 + round * 3, budget = 17 + round * 40, max_seqs = 3 + round;
        sim_init(&m, blocks, budget, max_seqs, round % 2 == 0, round % 3 == 1);
        int32_t base[400];
        for (int i = 0; i < 400; i++) base[i] = i % 97;
        int pending_fork[MAXQ] = {0};
        int added = 0;
        while (m.steps < 3000) {
            x = di_rng_mix64(x);
            if (added < 60 && x % 3 == 0) {
                int len = 1 + (int)((x >> 8) % 200), gen = 1 + (int)((x >> 20) % 40);
                int prio = (int)((x >> 30) % 3) - 1;
                int seats = (x >> 40) % 5 == 0 ? 2 : 1;
                if (seats > max_seqs) seats = 1;
                /* everything fits in the pool alone */
                if ((len + gen + 63) / 64 > blocks) gen = 1, len = len > 64 ? 64 : len;
                int off = (int)((x >> 50) % 3) * 64;
                int i = sim_add(&m, base + off, len, gen, prio, seats);
                pending_fork[i] = seats - 1;
                added++;
            }
            if (m.n > 0 && (x >> 13) % 17 == 0) { /* abort someone */
                int i = (int)((x >> 24) % (uint64_t)m.n);
                if (m.q[i].state == DI_SEQ_RUNNING || m.q[i].state == DI_SEQ_WAITING) di_scheduler_finish(m.s, &m.q[i]);
            }
            const di_step_plan *p = sim_step(&m);
            /* fork children of sequences that just finished their prompt */
            for (int k = 0; k < p->n_seqs; k++) {
                di_seq *q = p->seqs[k];
                int idx = (int)(q - m.q);
                if (!p->sample[k] || pending_fork[idx] == 0 || q->state != DI_SEQ_RUNNING || m.n >= MAXQ) continue;
                if (q->len != q->prompt_len + 1) continue;
                int c = m.n++;
                CHECK_OK(di_seq_init(&m.q[c], q->tokens, q->prompt_len, m.target[idx]));
                m.used[c] = 1;
                m.target[c] = m.target[idx];
                m.q[c].arrival = q->arrival;
                m.q[c].priority = q->priority;
                m.q[c].index = 1;
                di_seq_copy_tokens(&m.q[c], q);
                m.q[c].len = q->prompt_len;
                CHECK_OK(di_scheduler_fork(m.s, q, &m.q[c]));
                m.q[c].tokens[m.q[c].len++] = 499;
                pending_fork[idx] = 0;
            }
            if (m.bad) break;
            if (added >= 60 && di_scheduler_n_running(m.s) + di_scheduler_n_waiting(m.s) == 0) break;
        }
        check_stress_end(&m, blocks, round);
        fprintf(stderr, "   round %d%s: %d steps, %llu preemptions, %d sequences\n", round,
                m.cfg.exact_recompute ? " (exact recompute)" : "", m.steps, (unsigned long long)di_scheduler_preemptions(m.s), m.n);
        sim_free(&m);
    }
}

/* Exact recompute: test_preemption_order's scenario (three 60-token prompts, a 3-block pool);
 * the preempted A comes back as a prefill chunk of exactly its prompt, then one decode entry of
 * the generated tokens that fit its block (check_plan checks every later plan). */
static void test_exact_recompute(void) {
    sim m;
    sim_init(&m, 3, 512, 8, 0, 1);
    int32_t prompt[60];
    for (int i = 0; i < 60; i++) prompt[i] = i;
    sim_add(&m, prompt, 60, 10, 0, 1);  /* A */
    sim_add(&m, prompt, 60, 10, -1, 1); /* B */
    sim_add(&m, prompt, 60, 10, 0, 1);  /* C */
    for (int k = 0; k < 6; k++) sim_step(&m);
    CHECK(m.q[0].state == DI_SEQ_WAITING && m.q[0].len == 65);
    int seen = 0, ok = 1;
    while (di_scheduler_n_running(m.s) + di_scheduler_n_waiting(m.s) > 0 && m.steps < 500) {
        const di_step_plan *p = sim_step(&m);
        for (int i = 0; i < p->n_seqs; i++) {
            if (p->seqs[i] != &m.q[0] || m.q[0].n_preempted != 1) continue;
            if (seen == 0) ok &= i >= p->n_decode && p->start[i] == 0 && p->n_new[i] == 60 && !p->sample[i];
            else if (seen == 1) /* 4: the rest of its one block (position 64 needs a block none frees) */
                ok &= i < p->n_decode && p->start[i] == 60 && p->n_new[i] == 4 && !p->sample[i];
            seen++;
        }
    }
    CHECK_MSG(ok && seen >= 2, "A's entries after its preemption (%d seen)", seen);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(m.q[i].len, 70);
    CHECK_EQ_INT(di_block_manager_n_free(m.bm), 3);
    CHECK(!m.bad);
    sim_free(&m);
}

/* The engine's asynchronous loop against the scheduler: a decode-only plan is followed by
 * chained plans (di_scheduler_schedule_chained) while the step before is "in flight": each
 * chained plan keeps a random subset of the rows that go on, then the previous plan's tokens
 * are appended, sequences end at random (EOS) or at their length, and some are aborted; the
 * invariants of check_state hold after every step, no block leaks, and every sequence that
 * ran to its length has exactly its own tokens. */
static void test_stress_chained(void) {
    for (int round = 0; round < 4; round++) {
        sim m;
        uint64_t x = 777 + (uint64_t)round;
        int blocks = 8 + round * 4, budget = 40 + round * 60, max_seqs = 4 + 2 * round;
        sim_init(&m, blocks, budget, max_seqs, round % 2 == 1, round >= 2);
        int32_t base[400];
        for (int i = 0; i < 400; i++) base[i] = i % 89;
        int added = 0, chained = 0;
        uint8_t keep[MAXQ];
        while (m.steps < 4000 && !m.bad) {
            x = di_rng_mix64(x);
            if (added < 50 && x % 4 == 0) {
                int len = 1 + (int)((x >> 8) % 150), gen = 1 + (int)((x >> 20) % 90);
                if ((len + gen + 63) / 64 > blocks) gen = 1, len = len > 64 ? 64 : len;
                sim_add(&m, base + (int)((x >> 50) % 3) * 64, len, gen, (int)((x >> 30) % 2), 1);
                added++;
            }
            const di_step_plan *p = di_scheduler_schedule(m.s);
            m.steps++;
            check_plan(&m, p);
            for (;;) { /* p is "in flight" */
                int all_decode = p->n_seqs > 0 && p->n_decode == p->n_seqs;
                for (int i = 0; all_decode && i < p->n_seqs; i++) all_decode = p->sample[i];
                const di_step_plan *next = NULL;
                if (all_decode && (x >> 5) % 5 != 0) {
                    int any = 0;
                    for (int i = 0; i < p->n_seqs; i++) {
                        x = di_rng_mix64(x);
                        di_seq *q = p->seqs[i];
                        int idx = (int)(q - m.q);
                        /* rows that finished, or whose in-flight token is their last, are left out */
                        keep[i] = q->state == DI_SEQ_RUNNING && q->len + 1 < m.target[idx] && x % 6 != 0;
                        any |= keep[i];
                    }
                    next = any ? di_scheduler_schedule_chained(m.s, p, keep) : NULL;
                    if (next) {
                        chained++;
                        for (int i = 0; i < next->n_seqs; i++)
                            if (next->seqs[i]->n_computed != next->seqs[i]->len + 1 || !next->sample[i]) m.bad = 1;
                    }
                }
                /* p's tokens arrive */
                di_scheduler_commit(m.s, p);
                for (int i = 0; i < p->n_seqs; i++) {
                    di_seq *q = p->seqs[i];
                    if (!p->sample[i] || q->state != DI_SEQ_RUNNING) continue;
                    int idx = (int)(q - m.q);
                    q->tokens[q->len] = gen_token(idx, q->len);
                    q->len++;
                    x = di_rng_mix64(x);
                    if (q->len >= m.target[idx] || x % 23 == 0) di_scheduler_finish(m.s, q); /* length or "EOS" */
                }
                if (m.n > 0 && (x >> 17) % 13 == 0) { /* an abort between steps */
                    int i = (int)((x >> 24) % (uint64_t)m.n);
                    if (m.q[i].state == DI_SEQ_RUNNING || m.q[i].state == DI_SEQ_WAITING) di_scheduler_finish(m.s, &m.q[i]);
                }
                if (!next) break;
                check_state(&m); /* with next in flight: its rows hold the blocks for n_computed */
                p = next;
                m.steps++;
            }
            check_state(&m);
            if (added >= 50 && di_scheduler_n_running(m.s) + di_scheduler_n_waiting(m.s) == 0) break;
        }
        check_stress_end(&m, blocks, round);
        CHECK(chained > 20);
        fprintf(stderr, "   chained round %d: %d steps, %d chained, %llu preemptions, %d sequences\n", round, m.steps,
                chained, (unsigned long long)di_scheduler_preemptions(m.s), m.n);
        sim_free(&m);
    }
}

TEST_MAIN(test_chunked_prefill, test_preemption_order, test_exact_recompute, test_prefix_reuse, test_fork_cow, test_chained, test_stress,
          test_stress_chained)
