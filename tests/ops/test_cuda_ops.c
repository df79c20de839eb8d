/* test_cuda_ops.c - CPU vs CUDA parity of the row-wise ops, the GEMMs (bf16 / fp8, every
 * kernel path: small, tiled, cuBLASLt, generic), the per-head bmm, and CUDA-graph replay.
 * Inputs are fresh random bf16 values each run; GPU outputs are poisoned with NaN first; the
 * CPU backend (fp32) on the same bf16 operands is the reference.
 *
 *   test_cuda_ops [rows] [gemm] [bmm] [graph]      (default: all groups) */
#include "cuda_test_util.h"

/* ---------------------------------------------------------------- row ops ---- */

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
        void *dids = g_raw(ids, sizeof ids), *dout = g_alloc((size_t)T * D * 2);
        g_poison(dout, (size_t)T * D * 2);
        g_gpu->embed(g_gpu, dout, &wg, dids, T);
        float *got = g_get_act(dout, (size_t)T * D);
        T_CHECK("embed [37 x 2048]", got, ref, (size_t)T * D, 0, 0);
        int32_t rows[5] = {3, 0, 36, 3, 17};
        float *gref = (float *)malloc(5 * (size_t)D * 4);
        g_cpu->gather_rows(g_cpu, gref, ref, rows, 5, D);
        void *drows = g_raw(rows, sizeof rows), *dg = g_alloc(5 * (size_t)D * 2);
        g_poison(dg, 5 * (size_t)D * 2);
        g_gpu->gather_rows(g_gpu, dg, dout, drows, 5, D);
        float *gg = g_get_act(dg, 5 * (size_t)D);
        T_CHECK("gather_rows [5 of 37 x 2048]", gg, gref, 5 * (size_t)D, 0, 0);
        free(gg); free(gref); g_free(drows); g_free(dg);
        free(got); free(ref); g_free(dids); g_free(dout);
        g_cpu->weight_free(g_cpu, &wc); g_gpu->weight_free(g_gpu, &wg); t_weight_free(&tab);
    }
    /* rmsnorm (strided, in place) and add_rmsnorm */
    const int Ds[3] = {2048, 160, 7168};
    for (int di = 0; di < 3; di++) {
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
        /* add_rmsnorm: h += delta (h rounded to bf16 on the GPU: round the CPU's h the same way) */
        float *h = t_rand((size_t)T * D, 2.0f), *hc = (float *)malloc((size_t)T * D * 4);
        for (size_t i = 0; i < (size_t)T * D; i++) hc[i] = di_bf16_to_f32(di_f32_to_bf16(h[i] + dl[i]));
        float *nref = (float *)malloc((size_t)T * D * 4);
        g_cpu->add_rmsnorm(g_cpu, hc, NULL, nref, &wc, 1e-6f, T, D);
        void *dh = g_act(h, (size_t)T * D), *ddl = g_act(dl, (size_t)T * D);
        g_poison(dout, (size_t)T * D * 2);
        g_gpu->add_rmsnorm(g_gpu, dh, ddl, dout, &wg, 1e-6f, T, D);
        float *gh = g_get_act(dh, (size_t)T * D), *gn = g_get_act(dout, (size_t)T * D);
        snprintf(what, sizeof what, "add_rmsnorm residual [%d x %d]", T, D);
        T_CHECK(what, gh, hc, (size_t)T * D, 0, 0);
        snprintf(what, sizeof what, "add_rmsnorm norm [%d x %d]", T, D);
        T_CHECK(what, gn, nref, (size_t)T * D, TOL_L2, TOL_MAX);
        free(gh); free(gn); free(h); free(hc); free(nref); g_free(dh); g_free(ddl);
        free(ref); free(x); free(w); free(dl); g_free(dx); g_free(dout);
        g_cpu->weight_free(g_cpu, &wc); g_gpu->weight_free(g_gpu, &wg);
    }
    /* silu_mul, add */
    {
        int T = 13, I = 1408;
        float *gu = t_rand((size_t)T * 2 * I, 4.0f), *ref = (float *)malloc((size_t)T * I * 4);
        g_cpu->silu_mul(g_cpu, ref, gu, T, I);
        void *dgu = g_act(gu, (size_t)T * 2 * I), *dout = g_alloc((size_t)T * I * 2);
        g_poison(dout, (size_t)T * I * 2);
        g_gpu->silu_mul(g_gpu, dout, dgu, T, I);
        float *got = g_get_act(dout, (size_t)T * I);
        T_CHECK("silu_mul [13 x 1408]", got, ref, (size_t)T * I, TOL_L2, TOL_MAX);
        float *y = t_rand((size_t)T * I, 1.0f), *x = t_rand((size_t)T * I, 1.0f);
        void *dy = g_act(y, (size_t)T * I), *dxx = g_act(x, (size_t)T * I);
        g_cpu->add(g_cpu, y, x, (size_t)T * I);
        g_gpu->add(g_gpu, dy, dxx, (size_t)T * I);
        float *ga = g_get_act(dy, (size_t)T * I);
        T_CHECK("add [13 x 1408]", ga, y, (size_t)T * I, TOL_L2, TOL_MAX);
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
    float *x = t_rand((size_t)T * ldx, 1.0f), *y0 = t_rand((size_t)T * ldy, 1.0f);
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
    /* bf16: small (T <= 32), cuBLASLt (T > 32), generic (K % 8 != 0), awkward N */
    const int Ts[] = {1, 3, 8, 16, 17, 32, 33, 64, 100, 256};
    const int NK[][2] = {{576, 2048}, {3072, 2048}, {130, 160}, {72, 136}, {1000, 512}};
    for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
        for (size_t b = 0; b < sizeof NK / sizeof NK[0]; b++)
            gemm_case(g_gpu, Ts[a], NK[b][0], NK[b][1], 0, (a + b) % 3 == 0 ? DI_MM_ACCUMULATE : 0, (a % 2) * 8, "",
                      TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 5, 50, 36, 0, 0, 1, " (generic)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 40, 50, 36, 0, DI_MM_ACCUMULATE, 3, " (generic)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 3, 1000, 2048, 0, DI_MM_OUT_F32, 0, " (logits)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 100, 1000, 2048, 0, DI_MM_OUT_F32, 0, " (logits)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 256, 2048, 4096, 0, 0, 0, " (large)", TOL_L2, TOL_MAX);
    /* fp8 weight-only: small path and tiled path (T % 4 != 0 keeps cuBLASLt out) */
    const int Tf[] = {1, 7, 16, 32, 37, 130};
    const int NKf[][2] = {{512, 1024}, {576, 2048}, {200, 264}};
    for (size_t a = 0; a < sizeof Tf / sizeof Tf[0]; a++)
        for (size_t b = 0; b < sizeof NKf / sizeof NKf[0]; b++)
            gemm_case(g_gpu, Tf[a], NKf[b][0], NKf[b][1], 1, a % 2 ? DI_MM_ACCUMULATE : 0, 0, "", TOL_L2, TOL_MAX);
    /* fp8 weight-only through the tiled kernel (the default for more than 32 rows) */
    gemm_case(g_gpu, 64, 512, 1024, 1, 0, 0, " (weight-only)", TOL_L2, TOL_MAX);
    gemm_case(g_gpu, 256, 576, 2048, 1, DI_MM_ACCUMULATE, 0, " (weight-only)", TOL_L2, TOL_MAX);
    /* DEEPINFER_FP8_ACT_QUANT=1: 1x128 activation quantization + cuBLASLt block-scaled fp8;
     * activation rounding to e4m3 costs ~2-3% per output, so the bound is looser. The weights
     * are uploaded after reserve(): the activation buffers grow with the widest fp8 weight. */
    setenv("DEEPINFER_FP8_ACT_QUANT", "1", 1);
    di_backend *aq = NULL;
    CHECK_OK(di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0}, &aq));
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

/* cuBLASLt fp8 needs the workspace reserve() sizes (activation-quant buffers) */
static void reserve_gpu(void) {
    di_backend_reserve r = {8192, 256, 129280, {16, 128, 64, 128, 512, 0.1f}};
    CHECK_OK(g_gpu->reserve(g_gpu, &r));
}

/* ---------------------------------------------------------------- bmm ---- */

static void test_bmm(void) {
    /* q̃ = W_UKᵀ q_nope per head (W transposed, bf16) and o = W_UV ō (W plain, fp8 or bf16) */
    const int Ts[] = {1, 5, 32, 40, 130};
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

static void test_graph(void) {
    /* capture norm -> matmul -> add, replay on new inputs, compare with the eager result */
    int T = 4, D = 2048, N = 2048;
    float *w = t_rand((size_t)D, 1.0f);
    di_weight wn = t_vec_upload(g_gpu, w, D);
    t_weight m = t_weight_make(1, N, D, 0, 0.05f);
    di_weight wm = t_weight_upload(g_gpu, &m, DI_WEIGHT_PLAIN);
    void *dx = g_alloc((size_t)T * D * 2), *dn = g_alloc((size_t)T * D * 2), *dy = g_alloc((size_t)T * N * 2);
    void *graph = NULL;
    CHECK_OK(g_gpu->graph_begin(g_gpu));
    g_gpu->rmsnorm(g_gpu, dn, D, dx, D, &wn, 1e-6f, T, D);
    g_gpu->matmul(g_gpu, dy, N, dn, D, &wm, T, 0);
    g_gpu->add(g_gpu, dy, dx, (size_t)T * N);
    CHECK_OK(g_gpu->graph_end(g_gpu, &graph));
    CHECK(graph != NULL);
    for (int rep = 0; rep < 3 && graph; rep++) {
        float *x = t_rand((size_t)T * D, 2.0f);
        uint16_t *xb = t_to_bf16(x, (size_t)T * D);
        g_gpu->upload(g_gpu, dx, xb, (size_t)T * D * 2);
        g_poison(dy, (size_t)T * N * 2);
        CHECK_OK(g_gpu->graph_launch(g_gpu, graph));
        float *got = g_get_act(dy, (size_t)T * N);
        g_gpu->rmsnorm(g_gpu, dn, D, dx, D, &wn, 1e-6f, T, D);
        g_gpu->matmul(g_gpu, dy, N, dn, D, &wm, T, 0);
        g_gpu->add(g_gpu, dy, dx, (size_t)T * N);
        float *eager = g_get_act(dy, (size_t)T * N);
        T_CHECK("graph replay == eager (norm, matmul, add)", got, eager, (size_t)T * N, 0, 0);
        free(got); free(eager); free(x); free(xb);
    }
    g_gpu->graph_free(g_gpu, graph);
    g_free(dx); g_free(dn); g_free(dy);
    g_gpu->weight_free(g_gpu, &wn); g_gpu->weight_free(g_gpu, &wm);
    t_weight_free(&m);
    free(w);
}

int main(int argc, char **argv) {
    const t_group groups[] = {{"reserve", reserve_gpu}, {"rows", test_rows}, {"gemm", test_gemm}, {"bmm", test_bmm},
                              {"graph", test_graph}};
    /* reserve always runs first (it is what a model does at load) */
    return t_main_first_always(argc, argv, groups, (int)(sizeof groups / sizeof groups[0]));
}
