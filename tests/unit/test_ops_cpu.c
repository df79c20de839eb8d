/* test_ops_cpu.c - the CPU backend's GEMM, weight upload/dequantization and row-wise ops
 * (embed, rmsnorm, add_rmsnorm, silu_mul, add, gather, rope, kv_write, kv_copy_blocks) against
 * direct double-precision computations on random inputs of awkward sizes. */
#include <stdio.h>

#include "backend/cpu/cpu_internal.h"
#include "core/dtype.h"
#include "core/status.h"
#include "ops_test_util.h"
#include "test_util.h"

static di_backend *g_be1, *g_be3;  /* 1 thread and 3 threads */

static void ref_gemm(double *y, const float *x, int ldx, const float *W, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)x[(size_t)i * ldx + k] * W[(size_t)j * K + k];
            y[(size_t)i * N + j] = s;
        }
}

static void test_matmul(void) {
    const int Ms[] = {1, 3, 4, 5, 17, 70}, Ns[] = {1, 2, 3, 7, 33, 130}, Ks[] = {1, 5, 8, 13, 67, 300};
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            for (int c = 0; c < 6; c += (a + b) % 2 + 1) {
                int M = Ms[a], N = Ns[b], K = Ks[c], ldx = K + 3, ldy = N + 2;
                float *x = rand_vec((size_t)M * ldx, 1), *W = rand_vec((size_t)N * K, 1);
                float *y1 = rand_vec((size_t)M * ldy, 1), *y3 = malloc((size_t)M * ldy * sizeof(float));
                memcpy(y3, y1, (size_t)M * ldy * sizeof(float));
                float *y0 = malloc((size_t)M * ldy * sizeof(float));
                memcpy(y0, y1, (size_t)M * ldy * sizeof(float));
                double *ref = malloc((size_t)M * N * sizeof(double));
                ref_gemm(ref, x, ldx, W, M, N, K);
                di_weight w1 = upload_f32(g_be1, 1, N, K, W), w3 = upload_f32(g_be3, 1, N, K, W);
                g_be1->matmul(g_be1, y1, ldy, x, ldx, &w1, M, 0);
                g_be3->matmul(g_be3, y3, ldy, x, ldx, &w3, M, DI_MM_ACCUMULATE);
                double e1 = 0, e3 = 0, mr = 1e-30, mr3 = 1e-30;
                int bitwise = 1, untouched = 1;
                for (int i = 0; i < M; i++) {
                    for (int j = 0; j < N; j++) {
                        double r = ref[(size_t)i * N + j];
                        double acc = r + y0[(size_t)i * ldy + j];
                        e1 = fmax(e1, fabs(y1[(size_t)i * ldy + j] - r));
                        e3 = fmax(e3, fabs(y3[(size_t)i * ldy + j] - acc));
                        mr = fmax(mr, fabs(r));
                        mr3 = fmax(mr3, fabs(acc));
                    }
                    for (int j = N; j < ldy; j++)  /* padding columns are not written */
                        untouched &= y1[(size_t)i * ldy + j] == y0[(size_t)i * ldy + j];
                }
                /* thread count must not change a single bit */
                memcpy(y3, y0, (size_t)M * ldy * sizeof(float));
                g_be3->matmul(g_be3, y3, ldy, x, ldx, &w3, M, 0);
                for (int i = 0; i < M * ldy; i++) bitwise &= memcmp(&y1[i], &y3[i], 4) == 0;
                CHECK_MSG(e1 / mr < 1e-5 && e3 / mr3 < 1e-5, "M=%d N=%d K=%d err %g %g", M, N, K, e1 / mr, e3 / mr3);
                CHECK_MSG(bitwise, "M=%d N=%d K=%d: 1-thread and 3-thread results differ", M, N, K);
                CHECK(untouched);
                g_be1->weight_free(g_be1, &w1);
                g_be3->weight_free(g_be3, &w3);
                free(x); free(W); free(y0); free(y1); free(y3); free(ref);
            }
    /* batch invariance: row i of a 37-row product equals the same row computed alone */
    int M = 37, N = 29, K = 91;
    float *x = rand_vec((size_t)M * K, 1), *W = rand_vec((size_t)N * K, 1);
    float *y = malloc((size_t)M * N * sizeof(float)), y1[29];
    di_weight w = upload_f32(g_be3, 1, N, K, W);
    g_be3->matmul(g_be3, y, N, x, K, &w, M, 0);
    int same = 1;
    for (int i = 0; i < M; i++) {
        g_be3->matmul(g_be3, y1, N, x + (size_t)i * K, K, &w, 1, 0);
        same &= memcmp(y1, y + (size_t)i * N, sizeof y1) == 0;
    }
    CHECK_MSG(same, "a row's result depends on the other rows of the batch");
    g_be3->weight_free(g_be3, &w);
    free(x); free(W); free(y);
}

/* Both kernel instantiations (baseline and, where the CPU has it, AVX2+FMA) against the
 * direct computation, including every edge path (M % 4, N % 2, N % 4, K % 8). */
static void test_gemm_isas(void) {
    fprintf(stderr, "   gemm kernels in use: %s\n", di_cpu_isa());
    int M = 11, N = 9, K = 37, ldx = 40, ldy = 12;
    float *x = rand_vec((size_t)M * ldx, 1), *W = rand_vec((size_t)N * K, 1), *y = malloc((size_t)M * ldy * 4);
    double *ref = malloc((size_t)M * N * sizeof(double));
    ref_gemm(ref, x, ldx, W, M, N, K);
    for (int isa = 0; isa < 1 + di_cpu_have_avx2(); isa++) {
        for (int acc = 0; acc < 2; acc++) {
            for (int i = 0; i < M * ldy; i++) y[i] = acc ? 1.0f : -7.0f;
            if (isa) di_cpu_gemm_serial_avx2(y, ldy, x, ldx, W, K, M, N, K, acc);
            else di_cpu_gemm_serial_base(y, ldy, x, ldx, W, K, M, N, K, acc);
            double err = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) err = fmax(err, fabs(y[i * ldy + j] - (ref[i * N + j] + acc)));
            CHECK_MSG(err < 1e-5, "isa %d accumulate %d: err %g", isa, acc, err);
            /* every output equals the dot kernel of the same instantiation, bit for bit */
            int same = 1;
            for (int i = 0; i < M && !acc; i++)
                for (int j = 0; j < N; j++) {
                    float d = isa ? di_cpu_dot_avx2(x + i * ldx, W + j * K, K) : di_cpu_dot_base(x + i * ldx, W + j * K, K);
                    same &= memcmp(&d, &y[i * ldy + j], 4) == 0;
                }
            CHECK_MSG(same, "isa %d: tiled kernels and the dot kernel disagree in the last bits", isa);
        }
        float ya[37], yb[37];
        for (int i = 0; i < 37; i++) ya[i] = yb[i] = x[i];
        if (isa) di_cpu_axpy_avx2(ya, 0.37f, W, 37); else di_cpu_axpy_base(ya, 0.37f, W, 37);
        double err = 0;
        for (int i = 0; i < 37; i++) err = fmax(err, fabs(ya[i] - (yb[i] + 0.37 * W[i])));
        CHECK_MSG(err < 1e-6, "isa %d: axpy err %g", isa, err);
    }
    free(x); free(W); free(y); free(ref);
}

static void test_bmm(void) {
    int T = 5, H = 3, in = 11, out = 6, ldx = 40, hsx = 12, ldy = 25, hsy = 7;
    float *x = rand_vec((size_t)T * ldx, 1), *W = rand_vec((size_t)H * out * in, 1);
    float *y = calloc((size_t)T * ldy, sizeof(float));
    di_weight w = upload_f32(g_be3, H, out, in, W);
    g_be3->bmm(g_be3, y, ldy, hsy, x, ldx, hsx, &w, T);
    double err = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < out; i++) {
                double s = 0;
                for (int j = 0; j < in; j++)
                    s += (double)x[t * ldx + h * hsx + j] * W[((size_t)h * out + i) * in + j];
                err = fmax(err, fabs(y[t * ldy + h * hsy + i] - s));
            }
    CHECK_MSG(err < 1e-5, "bmm err %g", err);
    g_be3->weight_free(g_be3, &w);
    free(x); free(W); free(y);
}

/* Weight upload: bf16 / f16 / fp8 with partial 128x128... blocks (here 4x3 for small sizes),
 * row0 offsets, concatenated parts, stacks and the transposed layout. */
static void test_weight_upload(void) {
    int rows = 10, cols = 7, br = 4, bc = 3, src_rows = 14, sr = (src_rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    uint16_t bf[14 * 7], hf[14 * 7];
    uint8_t f8[14 * 7];
    float scale[4 * 3], ref_bf[14 * 7], ref_hf[14 * 7], ref_f8[14 * 7];
    for (int i = 0; i < sr * sc; i++) scale[i] = 0.01f + 0.1f * (float)i;
    for (int i = 0; i < src_rows * cols; i++) {
        bf[i] = di_f32_to_bf16(rng_f(2));
        hf[i] = di_f32_to_f16(rng_f(2));
        f8[i] = di_f32_to_fp8e4m3(rng_f(300));
        ref_bf[i] = di_bf16_to_f32(bf[i]);
        ref_hf[i] = di_f16_to_f32(hf[i]);
        int r = i / cols, c = i % cols;
        ref_f8[i] = di_fp8e4m3_to_f32(f8[i]) * scale[(r / br) * sc + c / bc];
    }
    /* matrix i of the stack = [bf16 rows 2..5 ; fp8 rows (3+i)..(3+i+rows-1)] */
    int n = 2, r1 = 4;
    di_host_matrix parts[4];
    for (int i = 0; i < n; i++) {
        parts[2 * i] = (di_host_matrix){"a.bf16", DI_DTYPE_BF16, 2, r1, cols, bf, NULL, 0, 0};
        parts[2 * i + 1] = (di_host_matrix){"b.fp8", DI_DTYPE_F8_E4M3, 3 + i, rows, cols, f8, scale, br, bc};
    }
    for (int layout = 0; layout < 2; layout++) {
        di_weight w;
        CHECK_OK(g_be1->weight_upload(g_be1, n, 2, parts, (di_weight_layout)layout, &w));
        CHECK_EQ_INT(w.n, n);
        CHECK_EQ_INT(w.rows, layout ? cols : r1 + rows);
        CHECK_EQ_INT(w.cols, layout ? r1 + rows : cols);
        int ok = 1;
        for (int i = 0; i < n; i++)
            for (int r = 0; r < r1 + rows; r++)
                for (int c = 0; c < cols; c++) {
                    float want = r < r1 ? ref_bf[(2 + r) * cols + c] : ref_f8[(3 + i + r - r1) * cols + c];
                    const float *m = (const float *)w.data + (size_t)i * (r1 + rows) * cols;
                    float got = layout ? m[c * (r1 + rows) + r] : m[r * cols + c];
                    ok &= got == want;
                }
        CHECK_MSG(ok, "dequantized weight differs (layout %d)", layout);
        g_be1->weight_free(g_be1, &w);
        CHECK(w.data == NULL);
    }
    di_host_matrix h16 = {"c.f16", DI_DTYPE_F16, 0, src_rows, cols, hf, NULL, 0, 0};
    di_weight w;
    CHECK_OK(g_be1->weight_upload(g_be1, 1, 1, &h16, DI_WEIGHT_PLAIN, &w));
    CHECK(memcmp(w.data, ref_hf, sizeof ref_hf) == 0);
    g_be1->weight_free(g_be1, &w);
    /* errors name the tensor */
    di_host_matrix bad = {"d.fp8", DI_DTYPE_F8_E4M3, 0, 2, cols, f8, NULL, 0, 0};
    CHECK(g_be1->weight_upload(g_be1, 1, 1, &bad, DI_WEIGHT_PLAIN, &w) != DI_OK);
    CHECK(strstr(di_last_error(), "d.fp8") != NULL);
    di_host_matrix i32 = {"e.i32", DI_DTYPE_I32, 0, 2, cols, f8, NULL, 0, 0};
    CHECK(g_be1->weight_upload(g_be1, 1, 1, &i32, DI_WEIGHT_PLAIN, &w) == DI_ERR_UNSUPPORTED);
    CHECK(strstr(di_last_error(), "e.i32") != NULL);
    di_host_matrix mism[2] = {{"f.a", DI_DTYPE_BF16, 0, 2, cols, bf, NULL, 0, 0},
                              {"f.b", DI_DTYPE_BF16, 0, 2, cols - 1, bf, NULL, 0, 0}};
    CHECK(g_be1->weight_upload(g_be1, 1, 2, mism, DI_WEIGHT_PLAIN, &w) != DI_OK);
    CHECK(strstr(di_last_error(), "f.b") != NULL);
    g_be1->weight_free(g_be1, NULL);
}

static void test_norms_and_rows(void) {
    int T = 5, D = 37, ld = 45;
    float eps = 1e-6f;
    float *x = rand_vec((size_t)T * ld, 3), *wv = rand_vec((size_t)D, 1), *out = calloc((size_t)T * ld, 4);
    di_weight w = upload_f32(g_be1, 1, 1, D, wv);
    g_be1->rmsnorm(g_be1, out, ld, x, ld, &w, eps, T, D);
    double err = 0;
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[t * ld + i] * x[t * ld + i];
        double inv = 1.0 / sqrt(ss / D + eps);
        for (int i = 0; i < D; i++) err = fmax(err, fabs(out[t * ld + i] - wv[i] * x[t * ld + i] * inv));
        for (int i = D; i < ld; i++) err = fmax(err, fabs(out[t * ld + i]));  /* padding untouched */
    }
    CHECK_MSG(err < 1e-5, "rmsnorm err %g", err);
    /* in place on the first D of each row (kv_a_layernorm on the latent part) */
    float *x2 = malloc((size_t)T * ld * 4);
    memcpy(x2, x, (size_t)T * ld * 4);
    g_be1->rmsnorm(g_be1, x2, ld, x2, ld, &w, eps, T, D);
    int same = 1;
    for (int t = 0; t < T; t++) {
        same &= memcmp(x2 + t * ld, out + t * ld, (size_t)D * 4) == 0;
        same &= memcmp(x2 + t * ld + D, x + t * ld + D, (size_t)(ld - D) * 4) == 0;
    }
    CHECK(same);
    /* add_rmsnorm: h += delta, out = norm(h) */
    float *h = rand_vec((size_t)T * D, 2), *delta = rand_vec((size_t)T * D, 2), *o2 = malloc((size_t)T * D * 4);
    float *hsum = malloc((size_t)T * D * 4), *o3 = malloc((size_t)T * D * 4);
    for (int i = 0; i < T * D; i++) hsum[i] = h[i] + delta[i];
    float *of = malloc((size_t)T * D * 4);
    g_be1->add_rmsnorm(g_be1, h, delta, o2, of, &w, eps, T, D);
    g_be1->rmsnorm(g_be1, o3, D, hsum, D, &w, eps, T, D);
    CHECK(memcmp(h, hsum, (size_t)T * D * 4) == 0);
    CHECK(memcmp(o2, o3, (size_t)T * D * 4) == 0);
    CHECK(memcmp(of, o3, (size_t)T * D * 4) == 0); /* the f32 copy: the same values */
    g_be1->add_rmsnorm(g_be1, h, NULL, o2, NULL, &w, eps, T, D);  /* no delta: plain norm */
    CHECK(memcmp(o2, o3, (size_t)T * D * 4) == 0);
    free(of);
    /* silu_mul */
    int I = 9;
    float *gu = rand_vec((size_t)T * 2 * I, 6), *sm = malloc((size_t)T * I * 4);
    g_be1->silu_mul(g_be1, sm, gu, T, I);
    err = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < I; i++) {
            double g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
            err = fmax(err, fabs(sm[t * I + i] - g / (1 + exp(-g)) * u));
        }
    CHECK_MSG(err < 1e-5, "silu_mul err %g", err);
    /* add, gather_rows, embed */
    float a[7] = {1, 2, 3, 4, 5, 6, 7}, b[7] = {7, 6, 5, 4, 3, 2, 1};
    g_be1->add(g_be1, a, b, 7);
    int all8 = 1;
    for (int i = 0; i < 7; i++) all8 &= a[i] == 8.0f;
    CHECK(all8);
    int32_t rows[3] = {4, 0, 4};
    float *g = malloc(3 * (size_t)D * 4);
    g_be1->gather_rows(g_be1, g, hsum, rows, 3, D);
    CHECK(memcmp(g, hsum + 4 * D, (size_t)D * 4) == 0 && memcmp(g + D, hsum, (size_t)D * 4) == 0 &&
          memcmp(g + 2 * D, hsum + 4 * D, (size_t)D * 4) == 0);
    int V = 11;
    float *tab = rand_vec((size_t)V * D, 1), *e = malloc(3 * (size_t)D * 4);
    di_weight wt = upload_f32(g_be1, 1, V, D, tab);
    int32_t ids[3] = {10, 0, 3};
    g_be1->embed(g_be1, e, &wt, ids, 3);
    CHECK(memcmp(e, tab + 10 * D, (size_t)D * 4) == 0 && memcmp(e + 2 * D, tab + 3 * D, (size_t)D * 4) == 0);
    g_be1->weight_free(g_be1, &wt);
    g_be1->weight_free(g_be1, &w);
    free(x); free(wv); free(out); free(x2); free(h); free(delta); free(o2); free(hsum); free(o3);
    free(gu); free(sm); free(g); free(tab); free(e);
}

/* RoPE against the pair rotation written directly, both layouts, with a YaRN-like mscale. */
static void test_rope(void) {
    int T = 4, H = 3, dn = 5, dr = 10, hs = dn + dr, ld = H * hs + 2;
    int32_t pos[4] = {0, 1, 77, 300};
    float inv[5] = {1.0f, 0.3f, 0.05f, 0.004f, 3.3e-5f};
    for (int il = 0; il < 2; il++) {
        di_rope_params rp = {dr, il, 1.25f, inv};
        float *x = rand_vec((size_t)T * ld, 1), *y = malloc((size_t)T * ld * 4);
        memcpy(y, x, (size_t)T * ld * 4);
        g_be1->rope(g_be1, y + dn, ld, H, hs, pos, T, &rp);
        double err = 0;
        int rest = 1;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                const float *xv = x + t * ld + h * hs + dn;
                const float *yv = y + t * ld + h * hs + dn;
                for (int i = 0; i < dr / 2; i++) {
                    int a = il ? 2 * i : i, b = il ? 2 * i + 1 : i + dr / 2;
                    double phi = (double)(float)((float)pos[t] * inv[i]);
                    double ya = 1.25 * (xv[a] * cos(phi) - xv[b] * sin(phi));
                    double yb = 1.25 * (xv[b] * cos(phi) + xv[a] * sin(phi));
                    err = fmax(err, fmax(fabs(yv[a] - ya), fabs(yv[b] - yb)));
                }
                rest &= memcmp(x + t * ld + h * hs, y + t * ld + h * hs, (size_t)dn * 4) == 0;
            }
        CHECK_MSG(err < 1e-5, "rope (interleave %d) err %g", il, err);
        CHECK_MSG(rest, "rope touched the nope part");
        free(x);
        free(y);
    }
}

static void test_kv_cache_ops(void) {
    int W = 9, blocks = 4, layers = 2;
    size_t stride = (size_t)blocks * DI_KV_BLOCK_SIZE * W;
    float *cache = calloc(stride * layers, 4);
    float *kv = rand_vec(3 * 12, 1);
    int32_t slots[3] = {130, -1, 5};
    g_be1->kv_write(g_be1, cache, kv, 12, slots, 3, W);
    CHECK(memcmp(cache + 130 * W, kv, (size_t)W * 4) == 0);
    CHECK(memcmp(cache + 5 * W, kv + 24, (size_t)W * 4) == 0);
    int others_zero = 1;  /* nothing else written (slot -1 skipped) */
    for (size_t i = 0; i < stride; i++)
        if ((i < 5 * (size_t)W || i >= 6 * (size_t)W) && (i < 130 * (size_t)W || i >= 131 * (size_t)W))
            others_zero &= cache[i] == 0;
    CHECK(others_zero);
    /* copy block 2 -> block 0 in both layers */
    for (size_t i = 0; i < stride; i++) cache[stride + i] = (float)i;
    int32_t src[1] = {2}, dst[1] = {0};
    g_be1->kv_copy_blocks(g_be1, cache, stride, layers, W, src, dst, 1);
    size_t bl = (size_t)DI_KV_BLOCK_SIZE * W;
    CHECK(memcmp(cache, cache + 2 * bl, bl * 4) == 0);
    CHECK(memcmp(cache + stride, cache + stride + 2 * bl, bl * 4) == 0);
    CHECK(cache[stride + 3 * bl] == (float)(3 * bl));
    free(cache);
    free(kv);
}

static void setup(void) {
    CHECK_OK(di_backend_cpu_create(1, &g_be1));
    setenv("DEEPINFER_CPU_PAR_MIN_WORK", "0", 1);  /* 3-thread backend: always threaded */
    CHECK_OK(di_backend_cpu_create(3, &g_be3));
    unsetenv("DEEPINFER_CPU_PAR_MIN_WORK");
    CHECK_EQ_INT(g_be1->caps.act_dtype, DI_DTYPE_F32);
    CHECK_EQ_INT(di_backend_act_size(g_be3), 4);
}
static void teardown(void) {
    di_backend_free(g_be1);
    di_backend_free(g_be3);
    di_backend_free(NULL);
    di_backend_options cu = {DI_DEVICE_CUDA, 0, 0, 0};
    di_backend *be = NULL;
#ifndef DI_HAVE_CUDA
    CHECK(di_backend_create(&cu, &be) == DI_ERR_UNSUPPORTED);
    CHECK(strstr(di_last_error(), "cuda") != NULL);
#endif
    (void)cu;
    (void)be;
}

TEST_MAIN(setup, test_matmul, test_gemm_isas, test_bmm, test_weight_upload, test_norms_and_rows, test_rope,
          test_kv_cache_ops, teardown)
