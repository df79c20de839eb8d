/* route_test_util.h - the routing diagnosis shared by the GPU tests (test_cuda_model.c,
 * test_cuda_pycoder.c): hooks around two backends' moe_route that record every MoE layer's
 * routing decisions of a run (slot 0: the CPU reference, slot 1: the GPU) and, with
 * g_rt_inject set, replace the GPU's decisions by the CPU's recorded ones; the CPU's fp32
 * selection scores, so a flipped decision's margin can be reported (rt_flip_margins); and a
 * one-sequence prefill that returns the logits of every position. Static state: include once
 * per test. */
#ifndef DI_ROUTE_TEST_UTIL_H
#define DI_ROUTE_TEST_UTIL_H
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "model/model.h"

enum { RT_MAXL = 16 };  /* layers recorded */
typedef void (*rt_route_fn)(di_backend *, int32_t *, float *, const float *, const di_weight *, const di_weight *,
                            const di_route_params *, int, float *);
static rt_route_fn g_rt_orig[2];
static int32_t *g_rt_idx[2][RT_MAXL];  /* [CPU/GPU][layer]: expert ids of the layer's last call, [T, top_k] */
static float *g_rt_w[2][RT_MAXL];      /* their weights */
static int g_rt_calls[2];              /* moe_route calls since the caller reset it (the layer index) */
static int g_rt_inject;                /* 1: the GPU uses the CPU's recorded decisions */
static float *g_rt_sel[RT_MAXL];       /* the CPU's selection scores [T, E] per layer (sigmoid + bias, or
                                        * softmax; before any group mask) */
static int g_rt_E;
static di_route_params g_rt_rp;        /* the CPU's last routing parameters */

static inline void rt_hook(int which, di_backend *be, int32_t *idx, float *w, const float *x, const di_weight *W_g,
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
    if (which == 0) { /* the CPU's scratch starts with its fp32 router logits [T, E] */
        int E = rp->n_experts;
        g_rt_E = E;
        g_rt_rp = *rp;
        free(g_rt_sel[l]);
        float *s = g_rt_sel[l] = (float *)malloc((size_t)T * E * 4);
        be->download(be, s, scratch, (size_t)T * E * 4);
        const float *b = bias ? (const float *)bias->data : NULL; /* CPU weights are host f32 */
        for (int t = 0; t < T; t++) {
            float *r = s + (size_t)t * E;
            if (rp->method == DI_ROUTE_NOAUX_TC) {
                for (int e = 0; e < E; e++) r[e] = 1.0f / (1.0f + expf(-r[e])) + (b ? b[e] : 0.0f);
            } else {
                double mx = r[0], sum = 0;
                for (int e = 1; e < E; e++) mx = r[e] > mx ? r[e] : mx;
                for (int e = 0; e < E; e++) sum += exp(r[e] - mx);
                for (int e = 0; e < E; e++) r[e] = (float)(exp(r[e] - mx) / sum);
            }
        }
    }
    if (which == 1 && g_rt_inject && g_rt_idx[0][l]) {
        be->upload(be, idx, g_rt_idx[0][l], (size_t)n * 4);
        be->upload(be, w, g_rt_w[0][l], (size_t)n * 4);
    }
}
static inline void rt_route_cpu(di_backend *be, int32_t *i, float *w, const float *x, const di_weight *g,
                                const di_weight *b, const di_route_params *rp, int T, float *s) {
    rt_hook(0, be, i, w, x, g, b, rp, T, s);
}
static inline void rt_route_gpu(di_backend *be, int32_t *i, float *w, const float *x, const di_weight *g,
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
    for (int l = 0; l < RT_MAXL; l++) {
        free(g_rt_sel[l]);
        g_rt_sel[l] = NULL;
    }
}

/* Group score of group g of a token's CPU selection scores s (E / G experts per group): the sum
 * of its two largest (NOAUX_TC) or its largest (GROUP_LIMITED_GREEDY), as the routers do. */
static inline float rt_group_score(const float *s, int g, int gs, int noaux) {
    float a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < gs; i++) {
        float v = s[g * gs + i];
        if (v > a) { b = a; a = v; } else if (v > b) b = v;
    }
    return noaux && gs >= 2 ? a + b : a;
}

/* How close the decisions were that the GPU took differently from the CPU, in the CPU's fp32
 * score space. A flip is "primary" when no earlier-or-same token flipped at an earlier layer
 * (a flip changes its token's later layers, and later tokens through attention, so those
 * differences are consequences, not near-ties). Margin of a flip: with group-limited routing
 * and a group only one side used, (lowest CPU group score among the CPU's kept groups) -
 * (highest CPU group score among groups only the GPU used), marked 'g'; otherwise (lowest CPU
 * score among experts only the CPU picked) - (highest CPU score among experts only the GPU
 * picked). Prints all flips' count and the sorted primary margins; returns the primary count. */
static inline int rt_flip_margins(const char *name, int T, int L, int k) {
    const int E = g_rt_E, noaux = g_rt_rp.method == DI_ROUTE_NOAUX_TC;
    const int G = g_rt_rp.n_group > 1 && g_rt_rp.method != DI_ROUTE_GREEDY && g_rt_rp.topk_group < g_rt_rp.n_group
                      ? g_rt_rp.n_group : 1;
    const int gs = E / G;
    int n = 0, all = 0, min_prev = 1 << 30;
    float *mg = (float *)malloc((size_t)(T > 0 ? T : 1) * sizeof(float));
    char *kind = (char *)malloc((size_t)(T > 0 ? T : 1));
    for (int t = 0; t < T; t++) {
        int first = -1;
        for (int l = 0; l < L; l++) {
            if (!g_rt_sel[l] || !g_rt_idx[0][l] || !g_rt_idx[1][l]) continue;
            const int32_t *c = g_rt_idx[0][l] + (size_t)t * k, *g = g_rt_idx[1][l] + (size_t)t * k;
            int differs = 0;
            for (int i = 0; i < k; i++) {
                int in_c = 0;
                for (int j = 0; j < k; j++) in_c |= c[j] == g[i];
                differs |= !in_c;
            }
            if (!differs) continue;
            all++;
            if (first >= 0) continue;
            first = l;
            if (l > min_prev) continue; /* a consequence of an earlier token's flip */
            const float *s = g_rt_sel[l] + (size_t)t * E;
            float lo = INFINITY, hi = -INFINITY;
            char kd = 'e';
            if (G > 1) { /* groups the CPU kept (top topk_group, ties to the lower index) */
                unsigned char keep[256] = {0};
                for (int r = 0; r < g_rt_rp.topk_group && G <= 256; r++) {
                    int best = -1;
                    float bv = -INFINITY;
                    for (int q = 0; q < G; q++)
                        if (!keep[q] && (best < 0 || rt_group_score(s, q, gs, noaux) > bv)) {
                            best = q;
                            bv = rt_group_score(s, q, gs, noaux);
                        }
                    keep[best] = 1;
                }
                for (int q = 0; q < G && G <= 256; q++)
                    if (keep[q]) lo = fminf(lo, rt_group_score(s, q, gs, noaux));
                for (int i = 0; i < k; i++)
                    if (g[i] >= 0 && g[i] < E && G <= 256 && !keep[g[i] / gs]) {
                        hi = fmaxf(hi, rt_group_score(s, g[i] / gs, gs, noaux));
                        kd = 'g';
                    }
            }
            if (kd == 'e') {
                lo = INFINITY;
                for (int i = 0; i < k; i++) {
                    int in_g = 0, in_c = 0;
                    for (int j = 0; j < k; j++) {
                        in_g |= g[j] == c[i];
                        in_c |= c[j] == g[i];
                    }
                    if (!in_g && c[i] >= 0 && c[i] < E) lo = fminf(lo, s[c[i]]);
                    if (!in_c && g[i] >= 0 && g[i] < E) hi = fmaxf(hi, s[g[i]]);
                }
            }
            kind[n] = kd;
            mg[n++] = lo - hi;
        }
        if (first >= 0 && first < min_prev) min_prev = first;
    }
    /* sort margins with their kinds (insertion sort: n <= T) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && mg[j] < mg[j - 1]; j--) {
            float tm = mg[j]; mg[j] = mg[j - 1]; mg[j - 1] = tm;
            char tk = kind[j]; kind[j] = kind[j - 1]; kind[j - 1] = tk;
        }
    fprintf(stderr, "  %-18s flipped decisions %d, primary %d; their CPU score margins:", name, all, n);
    for (int i = 0; i < n && i < 24; i++) fprintf(stderr, " %.2e%s", (double)mg[i], kind[i] == 'g' ? "g" : "");
    if (n > 24) fprintf(stderr, " ... largest %.2e", (double)mg[n - 1]);
    fprintf(stderr, "\n");
    free(mg);
    free(kind);
    return n;
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
