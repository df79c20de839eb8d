/* sampler.c - one row of logits -> one token (see sampler.h for the contract and
 * docs/engine.md "Sampler" for the specification the CUDA port follows).
 *
 * Scratch (all [vocab], allocated once): x (modified logits, then y = x / T), p and q (per-id
 * probability relative to the max and its integer weight), pairs (candidates as (y, id) for
 * selection and sorting), mark (penalty bookkeeping, kept all-zero between calls).
 * Invariant: `pairs` order "before" is (y desc, id asc), a strict total order because ids are
 * distinct and NaN is rejected before any comparison. */
/* Each fp32 operation in this file must round separately (no FMA contraction) to match the
 * CUDA port. Set for the whole file, before any include, so that every function (header
 * inlines too) has the same options and stays inlinable. no-trapping-math lets the branch-
 * free exp loop vectorize; it changes no result. */
#pragma GCC optimize("fp-contract=off", "vect-cost-model=dynamic", "no-trapping-math")

#include "sampling/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/status.h"
#include "sampling/rng.h"

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
    uint64_t *bsum; /* [NB] top-p buckets */
};

#define NB 2048                 /* top-p buckets over y in (m - 23, m] */
#define D_MIN (-23.0f)          /* exp(-23) < 2^-32: tokens further below the max weigh 0 */

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
    s->bsum = malloc((NB + 1) * sizeof *s->bsum);
    if (!s->x || !s->p || !s->q || !s->pairs || !s->mark || !s->bsum) {
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
    free(s->bsum);
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

/* floor of x for |x| < 2^31: truncate, then step down if that rounded up */
static inline float floor_small(float x) {
    float t = (float)(int32_t)x;
    return t > x ? t - 1.0f : t;
}

/* exp(d) for -87 < d <= 0 */
static inline float exp_neg(float d) {
    float t = d * LOG2E;
    float kf = floor_small(t + 0.5f);    /* k in [-125, 0] */
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
    uint32_t bits = (uint32_t)((int32_t)kf + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

float di_sampling_exp(float d) {
    if (!(d > -87.0f)) return 0.0f;
    if (d > 0.0f) d = 0.0f;
    return exp_neg(d);
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

static void add_bias(float *x, int i, float b) { x[i] = x[i] + b; }

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

/* Max of x[0..V) (8 independent lanes so the loop vectorizes); NaN or +inf is an error. */
static di_status scan_max(const float *x, const float *raw, int V, float *m_out) {
    if (V < 64) { /* small vocabularies: the lane setup costs more than it saves */
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) {
            if (isnan(x[i]) || x[i] > FLT_MAX) return bad_logit(i, raw[i]);
            mx = x[i] > mx ? x[i] : mx;
        }
        if (mx == -INFINITY) return di_error(DI_ERR_BACKEND, "sampler: every token is masked (all logits -inf)");
        *m_out = mx;
        return DI_OK;
    }
    float m[8];
    int nan[8];
    for (int j = 0; j < 8; j++) {
        m[j] = -INFINITY;
        nan[j] = 0;
    }
    int i = 0;
    for (; i + 8 <= V; i += 8)
        for (int j = 0; j < 8; j++) {
            float v = x[i + j];
            m[j] = v > m[j] ? v : m[j];
            nan[j] |= v != v;
        }
    for (; i < V; i++) {
        m[0] = x[i] > m[0] ? x[i] : m[0];
        nan[0] |= x[i] != x[i];
    }
    float mx = m[0];
    int any_nan = nan[0];
    for (int j = 1; j < 8; j++) {
        mx = m[j] > mx ? m[j] : mx;
        any_nan |= nan[j];
    }
    if (any_nan || mx > FLT_MAX) {
        for (i = 0; i < V; i++)
            if (isnan(x[i]) || x[i] > FLT_MAX) return bad_logit(i, raw[i]);
    }
    if (mx == -INFINITY) return di_error(DI_ERR_BACKEND, "sampler: every token is masked (all logits -inf)");
    *m_out = mx;
    return DI_OK;
}

/* Greedy: the lowest id among the maxima of x[0..V). With SSE2 (every x86-64): one pass of
 * packed max and "x <= FLT_MAX" flags (false for NaN and +inf), then a packed search for the
 * first element equal to the max; a row with a bad value goes to scan_max for its error. The
 * result is the same as scan_max + the first-maximum search below (maxps picks one of its
 * operands exactly; -0 and +0 compare equal in both). */
static __attribute__((noinline)) di_status argmax_scalar(const float *x, int V, int32_t *token) {
    float m;
    DI_TRY(scan_max(x, x, V, &m));
    int i = 0;
    while (x[i] != m) i++; /* the lowest id among the maxima */
    *token = i;
    return DI_OK;
}

di_status di_sampler_argmax(const float *x, int V, int32_t *token) {
#if defined(__SSE2__)
    if (V >= 8) {
        const __m128 lim = _mm_set1_ps(FLT_MAX);
        __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0;
        __m128 ok = _mm_cmple_ps(m0, lim); /* all ones */
        int i = 0;
        for (; i + 8 <= V; i += 8) {
            __m128 a = _mm_loadu_ps(x + i), b = _mm_loadu_ps(x + i + 4);
            m0 = _mm_max_ps(m0, a);
            m1 = _mm_max_ps(m1, b);
            ok = _mm_and_ps(ok, _mm_and_ps(_mm_cmple_ps(a, lim), _mm_cmple_ps(b, lim)));
        }
        if (i + 4 <= V) {
            __m128 a = _mm_loadu_ps(x + i);
            m0 = _mm_max_ps(m0, a);
            ok = _mm_and_ps(ok, _mm_cmple_ps(a, lim));
            i += 4;
        }
        m0 = _mm_max_ps(m0, m1);
        m0 = _mm_max_ps(m0, _mm_movehl_ps(m0, m0));
        m0 = _mm_max_ss(m0, _mm_shuffle_ps(m0, m0, 1));
        float mx = _mm_cvtss_f32(m0);
        int good = _mm_movemask_ps(ok) == 0xf;
        for (; i < V; i++) {
            good &= x[i] <= FLT_MAX;
            mx = x[i] > mx ? x[i] : mx;
        }
        if (good && mx != -INFINITY) {
            const __m128 mv = _mm_set1_ps(mx);
            for (i = 0; i + 8 <= V; i += 8) {
                int hit = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + i), mv)) |
                          _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + i + 4), mv)) << 4;
                if (hit) {
                    *token = i + __builtin_ctz((unsigned)hit);
                    return DI_OK;
                }
            }
            while (x[i] != mx) i++;
            *token = i;
            return DI_OK;
        }
        /* fall through: scan_max names the bad value */
    }
#endif
    return argmax_scalar(x, V, token);
}

static int is_greedy(const di_sampling_params *p) { return p->temperature < 1e-5f; }

int di_sampler_plain_greedy(const di_sampling_params *p) {
    return is_greedy(p) && !di_penalties_active(p) && p->n_logit_bias == 0 && p->logprobs < 0;
}

static void scale_temperature(float *y, const float *x, int V, float T) {
    for (int i = 0; i < V; i++) y[i] = x[i] / T;
}

/* pr * 2^32 <= 2^32 fits int64, whose conversion is one instruction (uint64 needs a branch) */
static inline uint64_t weight_of(float pr) { return (uint64_t)(int64_t)(pr * 4294967296.0f); }

/* p and q of token id from its y and the max m (weight 0 below D_MIN: exp < 2^-32 there) */
static inline void prob_of(di_sampler *s, int id, float y, float m) {
    float d = y - m;
    float pr = d < D_MIN ? 0.0f : exp_neg(d);
    s->p[id] = pr;
    s->q[id] = weight_of(pr);
}

/* p[i] for every token, branch-free so the loop vectorizes (same values as prob_of) */
static void probs_all(float *restrict p, const float *restrict y, int V, float m) {
    for (int i = 0; i < V; i++) {
        float d = y[i] - m;
        float e = exp_neg(d < -87.0f ? -87.0f : d);
        p[i] = d < D_MIN ? 0.0f : e;
    }
}

/* Top-k for small k: a heap of the k first in "before" order, root = the last of them. */
static void heap_down(pair *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && before(h[w], h[l])) w = l;
        if (r < n && before(h[w], h[r])) w = r;
        if (w == i) return;
        swap(&h[i], &h[w]);
        i = w;
    }
}

static void top_k_heap(const float *y, int V, int k, pair *h) {
    for (int i = 0; i < k; i++) h[i] = (pair){y[i], i};
    for (int i = k / 2 - 1; i >= 0; i--) heap_down(h, k, i);
    for (int i = k; i < V; i++) {
        if (!(y[i] > h[0].y)) continue; /* ties with the root lose: the root has a lower id */
        h[0] = (pair){y[i], i};
        heap_down(h, k, 0);
    }
}

/* top_p over all ids (no top-k): keeps the minimal prefix in (y desc, id asc) order whose
 * excluded-prefix weight stays below top_p * total, by bucketing y under the max (a
 * monotone bucketing, so the result is exactly the specified one) and sorting only the
 * bucket where the cut falls. Dropped tokens get weight 0. */
static void top_p_all(di_sampler *s, const float *y, float m, uint64_t total, float top_p) {
    const int V = s->vocab;
    const float scale = (float)NB / -D_MIN;
    const unsigned __int128 limit = (unsigned __int128)(uint64_t)(top_p * 16777216.0f) * total;
    memset(s->bsum, 0, (NB + 1) * sizeof *s->bsum);
    for (int i = 0; i < V; i++) {
        if (!s->q[i]) continue;
        int b = (int)((m - y[i]) * scale);
        s->bsum[b < NB ? b : NB - 1] += s->q[i];
    }
    uint64_t excl = 0;
    int c = 0;
    for (; c < NB; c++) {
        if (((unsigned __int128)(excl + s->bsum[c]) << 24) >= limit) break;
        excl += s->bsum[c];
    }
    if (c == NB) return; /* everything kept */
    /* the cut falls in bucket c (or right after it): order its tokens */
    pair *a = s->pairs;
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (!s->q[i]) continue;
        int b = (int)((m - y[i]) * scale);
        b = b < NB ? b : NB - 1;
        if (b == c) a[n++] = (pair){y[i], i};
        else if (b > c) s->q[i] = 0;
    }
    qsort(a, (size_t)n, sizeof *a, cmp_before);
    int keep = n;
    for (int i = 0; i < n; i++) {
        if (((unsigned __int128)excl << 24) >= limit && (excl > 0 || i > 0)) {
            keep = i;
            break;
        }
        excl += s->q[a[i].id];
    }
    for (int i = keep; i < n; i++) s->q[a[i].id] = 0;
}

/* Builds the kept set K. Returns *nk = -1 when K is described by q over all ids (weight 0 =
 * not kept), else K = pairs[0..nk) in ascending id. *W = sum of weights over K. */
static di_status build_kept(di_sampler *s, const float *x, const di_sample_request *rq, int *nk, uint64_t *W) {
    const di_sampling_params *p = rq->params;
    const int V = s->vocab;
    const float *y = x;
    if (p->temperature != 1.0f) {
        scale_temperature(s->x, x, V, p->temperature);
        y = s->x;
    }
    float m;
    DI_TRY(scan_max(y, x, V, &m));
    const int use_k = p->top_k > 0 && p->top_k < V;
    const int use_p = p->top_p < 1.0f;
    uint64_t total = 0;
    if (!use_k) {
        probs_all(s->p, y, V, m); /* vectorized */
        for (int i = 0; i < V; i++) {
            s->q[i] = weight_of(s->p[i]);
            total += s->q[i];
        }
        if (use_p) top_p_all(s, y, m, total, p->top_p);
        if (use_p || p->min_p > 0.0f) {
            total = 0;
            for (int i = 0; i < V; i++) {
                if (p->min_p > 0.0f && !(s->p[i] >= p->min_p)) s->q[i] = 0;
                total += s->q[i];
            }
        }
        *nk = -1;
        *W = total;
        return DI_OK;
    }
    pair *a = s->pairs;
    int n = p->top_k;
    if (n <= 4096) {
        top_k_heap(y, V, n, a);
    } else {
        for (int i = 0; i < V; i++) a[i] = (pair){y[i], i};
        select_top(a, V, n);
    }
    for (int i = 0; i < n; i++) {
        prob_of(s, a[i].id, a[i].y, m);
        total += s->q[a[i].id];
    }
    if (use_p) {
        const unsigned __int128 limit = (unsigned __int128)(uint64_t)(p->top_p * 16777216.0f) * total;
        qsort(a, (size_t)n, sizeof *a, cmp_before);
        uint64_t excl = 0;
        for (int i = 0; i < n; i++) {
            if (i > 0 && ((unsigned __int128)excl << 24) >= limit) {
                n = i;
                break;
            }
            excl += s->q[a[i].id];
        }
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
        DI_TRY(di_sampler_argmax(x, s->vocab, &tok));
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
