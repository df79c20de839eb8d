/* cpu_attention.c - MLA attention on the CPU over the paged latent cache: the naive prefill
 * path (decompress the context's latents through W_kvb per 64-token tile, causal online
 * softmax) and the weight-absorbed decode path (scores against the 576-wide latent directly).
 *
 * Owner: model. Both paths use a blockwise online softmax whose order of operations per
 * (token, head) is fixed: context tiles in increasing position, positions in order within a
 * tile; so results do not depend on threads or on how the batch is composed, and memory is
 * linear in context length (one tile of decompressed K/V at a time). The cache row of context
 * position p of sequence i is block_table[i][p / 64] * 64 + p % 64; it holds c (kv_rank values,
 * after kv_a_layernorm) then k_pe (rope_dim values, after RoPE). */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "core/status.h"

enum { TILE = DI_KV_BLOCK_SIZE };

static inline size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The sequence (in [lo, hi)) whose token range holds batch token t. */
static int seq_of_token(const int32_t *seq_start, int lo, int hi, int t) {
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (seq_start[mid] <= t) lo = mid; else hi = mid;
    }
    return lo;
}

static inline const float *cache_row(const float *cache, const di_attn_batch *ab, int seq, int p,
                                     int W) {
    int32_t block = ab->block_table[(size_t)seq * ab->max_blocks + p / TILE];
    return cache + ((size_t)block * TILE + (size_t)(p % TILE)) * W;
}

/* Online-softmax update of one (token, head) state with n new scores. acc has dim values;
 * v_of(s) rows start at vbase + s * vstride. */
static void softmax_update(float *m, float *l, float *acc, int dim, const float *score, int n,
                           const float *vbase, size_t vstride) {
    float mx = *m;
    for (int s = 0; s < n; s++)
        if (score[s] > mx) mx = score[s];
    float corr = expf(*m - mx);  /* 0 on the first tile (m = -inf) */
    float lsum = *l * corr;
    for (int i = 0; i < dim; i++) acc[i] *= corr;
    for (int s = 0; s < n; s++) {
        float p = expf(score[s] - mx);
        lsum += p;
        cpu_axpy(acc, p, vbase + (size_t)s * vstride, dim);
    }
    *m = mx;
    *l = lsum;
}

/* ---------------------------------------------------------------- decode (absorbed) ---- */

typedef struct {
    float *out;
    const float *qt, *qpe, *cache;
    int ldqpe, hsqpe;
    const di_attn_batch *ab;
    const di_mla_dims *d;
    int seq_begin, seq_end, tok0, n_groups, heads_per_group;
} decode_job;

static void decode_item(void *ctx, size_t item, int tid) {
    (void)tid;
    const decode_job *j = ctx;
    const di_mla_dims *d = j->d;
    const di_attn_batch *ab = j->ab;
    int t = j->tok0 + (int)(item / (size_t)j->n_groups);
    int g = (int)(item % (size_t)j->n_groups);
    int h0 = g * j->heads_per_group;
    int h1 = h0 + j->heads_per_group < d->n_heads ? h0 + j->heads_per_group : d->n_heads;
    int seq = seq_of_token(ab->seq_start, j->seq_begin, j->seq_end, t);
    int q_len = ab->seq_start[seq + 1] - ab->seq_start[seq];
    int pos = ab->seq_ctx_len[seq] - q_len + (t - ab->seq_start[seq]);
    int r = d->kv_rank, dr = d->rope_dim, W = r + dr, H = d->n_heads;
    float ms[64], ls[64], score[TILE];
    DI_ASSERT(h1 - h0 <= 64);
    for (int h = h0; h < h1; h++) {
        ms[h - h0] = -INFINITY;
        ls[h - h0] = 0.0f;
        memset(j->out + ((size_t)t * H + h) * r, 0, (size_t)r * sizeof(float));
    }
    for (int b0 = 0; b0 <= pos; b0 += TILE) {
        int n = pos + 1 - b0 < TILE ? pos + 1 - b0 : TILE;
        const float *rows = cache_row(j->cache, ab, seq, b0, W);  /* a block is contiguous */
        for (int h = h0; h < h1; h++) {
            const float *qt = j->qt + ((size_t)t * H + h) * r;
            const float *qp = j->qpe + (size_t)t * j->ldqpe + (size_t)h * j->hsqpe;
            for (int s = 0; s < n; s++) {
                const float *c = rows + (size_t)s * W;
                score[s] = d->softmax_scale * (cpu_dot(qt, c, r) + cpu_dot(qp, c + r, dr));
            }
            softmax_update(&ms[h - h0], &ls[h - h0], j->out + ((size_t)t * H + h) * r, r, score, n,
                           rows, (size_t)W);
        }
    }
    for (int h = h0; h < h1; h++) {
        float inv = 1.0f / ls[h - h0];
        float *o = j->out + ((size_t)t * H + h) * r;
        for (int i = 0; i < r; i++) o[i] *= inv;
    }
}

void cpu_mla_decode(di_backend *be, void *out, const void *qt, const void *qpe, int ldqpe,
                    int hsqpe, const void *cache, const di_attn_batch *ab, int seq_begin,
                    int seq_end, const di_mla_dims *d) {
    if (seq_end <= seq_begin) return;
    int tok0 = ab->seq_start[seq_begin], tok1 = ab->seq_start[seq_end];
    if (tok1 <= tok0) return;
    int n_threads = ((cpu_state *)be->impl)->n_threads;
    /* split heads so that small batches still use every thread; result independent of split */
    int n_groups = 1;
    while (n_groups < d->n_heads && (tok1 - tok0) * n_groups < 2 * n_threads) n_groups *= 2;
    int hpg = (d->n_heads + n_groups - 1) / n_groups;
    while (hpg > 64) hpg = (hpg + 1) / 2;
    n_groups = (d->n_heads + hpg - 1) / hpg;
    decode_job j = {out, qt, qpe, cache, ldqpe, hsqpe, ab, d, seq_begin, seq_end, tok0, n_groups, hpg};
    cpu_parallel(be, (size_t)(tok1 - tok0) * (size_t)n_groups, decode_item, &j,
                 (double)(tok1 - tok0) * d->n_heads * ab->max_ctx_len * 2.0 * (d->kv_rank + d->rope_dim));
}

/* ---------------------------------------------------------------- prefill (naive) ---- */

size_t cpu_mla_prefill_scratch_bytes(di_backend *be, const di_mla_dims *d, int max_tokens) {
    (void)be;
    size_t W = (size_t)d->kv_rank + d->rope_dim;
    size_t kvw = (size_t)d->n_heads * (d->nope_dim + d->v_dim);
    return align64(TILE * W * sizeof(float)) + align64(TILE * kvw * sizeof(float)) +
           align64((size_t)max_tokens * d->n_heads * 2 * sizeof(float));
}

typedef struct {
    float *out, *ml;
    const float *q, *lat, *kv;
    int ldq, t0, first_pos, tile0, n;
    const di_mla_dims *d;
} prefill_job;

/* One query token, all heads, against one decompressed tile. */
static void prefill_item(void *ctx, size_t item, int tid) {
    (void)tid;
    const prefill_job *j = ctx;
    const di_mla_dims *d = j->d;
    int H = d->n_heads, dn = d->nope_dim, dr = d->rope_dim, dv = d->v_dim, r = d->kv_rank;
    int W = r + dr, kvw = dn + dv;
    int qi = (int)item + (j->tile0 > j->first_pos ? j->tile0 - j->first_pos : 0);
    int t = j->t0 + qi, pos = j->first_pos + qi;
    int nvis = pos - j->tile0 + 1 < j->n ? pos - j->tile0 + 1 : j->n;
    if (nvis <= 0) return;
    float score[TILE];
    for (int h = 0; h < H; h++) {
        const float *qh = j->q + (size_t)t * j->ldq + (size_t)h * (dn + dr);
        const float *kvh = j->kv + (size_t)h * kvw;
        for (int s = 0; s < nvis; s++) {
            const float *k = kvh + (size_t)s * H * kvw;
            score[s] = d->softmax_scale *
                       (cpu_dot(qh, k, dn) + cpu_dot(qh + dn, j->lat + (size_t)s * W + r, dr));
        }
        float *st = j->ml + ((size_t)t * H + h) * 2;
        softmax_update(&st[0], &st[1], j->out + ((size_t)t * H + h) * dv, dv, score, nvis, kvh + dn,
                       (size_t)H * kvw);
    }
}

void cpu_mla_prefill(di_backend *be, void *out, const void *q, int ldq, const void *cache,
                     const di_weight *W_kvb, const di_attn_batch *ab, int seq_begin, int seq_end,
                     const di_mla_dims *d, void *scratch, size_t scratch_bytes) {
    int H = d->n_heads, dn = d->nope_dim, dr = d->rope_dim, dv = d->v_dim, r = d->kv_rank;
    int W = r + dr, kvw = H * (dn + dv);
    DI_ASSERT(W_kvb->dtype == DI_DTYPE_F32 && W_kvb->rows == kvw && W_kvb->cols == r);
    DI_ASSERT(scratch_bytes >= cpu_mla_prefill_scratch_bytes(be, d, ab->n_tokens));
    float *lat = scratch;
    float *kv = (float *)((char *)scratch + align64(TILE * (size_t)W * sizeof(float)));
    float *ml = (float *)((char *)kv + align64(TILE * (size_t)kvw * sizeof(float)));
    float *o = out;
    for (int i = seq_begin; i < seq_end; i++) {
        int t0 = ab->seq_start[i], t1 = ab->seq_start[i + 1], q_len = t1 - t0;
        int ctx = ab->seq_ctx_len[i], first_pos = ctx - q_len;
        DI_ASSERT(q_len >= 0 && first_pos >= 0);
        if (q_len == 0) continue;
        for (int t = t0; t < t1; t++) {
            memset(o + (size_t)t * H * dv, 0, (size_t)H * dv * sizeof(float));
            for (int h = 0; h < H; h++) {
                ml[((size_t)t * H + h) * 2] = -INFINITY;
                ml[((size_t)t * H + h) * 2 + 1] = 0.0f;
            }
        }
        for (int tile0 = 0; tile0 < ctx; tile0 += TILE) {
            int n = ctx - tile0 < TILE ? ctx - tile0 : TILE;
            memcpy(lat, cache_row(cache, ab, i, tile0, W), (size_t)n * W * sizeof(float));
            cpu_gemm(cpu_pool_for(be, (double)n * kvw * r), kv, kvw, lat, W, W_kvb->data, r, n, kvw, r, 0);
            int q_first = tile0 > first_pos ? tile0 - first_pos : 0;  /* earlier queries see none */
            prefill_job j = {o, ml, q, lat, kv, ldq, t0, first_pos, tile0, n, d};
            cpu_parallel(be, (size_t)(q_len - q_first), prefill_item, &j,
                         (double)(q_len - q_first) * H * n * (dn + dr + dv));
        }
        for (int t = t0; t < t1; t++)
            for (int h = 0; h < H; h++) {
                float inv = 1.0f / ml[((size_t)t * H + h) * 2 + 1];
                float *oh = o + ((size_t)t * H + h) * dv;
                for (int e = 0; e < dv; e++) oh[e] *= inv;
            }
    }
}
