/* async_steps_util.h - the asynchronous-step scenario shared by the GPU test
 * (tests/ops/test_cuda_model.c "async") and the CPU test with a fake asynchronous stream
 * (tests/unit/test_async_steps.c): prompts generated with decode steps launched chained to the
 * one in flight (di_model_sample_launch / _collect), prompts leaving the batch while chained,
 * optionally a plain forward between two steps, against the same prompts run step by step.
 * Static functions; include once per test, after test_util.h. */
#ifndef DI_ASYNC_STEPS_UTIL_H
#define DI_ASYNC_STEPS_UTIL_H
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "model/model.h"

enum { GEN_NEW = 32, GEN_PROMPTS = 7, GEN_MAXP = 48 };

/* Asynchronous steps (di_model_sample_launch / _collect): S prompts generated with
 * each decode step launched chained to the one in flight, against the same prompts run step by
 * step (di_model_forward_sample) with every prompt in every step: the tokens must be identical,
 * bit for bit (the same graphs and ops; only where the input ids come from differs). While
 * chained, prompts leave the batch (from step 10 prompt 1, from step 20 every odd one): their
 * positions in the bucket become padding and the others keep theirs, so each kept prompt's
 * tokens must still be those of the full synchronous run (rows of one bucket are computed
 * independently). Greedy and seeded temperature sampling. async = 2 also runs a plain forward
 * (a 2-token prefill of a scratch sequence in block SCRATCH_BLOCK) between launching step 5 and
 * collecting step 4: a forward queued between two chained steps (it overwrites the model's
 * activations and writes the cache) must not disturb the steps in flight. */
enum { SCRATCH_BLOCK = GEN_PROMPTS * 2 };
static di_status scratch_forward(di_model *m) {
    static float logits[200000];
    int V = di_model_config_of(m)->vocab_size;
    if (V > 200000) return di_error(DI_ERR_INVALID_ARG, "scratch forward: vocabulary %d too large", V);
    int32_t ids[2] = {5, 7}, pos[2] = {0, 1}, slots[2] = {SCRATCH_BLOCK * 64, SCRATCH_BLOCK * 64 + 1};
    int32_t start[2] = {0, 2}, ctx[1] = {2}, bt[1] = {SCRATCH_BLOCK}, row[1] = {1};
    di_batch b = {2, ids, pos, slots, 1, 0, start, ctx, bt, 1, 1, row};
    return di_model_forward(m, &b, logits);
}
static int kept_at(int S, int step, int i) { return step < 10 || i == 0 || (step < 20 ? i != 1 : i % 2 == 0); }

/* Optional: called after each asynchronous decode step's launch (and the previous step's
 * collect) with the step index (a test measuring what one step costs). */
static void (*g_async_step_hook)(int step);

static di_status generate_steps(di_model *m, int32_t prompts[][GEN_MAXP], const int *plen, int S, float temp,
                                int async, int32_t out[][GEN_NEW]) {
    int nb = (GEN_MAXP + GEN_NEW + 63) / 64;
    int32_t ids[GEN_PROMPTS * GEN_MAXP], pos[GEN_PROMPTS * GEN_MAXP], slots[GEN_PROMPTS * GEN_MAXP];
    int32_t start[GEN_PROMPTS + 1], ctx[GEN_PROMPTS], bt[GEN_PROMPTS * 4], rows[GEN_PROMPTS];
    int32_t tok[GEN_PROMPTS], st[GEN_PROMPTS], cur[GEN_PROMPTS], ctxp[GEN_PROMPTS], bts[GEN_PROMPTS * 4];
    int32_t list[GEN_PROMPTS], prev[GEN_PROMPTS], chain[GEN_PROMPTS];
    int n = 0, n_prev = 0;
    di_sample_row sr[GEN_PROMPTS] = {{0}}, srp[GEN_PROMPTS] = {{0}};
    for (int i = 0; i < S; i++)
        for (int b = 0; b < nb; b++) bt[i * nb + b] = i * nb + b;
    int T = 0;
    start[0] = 0;
    for (int i = 0; i < S; i++) {
        for (int j = 0; j < plen[i]; j++, T++) {
            ids[T] = prompts[i][j];
            pos[T] = j;
            slots[T] = bt[i * nb + j / 64] * 64 + j % 64;
        }
        start[i + 1] = T;
        ctx[i] = ctxp[i] = plen[i];
        rows[i] = T - 1;
        srp[i] = sr[i] = (di_sample_row){i % 2 ? temp : 0.0f, 1.0f, 0.0f, 0, 1000 + (uint64_t)i, (uint32_t)ctx[i], 0};
    }
    di_batch b = {T, ids, pos, slots, S, 0, start, ctx, bt, nb, S, rows};
    DI_TRY(di_model_forward_sample(m, &b, sr, tok));
    for (int i = 0; i < S; i++) out[i][0] = cur[i] = tok[i];
    for (int step = 0; step < GEN_NEW - 1; step++) { /* decode step `step` makes token step + 1 */
        n = 0;
        for (int i = 0; i < S; i++)
            if (!async || kept_at(S, step, i)) list[n++] = i;
        for (int j = 0; j < n; j++) { /* row j: prompt list[j], one position further */
            int i = list[j];
            ids[j] = cur[i];
            pos[j] = ctxp[i];
            slots[j] = bt[i * nb + ctxp[i] / 64] * 64 + ctxp[i] % 64;
            ctx[j] = ++ctxp[i];
            start[j + 1] = j + 1;
            rows[j] = j;
            memcpy(bts + j * nb, bt + i * nb, (size_t)nb * sizeof(int32_t));
            sr[j] = srp[i];
            sr[j].position = (uint32_t)ctxp[i];
            for (int k = 0; k < n_prev; k++)
                if (prev[k] == i) chain[j] = k;
        }
        di_batch d = {n, ids, pos, slots, n, n, start, ctx, bts, nb, n, rows};
        if (!async) {
            DI_TRY(di_model_forward_sample(m, &d, sr, tok));
            for (int j = 0; j < n; j++) out[list[j]][step + 1] = cur[list[j]] = tok[j];
        } else {
            DI_TRY(di_model_sample_launch(m, &d, sr, step > 0 ? chain : NULL));
            if (async == 2 && step == 5) DI_TRY(scratch_forward(m));
            if (step > 0) {
                DI_TRY(di_model_sample_collect(m, tok, st));
                for (int k = 0; k < n_prev; k++) out[prev[k]][step] = tok[k];
            }
            if (g_async_step_hook) g_async_step_hook(step);
        }
        memcpy(prev, list, (size_t)n * sizeof(int32_t));
        n_prev = n;
    }
    if (async) {
        DI_TRY(di_model_sample_collect(m, tok, st));
        for (int k = 0; k < n_prev; k++) out[prev[k]][GEN_NEW - 1] = tok[k];
    }
    return DI_OK;
}

/* Optional: a second model (e.g. the plain CPU one) whose synchronous tokens both runs of
 * async_compare must also match, for a model whose own synchronous steps are under test too
 * (the fake stream's side-lane orders). */
static di_model *g_async_ref;

/* One comparison: S prompts (greedy, or seeded temperature on odd prompts), synchronous steps
 * and asynchronous ones (mode 1, or 2 with a forward between steps 5 and 4), the asynchronous
 * run first when async_first (its first steps of a bucket then run before any graph of it
 * exists). 1 if every kept prompt's tokens are identical; the first difference is printed with
 * `label`; -1 if a run failed (di_last_error() says why). */
static int async_compare(di_model *m, int32_t prompts[][GEN_MAXP], const int *plen, int S, float temp, int mode,
                         int async_first, const char *label) {
    static int32_t os[GEN_PROMPTS][GEN_NEW], oa[GEN_PROMPTS][GEN_NEW], orf[GEN_PROMPTS][GEN_NEW];
    memset(os, 0xff, sizeof os);
    memset(oa, 0xfe, sizeof oa);
    int ok = 1;
    if (!async_first) ok = generate_steps(m, prompts, plen, S, temp, 0, os) == DI_OK;
    ok = ok && generate_steps(m, prompts, plen, S, temp, mode, oa) == DI_OK;
    if (async_first) ok = ok && generate_steps(m, prompts, plen, S, temp, 0, os) == DI_OK;
    if (g_async_ref) ok = ok && generate_steps(g_async_ref, prompts, plen, S, temp, 0, orf) == DI_OK;
    if (!ok) return -1;
    for (int i = 0; i < S; i++)
        for (int j = 0; j < GEN_NEW; j++) {
            int kept = j == 0 || kept_at(S, j - 1, i);
            if (kept && (os[i][j] != oa[i][j] || (g_async_ref && orf[i][j] != os[i][j]))) {
                fprintf(stderr, "    %s, %d prompts%s, temperature %.1f: prompt %d token %d: sync %d, async %d, "
                        "reference %d\n", label, S, mode == 2 ? " (a forward between)" : "", (double)temp, i, j,
                        os[i][j], oa[i][j], g_async_ref ? orf[i][j] : os[i][j]);
                return 0;
            }
        }
    return 1;
}

/* GEN_PROMPTS random prompts of 4..GEN_MAXP-1 ids in 2..V-1, from the xorshift state rs. */
static void async_make_prompts(int32_t prompts[][GEN_MAXP], int *plen, int V, unsigned long long *rs) {
    for (int p = 0; p < GEN_PROMPTS; p++) {
        plen[p] = 4 + (int)(test_xorshift(rs) % (GEN_MAXP - 4));
        for (int j = 0; j < plen[p]; j++) prompts[p][j] = 2 + (int)(test_xorshift(rs) % (unsigned long long)(V - 2));
    }
}

/* The scenario on one loaded model: 1, 3 and GEN_PROMPTS prompts greedy and with temperature,
 * the last size again with a forward between two steps; how = 0: each synchronous run first,
 * 1: the decode graphs captured up front (di_model_warmup_decode, as the engine does), 2: each
 * asynchronous run first (the first steps of a bucket run eagerly). The prompts:
 * async_make_prompts from the caller's xorshift state rs. Adds the runs and the
 * identical ones to *runs / *same (8 runs). */
static void async_model_runs(di_model *m, unsigned long long *rs, int how, const char *what, int *runs, int *same) {
    static int32_t prompts[GEN_PROMPTS][GEN_MAXP];
    int plen[GEN_PROMPTS];
    async_make_prompts(prompts, plen, di_model_config_of(m)->vocab_size, rs);
    if (how == 1) {
        int nc = 0;
        CHECK_OK(di_model_warmup_decode(m, GEN_PROMPTS, &nc));
        CHECK(nc > 0);
    }
    static const int sizes[4] = {1, 3, GEN_PROMPTS, GEN_PROMPTS};
    for (int k = 0; k < 4; k++)
        for (int t = 0; t < 2; t++) {
            int mode = k == 3 ? 2 : 1; /* the last size with a forward in between */
            int eq = async_compare(m, prompts, plen, sizes[k], t ? 0.9f : 0.0f, mode, how == 2, what);
            CHECK_MSG(eq >= 0, "%s: %d prompts: %s", what, sizes[k], di_last_error());
            CHECK(eq == 1);
            CHECK_EQ_INT(di_model_sample_in_flight(m), 0);
            (*runs)++;
            *same += eq == 1;
        }
}
#endif
