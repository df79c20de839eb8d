/* test_sampling.c - the sampler: Philox-4x32-10 against the Random123 known-answer vectors,
 * the fp32 exp against libm, greedy tie-breaking, the exact kept distribution of every filter
 * against a direct double-precision computation, 100k-draw chi-square tests of the actual
 * draws (fixed seeds, so deterministic), seeded reproducibility and independence from other
 * rows, logprobs, penalties against hand-computed values, and errors on bad logits / params. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#include "core/status.h"
#include "deepinfer.h"
#include "sampling/penalties.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "test_util.h"

/* ---- RNG ---- */

static void test_philox_kat(void) {
    /* Random123 tests/kat_vectors, "philox4x32 10" lines: ctr[4] key[2] -> out[4] */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e,
         0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb,
         0x5001e420, 0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        di_philox4x32_10(kat[i], kat[i] + 4, out);
        for (int j = 0; j < 4; j++) CHECK_MSG(out[j] == kat[i][6 + j], "kat %d word %d: %08x", i, j, out[j]);
    }
    /* the sampler's keying is the documented counter/key layout */
    uint64_t seed = 0x0123456789abcdefull;
    uint32_t ctr[4] = {77, 3, 0, DI_RNG_DOMAIN_SAMPLE}, key[2] = {0x89abcdefu, 0x01234567u}, out[4];
    di_philox4x32_10(ctr, key, out);
    CHECK(di_rng_u32(seed, 77, 3, 0) == out[0]);
    CHECK(di_rng_u32(seed, 77, 3, 0) != di_rng_u32(seed, 78, 3, 0));
    CHECK(di_rng_u32(seed, 77, 3, 0) != di_rng_u32(seed, 77, 4, 0));
    CHECK(di_rng_u32(seed, 77, 3, 0) != di_rng_u32(seed + 1, 77, 3, 0));
    /* uniformity sanity: mean of 2^16 draws near 2^31 */
    double mean = 0;
    for (uint32_t i = 0; i < 65536; i++) mean += di_rng_u32(42, i, 0, 0);
    mean /= 65536.0 * 4294967296.0;
    CHECK_NEAR(mean, 0.5, 0.005);
}

static void test_exp(void) {
    CHECK(di_sampling_exp(0.0f) == 1.0f);
    CHECK(di_sampling_exp(-0.0f) == 1.0f);
    CHECK(di_sampling_exp(-87.5f) == 0.0f);
    CHECK(di_sampling_exp(-INFINITY) == 0.0f);
    CHECK(di_sampling_exp(NAN) == 0.0f);
    double worst = 0;
    for (int i = 0; i <= 290000; i++) {
        float d = -(float)i * 3e-4f;
        if (!(d > -87.0f)) break;
        double ref = exp((double)d), got = di_sampling_exp(d);
        double rel = fabs(got - ref) / ref;
        if (rel > worst) worst = rel;
    }
    CHECK_MSG(worst < 4e-7, "worst relative error %g", worst);
}

/* ---- reference distribution (double, straightforward) ---- */

typedef struct ref_ctx {
    const float *logits;
    int V;
    const di_sampling_params *p;
    const int32_t *prompt;
    int n_prompt;
    const int32_t *output;
    int n_output;
    const int32_t *eos;
    int n_eos;
} ref_ctx;

static const double *g_sort_y;
static int cmp_ref(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (g_sort_y[i] > g_sort_y[j]) return -1;
    if (g_sort_y[i] < g_sort_y[j]) return 1;
    return (i > j) - (i < j);
}

/* probs[V] = the distribution the sampler should draw from */
static void ref_dist(const ref_ctx *c, double *probs) {
    const int V = c->V;
    const di_sampling_params *p = c->p;
    double *x = malloc(V * sizeof *x);
    int *cnt = calloc(V, sizeof *cnt), *seen = calloc(V, sizeof *seen), *ord = malloc(V * sizeof *ord);
    for (int i = 0; i < V; i++) x[i] = c->logits[i];
    for (int i = 0; i < c->n_prompt; i++) seen[c->prompt[i]] = 1;
    for (int i = 0; i < c->n_output; i++) {
        seen[c->output[i]] = 1;
        cnt[c->output[i]]++;
    }
    for (int i = 0; i < V; i++) {
        if (seen[i]) x[i] = x[i] > 0 ? x[i] / p->repetition_penalty : x[i] * p->repetition_penalty;
        if (cnt[i]) x[i] -= p->frequency_penalty * cnt[i] + p->presence_penalty;
    }
    for (int i = 0; i < p->n_logit_bias; i++) x[p->logit_bias_ids[i]] += p->logit_bias_values[i];
    if (c->n_output < p->min_tokens) {
        for (int i = 0; i < p->n_stop_token_ids; i++) x[p->stop_token_ids[i]] = -INFINITY;
        if (!p->ignore_eos)
            for (int i = 0; i < c->n_eos; i++) x[c->eos[i]] = -INFINITY;
    }
    for (int i = 0; i < V; i++) x[i] /= p->temperature;
    for (int i = 0; i < V; i++) ord[i] = i;
    g_sort_y = x;
    qsort(ord, V, sizeof *ord, cmp_ref);
    int n = V;
    if (p->top_k > 0 && p->top_k < V) n = p->top_k;
    double tot = 0;
    for (int i = 0; i < V; i++) probs[i] = 0;
    for (int i = 0; i < n; i++) {
        probs[ord[i]] = exp(x[ord[i]] - x[ord[0]]);
        tot += probs[ord[i]];
    }
    if (p->top_p < 1) {
        double excl = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            if (i > 0 && excl / tot >= p->top_p) {
                keep = i;
                break;
            }
            excl += probs[ord[i]];
        }
        for (int i = keep; i < n; i++) probs[ord[i]] = 0;
        n = keep;
    }
    if (p->min_p > 0)
        for (int i = 0; i < n; i++)
            if (probs[ord[i]] < p->min_p) probs[ord[i]] = 0;
    tot = 0;
    for (int i = 0; i < V; i++) tot += probs[i];
    for (int i = 0; i < V; i++) probs[i] /= tot;
    free(x);
    free(cnt);
    free(seen);
    free(ord);
}

typedef struct fixture {
    di_sampler *s;
    di_token_counts prompt, output;
    di_sample_request rq;
} fixture;

static void fixture_init(fixture *f, const ref_ctx *c, uint64_t seed) {
    memset(f, 0, sizeof *f);
    CHECK_OK(di_sampler_create(c->V, &f->s));
    for (int i = 0; i < c->n_prompt; i++) CHECK_OK(di_token_counts_add(&f->prompt, c->prompt[i]));
    for (int i = 0; i < c->n_output; i++) CHECK_OK(di_token_counts_add(&f->output, c->output[i]));
    f->rq.params = c->p;
    f->rq.seed = seed;
    f->rq.n_generated = c->n_output;
    f->rq.prompt_counts = &f->prompt;
    f->rq.output_counts = &f->output;
    f->rq.eos_ids = c->eos;
    f->rq.n_eos = c->n_eos;
}

static void fixture_free(fixture *f) {
    di_sampler_free(f->s);
    di_token_counts_free(&f->prompt);
    di_token_counts_free(&f->output);
}

/* The sampler's exact kept distribution matches the reference to ~fp32 precision. */
static double dist_tv(const ref_ctx *c) {
    fixture f;
    fixture_init(&f, c, 1);
    double *ref = malloc(c->V * sizeof *ref), *got = calloc(c->V, sizeof *got);
    int32_t *ids = malloc(c->V * sizeof *ids);
    uint64_t *w = malloc(c->V * sizeof *w);
    int n = 0;
    ref_dist(c, ref);
    CHECK_OK(di_sampler_distribution(f.s, c->logits, &f.rq, ids, w, &n));
    double W = 0;
    for (int i = 0; i < n; i++) W += (double)w[i];
    for (int i = 0; i < n; i++) {
        got[ids[i]] = (double)w[i] / W;
        if (i > 0) CHECK(ids[i] > ids[i - 1]);
    }
    double tv = 0;
    for (int i = 0; i < c->V; i++) tv += fabs(got[i] - ref[i]);
    free(ref);
    free(got);
    free(ids);
    free(w);
    fixture_free(&f);
    return tv / 2;
}

/* chi-square statistic of n draws (positions 0..n-1) against the reference */
static void chi_square(const ref_ctx *c, int n, uint64_t seed, double *chi2, int *df) {
    fixture f;
    fixture_init(&f, c, seed);
    double *ref = malloc(c->V * sizeof *ref);
    long *obs = calloc(c->V, sizeof *obs);
    ref_dist(c, ref);
    int zero_hits = 0;
    for (int i = 0; i < n; i++) {
        int32_t t = -1;
        f.rq.position = (uint32_t)i;
        CHECK_OK(di_sampler_sample(f.s, c->logits, &f.rq, &t, NULL));
        if (t < 0 || t >= c->V) { zero_hits++; continue; }
        if (ref[t] == 0) zero_hits++;
        obs[t]++;
    }
    CHECK_MSG(zero_hits == 0, "%d draws of tokens with reference probability 0", zero_hits);
    /* bins with expected >= 5, the rest pooled */
    double x2 = 0, pool_e = 0, pool_o = 0;
    int bins = 0;
    for (int i = 0; i < c->V; i++) {
        double e = ref[i] * n;
        if (e >= 5) {
            x2 += (obs[i] - e) * (obs[i] - e) / e;
            bins++;
        } else {
            pool_e += e;
            pool_o += obs[i];
        }
    }
    if (pool_e >= 5) {
        x2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins++;
    }
    *chi2 = x2;
    *df = bins - 1;
    free(ref);
    free(obs);
    fixture_free(&f);
}

static float *make_logits(int V, uint64_t seed, float scale) {
    float *l = malloc(V * sizeof *l);
    for (int i = 0; i < V; i++) {
        uint64_t h = di_rng_mix64(seed * 1000003u + (uint64_t)i);
        l[i] = scale * (float)((double)(h >> 11) / 9007199254740992.0) - scale / 2;
    }
    return l;
}

static void check_case(const char *name, const ref_ctx *c, int draws) {
    double tv = dist_tv(c);
    CHECK_MSG(tv < 2e-6, "%s: total variation %g between kept distribution and reference", name, tv);
    double x2;
    int df;
    chi_square(c, draws, 12345, &x2, &df);
    /* generous fixed bound (~6 sigma above the mean df); the seed is fixed, so deterministic */
    double bound = df + 6.0 * sqrt(2.0 * df) + 10.0;
    CHECK_MSG(df >= 1 && x2 < bound, "%s: chi2 %.1f with df %d (bound %.1f)", name, x2, df, bound);
    fprintf(stderr, "   %-28s tv %.2e chi2 %.1f df %d\n", name, tv, x2, df);
}

static void test_distributions(void) {
    const int V = 64;
    float *l = make_logits(V, 7, 8.0f);
    di_sampling_params p;
    ref_ctx c = {.logits = l, .V = V, .p = &p};

    di_sampling_params_init(&p);
    check_case("temperature 1", &c, 100000);
    p.temperature = 0.7f;
    check_case("temperature 0.7", &c, 15000);
    p.temperature = 1.6f;
    check_case("temperature 1.6", &c, 15000);

    di_sampling_params_init(&p);
    p.top_k = 17;
    check_case("top_k 17", &c, 15000);
    p.temperature = 0.5f;
    check_case("top_k 17 T 0.5", &c, 15000);

    di_sampling_params_init(&p);
    p.top_p = 0.8f;
    check_case("top_p 0.8", &c, 15000);
    p.top_p = 0.3f;
    p.temperature = 1.3f;
    check_case("top_p 0.3 T 1.3", &c, 15000);

    di_sampling_params_init(&p);
    p.min_p = 0.05f;
    check_case("min_p 0.05", &c, 15000);

    di_sampling_params_init(&p);
    p.top_k = 50;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.temperature = 0.9f;
    check_case("top_k+top_p+min_p", &c, 100000);

    /* penalties on known history */
    const int32_t prompt[] = {3, 5, 5, 9, 60, 61, 50};
    const int32_t output[] = {5, 7, 7, 7, 61, 40, 63, 0};
    di_sampling_params_init(&p);
    p.repetition_penalty = 1.3f;
    p.frequency_penalty = 0.4f;
    p.presence_penalty = 0.6f;
    c.prompt = prompt;
    c.n_prompt = 7;
    c.output = output;
    c.n_output = 8;
    check_case("penalties", &c, 15000);
    p.repetition_penalty = 0.7f;
    p.frequency_penalty = -0.5f;
    p.presence_penalty = -1.0f;
    check_case("negative penalties", &c, 15000);

    /* logit bias + min_tokens mask of EOS and stop ids */
    const int32_t bias_ids[] = {1, 2, 62};
    const float bias_vals[] = {6.0f, -100.0f, 3.5f};
    const int32_t stop_ids[] = {4, 8};
    const int32_t eos[] = {1};
    di_sampling_params_init(&p);
    p.logit_bias_ids = bias_ids;
    p.logit_bias_values = bias_vals;
    p.n_logit_bias = 3;
    p.stop_token_ids = stop_ids;
    p.n_stop_token_ids = 2;
    p.min_tokens = 20;
    c.eos = eos;
    c.n_eos = 1;
    check_case("bias + min_tokens", &c, 15000);
    p.ignore_eos = 1;
    check_case("bias + min_tokens ign eos", &c, 15000);
    free(l);

    /* a flat large vocabulary exercises top-p's widening selection */
    const int V2 = 5000;
    float *l2 = make_logits(V2, 11, 2.0f);
    ref_ctx c2 = {.logits = l2, .V = V2, .p = &p};
    di_sampling_params_init(&p);
    p.top_p = 0.95f;
    double tv = dist_tv(&c2);
    CHECK_MSG(tv < 2e-6, "flat top_p: tv %g", tv);
    p.top_p = 0.5f;
    p.top_k = 3000;
    tv = dist_tv(&c2);
    CHECK_MSG(tv < 2e-6, "flat top_k+top_p: tv %g", tv);
    free(l2);
}

/* ---- greedy, determinism, independence ---- */

static void test_greedy(void) {
    const int V = 10;
    float l[10] = {0, 1, 5, 3, 5, -1, 2, 5, 0, 0};
    di_sampler *s;
    CHECK_OK(di_sampler_create(V, &s));
    di_sampling_params p;
    di_sampling_params_init(&p);
    p.temperature = 0;
    di_sample_request rq = {.params = &p};
    int32_t t = -1;
    CHECK_OK(di_sampler_sample(s, l, &rq, &t, NULL));
    CHECK_EQ_INT(t, 2); /* ties -> lowest id */
    /* repetition penalty 2 on token 2 (in prompt): 5 -> 2.5, next best is 4 */
    di_token_counts prompt = {0};
    CHECK_OK(di_token_counts_add(&prompt, 2));
    p.repetition_penalty = 2.0f;
    rq.prompt_counts = &prompt;
    CHECK_OK(di_sampler_sample(s, l, &rq, &t, NULL));
    CHECK_EQ_INT(t, 4);
    /* bias wins */
    int32_t bid = 9;
    float bval = 5.5f;
    p.logit_bias_ids = &bid;
    p.logit_bias_values = &bval;
    p.n_logit_bias = 1;
    CHECK_OK(di_sampler_sample(s, l, &rq, &t, NULL));
    CHECK_EQ_INT(t, 9);
    /* min_tokens masks the stop id, ignore_eos leaves EOS alone */
    int32_t eos = 9;
    rq.eos_ids = &eos;
    rq.n_eos = 1;
    p.min_tokens = 1;
    CHECK_OK(di_sampler_sample(s, l, &rq, &t, NULL));
    CHECK_EQ_INT(t, 4);
    p.ignore_eos = 1;
    CHECK_OK(di_sampler_sample(s, l, &rq, &t, NULL));
    CHECK_EQ_INT(t, 9);
    /* bad rows */
    float bad[10] = {0, 1, NAN, 0, 0, 0, 0, 0, 0, 0};
    di_sampling_params_init(&p);
    p.temperature = 0;
    rq = (di_sample_request){.params = &p};
    CHECK(di_sampler_sample(s, bad, &rq, &t, NULL) == DI_ERR_BACKEND);
    CHECK(strstr(di_last_error(), "token 2") != NULL);
    p.temperature = 1;
    CHECK(di_sampler_sample(s, bad, &rq, &t, NULL) == DI_ERR_BACKEND);
    bad[2] = INFINITY;
    CHECK(di_sampler_sample(s, bad, &rq, &t, NULL) == DI_ERR_BACKEND);
    float all_masked[10];
    for (int i = 0; i < 10; i++) all_masked[i] = -INFINITY;
    CHECK(di_sampler_sample(s, all_masked, &rq, &t, NULL) == DI_ERR_BACKEND);
    di_token_counts_free(&prompt);
    di_sampler_free(s);
}

/* Greedy at every vocabulary shape the packed argmax distinguishes (below / at / past the
 * 8-wide body, 4-wide search tails), with ties, -inf, signed zeros and a bad value at every
 * position, against the definition: the lowest id among the maxima; NaN / +inf anywhere is
 * an error naming that token; all -inf is an error. */
static void test_greedy_sizes(void) {
    static const int sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 23, 24, 31, 32, 33, 63, 64, 65, 100, 1031};
    static const float vals[] = {-INFINITY, -3.5f, -1.0f, -0.0f, 0.0f, 0.25f, 2.0f, 7.0f};
    float *x = malloc(1031 * sizeof *x);
    uint64_t rng = 12345;
    int cases = 0, wrong = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int V = sizes[si];
        di_sampler *s;
        CHECK_OK(di_sampler_create(V, &s));
        di_sampling_params p;
        di_sampling_params_init(&p);
        p.temperature = 0;
        di_sample_request rq = {.params = &p};
        for (int trial = 0; trial < 200; trial++) {
            /* few distinct values -> many ties; sometimes the max only once, at a chosen spot */
            for (int i = 0; i < V; i++) {
                rng = di_rng_mix64(rng);
                x[i] = vals[rng % (trial % 3 == 0 ? 4 : 8)];
            }
            if (trial % 5 == 1) x[(int)(di_rng_mix64(rng + 1) % (uint64_t)V)] = 9.0f;
            int all_inf = 1, want = -1;
            for (int i = 0; i < V; i++) all_inf &= x[i] == -INFINITY;
            if (!all_inf) {
                float m = -INFINITY;
                for (int i = 0; i < V; i++)
                    if (x[i] > m) m = x[i];
                for (want = 0; x[want] != m; want++) {}
            }
            int32_t t1 = -1, t2 = -1;
            di_status s1 = di_sampler_argmax(x, V, &t1), s2 = di_sampler_sample(s, x, &rq, &t2, NULL);
            cases++;
            if (all_inf) wrong += s1 != DI_ERR_BACKEND || s2 != DI_ERR_BACKEND;
            else wrong += s1 != DI_OK || s2 != DI_OK || t1 != want || t2 != want;
        }
        /* a bad value at every position is found and named */
        for (int i = 0; i < V; i++) x[i] = (float)(i % 7);
        for (int bad = 0; bad < V; bad++) {
            for (int k = 0; k < 2; k++) {
                float keep = x[bad];
                x[bad] = k ? INFINITY : NAN;
                int32_t t = -1;
                char want_msg[32];
                snprintf(want_msg, sizeof want_msg, "token %d ", bad);
                di_status st = di_sampler_argmax(x, V, &t);
                cases++;
                wrong += st != DI_ERR_BACKEND || strstr(di_last_error(), want_msg) == NULL;
                x[bad] = keep;
            }
        }
        di_sampler_free(s);
    }
    CHECK_MSG(wrong == 0, "%d of %d greedy cases wrong", wrong, cases);
    float z[9] = {-0.0f, 0.0f, -1, -1, -1, -1, -1, -1, -1};
    int32_t t = -1;
    CHECK_OK(di_sampler_argmax(z, 9, &t));
    CHECK_EQ_INT(t, 0); /* -0 == +0: the lower id */
    free(x);
}

static void test_reproducible(void) {
    const int V = 1000;
    float *a = make_logits(V, 1, 6.0f), *b = make_logits(V, 2, 6.0f);
    di_sampler *s1, *s2;
    CHECK_OK(di_sampler_create(V, &s1));
    CHECK_OK(di_sampler_create(V, &s2));
    di_sampling_params p;
    di_sampling_params_init(&p);
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    di_sampling_params q = p;
    q.top_k = 5;
    /* row a sampled alone at positions 0..199 vs interleaved with unrelated rows on the same
     * sampler: identical tokens */
    int32_t alone[200], mixed[200];
    di_sample_request rq = {.params = &p, .seed = 99};
    for (int i = 0; i < 200; i++) {
        rq.position = (uint32_t)(50 + i);
        CHECK_OK(di_sampler_sample(s1, a, &rq, &alone[i], NULL));
    }
    di_sample_request other = {.params = &q, .seed = 5};
    int differ_stream = 0, differ_seed = 0;
    for (int i = 0; i < 200; i++) {
        int32_t t;
        other.position = (uint32_t)i;
        CHECK_OK(di_sampler_sample(s2, b, &other, &t, NULL));
        rq.position = (uint32_t)(50 + i);
        CHECK_OK(di_sampler_sample(s2, a, &rq, &mixed[i], NULL));
        CHECK_OK(di_sampler_sample(s2, b, &other, &t, NULL));
        di_sample_request r2 = rq;
        r2.stream = 1;
        CHECK_OK(di_sampler_sample(s2, a, &r2, &t, NULL));
        differ_stream += t != mixed[i];
        r2.stream = 0;
        r2.seed = 100;
        CHECK_OK(di_sampler_sample(s2, a, &r2, &t, NULL));
        differ_seed += t != mixed[i];
    }
    int same = 1;
    for (int i = 0; i < 200; i++) same &= alone[i] == mixed[i];
    CHECK(same);
    CHECK(differ_stream > 100);
    CHECK(differ_seed > 100);
    di_sampler_free(s1);
    di_sampler_free(s2);
    free(a);
    free(b);
}

static void test_logprobs(void) {
    const int V = 400;
    float *l = make_logits(V, 3, 10.0f);
    di_sampler *s;
    CHECK_OK(di_sampler_create(V, &s));
    di_sampling_params p;
    di_sampling_params_init(&p);
    p.temperature = 0;
    p.logprobs = 5;
    di_sample_request rq = {.params = &p};
    int32_t t;
    di_token_logprob lp;
    CHECK_OK(di_sampler_sample(s, l, &rq, &t, &lp));
    double m = -1e30, sum = 0;
    for (int i = 0; i < V; i++) m = l[i] > m ? l[i] : m;
    for (int i = 0; i < V; i++) sum += exp(l[i] - m);
    double lse = m + log(sum);
    CHECK_EQ_INT(lp.token, t);
    CHECK_NEAR(lp.logprob, l[t] - lse, 1e-5);
    CHECK_EQ_INT(lp.n_top, 5);
    CHECK_EQ_INT(lp.top_tokens[0], t);
    for (int i = 0; i < 5; i++) {
        CHECK_NEAR(lp.top_logprobs[i], l[lp.top_tokens[i]] - lse, 1e-5);
        if (i) CHECK(lp.top_logprobs[i] <= lp.top_logprobs[i - 1]);
    }
    /* the 5 reported are the 5 largest */
    int larger = 0;
    for (int i = 0; i < V; i++) larger += l[i] > l[lp.top_tokens[4]];
    CHECK_EQ_INT(larger, 4);
    /* penalties do not change the reported (raw) logprobs */
    p.temperature = 1;
    p.repetition_penalty = 3;
    di_token_counts pc = {0};
    CHECK_OK(di_token_counts_add(&pc, lp.top_tokens[0]));
    rq.prompt_counts = &pc;
    rq.seed = 4;
    di_token_logprob lp2;
    CHECK_OK(di_sampler_sample(s, l, &rq, &t, &lp2));
    CHECK_NEAR(lp2.logprob, l[t] - lse, 1e-5);
    CHECK(lp2.top_tokens[0] == lp.top_tokens[0] && lp2.top_logprobs[0] == lp.top_logprobs[0]);
    di_token_counts_free(&pc);
    di_sampler_free(s);
    free(l);
}

static void test_penalty_values(void) {
    float l[6] = {2.0f, -2.0f, 1.0f, 0.5f, -0.5f, 3.0f};
    di_token_counts pr = {0}, out = {0};
    CHECK_OK(di_token_counts_add(&pr, 0));
    CHECK_OK(di_token_counts_add(&pr, 1));
    CHECK_OK(di_token_counts_add(&out, 1));
    CHECK_OK(di_token_counts_add(&out, 2));
    CHECK_OK(di_token_counts_add(&out, 2));
    CHECK_OK(di_token_counts_add(&out, 2));
    di_sampling_params p;
    di_sampling_params_init(&p);
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.5f;
    uint8_t mark[6] = {0};
    di_penalties_apply(l, 6, &p, &pr, &out, mark);
    CHECK(l[0] == 1.0f);                       /* prompt only: 2 / 2 */
    CHECK(l[1] == -2.0f * 2 - 0.25f - 0.5f);   /* both: -4 once, then 1 * 0.25 + 0.5 */
    CHECK(l[2] == 0.5f - 0.75f - 0.5f);        /* output x3: 1/2 - 3*0.25 - 0.5 */
    CHECK(l[3] == 0.5f && l[4] == -0.5f && l[5] == 3.0f);
    for (int i = 0; i < 6; i++) CHECK(mark[i] == 0);
    di_token_counts_free(&pr);
    di_token_counts_free(&out);
}

static void test_token_counts(void) {
    di_token_counts c = {0}, d = {0};
    int dense[5000] = {0};
    uint64_t x = 1;
    for (int i = 0; i < 20000; i++) {
        x = di_rng_mix64(x);
        int32_t t = (int32_t)(x % 5000) * ((x >> 40) % 3 == 0 ? 1 : 0);
        CHECK_OK(di_token_counts_add(&c, t));
        dense[t]++;
    }
    int ok = 1, distinct = 0;
    for (int i = 0; i < 5000; i++) {
        ok &= di_token_counts_get(&c, i) == dense[i];
        distinct += dense[i] > 0;
    }
    CHECK(ok);
    CHECK_EQ_INT(c.n, distinct);
    CHECK_OK(di_token_counts_copy(&d, &c));
    ok = 1;
    for (int i = 0; i < 5000; i++) ok &= di_token_counts_get(&d, i) == dense[i];
    CHECK(ok);
    di_token_counts_clear(&d);
    CHECK_EQ_INT(di_token_counts_get(&d, 0), 0);
    CHECK_EQ_INT(d.n, 0);
    di_token_counts_free(&c);
    di_token_counts_free(&d);
    di_token_counts_free(NULL);
}

static void test_params_validation(void) {
    di_sampling_params p;
    di_sampling_params_init(&p);
    CHECK_OK(di_sampling_params_validate(&p, 100));
    p.top_p = 1.5f;
    CHECK(di_sampling_params_validate(&p, 100) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "'top_p'") != NULL);
    di_sampling_params_init(&p);
    p.temperature = -1;
    CHECK(di_sampling_params_validate(&p, 100) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "'temperature'") != NULL);
    di_sampling_params_init(&p);
    p.n = 0;
    CHECK(di_sampling_params_validate(&p, 100) == DI_ERR_INVALID_ARG);
    di_sampling_params_init(&p);
    int32_t ids[1] = {100};
    float v[1] = {1};
    p.logit_bias_ids = ids;
    p.logit_bias_values = v;
    p.n_logit_bias = 1;
    CHECK(di_sampling_params_validate(&p, 100) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "logit_bias") != NULL);
    di_sampling_params_init(&p);
    const char *stops[1] = {""};
    p.stop = stops;
    p.n_stop = 1;
    CHECK(di_sampling_params_validate(&p, 100) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "stop[0]") != NULL);
    di_sampling_params_init(&p);
    p.min_tokens = 20;
    p.max_tokens = 10;
    CHECK(di_sampling_params_validate(&p, 100) == DI_ERR_INVALID_ARG);
    di_sampling_params_init(&p);
    p.logprobs = 21;
    CHECK(di_sampling_params_validate(&p, 100) == DI_ERR_INVALID_ARG);
}

TEST_MAIN(test_philox_kat, test_exp, test_distributions, test_greedy, test_greedy_sizes, test_reproducible, test_logprobs,
          test_penalty_values, test_token_counts, test_params_validation)
