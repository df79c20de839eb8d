/* route_test_util.h - the routing diagnosis shared by the GPU tests (test_cuda_model.c,
 * test_cuda_pycoder.c): hooks around two backends' moe_route that record every MoE layer's
 * routing decisions of a run (slot 0: the CPU reference, slot 1: the GPU) and, with
 * g_rt_inject set, replace the GPU's decisions by the CPU's recorded ones; and a one-sequence
 * prefill that returns the logits of every position. Static state: include once per test. */
#ifndef DI_ROUTE_TEST_UTIL_H
#define DI_ROUTE_TEST_UTIL_H
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "model/model.h"

enum { RT_MAXL = 16 };  /* layers recorded */
typedef void (*rt_route_fn)(di_backend *, int32_t *, float *, const void *, const di_weight *, const di_weight *,
                            const di_route_params *, int, float *);
static rt_route_fn g_rt_orig[2];
static int32_t *g_rt_idx[2][RT_MAXL];  /* [CPU/GPU][layer]: expert ids of the layer's last call, [T, top_k] */
static float *g_rt_w[2][RT_MAXL];      /* their weights */
static int g_rt_calls[2];              /* moe_route calls since the caller reset it (the layer index) */
static int g_rt_inject;                /* 1: the GPU uses the CPU's recorded decisions */

static inline void rt_hook(int which, di_backend *be, int32_t *idx, float *w, const void *x, const di_weight *W_g,
                           const di_weight *bias, const di_route_params *rp, int T, float *scratch) {
    g_rt_orig[which](be, idx, w, x, W_g, bias, rp, T, scratch);
    int l = g_rt_calls[which]++, n = T * rp->top_k;
    if (l >= RT_MAXL) return;
    free(g_rt_idx[which][l]);
    free(g_rt_w[which][l]);
    g_rt_idx[which][l] = (int32_t *)malloc((size_t)n * 4);
    g_rt_w[which][l] = (float *)malloc((size_t)n * 4);
    be->download(be, g_rt_idx[which][l], idx, (size_t)n * 4);
    be->download(be, g_rt_w[which][l], w, (size_t)n * 4);
    if (which == 1 && g_rt_inject && g_rt_idx[0][l]) {
        be->upload(be, idx, g_rt_idx[0][l], (size_t)n * 4);
        be->upload(be, w, g_rt_w[0][l], (size_t)n * 4);
    }
}
static inline void rt_route_cpu(di_backend *be, int32_t *i, float *w, const void *x, const di_weight *g,
                                const di_weight *b, const di_route_params *rp, int T, float *s) {
    rt_hook(0, be, i, w, x, g, b, rp, T, s);
}
static inline void rt_route_gpu(di_backend *be, int32_t *i, float *w, const void *x, const di_weight *g,
                                const di_weight *b, const di_route_params *rp, int T, float *s) {
    rt_hook(1, be, i, w, x, g, b, rp, T, s);
}

/* Wraps the CPU backend's and the GPU backend's moe_route; rt_hooks_remove restores them. */
static inline void rt_hooks_install(di_backend *cpu, di_backend *gpu) {
    g_rt_orig[0] = cpu->moe_route;
    g_rt_orig[1] = gpu->moe_route;
    cpu->moe_route = rt_route_cpu;
    gpu->moe_route = rt_route_gpu;
}
static inline void rt_hooks_remove(di_backend *cpu, di_backend *gpu) {
    cpu->moe_route = g_rt_orig[0];
    gpu->moe_route = g_rt_orig[1];
}

/* Frees the recorded decisions. */
static inline void rt_records_free(void) {
    for (int w = 0; w < 2; w++)
        for (int l = 0; l < RT_MAXL; l++) {
            free(g_rt_idx[w][l]);
            free(g_rt_w[w][l]);
            g_rt_idx[w][l] = NULL;
            g_rt_w[w][l] = NULL;
        }
}

/* One sequence of the JSON ids, prefilled from position 0: out [n, vocab] logits of every position. */
static inline di_status rt_prefill(di_model *m, json_t *ids, float *out) {
    int n = (int)json_array_size(ids), nb = (n + 63) / 64;
    int32_t *tok = (int32_t *)malloc((size_t)n * 4), *pos = (int32_t *)malloc((size_t)n * 4);
    int32_t *bt = (int32_t *)malloc((size_t)nb * 4), start[2] = {0, n}, ctx = n;
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
        pos[i] = i;
    }
    for (int i = 0; i < nb; i++) bt[i] = i;
    di_batch b = {n, tok, pos, pos, 1, 0, start, &ctx, bt, nb, n, pos};
    di_status s = di_model_forward(m, &b, out);
    free(tok);
    free(pos);
    free(bt);
    return s;
}
#endif
