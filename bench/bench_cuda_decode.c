/* bench_cuda_decode.c - the ops of a small decode step as a CUDA graph replays them: chains of
 * the same op over rotating weight copies (so every launch reads its weights from HBM, not
 * from the 50 MB L2, and consecutive launches overlap as in a real step), at DeepSeek-V2-Lite
 * shapes: the attention / dense projections and per-head absorptions at 1, 4, 8 and 16 rows
 * (GEMV or cuBLASLt as the dispatch picks), and the experts of a 1-4-token step,
 * fused (routed + shared, cuda_moe_small.cu) and as the older sequence (permuted moe_experts,
 * then the shared gate/up GEMV, silu_mul and the accumulating down GEMV).
 *
 *   bench_cuda_decode [gemv] [moe] [--fp8] [--only NAME] [--rows T]
 *                                             (default both; env switches of docs/cuda.md apply;
 *                                             DEEPINFER_CUDA_MOE_SMALL defaults to 4 here;
 *                                             --fp8: the weights fp8 e4m3 with 128 x 128
 *                                             block scales, as DeepSeek-V3's;
 *                                             --only / --rows: the GEMV / GEMM shapes whose
 *                                             name contains NAME, at T rows only)
 *
 * Prints time per op (median of the replays), the bytes it must read and the fraction of the
 * copy bandwidth (4218 GB/s, docs/PERF.md; --bw to change). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DI_HAVE_CUDA
#include "bench_cuda_util.h"

static double g_bw = 4218e9;
static int g_fp8;             /* --fp8: the weights (GEMV shapes and experts) in fp8 */
static const char *g_only;    /* --only S: the GEMV / GEMM shapes whose name contains S */
static int g_rows;            /* --rows T: only T rows (0: 1, 4, 8, 16) */

/* n views of `heads` matrices each into one uploaded weight of n * heads matrices */
static di_weight *views(const di_weight *all, int n, int heads) {
    di_weight *v = calloc((size_t)n, sizeof *v);
    size_t per = (size_t)all->rows * all->cols * heads * (all->dtype == DI_DTYPE_BF16 ? 2 : 1);
    /* fp8 scales: [matrix][ceil(rows / block_rows)][roundup(ceil(cols / block_cols), 4)] floats */
    size_t sper = 0;
    if (all->dtype == DI_DTYPE_F8_E4M3)
        sper = (size_t)heads * ((all->rows + all->block_rows - 1) / all->block_rows) *
               ((((all->cols + all->block_cols - 1) / all->block_cols) + 3) & ~3);
    for (int i = 0; i < n; i++) {
        v[i] = *all;
        v[i].n = heads;
        v[i].data = (char *)all->data + per * i;
        v[i].scale = sper ? (void *)((float *)all->scale + sper * i) : NULL;
        v[i].bytes = per;
    }
    return v;
}

typedef struct gemv_ctx {
    di_backend *be;
    di_weight *w;
    int n, next, T;
    void *x, *y;
    unsigned flags;
} gemv_ctx;

static void gemv_op(void *c) {
    gemv_ctx *g = c;
    di_weight *w = &g->w[g->next];
    g->next = (g->next + 1) % g->n;
    if (w->n > 1) /* per-head absorption: x [T][heads][cols], y [T][heads][rows] */
        g->be->bmm(g->be, g->y, w->n * w->rows, w->rows, g->x, w->n * w->cols, w->cols, w, g->T);
    else
        g->be->matmul(g->be, g->y, w->rows, g->x, w->cols, w, g->T, g->flags);
}

static void bench_gemv(di_backend *be) {
    static const struct { const char *name; int rows, cols, heads; unsigned flags; } shapes[] = {
        {"kv_a 576x2048", 576, 2048, 1, 0},          {"o_proj 2048x2048", 2048, 2048, 1, 0},
        {"q_proj 3072x2048", 3072, 2048, 1, 0},      {"q+kv_a 3648x2048", 3648, 2048, 1, 0},
        {"o_proj f32 acc", 2048, 2048, 1, DI_MM_OUT_F32 | DI_MM_ACCUMULATE},
        {"W_UK bmm 16x512x128", 512, 128, 16, 0},    {"W_UV bmm 16x128x512", 128, 512, 16, 0},
        {"router 64x2048 f32", 64, 2048, 1, DI_MM_OUT_F32}, {"shared gu 5632x2048", 5632, 2048, 1, 0},
        {"shared down 2048x2816", 2048, 2816, 1, 0},
        {"dense gu 21888x2048", 21888, 2048, 1, 0},  {"dense down 2048x10944", 2048, 10944, 1, 0},
        {"lm_head 129280x2048 f32", 129280, 2048, 1, DI_MM_OUT_F32},
    };
    static const int Ts[] = {1, 2, 4, 8, 16};
    printf("%-26s %4s %10s %10s %9s %7s\n", "GEMV / GEMM", "rows", "us/op", "MB", "GB/s", "of copy");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        if (g_only && !strstr(shapes[s].name, g_only)) continue;
        int H = shapes[s].heads;
        size_t bytes = (size_t)shapes[s].rows * shapes[s].cols * H * (g_fp8 ? 1 : 2);
        int n = (int)((400u << 20) / bytes);
        n = n < 2 ? 2 : n > 64 ? 64 : n;
        di_weight all = b_weight(be, n * H, shapes[s].rows, shapes[s].cols, g_fp8);
        di_weight *w = views(&all, n, H);
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            int T = Ts[ti];
            if (g_rows && T != g_rows) continue;
            gemv_ctx g = {be, w, n, 0, T, b_rand_act(be, (size_t)T * shapes[s].cols * H),
                          b_alloc(be, (size_t)T * shapes[s].rows * H * 4), shapes[s].flags};
            double t = b_time(be, gemv_op, &g, n, 7);
            printf("%-26s %4d %10.2f %10.2f %9.0f %6.1f%%\n", shapes[s].name, T, t * 1e6, bytes / 1e6,
                   bytes / t / 1e9, 100.0 * bytes / t / g_bw);
            be->free(be, g.x);
            be->free(be, g.y);
        }
        free(w);
        be->weight_free(be, &all);
    }
}

/* ---- experts ---- */
typedef struct moe_ctx {
    di_backend *be;
    int T, k, D, I, Is, n_sets, next, fused;
    di_weight gu, dn, sgu, sdn;
    int32_t **idx;
    float *w;
    void *x, *out, *gu_buf, *act, *scratch;
    size_t scratch_bytes;
} moe_ctx;

static void moe_op(void *c) {
    moe_ctx *m = c;
    di_backend *be = m->be;
    const int32_t *idx = m->idx[m->next];
    m->next = (m->next + 1) % m->n_sets;
    if (m->fused && be->moe_experts_shared &&
        be->moe_experts_shared(be, m->out, m->x, idx, m->w, m->k, &m->gu, &m->dn, &m->sgu, &m->sdn, m->T, m->scratch,
                               m->scratch_bytes))
        return;
    be->moe_experts(be, m->out, m->x, idx, m->w, m->k, &m->gu, &m->dn, m->T, m->scratch, m->scratch_bytes);
    be->matmul(be, m->gu_buf, 2 * m->Is, m->x, m->D, &m->sgu, m->T, 0);
    be->silu_mul(be, m->act, m->gu_buf, m->T, m->Is);
    be->matmul(be, m->out, m->D, m->act, m->Is, &m->sdn, m->T, DI_MM_ACCUMULATE);
}

static void bench_moe(di_backend *be) {
    const int E = 64, k = 6, D = 2048, I = 1408, Is = 2816, n_sets = 16;
    moe_ctx m = {0};
    m.be = be;
    m.k = k;
    m.D = D;
    m.I = I;
    m.Is = Is;
    m.n_sets = n_sets;
    const double wbytes = g_fp8 ? 1.0 : 2.0; /* per weight; fp8 block scales: < 0.1% more */
    m.gu = b_weight(be, E, 2 * I, D, g_fp8);
    m.dn = b_weight(be, E, D, I, g_fp8);
    m.sgu = b_weight(be, 1, 2 * Is, D, g_fp8);
    m.sdn = b_weight(be, 1, D, Is, g_fp8);
    m.x = b_rand_act(be, (size_t)4 * D);
    m.out = b_alloc(be, (size_t)4 * D * 2);
    m.gu_buf = b_alloc(be, (size_t)4 * 2 * Is * 2);
    m.act = b_alloc(be, (size_t)4 * Is * 2);
    m.scratch_bytes = be->moe_scratch_bytes(be, 4, k, D, I, E);
    m.scratch = b_alloc(be, m.scratch_bytes);
    float hw[4 * 6];
    for (int i = 0; i < 4 * k; i++) hw[i] = 0.1f + 0.1f * (float)(i % 5);
    m.w = b_alloc(be, sizeof hw);
    be->upload(be, m.w, hw, sizeof hw);
    const char *title = g_fp8 ? "experts (routed + shared), fp8" : "experts (routed + shared)";
    printf("%-34s %4s %10s %10s %9s %7s\n", title, "T", "us/op", "MB", "GB/s", "of copy");
    for (int T = 1; T <= 4; T++) {
        m.T = T;
        /* n_sets random expert choices (k distinct per token, ascending); bytes: distinct experts */
        double bytes = 0;
        m.idx = calloc(n_sets, sizeof *m.idx);
        for (int s = 0; s < n_sets; s++) {
            int32_t h[4 * 6];
            int used[64] = {0};
            for (int t = 0; t < T; t++) {
                int n = 0;
                while (n < k) {
                    int e = (int)(b_u64() % E), dup = 0;
                    for (int j = 0; j < n; j++) dup |= h[t * k + j] == e;
                    if (!dup) h[t * k + n++] = e;
                }
                for (int a = 0; a < k; a++)
                    for (int b = a + 1; b < k; b++)
                        if (h[t * k + b] < h[t * k + a]) {
                            int32_t x = h[t * k + a];
                            h[t * k + a] = h[t * k + b];
                            h[t * k + b] = x;
                        }
                for (int j = 0; j < k; j++) used[h[t * k + j]] = 1;
            }
            for (int e = 0; e < E; e++) bytes += used[e] * 3.0 * I * D * wbytes;
            m.idx[s] = b_alloc(be, (size_t)T * k * 4);
            be->upload(be, m.idx[s], h, (size_t)T * k * 4);
        }
        bytes = bytes / n_sets + 3.0 * Is * D * wbytes;
        for (int fused = 1; fused >= 0; fused--) {
            m.fused = fused;
            m.next = 0;
            double t = b_time(be, moe_op, &m, n_sets, 7);
            printf("%-34s %4d %10.2f %10.1f %9.0f %6.1f%%\n",
                   fused ? "fused small (moe_experts_shared)" : "moe_experts + shared matmuls", T, t * 1e6, bytes / 1e6,
                   bytes / t / 1e9, 100.0 * bytes / t / g_bw);
        }
        for (int s = 0; s < n_sets; s++) be->free(be, m.idx[s]);
        free(m.idx);
    }
    be->weight_free(be, &m.gu);
    be->weight_free(be, &m.dn);
    be->weight_free(be, &m.sgu);
    be->weight_free(be, &m.sdn);
    be->free(be, m.x);
    be->free(be, m.out);
    be->free(be, m.gu_buf);
    be->free(be, m.act);
    be->free(be, m.scratch);
    be->free(be, m.w);
}

int main(int argc, char **argv) {
    int do_gemv = 0, do_moe = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "gemv")) do_gemv = 1;
        else if (!strcmp(argv[i], "moe")) do_moe = 1;
        else if (!strcmp(argv[i], "--bw") && i + 1 < argc) g_bw = atof(argv[++i]) * 1e9;
        else if (!strcmp(argv[i], "--fp8")) g_fp8 = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) g_only = argv[++i];
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) g_rows = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_cuda_decode [gemv] [moe] [--fp8] [--bw GB/s] [--only NAME] [--rows T]\n");
            return 2;
        }
    }
    if (!do_gemv && !do_moe) do_gemv = do_moe = 1;
    /* the permutation-free expert path up to 4 tokens (the default dispatch takes it at 1), so
     * that both paths are measured at every T */
    setenv("DEEPINFER_CUDA_MOE_SMALL", "4", 0);
    di_backend *be = NULL;
    if (di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &be) != DI_OK) {
        fprintf(stderr, "bench_cuda_decode: %s\n", di_last_error());
        return 1;
    }
    di_backend_reserve rs = {256, 16, 1024, {16, 128, 64, 128, 512, 0.1f}};
    if (be->reserve(be, &rs) != DI_OK) {
        fprintf(stderr, "bench_cuda_decode: %s\n", di_last_error());
        return 1;
    }
    if (do_gemv) bench_gemv(be);
    if (do_moe) bench_moe(be);
    di_status s = be->sync(be);
    if (s != DI_OK) fprintf(stderr, "bench_cuda_decode: %s\n", di_last_error());
    di_backend_free(be);
    return s == DI_OK ? 0 : 1;
}
#else
int main(void) {
    fprintf(stderr, "bench_cuda_decode: this build has no CUDA backend\n");
    return 1;
}
#endif
