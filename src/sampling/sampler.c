/* sampler.c - one row of logits -> one token (see sampler.h for the contract and
 * docs/engine.md "Sampler" for the specification the CUDA port follows).
 *
 * Scratch (all [vocab], allocated once): x (modified logits, then y = x / T), p and q (per-id
 * probability relative to the max and its integer weight), pairs (candidates as (y, id) for
 * selection and sorting), mark (penalty bookkeeping, kept all-zero between calls).
 * Invariant: `pairs` order "before" is (y desc, id asc), a strict total order because ids are
 * distinct and NaN is rejected before any comparison. */
#include "sampling/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "sampling/rng.h"

/* Each fp32 operation below must round separately (no FMA) to match the CUDA port. */
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))

typedef struct pair {
    float y;
    int32_t id;
} pair;

struct di_sampler {
    int vocab;
    float *x;       /* [vocab] */
    float *p;       /* [vocab] indexed by id */
    uint64_t *q;    /* [vocab] indexed by id */
    pair *pairs;    /* [vocab] */
    uint8_t *mark;  /* [vocab], zero between calls */
};

di_status di_sampler_create(int vocab_size, di_sampler **out) {
    *out = NULL;
    if (vocab_size <= 0) return di_error(DI_ERR_INVALID_ARG, "sampler: vocab size %d: expected > 0", vocab_size);
    di_sampler *s = calloc(1, sizeof *s);
    if (!s) return di_error(DI_ERR_NOMEM, "sampler: out of memory");
    size_t v = (size_t)vocab_size;
    s->vocab = vocab_size;
    s->x = malloc(v * sizeof *s->x);
    s->p = malloc(v * sizeof *s->p);
    s->q = malloc(v * sizeof *s->q);
    s->pairs = malloc(v * sizeof *s->pairs);
    s->mark = calloc(v, 1);
    if (!s->x || !s->p || !s->q || !s->pairs || !s->mark) {
        di_sampler_free(s);
        return di_error(DI_ERR_NOMEM, "sampler: out of memory for vocab %d scratch", vocab_size);
    }
    *out = s;
    return DI_OK;
}

void di_sampler_free(di_sampler *s) {
    if (!s) return;
    free(s->x);
    free(s->p);
    free(s->q);
    free(s->pairs);
    free(s->mark);
    free(s);
}

int di_sampler_vocab(const di_sampler *s) { return s->vocab; }

/* ---- exp ---- */

#define LOG2E 0x1.715476p+0f      /* fp32(log2 e) */
#define LN2_HI 0x1.63p-1f         /* 0.693359375: 9 significant bits, so k * LN2_HI is exact */
#define LN2_LO (-0x1.bd0106p-13f) /* fp32(ln 2 - LN2_HI) */
#define C7 0x1.a01a02p-13f        /* fp32(1/5040) */
#define C6 0x1.6c16c2p-10f        /* fp32(1/720) */
#define C5 0x1.111112p-7f         /* fp32(1/120) */
#define C4 0x1.555556p-5f         /* fp32(1/24) */
#define C3 0x1.555556p-3f         /* fp32(1/6) */

NO_CONTRACT float di_sampling_exp(float d) {
    if (!(d > -87.0f)) return 0.0f;
    if (d > 0.0f) d = 0.0f;
    float t = d * LOG2E;
    float kf = floorf(t + 0.5f);         /* k in [-125, 0] */
    float r = d - kf * LN2_HI;
    r = r - kf * LN2_LO;                 /* |r| <= ~0.347 */
    float p = C7;
    p = p * r + C6;
    p = p * r + C5;
    p = p * r + C4;
    p = p * r + C3;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int)kf + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* ---- ordering, selection, sorting ---- */

static inline int before(pair a, pair b) { return a.y > b.y || (a.y == b.y && a.id < b.id); }

static int cmp_before(const void *pa, const void *pb) {
    const pair *a = pa, *b = pb;
    if (before(*a, *b)) return -1;
    if (before(*b, *a)) return 1;
    return 0;
}

static int cmp_id(const void *pa, const void *pb) {
    const pair *a = pa, *b = pb;
    return (a->id > b->id) - (a->id < b->id);
}

static inline void swap(pair *a, pair *b) {
    pair t = *a;
    *a = *b;
    *b = t;
}

/* Reorders a[0..n) so that a[0..k) are the k first in "before" order (unordered), 0 < k < n. */
static void select_top(pair *a, int n, int k) {
    int lo = 0, hi = n - 1, rounds = 0;
    while (hi > lo) {
        if (++rounds > 96) { /* pathological pivots: finish by sorting the remaining range */
            qsort(a + lo, (size_t)(hi - lo + 1), sizeof *a, cmp_before);
            return;
        }
        int mid = lo + (hi - lo) / 2;
        if (before(a[mid], a[lo])) swap(&a[mid], &a[lo]);
        if (before(a[hi], a[lo])) swap(&a[hi], &a[lo]);
        if (before(a[hi], a[mid])) swap(&a[hi], &a[mid]);
        pair pivot = a[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (before(a[i], pivot)) i++;
            while (before(pivot, a[j])) j--;
            if (i <= j) {
                swap(&a[i], &a[j]);
                i++;
                j--;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else return;
    }
}

/* ---- stages ---- */

static di_status bad_logit(int id, float v) {
    return di_error(DI_ERR_BACKEND, "sampler: logit of token %d is %s (expected a finite value or -inf)", id,
                    isnan(v) ? "NaN" : "+inf");
}

static NO_CONTRACT void add_bias(float *x, int i, float b) { x[i] = x[i] + b; }

/* x = logits with penalties, bias and the min_tokens mask; returns logits itself when none
 * applies (no copy). */
static const float *prepare(di_sampler *s, const float *logits, const di_sample_request *rq) {
    const di_sampling_params *p = rq->params;
    const int V = s->vocab;
    const int mask = rq->n_generated < p->min_tokens;
    if (!di_penalties_active(p) && p->n_logit_bias == 0 && !mask) return logits;
    memcpy(s->x, logits, (size_t)V * sizeof *s->x);
    if (di_penalties_active(p))
        di_penalties_apply(s->x, V, p, rq->prompt_counts, rq->output_counts, s->mark);
    for (int i = 0; i < p->n_logit_bias; i++) {
        int32_t t = p->logit_bias_ids[i];
        if (t >= 0 && t < V) add_bias(s->x, t, p->logit_bias_values[i]);
    }
    if (mask) {
        for (int i = 0; i < p->n_stop_token_ids; i++) {
            int32_t t = p->stop_token_ids[i];
            if (t >= 0 && t < V) s->x[t] = -INFINITY;
        }
        if (!p->ignore_eos)
            for (int i = 0; i < rq->n_eos; i++)
                if (rq->eos_ids[i] >= 0 && rq->eos_ids[i] < V) s->x[rq->eos_ids[i]] = -INFINITY;
    }
    return s->x;
}

static di_status argmax(const float *x, int V, int32_t *token) {
    int best = -1;
    float bv = -INFINITY;
    for (int i = 0; i < V; i++) {
        float v = x[i];
        if (v > bv) {
            best = i;
            bv = v;
        }
    }
    if (bv > FLT_MAX) return bad_logit(best, bv);
    for (int i = 0; i < V; i++) /* NaN never wins a comparison: look for it separately */
        if (isnan(x[i])) return bad_logit(i, x[i]);
    if (best < 0) return di_error(DI_ERR_BACKEND, "sampler: every token is masked (all logits -inf)");
    *token = best;
    return DI_OK;
}

static int is_greedy(const di_sampling_params *p) { return p->temperature < 1e-5f; }

static NO_CONTRACT void scale_temperature(float *y, const float *x, int V, float T) {
    for (int i = 0; i < V; i++) y[i] = x[i] / T;
}

static inline uint64_t weight_of(float pr) { return (uint64_t)(pr * 4294967296.0f); }

/* Fills p/q of token id from its y and the max m. */
static NO_CONTRACT void prob_of(di_sampler *s, int id, float y, float m) {
    float d = y - m;
    float pr = d < -23.0f ? 0.0f : di_sampling_exp(d); /* exp(-23) < 2^-32: weight 0 either way */
    s->p[id] = pr;
    s->q[id] = weight_of(pr);
}

/* Builds the kept set K. Returns *nk = -1 when K is "all ids" (weights in q, filtered ones
 * zeroed), else K = pairs[0..nk) in ascending id. *W = sum of weights over K. */
static di_status build_kept(di_sampler *s, const float *x, const di_sample_request *rq, int *nk, uint64_t *W) {
    const di_sampling_params *p = rq->params;
    const int V = s->vocab;
    const float *y = x;
    if (p->temperature != 1.0f) {
        scale_temperature(s->x, x, V, p->temperature);
        y = s->x;
    }
    float m = -INFINITY;
    for (int i = 0; i < V; i++) {
        if (y[i] > m) m = y[i];
    }
    if (m > FLT_MAX) {
        for (int i = 0; i < V; i++)
            if (y[i] > FLT_MAX) return bad_logit(i, x[i]);
    }
    for (int i = 0; i < V; i++)
        if (isnan(y[i])) return bad_logit(i, x[i]);
    if (m == -INFINITY) return di_error(DI_ERR_BACKEND, "sampler: every token is masked (all logits -inf)");

    const int use_k = p->top_k > 0 && p->top_k < V;
    const int use_p = p->top_p < 1.0f;
    uint64_t total = 0;
    if (!use_k && !use_p) {
        for (int i = 0; i < V; i++) {
            prob_of(s, i, y[i], m);
            if (p->min_p > 0.0f && !(s->p[i] >= p->min_p)) s->q[i] = 0;
            total += s->q[i];
        }
        *nk = -1;
        *W = total;
        return DI_OK;
    }
    pair *a = s->pairs;
    for (int i = 0; i < V; i++) {
        a[i].y = y[i];
        a[i].id = i;
    }
    int n = V;
    if (use_k) {
        select_top(a, V, p->top_k);
        n = p->top_k;
    }
    for (int i = 0; i < n; i++) {
        prob_of(s, a[i].id, a[i].y, m);
        total += s->q[a[i].id];
    }
    if (use_p) {
        /* Order by (y desc, id asc), widening the selected prefix until it covers top_p. */
        const uint64_t tp24 = (uint64_t)(p->top_p * 16777216.0f);
        const unsigned __int128 limit = (unsigned __int128)tp24 * total;
        int sorted = use_k ? n : (n < 64 ? n : 64), keep = -1;
        for (;;) {
            if (sorted < n) select_top(a, n, sorted);
            qsort(a, (size_t)sorted, sizeof *a, cmp_before);
            uint64_t excl = 0;
            for (int i = 0; i < sorted; i++) {
                if (i > 0 && ((unsigned __int128)excl << 24) >= limit) {
                    keep = i;
                    break;
                }
                excl += s->q[a[i].id];
            }
            if (keep >= 0 || sorted == n) break;
            sorted = sorted > n / 8 ? n : sorted * 8;
        }
        if (keep >= 0) n = keep;
    }
    if (p->min_p > 0.0f) {
        int w = 0;
        for (int i = 0; i < n; i++)
            if (s->p[a[i].id] >= p->min_p) a[w++] = a[i];
        n = w;
    }
    qsort(a, (size_t)n, sizeof *a, cmp_id);
    total = 0;
    for (int i = 0; i < n; i++) total += s->q[a[i].id];
    *nk = n;
    *W = total;
    return DI_OK;
}

static int32_t draw(const di_sampler *s, int nk, uint64_t W, const di_sample_request *rq) {
    const uint32_t r = di_rng_u32(rq->seed, rq->position, rq->stream, 0);
    const uint64_t t = (uint64_t)(((unsigned __int128)r * W) >> 32); /* t < W */
    uint64_t cum = 0;
    if (nk < 0) {
        for (int i = 0; i < s->vocab; i++) {
            cum += s->q[i];
            if (cum > t) return i;
        }
    } else {
        for (int i = 0; i < nk; i++) {
            cum += s->q[s->pairs[i].id];
            if (cum > t) return s->pairs[i].id;
        }
    }
    DI_ASSERT(0 && "draw ran past the total weight");
    return -1;
}

di_status di_sampler_distribution(di_sampler *s, const float *logits, const di_sample_request *rq,
                                  int32_t *ids, uint64_t *weights, int *n) {
    const float *x = prepare(s, logits, rq);
    int nk;
    uint64_t W;
    DI_TRY(build_kept(s, x, rq, &nk, &W));
    int c = 0;
    int cnt = nk < 0 ? s->vocab : nk;
    for (int i = 0; i < cnt; i++) {
        int id = nk < 0 ? i : s->pairs[i].id;
        if (s->q[id] == 0) continue;
        ids[c] = id;
        weights[c] = s->q[id];
        c++;
    }
    *n = c;
    return DI_OK;
}

di_status di_sampler_sample(di_sampler *s, const float *logits, const di_sample_request *rq, int32_t *token,
                            di_token_logprob *lp) {
    const di_sampling_params *p = rq->params;
    const float *x = prepare(s, logits, rq);
    int32_t tok = -1;
    if (is_greedy(p)) {
        DI_TRY(argmax(x, s->vocab, &tok));
    } else {
        int nk;
        uint64_t W;
        DI_TRY(build_kept(s, x, rq, &nk, &W));
        if (W == 0) return di_error(DI_ERR_BACKEND, "sampler: no token has a non-zero probability");
        tok = draw(s, nk, W, rq);
    }
    *token = tok;
    if (lp && p->logprobs >= 0) di_sampler_logprobs(s, logits, tok, p->logprobs, lp);
    return DI_OK;
}

void di_sampler_logprobs(di_sampler *s, const float *logits, int32_t token, int top_n, di_token_logprob *lp) {
    const int V = s->vocab;
    double m = -INFINITY;
    for (int i = 0; i < V; i++)
        if (logits[i] > m) m = logits[i];
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - m);
    const double lse = m + log(sum);
    lp->token = token;
    lp->logprob = (float)((double)logits[token] - lse);
    if (top_n > DI_MAX_TOP_LOGPROBS) top_n = DI_MAX_TOP_LOGPROBS;
    if (top_n > V) top_n = V;
    lp->n_top = top_n > 0 ? top_n : 0;
    if (top_n <= 0) return;
    pair *a = s->pairs;
    for (int i = 0; i < V; i++) {
        a[i].y = logits[i];
        a[i].id = i;
    }
    if (top_n < V) select_top(a, V, top_n);
    qsort(a, (size_t)top_n, sizeof *a, cmp_before);
    for (int i = 0; i < top_n; i++) {
        lp->top_tokens[i] = a[i].id;
        lp->top_logprobs[i] = (float)((double)a[i].y - lse);
    }
}
