/* test_core.c - core utilities: dtype conversions (against values from the format specs),
 * UTF-8 validation, hashing, the string map, the thread pool, JSON field errors. */
#include <stdint.h>
#include <stdatomic.h>

#include "core/dtype.h"
#include "core/hash.h"
#include "core/json_util.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "core/utf8.h"
#include "test_util.h"

static void test_dtype(void) {
    CHECK_EQ_INT(di_f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(di_f32_to_bf16(-2.0f), 0xc000);
    CHECK(di_bf16_to_f32(0x3f80) == 1.0f);
    /* 1 + 2^-8 is a tie between bf16 1.0 and 1.0078125: round to even (1.0) */
    CHECK_EQ_INT(di_f32_to_bf16(1.00390625f), 0x3f80);
    CHECK_EQ_INT(di_f32_to_bf16(1.01171875f), 0x3f82); /* tie between 0x3f81 and 0x3f82 -> even */
    CHECK_EQ_INT(di_f32_to_f16(1.0f), 0x3c00);
    CHECK_EQ_INT(di_f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ_INT(di_f32_to_f16(1e6f), 0x7c00);
    CHECK(di_f16_to_f32(0x0001) == 5.9604644775390625e-8f);
    CHECK(di_f16_to_f32(0xc000) == -2.0f);
    /* e4m3fn: 0x7e = 448 (max), 0x08 = 2^-6 (min normal), 0x01 = 2^-9 (min subnormal), 0x38 = 1 */
    CHECK(di_fp8e4m3_to_f32(0x7e) == 448.0f);
    CHECK(di_fp8e4m3_to_f32(0x08) == 0.015625f);
    CHECK(di_fp8e4m3_to_f32(0x01) == 0.001953125f);
    CHECK(di_fp8e4m3_to_f32(0x38) == 1.0f);
    CHECK(di_fp8e4m3_to_f32(0xb8) == -1.0f);
    CHECK(isnan(di_fp8e4m3_to_f32(0x7f)));
    CHECK_EQ_INT(di_f32_to_fp8e4m3(1000.0f), 0x7e);  /* saturates */
    CHECK_EQ_INT(di_f32_to_fp8e4m3(-1.0f), 0xb8);
    CHECK_EQ_INT(di_f32_to_fp8e4m3(1.0625f), 0x38);  /* tie 1.0 / 1.125 -> even mantissa (1.0) */
    CHECK_EQ_INT(di_f32_to_fp8e4m3(1.1875f), 0x3a);  /* tie 1.125 / 1.25 -> 1.25 (even) */
    /* every finite code round-trips */
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue;
        if (di_f32_to_fp8e4m3(di_fp8e4m3_to_f32((uint8_t)c)) != (c == 0x80 ? 0x80 : c)) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    di_dtype t;
    CHECK(di_dtype_from_name("F8_E4M3", &t) && t == DI_DTYPE_F8_E4M3);
    CHECK(!di_dtype_from_name("F8_E5M2X", &t));
}

static void test_utf8(void) {
    size_t off = 99;
    CHECK(di_utf8_valid("h\xc3\xa9llo \xf0\x9f\x98\x80", 11, &off));
    CHECK(!di_utf8_valid("ab\xc0\xaf", 4, &off) && off == 2);       /* overlong '/' */
    CHECK(!di_utf8_valid("\xed\xa0\x80", 3, &off) && off == 0);     /* surrogate */
    CHECK(!di_utf8_valid("x\xf4\x90\x80\x80", 5, &off) && off == 1); /* > U+10FFFF */
    CHECK(!di_utf8_valid("\xe2\x82", 2, &off) && off == 0);         /* truncated */
    CHECK_EQ_INT(di_utf8_complete_prefix("a\xe2\x82", 3), 1);
    CHECK_EQ_INT(di_utf8_complete_prefix("a\xe2\x82\xac", 4), 4);
    char buf[4];
    CHECK_EQ_INT(di_utf8_encode(0x1F600, buf), 4);
    CHECK(memcmp(buf, "\xf0\x9f\x98\x80", 4) == 0);
    CHECK_EQ_INT(di_utf8_encode(0xD800, buf), 0);
}

static void test_hash_and_map(void) {
    const char *a = "the quick brown fox jumps over the lazy dog";
    CHECK(di_hash64(a, strlen(a), 0) == di_hash64(a, strlen(a), 0));
    CHECK(di_hash64(a, strlen(a), 0) != di_hash64(a, strlen(a), 1));
    CHECK(di_hash64(a, strlen(a) - 1, 0) != di_hash64(a, strlen(a), 0));
    /* no collisions among 100k short distinct keys */
    di_strmap *seen = di_strmap_create(100000);
    int collisions = 0;
    for (int i = 0; i < 100000; i++) {
        uint64_t h = di_hash64(&i, sizeof i, 7);
        if (di_strmap_get(seen, (const char *)&h, 8, NULL)) collisions++;
        di_strmap_put(seen, (const char *)&h, 8, i);
    }
    CHECK_EQ_INT(collisions, 0);
    CHECK_EQ_INT(di_strmap_size(seen), 100000);
    int64_t v = -1;
    int k = 4242;
    uint64_t h = di_hash64(&k, sizeof k, 7);
    CHECK(di_strmap_get(seen, (const char *)&h, 8, &v) && v == 4242);
    di_strmap_free(seen);
}

typedef struct { _Atomic long sum; } sum_ctx;
static void add_index(void *ctx, size_t i, int tid) {
    (void)tid;
    atomic_fetch_add(&((sum_ctx *)ctx)->sum, (long)i);
}

static void test_threadpool(void) {
    di_threadpool *p = di_threadpool_create(4);
    CHECK(p != NULL);
    for (int rep = 0; rep < 50; rep++) {
        sum_ctx c = {0};
        di_threadpool_run(p, 1000, add_index, &c);
        CHECK_EQ_INT(atomic_load(&c.sum), 999L * 1000 / 2);
    }
    di_threadpool_free(p);
    sum_ctx c = {0};
    di_threadpool_run(NULL, 10, add_index, &c);
    CHECK_EQ_INT(atomic_load(&c.sum), 45);
}

static void test_json_errors(void) {
    json_t *j = NULL;
    CHECK(di_json_loadb("{\"a\": 1,}", 9, "x.json", &j) == DI_ERR_FORMAT);
    CHECK(strstr(di_last_error(), "x.json") != NULL);
    CHECK_OK(di_json_loadb("{\"a\": \"s\", \"b\": 2.5, \"c\": 3}", 28, "x.json", &j));
    int64_t i = 0;
    CHECK(di_json_req_int(j, "a", "cfg.json", &i) == DI_ERR_FORMAT);
    CHECK(strstr(di_last_error(), "'a'") && strstr(di_last_error(), "string"));
    CHECK(di_json_req_int(j, "b", "cfg.json", &i) == DI_ERR_FORMAT);
    CHECK(di_json_req_int(j, "missing", "cfg.json", &i) == DI_ERR_FORMAT);
    CHECK(strstr(di_last_error(), "missing required field 'missing'") != NULL);
    json_t *big = NULL;
    CHECK_OK(di_json_loadb("{\"x\": 1e30, \"y\": -4.0}", 22, "x.json", &big));
    CHECK(di_json_req_int(big, "x", "cfg.json", &i) == DI_ERR_FORMAT); /* out of int64 range */
    CHECK_OK(di_json_req_int(big, "y", "cfg.json", &i));
    CHECK_EQ_INT(i, -4);
    json_decref(big);
    CHECK_OK(di_json_req_int(j, "c", "cfg.json", &i));
    CHECK_EQ_INT(i, 3);
    double d = 0;
    CHECK_OK(di_json_req_double(j, "c", "cfg.json", &d));
    CHECK(d == 3.0);
    json_decref(j);
}

TEST_MAIN(test_dtype, test_utf8, test_hash_and_map, test_threadpool, test_json_errors)
