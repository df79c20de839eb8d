/* cuda_mla_sparse.cu - MLA attention restricted to each token's selected context positions
 * (DeepSeek-V3.2 DSA: di_attn_batch.sel_pos / sel_count / sel_stride, written by indexer_topk).
 * cuda_mla_decode and cuda_mla_prefill hand over to these when ab->sel_pos != NULL.
 *
 * Owner: cuda. The math per attended position is that of the CPU backend (cpu_attention.c):
 *  - decode (weight-absorbed, latent space): one warp per (token, head) over the token's
 *    sel_count positions, score = σ (q̃ · c_s + q_pe · k_pe_s), online softmax in fp32,
 *    out = Σ p c_s / Σ p (the generic dense decode kernel's arithmetic, positions from the list);
 *  - prefill (decompressed, as the CPU's): per group of sequences and window [c0, c0 + CH) of
 *    context, gather the window's cache rows, decompress them through W_kvb with one GEMM
 *    (cuda_linear), then one warp per (query, head) attends to its selected positions inside
 *    the window (binary search in the sorted list); the online-softmax state (m, l, O in fp32)
 *    persists in scratch between windows, so memory is linear in context.
 * Simple kernels, correctness first: no tensor cores. Scratch layout (prefill, from the
 * caller's mla_prefill scratch): state [n_tokens*H][2] f32, acc [n_tokens*H][dv] f32, then as
 * many dense rows (lat [r+dr] + kv [H*(dn+dv)], bf16) as the rest holds. */
#include <math.h>

#include "backend/cuda/cuda_internal.h"

enum { SP_MAXR = 16, SP_MAXDR = 4 };  /* decode per-lane registers: r <= 512, rope <= 128 */
enum { SP_MAXV = 16, SP_MAXQ = 24 };  /* prefill: dv <= 512, dn + dr <= 768 */


/* ---------------------------------------------------------------- decode ---- */

typedef struct sd_args {
    bf16 *out;
    const bf16 *qt, *qpe, *cache;
    long ldqpe, hsqpe;
    const int32_t *seq_start, *ctx_len, *block_table, *sel_pos, *sel_count;
    int max_blocks, seq_begin, seq_end, n_heads, r, dr, sel_stride;
    float scale;
} sd_args;

__global__ void k_mla_sparse_decode(sd_args a) {
    int t = blockIdx.x, h = blockIdx.y * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    int seq = seq_of(a.seq_start, a.seq_begin, a.seq_end, t);
    if (seq < 0 || h >= a.n_heads) return;
    int r = a.r, dr = a.dr, W = r + dr, H = a.n_heads;
    const int32_t *sel = a.sel_pos + (long)t * a.sel_stride;
    int cnt = a.sel_count[t];
    float q[SP_MAXR], qp[SP_MAXDR], acc[SP_MAXR];
#pragma unroll
    for (int i = 0; i < SP_MAXR; i++) {
        int j = lane + 32 * i;
        q[i] = j < r ? __bfloat162float(a.qt[((long)t * H + h) * r + j]) : 0.f;
        acc[i] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < SP_MAXDR; i++) {
        int j = lane + 32 * i;
        qp[i] = j < dr ? __bfloat162float(a.qpe[(long)t * a.ldqpe + (long)h * a.hsqpe + j]) : 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int k = 0; k < cnt; k++) {
        int p = sel[k];
        int blk = a.block_table[(long)seq * a.max_blocks + p / DI_KV_BLOCK_SIZE];
        const bf16 *c = a.cache + ((long)blk * DI_KV_BLOCK_SIZE + p % DI_KV_BLOCK_SIZE) * W;
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < SP_MAXR; i++) {
            int j = lane + 32 * i;
            if (j < r) d += q[i] * __bfloat162float(c[j]);
        }
#pragma unroll
        for (int i = 0; i < SP_MAXDR; i++) {
            int j = lane + 32 * i;
            if (j < dr) d += qp[i] * __bfloat162float(c[r + j]);
        }
        for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        float sc = a.scale * d, mn = fmaxf(m, sc);
        float corr = expf(m - mn), pr = expf(sc - mn);
        l = l * corr + pr;
#pragma unroll
        for (int i = 0; i < SP_MAXR; i++) {
            int j = lane + 32 * i;
            acc[i] = acc[i] * corr + (j < r ? pr * __bfloat162float(c[j]) : 0.f);
        }
        m = mn;
    }
    float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < SP_MAXR; i++) {
        int j = lane + 32 * i;
        if (j < r) a.out[((long)t * H + h) * r + j] = __float2bfloat16_rn(acc[i] * inv);
    }
}

void cuda_mla_sparse_decode(cuda_state *st, void *out, const void *qt, const void *qpe, int ldqpe, int hsqpe,
                            const void *cache, const di_attn_batch *ab, int seq_begin, int seq_end,
                            const di_mla_dims *d) {
    if (seq_end <= seq_begin || ab->n_tokens <= 0) return;
    DI_ASSERT(d->kv_rank <= 32 * SP_MAXR && d->rope_dim <= 32 * SP_MAXDR && ab->sel_count);
    sd_args a;
    a.out = (bf16 *)out;
    a.qt = (const bf16 *)qt;
    a.qpe = (const bf16 *)qpe;
    a.cache = (const bf16 *)cache;
    a.ldqpe = ldqpe;
    a.hsqpe = hsqpe;
    a.seq_start = ab->seq_start;
    a.ctx_len = ab->seq_ctx_len;
    a.block_table = ab->block_table;
    a.sel_pos = ab->sel_pos;
    a.sel_count = ab->sel_count;
    a.sel_stride = ab->sel_stride;
    a.max_blocks = ab->max_blocks;
    a.seq_begin = seq_begin;
    a.seq_end = seq_end;
    a.n_heads = d->n_heads;
    a.r = d->kv_rank;
    a.dr = d->rope_dim;
    a.scale = d->softmax_scale;
    dim3 grid(ab->n_tokens, ceil_div_i(d->n_heads, 4));
    k_mla_sparse_decode<<<grid, 128, 0, st->stream>>>(a);
    CUDA_LAUNCHED(st, "mla_sparse_decode");
}

/* ---------------------------------------------------------------- prefill ---- */

typedef struct sp_args {
    bf16 *out;
    const bf16 *q, *lat, *kv, *cache;
    long ldq;
    const int32_t *seq_start, *ctx_len, *block_table, *sel_pos, *sel_count;
    int max_blocks, sel_stride, g0, g1, c0, CH;
    int H, dn, dr, dv, r;
    float scale;
    int first, last;
    float *state, *acc;
} sp_args;

/* lat[(seq - g0) * CH + (p - c0)] = cache row of position p of seq, for p < ctx. */
__global__ void k_sparse_gather(sp_args a, int W) {
    long ri = blockIdx.x;
    int seq = a.g0 + (int)(ri / a.CH), p = a.c0 + (int)(ri % a.CH);
    if (seq >= a.g1 || p >= a.ctx_len[seq]) return;
    int blk = a.block_table[(long)seq * a.max_blocks + p / DI_KV_BLOCK_SIZE];
    const bf16 *src = a.cache + ((long)blk * DI_KV_BLOCK_SIZE + p % DI_KV_BLOCK_SIZE) * W;
    bf16 *dst = (bf16 *)a.lat + ri * W;
    for (int i = threadIdx.x; i < W; i += blockDim.x) dst[i] = src[i];
}

__global__ void k_mla_sparse_prefill(sp_args a) {
    int qi = blockIdx.x, seq = a.g0 + blockIdx.z, lane = threadIdx.x & 31;
    int h = blockIdx.y * 4 + (threadIdx.x >> 5);
    if (seq >= a.g1 || h >= a.H) return;
    int t0 = a.seq_start[seq], q_len = a.seq_start[seq + 1] - t0;
    if (qi >= q_len) return;
    int ctx = a.ctx_len[seq], t = t0 + qi, pos = ctx - q_len + qi;
    int dn = a.dn, dr = a.dr, dv = a.dv, W = a.r + dr, kvw = dn + dv, H = a.H;
    float q[SP_MAXQ], o[SP_MAXV];
    const bf16 *qh = a.q + (long)t * a.ldq + (long)h * (dn + dr);
#pragma unroll
    for (int i = 0; i < SP_MAXQ; i++) {
        int j = lane + 32 * i;
        q[i] = j < dn + dr ? __bfloat162float(qh[j]) : 0.f;
    }
    long si = (long)t * H + h;
    float m = -INFINITY, l = 0.f;
    if (!a.first) {
        m = a.state[si * 2];
        l = a.state[si * 2 + 1];
    }
#pragma unroll
    for (int i = 0; i < SP_MAXV; i++) {
        int j = lane + 32 * i;
        o[i] = (!a.first && j < dv) ? a.acc[si * dv + j] : 0.f;
    }
    /* the selected positions inside [c0, kend): first index by binary search (list ascending) */
    const int32_t *sel = a.sel_pos + (long)t * a.sel_stride;
    int cnt = a.sel_count[t];
    int kend = min(min(a.c0 + a.CH, ctx), pos + 1);
    int lo = 0, hi = cnt;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (sel[mid] < a.c0) lo = mid + 1;
        else hi = mid;
    }
    for (int k = lo; k < cnt; k++) {
        int p = sel[k];
        if (p >= kend) break;
        long row = (long)(seq - a.g0) * a.CH + (p - a.c0);
        const bf16 *kn = a.kv + row * H * kvw + (long)h * kvw, *kp = a.lat + row * W + a.r;
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < SP_MAXQ; i++) {
            int j = lane + 32 * i;
            if (j < dn) d += q[i] * __bfloat162float(kn[j]);
            else if (j < dn + dr) d += q[i] * __bfloat162float(kp[j - dn]);
        }
        for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
        float sc = a.scale * d, mn = fmaxf(m, sc);
        float corr = expf(m - mn), pr = expf(sc - mn);
        l = l * corr + pr;
#pragma unroll
        for (int i = 0; i < SP_MAXV; i++) {
            int j = lane + 32 * i;
            o[i] = o[i] * corr + (j < dv ? pr * __bfloat162float(kn[dn + j]) : 0.f);
        }
        m = mn;
    }
    if (a.last) {
        float inv = 1.0f / l;
#pragma unroll
        for (int i = 0; i < SP_MAXV; i++) {
            int j = lane + 32 * i;
            if (j < dv) a.out[si * dv + j] = __float2bfloat16_rn(o[i] * inv);
        }
    } else {
        if (lane == 0) {
            a.state[si * 2] = m;
            a.state[si * 2 + 1] = l;
        }
#pragma unroll
        for (int i = 0; i < SP_MAXV; i++) {
            int j = lane + 32 * i;
            if (j < dv) a.acc[si * dv + j] = o[i];
        }
    }
}

void cuda_mla_sparse_prefill(cuda_state *st, void *out, const void *q, int ldq, const void *cache,
                             const di_weight *W_kvb, const di_attn_batch *ab, int seq_begin, int seq_end,
                             const di_mla_dims *d, void *scratch, size_t scratch_bytes) {
    int H = d->n_heads, dn = d->nope_dim, dr = d->rope_dim, dv = d->v_dim, r = d->kv_rank, W = r + dr;
    int kvw = H * (dn + dv);
    DI_ASSERT(W_kvb->rows == kvw && W_kvb->cols == r && W_kvb->n == 1 && ab->sel_count);
    if (seq_end <= seq_begin || ab->n_tokens <= 0) return;
    DI_ASSERT(dv <= 32 * SP_MAXV && dn + dr <= 32 * SP_MAXQ);
    /* carve: state and acc for this step's tokens, then dense rows */
    size_t th = (size_t)ab->n_tokens * H, off = 0;
    char *base = (char *)scratch;
    float *state = (float *)base;
    off += align256(th * 2 * sizeof(float));
    float *acc = (float *)(base + off);
    off += align256(th * dv * sizeof(float));
    size_t row_bytes = ((size_t)W + (size_t)kvw) * 2;
    size_t rest = scratch_bytes > off + 512 ? scratch_bytes - off - 512 : 0;
    size_t cap = rest / row_bytes;
    cap &= ~(size_t)63;
    if (cap > (size_t)1 << 30) cap = (size_t)1 << 30;
    DI_ASSERT(cap >= 64);
    bf16 *lat = (bf16 *)(base + off);
    off += align256(cap * W * 2);
    bf16 *kv = (bf16 *)(base + off);
    int max_ctx = ab->max_ctx_len > 0 ? ab->max_ctx_len : 1;
    int CH = (max_ctx + 63) & ~63;
    if ((size_t)CH > cap) CH = (int)cap;
    int G = (int)(cap / (size_t)CH);
    if (G < 1) G = 1;
    int max_q = ab->max_q_len > 0 ? ab->max_q_len : ab->n_tokens;
    sp_args a;
    a.out = (bf16 *)out;
    a.q = (const bf16 *)q;
    a.lat = lat;
    a.kv = kv;
    a.cache = (const bf16 *)cache;
    a.ldq = ldq;
    a.seq_start = ab->seq_start;
    a.ctx_len = ab->seq_ctx_len;
    a.block_table = ab->block_table;
    a.sel_pos = ab->sel_pos;
    a.sel_count = ab->sel_count;
    a.sel_stride = ab->sel_stride;
    a.max_blocks = ab->max_blocks;
    a.CH = CH;
    a.H = H;
    a.dn = dn;
    a.dr = dr;
    a.dv = dv;
    a.r = r;
    a.scale = d->softmax_scale;
    a.state = state;
    a.acc = acc;
    for (int g0 = seq_begin; g0 < seq_end; g0 += G) {
        int g1 = g0 + G < seq_end ? g0 + G : seq_end, ng = g1 - g0;
        a.g0 = g0;
        a.g1 = g1;
        for (int c0 = 0; c0 < max_ctx; c0 += CH) {
            a.c0 = c0;
            a.first = c0 == 0;
            a.last = c0 + CH >= max_ctx;
            long rows = (long)ng * CH;
            k_sparse_gather<<<(unsigned)rows, 64, 0, st->stream>>>(a, W);
            CUDA_LAUNCHED(st, "mla_sparse_gather");
            cuda_linear(st, kv, kvw, 0, 0, lat, W, W_kvb, (int)rows);
            dim3 grid(max_q, ceil_div_i(H, 4), ng);
            k_mla_sparse_prefill<<<grid, 128, 0, st->stream>>>(a);
            CUDA_LAUNCHED(st, "mla_sparse_prefill");
        }
    }
}
