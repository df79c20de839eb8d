/* test_cuda_f32.c - CPU vs CUDA parity of the CUDA backend's fp32 op table (DI_PRECISION_F32,
 * src/backend/cuda/cuda_f32.cu, plus the ops it shares with the bf16 table: gather_rows,
 * layernorm, indexer_topk), op by op, with TIGHT tolerances: on that table every activation
 * buffer and the KV cache are float32 and every weight is stored as f32 (bf16 / fp8 / f32 host
 * matrices converted at upload, as the CPU backend does), so both backends compute the same
 * fp32 arithmetic on identical operands and differ only in summation order.
 *
 * Owner: cuda (tests). Inputs are fresh random fp32 values each run (seed printed; DI_TEST_SEED
 * repeats one); GPU outputs are NaN-poisoned first (0xff bytes), so an unwritten output fails;
 * rows an op must leave alone (other sequences, padding columns) are checked to be untouched.
 * Activations go up with g_raw (f32 bytes) and come back with g_get_f32.
 *
 *   test_cuda_f32 [rows] [gemm] [route] [experts] [decode] [prefill] [indexer] [graph]
 *   (default: all groups; the backend's reserve() always runs first) */
#include "cuda_test_util.h"

/* Tolerances (relative, as T_CHECK computes them: ||d|| / ||ref|| and max|d| / max|ref|).
 * Both sides are fp32 with fp32 (or double) reductions; the only difference is the order of
 * the sums (the CPU's 4/8-lane vector dot products vs the GPU's sequential fmaf chains or warp
 * trees). A K-term fp32 sum carries ~sqrt(K) * 2^-24 relative noise: ~1e-6 at K = 2048, so
 * 1e-5 on the L2 metric and 1e-4 on the max metric leave an order of magnitude of margin while
 * still catching any bf16 rounding (2^-9 = 2e-3) or a dropped / doubled term. */
#define TOL32_L2 1e-5
#define TOL32_MAX 1e-4
/* Attention and the routed experts chain two or three reductions (attention: q̃·c then the
 * softmax-weighted sum of up to 300 latents, and prefill computes the CPU's naive
 * decompress-then-attend form in the weight-absorbed order, a different association of the same
 * products; experts: gate_up over D, down over I, the weighted combine over k), each adding
 * its own ~1e-6 of order noise: twice the bounds above. */
#define TOL32_ATT_L2 2e-5
#define TOL32_ATT_MAX 2e-4
/* Data movement (embed, gather_rows, kv_write, kv_copy_blocks) and the fp32 residual add
 * (one correctly rounded add per element on both sides) must be bit-exact: (0, 0). */

/* ---------------------------------------------------------------- helpers ---- */

/* weight kinds of the host matrices: all become f32 on both backends */
enum { WK_BF16 = 0, WK_FP8 = 1, WK_F32 = 2 };
static const char *const wk_name[3] = {"bf16", "fp8", "f32"};

/* n F32 host matrices [rows, cols] (contiguous in m) uploaded with `layout` */
static di_weight f32_weight_upload(di_backend *be, const float *m, int n, int rows, int cols, di_weight_layout layout) {
    di_host_matrix *hm = (di_host_matrix *)calloc((size_t)n, sizeof *hm);
    for (int i = 0; i < n; i++)
        hm[i] = (di_host_matrix){"test f32", DI_DTYPE_F32, 0, rows, cols, m + (size_t)i * rows * cols, NULL, 0, 0};
    di_weight out;
    if (be->weight_upload(be, n, 1, hm, layout, &out) != DI_OK) {
        fprintf(stderr, "weight_upload (f32) failed: %s\n", di_last_error());
        memset(&out, 0, sizeof out);
    }
    free(hm);
    return out;
}

/* One weight (n matrices of a host kind) uploaded to both backends. */
typedef struct wpair {
    int kind;
    t_weight tw;     /* bf16 / fp8 host matrices */
    float *f;        /* f32 host matrices */
    di_weight c, g;  /* CPU / GPU uploads */
} wpair;

static void wpair_make(wpair *w, int kind, int n, int rows, int cols, float amp, di_weight_layout layout) {
    memset(w, 0, sizeof *w);
    w->kind = kind;
    if (kind == WK_F32) {
        w->f = t_rand_f32((size_t)n * rows * cols, amp);
        w->c = f32_weight_upload(g_cpu, w->f, n, rows, cols, layout);
        w->g = f32_weight_upload(g_gpu, w->f, n, rows, cols, layout);
    } else {
        w->tw = t_weight_make(n, rows, cols, kind == WK_FP8, amp);
        w->c = t_weight_upload(g_cpu, &w->tw, layout);
        w->g = t_weight_upload(g_gpu, &w->tw, layout);
    }
    CHECK_MSG(w->g.dtype == DI_DTYPE_F32 && w->g.n == w->c.n && w->g.rows == w->c.rows && w->g.cols == w->c.cols,
              "%s weight %d x [%d x %d] layout %d: GPU stores dtype %d [%d x %d], CPU [%d x %d] (f32 expected)",
              wk_name[kind], n, rows, cols, (int)layout, (int)w->g.dtype, w->g.rows, w->g.cols, w->c.rows, w->c.cols);
}

static void wpair_free(wpair *w) {
    g_cpu->weight_free(g_cpu, &w->c);
    g_gpu->weight_free(g_gpu, &w->g);
    if (w->kind == WK_F32) free(w->f);
    else t_weight_free(&w->tw);
}

/* Compares tokens [t0, t1) (row values each) with the reference, and checks that every other
 * token's row is still poisoned (NaN): an op on a sequence range writes only its tokens. */
static void check_rows(const char *what, const float *got, const float *ref, int T, int t0, int t1, size_t row,
                       double tol_l2, double tol_max) {
    T_CHECK(what, got + (size_t)t0 * row, ref + (size_t)t0 * row, (size_t)(t1 - t0) * row, tol_l2, tol_max);
    size_t written = 0;
    for (int t = 0; t < T; t++)
        if (t < t0 || t >= t1)
            for (size_t j = 0; j < row; j++) written += !isnan(got[(size_t)t * row + j]);
    CHECK_MSG(written == 0, "%s: %zu values of tokens outside [%d, %d) were written", what, written, t0, t1);
}

/* ---------------------------------------------------------------- paged batches ---- */

/* A step's attention batch over a paged f32 cache (cuda_test_util.h paged_make_as), with an
 * optional sparse selection (pb_select). */
typedef struct pbatch {
    paged pg;
    int32_t *sel, *cnt, *dsel, *dcnt; /* sparse selection (pb_select) or NULL */
} pbatch;

static void pb_make(pbatch *p, int S, const int *q_len, const int *ctx, int W) {
    memset(p, 0, sizeof *p);
    paged_make_as(&p->pg, S, q_len, ctx, W, 1);
}

/* A sparse (V3.2 DSA) selection of at most K positions per token: sorted, random, always
 * position 0 and the token's own, between 2 and min(K, pos + 1) positions in all. */
static void pb_select(pbatch *p, int K) {
    p->sel = (int32_t *)malloc((size_t)p->pg.T * K * 4);
    p->cnt = (int32_t *)malloc((size_t)p->pg.T * 4);
    for (int t = 0; t < p->pg.T; t++) {
        int pos = p->pg.pos[t], n = pos + 1;
        int32_t *s = p->sel + (size_t)t * K;
        int want = n <= 2 ? n : 2 + t_int(n - 1);
        if (want > K) want = K;
        int c = 0;
        s[c++] = 0;
        int need = want - (n >= 2 ? 2 : 1); /* interior positions [1, pos - 1] to draw */
        for (int x = 1; x < pos && need > 0; x++)
            if (t_int(pos - x) < need) { /* selection sampling: sorted */
                s[c++] = x;
                need--;
            }
        if (n >= 2) s[c++] = pos;
        p->cnt[t] = c;
    }
    p->dsel = (int32_t *)g_raw(p->sel, (size_t)p->pg.T * K * 4);
    p->dcnt = (int32_t *)g_raw(p->cnt, (size_t)p->pg.T * 4);
    p->pg.hab.sel_pos = p->sel;
    p->pg.hab.sel_count = p->cnt;
    p->pg.dab.sel_pos = p->dsel;
    p->pg.dab.sel_count = p->dcnt;
    p->pg.hab.sel_stride = p->pg.dab.sel_stride = K;
}

static void pb_free(pbatch *p) {
    paged_free(&p->pg);
    if (p->sel) {
        free(p->sel); free(p->cnt); g_free(p->dsel); g_free(p->dcnt);
    }
}

/* ---------------------------------------------------------------- rows ---- */

/* The D columns of each of T rows of stride ld in got (an op's in-place output) into out
 * [T, D]; returns whether got's padding columns still hold x's (the input's) values. */
static int unpad_rows(float *out, const float *got, const float *x, int T, int D, int ld) {
    int pad_ok = 1;
    for (int t = 0; t < T; t++) {
        memcpy(out + (size_t)t * D, got + (size_t)t * ld, (size_t)D * 4);
        pad_ok &= !memcmp(got + (size_t)t * ld + D, x + (size_t)t * ld + D, (size_t)(ld - D) * 4);
    }
    return pad_ok;
}

/* embed from an f32 table and from a bf16 one (converted at upload); gather_rows */
static void rows_embed_gather(void) {
    char what[160];
    for (int kind = 0; kind < 2; kind++) {
        int V = 1000, D = 300, T = 37, wk = kind ? WK_BF16 : WK_F32;
        wpair tab;
        wpair_make(&tab, wk, 1, V, D, 1.0f, DI_WEIGHT_PLAIN);
        int32_t ids[37];
        for (int t = 0; t < T; t++) ids[t] = t_int(V);
        ids[0] = V - 1;
        ids[1] = 0;
        float *ref = (float *)malloc((size_t)T * D * 4);
        g_cpu->embed(g_cpu, ref, &tab.c, ids, T);
        void *dids = g_raw(ids, sizeof ids), *dout = g_alloc((size_t)T * D * 4);
        g_poison(dout, (size_t)T * D * 4);
        g_gpu->embed(g_gpu, (float *)dout, &tab.g, (const int32_t *)dids, T);
        float *got = g_get_f32(dout, (size_t)T * D);
        snprintf(what, sizeof what, "embed %s table [%d x %d] -> f32 [%d x %d]", wk_name[wk], V, D, T, D);
        T_CHECK(what, got, ref, (size_t)T * D, 0, 0);
        free(got); free(ref); g_free(dids); g_free(dout);
        wpair_free(&tab);
    }
    int T = 37, D = 161, n = 5;
    float *h = t_rand_f32((size_t)T * D, 3.0f), *ref = (float *)malloc((size_t)n * D * 4);
    int32_t rows[5] = {3, 0, 36, 3, 17};
    g_cpu->gather_rows(g_cpu, ref, h, rows, n, D);
    void *dh = g_raw(h, (size_t)T * D * 4), *drows = g_raw(rows, sizeof rows), *dout = g_alloc((size_t)n * D * 4);
    g_poison(dout, (size_t)n * D * 4);
    g_gpu->gather_rows(g_gpu, (float *)dout, (const float *)dh, (const int32_t *)drows, n, D);
    float *got = g_get_f32(dout, (size_t)n * D);
    T_CHECK("gather_rows f32 [5 of 37 x 161]", got, ref, (size_t)n * D, 0, 0);
    free(got); free(ref); free(h); g_free(dh); g_free(drows); g_free(dout);
}

/* rmsnorm (strided input into a contiguous out, then in place on the strided buffer) and
 * add_rmsnorm (with a delta: h, out, out_f32; without: out, h unchanged) */
static void rows_norms(void) {
    char what[160];
    const float eps = 1e-6f;
    const int Ds[4] = {2048, 160, 100, 7168};
    for (int di = 0; di < 4; di++) {
        int D = Ds[di], T = 9, ld = D + 24;
        size_t nd = (size_t)T * D;
        float *x = t_rand_f32((size_t)T * ld, 3.0f), *w = t_rand_f32((size_t)D, 1.0f);
        di_weight wc = t_vec_upload(g_cpu, w, D), wg = t_vec_upload(g_gpu, w, D);
        float *ref = (float *)malloc(nd * 4);
        g_cpu->rmsnorm(g_cpu, ref, D, x, ld, &wc, eps, T, D);
        void *dx = g_raw(x, (size_t)T * ld * 4), *dout = g_alloc(nd * 4);
        g_poison(dout, nd * 4);
        g_gpu->rmsnorm(g_gpu, dout, D, dx, ld, &wg, eps, T, D);
        float *got = g_get_f32(dout, nd);
        snprintf(what, sizeof what, "rmsnorm [%d x %d] ldx %d -> contiguous", T, D, ld);
        T_CHECK(what, got, ref, nd, TOL32_L2, TOL32_MAX);
        free(got);
        /* in place on the strided buffer: the D columns normed, the padding untouched */
        g_gpu->rmsnorm(g_gpu, dx, ld, dx, ld, &wg, eps, T, D);
        float *gi = g_get_f32(dx, (size_t)T * ld), *gic = (float *)malloc(nd * 4);
        int pad_ok = unpad_rows(gic, gi, x, T, D, ld);
        snprintf(what, sizeof what, "rmsnorm in place [%d x %d] ld %d", T, D, ld);
        T_CHECK(what, gic, ref, nd, TOL32_L2, TOL32_MAX);
        CHECK_MSG(pad_ok, "%s: the padding columns were written", what);
        free(gi); free(gic);

        /* add_rmsnorm: h += delta (one fp32 add per element: bit-exact), then the norm; out and
         * out_f32 are both f32 on this table, so they must hold the same bits */
        float *h = t_rand_f32(nd, 2.0f), *dl = t_rand_f32(nd, 1.0f), *hc = (float *)malloc(nd * 4);
        memcpy(hc, h, nd * 4);
        float *nref = (float *)malloc(nd * 4), *fref = (float *)malloc(nd * 4);
        g_cpu->add_rmsnorm(g_cpu, hc, dl, nref, fref, &wc, eps, T, D);
        void *dh = g_raw(h, nd * 4), *ddl = g_raw(dl, nd * 4), *dof = g_alloc(nd * 4);
        g_poison(dout, nd * 4);
        g_poison(dof, nd * 4);
        g_gpu->add_rmsnorm(g_gpu, (float *)dh, ddl, dout, (float *)dof, &wg, eps, T, D);
        float *gh = g_get_f32(dh, nd), *gn = g_get_f32(dout, nd), *gf = g_get_f32(dof, nd);
        snprintf(what, sizeof what, "add_rmsnorm h += delta [%d x %d]", T, D);
        T_CHECK(what, gh, hc, nd, 0, 0);
        snprintf(what, sizeof what, "add_rmsnorm out [%d x %d]", T, D);
        T_CHECK(what, gn, nref, nd, TOL32_L2, TOL32_MAX);
        snprintf(what, sizeof what, "add_rmsnorm out_f32 [%d x %d]", T, D);
        T_CHECK(what, gf, fref, nd, TOL32_L2, TOL32_MAX);
        CHECK_MSG(!memcmp(gn, gf, nd * 4), "add_rmsnorm [%d x %d]: out and out_f32 differ on the f32 table", T, D);
        free(gh); free(gn); free(gf);
        /* no delta (and no out_f32): the norm of h, h unchanged */
        g_cpu->add_rmsnorm(g_cpu, hc, NULL, nref, NULL, &wc, eps, T, D);
        g_poison(dout, nd * 4);
        g_gpu->add_rmsnorm(g_gpu, (float *)dh, NULL, dout, NULL, &wg, eps, T, D);
        gn = g_get_f32(dout, nd);
        gh = g_get_f32(dh, nd);
        snprintf(what, sizeof what, "add_rmsnorm no delta out [%d x %d]", T, D);
        T_CHECK(what, gn, nref, nd, TOL32_L2, TOL32_MAX);
        snprintf(what, sizeof what, "add_rmsnorm no delta leaves h [%d x %d]", T, D);
        T_CHECK(what, gh, hc, nd, 0, 0);
        free(gh); free(gn); free(h); free(dl); free(hc); free(nref); free(fref);
        g_free(dh); g_free(ddl); g_free(dof);
        free(ref); free(x); free(w); g_free(dx); g_free(dout);
        g_cpu->weight_free(g_cpu, &wc); g_gpu->weight_free(g_gpu, &wg);
    }
}

/* silu_mul and the f32 add (bit-exact) */
static void rows_silu_add(void) {
    char what[160];
    static const int shp[3][2] = {{13, 1408}, {5, 36}, {3, 21}};
    for (int si = 0; si < 3; si++) {
        int T = shp[si][0], I = shp[si][1];
        size_t n = (size_t)T * I;
        float *gu = t_rand_f32(2 * n, 4.0f), *ref = (float *)malloc(n * 4);
        g_cpu->silu_mul(g_cpu, ref, gu, T, I);
        void *dgu = g_raw(gu, 2 * n * 4), *dout = g_alloc(n * 4);
        g_poison(dout, n * 4);
        g_gpu->silu_mul(g_gpu, dout, dgu, T, I);
        float *got = g_get_f32(dout, n);
        snprintf(what, sizeof what, "silu_mul [%d x %d]", T, I);
        T_CHECK(what, got, ref, n, TOL32_L2, TOL32_MAX);
        float *y = t_rand_f32(n, 1.0f), *x = t_rand_f32(n, 1.0f);
        void *dy = g_raw(y, n * 4), *dx = g_raw(x, n * 4);
        g_cpu->add(g_cpu, y, x, n);
        g_gpu->add(g_gpu, (float *)dy, dx, n);
        float *ga = g_get_f32(dy, n);
        snprintf(what, sizeof what, "add f32 += f32 [%zu]", n);
        T_CHECK(what, ga, y, n, 0, 0);
        free(ga); free(y); free(x); g_free(dy); g_free(dx);
        free(got); free(ref); free(gu); g_free(dgu); g_free(dout);
    }
}

/* rope: the rope slices of 4 q heads (head stride 48, rope after 32 nope values, padded rows)
 * and k_pe (one head at offset 64 of an 83-wide kv row); both layouts, mscale 1 and not */
static void rows_rope(void) {
    char what[160];
    const int T = 7, dr = 16, half = dr / 2;
    int32_t pos[7] = {0, 1, 63, 64, 1000, 4095, 5000};
    float *inv = t_rope_inv_freq(dr);
    float *dinv = (float *)g_raw(inv, (size_t)half * 4);
    void *dpos = g_raw(pos, sizeof pos);
    static const struct { int il; float ms; } cfg[3] = {{1, 1.0f}, {0, 1.2f}, {1, 0.85f}};
    for (int c = 0; c < 3; c++) {
        di_rope_params rc = {dr, cfg[c].il, cfg[c].ms, inv}, rg = rc;
        rg.inv_freq = dinv;
        /* q: [T, H, dn + dr] rows of stride ld */
        int H = 4, dn = 32, hs = dn + dr, ld = H * hs + 5;
        float *x = t_rand_f32((size_t)T * ld, 2.0f);
        void *dx = g_raw(x, (size_t)T * ld * 4);
        g_cpu->rope(g_cpu, x + dn, ld, H, hs, pos, T, &rc);
        g_gpu->rope(g_gpu, (float *)dx + dn, ld, H, hs, (const int32_t *)dpos, T, &rg);
        float *got = g_get_f32(dx, (size_t)T * ld);
        snprintf(what, sizeof what, "rope q [%d x %d x %d] ld %d interleave %d mscale %.2f", T, H, hs, ld, cfg[c].il,
                 (double)cfg[c].ms);
        T_CHECK(what, got, x, (size_t)T * ld, TOL32_L2, TOL32_MAX);
        free(got); free(x); g_free(dx);
        /* k_pe: one head inside a kv row */
        int r = 64, ldkv = r + dr + 3;
        float *kv = t_rand_f32((size_t)T * ldkv, 2.0f);
        void *dkv = g_raw(kv, (size_t)T * ldkv * 4);
        g_cpu->rope(g_cpu, kv + r, ldkv, 1, ldkv, pos, T, &rc);
        g_gpu->rope(g_gpu, (float *)dkv + r, ldkv, 1, ldkv, (const int32_t *)dpos, T, &rg);
        got = g_get_f32(dkv, (size_t)T * ldkv);
        snprintf(what, sizeof what, "rope k_pe [%d x %d] interleave %d mscale %.2f", T, ldkv, cfg[c].il,
                 (double)cfg[c].ms);
        T_CHECK(what, got, kv, (size_t)T * ldkv, TOL32_L2, TOL32_MAX);
        free(got); free(kv); g_free(dkv);
    }
    free(inv); g_free(dinv); g_free(dpos);
}

/* kv_write (a negative slot skips its token) and kv_copy_blocks (2 layers, one src == dst) */
static void rows_kv(void) {
    const int W = 80, nslots = 8 * 64, T = 6, ldkv = W + 8; /* 2 layers x 4 blocks */
    size_t nc = (size_t)nslots * W;
    float *cache = t_rand_f32(nc, 1.0f), *kv = t_rand_f32((size_t)T * ldkv, 1.0f), *init = (float *)malloc(nc * 4);
    memcpy(init, cache, nc * 4);
    int32_t slots[6] = {5, 64, -1, 255, 0, 130};
    void *dc = g_raw(cache, nc * 4), *dkv = g_raw(kv, (size_t)T * ldkv * 4), *ds = g_raw(slots, sizeof slots);
    g_cpu->kv_write(g_cpu, cache, kv, ldkv, slots, T, W);
    g_gpu->kv_write(g_gpu, dc, dkv, ldkv, (const int32_t *)ds, T, W);
    float *got = g_get_f32(dc, nc);
    T_CHECK("kv_write f32 [6 tokens, one skipped] W 80", got, cache, nc, 0, 0);
    /* every slot no token names (the skipped token's included) keeps its old row */
    int kept = 1;
    for (int s = 0; s < nslots; s++) {
        int named = 0;
        for (int t = 0; t < T; t++) named |= slots[t] == s;
        if (!named) kept &= !memcmp(got + (size_t)s * W, init + (size_t)s * W, (size_t)W * 4);
    }
    CHECK_MSG(kept, "kv_write: a slot no token writes was changed");
    free(got);
    int32_t src[3] = {1, 3, 2}, dst[3] = {2, 0, 2};
    g_cpu->kv_copy_blocks(g_cpu, cache, nc / 2, 2, W, src, dst, 3);
    g_gpu->kv_copy_blocks(g_gpu, dc, nc / 2, 2, W, src, dst, 3);
    got = g_get_f32(dc, nc);
    T_CHECK("kv_copy_blocks f32 [2 layers x 4 blocks] 1->2 3->0 2->2", got, cache, nc, 0, 0);
    free(got); free(cache); free(kv); free(init); g_free(dc); g_free(dkv); g_free(ds);
}

/* layernorm with bias: out of place from a strided input, and in place on it */
static void rows_layernorm(void) {
    char what[160];
    static const int shp[3][3] = {{7, 128, 136}, {5, 45, 52}, {3, 2048, 2064}}; /* T, D, ld */
    for (int c = 0; c < 3; c++) {
        int T = shp[c][0], D = shp[c][1], ld = shp[c][2];
        size_t nd = (size_t)T * D;
        float *x = t_rand_f32((size_t)T * ld, 2.0f), *w = t_rand_f32((size_t)D, 1.0f), *b = t_rand_f32((size_t)D, 0.5f);
        for (size_t i = 0; i < (size_t)T * ld; i++) x[i] += 1.5f; /* an offset, so the mean matters */
        di_weight wc = t_vec_upload(g_cpu, w, D), bc = t_vec_upload(g_cpu, b, D);
        di_weight wg = t_vec_upload(g_gpu, w, D), bg = t_vec_upload(g_gpu, b, D);
        float *ref = (float *)malloc(nd * 4);
        g_cpu->layernorm(g_cpu, ref, D, x, ld, &wc, &bc, 1e-6f, T, D);
        void *dx = g_raw(x, (size_t)T * ld * 4), *dout = g_alloc(nd * 4);
        g_poison(dout, nd * 4);
        g_gpu->layernorm(g_gpu, dout, D, dx, ld, &wg, &bg, 1e-6f, T, D);
        g_gpu->layernorm(g_gpu, dx, ld, dx, ld, &wg, &bg, 1e-6f, T, D);
        float *got = g_get_f32(dout, nd), *gi = g_get_f32(dx, (size_t)T * ld), *gic = (float *)malloc(nd * 4);
        int pad_ok = unpad_rows(gic, gi, x, T, D, ld);
        snprintf(what, sizeof what, "layernorm [%d x %d] ldx %d -> contiguous", T, D, ld);
        T_CHECK(what, got, ref, nd, TOL32_L2, TOL32_MAX);
        snprintf(what, sizeof what, "layernorm in place [%d x %d] ld %d", T, D, ld);
        T_CHECK(what, gic, ref, nd, TOL32_L2, TOL32_MAX);
        CHECK_MSG(pad_ok, "%s: the padding columns were written", what);
        free(x); free(w); free(b); free(ref); free(got); free(gi); free(gic);
        g_free(dx); g_free(dout);
        g_cpu->weight_free(g_cpu, &wc); g_cpu->weight_free(g_cpu, &bc);
        g_gpu->weight_free(g_gpu, &wg); g_gpu->weight_free(g_gpu, &bg);
    }
}

static void test_rows(void) {
    rows_embed_gather();
    rows_norms();
    rows_silu_add();
    rows_rope();
    rows_kv();
    rows_layernorm();
}

/* ---------------------------------------------------------------- gemm ---- */

/* y (+)= x · Wᵀ with padded ldx / ldy. Accumulate: y starts random on both sides and the
 * padding columns must keep their values; else y is poisoned and the padding must stay NaN. */
static void gemm_case(int T, int N, int K, int wk, unsigned flags, int ldx_pad, int ldy_pad) {
    int ldx = K + ldx_pad, ldy = N + ldy_pad, acc = (flags & DI_MM_ACCUMULATE) != 0;
    wpair w;
    wpair_make(&w, wk, 1, N, K, 0.05f, DI_WEIGHT_PLAIN);
    float *x = t_rand_f32((size_t)T * ldx, 1.0f), *y0 = t_rand_f32((size_t)T * ldy, 1.0f);
    float *ref = (float *)malloc((size_t)T * ldy * 4);
    memcpy(ref, y0, (size_t)T * ldy * 4);
    g_cpu->matmul(g_cpu, ref, ldy, x, ldx, &w.c, T, flags);
    void *dx = g_raw(x, (size_t)T * ldx * 4), *dy = g_raw(y0, (size_t)T * ldy * 4);
    if (!acc) g_poison(dy, (size_t)T * ldy * 4);
    g_gpu->matmul(g_gpu, dy, ldy, dx, ldx, &w.g, T, flags);
    float *got = g_get_f32(dy, (size_t)T * ldy);
    float *gc = (float *)malloc((size_t)T * N * 4), *rc = (float *)malloc((size_t)T * N * 4);
    size_t pad_bad = 0;
    for (int t = 0; t < T; t++) {
        memcpy(gc + (size_t)t * N, got + (size_t)t * ldy, (size_t)N * 4);
        memcpy(rc + (size_t)t * N, ref + (size_t)t * ldy, (size_t)N * 4);
        for (int i = N; i < ldy; i++) {
            float v = got[(size_t)t * ldy + i];
            pad_bad += acc ? v != y0[(size_t)t * ldy + i] : !isnan(v);
        }
    }
    char what[192];
    snprintf(what, sizeof what, "matmul %s [%d x %d x %d] ldx %d ldy %d flags%s%s%s", wk_name[wk], T, N, K, ldx, ldy,
             flags ? "" : " 0", acc ? " ACCUMULATE" : "", flags & DI_MM_OUT_F32 ? " OUT_F32" : "");
    T_CHECK(what, gc, rc, (size_t)T * N, TOL32_L2, TOL32_MAX);
    CHECK_MSG(pad_bad == 0, "%s: %zu padding values of y changed", what, pad_bad);
    free(gc); free(rc); free(got); free(ref); free(x); free(y0); g_free(dx); g_free(dy);
    wpair_free(&w);
}

/* bmm over H per-head matrices, stored [rows, cols] (TRANSPOSED: from [cols, rows] sources);
 * x (t, h, j) at x[t * ldx + h * hsx + j], y (t, h, i) at y[t * ldy + h * hsy + i], both with
 * gaps between heads and rows, which must stay poisoned in y */
static void bmm_case(int T, int H, int rows, int cols, di_weight_layout layout, int wk) {
    int tr = layout == DI_WEIGHT_TRANSPOSED;
    wpair w;
    wpair_make(&w, wk, H, tr ? cols : rows, tr ? rows : cols, 0.1f, layout);
    CHECK_MSG(w.g.rows == rows && w.g.cols == cols, "bmm: stored shape [%d x %d], expected [%d x %d]", w.g.rows,
              w.g.cols, rows, cols);
    int hsx = cols + 6, ldx = H * hsx + 3, hsy = rows + 3, ldy = H * hsy + 5;
    size_t ny = (size_t)T * ldy, nw = (size_t)T * H * rows;
    float *x = t_rand_f32((size_t)T * ldx, 1.0f), *ref = (float *)calloc(ny, 4);
    g_cpu->bmm(g_cpu, ref, ldy, hsy, x, ldx, hsx, &w.c, T);
    void *dx = g_raw(x, (size_t)T * ldx * 4), *dy = g_alloc(ny * 4);
    g_poison(dy, ny * 4);
    g_gpu->bmm(g_gpu, dy, ldy, hsy, dx, ldx, hsx, &w.g, T);
    float *got = g_get_f32(dy, ny);
    float *gc = (float *)malloc(nw * 4), *rc = (float *)malloc(nw * 4);
    char *written = (char *)calloc(ny, 1);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < rows; i++) {
                size_t at = (size_t)t * ldy + (size_t)h * hsy + i, k = ((size_t)t * H + h) * rows + i;
                gc[k] = got[at];
                rc[k] = ref[at];
                written[at] = 1;
            }
    size_t gap_bad = 0;
    for (size_t i = 0; i < ny; i++) gap_bad += !written[i] && !isnan(got[i]);
    char what[192];
    snprintf(what, sizeof what, "bmm %s %s [%d x %d heads x %d x %d] hsx %d hsy %d", wk_name[wk],
             tr ? "TRANSPOSED" : "PLAIN", T, H, rows, cols, hsx, hsy);
    T_CHECK(what, gc, rc, nw, TOL32_L2, TOL32_MAX);
    CHECK_MSG(gap_bad == 0, "%s: %zu values between heads / rows were written", what, gap_bad);
    free(x); free(ref); free(got); free(gc); free(rc); free(written); g_free(dx); g_free(dy);
    wpair_free(&w);
}

/* Batch invariance: the table picks the skinny GEMM for <= 64 rows and the tiled one above,
 * both summing each output as one fmaf chain over k in order, so a row's result must not
 * depend on how many rows share the call: rows of a 130-row (tiled) matmul / bmm against the
 * same rows computed alone and in a 64-row (skinny) call, bit for bit. */
static void gemm_invariance(void) {
    const int T = 130, N = 300, K = 1000, H = 3;
    wpair w, wb;
    wpair_make(&w, WK_F32, 1, N, K, 0.05f, DI_WEIGHT_PLAIN);
    wpair_make(&wb, WK_BF16, H, 48, 40, 0.1f, DI_WEIGHT_PLAIN);
    float *x = t_rand_f32((size_t)T * K, 1.0f), *xb = t_rand_f32((size_t)T * H * 40, 1.0f);
    void *dx = g_raw(x, (size_t)T * K * 4), *dy = g_alloc((size_t)T * N * 4), *dy1 = g_alloc((size_t)T * N * 4);
    void *dxb = g_raw(xb, (size_t)T * H * 40 * 4), *dyb = g_alloc((size_t)T * H * 48 * 4);
    void *dyb1 = g_alloc((size_t)T * H * 48 * 4);
    g_gpu->matmul(g_gpu, dy, N, dx, K, &w.g, T, 0);
    g_gpu->bmm(g_gpu, dyb, H * 48, 48, dxb, H * 40, 40, &wb.g, T);
    float *all = g_get_f32(dy, (size_t)T * N), *allb = g_get_f32(dyb, (size_t)T * H * 48);
    const int rows[3] = {0, 77, 129};
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        int r = rows[i];
        g_poison(dy1, (size_t)N * 4);
        g_gpu->matmul(g_gpu, dy1, N, (const float *)dx + (size_t)r * K, K, &w.g, 1, 0);
        float *one = g_get_f32(dy1, (size_t)N);
        bad += memcmp(one, all + (size_t)r * N, (size_t)N * 4) != 0;
        free(one);
        g_gpu->bmm(g_gpu, dyb1, H * 48, 48, (const float *)dxb + (size_t)r * H * 40, H * 40, 40, &wb.g, 1);
        float *oneb = g_get_f32(dyb1, (size_t)H * 48);
        bad += memcmp(oneb, allb + (size_t)r * H * 48, (size_t)H * 48 * 4) != 0;
        free(oneb);
    }
    g_gpu->matmul(g_gpu, dy1, N, dx, K, &w.g, 64, 0); /* the skinny kernel's largest call */
    float *sk = g_get_f32(dy1, (size_t)64 * N);
    bad += memcmp(sk, all, (size_t)64 * N * 4) != 0;
    fprintf(stderr, "  matmul / bmm rows alone and in 64 rows vs in 130 rows: %s\n", bad ? "DIFFER" : "same bits");
    CHECK_MSG(bad == 0, "f32 GEMM is not batch-invariant: %d comparisons differ", bad);
    free(sk); free(all); free(allb); free(x); free(xb);
    g_free(dx); g_free(dy); g_free(dy1); g_free(dxb); g_free(dyb); g_free(dyb1);
    wpair_free(&w);
    wpair_free(&wb);
}

static void test_gemm(void) {
    gemm_invariance();
    /* T below, at and above one 64-row tile; N and K not multiples of 64 or 16; every flag
     * combination with every weight kind (kind cycles against flags across the shapes); the
     * OUT_F32 flag changes nothing on this table (act is f32), which is what it checks */
    const int Ts[4] = {1, 3, 64, 130};
    const int NK[3][2] = {{96, 200}, {2048, 512}, {130, 70}};
    const unsigned fl[4] = {0, DI_MM_ACCUMULATE, DI_MM_OUT_F32, DI_MM_ACCUMULATE | DI_MM_OUT_F32};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++)
            for (int f = 0; f < 4; f++)
                gemm_case(Ts[a], NK[b][0], NK[b][1], (a + b + f) % 3, fl[f], (a + f) % 2 ? 5 : 0,
                          (b + f) % 2 ? 7 : 0);
    /* bmm: per-head weights, both layouts, bf16 and fp8 sources */
    const int Tb[3] = {1, 7, 130};
    for (int a = 0; a < 3; a++)
        for (int lay = 0; lay < 2; lay++)
            for (int wk = 0; wk < 2; wk++)
                bmm_case(Tb[a], 4, 48, 40, lay ? DI_WEIGHT_TRANSPOSED : DI_WEIGHT_PLAIN, wk);
}

/* ---------------------------------------------------------------- route ---- */

/* moe_route on both backends: the fp32 logits (scratch [T, E] first), the picks (exactly,
 * both sorted by expert index) and their weights. A differing pick is a failure (fp32 on
 * both sides makes a near-tie flip very unlikely; the tokens are printed if it happens). */
static void route_case(const char *name, di_route_params rp, int T, int D, float bias_amp, int wk) {
    int E = rp.n_experts, k = rp.top_k;
    char what[192];
    wpair gw;
    wpair_make(&gw, wk, 1, E, D, 0.05f, DI_WEIGHT_PLAIN);
    float *bias = bias_amp > 0 ? t_rand_f32((size_t)E, bias_amp) : NULL;
    di_weight bc, bg;
    memset(&bc, 0, sizeof bc);
    memset(&bg, 0, sizeof bg);
    if (bias) {
        bc = t_vec_upload(g_cpu, bias, E);
        bg = t_vec_upload(g_gpu, bias, E);
    }
    float *x = t_rand_f32((size_t)T * D, 1.0f);
    int32_t *ic = (int32_t *)malloc((size_t)T * k * 4), *ig = (int32_t *)malloc((size_t)T * k * 4);
    float *wc = (float *)malloc((size_t)T * k * 4), *scr = (float *)malloc((size_t)T * 2 * E * 4);
    g_cpu->moe_route(g_cpu, ic, wc, x, &gw.c, bias ? &bc : NULL, &rp, T, scr);
    void *dx = g_raw(x, (size_t)T * D * 4), *di = g_alloc((size_t)T * k * 4), *dw = g_alloc((size_t)T * k * 4);
    void *ds = g_alloc((size_t)T * 2 * E * 4);
    g_poison(di, (size_t)T * k * 4);
    g_poison(dw, (size_t)T * k * 4);
    g_poison(ds, (size_t)T * 2 * E * 4);
    g_gpu->moe_route(g_gpu, (int32_t *)di, (float *)dw, (const float *)dx, &gw.g, bias ? &bg : NULL, &rp, T,
                     (float *)ds);
    float *lg = g_get_f32(ds, (size_t)T * E), *wg = g_get_f32(dw, (size_t)T * k);
    CHECK_OK(g_gpu->download(g_gpu, ig, di, (size_t)T * k * 4));
    snprintf(what, sizeof what, "moe_route %s E%d k%d D%d T%d logits", name, E, k, D, T);
    T_CHECK(what, lg, scr, (size_t)T * E, TOL32_L2, TOL32_MAX);
    int bad_tok = 0;
    for (int t = 0; t < T; t++) {
        int diff = 0, sorted = 1;
        for (int j = 0; j < k; j++) {
            diff |= ig[t * k + j] != ic[t * k + j];
            if (j) sorted &= ig[t * k + j] > ig[t * k + j - 1];
        }
        if (!diff && sorted) continue;
        bad_tok++;
        fprintf(stderr, "    token %d:%s gpu", t, sorted ? "" : " (gpu picks not ascending)");
        for (int j = 0; j < k; j++) fprintf(stderr, " %d", ig[t * k + j]);
        fprintf(stderr, "  cpu");
        for (int j = 0; j < k; j++) fprintf(stderr, " %d", ic[t * k + j]);
        fputc('\n', stderr);
    }
    CHECK_MSG(bad_tok == 0, "moe_route %s T%d: %d of %d tokens picked other experts than the CPU", name, T, bad_tok, T);
    snprintf(what, sizeof what, "moe_route %s E%d k%d D%d T%d weights", name, E, k, D, T);
    T_CHECK(what, wg, wc, (size_t)T * k, TOL32_L2, TOL32_MAX);
    free(ic); free(ig); free(wc); free(scr); free(lg); free(wg); free(x); free(bias);
    g_free(dx); g_free(di); g_free(dw); g_free(ds);
    if (bias) {
        g_cpu->weight_free(g_cpu, &bc);
        g_gpu->weight_free(g_gpu, &bg);
    }
    wpair_free(&gw);
}

static void test_route(void) {
    const int Ts[2] = {1, 37};
    for (int a = 0; a < 2; a++) {
        int T = Ts[a];
        route_case("noaux_tc", (di_route_params){DI_ROUTE_NOAUX_TC, 64, 6, 4, 2, 1, 2.5f}, T, 256, 0.1f, WK_BF16);
        route_case("noaux_tc ungrouped", (di_route_params){DI_ROUTE_NOAUX_TC, 64, 6, 1, 1, 1, 2.5f}, T, 256, 0.1f,
                   WK_F32);
        route_case("greedy", (di_route_params){DI_ROUTE_GREEDY, 64, 6, 1, 1, 0, 1.0f}, T, 256, 0.0f, WK_F32);
        route_case("group_limited_greedy", (di_route_params){DI_ROUTE_GROUP_LIMITED_GREEDY, 64, 6, 4, 2, 0, 2.0f}, T,
                   256, 0.0f, WK_FP8);
    }
}

/* ---------------------------------------------------------------- experts ---- */

/* k distinct experts of [0, e_route) per token, ascending; weights in [0.1, 0.6) */
static void random_topk(int32_t *idx, float *w, int T, int k, int e_route) {
    for (int t = 0; t < T; t++) {
        int32_t *it = idx + (size_t)t * k;
        for (int n = 0; n < k;) {
            int e = t_int(e_route), dup = 0;
            for (int j = 0; j < n; j++) dup |= it[j] == e;
            if (!dup) it[n++] = e;
        }
        for (int a = 0; a < k; a++)
            for (int b = a + 1; b < k; b++)
                if (it[b] < it[a]) {
                    int32_t tmp = it[a];
                    it[a] = it[b];
                    it[b] = tmp;
                }
        for (int j = 0; j < k; j++) w[(size_t)t * k + j] = 0.1f + 0.5f * (float)(t_u64() % 1000) / 1000.0f;
    }
}

/* moe_experts of T tokens over the first e_route of E experts (e_route < E: experts without
 * tokens). The GPU's scratch is poisoned and the op run twice: the same bits both times (the
 * per-expert row order comes from atomics, but every row is computed alone). */
static void experts_case(int E, int e_route, int k, int D, int I, int T, int wk) {
    wpair gu, dn;
    wpair_make(&gu, wk, E, 2 * I, D, 0.08f, DI_WEIGHT_PLAIN);
    wpair_make(&dn, wk, E, D, I, 0.08f, DI_WEIGHT_PLAIN);
    size_t nd = (size_t)T * D;
    float *x = t_rand_f32(nd, 1.0f), *w = (float *)malloc((size_t)T * k * 4);
    int32_t *idx = (int32_t *)malloc((size_t)T * k * 4);
    random_topk(idx, w, T, k, e_route);
    size_t sc = g_cpu->moe_scratch_bytes(g_cpu, T, k, D, I, E), sg = g_gpu->moe_scratch_bytes(g_gpu, T, k, D, I, E);
    void *hs = malloc(sc), *ds = g_alloc(sg);
    float *ref = (float *)malloc(nd * 4);
    g_cpu->moe_experts(g_cpu, ref, x, idx, w, k, &gu.c, &dn.c, T, hs, sc);
    void *dx = g_raw(x, nd * 4), *di = g_raw(idx, (size_t)T * k * 4), *dw = g_raw(w, (size_t)T * k * 4);
    void *dout = g_alloc(nd * 4);
    float *got[2];
    for (int rep = 0; rep < 2; rep++) {
        g_poison(dout, nd * 4);
        g_poison(ds, sg);
        g_gpu->moe_experts(g_gpu, dout, dx, (const int32_t *)di, (const float *)dw, k, &gu.g, &dn.g, T, ds, sg);
        got[rep] = g_get_f32(dout, nd);
    }
    char what[192];
    snprintf(what, sizeof what, "moe_experts %s E%d k%d D%d I%d T%d%s", wk_name[wk], E, k, D, I, T,
             e_route < E ? " (some experts idle)" : "");
    T_CHECK(what, got[0], ref, nd, TOL32_ATT_L2, TOL32_ATT_MAX);
    CHECK_MSG(!memcmp(got[0], got[1], nd * 4), "%s: two runs differ", what);
    free(got[0]); free(got[1]); free(x); free(w); free(idx); free(hs); free(ref);
    g_free(ds); g_free(dx); g_free(di); g_free(dw); g_free(dout);
    wpair_free(&gu);
    wpair_free(&dn);
}

/* The routed experts' rows must not depend on the batch either: token rows of a 100-token call
 * (400 rows: the tiled grouped GEMM) against the same tokens alone (4 rows: the skinny one). */
static void experts_invariance(void) {
    const int E = 16, k = 4, D = 128, I = 96, T = 100;
    wpair gu, dn;
    wpair_make(&gu, WK_BF16, E, 2 * I, D, 0.08f, DI_WEIGHT_PLAIN);
    wpair_make(&dn, WK_BF16, E, D, I, 0.08f, DI_WEIGHT_PLAIN);
    float *x = t_rand_f32((size_t)T * D, 1.0f), *w = (float *)malloc((size_t)T * k * 4);
    int32_t *idx = (int32_t *)malloc((size_t)T * k * 4);
    random_topk(idx, w, T, k, E);
    size_t sg = g_gpu->moe_scratch_bytes(g_gpu, T, k, D, I, E);
    void *ds = g_alloc(sg), *dx = g_raw(x, (size_t)T * D * 4), *di = g_raw(idx, (size_t)T * k * 4);
    void *dw = g_raw(w, (size_t)T * k * 4), *dout = g_alloc((size_t)T * D * 4), *d1 = g_alloc((size_t)D * 4);
    g_gpu->moe_experts(g_gpu, dout, dx, (const int32_t *)di, (const float *)dw, k, &gu.g, &dn.g, T, ds, sg);
    float *all = g_get_f32(dout, (size_t)T * D);
    int bad = 0;
    const int toks[3] = {0, 41, 99};
    for (int i = 0; i < 3; i++) {
        int t = toks[i];
        g_poison(d1, (size_t)D * 4);
        g_gpu->moe_experts(g_gpu, d1, (const float *)dx + (size_t)t * D, (const int32_t *)di + (size_t)t * k,
                           (const float *)dw + (size_t)t * k, k, &gu.g, &dn.g, 1, ds, sg);
        float *one = g_get_f32(d1, (size_t)D);
        bad += memcmp(one, all + (size_t)t * D, (size_t)D * 4) != 0;
        free(one);
    }
    fprintf(stderr, "  moe_experts tokens alone vs in 100 tokens: %s\n", bad ? "DIFFER" : "same bits");
    CHECK_MSG(bad == 0, "f32 experts are not batch-invariant: %d tokens differ", bad);
    free(all); free(x); free(w); free(idx);
    g_free(ds); g_free(dx); g_free(di); g_free(dw); g_free(dout); g_free(d1);
    wpair_free(&gu);
    wpair_free(&dn);
}

static void test_experts(void) {
    const int E = 16, k = 4, D = 128, I = 96;
    experts_invariance();
    experts_case(E, E, k, D, I, 1, WK_BF16);
    experts_case(E, E, k, D, I, 5, WK_BF16);
    experts_case(E, E, k, D, I, 100, WK_BF16);
    experts_case(E, 8, k, D, I, 5, WK_F32);      /* half the experts idle */
    experts_case(E, 5, k, D, I, 100, WK_FP8);    /* 80 rows per used expert: two row tiles each */
    experts_case(E, 6, k, D, I, 1, WK_FP8);
}

/* ---------------------------------------------------------------- decode ---- */

/* mla_decode for sequences [sb, se) over a paged f32 cache (H 4, r 64, dr 16: W 80), qpe
 * strided inside q rows [T, H, 32 + dr] (+ padding); K > 0: over a random selection */
static void decode_case(const char *name, int S, const int *ql, const int *cx, int K, int sb, int se) {
    di_mla_dims d = {4, 32, 16, 24, 64, 0.1f};
    int H = d.n_heads, r = d.kv_rank, dr = d.rope_dim, W = r + dr, off = 32, hs = off + dr, ldq = H * hs + 4;
    pbatch p;
    pb_make(&p, S, ql, cx, W);
    if (K > 0) pb_select(&p, K);
    int T = p.pg.T;
    size_t no = (size_t)T * H * r;
    float *qt = t_rand_f32(no, 2.0f), *q = t_rand_f32((size_t)T * ldq, 2.0f), *ref = (float *)calloc(no, 4);
    g_cpu->mla_decode(g_cpu, ref, qt, q + off, ldq, hs, p.pg.cache, &p.pg.hab, sb, se, &d);
    void *dqt = g_raw(qt, no * 4), *dq = g_raw(q, (size_t)T * ldq * 4), *dout = g_alloc(no * 4);
    g_poison(dout, no * 4);
    g_gpu->mla_decode(g_gpu, dout, dqt, (const float *)dq + off, ldq, hs, p.pg.dcache, &p.pg.dab, sb, se, &d);
    float *got = g_get_f32(dout, no);
    char what[192];
    snprintf(what, sizeof what, "mla_decode %s H%d r%d dr%d seqs [%d, %d) of %d%s", name, H, r, dr, sb, se, S,
             K > 0 ? " sparse" : "");
    check_rows(what, got, ref, T, p.pg.start[sb], p.pg.start[se], (size_t)H * r, TOL32_ATT_L2, TOL32_ATT_MAX);
    free(qt); free(q); free(ref); free(got); g_free(dqt); g_free(dq); g_free(dout);
    pb_free(&p);
}

static void test_decode(void) {
    int qa[3] = {1, 1, 1}, ca[3] = {1, 70, 200};
    decode_case("3 seqs ctx 1/70/200", 3, qa, ca, 0, 0, 3);
    int qb[1] = {3}, cb[1] = {130};
    decode_case("q_len 3 ctx 130 (causal)", 1, qb, cb, 0, 0, 1);
    int qc[4] = {1, 2, 1, 3}, cc[4] = {5, 100, 64, 260};
    decode_case("range", 4, qc, cc, 0, 1, 3);
    int qd[3] = {1, 4, 2}, cd[3] = {1, 150, 300};
    decode_case("k40", 3, qd, cd, 40, 0, 3);
    decode_case("k100 (selections over 2 tiles)", 3, qd, cd, 100, 0, 3);
    decode_case("k100 range", 3, qd, cd, 100, 1, 3);
}

/* ---------------------------------------------------------------- prefill ---- */

/* mla_prefill for sequences [sb, se) (H 4, dn 32, dr 16, dv 24, r 64), W_kvb of kind wk
 * uploaded PLAIN, q rows of stride H * (dn + dr) + ldq_pad; K > 0: over a random selection.
 * The whole out buffer is poisoned: other sequences' tokens must stay NaN. */
static void prefill_case(const char *name, int S, const int *ql, const int *cx, int K, int sb, int se, int ldq_pad,
                         int wk) {
    di_mla_dims d = {4, 32, 16, 24, 64, 0.15f};
    int H = d.n_heads, dn = d.nope_dim, dr = d.rope_dim, dv = d.v_dim, r = d.kv_rank, W = r + dr;
    int ldq = H * (dn + dr) + ldq_pad;
    pbatch p;
    pb_make(&p, S, ql, cx, W);
    if (K > 0) pb_select(&p, K);
    int T = p.pg.T;
    size_t no = (size_t)T * H * dv;
    wpair wk_;
    wpair_make(&wk_, wk, 1, H * (dn + dv), r, 0.08f, DI_WEIGHT_PLAIN);
    float *q = t_rand_f32((size_t)T * ldq, 1.0f), *ref = (float *)calloc(no, 4);
    size_t sc = g_cpu->mla_prefill_scratch_bytes(g_cpu, &d, T), sg = g_gpu->mla_prefill_scratch_bytes(g_gpu, &d, T);
    void *hs = malloc(sc), *ds = g_alloc(sg);
    g_cpu->mla_prefill(g_cpu, ref, q, ldq, p.pg.cache, &wk_.c, &p.pg.hab, sb, se, &d, hs, sc);
    void *dq = g_raw(q, (size_t)T * ldq * 4), *dout = g_alloc(no * 4);
    g_poison(dout, no * 4);
    g_poison(ds, sg);
    g_gpu->mla_prefill(g_gpu, dout, dq, ldq, p.pg.dcache, &wk_.g, &p.pg.dab, sb, se, &d, ds, sg);
    float *got = g_get_f32(dout, no);
    char what[192];
    snprintf(what, sizeof what, "mla_prefill %s H%d dn%d dr%d dv%d r%d %s W_kvb ldq %d seqs [%d, %d)%s", name, H, dn,
             dr, dv, r, wk_name[wk], ldq, sb, se, K > 0 ? " sparse" : "");
    check_rows(what, got, ref, T, p.pg.start[sb], p.pg.start[se], (size_t)H * dv, TOL32_ATT_L2, TOL32_ATT_MAX);
    free(q); free(ref); free(got); free(hs); g_free(ds); g_free(dq); g_free(dout);
    wpair_free(&wk_);
    pb_free(&p);
}

static void test_prefill(void) {
    /* (a) one sequence of 300 tokens from position 0: more than the GPU's 256-token chunk */
    int qa[1] = {300}, ca[1] = {300};
    prefill_case("300 tokens", 1, qa, ca, 0, 0, 1, 0, WK_BF16);
    /* (b) chunked prefill: 40 new tokens at the end of a 150-token context, and a fresh
     * 5-token sequence; padded q rows; and the same with an fp8 W_kvb */
    int qb[2] = {40, 5}, cb[2] = {150, 5};
    prefill_case("chunk 40 of ctx 150 + 5", 2, qb, cb, 0, 0, 2, 7, WK_BF16);
    prefill_case("chunk 40 of ctx 150 + 5", 2, qb, cb, 0, 0, 2, 0, WK_FP8);
    /* (c) a decode sequence first, prefill of sequences [1, 3) only: token 0 untouched */
    int qc[3] = {1, 30, 20}, cc[3] = {90, 30, 200};
    prefill_case("after a decode seq", 3, qc, cc, 0, 1, 3, 0, WK_F32);
    /* (d) sparse selections (over several 64-position tiles) */
    int qd[2] = {50, 3}, cd[2] = {200, 70};
    prefill_case("k48", 2, qd, cd, 48, 0, 2, 0, WK_BF16);
    prefill_case("k100", 2, qd, cd, 100, 0, 2, 5, WK_BF16);
    /* a sparse 300-token prefill: chunks and selections together */
    prefill_case("300 tokens k64", 1, qa, ca, 64, 0, 1, 0, WK_BF16);
}

/* ---------------------------------------------------------------- indexer ---- */


/* indexer_topk (n_heads 4, head_dim 32: the generic kernel; topk 16) for sequences [sb, se):
 * counts and selections must equal the CPU's exactly. A mismatch is a failure; the fp64
 * scores of the positions in question are printed to tell a near-tie from a bug. */
static void indexer_case(const char *name, int S, const int *ql, const int *cx, int sb, int se) {
    di_indexer_dims d = {4, 32, 16, 0.17677669f, 0.5f};
    int nh = d.n_heads, hd = d.head_dim, K = d.topk;
    pbatch p;
    pb_make(&p, S, ql, cx, hd);
    int T = p.pg.T;
    float *q = t_rand_f32((size_t)T * nh * hd, 1.0f), *w = t_rand_f32((size_t)T * nh, 1.0f);
    int32_t *cpos = (int32_t *)malloc((size_t)T * K * 4), *ccnt = (int32_t *)malloc((size_t)T * 4);
    int32_t *gpos = (int32_t *)malloc((size_t)T * K * 4), *gcnt = (int32_t *)malloc((size_t)T * 4);
    for (int i = 0; i < T; i++) ccnt[i] = -1;
    size_t sc = g_cpu->indexer_scratch_bytes(g_cpu, T, p.pg.hab.max_ctx_len);
    size_t sg = g_gpu->indexer_scratch_bytes(g_gpu, T, p.pg.hab.max_ctx_len);
    void *hs = malloc(sc), *ds = g_alloc(sg);
    g_cpu->indexer_topk(g_cpu, cpos, ccnt, q, w, p.pg.cache, &p.pg.hab, sb, se, &d, hs, sc);
    void *dq = g_raw(q, (size_t)T * nh * hd * 4), *dw = g_raw(w, (size_t)T * nh * 4);
    void *dpos = g_alloc((size_t)T * K * 4), *dcnt = g_alloc((size_t)T * 4);
    g_poison(dpos, (size_t)T * K * 4);
    g_poison(dcnt, (size_t)T * 4);
    g_gpu->indexer_topk(g_gpu, (int32_t *)dpos, (int32_t *)dcnt, dq, (const float *)dw, p.pg.dcache, &p.pg.dab, sb, se, &d,
                        ds, sg);
    CHECK_OK(g_gpu->download(g_gpu, gpos, dpos, (size_t)T * K * 4));
    CHECK_OK(g_gpu->download(g_gpu, gcnt, dcnt, (size_t)T * 4));
    int t0 = p.pg.start[sb], t1 = p.pg.start[se], bad = 0, untouched = 1, sparse = 0;
    for (int t = 0; t < T; t++) {
        if (t < t0 || t >= t1) {
            untouched &= gcnt[t] == -1; /* still the poison */
            continue;
        }
        int seq = sb;
        while (p.pg.start[seq + 1] <= t) seq++;
        int pos = p.pg.pos[t], want = pos + 1 < K ? pos + 1 : K;
        sparse += pos + 1 > K;
        if (gcnt[t] != want || ccnt[t] != want) {
            bad++;
            fprintf(stderr, "    token %d (pos %d): count gpu %d cpu %d, expected %d\n", t, pos, gcnt[t], ccnt[t],
                    want);
            continue;
        }
        const int32_t *c = cpos + (size_t)t * K, *g = gpos + (size_t)t * K;
        if (!memcmp(c, g, (size_t)want * 4)) continue;
        bad++;
        double kth = INFINITY;
        for (int i = 0; i < want; i++) kth = fmin(kth, ix_score(&p.pg, seq, q, w, t, c[i], &d));
        fprintf(stderr, "    token %d (pos %d): selections differ; cpu's k-th score %.9g; fp64 scores of the positions"
                        " in one list only:", t, pos, kth);
        for (int i = 0, j = 0; i < want || j < want;) { /* symmetric difference of two sorted lists */
            int a = i < want ? c[i] : 1 << 30, b = j < want ? g[j] : 1 << 30, x;
            if (a == b) {
                i++;
                j++;
                continue;
            }
            if (a < b) {
                x = a;
                i++;
            } else {
                x = b;
                j++;
            }
            fprintf(stderr, " %s %d: %.9g", x == a ? "cpu" : "gpu", x, ix_score(&p.pg, seq, q, w, t, x, &d));
        }
        fputc('\n', stderr);
    }
    fprintf(stderr, "  indexer_topk %-30s nh%d hd%d k%d tokens [%d, %d): %d differ (%d with pos >= k)%s\n", name, nh,
            hd, K, t0, t1, bad, sparse, bad || !untouched ? "   FAIL" : "");
    CHECK_MSG(bad == 0, "indexer_topk %s: %d tokens' selections differ from the CPU's", name, bad);
    CHECK_MSG(untouched, "indexer_topk %s: tokens outside the sequence range were written", name);
    free(q); free(w); free(cpos); free(ccnt); free(gpos); free(gcnt); free(hs);
    g_free(ds); g_free(dq); g_free(dw); g_free(dpos); g_free(dcnt);
    pb_free(&p);
}

static void test_indexer(void) {
    /* contexts of 10 (<= topk: everything selected), 100 (decode) and 300 (a 40-token chunk) */
    int q3[3] = {10, 1, 40}, c3[3] = {10, 100, 300};
    indexer_case("ctx 10 / 100 / 300", 3, q3, c3, 0, 3);
    indexer_case("ctx 10 / 100 / 300, seqs 1..2", 3, q3, c3, 1, 3);
    int q1[1] = {100}, c1[1] = {100};
    indexer_case("100-token prefill", 1, q1, c1, 0, 1);
}

/* ---------------------------------------------------------------- graph ---- */

/* A captured f32 MoE-ish step (add_rmsnorm with out_f32, the router on it, gate_up, silu_mul,
 * down accumulated into h) replayed on new inputs uploaded into the same buffers: the same
 * bits as the same ops run eagerly (same kernels), and within tolerance of the CPU. */
static void test_graph(void) {
    const int T = 5, D = 256, I = 96, E = 64, k = 6;
    const float eps = 1e-6f;
    size_t nd = (size_t)T * D;
    float *nw = t_rand_f32((size_t)D, 1.0f);
    di_weight nwc = t_vec_upload(g_cpu, nw, D), nwg = t_vec_upload(g_gpu, nw, D);
    wpair gu, dn, gate;
    wpair_make(&gu, WK_BF16, 1, 2 * I, D, 0.05f, DI_WEIGHT_PLAIN);
    wpair_make(&dn, WK_FP8, 1, D, I, 0.05f, DI_WEIGHT_PLAIN);
    wpair_make(&gate, WK_F32, 1, E, D, 0.05f, DI_WEIGHT_PLAIN);
    di_route_params rp = {DI_ROUTE_NOAUX_TC, E, k, 4, 2, 1, 2.5f};
    float *dh = (float *)g_alloc(nd * 4), *ddl = (float *)g_alloc(nd * 4), *dnf = (float *)g_alloc(nd * 4);
    void *dnrm = g_alloc(nd * 4), *dgu = g_alloc((size_t)T * 2 * I * 4), *da = g_alloc((size_t)T * I * 4);
    int32_t *didx = (int32_t *)g_alloc((size_t)T * k * 4);
    float *dw = (float *)g_alloc((size_t)T * k * 4), *dscr = (float *)g_alloc((size_t)T * 2 * E * 4);
#define F32_STEP(be, h, dl, nrm, nf, wn, idx, w, scr, gu_, a, wgu, wdn, wg)                       \
    do {                                                                                          \
        (be)->add_rmsnorm((be), (h), (dl), (nrm), (nf), (wn), eps, T, D);                         \
        (be)->moe_route((be), (idx), (w), (nf), (wg), NULL, &rp, T, (scr));                       \
        (be)->matmul((be), (gu_), 2 * I, (nrm), D, (wgu), T, 0);                                  \
        (be)->silu_mul((be), (a), (gu_), T, I);                                                   \
        (be)->matmul((be), (h), D, (a), I, (wdn), T, DI_MM_ACCUMULATE);                           \
    } while (0)
#define GPU_STEP() F32_STEP(g_gpu, dh, ddl, dnrm, dnf, &nwg, didx, dw, dscr, dgu, da, &gu.g, &dn.g, &gate.g)
    void *graph = NULL;
    CHECK_OK(g_gpu->graph_begin(g_gpu));
    GPU_STEP();
    CHECK_OK(g_gpu->graph_end(g_gpu, &graph));
    CHECK(graph != NULL);
    /* host reference buffers */
    float *hh = (float *)malloc(nd * 4), *hn = (float *)malloc(nd * 4), *hnf = (float *)malloc(nd * 4);
    float *hgu = (float *)malloc((size_t)T * 2 * I * 4), *ha = (float *)malloc((size_t)T * I * 4);
    float *hw = (float *)malloc((size_t)T * k * 4), *hscr = (float *)malloc((size_t)T * 2 * E * 4);
    int32_t *hidx = (int32_t *)malloc((size_t)T * k * 4);
    for (int rep = 0; rep < 2 && graph; rep++) {
        float *h0 = t_rand_f32(nd, 2.0f), *dl = t_rand_f32(nd, 1.0f);
        float *res_h[2], *res_a[2], *res_w[2];
        int32_t *res_i[2];
        for (int mode = 0; mode < 2; mode++) { /* 0: graph replay, 1: eager */
            g_gpu->upload(g_gpu, dh, h0, nd * 4);
            g_gpu->upload(g_gpu, ddl, dl, nd * 4);
            g_poison(da, (size_t)T * I * 4);
            g_poison(didx, (size_t)T * k * 4);
            g_poison(dw, (size_t)T * k * 4);
            if (mode == 0) CHECK_OK(g_gpu->graph_launch(g_gpu, graph));
            else GPU_STEP();
            res_h[mode] = g_get_f32(dh, nd);
            res_a[mode] = g_get_f32(da, (size_t)T * I);
            res_w[mode] = g_get_f32(dw, (size_t)T * k);
            res_i[mode] = (int32_t *)malloc((size_t)T * k * 4);
            CHECK_OK(g_gpu->download(g_gpu, res_i[mode], didx, (size_t)T * k * 4));
        }
        char what[160];
        snprintf(what, sizeof what, "graph replay %d == eager (h)", rep);
        T_CHECK(what, res_h[0], res_h[1], nd, 0, 0);
        snprintf(what, sizeof what, "graph replay %d == eager (silu_mul out)", rep);
        T_CHECK(what, res_a[0], res_a[1], (size_t)T * I, 0, 0);
        snprintf(what, sizeof what, "graph replay %d == eager (router weights)", rep);
        T_CHECK(what, res_w[0], res_w[1], (size_t)T * k, 0, 0);
        CHECK_MSG(!memcmp(res_i[0], res_i[1], (size_t)T * k * 4), "graph replay %d: router picks differ from eager",
                  rep);
        /* the CPU on the same inputs */
        memcpy(hh, h0, nd * 4);
        F32_STEP(g_cpu, hh, dl, hn, hnf, &nwc, hidx, hw, hscr, hgu, ha, &gu.c, &dn.c, &gate.c);
        snprintf(what, sizeof what, "graph replay %d vs cpu (h)", rep);
        T_CHECK(what, res_h[0], hh, nd, TOL32_L2, TOL32_MAX);
        snprintf(what, sizeof what, "graph replay %d vs cpu (silu_mul out)", rep);
        T_CHECK(what, res_a[0], ha, (size_t)T * I, TOL32_L2, TOL32_MAX);
        CHECK_MSG(!memcmp(res_i[0], hidx, (size_t)T * k * 4), "graph replay %d: router picks differ from the CPU's",
                  rep);
        snprintf(what, sizeof what, "graph replay %d vs cpu (router weights)", rep);
        T_CHECK(what, res_w[0], hw, (size_t)T * k, TOL32_L2, TOL32_MAX);
        for (int mode = 0; mode < 2; mode++) {
            free(res_h[mode]); free(res_a[mode]); free(res_w[mode]); free(res_i[mode]);
        }
        free(h0); free(dl);
    }
#undef GPU_STEP
#undef F32_STEP
    g_gpu->graph_free(g_gpu, graph);
    free(hh); free(hn); free(hnf); free(hgu); free(ha); free(hw); free(hscr); free(hidx); free(nw);
    g_free(dh); g_free(ddl); g_free(dnf); g_free(dnrm); g_free(dgu); g_free(da); g_free(didx); g_free(dw);
    g_free(dscr);
    g_cpu->weight_free(g_cpu, &nwc); g_gpu->weight_free(g_gpu, &nwg);
    wpair_free(&gu); wpair_free(&dn); wpair_free(&gate);
}

/* ---------------------------------------------------------------- main ---- */

/* what a model does at load: the sampler's and the workspace's sizes */
/* Runs first (t_main_first_always): the table's identity, then reserve() as a model's load does
 * (the sampler and the workspace rely on it). Exits when g_gpu is not the f32 table: every
 * buffer of the groups would be mis-sized. */
static void setup_f32(void) {
    /* the f32 op table: f32 activations and cache, none of the bf16 table's fused extensions
     * (the model falls back to the separate ops when they are NULL) */
    CHECK_MSG(g_gpu->caps.act_dtype == DI_DTYPE_F32 && di_backend_act_size(g_gpu) == 4,
              "DI_PRECISION_F32 backend has act dtype %d (F32 expected)", (int)g_gpu->caps.act_dtype);
    CHECK_MSG(!g_gpu->caps.keeps_fp8, "DI_PRECISION_F32 backend claims to keep fp8 weights");
    CHECK_MSG(!g_gpu->rope_kv_write && !g_gpu->mla_decode_uv && !g_gpu->moe_experts_shared &&
                  !g_gpu->moe_experts_defer && !g_gpu->add_rmsnorm_experts,
              "DI_PRECISION_F32 backend exposes a bf16-only fused extension");
    if (g_gpu->caps.act_dtype != DI_DTYPE_F32 || !g_gpu->reserve) {
        fprintf(stderr, "FAIL: not the f32 op table (or no reserve); no op tested\n");
        exit(1);
    }
    di_backend_reserve r = {8192, 256, 129280, {16, 128, 64, 128, 512, 0.1f}};
    CHECK_OK(g_gpu->reserve(g_gpu, &r));
}

int main(int argc, char **argv) {
    const t_group groups[] = {{"setup", setup_f32},      {"rows", test_rows},       {"gemm", test_gemm},
                              {"route", test_route},     {"experts", test_experts}, {"decode", test_decode},
                              {"prefill", test_prefill}, {"indexer", test_indexer}, {"graph", test_graph}};
    g_gpu_precision = DI_PRECISION_F32;
    return t_main_first_always(argc, argv, groups, (int)(sizeof groups / sizeof groups[0]));
}
