/* cpu_matmul.c - fp32 GEMM kernels of the CPU backend and the matmul / bmm ops.
 *
 * Owner: model. y[M, N] = x[M, K] · W[N, K]ᵀ with both operands K-contiguous, so every output
 * is a dot product. Register-blocked micro-kernels (4 rows of x by 2 rows of W) written with
 * GCC vector extensions (SSE2 by default, AVX with -march=native; no intrinsics). Invariant:
 * every output element is computed by the same fp32 sequence in every kernel variant — LANES
 * partial sums over k ≡ l (mod LANES), reduced in a fixed tree, then the scalar tail — so the
 * result does not depend on tiling, thread count or batch composition. */
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "core/status.h"

#if defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vf __attribute__((vector_size(LANES * sizeof(float))));

static inline vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum(vf v) {
    float a[LANES];
    memcpy(a, &v, sizeof a);
#if LANES == 8
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
#else
    return (a[0] + a[2]) + (a[1] + a[3]);
#endif
}

float cpu_dot(const float *a, const float *b, int n) {
    vf acc = {0};
    int kv = n - n % LANES, k;
    for (k = 0; k < kv; k += LANES) acc += vload(a + k) * vload(b + k);
    float s = hsum(acc);
    for (; k < n; k++) s += a[k] * b[k];
    return s;
}

void cpu_axpy(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static inline void store(float *y, float v, int accumulate) {
    if (accumulate) *y += v; else *y = v;
}

/* 4 rows of x times 2 rows of W. */
static void kernel_4x2(float *y, int ldy, const float *x, int ldx, const float *w, int ldw, int K,
                       int accumulate) {
    vf c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0};
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * (size_t)ldx, *x3 = x + 3 * (size_t)ldx;
    const float *w0 = w, *w1 = w + ldw;
    int kv = K - K % LANES, k;
    for (k = 0; k < kv; k += LANES) {
        vf b0 = vload(w0 + k), b1 = vload(w1 + k);
        vf a = vload(x0 + k);
        c00 += a * b0; c01 += a * b1;
        a = vload(x1 + k);
        c10 += a * b0; c11 += a * b1;
        a = vload(x2 + k);
        c20 += a * b0; c21 += a * b1;
        a = vload(x3 + k);
        c30 += a * b0; c31 += a * b1;
    }
    float s[4][2] = {{hsum(c00), hsum(c01)}, {hsum(c10), hsum(c11)},
                     {hsum(c20), hsum(c21)}, {hsum(c30), hsum(c31)}};
    for (; k < K; k++)
        for (int i = 0; i < 4; i++) {
            float xv = x[i * (size_t)ldx + k];
            s[i][0] += xv * w0[k];
            s[i][1] += xv * w1[k];
        }
    for (int i = 0; i < 4; i++) {
        store(y + i * (size_t)ldy, s[i][0], accumulate);
        store(y + i * (size_t)ldy + 1, s[i][1], accumulate);
    }
}

/* 1 row of x times 4 rows of W (GEMV-shaped remainder). */
static void kernel_1x4(float *y, const float *x, const float *w, int ldw, int K, int accumulate) {
    vf c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * (size_t)ldw, *w3 = w + 3 * (size_t)ldw;
    int kv = K - K % LANES, k;
    for (k = 0; k < kv; k += LANES) {
        vf a = vload(x + k);
        c0 += a * vload(w0 + k);
        c1 += a * vload(w1 + k);
        c2 += a * vload(w2 + k);
        c3 += a * vload(w3 + k);
    }
    float s0 = hsum(c0), s1 = hsum(c1), s2 = hsum(c2), s3 = hsum(c3);
    for (; k < K; k++) {
        s0 += x[k] * w0[k];
        s1 += x[k] * w1[k];
        s2 += x[k] * w2[k];
        s3 += x[k] * w3[k];
    }
    store(y, s0, accumulate);
    store(y + 1, s1, accumulate);
    store(y + 2, s2, accumulate);
    store(y + 3, s3, accumulate);
}

void cpu_gemm_serial(float *y, int ldy, const float *x, int ldx, const float *W, int ldw, int M,
                     int N, int K, int accumulate) {
    int m4 = M - M % 4, n2 = N - N % 2;
    for (int j = 0; j < n2; j += 2)
        for (int i = 0; i < m4; i += 4)
            kernel_4x2(y + (size_t)i * ldy + j, ldy, x + (size_t)i * ldx, ldx, W + (size_t)j * ldw,
                       ldw, K, accumulate);
    /* remaining rows of x: all columns */
    for (int i = m4; i < M; i++) {
        const float *xi = x + (size_t)i * ldx;
        float *yi = y + (size_t)i * ldy;
        int j = 0;
        for (; j + 4 <= N; j += 4) kernel_1x4(yi + j, xi, W + (size_t)j * ldw, ldw, K, accumulate);
        for (; j < N; j++) store(yi + j, cpu_dot(xi, W + (size_t)j * ldw, K), accumulate);
    }
    /* last odd column for the blocked rows */
    if (n2 < N)
        for (int i = 0; i < m4; i++)
            store(y + (size_t)i * ldy + n2, cpu_dot(x + (size_t)i * ldx, W + (size_t)n2 * ldw, K),
                  accumulate);
}

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
    cpu_gemm_serial(g->y + (size_t)m0 * g->ldy + n0, g->ldy, g->x + (size_t)m0 * g->ldx, g->ldx,
                    g->W + (size_t)n0 * g->ldw, g->ldw, m, n, g->K, g->accumulate);
}

void cpu_gemm(di_threadpool *pool, float *y, int ldy, const float *x, int ldx, const float *W,
              int ldw, int M, int N, int K, int accumulate) {
    if (M <= 0 || N <= 0) return;
    if (di_threadpool_size(pool) == 1) {
        cpu_gemm_serial(y, ldy, x, ldx, W, ldw, M, N, K, accumulate);
        return;
    }
    gemm_job g = {y, x, W, ldy, ldx, ldw, M, N, K, accumulate, GEMM_MB, GEMM_NB, 0};
    g.n_mtiles = (M + g.mb - 1) / g.mb;
    size_t n_items = (size_t)g.n_mtiles * (size_t)((N + g.nb - 1) / g.nb);
    di_threadpool_run(pool, n_items, gemm_item, &g);
}

void cpu_matmul(di_backend *be, void *y, int ldy, const void *x, int ldx, const di_weight *W,
                int T, unsigned flags) {
    DI_ASSERT(W && W->n == 1 && W->dtype == DI_DTYPE_F32);
    DI_ASSERT(ldx >= W->cols && ldy >= W->rows);
    cpu_gemm(cpu_pool_for(be, (double)T * W->rows * W->cols), y, ldy, x, ldx, W->data, W->cols, T, W->rows, W->cols,
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
    cpu_gemm_serial(b->y + h * (size_t)b->hsy, b->ldy, b->x + h * (size_t)b->hsx, b->ldx, Wh,
                    b->W->cols, b->T, b->W->rows, b->W->cols, 0);
}

void cpu_bmm(di_backend *be, void *y, int ldy, int hsy, const void *x, int ldx, int hsx,
             const di_weight *W, int T) {
    DI_ASSERT(W && W->dtype == DI_DTYPE_F32);
    if (T <= 0) return;
    bmm_job b = {y, x, W, ldy, hsy, ldx, hsx, T};
    cpu_parallel(be, (size_t)W->n, bmm_item, &b, (double)T * W->n * W->rows * W->cols);
}
