/* bench_cuda_util.h - helpers of the CUDA benchmarks: the measured ceilings every roofline
 * uses (device-to-device copy bandwidth counting bytes read + written, and the bf16 / fp8 GEMM
 * rate through the backend's cuBLASLt path on random data), and op timing by replaying a CUDA
 * graph of repeated launches (so launch gaps do not count), median of several replays. */
#ifndef DI_BENCH_CUDA_UTIL_H
#define DI_BENCH_CUDA_UTIL_H
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/timer.h"

static uint64_t b_state = 0x243f6a8885a308d3ull;
static inline uint64_t b_u64(void) {
    uint64_t z = (b_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline float b_unif(float a) { return a * (2.0f * (float)((b_u64() >> 40) * (1.0 / 16777216.0)) - 1.0f); }

static inline void *b_alloc(di_backend *be, size_t bytes) {
    void *p = NULL;
    if (be->alloc(be, bytes, &p) != DI_OK) {
        fprintf(stderr, "bench: %s\n", di_last_error());
        exit(2);
    }
    return p;
}

/* random bf16 device buffer (filled on the device side by copying a 1 MiB host pattern) */
static inline void *b_rand_act(di_backend *be, size_t n) {
    void *d = b_alloc(be, n * 2);
    size_t chunk = (size_t)1 << 19;
    uint16_t *h = (uint16_t *)malloc(chunk * 2);
    for (size_t i = 0; i < chunk; i++) h[i] = di_f32_to_bf16(b_unif(1.0f));
    for (size_t o = 0; o < n; o += chunk) be->upload(be, (uint16_t *)d + o, h, (n - o < chunk ? n - o : chunk) * 2);
    be->sync(be);
    free(h);
    return d;
}

/* n bf16 (or fp8 + scales) matrices [rows, cols] with random values */
static inline di_weight b_weight(di_backend *be, int n, int rows, int cols, int fp8) {
    size_t per = (size_t)rows * cols;
    int sr = (rows + 127) / 128, sc = (cols + 127) / 128;
    void *data = malloc(per * (fp8 ? 1 : 2));
    float *scale = fp8 ? (float *)malloc((size_t)sr * sc * sizeof(float)) : NULL;
    if (fp8) {
        uint8_t *q = (uint8_t *)data;
        for (size_t i = 0; i < per; i++) {
            uint8_t b = (uint8_t)b_u64();
            q[i] = (b & 0x7f) == 0x7f ? 0x3f : b;
        }
        for (int i = 0; i < sr * sc; i++) scale[i] = 1e-4f;
    } else {
        uint16_t *h = (uint16_t *)data;
        for (size_t i = 0; i < per; i++) h[i] = di_f32_to_bf16(b_unif(0.05f));
    }
    di_host_matrix *hm = (di_host_matrix *)calloc((size_t)n, sizeof *hm);
    for (int i = 0; i < n; i++)
        hm[i] = (di_host_matrix){"bench", fp8 ? DI_DTYPE_F8_E4M3 : DI_DTYPE_BF16, 0, rows, cols, data, scale, 128, 128};
    di_weight w;
    if (be->weight_upload(be, n, 1, hm, DI_WEIGHT_PLAIN, &w) != DI_OK) {
        fprintf(stderr, "bench: weight upload: %s\n", di_last_error());
        exit(2);
    }
    free(hm);
    free(data);
    free(scale);
    return w;
}

typedef void (*b_op)(void *ctx);

/* the median of t[0..n) (sorts t) */
static inline double b_median(double *t, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (t[j] < t[i]) {
                double x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
    return t[n / 2];
}

/* Seconds per call of op: a graph of `reps` calls, replayed `rounds` times; median. Falls
 * back to eager launches when capture is not possible. Before the timed rounds the calls run
 * for at least 25 ms, so that a GPU whose clocks dropped while the benchmark prepared its
 * inputs (uploads of up to a GB with the SMs idle) is back at speed. */
static inline double b_time(di_backend *be, b_op op, void *ctx, int reps, int rounds) {
    op(ctx); /* warm-up: plans, attributes */
    if (be->sync(be) != DI_OK) {
        fprintf(stderr, "bench: op failed: %s\n", di_last_error());
        return -1;
    }
    void *g = NULL;
    if (be->graph_begin && be->graph_begin(be) == DI_OK) {
        for (int i = 0; i < reps; i++) op(ctx);
        if (be->graph_end(be, &g) != DI_OK) g = NULL;
    }
    for (double w0 = di_now_s(); di_now_s() - w0 < 0.025;) { /* clock warm-up, untimed */
        if (g) be->graph_launch(be, g);
        else
            for (int i = 0; i < reps; i++) op(ctx);
        if (be->sync(be) != DI_OK) break;
    }
    double t[16];
    if (rounds > 16) rounds = 16;
    for (int r = 0; r < rounds; r++) {
        double t0 = di_now_s();
        if (g) be->graph_launch(be, g);
        else
            for (int i = 0; i < reps; i++) op(ctx);
        if (be->sync(be) != DI_OK) fprintf(stderr, "bench: op failed: %s\n", di_last_error());
        t[r] = (di_now_s() - t0) / reps;
    }
    if (g) be->graph_free(be, g);
    return b_median(t, rounds);
}

/* ---- ceilings ---- */

/* device-to-device copy of 2 GiB: bytes read + written per second */
static inline double b_copy_bw(void) {
    size_t n = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) return -1;
    cudaMemset(a, 1, n);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = di_now_s();
        cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
        cudaDeviceSynchronize();
        double t = di_now_s() - t0;
        if (t < best) best = t;
    }
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)n / best;
}

typedef struct b_gemm_ctx {
    di_backend *be;
    void *x, *y;
    di_weight w;
    int T;
} b_gemm_ctx;
static inline void b_gemm_op(void *c) {
    b_gemm_ctx *g = (b_gemm_ctx *)c;
    g->be->matmul(g->be, g->y, g->w.rows, g->x, g->w.cols, &g->w, g->T, 0);
}

/* FLOP/s of y[T, N] = x[T, K] W[N, K]ᵀ through the backend's matmul */
static inline double b_gemm_rate(di_backend *be, int T, int N, int K, int fp8) {
    b_gemm_ctx g = {be, b_rand_act(be, (size_t)T * K), b_alloc(be, (size_t)T * N * 2), b_weight(be, 1, N, K, fp8), T};
    double t = b_time(be, b_gemm_op, &g, 10, 5);
    be->free(be, g.x);
    be->free(be, g.y);
    be->weight_free(be, &g.w);
    return t > 0 ? 2.0 * T * (double)N * K / t : -1;
}
#endif
