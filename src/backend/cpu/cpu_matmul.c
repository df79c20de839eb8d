/* cpu_matmul.c - the CPU backend's GEMM entry points (instruction-set dispatch, threading over
 * tiles) and the matmul / bmm ops.
 *
 * Owner: model. The micro-kernels live in cpu_gemm_kernels.h, instantiated for baseline x86-64
 * (cpu_gemm_base.c) and AVX2+FMA (cpu_gemm_avx2.c); the AVX2 one is used when the CPU has it
 * unless DEEPINFER_CPU_ISA=baseline. The choice is made once per process, so every op of a
 * run uses the same arithmetic (results stay bit-reproducible and batch-invariant on a given
 * machine; they may differ in the last bits between machines). */
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "core/status.h"

#include <pthread.h>
#include <stdlib.h>

/* ---- instruction-set dispatch (chosen once per process) ---- */

typedef void (*gemm_serial_fn)(float *, int, const float *, int, const float *, int, int, int, int, int);
typedef float (*dot_fn)(const float *, const float *, int);
typedef void (*axpy_fn)(float *, float, const float *, int);
static gemm_serial_fn g_gemm_serial = di_cpu_gemm_serial_base;
static dot_fn g_dot = di_cpu_dot_base;
static axpy_fn g_axpy = di_cpu_axpy_base;
static const char *g_isa = "baseline";
static pthread_once_t g_isa_once = PTHREAD_ONCE_INIT;

int di_cpu_have_avx2(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static void pick_isa(void) {
    const char *want = getenv("DEEPINFER_CPU_ISA");
    int baseline = want && !strcmp(want, "baseline");
#if defined(__x86_64__) && defined(__GNUC__)
    if (!baseline && di_cpu_have_avx2()) {
        g_gemm_serial = di_cpu_gemm_serial_avx2;
        g_dot = di_cpu_dot_avx2;
        g_axpy = di_cpu_axpy_avx2;
        g_isa = "avx2+fma";
    }
#else
    (void)baseline;
#endif
}

void di_cpu_isa_init(void) { pthread_once(&g_isa_once, pick_isa); }
const char *di_cpu_isa(void) { di_cpu_isa_init(); return g_isa; }

void di_cpu_gemm_serial(float *y, int ldy, const float *x, int ldx, const float *W, int ldw, int M,
                        int N, int K, int accumulate) {
    g_gemm_serial(y, ldy, x, ldx, W, ldw, M, N, K, accumulate);
}

float di_cpu_dot(const float *a, const float *b, int n) { return g_dot(a, b, n); }

void di_cpu_axpy(float *y, float a, const float *x, int n) { g_axpy(y, a, x, n); }

typedef struct {
    float *y;
    const float *x, *W;
    int ldy, ldx, ldw, M, N, K, accumulate;
    int mb, nb, n_mtiles;
} gemm_job;

enum { GEMM_MB = 64, GEMM_NB = 16 };

static void gemm_item(void *ctx, size_t item, int tid) {
    (void)tid;
    const gemm_job *g = ctx;
    int mi = (int)(item % (size_t)g->n_mtiles), ni = (int)(item / (size_t)g->n_mtiles);
    int m0 = mi * g->mb, n0 = ni * g->nb;
    int m = g->M - m0 < g->mb ? g->M - m0 : g->mb;
    int n = g->N - n0 < g->nb ? g->N - n0 : g->nb;
    di_cpu_gemm_serial(g->y + (size_t)m0 * g->ldy + n0, g->ldy, g->x + (size_t)m0 * g->ldx, g->ldx,
                    g->W + (size_t)n0 * g->ldw, g->ldw, m, n, g->K, g->accumulate);
}

void di_cpu_gemm(di_threadpool *pool, float *y, int ldy, const float *x, int ldx, const float *W,
              int ldw, int M, int N, int K, int accumulate) {
    if (M <= 0 || N <= 0) return;
    if (di_threadpool_size(pool) == 1) {
        di_cpu_gemm_serial(y, ldy, x, ldx, W, ldw, M, N, K, accumulate);
        return;
    }
    gemm_job g = {y, x, W, ldy, ldx, ldw, M, N, K, accumulate, GEMM_MB, GEMM_NB, 0};
    g.n_mtiles = (M + g.mb - 1) / g.mb;
    size_t n_items = (size_t)g.n_mtiles * (size_t)((N + g.nb - 1) / g.nb);
    di_threadpool_run(pool, n_items, gemm_item, &g);
}

void di_cpu_matmul(di_backend *be, void *y, int ldy, const void *x, int ldx, const di_weight *W,
                int T, unsigned flags) {
    DI_ASSERT(W && W->n == 1 && W->dtype == DI_DTYPE_F32);
    DI_ASSERT(ldx >= W->cols && ldy >= W->rows);
    di_cpu_gemm(cpu_pool_for(be, (double)T * W->rows * W->cols), y, ldy, x, ldx, W->data, W->cols, T, W->rows, W->cols,
             (flags & DI_MM_ACCUMULATE) != 0);
}

typedef struct {
    float *y;
    const float *x;
    const di_weight *W;
    int ldy, hsy, ldx, hsx, T;
} bmm_job;

static void bmm_item(void *ctx, size_t h, int tid) {
    (void)tid;
    const bmm_job *b = ctx;
    const float *Wh = (const float *)b->W->data + h * (size_t)b->W->rows * b->W->cols;
    di_cpu_gemm_serial(b->y + h * (size_t)b->hsy, b->ldy, b->x + h * (size_t)b->hsx, b->ldx, Wh,
                    b->W->cols, b->T, b->W->rows, b->W->cols, 0);
}

void di_cpu_bmm(di_backend *be, void *y, int ldy, int hsy, const void *x, int ldx, int hsx,
             const di_weight *W, int T) {
    DI_ASSERT(W && W->dtype == DI_DTYPE_F32);
    if (T <= 0) return;
    bmm_job b = {y, x, W, ldy, hsy, ldx, hsx, T};
    cpu_parallel(be, (size_t)W->n, bmm_item, &b, (double)T * W->n * W->rows * W->cols);
}
