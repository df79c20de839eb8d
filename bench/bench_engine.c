/* bench_engine.c - the engine's own cost per step, with the null executor (instant fixed
 * logits, no KV), 256 running sequences in decode (contexts 700 -> 700 + steps tokens):
 *   1. di_engine_step with a 16-token vocabulary and greedy sampling: scheduling, block
 *      bookkeeping (a new block every 64 tokens per sequence, prefix-cache registration),
 *      batch assembly, sampling (tiny here), token append and stop checks, output reporting.
 *      Measured with outputs streamed every step (stream_outputs = 1, the server's mode) and
 *      with only final outputs (stream_outputs = 0, offline generation). Goal: <= 20 us.
 *   2. the parts: batch assembly alone (di_runner_prepare of a 256-sequence decode plan) and
 *      greedy sampling of 256 rows at vocabulary 16 (so engine-only = step - that).
 *   3. sampling cost per step at the DeepSeek-V3 vocabulary (129280), 256 rows: greedy,
 *      temperature 1, top-k 50, top-p 0.9 (it scales with the vocabulary; reported apart).
 * Times are thread CPU time (less disturbed than wall time on a shared machine), read around
 * chunks of 50 steps (reading that clock is a system call); the median and the minimum chunk
 * are printed, with the ratio of the median to the 20 us goal.
 *   usage: bench_engine [steps (2000)] [sequences (256)] [prompt tokens (700)] [sampling 1/0] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/timer.h"
#include "engine/engine_internal.h"
#include "engine/executor.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"

enum { CHUNK = 50 };

static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

static void die(void) {
    fprintf(stderr, "bench_engine: %s\n", di_last_error());
    exit(1);
}

/* An engine with nseq decoding sequences (prefill done). */
static di_engine *setup(int nseq, int plen, int steps, int stream) {
    const int max_len = plen + steps + 200;
    const int blocks = nseq * ((max_len + 63) / 64) + 64;
    di_executor ex;
    if (di_executor_null_create(16, blocks, max_len, nseq, &ex) != DI_OK) die();
    di_engine_params p;
    di_engine_params_init(&p);
    p.max_batch_tokens = 2048;
    p.max_seqs = nseq;
    p.stream_outputs = stream;
    di_engine *e;
    if (di_engine_create_with(&p, &ex, NULL, &e) != DI_OK) die();
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
        if (di_engine_add_request(e, &r, NULL) != DI_OK) die();
    }
    free(prompt);
    const di_request_output *const *outs;
    size_t n_outs;
    int warm = 0;
    while (di_scheduler_n_waiting(e->sched) > 0 || warm < 3) {
        if (di_engine_step(e, &outs, &n_outs) != DI_OK) die();
        if (di_scheduler_n_waiting(e->sched) == 0) warm++;
    }
    return e;
}

/* median / min per-step CPU time of `steps` decode steps */
static void time_steps(di_engine *e, int steps, double *med, double *min, double *wall) {
    int chunks = steps / CHUNK;
    double *c = malloc((size_t)chunks * sizeof *c), *t = malloc((size_t)chunks * sizeof *t);
    const di_request_output *const *outs;
    size_t n_outs;
    for (int k = 0; k < chunks; k++) {
        uint64_t t0 = di_now_ns(), c0 = cpu_ns();
        for (int s = 0; s < CHUNK; s++)
            if (di_engine_step(e, &outs, &n_outs) != DI_OK) die();
        c[k] = (double)(cpu_ns() - c0) * 1e-3 / CHUNK;
        t[k] = (double)(di_now_ns() - t0) * 1e-3 / CHUNK;
    }
    *med = median(c, chunks);
    *min = c[0];
    *wall = median(t, chunks);
    free(c);
    free(t);
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 2000;
    int nseq = argc > 2 ? atoi(argv[2]) : 256;
    int plen = argc > 3 ? atoi(argv[3]) : 700;
    int with_sampling = argc > 4 ? atoi(argv[4]) : 1;
    if (steps < CHUNK || nseq < 1 || plen < 1) {
        fprintf(stderr, "usage: bench_engine [steps >= %d] [sequences] [prompt tokens] [sampling 1/0]\n", CHUNK);
        return 2;
    }
    printf("engine step, %d running sequences in decode (context %d..%d), null executor, vocab 16, greedy:\n", nseq,
           plen, plen + steps);
    double med_s = 0, med_o = 0;
    for (int stream = 1; stream >= 0; stream--) {
        di_engine *e = setup(nseq, plen, steps, stream);
        double med, min, wall;
        time_steps(e, steps, &med, &min, &wall);
        printf("  %-30s median %6.2f us/step CPU (min %6.2f; wall median %6.2f)  median / 20 us goal = %.2f\n",
               stream ? "stream_outputs = 1 (server):" : "stream_outputs = 0 (offline):", med, min, wall, med / 20.0);
        if (stream) med_s = med;
        else med_o = med;
        if (!stream) {
            /* parts: batch assembly of the current plan, greedy sampling of 256 tiny rows */
            const di_step_plan *plan = di_scheduler_schedule(e->sched);
            int chunks = steps / CHUNK;
            double *c = malloc((size_t)chunks * sizeof *c);
            for (int k = 0; k < chunks; k++) {
                uint64_t c0 = cpu_ns();
                for (int s = 0; s < CHUNK; s++) di_runner_prepare(e->runner, plan);
                c[k] = (double)(cpu_ns() - c0) * 1e-3 / CHUNK;
            }
            printf("  of which batch assembly (di_runner_prepare, %d tokens): median %.2f us\n", plan->n_tokens,
                   median(c, chunks));
            float logits[16];
            for (int v = 0; v < 16; v++) logits[v] = (float)v * 0.37f - 2.0f;
            di_sampling_params sp;
            di_sampling_params_init(&sp);
            sp.temperature = 0;
            di_sample_request rq = {.params = &sp, .seed = 1};
            for (int k = 0; k < chunks; k++) {
                uint64_t c0 = cpu_ns();
                for (int s = 0; s < CHUNK; s++)
                    for (int i = 0; i < nseq; i++) {
                        int32_t tok;
                        rq.position = (uint32_t)i;
                        di_sampler_sample(e->sampler, logits, &rq, &tok, NULL);
                    }
                c[k] = (double)(cpu_ns() - c0) * 1e-3 / CHUNK;
            }
            double samp = median(c, chunks);
            printf("  of which greedy sampling of %d rows at vocab 16: median %.2f us -> engine-only %.2f us "
                   "(offline), %.2f us (server)\n", nseq, samp, med_o - samp, med_s - samp);
            free(c);
        }
        di_engine_free(e);
    }
    if (!with_sampling) return 0;

    /* 3. sampling at the real vocabulary */
    const int V = 129280, rows = nseq;
    float *logits = malloc((size_t)V * sizeof *logits);
    for (int v = 0; v < V; v++) logits[v] = (float)((di_rng_mix64((uint64_t)v + 5) >> 40) / 16777216.0) * 12.0f - 6.0f;
    di_sampler *smp;
    if (di_sampler_create(V, &smp) != DI_OK) die();
    struct {
        const char *name;
        float temp, top_p;
        int top_k;
    } modes[] = {{"greedy", 0, 1, -1}, {"temperature 1", 1, 1, -1}, {"top-k 50", 1, 1, 50}, {"top-p 0.9", 1, 0.9f, -1}};
    printf("sampling, vocab %d (logits uniform in [-6, 6]), %d rows per step, one thread:\n", V, rows);
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        di_sampling_params sp;
        di_sampling_params_init(&sp);
        sp.temperature = modes[m].temp;
        sp.top_p = modes[m].top_p;
        sp.top_k = modes[m].top_k;
        di_sample_request rq = {.params = &sp, .seed = 1};
        double per_row[9];
        for (int r = 0; r < 9; r++) {
            uint64_t t0 = cpu_ns();
            for (int i = 0; i < 16; i++) {
                int32_t tok;
                rq.position = (uint32_t)(r * 16 + i);
                di_sampler_sample(smp, logits, &rq, &tok, NULL);
            }
            per_row[r] = (double)(cpu_ns() - t0) * 1e-3 / 16;
        }
        double pr = median(per_row, 9);
        printf("  %-14s %8.1f us/row  %9.2f ms/step (x%d rows)\n", modes[m].name, pr, pr * rows * 1e-3, rows);
    }
    di_sampler_free(smp);
    free(logits);
    return 0;
}
