/* bench_model_cpu.c - CPU backend throughput: the GEMM kernel (GFLOP/s at prefill- and
 * decode-shaped problems, 1 thread and all threads) and the whole forward pass of a model
 * directory (prefill tokens/s for one sequence, decode tokens/s one token per step).
 *
 *   bench_model_cpu [--model DIR] [--prefill N] [--decode N] [--threads N]
 *
 * Without --model only the GEMM part runs. Baseline for the GEMM ratio: a plain triple loop
 * (one dot product per output, scalar) measured in the same run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/status.h"
#include "core/timer.h"
#include "model/model.h"

static double now(void) { return di_now_s(); }

static void naive_gemm(float *y, const float *x, const float *W, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++) s += x[(size_t)i * K + k] * W[(size_t)j * K + k];
            y[(size_t)i * N + j] = s;
        }
}

static void bench_gemm(int threads) {
    const int shapes[][3] = {{1, 4096, 4096}, {16, 2048, 2048}, {256, 2048, 2048}, {512, 1408, 512}};
    di_backend *be1 = NULL, *ben = NULL;
    if (di_backend_cpu_create(1, &be1) != DI_OK || di_backend_cpu_create(threads, &ben) != DI_OK) return;
    printf("GEMM y[M,N] = x[M,K] W[N,K]^T, fp32 (threads: 1 and %d)\n", ben->caps.n_threads);
    printf("%6s %6s %6s %12s %12s %12s %8s\n", "M", "N", "K", "naive GF/s", "1T GF/s", "nT GF/s", "nT/naive");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *x = malloc((size_t)M * K * 4), *W = malloc((size_t)N * K * 4), *y = malloc((size_t)M * N * 4);
        for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)(i % 17) * 0.01f;
        for (size_t i = 0; i < (size_t)N * K; i++) W[i] = (float)(i % 13) * 0.01f;
        di_host_matrix hm = {"W", DI_DTYPE_F32, 0, N, K, W, NULL, 0, 0};
        di_weight w1, wn;
        be1->weight_upload(be1, 1, 1, &hm, DI_WEIGHT_PLAIN, &w1);
        ben->weight_upload(ben, 1, 1, &hm, DI_WEIGHT_PLAIN, &wn);
        double flops = 2.0 * M * N * K, gf[3];
        for (int v = 0; v < 3; v++) {
            int reps = 0;
            double t0 = now(), t;
            do {
                if (v == 0) naive_gemm(y, x, W, M, N, K);
                else if (v == 1) be1->matmul(be1, y, N, x, K, &w1, M, 0);
                else ben->matmul(ben, y, N, x, K, &wn, M, 0);
                reps++;
            } while ((t = now() - t0) < 0.3);
            gf[v] = flops * reps / t / 1e9;
        }
        printf("%6d %6d %6d %12.2f %12.2f %12.2f %8.1fx\n", M, N, K, gf[0], gf[1], gf[2], gf[2] / gf[0]);
        be1->weight_free(be1, &w1);
        ben->weight_free(ben, &wn);
        free(x); free(W); free(y);
    }
    di_backend_free(be1);
    di_backend_free(ben);
}

static int bench_model(const char *dir, int n_prefill, int n_decode, int threads) {
    di_model_options o = {0};
    o.n_threads = threads;
    o.max_batch_tokens = n_prefill;
    o.max_seqs = 1;
    o.max_context = n_prefill + n_decode;
    o.kv_blocks = (n_prefill + n_decode + 63) / 64;
    di_model *m = NULL;
    double t0 = now();
    if (di_model_load(dir, &o, &m) != DI_OK) {
        fprintf(stderr, "bench_model_cpu: %s\n", di_last_error());
        return 1;
    }
    double t_load = now() - t0;
    int V = di_model_config_of(m)->vocab_size, total = n_prefill + n_decode;
    int32_t *ids = malloc((size_t)total * 4), *pos = malloc((size_t)total * 4), *bt = malloc((size_t)o.kv_blocks * 4);
    for (int i = 0; i < total; i++) { ids[i] = (int32_t)((i * 7919) % V); pos[i] = i; }
    for (int i = 0; i < o.kv_blocks; i++) bt[i] = i;
    float *logits = malloc((size_t)V * 4);
    int32_t ss[2] = {0, n_prefill}, ctx = n_prefill, row = n_prefill - 1;
    di_batch b = {n_prefill, ids, pos, pos, 1, 0, ss, &ctx, bt, o.kv_blocks, 1, &row};
    t0 = now();
    di_status s = di_model_forward(m, &b, logits);
    double t_pre = now() - t0;
    t0 = now();
    for (int i = n_prefill; i < total && s == DI_OK; i++) {
        int32_t ss1[2] = {0, 1}, c1 = i + 1, r1 = 0;
        di_batch d = {1, ids + i, pos + i, pos + i, 1, 1, ss1, &c1, bt, o.kv_blocks, 1, &r1};
        s = di_model_forward(m, &d, logits);
    }
    double t_dec = now() - t0;
    if (s != DI_OK) fprintf(stderr, "bench_model_cpu: %s\n", di_last_error());
    else
        printf("model %s (%d threads): load %.2f s; prefill %d tokens: %.1f tok/s; decode %d tokens (context %d..%d): "
               "%.1f tok/s\n", dir, di_model_backend(m)->caps.n_threads, t_load, n_prefill, n_prefill / t_pre,
               n_decode, n_prefill + 1, total, n_decode / t_dec);
    free(ids); free(pos); free(bt); free(logits);
    di_model_free(m);
    return s != DI_OK;
}

int main(int argc, char **argv) {
    const char *model = NULL;
    int n_prefill = 512, n_decode = 64, threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--prefill")) n_prefill = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--decode")) n_decode = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    if (n_prefill < 1 || n_decode < 0) return 2;
    bench_gemm(threads);
    return model ? bench_model(model, n_prefill, n_decode, threads) : 0;
}
