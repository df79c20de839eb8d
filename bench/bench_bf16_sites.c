/* bench_bf16_sites.c - which of the CUDA backend's bf16 roundings move MoE routing (a diagnosis,
 * run by hand; no GPU needed). The CUDA path misses the end-to-end parity bounds of issue 6
 * because bf16 activations flip near-tied routing decisions (docs/cuda.md, "Verification").
 * This program finds which roundings matter: it runs the CPU model (fp32) and a second CPU
 * model whose backend op table is wrapped so that chosen activations are rounded to bf16 where
 * the CUDA backend stores them in bf16 (the "sites" below), on the cases of the transformers
 * golden data of models/pycoder-moe (one-sequence prefills, as test_cuda_pycoder routing does),
 * and prints, per set of sites, how many (token, layer) routing decisions differ from fp32 and
 * the logits' max|d|/max|ref| against transformers. Compare its "all" row with the GPU's
 * (test_cuda_pycoder routing: 32 of 3717 decisions, 2.6e-2): what the emulation covers is then
 * what the GPU does, and the single-site rows say where precision would pay.
 *
 * Sites (each an op's output, rounded to bf16 and kept in f32 storage):
 *   norm   rmsnorm / add_rmsnorm outputs (GEMM inputs; the router's f32 input is not rounded)
 *   mm     matmul / bmm outputs stored as act (not DI_MM_OUT_F32: logits, h accumulations)
 *   rope   the rotated slices
 *   attn   mla_prefill / mla_decode outputs
 *   kvd    prefill attention recomputed here with the decompressed K / V rounded (the GPU
 *          decompresses a window's latents with one bf16 GEMM)
 *   p      prefill attention with the probabilities rounded before P·V (the GPU's mma takes
 *          P in bf16; the row sum stays fp32)
 *   silu   silu_mul outputs (shared experts, dense MLP)
 *   expi   the routed experts' SiLU-mul product (the down GEMM's input)
 *   expo   each routed expert's output rows, and their weighted sum
 * kvd and p replace the CPU's mla_prefill by a naive fp32 attention over the paged cache (the
 * same math; with neither set the CPU op runs). Not covered: the GPU's summation orders.
 *
 * usage: bench_bf16_sites [--sites LIST[,LIST]...] [--mantissa N]   (LIST: site names joined
 *        by '+', or none / all; default: none, all, each site alone, all but each site;
 *        --mantissa: explicit mantissa bits the roundings keep, 1..22, default 7 = bf16, e.g.
 *        10 for fp16's precision; --golden: the random tiny checkpoints of tests/data/golden
 *        instead, made with $DI_BIN mkmodel into $DI_BUILD_DIR/golden/ where missing; --range:
 *        every site's code path with nothing rounded, and the largest |value| each site held,
 *        against fp16's range)
 * Environment: DI_SOURCE_DIR (source root), DI_BUILD_DIR (the unpacked golden logits under
 * tests/data/golden_pycoder), DI_PYCODER_MODEL (else models/pycoder-moe). */
#include "pycoder_golden.h"
#include "route_test_util.h"

#include "core/dtype.h"
#include "model/model.h"

enum { I_NORM, I_MM, I_ROPE, I_ATTN, I_KVD, I_P, I_SILU, I_EXPI, I_EXPO, N_SITES }; /* site indices */
enum {
    S_NORM = 1 << I_NORM, S_MM = 1 << I_MM, S_ROPE = 1 << I_ROPE, S_ATTN = 1 << I_ATTN, S_KVD = 1 << I_KVD,
    S_P = 1 << I_P, S_SILU = 1 << I_SILU, S_EXPI = 1 << I_EXPI, S_EXPO = 1 << I_EXPO, S_ALL = (1 << N_SITES) - 1
};
static const char *const site_names[N_SITES] = {"norm", "mm", "rope", "attn", "kvd", "p", "silu", "expi", "expo"};

static unsigned g_sites;   /* the sites the wrapped backend rounds now */
static di_backend g_orig;  /* the wrapped backend's own ops */

static int g_mant = 7;     /* explicit mantissa bits kept (--mantissa; bf16: 7) */
static int g_range_only;   /* --range: every site's code path, nothing rounded */

/* x rounded to g_mant explicit mantissa bits, to nearest even (bf16 at 7; fp16's precision,
 * without its range, at 10); NaN and infinities unchanged; x itself with --range */
static float bf(float x) {
    if (g_range_only) return x;
    if (g_mant == 7) return di_bf16_to_f32(di_f32_to_bf16(x));
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    const int drop = 23 - g_mant;
    u += ((1u << (drop - 1)) - 1u) + ((u >> drop) & 1u);
    u &= ~((1u << drop) - 1u);
    memcpy(&x, &u, 4);
    return x;
}
static double g_absmax[N_SITES]; /* --range: the largest |value| seen at each site (unrounded) */

/* rows x cols values at p (row stride ld), the output of site `site` (I_*): their largest
 * magnitude noted, then rounded (bf) when the site is on */
static void round_rows(int site, float *p, int rows, int cols, int ld) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float *x = &p[(size_t)r * ld + c];
            if (fabs(*x) > g_absmax[site]) g_absmax[site] = fabs(*x);
            if (g_sites & (1u << site)) *x = bf(*x);
        }
}

/* ---- the wrapped ops (the CPU backend: device pointers are host f32 arrays) ---- */

static void w_rmsnorm(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w, float eps,
                      int T, int D) {
    g_orig.rmsnorm(be, out, ldo, x, ldx, w, eps, T, D);
    round_rows(I_NORM, out, T, D, ldo);
}
static void w_add_rmsnorm(di_backend *be, float *h, const void *delta, void *out, float *out_f32, const di_weight *w,
                          float eps, int T, int D) {
    g_orig.add_rmsnorm(be, h, delta, out, out_f32, w, eps, T, D);
    round_rows(I_NORM, out, T, D, D);
}
static void w_silu_mul(di_backend *be, void *out, const void *gu, int T, int I) {
    g_orig.silu_mul(be, out, gu, T, I);
    round_rows(I_SILU, out, T, I, I);
}
static void w_matmul(di_backend *be, void *y, int ldy, const void *x, int ldx, const di_weight *W, int T,
                     unsigned flags) {
    g_orig.matmul(be, y, ldy, x, ldx, W, T, flags);
    if (!(flags & DI_MM_OUT_F32)) round_rows(I_MM, y, T, W->rows, ldy);
}
static void w_bmm(di_backend *be, void *y, int ldy, int hsy, const void *x, int ldx, int hsx, const di_weight *W,
                  int T) {
    g_orig.bmm(be, y, ldy, hsy, x, ldx, hsx, W, T);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < W->n; h++) round_rows(I_MM, (float *)y + (size_t)t * ldy + (size_t)h * hsy, 1, W->rows, 0);
}
static void w_rope(di_backend *be, void *x, int ldx, int n_heads, int hs, const int32_t *positions, int T,
                   const di_rope_params *rp) {
    g_orig.rope(be, x, ldx, n_heads, hs, positions, T, rp);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++)
            round_rows(I_ROPE, (float *)x + (size_t)t * ldx + (size_t)h * hs, 1, rp->dim, 0);
}
static void w_mla_decode(di_backend *be, void *out, const void *qt, const void *qpe, int ldqpe, int hsqpe,
                         const void *cache, const di_attn_batch *ab, int seq_begin, int seq_end,
                         const di_mla_dims *d) {
    g_orig.mla_decode(be, out, qt, qpe, ldqpe, hsqpe, cache, ab, seq_begin, seq_end, d);
    int t0 = ab->seq_start[seq_begin], t1 = ab->seq_start[seq_end];
    round_rows(I_ATTN, (float *)out + (size_t)t0 * d->n_heads * d->kv_rank, t1 - t0, d->n_heads * d->kv_rank,
               d->n_heads * d->kv_rank);
}

/* Naive MLA prefill (the CPU op's math, backend.h) with the decompressed K / V (kvd) and the
 * probabilities (p) rounded: per sequence, K / V of its whole context through W_kvb, then
 * causal softmax attention per (token, head) in fp32 (double row sums). */
static void naive_prefill(di_backend *be, float *out, const float *q, int ldq, const float *cache,
                          const di_weight *W_kvb, const di_attn_batch *ab, int s, const di_mla_dims *d) {
    const int H = d->n_heads, dn = d->nope_dim, dr = d->rope_dim, dv = d->v_dim, r = d->kv_rank, Wc = r + dr;
    const int ctx = ab->seq_ctx_len[s], t0 = ab->seq_start[s], t1 = ab->seq_start[s + 1];
    float *c = malloc((size_t)ctx * r * 4), *kv = malloc((size_t)ctx * H * (dn + dv) * 4);
    float *sc = malloc((size_t)ctx * 4);
    for (int j = 0; j < ctx; j++) {
        int slot = ab->block_table[(size_t)s * ab->max_blocks + j / 64] * 64 + j % 64;
        memcpy(c + (size_t)j * r, cache + (size_t)slot * Wc, (size_t)r * 4);
    }
    g_orig.matmul(be, kv, H * (dn + dv), c, r, W_kvb, ctx, 0);
    round_rows(I_KVD, kv, ctx, H * (dn + dv), H * (dn + dv));
    for (int t = t0; t < t1; t++) {
        const int pos = ab->positions[t];
        for (int h = 0; h < H; h++) {
            const float *qh = q + (size_t)t * ldq + (size_t)h * (dn + dr);
            float mx = -INFINITY;
            for (int j = 0; j <= pos && j < ctx; j++) {
                const float *k = kv + (size_t)j * H * (dn + dv) + (size_t)h * (dn + dv);
                const float *kpe = cache + (size_t)(ab->block_table[(size_t)s * ab->max_blocks + j / 64] * 64 + j % 64) * Wc + r;
                float a = 0.0f;
                for (int i = 0; i < dn; i++) a += qh[i] * k[i];
                for (int i = 0; i < dr; i++) a += qh[dn + i] * kpe[i];
                sc[j] = a * d->softmax_scale;
                mx = fmaxf(mx, sc[j]);
            }
            double l = 0.0;
            float *o = out + (size_t)t * H * dv + (size_t)h * dv;
            float acc[1024];
            for (int i = 0; i < dv; i++) acc[i] = 0.0f;
            for (int j = 0; j <= pos && j < ctx; j++) {
                float p = expf(sc[j] - mx);
                l += p;
                float pr = (g_sites & S_P) ? bf(p) : p;
                const float *v = kv + (size_t)j * H * (dn + dv) + (size_t)h * (dn + dv) + dn;
                for (int i = 0; i < dv; i++) acc[i] += pr * v[i];
            }
            for (int i = 0; i < dv; i++) o[i] = (float)(acc[i] / l);
        }
    }
    free(c);
    free(kv);
    free(sc);
}

static void w_mla_prefill(di_backend *be, void *out, const void *q, int ldq, const void *cache,
                          const di_weight *W_kvb, const di_attn_batch *ab, int seq_begin, int seq_end,
                          const di_mla_dims *d, void *scratch, size_t scratch_bytes) {
    if ((g_sites & (S_KVD | S_P)) && !ab->sel_pos && d->v_dim <= 1024) {
        for (int s = seq_begin; s < seq_end; s++) naive_prefill(be, out, q, ldq, cache, W_kvb, ab, s, d);
    } else {
        g_orig.mla_prefill(be, out, q, ldq, cache, W_kvb, ab, seq_begin, seq_end, d, scratch, scratch_bytes);
    }
    int t0 = ab->seq_start[seq_begin], t1 = ab->seq_start[seq_end];
    round_rows(I_ATTN, (float *)out + (size_t)t0 * d->n_heads * d->v_dim, t1 - t0, d->n_heads * d->v_dim,
               d->n_heads * d->v_dim);
}

/* The routed experts pair by pair through the CPU's matmul on one expert's rows (a view of the
 * f32 [n, rows, cols] weight), the SiLU-mul product rounded (expi), each expert's output rows
 * rounded (expo), then the weighted sum in fp32 in j order, rounded (expo). */
static void w_moe_experts(di_backend *be, void *out, const void *x, const int32_t *topk_idx, const float *topk_w,
                          int k, const di_weight *gate_up, const di_weight *down, int T, void *scratch,
                          size_t scratch_bytes) {
    if (!(g_sites & (S_EXPI | S_EXPO))) {
        g_orig.moe_experts(be, out, x, topk_idx, topk_w, k, gate_up, down, T, scratch, scratch_bytes);
        return;
    }
    const int D = gate_up->cols, I = down->cols;
    float *gu = malloc((size_t)2 * I * 4), *a = malloc((size_t)I * 4), *y = malloc((size_t)D * 4);
    for (int t = 0; t < T; t++) {
        float *o = (float *)out + (size_t)t * D;
        for (int i = 0; i < D; i++) o[i] = 0.0f;
        for (int j = 0; j < k; j++) {
            int e = topk_idx[(size_t)t * k + j];
            di_weight wg = *gate_up, wd = *down;
            wg.n = wd.n = 1;
            wg.data = (float *)gate_up->data + (size_t)e * gate_up->rows * D;
            wd.data = (float *)down->data + (size_t)e * down->rows * I;
            wg.scale = wd.scale = NULL;
            g_orig.matmul(be, gu, 2 * I, (const float *)x + (size_t)t * D, D, &wg, 1, 0);
            g_orig.silu_mul(be, a, gu, 1, I);
            round_rows(I_EXPI, a, 1, I, I);
            g_orig.matmul(be, y, D, a, I, &wd, 1, 0);
            round_rows(I_EXPO, y, 1, D, D);
            for (int i = 0; i < D; i++) o[i] += topk_w[(size_t)t * k + j] * y[i];
        }
        round_rows(I_EXPO, o, 1, D, D);
    }
    free(gu);
    free(a);
    free(y);
}

static void wrap(di_backend *be) {
    g_orig = *be;
    be->rmsnorm = w_rmsnorm;
    be->add_rmsnorm = w_add_rmsnorm;
    be->silu_mul = w_silu_mul;
    be->matmul = w_matmul;
    be->bmm = w_bmm;
    be->rope = w_rope;
    be->mla_decode = w_mla_decode;
    be->mla_prefill = w_mla_prefill;
    be->moe_experts = w_moe_experts;
}

/* ---- the comparison ---- */

/* Prefills ids on both models with the routing hooks recording; returns the (token, layer)
 * decisions that differ and the layer count in *L. */
static int prefill_both(di_model *mc, di_model *me, json_t *ids, float *lc, float *le, int k, int *L) {
    const int n = (int)json_array_size(ids);
    g_rt_calls[0] = g_rt_calls[1] = 0;
    g_rt_inject = 0;
    CHECK_OK(rt_prefill(mc, ids, lc));
    CHECK_OK(rt_prefill(me, ids, le));
    *L = g_rt_calls[0] < RT_MAXL ? g_rt_calls[0] : RT_MAXL;
    int diff = 0;
    for (int t = 0; t < n; t++)
        for (int l = 0; l < *L; l++) {
            int dl = 0;
            for (int j = 0; j < k; j++) dl |= g_rt_idx[0][l][t * k + j] != g_rt_idx[1][l][t * k + j];
            diff += dl;
        }
    return diff;
}

static void sites_name(unsigned m, char *buf, size_t n) {
    if (m == 0) { snprintf(buf, n, "none"); return; }
    if (m == S_ALL) { snprintf(buf, n, "all"); return; }
    buf[0] = 0;
    for (int i = 0; i < N_SITES; i++)
        if (m & (1u << i)) snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", buf[0] ? "+" : "", site_names[i]);
}

/* One set of sites over every golden case: decisions that differ from fp32 and the worst error */
static void run_sites(json_t *man, di_model *mc, di_model *me, unsigned sites) {
    long V = (long)json_integer_value(json_object_get(man, "vocab_size"));
    const int k = di_model_config_of(mc)->num_experts_per_tok;
    g_sites = sites;
    int total_diff = 0, total = 0, primary = 0;
    double worst = 0, worst_cpu = 0;
    size_t ci;
    json_t *c;
    char name[128];
    sites_name(sites, name, sizeof name);
    json_array_foreach(json_object_get(man, "cases"), ci, c) {
        json_t *ids = json_object_get(c, "ids");
        int n = (int)json_array_size(ids);
        float *ref = pg_reference(man, c);
        float *lc = malloc((size_t)n * V * 4), *le = malloc((size_t)n * V * 4);
        if (!ref || !lc || !le) {
            free(ref); free(lc); free(le);
            continue;
        }
        int L = 0;
        total_diff += prefill_both(mc, me, ids, lc, le, k, &L);
        total += L * n;
        char tag[160];
        snprintf(tag, sizeof tag, "%s/%s", name, json_string_value(json_object_get(c, "name")));
        primary += rt_flip_margins(tag, n, L, k);
        worst = fmax(worst, pg_kept_err(c, le, ref, V));
        worst_cpu = fmax(worst_cpu, pg_kept_err(c, lc, ref, V));
        free(ref); free(lc); free(le);
    }
    printf("%-32s decisions differing %4d of %d (primary flips %3d); logits vs transformers %.3e (fp32 CPU %.1e)\n",
           name, total_diff, total, primary, worst, worst_cpu);
    fflush(stdout);
}

/* --range: the largest |value| each site held over the runs so far (fp16's largest finite
 * value is 65504) */
static void print_range(const char *what) {
    printf("%s: largest |value| per site:", what);
    for (int i = 0; i < N_SITES; i++)
        if (i != I_P) printf(" %s %.4g", site_names[i], g_absmax[i]);
    printf(" (p <= 1)\n");
}

/* The same over the random tiny checkpoints of tests/data/golden (golden.json; each made with
 * `deepinfer mkmodel` into $DI_BUILD_DIR/golden/ if missing, as test_cuda_model does): per set
 * of sites, decisions that differ, primary flips, cases within 2e-2 and the worst error. */
static void run_golden(json_t *man, const unsigned *list, int n_list) {
    const char *bin = getenv("DI_BIN"), *build = getenv("DI_BUILD_DIR");
    if (!bin || !build) {
        fprintf(stderr, "bench_bf16_sites --golden: DI_BIN and DI_BUILD_DIR must be set\n");
        return;
    }
    int diff[64] = {0}, prim[64] = {0}, within[64] = {0}, total = 0, n_cases = 0;
    double worst[64] = {0};
    size_t ci;
    json_t *c;
    json_array_foreach(json_object_get(man, "cases"), ci, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *preset = json_string_value(json_object_get(c, "preset"));
        const char *dtype = json_string_value(json_object_get(c, "dtype"));
        long long seed = json_integer_value(json_object_get(c, "seed"));
        long V = (long)json_integer_value(json_object_get(c, "vocab_size"));
        json_t *ids = json_object_get(c, "ids");
        long n = (long)json_array_size(ids);
        char dir[4096], probe[4200], cmd[9000], refpath[1024];
        snprintf(dir, sizeof dir, "%s/golden/%s_%lld_%s", build, preset, seed, dtype);
        snprintf(probe, sizeof probe, "%s/config.json", dir);
        FILE *f = fopen(probe, "r");
        if (f) fclose(f);
        else {
            snprintf(cmd, sizeof cmd, "'%s' mkmodel --preset %s --seed %lld --dtype %s --out '%s' >/dev/null 2>&1", bin,
                     preset, seed, dtype, dir);
            if (test_run(cmd) != 0) {
                fprintf(stderr, "%s: mkmodel failed\n", name);
                continue;
            }
        }
        float *ref = NULL;
        snprintf(refpath, sizeof refpath, "tests/data/golden/%s", json_string_value(json_object_get(c, "logits")));
        if (test_read_f32(test_src_path(refpath), &ref) != n * V) {
            fprintf(stderr, "%s: reference size\n", name);
            free(ref);
            continue;
        }
        di_model_options o = {0};
        o.device = DI_DEVICE_CPU;
        o.max_batch_tokens = (int)(n > 64 ? n : 64);
        o.max_seqs = 1;
        o.max_context = (int)(n > 64 ? n : 64);
        o.kv_blocks = (int)((n + 63) / 64 + 1);
        di_model *mc = NULL, *me = NULL;
        CHECK_OK(di_model_load(dir, &o, &mc));
        CHECK_OK(di_model_load(dir, &o, &me));
        float *lc = malloc((size_t)n * V * 4), *le = malloc((size_t)n * V * 4);
        if (mc && me && lc && le) {
            di_backend *bc = di_model_backend(mc), *be = di_model_backend(me);
            wrap(be);
            rt_hooks_install(bc, be);
            const int k = di_model_config_of(mc)->num_experts_per_tok;
            double mr = 0;
            for (long i = 0; i < n * V; i++) mr = fmax(mr, fabs(ref[i]));
            n_cases++;
            for (int s = 0; s < n_list; s++) {
                g_sites = list[s];
                int L = 0;
                diff[s] += prefill_both(mc, me, ids, lc, le, k, &L);
                if (s == 0) total += L * (int)n;
                char tag[160];
                sites_name(list[s], tag, sizeof tag);
                snprintf(tag + strlen(tag), sizeof tag - strlen(tag), "/%s", name);
                if (L > 0) prim[s] += rt_flip_margins(tag, (int)n, L, k);
                double md = 0;
                for (long i = 0; i < n * V; i++) {
                    double d = fabs((double)le[i] - ref[i]);
                    md = d > md || d != d ? d : md;
                }
                worst[s] = fmax(worst[s], md / mr);
                within[s] += md / mr <= 2e-2;
            }
            rt_hooks_remove(bc, be);
            rt_records_free();
        }
        free(lc); free(le); free(ref);
        di_model_free(mc);
        di_model_free(me);
    }
    for (int s = 0; s < n_list; s++) {
        char name[128];
        sites_name(list[s], name, sizeof name);
        printf("golden %-25s decisions differing %4d of %d (primary flips %3d); cases within 2e-2: %d of %d, worst "
               "%.3e\n", name, diff[s], total, prim[s], within[s], n_cases, worst[s]);
    }
}

static unsigned parse_sites(const char *s) {
    if (!strcmp(s, "all")) return S_ALL;
    if (!strcmp(s, "none")) return 0;
    unsigned m = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, "+"); tok; tok = strtok(NULL, "+")) {
        int i = 0;
        while (i < N_SITES && strcmp(tok, site_names[i])) i++;
        if (i == N_SITES) {
            fprintf(stderr, "bench_bf16_sites: unknown site '%s'\n", tok);
            exit(2);
        }
        m |= 1u << i;
    }
    return m;
}

int main(int argc, char **argv) {
    unsigned list[64];
    int n_list = 0, golden = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sites") && i + 1 < argc) {
            char buf[1024];
            snprintf(buf, sizeof buf, "%s", argv[++i]);
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n_list < 64;
                 tok = strtok_r(NULL, ",", &save))
                list[n_list++] = parse_sites(tok);
        } else if (!strcmp(argv[i], "--range")) {
            g_range_only = 1;
        } else if (!strcmp(argv[i], "--golden")) {
            golden = 1;
        } else if (!strcmp(argv[i], "--mantissa") && i + 1 < argc && atoi(argv[i + 1]) >= 1 &&
                   atoi(argv[i + 1]) <= 22) {
            g_mant = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_bf16_sites [--sites LIST[,LIST]...] [--mantissa 1..22] [--golden] [--range]\n");
            return 2;
        }
    }
    if (n_list == 0) {
        list[n_list++] = 0;
        list[n_list++] = S_ALL;
        for (int i = 0; i < N_SITES; i++) list[n_list++] = 1u << i;
        for (int i = 0; i < N_SITES; i++) list[n_list++] = S_ALL & ~(1u << i);
    }
    if (golden) {
        json_t *gm = NULL;
        CHECK_OK(di_json_load_file(test_src_path("tests/data/golden/golden.json"), &gm));
        if (!gm) return 1;
        if (g_range_only) list[0] = S_ALL, n_list = 1;
        run_golden(gm, list, n_list);
        if (g_range_only) print_range("random tiny golden models");
        json_decref(gm);
        return g_test_failures ? 1 : 0;
    }
    json_t *man = pg_manifest();
    if (!man) return 1;
    di_model_options o = {0};
    o.device = DI_DEVICE_CPU;
    o.max_batch_tokens = 512;
    o.max_seqs = 1;
    o.max_context = 512;
    o.kv_blocks = 8;
    di_model *mc = NULL, *me = NULL;
    CHECK_OK(di_model_load(pg_model_dir(), &o, &mc));
    CHECK_OK(di_model_load(pg_model_dir(), &o, &me));
    if (!mc || !me) return 1;
    di_backend *bc = di_model_backend(mc), *be = di_model_backend(me);
    wrap(be);
    rt_hooks_install(bc, be);
    if (g_range_only) list[0] = S_ALL, n_list = 1;
    for (int i = 0; i < n_list; i++) run_sites(man, mc, me, list[i]);
    if (g_range_only) print_range("pycoder");
    rt_hooks_remove(bc, be);
    rt_records_free();
    di_model_free(mc);
    di_model_free(me);
    json_decref(man);
    return g_test_failures ? 1 : 0;
}
