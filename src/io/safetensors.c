/* safetensors.c - the safetensors reader: single files and sharded directories, mmapped.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON header, then the data
 * section. The header maps tensor names to {dtype, shape, data_offsets [begin, end)} relative
 * to the data section, plus an optional "__metadata__" string->string map. We accept a file
 * only if, like the reference implementation, N fits the file and DI_ST_MAX_HEADER, the header
 * is a JSON object without duplicate keys, every dtype is known, every shape is a list of at
 * most DI_MAX_DIMS non-negative integers whose byte size does not overflow, every
 * data_offsets pair is ordered, matches that byte size and lies inside the data section, and
 * the tensors tile the data section exactly (no overlap, no hole, nothing after the last).
 *
 * Owns: the mmaps, copies of tensor names, the name->index map, the metadata object, and
 * aligned copies of tensors whose mmapped bytes are not aligned to their element size. */
#include "io/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/hash.h"
#include "core/json_util.h"
#include "core/mmap_file.h"
#include "core/status.h"

struct di_weights {
    di_mmap *maps;
    size_t n_maps;
    di_tensor_info *t;
    size_t n, cap;
    di_strmap *by_name;
    json_t *metadata;     /* __metadata__ of the first file, or NULL */
    void **copies;        /* aligned copies (see header) */
    size_t n_copies;
};

typedef struct span { uint64_t begin, end; size_t idx; } span;

size_t di_weights_count(const di_weights *w) { return w ? w->n : 0; }
const di_tensor_info *di_weights_at(const di_weights *w, size_t i) { return (w && i < w->n) ? &w->t[i] : NULL; }

const di_tensor_info *di_weights_find(const di_weights *w, const char *name) {
    int64_t i;
    if (!w || !name || !di_strmap_get(w->by_name, name, strlen(name), &i)) return NULL;
    return &w->t[i];
}

const char *di_weights_metadata(const di_weights *w, const char *key) {
    if (!w || !w->metadata) return NULL;
    return json_string_value(json_object_get(w->metadata, key));
}

int64_t di_tensor_numel(const di_tensor_info *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

const char *di_tensor_shape_str(int ndim, const int64_t *shape, char *buf, size_t len) {
    size_t k = 0;
    if (len == 0) return buf;
    buf[0] = '\0';
    k += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < len) snprintf(buf + k, len - k, "]");
    return buf;
}

void di_weights_free(di_weights *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) free((char *)w->t[i].name);
    for (size_t i = 0; i < w->n_maps; i++) di_mmap_close(&w->maps[i]);
    for (size_t i = 0; i < w->n_copies; i++) free(w->copies[i]);
    free(w->copies);
    free(w->maps);
    free(w->t);
    di_strmap_free(w->by_name);
    json_decref(w->metadata);
    free(w);
}

static di_status push_tensor(di_weights *w, di_tensor_info *ti) {
    if (w->n == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 256;
        di_tensor_info *nt = realloc(w->t, nc * sizeof *nt);
        if (!nt) return di_error(DI_ERR_NOMEM, "out of memory");
        w->t = nt;
        w->cap = nc;
    }
    w->t[w->n++] = *ti;
    return DI_OK;
}

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Reads a JSON integer >= 0. */
static int get_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

/* Parses one tensor entry of a header into ti (name not yet set). */
static di_status parse_entry(const char *path, const char *name, const json_t *e, di_tensor_info *ti,
                             uint64_t *begin, uint64_t *end) {
    memset(ti, 0, sizeof *ti);
    if (!json_is_object(e))
        return di_error(DI_ERR_FORMAT, "%s: tensor '%s': expected an object {dtype, shape, data_offsets}, got %s", path,
                        name, di_json_type_name(e));
    const json_t *dt = json_object_get(e, "dtype"), *sh = json_object_get(e, "shape"), *off = json_object_get(e, "data_offsets");
    if (!json_is_string(dt))
        return di_error(DI_ERR_FORMAT, "%s: tensor '%s': 'dtype' must be a string, got %s", path, name, di_json_type_name(dt));
    if (!di_dtype_from_name(json_string_value(dt), &ti->dtype))
        return di_error(DI_ERR_UNSUPPORTED, "%s: tensor '%s': dtype \"%s\" is not supported (expected F32, BF16, F16, "
                        "F8_E4M3, I32, I64 or U8)", path, name, json_string_value(dt));
    if (!json_is_array(sh))
        return di_error(DI_ERR_FORMAT, "%s: tensor '%s': 'shape' must be a list of integers, got %s", path, name,
                        di_json_type_name(sh));
    size_t nd = json_array_size(sh);
    if (nd > DI_MAX_DIMS)
        return di_error(DI_ERR_FORMAT, "%s: tensor '%s': %zu dimensions, at most %d supported", path, name, nd, DI_MAX_DIMS);
    ti->ndim = (int)nd;
    uint64_t numel = 1;
    const uint64_t limit = (uint64_t)1 << 62;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!get_u64(json_array_get(sh, i), &d))
            return di_error(DI_ERR_FORMAT, "%s: tensor '%s': shape[%zu] must be an integer >= 0", path, name, i);
        if (d > limit || (d && numel > limit / d))
            return di_error(DI_ERR_FORMAT, "%s: tensor '%s': shape product overflows", path, name);
        numel *= d;
        ti->shape[i] = (int64_t)d;
    }
    uint64_t esz = di_dtype_size(ti->dtype);
    if (numel > limit / esz) return di_error(DI_ERR_FORMAT, "%s: tensor '%s': byte size overflows", path, name);
    uint64_t nbytes = numel * esz;
    if (!json_is_array(off) || json_array_size(off) != 2 || !get_u64(json_array_get(off, 0), begin) ||
        !get_u64(json_array_get(off, 1), end))
        return di_error(DI_ERR_FORMAT, "%s: tensor '%s': 'data_offsets' must be [begin, end] with integers >= 0", path, name);
    if (*end < *begin)
        return di_error(DI_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] are reversed", path, name,
                        (unsigned long long)*begin, (unsigned long long)*end);
    if (*end - *begin != nbytes) {
        char sb[160];
        return di_error(DI_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] span %llu bytes, but %s %s needs %llu",
                        path, name, (unsigned long long)*begin, (unsigned long long)*end,
                        (unsigned long long)(*end - *begin), di_dtype_name(ti->dtype),
                        di_tensor_shape_str(ti->ndim, ti->shape, sb, sizeof sb), (unsigned long long)nbytes);
    }
    if (nbytes > SIZE_MAX) return di_error(DI_ERR_FORMAT, "%s: tensor '%s': too large for this machine", path, name);
    ti->nbytes = (size_t)nbytes;
    return DI_OK;
}

static di_status check_metadata(const char *path, const json_t *m) {
    if (!json_is_object(m))
        return di_error(DI_ERR_FORMAT, "%s: '__metadata__' must be an object of strings, got %s", path, di_json_type_name(m));
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)m, k, v) {
        if (!json_is_string(v))
            return di_error(DI_ERR_FORMAT, "%s: '__metadata__' entry '%s' must be a string, got %s", path, k,
                            di_json_type_name(v));
    }
    return DI_OK;
}

/* Makes the data pointer of ti aligned (copying if the file did not align it). */
static di_status align_tensor(di_weights *w, di_tensor_info *ti) {
    size_t a = di_dtype_size(ti->dtype);
    if (!ti->nbytes || ((uintptr_t)ti->data % a) == 0) return DI_OK;
    void **nc = realloc(w->copies, (w->n_copies + 1) * sizeof *nc);
    if (!nc) return di_error(DI_ERR_NOMEM, "out of memory");
    w->copies = nc;
    void *p = malloc(ti->nbytes);
    if (!p) return di_error(DI_ERR_NOMEM, "%s: tensor '%s': out of memory copying %zu bytes", ti->file, ti->name, ti->nbytes);
    memcpy(p, ti->data, ti->nbytes);
    w->copies[w->n_copies++] = p;
    ti->data = p;
    return DI_OK;
}

/* Parses the header of the mapped file m and appends its tensors to w. */
static di_status parse_header(di_weights *w, const di_mmap *m) {
    const char *path = m->path;
    if (m->size < 8)
        return di_error(DI_ERR_FORMAT, "%s: file is %zu bytes, too short for the 8-byte header length", path, m->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | m->data[i];
    if (hlen == 0) return di_error(DI_ERR_FORMAT, "%s: header length is 0 (expected a JSON header)", path);
    if (hlen > DI_ST_MAX_HEADER)
        return di_error(DI_ERR_FORMAT, "%s: header length %llu exceeds the limit of %u bytes", path,
                        (unsigned long long)hlen, DI_ST_MAX_HEADER);
    if (hlen > m->size - 8)
        return di_error(DI_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                        (unsigned long long)hlen, m->size);
    char where[4200];
    snprintf(where, sizeof where, "%s: header", path);
    json_t *root = NULL;
    DI_TRY(di_json_loadb((const char *)m->data + 8, (size_t)hlen, where, &root));
    di_status s = DI_OK;
    span *spans = NULL;
    const size_t first = w->n;
    const uint64_t data_size = m->size - 8 - hlen;
    const unsigned char *data = m->data + 8 + hlen;
    if (!json_is_object(root)) {
        s = di_error(DI_ERR_FORMAT, "%s: header must be a JSON object, got %s", path, di_json_type_name(root));
        goto done;
    }
    spans = malloc((json_object_size(root) + 1) * sizeof *spans);
    if (!spans) { s = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
    size_t ns = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if ((s = check_metadata(path, val)) != DI_OK) goto done;
            if (!w->metadata) w->metadata = json_incref(val);
            continue;
        }
        di_tensor_info ti;
        uint64_t b, e;
        if ((s = parse_entry(path, key, val, &ti, &b, &e)) != DI_OK) goto done;
        if (e > data_size) {
            s = di_error(DI_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end past the data section (%llu bytes)",
                         path, key, (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_size);
            goto done;
        }
        int64_t prev;
        if (di_strmap_get(w->by_name, key, strlen(key), &prev)) {
            s = di_error(DI_ERR_FORMAT, "%s: tensor '%s' is defined twice (also in %s)", path, key, w->t[prev].file);
            goto done;
        }
        ti.name = strdup(key);
        ti.file = path;
        ti.data = ti.nbytes ? data + b : NULL;
        if (!ti.name || (s = push_tensor(w, &ti)) != DI_OK) {
            free((char *)ti.name);
            if (s == DI_OK) s = di_error(DI_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (di_strmap_put(w->by_name, key, strlen(key), (int64_t)(w->n - 1)) != 0) {
            s = di_error(DI_ERR_NOMEM, "out of memory");
            goto done;
        }
        spans[ns++] = (span){b, e, w->n - 1};
    }
    /* The tensors must tile [0, data_size) exactly. */
    qsort(spans, ns, sizeof *spans, cmp_span);
    uint64_t at = 0;
    for (size_t i = 0; i < ns; i++) {
        const di_tensor_info *ti = &w->t[spans[i].idx];
        if (spans[i].begin < at) {
            const di_tensor_info *pv = &w->t[spans[i - 1].idx];
            s = di_error(DI_ERR_FORMAT, "%s: tensor '%s' (bytes [%llu, %llu)) overlaps tensor '%s' (bytes [%llu, %llu))",
                         path, ti->name, (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end, pv->name,
                         (unsigned long long)spans[i - 1].begin, (unsigned long long)spans[i - 1].end);
            goto done;
        }
        if (spans[i].begin > at) {
            s = di_error(DI_ERR_FORMAT, "%s: %llu unused bytes before tensor '%s' at data offset %llu (tensors must be "
                         "contiguous)", path, (unsigned long long)(spans[i].begin - at), ti->name, (unsigned long long)at);
            goto done;
        }
        at = spans[i].end;
    }
    if (at != data_size) {
        s = di_error(DI_ERR_FORMAT, "%s: data section is %llu bytes but the tensors cover %llu", path,
                     (unsigned long long)data_size, (unsigned long long)at);
        goto done;
    }
    for (size_t i = first; i < w->n; i++)
        if ((s = align_tensor(w, &w->t[i])) != DI_OK) goto done;
done:
    free(spans);
    json_decref(root);
    return s;
}

static di_status add_file(di_weights *w, const char *path) {
    di_mmap *nm = realloc(w->maps, (w->n_maps + 1) * sizeof *nm);
    if (!nm) return di_error(DI_ERR_NOMEM, "out of memory");
    w->maps = nm;
    DI_TRY(di_mmap_open(&w->maps[w->n_maps], path));
    w->n_maps++;
    return parse_header(w, &w->maps[w->n_maps - 1]);
}

/* A shard name from an index must be a plain file name in the model directory. */
static int safe_shard_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/') && !strchr(s, '\\') && strlen(s) < 1024;
}

static di_status open_index(di_weights *w, const char *index_path) {
    json_t *root = NULL;
    DI_TRY(di_json_load_file(index_path, &root));
    di_status s = DI_OK;
    char *dir = NULL, *shard = NULL;
    const json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        s = di_error(DI_ERR_FORMAT, "%s: expected an object with a 'weight_map' object", index_path);
        goto done;
    }
    const json_t *meta = json_object_get(root, "metadata");
    if (meta && !json_is_null(meta) && !json_is_object(meta)) {
        s = di_error(DI_ERR_FORMAT, "%s: 'metadata' must be an object, got %s", index_path, di_json_type_name(meta));
        goto done;
    }
    if (json_object_size(wm) == 0) {
        s = di_error(DI_ERR_FORMAT, "%s: 'weight_map' is empty", index_path);
        goto done;
    }
    dir = strdup(index_path);
    if (!dir) { s = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = '\0'; else strcpy(dir, "./");
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)wm, key, val) {
        if (!json_is_string(val) || !safe_shard_name(json_string_value(val))) {
            s = di_error(DI_ERR_FORMAT, "%s: weight_map['%s']: expected a file name in the model directory, got %s%s%s",
                         index_path, key, json_is_string(val) ? "\"" : di_json_type_name(val),
                         json_is_string(val) ? json_string_value(val) : "", json_is_string(val) ? "\"" : "");
            goto done;
        }
    }
    /* Open every distinct shard once, in first-mention order. */
    json_object_foreach((json_t *)wm, key, val) {
        const char *file = json_string_value(val);
        int seen = 0;
        for (size_t i = 0; i < w->n_maps && !seen; i++) {
            const char *b = strrchr(w->maps[i].path, '/');
            seen = !strcmp(b ? b + 1 : w->maps[i].path, file);
        }
        if (seen) continue;
        shard = di_path_join(dir, file);
        if (!shard) { s = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
        if (!di_file_exists(shard)) {
            s = di_error(DI_ERR_NOT_FOUND, "%s: weight_map['%s'] names shard '%s', which does not exist", index_path, key, file);
            goto done;
        }
        size_t before = w->n;
        if ((s = add_file(w, shard)) != DI_OK) goto done;
        /* every tensor of the shard must be mapped to this shard */
        for (size_t i = before; i < w->n; i++) {
            const char *mapped = json_string_value(json_object_get(wm, w->t[i].name));
            if (!mapped || strcmp(mapped, file) != 0) {
                s = di_error(DI_ERR_FORMAT, "%s: shard '%s' holds tensor '%s', which the index %s", index_path, file,
                             w->t[i].name, mapped ? "maps to another shard" : "does not list");
                goto done;
            }
        }
        free(shard);
        shard = NULL;
    }
    json_object_foreach((json_t *)wm, key, val) {
        if (!di_weights_find(w, key)) {
            s = di_error(DI_ERR_NOT_FOUND, "%s: tensor '%s' is mapped to shard '%s', which does not contain it", index_path,
                         key, json_string_value(val));
            goto done;
        }
    }
done:
    free(shard);
    free(dir);
    json_decref(root);
    return s;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

di_status di_weights_open(const char *path, di_weights **out) {
    *out = NULL;
    di_weights *w = calloc(1, sizeof *w);
    if (!w || !(w->by_name = di_strmap_create(1024))) {
        free(w);
        return di_error(DI_ERR_NOMEM, "out of memory");
    }
    di_status s;
    if (is_dir(path)) {
        char *idx = di_path_join(path, "model.safetensors.index.json");
        char *single = di_path_join(path, "model.safetensors");
        if (!idx || !single) s = di_error(DI_ERR_NOMEM, "out of memory");
        else if (di_file_exists(idx)) s = open_index(w, idx);
        else if (di_file_exists(single)) s = add_file(w, single);
        else
            s = di_error(DI_ERR_NOT_FOUND, "%s: no model.safetensors.index.json or model.safetensors in this directory", path);
        free(idx);
        free(single);
    } else if (ends_with(path, ".json")) {
        s = open_index(w, path);
    } else {
        s = add_file(w, path);
    }
    if (s != DI_OK) {
        di_weights_free(w);
        return s;
    }
    *out = w;
    return DI_OK;
}
