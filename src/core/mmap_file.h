/* mmap_file.h - read-only memory-mapped files (weights, tokenizer.json) and whole-file reads. */
#ifndef DI_CORE_MMAP_FILE_H
#define DI_CORE_MMAP_FILE_H
#include <stddef.h>
#include "deepinfer.h"

typedef struct di_mmap {
    const unsigned char *data;  /* NULL for an empty file */
    size_t size;
    char *path;                 /* owned copy, for error messages */
} di_mmap;

/* Maps `path` read-only. On error returns a status naming the path. */
di_status di_mmap_open(di_mmap *m, const char *path);
void di_mmap_close(di_mmap *m);

/* Reads a whole file into a NUL-terminated malloc'd buffer (caller frees). max_size guards
 * against absurd inputs (0 = no limit). */
di_status di_read_file(const char *path, char **out, size_t *out_len, size_t max_size);
/* Writes a whole buffer (creates/truncates). */
di_status di_write_file(const char *path, const void *data, size_t len);
/* Joins dir and name into a malloc'd path. */
char *di_path_join(const char *dir, const char *name);
int di_file_exists(const char *path);
#endif
