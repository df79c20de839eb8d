/* test_cuda_pycoder.c - the trained model (models/pycoder-moe, FP8, DeepSeek-V3 architecture) on
 * the GPU, where routing has real margins (unlike the random tiny models of test_cuda_model):
 *
 *   golden:   `deepinfer logits --device cuda` (prefill and decode modes) against the
 *             transformers logits of tests/data/golden_pycoder (max|d|/max|ref| <= 2e-2, the
 *             manifest's gpu_tolerance), argmax agreement with transformers on the kept rows
 *             and with the CPU on every row;
 *   routing:  diagnosis that goes with it: per case, how many (token, layer) routing decisions
 *             the GPU (bf16 activations) makes differently from the CPU (fp32), and the GPU's
 *             error with the CPU's decisions injected;
 *   greedy:   >= 30 prompts (the demo prompts and slices of the held-out slice) through the
 *             engine CLI, `deepinfer generate --temperature 0 --max-tokens 32 --ignore-eos`,
 *             CPU vs CUDA (device sampling, decode graphs); >= 95% of prompts identical over the
 *             32 tokens; for the others: where they first differ and the logit margin between
 *             the two candidate tokens on each device at that point. Also CUDA batched vs one
 *             sequence at a time (--max-seqs 1), reported;
 *   sampling: the engine on CUDA with device sampling vs host sampling (DEEPINFER_DEVICE_SAMPLING
 *             = 1 / 0), seeded temperature / top-k / top-p / min-p requests and a mix with
 *             host-only parameters: identical tokens required with decode graphs off (both paths
 *             run the same kernels on the same batches, so only the sampler differs); with graphs
 *             on (decode steps padded to a bucket) and CPU vs CUDA, reported; with graphs on,
 *             the engine with its decode graphs captured at create (the default) and with them
 *             captured lazily (DEEPINFER_GRAPH_WARMUP=0) must give identical tokens (the
 *             warm-up runs padding rows only and must leave no trace).
 *
 *   golden-f32, greedy-f32: golden and greedy with the GPU on the fp32 op table (`--dtype f32`),
 *             golden held to the CPU's bound (1e-4);
 *
 *   test_cuda_pycoder [golden] [routing] [greedy] [sampling] [golden-f32] [greedy-f32]   (default: all)
 * Environment: DI_BIN (deepinfer CLI), DI_BUILD_DIR (scratch, and the unpacked golden logits
 * under tests/data/golden_pycoder, or DI_GOLDEN_PYCODER_DIR), DI_SOURCE_DIR (source tree or the
 * staged one), DI_PYCODER_MODEL (else $DI_SOURCE_DIR/models/pycoder-moe), DI_TEST_DEVICE=cpu
 * (dry run of the whole program with the CPU standing in for the GPU). */
#include "pycoder_golden.h"
#include "route_test_util.h"

#include "core/timer.h"
#include "deepinfer.h"
#include "engine/engine_internal.h"
#include "model/model.h"

static int g_dev = DI_DEVICE_CUDA;
static int g_f32; /* the -f32 groups: the GPU on the fp32 op table (--dtype f32) */
static const char *dev_flag(void) {
    return g_dev != DI_DEVICE_CUDA ? "--device cpu" : g_f32 ? "--device cuda --dtype f32" : "--device cuda";
}

static long argmax_row(const float *x, long V) {
    long a = 0;
    for (long v = 1; v < V; v++)
        if (x[v] > x[a]) a = v;
    return a;
}

/* ---------------------------------------------------------------- golden ---- */

static void test_golden(void) {
    const char *tmp = getenv("DI_BUILD_DIR");
    json_t *man = pg_manifest();
    if (!man || !tmp) {
        CHECK_MSG(tmp != NULL, "DI_BUILD_DIR unset");
        json_decref(man);
        return;
    }
    /* the fp32 table is held to the CPU's own bound */
    const double tol = g_f32 ? 1e-4 : json_number_value(json_object_get(man, "gpu_tolerance"));
    CHECK(tol > 0 && tol <= 2e-2);
    long V = (long)json_integer_value(json_object_get(man, "vocab_size"));
    int n_cmp = 0, n_cases = 0, kept = 0, kept_same = 0, rows = 0, rows_same = 0;
    double worst = 0, worst_cpu = 0;
    size_t ci;
    json_t *c;
    json_array_foreach(json_object_get(man, "cases"), ci, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        long n_ids = (long)json_array_size(json_object_get(c, "ids"));
        float *ref = pg_reference(man, c);
        if (!ref) continue;
        n_cases++;
        for (int m = 0; m < 2; m++) {
            const char *mode = m ? "decode" : "prefill";
            char og[4400], oc[4400];
            snprintf(og, sizeof og, "%s/pycoder.%s.%s.gpu.bin", tmp, name, mode);
            snprintf(oc, sizeof oc, "%s/pycoder.%s.%s.cpu.bin", tmp, name, mode);
            pg_stats sg, sc;
            float *ag = NULL, *ac = NULL;
            int okg = pg_compare(man, c, ref, mode, dev_flag(), og, &sg, &ag) == 0;
            int okc = pg_compare(man, c, ref, mode, "--device cpu", oc, &sc, &ac) == 0;
            if (okg && okc) {
                int same = 0;
                double md = 0, mr = 0;
                for (long t = 0; t < n_ids; t++) {
                    same += argmax_row(ag + t * V, V) == argmax_row(ac + t * V, V);
                    for (long v = 0; v < V; v++) {
                        double d = fabs((double)ag[t * V + v] - ac[t * V + v]);
                        md = d > md || d != d ? d : md;
                        mr = fmax(mr, fabs(ac[t * V + v]));
                    }
                }
                rows += (int)n_ids;
                rows_same += same;
                fprintf(stderr, "  %-18s %-7s n=%-4ld vs transformers: max|d|/max|ref| %.3e ||d||/||ref|| %.3e argmax "
                                "%d/%d kept rows; vs CPU (all rows): max|d|/max|cpu| %.3e argmax %d/%ld; CPU vs "
                                "transformers %.1e%s\n",
                        name, mode, n_ids, sg.rel_max, sg.rel_l2, sg.argmax_same, sg.rows, md / mr, same, n_ids,
                        sc.rel_max, sg.rel_max <= tol ? "" : "  FAIL");
                CHECK_MSG(sg.rel_max <= tol, "%s/%s: max|d|/max|ref| = %.3g > %.0e (token %ld, id %ld: got %g, "
                          "transformers %g)", name, mode, sg.rel_max, tol, sg.worst_row, sg.worst_id,
                          (double)sg.worst_got, (double)sg.worst_ref);
                CHECK_MSG(sc.rel_max <= 1e-4, "%s/%s: the CPU is %.3g from transformers", name, mode, sc.rel_max);
                worst = sg.rel_max > worst || sg.rel_max != sg.rel_max ? sg.rel_max : worst;
                worst_cpu = fmax(worst_cpu, sc.rel_max);
                kept += sg.rows;
                kept_same += sg.argmax_same;
                n_cmp++;
            }
            free(ag);
            free(ac);
        }
        free(ref);
    }
    fprintf(stderr, "  pycoder golden%s: %d comparisons over %d cases, worst max|d|/max|ref| %.3e (bound %.0e); argmax "
                    "equal to transformers on %d/%d kept rows, to the CPU on %d/%d rows (CPU worst %.1e)\n",
            g_f32 ? " (f32)" : "", n_cmp, n_cases, worst, tol, kept_same, kept, rows_same, rows, worst_cpu);
    CHECK(n_cases >= 4 && n_cmp == 2 * n_cases);
    json_decref(man);
}

/* ---------------------------------------------------------------- routing ---- */

static void test_routing(void) {
    json_t *man = pg_manifest();
    if (!man) return;
    long V = (long)json_integer_value(json_object_get(man, "vocab_size"));
    di_model_options o = {0};
    o.max_batch_tokens = 512;
    o.max_seqs = 1;
    o.max_context = 512;
    o.kv_blocks = 8;
    di_model *mc = NULL, *mg = NULL;
    o.device = DI_DEVICE_CPU;
    CHECK_OK(di_model_load(pg_model_dir(), &o, &mc));
    o.device = (di_device)g_dev;
    CHECK_OK(di_model_load(pg_model_dir(), &o, &mg));
    if (!mc || !mg) {
        di_model_free(mc);
        di_model_free(mg);
        json_decref(man);
        return;
    }
    di_backend *bc = di_model_backend(mc), *bg = di_model_backend(mg);
    rt_hooks_install(bc, bg);
    const int k = di_model_config_of(mc)->num_experts_per_tok;
    int total_diff = 0, total = 0;
    double worst_inj = 0;
    size_t ci;
    json_t *c;
    json_array_foreach(json_object_get(man, "cases"), ci, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *ids = json_object_get(c, "ids");
        int n = (int)json_array_size(ids);
        float *ref = pg_reference(man, c);
        float *lc = (float *)malloc((size_t)n * V * 4), *lg = (float *)malloc((size_t)n * V * 4);
        float *li = (float *)malloc((size_t)n * V * 4);
        if (!ref || !lc || !lg || !li) {
            free(ref); free(lc); free(lg); free(li);
            continue;
        }
        g_rt_calls[0] = g_rt_calls[1] = 0;
        g_rt_inject = 0;
        CHECK_OK(rt_prefill(mc, ids, lc));
        CHECK_OK(rt_prefill(mg, ids, lg));
        int L = g_rt_calls[0] < RT_MAXL ? g_rt_calls[0] : RT_MAXL, diff = 0, toks = 0;
        for (int t = 0; t < n; t++) {
            int any = 0;
            for (int l = 0; l < L; l++) {
                int dl = 0;
                for (int j = 0; j < k; j++) dl |= g_rt_idx[0][l][t * k + j] != g_rt_idx[1][l][t * k + j];
                diff += dl;
                any |= dl;
            }
            toks += any;
        }
        rt_flip_margins(name, n, L, k);
        g_rt_calls[1] = 0;
        g_rt_inject = 1;
        CHECK_OK(rt_prefill(mg, ids, li));
        g_rt_inject = 0;
        double eg = pg_kept_err(c, lg, ref, V), ei = pg_kept_err(c, li, ref, V);
        fprintf(stderr, "  %-18s n=%-4d routing decisions that differ CPU vs GPU: %d of %d (%d tokens); GPU vs "
                        "transformers %.3e, with the CPU's routing %.3e (manifest: route margin min %.2e, %lld "
                        "decisions < 1e-3)\n", name, n, diff, L * n, toks, eg, ei,
                json_number_value(json_object_get(c, "route_margin_min")),
                json_integer_value(json_object_get(c, "routes_below_1e3")));
        total_diff += diff;
        total += L * n;
        worst_inj = fmax(worst_inj, ei);
        free(ref); free(lc); free(lg); free(li);
    }
    rt_hooks_remove(bc, bg);
    rt_records_free();
    fprintf(stderr, "  pycoder routing: %d of %d decisions differ; worst error with the CPU's routing %.3e\n", total_diff,
            total, worst_inj);
    CHECK_MSG(worst_inj <= 2e-2, "with the CPU's routing the GPU is %.3g from transformers", worst_inj);
    di_model_free(mc);
    di_model_free(mg);
    json_decref(man);
}

/* ---------------------------------------------------------------- greedy (engine CLI) ---- */

enum { G_NEW = 32, G_SLICES = 34, G_MAXP = 64 };

typedef struct prompt {
    int32_t *ids;
    int n;
} prompt;

/* the demo prompts, then G_SLICES pieces of the held-out slice (12..191 tokens, spread over it) */
static int make_prompts(prompt *p, int cap) {
    json_t *demo = NULL, *sl = NULL;
    char path[4400];
    snprintf(path, sizeof path, "%s/demo_prompts.json", pg_model_dir());
    CHECK_OK(di_json_load_file(path, &demo));
    CHECK_OK(di_json_load_file(test_src_path("tests/data/ppl/slice.json"), &sl));
    int n = 0;
    json_t *dp = demo ? json_object_get(demo, "prompts") : NULL;
    for (size_t i = 0; i < json_array_size(dp) && n < cap; i++, n++) {
        json_t *ids = json_object_get(json_array_get(dp, i), "prompt_ids");
        p[n].n = (int)json_array_size(ids);
        p[n].ids = (int32_t *)malloc((size_t)p[n].n * 4);
        for (int j = 0; j < p[n].n; j++) p[n].ids[j] = (int32_t)json_integer_value(json_array_get(ids, (size_t)j));
    }
    json_t *all = sl ? json_object_get(sl, "token_ids") : NULL;
    int total = (int)json_array_size(all);
    for (int k = 0; k < G_SLICES && n < cap && total >= 1600; k++, n++) {
        int off = 40 * k + (k * k) % 37, len = 12 + (k * 53) % 180;
        p[n].n = len;
        p[n].ids = (int32_t *)malloc((size_t)len * 4);
        for (int j = 0; j < len; j++) p[n].ids[j] = (int32_t)json_integer_value(json_array_get(all, (size_t)(off + j)));
    }
    json_decref(demo);
    json_decref(sl);
    return n;
}

static char *ids_str(const int32_t *ids, int n) {
    char *s = (char *)malloc((size_t)n * 12 + 1);
    size_t k = 0;
    s[0] = 0;
    for (int i = 0; i < n; i++) k += (size_t)sprintf(s + k, "%s%d", i ? "," : "", ids[i]);
    return s;
}

/* runs `deepinfer generate` over the prompts file; tokens[i][0..G_NEW) per prompt */
static int generate_cli(const char *in, const char *out, const char *extra, int n, int32_t (*tokens)[G_NEW]) {
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "'%s' generate --model '%s' --input '%s' --output '%s' --temperature 0 --max-tokens %d "
                              "--ignore-eos --quiet %s", getenv("DI_BIN"), pg_model_dir(), in, out, G_NEW, extra);
    double t0 = di_now_s();
    int rc = test_run(cmd);
    CHECK_MSG(rc == 0, "`deepinfer generate %s` failed (exit %d)", extra, rc);
    if (rc) return -1;
    fprintf(stderr, "    generate %s: %.2f s\n", extra, di_now_s() - t0);
    FILE *f = fopen(out, "r");
    CHECK_MSG(f != NULL, "no output %s", out);
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    int i = 0, ok = 1;
    while (getline(&line, &cap, f) > 0 && i < n) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        json_t *t = o ? json_object_get(o, "token_ids") : NULL;
        ok &= json_array_size(t) == G_NEW;
        for (int j = 0; j < G_NEW; j++) tokens[i][j] = (int32_t)json_integer_value(json_array_get(t, (size_t)j));
        json_decref(o);
        i++;
    }
    free(line);
    fclose(f);
    CHECK_MSG(i == n && ok, "%s: %d lines (expected %d), every line %d tokens: %s", out, i, n, G_NEW, ok ? "yes" : "no");
    return i == n && ok ? 0 : -1;
}

/* logits of the last position of ids on a device (decode mode: the path generation uses) */
static float *last_logits(const int32_t *ids, int n, const char *devflag, const char *out, long V) {
    char *s = ids_str(ids, n);
    size_t cap = strlen(s) + 8192;
    char *cmd = (char *)malloc(cap);
    snprintf(cmd, cap, "'%s' logits --model '%s' --ids %s --mode decode %s --out '%s'", getenv("DI_BIN"), pg_model_dir(),
             s, devflag, out);
    int rc = test_run(cmd);
    free(s);
    free(cmd);
    float *all = NULL;
    long got = rc == 0 ? test_read_f32(out, &all) : -1;
    if (got != (long)n * V) {
        free(all);
        return NULL;
    }
    float *row = (float *)malloc((size_t)V * 4);
    memcpy(row, all + (size_t)(n - 1) * V, (size_t)V * 4);
    free(all);
    return row;
}

static void test_greedy(void) {
    const char *tmp = getenv("DI_BUILD_DIR");
    if (!tmp) return;
    static prompt p[G_MAXP];
    static int32_t tc[G_MAXP][G_NEW], tg[G_MAXP][G_NEW], t1[G_MAXP][G_NEW];
    int n = make_prompts(p, G_MAXP);
    CHECK_MSG(n >= 30, "%d prompts", n);
    char in[4400], oc[4400], og[4400], o1[4400];
    snprintf(in, sizeof in, "%s/pycoder_greedy.jsonl", tmp);
    snprintf(oc, sizeof oc, "%s/pycoder_greedy.cpu.jsonl", tmp);
    snprintf(og, sizeof og, "%s/pycoder_greedy.gpu.jsonl", tmp);
    snprintf(o1, sizeof o1, "%s/pycoder_greedy.gpu1.jsonl", tmp);
    FILE *f = fopen(in, "w");
    CHECK(f != NULL);
    if (!f) return;
    for (int i = 0; i < n; i++) {
        char *s = ids_str(p[i].ids, p[i].n);
        fprintf(f, "{\"prompt_token_ids\": [%s]}\n", s);
        free(s);
    }
    fclose(f);
    char gflag[64];
    snprintf(gflag, sizeof gflag, "%s", dev_flag());
    char g1flag[96];
    snprintf(g1flag, sizeof g1flag, "%s --max-seqs 1", dev_flag());
    int okc = generate_cli(in, oc, "--device cpu", n, tc) == 0;
    int okg = generate_cli(in, og, gflag, n, tg) == 0;
    int ok1 = generate_cli(in, o1, g1flag, n, t1) == 0;
    if (!okc || !okg) return;
    const long V = 8192;
    int same = 0, same1 = 0, tokens_same = 0;
    for (int i = 0; i < n; i++) {
        int first = -1, first1 = -1;
        for (int j = G_NEW - 1; j >= 0; j--) {
            if (tc[i][j] != tg[i][j]) first = j;
            if (ok1 && t1[i][j] != tg[i][j]) first1 = j;
        }
        same += first < 0;
        same1 += ok1 && first1 < 0;
        tokens_same += first < 0 ? G_NEW : first;
        if (first < 0) continue;
        /* margins at the first difference: context = prompt + the common tokens */
        int32_t *ctx = (int32_t *)malloc((size_t)(p[i].n + first) * 4);
        memcpy(ctx, p[i].ids, (size_t)p[i].n * 4);
        memcpy(ctx + p[i].n, tc[i], (size_t)first * 4);
        char lc[4400], lg[4400];
        snprintf(lc, sizeof lc, "%s/pycoder_margin.cpu.bin", tmp);
        snprintf(lg, sizeof lg, "%s/pycoder_margin.gpu.bin", tmp);
        float *rc = last_logits(ctx, p[i].n + first, "--device cpu", lc, V);
        float *rg = last_logits(ctx, p[i].n + first, gflag, lg, V);
        int a = tc[i][first], b = tg[i][first];
        if (rc && rg) {
            double mx = 0;
            for (long v = 0; v < V; v++) mx = fmax(mx, fabs(rc[v]));
            fprintf(stderr, "    prompt %2d (%3d tokens): CPU and CUDA differ from new token %d: CPU %d, CUDA %d; logit "
                            "margin CPU l[%d]-l[%d] = %.4f, CUDA l[%d]-l[%d] = %.4f (max|logit| %.2f; argmax of that "
                            "context: CPU %ld, CUDA %ld)\n",
                    i, p[i].n, first, a, b, a, b, rc[a] - rc[b], b, a, rg[b] - rg[a], mx, argmax_row(rc, V),
                    argmax_row(rg, V));
        } else {
            fprintf(stderr, "    prompt %2d: differ from new token %d (CPU %d, CUDA %d); margin not computed\n", i, first,
                    a, b);
        }
        free(rc);
        free(rg);
        free(ctx);
    }
    fprintf(stderr, "  pycoder greedy%s: %d/%d prompts identical CPU vs CUDA over %d new tokens (%.1f%%; goal 95%%), "
                    "%d/%d tokens before the first difference; CUDA batched vs one at a time: %d/%d identical\n",
            g_f32 ? " (f32)" : "", same, n, G_NEW, 100.0 * same / n, tokens_same, n * G_NEW, same1, n);
    CHECK(same * 100 >= 95 * n);
    for (int i = 0; i < n; i++) free(p[i].ids);
}

/* ---------------------------------------------------------------- sampling (engine API) ---- */

enum { S_REQ = 24, S_NEW = 32 };

static void s_request(const prompt *pr, int r, int mixed, di_request_input *in) {
    di_request_input_init(in);
    in->prompt_ids = pr->ids;
    in->n_prompt_ids = (size_t)pr->n;
    di_sampling_params *p = &in->sampling;
    p->max_tokens = S_NEW;
    p->ignore_eos = 1;
    p->has_seed = r % 5 != 4;
    p->seed = 31337 + (uint64_t)r * 104729;
    switch (r % 6) {
    case 0: p->temperature = 0.0f; break;
    case 1: p->temperature = 0.8f; p->top_p = 0.95f; break;
    case 2: p->temperature = 1.0f; break;
    case 3: p->temperature = 0.7f; p->top_k = 20; break;
    case 4: p->temperature = 1.3f; p->min_p = 0.05f; break;
    default: p->temperature = 0.9f; p->top_k = 50; p->top_p = 0.9f; p->min_p = 0.02f; break;
    }
    if (!mixed) return;
    switch (r % 8) {
    case 1: p->logprobs = 1; p->max_tokens = 5; break;
    case 3: p->frequency_penalty = 0.4f; p->max_tokens = 6; break;
    case 5: p->n = 2; break;
    case 6: p->min_tokens = 3; p->ignore_eos = 0; break;
    default: break;
    }
}

/* one engine run: tokens of every completion (2 per request at most) */
static int s_run(int device, const char *dev_sampling, const char *graphs, const char *warmup, const prompt *pr,
                 int mixed, int32_t (*tok)[2][S_NEW], int (*ntok)[2], uint64_t *in_exec, uint64_t *on_host,
                 double *secs) {
    setenv("DEEPINFER_DEVICE_SAMPLING", dev_sampling, 1);
    setenv("DEEPINFER_CUDA_GRAPHS", graphs, 1);
    setenv("DEEPINFER_GRAPH_WARMUP", warmup, 1);
    di_engine_params ep;
    di_engine_params_init(&ep);
    ep.model_dir = pg_model_dir();
    ep.device = device;
    ep.max_seqs = 64;
    ep.kv_blocks = 256;
    ep.seed = 5;
    di_engine *e = NULL;
    CHECK_OK(di_engine_create(&ep, &e));
    unsetenv("DEEPINFER_DEVICE_SAMPLING");
    unsetenv("DEEPINFER_CUDA_GRAPHS");
    unsetenv("DEEPINFER_GRAPH_WARMUP");
    if (!e) return -1;
    di_request_input in[S_REQ];
    for (int r = 0; r < S_REQ; r++) s_request(&pr[r], r, mixed, &in[r]);
    di_request_output *out = NULL;
    double t0 = di_now_s();
    CHECK_OK(di_generate(e, in, S_REQ, &out));
    *secs = di_now_s() - t0;
    memset(ntok, 0, sizeof(int) * 2 * S_REQ);
    for (int r = 0; out && r < S_REQ; r++)
        for (size_t k = 0; k < out[r].n_choices && k < 2; k++) {
            ntok[r][k] = (int)out[r].choices[k].n_tokens;
            memcpy(tok[r][k], out[r].choices[k].token_ids, (size_t)ntok[r][k] * 4);
        }
    if (out) di_generate_results_free(out, S_REQ);
    *in_exec = e->steps_sampled_in_executor;
    *on_host = e->steps_sampled_on_host;
    di_engine_free(e);
    return out ? 0 : -1;
}

static int s_same(int32_t (*a)[2][S_NEW], int (*na)[2], int32_t (*b)[2][S_NEW], int (*nb)[2], int *total) {
    int same = 0;
    *total = 0;
    for (int r = 0; r < S_REQ; r++)
        for (int k = 0; k < 2; k++) {
            if (!na[r][k] && !nb[r][k]) continue;
            (*total)++;
            same += na[r][k] == nb[r][k] && !memcmp(a[r][k], b[r][k], (size_t)na[r][k] * 4);
        }
    return same;
}

static void test_sampling(void) {
    static prompt p[G_MAXP];
    int n = make_prompts(p, G_MAXP);
    CHECK(n >= S_REQ);
    if (n < S_REQ) return;
    static int32_t td[S_REQ][2][S_NEW], th[S_REQ][2][S_NEW], tgr[S_REQ][2][S_NEW], tc[S_REQ][2][S_NEW];
    static int32_t tgl[S_REQ][2][S_NEW];
    int nd[S_REQ][2], nh[S_REQ][2], ngr[S_REQ][2], nc[S_REQ][2], ngl[S_REQ][2];
    for (int mixed = 0; mixed < 2; mixed++) {
        uint64_t ed, hd, eh, hh, eg, hg, ec, hc, el, hl;
        double sd, sh, sg, sc, sl;
        int ok = s_run(g_dev, "1", "0", "1", p, mixed, td, nd, &ed, &hd, &sd) == 0;
        ok &= s_run(g_dev, "0", "0", "1", p, mixed, th, nh, &eh, &hh, &sh) == 0;
        ok &= s_run(g_dev, "1", "1", "1", p, mixed, tgr, ngr, &eg, &hg, &sg) == 0;
        ok &= s_run(g_dev, "1", "1", "0", p, mixed, tgl, ngl, &el, &hl, &sl) == 0;
        ok &= s_run(DI_DEVICE_CPU, "0", "0", "1", p, mixed, tc, nc, &ec, &hc, &sc) == 0;
        if (!ok) continue;
        int tot4, same_l = s_same(tgr, ngr, tgl, ngl, &tot4);
        fprintf(stderr, "  sampling %-13s graphs captured at create vs lazily: %d/%d completions identical (time "
                        "%.2f s vs %.2f s, engine creation not counted)\n",
                mixed ? "(mixed)" : "(device-only)", same_l, tot4, sg, sl);
        CHECK_MSG(same_l == tot4 && tot4 >= S_REQ, "the graph warm-up changed %d of %d completions", tot4 - same_l,
                  tot4);
        int tot, tot2, tot3;
        int same = s_same(td, nd, th, nh, &tot), same_g = s_same(tgr, ngr, th, nh, &tot2);
        int same_c = s_same(tc, nc, th, nh, &tot3);
        fprintf(stderr, "  sampling %-13s device vs host sampling (graphs off): %d/%d completions identical (steps in "
                        "executor %llu / on host %llu; host run %llu / %llu); with graphs: %d/%d (steps %llu / %llu); "
                        "CPU engine vs CUDA host sampling: %d/%d; time device %.2f s, host %.2f s, graphs %.2f s\n",
                mixed ? "(mixed)" : "(device-only)", same, tot, (unsigned long long)ed, (unsigned long long)hd,
                (unsigned long long)eh, (unsigned long long)hh, same_g, tot2, (unsigned long long)eg,
                (unsigned long long)hg, same_c, tot3, sd, sh, sg);
        CHECK_MSG(same == tot && tot >= S_REQ, "device sampling changed %d of %d completions", tot - same, tot);
        CHECK(ed > 0 && eh == 0);
        if (!mixed) CHECK(hd == 0);
        else CHECK(hd > 0);
    }
    for (int i = 0; i < n; i++) free(p[i].ids);
}

static void test_golden_f32(void) {
    g_f32 = 1;
    test_golden();
    g_f32 = 0;
}

static void test_greedy_f32(void) {
    g_f32 = 1;
    test_greedy();
    g_f32 = 0;
}

int main(int argc, char **argv) {
    const char *d = getenv("DI_TEST_DEVICE");
    if (d && !strcmp(d, "cpu")) g_dev = DI_DEVICE_CPU;
    enum { N_GROUPS = 6 };
    int want[N_GROUPS] = {argc < 2, argc < 2, argc < 2, argc < 2, argc < 2, argc < 2};
    static const char *names[N_GROUPS] = {"golden", "routing", "greedy", "sampling", "golden-f32", "greedy-f32"};
    for (int i = 1; i < argc; i++)
        for (int k = 0; k < N_GROUPS; k++) want[k] |= !strcmp(argv[i], names[k]);
    void (*fns[N_GROUPS])(void) = {test_golden, test_routing, test_greedy, test_sampling, test_golden_f32, test_greedy_f32};
    for (int k = 0; k < N_GROUPS; k++)
        if (want[k]) {
            double t0 = di_now_s();
            fprintf(stderr, "-- pycoder %s (%s)\n", names[k], g_dev == DI_DEVICE_CUDA ? "cuda" : "cpu dry run");
            fns[k]();
            fprintf(stderr, "   (%.1f s)\n", di_now_s() - t0);
        }
    fprintf(stderr, "%d checks, %d failures\n", g_test_checks, g_test_failures);
    return g_test_failures ? 1 : (g_test_checks ? 0 : 1);
}
