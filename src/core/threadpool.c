/* threadpool.c - pthread worker pool with a generation counter; work items are claimed with an
 * atomic counter so uneven items balance themselves. */
#include "core/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct di_threadpool {
    int n_threads;  /* including the caller */
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    unsigned long generation;
    int shutdown;
    int active;  /* workers still running the current job */
    /* current job */
    di_parallel_fn fn;
    void *ctx;
    size_t n;
    atomic_size_t next;
};

typedef struct { di_threadpool *pool; int index; } worker_arg;

static void run_items(di_threadpool *p, int tid) {
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n) break;
        p->fn(p->ctx, i, tid);
    }
}

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    di_threadpool *p = wa.pool;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->shutdown && p->generation == seen) pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->shutdown) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_items(p, wa.index);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int di_default_threads(void) {
    const char *s = getenv("DEEPINFER_THREADS");
    if (s) {
        int n = atoi(s);
        if (n > 0 && n <= 1024) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

di_threadpool *di_threadpool_create(int n_threads) {
    if (n_threads <= 0) n_threads = di_default_threads();
    di_threadpool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->workers) { free(p); return NULL; }
        for (int i = 0; i < n_threads - 1; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) { p->n_threads = i + 1; break; }
            wa->pool = p;
            wa->index = i + 1;
            if (pthread_create(&p->workers[i], NULL, worker_main, wa) != 0) {
                free(wa);
                p->n_threads = i + 1;
                break;
            }
        }
    }
    return p;
}

void di_threadpool_free(di_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->shutdown = 1;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p);
}

int di_threadpool_size(const di_threadpool *p) { return p ? p->n_threads : 1; }

void di_threadpool_run(di_threadpool *p, size_t n, di_parallel_fn fn, void *ctx) {
    if (n == 0) return;
    if (!p || p->n_threads == 1 || n == 1) {
        for (size_t i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    atomic_store(&p->next, 0);
    p->active = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    run_items(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
