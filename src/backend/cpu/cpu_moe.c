/* cpu_moe.c - mixture-of-experts on the CPU: the router (noaux_tc sigmoid + correction bias
 * with group-limited top-k; V2 softmax greedy / group_limited_greedy) and all routed experts
 * of a layer in one op (permute tokens by expert, per-expert gate/up GEMM, SiLU-mul, down
 * GEMM, weighted combine).
 *
 * Owner: model. Semantics follow Hugging Face transformers 5.17 (DeepseekV3TopkRouter,
 * DeepseekV2TopkRouter) — see backend.h. Ties in every top-k pick the lower index. Each
 * token's combine sums its experts in ascending expert order, fixed, so results are
 * batch-invariant. Scratch layout of moe_experts (all 64-byte aligned): counts/offsets/
 * cursors [E+1] i32, tile prefix [E+1] i32, perm_tok / slot_of [T*k] i32, then f32 buffers
 * Xp [T*k, D], Hgu [T*k, 2I], A [T*k, I], Y [T*k, D]. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "core/status.h"

static inline size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* ---------------------------------------------------------------- router ---- */

/* Index of the largest v[i] among i in [0, n) with !taken[i]; lowest index on ties. */
static int argmax_free(const float *v, const unsigned char *taken, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

enum { ROUTE_MAX_E = DI_MAX_EXPERTS };

static void route_token(const float *logits, float *s, const float *bias,
                        const di_route_params *rp, int32_t *idx, float *w) {
    int E = rp->n_experts, k = rp->top_k;
    float sel[ROUTE_MAX_E];
    unsigned char taken[ROUTE_MAX_E];
    if (rp->method == DI_ROUTE_NOAUX_TC) {
        for (int e = 0; e < E; e++) {
            s[e] = 1.0f / (1.0f + expf(-logits[e]));
            sel[e] = s[e] + (bias ? bias[e] : 0.0f);
        }
    } else {
        float mx = logits[0];
        for (int e = 1; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
        double sum = 0.0;
        for (int e = 0; e < E; e++) sum += (s[e] = expf(logits[e] - mx));
        for (int e = 0; e < E; e++) sel[e] = s[e] = (float)(s[e] / sum);
    }
    int G = rp->n_group > 0 ? rp->n_group : 1, gs = E / G;
    if (G > 1 && rp->method != DI_ROUTE_GREEDY && rp->topk_group < G) {
        float gscore[ROUTE_MAX_E];
        unsigned char gtaken[ROUTE_MAX_E];
        for (int g = 0; g < G; g++) {
            const float *v = sel + (size_t)g * gs;
            if (rp->method == DI_ROUTE_NOAUX_TC) {  /* sum of the two largest */
                float a = -INFINITY, b = -INFINITY;
                for (int i = 0; i < gs; i++) {
                    if (v[i] > a) { b = a; a = v[i]; } else if (v[i] > b) b = v[i];
                }
                gscore[g] = gs >= 2 ? a + b : a;
            } else {                                  /* max */
                float a = v[0];
                for (int i = 1; i < gs; i++) a = v[i] > a ? v[i] : a;
                gscore[g] = a;
            }
            gtaken[g] = 0;
        }
        for (int n = 0; n < rp->topk_group; n++) gtaken[argmax_free(gscore, gtaken, G)] = 1;
        float fill = rp->method == DI_ROUTE_NOAUX_TC ? -INFINITY : 0.0f;
        for (int g = 0; g < G; g++)
            if (!gtaken[g])
                for (int i = 0; i < gs; i++) sel[(size_t)g * gs + i] = fill;
    }
    memset(taken, 0, (size_t)E);
    for (int n = 0; n < k; n++) taken[argmax_free(sel, taken, E)] = 1;
    /* emit in ascending expert order */
    int n = 0;
    double sum = 0.0;
    for (int e = 0; e < E && n < k; e++) {
        if (!taken[e]) continue;
        idx[n] = e;
        /* V3 weights are the unbiased sigmoid; V2 weights are the (masked) softmax scores */
        w[n] = rp->method == DI_ROUTE_NOAUX_TC ? s[e] : sel[e];
        sum += w[n];
        n++;
    }
    if (rp->norm_topk_prob) {
        float denom = (float)sum + 1e-20f;
        for (int i = 0; i < k; i++) w[i] /= denom;
    }
    for (int i = 0; i < k; i++) w[i] *= rp->routed_scaling_factor;
}

void di_cpu_moe_route(di_backend *be, int32_t *topk_idx, float *topk_w, const float *x,
                   const di_weight *W_g, const di_weight *bias, const di_route_params *rp, int T,
                   float *scratch) {
    int E = rp->n_experts, k = rp->top_k;
    DI_ASSERT(W_g->rows == E && E <= ROUTE_MAX_E && k >= 1 && k <= E);
    DI_ASSERT(!bias || bias->cols == E);
    float *logits = scratch, *s = scratch + (size_t)T * E;
    di_cpu_gemm(cpu_pool_for(be, (double)T * E * W_g->cols), logits, E, x, W_g->cols, W_g->data, W_g->cols, T, E,
             W_g->cols, 0);
    for (int t = 0; t < T; t++)
        route_token(logits + (size_t)t * E, s + (size_t)t * E, bias ? bias->data : NULL, rp,
                    topk_idx + (size_t)t * k, topk_w + (size_t)t * k);
}

/* ---------------------------------------------------------------- experts ---- */

enum { MOE_MB = 32, MOE_NB = 32 };

typedef struct {
    int32_t *counts, *offsets, *tiles, *perm_tok, *slot_of;
    float *Xp, *Hgu, *A, *Y;
} moe_scratch;

static size_t carve(moe_scratch *ms, void *base, int Tk, int D, int I, int E) {
    char *p = base;
    size_t off = 0;
#define TAKE(field, type, count) do { if (ms) ms->field = (type *)(p + off); \
    off += align64((size_t)(count) * sizeof(type)); } while (0)
    TAKE(counts, int32_t, E + 1);
    TAKE(offsets, int32_t, E + 1);
    TAKE(tiles, int32_t, E + 1);
    TAKE(perm_tok, int32_t, Tk);
    TAKE(slot_of, int32_t, Tk);
    TAKE(Xp, float, (size_t)Tk * D);
    TAKE(Hgu, float, (size_t)Tk * 2 * I);
    TAKE(A, float, (size_t)Tk * I);
    TAKE(Y, float, (size_t)Tk * D);
#undef TAKE
    return off;
}

size_t di_cpu_moe_scratch_bytes(di_backend *be, int max_tokens, int k, int D, int I, int E) {
    (void)be;
    return carve(NULL, NULL, max_tokens * k, D, I, E);
}

typedef struct {
    const moe_scratch *ms;
    const di_weight *W;   /* gate_up (phase 1) or down (phase 2) */
    const float *X;       /* rows by permuted position */
    float *Yout;
    int E, K, N, n_ntiles;
} expert_gemm_job;

/* Item -> (expert, row tile, column tile) through the per-expert tile prefix. */
static void expert_gemm_item(void *ctx, size_t item, int tid) {
    (void)tid;
    const expert_gemm_job *j = ctx;
    const moe_scratch *ms = j->ms;
    int lo = 0, hi = j->E;  /* largest e with tiles[e] <= item */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (ms->tiles[mid] <= (int32_t)item) lo = mid; else hi = mid;
    }
    int e = lo, local = (int)item - ms->tiles[e];
    int mt = local / j->n_ntiles, nt = local % j->n_ntiles;
    int r0 = ms->offsets[e] + mt * MOE_MB, r1 = ms->offsets[e + 1];
    int m = r1 - r0 < MOE_MB ? r1 - r0 : MOE_MB;
    int n0 = nt * MOE_NB, n = j->N - n0 < MOE_NB ? j->N - n0 : MOE_NB;
    const float *We = (const float *)j->W->data + (size_t)e * j->W->rows * j->W->cols;
    di_cpu_gemm_serial(j->Yout + (size_t)r0 * j->N + n0, j->N, j->X + (size_t)r0 * j->K, j->K,
                    We + (size_t)n0 * j->K, j->K, m, n, j->K, 0);
}

static void run_expert_gemm(di_backend *be, const moe_scratch *ms, const di_weight *W,
                            const float *X, float *Y, int E) {
    expert_gemm_job j = {ms, W, X, Y, E, W->cols, W->rows, (W->rows + MOE_NB - 1) / MOE_NB};
    ms->tiles[0] = 0;
    for (int e = 0; e < E; e++) {
        int n_e = ms->offsets[e + 1] - ms->offsets[e];
        ms->tiles[e + 1] = ms->tiles[e] + (n_e + MOE_MB - 1) / MOE_MB * j.n_ntiles;
    }
    cpu_parallel(be, (size_t)ms->tiles[E], expert_gemm_item, &j,
                 (double)ms->offsets[E] * W->rows * W->cols);
}

void di_cpu_moe_experts(di_backend *be, void *out, const void *x, const int32_t *topk_idx,
                     const float *topk_w, int k, const di_weight *gate_up, const di_weight *down,
                     int T, void *scratch, size_t scratch_bytes) {
    int E = gate_up->n, D = gate_up->cols, I = down->cols;
    DI_ASSERT(gate_up->rows == 2 * I && down->n == E && down->rows == D);
    DI_ASSERT(scratch_bytes >= di_cpu_moe_scratch_bytes(be, T, k, D, I, E));
    if (T <= 0) return;
    moe_scratch ms;
    carve(&ms, scratch, T * k, D, I, E);
    /* permutation: counting sort of (token, j) pairs by expert, stable in (t, j) order */
    memset(ms.counts, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int i = 0; i < T * k; i++) {
        DI_ASSERT(topk_idx[i] >= 0 && topk_idx[i] < E);
        ms.counts[topk_idx[i]]++;
    }
    ms.offsets[0] = 0;
    for (int e = 0; e < E; e++) ms.offsets[e + 1] = ms.offsets[e] + ms.counts[e];
    memset(ms.counts, 0, (size_t)(E + 1) * sizeof(int32_t));  /* now cursors */
    for (int i = 0; i < T * k; i++) {
        int e = topk_idx[i], pos = ms.offsets[e] + ms.counts[e]++;
        ms.perm_tok[pos] = i / k;
        ms.slot_of[i] = pos;
    }
    const float *xf = x;
    for (int p = 0; p < T * k; p++)
        memcpy(ms.Xp + (size_t)p * D, xf + (size_t)ms.perm_tok[p] * D, (size_t)D * sizeof(float));
    run_expert_gemm(be, &ms, gate_up, ms.Xp, ms.Hgu, E);
    di_cpu_silu_mul(be, ms.A, ms.Hgu, T * k, I);
    run_expert_gemm(be, &ms, down, ms.A, ms.Y, E);
    float *o = out;
    for (int t = 0; t < T; t++) {
        float *ot = o + (size_t)t * D;
        memset(ot, 0, (size_t)D * sizeof(float));
        for (int j = 0; j < k; j++)
            di_cpu_axpy(ot, topk_w[(size_t)t * k + j], ms.Y + (size_t)ms.slot_of[t * k + j] * D, D);
    }
}
