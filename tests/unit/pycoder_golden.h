/* pycoder_golden.h - shared by the CPU test (tests/unit/test_pycoder_golden.c) and the GPU test
 * (tests/ops/test_cuda_model.c "pycoder"): the transformers golden logits of the shipped model
 * models/pycoder-moe (tests/data/golden_pycoder/golden_pycoder.json, written by
 * tools/golden/make_pycoder_golden.py; the logits themselves are in golden_pycoder.tar.xz, which
 * configure unpacks into $DI_BUILD_DIR/tests/data/golden_pycoder/).
 *
 * pg_compare runs `$DI_BIN logits --model M --ids ... --mode MODE EXTRA --out F` for one case
 * and compares the rows the manifest kept: max|d| / max|ref| (NaN if any value is NaN),
 * ||d|| / ||ref||, and how many argmaxes agree. Environment: DI_BIN, DI_BUILD_DIR (or
 * DI_GOLDEN_PYCODER_DIR for the unpacked logits), DI_PYCODER_MODEL (else the source tree's
 * models/pycoder-moe). Static functions only; include once per test. */
#ifndef DI_TEST_PYCODER_GOLDEN_H
#define DI_TEST_PYCODER_GOLDEN_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "core/mmap_file.h"
#include "core/status.h"
#include "test_util.h"
#include "cli_test_util.h"
#include "golden_util.h"

typedef struct pg_stats {
    double rel_max;      /* max|d| / max|ref| over the kept rows */
    double rel_l2;       /* ||d|| / ||ref|| */
    int rows;            /* kept rows compared */
    int argmax_same;     /* kept rows whose argmax equals the reference's */
    long worst_row, worst_id;
    float worst_got, worst_ref;
} pg_stats;

static const char *pg_model_dir(void) {
    const char *m = getenv("DI_PYCODER_MODEL");
    return m && *m ? m : test_src_path("models/pycoder-moe");
}

/* The manifest, after checking that the model files are the ones transformers read. */
static json_t *pg_manifest(void) {
    json_t *man = NULL;
    CHECK_OK(di_json_load_file(test_src_path("tests/data/golden_pycoder/golden_pycoder.json"), &man));
    if (!man) return NULL;
    const char *f;
    json_t *crc;
    int n_files = 0;
    json_object_foreach(json_object_get(man, "model_crc32"), f, crc) {
        char path[4400];
        int ok;
        snprintf(path, sizeof path, "%s/%s", pg_model_dir(), f);
        uint32_t got = test_crc32_file(path, &ok);
        CHECK_MSG(ok && got == (uint32_t)json_integer_value(crc),
                  "%s: crc32 %08x, the golden data was made from %08x: the model changed; rerun "
                  "tools/golden/make_pycoder_golden.py", path, got, (uint32_t)json_integer_value(crc));
        n_files++;
    }
    CHECK_MSG(n_files >= 2, "golden_pycoder.json lists %d model files", n_files);
    return man;
}

/* Reference rows of a case (malloc'd [rows, vocab]); NULL on error (reported). */
static float *pg_reference(json_t *man, json_t *c) {
    const char *dir = getenv("DI_GOLDEN_PYCODER_DIR"), *build = getenv("DI_BUILD_DIR");
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *file = json_string_value(json_object_get(c, "logits"));
    long V = (long)json_integer_value(json_object_get(man, "vocab_size"));
    long rows = (long)json_array_size(json_object_get(c, "rows"));
    char path[4400];
    if (dir && *dir) snprintf(path, sizeof path, "%s/%s", dir, file ? file : "?");
    else snprintf(path, sizeof path, "%s/tests/data/golden_pycoder/%s", build ? build : ".", file ? file : "?");
    float *ref = NULL;
    long n = test_read_f32(path, &ref);
    CHECK_MSG(n == rows * V && rows > 0, "%s: %s has %ld floats, expected %ld rows x %ld (unpacked from "
              "golden_pycoder.tar.xz at configure time?)", name ? name : "?", path, n, rows, V);
    if (n != rows * V || rows <= 0) {
        free(ref);
        return NULL;
    }
    return ref;
}

/* Runs the CLI for case c in `mode` with `extra` arguments into `out` and compares the kept
 * rows with ref. *all (optional) receives every row of the output (malloc'd [n_ids, vocab]).
 * Returns 0 on success, -1 if the command failed or wrote the wrong size (reported). */
static int pg_compare(json_t *man, json_t *c, const float *ref, const char *mode, const char *extra, const char *out,
                      pg_stats *st, float **all) {
    const char *bin = getenv("DI_BIN"), *name = json_string_value(json_object_get(c, "name"));
    json_t *ids = json_object_get(c, "ids"), *rows = json_object_get(c, "rows");
    long V = (long)json_integer_value(json_object_get(man, "vocab_size"));
    long n_ids = (long)json_array_size(ids), n_rows = (long)json_array_size(rows);
    memset(st, 0, sizeof *st);
    if (all) *all = NULL;
    char *idstr = test_ids_csv(ids);
    size_t cap = strlen(idstr ? idstr : "") + 8192;
    char *cmd = (char *)malloc(cap);
    if (!idstr || !cmd || !bin) {
        CHECK_MSG(0, "%s: out of memory or DI_BIN unset", name);
        free(idstr);
        free(cmd);
        return -1;
    }
    remove(out);
    snprintf(cmd, cap, "'%s' logits --model '%s' --ids %s --mode %s %s --out '%s'", bin, pg_model_dir(), idstr, mode,
             extra ? extra : "", out);
    int rc = test_run(cmd);
    free(idstr);
    free(cmd);
    CHECK_MSG(rc == 0, "%s/%s: `deepinfer logits %s` failed (exit %d)", name, mode, extra ? extra : "", rc);
    if (rc != 0) return -1;
    float *got = NULL;
    long n = test_read_f32(out, &got);
    CHECK_MSG(n == n_ids * V, "%s/%s: %ld floats written, expected %ld x %ld", name, mode, n, n_ids, V);
    if (n != n_ids * V) {
        free(got);
        return -1;
    }
    double maxref = 0, maxd = 0, dd = 0, rr = 0;
    int nan_seen = 0;
    for (long r = 0; r < n_rows; r++) {
        long t = (long)json_integer_value(json_array_get(rows, (size_t)r));
        CHECK_MSG(t >= 0 && t < n_ids, "%s: kept row %ld out of range", name, t);
        if (t < 0 || t >= n_ids) continue;
        const float *g = got + t * V, *f = ref + r * V;
        long ag = 0, af = 0;
        for (long v = 0; v < V; v++) {
            double d = fabs((double)g[v] - (double)f[v]);
            if (d != d) {
                nan_seen = 1;
            } else if (d > maxd) {
                maxd = d;
                st->worst_row = t;
                st->worst_id = v;
                st->worst_got = g[v];
                st->worst_ref = f[v];
            }
            maxref = fmax(maxref, fabs((double)f[v]));
            if (d == d) dd += d * d;
            rr += (double)f[v] * f[v];
            if (g[v] > g[ag]) ag = v;
            if (f[v] > f[af]) af = v;
        }
        st->argmax_same += ag == af;
        st->rows++;
    }
    st->rel_max = maxref > 0 ? maxd / maxref : INFINITY;
    st->rel_l2 = rr > 0 ? sqrt(dd / rr) : INFINITY;
    if (nan_seen) st->rel_max = st->rel_l2 = NAN; /* never passes a <= bound */
    if (all) *all = got;
    else free(got);
    return 0;
}
/* max|d| / max|ref| of all-row logits `all` [n, V] against case c's reference rows (its kept
 * rows, [rows, V]); NaN if any compared value is NaN */
static inline double pg_kept_err(json_t *c, const float *all, const float *ref, long V) {
    json_t *rows = json_object_get(c, "rows");
    double md = 0, mr = 0;
    for (size_t r = 0; r < json_array_size(rows); r++) {
        long t = (long)json_integer_value(json_array_get(rows, r));
        for (long v = 0; v < V; v++) {
            double d = fabs((double)all[t * V + v] - ref[(long)r * V + v]);
            md = d > md || d != d ? d : md;
            mr = fmax(mr, fabs(ref[(long)r * V + v]));
        }
    }
    return md / mr;
}
#endif
