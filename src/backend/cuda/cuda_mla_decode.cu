/* cuda_mla_decode.cu - weight-absorbed MLA decode attention over the paged latent cache:
 *   score_{t,h,s} = σ (q̃[t,h,:] · c_s + q_pe[t,h,:] · k_pe_s),  s <= pos(t)
 *   out[t,h,:]    = Σ_s softmax_s(score) c_s
 *
 * Owner: cuda. Three kernels:
 *  - wgmma (heads a multiple of 64, r = 512, rope 64; the default there, DEEPINFER_CUDA_MLA_WGMMA=0
 *    falls back to the fast kernel): cuda_mla_decode_wgmma.cu, 64-key tiles, one wave of blocks;
 *  - fast (r = 512, rope 64, heads a multiple of 16; DeepSeek V2/V3 shapes), FlashMLA-like:
 *    one block per (token, group of R <= 64 heads, KV split); the block streams 32-key tiles
 *    of its token's context through shared memory (cp.async, double buffered) once for all R
 *    heads; S = Q·Kᵀ (576-wide) and O += P·V (V = the first 512 columns of the same tile) on
 *    tensor cores (mma.sync), online softmax in fp32 with P rounded to bf16. Blocks of the same
 *    (token, split) but different head groups are adjacent in the grid, so a second head group
 *    reads the tiles from L2. With several splits, fp32 partials (m, l, O) go to the reserved
 *    workspace and k_mla_combine merges them.
 *    With a DSA selection (V3.2, ab->sel_pos) the same kernel (template flag SP) walks the
 *    token's selected list instead of positions 0..pos: key j of token t is context position
 *    sel_pos[t * sel_stride + j], j < sel_count[t] (ascending, all <= pos: no causal mask); the
 *    block first resolves its split's keys to cache slots (block table) into shared memory,
 *    then loads each 32-key tile row by row from those slots. Splits over the list: the dense
 *    split count capped at ceil(ceil(sel_stride / 32) / DEEPINFER_CUDA_SPARSE_MIN_TILES)
 *    (host-known shapes only; default 2 tiles per split, measured best at 1 token), merged by
 *    k_mla_combine (its SP flavour counts the splits from the selection). Shapes the fast
 *    kernel does not take (or more than SP_MAXKEYS keys per split) go to the generic kernel
 *    walking the list.
 *    Dense steps load early (DEEPINFER_CUDA_MLA_EARLY, default on; the kernel is then launched
 *    with PDL): the step's metadata (sequence, context length, block table: uploaded before the
 *    step's first kernel) and the first tile's rows of earlier steps' keys before the PDL wait,
 *    q and the rows this step's rope_kv_write wrote after it. Same bits either way.
 *  - generic: one warp per (token, head), any shape (tiny test models); over the token's
 *    selected positions when there is a DSA selection.
 * Also mla_decode_uv (backend.h: decode + the W_UV bmm): at one token with split KV, k_mla_uv
 * merges the splits inside the W_UV GEMV (k_mla_combine's merge, k_gemv's arithmetic: the
 * same bits as combine + bmm) instead of launching k_mla_combine.
 * Invariants: the split count depends only on the number of tokens (never on context lengths),
 * so a captured decode step replays correctly for any context; cache rows past a token's
 * position are never read into the result (masked to -inf and zero-filled). */
#include <math.h>

#include "backend/cuda/cuda_mla_decode.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_wload.cuh"

/* DSA selection, a separate kernel parameter of the SP kernels (dense: zeros; keeping it out of
 * dec_args leaves the dense kernels' code as it was) */
typedef struct dec_sel {
    const int32_t *sel_pos, *sel_count;
    int sel_stride;
} dec_sel;

/* Number of keys token t attends to: pos + 1 (dense) or its selection count (SP). */
template <bool SP>
static __device__ __forceinline__ int dec_nkeys(const dec_args &a, const dec_sel &sp, int seq, int t) {
    if (SP) return sp.sel_count[t];
    return token_pos(a.seq_start, a.ctx_len, seq, t) + 1;
}

/* ---------------------------------------------------------------- generic ---- */

enum { GEN_MAXR = 16, GEN_MAXDR = 4 }; /* per-lane registers: r <= 512, rope <= 128 */

/* The widest latent and rope the decode kernels serve: the generic kernel's (the fast ones need
 * r = 512, rope 64, which it covers too); checked at model load (cuda_limits.cu) */
void cuda_mla_decode_limits(int *max_rank, int *max_rope) {
    *max_rank = 32 * GEN_MAXR;
    *max_rope = 32 * GEN_MAXDR;
}

/* One warp per (token, head) over the token's keys: positions 0..pos, or with a DSA selection
 * (sp.sel_pos) the token's listed positions. */
__global__ void k_mla_decode_generic(dec_args a, dec_sel sp) {
    pdl_launch_dependents();
    pdl_wait(); /* PDL (cuda_pdl.cuh): everything below reads the step's data */
    int t = blockIdx.x, h = blockIdx.y * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    int seq = seq_of(a.seq_start, a.seq_begin, a.seq_end, t);
    if (seq < 0 || h >= a.n_heads) return;
    int pos = token_pos(a.seq_start, a.ctx_len, seq, t);
    int r = a.r, dr = a.dr, W = r + dr, H = a.n_heads;
    float q[GEN_MAXR], qp[GEN_MAXDR], acc[GEN_MAXR];
#pragma unroll
    for (int i = 0; i < GEN_MAXR; i++) {
        int j = lane + 32 * i;
        q[i] = j < r ? __bfloat162float(a.qt[((long)t * H + h) * r + j]) : 0.f;
        acc[i] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < GEN_MAXDR; i++) {
        int j = lane + 32 * i;
        qp[i] = j < dr ? __bfloat162float(a.qpe[(long)t * a.ldqpe + (long)h * a.hsqpe + j]) : 0.f;
    }
    float m = -INFINITY, l = 0.f;
    const int32_t *sel = sp.sel_pos ? sp.sel_pos + (long)t * sp.sel_stride : NULL;
    int nkeys = sel ? sp.sel_count[t] : pos + 1;
    for (int k = 0; k < nkeys; k++) {
        const bf16 *c = a.cache + cache_slot(a, seq, sel ? sel[k] : k) * W;
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < GEN_MAXR; i++) {
            int j = lane + 32 * i;
            if (j < r) d += q[i] * __bfloat162float(c[j]);
        }
#pragma unroll
        for (int i = 0; i < GEN_MAXDR; i++) {
            int j = lane + 32 * i;
            if (j < dr) d += qp[i] * __bfloat162float(c[r + j]);
        }
        for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        float sc = a.scale * d, mn = fmaxf(m, sc);
        float corr = expf(m - mn), p = expf(sc - mn);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < GEN_MAXR; i++) {
            int j = lane + 32 * i;
            acc[i] = acc[i] * corr + (j < r ? p * __bfloat162float(c[j]) : 0.f);
        }
        m = mn;
    }
    float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < GEN_MAXR; i++) {
        int j = lane + 32 * i;
        if (j < r) a.out[((long)t * H + h) * r + j] = __float2bfloat16_rn(acc[i] * inv);
    }
}

/* ---------------------------------------------------------------- fast ---- */

enum { FD = 576, FDV = 512, FKT = 32, FLD = 584 };
enum { SP_MAXKEYS = 8192 }; /* sparse: most selected keys one split resolves into shared memory */

template <int R, int NW>
struct dec_smem {
    static constexpr int q = R * FLD * 2;
    static constexpr int k = FKT * FLD * 2;
    static constexpr int p = R * (FKT + 8) * 2;
    static constexpr int cw = NW / (R / 16);
    static constexpr int total = q + 2 * k + p + 2 * cw * R * 4;
};

template <int R, int NW, bool SP>
__global__ void __launch_bounds__(NW * 32, 1) k_mla_decode_fast(dec_args a, dec_sel sp) {
    typedef dec_smem<R, NW> L;
    constexpr int RW = R / 16, CW = NW / RW, KPW = FKT / CW, NJS = KPW / 8, OCOLS = FDV / CW, NJO = OCOLS / 8;
    static_assert(KPW % 8 == 0 && NJO % 2 == 0, "tile split");
    extern __shared__ __align__(16) unsigned char sm[];
    pdl_launch_dependents();
    /* early (dense only): the step's metadata (uploaded before its first kernel) and the cache
     * rows of earlier steps are read before the wait; q and this step's cache rows after it */
    const bool early = !SP && a.early;
    if (!early) pdl_wait(); /* PDL (cuda_pdl.cuh): everything below reads the step's data */
    bf16 *Qs = (bf16 *)sm, *Ks0 = (bf16 *)(sm + L::q), *Ps = (bf16 *)(sm + L::q + 2 * L::k);
    float *redm = (float *)(sm + L::q + 2 * L::k + L::p), *redl = redm + CW * R;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    /* block = hg + n_hg * (split + nsplit * t): head groups of one (token, split) adjacent */
    const int H = a.n_heads, n_hg = H / R;
    const int hg = blockIdx.x % n_hg, split = (blockIdx.x / n_hg) % a.nsplit, t = blockIdx.x / (n_hg * a.nsplit);
    int seq = seq_of(a.seq_start, a.seq_begin, a.seq_end, t);
    int nkeys = seq < 0 ? 0 : dec_nkeys<SP>(a, sp, seq, t), ntiles = (nkeys + FKT - 1) / FKT;
    int tps = split_tiles(a, ntiles);
    int tb = split * tps, te = min(ntiles, tb + tps);
    const int h0 = hg * R;
    const int rg = warp % RW, cg = warp / RW;

    if (seq < 0 || tb >= te) { /* split past the context: k_mla_combine skips it */
        if (early) pdl_wait();
        return;
    }

    int *slots = (int *)(sm + L::total); /* SP: cache slot of each key of this split */
    if (SP) {
        const int32_t *sel = sp.sel_pos + (long)t * sp.sel_stride;
        int j0 = tb * FKT, j1 = min(nkeys, te * FKT);
#pragma unroll 4
        for (int j = j0 + tid; j < j1; j += NW * 32) slots[j - j0] = (int)cache_slot(a, seq, sel[j]);
        __syncthreads();
    }

    /* Q tile: q̃ (512) then q_pe (64) for R heads */
    auto load_q = [&]() {
        for (int c = tid; c < R * 72; c += NW * 32) {
            int i = c / 72, ch = c % 72, h = h0 + i;
            const bf16 *src = ch < 64 ? a.qt + ((long)t * H + h) * FDV + ch * 8
                                      : a.qpe + (long)t * a.ldqpe + (long)h * a.hsqpe + (ch - 64) * 8;
            cp_async16(Qs + i * FLD + ch * 8, src, 16);
        }
    };
    /* rows [r0, r1) of tile ti (rows past the context zero-filled) */
    auto load_rows = [&](int ti, int buf, int r0, int r1) {
        bf16 *Ks = Ks0 + buf * FKT * FLD;
        int key0 = ti * FKT;
        long slot0 = cache_slot(a, seq, key0); /* a 32-key tile lies inside one 64-slot block */
        for (int c = tid + r0 * 72; c < r1 * 72; c += NW * 32) {
            int rr = c / 72, ch = c % 72;
            bool ok = key0 + rr < nkeys;
            const bf16 *src = a.cache + (slot0 + rr) * FD + ch * 8;
            cp_async16(Ks + rr * FLD + ch * 8, ok ? (const void *)src : (const void *)a.cache, ok ? 16 : 0);
        }
    };
    auto load_tile = [&](int ti, int buf) { load_rows(ti, buf, 0, FKT); };
    auto load_tile_sp = [&](int ti, int buf) { /* rows from the resolved slots */
        bf16 *Ks = Ks0 + buf * FKT * FLD;
        int key0 = ti * FKT;
        for (int c = tid; c < FKT * 72; c += NW * 32) {
            int rr = c / 72, ch = c % 72;
            bool ok = key0 + rr < nkeys;
            const bf16 *src = ok ? a.cache + (long)slots[key0 + rr - tb * FKT] * FD + ch * 8 : a.cache;
            cp_async16(Ks + rr * FLD + ch * 8, src, ok ? 16 : 0);
        }
    };
    if constexpr (SP) {
        load_q();
        load_tile_sp(tb, 0);
    } else if (early) { /* the first tile's rows of earlier steps, the wait, then the rest */
        int first_new = token_pos(a.seq_start, a.ctx_len, seq, a.seq_start[seq]); /* this step's first key */
        int old = min(FKT, max(0, first_new - tb * FKT));
        load_rows(tb, 0, 0, old);
        pdl_wait();
        load_q();
        load_rows(tb, 0, old, FKT);
    } else {
        load_q();
        load_tile(tb, 0);
    }
    cp_async_commit();

    float o[NJO][4];
#pragma unroll
    for (int j = 0; j < NJO; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
    const int row_lo = rg * 16 + g, row_hi = row_lo + 8;

    for (int ti = tb; ti < te; ti++) {
        int buf = (ti - tb) & 1;
        cp_async_wait<0>();
        __syncthreads();
        if (ti + 1 < te) {
            if constexpr (SP) load_tile_sp(ti + 1, buf ^ 1);
            else load_tile(ti + 1, buf ^ 1);
        }
        cp_async_commit();
        const bf16 *Ks = Ks0 + buf * FKT * FLD;
        /* S = Q Kᵀ for rows rg*16.., keys cg*KPW.. */
        float s[NJS][4];
#pragma unroll
        for (int j = 0; j < NJS; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll 4
        for (int ks = 0; ks < FD / 16; ks++) {
            uint32_t af[4];
            ldsm_x4(af, Qs + (rg * 16 + (lane & 15)) * FLD + ks * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int j = 0; j < NJS; j++) {
                uint32_t bfr[2];
                ldsm_x2(bfr, Ks + (cg * KPW + j * 8 + (lane & 7)) * FLD + ks * 16 + ((lane >> 3) & 1) * 8);
                mma16816(s[j], af[0], af[1], af[2], af[3], bfr[0], bfr[1]);
            }
        }
        /* scale, mask, tile row max */
        float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
        for (int j = 0; j < NJS; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int key = ti * FKT + cg * KPW + j * 8 + 2 * t4 + (c & 1);
                float v = key < nkeys ? s[j][c] * a.scale : -INFINITY;
                s[j][c] = v;
                if (c < 2) mx_lo = fmaxf(mx_lo, v);
                else mx_hi = fmaxf(mx_hi, v);
            }
        for (int off = 1; off <= 2; off <<= 1) {
            mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
            mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
        }
        if (t4 == 0) {
            redm[cg * R + row_lo] = mx_lo;
            redm[cg * R + row_hi] = mx_hi;
        }
        __syncthreads();
        float tm_lo = -INFINITY, tm_hi = -INFINITY;
#pragma unroll
        for (int c = 0; c < CW; c++) {
            tm_lo = fmaxf(tm_lo, redm[c * R + row_lo]);
            tm_hi = fmaxf(tm_hi, redm[c * R + row_hi]);
        }
        float mn_lo = fmaxf(m_lo, tm_lo), mn_hi = fmaxf(m_hi, tm_hi); /* finite: key0 of the tile is valid */
        float corr_lo = expf(m_lo - mn_lo), corr_hi = expf(m_hi - mn_hi);
        m_lo = mn_lo;
        m_hi = mn_hi;
        l_lo *= corr_lo;
        l_hi *= corr_hi;
#pragma unroll
        for (int j = 0; j < NJS; j++) {
            float p0 = expf(s[j][0] - mn_lo), p1 = expf(s[j][1] - mn_lo);
            float p2 = expf(s[j][2] - mn_hi), p3 = expf(s[j][3] - mn_hi);
            l_lo += p0 + p1;
            l_hi += p2 + p3;
            int col = cg * KPW + j * 8 + 2 * t4;
            *(uint32_t *)(Ps + row_lo * (FKT + 8) + col) = pack_bf16(p0, p1);
            *(uint32_t *)(Ps + row_hi * (FKT + 8) + col) = pack_bf16(p2, p3);
        }
#pragma unroll
        for (int j = 0; j < NJO; j++) {
            o[j][0] *= corr_lo;
            o[j][1] *= corr_lo;
            o[j][2] *= corr_hi;
            o[j][3] *= corr_hi;
        }
        __syncthreads();
        /* O += P V for rows rg*16.., output columns cg*OCOLS.. */
#pragma unroll
        for (int ks = 0; ks < FKT / 16; ks++) {
            uint32_t af[4];
            ldsm_x4(af, Ps + (rg * 16 + (lane & 15)) * (FKT + 8) + ks * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int j2 = 0; j2 < NJO / 2; j2++) {
                int m8 = lane >> 3;
                uint32_t bfr[4];
                ldsm_x4_t(bfr, Ks + (ks * 16 + (m8 & 1) * 8 + (lane & 7)) * FLD + cg * OCOLS + j2 * 16 + (m8 >> 1) * 8);
                mma16816(o[2 * j2], af[0], af[1], af[2], af[3], bfr[0], bfr[1]);
                mma16816(o[2 * j2 + 1], af[0], af[1], af[2], af[3], bfr[2], bfr[3]);
            }
        }
    }
    cp_async_wait<0>();
    /* row sums: quad, then across the column-group warps */
    for (int off = 1; off <= 2; off <<= 1) {
        l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
        l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
    }
    __syncthreads();
    if (t4 == 0) {
        redl[cg * R + row_lo] = l_lo;
        redl[cg * R + row_hi] = l_hi;
    }
    __syncthreads();
    float L_lo = 0.f, L_hi = 0.f;
#pragma unroll
    for (int c = 0; c < CW; c++) {
        L_lo += redl[c * R + row_lo];
        L_hi += redl[c * R + row_hi];
    }
    const int hl = h0 + row_lo, hh = h0 + row_hi;
    if (a.nsplit == 1) {
        float il = 1.0f / L_lo, ih = 1.0f / L_hi;
#pragma unroll
        for (int j = 0; j < NJO; j++) {
            int col = cg * OCOLS + j * 8 + 2 * t4;
            *(uint32_t *)(a.out + ((long)t * H + hl) * FDV + col) = pack_bf16(o[j][0] * il, o[j][1] * il);
            *(uint32_t *)(a.out + ((long)t * H + hh) * FDV + col) = pack_bf16(o[j][2] * ih, o[j][3] * ih);
        }
        return;
    }
    long pl = ((long)t * H + hl) * a.nsplit + split, ph = ((long)t * H + hh) * a.nsplit + split;
#pragma unroll
    for (int j = 0; j < NJO; j++) {
        int col = cg * OCOLS + j * 8 + 2 * t4;
        *(float2 *)(a.part + pl * FDV + col) = make_float2(o[j][0], o[j][1]);
        *(float2 *)(a.part + ph * FDV + col) = make_float2(o[j][2], o[j][3]);
    }
    if (cg == 0 && t4 == 0) {
        a.ml[pl * 2] = m_lo;
        a.ml[pl * 2 + 1] = L_lo;
        a.ml[ph * 2] = m_hi;
        a.ml[ph * 2 + 1] = L_hi;
    }
}

/* Merges the splits of one (token, head): out = Σ_s e^{m_s - M} O_s / Σ_s e^{m_s - M} l_s,
 * over the splits that had keys, found with the decode kernels' own split arithmetic: the
 * token's keys are its context positions 0..pos (dense) or its sel_count[t] selected positions
 * (SP), in tiles of a.kt keys. The first warp turns the (m, l) of those splits (at most
 * MLA_MAXSPLIT) into weights in shared memory (fixed shuffle trees), then each thread sums 4
 * columns over the splits in split order with the split loads unrolled: deterministic. */
enum { MLA_MAXSPLIT = 128, MLA_SPL = MLA_MAXSPLIT / 32, MERGE_PRE = 8 };
/* One warp: the weights e^{m_s - M} of the S splits that had keys (lane holds splits lane,
 * lane + 32, ...: mlp = their (m, l)) into wsh[s], and returns L = Σ_s l_s e^{m_s - M} (fixed
 * xor trees: every lane gets the same M and L). */
static __device__ __forceinline__ float split_weights(const float2 (&mlp)[MLA_SPL], int S, int lane, float *wsh) {
    float M = -INFINITY;
#pragma unroll
    for (int r = 0; r < MLA_SPL; r++)
        if (lane + 32 * r < S) M = fmaxf(M, mlp[r].x);
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float L = 0.f;
#pragma unroll
    for (int r = 0; r < MLA_SPL; r++) {
        int s = lane + 32 * r;
        if (s >= S) continue;
        float w = expf(mlp[r].x - M);
        wsh[s] = w;
        L += mlp[r].y * w;
    }
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    return L;
}

/* One thread's 4 columns of a merge: Σ_s wsh[s] · O_s[c..c+3] in split order over the S splits
 * with keys (the first MERGE_PRE from pre, loaded already; split s's columns at part + s * FDV),
 * times inv, rounded to bf16 into dst[0..4). CG: the later loads with ld.global.cg. */
template <bool CG>
static __device__ __forceinline__ void merge_cols(const float *wsh, const float4 (&pre)[MERGE_PRE], int S,
                                                  const float *part, float inv, bf16 *dst) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    auto add = [&](float w, float4 v) {
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
    };
#pragma unroll
    for (int s = 0; s < MERGE_PRE; s++) {
        if (s >= S) break;
        add(wsh[s], pre[s]);
    }
#pragma unroll 8
    for (int s = MERGE_PRE; s < S; s++)
        add(wsh[s], CG ? ld_act16f(part + (long)s * FDV) : *(const float4 *)(part + (long)s * FDV));
    uint2 o;
    o.x = pack_bf16(acc.x * inv, acc.y * inv);
    o.y = pack_bf16(acc.z * inv, acc.w * inv);
    *(uint2 *)dst = o;
}

/* The merge of token t's head h by a block of >= 128 threads (threads 128.. only take part in
 * the barrier) into dst[0, FDV) (bf16); false, with nothing written, when the token has no
 * keys. */
template <bool SP>
static __device__ __forceinline__ bool merge_head(const dec_args &a, const dec_sel &sp, int t, int h, bf16 *dst,
                                                  float *wsh, float *s_inv) {
    int H = a.n_heads, S = a.nsplit;
    long p0 = ((long)t * H + h) * a.nsplit;
    /* The (m, l) of every split and the first MERGE_PRE splits' partials are loaded before the
     * token's key count is known (the workspace holds a.nsplit splits of every (token, head),
     * so the loads stay in bounds; splits without keys are loaded but never used): the merge
     * then waits for one memory round trip instead of three in a row. */
    float2 mlp[MLA_SPL] = {};
    float4 pre[MERGE_PRE];
    if (threadIdx.x < 32)
#pragma unroll
        for (int r = 0; r < MLA_SPL; r++) {
            int s = threadIdx.x + 32 * r;
            if (s < a.nsplit) mlp[r] = *(const float2 *)(a.ml + (p0 + s) * 2);
        }
    if (threadIdx.x < 128)
#pragma unroll
        for (int s = 0; s < MERGE_PRE; s++)
            if (s < a.nsplit) pre[s] = *(const float4 *)(a.part + (p0 + s) * FDV + threadIdx.x * 4);
    int seq = seq_of(a.seq_start, a.seq_begin, a.seq_end, t);
    if (seq < 0) return false;
    int keys = dec_nkeys<SP>(a, sp, seq, t);
    int ntiles = (keys + a.kt - 1) / a.kt;
    if (ntiles <= 0) return false; /* an empty selection (backend.h: never; count >= 1) */
    int tps = split_tiles(a, ntiles);
    S = (ntiles + tps - 1) / tps;
    if (threadIdx.x < 32) {
        float L = split_weights(mlp, S, threadIdx.x, wsh);
        if (threadIdx.x == 0) *s_inv = 1.0f / L;
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        int c = threadIdx.x * 4; /* 128 threads x 4 = FDV columns */
        merge_cols<false>(wsh, pre, S, a.part + p0 * FDV + c, *s_inv, dst + c);
    }
    return true;
}

/* Merges the splits of one (token, head): out = Σ_s e^{m_s - M} O_s / Σ_s e^{m_s - M} l_s,
 * over the splits that had keys, found with the decode kernels' own split arithmetic: the
 * token's keys are its context positions 0..pos (dense) or its sel_count[t] selected positions
 * (SP), in tiles of a.kt keys. The first warp turns the (m, l) of those splits (at most
 * MLA_MAXSPLIT) into weights in shared memory (fixed shuffle trees), then each thread sums 4
 * columns over the splits in split order with the split loads unrolled: deterministic. */
template <bool SP>
__global__ void __launch_bounds__(128) k_mla_combine(dec_args a, dec_sel sp) {
    __shared__ float wsh[MLA_MAXSPLIT];
    __shared__ float s_inv;
    pdl_launch_dependents(); /* the W_UV GEMV may start loading its weights */
    pdl_wait();
    int t = blockIdx.x, h = blockIdx.y;
    merge_head<SP>(a, sp, t, h, a.out + ((long)t * a.n_heads + h) * FDV, wsh, &s_inv);
}

/* The W_UV GEMV of k_mla_uv and k_mla_uv_multi (k_gemv's arithmetic at one row): warp `warp` of
 * the block owns rows (blockIdx.x * 8 + warp) * 4 + r, r < 4, of head h; uv_rows loads them into
 * registers (constant: before the PDL wait), uv_dot dots them with ō (FDV bf16 in shared
 * memory; lane l: columns 8l + 256u in order, fmaf per element, xor tree, one rounding) and
 * lane 0 writes the four outputs to y[rows[r]]. */
static __device__ __forceinline__ void uv_rows(const wview &w, int h, int warp, int lane, int (&rows)[4],
                                               bool (&rok)[4], wraw<false> (&wr)[FDV / 256][4]) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        rows[r] = (blockIdx.x * 8 + warp) * 4 + r;
        rok[r] = rows[r] < w.rows;
    }
#pragma unroll
    for (int u = 0; u < FDV / 256; u++)
#pragma unroll
        for (int r = 0; r < 4; r++) wr[u][r] = wload<false>(w, h, rows[r], lane * 8 + u * 256, rok[r]);
}

static __device__ __forceinline__ void uv_dot(const wraw<false> (&wr)[FDV / 256][4], const bf16 *ol, int lane,
                                              const int (&rows)[4], const bool (&rok)[4], bf16 *y) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < FDV / 256; u++) {
        float x[8];
        bf16x8_float(*(const uint4 *)(ol + lane * 8 + u * 256), x);
#pragma unroll
        for (int r = 0; r < 4; r++) {
            float wf[8];
            wfloat<false>(wr[u][r], wf);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[r] = fmaf(wf[e], x[e], acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < 4; r++)
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < 4; r++)
            if (rok[r]) y[rows[r]] = __float2bfloat16_rn(acc[r]);
}

/* o_h = W_UV_h ō_h for a one-token step whose decode left split partials: block (row block,
 * head h) merges h's splits into shared memory with merge_head (k_mla_combine's arithmetic),
 * then its 8 warps x 4 rows dot them exactly as k_gemv<NT 1, RW 4, U 1> does for the W_UV bmm
 * at one token (lane l: columns 8l + 256i in order, fmaf per element, xor tree, one rounding).
 * Same bits as k_mla_combine followed by that GEMV, one launch fewer. The weight rows are
 * loaded before pdl_wait (they are constant). */
__global__ void __launch_bounds__(256) k_mla_uv(dec_args a, wview w, bf16 *y, long hsy) {
    __shared__ float wsh[MLA_MAXSPLIT];
    __shared__ float s_inv;
    __shared__ __align__(16) bf16 ol[FDV];
    pdl_launch_dependents();
    const int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int rows[4];
    bool rok[4];
    wraw<false> wr[FDV / 256][4];
    uv_rows(w, h, warp, lane, rows, rok, wr);
    pdl_wait(); /* the partials come from the decode kernel */
    if (!merge_head<false>(a, dec_sel{NULL, NULL, 0}, 0, h, ol, wsh, &s_inv)) return;
    __syncthreads();
    uv_dot(wr, ol, lane, rows, rok, y + (long)h * hsy);
}

/* k_mla_uv for a step of 2..UV_MAX_T decode tokens: block (row block, head h, token group)
 * holds its 32 weight rows in registers as k_mla_uv does (loaded before the PDL wait), merges
 * the splits of the group's UV_TG tokens for head h into shared memory with merge_head's
 * arithmetic (so the same ō bits as k_mla_combine: warp w computes token w's split weights,
 * then every thread sums its column quads over the splits in split order, the first MERGE_PRE
 * splits loaded before the key counts are known), then dots each token's ō with the rows as
 * k_mla_uv does. One launch instead of k_mla_combine + the W_UV bmm; the outputs are k_gemv's
 * sums, not cuBLASLt's (bf16 rounding apart from mla_decode + bmm). A token without keys gets
 * zeros (backend.h: never happens). */
enum { UV_TG = 4, UV_MAX_T = 16 };
__global__ void __launch_bounds__(256) k_mla_uv_multi(dec_args a, wview w, bf16 *y, long ldy, long hsy, int T) {
    __shared__ float wsh[UV_TG][MLA_MAXSPLIT];
    __shared__ float s_inv[UV_TG];
    __shared__ int s_cnt[UV_TG];
    __shared__ __align__(16) bf16 ol[UV_TG][FDV];
    pdl_launch_dependents();
    const int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, H = a.n_heads;
    const int t0 = blockIdx.z * UV_TG, nt = min(UV_TG, T - t0);
    int rows[4];
    bool rok[4];
    wraw<false> wr[FDV / 256][4];
    uv_rows(w, h, warp, lane, rows, rok, wr);
    pdl_wait(); /* the partials come from the decode kernel */
    /* column quads: item i = threadIdx.x + 256 j is token i / 128's quad i % 128 */
    enum { ITEMS = UV_TG * 128 / 256 };
    float4 pre[ITEMS][MERGE_PRE];
#pragma unroll
    for (int j = 0; j < ITEMS; j++) {
        const int i = threadIdx.x + 256 * j, tw = i >> 7;
        const long p0 = ((long)(t0 + tw) * H + h) * a.nsplit;
        if (tw < nt)
#pragma unroll
            for (int s = 0; s < MERGE_PRE; s++)
                if (s < a.nsplit) pre[j][s] = ld_act16f(a.part + (p0 + s) * FDV + (i & 127) * 4);
    }
    if (warp < nt) { /* token t0 + warp's split weights, as merge_head's first warp */
        const int t = t0 + warp;
        const long p0 = ((long)t * H + h) * a.nsplit;
        float2 mlp[MLA_SPL] = {};
#pragma unroll
        for (int r = 0; r < MLA_SPL; r++) {
            int s = lane + 32 * r;
            if (s < a.nsplit) mlp[r] = *(const float2 *)(a.ml + (p0 + s) * 2);
        }
        int seq = seq_of(a.seq_start, a.seq_begin, a.seq_end, t), S = 0;
        if (seq >= 0) {
            int keys = dec_nkeys<false>(a, dec_sel{NULL, NULL, 0}, seq, t);
            int ntiles = (keys + a.kt - 1) / a.kt;
            if (ntiles > 0) {
                int tps = split_tiles(a, ntiles);
                S = (ntiles + tps - 1) / tps;
            }
        }
        float L = split_weights(mlp, S, lane, wsh[warp]);
        if (lane == 0) {
            s_inv[warp] = 1.0f / L;
            s_cnt[warp] = S;
        }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < ITEMS; j++) {
        const int i = threadIdx.x + 256 * j, tw = i >> 7, c = (i & 127) * 4;
        if (tw >= nt) continue;
        const int S = s_cnt[tw];
        const long p0 = ((long)(t0 + tw) * H + h) * a.nsplit;
        merge_cols<true>(wsh[tw], pre[j], S, a.part + p0 * FDV + c, S > 0 ? s_inv[tw] : 0.f, &ol[tw][c]);
    }
    __syncthreads();
    for (int tw = 0; tw < nt; tw++) /* k_mla_uv's GEMV per token */
        uv_dot(wr, ol[tw], lane, rows, rok, y + (long)(t0 + tw) * ldy + (long)h * hsy);
}

/* The split merge after a decode launch with a.nsplit > 1 splits (dense or SP). */
template <bool SP>
static void launch_combine(cuda_state *st, const dec_args &a, const dec_sel &sp, int n_tokens) {
    DI_ASSERT(a.nsplit <= MLA_MAXSPLIT);
    cuda_launch_pdl(st, st->pdl >= 2, k_mla_combine<SP>, dim3(n_tokens, a.n_heads), dim3(128), 0, a, sp);
    CUDA_LAUNCHED(st, "mla_combine");
}

/* ---------------------------------------------------------------- host ---- */

static int heads_per_block(int H) {
    if (H % 64 == 0) return 64;
    if (H % 32 == 0) return 32;
    return 16;
}

/* KV splits per (token, head group): enough blocks for one wave (a block per SM for the wgmma
 * kernel, two for the mma.sync kernel). The wgmma kernel and mma.sync launches of at most 8
 * splits per token (st->mla_split_floor) round down, so the launch fills at most one wave and
 * no split runs in a mostly idle second one (256 tokens: 1 split instead of 2, no merge; 128: 2
 * instead of 3); wider mma.sync launches, whose splits hold a tile or two each, round up as
 * measured faster there (16 tokens: 17). At most MLA_NARROW, except one-token steps on the
 * mma.sync kernel with blocks of 16 / 32 heads (R) and st->mla_wide: up to MLA_MAXSPLIT, at
 * least 2 tiles each past MLA_NARROW tiles (split_tiles; 16 heads at 16K / 32K context 26.4 /
 * 45.2 -> 20.1 / 28.8 us, decode + W_UV, H100; the wgmma kernel at 64 heads and steps of 2
 * tokens were slower with more). A function of the token count only, as captured graphs need
 * (docs/PERF.md, 2026-12-05). */
static int n_splits(const cuda_state *st, int n_tokens, int n_hg, int R, int wg) {
    int target = wg ? st->n_sm : 2 * st->n_sm, work = n_tokens * n_hg;
    if (work >= target) return 1;
    bool down = wg || (st->mla_split_floor && work * 8 >= target);
    int s = down ? target / work : (target + work - 1) / work;
    if (s < 1) s = 1;
    int cap = st->mla_wide && !wg && R < 64 && n_tokens == 1 ? (int)MLA_MAXSPLIT : (int)MLA_NARROW;
    return s > cap ? cap : s;
}

static int use_wg(const cuda_state *st, const di_mla_dims *d) { return st->mla_wgmma && d->n_heads % 64 == 0; }

size_t cuda_mla_decode_part_bytes(cuda_state *st, const di_mla_dims *d, int max_tokens) {
    if (d->kv_rank != FDV || d->rope_dim != FD - FDV || d->n_heads % 16 != 0 || d->n_heads <= 0) return 0;
    int wg = use_wg(st, d), R = wg ? 64 : heads_per_block(d->n_heads), n_hg = d->n_heads / R;
    size_t best = 0;
    for (int T = 1; T <= max_tokens; T++) {
        int s = n_splits(st, T, n_hg, R, wg);
        if (s == 1) break;
        size_t rows = (size_t)T * d->n_heads * s;
        size_t b = align256(rows * FDV * sizeof(float)) + rows * 2 * sizeof(float);
        if (b > best) best = b;
    }
    return best;
}

/* keys one split of a sparse launch may hold: split_tiles of the longest list (stride keys),
 * which bounds every shorter list's */
static int sp_keys_per_split(int sel_stride, int nsplit) {
    int ntiles = (sel_stride + FKT - 1) / FKT;
    return split_tiles_of(ntiles, nsplit) * FKT;
}

template <int R, int NW, bool SP>
static void launch_fast(cuda_state *st, const dec_args &a, const dec_sel &sp, int n_tokens) {
    typedef dec_smem<R, NW> L;
    static bool attr = false;
    if (!attr) {
        if (cuda_note(st, cudaFuncSetAttribute(k_mla_decode_fast<R, NW, SP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               L::total + (SP ? SP_MAXKEYS * 4 : 0)),
                      "mla_decode smem attribute"))
            return;
        attr = true;
    }
    size_t smem = (size_t)L::total + (SP ? (size_t)sp_keys_per_split(sp.sel_stride, a.nsplit) * 4 : 0);
    unsigned blocks = (unsigned)(a.n_heads / R) * (unsigned)a.nsplit * (unsigned)n_tokens;
    bool pdl = st->pdl >= 2 || pdl_with(st, a.early && !SP);
    cuda_launch_pdl(st, pdl, k_mla_decode_fast<R, NW, SP>, dim3(blocks), dim3(NW * 32), smem, a, sp);
    CUDA_LAUNCHED(st, SP ? "mla_decode_sparse" : "mla_decode");
}

template <bool SP>
static void launch_decode(cuda_state *st, const dec_args &a, const dec_sel &sp, int R, int n_tokens) {
    if (R == 64) launch_fast<64, 8, SP>(st, a, sp, n_tokens);
    else if (R == 32) launch_fast<32, 8, SP>(st, a, sp, n_tokens);
    else launch_fast<16, 4, SP>(st, a, sp, n_tokens);
}

/* The decode launches; with leave_split, a dense launch with several splits skips the combine
 * and returns 1 (the partials in *ap are then merged by the caller). */
static int mla_decode_run(cuda_state *st, dec_args *ap, void *out, const void *qt, const void *qpe, int ldqpe,
                          int hsqpe, const void *cache, const di_attn_batch *ab, int seq_begin, int seq_end,
                          const di_mla_dims *d, bool leave_split) {
    dec_args &a = *ap;
    a.out = (bf16 *)out;
    a.qt = (const bf16 *)qt;
    a.qpe = (const bf16 *)qpe;
    a.cache = (const bf16 *)cache;
    a.ldqpe = ldqpe;
    a.hsqpe = hsqpe;
    a.seq_start = ab->seq_start;
    a.ctx_len = ab->seq_ctx_len;
    a.block_table = ab->block_table;
    a.max_blocks = ab->max_blocks;
    a.seq_begin = seq_begin;
    a.seq_end = seq_end;
    a.n_heads = d->n_heads;
    a.r = d->kv_rank;
    a.dr = d->rope_dim;
    a.scale = d->softmax_scale;
    a.nsplit = 1;
    a.kt = FKT;
    a.part = NULL;
    a.ml = NULL;
    a.early = st->mla_early;
    dec_sel sp = {ab->sel_pos, ab->sel_count, ab->sel_stride};
    int fast = d->kv_rank == FDV && d->rope_dim == FD - FDV && d->n_heads % 16 == 0 && ldqpe % 8 == 0 &&
               hsqpe % 8 == 0 && ((uintptr_t)qpe & 15) == 0 && ((uintptr_t)qt & 15) == 0;
    /* the wgmma kernel (64-head groups) serves dense steps; a DSA selection takes the SP flavour
     * of the mma.sync kernel */
    int wg = fast && !ab->sel_pos && use_wg(st, d);
    int R = wg ? 64 : fast ? heads_per_block(d->n_heads) : 16, n_hg = d->n_heads / R;
    int S = fast ? n_splits(st, ab->n_tokens, n_hg, R, wg) : 1;
    if (ab->sel_pos && ab->sel_stride > 0) { /* sparse: splits of at least sp_min_tiles tiles of the list */
        int cap = ((ab->sel_stride + FKT - 1) / FKT + st->sp_min_tiles - 1) / st->sp_min_tiles;
        if (S > cap) S = cap > 1 ? cap : 1;
    }
    size_t rows = (size_t)ab->n_tokens * d->n_heads * S;
    if (S > 1 && st->dec_part && align256(rows * FDV * sizeof(float)) + rows * 2 * sizeof(float) <= st->dec_part_bytes) {
        a.nsplit = S;
        a.part = st->dec_part;
        a.ml = (float *)((char *)st->dec_part + align256(rows * FDV * sizeof(float)));
    }
    if (ab->sel_pos) { /* V3.2: each token's selected positions only */
        if (fast && ab->sel_count && ab->sel_stride > 0 && sp_keys_per_split(ab->sel_stride, a.nsplit) <= SP_MAXKEYS) {
            launch_decode<true>(st, a, sp, R, ab->n_tokens);
            if (a.nsplit > 1) launch_combine<true>(st, a, sp, ab->n_tokens);
            return 0;
        }
        DI_ASSERT(ab->sel_count);
        fast = 0; /* the generic kernel over the list */
    }
    if (!fast) {
        DI_ASSERT(d->kv_rank <= 32 * GEN_MAXR && d->rope_dim <= 32 * GEN_MAXDR);
        dim3 grid(ab->n_tokens, ceil_div_i(d->n_heads, 4));
        cuda_launch_pdl(st, st->pdl >= 2, k_mla_decode_generic, grid, dim3(128), 0, a, sp);
        CUDA_LAUNCHED(st, "mla_decode_generic");
        return 0;
    }
    if (wg) {
        a.kt = MLA_WG_KT;
        mla_decode_wg_launch(st, a, ab->n_tokens);
    } else {
        launch_decode<false>(st, a, dec_sel{NULL, NULL, 0}, R, ab->n_tokens);
    }
    if (a.nsplit > 1) {
        if (leave_split) return 1;
        launch_combine<false>(st, a, sp, ab->n_tokens);
    }
    return 0;
}

void cuda_mla_decode(di_backend *be, void *out, const void *qt, const void *qpe, int ldqpe, int hsqpe,
                     const void *cache, const di_attn_batch *ab, int seq_begin, int seq_end, const di_mla_dims *d) {
    cuda_state *st = cst(be);
    if (seq_end <= seq_begin || ab->n_tokens <= 0) return;
    dec_args a;
    mla_decode_run(st, &a, out, qt, qpe, ldqpe, hsqpe, cache, ab, seq_begin, seq_end, d, false);
}

/* backend.h mla_decode_uv: at one token with split KV (dense), the merge moves into the W_UV
 * GEMV (k_mla_uv), taken only where the bmm itself would run the one-split GEMV that k_mla_uv
 * reproduces (bf16 W_UV of r = 512 columns, st->gemv); at 2..UV_MAX_T decode tokens with split
 * KV into k_mla_uv_multi (st->mla_uv_multi); otherwise mla_decode, then bmm. */
void cuda_mla_decode_uv(di_backend *be, void *o, int ldo, int hso, void *olat, const void *qt, const void *qpe,
                        int ldqpe, int hsqpe, const void *cache, const di_attn_batch *ab, int seq_begin, int seq_end,
                        const di_mla_dims *d, const di_weight *w_uv, int n_tokens) {
    cuda_state *st = cst(be);
    if (seq_end <= seq_begin || ab->n_tokens <= 0 || n_tokens <= 0) return;
    const int H = d->n_heads, r = d->kv_rank;
    bool fuse = st->mla_uv && ab->n_tokens == 1 && n_tokens == 1 && !ab->sel_pos && r == FDV && st->gemv &&
                w_uv->dtype == DI_DTYPE_BF16 && w_uv->n == H && w_uv->cols == r && w_uv->rows > 0 &&
                ((uintptr_t)w_uv->data & 15) == 0 && ((uintptr_t)olat & 15) == 0 &&
                gemv_splits(st, ceil_div_i(w_uv->rows, 4), H, r) == 1;
    /* 2..UV_MAX_T tokens, all decoding: k_mla_uv_multi (any W_UV GEMV split choice: its sums are
     * k_mla_uv's, not the bmm's) */
    bool multi = st->mla_uv_multi && n_tokens >= 2 && n_tokens <= UV_MAX_T && ab->n_tokens == n_tokens &&
                 !ab->sel_pos && r == FDV && w_uv->dtype == DI_DTYPE_BF16 && w_uv->n == H && w_uv->cols == r &&
                 w_uv->rows > 0 && ((uintptr_t)w_uv->data & 15) == 0;
    dec_args a;
    if ((fuse || multi) &&
        mla_decode_run(st, &a, olat, qt, qpe, ldqpe, hsqpe, cache, ab, seq_begin, seq_end, d, true)) {
        if (fuse)
            cuda_launch_pdl(st, st->pdl >= 1, k_mla_uv, dim3(ceil_div_i(w_uv->rows, 32), H), dim3(256), 0, a,
                            wview_of(w_uv), (bf16 *)o, (long)hso);
        else
            cuda_launch_pdl(st, st->pdl >= 1, k_mla_uv_multi,
                            dim3(ceil_div_i(w_uv->rows, 32), H, ceil_div_i(n_tokens, UV_TG)), dim3(256), 0, a,
                            wview_of(w_uv), (bf16 *)o, (long)ldo, (long)hso, n_tokens);
        CUDA_LAUNCHED(st, "mla_uv");
        return;
    }
    /* (fuse or multi with one split: the decode kernel wrote the merged latents; the bmm follows) */
    if (!fuse && !multi) mla_decode_run(st, &a, olat, qt, qpe, ldqpe, hsqpe, cache, ab, seq_begin, seq_end, d, false);
    cuda_bmm(be, o, ldo, hso, olat, H * r, r, w_uv, n_tokens);
}
