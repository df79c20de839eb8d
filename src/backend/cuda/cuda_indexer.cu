/* cuda_indexer.cu - DeepSeek-V3.2's lightning indexer on CUDA: the index keys' LayerNorm (with
 * bias) and the per-token top-k selection of the context positions sparse MLA attends to
 * (backend.h: layernorm, indexer_topk, indexer_scratch_bytes).
 *
 * Owner: cuda. Semantics of the CPU backend (cpu_indexer.c, transformers 5.17
 * DeepseekV32Indexer): I[t, s] = Σ_h (w[t,h] · weight_scale) · relu(scale · q[t,h,:] · k_s) in
 * fp32 over s <= pos(t); the min(topk, pos + 1) largest (ties: lower position), written in
 * ascending position order. One block per token: its scores go to an fp32 scratch row, then a
 * radix select over the scores' orderable bits (4 passes of 8 bits, shared-memory integer
 * histograms) finds the k-th largest value and how many of its equals to keep, and an ordered
 * block-wide prefix sum over "selected" flags writes the positions sorted. No host sync, no
 * float atomics (the score of a position is summed in a fixed order), so results are
 * deterministic. Scratch: rows of max_ctx floats for up to IX_MAX_ROWS tokens at a time (the op
 * loops over token chunks; the chunking depends on the token count only).
 *
 * Fast path (head_dim 128, heads a multiple of 16 up to 128: V3.2's 64 x 128), two kernels:
 *  - k_ix_scores: one block per (context chunk of IXF_CH positions, token): q[t] (all heads)
 *    and the chunk's keys through shared memory (cp.async), S = q · Kᵀ on tensor cores
 *    (mma.sync bf16 -> fp32; warp w owns 16 positions, loops over the 16-head tiles), then
 *    Σ_h w_h·ws·relu(scale·S) per position in a fixed order (per thread, then a fixed
 *    shuffle tree over the head lanes) into the scratch row;
 *  - k_ix_select: one block of 1024 threads per token over its scratch row: the same radix
 *    select (warp-aggregated histogram atomics, parallel bin search) and an ordered write-out
 *    where each warp owns a contiguous run of positions (lanes over consecutive positions,
 *    ballots for the ranks; the runs' counts combined through shared memory). Same selection
 *    rules as the one-kernel version (kept for other shapes). Rows of up to IXS_SMEM_MAX floats
 *    (contexts up to 48K) are first copied into shared memory, so the 4 histogram passes and
 *    the 2 write-out passes read shared memory; longer rows are read from global memory. */
#include <math.h>

#include "backend/cuda/cuda_mma.cuh"

enum { IX_THREADS = 256, IX_WARPS = IX_THREADS / 32, IX_MAX_ROWS = 512 };

/* ---------------------------------------------------------------- layernorm ---- */

/* One block per row; out may alias x (each thread reads its elements before any write). T: the
 * activation type (bf16, or float for the f32 op table). */
template <typename T>
__global__ void k_layernorm(T *out, long ldo, const T *x, long ldx, const float *w, const float *b, float eps, int D) {
    __shared__ double red[32];
    extern __shared__ float row[]; /* [D] */
    const T *xr = x + (long)blockIdx.x * ldx;
    double s = 0.0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = ld_f(xr + i);
        row[i] = v;
        s += v;
    }
    double mean = block_sum(s, red) / D;
    double v2 = 0.0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        double d = (double)row[i] - mean;
        v2 += d * d;
    }
    double var = block_sum(v2, red) / D;
    float inv = (float)(1.0 / sqrt(var + (double)eps)), mf = (float)mean;
    T *o = out + (long)blockIdx.x * ldo;
    for (int i = threadIdx.x; i < D; i += blockDim.x) st_f(o + i, (row[i] - mf) * inv * w[i] + b[i]);
}

void cuda_layernorm(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w,
                    const di_weight *b, float eps, int T, int D) {
    cuda_state *st = cst(be);
    DI_ASSERT(w->dtype == DI_DTYPE_F32 && b->dtype == DI_DTYPE_F32 && w->cols == D && b->cols == D);
    if (T <= 0) return;
    int th = 32;
    while (th < 256 && th < D) th *= 2;
    if (st->f32)
        k_layernorm<float><<<T, th, (size_t)D * sizeof(float), st->stream>>>(
            (float *)out, ldo, (const float *)x, ldx, (const float *)w->data, (const float *)b->data, eps, D);
    else
        k_layernorm<bf16><<<T, th, (size_t)D * sizeof(float), st->stream>>>(
            (bf16 *)out, ldo, (const bf16 *)x, ldx, (const float *)w->data, (const float *)b->data, eps, D);
    CUDA_LAUNCHED(st, "layernorm");
}

/* ---------------------------------------------------------------- top-k ---- */

typedef struct ix_args {
    int32_t *sel_pos, *sel_count;
    const void *q, *kc; /* bf16 (or f32 for the f32 op table: the generic kernel only) */
    const float *w;
    const int32_t *seq_start, *ctx_len, *block_table;
    int max_blocks, seq_begin, seq_end, nh, hd, topk;
    float scale, wscale;
    float *scores; /* [gridDim.x][ld] */
    long ld;
    int t0;        /* token of block 0 */
    int stage;     /* k_ix_select: copy the scratch row into shared memory first (ld floats fit) */
} ix_args;


/* Orderable key of a score: larger float -> larger unsigned (-0 counted as +0, as the CPU's
 * float comparisons do). */
static __device__ __forceinline__ unsigned ix_key(float f) {
    if (f == 0.0f) f = 0.0f;
    unsigned u = __float_as_uint(f);
    return u ^ ((u & 0x80000000u) ? 0xffffffffu : 0x80000000u);
}

/* Exclusive prefix sum of v over the block in thread order; *tot = the block's total. Every
 * thread of the block must call it. */
static __device__ int ix_block_scan(int v, int *tot, int *wsum) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads(); /* the previous call's readers of wsum are done */
    if (lane == 31) wsum[w] = x;
    __syncthreads();
    int pre = 0, all = 0;
    for (int i = 0; i < IX_WARPS; i++) {
        if (i < w) pre += wsum[i];
        all += wsum[i];
    }
    *tot = all;
    return pre + x - v;
}

template <typename T>
__global__ void __launch_bounds__(IX_THREADS) k_indexer_topk(ix_args a) {
    extern __shared__ float ism[]; /* q [nh][hd + 1], w·weight_scale [nh], one key row per warp [IX_WARPS][hd] */
    __shared__ int hist[256];
    __shared__ int wsum[IX_WARPS];
    __shared__ int s_digit, s_want;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t = a.t0 + blockIdx.x;
    const int seq = seq_of(a.seq_start, a.seq_begin, a.seq_end, t);
    if (seq < 0) return;
    const int pos = token_pos(a.seq_start, a.ctx_len, seq, t);
    const int K = a.topk, n = pos + 1, nh = a.nh, hd = a.hd, ldq = hd + 1;
    int32_t *out = a.sel_pos + (long)t * K;
    if (n <= K) { /* everything is selected */
        for (int s = tid; s < n; s += IX_THREADS) out[s] = s;
        if (tid == 0) a.sel_count[t] = n;
        return;
    }
    float *qs = ism, *ws = qs + nh * ldq, *kw = ws + nh + warp * hd;
    const T *aq = (const T *)a.q, *akc = (const T *)a.kc;
    for (int i = tid; i < nh * hd; i += IX_THREADS) qs[(i / hd) * ldq + i % hd] = ld_f(aq + (long)t * nh * hd + i);
    for (int h = tid; h < nh; h += IX_THREADS) ws[h] = a.w[(long)t * nh + h] * a.wscale;
    __syncthreads();

    /* scores: one warp per position, lanes over heads (q rows padded: conflict-free) */
    float *score = a.scores + (long)blockIdx.x * a.ld;
    for (int s = warp; s < n; s += IX_WARPS) {
        int blk = a.block_table[(long)seq * a.max_blocks + s / DI_KV_BLOCK_SIZE];
        const T *k = akc + ((long)blk * DI_KV_BLOCK_SIZE + s % DI_KV_BLOCK_SIZE) * hd;
        for (int j = lane; j < hd; j += 32) kw[j] = ld_f(k + j);
        __syncwarp();
        float acc = 0.f;
        for (int h = lane; h < nh; h += 32) {
            const float *qh = qs + h * ldq;
            float d = 0.f;
            for (int j = 0; j < hd; j++) d = fmaf(qh[j], kw[j], d);
            d *= a.scale;
            acc += ws[h] * (d > 0.f ? d : 0.f);
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) score[s] = acc;
        __syncwarp();
    }
    __syncthreads();

    /* radix select: the K-th largest key (prefix), and how many keys equal to it to keep (want) */
    unsigned prefix = 0, mask = 0;
    int want = K;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += IX_THREADS) hist[i] = 0;
        __syncthreads();
        for (int s = tid; s < n; s += IX_THREADS) {
            unsigned u = ix_key(score[s]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255], 1);
        }
        __syncthreads();
        if (tid == 0) {
            int cum = 0, b = 255;
            for (; b > 0; b--) {
                if (cum + hist[b] >= want) break;
                cum += hist[b];
            }
            s_digit = b;
            s_want = want - cum;
        }
        __syncthreads();
        prefix |= (unsigned)s_digit << shift;
        mask |= 255u << shift;
        want = s_want;
    }

    /* ascending output: keys above the threshold, and the first `want` equal ones */
    int carry_eq = 0, carry_sel = 0;
    for (int base = 0; base < n; base += IX_THREADS) {
        int s = base + tid;
        unsigned u = s < n ? ix_key(score[s]) : 0u;
        int gt = s < n && u > prefix, eq = s < n && u == prefix, tot;
        int eq_ex = ix_block_scan(eq, &tot, wsum);
        int sel = gt || (eq && carry_eq + eq_ex < want);
        carry_eq += tot;
        int sel_ex = ix_block_scan(sel, &tot, wsum);
        if (sel) out[carry_sel + sel_ex] = s;
        carry_sel += tot;
    }
    if (tid == 0) a.sel_count[t] = K;
}

/* ---------------------------------------------------------------- fast path ---- */

enum { IXF_HD = 128, IXF_LD = IXF_HD + 8, IXF_CH = 128, IXF_THREADS = 256, IXS_THREADS = 1024 };
enum { IXS_SMEM_MAX = 48 * 1024 }; /* floats of a scratch row k_ix_select stages in shared memory */

static size_t ixf_smem(int nh) { return ((size_t)nh + IXF_CH) * IXF_LD * 2 + (size_t)nh * 4; }

/* grid (context chunk, token - t0); tokens with pos < topk and chunks past pos exit */
__global__ void __launch_bounds__(IXF_THREADS) k_ix_scores(ix_args a) {
    extern __shared__ __align__(16) unsigned char ixs[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const int t = a.t0 + blockIdx.y;
    const int seq = seq_of(a.seq_start, a.seq_begin, a.seq_end, t);
    if (seq < 0) return;
    const int n = token_pos(a.seq_start, a.ctx_len, seq, t) + 1, nh = a.nh;
    const int c0 = blockIdx.x * IXF_CH;
    if (n <= a.topk || c0 >= n) return;
    bf16 *Qs = (bf16 *)ixs, *Ks = Qs + nh * IXF_LD;
    float *ws = (float *)(Ks + IXF_CH * IXF_LD);
    for (int c = tid; c < nh * 16; c += IXF_THREADS) {
        int i = c >> 4, ch = c & 15;
        cp_async16(Qs + i * IXF_LD + ch * 8, (const bf16 *)a.q + ((long)t * nh + i) * IXF_HD + ch * 8, 16);
    }
    for (int c = tid; c < IXF_CH * 16; c += IXF_THREADS) {
        int rr = c >> 4, ch = c & 15, s = c0 + rr;
        const bf16 *src = (const bf16 *)a.kc;
        if (s < n) {
            int blk = a.block_table[(long)seq * a.max_blocks + s / DI_KV_BLOCK_SIZE];
            src = (const bf16 *)a.kc + ((long)blk * DI_KV_BLOCK_SIZE + s % DI_KV_BLOCK_SIZE) * IXF_HD + ch * 8;
        }
        cp_async16(Ks + rr * IXF_LD + ch * 8, src, s < n ? 16 : 0);
    }
    cp_async_commit();
    for (int h = tid; h < nh; h += IXF_THREADS) ws[h] = a.w[(long)t * nh + h] * a.wscale;
    cp_async_wait<0>();
    __syncthreads();

    /* warp: positions c0 + warp*16 .. +15 as two n-tiles; rows = heads, 16 per m-tile */
    float acc[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
    const int nmt = nh / 16;
    for (int mt = 0; mt < nmt; mt++) {
        float c[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int ks = 0; ks < IXF_HD / 16; ks++) {
            uint32_t af[4], bfr[4];
            ldsm_x4(af, Qs + (mt * 16 + (lane & 15)) * IXF_LD + ks * 16 + (lane >> 4) * 8);
            ldsm_x4(bfr, Ks + (warp * 16 + (lane & 7) + ((lane >> 4) & 1) * 8) * IXF_LD + ks * 16 + ((lane >> 3) & 1) * 8);
            mma16816(c[0], af[0], af[1], af[2], af[3], bfr[0], bfr[1]);
            mma16816(c[1], af[0], af[1], af[2], af[3], bfr[2], bfr[3]);
        }
        float wl = ws[mt * 16 + g], wh = ws[mt * 16 + g + 8];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float dl = c[j][e] * a.scale, dh = c[j][2 + e] * a.scale;
                acc[j][e] += wl * (dl > 0.f ? dl : 0.f);
                acc[j][e] += wh * (dh > 0.f ? dh : 0.f);
            }
    }
    /* sum over the 8 head lanes (g) of each column: a fixed tree */
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e = 0; e < 2; e++)
            for (int o = 4; o < 32; o <<= 1) acc[j][e] += __shfl_xor_sync(0xffffffffu, acc[j][e], o);
    if (g == 0) {
        float *score = a.scores + (long)blockIdx.y * a.ld;
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int s = c0 + warp * 16 + j * 8 + 2 * t4 + e;
                if (s < n) score[s] = acc[j][e];
            }
    }
}

/* one block (IXS_THREADS) per token: radix select over its scratch row, ordered write-out */
__global__ void __launch_bounds__(IXS_THREADS, 1) k_ix_select(ix_args a) {
    __shared__ int hist[256];
    __shared__ int wsum[32], wgt_eq[32];
    __shared__ int s_digit, s_want;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t = a.t0 + blockIdx.x;
    const int seq = seq_of(a.seq_start, a.seq_begin, a.seq_end, t);
    if (seq < 0) return;
    const int n = token_pos(a.seq_start, a.ctx_len, seq, t) + 1, K = a.topk;
    int32_t *out = a.sel_pos + (long)t * K;
    if (n <= K) { /* everything is selected */
        for (int s = tid; s < n; s += IXS_THREADS) out[s] = s;
        if (tid == 0) a.sel_count[t] = n;
        return;
    }
    const float *score = a.scores + (long)blockIdx.x * a.ld;
    if (a.stage) { /* the row once into shared memory (16-byte loads; ld is a multiple of 64) */
        extern __shared__ float4 srow[];
        const float4 *g4 = (const float4 *)score;
        for (int i = tid; i < (n + 3) / 4; i += IXS_THREADS) srow[i] = g4[i];
        __syncthreads();
        score = (const float *)srow;
    }
    unsigned prefix = 0, mask = 0;
    int want = K;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += IXS_THREADS) hist[i] = 0;
        __syncthreads();
        for (int base = 0; base < n; base += IXS_THREADS) { /* uniform trip count: full warps */
            int s = base + tid;
            unsigned u = s < n ? ix_key(score[s]) : 0u;
            int bin = s < n && (u & mask) == prefix ? (int)((u >> shift) & 255) : 256;
            unsigned same = __match_any_sync(0xffffffffu, bin);
            if (bin < 256 && lane == __ffs(same) - 1) atomicAdd(&hist[bin], __popc(same));
        }
        __syncthreads();
        if (warp == 0) { /* lane l: bins 255 - 8l down to 248 - 8l; first lane reaching want */
            int c[8], sum = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                c[i] = hist[255 - 8 * lane - i];
                sum += c[i];
            }
            int inc = sum;
            for (int o = 1; o < 32; o <<= 1) {
                int y = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += y;
            }
            unsigned hit = __ballot_sync(0xffffffffu, inc >= want);
            if (lane == __ffs(hit) - 1) {
                int cum = inc - sum, b = 255 - 8 * lane;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    if (cum + c[i] >= want) break;
                    cum += c[i];
                    b--;
                }
                s_digit = b;
                s_want = want - cum;
            }
        }
        __syncthreads();
        prefix |= (unsigned)s_digit << shift;
        mask |= 255u << shift;
        want = s_want;
    }

    /* each warp owns a contiguous run of positions (coalesced, lanes over 32 consecutive ones):
     * keys above the threshold, and the first `want` equal ones in position order */
    const int nw = IXS_THREADS / 32, wseg = (n + 32 * nw - 1) / (32 * nw) * 32;
    const int b0 = min(n, warp * wseg), b1 = min(n, b0 + wseg);
    const unsigned lt = (1u << lane) - 1u;
    int ngt = 0, neq = 0;
    for (int base = b0; base < b1; base += 32) {
        int s = base + lane;
        unsigned u = s < b1 ? ix_key(score[s]) : 0u;
        ngt += __popc(__ballot_sync(0xffffffffu, s < b1 && u > prefix));
        neq += __popc(__ballot_sync(0xffffffffu, s < b1 && u == prefix));
    }
    if (lane == 0) {
        wsum[warp] = ngt;
        wgt_eq[warp] = neq;
    }
    __syncthreads();
    int e = 0, o = 0; /* equal keys and selected keys before this warp's run */
    for (int i = 0; i < warp; i++) {
        int keep = want - e;
        keep = keep < 0 ? 0 : keep > wgt_eq[i] ? wgt_eq[i] : keep;
        o += wsum[i] + keep;
        e += wgt_eq[i];
    }
    for (int base = b0; base < b1; base += 32) {
        int s = base + lane;
        unsigned u = s < b1 ? ix_key(score[s]) : 0u;
        bool gt = s < b1 && u > prefix, eq = s < b1 && u == prefix;
        unsigned eqm = __ballot_sync(0xffffffffu, eq);
        bool sel = gt || (eq && e + __popc(eqm & lt) < want);
        unsigned selm = __ballot_sync(0xffffffffu, sel);
        if (sel) out[o + __popc(selm & lt)] = s;
        o += __popc(selm);
        e += __popc(eqm);
    }
    if (tid == 0) a.sel_count[t] = K;
}

static long ix_ld(int max_ctx) { return ((long)(max_ctx > 0 ? max_ctx : 1) + 63) & ~63L; }

size_t cuda_indexer_scratch_bytes(di_backend *be, int max_tokens, int max_ctx) {
    (void)be;
    long rows = max_tokens < IX_MAX_ROWS ? max_tokens : IX_MAX_ROWS;
    if (rows < 1) rows = 1;
    return (size_t)rows * ix_ld(max_ctx) * sizeof(float) + 256;
}

/* Shared memory of the generic kernel (k_indexer_topk): q [nh][hd + 1], the head weights [nh],
 * one key row per warp */
size_t cuda_indexer_generic_smem(const di_indexer_dims *d) {
    return ((size_t)d->n_heads * (d->head_dim + 1) + d->n_heads + (size_t)IX_WARPS * d->head_dim) * sizeof(float);
}

/* Whether the bf16 fast kernels serve these dims (q and the cache 16-byte aligned besides) */
static int fast_dims(const di_indexer_dims *d) {
    return d->head_dim == IXF_HD && d->n_heads % 16 == 0 && d->n_heads > 0 && d->n_heads <= 128;
}

void cuda_indexer_topk(di_backend *be, int32_t *sel_pos, int32_t *sel_count, const void *q, const float *w,
                       const void *index_cache, const di_attn_batch *ab, int seq_begin, int seq_end,
                       const di_indexer_dims *d, void *scratch, size_t scratch_bytes) {
    cuda_state *st = cst(be);
    if (seq_end <= seq_begin || ab->n_tokens <= 0) return;
    ix_args a;
    a.ld = ix_ld(ab->max_ctx_len);
    long fit = (long)(scratch_bytes / ((size_t)a.ld * sizeof(float)));
    DI_ASSERT(fit >= 1);
    if (fit > IX_MAX_ROWS) fit = IX_MAX_ROWS;
    a.sel_pos = sel_pos;
    a.sel_count = sel_count;
    a.q = q;
    a.kc = index_cache;
    a.w = w;
    a.seq_start = ab->seq_start;
    a.ctx_len = ab->seq_ctx_len;
    a.block_table = ab->block_table;
    a.max_blocks = ab->max_blocks;
    a.seq_begin = seq_begin;
    a.seq_end = seq_end;
    a.nh = d->n_heads;
    a.hd = d->head_dim;
    a.topk = d->topk;
    a.scale = d->scale;
    a.wscale = d->weight_scale;
    a.scores = (float *)scratch;
    a.stage = 0;
    int fast = !st->f32 && fast_dims(d) && ((uintptr_t)q & 15) == 0 && ((uintptr_t)index_cache & 15) == 0;
    if (fast) {
        size_t fsm = ixf_smem(d->n_heads);
        static size_t fsm_set = 48 * 1024;
        if (fsm > fsm_set) {
            if (cuda_note(st, cudaFuncSetAttribute(k_ix_scores, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fsm),
                          "indexer scores smem attribute"))
                return;
            fsm_set = fsm;
        }
        a.stage = a.ld <= IXS_SMEM_MAX;
        size_t ssm = a.stage ? (size_t)a.ld * sizeof(float) : 0;
        static size_t ssm_set = 48 * 1024;
        if (ssm > ssm_set) {
            if (cuda_note(st, cudaFuncSetAttribute(k_ix_select, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)(IXS_SMEM_MAX * sizeof(float))),
                          "indexer select smem attribute"))
                return;
            ssm_set = IXS_SMEM_MAX * sizeof(float);
        }
        int max_ctx = ab->max_ctx_len > 0 ? ab->max_ctx_len : 1;
        unsigned nch = (unsigned)((max_ctx + IXF_CH - 1) / IXF_CH);
        for (int t0 = 0; t0 < ab->n_tokens; t0 += (int)fit) {
            int nt = ab->n_tokens - t0 < fit ? ab->n_tokens - t0 : (int)fit;
            a.t0 = t0;
            k_ix_scores<<<dim3(nch, (unsigned)nt), IXF_THREADS, fsm, st->stream>>>(a);
            CUDA_LAUNCHED(st, "indexer_scores");
            k_ix_select<<<nt, IXS_THREADS, ssm, st->stream>>>(a);
            CUDA_LAUNCHED(st, "indexer_select");
        }
        return;
    }
    size_t smem = cuda_indexer_generic_smem(d);
    static size_t smem_set = 48 * 1024;
    if (smem > smem_set) {
        DI_ASSERT(smem <= CUDA_MAX_SMEM); /* cuda_limits.cu refused such models at load */
        if (cuda_note(st, cudaFuncSetAttribute(k_indexer_topk<bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                      "indexer smem attribute") ||
            cuda_note(st, cudaFuncSetAttribute(k_indexer_topk<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                      "indexer smem attribute"))
            return;
        smem_set = smem;
    }
    for (int t0 = 0; t0 < ab->n_tokens; t0 += (int)fit) {
        int nt = ab->n_tokens - t0 < fit ? ab->n_tokens - t0 : (int)fit;
        a.t0 = t0;
        if (st->f32) k_indexer_topk<float><<<nt, IX_THREADS, smem, st->stream>>>(a);
        else k_indexer_topk<bf16><<<nt, IX_THREADS, smem, st->stream>>>(a);
        CUDA_LAUNCHED(st, "indexer_topk");
    }
}
