/* ops_test_util.h - helpers shared by the CPU op tests: a deterministic RNG, host weights
 * uploaded to a backend, and relative-error comparison against reference arrays. */
#ifndef DI_OPS_TEST_UTIL_H
#define DI_OPS_TEST_UTIL_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

static uint64_t g_rng = 0x1234567ull;
static inline uint64_t rng_u64(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform in [-a, a) */
static inline float rng_f(float a) { return a * (2.0f * (float)((rng_u64() >> 40) * (1.0 / 16777216.0)) - 1.0f); }
static inline int rng_int(int n) { return (int)(rng_u64() % (uint64_t)n); }
static inline float *rand_vec(size_t n, float a) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = rng_f(a);
    return v;
}
/* max |a - b| / max |b| (b = reference); 0 for empty */
static inline double rel_err(const float *a, const double *b, size_t n) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = d;  /* NaN propagates */
        if (fabs(b[i]) > mr) mr = fabs(b[i]);
    }
    return mr > 0 ? md / mr : md;
}
static inline double rel_err_f(const float *a, const float *b, size_t n) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = d;
        if (fabs(b[i]) > mr) mr = fabs(b[i]);
    }
    return mr > 0 ? md / mr : md;
}
/* Uploads an fp32 host matrix stack [n, rows, cols] as a backend weight. */
static inline di_weight upload_f32(di_backend *be, int n, int rows, int cols, const float *data) {
    di_host_matrix *hm = calloc((size_t)n, sizeof *hm);
    for (int i = 0; i < n; i++)
        hm[i] = (di_host_matrix){"test", DI_DTYPE_F32, 0, rows, cols, data + (size_t)i * rows * cols, NULL, 0, 0};
    di_weight w;
    di_status s = be->weight_upload(be, n, 1, hm, DI_WEIGHT_PLAIN, &w);
    free(hm);
    if (s != DI_OK) memset(&w, 0, sizeof w);
    return w;
}
#endif
