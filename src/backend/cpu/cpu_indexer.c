/* cpu_indexer.c - DeepSeek-V3.2's lightning indexer on the CPU: per query token, fp32 index
 * scores against the paged index-key cache and the top-k context positions it may attend to.
 *
 * Owner: model. Semantics of transformers 5.17 DeepseekV32Indexer (no Hadamard rotation, no
 * FP8: dot products in fp32): I[t, s] = Σ_h (w[t,h] · n_heads^-½) · relu(head_dim^-½ · q_h · k_s)
 * over s <= pos(t); the min(topk, pos + 1) largest are kept (ties: lower position) and emitted
 * in ascending position order. Selection uses a quickselect for the k-th largest score, so it
 * costs O(context) per token. Scratch: per worker thread, two context-length float arrays. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "core/status.h"

size_t di_cpu_indexer_scratch_bytes(di_backend *be, int max_tokens, int max_ctx) {
    (void)max_tokens;
    di_cpu_state *st = be->impl;
    return (size_t)st->n_threads * 2 * (size_t)(max_ctx > 0 ? max_ctx : 1) * sizeof(float);
}

/* The k-th largest (1-based) of v[0, n), reordering v. Deterministic (middle pivot). */
static float kth_largest(float *v, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;  /* index in descending order */
    while (lo < hi) {
        float pivot = v[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                float t = v[i]; v[i] = v[j]; v[j] = t;
                i++;
                j--;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return v[want];
    }
    return v[want];
}

typedef struct {
    int32_t *sel_pos, *sel_count;
    const float *q, *w, *cache;
    const di_attn_batch *ab;
    const di_indexer_dims *d;
    int seq_begin, seq_end, tok0;
    float *scratch;
    size_t per_thread;  /* floats */
} indexer_job;

static void indexer_item(void *ctx, size_t item, int tid) {
    const indexer_job *j = ctx;
    const di_attn_batch *ab = j->ab;
    const di_indexer_dims *d = j->d;
    int t = j->tok0 + (int)item;
    int seq = j->seq_begin;
    while (ab->seq_start[seq + 1] <= t) seq++;
    int q_len = ab->seq_start[seq + 1] - ab->seq_start[seq];
    int pos = ab->seq_ctx_len[seq] - q_len + (t - ab->seq_start[seq]);
    int K = d->topk, n = pos + 1, hd = d->head_dim, nh = d->n_heads;
    int32_t *out = j->sel_pos + (size_t)t * K;
    if (n <= K) {  /* everything is selected: dense */
        for (int s = 0; s < n; s++) out[s] = s;
        j->sel_count[t] = n;
        return;
    }
    float *score = j->scratch + (size_t)tid * j->per_thread, *tmp = score + j->per_thread / 2;
    const float *qt = j->q + (size_t)t * nh * hd, *wt = j->w + (size_t)t * nh;
    for (int s = 0; s < n; s++) {
        int32_t block = ab->block_table[(size_t)seq * ab->max_blocks + s / DI_KV_BLOCK_SIZE];
        const float *k = j->cache + ((size_t)block * DI_KV_BLOCK_SIZE + s % DI_KV_BLOCK_SIZE) * hd;
        float acc = 0.0f;
        for (int h = 0; h < nh; h++) {
            float dot = di_cpu_dot(qt + (size_t)h * hd, k, hd) * d->scale;
            acc += (wt[h] * d->weight_scale) * (dot > 0.0f ? dot : 0.0f);
        }
        score[s] = acc;
    }
    memcpy(tmp, score, (size_t)n * sizeof(float));
    float thr = kth_largest(tmp, n, K);
    int above = 0;
    for (int s = 0; s < n; s++) above += score[s] > thr;
    int ties = K - above, c = 0;
    for (int s = 0; s < n; s++)
        if (score[s] > thr || (score[s] == thr && ties-- > 0)) out[c++] = s;
    DI_ASSERT(c == K);
    j->sel_count[t] = K;
}

void di_cpu_indexer_topk(di_backend *be, int32_t *sel_pos, int32_t *sel_count, const void *q,
                      const float *w, const void *index_cache, const di_attn_batch *ab, int seq_begin,
                      int seq_end, const di_indexer_dims *d, void *scratch, size_t scratch_bytes) {
    if (seq_end <= seq_begin) return;
    int tok0 = ab->seq_start[seq_begin], tok1 = ab->seq_start[seq_end];
    DI_ASSERT(scratch_bytes >= di_cpu_indexer_scratch_bytes(be, ab->n_tokens, ab->max_ctx_len));
    di_cpu_state *st = be->impl;
    indexer_job j = {sel_pos, sel_count, q, w, index_cache, ab, d, seq_begin, seq_end, tok0, scratch,
                     scratch_bytes / sizeof(float) / (size_t)st->n_threads};
    j.per_thread -= j.per_thread % 2;
    cpu_parallel(be, (size_t)(tok1 - tok0), indexer_item, &j,
                 (double)(tok1 - tok0) * ab->max_ctx_len * d->n_heads * d->head_dim);
}
