/* mmap_file.c - see mmap_file.h. */
#include "core/mmap_file.h"
#include "core/status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

di_status di_mmap_open(di_mmap *m, const char *path) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return di_error(DI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return di_error(DI_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return di_error(DI_ERR_IO, "%s: not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return di_error(DI_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, m->size, strerror(e));
        }
        m->data = p;
    }
    close(fd);
    m->path = strdup(path);
    if (!m->path) {
        di_mmap_close(m);
        return di_error(DI_ERR_NOMEM, "%s: out of memory", path);
    }
    return DI_OK;
}

void di_mmap_close(di_mmap *m) {
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->size);
    free(m->path);
    memset(m, 0, sizeof *m);
}

di_status di_read_file(const char *path, char **out, size_t *out_len, size_t max_size) {
    *out = NULL;
    if (out_len) *out_len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return di_error(DI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) { fclose(f); return di_error(DI_ERR_NOMEM, "%s: out of memory", path); }
    for (;;) {
        if (len == cap) {
            if (max_size && cap >= max_size) {
                free(buf);
                fclose(f);
                return di_error(DI_ERR_FORMAT, "%s: larger than the limit of %zu bytes", path, max_size);
            }
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) { free(buf); fclose(f); return di_error(DI_ERR_NOMEM, "%s: out of memory", path); }
            buf = nb;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) { free(buf); return di_error(DI_ERR_IO, "%s: read error", path); }
    if (max_size && len > max_size) {
        free(buf);
        return di_error(DI_ERR_FORMAT, "%s: larger than the limit of %zu bytes", path, max_size);
    }
    buf[len] = '\0';
    *out = buf;
    if (out_len) *out_len = len;
    return DI_OK;
}

di_status di_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return di_error(DI_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    if (len && fwrite(data, 1, len, f) != len) {
        fclose(f);
        return di_error(DI_ERR_IO, "%s: write failed", path);
    }
    if (fclose(f) != 0) return di_error(DI_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return DI_OK;
}

char *di_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

int di_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}
