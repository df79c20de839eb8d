/* test_safetensors_bad.c - hand-crafted broken and malicious safetensors files and indexes:
 * every one must be refused with an error naming the file (and the tensor or field) and what
 * was expected, never crash or read out of bounds (this test also runs under ASan+UBSan).
 * Ends with a mutation fuzz of a valid file (flipped header bytes, truncations). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/mmap_file.h"
#include "core/status.h"
#include "io/safetensors.h"
#include "test_util.h"

static const char *tmp(const char *name) {
    static char buf[4][4096];
    static int k = 0;
    const char *dir = getenv("DI_BUILD_DIR");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/test_st_bad/%s", dir ? dir : "/tmp", name);
    return b;
}

/* Writes u64 `hlen` + header text + n_data bytes of data. */
static void write_raw(const char *path, uint64_t hlen, const char *header, size_t n_data) {
    size_t h = strlen(header);
    unsigned char *buf = calloc(1, 8 + h + n_data + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < n_data; i++) buf[8 + h + i] = (unsigned char)i;
    CHECK_OK(di_write_file(path, buf, 8 + h + n_data));
    free(buf);
}

static void write_st(const char *path, const char *header, size_t n_data) { write_raw(path, strlen(header), header, n_data); }

/* Opens `path`, expects failure `code` with the path and both fragments in the message. */
static void expect(const char *path, di_status code, const char *frag1, const char *frag2) {
    di_weights *w = NULL;
    di_status s = di_weights_open(path, &w);
    CHECK_MSG(s == code, "%s: expected %s, got %s: %s", path, di_status_name(code), di_status_name(s), di_last_error());
    CHECK(w == NULL);
    di_weights_free(w);
    const char *base = strrchr(path, '/');
    CHECK_MSG(strstr(di_last_error(), base ? base + 1 : path) != NULL, "file name missing from: %s", di_last_error());
    if (frag1) CHECK_MSG(strstr(di_last_error(), frag1) != NULL, "'%s' not in: %s", frag1, di_last_error());
    if (frag2) CHECK_MSG(strstr(di_last_error(), frag2) != NULL, "'%s' not in: %s", frag2, di_last_error());
}

#define T(name, dtype, shape, b, e) "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void test_header_length(void) {
    const char *p = tmp("short.safetensors");
    CHECK_OK(di_write_file(p, "\x05\x00\x00", 3));
    expect(p, DI_ERR_FORMAT, "too short", NULL);
    p = tmp("zero.safetensors");
    write_raw(p, 0, "", 16);
    expect(p, DI_ERR_FORMAT, "header length is 0", NULL);
    p = tmp("huge.safetensors");
    write_raw(p, 0xffffffffffffffffull, "{}", 0);
    expect(p, DI_ERR_FORMAT, "exceeds the limit", NULL);
    p = tmp("past_eof.safetensors");
    write_raw(p, 4096, "{\"a\":{}}", 10);
    expect(p, DI_ERR_FORMAT, "runs past the end", NULL);
    p = tmp("empty.safetensors");
    CHECK_OK(di_write_file(p, "", 0));
    expect(p, DI_ERR_FORMAT, "too short", NULL);
}

static void test_header_json(void) {
    const char *p = tmp("notjson.safetensors");
    write_st(p, "this is not json", 0);
    expect(p, DI_ERR_FORMAT, "invalid JSON", NULL);
    p = tmp("array.safetensors");
    write_st(p, "[1,2,3]", 0);
    expect(p, DI_ERR_FORMAT, "JSON object", "array");
    p = tmp("truncjson.safetensors");
    write_st(p, "{\"w\":{\"dtype\":\"F32\",", 0);
    expect(p, DI_ERR_FORMAT, "invalid JSON", NULL);
    p = tmp("trailing.safetensors");
    write_st(p, "{} {}", 0);
    expect(p, DI_ERR_FORMAT, "invalid JSON", NULL);
    p = tmp("dup.safetensors");
    write_st(p, "{" T("w", "F32", "[1]", 0, 4) "," T("w", "F32", "[1]", 4, 8) "}", 8);
    expect(p, DI_ERR_FORMAT, "invalid JSON", "duplicate");
    p = tmp("nul.safetensors");
    write_st(p, "{\"w\\u0000x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    expect(p, DI_ERR_FORMAT, "invalid JSON", NULL);
    p = tmp("badutf8.safetensors");
    write_st(p, "{\"w\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    expect(p, DI_ERR_FORMAT, "invalid JSON", NULL);
    p = tmp("meta_array.safetensors");
    write_st(p, "{\"__metadata__\":[1]," T("w", "F32", "[1]", 0, 4) "}", 4);
    expect(p, DI_ERR_FORMAT, "__metadata__", "object");
    p = tmp("meta_value.safetensors");
    write_st(p, "{\"__metadata__\":{\"format\":5}," T("w", "F32", "[1]", 0, 4) "}", 4);
    expect(p, DI_ERR_FORMAT, "__metadata__", "format");
    p = tmp("entry_notobj.safetensors");
    write_st(p, "{\"w\":[0,4]}", 4);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "expected an object");
}

static void test_entries(void) {
    const char *p = tmp("dtype_unknown.safetensors");
    write_st(p, "{" T("w", "F64", "[1]", 0, 8) "}", 8);
    expect(p, DI_ERR_UNSUPPORTED, "tensor 'w'", "F64");
    p = tmp("dtype_num.safetensors");
    write_st(p, "{\"w\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "dtype");
    p = tmp("shape_neg.safetensors");
    write_st(p, "{" T("w", "F32", "[-1, 4]", 0, 4) "}", 4);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "shape[0]");
    p = tmp("shape_float.safetensors");
    write_st(p, "{" T("w", "F32", "[1.5]", 0, 4) "}", 4);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "shape[0]");
    p = tmp("shape_str.safetensors");
    write_st(p, "{" T("w", "F32", "\"4\"", 0, 16) "}", 16);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "shape");
    p = tmp("shape_overflow.safetensors");
    write_st(p, "{" T("w", "F32", "[4294967296, 4294967296]", 0, 4) "}", 4);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "overflow");
    p = tmp("shape_overflow2.safetensors");
    write_st(p, "{" T("w", "BF16", "[3074457345618258602, 3]", 0, 4) "}", 4);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "overflow");
    p = tmp("shape_bigint.safetensors");
    write_st(p, "{" T("w", "F32", "[99999999999999999999999]", 0, 4) "}", 4);
    expect(p, DI_ERR_FORMAT, "invalid JSON", NULL);
    p = tmp("ndim.safetensors");
    write_st(p, "{" T("w", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "dimensions");
    p = tmp("off_reversed.safetensors");
    write_st(p, "{" T("w", "F32", "[1]", 8, 4) "}", 8);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "reversed");
    p = tmp("off_range.safetensors");
    write_st(p, "{" T("w", "F32", "[4]", 0, 16) "}", 8);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "end past the data section");
    p = tmp("off_huge.safetensors");
    write_st(p, "{" T("w", "U8", "[4]", 9223372036854775800, 9223372036854775804) "}", 8);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "end past the data section");
    p = tmp("off_neg.safetensors");
    write_st(p, "{" T("w", "F32", "[1]", -4, 0) "}", 8);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "data_offsets");
    p = tmp("off_three.safetensors");
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "data_offsets");
    p = tmp("off_missing.safetensors");
    write_st(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "data_offsets");
    p = tmp("size_mismatch.safetensors");
    write_st(p, "{" T("w", "BF16", "[3, 3]", 0, 16) "}", 16);
    expect(p, DI_ERR_FORMAT, "tensor 'w'", "needs 18");
    p = tmp("overlap.safetensors");
    write_st(p, "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}", 12);
    expect(p, DI_ERR_FORMAT, "overlaps", "'a'");
    p = tmp("same_range.safetensors");
    write_st(p, "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 0, 8) "}", 8);
    expect(p, DI_ERR_FORMAT, "overlaps", NULL);
    p = tmp("hole.safetensors");
    write_st(p, "{" T("a", "F32", "[1]", 0, 4) "," T("b", "F32", "[1]", 8, 12) "}", 12);
    expect(p, DI_ERR_FORMAT, "unused bytes before tensor 'b'", NULL);
    p = tmp("trailing_data.safetensors");
    write_st(p, "{" T("a", "F32", "[1]", 0, 4) "}", 20);
    expect(p, DI_ERR_FORMAT, "data section is 20 bytes", "cover 4");
    /* well-formed corner cases are accepted: no tensors, zero-size tensors, scalars */
    p = tmp("ok_empty.safetensors");
    write_st(p, "{}", 0);
    di_weights *w = NULL;
    CHECK_OK(di_weights_open(p, &w));
    CHECK_EQ_INT(di_weights_count(w), 0);
    di_weights_free(w);
    p = tmp("ok_zero.safetensors");
    write_st(p, "{" T("z", "F32", "[0,5]", 0, 0) "," T("s", "I32", "[]", 0, 4) "}", 4);
    CHECK_OK(di_weights_open(p, &w));
    CHECK_EQ_INT(di_weights_count(w), 2);
    di_weights_free(w);
}

/* A two-shard checkpoint whose index we then break in various ways. */
static void test_index(void) {
    const char *dir = tmp("idx");
    mkdir(dir, 0755);
    char a[4200], b[4200], ip[4200];
    snprintf(a, sizeof a, "%s/a.safetensors", dir);
    snprintf(b, sizeof b, "%s/b.safetensors", dir);
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", dir);
    write_st(a, "{" T("x", "F32", "[1]", 0, 4) "}", 4);
    write_st(b, "{" T("y", "F32", "[2]", 0, 8) "," T("z", "U8", "[1]", 8, 9) "}", 9);
    struct { const char *json; di_status code; const char *f1, *f2; } cases[] = {
        {"{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"b.safetensors\", \"z\": \"b.safetensors\"}}", DI_OK, NULL, NULL},
        {"{\"metadata\": {\"total_size\": 13}, \"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"b.safetensors\", "
         "\"z\": \"b.safetensors\"}}", DI_OK, NULL, NULL},
        {"not json", DI_ERR_FORMAT, "invalid JSON", NULL},
        {"{\"weight_map\": [1]}", DI_ERR_FORMAT, "weight_map", NULL},
        {"{\"weight_map\": {}}", DI_ERR_FORMAT, "empty", NULL},
        {"{\"metadata\": 5, \"weight_map\": {\"x\": \"a.safetensors\"}}", DI_ERR_FORMAT, "'metadata'", NULL},
        {"{\"weight_map\": {\"x\": 7}}", DI_ERR_FORMAT, "weight_map['x']", "file name"},
        {"{\"weight_map\": {\"x\": \"../a.safetensors\"}}", DI_ERR_FORMAT, "weight_map['x']", "file name"},
        {"{\"weight_map\": {\"x\": \"/etc/passwd\"}}", DI_ERR_FORMAT, "weight_map['x']", "file name"},
        {"{\"weight_map\": {\"x\": \"missing.safetensors\"}}", DI_ERR_NOT_FOUND, "missing.safetensors", "does not exist"},
        /* a tensor the index maps to a shard that lacks it */
        {"{\"weight_map\": {\"x\": \"a.safetensors\", \"w\": \"a.safetensors\"}}", DI_ERR_NOT_FOUND, "'w'", "does not contain"},
        /* a shard holding a tensor the index does not list */
        {"{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"b.safetensors\"}}", DI_ERR_FORMAT, "'z'", "does not list"},
        /* a tensor listed for the wrong shard */
        {"{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"b.safetensors\", \"z\": \"a.safetensors\"}}", DI_ERR_FORMAT,
         "'z'", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_OK(di_write_file(ip, cases[i].json, strlen(cases[i].json)));
        di_weights *w = NULL;
        di_status s = di_weights_open(dir, &w);
        CHECK_MSG(s == cases[i].code, "index case %zu: expected %s, got %s (%s)", i, di_status_name(cases[i].code),
                  di_status_name(s), di_last_error());
        if (s == DI_OK) {
            CHECK_EQ_INT(di_weights_count(w), 3);
            const di_tensor_info *z = di_weights_find(w, "z");
            CHECK(z && ((const uint8_t *)z->data)[0] == 8);
        } else {
            CHECK_MSG(strstr(di_last_error(), "model.safetensors.index.json") != NULL, "case %zu: %s", i, di_last_error());
            if (cases[i].f1) CHECK_MSG(strstr(di_last_error(), cases[i].f1) != NULL, "case %zu: %s", i, di_last_error());
            if (cases[i].f2) CHECK_MSG(strstr(di_last_error(), cases[i].f2) != NULL, "case %zu: %s", i, di_last_error());
        }
        di_weights_free(w);
    }
    /* the same tensor in two shards */
    write_st(b, "{" T("x", "F32", "[1]", 0, 4) "}", 4);
    const char *dupe = "{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"b.safetensors\"}}";
    CHECK_OK(di_write_file(ip, dupe, strlen(dupe)));
    di_weights *w = NULL;
    CHECK(di_weights_open(dir, &w) == DI_ERR_FORMAT);
    CHECK_MSG(strstr(di_last_error(), "'x'") && strstr(di_last_error(), "twice"), "%s", di_last_error());
    /* a directory with neither layout */
    const char *empty = tmp("idx_empty");
    mkdir(empty, 0755);
    CHECK(di_weights_open(empty, &w) == DI_ERR_NOT_FOUND);
    CHECK(strstr(di_last_error(), "model.safetensors") != NULL);
    CHECK(di_weights_open(tmp("nonexistent.safetensors"), &w) == DI_ERR_IO);
    CHECK(strstr(di_last_error(), "nonexistent.safetensors") != NULL);
}

/* Mutations of a valid file: byte flips in the header and length field, truncations, and
 * random header garbage. Every result is either a valid open or an error; nothing else. */
static uint64_t rng_state = 0x123456789abcdefull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void test_fuzz(void) {
    const char *src = tmp("fuzz_src.safetensors"), *p = tmp("fuzz.safetensors");
    write_st(src, "{\"__metadata__\":{\"format\":\"pt\"}," T("a", "BF16", "[3,2]", 0, 12) "," T("b", "F32", "[2,2]", 12, 28) ","
             T("c", "F8_E4M3", "[5]", 28, 33) "}", 33);
    di_mmap m;
    CHECK_OK(di_mmap_open(&m, src));
    unsigned char *buf = malloc(m.size);
    int opened = 0, refused = 0, bad_status = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, m.data, m.size);
        size_t len = m.size;
        int kind = (int)(rnd() % 4);
        if (kind == 0) { /* flip 1-3 bytes anywhere in the length + header */
            int n = 1 + (int)(rnd() % 3);
            for (int k = 0; k < n; k++) buf[rnd() % (m.size - 33)] ^= (unsigned char)(1u << (rnd() % 8));
        } else if (kind == 1) { /* truncate */
            len = (size_t)(rnd() % m.size);
        } else if (kind == 2) { /* overwrite a header byte with a JSON-significant character */
            const char sig[] = "{}[],:\"0123456789-e. ";
            buf[8 + rnd() % (m.size - 41)] = (unsigned char)sig[rnd() % (sizeof sig - 1)];
        } else { /* random digits inside numbers: shapes and offsets */
            for (size_t k = 8; k < m.size - 33; k++)
                if (buf[k] >= '0' && buf[k] <= '9' && rnd() % 8 == 0) buf[k] = (unsigned char)('0' + rnd() % 10);
        }
        CHECK_OK(di_write_file(p, buf, len));
        di_weights *w = NULL;
        di_status s = di_weights_open(p, &w);
        if (s == DI_OK) {
            opened++;
            /* whatever was accepted must be internally consistent: every byte readable */
            for (size_t i = 0; i < di_weights_count(w); i++) {
                const di_tensor_info *t = di_weights_at(w, i);
                volatile unsigned sum = 0;
                for (size_t k = 0; k < t->nbytes; k++) sum += ((const unsigned char *)t->data)[k];
                (void)sum;
                if (t->nbytes != (size_t)di_tensor_numel(t) * di_dtype_size(t->dtype)) bad_status++;
            }
        } else {
            refused++;
            if (s != DI_ERR_FORMAT && s != DI_ERR_UNSUPPORTED) bad_status++;
            if (!strstr(di_last_error(), "fuzz.safetensors")) bad_status++;
        }
        di_weights_free(w);
    }
    free(buf);
    di_mmap_close(&m);
    CHECK_EQ_INT(bad_status, 0);
    CHECK(refused > 1000);
    CHECK(opened > 10);
    fprintf(stderr, "fuzz: %d opened, %d refused\n", opened, refused);
}

static void setup(void) {
    char d[4096];
    const char *b = getenv("DI_BUILD_DIR");
    snprintf(d, sizeof d, "%s/test_st_bad", b ? b : "/tmp");
    mkdir(d, 0755);
    CHECK(di_file_exists(d));
}

TEST_MAIN(setup, test_header_length, test_header_json, test_entries, test_index, test_fuzz)
