/* safetensors_write.c - the safetensors writer: one file, or shards plus
 * model.safetensors.index.json, streaming lazily produced tensors to disk.
 *
 * Owns: the tensor declarations (name, dtype, shape, optional copied bytes). Invariants: every
 * file's header is padded with spaces to a multiple of 8 bytes and its tensors are laid out by
 * decreasing element size (then insertion order), so each tensor is aligned to its element size;
 * files appear under their final names only once completely written (write + rename). */
#include "io/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "core/mmap_file.h"
#include "core/status.h"

typedef struct st_entry {
    char *name;
    di_dtype dtype;
    int ndim;
    int64_t shape[DI_MAX_DIMS];
    uint64_t nbytes;
    void *data;       /* owned copy, or NULL for a lazy tensor */
} st_entry;

struct di_st_writer {
    st_entry *e;
    size_t n, cap;
    di_st_fill_fn fill;
    void *fill_ctx;
};

di_st_writer *di_st_writer_create(void) { return calloc(1, sizeof(di_st_writer)); }

void di_st_writer_free(di_st_writer *wr) {
    if (!wr) return;
    for (size_t i = 0; i < wr->n; i++) {
        free(wr->e[i].name);
        free(wr->e[i].data);
    }
    free(wr->e);
    free(wr);
}

size_t di_st_writer_count(const di_st_writer *wr) { return wr ? wr->n : 0; }

uint64_t di_st_writer_total_bytes(const di_st_writer *wr) {
    uint64_t t = 0;
    for (size_t i = 0; wr && i < wr->n; i++) t += wr->e[i].nbytes;
    return t;
}

void di_st_writer_set_fill(di_st_writer *wr, di_st_fill_fn fn, void *ctx) {
    wr->fill = fn;
    wr->fill_ctx = ctx;
}

static di_status declare(di_st_writer *wr, const char *name, di_dtype dtype, int ndim, const int64_t *shape,
                         st_entry **out) {
    if (!name || !name[0] || !strcmp(name, "__metadata__"))
        return di_error(DI_ERR_INVALID_ARG, "safetensors writer: invalid tensor name '%s'", name ? name : "(null)");
    if ((unsigned)dtype >= DI_DTYPE_COUNT || ndim < 0 || ndim > DI_MAX_DIMS)
        return di_error(DI_ERR_INVALID_ARG, "safetensors writer: tensor '%s': bad dtype or rank", name);
    for (size_t i = 0; i < wr->n; i++)
        if (!strcmp(wr->e[i].name, name))
            return di_error(DI_ERR_INVALID_ARG, "safetensors writer: tensor '%s' added twice", name);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] && numel > ((uint64_t)1 << 62) / (uint64_t)shape[i]))
            return di_error(DI_ERR_INVALID_ARG, "safetensors writer: tensor '%s': bad shape", name);
        numel *= (uint64_t)shape[i];
    }
    if (wr->n == wr->cap) {
        size_t nc = wr->cap ? wr->cap * 2 : 256;
        st_entry *ne = realloc(wr->e, nc * sizeof *ne);
        if (!ne) return di_error(DI_ERR_NOMEM, "out of memory");
        wr->e = ne;
        wr->cap = nc;
    }
    st_entry *e = &wr->e[wr->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name) return di_error(DI_ERR_NOMEM, "out of memory");
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = numel * di_dtype_size(dtype);
    wr->n++;
    *out = e;
    return DI_OK;
}

di_status di_st_writer_add_lazy(di_st_writer *wr, const char *name, di_dtype dtype, int ndim, const int64_t *shape) {
    st_entry *e;
    return declare(wr, name, dtype, ndim, shape, &e);
}

di_status di_st_writer_add(di_st_writer *wr, const char *name, di_dtype dtype, int ndim, const int64_t *shape,
                           const void *data, size_t nbytes) {
    st_entry *e;
    DI_TRY(declare(wr, name, dtype, ndim, shape, &e));
    if (e->nbytes != nbytes) {
        wr->n--;
        free(e->name);
        return di_error(DI_ERR_INVALID_ARG, "safetensors writer: tensor '%s': %zu bytes given, shape needs %llu", name,
                        nbytes, (unsigned long long)e->nbytes);
    }
    if (nbytes) {
        e->data = malloc(nbytes);
        if (!e->data) {
            wr->n--;
            free(e->name);
            return di_error(DI_ERR_NOMEM, "out of memory");
        }
        memcpy(e->data, data, nbytes);
    }
    return DI_OK;
}

/* Tensors [lo, hi) in file order: decreasing element size, then insertion order. */
static size_t *file_order(const di_st_writer *wr, size_t lo, size_t hi) {
    size_t *o = malloc((hi - lo + 1) * sizeof *o), k = 0;
    if (!o) return NULL;
    for (size_t sz = 8; sz >= 1; sz /= 2)
        for (size_t i = lo; i < hi; i++)
            if (di_dtype_size(wr->e[i].dtype) == sz) o[k++] = i;
    return o;
}

static char *make_header(const di_st_writer *wr, const size_t *order, size_t n, size_t *len) {
    json_t *root = json_object();
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        const st_entry *e = &wr->e[order[k]];
        json_t *t = json_object(), *sh = json_array(), *of = json_array();
        json_object_set_new(t, "dtype", json_string(di_dtype_name(e->dtype)));
        for (int d = 0; d < e->ndim; d++) json_array_append_new(sh, json_integer(e->shape[d]));
        json_object_set_new(t, "shape", sh);
        json_array_append_new(of, json_integer((json_int_t)off));
        json_array_append_new(of, json_integer((json_int_t)(off + e->nbytes)));
        json_object_set_new(t, "data_offsets", of);
        json_object_set_new(root, e->name, t);
        off += e->nbytes;
    }
    char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!s) return NULL;
    size_t l = strlen(s), padded = (l + 7) / 8 * 8;
    char *h = malloc(padded + 1);
    if (h) {
        memcpy(h, s, l);
        memset(h + l, ' ', padded - l);
        h[padded] = '\0';
        *len = padded;
    }
    free(s);
    return h;
}

/* Writes tensors [lo, hi) to `path`. */
static di_status write_file(di_st_writer *wr, const char *path, size_t lo, size_t hi) {
    di_status s = DI_OK;
    size_t hlen = 0;
    size_t *order = file_order(wr, lo, hi);
    char *header = order ? make_header(wr, order, hi - lo, &hlen) : NULL;
    char *tmp = malloc(strlen(path) + 8);
    void *buf = NULL;
    size_t buf_cap = 0;
    FILE *f = NULL;
    if (!order || !header || !tmp) { s = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
    sprintf(tmp, "%s.tmp", path);
    f = fopen(tmp, "wb");
    if (!f) { s = di_error(DI_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno)); goto done; }
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    if (fwrite(lenb, 1, 8, f) != 8 || fwrite(header, 1, hlen, f) != hlen) {
        s = di_error(DI_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
        goto done;
    }
    for (size_t k = 0; k < hi - lo; k++) {
        st_entry *e = &wr->e[order[k]];
        const void *src = e->data;
        if (!e->nbytes) continue;
        if (!src) {
            if (!wr->fill) { s = di_error(DI_ERR_INVALID_ARG, "safetensors writer: lazy tensor '%s' but no fill function", e->name); goto done; }
            if (e->nbytes > SIZE_MAX) { s = di_error(DI_ERR_NOMEM, "tensor '%s' too large", e->name); goto done; }
            if (e->nbytes > buf_cap) {
                free(buf);
                buf = malloc((size_t)e->nbytes);
                buf_cap = buf ? (size_t)e->nbytes : 0;
                if (!buf) { s = di_error(DI_ERR_NOMEM, "tensor '%s': out of memory for %llu bytes", e->name, (unsigned long long)e->nbytes); goto done; }
            }
            if ((s = wr->fill(wr->fill_ctx, order[k], buf, (size_t)e->nbytes)) != DI_OK) goto done;
            src = buf;
        }
        if (fwrite(src, 1, (size_t)e->nbytes, f) != e->nbytes) {
            s = di_error(DI_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
            goto done;
        }
    }
    int rc = fclose(f);
    f = NULL;
    if (rc != 0) { s = di_error(DI_ERR_IO, "%s: write failed: %s", tmp, strerror(errno)); goto done; }
    if (rename(tmp, path) != 0) s = di_error(DI_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
done:
    if (f) fclose(f);
    if (s != DI_OK && tmp) remove(tmp);
    free(buf);
    free(tmp);
    free(header);
    free(order);
    return s;
}

di_status di_st_writer_write(di_st_writer *wr, const char *path) { return write_file(wr, path, 0, wr->n); }

di_status di_st_writer_write_sharded(di_st_writer *wr, const char *dir, size_t max_shard_bytes) {
    if (max_shard_bytes == 0) return di_error(DI_ERR_INVALID_ARG, "safetensors writer: shard size must be > 0");
    /* shard boundaries: consecutive tensors, closing a shard before it would exceed the limit */
    size_t *start = malloc((wr->n + 2) * sizeof *start), ns = 0;
    if (!start) return di_error(DI_ERR_NOMEM, "out of memory");
    uint64_t cur = 0;
    start[ns++] = 0;
    for (size_t i = 0; i < wr->n; i++) {
        if (cur > 0 && cur + wr->e[i].nbytes > max_shard_bytes) {
            start[ns++] = i;
            cur = 0;
        }
        cur += wr->e[i].nbytes;
    }
    start[ns] = wr->n;
    di_status s = DI_OK;
    json_t *idx = json_object(), *meta = json_object(), *wm = json_object();
    json_object_set_new(meta, "total_size", json_integer((json_int_t)di_st_writer_total_bytes(wr)));
    json_object_set_new(idx, "metadata", meta);
    json_object_set_new(idx, "weight_map", wm);
    for (size_t k = 0; k < ns && s == DI_OK; k++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, ns);
        char *path = di_path_join(dir, name);
        if (!path) { s = di_error(DI_ERR_NOMEM, "out of memory"); break; }
        s = write_file(wr, path, start[k], start[k + 1]);
        free(path);
        for (size_t i = start[k]; i < start[k + 1]; i++) json_object_set_new(wm, wr->e[i].name, json_string(name));
    }
    if (s == DI_OK) {
        char *text = json_dumps(idx, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        char *path = di_path_join(dir, "model.safetensors.index.json");
        if (!text || !path) s = di_error(DI_ERR_NOMEM, "out of memory");
        else {
            size_t l = strlen(text);
            text[l] = '\n'; /* json_dumps's NUL becomes the final newline */
            s = di_write_file(path, text, l + 1);
        }
        free(text);
        free(path);
    }
    json_decref(idx);
    free(start);
    return s;
}
