/* bench_cuda_ops.c - CUDA op benchmarks against the roofline: the measured ceilings (copy
 * bandwidth, bf16 / fp8 GEMM), small-M GEMM bandwidth (decode-shaped weights), MLA decode
 * attention at DeepSeek-V3 shape (128 heads, 576/512 dims, 64-token blocks) and V2-Lite shape
 * (16 heads) for batch 64 / 128 and context 4K / 16K, and the grouped MoE experts at V2-Lite
 * shape. Every line gives the time, the achieved rate, and the roofline bound
 * max(bytes / copy-bandwidth, FLOPs / bf16-GEMM-rate) with the fraction reached.
 *
 * With `v32`: only DeepSeek-V3.2's indexer_topk and sparse vs dense MLA decode / prefill (times).
 * With `prefill`: only MLA prefill (gather + decompress GEMM + causal attention, one sequence of
 * 512 / 8192 tokens, V2-Lite shape) for every variant of the fast attention kernel; TFLOP/s
 * counts the attention.
 *
 * With `sample`: only the device sampler (1 / 16 / 64 / 256 rows of V3-vocabulary logits, greedy and
 * five temperature / top-k / top-p / min-p settings).
 *
 * With `mladec`: only MLA decode (V3 shapes, 64 heads, V2-Lite), then the V3 shapes again with
 * DEEPINFER_CUDA_MLA_WGMMA=0 (the mma.sync kernel): before / after; then decode + W_UV
 * (mla_decode_uv) of one token at 256-32K contexts, 16 / 32 heads, with up to 128 KV splits (the
 * default) and with DEEPINFER_CUDA_MLA_WIDE=0 (at most 64), in turn.
 *
 *   bench_cuda_ops [quick | v32 | prefill | mladec | sample]    (quick: fewer shapes) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DI_HAVE_CUDA
#include "bench_cuda_util.h"

static double g_bw, g_tf; /* measured ceilings: bytes/s, FLOP/s (bf16) */

static void line(const char *what, double t, double bytes, double flops) {
    double bound = fmax(bytes / g_bw, flops / g_tf);
    printf("%-52s %9.1f us  %7.0f GB/s  %6.1f TFLOP/s  bound %8.1f us  %5.1f%% of roofline\n", what, t * 1e6,
           bytes / t / 1e9, flops / t / 1e12, bound * 1e6, 100.0 * bound / t);
    fflush(stdout);
}

/* ---- small-M GEMM ---- */
static void bench_small_gemm(di_backend *be, const char *tag) {
    const int shapes[][3] = {{129280, 2048, 0}, {3072, 2048, 0}, {576, 2048, 0}, {2048, 2048, 0}, {2048, 7168, 1},
                             {24576, 1536, 1}};
    const int Ts[] = {1, 4, 16, 32, 64};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++) {
            int N = shapes[s][0], K = shapes[s][1], fp8 = shapes[s][2], T = Ts[a];
            b_gemm_ctx g = {be, b_rand_act(be, (size_t)T * K), b_alloc(be, (size_t)T * N * 2), b_weight(be, 1, N, K, fp8), T};
            double t = b_time(be, b_gemm_op, &g, 20, 7);
            char what[128];
            snprintf(what, sizeof what, "matmul%s %s T=%d N=%d K=%d", tag, fp8 ? "fp8 " : "bf16", T, N, K);
            line(what, t, (double)N * K * (fp8 ? 1 : 2) + (double)T * (K + N) * 2, 2.0 * T * N * K);
            be->free(be, g.x);
            be->free(be, g.y);
            be->weight_free(be, &g.w);
        }
}

/* ---- MLA decode ---- */
typedef struct dec_ctx {
    di_backend *be;
    void *out, *qt, *q, *cache;
    di_attn_batch ab;
    di_mla_dims d;
} dec_ctx;
static void dec_op(void *c) {
    dec_ctx *x = (dec_ctx *)c;
    int H = x->d.n_heads;
    x->be->mla_decode(x->be, x->out, x->qt, (uint16_t *)x->q + 128, H * 192, 192, x->cache, &x->ab, 0, x->ab.n_seqs, &x->d);
}

/* A decode step of B sequences, one token each at context ctx (cache blocks scattered), H heads:
 * random q̃, q and cache, and the metadata on the device */
static void dec_make(dec_ctx *x, di_backend *be, int H, int B, int ctx) {
    di_mla_dims d = {H, 128, 64, 128, 512, 0.1352f};
    int nb = (ctx + 63) / 64;
    size_t slots = (size_t)B * nb * 64;
    *x = (dec_ctx){be, b_alloc(be, (size_t)B * H * 512 * 2), b_rand_act(be, (size_t)B * H * 512),
                   b_rand_act(be, (size_t)B * H * 192), b_rand_act(be, slots * 576), {0}, d};
    int32_t *start = (int32_t *)malloc((size_t)(B + 1) * 4), *cl = (int32_t *)malloc((size_t)B * 4);
    int32_t *bt = (int32_t *)malloc((size_t)B * nb * 4);
    for (int i = 0; i <= B; i++) start[i] = i;
    for (int i = 0; i < B; i++) cl[i] = ctx;
    for (int i = 0; i < B * nb; i++) bt[i] = (int32_t)((i * 7919L) % (B * nb)); /* scattered blocks */
    int32_t *ds = (int32_t *)b_alloc(be, (size_t)(B + 1) * 4), *dc = (int32_t *)b_alloc(be, (size_t)B * 4);
    int32_t *db = (int32_t *)b_alloc(be, (size_t)B * nb * 4);
    be->upload(be, ds, start, (size_t)(B + 1) * 4);
    be->upload(be, dc, cl, (size_t)B * 4);
    be->upload(be, db, bt, (size_t)B * nb * 4);
    be->sync(be);
    free(start); free(cl); free(bt);
    x->ab = (di_attn_batch){.seq_start = ds, .seq_ctx_len = dc, .block_table = db, .n_tokens = B, .n_seqs = B,
                            .max_blocks = nb, .max_q_len = 1, .max_ctx_len = ctx};
}

static void dec_free(dec_ctx *x, di_backend *be) {
    be->free(be, x->out); be->free(be, x->qt); be->free(be, x->q); be->free(be, x->cache);
    be->free(be, (void *)x->ab.seq_start); be->free(be, (void *)x->ab.seq_ctx_len);
    be->free(be, (void *)x->ab.block_table);
}

static void bench_decode(di_backend *be, int H, int B, int ctx, const char *tag) {
    dec_ctx x;
    dec_make(&x, be, H, B, ctx);
    double t = b_time(be, dec_op, &x, 5, 7);
    double bytes = (double)B * ctx * 576 * 2 + (double)B * H * (512 + 64 + 512) * 2;
    double flops = 2.0 * B * H * (double)ctx * (576 + 512);
    char what[128];
    snprintf(what, sizeof what, "mla_decode%s H=%d B=%d ctx=%d", tag, H, B, ctx);
    line(what, t, bytes, flops);
    dec_free(&x, be);
}

/* ---- MLA decode + W_UV (mla_decode_uv), one or a few tokens ---- */
typedef struct uv_ctx {
    dec_ctx x;
    void *o;
    di_weight wuv;
} uv_ctx;
static void uv_op(void *c) {
    uv_ctx *u = (uv_ctx *)c;
    dec_ctx *x = &u->x;
    int H = x->d.n_heads;
    x->be->mla_decode_uv(x->be, u->o, H * 128, 128, x->out, x->qt, (uint16_t *)x->q + 128, H * 192, 192, x->cache,
                         &x->ab, 0, x->ab.n_seqs, &x->d, &u->wuv, x->ab.n_tokens);
}

/* B sequences of context ctx with H heads, mla_decode_uv on backends be[0..nbe) in turn (the
 * same inputs), two rounds */
static void bench_decode_uv(di_backend **be, const char *const *tags, int nbe, int H, int B, int ctx) {
    di_backend *b0 = be[0];
    uv_ctx u;
    dec_make(&u.x, b0, H, B, ctx);
    u.o = b_alloc(b0, (size_t)B * H * 128 * 2);
    u.wuv = b_weight(b0, H, 128, 512, 0);
    double bytes = (double)B * ctx * 576 * 2 + (double)B * H * (512 + 64 + 128) * 2 + (double)H * 128 * 512 * 2;
    double flops = 2.0 * B * H * ((double)ctx * (576 + 512) + 128.0 * 512);
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < nbe; i++) {
            u.x.be = be[i];
            double t = b_time(be[i], uv_op, &u, 5, 7);
            char what[128];
            snprintf(what, sizeof what, "mla_decode_uv%s H=%d B=%d ctx=%d", tags[i], H, B, ctx);
            line(what, t, bytes, flops);
        }
    dec_free(&u.x, b0);
    b0->free(b0, u.o);
    b0->weight_free(b0, &u.wuv);
}

/* `mladec`: the V3 shapes (and 64 heads, batch 1 / 8) on one backend; V2-Lite on the default only */
static void mladec_lines(di_backend *be, const char *tag) {
    const int Bs[2] = {64, 128}, Cs[2] = {4096, 16384};
    for (int b = 0; b < 2; b++)
        for (int c = 0; c < 2; c++) bench_decode(be, 128, Bs[b], Cs[c], tag);
    bench_decode(be, 128, 1, 4096, tag);
    bench_decode(be, 128, 8, 8192, tag);
    bench_decode(be, 64, 64, 4096, tag);
    if (tag[0]) return;
    for (int b = 0; b < 2; b++)
        for (int c = 0; c < 2; c++) bench_decode(be, 16, Bs[b], Cs[c], tag);
    bench_decode(be, 16, 1, 4096, tag);
}

/* ---- MLA prefill (gather + decompress GEMM + attention) at V2-Lite shape, one sequence ---- */
typedef struct pf_ctx {
    di_backend *be;
    void *out, *q, *cache, *scratch;
    size_t sb;
    di_weight wkvb;
    di_attn_batch ab;
    di_mla_dims d;
} pf_ctx;
static void pf_op(void *c) {
    pf_ctx *x = (pf_ctx *)c;
    x->be->mla_prefill(x->be, x->out, x->q, x->d.n_heads * 192, x->cache, &x->wkvb, &x->ab, 0, 1, &x->d, x->scratch,
                       x->sb);
}

/* every variant of the fast kernel (DEEPINFER_CUDA_PREFILL_KERNEL=1..nv), then the default */
static void bench_prefill(di_backend *be, int T, int nv) {
    di_mla_dims d = {16, 128, 64, 128, 512, 0.1352f};
    int H = d.n_heads, nb = (T + 63) / 64;
    pf_ctx x = {be, b_alloc(be, (size_t)T * H * 128 * 2), b_rand_act(be, (size_t)T * H * 192),
                b_rand_act(be, (size_t)nb * 64 * 576), NULL, 0, b_weight(be, 1, H * 256, 512, 0), {0}, d};
    x.sb = be->mla_prefill_scratch_bytes(be, &d, T);
    x.scratch = b_alloc(be, x.sb);
    int32_t start[2] = {0, T}, cl[1] = {T}, *bt = (int32_t *)malloc((size_t)nb * 4);
    for (int i = 0; i < nb; i++) bt[i] = (int32_t)((i * 7919L) % nb);
    int32_t *ds = (int32_t *)b_alloc(be, 8), *dc = (int32_t *)b_alloc(be, 4), *db = (int32_t *)b_alloc(be, (size_t)nb * 4);
    be->upload(be, ds, start, 8);
    be->upload(be, dc, cl, 4);
    be->upload(be, db, bt, (size_t)nb * 4);
    be->sync(be);
    x.ab = (di_attn_batch){.seq_start = ds, .seq_ctx_len = dc, .block_table = db, .n_tokens = T, .n_seqs = 1,
                           .max_blocks = nb, .max_q_len = T, .max_ctx_len = T};
    double flops = 2.0 * H * ((double)T * (T + 1) / 2) * (192 + 128); /* causal attention only */
    double bytes = (double)T * (576 + H * 192 + H * 128) * 2;
    for (int v = 1; v <= nv + 1; v++) {
        char vs[16], what[128];
        snprintf(vs, sizeof vs, "%d", v <= nv ? v : 0);
        setenv("DEEPINFER_CUDA_PREFILL_KERNEL", vs, 1);
        double t = b_time(be, pf_op, &x, T >= 4096 ? 3 : 10, 5);
        snprintf(what, sizeof what, "mla_prefill H=%d T=%d kernel %s%s", H, T, vs, v <= nv ? "" : " (default)");
        line(what, t, bytes, flops);
    }
    unsetenv("DEEPINFER_CUDA_PREFILL_KERNEL");
    be->free(be, x.out); be->free(be, x.q); be->free(be, x.cache); be->free(be, x.scratch);
    be->weight_free(be, &x.wkvb);
    be->free(be, ds); be->free(be, dc); be->free(be, db);
    free(bt);
}

/* ---- MoE experts ---- */
typedef struct moe_ctx {
    di_backend *be;
    void *out, *x, *idx, *w, *scratch;
    size_t sb;
    di_weight gu, dn;
    int T, k;
} moe_ctx;
static void moe_op(void *c) {
    moe_ctx *m = (moe_ctx *)c;
    m->be->moe_experts(m->be, m->out, m->x, (const int32_t *)m->idx, (const float *)m->w, m->k, &m->gu, &m->dn, m->T,
                       m->scratch, m->sb);
}

static void bench_moe(di_backend *be, int T, const char *tag) {
    int E = 64, k = 6, D = 2048, I = 1408;
    moe_ctx m = {be, b_alloc(be, (size_t)T * D * 2), b_rand_act(be, (size_t)T * D), NULL, NULL, NULL, 0,
                 b_weight(be, E, 2 * I, D, 0), b_weight(be, E, D, I, 0), T, k};
    int32_t *idx = (int32_t *)malloc((size_t)T * k * 4);
    float *w = (float *)malloc((size_t)T * k * 4);
    unsigned char used[64] = {0};
    for (int t = 0; t < T; t++) {
        int n = 0;
        while (n < k) {
            int e = (int)(b_u64() % (uint64_t)E), dup = 0;
            for (int j = 0; j < n; j++) dup |= idx[t * k + j] == e;
            if (!dup) idx[t * k + n++] = e;
        }
        for (int j = 0; j < k; j++) {
            w[t * k + j] = 0.2f;
            used[idx[t * k + j]] = 1;
        }
    }
    int n_used = 0;
    for (int e = 0; e < E; e++) n_used += used[e];
    m.idx = b_alloc(be, (size_t)T * k * 4);
    m.w = b_alloc(be, (size_t)T * k * 4);
    be->upload(be, m.idx, idx, (size_t)T * k * 4);
    be->upload(be, m.w, w, (size_t)T * k * 4);
    m.sb = be->moe_scratch_bytes(be, T, k, D, I, E);
    m.scratch = b_alloc(be, m.sb);
    double t = b_time(be, moe_op, &m, 10, 7);
    char what[128];
    snprintf(what, sizeof what, "moe_experts%s V2-Lite T=%d (%d used)", tag, T, n_used);
    line(what, t, (double)n_used * 3 * I * D * 2 + (double)T * D * 4, 2.0 * T * k * 3.0 * I * D);
    be->free(be, m.out); be->free(be, m.x); be->free(be, m.idx); be->free(be, m.w); be->free(be, m.scratch);
    be->weight_free(be, &m.gu); be->weight_free(be, &m.dn);
    free(idx); free(w);
}

/* ---- DeepSeek-V3.2: indexer top-k and sparse MLA (simple kernels; times only) ---- */
typedef struct v32_ctx {
    di_backend *be;
    int kind; /* 0 indexer_topk, 1 sparse decode, 2 dense decode, 3 sparse prefill, 4 dense prefill */
    void *iq, *q, *qt, *out, *cache, *icache, *scratch;
    float *w;
    int32_t *sel, *cnt;
    size_t sbytes;
    di_weight wkvb;
    di_attn_batch ab, sab;
    di_indexer_dims id;
    di_mla_dims d;
} v32_ctx;

static void v32_op(void *c) {
    v32_ctx *x = (v32_ctx *)c;
    di_backend *be = x->be;
    int H = x->d.n_heads, S = x->ab.n_seqs;
    switch (x->kind) {
    case 0:
        be->indexer_topk(be, x->sel, x->cnt, x->iq, x->w, x->icache, &x->ab, 0, S, &x->id, x->scratch, x->sbytes);
        break;
    case 1:
    case 2:
        be->mla_decode(be, x->out, x->qt, (uint16_t *)x->q + 128, H * 192, 192, x->cache, x->kind == 1 ? &x->sab : &x->ab,
                       0, S, &x->d);
        break;
    default:
        be->mla_prefill(be, x->out, x->q, H * 192, x->cache, &x->wkvb, x->kind == 3 ? &x->sab : &x->ab, 0, S, &x->d,
                        x->scratch, x->sbytes);
    }
}

/* S sequences of q_len tokens at the end of a ctx-token context each (blocks scattered) */
static void bench_v32(di_backend *be, int S, int q_len, int ctx) {
    const int H = 128, NH = 64, HD = 128, K = 2048;
    int T = S * q_len, nb = ctx / 64;
    size_t slots = (size_t)S * nb * 64;
    v32_ctx x;
    memset(&x, 0, sizeof x);
    x.be = be;
    x.d = (di_mla_dims){H, 128, 64, 128, 512, 0.1352f};
    x.id = (di_indexer_dims){NH, HD, K, 0.08838834764f, 0.125f};
    x.iq = b_rand_act(be, (size_t)T * NH * HD);
    x.q = b_rand_act(be, (size_t)T * H * 192);
    x.qt = b_rand_act(be, (size_t)T * H * 512);
    x.out = b_alloc(be, (size_t)T * H * 512 * 2);
    x.cache = b_rand_act(be, slots * 576);
    x.icache = b_rand_act(be, slots * HD);
    float *hw = (float *)malloc((size_t)T * NH * 4);
    for (int i = 0; i < T * NH; i++) hw[i] = b_unif(1.0f);
    x.w = (float *)b_alloc(be, (size_t)T * NH * 4);
    be->upload(be, x.w, hw, (size_t)T * NH * 4);
    x.sel = (int32_t *)b_alloc(be, (size_t)T * K * 4);
    x.cnt = (int32_t *)b_alloc(be, (size_t)T * 4);
    size_t si = be->indexer_scratch_bytes(be, T, ctx), sp = be->mla_prefill_scratch_bytes(be, &x.d, T);
    x.sbytes = si > sp ? si : sp;
    x.scratch = b_alloc(be, x.sbytes);
    if (q_len > 1) x.wkvb = b_weight(be, 1, H * 256, 512, 0);
    int32_t *start = (int32_t *)malloc((size_t)(S + 1) * 4), *cl = (int32_t *)malloc((size_t)S * 4);
    int32_t *bt = (int32_t *)malloc((size_t)S * nb * 4);
    for (int i = 0; i <= S; i++) start[i] = i * q_len;
    for (int i = 0; i < S; i++) cl[i] = ctx;
    for (int i = 0; i < S * nb; i++) bt[i] = (int32_t)((i * 7919L) % (S * nb));
    int32_t *ds = (int32_t *)b_alloc(be, (size_t)(S + 1) * 4), *dc = (int32_t *)b_alloc(be, (size_t)S * 4);
    int32_t *db = (int32_t *)b_alloc(be, (size_t)S * nb * 4);
    be->upload(be, ds, start, (size_t)(S + 1) * 4);
    be->upload(be, dc, cl, (size_t)S * 4);
    be->upload(be, db, bt, (size_t)S * nb * 4);
    be->sync(be);
    x.ab = (di_attn_batch){.seq_start = ds, .seq_ctx_len = dc, .block_table = db, .n_tokens = T, .n_seqs = S,
                           .max_blocks = nb, .max_q_len = q_len, .max_ctx_len = ctx};
    x.sab = x.ab;
    x.sab.sel_pos = x.sel;
    x.sab.sel_count = x.cnt;
    x.sab.sel_stride = K;
    int reps = q_len > 1 ? 1 : 5;
    const char *names[5] = {"indexer_topk (64 x 128, top-2048)", "mla_decode sparse (top-2048)", "mla_decode dense",
                            "mla_prefill sparse (top-2048)", "mla_prefill dense"};
    int kinds[3] = {0, q_len > 1 ? 3 : 1, q_len > 1 ? 4 : 2};
    for (int i = 0; i < 3; i++) {
        x.kind = kinds[i];
        double t = b_time(be, v32_op, &x, reps, 3); /* the indexer runs first: real selections */
        printf("v32 %-36s seqs=%-3d q_len=%-5d ctx=%-6d %10.1f us  (%.2f us per token)\n", names[x.kind], S, q_len, ctx,
               t * 1e6, t * 1e6 / T);
        fflush(stdout);
    }
    be->free(be, x.iq); be->free(be, x.q); be->free(be, x.qt); be->free(be, x.out); be->free(be, x.cache);
    be->free(be, x.icache); be->free(be, x.w); be->free(be, x.sel); be->free(be, x.cnt); be->free(be, x.scratch);
    be->free(be, ds); be->free(be, dc); be->free(be, db);
    if (q_len > 1) be->weight_free(be, &x.wkvb);
    free(hw); free(start); free(cl); free(bt);
}

/* ---- sampling ---- */
typedef struct smp_ctx {
    di_backend *be;
    void *tok, *st, *logits, *rows;
    int n, V;
} smp_ctx;
static void smp_op(void *c) {
    smp_ctx *x = (smp_ctx *)c;
    x->be->sample(x->be, (int32_t *)x->tok, (int32_t *)x->st, (const float *)x->logits, x->n, x->V,
                  (const di_sample_row *)x->rows);
}

/* The device sampler on LM-like logits (V3 vocabulary; ~N(0, 2.5) with a few tokens 8-14 above;
 * 64 distinct rows, repeated above 64): n rows with one parameter set each, for n = 1 / 16 / 64 /
 * 256; bytes = the logits read once. */
enum { SMP_ROWS = 256, SMP_DISTINCT = 64 };
static void bench_sample(di_backend *be) {
    const int V = 129280, Ns[4] = {1, 16, 64, SMP_ROWS};
    struct {
        const char *what;
        di_sample_row p;
    } sets[] = {
        {"greedy", {0.0f, 1.0f, 0.0f, 0, 1, 0, 0}},
        {"temperature 0.8", {0.8f, 1.0f, 0.0f, 0, 1, 0, 0}},
        {"temperature 0.7, top-k 50", {0.7f, 1.0f, 0.0f, 50, 1, 0, 0}},
        {"temperature 0.8, top-p 0.95", {0.8f, 0.95f, 0.0f, 0, 1, 0, 0}},
        {"temperature 1, top-p 0.9, top-k 40, min-p 0.05", {1.0f, 0.9f, 0.05f, 40, 1, 0, 0}},
        {"temperature 1, min-p 0.1", {1.0f, 1.0f, 0.1f, 0, 1, 0, 0}},
    };
    float *h = (float *)malloc((size_t)SMP_ROWS * V * 4);
    for (int r = 0; r < SMP_DISTINCT; r++) {
        float *row = h + (size_t)r * V;
        for (int i = 0; i < V; i++) { /* sum of 4 uniforms: roughly normal */
            float g = b_unif(1.0f) + b_unif(1.0f) + b_unif(1.0f) + b_unif(1.0f);
            row[i] = 2.5f * 0.866f * g;
        }
        for (int j = 0; j < 8; j++) row[b_u64() % V] = 8.0f + (float)(b_u64() % 600) / 100.0f;
    }
    for (int r = SMP_DISTINCT; r < SMP_ROWS; r++)
        memcpy(h + (size_t)r * V, h + (size_t)(r % SMP_DISTINCT) * V, (size_t)V * 4);
    smp_ctx c = {be, b_alloc(be, SMP_ROWS * 4), b_alloc(be, SMP_ROWS * 4), b_alloc(be, (size_t)SMP_ROWS * V * 4),
                 b_alloc(be, SMP_ROWS * sizeof(di_sample_row)), 0, V};
    be->upload(be, c.logits, h, (size_t)SMP_ROWS * V * 4);
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++)
        for (int a = 0; a < 4; a++) {
            di_sample_row rows[SMP_ROWS];
            for (int r = 0; r < SMP_ROWS; r++) {
                rows[r] = sets[s].p;
                rows[r].position = (uint32_t)(100 + r);
                rows[r].stream = (uint32_t)r;
            }
            be->upload(be, c.rows, rows, sizeof rows);
            c.n = Ns[a];
            double t = b_time(be, smp_op, &c, 20, 7);
            char what[128];
            snprintf(what, sizeof what, "sample %s n=%d", sets[s].what, c.n);
            line(what, t, (double)c.n * V * 4, 0);
        }
    be->free(be, c.tok);
    be->free(be, c.st);
    be->free(be, c.logits);
    be->free(be, c.rows);
    free(h);
}

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "quick");
    di_backend *be = NULL;
    if (di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &be) != DI_OK) {
        fprintf(stderr, "bench_cuda_ops: %s\n", di_last_error());
        return 1;
    }
    di_backend_reserve r = {8192, 256, 129280, {128, 128, 64, 128, 512, 0.1352f}};
    if (be->reserve(be, &r) != DI_OK) {
        fprintf(stderr, "bench_cuda_ops: %s\n", di_last_error());
        return 1;
    }
    if (argc > 1 && !strcmp(argv[1], "v32")) { /* only the DeepSeek-V3.2 ops */
        bench_v32(be, 1, 1, 32768);
        bench_v32(be, 64, 1, 8192);
        bench_v32(be, 1, 1, 2048);  /* context = top-k: sparse and dense attend to the same 2048 keys */
        bench_v32(be, 64, 1, 2048);
        bench_v32(be, 1, 2048, 8192);
        di_status s = be->sync(be);
        if (s != DI_OK) fprintf(stderr, "bench_cuda_ops: %s\n", di_last_error());
        di_backend_free(be);
        return s == DI_OK ? 0 : 1;
    }
    g_bw = b_copy_bw();
    g_tf = b_gemm_rate(be, 8192, 8192, 8192, 0);
    if (argc > 1 && !strcmp(argv[1], "mladec")) { /* MLA decode only: default, then the mma.sync kernel */
        mladec_lines(be, "");
        setenv("DEEPINFER_CUDA_MLA_WGMMA", "0", 1);
        di_backend *alt = NULL;
        di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &alt);
        unsetenv("DEEPINFER_CUDA_MLA_WGMMA");
        if (alt && alt->reserve(alt, &r) == DI_OK) mladec_lines(alt, "[wgmma=0]");
        di_backend_free(alt);
        /* one token, long contexts: decode + W_UV with up to 128 KV splits (the default) and
         * with DEEPINFER_CUDA_MLA_WIDE=0 (at most 64), in turn */
        setenv("DEEPINFER_CUDA_MLA_WIDE", "0", 1);
        di_backend *narrow = NULL;
        di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &narrow);
        unsetenv("DEEPINFER_CUDA_MLA_WIDE");
        if (narrow && narrow->reserve(narrow, &r) == DI_OK) {
            di_backend *bes[2] = {be, narrow};
            const char *tags[2] = {"", "[wide=0]"};
            const int uc[7] = {256, 1024, 2048, 4096, 8192, 16384, 32768};
            for (int i = 0; i < 7; i++) bench_decode_uv(bes, tags, 2, 16, 1, uc[i]);
            bench_decode_uv(bes, tags, 2, 32, 1, 4096);
            bench_decode_uv(bes, tags, 2, 32, 1, 16384);
        }
        di_backend_free(narrow);
        /* the default's V3 lines again: the first line of the call follows the GEMM ceiling
         * (clocks / power state) */
        const int Bs[2] = {64, 128}, Cs[2] = {4096, 16384};
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 2; c++) bench_decode(be, 128, Bs[b], Cs[c], "[again]");
        di_status s = be->sync(be);
        di_backend_free(be);
        return s == DI_OK ? 0 : 1;
    }
    if (argc > 1 && !strcmp(argv[1], "sample")) { /* the device sampler only */
        bench_sample(be);
        di_status s = be->sync(be);
        di_backend_free(be);
        return s == DI_OK ? 0 : 1;
    }
    if (argc > 1 && !strcmp(argv[1], "prefill")) { /* MLA prefill only: the 10 fast-kernel variants */
        bench_prefill(be, 512, 10);
        bench_prefill(be, 8192, 10);
        di_status s = be->sync(be);
        di_backend_free(be);
        return s == DI_OK ? 0 : 1;
    }
    double tf4 = b_gemm_rate(be, 4096, 4096, 4096, 0);
    double f8 = b_gemm_rate(be, 8192, 8192, 8192, 1), f84 = b_gemm_rate(be, 4096, 7168, 7168, 1);
    printf("ceiling: device-to-device copy %.0f GB/s (read + write)\n", g_bw / 1e9);
    printf("ceiling: bf16 GEMM 8192^3 %.0f TFLOP/s (4096^3: %.0f) via cuBLASLt, random data\n", g_tf / 1e12, tf4 / 1e12);
    printf("fp8 weight-only (our tiled kernel, the default): 8192^3 %.0f TFLOP/s, 4096x7168x7168 %.0f TFLOP/s\n",
           f8 / 1e12, f84 / 1e12);
    setenv("DEEPINFER_FP8_ACT_QUANT", "1", 1);
    di_backend *aqb = NULL;
    di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &aqb);
    unsetenv("DEEPINFER_FP8_ACT_QUANT");
    if (aqb && aqb->reserve(aqb, &r) == DI_OK) {
        double q8 = b_gemm_rate(aqb, 8192, 8192, 8192, 1), q84 = b_gemm_rate(aqb, 4096, 7168, 7168, 1);
        double q81 = b_gemm_rate(aqb, 1024, 7168, 7168, 1);
        printf("fp8 cuBLASLt 1x128 act-quant + 128x128 blocks (quantization included): 8192^3 %.0f TFLOP/s, "
               "4096x7168x7168 %.0f, 1024x7168x7168 %.0f\n", q8 / 1e12, q84 / 1e12, q81 / 1e12);
    }
    di_backend_free(aqb);
    fflush(stdout);
    const int Bs[2] = {64, 128}, Cs[2] = {4096, 16384};
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 2; c++) bench_decode(be, h ? 16 : 128, Bs[b], Cs[c], "");
    if (!quick) {
        bench_decode(be, 128, 1, 4096, "");
        bench_decode(be, 16, 1, 4096, "");
        bench_decode(be, 16, 256, 256, "");
    }
    /* kernel variants for decode-sized GEMMs: default (FMA GEMV <= 4 rows, mma <= 32,
     * cuBLASLt above), mma only (DEEPINFER_CUDA_GEMV=0), cuBLASLt for every plain GEMM */
    di_backend *mma = NULL, *lt = NULL;
    setenv("DEEPINFER_CUDA_GEMV", "0", 1);
    di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &mma);
    setenv("DEEPINFER_CUDA_LT_MIN_ROWS", "1", 1);
    di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &lt);
    unsetenv("DEEPINFER_CUDA_GEMV");
    unsetenv("DEEPINFER_CUDA_LT_MIN_ROWS");
    if (mma) mma->reserve(mma, &r);
    if (lt) lt->reserve(lt, &r);
    bench_small_gemm(be, "");
    if (mma) bench_small_gemm(mma, "[mma]");
    if (lt) bench_small_gemm(lt, "[lt]");
    const int Ts[] = {1, 16, 64, 256, 2048, 8192};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) bench_moe(be, Ts[i], "");
    if (mma) {
        bench_moe(mma, 1, "[mma]");
        bench_moe(mma, 16, "[mma]");
    }
    di_backend_free(mma);
    di_backend_free(lt);
    di_status s = be->sync(be);
    if (s != DI_OK) fprintf(stderr, "bench_cuda_ops: %s\n", di_last_error());
    di_backend_free(be);
    return s == DI_OK ? 0 : 1;
}
#else
int main(void) {
    fprintf(stderr, "bench_cuda_ops: this build has no CUDA backend\n");
    return 1;
}
#endif
