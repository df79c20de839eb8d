/* cuda_test_util.h - helpers of the CPU-vs-CUDA parity tests: both backends, fresh random
 * inputs every run (seed from the clock unless DI_TEST_SEED is set; printed), bf16 rounding on
 * the host so both backends see identical operands, device buffers with dtype conversion, NaN
 * poisoning of outputs before each GPU run, and the two error metrics every comparison reports:
 * ||got - ref|| / ||ref|| and max|got - ref| / max|ref| (a NaN anywhere fails). */
#ifndef DI_CUDA_TEST_UTIL_H
#define DI_CUDA_TEST_UTIL_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/status.h"
#include "test_util.h"

static di_backend *g_cpu, *g_gpu;
static int g_gpu_precision; /* the di_precision t_backends creates g_gpu with (0: bf16) */
static uint64_t g_state;

static inline uint64_t t_u64(void) {
    uint64_t z = (g_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline float t_unif(float a) { return a * (2.0f * (float)((t_u64() >> 40) * (1.0 / 16777216.0)) - 1.0f); }
static inline int t_int(int n) { return (int)(t_u64() % (uint64_t)n); }

static inline void t_seed(void) {
    const char *e = getenv("DI_TEST_SEED");
    g_state = e ? strtoull(e, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    fprintf(stderr, "seed %llu (DI_TEST_SEED to repeat)\n", (unsigned long long)g_state);
}

/* uniform in [-a, a), rounded to bf16 */
static inline float *t_rand(size_t n, float a) {
    float *v = (float *)malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = di_bf16_to_f32(di_f32_to_bf16(t_unif(a)));
    return v;
}

/* uniform in [-a, a), full fp32 precision (residual stream, router input) */
static inline float *t_rand_f32(size_t n, float a) {
    float *v = (float *)malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = t_unif(a);
    return v;
}

static inline uint16_t *t_to_bf16(const float *f, size_t n) {
    uint16_t *h = (uint16_t *)malloc((n ? n : 1) * 2);
    for (size_t i = 0; i < n; i++) h[i] = di_f32_to_bf16(f[i]);
    return h;
}

/* ---- GPU buffers ---- */
static inline void *g_alloc(size_t bytes) {
    void *p = NULL;
    if (g_gpu->alloc(g_gpu, bytes ? bytes : 16, &p) != DI_OK) {
        fprintf(stderr, "gpu alloc of %zu bytes failed: %s\n", bytes, di_last_error());
        exit(2);
    }
    return p;
}
static inline void *g_act(const float *h, size_t n) {
    uint16_t *b = t_to_bf16(h, n);
    void *d = g_alloc(n * 2);
    g_gpu->upload(g_gpu, d, b, n * 2);
    g_gpu->sync(g_gpu);
    free(b);
    return d;
}
static inline void *g_raw(const void *h, size_t bytes) {
    void *d = g_alloc(bytes);
    g_gpu->upload(g_gpu, d, h, bytes);
    g_gpu->sync(g_gpu);
    return d;
}
static inline float *g_get_act(const void *d, size_t n) {
    uint16_t *b = (uint16_t *)malloc((n ? n : 1) * 2);
    float *f = (float *)malloc((n ? n : 1) * 4);
    di_status s = g_gpu->download(g_gpu, b, d, n * 2);
    if (s != DI_OK) fprintf(stderr, "download failed: %s\n", di_last_error());
    for (size_t i = 0; i < n; i++) f[i] = s == DI_OK ? di_bf16_to_f32(b[i]) : NAN;
    free(b);
    return f;
}
static inline float *g_get_f32(const void *d, size_t n) {
    float *f = (float *)malloc((n ? n : 1) * 4);
    di_status s = g_gpu->download(g_gpu, f, d, n * 4);
    if (s != DI_OK) {
        fprintf(stderr, "download failed: %s\n", di_last_error());
        for (size_t i = 0; i < n; i++) f[i] = NAN;
    }
    return f;
}
static inline void g_poison(void *d, size_t bytes) { g_gpu->memset(g_gpu, d, 0xff, bytes); }
static inline void g_free(void *d) { g_gpu->free(g_gpu, d); }

/* ---- metrics ---- */
typedef struct { double l2, mx; int nan; } t_err;

static inline t_err t_compare(const float *got, const float *ref, size_t n) {
    t_err e = {0, 0, 0};
    double dd = 0, rr = 0, md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isinf(got[i])) e.nan++;
        double d = (double)got[i] - ref[i];
        dd += d * d;
        rr += (double)ref[i] * ref[i];
        if (fabs(d) > md) md = fabs(d);
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    e.l2 = rr > 0 ? sqrt(dd / rr) : sqrt(dd);
    e.mx = mr > 0 ? md / mr : md;
    if (e.nan) e.l2 = e.mx = NAN;
    return e;
}

/* Prints "op  shape  l2  max" and checks both against their tolerances. */
#define T_CHECK(what, got, ref, n, tol_l2, tol_max)                                                              \
    do {                                                                                                         \
        t_err e_ = t_compare((got), (ref), (n));                                                                 \
        int ok_ = !e_.nan && e_.l2 <= (tol_l2) && e_.mx <= (tol_max);                                            \
        fprintf(stderr, "  %-44s l2 %.2e  max %.2e%s\n", (what), e_.l2, e_.mx, ok_ ? "" : "   FAIL");             \
        CHECK_MSG(ok_, "%s: ||d||/||ref|| %.3g (tol %.1g), max|d|/max|ref| %.3g (tol %.1g), %d non-finite", (what), \
                  e_.l2, (double)(tol_l2), e_.mx, (double)(tol_max), e_.nan);                                     \
    } while (0)

/* bf16 tolerances: one rounding of the output (2^-9) plus fp32 accumulation-order noise */
#define TOL_L2 8e-3
#define TOL_MAX 2e-2

/* ---- weights ---- */
/* n matrices [rows, cols] of bf16 values (f32 copy in *ref if asked) uploaded to a backend. */
typedef struct t_weight {
    int n, rows, cols, fp8;
    uint16_t **bf;       /* [n] bf16 data */
    uint8_t **q;         /* [n] fp8 data */
    float **sc;          /* [n] scales [ceil(rows/t_fp8_br)][ceil(cols/t_fp8_bc)] */
    float *deq;          /* [n, rows, cols] dequantized values */
} t_weight;

/* the fp8 block-scale shape of the next t_weight_make / t_weight_upload (DeepSeek's 128 x 128
 * unless a test sets another) */
static int t_fp8_br = 128, t_fp8_bc = 128;

static inline t_weight t_weight_make(int n, int rows, int cols, int fp8, float amp) {
    t_weight w = {n, rows, cols, fp8, NULL, NULL, NULL, NULL};
    size_t per = (size_t)rows * cols;
    w.deq = (float *)malloc(per * n * sizeof(float));
    if (!fp8) {
        w.bf = (uint16_t **)calloc((size_t)n, sizeof *w.bf);
        for (int i = 0; i < n; i++) {
            w.bf[i] = (uint16_t *)malloc(per * 2);
            for (size_t j = 0; j < per; j++) {
                w.bf[i][j] = di_f32_to_bf16(t_unif(amp));
                w.deq[i * per + j] = di_bf16_to_f32(w.bf[i][j]);
            }
        }
        return w;
    }
    int sr = (rows + t_fp8_br - 1) / t_fp8_br, scn = (cols + t_fp8_bc - 1) / t_fp8_bc;
    w.q = (uint8_t **)calloc((size_t)n, sizeof *w.q);
    w.sc = (float **)calloc((size_t)n, sizeof *w.sc);
    for (int i = 0; i < n; i++) {
        w.q[i] = (uint8_t *)malloc(per);
        w.sc[i] = (float *)malloc((size_t)sr * scn * sizeof(float));
        for (int j = 0; j < sr * scn; j++) w.sc[i][j] = amp / 448.0f * (0.5f + (float)(t_u64() % 1000) / 1000.0f);
        for (size_t j = 0; j < per; j++) {
            uint8_t b;
            do b = (uint8_t)t_u64(); while ((b & 0x7f) == 0x7f); /* no NaN encodings */
            w.q[i][j] = b;
            int r = (int)(j / cols), c = (int)(j % cols);
            w.deq[i * per + j] = di_fp8e4m3_to_f32(b) * w.sc[i][(r / t_fp8_br) * scn + c / t_fp8_bc];
        }
    }
    return w;
}

static inline di_weight t_weight_upload(di_backend *be, const t_weight *w, di_weight_layout layout) {
    di_host_matrix *hm = (di_host_matrix *)calloc((size_t)w->n, sizeof *hm);
    for (int i = 0; i < w->n; i++) {
        hm[i].name = "test";
        hm[i].dtype = w->fp8 ? DI_DTYPE_F8_E4M3 : DI_DTYPE_BF16;
        hm[i].rows = w->rows;
        hm[i].cols = w->cols;
        hm[i].data = w->fp8 ? (const void *)w->q[i] : (const void *)w->bf[i];
        hm[i].scale = w->fp8 ? w->sc[i] : NULL;
        hm[i].block_rows = t_fp8_br;
        hm[i].block_cols = t_fp8_bc;
    }
    di_weight out;
    di_status s = be->weight_upload(be, w->n, 1, hm, layout, &out);
    free(hm);
    if (s != DI_OK) {
        fprintf(stderr, "weight_upload failed: %s\n", di_last_error());
        memset(&out, 0, sizeof out);
    }
    return out;
}

static inline void t_weight_free(t_weight *w) {
    for (int i = 0; i < w->n; i++) {
        if (w->bf) free(w->bf[i]);
        if (w->q) free(w->q[i]);
        if (w->sc) free(w->sc[i]);
    }
    free(w->bf);
    free(w->q);
    free(w->sc);
    free(w->deq);
}

/* an f32 vector weight (norm weights, router bias) */
static inline di_weight t_vec_upload(di_backend *be, const float *v, int n) {
    di_host_matrix hm = {"test", DI_DTYPE_F32, 0, 1, n, v, NULL, 0, 0};
    di_weight out;
    if (be->weight_upload(be, 1, 1, &hm, DI_WEIGHT_PLAIN, &out) != DI_OK) memset(&out, 0, sizeof out);
    return out;
}

/* A RoPE frequency table of dr / 2 entries (malloc'd): 10000^(-2i / dr), the last third scaled
 * by 0.025 as YaRN's interpolated frequencies are. */
static inline float *t_rope_inv_freq(int dr) {
    int half = dr / 2;
    float *inv = (float *)malloc((size_t)half * 4);
    for (int i = 0; i < half; i++) inv[i] = powf(10000.0f, -2.0f * i / dr) * (i > half * 2 / 3 ? 0.025f : 1.0f);
    return inv;
}

/* ---------------------------------------------------------------- paged batches ---- */

/* A step's attention batch over a paged cache: sequence i has q_len[i] tokens, the last of its
 * ctx[i] positions; blocks handed out in shuffled order (3 spare blocks); the cache starts random
 * (every context position's row, as if written by earlier steps). hab holds host pointers (the
 * CPU), dab device pointers with the same values (the GPU). The device cache is bf16 (the
 * values rounded on the host first, so both sides see the same operands) or, for the f32 op
 * table, f32. */
typedef struct paged {
    int S, T, W, max_blocks, n_blocks;
    int32_t *pos, *slots, *start, *ctx, *bt;
    float *cache;          /* [n_blocks * 64, W] host */
    void *dcache;          /* device bf16, or f32 (paged_make_as with f32) */
    int32_t *dpos, *dslots, *dstart, *dctx, *dbt;
    di_attn_batch hab, dab; /* host / device metadata */
} paged;

static inline void paged_make_as(paged *p, int S, const int *q_len, const int *ctx, int W, int f32) {
    memset(p, 0, sizeof *p);
    p->S = S;
    p->W = W;
    int mq = 0, mc = 0;
    p->start = (int32_t *)calloc((size_t)S + 1, 4);
    p->ctx = (int32_t *)calloc((size_t)S, 4);
    for (int i = 0; i < S; i++) {
        p->start[i + 1] = p->start[i] + q_len[i];
        p->ctx[i] = ctx[i];
        int nb = (ctx[i] + 63) / 64;
        if (nb > p->max_blocks) p->max_blocks = nb;
        p->n_blocks += nb;
        mq = q_len[i] > mq ? q_len[i] : mq;
        mc = ctx[i] > mc ? ctx[i] : mc;
    }
    p->T = p->start[S];
    p->n_blocks += 3;
    /* blocks handed out in a shuffled order */
    int *perm = (int *)malloc((size_t)p->n_blocks * sizeof(int));
    for (int i = 0; i < p->n_blocks; i++) perm[i] = i;
    for (int i = p->n_blocks - 1; i > 0; i--) {
        int j = t_int(i + 1), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    p->bt = (int32_t *)calloc((size_t)S * p->max_blocks, 4);
    int next = 0;
    for (int i = 0; i < S; i++)
        for (int b = 0; b < (ctx[i] + 63) / 64; b++) p->bt[i * p->max_blocks + b] = perm[next++];
    free(perm);
    p->pos = (int32_t *)malloc((size_t)(p->T > 0 ? p->T : 1) * 4);
    p->slots = (int32_t *)malloc((size_t)(p->T > 0 ? p->T : 1) * 4);
    for (int i = 0; i < S; i++)
        for (int j = 0; j < q_len[i]; j++) {
            int t = p->start[i] + j, ps = ctx[i] - q_len[i] + j;
            p->pos[t] = ps;
            p->slots[t] = p->bt[i * p->max_blocks + ps / 64] * 64 + ps % 64;
        }
    size_t nc = (size_t)p->n_blocks * 64 * W;
    p->cache = f32 ? t_rand_f32(nc, 1.0f) : t_rand(nc, 1.0f);
    p->dcache = f32 ? g_raw(p->cache, nc * 4) : g_act(p->cache, nc);
    p->dpos = (int32_t *)g_raw(p->pos, (size_t)p->T * 4);
    p->dslots = (int32_t *)g_raw(p->slots, (size_t)p->T * 4);
    p->dstart = (int32_t *)g_raw(p->start, ((size_t)S + 1) * 4);
    p->dctx = (int32_t *)g_raw(p->ctx, (size_t)S * 4);
    p->dbt = (int32_t *)g_raw(p->bt, (size_t)S * p->max_blocks * 4);
    p->hab = (di_attn_batch){.positions = p->pos, .slot_mapping = p->slots, .seq_start = p->start, .seq_ctx_len = p->ctx,
                             .block_table = p->bt, .n_tokens = p->T, .n_seqs = S, .max_blocks = p->max_blocks,
                             .max_q_len = mq, .max_ctx_len = mc};
    p->dab = p->hab;
    p->dab.positions = p->dpos;
    p->dab.slot_mapping = p->dslots;
    p->dab.seq_start = p->dstart;
    p->dab.seq_ctx_len = p->dctx;
    p->dab.block_table = p->dbt;
}

static inline void paged_make(paged *p, int S, const int *q_len, const int *ctx, int W) {
    paged_make_as(p, S, q_len, ctx, W, 0);
}

static inline void paged_free(paged *p) {
    free(p->pos); free(p->slots); free(p->start); free(p->ctx); free(p->bt); free(p->cache);
    g_free(p->dcache); g_free(p->dpos); g_free(p->dslots); g_free(p->dstart); g_free(p->dctx); g_free(p->dbt);
}

/* The V3.2 index score of token t at context position s of sequence seq (host fp64 on the
 * cache's host values), as backend.h defines it: q [T, n_heads, hd], w [T, n_heads]. */
static inline double ix_score(const paged *p, int seq, const float *q, const float *w, int t, int s,
                              const di_indexer_dims *d) {
    int hd = d->head_dim;
    const float *k = p->cache + ((size_t)p->bt[seq * p->max_blocks + s / 64] * 64 + s % 64) * hd;
    double acc = 0;
    for (int h = 0; h < d->n_heads; h++) {
        double dot = 0;
        for (int j = 0; j < hd; j++) dot += (double)q[((size_t)t * d->n_heads + h) * hd + j] * k[j];
        dot *= d->scale;
        acc += (double)w[(size_t)t * d->n_heads + h] * d->weight_scale * (dot > 0 ? dot : 0);
    }
    return acc;
}

/* Another CUDA backend, created with the environment switch var=val (unset again afterwards,
 * so the next backends see the default); NULL, with a failed check, if it cannot be made. */
static inline di_backend *g_backend_with(const char *var, const char *val) {
    setenv(var, val, 1);
    di_backend *be = NULL;
    CHECK_OK(di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &be));
    unsetenv(var);
    return be;
}

/* Creates both backends; returns 0 if there is no CUDA device (the caller fails the test). */
static inline int t_backends(void) {
    if (di_backend_create(&(di_backend_options){DI_DEVICE_CPU, 0, 0, 0}, &g_cpu) != DI_OK) return 0;
    di_status s = di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, g_gpu_precision}, &g_gpu);
    if (s != DI_OK) {
        fprintf(stderr, "no CUDA backend: %s\n", di_last_error());
        return 0;
    }
    return 1;
}

/* Runs the named groups (argv) or all; each group is a function. */
typedef struct t_group { const char *name; void (*fn)(void); } t_group;
static inline int t_main(int argc, char **argv, const t_group *groups, int n) {
    for (int a = 1; a < argc; a++) {
        int known = 0;
        for (int i = 0; i < n; i++) known |= !strcmp(argv[a], groups[i].name);
        if (!known) {
            fprintf(stderr, "FAIL: unknown group '%s'; groups:", argv[a]);
            for (int i = 0; i < n; i++) fprintf(stderr, " %s", groups[i].name);
            fprintf(stderr, "\n");
            return 1;
        }
    }
    t_seed();
    if (!t_backends()) {
        fprintf(stderr, "FAIL: a CUDA device is required\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        int run = argc < 2;
        for (int a = 1; a < argc; a++) run |= !strcmp(argv[a], groups[i].name);
        if (!run) continue;
        fprintf(stderr, "-- %s\n", groups[i].name);
        groups[i].fn();
        di_status s = g_gpu->sync(g_gpu);
        CHECK_MSG(s == DI_OK, "group %s left a device error: %s", groups[i].name, di_last_error());
    }
    di_backend_free(g_gpu);
    di_backend_free(g_cpu);
    fprintf(stderr, "%d checks, %d failures\n", g_test_checks, g_test_failures);
    return g_test_failures ? 1 : (g_test_checks ? 0 : 1);
}

/* t_main where groups[0] also runs (first) when the command line names other groups: the
 * reserve() call that a model makes at load, which the op groups rely on. */
static inline int t_main_first_always(int argc, char **argv, const t_group *groups, int n) {
    if (argc < 2) return t_main(argc, argv, groups, n);
    char **av = (char **)malloc((size_t)(argc + 1) * sizeof *av);
    av[0] = argv[0];
    av[1] = (char *)groups[0].name;
    for (int i = 1; i < argc; i++) av[i + 1] = argv[i];
    return t_main(argc + 1, av, groups, n);
}
#endif
