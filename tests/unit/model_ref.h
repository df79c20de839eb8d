/* model_ref.h - a direct, double-precision DeepSeek forward pass for tests: reads the
 * checkpoint tensors by name and computes each position with the textbook formulas of
 * docs/deepseek-v3-arch.md (naive MLA over all previous positions, routing by sorting, one
 * expert at a time), sharing no code with src/model or src/backend. Slow; tiny models only. */
#ifndef DI_MODEL_REF_H
#define DI_MODEL_REF_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/config.h"
#include "io/safetensors.h"

#define REF_CACHE 1024
typedef struct ref_model {
    di_model_config c;
    di_weights *w;
    double inv_freq[512], mscale;
    const di_tensor_info *cached_t[REF_CACHE];  /* converted tensors, by tensor */
    double *cached[REF_CACHE];
    int n_cached;
} ref_model;

static double *ref_convert(const ref_model *m, const di_tensor_info *t, const char *name);

/* Tensor `name` as doubles (dequantizing FP8 with its block scales). The returned copy is
 * the caller's (free it); conversions are cached per tensor. */
static double *ref_get(const ref_model *cm, const char *name, size_t *n_out) {
    ref_model *m = (ref_model *)cm;
    const di_tensor_info *t = di_weights_find(m->w, name);
    if (!t) { fprintf(stderr, "ref: missing %s\n", name); abort(); }
    size_t n = t->nbytes / di_dtype_size(t->dtype);
    if (n_out) *n_out = n;
    int k = 0;
    while (k < m->n_cached && m->cached_t[k] != t) k++;
    if (k == m->n_cached) {
        if (k == REF_CACHE) abort();
        m->cached_t[k] = t;
        m->cached[k] = ref_convert(m, t, name);
        m->n_cached++;
    }
    double *d = malloc(n * sizeof *d);
    memcpy(d, m->cached[k], n * sizeof *d);
    return d;
}

static double *ref_convert(const ref_model *m, const di_tensor_info *t, const char *name) {
    size_t n = t->nbytes / di_dtype_size(t->dtype);
    float *f = malloc(n * sizeof *f);
    double *d = malloc(n * sizeof *d);
    di_convert_to_f32(f, t->data, t->dtype, n);
    size_t cols = t->ndim == 2 ? (size_t)t->shape[1] : n;
    const float *sc = NULL;
    size_t sc_cols = 0;
    if (t->dtype == DI_DTYPE_F8_E4M3) {
        char sn[256];
        snprintf(sn, sizeof sn, "%s_scale_inv", name);
        const di_tensor_info *s = di_weights_find(m->w, sn);
        sc = s->data;
        sc_cols = (size_t)s->shape[1];
    }
    for (size_t i = 0; i < n; i++) {
        d[i] = f[i];
        if (sc) d[i] *= sc[(i / cols) / (size_t)m->c.weight_block[0] * sc_cols + (i % cols) / (size_t)m->c.weight_block[1]];
    }
    free(f);
    return d;
}
static double *ref_getf(const ref_model *m, const char *fmt, int l) {
    char name[256];
    snprintf(name, sizeof name, fmt, l);
    return ref_get(m, name, NULL);
}

static void ref_rmsnorm(double *y, const double *x, const double *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = w[i] * x[i] * inv;
}
/* y[out] = W[out, in] x[in] */
static void ref_linear(double *y, const double *W, const double *x, int out, int in) {
    for (int o = 0; o < out; o++) {
        double s = 0;
        for (int i = 0; i < in; i++) s += W[(size_t)o * in + i] * x[i];
        y[o] = s;
    }
}
static void ref_rope(const ref_model *m, double *v, int pos) {
    int dr = m->c.qk_rope_head_dim, half = dr / 2;
    for (int i = 0; i < half; i++) {
        double phi = (double)((float)pos * (float)m->inv_freq[i]);
        double cs = cos(phi) * m->mscale, sn = sin(phi) * m->mscale;
        int a = m->c.rope.interleave ? 2 * i : i, b = m->c.rope.interleave ? 2 * i + 1 : i + half;
        double xa = v[a], xb = v[b];
        v[a] = xa * cs - xb * sn;
        v[b] = xb * cs + xa * sn;
    }
}
static double ref_silu(double x) { return x / (1 + exp(-x)); }

/* y = down(silu(gate x) * up(x)) for the MLP under `prefix` (printf with %d = l). */
static void ref_mlp(const ref_model *m, const char *gate, const char *up, const char *down, int l, int I,
                    const double *x, double *y) {
    int D = m->c.hidden_size;
    double *G = ref_getf(m, gate, l), *U = ref_getf(m, up, l), *Dn = ref_getf(m, down, l);
    double *g = malloc((size_t)I * 8), *u = malloc((size_t)I * 8);
    ref_linear(g, G, x, I, D);
    ref_linear(u, U, x, I, D);
    for (int i = 0; i < I; i++) g[i] = ref_silu(g[i]) * u[i];
    ref_linear(y, Dn, g, D, I);
    free(G); free(U); free(Dn); free(g); free(u);
}

typedef struct { double v; int i; } ref_vi;
static int ref_desc(const void *a, const void *b) {
    const ref_vi *x = a, *y = b;
    return x->v != y->v ? (x->v < y->v ? 1 : -1) : x->i - y->i;
}

static void ref_moe(const ref_model *m, int l, const double *x, double *y) {
    const di_model_config *c = &m->c;
    int D = c->hidden_size, E = c->n_routed_experts, k = c->num_experts_per_tok, G = c->n_group > 0 ? c->n_group : 1;
    double *Wg = ref_getf(m, "model.layers.%d.mlp.gate.weight", l), *bias = NULL;
    double *lg = malloc((size_t)E * 8), *s = malloc((size_t)E * 8), *b = malloc((size_t)E * 8);
    ref_vi *v = malloc((size_t)(E + G) * sizeof *v);
    ref_linear(lg, Wg, x, E, D);
    int v3 = c->topk_method == DI_TOPK_NOAUX_TC;
    if (v3) {
        bias = ref_getf(m, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
        for (int e = 0; e < E; e++) { s[e] = 1 / (1 + exp(-lg[e])); b[e] = s[e] + bias[e]; }
    } else {
        double mx = -1e300, sum = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, lg[e]);
        for (int e = 0; e < E; e++) sum += (s[e] = exp(lg[e] - mx));
        for (int e = 0; e < E; e++) b[e] = (s[e] /= sum);
    }
    if (G > 1 && c->topk_method != DI_TOPK_GREEDY) {
        int gs = E / G;
        ref_vi *g = v + E;
        for (int gi = 0; gi < G; gi++) {
            for (int j = 0; j < gs; j++) v[j] = (ref_vi){b[gi * gs + j], j};
            qsort(v, (size_t)gs, sizeof *v, ref_desc);
            g[gi] = (ref_vi){v3 ? v[0].v + v[1].v : v[0].v, gi};
        }
        qsort(g, (size_t)G, sizeof *g, ref_desc);
        for (int gi = c->topk_group; gi < G; gi++)
            for (int j = 0; j < gs; j++) b[g[gi].i * gs + j] = -1e300;
    }
    for (int e = 0; e < E; e++) v[e] = (ref_vi){b[e], e};
    qsort(v, (size_t)E, sizeof *v, ref_desc);
    double sum = 0;
    for (int j = 0; j < k; j++) sum += s[v[j].i];
    double *ye = malloc((size_t)D * 8);
    memset(y, 0, (size_t)D * 8);
    for (int j = 0; j < k; j++) {
        int e = v[j].i;
        double w = (c->norm_topk_prob ? s[e] / (sum + 1e-20) : s[e]) * c->routed_scaling_factor;
        char gn[160], un[160], dn[160];
        snprintf(gn, sizeof gn, "model.layers.%%d.mlp.experts.%d.gate_proj.weight", e);
        snprintf(un, sizeof un, "model.layers.%%d.mlp.experts.%d.up_proj.weight", e);
        snprintf(dn, sizeof dn, "model.layers.%%d.mlp.experts.%d.down_proj.weight", e);
        ref_mlp(m, gn, un, dn, l, c->moe_intermediate_size, x, ye);
        for (int i = 0; i < D; i++) y[i] += w * ye[i];
    }
    if (c->n_shared_experts > 0) {
        ref_mlp(m, "model.layers.%d.mlp.shared_experts.gate_proj.weight", "model.layers.%d.mlp.shared_experts.up_proj.weight",
                "model.layers.%d.mlp.shared_experts.down_proj.weight", l, c->moe_intermediate_size * c->n_shared_experts, x, ye);
        for (int i = 0; i < D; i++) y[i] += ye[i];
    }
    free(Wg); free(bias); free(lg); free(s); free(b); free(v); free(ye);
}

/* Decoder layer l on hidden states h[N, D] (positions 0..N-1), in place. */
static void ref_layer(const ref_model *m, int l, double *h, int N) {
    const di_model_config *c = &m->c;
    int D = c->hidden_size, H = c->num_attention_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim;
    int dv = c->v_head_dim, r = c->kv_lora_rank, qk = dn + dr;
    double eps = c->rms_norm_eps;
    double *ln1 = ref_getf(m, "model.layers.%d.input_layernorm.weight", l);
    double *ln2 = ref_getf(m, "model.layers.%d.post_attention_layernorm.weight", l);
    double *Wkva = ref_getf(m, "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", l);
    double *kvn = ref_getf(m, "model.layers.%d.self_attn.kv_a_layernorm.weight", l);
    double *Wkvb = ref_getf(m, "model.layers.%d.self_attn.kv_b_proj.weight", l);
    double *Wo = ref_getf(m, "model.layers.%d.self_attn.o_proj.weight", l);
    double *Wq = NULL, *Wqa = NULL, *qan = NULL, *Wqb = NULL;
    if (c->q_lora_rank > 0) {
        Wqa = ref_getf(m, "model.layers.%d.self_attn.q_a_proj.weight", l);
        qan = ref_getf(m, "model.layers.%d.self_attn.q_a_layernorm.weight", l);
        Wqb = ref_getf(m, "model.layers.%d.self_attn.q_b_proj.weight", l);
    } else {
        Wq = ref_getf(m, "model.layers.%d.self_attn.q_proj.weight", l);
    }
    double *x = malloc((size_t)D * 8), *q = malloc((size_t)N * H * qk * 8), *kv = malloc((size_t)N * H * (dn + dv) * 8);
    double *kpe = malloc((size_t)N * dr * 8), *a = malloc((size_t)(r + dr) * 8), *cq = malloc((size_t)(c->q_lora_rank + 1) * 8);
    double *o = malloc((size_t)H * dv * 8), *sc = malloc((size_t)N * 8), *y = malloc((size_t)D * 8);
    for (int t = 0; t < N; t++) {
        ref_rmsnorm(x, h + (size_t)t * D, ln1, D, eps);
        if (Wq) ref_linear(q + (size_t)t * H * qk, Wq, x, H * qk, D);
        else {
            ref_linear(cq, Wqa, x, c->q_lora_rank, D);
            ref_rmsnorm(cq, cq, qan, c->q_lora_rank, eps);
            ref_linear(q + (size_t)t * H * qk, Wqb, cq, H * qk, c->q_lora_rank);
        }
        for (int hh = 0; hh < H; hh++) ref_rope(m, q + ((size_t)t * H + hh) * qk + dn, t);
        ref_linear(a, Wkva, x, r + dr, D);
        ref_rmsnorm(a, a, kvn, r, eps);
        memcpy(kpe + (size_t)t * dr, a + r, (size_t)dr * 8);
        ref_rope(m, kpe + (size_t)t * dr, t);
        ref_linear(kv + (size_t)t * H * (dn + dv), Wkvb, a, H * (dn + dv), r);
    }
    double *hn = malloc((size_t)N * D * 8);
    for (int t = 0; t < N; t++) {
        for (int hh = 0; hh < H; hh++) {
            const double *qh = q + ((size_t)t * H + hh) * qk;
            double mx = -1e300, sum = 0;
            for (int s = 0; s <= t; s++) {
                const double *ks = kv + ((size_t)s * H + hh) * (dn + dv);
                double d = 0;
                for (int j = 0; j < dn; j++) d += qh[j] * ks[j];
                for (int j = 0; j < dr; j++) d += qh[dn + j] * kpe[(size_t)s * dr + j];
                sc[s] = d * di_config_softmax_scale(c);
                mx = fmax(mx, sc[s]);
            }
            for (int s = 0; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
            for (int j = 0; j < dv; j++) {
                double acc = 0;
                for (int s = 0; s <= t; s++) acc += sc[s] / sum * kv[((size_t)s * H + hh) * (dn + dv) + dn + j];
                o[hh * dv + j] = acc;
            }
        }
        ref_linear(y, Wo, o, D, H * dv);
        for (int i = 0; i < D; i++) hn[(size_t)t * D + i] = h[(size_t)t * D + i] + y[i];
    }
    for (int t = 0; t < N; t++) {
        double *ht = hn + (size_t)t * D;
        ref_rmsnorm(x, ht, ln2, D, eps);
        if (di_config_layer_is_moe(c, l)) ref_moe(m, l, x, y);
        else ref_mlp(m, "model.layers.%d.mlp.gate_proj.weight", "model.layers.%d.mlp.up_proj.weight",
                     "model.layers.%d.mlp.down_proj.weight", l, c->intermediate_size, x, y);
        for (int i = 0; i < D; i++) h[(size_t)t * D + i] = ht[i] + y[i];
    }
    free(ln1); free(ln2); free(Wkva); free(kvn); free(Wkvb); free(Wo); free(Wq); free(Wqa); free(qan); free(Wqb);
    free(x); free(q); free(kv); free(kpe); free(a); free(cq); free(o); free(sc); free(y); free(hn);
}

/* logits[N, V] = head(norm(h)) with the given tensor names; normed hidden into hid if not NULL. */
static void ref_head(const ref_model *m, const char *norm, const char *head, const double *h, int N,
                     double *logits, double *hid) {
    int D = m->c.hidden_size, V = m->c.vocab_size;
    double *nw = ref_get(m, norm, NULL), *W = ref_get(m, head, NULL), *x = malloc((size_t)D * 8);
    for (int t = 0; t < N; t++) {
        ref_rmsnorm(x, h + (size_t)t * D, nw, D, m->c.rms_norm_eps);
        if (hid) memcpy(hid + (size_t)t * D, x, (size_t)D * 8);
        ref_linear(logits + (size_t)t * V, W, x, V, D);
    }
    free(nw); free(W); free(x);
}

/* Main model: logits[N, V] and final normed hidden states hid[N, D]. */
static void ref_forward(const ref_model *m, const int32_t *ids, int N, double *logits, double *hid) {
    int D = m->c.hidden_size;
    double *E = ref_get(m, "model.embed_tokens.weight", NULL), *h = malloc((size_t)N * D * 8);
    for (int t = 0; t < N; t++) memcpy(h + (size_t)t * D, E + (size_t)ids[t] * D, (size_t)D * 8);
    for (int l = 0; l < m->c.num_hidden_layers; l++) ref_layer(m, l, h, N);
    ref_head(m, "model.norm.weight", m->c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
             h, N, logits, hid);
    free(E); free(h);
}

/* MTP layer L = num_hidden_layers: position i gets next[i] = t_{i+1} and hid_in[i] = h_i. */
static void ref_mtp(const ref_model *m, const int32_t *next, const double *hid_in, int N, double *logits) {
    int D = m->c.hidden_size, L = m->c.num_hidden_layers;
    char emb[128];
    snprintf(emb, sizeof emb, "model.layers.%d.embed_tokens.weight", L);
    double *E = ref_get(m, di_weights_find(m->w, emb) ? emb : "model.embed_tokens.weight", NULL);
    double *en = ref_getf(m, "model.layers.%d.enorm.weight", L), *hn = ref_getf(m, "model.layers.%d.hnorm.weight", L);
    double *eh = ref_getf(m, "model.layers.%d.eh_proj.weight", L);
    double *cat = malloc((size_t)2 * D * 8), *h = malloc((size_t)N * D * 8);
    for (int t = 0; t < N; t++) {
        ref_rmsnorm(cat, E + (size_t)next[t] * D, en, D, m->c.rms_norm_eps);
        ref_rmsnorm(cat + D, hid_in + (size_t)t * D, hn, D, m->c.rms_norm_eps);
        ref_linear(h + (size_t)t * D, eh, cat, D, 2 * D);
    }
    ref_layer(m, L, h, N);
    char nn[128], hd[128];
    snprintf(nn, sizeof nn, "model.layers.%d.shared_head.norm.weight", L);
    snprintf(hd, sizeof hd, "model.layers.%d.shared_head.head.weight", L);
    if (!di_weights_find(m->w, hd))  /* optional on disk: the main lm_head then */
        snprintf(hd, sizeof hd, "%s", m->c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    ref_head(m, nn, hd, h, N, logits, NULL);
    free(E); free(en); free(hn); free(eh); free(cat); free(h);
}

static int ref_open(ref_model *m, const char *dir) {
    char p[1024];
    memset(m, 0, sizeof *m);
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (di_config_load(p, &m->c) != DI_OK || di_weights_open(dir, &m->w) != DI_OK) return -1;
    di_config_rope_inv_freq(&m->c, m->inv_freq, &m->mscale);
    return 0;
}
static void ref_close(ref_model *m) {
    for (int k = 0; k < m->n_cached; k++) free(m->cached[k]);
    di_weights_free(m->w);
}
#endif
