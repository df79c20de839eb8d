/* golden_util.h - helpers for the tests that compare deepinfer's output files with reference
 * files made by other tools (tests/unit/test_golden.c, pycoder_golden.h and the GPU tests in
 * tests/ops): CRC32 of a file (the checkpoint transformers loaded must be the one we load),
 * float32 files, and id lists in the CLI's "a,b,c" form. */
#ifndef DI_GOLDEN_UTIL_H
#define DI_GOLDEN_UTIL_H
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/mmap_file.h"
#include "core/status.h"

/* CRC-32 (zlib's, as Python's zlib.crc32) of a file; *ok = 0 if it cannot be read. */
static inline uint32_t test_crc32_file(const char *path, int *ok) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    di_mmap m;
    *ok = di_mmap_open(&m, path) == DI_OK;
    if (!*ok) return 0;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < m.size; i++) c = table[(c ^ m.data[i]) & 0xff] ^ (c >> 8);
    di_mmap_close(&m);
    return c ^ 0xffffffffu;
}

/* Reads a float32 file (malloc'd into *out); returns the element count, or -1 (then *out is
 * NULL) if it cannot be read or its size is not a multiple of 4. */
static inline long test_read_f32(const char *path, float **out) {
    char *buf = NULL;
    size_t len = 0;
    *out = NULL;
    if (di_read_file(path, &buf, &len, 0) != DI_OK || len % 4) {
        free(buf);
        return -1;
    }
    *out = (float *)buf;
    return (long)(len / 4);
}

/* "a,b,c" of a JSON array of ids (malloc'd), or NULL when out of memory. */
static inline char *test_ids_csv(const json_t *ids) {
    size_t n = json_array_size(ids), k = 0;
    char *s = (char *)malloc(n * 12 + 1);
    if (!s) return NULL;
    s[0] = 0;
    for (size_t i = 0; i < n; i++)
        k += (size_t)sprintf(s + k, "%s%lld", i ? "," : "", json_integer_value(json_array_get(ids, i)));
    return s;
}
#endif
