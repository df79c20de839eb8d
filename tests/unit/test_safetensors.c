/* test_safetensors.c - the safetensors writer and reader on well-formed files: single-file and
 * sharded round trips (lazy tensors, alignment, metadata), a file written by the Python
 * `safetensors` library (tests/data/safetensors/, made by tools/golden/make_st_fixture.py), and
 * the aligned-copy fallback for files whose tensors are not aligned. Malformed files are in
 * test_safetensors_bad.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/mmap_file.h"
#include "core/status.h"
#include "io/safetensors.h"
#include "test_util.h"

static const char *tmp_path(const char *name) {
    static char buf[4][4096];
    static int k = 0;
    const char *dir = getenv("DI_BUILD_DIR");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/test_st_%s", dir ? dir : "/tmp", name);
    return b;
}

/* lazy fill: byte j of tensor i is (i * 31 + j) & 0xff */
static di_status fill_pattern(void *ctx, size_t index, void *dst, size_t nbytes) {
    (void)ctx;
    unsigned char *d = dst;
    for (size_t j = 0; j < nbytes; j++) d[j] = (unsigned char)((index * 31 + j) & 0xff);
    return DI_OK;
}

static int pattern_ok(const di_tensor_info *t, size_t index) {
    const unsigned char *d = t->data;
    for (size_t j = 0; j < t->nbytes; j++)
        if (d[j] != (unsigned char)((index * 31 + j) & 0xff)) return 0;
    return 1;
}

static di_st_writer *make_writer(void) {
    di_st_writer *wr = di_st_writer_create();
    float f[6] = {1, -2, 3.5f, 0, 1e-3f, 7};
    uint16_t h[5] = {0x3f80, 0xc000, 1, 2, 3};
    uint8_t q[7] = {0x38, 0xb8, 0x7e, 0, 1, 2, 3};
    int64_t s23[2] = {2, 3}, s5[1] = {5}, s7[2] = {7, 1}, s0[2] = {0, 4}, s44[2] = {4, 4};
    CHECK_OK(di_st_writer_add(wr, "a.bf16", DI_DTYPE_BF16, 1, s5, h, sizeof h));   /* 10 bytes: misaligns what follows */
    CHECK_OK(di_st_writer_add(wr, "b.f32", DI_DTYPE_F32, 2, s23, f, sizeof f));
    CHECK_OK(di_st_writer_add(wr, "c.fp8", DI_DTYPE_F8_E4M3, 2, s7, q, sizeof q));
    CHECK_OK(di_st_writer_add(wr, "d.empty", DI_DTYPE_F32, 2, s0, NULL, 0));
    CHECK_OK(di_st_writer_add_lazy(wr, "e.lazy", DI_DTYPE_F32, 2, s44));
    CHECK_OK(di_st_writer_add_lazy(wr, "f.scalar", DI_DTYPE_I64, 0, NULL));
    di_st_writer_set_fill(wr, fill_pattern, NULL);
    /* misuse is an error, not a crash */
    CHECK(di_st_writer_add(wr, "b.f32", DI_DTYPE_F32, 2, s23, f, sizeof f) == DI_ERR_INVALID_ARG);
    CHECK(di_st_writer_add(wr, "g.bad", DI_DTYPE_F32, 2, s23, f, 5) == DI_ERR_INVALID_ARG);
    CHECK(di_st_writer_add_lazy(wr, "__metadata__", DI_DTYPE_F32, 2, s23) == DI_ERR_INVALID_ARG);
    CHECK_EQ_INT(di_st_writer_count(wr), 6);
    return wr;
}

static void check_contents(const di_weights *w) {
    CHECK_EQ_INT(di_weights_count(w), 6);
    const di_tensor_info *a = di_weights_find(w, "a.bf16"), *b = di_weights_find(w, "b.f32"),
                         *c = di_weights_find(w, "c.fp8"), *d = di_weights_find(w, "d.empty"),
                         *e = di_weights_find(w, "e.lazy"), *s = di_weights_find(w, "f.scalar");
    CHECK(a && b && c && d && e && s);
    if (!(a && b && c && d && e && s)) return;
    CHECK(di_weights_find(w, "nope") == NULL);
    CHECK_EQ_INT(a->dtype, DI_DTYPE_BF16);
    CHECK_EQ_INT(a->ndim, 1);
    CHECK_EQ_INT(a->shape[0], 5);
    CHECK_EQ_INT(((const uint16_t *)a->data)[1], 0xc000);
    CHECK_EQ_INT(b->ndim, 2);
    CHECK_EQ_INT(b->shape[1], 3);
    CHECK(((const float *)b->data)[2] == 3.5f);
    CHECK(((uintptr_t)b->data % 4) == 0);
    CHECK_EQ_INT(c->nbytes, 7);
    CHECK_EQ_INT(((const uint8_t *)c->data)[2], 0x7e);
    CHECK(d->nbytes == 0 && d->data == NULL);
    CHECK_EQ_INT(e->nbytes, 64);
    CHECK(pattern_ok(e, 4));
    CHECK_EQ_INT(s->ndim, 0);
    CHECK_EQ_INT(s->nbytes, 8);
    CHECK_EQ_INT(di_tensor_numel(s), 1);
    CHECK(pattern_ok(s, 5));
    CHECK(((uintptr_t)s->data % 8) == 0);
}

static void test_single_roundtrip(void) {
    di_st_writer *wr = make_writer();
    const char *path = tmp_path("single.safetensors");
    CHECK_OK(di_st_writer_write(wr, path));
    di_st_writer_free(wr);
    di_weights *w = NULL;
    CHECK_OK(di_weights_open(path, &w));
    if (w) {
        check_contents(w);
        CHECK_EQ_STR(di_weights_metadata(w, "format"), "pt");
        CHECK(strstr(di_weights_at(w, 0)->file, "single.safetensors") != NULL);
    }
    di_weights_free(w);
    /* the header length is a multiple of 8 and the file holds nothing else */
    di_mmap m;
    CHECK_OK(di_mmap_open(&m, path));
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | m.data[i];
    CHECK_EQ_INT(hl % 8, 0);
    CHECK_EQ_INT(m.size, 8 + hl + 10 + 24 + 7 + 64 + 8);
    di_mmap_close(&m);
    remove(path);
}

static void test_sharded_roundtrip(void) {
    const char *dir = tmp_path("sharded");
    mkdir(dir, 0755);
    di_st_writer *wr = make_writer();
    CHECK_OK(di_st_writer_write_sharded(wr, dir, 40)); /* several shards */
    di_st_writer_free(wr);
    di_weights *w = NULL;
    CHECK_OK(di_weights_open(dir, &w));
    if (w) {
        check_contents(w);
        const di_tensor_info *a = di_weights_find(w, "a.bf16"), *e = di_weights_find(w, "e.lazy");
        CHECK(a && e && strcmp(a->file, e->file) != 0);
    }
    di_weights_free(w);
    /* opening the index file directly works too */
    char idx[4200];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    CHECK_OK(di_weights_open(idx, &w));
    di_weights_free(w);
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* A file written by Python safetensors 0.8 (tools/golden/make_st_fixture.py). */
static void test_python_file(void) {
    di_weights *w = NULL;
    CHECK_OK(di_weights_open(test_src_path("tests/data/safetensors/python.safetensors"), &w));
    if (!w) return;
    CHECK_EQ_STR(di_weights_metadata(w, "producer"), "tools/golden/make_st_fixture.py");
    const di_tensor_info *f = di_weights_find(w, "model.f32"), *b = di_weights_find(w, "model.bf16"),
                         *h = di_weights_find(w, "model.f16"), *q = di_weights_find(w, "model.fp8"),
                         *s = di_weights_find(w, "model.fp8_scale_inv"), *i = di_weights_find(w, "ids.i64");
    CHECK(f && b && h && q && s && i);
    if (f && b && h && q && s && i) {
        /* values as the script defines them: x[k] = (k - 5) / 4 for k < numel */
        CHECK_EQ_INT(f->shape[0], 3);
        CHECK_EQ_INT(f->shape[1], 5);
        int ok = 1;
        for (int k = 0; k < 15; k++) ok &= ((const float *)f->data)[k] == (float)(k - 5) / 4.0f;
        CHECK(ok);
        ok = 1;
        for (int k = 0; k < 6; k++) ok &= di_bf16_to_f32(((const uint16_t *)b->data)[k]) == (float)(k - 5) / 4.0f;
        CHECK(ok);
        ok = 1;
        for (int k = 0; k < 7; k++) ok &= di_f16_to_f32(((const uint16_t *)h->data)[k]) == (float)(k - 5) / 4.0f;
        CHECK(ok);
        CHECK_EQ_INT(q->dtype, DI_DTYPE_F8_E4M3);
        CHECK_EQ_INT(q->shape[0], 130);
        CHECK_EQ_INT(q->shape[1], 200);
        ok = 1;
        for (int k = 0; k < 130 * 200; k++) ok &= di_fp8e4m3_to_f32(((const uint8_t *)q->data)[k]) == (float)((k % 17) - 8) / 4.0f;
        CHECK(ok);
        CHECK_EQ_INT(s->shape[0], 2);
        CHECK_EQ_INT(s->shape[1], 2);
        CHECK(((const float *)s->data)[3] == 0.5f);
        CHECK_EQ_INT(((const int64_t *)i->data)[2], -3);
    }
    di_weights_free(w);
}

/* A hand-made file whose header length is not a multiple of 8 (older writers): the tensors
 * come back aligned anyway. */
static void test_unaligned_file(void) {
    const char *hdr = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    size_t hl = strlen(hdr);
    CHECK(hl % 4 != 0);
    unsigned char buf[256];
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hl >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    float v[2] = {1.5f, -2.25f};
    memcpy(buf + 8 + hl, v, 8);
    const char *path = tmp_path("unaligned.safetensors");
    CHECK_OK(di_write_file(path, buf, 8 + hl + 8));
    di_weights *w = NULL;
    CHECK_OK(di_weights_open(path, &w));
    const di_tensor_info *t = w ? di_weights_find(w, "x") : NULL;
    CHECK(t != NULL);
    if (t) {
        CHECK(((uintptr_t)t->data % 4) == 0);
        CHECK(((const float *)t->data)[1] == -2.25f);
    }
    di_weights_free(w);
    remove(path);
}

TEST_MAIN(test_single_roundtrip, test_sharded_roundtrip, test_python_file, test_unaligned_file)
