/* cuda_trace.h - a timeline of the GPU work inside chosen host calls (decode steps), from CUPTI
 * activity records: every kernel, memcpy and memset with its GPU start and end, including the
 * kernels of replayed CUDA graphs and programmatic-dependent launches that overlap their
 * predecessor. Used by bench_cuda_e2e --trace to say where a decode step's time goes in the
 * real graph replay (ncu serializes kernels and flushes caches, so its per-kernel times do not
 * add up to a step).
 *
 *   trace_init()              before the model is loaded (CUPTI may need to see graph creation)
 *   trace_mark()              before each traced call, and once after the last one
 *   trace_report(stdout, B)   flushes the records and prints the report
 *
 * What the report calls a kernel's "advance": the activities of a step sorted by end time, each
 * one's end minus the latest end before it (0 when it ends in another's shadow). The advances
 * of a step add up to its GPU span, so they attribute the span to the work that finished last:
 * a side-lane kernel hidden beside the main chain advances nothing, a kernel that ends long
 * after its predecessor advances by its exposed time. Built only with CUPTI (DI_HAVE_CUPTI);
 * tracing slows the host side of a step a little, so traced steps are not timed.
 *
 * Owner: bench. Records are kept in one growing array; names are copied. */
#ifndef DI_BENCH_CUDA_TRACE_H
#define DI_BENCH_CUDA_TRACE_H
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct trace_rec {
    uint64_t start, end;
    char name[64];
    int grid, block; /* blocks and threads per block (0 for copies) */
    unsigned stream; /* CUPTI's stream id */
    int regs, smem;  /* registers per thread; shared memory the driver configured for it, KB */
    double adv;      /* its advance in its step (us), set by trace_step */
} trace_rec;

static trace_rec *g_tr;
static size_t g_tr_n, g_tr_cap;
static uint64_t g_marks[4096];
static int g_nmarks;
static int g_trace_on;

#define TRACE_TRY(call)                                                                 \
    do {                                                                                \
        CUptiResult r_ = (call);                                                        \
        if (r_ != CUPTI_SUCCESS) {                                                      \
            const char *m_ = NULL;                                                      \
            cuptiGetResultString(r_, &m_);                                              \
            fprintf(stderr, "cuda_trace: %s: %s\n", #call, m_ ? m_ : "unknown error"); \
            return 0;                                                                   \
        }                                                                               \
    } while (0)

/* "_Z10k_small_guILi1ELb0ELi4EEv10small_argsi" -> "k_small_gu<1,0,4>"; other names as they are */
static void trace_short_name(const char *m, char *out, size_t cap) {
    if (!m) {
        snprintf(out, cap, "?");
        return;
    }
    const char *p = m;
    if (p[0] != '_' || p[1] != 'Z') {
        snprintf(out, cap, "%s", m);
        return;
    }
    p += 2;
    if (*p == 'N') p++; /* nested name: take its first component */
    int n = 0;
    while (*p >= '0' && *p <= '9') n = n * 10 + (*p++ - '0');
    if (n <= 0 || (size_t)n >= cap || strlen(p) < (size_t)n) {
        snprintf(out, cap, "%s", m);
        return;
    }
    size_t o = (size_t)n;
    memcpy(out, p, o);
    p += n;
    if (*p == 'I') { /* template arguments: literals L<type><value>E as values, the rest as '?' */
        p++;
        out[o++] = '<';
        int first = 1;
        while (*p && *p != 'E' && o + 8 < cap) {
            if (!first) out[o++] = ',';
            first = 0;
            if (*p == 'L') {
                p++;
                while (*p && !(*p >= '0' && *p <= '9') && *p != 'n' && *p != 'E') p++;
                if (*p == 'n') out[o++] = '-', p++;
                while (*p >= '0' && *p <= '9' && o + 4 < cap) out[o++] = *p++;
                if (*p == 'E') p++;
            } else {
                out[o++] = '?';
                break;
            }
        }
        out[o++] = '>';
    }
    out[o] = 0;
}

static void CUPTIAPI trace_buf_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = (size_t)8 << 20;
    *buf = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;
}

static void trace_add(uint64_t start, uint64_t end, const char *name, int grid, int block, unsigned stream, int regs,
                      int smem) {
    if (g_tr_n == g_tr_cap) {
        size_t cap = g_tr_cap ? 2 * g_tr_cap : 65536;
        trace_rec *t = (trace_rec *)realloc(g_tr, cap * sizeof *t);
        if (!t) return;
        g_tr = t;
        g_tr_cap = cap;
    }
    trace_rec *r = &g_tr[g_tr_n++];
    r->start = start;
    r->end = end;
    r->grid = grid;
    r->block = block;
    r->stream = stream;
    r->regs = regs;
    r->smem = smem;
    trace_short_name(name, r->name, sizeof r->name);
}

static void CUPTIAPI trace_buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
            trace_add(k->start, k->end, k->name, k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ,
                      k->streamId, k->registersPerThread, (int)(k->sharedMemoryExecuted >> 10));
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *c = (const CUpti_ActivityMemcpy6 *)rec;
            char nm[48];
            snprintf(nm, sizeof nm, "[memcpy kind %u, %llu B]", (unsigned)c->copyKind, (unsigned long long)c->bytes);
            trace_add(c->start, c->end, nm, 0, 0, c->streamId, 0, 0);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *s = (const CUpti_ActivityMemset4 *)rec;
            char nm[48];
            snprintf(nm, sizeof nm, "[memset %llu B]", (unsigned long long)s->bytes);
            trace_add(s->start, s->end, nm, 0, 0, s->streamId, 0, 0);
        }
    }
    free(buf);
}

/* 1 when tracing is on */
static int trace_init(void) {
    TRACE_TRY(cuptiActivityRegisterCallbacks(trace_buf_requested, trace_buf_completed));
    TRACE_TRY(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    TRACE_TRY(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    TRACE_TRY(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    g_trace_on = 1;
    return 1;
}

static void trace_mark(void) {
    uint64_t t = 0;
    if (g_trace_on && g_nmarks < (int)(sizeof g_marks / sizeof g_marks[0]) && cuptiGetTimestamp(&t) == CUPTI_SUCCESS)
        g_marks[g_nmarks++] = t;
}

static int trace_cmp_end(const void *a, const void *b) {
    const trace_rec *x = *(const trace_rec *const *)a, *y = *(const trace_rec *const *)b;
    return x->end < y->end ? -1 : x->end > y->end ? 1 : 0;
}
static int trace_cmp_start(const void *a, const void *b) {
    const trace_rec *x = *(const trace_rec *const *)a, *y = *(const trace_rec *const *)b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : 0;
}

typedef struct trace_agg {
    char name[64];
    int grid;
    double n, dur, adv; /* summed over the traced steps */
} trace_agg;

/* One traced step: its records sorted by start, its GPU span, idle time inside it and host
 * time (us). */
typedef struct trace_stepv {
    trace_rec **v;
    int n;
    double span, idle, host;
} trace_stepv;

/* The step between marks s and s + 1, each record's advance set (see the top of the file). */
static void trace_step(int s, trace_stepv *st) {
    uint64_t a = g_marks[s], b = g_marks[s + 1];
    trace_rec **v = (trace_rec **)malloc((g_tr_n + 1) * sizeof *v);
    int n = 0;
    for (size_t i = 0; i < g_tr_n; i++)
        if (g_tr[i].start >= a && g_tr[i].start < b) v[n++] = &g_tr[i];
    qsort(v, (size_t)n, sizeof *v, trace_cmp_start);
    *st = (trace_stepv){v, n, 0, 0, (double)(b - a) / 1e3};
    if (n == 0) return;
    uint64_t cover = v[0]->start, idle = 0, last = v[0]->start;
    for (int i = 0; i < n; i++) {
        if (v[i]->start > cover) idle += v[i]->start - cover;
        if (v[i]->end > cover) cover = v[i]->end;
        if (v[i]->end > last) last = v[i]->end;
    }
    st->span = (double)(last - v[0]->start) / 1e3;
    st->idle = (double)idle / 1e3;
    trace_rec **e = (trace_rec **)malloc((size_t)n * sizeof *e); /* by end: the advances */
    memcpy(e, v, (size_t)n * sizeof *e);
    qsort(e, (size_t)n, sizeof *e, trace_cmp_end);
    uint64_t front = v[0]->start;
    for (int i = 0; i < n; i++) {
        e[i]->adv = e[i]->end > front ? (double)(e[i]->end - front) / 1e3 : 0;
        if (e[i]->end > front) front = e[i]->end;
    }
    free(e);
}

/* Prints the per-step summary, the kernels of the median step in start order, and the per-kernel
 * totals over all traced steps, for the calls between the marks. */
static void trace_report(FILE *f, const char *what) {
    if (!g_trace_on) return;
    cuptiActivityFlushAll(1);
    int steps = g_nmarks - 1;
    if (steps < 1) return;
    trace_stepv *sv = (trace_stepv *)malloc((size_t)steps * sizeof *sv);
    fprintf(f, "trace %s: %d steps, %zu GPU activities recorded\n", what, steps, g_tr_n);
    for (int s = 0; s < steps; s++) {
        trace_step(s, &sv[s]);
        fprintf(f, "  step %d: %d activities, GPU span %.1f us (idle inside %.1f us), host call %.1f us\n", s,
                sv[s].n, sv[s].span, sv[s].idle, sv[s].host);
    }
    int med = 0; /* the step of median span */
    for (int s = 0; s < steps; s++) {
        int below = 0;
        for (int t = 0; t < steps; t++) below += sv[t].span < sv[s].span;
        if (below == steps / 2) med = s;
    }
    trace_rec **v = sv[med].v;
    fprintf(f, "  median step %d, in start order (us from its first start):\n", med);
    fprintf(f, "  %8s %8s %7s %7s  %-40s %6s %5s %6s %4s %5s\n", "start", "end", "dur", "advance", "kernel", "blocks",
            "thr", "stream", "regs", "smemK");
    for (int i = 0; i < sv[med].n; i++)
        fprintf(f, "  %8.1f %8.1f %7.1f %7.1f  %-40s %6d %5d %6u %4d %5d\n", (double)(v[i]->start - v[0]->start) / 1e3,
                (double)(v[i]->end - v[0]->start) / 1e3, (double)(v[i]->end - v[i]->start) / 1e3, v[i]->adv,
                v[i]->name, v[i]->grid, v[i]->block, v[i]->stream, v[i]->regs, v[i]->smem);
    /* totals per (name, grid) over every step */
    trace_agg *ag = (trace_agg *)calloc(g_tr_n + 1, sizeof *ag);
    int na = 0;
    double tot_adv = 0;
    for (int s = 0; s < steps; s++)
        for (int i = 0; i < sv[s].n; i++) {
            const trace_rec *r = sv[s].v[i];
            int j = 0;
            while (j < na && !(ag[j].grid == r->grid && !strcmp(ag[j].name, r->name))) j++;
            if (j == na) {
                memcpy(ag[na].name, r->name, sizeof ag[na].name);
                ag[na++].grid = r->grid;
            }
            ag[j].n += 1;
            ag[j].dur += (double)(r->end - r->start) / 1e3;
            ag[j].adv += r->adv;
            tot_adv += r->adv;
        }
    for (int i = 1; i < na; i++) /* by advance, largest first */
        for (int j = i; j > 0 && ag[j].adv > ag[j - 1].adv; j--) {
            trace_agg t = ag[j];
            ag[j] = ag[j - 1];
            ag[j - 1] = t;
        }
    fprintf(f, "  per kernel, per step (mean over %d steps), by advance:\n", steps);
    fprintf(f, "  %-40s %6s %6s %9s %9s %6s\n", "kernel", "blocks", "count", "dur us", "adv us", "adv %");
    for (int i = 0; i < na; i++)
        fprintf(f, "  %-40s %6d %6.1f %9.1f %9.1f %5.1f%%\n", ag[i].name, ag[i].grid, ag[i].n / steps,
                ag[i].dur / steps, ag[i].adv / steps, tot_adv > 0 ? 100.0 * ag[i].adv / tot_adv : 0);
    free(ag);
    for (int s = 0; s < steps; s++) free(sv[s].v);
    free(sv);
    g_tr_n = 0;
    g_nmarks = 0;
}
#endif
