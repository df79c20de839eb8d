/* bench_engine.c - the engine's own cost per step, with the null executor (instant fixed
 * logits, no KV), 256 running sequences in decode:
 *   1. di_engine_step with a 16-token vocabulary and greedy sampling: scheduling, block
 *      bookkeeping (incl. new blocks every 64 tokens and prefix-cache registration), batch
 *      assembly, token append / stop checks, output reporting (sampling ~free). Goal: <= 20 us.
 *   2. batch assembly alone (di_runner_prepare of the same plan), for the breakdown.
 *   3. sampling cost per step at the DeepSeek-V3 vocabulary (129280) for 256 rows: greedy,
 *      temperature 1, top-k 50, top-p 0.9 (it scales with the vocabulary; reported apart).
 * Prints the medians of repeated timings and the ratio to the 20 us goal.
 *   usage: bench_engine [steps (default 2000)] [sequences (256)] [prompt tokens (700)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "engine/engine_internal.h"
#include "engine/executor.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 2000;
    int nseq = argc > 2 ? atoi(argv[2]) : 256;
    int plen = argc > 3 ? atoi(argv[3]) : 700;
    if (steps < 10 || nseq < 1 || plen < 1) {
        fprintf(stderr, "usage: bench_engine [steps >= 10] [sequences] [prompt tokens]\n");
        return 2;
    }
    const int max_len = plen + steps + 200;
    const int blocks = nseq * ((max_len + 63) / 64) + 64;
    di_executor ex;
    if (di_executor_null_create(16, blocks, max_len, nseq, &ex) != DI_OK) {
        fprintf(stderr, "%s\n", di_last_error());
        return 1;
    }
    di_engine_params p;
    di_engine_params_init(&p);
    p.max_batch_tokens = 2048;
    p.max_seqs = nseq;
    di_engine *e;
    if (di_engine_create_with(&p, &ex, NULL, &e) != DI_OK) {
        fprintf(stderr, "%s\n", di_last_error());
        return 1;
    }
    int32_t *prompt = malloc((size_t)plen * sizeof *prompt);
    for (int i = 0; i < nseq; i++) {
        for (int k = 0; k < plen; k++) prompt[k] = (int32_t)(di_rng_mix64((uint64_t)i * 100003 + (uint64_t)k) % 16);
        di_request_input r;
        di_request_input_init(&r);
        r.prompt_ids = prompt;
        r.n_prompt_ids = (size_t)plen;
        r.sampling.temperature = 0;
        r.sampling.max_tokens = steps + 100;
        r.sampling.ignore_eos = 1;
        if (di_engine_add_request(e, &r, NULL) != DI_OK) {
            fprintf(stderr, "%s\n", di_last_error());
            return 1;
        }
    }
    /* prefill everything */
    const di_request_output *const *outs;
    size_t n_outs;
    int warm = 0;
    while (di_scheduler_n_waiting(e->sched) > 0 || warm < 3) {
        if (di_engine_step(e, &outs, &n_outs) != DI_OK) {
            fprintf(stderr, "%s\n", di_last_error());
            return 1;
        }
        if (di_scheduler_n_waiting(e->sched) == 0) warm++;
    }
    /* 1. decode steps */
    double *t = malloc((size_t)steps * sizeof *t);
    for (int s = 0; s < steps; s++) {
        uint64_t t0 = di_now_ns();
        di_engine_step(e, &outs, &n_outs);
        t[s] = (double)(di_now_ns() - t0) * 1e-3;
    }
    double step_us = median(t, steps);
    double mean = 0;
    for (int s = 0; s < steps; s++) mean += t[s];
    mean /= steps;
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    /* 2. batch assembly of one 256-sequence decode plan */
    const di_step_plan *plan = di_scheduler_schedule(e->sched);
    for (int s = 0; s < steps; s++) {
        uint64_t t0 = di_now_ns();
        di_runner_prepare(e->runner, plan);
        t[s] = (double)(di_now_ns() - t0) * 1e-3;
    }
    double prep_us = median(t, steps);
    printf("engine step, %d running sequences (context %d..%d), null executor, vocab 16, greedy:\n", st.running, plen,
           plen + steps);
    printf("  median %.2f us/step  (mean %.2f)  ratio to the 20 us goal: %.2f  [%d tokens/step]\n", step_us, mean,
           step_us / 20.0, plan->n_tokens);
    printf("  of which batch assembly (di_runner_prepare): median %.2f us\n", prep_us);
    di_engine_free(e);

    /* 3. sampling at the real vocabulary */
    const int V = 129280, rows = nseq;
    float *logits = malloc((size_t)V * sizeof *logits);
    for (int v = 0; v < V; v++) logits[v] = (float)((di_rng_mix64((uint64_t)v + 5) >> 40) / 16777216.0) * 12.0f - 6.0f;
    di_sampler *smp;
    if (di_sampler_create(V, &smp) != DI_OK) return 1;
    struct {
        const char *name;
        float temp, top_p;
        int top_k;
    } modes[] = {{"greedy", 0, 1, -1}, {"temperature 1", 1, 1, -1}, {"top-k 50", 1, 1, 50}, {"top-p 0.9", 1, 0.9f, -1}};
    printf("sampling, vocab %d, %d rows per step:\n", V, rows);
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        di_sampling_params sp;
        di_sampling_params_init(&sp);
        sp.temperature = modes[m].temp;
        sp.top_p = modes[m].top_p;
        sp.top_k = modes[m].top_k;
        di_sample_request rq = {.params = &sp, .seed = 1};
        int reps = 9;
        double per_row[9];
        for (int r = 0; r < reps; r++) {
            uint64_t t0 = di_now_ns();
            int n_rows = m == 0 ? rows : 16; /* the slow modes on 16 rows, scaled */
            for (int i = 0; i < n_rows; i++) {
                int32_t tok;
                rq.position = (uint32_t)(r * rows + i);
                di_sampler_sample(smp, logits, &rq, &tok, NULL);
            }
            per_row[r] = (double)(di_now_ns() - t0) * 1e-3 / n_rows;
        }
        double pr = median(per_row, reps);
        printf("  %-14s %8.1f us/row  %9.2f ms/step (x%d rows)\n", modes[m].name, pr, pr * rows * 1e-3, rows);
    }
    di_sampler_free(smp);
    free(logits);
    free(prompt);
    free(t);
    return 0;
}
