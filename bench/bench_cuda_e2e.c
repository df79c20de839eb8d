/* bench_cuda_e2e.c - end-to-end decode and prefill throughput of a model on the CUDA backend
 * (di_model_forward_sample: device sampling, decode steps replayed from CUDA graphs), each with
 * its roofline bound from the model's byte and FLOP counts over the ceilings measured in the
 * same run (in a child process of its own, so that neither measurement moves the other's
 * memory; --ceilings 2: in this process, first), and the ratio to the llama.cpp numbers issue 6
 * gives for the benchmark model, which were measured on an H200 ("llama.cpp@H200"; on any other
 * card see remote.sh's `peer` step, which runs llama.cpp on the same card in the same call).
 *
 *   bench_cuda_e2e --model DIR [--batches 1,16,64,256|none] [--prompt 128] [--gen 128]
 *                  [--prefill 512,8192|none] [--ceilings 0|1|2] [--trace K] [--async 0|1] [--warmup 0|1]
 *                  [--dtype bf16|f32]   (f32: the fp32 op table, the reference mode; its bounds are still
 *                                        computed for bf16 weights)
 *
 * Decode at batch B: B random prompts of --prompt tokens prefilled together, then --gen new
 * tokens each (the first from the prefill, the rest from decode steps of B tokens); tok/s =
 * B x timed steps / time, timing every step after the first two (eager warm-up and graph
 * capture). --async 1 (the default, as the engine runs them): each decode step is launched
 * chained to the one in flight before that one's tokens are collected (di_model_sample_launch,
 * model.h), so the host's work overlaps the GPU's; the clock starts when the second step's
 * tokens are back and stops at the last's. --async 0: one di_model_forward_sample per step,
 * timed one by one (the default when DEEPINFER_ASYNC_STEPS=0). Prefill at L: one sequence of
 * L tokens, logits of the last one; median of 3.
 * --trace K (builds with CUPTI): the last K decode steps of each batch are traced instead of
 * timed, and the timeline of their GPU work is printed (cuda_trace.h). --trace-async K: the
 * last K chained steps of the asynchronous loop traced as one window (printed as one "step":
 * the transitions between consecutive steps' graphs), the tok/s then includes tracing.
 * --warmup 1 (default): the decode graphs of every batch size up to the largest are captured
 * before the first decode (di_model_warmup_decode, as the engine does at start), so no timed
 * step runs eagerly or captures; --warmup 0: captured on first use (timed steps may then
 * include captures, as before 2026-12-05). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef DI_HAVE_CUDA
#include "bench_cuda_util.h"
#include "model/model.h"
#ifdef DI_HAVE_CUPTI
#include "cuda_trace.h"
#endif

static int g_trace_steps; /* --trace K */
static int g_async = 1;   /* --async 0|1 */
static int g_trace_async; /* --trace-async K: the last K chained steps traced as one window */

typedef struct counts {
    double attn, dense, router, shared, expert, head; /* parameters */
} counts;

static counts count_params(const di_model_config *c) {
    counts k;
    double D = c->hidden_size, H = c->num_attention_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim;
    double dv = c->v_head_dim, r = c->kv_lora_rank, ql = c->q_lora_rank;
    double q = ql > 0 ? ql * D + H * (dn + dr) * ql : H * (dn + dr) * D;
    k.attn = q + (r + dr) * D + H * (dn + dv) * r + D * H * dv;
    k.dense = 3.0 * c->intermediate_size * D;
    k.router = (double)c->n_routed_experts * D;
    k.shared = 3.0 * c->moe_intermediate_size * c->n_shared_experts * D;
    k.expert = 3.0 * c->moe_intermediate_size * D;
    k.head = (double)c->vocab_size * D;
    return k;
}

static double experts_touched(const di_model_config *c, double tokens) {
    double E = c->n_routed_experts, k = c->num_experts_per_tok;
    return E * (1.0 - pow(1.0 - k / E, tokens));
}

static int n_moe(const di_model_config *c) {
    int n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n += di_config_layer_is_moe(c, l);
    return n;
}

/* bytes and FLOPs of one decode step of B sequences at context ctx (bf16 weights, KV) */
static void decode_cost(const di_model_config *c, int B, double ctx, double *bytes, double *flops) {
    counts k = count_params(c);
    int L = c->num_hidden_layers, M = n_moe(c), Dn = L - M;
    double W = c->kv_lora_rank + c->qk_rope_head_dim, H = c->num_attention_heads, r = c->kv_lora_rank;
    double w = L * k.attn + Dn * k.dense + M * (k.router + k.shared + experts_touched(c, B) * k.expert) + k.head;
    double kv = (double)B * ctx * W * L + (double)B * W * L;
    *bytes = 2.0 * (w + kv);
    double per_tok = L * k.attn + Dn * k.dense + M * (k.router + k.shared + c->num_experts_per_tok * k.expert) + k.head;
    *flops = 2.0 * B * per_tok + 2.0 * B * L * H * ctx * (2 * r + c->qk_rope_head_dim);
}

/* one sequence of T tokens (causal), logits of the last token only */
static void prefill_cost(const di_model_config *c, int T, double *bytes, double *flops) {
    counts k = count_params(c);
    int L = c->num_hidden_layers, M = n_moe(c), Dn = L - M;
    double H = c->num_attention_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    double r = c->kv_lora_rank, W = r + dr;
    double w = L * k.attn + Dn * k.dense + M * (k.router + k.shared + experts_touched(c, (double)T) * k.expert) + k.head;
    *bytes = 2.0 * (w + (double)T * W * L * 2 + (double)T * c->hidden_size * 2);
    double per_tok = L * k.attn + Dn * k.dense + M * (k.router + k.shared + c->num_experts_per_tok * k.expert);
    double pairs = (double)T * (T + 1) / 2; /* causal (query, key) pairs */
    *flops = 2.0 * T * per_tok + 2.0 * k.head + 2.0 * L * H * pairs * (dn + dr + dv);
}

static int parse_list(const char *s, int *v, int max) {
    int n = 0;
    while (*s && n < max) {
        v[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

static double g_bw, g_tf;

static void report(const char *what, double tok_s, int tokens_per_unit, double bytes, double flops, double peer) {
    double tb = bytes / g_bw, tf = flops / g_tf, bound = fmax(tb, tf);
    double bound_tok = tokens_per_unit / bound;
    printf("%-28s %10.0f tok/s   roofline %10.0f tok/s (%s-bound: %.2f GB, %.2f TFLOP per step)  %5.1f%%", what,
           tok_s, bound_tok, tb >= tf ? "memory" : "compute", bytes / 1e9, flops / 1e12, 100.0 * tok_s / bound_tok);
    if (peer > 0) printf("   llama.cpp@H200 %6.0f -> %.2fx", peer, tok_s / peer);
    printf("\n");
    fflush(stdout);
}

/* The copy and bf16 GEMM ceilings (on a backend of their own, freed after). */
static void measure_ceilings_here(void) {
    di_backend *be = NULL;
    if (di_backend_create(&(di_backend_options){DI_DEVICE_CUDA, 0, 0, 0}, &be) != DI_OK) {
        fprintf(stderr, "bench_cuda_e2e: %s\n", di_last_error());
        exit(1);
    }
    di_backend_reserve rs = {8192, 16, 1024, {16, 128, 64, 128, 512, 0.1f}};
    be->reserve(be, &rs);
    g_bw = b_copy_bw();
    g_tf = b_gemm_rate(be, 8192, 8192, 8192, 0);
    di_backend_free(be);
}

/* The same in a child process, before this one touches the GPU: each process then has a CUDA
 * context of its own, and neither measurement changes where the other's memory lands. Measured
 * in this process, the ceilings' buffers (2 x 2 GiB, freed before the model loads) left every
 * decode step ~1.5% slower (H200, batch 1: 1565-1567 vs 1586-1590 tok/s, the latter as in a
 * fresh process, as the engine runs), and measured after the model was freed the copy rate came
 * out 13% low on one H100 (2,604 GB/s), which overstates the fraction of the bound
 * (docs/PERF.md, 2026-12-06). Returns 1, or 0 where the child failed and this process measured. */
static int measure_ceilings(void) {
    int fd[2];
    double v[2] = {-1, -1};
    fflush(stdout);
    if (pipe(fd) != 0) {
        measure_ceilings_here();
        return 0;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        measure_ceilings_here();
        v[0] = g_bw;
        v[1] = g_tf;
        ssize_t w = write(fd[1], v, sizeof v);
        _exit(w == (ssize_t)sizeof v ? 0 : 1);
    }
    close(fd[1]);
    ssize_t r = pid > 0 ? read(fd[0], v, sizeof v) : -1;
    close(fd[0]);
    if (pid > 0) waitpid(pid, NULL, 0);
    if (r != (ssize_t)sizeof v || v[0] <= 0 || v[1] <= 0) {
        fprintf(stderr, "bench_cuda_e2e: the ceilings' child process failed; measuring here\n");
        measure_ceilings_here();
        return 0;
    }
    g_bw = v[0];
    g_tf = v[1];
    return 1;
}

static uint64_t g_rs = 0x9e3779b97f4a7c15ull;
static int rnd_id(int V) {
    g_rs ^= g_rs << 13;
    g_rs ^= g_rs >> 7;
    g_rs ^= g_rs << 17;
    return 2 + (int)(g_rs % (uint64_t)(V - 2));
}

/* The decode step after the current one: each of the B sequences one position further (block
 * table bt of nbs blocks per sequence); ids are left to the caller. */
static void advance_decode(int B, int nbs, const int32_t *bt, int32_t *pos, int32_t *slots, int32_t *ctx,
                           int32_t *start, int32_t *rows, di_sample_row *sr) {
    for (int i = 0; i < B; i++) {
        pos[i] = ctx[i];
        slots[i] = bt[i * nbs + ctx[i] / 64] * 64 + ctx[i] % 64;
        ctx[i]++;
        start[i + 1] = i + 1;
        rows[i] = i;
        sr[i].position = (uint32_t)ctx[i];
    }
}

/* B prompts of P tokens, G new tokens each; returns steady-state decode tok/s */
static double bench_decode(di_model *m, int B, int P, int G, int nbs, double *prefill_s) {
    int V = di_model_config_of(m)->vocab_size;
    int T = B * P;
    int32_t *ids = malloc((size_t)T * 4), *pos = malloc((size_t)T * 4), *slots = malloc((size_t)T * 4);
    int32_t *start = malloc((size_t)(B + 1) * 4), *ctx = malloc((size_t)B * 4), *rows = malloc((size_t)B * 4);
    int32_t *bt = malloc((size_t)B * nbs * 4), *tok = malloc((size_t)B * 4);
    di_sample_row *sr = malloc((size_t)B * sizeof *sr);
    for (int i = 0; i < B * nbs; i++) bt[i] = i;
    start[0] = 0;
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < P; j++) {
            int t = i * P + j;
            ids[t] = rnd_id(V);
            pos[t] = j;
            slots[t] = bt[i * nbs + j / 64] * 64 + j % 64;
        }
        start[i + 1] = (i + 1) * P;
        ctx[i] = P;
        rows[i] = (i + 1) * P - 1;
        sr[i] = (di_sample_row){0.0f, 1.0f, 0.0f, 0, 0, (uint32_t)P, 0};
    }
    di_batch pb = {T, ids, pos, slots, B, 0, start, ctx, bt, nbs, B, rows};
    double t0 = di_now_s();
    di_status s = di_model_forward_sample(m, &pb, sr, tok);
    *prefill_s = di_now_s() - t0;
    double t_dec = 0;
    int timed = 0;
    int tk = g_trace_async;
    if (g_async && !g_trace_steps && s == DI_OK) {
        memcpy(ids, tok, (size_t)B * 4); /* the first decode step's input; chained steps take theirs on the device */
        int32_t *st = malloc((size_t)B * 4), *chain = malloc((size_t)B * 4);
        for (int i = 0; i < B; i++) chain[i] = i;
        double ta = 0;
        for (int step = 1; step < G && s == DI_OK; step++) {
            advance_decode(B, nbs, bt, pos, slots, ctx, start, rows, sr);
            di_batch d = {B, ids, pos, slots, B, B, start, ctx, bt, nbs, B, rows};
#ifdef DI_HAVE_CUPTI
            if (tk > 0 && step == G - tk) trace_mark(); /* the window: these launches to the last collect */
#endif
            s = di_model_sample_launch(m, &d, sr, step > 1 ? chain : NULL);
            if (s != DI_OK || step == 1) continue;
            s = di_model_sample_collect(m, tok, st); /* step - 1's tokens */
            if (step == 3) ta = di_now_s();
            else if (step > 3) timed++;
        }
        if (s == DI_OK) {
            s = di_model_sample_collect(m, tok, st);
            timed++;
        }
        t_dec = di_now_s() - ta;
#ifdef DI_HAVE_CUPTI
        if (tk > 0) trace_mark();
#endif
        while (di_model_sample_in_flight(m) > 0) /* after an error */
            if (di_model_sample_collect(m, tok, st) != DI_OK) di_error_clear();
        free(st);
        free(chain);
        G = 0; /* the synchronous loop below does nothing */
    }
    for (int step = 1; step < G && s == DI_OK; step++) {
        memcpy(ids, tok, (size_t)B * 4);
        advance_decode(B, nbs, bt, pos, slots, ctx, start, rows, sr);
        di_batch d = {B, ids, pos, slots, B, B, start, ctx, bt, nbs, B, rows};
        int traced = step >= G - g_trace_steps && step > 2;
#ifdef DI_HAVE_CUPTI
        if (traced) trace_mark();
#endif
        double a = di_now_s();
        s = di_model_forward_sample(m, &d, sr, tok);
        if (step > 2 && !traced) {
            t_dec += di_now_s() - a;
            timed++;
        }
    }
    if (s != DI_OK) fprintf(stderr, "decode B=%d: %s\n", B, di_last_error());
#ifdef DI_HAVE_CUPTI
    if (g_trace_steps > 0 || tk > 0) {
        if (g_trace_steps > 0) trace_mark();
        char what[48];
        snprintf(what, sizeof what, "decode batch %d", B);
        trace_report(stdout, what);
    }
#endif
    free(ids); free(pos); free(slots); free(start); free(ctx); free(rows); free(bt); free(tok); free(sr);
    return s == DI_OK && timed ? (double)B * timed / t_dec : -1;
}

static double bench_prefill(di_model *m, int L) {
    int V = di_model_config_of(m)->vocab_size, nb = (L + 63) / 64;
    int32_t *ids = malloc((size_t)L * 4), *pos = malloc((size_t)L * 4), *slots = malloc((size_t)L * 4);
    int32_t *bt = malloc((size_t)nb * 4), start[2] = {0, L}, ctx = L, row = L - 1, tok;
    for (int i = 0; i < nb; i++) bt[i] = i;
    for (int i = 0; i < L; i++) {
        ids[i] = rnd_id(V);
        pos[i] = i;
        slots[i] = i;
    }
    di_sample_row sr = {0.0f, 1.0f, 0.0f, 0, 0, (uint32_t)L, 0};
    di_batch b = {L, ids, pos, slots, 1, 0, start, &ctx, bt, nb, 1, &row};
    double t[4];
    di_status s = DI_OK;
    for (int r = 0; r < 4 && s == DI_OK; r++) {
        double a = di_now_s();
        s = di_model_forward_sample(m, &b, &sr, &tok);
        t[r] = di_now_s() - a;
    }
    if (s != DI_OK) fprintf(stderr, "prefill L=%d: %s\n", L, di_last_error());
    free(ids); free(pos); free(slots); free(bt);
    double x = t[1], y = t[2], z = t[3]; /* median of the 3 after warm-up */
    double med = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
    return s == DI_OK ? L / med : -1;
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    int Bs[8] = {1, 16, 64, 256}, nB = 4, Ls[8] = {512, 8192}, nL = 2, P = 128, G = 128, ceilings = 1, warm = 1;
    int precision = DI_PRECISION_DEFAULT;
    const char *as = getenv("DEEPINFER_ASYNC_STEPS"); /* the engine's switch sets the default too */
    if (as && *as) g_async = as[0] != '0';
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--batches")) nB = strcmp(argv[i + 1], "none") ? parse_list(argv[i + 1], Bs, 8) : 0;
        else if (!strcmp(argv[i], "--prefill")) nL = strcmp(argv[i + 1], "none") ? parse_list(argv[i + 1], Ls, 8) : 0;
        else if (!strcmp(argv[i], "--ceilings")) ceilings = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt")) P = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gen")) G = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--trace")) g_trace_steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--async")) g_async = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--trace-async")) g_trace_async = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup")) warm = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype")) precision = di_precision_from_name(argv[i + 1]);
    }
    if (!dir || precision < 0 || ceilings < 0 || ceilings > 2 || P < 1 || G < 4 || g_trace_steps < 0 ||
        (g_trace_steps > 0 && g_trace_steps > G - 8) || g_trace_async < 0 || g_trace_async > G - 8 ||
        (g_trace_async > 0 && (g_trace_steps > 0 || !g_async))) {
        fprintf(stderr, "usage: bench_cuda_e2e --model DIR [--batches 1,16,64,256|none] [--prompt 128] [--gen 128] "
                        "[--prefill 512,8192|none] [--ceilings 0|1|2] [--trace K (0..gen-8)] [--async 0|1] [--trace-async K] "
                        "[--warmup 0|1] [--dtype bf16|f32]\n");
        return 2;
    }
    /* before anything here touches the GPU (CUPTI's init too): --ceilings 1, measured in a child
     * process (measure_ceilings); 2, in this process before the model loads (the way before
     * 2026-12-06, for comparisons); 0 (profiling runs), PERF.md's values */
    if (ceilings == 1) {
        if (!measure_ceilings()) ceilings = 2; /* the child failed: the label below says so */
    } else if (ceilings == 2) {
        measure_ceilings_here();
    } else {
        g_bw = 4218e9;
        g_tf = 783e12;
    }
    printf("ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s%s\n", g_bw / 1e9, g_tf / 1e12,
           ceilings == 1 ? " (measured in a child process)" : ceilings == 2 ? " (measured in this process)" : "");
    if (g_trace_steps > 0 || g_trace_async > 0) {
#ifdef DI_HAVE_CUPTI
        if (!trace_init()) return 1;
#else
        fprintf(stderr, "bench_cuda_e2e: --trace needs a build with CUPTI\n");
        return 2;
#endif
    }
    int maxB = 1, maxL = 1;
    for (int i = 0; i < nB; i++) maxB = Bs[i] > maxB ? Bs[i] : maxB;
    for (int i = 0; i < nL; i++) maxL = Ls[i] > maxL ? Ls[i] : maxL;
    int nbs = (P + G + 63) / 64;
    di_model_options o = {0};
    o.device = DI_DEVICE_CUDA;
    o.precision = (di_precision)precision;
    o.max_batch_tokens = maxB * P > maxL ? maxB * P : maxL;
    o.max_seqs = maxB;
    o.max_context = (maxL > P + G ? maxL : P + G) + 64;
    int need = maxB * nbs, needL = (maxL + 63) / 64;
    o.kv_blocks = (need > needL ? need : needL) + 8;
    di_model *m = NULL;
    double t0 = di_now_s();
    if (di_model_load(dir, &o, &m) != DI_OK) {
        fprintf(stderr, "bench_cuda_e2e: %s\n", di_last_error());
        return 1;
    }
    const di_model_config *c = di_model_config_of(m);
    printf("model %s: %d layers, hidden %d, %d experts top-%d, vocab %d; loaded in %.1f s\n", dir, c->num_hidden_layers,
           c->hidden_size, c->n_routed_experts, c->num_experts_per_tok, c->vocab_size, di_now_s() - t0);
    if (nB > 0) printf("decode steps: %s\n", g_async && !g_trace_steps ? "asynchronous (each launched chained to the one in flight)" : "synchronous");
    if (nB > 0 && warm) { /* as the engine does at start: no capture inside the timed steps */
        int ng = 0;
        t0 = di_now_s();
        if (di_model_warmup_decode(m, maxB, &ng) != DI_OK) {
            fprintf(stderr, "bench_cuda_e2e: %s\n", di_last_error());
            return 1;
        }
        printf("decode graphs of %d batch sizes captured in %.2f s\n", ng, di_now_s() - t0);
    }
    fflush(stdout);
    static const int peer_b[4] = {1, 16, 64, 128};
    static const double peer_v[4] = {711, 3674, 9128, 11423};
    for (int i = 0; i < nB; i++) {
        double pf = 0, tps = bench_decode(m, Bs[i], P, G, nbs, &pf);
        double bytes, flops, peer = 0;
        decode_cost(c, Bs[i], P + G / 2.0, &bytes, &flops);
        for (int j = 0; j < 4; j++)
            if (peer_b[j] == Bs[i]) peer = peer_v[j];
        char what[64];
        snprintf(what, sizeof what, "decode batch %d", Bs[i]);
        report(what, tps, Bs[i], bytes, flops, peer);
        printf("    (prompt prefill of %d x %d tokens: %.1f ms)\n", Bs[i], P, pf * 1e3);
    }
    for (int i = 0; i < nL; i++) {
        double tps = bench_prefill(m, Ls[i]), bytes, flops;
        prefill_cost(c, Ls[i], &bytes, &flops);
        char what[64];
        snprintf(what, sizeof what, "prefill %d tokens", Ls[i]);
        report(what, tps, Ls[i], bytes, flops, Ls[i] == 512 ? 18080 : 0);
    }
    di_model_free(m);
    return 0;
}
#else
int main(void) {
    fprintf(stderr, "bench_cuda_e2e: this build has no CUDA backend\n");
    return 1;
}
#endif
