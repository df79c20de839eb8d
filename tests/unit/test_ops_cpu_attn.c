/* test_ops_cpu_attn.c - the CPU backend's MLA attention (naive prefill over decompressed K/V,
 * weight-absorbed decode over the latent cache) and MoE ops (router in every method, experts)
 * against direct double-precision computations: several sequences with chunked contexts,
 * q_len > 1 decode (speculative verification), block tables in shuffled order, awkward sizes,
 * and bitwise equality between 1 and 3 threads. */
#include <stdio.h>

#include "core/status.h"
#include "ops_test_util.h"
#include "test_util.h"

static di_backend *g_be1, *g_be3;

/* A paged cache with random contents and a batch of sequences whose blocks are shuffled. */
typedef struct {
    int S, T, W, n_blocks, max_blocks;
    int32_t seq_start[8], ctx[8], *bt, *pos, *slots;
    float *cache;
    di_attn_batch ab;
} paged;

static void make_paged(paged *p, int S, const int *q_len, const int *ctx, int W) {
    memset(p, 0, sizeof *p);
    p->S = S;
    p->W = W;
    p->max_blocks = 0;
    int total_blocks = 0;
    for (int i = 0; i < S; i++) {
        int nb = (ctx[i] + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
        p->max_blocks = nb > p->max_blocks ? nb : p->max_blocks;
        total_blocks += nb;
        p->seq_start[i + 1] = p->seq_start[i] + q_len[i];
        p->ctx[i] = ctx[i];
    }
    p->T = p->seq_start[S];
    p->n_blocks = total_blocks + 3;
    int32_t *perm = malloc((size_t)p->n_blocks * sizeof *perm);
    for (int i = 0; i < p->n_blocks; i++) perm[i] = i;
    for (int i = p->n_blocks - 1; i > 0; i--) {
        int j = rng_int(i + 1);
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    p->bt = calloc((size_t)S * p->max_blocks, sizeof *p->bt);
    int next = 0;
    for (int i = 0; i < S; i++)
        for (int b = 0; b < (ctx[i] + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE; b++)
            p->bt[i * p->max_blocks + b] = perm[next++];
    free(perm);
    p->cache = rand_vec((size_t)p->n_blocks * DI_KV_BLOCK_SIZE * W, 1);
    p->pos = malloc((size_t)p->T * sizeof *p->pos);
    p->slots = malloc((size_t)p->T * sizeof *p->slots);
    int mq = 0, mc = 0;
    for (int i = 0; i < S; i++)
        for (int t = p->seq_start[i]; t < p->seq_start[i + 1]; t++) {
            int ps = ctx[i] - q_len[i] + (t - p->seq_start[i]);
            p->pos[t] = ps;
            p->slots[t] = p->bt[i * p->max_blocks + ps / 64] * 64 + ps % 64;
            mq = q_len[i] > mq ? q_len[i] : mq;
            mc = ctx[i] > mc ? ctx[i] : mc;
        }
    p->ab = (di_attn_batch){p->pos, p->slots, p->seq_start, p->ctx, p->bt, p->T, S, p->max_blocks, mq, mc};
}
static void free_paged(paged *p) { free(p->bt); free(p->cache); free(p->pos); free(p->slots); }
static const float *row_of(const paged *p, int seq, int s) {
    return p->cache + ((size_t)p->bt[seq * p->max_blocks + s / 64] * 64 + s % 64) * p->W;
}
static int seq_of(const paged *p, int t) {
    int i = 0;
    while (p->seq_start[i + 1] <= t) i++;
    return i;
}

static void test_mla_decode(void) {
    /* 3 decode sequences: q_len 1, 3 (speculative), 2; contexts cross block boundaries */
    int q_len[3] = {1, 3, 2}, ctx[3] = {1, 130, 64};
    di_mla_dims d = {5, 0, 6, 0, 19, 0.37f};
    int W = d.kv_rank + d.rope_dim, H = d.n_heads, r = d.kv_rank, ldq = H * 9 + 1, hs = 9;
    paged p;
    make_paged(&p, 3, q_len, ctx, W);
    float *qt = rand_vec((size_t)p.T * H * r, 1), *qpe = rand_vec((size_t)p.T * ldq, 1);
    float *o1 = malloc((size_t)p.T * H * r * 4), *o3 = malloc((size_t)p.T * H * r * 4);
    g_be1->mla_decode(g_be1, o1, qt, qpe, ldq, hs, p.cache, &p.ab, 0, 3, &d);
    g_be3->mla_decode(g_be3, o3, qt, qpe, ldq, hs, p.cache, &p.ab, 0, 3, &d);
    CHECK_MSG(memcmp(o1, o3, (size_t)p.T * H * r * 4) == 0, "thread count changed decode attention");
    double *ref = calloc((size_t)p.T * H * r, sizeof(double)), *sc = malloc(200 * sizeof(double));
    for (int t = 0; t < p.T; t++) {
        int i = seq_of(&p, t);
        for (int h = 0; h < H; h++) {
            double mx = -1e300, sum = 0;
            for (int s = 0; s <= p.pos[t]; s++) {
                const float *c = row_of(&p, i, s);
                double a = 0;
                for (int j = 0; j < r; j++) a += (double)qt[((size_t)t * H + h) * r + j] * c[j];
                for (int j = 0; j < d.rope_dim; j++) a += (double)qpe[t * ldq + h * hs + j] * c[r + j];
                sc[s] = d.softmax_scale * a;
                mx = fmax(mx, sc[s]);
            }
            for (int s = 0; s <= p.pos[t]; s++) sum += (sc[s] = exp(sc[s] - mx));
            for (int s = 0; s <= p.pos[t]; s++)
                for (int j = 0; j < r; j++) ref[((size_t)t * H + h) * r + j] += sc[s] / sum * row_of(&p, i, s)[j];
        }
    }
    double e = rel_err(o1, ref, (size_t)p.T * H * r);
    CHECK_MSG(e < 1e-5, "mla_decode rel err %g", e);
    free(qt); free(qpe); free(o1); free(o3); free(ref); free(sc);
    free_paged(&p);
}

static void test_mla_prefill(void) {
    /* sequence 0: a chunk of 70 tokens after 60 cached; sequence 1: fresh 5 tokens; seq 2: 1 token after 128 */
    int q_len[3] = {70, 5, 1}, ctx[3] = {130, 5, 129};
    di_mla_dims d = {3, 7, 4, 5, 11, 0.29f};
    int H = d.n_heads, dn = d.nope_dim, dr = d.rope_dim, dv = d.v_dim, r = d.kv_rank, W = r + dr;
    int qk = dn + dr, ldq = H * qk + 2, kvw = dn + dv;
    paged p;
    make_paged(&p, 3, q_len, ctx, W);
    float *q = rand_vec((size_t)p.T * ldq, 1), *wkv = rand_vec((size_t)H * kvw * r, 0.5f);
    di_weight w1 = upload_f32(g_be1, 1, H * kvw, r, wkv), w3 = upload_f32(g_be3, 1, H * kvw, r, wkv);
    size_t sb = g_be1->mla_prefill_scratch_bytes(g_be1, &d, p.T);
    void *scratch = malloc(sb);
    float *o1 = malloc((size_t)p.T * H * dv * 4), *o3 = malloc((size_t)p.T * H * dv * 4);
    g_be1->mla_prefill(g_be1, o1, q, ldq, p.cache, &w1, &p.ab, 0, 3, &d, scratch, sb);
    g_be3->mla_prefill(g_be3, o3, q, ldq, p.cache, &w3, &p.ab, 0, 3, &d, scratch, sb);
    CHECK_MSG(memcmp(o1, o3, (size_t)p.T * H * dv * 4) == 0, "thread count changed prefill attention");
    double *ref = calloc((size_t)p.T * H * dv, sizeof(double)), *sc = malloc(200 * sizeof(double));
    double *kv = malloc(200 * (size_t)H * kvw * sizeof(double));
    for (int t = 0; t < p.T; t++) {
        int i = seq_of(&p, t);
        for (int s = 0; s <= p.pos[t]; s++)
            for (int o = 0; o < H * kvw; o++) {
                double a = 0;
                for (int j = 0; j < r; j++) a += (double)wkv[(size_t)o * r + j] * row_of(&p, i, s)[j];
                kv[(size_t)s * H * kvw + o] = a;
            }
        for (int h = 0; h < H; h++) {
            const float *qh = q + (size_t)t * ldq + h * qk;
            double mx = -1e300, sum = 0;
            for (int s = 0; s <= p.pos[t]; s++) {
                double a = 0;
                for (int j = 0; j < dn; j++) a += qh[j] * kv[(size_t)s * H * kvw + h * kvw + j];
                for (int j = 0; j < dr; j++) a += (double)qh[dn + j] * row_of(&p, i, s)[r + j];
                sc[s] = d.softmax_scale * a;
                mx = fmax(mx, sc[s]);
            }
            for (int s = 0; s <= p.pos[t]; s++) sum += (sc[s] = exp(sc[s] - mx));
            for (int s = 0; s <= p.pos[t]; s++)
                for (int j = 0; j < dv; j++)
                    ref[((size_t)t * H + h) * dv + j] += sc[s] / sum * kv[(size_t)s * H * kvw + h * kvw + dn + j];
        }
    }
    double e = rel_err(o1, ref, (size_t)p.T * H * dv);
    CHECK_MSG(e < 1e-5, "mla_prefill rel err %g", e);
    /* a sequence range: only seq 1 processed, others untouched */
    float *o4 = malloc((size_t)p.T * H * dv * 4);
    for (int i = 0; i < p.T * H * dv; i++) o4[i] = 123.0f;
    g_be3->mla_prefill(g_be3, o4, q, ldq, p.cache, &w3, &p.ab, 1, 2, &d, scratch, sb);
    int ok = 1;
    for (int t = 0; t < p.T; t++)
        for (int j = 0; j < H * dv; j++) {
            float v = o4[(size_t)t * H * dv + j];
            ok &= (t >= 70 && t < 75) ? v == o1[(size_t)t * H * dv + j] : v == 123.0f;
        }
    CHECK_MSG(ok, "mla_prefill wrote outside its sequence range or differs");
    g_be1->weight_free(g_be1, &w1);
    g_be3->weight_free(g_be3, &w3);
    free(q); free(wkv); free(scratch); free(o1); free(o3); free(o4); free(ref); free(sc); free(kv);
    free_paged(&p);
}

/* ---- MoE ---- */

typedef struct { double v; int i; } vi;
static int by_desc(const void *a, const void *b) {
    const vi *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? 1 : -1;
    return x->i - y->i;
}

/* Reference router by sorting (written independently of the backend's selection loop). */
static void ref_route(const float *logit, const float *bias, const di_route_params *rp, int *idx, double *w) {
    int E = rp->n_experts, G = rp->n_group, gs = E / G;
    double s[64], b[64];
    vi v[64], g[64];
    if (rp->method == DI_ROUTE_NOAUX_TC) {
        for (int e = 0; e < E; e++) { s[e] = 1 / (1 + exp(-(double)logit[e])); b[e] = s[e] + (bias ? bias[e] : 0); }
    } else {
        double mx = -1e300, sum = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, logit[e]);
        for (int e = 0; e < E; e++) sum += (s[e] = exp(logit[e] - mx));
        for (int e = 0; e < E; e++) b[e] = (s[e] /= sum);
    }
    int keep[64];
    for (int e = 0; e < E; e++) keep[e] = 1;
    if (G > 1 && rp->method != DI_ROUTE_GREEDY) {
        for (int gi = 0; gi < G; gi++) {
            for (int j = 0; j < gs; j++) v[j] = (vi){b[gi * gs + j], j};
            qsort(v, (size_t)gs, sizeof *v, by_desc);
            g[gi] = (vi){rp->method == DI_ROUTE_NOAUX_TC ? v[0].v + v[1].v : v[0].v, gi};
        }
        qsort(g, (size_t)G, sizeof *g, by_desc);
        for (int gi = rp->topk_group; gi < G; gi++)
            for (int j = 0; j < gs; j++) keep[g[gi].i * gs + j] = 0;
    }
    for (int e = 0; e < E; e++) v[e] = (vi){keep[e] ? b[e] : -1e300, e};
    qsort(v, (size_t)E, sizeof *v, by_desc);
    int sel[64] = {0};
    for (int j = 0; j < rp->top_k; j++) sel[v[j].i] = 1;
    double sum = 0;
    int n = 0;
    for (int e = 0; e < E; e++)
        if (sel[e]) { idx[n] = e; w[n] = s[e]; sum += s[e]; n++; }
    for (int j = 0; j < n; j++) w[j] = (rp->norm_topk_prob ? w[j] / (sum + 1e-20) : w[j]) * rp->routed_scaling_factor;
}

static void check_route(di_route_params rp, int T, int D, float bias_level, const char *what) {
    int E = rp.n_experts, k = rp.top_k;
    float *x = rand_vec((size_t)T * D, 1), *wg = rand_vec((size_t)E * D, 1), *bias = rand_vec((size_t)E, 0.3f);
    for (int e = 0; e < E; e++) bias[e] += bias_level;
    di_weight W = upload_f32(g_be3, 1, E, D, wg), B = upload_f32(g_be3, 1, 1, E, bias);
    int32_t *idx = malloc((size_t)T * k * 4);
    float *w = malloc((size_t)T * k * 4), *scratch = malloc((size_t)T * 2 * E * 4), *logit = malloc((size_t)E * 4);
    g_be3->moe_route(g_be3, idx, w, x, &W, rp.method == DI_ROUTE_NOAUX_TC ? &B : NULL, &rp, T, scratch);
    int same = 1;
    double werr = 0;
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) {
            double a = 0;
            for (int j = 0; j < D; j++) a += (double)x[t * D + j] * wg[e * D + j];
            logit[e] = (float)a;
        }
        int ridx[64];
        double rw[64];
        ref_route(logit, rp.method == DI_ROUTE_NOAUX_TC ? bias : NULL, &rp, ridx, rw);
        for (int j = 0; j < k; j++) {
            same &= idx[t * k + j] == ridx[j];
            werr = fmax(werr, fabs(w[t * k + j] - rw[j]));
        }
    }
    CHECK_MSG(same, "%s: selected experts differ from the reference", what);
    CHECK_MSG(werr < 1e-5, "%s: weights differ by %g", what, werr);
    g_be3->weight_free(g_be3, &W);
    g_be3->weight_free(g_be3, &B);
    free(x); free(wg); free(bias); free(idx); free(w); free(scratch); free(logit);
}

static void test_moe_route(void) {
    di_route_params v3 = {DI_ROUTE_NOAUX_TC, 16, 4, 4, 2, 1, 2.5f};
    check_route(v3, 37, 23, 0.0f, "noaux_tc grouped");
    check_route(v3, 37, 23, -2.0f, "noaux_tc, all biases negative");
    v3.n_group = 1; v3.topk_group = 1; v3.norm_topk_prob = 0;
    check_route(v3, 9, 23, 0.0f, "noaux_tc ungrouped, no renorm");
    di_route_params g = {DI_ROUTE_GREEDY, 12, 3, 1, 1, 0, 1.5f};
    check_route(g, 21, 17, 0.0f, "greedy");
    di_route_params glg = {DI_ROUTE_GROUP_LIMITED_GREEDY, 12, 3, 4, 1, 0, 1.5f};
    check_route(glg, 21, 17, 0.0f, "group_limited_greedy");
    glg.norm_topk_prob = 1;
    check_route(glg, 21, 17, 0.0f, "group_limited_greedy renormalised");

    /* HF 5.17 V3 masks dropped groups with -inf: with every biased score negative, the top-k
     * must still come only from the kept groups (0.0-filling would pick dropped experts). */
    di_route_params rp = {DI_ROUTE_NOAUX_TC, 8, 3, 4, 2, 1, 1.0f};
    float x[1] = {1.0f}, wg[8] = {3, 2.5f, -3, -2, 1, 0.5f, -1, -4}, bias[8];
    for (int e = 0; e < 8; e++) bias[e] = -2.0f;
    di_weight W = upload_f32(g_be1, 1, 8, 1, wg), B = upload_f32(g_be1, 1, 1, 8, bias);
    int32_t idx[3];
    float w[3], scratch[16];
    g_be1->moe_route(g_be1, idx, w, x, &W, &B, &rp, 1, scratch);
    /* groups {0,1} and {4,5} have the best pair sums; the top 3 of those are 0, 1, 4 */
    CHECK(idx[0] == 0 && idx[1] == 1 && idx[2] == 4);
    double s0 = 1 / (1 + exp(-3.0)), s1 = 1 / (1 + exp(-2.5)), s4 = 1 / (1 + exp(-1.0)), sum = s0 + s1 + s4;
    CHECK_NEAR(w[0], s0 / sum, 1e-6);
    CHECK_NEAR(w[2], s4 / sum, 1e-6);
    g_be1->weight_free(g_be1, &W);
    g_be1->weight_free(g_be1, &B);
    /* V2 group_limited_greedy keeps only the best group (by max): experts 0 and 1 */
    di_route_params v2 = {DI_ROUTE_GROUP_LIMITED_GREEDY, 8, 2, 4, 1, 0, 1.0f};
    float wg2[8] = {3, -1, 2.9f, 2.8f, 0, 0, 0, 0};
    di_weight W2 = upload_f32(g_be1, 1, 8, 1, wg2);
    g_be1->moe_route(g_be1, idx, w, x, &W2, NULL, &v2, 1, scratch);
    CHECK(idx[0] == 0 && idx[1] == 1);
    v2.method = DI_ROUTE_GREEDY;
    g_be1->moe_route(g_be1, idx, w, x, &W2, NULL, &v2, 1, scratch);
    CHECK(idx[0] == 0 && idx[1] == 2);
    g_be1->weight_free(g_be1, &W2);
}

static void check_experts(int T, int D, int I, int E, int k) {
    float *x = rand_vec((size_t)T * D, 1), *gu = rand_vec((size_t)E * 2 * I * D, 0.5f);
    float *dn = rand_vec((size_t)E * D * I, 0.5f), *tw = rand_vec((size_t)T * k, 1);
    int32_t *ti = malloc((size_t)T * k * 4);
    for (int t = 0; t < T; t++)  /* distinct experts per token, expert E-1 never used */
        for (int j = 0; j < k; j++) ti[t * k + j] = (t + j * 2) % (E - 1);
    di_weight GU1 = upload_f32(g_be1, E, 2 * I, D, gu), DN1 = upload_f32(g_be1, E, D, I, dn);
    di_weight GU3 = upload_f32(g_be3, E, 2 * I, D, gu), DN3 = upload_f32(g_be3, E, D, I, dn);
    size_t sb = g_be3->moe_scratch_bytes(g_be3, T, k, D, I, E);
    void *scratch = malloc(sb);
    float *o1 = malloc((size_t)T * D * 4), *o3 = malloc((size_t)T * D * 4);
    g_be1->moe_experts(g_be1, o1, x, ti, tw, k, &GU1, &DN1, T, scratch, sb);
    g_be3->moe_experts(g_be3, o3, x, ti, tw, k, &GU3, &DN3, T, scratch, sb);
    CHECK_MSG(memcmp(o1, o3, (size_t)T * D * 4) == 0, "thread count changed moe_experts");
    double *ref = calloc((size_t)T * D, sizeof(double)), *h = malloc((size_t)I * sizeof(double));
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int e = ti[t * k + j];
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int c = 0; c < D; c++) {
                    g += (double)gu[((size_t)e * 2 * I + i) * D + c] * x[t * D + c];
                    u += (double)gu[((size_t)e * 2 * I + I + i) * D + c] * x[t * D + c];
                }
                h[i] = g / (1 + exp(-g)) * u;
            }
            for (int c = 0; c < D; c++) {
                double y = 0;
                for (int i = 0; i < I; i++) y += (double)dn[((size_t)e * D + c) * I + i] * h[i];
                ref[t * D + c] += tw[t * k + j] * y;
            }
        }
    double e = rel_err(o1, ref, (size_t)T * D);
    CHECK_MSG(e < 1e-5, "moe_experts T=%d D=%d I=%d E=%d k=%d rel err %g", T, D, I, E, k, e);
    /* batch invariance: token 5 alone gives the same bits */
    if (T > 5) {
        float *one = malloc((size_t)D * 4);
        g_be3->moe_experts(g_be3, one, x + 5 * D, ti + 5 * k, tw + 5 * k, k, &GU3, &DN3, 1, scratch, sb);
        CHECK_MSG(memcmp(one, o3 + 5 * D, (size_t)D * 4) == 0, "moe_experts not batch-invariant");
        free(one);
    }
    g_be1->weight_free(g_be1, &GU1); g_be1->weight_free(g_be1, &DN1);
    g_be3->weight_free(g_be3, &GU3); g_be3->weight_free(g_be3, &DN3);
    free(x); free(gu); free(dn); free(tw); free(ti); free(scratch); free(o1); free(o3); free(ref); free(h);
}

static void test_moe_experts(void) {
    check_experts(1, 8, 4, 3, 1);
    check_experts(13, 19, 7, 6, 2);
    check_experts(90, 33, 35, 9, 3);
}

static void setup(void) {
    CHECK_OK(di_backend_cpu_create(1, &g_be1));
    setenv("DEEPINFER_CPU_PAR_MIN_WORK", "0", 1);  /* 3-thread backend: always threaded */
    CHECK_OK(di_backend_cpu_create(3, &g_be3));
    unsetenv("DEEPINFER_CPU_PAR_MIN_WORK");
}
static void teardown(void) { di_backend_free(g_be1); di_backend_free(g_be3); }

TEST_MAIN(setup, test_mla_decode, test_mla_prefill, test_moe_route, test_moe_experts, teardown)
