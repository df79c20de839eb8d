/* test_cuda_ops.c - CPU vs CUDA parity of the row-wise ops (rope_kv_write also bit for bit
 * against the three ops it fuses), the GEMMs (bf16 / fp8, every
 * kernel path: small, tiled, cuBLASLt, generic), the per-head bmm, CUDA-graph replay, and the
 * two-lane concurrency (side_begin / side_end / side_join and, where the backend has it,
 * side_resume; eager and in a graph).
 * Inputs are fresh random bf16 values each run (full-precision fp32 for the residual stream,
 * which is f32 on both backends); GPU outputs are poisoned with NaN first; the CPU backend
 * (fp32) on the same operands is the reference.
 *
 *   test_cuda_ops [rows] [gemm] [bmm] [graph] [lanes]      (default: all groups) */
#include "cuda_test_util.h"

/* ---------------------------------------------------------------- row ops ---- */

/* rope_kv_write (with norm: the latent's RMSNorm first; rope of q's rope slices and of k_pe,
 * then the cache write; one launch) against the CPU's separate ops, and bit for bit against the
 * GPU's separate ops on the same inputs. q rows [T, H, dn + dr], kv rows [T, r + dr] (ld: a
 * row stride >= r + dr, e.g. one that is not a multiple of 8, which sends the norm to its own
 * launch); cache rows start random so a missed element shows; one token has a negative slot
 * (no cache write, its q and k_pe still rotated and its latent still normed). split: the op in
 * its two halves as the model's split issues them (n_heads = 0: the kv part; kv = NULL: q
 * only), which must give the same bits. */
static void rope_kv_case(int T, int H, int dn, int dr, int r, int il, int norm, int ld, int split) {
    int qk = dn + dr, ldq = H * qk, W = r + dr, nslots = 3 * 64, half = dr / 2;
    if (ld < W) ld = W;
    float *inv = t_rope_inv_freq(dr);
    int32_t *pos = (int32_t *)malloc((size_t)T * 4), *slots = (int32_t *)malloc((size_t)T * 4);
    for (int t = 0; t < T; t++) {
        pos[t] = t == 0 ? 0 : t_int(200000);
        slots[t] = (t * 37 + 5) % nslots;
    }
    if (T > 1) slots[1] = -1;
    di_rope_params rc = {dr, il, il ? 1.0f : 1.2f, inv};
    float *dinv = (float *)g_raw(inv, (size_t)half * 4);
    di_rope_params rg = rc;
    rg.inv_freq = dinv;
    float *q = t_rand((size_t)T * ldq, 2.0f), *kv = t_rand((size_t)T * ld, 2.0f), *cache = t_rand((size_t)nslots * W, 1.0f);
    float *nwv = t_rand((size_t)r, 1.0f);
    di_weight nwc = t_vec_upload(g_cpu, nwv, r), nwg = t_vec_upload(g_gpu, nwv, r);
    void *dq = g_act(q, (size_t)T * ldq), *dkv = g_act(kv, (size_t)T * ld), *dc = g_act(cache, (size_t)nslots * W);
    void *dq2 = g_act(q, (size_t)T * ldq), *dkv2 = g_act(kv, (size_t)T * ld), *dc2 = g_act(cache, (size_t)nslots * W);
    void *dpos = g_raw(pos, (size_t)T * 4), *dsl = g_raw(slots, (size_t)T * 4);
    /* the CPU reference: the separate ops (the CPU backend has no fused form) */
    if (norm) g_cpu->rmsnorm(g_cpu, kv, ld, kv, ld, &nwc, 1e-6f, T, r);
    g_cpu->rope(g_cpu, q + dn, ldq, H, qk, pos, T, &rc);
    g_cpu->rope(g_cpu, kv + r, ld, 1, ld, pos, T, &rc);
    g_cpu->kv_write(g_cpu, cache, kv, ld, slots, T, W);
    CHECK_MSG(g_gpu->rope_kv_write != NULL, "cuda backend has no rope_kv_write");
    if (g_gpu->rope_kv_write && !split)
        g_gpu->rope_kv_write(g_gpu, (uint16_t *)dq + dn, ldq, H, qk, dkv, ld, r, dc, dsl, W, dpos, T, &rg,
                             norm ? &nwg : NULL, 1e-6f);
    if (g_gpu->rope_kv_write && split) {
        g_gpu->rope_kv_write(g_gpu, NULL, 0, 0, qk, dkv, ld, r, dc, dsl, W, dpos, T, &rg, norm ? &nwg : NULL, 1e-6f);
        g_gpu->rope_kv_write(g_gpu, (uint16_t *)dq + dn, ldq, H, qk, NULL, 0, 0, NULL, dsl, W, dpos, T, &rg, NULL,
                             1e-6f);
    }
    if (norm) g_gpu->rmsnorm(g_gpu, dkv2, ld, dkv2, ld, &nwg, 1e-6f, T, r);
    g_gpu->rope(g_gpu, (uint16_t *)dq2 + dn, ldq, H, qk, dpos, T, &rg);
    g_gpu->rope(g_gpu, (uint16_t *)dkv2 + r, ld, 1, ld, dpos, T, &rg);
    g_gpu->kv_write(g_gpu, dc2, dkv2, ld, dsl, T, W);
    char what[160];
    struct { void *d, *d2; float *ref; size_t n; const char *name; } outs[3] = {
        {dq, dq2, q, (size_t)T * ldq, "q"}, {dkv, dkv2, kv, (size_t)T * ld, "kv"}, {dc, dc2, cache, (size_t)nslots * W, "cache"}};
    for (int o = 0; o < 3; o++) {
        snprintf(what, sizeof what, "rope_kv_write%s %s T%d H%d dn%d dr%d r%d ld%d interleave %d norm %d",
                 split ? " (two halves)" : "", outs[o].name, T, H, dn, dr, r, ld, il, norm);
        float *got = g_get_act(outs[o].d, outs[o].n);
        T_CHECK(what, got, outs[o].ref, outs[o].n, TOL_L2, TOL_MAX);
        uint16_t *a = (uint16_t *)malloc(outs[o].n * 2), *b = (uint16_t *)malloc(outs[o].n * 2);
        CHECK_OK(g_gpu->download(g_gpu, a, outs[o].d, outs[o].n * 2));
        CHECK_OK(g_gpu->download(g_gpu, b, outs[o].d2, outs[o].n * 2));
        CHECK_MSG(memcmp(a, b, outs[o].n * 2) == 0, "%s: fused and separate ops differ", what);
        free(a); free(b); free(got);
    }
    free(inv); free(pos); free(slots); free(q); free(kv); free(cache); free(nwv);
    g_cpu->weight_free(g_cpu, &nwc); g_gpu->weight_free(g_gpu, &nwg);
    g_free(dinv); g_free(dq); g_free(dkv); g_free(dc); g_free(dq2); g_free(dkv2); g_free(dc2); g_free(dpos); g_free(dsl);
}

static void test_rows(void) {
    char what[128];
    /* embed + gather */
    {
        int V = 1000, D = 2048, T = 37;
        t_weight tab = t_weight_make(1, V, D, 0, 1.0f);
        di_weight wc = t_weight_upload(g_cpu, &tab, DI_WEIGHT_PLAIN), wg = t_weight_upload(g_gpu, &tab, DI_WEIGHT_PLAIN);
        int32_t ids[37];
        for (int i = 0; i < T; i++) ids[i] = t_int(V);
        float *ref = (float *)malloc((size_t)T * D * 4);
        g_cpu->embed(g_cpu, ref, &wc, ids, T);
        void *dids = g_raw(ids, sizeof ids), *dout = g_alloc((size_t)T * D * 4);
        g_poison(dout, (size_t)T * D * 4);
        g_gpu->embed(g_gpu, (float *)dout, &wg, dids, T);
        float *got = g_get_f32(dout, (size_t)T * D);
        T_CHECK("embed -> f32 [37 x 2048]", got, ref, (size_t)T * D, 0, 0);
        /* gather of f32 residual rows (full-precision values), D = 2048 (float4) and odd */
        for (int odd = 0; odd < 2; odd++) {
            int Dg = odd ? 161 : D;
            float *h = t_rand_f32((size_t)T * Dg, 3.0f);
            int32_t rows[5] = {3, 0, 36, 3, 17};
            float *gref = (float *)malloc(5 * (size_t)Dg * 4);
            g_cpu->gather_rows(g_cpu, gref, h, rows, 5, Dg);
            void *dh = g_raw(h, (size_t)T * Dg * 4), *drows = g_raw(rows, sizeof rows), *dg = g_alloc(5 * (size_t)Dg * 4);
            g_poison(dg, 5 * (size_t)Dg * 4);
            g_gpu->gather_rows(g_gpu, (float *)dg, (const float *)dh, drows, 5, Dg);
            float *gg = g_get_f32(dg, 5 * (size_t)Dg);
            snprintf(what, sizeof what, "gather_rows f32 [5 of 37 x %d]", Dg);
            T_CHECK(what, gg, gref, 5 * (size_t)Dg, 0, 0);
            free(gg); free(gref); free(h); g_free(dh); g_free(drows); g_free(dg);
        }
        free(got); free(ref); g_free(dids); g_free(dout);
        g_cpu->weight_free(g_cpu, &wc); g_gpu->weight_free(g_gpu, &wg); t_weight_free(&tab);
    }
    /* rmsnorm (strided, in place) and add_rmsnorm */
    /* the vectorised kernels (D % 8 == 0 / D % 4 == 0, up to 8192) and the generic ones (100 for
     * the bf16 norm, 102 for both; 9000 too long for the vectorised ones) */
    const int Ds[7] = {2048, 160, 7168, 512, 100, 102, 9000};
    for (int di = 0; di < 7; di++) {
        int D = Ds[di], T = 9, ld = D + 24;
        float *x = t_rand((size_t)T * ld, 3.0f), *w = t_rand((size_t)D, 1.0f), *dl = t_rand((size_t)T * D, 1.0f);
        di_weight wc = t_vec_upload(g_cpu, w, D), wg = t_vec_upload(g_gpu, w, D);
        float *ref = (float *)malloc((size_t)T * D * 4);
        g_cpu->rmsnorm(g_cpu, ref, D, x, ld, &wc, 1e-6f, T, D);
        void *dx = g_act(x, (size_t)T * ld), *dout = g_alloc((size_t)T * D * 2);
        g_poison(dout, (size_t)T * D * 2);
        g_gpu->rmsnorm(g_gpu, dout, D, dx, ld, &wg, 1e-6f, T, D);
        float *got = g_get_act(dout, (size_t)T * D);
        snprintf(what, sizeof what, "rmsnorm [%d x %d] ldx %d", T, D, ld);
        T_CHECK(what, got, ref, (size_t)T * D, TOL_L2, TOL_MAX);
        free(got);
        /* in place on the strided buffer */
        g_gpu->rmsnorm(g_gpu, dx, ld, dx, ld, &wg, 1e-6f, T, D);
        float *gi = g_get_act(dx, (size_t)T * ld), *gic = (float *)malloc((size_t)T * D * 4);
        for (int t = 0; t < T; t++) memcpy(gic + (size_t)t * D, gi + (size_t)t * ld, (size_t)D * 4);
        snprintf(what, sizeof what, "rmsnorm in place [%d x %d]", T, D);
        T_CHECK(what, gic, ref, (size_t)T * D, TOL_L2, TOL_MAX);
        free(gi); free(gic);
        /* add_rmsnorm on the f32 residual stream: h += bf16 delta in fp32 (bit-exact vs the
         * CPU), the norm rounded to bf16, and its unrounded f32 copy (router input), which
         * differs from the CPU only by summation order; then without delta (plain norm of h) */
        float *h = t_rand_f32((size_t)T * D, 2.0f), *hc = (float *)malloc((size_t)T * D * 4);
        memcpy(hc, h, (size_t)T * D * 4);
        float *nref = (float *)malloc((size_t)T * D * 4), *fref = (float *)malloc((size_t)T * D * 4);
        g_cpu->add_rmsnorm(g_cpu, hc, dl, nref, fref, &wc, 1e-6f, T, D);
        void *dh = g_raw(h, (size_t)T * D * 4), *ddl = g_act(dl, (size_t)T * D), *dof = g_alloc((size_t)T * D * 4);
        g_poison(dout, (size_t)T * D * 2);
        g_poison(dof, (size_t)T * D * 4);
        g_gpu->add_rmsnorm(g_gpu, (float *)dh, ddl, dout, (float *)dof, &wg, 1e-6f, T, D);
        float *gh = g_get_f32(dh, (size_t)T * D), *gn = g_get_act(dout, (size_t)T * D), *gf = g_get_f32(dof, (size_t)T * D);
        snprintf(what, sizeof what, "add_rmsnorm f32 residual [%d x %d]", T, D);
        T_CHECK(what, gh, hc, (size_t)T * D, 0, 0);
        snprintf(what, sizeof what, "add_rmsnorm norm [%d x %d]", T, D);
        T_CHECK(what, gn, nref, (size_t)T * D, TOL_L2, TOL_MAX);
        snprintf(what, sizeof what, "add_rmsnorm norm f32 copy [%d x %d]", T, D);
        T_CHECK(what, gf, fref, (size_t)T * D, 1e-6, 2e-6);
        free(gn); free(gf);
        g_cpu->add_rmsnorm(g_cpu, hc, NULL, nref, NULL, &wc, 1e-6f, T, D);
        g_poison(dout, (size_t)T * D * 2);
        g_gpu->add_rmsnorm(g_gpu, (float *)dh, NULL, dout, NULL, &wg, 1e-6f, T, D);
        gn = g_get_act(dout, (size_t)T * D);
        float *gh2 = g_get_f32(dh, (size_t)T * D);
        snprintf(what, sizeof what, "add_rmsnorm no delta [%d x %d]", T, D);
        T_CHECK(what, gn, nref, (size_t)T * D, TOL_L2, TOL_MAX);
        snprintf(what, sizeof what, "add_rmsnorm no delta leaves h [%d x %d]", T, D);
        T_CHECK(what, gh2, hc, (size_t)T * D, 0, 0);
        free(gh2); free(fref); g_free(dof);
        free(gh); free(gn); free(h); free(hc); free(nref); g_free(dh); g_free(ddl);
        free(ref); free(x); free(w); free(dl); g_free(dx); g_free(dout);
        g_cpu->weight_free(g_cpu, &wc); g_gpu->weight_free(g_gpu, &wg);
    }
    /* silu_mul, add: vectorised kernels (I % 8 == 0, n % 4 == 0) and the scalar fallbacks */
    static const int su_shape[3][2] = {{13, 1408}, {5, 36}, {3, 21}};
    for (int si = 0; si < 3; si++) {
        int T = su_shape[si][0], I = su_shape[si][1];
        char nm[64];
        float *gu = t_rand((size_t)T * 2 * I, 4.0f), *ref = (float *)malloc((size_t)T * I * 4);
        g_cpu->silu_mul(g_cpu, ref, gu, T, I);
        void *dgu = g_act(gu, (size_t)T * 2 * I), *dout = g_alloc((size_t)T * I * 2);
        g_poison(dout, (size_t)T * I * 2);
        g_gpu->silu_mul(g_gpu, dout, dgu, T, I);
        float *got = g_get_act(dout, (size_t)T * I);
        snprintf(nm, sizeof nm, "silu_mul [%d x %d]", T, I);
        T_CHECK(nm, got, ref, (size_t)T * I, TOL_L2, TOL_MAX);
        /* add: f32 residual += bf16 delta, in fp32 (bit-exact) */
        float *y = t_rand_f32((size_t)T * I, 1.0f), *x = t_rand((size_t)T * I, 1.0f);
        void *dy = g_raw(y, (size_t)T * I * 4), *dxx = g_act(x, (size_t)T * I);
        g_cpu->add(g_cpu, y, x, (size_t)T * I);
        g_gpu->add(g_gpu, (float *)dy, dxx, (size_t)T * I);
        float *ga = g_get_f32(dy, (size_t)T * I);
        snprintf(nm, sizeof nm, "add f32 += bf16 [%d x %d]", T, I);
        T_CHECK(nm, ga, y, (size_t)T * I, 0, 0);
        free(ga); free(y); free(x); g_free(dy); g_free(dxx);
        free(got); free(ref); free(gu); g_free(dgu); g_free(dout);
    }
    /* rope: q heads (hs 192, rope slice after 128) and k_pe (one head inside a 576 row) */
    for (int il = 0; il < 2; il++) {
        int T = 7, H = 16, hs = 192, ld = H * hs, dim = 64;
        float inv[32];
        for (int i = 0; i < 32; i++) inv[i] = powf(10000.0f, -2.0f * i / dim) * (i > 20 ? 0.025f : 1.0f);
        int32_t pos[7] = {0, 1, 63, 64, 4095, 4096, 163839};
        di_rope_params rc = {dim, il, il ? 1.0f : 1.2f, inv};
        float *dinv = (float *)g_raw(inv, sizeof inv);
        di_rope_params rg = rc;
        rg.inv_freq = dinv;
        float *x = t_rand((size_t)T * ld, 2.0f);
        void *dx = g_act(x, (size_t)T * ld), *dpos = g_raw(pos, sizeof pos);
        g_cpu->rope(g_cpu, x + 128, ld, H, hs, pos, T, &rc);
        g_gpu->rope(g_gpu, (uint16_t *)dx + 128, ld, H, hs, dpos, T, &rg);
        float *got = g_get_act(dx, (size_t)T * ld);
        snprintf(what, sizeof what, "rope q [7 x 16 x 192] interleave %d", il);
        T_CHECK(what, got, x, (size_t)T * ld, TOL_L2, TOL_MAX);
        free(got); free(x); g_free(dx); g_free(dpos); g_free(dinv);
    }
    /* (latent norm +) rope + rope + kv_write fused: V2-Lite (16 heads), V3 (128), odd tiny
     * shapes (r = 20: the norm in its own launch, as for a row stride that is not a multiple
     * of 8), a latent of 1536 (three warps of norm threads) */
    for (int norm = 0; norm < 2; norm++) {
        for (int il = 0; il < 2; il++) {
            rope_kv_case(1, 16, 128, 64, 512, il, norm, 0, 0);
            rope_kv_case(5, 128, 128, 64, 512, il, norm, 0, 0);
            rope_kv_case(3, 3, 8, 6, 20, il, norm, 0, 0);
            rope_kv_case(1, 16, 128, 64, 512, il, norm, 0, 1);
            rope_kv_case(17, 128, 128, 64, 512, il, norm, 0, 1);
        }
        rope_kv_case(33, 16, 128, 64, 512, 1, norm, 0, 0);
        rope_kv_case(4, 16, 128, 64, 512, 1, norm, 580, 0);
        rope_kv_case(2, 4, 64, 32, 1536, 0, norm, 0, 0);
        rope_kv_case(4, 16, 128, 64, 512, 1, norm, 580, 1);
    }
    /* kv_write (negative slot skipped) and kv_copy_blocks */
    {
        int W = 576, nslots = 8 * 64, T = 6; /* 2 layers x 4 blocks */
        float *cache = t_rand((size_t)nslots * W, 1.0f), *kv = t_rand((size_t)T * (W + 8), 1.0f);
        int32_t slots[6] = {5, 64, -1, 255, 0, 130};
        void *dc = g_act(cache, (size_t)nslots * W), *dkv = g_act(kv, (size_t)T * (W + 8)), *ds = g_raw(slots, sizeof slots);
        g_cpu->kv_write(g_cpu, cache, kv, W + 8, slots, T, W);
        g_gpu->kv_write(g_gpu, dc, dkv, W + 8, ds, T, W);
        int32_t src[2] = {1, 3}, dst[2] = {2, 0};
        g_cpu->kv_copy_blocks(g_cpu, cache, (size_t)nslots * W / 2, 2, W, src, dst, 2);
        g_gpu->kv_copy_blocks(g_gpu, dc, (size_t)nslots * W / 2, 2, W, src, dst, 2);
        float *got = g_get_act(dc, (size_t)nslots * W);
        T_CHECK("kv_write + kv_copy_blocks [2 x 256 x 576]", got, cache, (size_t)nslots * W, 0, 0);
        free(got); free(cache); free(kv); g_free(dc); g_free(dkv); g_free(ds);
    }
}

/* ---------------------------------------------------------------- GEMM ---- */

/* y = x · Wᵀ for one shape / dtype / flags on both backends; tolerances by path. */
static void gemm_case(di_backend *gpu, int T, int N, int K, int fp8, unsigned flags, int ldx_pad, const char *tag,
                      double tol_l2, double tol_max) {
    di_backend *save = g_gpu;
    g_gpu = gpu;
    int ldx = K + ldx_pad, f32 = (flags & DI_MM_OUT_F32) != 0, ldy = N + (f32 ? 3 : 8);
    t_weight w = t_weight_make(1, N, K, fp8, 0.05f);
    di_weight wc = t_weight_upload(g_cpu, &w, DI_WEIGHT_PLAIN), wg = t_weight_upload(g_gpu, &w, DI_WEIGHT_PLAIN);
    float *x = t_rand((size_t)T * ldx, 1.0f), *y0 = f32 ? t_rand_f32((size_t)T * ldy, 1.0f) : t_rand((size_t)T * ldy, 1.0f);
    float *ref = (float *)malloc((size_t)T * ldy * 4);
    memcpy(ref, y0, (size_t)T * ldy * 4);
    g_cpu->matmul(g_cpu, ref, ldy, x, ldx, &wc, T, flags);
    void *dx = g_act(x, (size_t)T * ldx), *dy;
    if (f32) dy = g_raw(y0, (size_t)T * ldy * 4);
    else dy = g_act(y0, (size_t)T * ldy);
    if (!(flags & DI_MM_ACCUMULATE)) g_poison(dy, (size_t)T * ldy * (f32 ? 4 : 2));
    g_gpu->matmul(g_gpu, dy, ldy, dx, ldx, &wg, T, flags);
    float *got = f32 ? g_get_f32(dy, (size_t)T * ldy) : g_get_act(dy, (size_t)T * ldy);
    /* compare the written columns; the padding columns must be untouched (poisoned = NaN ok) */
    float *gc = (float *)malloc((size_t)T * N * 4), *rc = (float *)malloc((size_t)T * N * 4);
    for (int t = 0; t < T; t++) {
        memcpy(gc + (size_t)t * N, got + (size_t)t * ldy, (size_t)N * 4);
        memcpy(rc + (size_t)t * N, ref + (size_t)t * ldy, (size_t)N * 4);
    }
    char what[128];
    snprintf(what, sizeof what, "matmul %s T%d N%d K%d%s%s%s", fp8 ? "fp8" : "bf16", T, N, K,
             flags & DI_MM_ACCUMULATE ? " acc" : "", f32 ? " f32" : "", tag);
    T_CHECK(what, gc, rc, (size_t)T * N, tol_l2, tol_max);
    free(gc); free(rc); free(got); free(ref); free(x); free(y0); g_free(dx); g_free(dy);
    g_cpu->weight_free(g_cpu, &wc); g_gpu->weight_free(g_gpu, &wg); t_weight_free(&w);
    g_gpu = save;
}

static void test_gemm(void) {
    /* bf16: GEMV (1-2 rows, narrow up to 4), small (T <= 32), cuBLASLt (T > 32), generic (K % 8
     * != 0), awkward N */
    const int Ts[] = {1, 2, 3, 8, 16, 17, 32, 33, 64, 100, 256};
    const int NK[][2] = {{576, 2048}, {3072, 2048}, {130, 160}, {72, 136}, {1000, 512}};
    for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
        for (size_t b = 0; b < sizeof NK / sizeof NK[0]; b++)
            gemm_case(g_gpu, Ts[a], NK[b][0], NK[b][1], 0, (a + b) % 3 == 0 ? DI_MM_ACCUMULATE : 0, (a % 2) * 8, "",
                      TOL_L2, TOL_MAX);
    /* 9-16 rows (decode batches of 9-16 sequences), odd ldx / ldy, N not a multiple of 16 */
    const int T16[] = {9, 12, 15, 16};
    const int NK16[][2] = {{576, 2048}, {3072, 2048}, {2048, 2048}, {136, 2816}, {40, 32}, {8, 96}};
    for (size_t a = 0; a < sizeof T16 / sizeof T16[0]; a++)
        for (size_t b = 0; b < sizeof NK16 / sizeof NK16[0]; b++)
            gemm_case(g_gpu, T16[a], NK16[b][0], NK16[b][1], 0, (a + b) % 2 ? DI_MM_ACCUMULATE : 0, (int)(a % 2) * 8,
                      " (9-16 rows)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 16, 1000, 2048, 0, DI_MM_OUT_F32, 0, " (16-row logits)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 5, 50, 36, 0, 0, 1, " (generic)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 40, 50, 36, 0, DI_MM_ACCUMULATE, 3, " (generic)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 3, 1000, 2048, 0, DI_MM_OUT_F32, 0, " (logits)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 100, 1000, 2048, 0, DI_MM_OUT_F32, 0, " (logits)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 256, 2048, 4096, 0, 0, 0, " (large)", TOL_L2, TOL_MAX);
    /* projections accumulated straight into the f32 residual stream (o_proj, dense down_proj):
     * y0 is full-precision fp32 and bf16 operands are exact on both sides, so only the fp32
     * summation order differs: a bound of 1e-4 catches any bf16 rounding of y (2^-9) */
    const int Tr[] = {1, 2, 3, 4, 16, 33, 256};
    for (size_t a = 0; a < sizeof Tr / sizeof Tr[0]; a++) {
        gemm_case(g_gpu, Tr[a], 2048, 2048, 0, DI_MM_OUT_F32 | DI_MM_ACCUMULATE, 0, " (residual)", 1e-4, 1e-4);
        /* fp8: the tensor-core paths dequantize W to bf16 in shared memory: bf16 bounds */
        gemm_case(g_gpu, Tr[a], 2048, 1408, 1, DI_MM_OUT_F32 | DI_MM_ACCUMULATE, 0, " (residual)", TOL_L2, TOL_MAX);
    }
    gemm_case(g_gpu, 7, 50, 36, 0, DI_MM_OUT_F32 | DI_MM_ACCUMULATE, 0, " (residual, generic)", 1e-4, 1e-4);
    /* fp8 weight-only: small path and tiled path (T % 4 != 0 keeps cuBLASLt out) */
    const int Tf[] = {1, 7, 16, 32, 37, 130};
    const int NKf[][2] = {{512, 1024}, {576, 2048}, {200, 264}};
    for (size_t a = 0; a < sizeof Tf / sizeof Tf[0]; a++)
        for (size_t b = 0; b < sizeof NKf / sizeof NKf[0]; b++)
            gemm_case(g_gpu, Tf[a], NKf[b][0], NKf[b][1], 1, a % 2 ? DI_MM_ACCUMULATE : 0, 0, "", TOL_L2, TOL_MAX);
    /* fp8 scale blocks of 6 rows and 16 columns: the 4 rows of a GEMV warp straddle scale
     * blocks, so each row loads its own scale (with 128-row blocks one load serves the 4) */
    t_fp8_br = 6;
    t_fp8_bc = 16;
    gemm_case(g_gpu, 1, 500, 1024, 1, 0, 0, " (6 x 16 scale blocks)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 1, 4100, 1024, 1, DI_MM_OUT_F32 | DI_MM_ACCUMULATE, 0, " (6 x 16 scale blocks)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 3, 200, 264, 1, DI_MM_ACCUMULATE, 0, " (6 x 16 scale blocks)", TOL_L2, TOL_MAX);
    t_fp8_br = t_fp8_bc = 128;
    /* one row over an fp8 weight of >= 4 MiB: one scale load per piece for a warp's 4 rows */
    gemm_case(g_gpu, 1, 4100, 1040, 1, 0, 0, " (shared scales)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 1, 2048, 2816, 1, DI_MM_OUT_F32 | DI_MM_ACCUMULATE, 0, " (shared scales)", TOL_L2, TOL_MAX);
    /* fp8 weight-only through the tiled kernel (the default for more than 32 rows) */
    gemm_case(g_gpu, 64, 512, 1024, 1, 0, 0, " (weight-only)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 256, 576, 2048, 1, DI_MM_ACCUMULATE, 0, " (weight-only)", TOL_L2, TOL_MAX);
    /* DEEPINFER_FP8_ACT_QUANT=1: 1x128 activation quantization + cuBLASLt block-scaled fp8;
     * activation rounding to e4m3 costs ~2-3% per output, so the bound is looser. The weights
     * are uploaded after reserve(): the activation buffers grow with the widest fp8 weight. */
    setenv("DEEPINFER_FP8_ACT_QUANT", "1", 1);
    di_backend *aq = NULL;
    CHECK_OK(di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &aq));
    unsetenv("DEEPINFER_FP8_ACT_QUANT");
    if (aq) {
        di_backend_reserve r = {8192, 256, 129280, {16, 128, 64, 128, 512, 0.1f}};
        CHECK_OK(aq->reserve(aq, &r));
        const int Tq[] = {64, 128, 512};
        for (size_t a = 0; a < sizeof Tq / sizeof Tq[0]; a++) {
            gemm_case(aq, Tq[a], 512, 1024, 1, 0, 0, " (act-quant)", 6e-2, 1.2e-1);
            gemm_case(aq, Tq[a], 576, 2048, 1, DI_MM_ACCUMULATE, 0, " (act-quant)", 6e-2, 1.2e-1);
            gemm_case(aq, Tq[a], 384, 640, 1, 0, 0, " (act-quant, 5 K-blocks)", 6e-2, 1.2e-1);
        }
        di_backend_free(aq);
    }
}

/* matmul_silu (on `gs`: DEEPINFER_CUDA_GU_SILU at its default, on) against matmul + silu_mul of
 * the test's backend on the same device buffers: bit for bit at one token (and near the CPU);
 * the calls it must refuse (2 tokens; `off`, a backend with DEEPINFER_CUDA_GU_SILU=0) return 0. */
static void silu_case(di_backend *gs, di_backend *off, int I, int D, int fp8, int ldx_pad) {
    int ldx = D + ldx_pad;
    t_weight w = t_weight_make(1, 2 * I, D, fp8, 0.05f);
    di_weight wc = t_weight_upload(g_cpu, &w, DI_WEIGHT_PLAIN), wg = t_weight_upload(g_gpu, &w, DI_WEIGHT_PLAIN);
    float *x = t_rand((size_t)2 * ldx, 1.0f);
    void *dx = g_act(x, (size_t)2 * ldx), *dgu = g_alloc((size_t)4 * I * 2), *da = g_alloc((size_t)2 * I * 2),
         *db = g_alloc((size_t)2 * I * 2);
    g_gpu->matmul(g_gpu, dgu, 2 * I, dx, ldx, &wg, 1, 0);
    g_gpu->silu_mul(g_gpu, da, dgu, 1, I);
    g_poison(db, (size_t)2 * I * 2);
    char what[96];
    snprintf(what, sizeof what, "matmul_silu %s I%d D%d ldx %d", fp8 ? "fp8" : "bf16", I, D, ldx);
    int took = gs->matmul_silu && gs->matmul_silu(gs, db, dx, ldx, &wg, I, 1);
    CHECK_MSG(took, "%s: not taken at one token", what);
    CHECK_OK(gs->sync(gs));
    uint16_t *ha = (uint16_t *)malloc((size_t)I * 2), *hb = (uint16_t *)malloc((size_t)I * 2);
    CHECK_OK(g_gpu->download(g_gpu, ha, da, (size_t)I * 2));
    CHECK_OK(g_gpu->download(g_gpu, hb, db, (size_t)I * 2));
    size_t diff = 0;
    for (int i = 0; i < I; i++) diff += ha[i] != hb[i];
    CHECK_MSG(diff == 0, "%s: %zu of %d outputs differ from matmul + silu_mul", what, diff, I);
    /* and the values: the CPU's fp32 matmul + silu_mul within bf16 bounds */
    float *gu = (float *)malloc((size_t)2 * I * 4), *ref = (float *)malloc((size_t)I * 4);
    g_cpu->matmul(g_cpu, gu, 2 * I, x, ldx, &wc, 1, 0);
    g_cpu->silu_mul(g_cpu, ref, gu, 1, I);
    float *got = g_get_act(db, (size_t)I);
    T_CHECK(what, got, ref, (size_t)I, TOL_L2, TOL_MAX);
    CHECK_MSG(!gs->matmul_silu(gs, db, dx, ldx, &wg, I, 2), "%s: taken at two tokens", what);
    CHECK_MSG(!off->matmul_silu || !off->matmul_silu(off, db, dx, ldx, &wg, I, 1),
              "%s: taken with DEEPINFER_CUDA_GU_SILU=0", what);
    free(got); free(gu); free(ref); free(ha); free(hb); free(x);
    g_free(dx); g_free(dgu); g_free(da); g_free(db);
    g_cpu->weight_free(g_cpu, &wc); g_gpu->weight_free(g_gpu, &wg); t_weight_free(&w);
}

static void test_silu(void) {
    unsetenv("DEEPINFER_CUDA_GU_SILU");
    di_backend *gs = NULL, *off = NULL;
    CHECK_OK(di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &gs));
    setenv("DEEPINFER_CUDA_GU_SILU", "0", 1);
    CHECK_OK(di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &off));
    unsetenv("DEEPINFER_CUDA_GU_SILU");
    if (!gs || !off) {
        if (gs) di_backend_free(gs);
        if (off) di_backend_free(off);
        return;
    }
    di_backend_reserve r = {8192, 256, 129280, {16, 128, 64, 128, 512, 0.1f}};
    CHECK_OK(gs->reserve(gs, &r));
    /* V2-Lite's dense FFN (split-K GEMV), its shared experts, odd I, a padded x, the generic
     * kernel (D % 8 != 0), fp8 with 128 x 128 scale blocks */
    silu_case(gs, off, 10944, 2048, 0, 0);
    silu_case(gs, off, 2816, 2048, 0, 8);
    silu_case(gs, off, 75, 136, 0, 0);
    silu_case(gs, off, 40, 36, 0, 3);
    silu_case(gs, off, 10944, 2048, 1, 0);
    silu_case(gs, off, 1408, 2048, 1, 0);
    di_backend_free(gs);
    di_backend_free(off);
}

/* cuBLASLt fp8 needs the workspace reserve() sizes (activation-quant buffers) */
static void reserve_gpu(void) {
    di_backend_reserve r = {8192, 256, 129280, {16, 128, 64, 128, 512, 0.1f}};
    CHECK_OK(g_gpu->reserve(g_gpu, &r));
}

/* ---------------------------------------------------------------- bmm ---- */

static void test_bmm(void) {
    /* q̃ = W_UKᵀ q_nope per head (W transposed, bf16) and o = W_UV ō (W plain, fp8 or bf16) */
    const int Ts[] = {1, 2, 5, 12, 16, 32, 40, 130};
    for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
        for (int kind = 0; kind < 3; kind++) {
            int T = Ts[a], H = 16, r = 512, dn = 128, fp8 = kind == 2;
            int rows = kind == 0 ? dn : 128, cols = r; /* stored [dn, r] then TRANSPOSED -> [r, dn] */
            t_weight w = t_weight_make(H, rows, cols, fp8, 0.05f);
            di_weight_layout lay = kind == 0 ? DI_WEIGHT_TRANSPOSED : DI_WEIGHT_PLAIN;
            di_weight wc = t_weight_upload(g_cpu, &w, lay), wg = t_weight_upload(g_gpu, &w, lay);
            int in = wc.cols, out = wc.rows, ldx = H * (in + 64), hsx = in + 64, ldy = H * out, hsy = out;
            float *x = t_rand((size_t)T * ldx, 1.0f), *ref = (float *)calloc((size_t)T * ldy, 4);
            g_cpu->bmm(g_cpu, ref, ldy, hsy, x, ldx, hsx, &wc, T);
            void *dx = g_act(x, (size_t)T * ldx), *dy = g_alloc((size_t)T * ldy * 2);
            g_poison(dy, (size_t)T * ldy * 2);
            g_gpu->bmm(g_gpu, dy, ldy, hsy, dx, ldx, hsx, &wg, T);
            float *got = g_get_act(dy, (size_t)T * ldy);
            char what[128];
            snprintf(what, sizeof what, "bmm %s H16 T%d [%d x %d]", kind == 0 ? "W_UK^T bf16" : fp8 ? "W_UV fp8" : "W_UV bf16",
                     T, out, in);
            T_CHECK(what, got, ref, (size_t)T * ldy, TOL_L2, TOL_MAX);
            free(got); free(x); free(ref); g_free(dx); g_free(dy);
            g_cpu->weight_free(g_cpu, &wc); g_gpu->weight_free(g_gpu, &wg); t_weight_free(&w);
        }
}

/* ---------------------------------------------------------------- graphs ---- */

/* The buffers and weights of one residual step (add_rmsnorm with its f32 copy, the router, a
 * D x D projection accumulated into h), shared by the graph and lanes groups. */
typedef struct resid_fix {
    float *w;                   /* host norm weight */
    t_weight m, g;              /* host projection [D, D] and router [E, D] */
    di_weight wn, wm, wg;
    di_route_params rp;
    float *dh, *dnf, *dw, *dscr;
    void *dn, *didx;
} resid_fix;

static void resid_fix_init(resid_fix *f, int T, int D, int E, int k, float proj_scale) {
    f->w = t_rand((size_t)D, 1.0f);
    f->wn = t_vec_upload(g_gpu, f->w, D);
    f->m = t_weight_make(1, D, D, 0, proj_scale);
    f->g = t_weight_make(1, E, D, 0, 0.05f);
    f->wm = t_weight_upload(g_gpu, &f->m, DI_WEIGHT_PLAIN);
    f->wg = t_weight_upload(g_gpu, &f->g, DI_WEIGHT_PLAIN);
    f->rp = (di_route_params){DI_ROUTE_GREEDY, E, k, 1, 1, 0, 1.0f};
    f->dh = (float *)g_alloc((size_t)T * D * 4);
    f->dnf = (float *)g_alloc((size_t)T * D * 4);
    f->dn = g_alloc((size_t)T * D * 2);
    f->didx = g_alloc((size_t)T * k * 4);
    f->dw = (float *)g_alloc((size_t)T * k * 4);
    f->dscr = (float *)g_alloc((size_t)T * 2 * E * 4);
}

static void resid_fix_free(resid_fix *f) {
    g_free(f->dh); g_free(f->dnf); g_free(f->dn); g_free(f->didx); g_free(f->dw); g_free(f->dscr);
    g_gpu->weight_free(g_gpu, &f->wg); t_weight_free(&f->g);
    g_gpu->weight_free(g_gpu, &f->wn); g_gpu->weight_free(g_gpu, &f->wm);
    t_weight_free(&f->m);
    free(f->w);
}

/* DEEPINFER_CUDA_GRAPH_FILL (default on): a captured graph's small memset nodes become fill
 * kernels. A backend with the switch set explicitly captures memset(a, 0x3f, 4 KB), add(y +=
 * a as bf16), memset(big, 0, 256 KB: too big, stays a memset); each replay, after a and big
 * are poisoned, must leave a's bytes 0x3f, y = y0 + bf16 0x3f3f (so the fill ran before the
 * add) and big zeroed. */
static void test_graph_fill(void) {
    di_backend *be = g_backend_with("DEEPINFER_CUDA_GRAPH_FILL", "1");
    if (!be) return;
    size_t n = 2048, nbig = 256 * 1024;
    void *a = NULL, *y = NULL, *big = NULL, *graph = NULL;
    CHECK_OK(be->alloc(be, n * 2, &a));
    CHECK_OK(be->alloc(be, n * 4, &y));
    CHECK_OK(be->alloc(be, nbig, &big));
    CHECK_OK(be->graph_begin(be));
    be->memset(be, a, 0x3f, n * 2);
    be->add(be, (float *)y, a, n);
    be->memset(be, big, 0, nbig);
    CHECK_OK(be->graph_end(be, &graph));
    CHECK(graph != NULL);
    float *y0 = t_rand_f32(n, 1.0f), *yg = (float *)malloc(n * 4);
    unsigned char *ab = (unsigned char *)malloc(n * 2), *bb = (unsigned char *)malloc(nbig);
    const float add = di_bf16_to_f32(0x3f3f);
    for (int rep = 0; rep < 2 && graph; rep++) {
        memset(ab, 0xff, n * 2);
        memset(bb, 0xff, nbig);
        be->upload(be, a, ab, n * 2);
        be->upload(be, big, bb, nbig);
        be->upload(be, y, y0, n * 4);
        CHECK_OK(be->graph_launch(be, graph));
        CHECK_OK(be->download(be, yg, y, n * 4));
        CHECK_OK(be->download(be, ab, a, n * 2));
        CHECK_OK(be->download(be, bb, big, nbig));
        size_t bad_a = 0, bad_b = 0, bad_y = 0;
        for (size_t i = 0; i < n * 2; i++) bad_a += ab[i] != 0x3f;
        for (size_t i = 0; i < nbig; i++) bad_b += bb[i] != 0;
        for (size_t i = 0; i < n; i++) bad_y += yg[i] != y0[i] + add;
        CHECK_MSG(bad_a == 0 && bad_b == 0 && bad_y == 0,
                  "graph with memsets as fill kernels, replay %d: %zu bytes of the small memset, %zu of the large "
                  "one and %zu sums wrong",
                  rep, bad_a, bad_b, bad_y);
    }
    printf("  graph with DEEPINFER_CUDA_GRAPH_FILL=1 (a 4 KB and a 256 KB memset around an add): 2 replays checked\n");
    free(y0); free(yg); free(ab); free(bb);
    be->graph_free(be, graph);
    be->free(be, a); be->free(be, y); be->free(be, big);
    di_backend_free(be);
}

/* copy_out inside a capture (a backend capability, backend.h): the copy and its fence are
 * graph nodes, so each replay copies what the ops before it wrote into pinned memory and
 * fence_wait returns once it has landed. The ops captured after it are not ordered after the
 * copy (backend.h), so the second add writes another buffer z (adding into y would race with
 * the copy, as nothing after a step's tail copy writes what it reads). */
static void test_graph_copy_out(void) {
    di_backend *be = g_gpu;
    if (!be->copy_out) { /* DEEPINFER_CUDA_ASYNC_COPIES=0: reported, not counted as a pass */
        printf("  graph with a captured copy_out: NOT RUN (no asynchronous copies)\n");
        return;
    }
    size_t n = 4096;
    void *a = NULL, *y = NULL, *z = NULL, *graph = NULL;
    float *host = NULL;
    CHECK_OK(be->alloc(be, n * 2, &a));
    CHECK_OK(be->alloc(be, n * 4, &y));
    CHECK_OK(be->alloc(be, n * 4, &z));
    CHECK_OK(be->host_alloc(be, n * 4, (void **)&host));
    if (!a || !y || !z || !host) return;
    CHECK_OK(be->graph_begin(be));
    be->memset(be, a, 0x3f, n * 2);
    be->add(be, (float *)y, a, n);
    be->copy_out(be, host, y, n * 4, 2);
    be->add(be, (float *)z, a, n);
    CHECK_OK(be->graph_end(be, &graph));
    CHECK(graph != NULL);
    const float add = di_bf16_to_f32(0x3f3f);
    for (int rep = 0; rep < 2 && graph; rep++) {
        float *y0 = t_rand_f32(n, 1.0f);
        for (size_t i = 0; i < n; i++) host[i] = NAN;
        be->upload(be, y, y0, n * 4);
        be->upload(be, z, y0, n * 4);
        CHECK_OK(be->graph_launch(be, graph));
        CHECK_OK(be->fence_wait(be, 2));
        size_t bad_mid = 0, bad_end = 0;
        for (size_t i = 0; i < n; i++) bad_mid += !(host[i] == y0[i] + add);
        float *yg = g_get_f32(y, n), *zg = g_get_f32(z, n);
        for (size_t i = 0; i < n; i++) bad_end += !(yg[i] == y0[i] + add) + !(zg[i] == y0[i] + add);
        CHECK_MSG(bad_mid == 0 && bad_end == 0,
                  "graph with a copy_out between two adds, replay %d: %zu copied values and %zu final sums wrong", rep,
                  bad_mid, bad_end);
        free(y0);
        free(yg);
        free(zg);
    }
    printf("  graph with a captured copy_out + fence between two adds: 2 replays checked\n");
    be->graph_free(be, graph);
    be->host_free(be, host);
    be->free(be, a);
    be->free(be, y);
    be->free(be, z);
}

static void test_graph(void) {
    /* capture one residual step (add_rmsnorm with its f32 copy, the router, a projection
     * accumulated into h, add), replay on new inputs, compare with the eager result */
    int T = 4, D = 2048, N = D, k = 6;
    resid_fix f;
    resid_fix_init(&f, T, D, 64, k, 0.05f);
    void *graph = NULL;
#define STEP()                                                                                 \
    do {                                                                                       \
        g_gpu->add_rmsnorm(g_gpu, f.dh, NULL, f.dn, f.dnf, &f.wn, 1e-6f, T, D);                \
        g_gpu->moe_route(g_gpu, (int32_t *)f.didx, f.dw, f.dnf, &f.wg, NULL, &f.rp, T, f.dscr); \
        g_gpu->matmul(g_gpu, f.dh, D, f.dn, D, &f.wm, T, DI_MM_OUT_F32 | DI_MM_ACCUMULATE);    \
        g_gpu->add(g_gpu, f.dh, f.dn, (size_t)T * N);                                          \
    } while (0)
    CHECK_OK(g_gpu->graph_begin(g_gpu));
    STEP();
    CHECK_OK(g_gpu->graph_end(g_gpu, &graph));
    CHECK(graph != NULL);
    for (int rep = 0; rep < 3 && graph; rep++) {
        float *x = t_rand_f32((size_t)T * D, 2.0f);
        g_gpu->upload(g_gpu, f.dh, x, (size_t)T * D * 4);
        g_poison(f.dw, (size_t)T * k * 4);
        CHECK_OK(g_gpu->graph_launch(g_gpu, graph));
        float *got = g_get_f32(f.dh, (size_t)T * D), *gw = g_get_f32(f.dw, (size_t)T * k);
        g_gpu->upload(g_gpu, f.dh, x, (size_t)T * D * 4);
        g_poison(f.dw, (size_t)T * k * 4);
        STEP();
        float *eager = g_get_f32(f.dh, (size_t)T * D), *ew = g_get_f32(f.dw, (size_t)T * k);
        T_CHECK("graph replay == eager (residual step: h)", got, eager, (size_t)T * D, 0, 0);
        T_CHECK("graph replay == eager (router weights)", gw, ew, (size_t)T * k, 0, 0);
        free(got); free(eager); free(gw); free(ew); free(x);
    }
#undef STEP
    g_gpu->graph_free(g_gpu, graph);
    resid_fix_free(&f);
    test_graph_fill();
    test_graph_copy_out();
}

/* ---------------------------------------------------------------- lanes ---- */

/* Two-lane concurrency: a chain of projections on the side lane (long: 4 dependent GEMMs) while
 * the main lane routes and accumulates into h, then the main lane adds the side's result. The
 * side lane may pick other kernel configurations than the main lane for the same op (its GEMVs'
 * K split, its cuBLASLt plans' SM target: cuda_internal.h side_gemv_want / side_sms), so two
 * lanes eager is checked against one lane within bf16 tolerance, and every other two-lane run
 * (graph replays, the resumed fork) bit for bit against two lanes eager (the same kernels on
 * the same lanes); the router stays on the main lane, so its weights match one lane bit for
 * bit. The side's output is NaN-poisoned before every run, so a missing join shows. */
static void test_lanes(void) {
    int T = 4, D = 2048, E = 64, k = 6;
    CHECK_MSG(g_gpu->side_begin != NULL && g_gpu->side_end != NULL && g_gpu->side_join != NULL,
              "cuda backend has no side lane ops");
    if (!g_gpu->side_begin) return;
    resid_fix f;
    resid_fix_init(&f, T, D, E, k, 0.03f);
    void *da = g_alloc((size_t)T * D * 2), *db = g_alloc((size_t)T * D * 2);
    int forked = 0;
    /* lanes = 0: everything on the main lane, in the same order; resume (with side_resume,
     * which DEEPINFER_CUDA_Q_FIRST=0 drops): the main lane's ops issued between the fork and
     * the side lane's, which then continue the fork without a new one */
#define LMAIN()                                                                                \
    do { /* the main lane's ops beside the side lane's chain */                                \
        g_gpu->moe_route(g_gpu, (int32_t *)f.didx, f.dw, f.dnf, &f.wg, NULL, &f.rp, T, f.dscr); \
        g_gpu->matmul(g_gpu, f.dh, D, f.dn, D, &f.wm, T, DI_MM_OUT_F32 | DI_MM_ACCUMULATE);    \
    } while (0)
#define LSTEP(lanes, resume)                                                                   \
    do {                                                                                       \
        g_gpu->add_rmsnorm(g_gpu, f.dh, NULL, f.dn, f.dnf, &f.wn, 1e-6f, T, D);                \
        int side_ = (lanes) && g_gpu->side_begin(g_gpu, T);                                    \
        int res_ = side_ && (resume);                                                          \
        forked |= side_;                                                                       \
        if (res_) {                                                                            \
            g_gpu->side_end(g_gpu);                                                            \
            LMAIN();                                                                           \
            g_gpu->side_resume(g_gpu);                                                         \
        }                                                                                      \
        g_gpu->matmul(g_gpu, da, D, f.dn, D, &f.wm, T, 0);                                     \
        g_gpu->matmul(g_gpu, db, D, da, D, &f.wm, T, 0);                                       \
        g_gpu->matmul(g_gpu, da, D, db, D, &f.wm, T, 0);                                       \
        g_gpu->matmul(g_gpu, db, D, da, D, &f.wm, 1, 0);                                       \
        g_gpu->matmul(g_gpu, db, D, da, D, &f.wm, T, 0);                                       \
        if (side_) g_gpu->side_end(g_gpu);                                                     \
        if (!res_) LMAIN();                                                                    \
        if (side_) g_gpu->side_join(g_gpu);                                                    \
        g_gpu->add(g_gpu, f.dh, db, (size_t)T * D);                                            \
    } while (0)
    const int nres = g_gpu->side_resume ? 2 : 1; /* the plain fork, and the resumed one */
    void *graphs[2] = {NULL, NULL};
    for (int rs = 0; rs < nres; rs++) {
        CHECK_OK(g_gpu->graph_begin(g_gpu));
        LSTEP(1, rs);
        CHECK_OK(g_gpu->graph_end(g_gpu, &graphs[rs]));
        CHECK(graphs[rs] != NULL);
    }
    for (int rep = 0; rep < 4; rep++) {
        float *x = t_rand_f32((size_t)T * D, 2.0f), *res[5], *rw[5];
        /* 0: one lane, 1: two lanes eager, 2: two lanes replayed; with side_resume 3 / 4: the
         * resumed fork eager / replayed */
        const int nmode = nres == 2 ? 5 : 3;
        for (int mode = 0; mode < nmode; mode++) {
            g_gpu->upload(g_gpu, f.dh, x, (size_t)T * D * 4);
            g_poison(da, (size_t)T * D * 2);
            g_poison(db, (size_t)T * D * 2);
            g_poison(f.dw, (size_t)T * k * 4);
            void *gm = mode == 2 ? graphs[0] : mode == 4 ? graphs[1] : NULL;
            if (mode == 2 || mode == 4) {
                if (gm) CHECK_OK(g_gpu->graph_launch(g_gpu, gm));
            } else {
                LSTEP(mode > 0, mode == 3);
            }
            res[mode] = g_get_f32(f.dh, (size_t)T * D);
            rw[mode] = g_get_f32(f.dw, (size_t)T * k);
        }
        static const char *names[5] = {"one lane", "two lanes eager", "two lanes replayed", "resumed side lane eager",
                                       "resumed side lane replayed"};
        char what[96];
        snprintf(what, sizeof what, "%s ~ one lane (h)", names[1]);
        T_CHECK(what, res[1], res[0], (size_t)T * D, TOL_L2, TOL_MAX);
        for (int mode = 1; mode < nmode; mode++) {
            if ((mode == 2 && !graphs[0]) || (mode == 4 && !graphs[1])) continue;
            if (mode > 1) {
                snprintf(what, sizeof what, "%s == two lanes eager (h)", names[mode]);
                T_CHECK(what, res[mode], res[1], (size_t)T * D, 0, 0);
            }
            snprintf(what, sizeof what, "%s == one lane (router weights)", names[mode]);
            T_CHECK(what, rw[mode], rw[0], (size_t)T * k, 0, 0);
        }
        for (int mode = 0; mode < nmode; mode++) {
            free(res[mode]);
            free(rw[mode]);
        }
        free(x);
    }
#undef LSTEP
#undef LMAIN
    const char *ln = getenv("DEEPINFER_CUDA_LANES");
    if (!(ln && ln[0] == '0')) CHECK_MSG(forked, "side_begin never forked at T = %d", T);
    g_gpu->graph_free(g_gpu, graphs[0]);
    g_gpu->graph_free(g_gpu, graphs[1]);
    g_free(da); g_free(db);
    resid_fix_free(&f);
}

int main(int argc, char **argv) {
    const t_group groups[] = {{"reserve", reserve_gpu}, {"rows", test_rows}, {"gemm", test_gemm}, {"silu", test_silu}, {"bmm", test_bmm},
                              {"graph", test_graph}, {"lanes", test_lanes}};
    /* reserve always runs first (it is what a model does at load) */
    return t_main_first_always(argc, argv, groups, (int)(sizeof groups / sizeof groups[0]));
}
