/* cpu_gemm_kernels.h - the fp32 GEMM micro-kernels, as a template instantiated once per
 * instruction set: cpu_gemm_base.c (baseline x86-64 SSE2, 4 lanes, or whatever the build
 * targets) and cpu_gemm_avx2.c (AVX2 + FMA, 8 lanes, chosen at run time when the CPU has it).
 *
 * Owner: model. Before including, define GEMM_LANES (4 or 8) and GEMM_SUFFIX; this defines
 * di_cpu_gemm_serial_<suffix>, di_cpu_dot_<suffix> and di_cpu_axpy_<suffix>. y[M, N] (+)= x[M, K] · W[N, K]ᵀ with
 * both operands K-contiguous: register-blocked 4x2 and 1x4 micro-kernels in GCC vector
 * extensions (no intrinsics). Invariant: within one instantiation every output element is
 * computed by the same fp32 sequence in every kernel — LANES partial sums over k = l (mod
 * LANES), reduced in a fixed tree, then the scalar tail — so results do not depend on tiling,
 * thread count or batch composition. */
#include <string.h>

#define GEMM_CAT2(a, b) a##b
#define GEMM_CAT(a, b) GEMM_CAT2(a, b)
#define GEMM_FN(name) GEMM_CAT(name, GEMM_SUFFIX)

#define LANES GEMM_LANES
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

float GEMM_FN(di_cpu_dot_)(const float *a, const float *b, int n) {
    vf acc = {0};
    int kv = n - n % LANES, k;
    for (k = 0; k < kv; k += LANES) acc += vload(a + k) * vload(b + k);
    float s = hsum(acc);
    for (; k < n; k++) s += a[k] * b[k];
    return s;
}

/* y[i] += a * x[i] (the attention value accumulation). */
void GEMM_FN(di_cpu_axpy_)(float *y, float a, const float *x, int n) {
    vf av = {0};
    av += a;
    int nv = n - n % LANES, i;
    for (i = 0; i < nv; i += LANES) {
        vf yv = vload(y + i) + av * vload(x + i);
        memcpy(y + i, &yv, sizeof yv);
    }
    for (; i < n; i++) y[i] += a * x[i];
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

void GEMM_FN(di_cpu_gemm_serial_)(float *y, int ldy, const float *x, int ldx, const float *W, int ldw, int M,
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
        for (; j < N; j++) store(yi + j, GEMM_FN(di_cpu_dot_)(xi, W + (size_t)j * ldw, K), accumulate);
    }
    /* last odd column for the blocked rows */
    if (n2 < N)
        for (int i = 0; i < m4; i++)
            store(y + (size_t)i * ldy + n2, GEMM_FN(di_cpu_dot_)(x + (size_t)i * ldx, W + (size_t)n2 * ldw, K),
                  accumulate);
}

