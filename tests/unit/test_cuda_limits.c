/* test_cuda_limits.c - the CUDA backend's load-time shape check (di_cuda_check_dims,
 * src/backend/cuda/cuda_limits.cu), without a device: every DeepSeek-family shape passes, each
 * limit holds at its boundary, and one past it is refused with DI_ERR_UNSUPPORTED naming the
 * config.json field, the value and the limit. Built only with the CUDA backend. */
#include "backend/backend.h"
#include "core/status.h"
#include "test_util.h"

static const char *W = "m/config.json";

static di_mla_dims mla(int H, int dn, int dr, int dv, int r) { return (di_mla_dims){H, dn, dr, dv, r, 0.1f}; }

/* refused, and the message names every given piece */
static void refused(int prec, const di_mla_dims *m, const di_indexer_dims *ix, const char *a, const char *b,
                    const char *c) {
    di_status s = di_cuda_check_dims(prec, W, m, ix);
    const char *e = di_last_error();
    CHECK_MSG(s == DI_ERR_UNSUPPORTED, "status %d", (int)s);
    CHECK_MSG(strstr(e, W) && strstr(e, a) && (!b || strstr(e, b)) && (!c || strstr(e, c)), "message: %s", e);
}

static void test_real_models_pass(void) {
    const int precs[2] = {DI_PRECISION_BF16, DI_PRECISION_F32};
    di_mla_dims v3 = mla(128, 128, 64, 128, 512), v2lite = mla(16, 128, 64, 128, 512), kimi = mla(64, 128, 64, 128, 512);
    di_indexer_dims v32 = {64, 128, 2048, 0.088f, 0.125f};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(di_cuda_check_dims(precs[i], W, &v3, NULL));
        CHECK_OK(di_cuda_check_dims(precs[i], W, &v2lite, NULL));
        CHECK_OK(di_cuda_check_dims(precs[i], W, &kimi, NULL));
        CHECK_OK(di_cuda_check_dims(precs[i], W, &v3, &v32));
        /* the tiny test presets' odd shapes */
        di_mla_dims tiny = mla(4, 24, 16, 20, 40);
        di_indexer_dims tix = {4, 32, 64, 0.17f, 0.5f};
        CHECK_OK(di_cuda_check_dims(precs[i], W, &tiny, &tix));
    }
    CHECK_OK(di_cuda_check_dims(DI_PRECISION_DEFAULT, NULL, &v3, NULL)); /* no `where`: still fine */
}

static void test_bf16_limits(void) {
    const int p = DI_PRECISION_BF16;
    di_mla_dims at = mla(128, 704, 64, 512, 512); /* every limit exactly: r 512, rope 64, dv 512, dn + dr 768 */
    CHECK_OK(di_cuda_check_dims(p, W, &at, NULL));
    at = mla(16, 640, 128, 128, 512); /* rope 128 */
    CHECK_OK(di_cuda_check_dims(p, W, &at, NULL));
    di_mla_dims m = mla(128, 128, 64, 128, 513);
    refused(p, &m, NULL, "'kv_lora_rank'", "513", "512");
    m = mla(128, 128, 64, 128, 1024);
    refused(p, &m, NULL, "'kv_lora_rank'", "1024", "--device cpu");
    m = mla(16, 128, 130, 128, 512);
    refused(p, &m, NULL, "'qk_rope_head_dim'", "130", "128");
    m = mla(16, 128, 64, 520, 512);
    refused(p, &m, NULL, "'v_head_dim'", "520", "512");
    m = mla(16, 706, 64, 128, 512); /* 706 + 64 = 770 */
    refused(p, &m, NULL, "'qk_nope_head_dim'", "770", "768");
}

static void test_f32_limits(void) {
    const int p = DI_PRECISION_F32;
    /* the fp32 attention keeps 2 r + dr + 64 floats in shared memory (227 KB: 58112 floats) */
    di_mla_dims m = mla(16, 128, 64, 128, 1024); /* wider than bf16 takes, fine in fp32 */
    CHECK_OK(di_cuda_check_dims(p, W, &m, NULL));
    m = mla(16, 128, 64, 128, 28992); /* 2 * 28992 + 64 + 64 = 58112 */
    CHECK_OK(di_cuda_check_dims(p, W, &m, NULL));
    m = mla(16, 128, 66, 128, 28992);
    refused(p, &m, NULL, "'kv_lora_rank'", "28992", "shared memory");
}

static void test_indexer_limits(void) {
    di_mla_dims v3 = mla(128, 128, 64, 128, 512);
    /* the generic kernel: (nh (hd + 1) + nh + 8 hd) floats of 227 KB */
    di_indexer_dims big = {512, 128, 2048, 0.088f, 0.044f};
    refused(DI_PRECISION_BF16, &v3, &big, "'index_n_heads'", "512", "shared memory");
    refused(DI_PRECISION_F32, &v3, &big, "'index_head_dim'", "128", NULL);
    di_indexer_dims ok = {128, 256, 2048, 0.0625f, 0.088f}; /* (128 * 257 + 128 + 2048) * 4 = 140 KB */
    CHECK_OK(di_cuda_check_dims(DI_PRECISION_BF16, W, &v3, &ok));
    CHECK_OK(di_cuda_check_dims(DI_PRECISION_BF16, W, NULL, NULL));
}

TEST_MAIN(test_real_models_pass, test_bf16_limits, test_f32_limits, test_indexer_limits)
