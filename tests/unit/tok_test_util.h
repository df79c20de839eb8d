/* tok_test_util.h - helpers shared by the tokenizer tests: locating the vendored tokenizers and
 * corpus (unpacked into $DI_BUILD_DIR/tests/data by tests/data/CMakeLists.txt), reading JSONL,
 * comparing id sequences against references and printing readable diffs. */
#ifndef DI_TOK_TEST_UTIL_H
#define DI_TOK_TEST_UTIL_H
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mmap_file.h"
#include "tokenizer/tokenizer.h"

static inline const char *tt_build_path(const char *rel) {
    static char buf[4][4096];
    static int k = 0;
    const char *root = getenv("DI_BUILD_DIR");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", root ? root : "build", rel);
    return b;
}

static inline di_tokenizer *tt_load(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/tokenizers/%s", name);
    di_tokenizer *t = NULL;
    if (di_tokenizer_load(tt_build_path(rel), &t) != DI_OK) {
        fprintf(stderr, "cannot load tokenizer %s: %s\n", name, di_last_error());
        return NULL;
    }
    return t;
}

/* Reads a JSONL file; returns an array of parsed lines (caller json_decref). */
static inline json_t *tt_read_jsonl(const char *path) {
    char *buf = NULL;
    size_t len = 0;
    if (di_read_file(path, &buf, &len, 0) != DI_OK) {
        fprintf(stderr, "cannot read %s: %s\n", path, di_last_error());
        return NULL;
    }
    json_t *arr = json_array();
    char *p = buf, *end = buf + len;
    size_t line = 0;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        line++;
        if (n) {
            json_error_t e;
            json_t *j = json_loadb(p, n, JSON_ALLOW_NUL, &e);
            if (!j) { fprintf(stderr, "%s:%zu: %s\n", path, line, e.text); json_decref(arr); free(buf); return NULL; }
            json_array_append_new(arr, j);
        }
        p = nl ? nl + 1 : end;
    }
    free(buf);
    return arr;
}

static inline int tt_ids_equal(const di_ids *ids, const json_t *ref) {
    if (!json_is_array(ref) || json_array_size(ref) != ids->n) return 0;
    for (size_t i = 0; i < ids->n; i++)
        if (json_integer_value(json_array_get(ref, i)) != ids->data[i]) return 0;
    return 1;
}

/* Prints text with control and non-ASCII bytes escaped, at most `max` bytes. */
static inline void tt_print_escaped(FILE *f, const char *s, size_t n, size_t max) {
    for (size_t i = 0; i < n && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') fputc(c, f);
        else fprintf(f, "\\x%02x", c);
    }
    if (n > max) fprintf(f, "...(%zu bytes)", n);
}

static inline void tt_print_diff(FILE *f, const di_ids *ids, const json_t *ref) {
    size_t n = json_array_size(ref), i = 0;
    while (i < n && i < ids->n && json_integer_value(json_array_get(ref, i)) == ids->data[i]) i++;
    fprintf(f, "    first difference at index %zu (ours %zu ids, reference %zu)\n    ours:", i, ids->n, n);
    for (size_t k = i >= 3 ? i - 3 : 0; k < ids->n && k < i + 8; k++) fprintf(f, " %d", ids->data[k]);
    fprintf(f, "\n    ref: ");
    for (size_t k = i >= 3 ? i - 3 : 0; k < n && k < i + 8; k++) fprintf(f, " %lld", (long long)json_integer_value(json_array_get(ref, k)));
    fprintf(f, "\n");
}

/* 64-bit FNV-1a over the ids as little-endian int32 (matches tools/tokenizer/gen_corpus.py). */
static inline unsigned long long tt_fnv64(const int32_t *ids, size_t n) {
    unsigned long long h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        for (int b = 0; b < 4; b++) {
            h ^= (v >> (8 * b)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}
#endif
