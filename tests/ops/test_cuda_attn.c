/* test_cuda_attn.c - CPU vs CUDA parity of MLA decode attention (fast split-KV kernel at V2-Lite
 * and V3 shapes, single-split batches, a sequence range, the generic kernel; the wgmma kernel at
 * 128 / 64 heads, and the same cases on the mma.sync kernel), MLA prefill
 * attention (fast and generic, chunked prefill over cached context, several context windows),
 * the MoE router (noaux_tc / greedy / group_limited_greedy) and grouped experts (small, tiled,
 * fp8 and generic paths), and the device sampler against src/sampling bit for bit.
 *
 *   test_cuda_attn [decode] [prefill] [route] [experts] [small] [sample] [indexer]   (default: all)
 * (small: the permutation-free experts of 1-4-token steps, with and without shared experts;
 * indexer: DeepSeek-V3.2's layernorm and indexer_topk (selections must match the CPU's), and
 * sparse mla_decode / mla_prefill with a given selection) */
#include "cuda_test_util.h"
#include "sampling/sampler.h"

#define ATOL_L2 1.2e-2
#define PF_NVARIANTS 10 /* variants of the fast prefill kernel (cuda_mla_prefill.cu pf_variants) */
#define ATOL_MAX 4e-2

/* A random sorted selection per token (min(K, pos + 1) of its positions; the last one always
 * included half of the time) on both sides of a paged batch. */
typedef struct selset { int32_t *pos, *cnt, *dpos, *dcnt; } selset;
static selset sel_make(paged *p, int K) {
    selset s;
    s.pos = (int32_t *)malloc((size_t)p->T * K * 4);
    s.cnt = (int32_t *)malloc((size_t)p->T * 4);
    for (int t = 0; t < p->T; t++) {
        int n = p->pos[t] + 1, want = n < K ? n : K, c = 0;
        for (int x = 0; x < n && c < want; x++)
            if (t_int(n - x) < want - c) s.pos[(size_t)t * K + c++] = x; /* selection sampling: sorted */
        s.cnt[t] = c;
    }
    s.dpos = (int32_t *)g_raw(s.pos, (size_t)p->T * K * 4);
    s.dcnt = (int32_t *)g_raw(s.cnt, (size_t)p->T * 4);
    p->hab.sel_pos = s.pos;
    p->hab.sel_count = s.cnt;
    p->dab.sel_pos = s.dpos;
    p->dab.sel_count = s.dcnt;
    p->hab.sel_stride = p->dab.sel_stride = K;
    return s;
}
static void sel_free(selset *s) { free(s->pos); free(s->cnt); g_free(s->dpos); g_free(s->dcnt); }

/* ---------------------------------------------------------------- decode ---- */

/* A backend made with DEEPINFER_CUDA_MLA_EARLY=0 (the decode kernel reads everything after its
 * wait): decode_case_sel checks that it gives the same bits. */
static di_backend *g_dec_late;

/* mla_decode vs the CPU; K > 0: over a random selection of at most K positions per token */
static void decode_case_sel(const char *name, int S, const int *q_len, const int *ctx, di_mla_dims d, int K, int sb,
                            int se) {
    int H = d.n_heads, r = d.kv_rank, dr = d.rope_dim, W = r + dr, hs = 128 + dr, ldq = H * hs;
    paged p;
    paged_make(&p, S, q_len, ctx, W);
    selset sl = {NULL, NULL, NULL, NULL};
    if (K > 0) sl = sel_make(&p, K);
    int T = p.T;
    float *qt = t_rand((size_t)T * H * r, 1.0f), *q = t_rand((size_t)T * ldq, 1.0f);
    float *ref = (float *)calloc((size_t)T * H * r, 4);
    g_cpu->mla_decode(g_cpu, ref, qt, q + 128, ldq, hs, p.cache, &p.hab, sb, se, &d);
    void *dqt = g_act(qt, (size_t)T * H * r), *dq = g_act(q, (size_t)T * ldq), *dout = g_alloc((size_t)T * H * r * 2);
    g_poison(dout, (size_t)T * H * r * 2);
    g_gpu->mla_decode(g_gpu, dout, dqt, (uint16_t *)dq + 128, ldq, hs, p.dcache, &p.dab, sb, se, &d);
    float *got = g_get_act(dout, (size_t)T * H * r);
    int t0 = p.start[sb], t1 = p.start[se], untouched = 1;
    for (int t = 0; t < T; t++)
        if (t < t0 || t >= t1)
            for (int j = 0; j < H * r; j++) untouched &= isnan(got[(size_t)t * H * r + j]);
    char what[160];
    if (K > 0) snprintf(what, sizeof what, "mla_decode sparse %s H%d T%d k%d", name, H, t1 - t0, K);
    else snprintf(what, sizeof what, "mla_decode %s H%d T%d", name, H, t1 - t0);
    T_CHECK(what, got + (size_t)t0 * H * r, ref + (size_t)t0 * H * r, (size_t)(t1 - t0) * H * r, ATOL_L2, ATOL_MAX);
    CHECK_MSG(untouched, "%s: tokens outside the sequence range were written", what);
    if (g_dec_late) { /* device buffers are usable from either backend */
        void *dl = g_alloc((size_t)T * H * r * 2);
        g_poison(dl, (size_t)T * H * r * 2);
        CHECK_OK(g_gpu->sync(g_gpu));
        g_dec_late->mla_decode(g_dec_late, dl, dqt, (uint16_t *)dq + 128, ldq, hs, p.dcache, &p.dab, sb, se, &d);
        CHECK_OK(g_dec_late->sync(g_dec_late));
        size_t n = (size_t)T * H * r * 2;
        unsigned char *ha = (unsigned char *)malloc(n), *hb = (unsigned char *)malloc(n);
        CHECK_OK(g_gpu->download(g_gpu, ha, dout, n));
        CHECK_OK(g_gpu->download(g_gpu, hb, dl, n));
        CHECK_MSG(memcmp(ha, hb, n) == 0, "%s: differs with DEEPINFER_CUDA_MLA_EARLY=0", what);
        free(ha); free(hb); g_free(dl);
    }
    free(qt); free(q); free(ref); free(got); g_free(dqt); g_free(dq); g_free(dout);
    if (K > 0) sel_free(&sl);
    paged_free(&p);
}

static void decode_case(const char *name, int S, const int *q_len, const int *ctx, di_mla_dims d, int sb, int se) {
    decode_case_sel(name, S, q_len, ctx, d, 0, sb, se);
}

/* mla_decode_uv (decode + W_UV in one op; with split KV the merge runs inside the W_UV GEMV)
 * against mla_decode + bmm on the GPU and against the CPU's two ops. One token: bit for bit
 * (k_mla_uv is k_mla_combine + the bmm's GEMV). 2-16 tokens (k_mla_uv_multi: the GEMV's sums
 * where the bmm runs cuBLASLt): within bf16 rounding of the two ops, and the same bits twice. */
static void decode_uv_case(const char *name, int S, const int *q_len, const int *ctx, di_mla_dims d) {
    int H = d.n_heads, r = d.kv_rank, dr = d.rope_dim, W = r + dr, hs = 128 + dr, ldq = H * hs, V = d.v_dim;
    paged p;
    paged_make(&p, S, q_len, ctx, W);
    int T = p.T;
    t_weight wu = t_weight_make(H, V, r, 0, 0.05f);
    di_weight wc = t_weight_upload(g_cpu, &wu, DI_WEIGHT_PLAIN), wg = t_weight_upload(g_gpu, &wu, DI_WEIGHT_PLAIN);
    float *qt = t_rand((size_t)T * H * r, 1.0f), *q = t_rand((size_t)T * ldq, 1.0f);
    float *lat = (float *)calloc((size_t)T * H * r, 4), *ref = (float *)calloc((size_t)T * H * V, 4);
    g_cpu->mla_decode(g_cpu, lat, qt, q + 128, ldq, hs, p.cache, &p.hab, 0, S, &d);
    g_cpu->bmm(g_cpu, ref, H * V, V, lat, H * r, r, &wc, T);
    void *dqt = g_act(qt, (size_t)T * H * r), *dq = g_act(q, (size_t)T * ldq);
    void *dlat = g_alloc((size_t)T * H * r * 2), *da = g_alloc((size_t)T * H * V * 2), *db = g_alloc((size_t)T * H * V * 2);
    g_poison(da, (size_t)T * H * V * 2);
    g_poison(db, (size_t)T * H * V * 2);
    g_gpu->mla_decode(g_gpu, dlat, dqt, (uint16_t *)dq + 128, ldq, hs, p.dcache, &p.dab, 0, S, &d);
    g_gpu->bmm(g_gpu, da, H * V, V, dlat, H * r, r, &wg, T);
    CHECK_MSG(g_gpu->mla_decode_uv != NULL, "%s: no mla_decode_uv", name);
    uint16_t *ha = (uint16_t *)malloc((size_t)T * H * V * 2), *hb = (uint16_t *)malloc((size_t)T * H * V * 2);
    uint16_t *hc = (uint16_t *)malloc((size_t)T * H * V * 2);
    for (int rep = 0; rep < 2 && g_gpu->mla_decode_uv; rep++) {
        g_poison(dlat, (size_t)T * H * r * 2);
        g_poison(db, (size_t)T * H * V * 2);
        g_gpu->mla_decode_uv(g_gpu, db, H * V, V, dlat, dqt, (uint16_t *)dq + 128, ldq, hs, p.dcache, &p.dab, 0, S, &d,
                             &wg, T);
        CHECK_OK(g_gpu->download(g_gpu, rep ? hc : hb, db, (size_t)T * H * V * 2));
    }
    CHECK_OK(g_gpu->download(g_gpu, ha, da, (size_t)T * H * V * 2));
    size_t diff = 0;
    for (size_t i = 0; i < (size_t)T * H * V; i++) diff += ha[i] != hb[i];
    char what[160];
    snprintf(what, sizeof what, "mla_decode_uv %s H%d T%d", name, H, T);
    CHECK_MSG(memcmp(hb, hc, (size_t)T * H * V * 2) == 0, "%s: two runs differ", what);
    if (T == 1) CHECK_MSG(diff == 0, "%s: %zu of %d outputs differ from mla_decode + bmm", what, diff, T * H * V);
    float *got = g_get_act(db, (size_t)T * H * V), *two = g_get_act(da, (size_t)T * H * V);
    T_CHECK(what, got, ref, (size_t)T * H * V, TOL_L2, TOL_MAX);
    if (T > 1) {
        char w2[240];
        snprintf(w2, sizeof w2, "%s vs mla_decode + bmm (%zu outputs differ in bits)", what, diff);
        T_CHECK(w2, got, two, (size_t)T * H * V, 4e-3, 8e-3);
    }
    free(qt); free(q); free(lat); free(ref); free(ha); free(hb); free(hc); free(got); free(two);
    g_free(dqt); g_free(dq); g_free(dlat); g_free(da); g_free(db);
    g_cpu->weight_free(g_cpu, &wc); g_gpu->weight_free(g_gpu, &wg);
    t_weight_free(&wu);
    paged_free(&p);
}

static void test_decode_uv(void) {
    di_mla_dims v2 = {16, 128, 64, 128, 512, 0.1352f}, v3 = {128, 128, 64, 128, 512, 0.1352f},
                h64 = {64, 128, 64, 128, 512, 0.1352f};
    int q1[1] = {1}, c1[6] = {1, 40, 129, 700, 3000, 20000};
    for (int i = 0; i < 6; i++) { /* one token: 1 to many KV splits */
        char name[64];
        snprintf(name, sizeof name, "v2-lite ctx %d", c1[i]);
        decode_uv_case(name, 1, q1, c1 + i, v2);
    }
    int c2[1] = {4097};
    decode_uv_case("v3 ctx 4097", 1, q1, c2, v3);
    decode_uv_case("64 heads ctx 4097", 1, q1, c2, h64);
    int ql[3] = {1, 2, 1}, cx[3] = {50, 900, 3}; /* several tokens: the merge inside the GEMV */
    decode_uv_case("v2-lite 3 seqs", 3, ql, cx, v2);
    int q16[16], c16[16], q17[17], c17[17];
    for (int i = 0; i < 17; i++) {
        q17[i] = 1;
        c17[i] = 1 + (i * 977) % 3000; /* 1 to ~3000 keys: 1 to 17 splits with keys */
        if (i < 16) {
            q16[i] = 1;
            c16[i] = c17[i];
        }
    }
    decode_uv_case("v2-lite 16 seqs", 16, q16, c16, v2);
    decode_uv_case("v2-lite 5 seqs", 5, q16, c16 + 3, v2);
    decode_uv_case("v2-lite 2 seqs", 2, q16, c16 + 7, v2);
    decode_uv_case("64 heads 16 seqs", 16, q16, c16, h64);
    decode_uv_case("v2-lite 17 seqs (decode, then bmm)", 17, q17, c17, v2);
}

/* 128 and 64 heads: contexts shorter than a tile and not multiples of 64, several tokens of a
 * sequence, a sequence range, many cache blocks in shuffled order (paged_make), batch 1 (many
 * KV splits) and batches of >= 64 sequences (one split) */
static void decode_wg_cases(const char *tag) {
    di_mla_dims v3 = {128, 128, 64, 128, 512, 0.1352f}, h64 = {64, 128, 64, 128, 512, 0.1352f};
    int ql[6] = {1, 1, 1, 2, 1, 1}, cx[6] = {1, 63, 64, 130, 1000, 5000}, q1[1] = {1}, c1[1] = {4097};
    char name[96];
    snprintf(name, sizeof name, "%sv3 mixed contexts", tag);
    decode_case(name, 6, ql, cx, v3, 0, 6);
    snprintf(name, sizeof name, "%sv3 seqs 2..4", tag);
    decode_case(name, 6, ql, cx, v3, 2, 5);
    snprintf(name, sizeof name, "%s64 heads mixed contexts", tag);
    decode_case(name, 6, ql, cx, h64, 0, 6);
    snprintf(name, sizeof name, "%sv3 batch 1", tag);
    decode_case(name, 1, q1, c1, v3, 0, 1);
    snprintf(name, sizeof name, "%s64 heads batch 1", tag);
    decode_case(name, 1, q1, c1, h64, 0, 1);
    enum { NB = 140 };
    int qb[NB], cb[NB];
    for (int i = 0; i < NB; i++) {
        qb[i] = 1;
        cb[i] = 1 + t_int(600);
    }
    snprintf(name, sizeof name, "%sv3 72 seqs", tag);
    decode_case(name, 72, qb, cb, v3, 0, 72);
    snprintf(name, sizeof name, "%s64 heads 140 seqs", tag);
    decode_case(name, NB, qb, cb, h64, 0, NB);
}

/* A CUDA backend with DEEPINFER_CUDA_MLA_WGMMA / DEEPINFER_CUDA_MLA_EARLY set (NULL: default),
 * reserved like the test's main backend (so the same split counts). */
static di_backend *decode_backend(const char *wgmma, const char *early) {
    if (wgmma) setenv("DEEPINFER_CUDA_MLA_WGMMA", wgmma, 1);
    if (early) setenv("DEEPINFER_CUDA_MLA_EARLY", early, 1);
    di_backend *be = NULL;
    CHECK_OK(di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &be));
    unsetenv("DEEPINFER_CUDA_MLA_WGMMA");
    unsetenv("DEEPINFER_CUDA_MLA_EARLY");
    if (be) {
        di_backend_reserve r = {8192, 512, 129280, {128, 128, 64, 128, 512, 0.1f}};
        CHECK_OK(be->reserve(be, &r));
    }
    return be;
}

/* one token of 16 / 32 heads at contexts of 1 to 625 tiles: 1 tile per split, the first
 * contexts past 64 tiles (2 per split), and 3-5 per split over ~86-125 splits */
static void one_token_cases(const char *tag) {
    di_mla_dims v2 = {16, 128, 64, 128, 512, 0.1352f}, h32 = {32, 128, 64, 128, 512, 0.2f};
    const int ctx[6] = {300, 2048, 2080, 4097, 8200, 20000};
    int q1[1] = {1};
    for (int i = 0; i < 6; i++) {
        char name[96];
        snprintf(name, sizeof name, "%sv2-lite one token ctx %d", tag, ctx[i]);
        decode_case(name, 1, q1, ctx + i, v2, 0, 1);
        if (i == 1 || i == 4) {
            snprintf(name, sizeof name, "%s32 heads one token ctx %d", tag, ctx[i]);
            decode_case(name, 1, q1, ctx + i, h32, 0, 1);
        }
    }
}

/* cases() with g_gpu a decode backend made with var=val */
static void with_decode_env(const char *var, const char *val, void (*cases)(void)) {
    setenv(var, val, 1);
    di_backend *be = decode_backend(NULL, NULL);
    unsetenv(var);
    if (!be) return;
    di_backend *save = g_gpu;
    g_gpu = be;
    cases();
    g_gpu = save;
    di_backend_free(be);
}

/* DEEPINFER_CUDA_MLA_WIDE=0: one-token steps in at most 64 splits */
static void wide0_cases(void) {
    one_token_cases("[wide=0] ");
    test_decode_uv();
}

static void test_decode(void) {
    int ql[5] = {1, 1, 3, 1, 2}, cx[5] = {1, 64, 65, 700, 3000};
    di_mla_dims v2 = {16, 128, 64, 128, 512, 0.1352f}, v3 = {128, 128, 64, 128, 512, 0.1352f};
    g_dec_late = decode_backend(NULL, "0");
    decode_case("v2-lite (split-KV)", 5, ql, cx, v2, 0, 5);
    decode_case("v2-lite seqs 1..3", 5, ql, cx, v2, 1, 4);
    decode_case("v3 (split-KV)", 5, ql, cx, v3, 0, 5);
    int ql3[3] = {1, 4, 1}, cx3[3] = {4100, 33, 129};
    decode_case("v3 long", 3, ql3, cx3, v3, 0, 3);
    di_mla_dims v32 = {32, 128, 64, 128, 512, 0.2f};
    decode_case("32 heads", 5, ql, cx, v32, 0, 5);
    /* enough tokens for one split per token */
    enum { NS = 300 };
    int qn[NS], cn[NS];
    for (int i = 0; i < NS; i++) {
        qn[i] = 1;
        cn[i] = 1 + t_int(200);
    }
    decode_case("v2-lite 300 seqs", NS, qn, cn, v2, 0, NS);
    di_mla_dims tiny = {3, 16, 8, 16, 36, 0.3f};
    decode_case("generic r36 rope8", 5, ql, cx, tiny, 0, 5);
    /* heads a multiple of 64: the wgmma kernel (cuda_mla_decode_wgmma.cu) by default, then the
     * same cases on the mma.sync kernel (DEEPINFER_CUDA_MLA_WGMMA=0) */
    decode_wg_cases("");
    di_backend *alt = decode_backend("0", NULL), *late = decode_backend("0", "0");
    if (alt) {
        di_backend *save = g_gpu, *save_late = g_dec_late;
        g_gpu = alt;
        g_dec_late = late; /* the same kernel with its early loads off */
        decode_wg_cases("[wgmma=0] ");
        g_gpu = save;
        g_dec_late = save_late;
        di_backend_free(alt);
    }
    if (late) di_backend_free(late);
    if (g_dec_late) di_backend_free(g_dec_late);
    g_dec_late = NULL;
    test_decode_uv();
    /* one-token steps of 16 / 32 heads (up to 128 KV splits by default, at least 2 tiles each
     * past 64 tiles: 1, 2 and 3+ tiles per split), then the same and mla_decode_uv with
     * DEEPINFER_CUDA_MLA_WIDE=0 (at most 64 splits) */
    one_token_cases("");
    with_decode_env("DEEPINFER_CUDA_MLA_WIDE", "0", wide0_cases);
}

/* ---------------------------------------------------------------- prefill ---- */

/* mla_prefill vs the CPU; K > 0: over a random selection of at most K positions per token (the
 * generic kernel: run once), else every variant of the fast kernel */
static void prefill_case_sel(const char *name, int S, const int *q_len, const int *ctx, di_mla_dims d, int K, int sb,
                             int se, int fp8) {
    int H = d.n_heads, dn = d.nope_dim, dr = d.rope_dim, dv = d.v_dim, r = d.kv_rank, W = r + dr;
    int qk = dn + dr, ldq = H * qk, kvw = H * (dn + dv);
    paged p;
    paged_make(&p, S, q_len, ctx, W);
    selset sl = {NULL, NULL, NULL, NULL};
    if (K > 0) sl = sel_make(&p, K);
    int T = p.T;
    float *q = t_rand((size_t)T * ldq, 1.0f);
    t_weight wk = t_weight_make(1, kvw, r, fp8, 0.08f);
    di_weight wc = t_weight_upload(g_cpu, &wk, DI_WEIGHT_PLAIN), wg = t_weight_upload(g_gpu, &wk, DI_WEIGHT_PLAIN);
    size_t sc = g_cpu->mla_prefill_scratch_bytes(g_cpu, &d, T), sg = g_gpu->mla_prefill_scratch_bytes(g_gpu, &d, T);
    void *hs = malloc(sc), *ds = g_alloc(sg);
    float *ref = (float *)calloc((size_t)T * H * dv, 4);
    g_cpu->mla_prefill(g_cpu, ref, q, ldq, p.cache, &wc, &p.hab, sb, se, &d, hs, sc);
    void *dq = g_act(q, (size_t)T * ldq), *dout = g_alloc((size_t)T * H * dv * 2);
    /* every variant of the fast kernel (DEEPINFER_CUDA_PREFILL_KERNEL 1..PF_NVARIANTS), then the
     * shape-chosen one; the generic shapes ignore the variable */
    for (int v = K > 0 ? PF_NVARIANTS + 1 : 1; v <= PF_NVARIANTS + 1; v++) {
        char vs[16];
        snprintf(vs, sizeof vs, "%d", v <= PF_NVARIANTS ? v : 0);
        setenv("DEEPINFER_CUDA_PREFILL_KERNEL", vs, 1);
        g_poison(dout, (size_t)T * H * dv * 2);
        g_gpu->mla_prefill(g_gpu, dout, dq, ldq, p.dcache, &wg, &p.dab, sb, se, &d, ds, sg);
        float *got = g_get_act(dout, (size_t)T * H * dv);
        int t0 = p.start[sb], t1 = p.start[se], untouched = 1;
        for (int t = 0; t < T; t++)
            if (t < t0 || t >= t1)
                for (int j = 0; j < H * dv; j++) untouched &= isnan(got[(size_t)t * H * dv + j]);
        char what[160];
        if (K > 0)
            snprintf(what, sizeof what, "mla_prefill sparse %s H%d T%d k%d%s", name, H, t1 - t0, K,
                     fp8 ? " fp8 W_kvb" : "");
        else
            snprintf(what, sizeof what, "mla_prefill %s H%d T%d%s kernel %s", name, H, t1 - t0,
                     fp8 ? " fp8 W_kvb" : "", vs);
        T_CHECK(what, got + (size_t)t0 * H * dv, ref + (size_t)t0 * H * dv, (size_t)(t1 - t0) * H * dv, ATOL_L2,
                ATOL_MAX);
        CHECK_MSG(untouched, "%s: tokens outside the sequence range were written", what);
        free(got);
    }
    unsetenv("DEEPINFER_CUDA_PREFILL_KERNEL");
    free(q); free(ref); free(hs); g_free(ds); g_free(dq); g_free(dout);
    g_cpu->weight_free(g_cpu, &wc); g_gpu->weight_free(g_gpu, &wg); t_weight_free(&wk);
    if (K > 0) sel_free(&sl);
    paged_free(&p);
}

static void prefill_case(const char *name, int S, const int *q_len, const int *ctx, di_mla_dims d, int sb, int se,
                         int fp8) {
    prefill_case_sel(name, S, q_len, ctx, d, 0, sb, se, fp8);
}

static void test_prefill(void) {
    di_mla_dims v2 = {16, 128, 64, 128, 512, 0.1352f};
    int ql[4] = {70, 5, 1, 200}, cx[4] = {130, 5, 129, 200};
    prefill_case("v2-lite", 4, ql, cx, v2, 0, 4, 0);
    prefill_case("v2-lite seqs 1..2", 4, ql, cx, v2, 1, 3, 0);
    prefill_case("v2-lite", 4, ql, cx, v2, 0, 4, 1);
    int ql2[2] = {8, 3}, cx2[2] = {5000, 3}; /* context beyond one window: several passes */
    prefill_case("v2-lite ctx 5000", 2, ql2, cx2, v2, 0, 2, 0);
    /* long contexts at the benchmark shape: full causal prefill with partial last tiles, a chunk
     * whose queries start mid-context, a single query */
    int ql4[3] = {1100, 301, 1}, cx4[3] = {1100, 2650, 700};
    prefill_case("v2-lite long", 3, ql4, cx4, v2, 0, 3, 0);
    di_mla_dims v3 = {128, 128, 64, 128, 512, 0.1352f};
    int ql3[2] = {40, 3}, cx3[2] = {100, 67};
    prefill_case("v3", 2, ql3, cx3, v3, 0, 2, 0);
    di_mla_dims t3 = {4, 24, 16, 20, 40, 0.25f}, odd = {3, 7, 4, 5, 11, 0.29f};
    prefill_case("tiny-v3 dims (generic)", 4, ql, cx, t3, 0, 4, 0);
    prefill_case("odd dims (generic)", 4, ql, cx, odd, 0, 4, 0);
}

/* ---------------------------------------------------------------- MoE ---- */

/* k_route's two top-k paths at every step size: DEEPINFER_CUDA_ROUTE_REDUX=0 (warp_argmax) and
 * =65536 (warp_topk_redux); the default backend takes the latter up to 16 tokens. And the router
 * logits of <= 32-token steps with 8 and 2 tokens per block (DEEPINFER_CUDA_ROUTER_TT; default 1) */
enum { ROUTE_ALTS = 4 };
static di_backend *g_route_alt[ROUTE_ALTS];
static const char *const g_route_alt_env[ROUTE_ALTS][2] = {{"DEEPINFER_CUDA_ROUTE_REDUX", "0"},
                                                          {"DEEPINFER_CUDA_ROUTE_REDUX", "65536"},
                                                          {"DEEPINFER_CUDA_ROUTER_TT", "8"},
                                                          {"DEEPINFER_CUDA_ROUTER_TT", "2"}};

/* route_case with inputs that stress k_route's tie, -INF and NaN rules. dup > 0: gate row e
 * (and bias e) a copy of row e % dup, so experts share bit-identical logits (exact ties, which
 * the lower index wins); bias_pow2 (with bias_amp > 0): each expert's bias 2^24 or 2^25, which
 * swallows the sigmoid, so every noaux_tc selection score is exactly 2^24 or 2^25 (ties among
 * experts and among group scores; the weights stay the unbiased sigmoid); nan_row >= 0: that
 * gate row NaN (its logits NaN, with softmax every score NaN): the comparisons with the CPU are
 * skipped (NaN picks are not specified) and only the two GPU paths are compared, whose ids and
 * weight bits must match as everywhere. */
static void route_case_x(const char *name, di_route_params rp, int T, int D, float bias_amp, int dup, int bias_pow2,
                         int nan_row) {
    int E = rp.n_experts, k = rp.top_k;
    char what[160];
    t_weight wg = t_weight_make(1, E, D, 0, 0.05f);
    for (int e = dup > 0 ? dup : E; e < E; e++) {
        memcpy(wg.bf[0] + (size_t)e * D, wg.bf[0] + (size_t)(e % dup) * D, (size_t)D * 2);
        memcpy(wg.deq + (size_t)e * D, wg.deq + (size_t)(e % dup) * D, (size_t)D * 4);
    }
    if (nan_row >= 0)
        for (int d = 0; d < D; d++) {
            wg.bf[0][(size_t)nan_row * D + d] = 0x7fc0; /* bf16 quiet NaN */
            wg.deq[(size_t)nan_row * D + d] = NAN;
        }
    di_weight gc = t_weight_upload(g_cpu, &wg, DI_WEIGHT_PLAIN), gg = t_weight_upload(g_gpu, &wg, DI_WEIGHT_PLAIN);
    float *bias = t_rand((size_t)E, bias_amp);
    for (int e = dup > 0 ? dup : E; e < E; e++) bias[e] = bias[e % dup];
    if (bias_pow2)
        for (int e = 0; e < E; e++) bias[e] = t_int(2) ? 33554432.0f : 16777216.0f;
    di_weight bc = t_vec_upload(g_cpu, bias, E), bg = t_vec_upload(g_gpu, bias, E);
    float *x = t_rand_f32((size_t)T * D, 1.0f); /* the router input is f32: full precision */
    int32_t *ic = (int32_t *)malloc((size_t)T * k * 4);
    float *wc = (float *)malloc((size_t)T * k * 4), *scr = (float *)malloc((size_t)T * 2 * E * 4);
    g_cpu->moe_route(g_cpu, ic, wc, x, &gc, bias_amp > 0 ? &bc : NULL, &rp, T, scr);
    void *dx = g_raw(x, (size_t)T * D * 4), *di = g_alloc((size_t)T * k * 4), *dw = g_alloc((size_t)T * k * 4),
         *ds = g_alloc((size_t)T * 2 * E * 4);
    g_poison(di, (size_t)T * k * 4);
    g_poison(dw, (size_t)T * k * 4);
    g_poison(ds, (size_t)T * 2 * E * 4);
    g_gpu->moe_route(g_gpu, di, dw, (const float *)dx, &gg, bias_amp > 0 ? &bg : NULL, &rp, T, ds);
    /* the fp32 router logits themselves (scratch [T, E] first): fp32 summation order only */
    float *lg = g_get_f32(ds, (size_t)T * E);
    snprintf(what, sizeof what, "moe_route %s T%d D%d fp32 logits", name, T, D);
    if (nan_row < 0) T_CHECK(what, lg, scr, (size_t)T * E, 1e-5, 1e-5);
    if (T > 1) { /* batch invariance: the last token routed alone gets bit-identical logits */
        void *di1 = g_alloc((size_t)k * 4), *dw1 = g_alloc((size_t)k * 4), *ds1 = g_alloc((size_t)2 * E * 4);
        g_poison(ds1, (size_t)2 * E * 4);
        g_gpu->moe_route(g_gpu, di1, dw1, (const float *)dx + (size_t)(T - 1) * D, &gg, bias_amp > 0 ? &bg : NULL,
                         &rp, 1, ds1);
        float *l1 = g_get_f32(ds1, (size_t)E);
        int same = memcmp(l1, lg + (size_t)(T - 1) * E, (size_t)E * 4) == 0;
        CHECK_MSG(same, "moe_route %s: token %d's router logits alone differ from those in its batch of %d", name,
                  T - 1, T);
        /* and its routing: same ids, same weight bits */
        int32_t *i1 = (int32_t *)malloc((size_t)k * 4), *ib = (int32_t *)malloc((size_t)k * 4);
        uint32_t *w1 = (uint32_t *)malloc((size_t)k * 4), *wb = (uint32_t *)malloc((size_t)k * 4);
        g_gpu->download(g_gpu, i1, di1, (size_t)k * 4);
        g_gpu->download(g_gpu, w1, dw1, (size_t)k * 4);
        g_gpu->download(g_gpu, ib, (const int32_t *)di + (size_t)(T - 1) * k, (size_t)k * 4);
        g_gpu->download(g_gpu, wb, (const float *)dw + (size_t)(T - 1) * k, (size_t)k * 4);
        CHECK_MSG(!memcmp(i1, ib, (size_t)k * 4) && !memcmp(w1, wb, (size_t)k * 4),
                  "moe_route %s: token %d routed alone differs from its routing in a batch of %d", name, T - 1, T);
        free(i1); free(ib); free(w1); free(wb);
        free(l1);
        g_free(di1); g_free(dw1); g_free(ds1);
    }
    free(lg);
    int32_t *ig = (int32_t *)malloc((size_t)T * k * 4);
    float *wgot = g_get_f32(dw, (size_t)T * k);
    g_gpu->download(g_gpu, ig, di, (size_t)T * k * 4);
    for (int v = 0; v < ROUTE_ALTS; v++) { /* the same inputs through each path: the same ids and weight bits */
        di_backend *alt = g_route_alt[v];
        if (!alt) continue;
        void *di0 = g_alloc((size_t)T * k * 4), *dw0 = g_alloc((size_t)T * k * 4);
        void *ds0 = g_alloc((size_t)T * 2 * E * 4);
        g_poison(di0, (size_t)T * k * 4);
        g_poison(dw0, (size_t)T * k * 4);
        CHECK_OK(g_gpu->sync(g_gpu)); /* the poison lands before the other backend's stream runs */
        alt->moe_route(alt, di0, dw0, (const float *)dx, &gg, bias_amp > 0 ? &bg : NULL, &rp, T, ds0);
        CHECK_OK(alt->sync(alt));
        int32_t *i0 = (int32_t *)malloc((size_t)T * k * 4);
        float *w0 = (float *)malloc((size_t)T * k * 4);
        g_gpu->download(g_gpu, i0, di0, (size_t)T * k * 4);
        g_gpu->download(g_gpu, w0, dw0, (size_t)T * k * 4);
        int same = !memcmp(i0, ig, (size_t)T * k * 4) && !memcmp(w0, wgot, (size_t)T * k * 4);
        fprintf(stderr, "  moe_route %s: %s=%s: %s\n", name, g_route_alt_env[v][0], g_route_alt_env[v][1],
                same ? "same ids and weight bits" : "DIFFERS");
        CHECK_MSG(same, "moe_route %s: ids / weight bits differ with %s=%s", name, g_route_alt_env[v][0],
                  g_route_alt_env[v][1]);
        free(i0); free(w0);
        g_free(di0); g_free(dw0); g_free(ds0);
    }
    if (nan_row < 0) {
        int mism = 0;
        for (int i = 0; i < T * k; i++) mism += ig[i] != ic[i];
        snprintf(what, sizeof what, "moe_route %s E%d k%d T%d: %d/%d indices differ", name, E, k, T, mism, T * k);
        fprintf(stderr, "  %s\n", what);
        CHECK_MSG(mism == 0, "%s", what);
        snprintf(what, sizeof what, "moe_route %s weights", name);
        T_CHECK(what, wgot, wc, (size_t)T * k, 1e-5, 1e-5);
    }
    free(ic); free(wc); free(scr); free(ig); free(wgot); free(x); free(bias);
    g_free(dx); g_free(di); g_free(dw); g_free(ds);
    g_cpu->weight_free(g_cpu, &gc); g_gpu->weight_free(g_gpu, &gg);
    g_cpu->weight_free(g_cpu, &bc); g_gpu->weight_free(g_gpu, &bg); t_weight_free(&wg);
}

static void route_case(const char *name, di_route_params rp, int T, int D, float bias_amp) {
    route_case_x(name, rp, T, D, bias_amp, 0, 0, -1);
}

/* every case also runs with each top-k path forced and with 8 and 2 router-logits tokens per block
 * (same ids, same bits) */
static void test_route(void) {
    for (int v = 0; v < ROUTE_ALTS; v++) g_route_alt[v] = g_backend_with(g_route_alt_env[v][0], g_route_alt_env[v][1]);
    route_case("noaux_tc V3", (di_route_params){DI_ROUTE_NOAUX_TC, 256, 8, 8, 4, 1, 2.5f}, 50, 1024, 0.05f);
    route_case("noaux_tc tiny", (di_route_params){DI_ROUTE_NOAUX_TC, 16, 4, 4, 2, 1, 2.5f}, 33, 160, 0.3f);
    route_case("greedy V2-Lite", (di_route_params){DI_ROUTE_GREEDY, 64, 6, 1, 1, 0, 1.0f}, 50, 2048, 0.0f);
    route_case("group_limited", (di_route_params){DI_ROUTE_GROUP_LIMITED_GREEDY, 16, 3, 4, 2, 0, 2.0f}, 40, 96, 0.0f);
    route_case("noaux_tc 1024", (di_route_params){DI_ROUTE_NOAUX_TC, 1024, 8, 16, 4, 1, 2.5f}, 9, 256, 0.05f);
    /* the router-logits kernel's three shapes: up to 32 tokens (one expert per block), 33-512
     * (4 experts x 4 tokens per block: the 40 / 50 / 203 / 300-token cases above and below, a
     * partial 4-token group, E = 72 / 256) and more (eight per block, a partial 8-token group),
     * V3's D = 7168, a D that is not a multiple of 4 (scalar path); every case also checks batch
     * invariance (the last token alone, on the one-expert kernel) */
    route_case("noaux_tc V3 batch 99", (di_route_params){DI_ROUTE_NOAUX_TC, 256, 8, 8, 4, 1, 2.5f}, 99, 7168, 0.05f);
    route_case("noaux_tc E72 batch 45", (di_route_params){DI_ROUTE_NOAUX_TC, 72, 6, 8, 3, 1, 2.5f}, 45, 1024, 0.05f);
    route_case("greedy V2-Lite batch 600", (di_route_params){DI_ROUTE_GREEDY, 64, 6, 1, 1, 0, 1.0f}, 600, 2048, 0.0f);
    route_case("noaux_tc V3 decode", (di_route_params){DI_ROUTE_NOAUX_TC, 256, 8, 8, 4, 1, 2.5f}, 1, 7168, 0.05f);
    route_case("greedy V2-Lite prefill", (di_route_params){DI_ROUTE_GREEDY, 64, 6, 1, 1, 0, 1.0f}, 203, 2048, 0.0f);
    route_case("noaux_tc pycoder prefill", (di_route_params){DI_ROUTE_NOAUX_TC, 16, 4, 4, 2, 1, 2.5f}, 300, 257, 0.3f);
    route_case("greedy V2-Lite batch 5", (di_route_params){DI_ROUTE_GREEDY, 64, 6, 1, 1, 0, 1.0f}, 5, 2048, 0.0f);
    route_case("noaux_tc odd D batch 8", (di_route_params){DI_ROUTE_NOAUX_TC, 16, 4, 4, 2, 1, 2.5f}, 8, 161, 0.3f);
    /* one-token steps (decode at batch 1) with the routers of V2-Lite, the tiny models and odd
     * expert counts / groups */
    route_case("greedy V2-Lite decode", (di_route_params){DI_ROUTE_GREEDY, 64, 6, 1, 1, 0, 1.0f}, 1, 2048, 0.0f);
    route_case("noaux_tc tiny decode", (di_route_params){DI_ROUTE_NOAUX_TC, 16, 4, 4, 2, 1, 2.5f}, 1, 160, 0.3f);
    route_case("group_limited decode", (di_route_params){DI_ROUTE_GROUP_LIMITED_GREEDY, 16, 3, 4, 2, 0, 2.0f}, 1, 96,
               0.0f);
    route_case("noaux_tc E72 decode", (di_route_params){DI_ROUTE_NOAUX_TC, 72, 6, 8, 3, 1, 2.5f}, 1, 1024, 0.05f);
    route_case("noaux_tc E256 D2048 decode", (di_route_params){DI_ROUTE_NOAUX_TC, 256, 8, 8, 4, 1, 2.5f}, 1, 2048,
               0.05f);
    /* more steps of 2-32 tokens (the one-expert-per-block kernel), Kimi-K2's 384 experts and
     * V3's router with D = 7168 at 32 tokens */
    route_case("greedy V2-Lite batch 16", (di_route_params){DI_ROUTE_GREEDY, 64, 6, 1, 1, 0, 1.0f}, 16, 2048, 0.0f);
    route_case("noaux_tc V3 batch 32", (di_route_params){DI_ROUTE_NOAUX_TC, 256, 8, 8, 4, 1, 2.5f}, 32, 7168, 0.05f);
    route_case("noaux_tc V3 batch 7", (di_route_params){DI_ROUTE_NOAUX_TC, 256, 8, 8, 4, 1, 2.5f}, 7, 1024, 0.05f);
    route_case("noaux_tc E384 batch 3", (di_route_params){DI_ROUTE_NOAUX_TC, 384, 8, 1, 1, 1, 2.827f}, 3, 1024, 0.05f);
    route_case("noaux_tc E128 decode", (di_route_params){DI_ROUTE_NOAUX_TC, 128, 8, 8, 4, 1, 2.5f}, 2, 512, 0.05f);
    route_case("noaux_tc D4160 batch 3", (di_route_params){DI_ROUTE_NOAUX_TC, 16, 4, 4, 2, 1, 2.5f}, 3, 4160, 0.3f);
    route_case("greedy V2-Lite batch 4", (di_route_params){DI_ROUTE_GREEDY, 64, 6, 1, 1, 0, 1.0f}, 4, 2048, 0.0f);
    /* ties, -INF / masked picks and NaN (route_case_x): duplicated gate rows (3 distinct rows
     * among 64: each top-6 is one value's six lowest copies, across lanes and slots; V3 with
     * 32 distinct rows: all group scores equal; 5 among 384; 7 among 1024), a bias that makes
     * every noaux_tc score 2^24 or 2^25, more picks than unmasked experts (noaux_tc: -INF
     * picked lowest index first; group_limited: masked zeros), one NaN gate row */
    const di_route_params v2 = {DI_ROUTE_GREEDY, 64, 6, 1, 1, 0, 1.0f}, v3 = {DI_ROUTE_NOAUX_TC, 256, 8, 8, 4, 1, 2.5f};
    route_case_x("greedy V2-Lite dup rows", v2, 5, 2048, 0.0f, 3, 0, -1);
    route_case_x("noaux_tc V3 dup rows", v3, 6, 1024, 0.05f, 32, 0, -1);
    route_case_x("noaux_tc E384 dup rows", (di_route_params){DI_ROUTE_NOAUX_TC, 384, 8, 1, 1, 1, 2.827f}, 3, 512,
                 0.05f, 5, 0, -1);
    route_case_x("noaux_tc 1024 dup rows", (di_route_params){DI_ROUTE_NOAUX_TC, 1024, 8, 16, 4, 1, 2.5f}, 2, 256,
                 0.05f, 7, 0, -1);
    route_case_x("noaux_tc V3 bias ties", v3, 9, 1024, 1.0f, 0, 1, -1);
    route_case_x("noaux_tc E72 bias ties", (di_route_params){DI_ROUTE_NOAUX_TC, 72, 6, 8, 3, 1, 2.5f}, 3, 512, 1.0f,
                 0, 1, -1);
    route_case("noaux_tc -inf picks", (di_route_params){DI_ROUTE_NOAUX_TC, 16, 4, 8, 1, 1, 2.5f}, 5, 160, 0.3f);
    route_case("group_limited zero picks", (di_route_params){DI_ROUTE_GROUP_LIMITED_GREEDY, 16, 6, 4, 1, 0, 2.0f}, 5,
               96, 0.0f);
    route_case_x("noaux_tc V3 NaN row", v3, 3, 1024, 0.05f, 0, 0, 37);
    route_case_x("greedy V2-Lite NaN row", v2, 2, 2048, 0.0f, 0, 0, 5);
    for (int v = 0; v < ROUTE_ALTS; v++) {
        if (g_route_alt[v]) di_backend_free(g_route_alt[v]);
        g_route_alt[v] = NULL;
    }
}

/* A router's output for tests: per token k distinct experts in ascending order, one pick in
 * `low_one_in` drawn from the first four (so tokens share experts), weights in [0.1, 0.6). */
static void random_topk(int32_t *idx, float *w, int T, int k, int E, int low_one_in) {
    for (int t = 0; t < T; t++) {
        int n = 0;
        while (n < k) {
            int e = t_int(low_one_in) == 0 ? t_int(E < 4 ? E : 4) : t_int(E), dup = 0;
            for (int j = 0; j < n; j++) dup |= idx[t * k + j] == e;
            if (!dup) idx[t * k + n++] = e;
        }
        for (int a = 0; a < k; a++)
            for (int b = a + 1; b < k; b++)
                if (idx[t * k + b] < idx[t * k + a]) {
                    int32_t tmp = idx[t * k + a];
                    idx[t * k + a] = idx[t * k + b];
                    idx[t * k + b] = tmp;
                }
        for (int j = 0; j < k; j++) w[t * k + j] = 0.1f + 0.5f * (float)(t_u64() % 1000) / 1000.0f;
    }
}

/* Other GPU backends (another kernel choice, e.g. DEEPINFER_CUDA_WGMMA=0) that experts_case
 * also checks against the same CPU reference (NULL-terminated; NULL: none). */
static di_backend *g_gpu_alt[4] = {NULL};
/* Set: experts_case also poisons its scratch with NaN (padded rows nobody fills must never reach
 * an output) and runs every backend twice (the two outputs must be bit-identical). */
static int g_experts_strict = 0;

/* A CUDA backend created with `var` = `val` (NULL on failure, reported). */
/* Runs moe_experts on g_gpu (output poisoned first; with g_experts_strict the scratch too, and
 * a second run that must give the same bits) and returns the output as floats. */
static float *experts_run(const char *what, void *dout, const void *dx, const int32_t *di, const float *dw, int k,
                          const di_weight *gu, const di_weight *dn, int T, int D, void *ds, size_t sg) {
    uint16_t *first = NULL;
    for (int rep = 0; rep < (g_experts_strict ? 2 : 1); rep++) {
        g_poison(dout, (size_t)T * D * 2);
        if (g_experts_strict) g_poison(ds, sg);
        g_gpu->moe_experts(g_gpu, dout, dx, di, dw, k, gu, dn, T, ds, sg);
        if (g_experts_strict && rep == 0) {
            first = (uint16_t *)malloc((size_t)T * D * 2);
            CHECK_OK(g_gpu->download(g_gpu, first, dout, (size_t)T * D * 2));
        }
    }
    float *got = g_get_act(dout, (size_t)T * D);
    if (first) {
        uint16_t *second = (uint16_t *)malloc((size_t)T * D * 2);
        CHECK_OK(g_gpu->download(g_gpu, second, dout, (size_t)T * D * 2));
        CHECK_MSG(memcmp(first, second, (size_t)T * D * 2) == 0, "%s: two runs differ", what);
        free(second);
        free(first);
    }
    return got;
}

/* Routed experts of T tokens; tokens pick among the first e_route experts only (e_route < E
 * leaves experts without tokens). */
static void experts_case_r(const char *name, int E, int e_route, int k, int D, int I, int T, int fp8) {
    t_weight gu = t_weight_make(E, 2 * I, D, fp8, 0.05f), dn = t_weight_make(E, D, I, fp8, 0.05f);
    di_weight guc = t_weight_upload(g_cpu, &gu, DI_WEIGHT_PLAIN), gug = t_weight_upload(g_gpu, &gu, DI_WEIGHT_PLAIN);
    di_weight dnc = t_weight_upload(g_cpu, &dn, DI_WEIGHT_PLAIN), dng = t_weight_upload(g_gpu, &dn, DI_WEIGHT_PLAIN);
    CHECK_MSG(!fp8 || (gug.dtype == DI_DTYPE_F8_E4M3 && dng.dtype == DI_DTYPE_F8_E4M3), "%s: fp8 experts not kept fp8", name);
    float *x = t_rand((size_t)T * D, 1.0f), *w = (float *)malloc((size_t)T * k * 4);
    int32_t *idx = (int32_t *)malloc((size_t)T * k * 4);
    random_topk(idx, w, T, k, e_route, 4); /* skewed toward low ids */
    size_t sc = g_cpu->moe_scratch_bytes(g_cpu, T, k, D, I, E), sg = g_gpu->moe_scratch_bytes(g_gpu, T, k, D, I, E);
    void *hs = malloc(sc), *ds = g_alloc(sg);
    float *ref = (float *)malloc((size_t)T * D * 4);
    g_cpu->moe_experts(g_cpu, ref, x, idx, w, k, &guc, &dnc, T, hs, sc);
    void *dx = g_act(x, (size_t)T * D), *di = g_raw(idx, (size_t)T * k * 4), *dw = g_raw(w, (size_t)T * k * 4);
    void *dout = g_alloc((size_t)T * D * 2);
    char what[160];
    snprintf(what, sizeof what, "moe_experts %s E%d k%d D%d I%d T%d%s", name, E, k, D, I, T, fp8 ? " fp8" : "");
    if (e_route < E) snprintf(what + strlen(what), sizeof what - strlen(what), " (experts < %d)", e_route);
    float *got = experts_run(what, dout, dx, (const int32_t *)di, (const float *)dw, k, &gug, &dng, T, D, ds, sg);
    T_CHECK(what, got, ref, (size_t)T * D, TOL_L2, TOL_MAX);
    size_t base_len = strlen(what);
    for (int a = 0; a < 3 && g_gpu_alt[a]; a++) { /* the same inputs through the other backends' kernels */
        di_backend *save = g_gpu;
        g_gpu = g_gpu_alt[a];
        di_weight gua = t_weight_upload(g_gpu, &gu, DI_WEIGHT_PLAIN), dna = t_weight_upload(g_gpu, &dn, DI_WEIGHT_PLAIN);
        free(got);
        if (a) snprintf(what + base_len, sizeof what - base_len, " alt%d", a + 1);
        else snprintf(what + base_len, sizeof what - base_len, " alt");
        got = experts_run(what, dout, dx, (const int32_t *)di, (const float *)dw, k, &gua, &dna, T, D, ds, sg);
        T_CHECK(what, got, ref, (size_t)T * D, TOL_L2, TOL_MAX);
        g_gpu->weight_free(g_gpu, &gua); g_gpu->weight_free(g_gpu, &dna);
        g_gpu = save;
    }
    free(x); free(w); free(idx); free(hs); free(ref); free(got);
    g_free(ds); g_free(dx); g_free(di); g_free(dw); g_free(dout);
    g_cpu->weight_free(g_cpu, &guc); g_gpu->weight_free(g_gpu, &gug);
    g_cpu->weight_free(g_cpu, &dnc); g_gpu->weight_free(g_gpu, &dng);
    t_weight_free(&gu); t_weight_free(&dn);
}

static void experts_case(const char *name, int E, int k, int D, int I, int T, int fp8) {
    experts_case_r(name, E, E, k, D, I, T, fp8);
}

/* A second small-path backend with DEEPINFER_CUDA_DOWN_EARLY=0 (k_small_down reads the ids and
 * loads its first weights after its wait): its results must be the same bits. */
static di_backend *g_small_late;

/* Routed (+ shared, Is > 0) experts of a 1-4-token step through the permutation-free path
 * (cuda_moe_small.cu): moe_experts, or moe_experts_shared against the CPU's moe_experts plus
 * the shared-expert matmuls; run twice, the two results must be bit-identical, and the same
 * bits again with k_small_down's early loads off (g_small_late). */
static void experts_small_case(const char *name, int E, int k, int D, int I, int Is, int T, int fp8) {
    t_weight gu = t_weight_make(E, 2 * I, D, fp8, 0.05f), dn = t_weight_make(E, D, I, fp8, 0.05f);
    t_weight sgu = t_weight_make(1, 2 * (Is > 0 ? Is : 8), D, fp8, 0.05f), sdn = t_weight_make(1, D, Is > 0 ? Is : 8, fp8, 0.05f);
    di_weight guc = t_weight_upload(g_cpu, &gu, DI_WEIGHT_PLAIN), gug = t_weight_upload(g_gpu, &gu, DI_WEIGHT_PLAIN);
    di_weight dnc = t_weight_upload(g_cpu, &dn, DI_WEIGHT_PLAIN), dng = t_weight_upload(g_gpu, &dn, DI_WEIGHT_PLAIN);
    di_weight sguc = t_weight_upload(g_cpu, &sgu, DI_WEIGHT_PLAIN), sgug = t_weight_upload(g_gpu, &sgu, DI_WEIGHT_PLAIN);
    di_weight sdnc = t_weight_upload(g_cpu, &sdn, DI_WEIGHT_PLAIN), sdng = t_weight_upload(g_gpu, &sdn, DI_WEIGHT_PLAIN);
    float *x = t_rand((size_t)T * D, 1.0f), *w = (float *)malloc((size_t)T * k * 4);
    int32_t *idx = (int32_t *)malloc((size_t)T * k * 4);
    random_topk(idx, w, T, k, E, 3); /* tokens often share experts */
    size_t sc = g_cpu->moe_scratch_bytes(g_cpu, T, k, D, I, E), sg = g_gpu->moe_scratch_bytes(g_gpu, T, k, D, I, E);
    void *hs = malloc(sc), *ds = g_alloc(sg);
    float *ref = (float *)malloc((size_t)T * D * 4);
    g_cpu->moe_experts(g_cpu, ref, x, idx, w, k, &guc, &dnc, T, hs, sc);
    if (Is > 0) {
        float *hgu = (float *)malloc((size_t)T * 2 * Is * 4), *hact = (float *)malloc((size_t)T * Is * 4);
        g_cpu->matmul(g_cpu, hgu, 2 * Is, x, D, &sguc, T, 0);
        g_cpu->silu_mul(g_cpu, hact, hgu, T, Is);
        g_cpu->matmul(g_cpu, ref, D, hact, Is, &sdnc, T, DI_MM_ACCUMULATE);
        free(hgu);
        free(hact);
    }
    void *dx = g_act(x, (size_t)T * D), *di = g_raw(idx, (size_t)T * k * 4), *dw = g_raw(w, (size_t)T * k * 4);
    void *dout = g_alloc((size_t)T * D * 2);
    uint16_t *first = (uint16_t *)malloc((size_t)T * D * 2), *second = (uint16_t *)malloc((size_t)T * D * 2);
    int ran = 1;
    for (int rep = 0; rep < 2; rep++) {
        g_poison(dout, (size_t)T * D * 2);
        if (Is > 0) {
            CHECK_MSG(g_gpu->moe_experts_shared != NULL, "%s: no moe_experts_shared", name);
            ran = g_gpu->moe_experts_shared && g_gpu->moe_experts_shared(g_gpu, dout, dx, di, dw, k, &gug, &dng, &sgug,
                                                                          &sdng, T, ds, sg);
            CHECK_MSG(ran, "%s: moe_experts_shared declined T=%d", name, T);
        } else {
            g_gpu->moe_experts(g_gpu, dout, dx, di, dw, k, &gug, &dng, T, ds, sg);
        }
        CHECK_OK(g_gpu->download(g_gpu, rep ? second : first, dout, (size_t)T * D * 2));
    }
    char what[160];
    snprintf(what, sizeof what, "moe small %s E%d k%d D%d I%d Is%d T%d%s", name, E, k, D, I, Is, T, fp8 ? " fp8" : "");
    if (ran) {
        float *got = g_get_act(dout, (size_t)T * D);
        T_CHECK(what, got, ref, (size_t)T * D, TOL_L2, TOL_MAX);
        CHECK_MSG(memcmp(first, second, (size_t)T * D * 2) == 0, "%s: two runs differ", what);
        free(got);
        if (g_small_late) { /* the device buffers and weights are usable from either backend */
            g_poison(dout, (size_t)T * D * 2);
            CHECK_OK(g_gpu->sync(g_gpu)); /* the poison lands before the other stream's kernels */
            int r2 = Is > 0 ? g_small_late->moe_experts_shared(g_small_late, dout, dx, di, dw, k, &gug, &dng, &sgug,
                                                                &sdng, T, ds, sg)
                            : (g_small_late->moe_experts(g_small_late, dout, dx, di, dw, k, &gug, &dng, T, ds, sg), 1);
            CHECK_OK(g_small_late->sync(g_small_late));
            CHECK_OK(g_gpu->download(g_gpu, second, dout, (size_t)T * D * 2));
            CHECK_MSG(r2 && memcmp(first, second, (size_t)T * D * 2) == 0,
                      "%s: differs with DEEPINFER_CUDA_DOWN_EARLY=0", what);
        }
    }
    free(x); free(w); free(idx); free(hs); free(ref); free(first); free(second);
    g_free(ds); g_free(dx); g_free(di); g_free(dw); g_free(dout);
    g_cpu->weight_free(g_cpu, &guc); g_gpu->weight_free(g_gpu, &gug);
    g_cpu->weight_free(g_cpu, &dnc); g_gpu->weight_free(g_gpu, &dng);
    g_cpu->weight_free(g_cpu, &sguc); g_gpu->weight_free(g_gpu, &sgug);
    g_cpu->weight_free(g_cpu, &sdnc); g_gpu->weight_free(g_gpu, &sdng);
    t_weight_free(&gu); t_weight_free(&dn); t_weight_free(&sgu); t_weight_free(&sdn);
}

/* The padded pointer-array path (16 tokens) captured in a graph and replayed: cuBLASLt zeroes a
 * counter in its workspace before the gate+up GEMM (a memset node), which graph_end folds into
 * the permutation kernel (DEEPINFER_CUDA_MOE_FOLD) or turns into a fill kernel (=0). Every replay
 * (output poisoned, other GEMMs run eagerly in between to leave the workspace dirty) must give
 * the eager run's bits on both backends. */
static void experts_graph_case(void) {
    const int E = 64, k = 6, D = 2048, I = 1408, T = 16;
    di_backend *fold = g_backend_with("DEEPINFER_CUDA_MOE_FOLD", "1"), *nofold = g_backend_with("DEEPINFER_CUDA_MOE_FOLD", "0");
    t_weight gu = t_weight_make(E, 2 * I, D, 0, 0.05f), dn = t_weight_make(E, D, I, 0, 0.05f);
    float *x = t_rand((size_t)T * D, 1.0f), *w = (float *)malloc((size_t)T * k * 4);
    int32_t *idx = (int32_t *)malloc((size_t)T * k * 4);
    random_topk(idx, w, T, k, E, 4);
    uint16_t *eager = (uint16_t *)malloc((size_t)T * D * 2), *got = (uint16_t *)malloc((size_t)T * D * 2);
    di_backend *bes[2] = {fold, nofold};
    for (int b = 0; b < 2 && fold && nofold; b++) {
        di_backend *be = bes[b], *save = g_gpu;
        g_gpu = be; /* g_act / g_raw / g_alloc allocate on g_gpu */
        di_weight gug = t_weight_upload(be, &gu, DI_WEIGHT_PLAIN), dng = t_weight_upload(be, &dn, DI_WEIGHT_PLAIN);
        size_t sg = be->moe_scratch_bytes(be, T, k, D, I, E);
        void *ds = g_alloc(sg), *dx = g_act(x, (size_t)T * D), *di = g_raw(idx, (size_t)T * k * 4);
        void *dw = g_raw(w, (size_t)T * k * 4), *dout = g_alloc((size_t)T * D * 2), *graph = NULL;
        be->moe_experts(be, dout, dx, (const int32_t *)di, (const float *)dw, k, &gug, &dng, T, ds, sg);
        CHECK_OK(be->download(be, b ? got : eager, dout, (size_t)T * D * 2));
        if (b) CHECK_MSG(memcmp(eager, got, (size_t)T * D * 2) == 0, "experts graph: eager runs differ by MOE_FOLD");
        CHECK_OK(be->graph_begin(be));
        be->moe_experts(be, dout, dx, (const int32_t *)di, (const float *)dw, k, &gug, &dng, T, ds, sg);
        CHECK_OK(be->graph_end(be, &graph));
        CHECK(graph != NULL);
        for (int rep = 0; rep < 3 && graph; rep++) {
            g_poison(dout, (size_t)T * D * 2);
            be->moe_experts(be, dout, dx, (const int32_t *)di, (const float *)dw, k, &gug, &dng, T, ds, sg);
            g_poison(dout, (size_t)T * D * 2);
            CHECK_OK(be->graph_launch(be, graph));
            CHECK_OK(be->download(be, got, dout, (size_t)T * D * 2));
            CHECK_MSG(memcmp(eager, got, (size_t)T * D * 2) == 0, "experts graph (MOE_FOLD=%d): replay %d differs from the eager run",
                      1 - b, rep);
        }
        if (graph) be->graph_free(be, graph);
        g_free(ds); g_free(dx); g_free(di); g_free(dw); g_free(dout);
        be->weight_free(be, &gug); be->weight_free(be, &dng);
        g_gpu = save;
    }
    printf("  experts T=%d in a graph, memset folded / as a fill kernel: 3 replays each equal the eager bits\n", T);
    free(x); free(w); free(idx); free(eager); free(got);
    t_weight_free(&gu); t_weight_free(&dn);
    if (fold) di_backend_free(fold);
    if (nofold) di_backend_free(nofold);
}

/* moe_experts_defer + add_rmsnorm_experts (the combine inside the next add + RMSNorm) against
 * moe_experts + add_rmsnorm, bit for bit (h, out and out_f32), on the same inputs: T tokens
 * over the first e_route of E experts. misalign: out 2 bytes off an 8-byte boundary, so both
 * sides take the generic norm kernel (the deferred one after the combine kernel into spare
 * scratch rows). Where the backend declines (T outside the padded path), that is checked too. */
static void experts_defer_case(int E, int e_route, int k, int D, int I, int T, int misalign) {
    t_weight gu = t_weight_make(E, 2 * I, D, 0, 0.05f), dn = t_weight_make(E, D, I, 0, 0.05f);
    di_weight gug = t_weight_upload(g_gpu, &gu, DI_WEIGHT_PLAIN), dng = t_weight_upload(g_gpu, &dn, DI_WEIGHT_PLAIN);
    float *x = t_rand((size_t)T * D, 1.0f), *w = (float *)malloc((size_t)T * k * 4);
    float *h0 = t_rand_f32((size_t)T * D, 2.0f), *nw = t_rand_f32((size_t)D, 1.0f);
    int32_t *idx = (int32_t *)malloc((size_t)T * k * 4);
    random_topk(idx, w, T, k, e_route, 4);
    di_weight wn = t_vec_upload(g_gpu, nw, D);
    size_t sg = g_gpu->moe_scratch_bytes(g_gpu, T, k, D, I, E);
    void *ds = g_alloc(sg), *dx = g_act(x, (size_t)T * D), *di = g_raw(idx, (size_t)T * k * 4);
    void *dw = g_raw(w, (size_t)T * k * 4), *dtmp = g_alloc((size_t)T * D * 2), *dh = g_alloc((size_t)T * D * 4);
    void *dout = g_alloc((size_t)T * D * 2 + 16), *dof = g_alloc((size_t)T * D * 4);
    void *out = (char *)dout + (misalign ? 2 : 0);
    float *res[2][2];
    uint16_t *outs[2];
    int deferred = 0;
    for (int v = 0; v < 2; v++) {
        g_gpu->upload(g_gpu, dh, h0, (size_t)T * D * 4);
        g_poison(ds, sg);
        g_poison(dout, (size_t)T * D * 2 + 16);
        g_poison(dof, (size_t)T * D * 4);
        if (v == 0) {
            g_gpu->moe_experts(g_gpu, dtmp, dx, (const int32_t *)di, (const float *)dw, k, &gug, &dng, T, ds, sg);
            g_gpu->add_rmsnorm(g_gpu, (float *)dh, dtmp, out, (float *)dof, &wn, 1e-6f, T, D);
        } else {
            deferred = g_gpu->moe_experts_defer(g_gpu, dx, (const int32_t *)di, (const float *)dw, k, &gug, &dng, T,
                                                ds, sg);
            if (deferred)
                g_gpu->add_rmsnorm_experts(g_gpu, (float *)dh, ds, (const float *)dw, k, out, (float *)dof, &wn,
                                           1e-6f, T, D);
        }
        res[v][0] = g_get_f32(dh, (size_t)T * D);
        res[v][1] = g_get_f32(dof, (size_t)T * D);
        outs[v] = (uint16_t *)malloc((size_t)T * D * 2);
        CHECK_OK(g_gpu->download(g_gpu, outs[v], out, (size_t)T * D * 2));
    }
    int want = T >= 16 && T <= 128;
    CHECK_MSG(deferred == want, "moe_experts_defer T=%d D=%d: returned %d, expected %d", T, D, deferred, want);
    if (deferred) {
        CHECK_MSG(memcmp(res[0][0], res[1][0], (size_t)T * D * 4) == 0, "deferred combine T=%d D=%d: h differs", T, D);
        CHECK_MSG(memcmp(res[0][1], res[1][1], (size_t)T * D * 4) == 0, "deferred combine T=%d D=%d: out_f32 differs", T, D);
        CHECK_MSG(memcmp(outs[0], outs[1], (size_t)T * D * 2) == 0, "deferred combine T=%d D=%d: out differs", T, D);
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)T * D; i++) bad += !isfinite(res[1][0][i]) || res[1][0][i] == h0[i];
        CHECK_MSG(bad < (size_t)T * D / 100, "deferred combine T=%d: %zu of h unchanged or not finite", T, bad);
    }
    printf("  moe_experts_defer E%d (routed to %d) k%d D%d I%d T%d%s: %s\n", E, e_route, k, D, I, T,
           misalign ? " (out misaligned)" : "", deferred ? "same bits as moe_experts + add_rmsnorm" : "declined");
    for (int v = 0; v < 2; v++) { free(res[v][0]); free(res[v][1]); free(outs[v]); }
    free(x); free(w); free(h0); free(nw); free(idx);
    g_free(ds); g_free(dx); g_free(di); g_free(dw); g_free(dtmp); g_free(dh); g_free(dout); g_free(dof);
    g_gpu->weight_free(g_gpu, &gug); g_gpu->weight_free(g_gpu, &dng); g_gpu->weight_free(g_gpu, &wn);
    t_weight_free(&gu); t_weight_free(&dn);
}

static void test_defer(void) {
    CHECK_MSG(g_gpu->moe_experts_defer && g_gpu->add_rmsnorm_experts, "no moe_experts_defer / add_rmsnorm_experts");
    if (!g_gpu->moe_experts_defer || !g_gpu->add_rmsnorm_experts) return;
    experts_defer_case(64, 64, 6, 2048, 1408, 16, 0);
    experts_defer_case(64, 64, 6, 2048, 1408, 16, 1);
    experts_defer_case(64, 8, 6, 2048, 1408, 33, 0);
    experts_defer_case(64, 64, 6, 2048, 1408, 128, 0);
    experts_defer_case(12, 5, 3, 136, 40, 23, 0);
    experts_defer_case(12, 12, 8, 128, 40, 17, 1);
    experts_defer_case(8, 8, 8, 7168, 64, 16, 0); /* V3's hidden size: 896 threads per row */
    experts_defer_case(64, 64, 6, 2048, 1408, 8, 0);   /* below the padded path: declined */
    experts_defer_case(64, 64, 6, 2048, 1408, 129, 0); /* above it: declined */
}

static void test_small(void) {
    /* 1-4 tokens: permutation-free small path, routed only and fused with the shared experts
     * (enabled up to 4 tokens here; the default dispatch takes it at one token only) */
    setenv("DEEPINFER_CUDA_MOE_SMALL", "4", 1);
    di_backend *small = NULL, *save = g_gpu;
    CHECK_OK(di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &small));
    g_small_late = g_backend_with("DEEPINFER_CUDA_DOWN_EARLY", "0"); /* with MOE_SMALL=4 too */
    unsetenv("DEEPINFER_CUDA_MOE_SMALL");
    if (!small) return;
    g_gpu = small;
    for (int T = 1; T <= 4; T++) { /* V2-Lite's matrix shapes; 16 of its 64 experts (test time) */
        experts_small_case("v2-lite", 16, 6, 2048, 1408, 0, T, 0);
        experts_small_case("v2-lite+shared", 16, 6, 2048, 1408, 2816, T, 0);
    }
    experts_small_case("v2-lite 64+shared", 64, 6, 2048, 1408, 2816, 1, 0);
    experts_small_case("v3 fp8+shared", 9, 8, 7168, 2048, 2048, 4, 1);
    experts_small_case("fp8+shared", 16, 8, 1024, 512, 512, 1, 1);
    experts_small_case("fp8", 8, 2, 512, 256, 0, 3, 1);
    experts_small_case("tiny+shared", 12, 3, 136, 40, 24, 2, 0);
    experts_small_case("tiny k8", 12, 8, 128, 40, 0, 4, 0);
    /* one token (the default small path) at shapes whose columns do not fill a block's pieces */
    experts_small_case("tiny+shared", 12, 3, 136, 40, 24, 1, 0);
    experts_small_case("tiny k8", 12, 8, 128, 40, 0, 1, 0);
    experts_small_case("v3 bf16+shared", 9, 8, 7168, 2048, 2048, 1, 0);
    experts_small_case("v3 fp8+shared", 9, 8, 7168, 2048, 2048, 1, 1);
    /* fp8 pieces of 8 columns (D not a multiple of 16; 8-column scale blocks), and scale blocks
     * of 6 rows, which the 4 gate/up rows and 8 down rows of a block straddle (a scale per row) */
    experts_small_case("tiny fp8+shared", 12, 3, 136, 40, 24, 1, 1);
    experts_small_case("tiny fp8+shared", 12, 3, 136, 40, 24, 2, 1);
    t_fp8_bc = 8;
    experts_small_case("fp8+shared bc8", 16, 8, 1024, 512, 512, 1, 1);
    t_fp8_br = 6;
    t_fp8_bc = 16;
    experts_small_case("fp8+shared br6", 16, 8, 1024, 512, 512, 1, 1);
    experts_small_case("fp8 br6", 8, 2, 512, 256, 0, 3, 1);
    t_fp8_br = t_fp8_bc = 128;
    g_gpu = save;
    di_backend_free(small);
    if (g_small_late) di_backend_free(g_small_late);
    g_small_late = NULL;
}

static void test_experts(void) {

    /* 1: GEMV; 16..128: cuBLASLt batched (padded per expert); 129: the small-M grouped kernel
     * (12 rows per expert on average); 300, 1200: the wgmma kernel (>= 16 on average) */
    const int Ts[] = {1, 64, 129, 300, 1200};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) experts_case("v2-lite", 64, 6, 2048, 1408, Ts[i], 0);
    di_backend *save = g_gpu;
    /* 16..128 tokens: cuBLASLt batches padded to T rows per expert, through pointer arrays over
     * min(E, T*k) slots (DEEPINFER_CUDA_MOE_LT=2) and, on the same inputs, strided over all E
     * experts (=1) and pointer arrays with the spare slots last (=4, "alt2"), and pointer arrays
     * over gathered token rows (DEEPINFER_CUDA_MOE_DIRECT=0, "alt3"; the others read x in place
     * where cuBLASLt takes it); scratch poisoned,
     * each run twice. Odd T, T = 128, only 8 / 5 experts with tokens (most slots spare), T*k < E
     * (48 slots for 64 experts, <= 40 with tokens), tiny dims. Then 8 tokens through pointer
     * arrays (=3) and, on the same inputs, the default (grouped) path. */
    di_backend *ptr = g_backend_with("DEEPINFER_CUDA_MOE_LT", "2");
    di_backend *strided = g_backend_with("DEEPINFER_CUDA_MOE_LT", "1");
    di_backend *ptr8 = g_backend_with("DEEPINFER_CUDA_MOE_LT", "3");
    di_backend *ptrend = g_backend_with("DEEPINFER_CUDA_MOE_LT", "4");
    di_backend *gathered = g_backend_with("DEEPINFER_CUDA_MOE_DIRECT", "0");
    if (ptr && strided && ptr8 && ptrend && gathered) {
        g_experts_strict = 1;
        g_gpu = ptr;
        g_gpu_alt[0] = strided;
        g_gpu_alt[1] = ptrend;
        g_gpu_alt[2] = gathered;
        experts_case("v2-lite ptr", 64, 6, 2048, 1408, 16, 0);
        experts_case("v2-lite ptr", 64, 6, 2048, 1408, 17, 0);
        experts_case("v2-lite ptr", 64, 6, 2048, 1408, 128, 0);
        experts_case_r("v2-lite ptr", 64, 8, 6, 2048, 1408, 16, 0);
        experts_case_r("v2-lite ptr k3", 64, 40, 3, 2048, 1408, 16, 0);
        experts_case("tiny ptr", 12, 3, 128, 40, 50, 0);
        experts_case_r("odd ptr", 12, 5, 3, 136, 40, 23, 0);
        g_gpu = ptr8;
        g_gpu_alt[0] = save;
        g_gpu_alt[1] = NULL;
        g_gpu_alt[2] = NULL;
        experts_case("v2-lite ptr", 64, 6, 2048, 1408, 8, 0);
        experts_case_r("v2-lite ptr", 64, 10, 6, 2048, 1408, 8, 0);
        g_gpu_alt[0] = NULL;
        g_gpu = save;
        g_experts_strict = 0;
    }
    if (ptr) di_backend_free(ptr);
    if (strided) di_backend_free(strided);
    if (ptr8) di_backend_free(ptr8);
    if (ptrend) di_backend_free(ptrend);
    if (gathered) di_backend_free(gathered);
    experts_graph_case();
    /* the same sizes through our grouped kernels (DEEPINFER_CUDA_MOE_LT=0) */
    di_backend *nolt = g_backend_with("DEEPINFER_CUDA_MOE_LT", "0");
    if (nolt) {
        g_gpu = nolt;
        experts_case("v2-lite no-lt", 64, 6, 2048, 1408, 16, 0);
        experts_case("v2-lite no-lt", 64, 6, 2048, 1408, 64, 0);
        g_gpu = save;
        di_backend_free(nolt);
    }
    /* 1-4 tokens through the permuted GEMV path (DEEPINFER_CUDA_MOE_SMALL=0) */
    di_backend *nosmall = g_backend_with("DEEPINFER_CUDA_MOE_SMALL", "0");
    if (nosmall) {
        g_gpu = nosmall;
        experts_case("v2-lite no-small", 64, 6, 2048, 1408, 1, 0);
        experts_case("v2-lite no-small", 64, 6, 2048, 1408, 4, 0);
        g_gpu = save;
        di_backend_free(nosmall);
    }
    /* >= DEEPINFER_CUDA_WGMMA_MIN_ROWS (16) rows per expert on average: BM = 128 or 64 tile table,
     * bf16 -> the wgmma kernel (cuda_gemm_wgmma.cu); each case also through the mma.sync tiled kernel
     * (DEEPINFER_CUDA_WGMMA=0). A decode batch of 256 (24 rows per expert: most of each 128-row
     * tile empty), 180 tokens over 40 experts (27 each), 1024+ tokens; partial tiles in M, N and
     * K (D 328 / I 200: K not a multiple of 64, N not of 256 / 128), experts without tokens
     * (only the first 40 / 5 picked). By default the cases of at most 32 rows per expert take
     * 64-row tiles (DEEPINFER_CUDA_WGMMA_BM64_MAX); each case also runs with 64-row tiles for
     * every average (one or several tiles per expert, partial tiles: the 5-stage ring and the
     * warpgroups splitting N) and with 128-row tiles for every average (=0). */
    di_backend *nowg = g_backend_with("DEEPINFER_CUDA_WGMMA", "0");
    di_backend *bm64 = g_backend_with("DEEPINFER_CUDA_WGMMA_BM64_MAX", "9999");
    di_backend *bm128 = g_backend_with("DEEPINFER_CUDA_WGMMA_BM64_MAX", "0");
    g_gpu_alt[0] = nowg;
    g_gpu_alt[1] = bm64;
    g_gpu_alt[2] = bm128;
    experts_case("v2-lite", 64, 6, 2048, 1408, 256, 0);
    experts_case_r("v2-lite", 64, 40, 6, 2048, 1408, 180, 0);
    experts_case("v2-lite", 64, 6, 2048, 1408, 1024, 0);
    experts_case_r("v2-lite", 64, 40, 6, 2048, 1408, 1100, 0);
    experts_case("odd", 8, 2, 328, 200, 600, 0);
    experts_case_r("odd", 8, 5, 3, 328, 200, 777, 0);
    experts_case("fp8", 8, 2, 512, 256, 700, 1);
    g_gpu_alt[0] = g_gpu_alt[1] = g_gpu_alt[2] = NULL;
    if (nowg) di_backend_free(nowg);
    if (bm64) di_backend_free(bm64);
    if (bm128) di_backend_free(bm128);
    experts_case("fp8", 8, 2, 512, 256, 3, 1);
    experts_case("fp8", 8, 2, 512, 256, 500, 1);
    experts_case("tiny", 12, 3, 128, 40, 1, 0);
    experts_case("tiny", 12, 3, 128, 40, 50, 0);
    experts_case("generic", 4, 2, 36, 20, 17, 0);
}

/* ---------------------------------------------------------------- sampling ---- */

/* n rows of V logits sampled on `be` with the given parameters (fresh seeds and positions per
 * repetition), each compared with the CPU sampler: same token, or both refuse. */
static void sample_case(di_backend *be, const char *what, const float *lg, int n, int V, di_sample_row *rows, int reps) {
    di_sampler *smp = NULL;
    CHECK_OK(di_sampler_create(V, &smp));
    if (!smp) return;
    di_backend *save = g_gpu;
    g_gpu = be;
    float *dl = (float *)g_raw(lg, (size_t)n * V * 4);
    void *dtok = g_alloc((size_t)n * 4), *dst = g_alloc((size_t)n * 4), *drows = g_alloc(sizeof(di_sample_row) * n);
    int32_t *tok = (int32_t *)malloc((size_t)n * 4), *st = (int32_t *)malloc((size_t)n * 4);
    int same = 0, total = 0;
    for (int rep = 0; rep < reps; rep++) {
        for (int r = 0; r < n; r++) {
            rows[r].seed = t_u64();
            rows[r].position = (uint32_t)t_u64();
        }
        g_gpu->upload(g_gpu, drows, rows, sizeof(di_sample_row) * n);
        g_poison(dtok, (size_t)n * 4);
        g_poison(dst, (size_t)n * 4);
        g_gpu->sample(g_gpu, (int32_t *)dtok, (int32_t *)dst, dl, n, V, (const di_sample_row *)drows);
        g_gpu->download(g_gpu, tok, dtok, (size_t)n * 4);
        g_gpu->download(g_gpu, st, dst, (size_t)n * 4);
        for (int r = 0; r < n; r++) {
            di_sampling_params p;
            di_sampling_params_init(&p);
            p.temperature = rows[r].temperature;
            p.top_p = rows[r].top_p;
            p.top_k = rows[r].top_k;
            p.min_p = rows[r].min_p;
            di_sample_request rq = {&p, rows[r].seed, rows[r].position, rows[r].stream, 0, NULL, NULL, NULL, 0};
            int32_t want = -1;
            di_status s = di_sampler_sample(smp, lg + (size_t)r * V, &rq, &want, NULL);
            total++;
            if (s != DI_OK) {
                CHECK_MSG(st[r] != DI_SAMPLE_OK && tok[r] == -1, "%s row %d: CPU sampler fails (%s) but GPU gave %d status %d",
                          what, r, di_last_error(), tok[r], st[r]);
                same += st[r] != DI_SAMPLE_OK && tok[r] == -1;
                continue;
            }
            CHECK_MSG(st[r] == DI_SAMPLE_OK && tok[r] == want, "%s row %d rep %d: GPU token %d (status %d), CPU %d", what,
                      r, rep, tok[r], st[r], want);
            same += st[r] == DI_SAMPLE_OK && tok[r] == want;
        }
    }
    fprintf(stderr, "  sample %s V=%d: %d/%d rows identical to the CPU sampler\n", what, V, same, total);
    g_free(dl); g_free(dtok); g_free(dst); g_free(drows);
    free(tok);
    free(st);
    g_gpu = save;
    di_sampler_free(smp);
}

/* LM-like logits: ~N(0, sd) with a few tokens 8-14 above */
static void lm_row(float *row, int V, float sd) {
    for (int i = 0; i < V; i++) row[i] = sd * 0.866f * (t_unif(1.0f) + t_unif(1.0f) + t_unif(1.0f) + t_unif(1.0f));
    for (int j = 0; j < 8; j++) row[t_int(V)] = 8.0f + (float)t_int(600) / 100.0f;
}

/* every case on the default (greedy rows on their own kernel, the others on 8-block clusters
 * at these batch sizes), on the one-block kernel, on 4-block clusters and with the greedy rows
 * left to the cluster kernel */
enum { N_SMP_ALT = 3 };
static di_backend *g_smp_alt[N_SMP_ALT];
static void sample_both(const char *what, const float *lg, int n, int V, di_sample_row *rows, int reps) {
    static const char *alt[N_SMP_ALT] = {"one block", "4-block clusters", "greedy in the cluster kernel"};
    char tag[96];
    sample_case(g_gpu, what, lg, n, V, rows, reps);
    for (int a = 0; a < N_SMP_ALT; a++) {
        snprintf(tag, sizeof tag, "%s [%s]", what, alt[a]);
        if (g_smp_alt[a]) sample_case(g_smp_alt[a], tag, lg, n, V, rows, reps);
    }
}

static void test_sample(void) {
    static const char *var[N_SMP_ALT] = {"DEEPINFER_CUDA_SAMPLE_CLUSTER", "DEEPINFER_CUDA_SAMPLE_CLUSTER",
                                         "DEEPINFER_CUDA_SAMPLE_GREEDY"};
    static const char *val[N_SMP_ALT] = {"0", "4", "0"};
    for (int a = 0; a < N_SMP_ALT; a++) g_smp_alt[a] = g_backend_with(var[a], val[a]);
    /* 1. uniform rows with exact ties, a clear winner, -inf masks, all -inf, a NaN */
    int V = 129280, n = 14;
    float *lg = (float *)malloc((size_t)16 * 163840 * 4);
    for (int r = 0; r < n; r++) {
        float *row = lg + (size_t)r * V;
        float sharp = 1.0f + (float)(r % 4) * 3.0f;
        for (int i = 0; i < V; i++) row[i] = t_unif(sharp);
        for (int i = 0; i < 64; i++) row[t_int(V)] = row[t_int(V)]; /* exact ties */
        row[t_int(V)] = sharp * 1.5f;                              /* a clear winner */
        if (r % 3 == 1)
            for (int i = 0; i < V / 3; i++) row[t_int(V)] = -INFINITY;
    }
    float *bad = lg + (size_t)(n - 1) * V, *masked = lg + (size_t)(n - 2) * V;
    bad[77] = NAN;
    for (int i = 0; i < V; i++) masked[i] = -INFINITY;
    di_sample_row rows[16] = {
        {0.0f, 1.0f, 0.0f, 0, 1, 5, 0},         /* greedy */
        {1.0f, 1.0f, 0.0f, 0, 2, 6, 0},         /* plain */
        {0.7f, 1.0f, 0.0f, 0, 3, 7, 1},         /* temperature */
        {1.0f, 1.0f, 0.0f, 1, 4, 8, 0},         /* top-1 */
        {0.9f, 1.0f, 0.0f, 50, 5, 9, 2},        /* top-k */
        {1.0f, 0.9f, 0.0f, 50, 6, 10, 0},       /* top-k + top-p */
        {1.0f, 0.9f, 0.0f, 0, 7, 11, 0},        /* top-p */
        {0.8f, 0.5f, 0.05f, 0, 8, 12, 3},       /* top-p + min-p */
        {1.0f, 1.0f, 0.1f, 0, 9, 13, 0},        /* min-p */
        {1.3f, 0.95f, 0.01f, 1000, 10, 14, 0},  /* all */
        {1.0f, 0.001f, 0.0f, 0, 11, 15, 0},     /* tiny top-p: first token only */
        {2.0f, 1.0f, 0.0f, 100000, 12, 16, 0},  /* large k */
        {1.0f, 1.0f, 0.0f, 0, 13, 17, 0},       /* all -inf: masked */
        {1.0f, 1.0f, 0.0f, 0, 14, 18, 0},       /* NaN */
    };
    sample_both("uniform", lg, n, V, rows, 8);
    /* the same rows greedy (the masked and NaN rows too), with a +inf in one */
    lg[(size_t)3 * V + 1234] = INFINITY;
    for (int r = 0; r < n; r++) rows[r].temperature = r % 2 ? 0.0f : 1e-6f;
    sample_both("uniform greedy", lg, n, V, rows, 2);

    /* 2. LM-like rows: the top-p cut and the k-th key inside the dense part */
    di_sample_row lm[8] = {
        {0.8f, 0.95f, 0.0f, 0, 0, 0, 0},   {0.7f, 1.0f, 0.0f, 50, 0, 0, 1},   {1.0f, 0.5f, 0.0f, 0, 0, 0, 2},
        {1.0f, 0.99f, 0.0f, 1000, 0, 0, 3}, {1.0f, 1.0f, 0.02f, 0, 0, 0, 4},  {1.5f, 0.999f, 0.0f, 0, 0, 0, 5},
        {3.0f, 0.9f, 0.0f, 20000, 0, 0, 6}, {0.6f, 0.9f, 0.05f, 40, 0, 0, 7},
    };
    for (int r = 0; r < 8; r++) lm_row(lg + (size_t)r * V, V, 1.0f + (float)r * 0.5f);
    sample_both("lm-like", lg, 8, V, lm, 6);

    /* 3. exact ties at the cut: every logit equal (the top-k / top-p keys decided by id alone),
     * and 3000 copies of one value around the k-th / the cut, in a 5000-token vocabulary */
    V = 5000;
    for (int i = 0; i < V; i++) lg[i] = 0.25f;
    for (int r = 1; r < 6; r++) {
        float *row = lg + (size_t)r * V;
        for (int i = 0; i < V; i++) row[i] = t_unif(4.0f);
        for (int i = 0; i < 3000; i++) row[t_int(V)] = 1.0f;
    }
    for (int r = 6; r < 12; r++) memcpy(lg + (size_t)r * V, lg, (size_t)V * 4);
    di_sample_row ties[12] = {
        {1.0f, 1.0f, 0.0f, 7, 0, 0, 0},    {1.0f, 1.0f, 0.0f, 1500, 0, 0, 0}, {1.0f, 0.3f, 0.0f, 0, 0, 0, 0},
        {1.0f, 0.97f, 0.0f, 0, 0, 0, 0},   {1.0f, 0.6f, 0.0f, 2000, 0, 0, 0}, {0.5f, 1.0f, 0.0f, 400, 0, 0, 0},
        {1.0f, 1.0f, 0.0f, 3, 0, 0, 0},    {1.0f, 0.3f, 0.0f, 0, 0, 0, 0},    {1.0f, 0.0001f, 0.0f, 0, 0, 0, 0},
        {1.0f, 1.0f, 0.0f, 4999, 0, 0, 0}, {1.0f, 0.5f, 0.0f, 2500, 0, 0, 0}, {0.0f, 1.0f, 0.0f, 0, 0, 0, 0},
    };
    sample_both("ties", lg, 12, V, ties, 4);
    /* signed zeros: -0 and +0 tie (the CPU compares values), the cut falls inside them */
    for (int r = 0; r < 4; r++) {
        float *row = lg + (size_t)r * V;
        for (int i = 0; i < V; i++) row[i] = (i + r) % 2 ? 0.0f : -0.0f;
        for (int i = 0; i < 20; i++) row[t_int(V)] = 1.0f + (float)t_int(100) / 50.0f;
    }
    di_sample_row zeros[4] = {
        {1.0f, 1.0f, 0.0f, 100, 0, 0, 0}, {1.0f, 0.5f, 0.0f, 0, 0, 0, 0},
        {0.5f, 0.9f, 0.0f, 2000, 0, 0, 0}, {0.0f, 1.0f, 0.0f, 0, 0, 0, 0},
    };
    sample_both("signed zeros", lg, 4, V, zeros, 4);

    /* 4. vocabularies that leave blocks of the cluster empty or partly filled, and Kimi-K2's */
    const int Vs[5] = {1, 7, 100, 32001, 163840};
    for (int v = 0; v < 5; v++) {
        V = Vs[v];
        for (int r = 0; r < 6; r++) lm_row(lg + (size_t)r * V, V, 2.0f);
        di_sample_row sm[6] = {
            {0.0f, 1.0f, 0.0f, 0, 0, 0, 0},  {0.8f, 0.95f, 0.0f, 0, 0, 0, 1}, {0.7f, 1.0f, 0.0f, 5, 0, 0, 2},
            {1.0f, 0.9f, 0.05f, 40, 0, 0, 3}, {1.0f, 1.0f, 0.0f, 0, 0, 0, 4},  {1.2f, 0.5f, 0.0f, 3, 0, 0, 5},
        };
        char tag[32];
        snprintf(tag, sizeof tag, "vocab %d", V);
        sample_both(tag, lg, 6, V, sm, 3);
    }
    /* 5. a batch of 40 rows: 4-block clusters by default (more rows than 8-block clusters fit) */
    V = 129280;
    di_sample_row big[40];
    for (int r = 0; r < 40; r++) {
        lm_row(lg + (size_t)(r % 16) * V, V, 1.5f + (float)(r % 5) * 0.5f);
        big[r] = lm[r % 8];
        if (r % 10 == 9) big[r].temperature = 0.0f; /* greedy rows mixed in */
    }
    float *lg40 = (float *)malloc((size_t)40 * V * 4);
    for (int r = 0; r < 40; r++) memcpy(lg40 + (size_t)r * V, lg + (size_t)(r % 16) * V, (size_t)V * 4);
    sample_case(g_gpu, "batch of 40", lg40, 40, V, big, 2);
    /* 40 greedy rows (a batch of greedy requests), with exact ties for the maximum */
    for (int r = 0; r < 40; r++) {
        big[r].temperature = 0.0f;
        float *row = lg40 + (size_t)r * V;
        if (r % 4 == 1) row[t_int(V)] = row[t_int(V)] = row[t_int(V)] = 20.0f;
    }
    sample_both("batch of 40 greedy", lg40, 40, V, big, 1);
    free(lg40);
    free(lg);
    for (int a = 0; a < N_SMP_ALT; a++)
        if (g_smp_alt[a]) di_backend_free(g_smp_alt[a]);
}

/* ---------------------------------------------------------------- V3.2 indexer / sparse MLA ---- */

static void layernorm_case(const char *name, int T, int D, int ld) {
    float *x = t_rand((size_t)T * ld, 2.0f), *w = t_rand_f32((size_t)D, 1.0f), *b = t_rand_f32((size_t)D, 0.5f);
    for (int t = 0; t < T; t++) /* rows with an offset, so the mean matters */
        for (int i = 0; i < D; i++) x[(size_t)t * ld + i] = di_bf16_to_f32(di_f32_to_bf16(x[(size_t)t * ld + i] + 1.5f));
    di_weight wc = t_vec_upload(g_cpu, w, D), bc = t_vec_upload(g_cpu, b, D);
    di_weight wg = t_vec_upload(g_gpu, w, D), bg = t_vec_upload(g_gpu, b, D);
    float *ref = (float *)malloc((size_t)T * ld * 4);
    memcpy(ref, x, (size_t)T * ld * 4);
    g_cpu->layernorm(g_cpu, ref, ld, ref, ld, &wc, &bc, 1e-6f, T, D); /* in place, as the model */
    void *dx = g_act(x, (size_t)T * ld), *dout = g_alloc((size_t)T * D * 2);
    g_poison(dout, (size_t)T * D * 2);
    g_gpu->layernorm(g_gpu, dout, D, dx, ld, &wg, &bg, 1e-6f, T, D);  /* out of place, contiguous out */
    g_gpu->layernorm(g_gpu, dx, ld, dx, ld, &wg, &bg, 1e-6f, T, D);   /* in place, strided */
    float *got = g_get_act(dout, (size_t)T * D), *got2 = g_get_act(dx, (size_t)T * ld);
    float *r2 = (float *)malloc((size_t)T * D * 4), *g2 = (float *)malloc((size_t)T * D * 4);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D; i++) {
            r2[(size_t)t * D + i] = ref[(size_t)t * ld + i];
            g2[(size_t)t * D + i] = got2[(size_t)t * ld + i];
        }
    char what[160];
    snprintf(what, sizeof what, "layernorm %s T%d D%d", name, T, D);
    T_CHECK(what, got, r2, (size_t)T * D, TOL_L2, TOL_MAX);
    snprintf(what, sizeof what, "layernorm %s T%d D%d in place ld %d", name, T, D, ld);
    T_CHECK(what, g2, r2, (size_t)T * D, TOL_L2, TOL_MAX);
    int rest_ok = 1; /* columns past D of the strided rows untouched */
    for (int t = 0; t < T; t++)
        for (int i = D; i < ld; i++) rest_ok &= got2[(size_t)t * ld + i] == x[(size_t)t * ld + i];
    CHECK_MSG(rest_ok, "%s: wrote past D", what);
    free(x); free(w); free(b); free(ref); free(got); free(got2); free(r2); free(g2);
    g_free(dx); g_free(dout);
    g_cpu->weight_free(g_cpu, &wc); g_cpu->weight_free(g_cpu, &bc);
    g_gpu->weight_free(g_gpu, &wg); g_gpu->weight_free(g_gpu, &bg);
}


/* indexer_topk on both backends; the selections must match exactly, except positions whose
 * scores lie within 1e-5 (relative to the token's largest |score|) of the CPU's k-th score
 * (fp32 summation-order near-ties; counted and reported). */
static void indexer_case(const char *name, int S, const int *q_len, const int *ctx, di_indexer_dims d, int sb, int se) {
    int nh = d.n_heads, hd = d.head_dim, K = d.topk;
    paged p;
    paged_make(&p, S, q_len, ctx, hd);
    int T = p.T;
    float *q = t_rand((size_t)T * nh * hd, 1.0f), *w = t_rand_f32((size_t)T * nh, 1.0f);
    int32_t *cpos = (int32_t *)malloc((size_t)T * K * 4), *ccnt = (int32_t *)malloc((size_t)T * 4);
    for (int i = 0; i < T; i++) ccnt[i] = -7;
    size_t sc = g_cpu->indexer_scratch_bytes(g_cpu, T, p.hab.max_ctx_len);
    size_t sg = g_gpu->indexer_scratch_bytes(g_gpu, T, p.hab.max_ctx_len);
    void *hs = malloc(sc), *ds = g_alloc(sg);
    g_cpu->indexer_topk(g_cpu, cpos, ccnt, q, w, p.cache, &p.hab, sb, se, &d, hs, sc);
    void *dq = g_act(q, (size_t)T * nh * hd), *dw = g_raw(w, (size_t)T * nh * 4);
    int32_t *dpos = (int32_t *)g_alloc((size_t)T * K * 4), *dcnt = (int32_t *)g_alloc((size_t)T * 4);
    g_poison(dpos, (size_t)T * K * 4);
    g_poison(dcnt, (size_t)T * 4);
    g_gpu->indexer_topk(g_gpu, dpos, dcnt, dq, (const float *)dw, p.dcache, &p.dab, sb, se, &d, ds, sg);
    int32_t *gpos = (int32_t *)malloc((size_t)T * K * 4), *gcnt = (int32_t *)malloc((size_t)T * 4);
    CHECK_OK(g_gpu->download(g_gpu, gpos, dpos, (size_t)T * K * 4));
    CHECK_OK(g_gpu->download(g_gpu, gcnt, dcnt, (size_t)T * 4));
    int t0 = p.start[sb], t1 = p.start[se], exact = 0, near = 0, bad = 0, sparse = 0, untouched = 1;
    for (int t = 0; t < T; t++) {
        if (t < t0 || t >= t1) {
            untouched &= gcnt[t] == -1;
            continue;
        }
        int seq = sb;
        while (p.start[seq + 1] <= t) seq++;
        int pos = p.pos[t], n = pos + 1, want = n < K ? n : K;
        sparse += n > K;
        if (gcnt[t] != want || ccnt[t] != want) {
            bad++;
            fprintf(stderr, "    token %d: count gpu %d cpu %d, expected %d\n", t, gcnt[t], ccnt[t], want);
            continue;
        }
        const int32_t *c = cpos + (size_t)t * K, *g = gpos + (size_t)t * K;
        int sorted = 1;
        for (int i = 0; i < want; i++) sorted &= g[i] >= 0 && g[i] <= pos && (i == 0 || g[i] > g[i - 1]);
        if (!sorted) {
            bad++;
            fprintf(stderr, "    token %d: gpu selection not ascending within [0, %d]\n", t, pos);
            continue;
        }
        if (!memcmp(c, g, (size_t)want * 4)) {
            exact++;
            continue;
        }
        /* near-tie check in fp64 */
        double thr = INFINITY, mx = 0;
        for (int i = 0; i < want; i++) thr = fmin(thr, ix_score(&p, seq, q, w, t, c[i], &d));
        for (int s = 0; s < n; s++) mx = fmax(mx, fabs(ix_score(&p, seq, q, w, t, s, &d)));
        int ok = 1;
        for (int i = 0, j = 0; i < want || j < want;) { /* symmetric difference of two sorted lists */
            int a = i < want ? c[i] : 1 << 30, b = j < want ? g[j] : 1 << 30, x;
            if (a == b) { i++; j++; continue; }
            if (a < b) { x = a; i++; } else { x = b; j++; }
            ok &= fabs(ix_score(&p, seq, q, w, t, x, &d) - thr) <= 1e-5 * mx;
        }
        if (ok) near++;
        else {
            bad++;
            fprintf(stderr, "    token %d (pos %d): selections differ beyond a near-tie\n", t, pos);
        }
    }
    fprintf(stderr, "  indexer_topk %-28s nh%d hd%d k%d T%d: %d exact, %d near-tie, %d wrong (%d tokens with pos >= k)%s\n",
            name, nh, hd, K, t1 - t0, exact, near, bad, sparse, bad || !untouched ? "   FAIL" : "");
    CHECK_MSG(bad == 0, "indexer_topk %s: %d tokens wrong", name, bad);
    CHECK_MSG(untouched, "indexer_topk %s: tokens outside the sequence range were written", name);
    CHECK_MSG(near * 20 <= t1 - t0, "indexer_topk %s: too many near-ties (%d)", name, near);
    free(q); free(w); free(cpos); free(ccnt); free(gpos); free(gcnt); free(hs);
    g_free(ds); g_free(dq); g_free(dw); g_free(dpos); g_free(dcnt);
    paged_free(&p);
}


static void test_indexer(void) {
    layernorm_case("v3.2 k_norm", 7, 128, 128);
    layernorm_case("odd", 5, 45, 52);
    /* V3.2's indexer shape (64 heads x 128, top-2048): a decode token, a prefill chunk across
     * n = k (dense) to n > k, a short sequence (dense) */
    di_indexer_dims v32 = {64, 128, 2048, 0.08838834764f, 0.125f};
    int ql[3] = {1, 5, 2}, cx[3] = {3000, 2051, 40};
    indexer_case("v3.2", 3, ql, cx, v32, 0, 3);
    di_indexer_dims tiny = {4, 32, 64, 0.1767767f, 0.5f};
    int ql2[4] = {70, 1, 5, 30}, cx2[4] = {100, 200, 5, 64};
    indexer_case("tiny-v32", 4, ql2, cx2, tiny, 0, 4);
    indexer_case("tiny-v32 seqs 1..3", 4, ql2, cx2, tiny, 1, 4);
    int ql3[1] = {600}, cx3[1] = {650}; /* more tokens than one launch's scratch rows (512) */
    indexer_case("tiny-v32 600-token prefill", 1, ql3, cx3, tiny, 0, 1);
    di_indexer_dims odd = {3, 20, 7, 0.2236f, 0.57735f};
    int ql4[2] = {9, 1}, cx4[2] = {20, 9};
    indexer_case("odd dims", 2, ql4, cx4, odd, 0, 2);
    /* fast path (tensor-core scores over 128-position chunks + 1024-thread select): a decode
     * token at 32K context; a 40-token prefill chunk crossing chunk boundaries next to a
     * decode token and a short (dense) sequence, sequences 1..2 only */
    int ql5[1] = {1}, cx5[1] = {32768};
    indexer_case("v3.2 1 token ctx 32K", 1, ql5, cx5, v32, 0, 1);
    int ql6[3] = {40, 1, 3}, cx6[3] = {5000, 2300, 700};
    indexer_case("v3.2 seqs 1..2 of 3", 3, ql6, cx6, v32, 1, 3);
    indexer_case("v3.2 40-token chunk ctx 5000", 3, ql6, cx6, v32, 0, 3);

    /* sparse MLA with a given selection */
    di_mla_dims v3 = {128, 128, 64, 128, 512, 0.1352f}, v2 = {16, 128, 64, 128, 512, 0.1352f};
    int dql[4] = {1, 1, 3, 2}, dcx[4] = {3000, 100, 2050, 5};
    decode_case_sel("v3.2 shape", 4, dql, dcx, v3, 2048, 0, 4);
    /* the split-KV tensor-core kernel over the selected list: 1 token at 3000 and 32K context
     * (64 splits), 64 decode tokens with contexts 1..6112 (3 splits; many with fewer selected
     * keys than sel_stride), 160 tokens (one split), sequences 10..50 of the 64 */
    int dql1[1] = {1}, dcx1[1] = {3000}, dcx2[1] = {32768};
    decode_case_sel("v3.2 1 token ctx 3000", 1, dql1, dcx1, v3, 2048, 0, 1);
    decode_case_sel("v3.2 1 token ctx 32K", 1, dql1, dcx2, v3, 2048, 0, 1);
    int dql64[160], dcx64[160];
    for (int i = 0; i < 160; i++) {
        dql64[i] = 1;
        dcx64[i] = i < 64 ? 1 + 97 * i : 1 + (i * 37) % 300;
    }
    decode_case_sel("v3.2 64 tokens ctx 1..6112", 64, dql64, dcx64, v3, 2048, 0, 64);
    decode_case_sel("v3.2 seqs 10..50 of 64", 64, dql64, dcx64, v3, 2048, 10, 50);
    decode_case_sel("v3.2 160 tokens (1 split)", 160, dql64, dcx64, v3, 2048, 0, 160);
    int dql3[3] = {1, 2, 1}, dcx3[3] = {9000, 4000, 77}; /* two tokens of one sequence, stride 1024 */
    decode_case_sel("v3.2 k1024", 3, dql3, dcx3, v3, 1024, 0, 3);
    decode_case_sel("v2-lite seqs 1..3", 4, dql, dcx, v2, 64, 1, 3);
    /* one token of 16 heads over 79 / 128 tiles of selected keys: with
     * DEEPINFER_CUDA_SPARSE_MIN_TILES=1 (remote.sh attnsp1) more than 64 splits, so at least 2
     * tiles per split (split_tiles), which the slot table must hold */
    int dcx6[1] = {6000};
    decode_case_sel("v2-lite 1 token k2500", 1, dql1, dcx6, v2, 2500, 0, 1);
    decode_case_sel("v2-lite 1 token k4096", 1, dql1, dcx6, v2, 4096, 0, 1);
    di_mla_dims tinyd = {4, 24, 16, 20, 40, 0.25f};
    decode_case_sel("tiny-v32 dims", 4, dql, dcx, tinyd, 64, 0, 4);
    int pql[4] = {70, 5, 1, 200}, pcx[4] = {130, 5, 129, 200};
    prefill_case_sel("v2-lite", 4, pql, pcx, v2, 64, 0, 4, 0);
    prefill_case_sel("v2-lite seqs 1..2", 4, pql, pcx, v2, 64, 1, 3, 1);
    int pql2[2] = {8, 3}, pcx2[2] = {5000, 3}; /* several context windows */
    prefill_case_sel("v2-lite ctx 5000", 2, pql2, pcx2, v2, 2048, 0, 2, 0);
    prefill_case_sel("tiny-v32 dims", 4, pql, pcx, tinyd, 64, 0, 4, 0);
}

static void reserve_gpu(void) {
    di_backend_reserve r = {8192, 512, 129280, {128, 128, 64, 128, 512, 0.1f}};
    CHECK_OK(g_gpu->reserve(g_gpu, &r));
}

int main(int argc, char **argv) {
    const t_group groups[] = {{"reserve", reserve_gpu}, {"decode", test_decode}, {"prefill", test_prefill},
                              {"route", test_route},     {"experts", test_experts}, {"small", test_small},
                              {"expgraph", experts_graph_case}, {"defer", test_defer},
                              {"sample", test_sample},   {"indexer", test_indexer}};
    return t_main_first_always(argc, argv, groups, (int)(sizeof groups / sizeof groups[0]));
}
