/* threadpool.h - a fixed pool of worker threads running parallel-for loops.
 *
 * di_threadpool_run(pool, n, fn, ctx) calls fn(ctx, i, thread_index) for every i in [0, n),
 * spread over the workers and the calling thread, and returns when all are done. Calls on one
 * pool must not overlap (one caller at a time). A NULL pool or 1 thread runs serially on the
 * caller. Thread count: explicit, or DEEPINFER_THREADS, or the number of online CPUs. */
#ifndef DI_CORE_THREADPOOL_H
#define DI_CORE_THREADPOOL_H
#include <stddef.h>

typedef struct di_threadpool di_threadpool;
typedef void (*di_parallel_fn)(void *ctx, size_t index, int thread_index);

/* n_threads <= 0: DEEPINFER_THREADS or the CPU count. Returns NULL on failure. */
di_threadpool *di_threadpool_create(int n_threads);
void di_threadpool_free(di_threadpool *pool);
int di_threadpool_size(const di_threadpool *pool);  /* 1 for NULL */
void di_threadpool_run(di_threadpool *pool, size_t n, di_parallel_fn fn, void *ctx);
/* Default CPU count honoring DEEPINFER_THREADS. */
int di_default_threads(void);
#endif
