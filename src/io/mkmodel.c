/* mkmodel.c - writes deterministic random checkpoints (see mkmodel.h for the value spec).
 *
 * Flow: the tensor list comes from di_model_tensor_specs (so the layout is the one the loader
 * checks); each tensor (and each FP8 weight's scale) is declared lazily on a safetensors writer
 * whose fill callback generates the bytes on demand, multi-threaded, so a model far larger
 * than memory streams to disk one tensor at a time. An FP8 weight's scale is computed from the
 * same regenerated values as the weight itself, so the two always agree.
 *
 * Per-role value ranges (center + uniform half-width a), chosen so activations stay O(1)
 * through the layers and routing is decisive but not degenerate:
 *   embeddings           0 +- 1
 *   norms (RMS / Layer)  1 +- 0.25        layer-norm bias 0 +- 0.1
 *   projections          0 +- sqrt(3/in)  (std 1/sqrt(in): output rms ~ input rms)
 *   router gate.weight   0 +- 2 sqrt(3/D) (router logits std ~2: clear top-k choices)
 *   correction bias      0 +- 0.25, never 0 (comparable to sigmoid score gaps, so the bias
 *                        changes which experts win: a bias bug shows in the logits)
 *   lm_head              0 +- 2/sqrt(D)
 * Only integer arithmetic and single IEEE operations (no libm) touch the values. */
#pragma GCC optimize("fp-contract=off")
#include "io/mkmodel.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/dtype.h"
#include "core/mmap_file.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "io/model_files.h"
#include "io/safetensors.h"

/* ---- RNG ---- */

static uint64_t splitmix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t di_mk_key(const char *name, uint64_t seed) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return h ^ splitmix64(seed);
}

float di_mk_uniform(uint64_t key, uint64_t i) {
    uint64_t r = splitmix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
    int64_t s = (int64_t)(r >> 40) - ((int64_t)1 << 23);
    return (float)s * (1.0f / 8388608.0f);
}

/* sqrt by Newton's method in doubles: basic IEEE operations only, so it is bit-identical on
 * every conforming machine (unlike a libm call). */
static double det_sqrt(double v) {
    double x = v > 1.0 ? v : 1.0;
    for (int i = 0; i < 64; i++) x = 0.5 * (x + v / x);
    return x;
}

/* ---- generation ---- */

typedef struct role_range { float center, a; int nonzero; } role_range;

static role_range range_of(const di_model_config *c, const di_tensor_spec *s) {
    role_range r = {0.0f, 1.0f, 0};
    switch (s->role) {
    case DI_TROLE_EMBED: r.a = 1.0f; break;
    case DI_TROLE_NORM: r.center = 1.0f; r.a = 0.25f; break;
    case DI_TROLE_NORM_BIAS: r.a = 0.1f; break;
    case DI_TROLE_LINEAR:
    case DI_TROLE_LINEAR_KEEP: r.a = (float)det_sqrt(3.0 / (double)s->shape[1]); break;
    case DI_TROLE_ROUTER: r.a = (float)(2.0 * det_sqrt(3.0 / (double)c->hidden_size)); break;
    case DI_TROLE_ROUTER_BIAS: r.a = 0.25f; r.nonzero = 1; break;
    case DI_TROLE_LM_HEAD: r.a = (float)(2.0 / det_sqrt((double)c->hidden_size)); break;
    }
    return r;
}

typedef enum { KIND_VALUES = 0, KIND_FP8_WEIGHT, KIND_FP8_SCALE } entry_kind;

typedef struct entry {
    size_t spec;          /* index into specs */
    entry_kind kind;
    di_dtype dtype;       /* stored dtype (VALUES) */
} entry;

typedef struct gen_ctx {
    const di_model_config *cfg;
    const di_tensor_spec *specs;
    entry *entries;
    uint64_t seed;
    di_threadpool *pool;
} gen_ctx;

#define CHUNK (1u << 16)

typedef struct fill_job {
    uint64_t key;
    role_range r;
    size_t n;
    float *f32;           /* generate into this ... */
    void *out;            /* ... or convert straight into this */
    di_dtype out_t;
} fill_job;

static void fill_chunk(void *ctx, size_t chunk, int tid) {
    (void)tid;
    fill_job *j = ctx;
    size_t lo = chunk * CHUNK, hi = lo + CHUNK < j->n ? lo + CHUNK : j->n;
    for (size_t i = lo; i < hi; i++) {
        float u = di_mk_uniform(j->key, i);
        if (j->r.nonzero && u == 0.0f) u = 1.0f / 1024.0f;
        float v = j->r.center + u * j->r.a;
        if (j->f32) j->f32[i] = v;
        else if (j->out_t == DI_DTYPE_BF16) ((uint16_t *)j->out)[i] = di_f32_to_bf16(v);
        else if (j->out_t == DI_DTYPE_F16) ((uint16_t *)j->out)[i] = di_f32_to_f16(v);
        else ((float *)j->out)[i] = v;
    }
}

/* The name whose RNG stream a tensor uses: an MTP layer's embed_tokens / shared_head.head hold
 * the same values as the main model's (DeepSeek's MTP shares them). */
static const char *stream_name(const di_tensor_spec *s) {
    if (s->mtp && s->role == DI_TROLE_EMBED) return "model.embed_tokens.weight";
    if (s->mtp && s->role == DI_TROLE_LM_HEAD) return "lm_head.weight";
    return s->name;
}

static void generate(gen_ctx *g, const di_tensor_spec *s, float *f32, void *out, di_dtype out_t) {
    fill_job j = {di_mk_key(stream_name(s), g->seed), range_of(g->cfg, s),
                  (size_t)(s->shape[0] * (s->ndim == 2 ? s->shape[1] : 1)), f32, out, out_t};
    di_threadpool_run(g->pool, (j.n + CHUNK - 1) / CHUNK, fill_chunk, &j);
}

typedef struct quant_job {
    const float *w;       /* [rows, cols] */
    int64_t rows, cols, b0, b1, scols;
    float *scale;         /* [srows, scols] */
    uint8_t *q;           /* [rows, cols] or NULL (scales only) */
} quant_job;

/* One row of blocks: amax -> scale -> (optionally) quantize. */
static void quant_rowblock(void *ctx, size_t rb, int tid) {
    (void)tid;
    quant_job *j = ctx;
    int64_t r0 = (int64_t)rb * j->b0, r1 = r0 + j->b0 < j->rows ? r0 + j->b0 : j->rows;
    for (int64_t cb = 0; cb < j->scols; cb++) {
        int64_t c0 = cb * j->b1, c1 = c0 + j->b1 < j->cols ? c0 + j->b1 : j->cols;
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = c0; c < c1; c++) {
                float a = j->w[r * j->cols + c];
                if (a < 0) a = -a;
                if (a > amax) amax = a;
            }
        float sc = amax > 0.0f ? amax / 448.0f : 1.0f;
        j->scale[rb * j->scols + cb] = sc;
        if (!j->q) continue;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = c0; c < c1; c++) j->q[r * j->cols + c] = di_f32_to_fp8e4m3(j->w[r * j->cols + c] / sc);
    }
}

static di_status fill_fp8(gen_ctx *g, const di_tensor_spec *s, int want_scale, void *dst) {
    int64_t ss[2];
    di_scale_shape(g->cfg, s->shape, ss);
    size_t n = (size_t)(s->shape[0] * s->shape[1]);
    float *w = malloc(n * sizeof *w);
    float *scale = want_scale ? dst : malloc((size_t)(ss[0] * ss[1]) * sizeof *scale);
    if (!w || !scale) {
        free(w);
        if (!want_scale) free(scale);
        return di_error(DI_ERR_NOMEM, "mkmodel: tensor '%s': out of memory", s->name);
    }
    generate(g, s, w, NULL, DI_DTYPE_F32);
    quant_job j = {w, s->shape[0], s->shape[1], g->cfg->weight_block[0], g->cfg->weight_block[1], ss[1], scale,
                   want_scale ? NULL : dst};
    di_threadpool_run(g->pool, (size_t)ss[0], quant_rowblock, &j);
    free(w);
    if (!want_scale) free(scale);
    return DI_OK;
}

static di_status fill_entry(void *ctx, size_t index, void *dst, size_t nbytes) {
    (void)nbytes;
    gen_ctx *g = ctx;
    const entry *e = &g->entries[index];
    const di_tensor_spec *s = &g->specs[e->spec];
    if (e->kind == KIND_VALUES) {
        generate(g, s, NULL, dst, e->dtype);
        return DI_OK;
    }
    return fill_fp8(g, s, e->kind == KIND_FP8_SCALE, dst);
}

/* ---- files ---- */

static di_status make_dir(const char *dir) {
    char *p = strdup(dir);
    if (!p) return di_error(DI_ERR_NOMEM, "out of memory");
    for (char *q = p + 1; *q; q++) {
        if (*q != '/') continue;
        *q = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            di_status s = di_error(DI_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
            free(p);
            return s;
        }
        *q = '/';
    }
    di_status s = DI_OK;
    if (mkdir(p, 0755) != 0 && errno != EEXIST) s = di_error(DI_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
    free(p);
    return s;
}

static di_status write_json(const char *dir, const char *name, json_t *j) {
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    char *path = di_path_join(dir, name);
    di_status s;
    if (!text || !path) s = di_error(DI_ERR_NOMEM, "out of memory");
    else {
        size_t l = strlen(text);
        text[l] = '\n';
        s = di_write_file(path, text, l + 1);
    }
    free(text);
    free(path);
    return s;
}

static di_status copy_file(const char *src_dir, const char *dst_dir, const char *name) {
    char *src = di_path_join(src_dir, name), *dst = di_path_join(dst_dir, name), *buf = NULL;
    size_t len = 0;
    di_status s = (!src || !dst) ? di_error(DI_ERR_NOMEM, "out of memory") : di_read_file(src, &buf, &len, 0);
    if (s == DI_OK) s = di_write_file(dst, buf, len);
    free(buf);
    free(src);
    free(dst);
    return s;
}

static di_status remove_stale(const char *dir) {
    /* a previous checkpoint in another layout (single vs sharded) must not linger */
    const char *names[] = {"model.safetensors", "model.safetensors.index.json"};
    for (int i = 0; i < 2; i++) {
        char *p = di_path_join(dir, names[i]);
        if (!p) return di_error(DI_ERR_NOMEM, "out of memory");
        if (di_file_exists(p) && remove(p) != 0) {
            di_status s = di_error(DI_ERR_IO, "%s: cannot remove: %s", p, strerror(errno));
            free(p);
            return s;
        }
        free(p);
    }
    return DI_OK;
}

di_status di_mkmodel_write(const di_model_config *cfg_in, const di_mkmodel_opts *o, const char *dir) {
    di_model_config cfg = *cfg_in;
    cfg.fp8 = o->dtype == DI_MK_FP8;
    cfg.num_nextn_predict_layers = o->mtp;
    cfg.torch_dtype = o->dtype == DI_MK_F32 ? DI_DTYPE_F32 : DI_DTYPE_BF16;
    if (cfg.fp8 && (cfg.weight_block[0] < 1 || cfg.weight_block[1] < 1)) cfg.weight_block[0] = cfg.weight_block[1] = 128;
    DI_TRY(di_config_validate(&cfg, "mkmodel config"));
    DI_TRY(make_dir(dir));

    di_tensor_spec *specs = NULL;
    size_t n = 0;
    DI_TRY(di_model_tensor_specs(&cfg, &specs, &n));
    di_status s = DI_OK;
    di_st_writer *wr = di_st_writer_create();
    entry *entries = malloc(2 * n * sizeof *entries);
    gen_ctx g = {&cfg, specs, entries, o->seed, NULL};
    if (!wr || !entries) { s = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
    /* declare: each FP8 weight is followed by its scale */
    size_t k = 0;
    for (size_t i = 0; i < n && s == DI_OK; i++) {
        const di_tensor_spec *sp = &specs[i];
        if (sp->optional && !sp->mtp) continue; /* lm_head of a tied-embedding model */
        if (cfg.fp8 && di_tensor_role_quantizable(sp->role)) {
            char sn[DI_TENSOR_NAME_MAX + 16];
            int64_t ss[2];
            di_scale_shape(&cfg, sp->shape, ss);
            di_scale_name(sp->name, sn, sizeof sn);
            s = di_st_writer_add_lazy(wr, sp->name, DI_DTYPE_F8_E4M3, 2, sp->shape);
            entries[k++] = (entry){i, KIND_FP8_WEIGHT, DI_DTYPE_F8_E4M3};
            if (s == DI_OK) s = di_st_writer_add_lazy(wr, sn, DI_DTYPE_F32, 2, ss);
            entries[k++] = (entry){i, KIND_FP8_SCALE, DI_DTYPE_F32};
            continue;
        }
        di_dtype t = sp->role == DI_TROLE_ROUTER_BIAS || o->dtype == DI_MK_F32 ? DI_DTYPE_F32 : DI_DTYPE_BF16;
        s = di_st_writer_add_lazy(wr, sp->name, t, sp->ndim, sp->shape);
        entries[k++] = (entry){i, KIND_VALUES, t};
    }
    if (s != DI_OK) goto done;
    g.pool = di_threadpool_create(o->n_threads);
    di_st_writer_set_fill(wr, fill_entry, &g);
    if ((s = remove_stale(dir)) != DI_OK) goto done;
    size_t shard = o->shard_bytes;
    if (!shard && di_st_writer_total_bytes(wr) > DI_MK_AUTO_SHARD) shard = DI_MK_AUTO_SHARD;
    if (shard) s = di_st_writer_write_sharded(wr, dir, shard);
    else {
        char *path = di_path_join(dir, "model.safetensors");
        s = path ? di_st_writer_write(wr, path) : di_error(DI_ERR_NOMEM, "out of memory");
        free(path);
    }
    if (s != DI_OK) goto done;
    json_t *cj = di_config_to_json(&cfg);
    s = cj ? write_json(dir, "config.json", cj) : di_error(DI_ERR_NOMEM, "out of memory");
    json_decref(cj);
    if (s != DI_OK) goto done;
    if (o->tokenizer_dir) {
        s = copy_file(o->tokenizer_dir, dir, "tokenizer.json");
        if (s == DI_OK) s = copy_file(o->tokenizer_dir, dir, "tokenizer_config.json");
    } else {
        s = di_mkmodel_write_tokenizer(cfg.vocab_size, dir);
    }
done:
    di_threadpool_free(g.pool);
    di_st_writer_free(wr);
    free(entries);
    free(specs);
    return s;
}
