/* cuda_mla_decode_wgmma.cu - the Hopper MLA decode kernel for 64-head groups (DeepSeek-V3/R1,
 * Kimi: 128 heads; Kimi-K2: 64): weight-absorbed attention over the paged latent cache,
 *   S = σ Q̃ [c | k_pe]ᵀ (576 wide),  O = softmax(S) c (512 wide),
 * with warpgroup MMAs (wgmma) from 128-byte-swizzled shared memory.
 *
 * Owner: cuda. One block of two warpgroups per (token, 64-head group, KV split); the block
 * streams its split's 64-key tiles (one 64-row cache block each, 73.7 KB) through a 2-stage
 * cp.async ring written straight into the swizzled layout (chunk c of row r of a 64-column
 * panel at r * 128 + (c ^ r % 8) * 16; the 576 columns are 9 panels of 8 KB), once for all 64
 * heads; the Q tile (64 heads x 576) stays in shared memory. The warpgroups are specialised:
 *   - warpgroup 0 computes S[64 heads x 64 keys] on 36 wgmma m64n64k16 (A = Q, B = K, both
 *     K-major; one instruction reads 4 KB of shared memory per 32 tensor cycles, where a
 *     key-split m64n32k16 reads 3 KB per 16), runs the online softmax alone (row maxima within a
 *     quad), stores P (bf16) to a swizzled 64 x 64 tile and the rows' corrections beside it, and
 *     accumulates O[:, 0..255] += P V on 4 wgmma m64n256k16 (B = V = the first 512 columns of the
 *     same K tile, read MN-major through a transposed descriptor);
 *   - warpgroup 1 issues the cache copies and accumulates O[:, 256..511], so the tensor cores
 *     run its P V beside warpgroup 0's and warpgroup 0 never copies.
 * Hand-offs through named barriers (arrive: the releasing side goes on; sync: both wait):
 *   KREADY  (arrive by 1) warpgroup 1's copies of the next tile landed (fenced for the async proxy)
 *   KFREE   (arrive by 0) warpgroup 0's S and P V of a tile retired: its buffer may be refilled
 *   PREADY  (sync) P and the row corrections of this tile are in shared memory
 *   PFREE   (sync) warpgroup 1's P V of the previous tile retired: P and corr may be rewritten
 * Warpgroup 1 reaches both syncs before warpgroup 0 does, so they cost warpgroup 0 nothing, and
 * every hand-off of generic shared-memory accesses is a full 256-thread barrier. (racecheck
 * still reports the corrections' stores and loads: it does not order accesses through named
 * barriers reached from different instructions; docs/PERF.md, 2026-12-05.)
 * Softmax in base 2 (ex2.approx of (s - m) scale log2 e, m the raw running maximum; only the
 * last tile of a sequence is masked: its rows past the position are zero-filled), l the fp32
 * sum of the unrounded p, P rounded to bf16; a warp rescales its O rows only when one of their
 * maxima moved. Output: bf16 directly with one split, else the fp32 partials (O, m of the scaled
 * scores, l) that k_mla_combine merges (cuda_mla_decode.cu; a.kt = 64). Every sum has a fixed
 * order: deterministic. Shared memory: 3 x 73.7 KB + 8 KB + 1 KB (one block per SM). Replaced a
 * version with both warpgroups computing S for half the keys each and exchanging row maxima
 * (1.7-1.8 TB/s at the V3 shape on an H100, this one 2.2-2.4: docs/PERF.md). */
#include <math.h>

#include "backend/cuda/cuda_mla_decode.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

enum { WG_PANEL = 64 * 128, WG_TILE = 9 * WG_PANEL };
enum { WG_Q = 0, WG_K = WG_TILE, WG_P = 3 * WG_TILE, WG_RED = WG_P + WG_PANEL, WG_SMEM = WG_RED + 1024 + 1024 };
static_assert(DI_KV_BLOCK_SIZE == MLA_WG_KT, "a 64-key tile is one cache block");

/* o[4j + e] *= e < 2 ? lo : hi (the accumulator rows of this thread) */
static __device__ __forceinline__ void rescale_rows(float *o, float lo, float hi) {
#pragma unroll
    for (int j = 0; j < 32; j++) {
        o[4 * j] *= lo;
        o[4 * j + 1] *= lo;
        o[4 * j + 2] *= hi;
        o[4 * j + 3] *= hi;
    }
}

enum { BAR_KREADY = 1, BAR_KFREE = 2, BAR_PREADY = 3, BAR_PFREE = 4 };

__global__ void __launch_bounds__(256, 1) k_mla_decode_wg(dec_args a) {
    extern __shared__ unsigned char wg_sm_raw[];
    pdl_launch_dependents();
    pdl_wait();
    const uint32_t raw = smem_u32(wg_sm_raw), base = (raw + 1023u) & ~1023u;
    unsigned char *bp = wg_sm_raw + (base - raw);
    float *corr_s = (float *)(bp + WG_RED), *lsum_s = corr_s + 64;

    const int tid = threadIdx.x, w = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int H = a.n_heads, n_hg = H / 64;
    const int hg = blockIdx.x % n_hg, split = (blockIdx.x / n_hg) % a.nsplit, t = blockIdx.x / (n_hg * a.nsplit);
    const int seq = seq_of(a.seq_start, a.seq_begin, a.seq_end, t);
    if (seq < 0) return;
    const int pos = token_pos(a.seq_start, a.ctx_len, seq, t);
    const int nkeys = pos + 1, ntiles = (nkeys + MLA_WG_KT - 1) / MLA_WG_KT;
    const int tps = split_tiles(a, ntiles);
    const int tb = split * tps, te = min(ntiles, tb + tps), n = te - tb;
    if (n <= 0) return;
    const int h0 = hg * 64;

    /* copies of rows r0, r0 + step, ... (64 / step rows) of a tile: chunk c of every panel. Q and
     * tile 0 are copied by all 256 threads (two rows each), later tiles by warpgroup 1 (four) */
    auto load_rows = [&](unsigned char *dst, int ti, int r0, int c, int step) {
        const long slot0 = (long)a.block_table[(long)seq * a.max_blocks + ti] * MLA_WG_KT;
        const int sw = r0 * 128 + ((c ^ (r0 & 7)) << 4);
#pragma unroll
        for (int row = r0, i = 0; i < 64 / step; i++, row += step) {
            const bool ok = ti * MLA_WG_KT + row < nkeys;
            const bf16 *src = a.cache + (ok ? slot0 + row : 0) * 576 + c * 8;
#pragma unroll
            for (int p = 0; p < 9; p++) cp_async16(dst + p * WG_PANEL + sw + i * step * 128, src + p * 64, ok ? 16 : 0);
        }
        cp_async_commit();
    };
    const int lt = tid & 127;
    auto load_tile = [&](int ti, int buf) { load_rows(bp + WG_K + buf * WG_TILE, ti, lt >> 3, lt & 7, 16); };
    {
        const int c = tid & 7, rr = tid >> 3, sw = rr * 128 + ((c ^ (rr & 7)) << 4);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int h = h0 + rr + 32 * i;
            const bf16 *q = a.qt + ((long)t * H + h) * 512 + c * 8;
#pragma unroll
            for (int p = 0; p < 8; p++) cp_async16(bp + WG_Q + p * WG_PANEL + sw + i * 4096, q + p * 64, 16);
            cp_async16(bp + WG_Q + 8 * WG_PANEL + sw + i * 4096, a.qpe + (long)t * a.ldqpe + (long)h * a.hsqpe + c * 8,
                       16);
        }
        load_rows(bp + WG_K, tb, rr, c, 32);
    }
    if (w == 1 && n > 1) {
        load_tile(tb + 1, 1);
        cp_async_wait<1>(); /* Q and tile 0; tile 1 may still be in flight */
    } else {
        cp_async_wait<0>();
    }
    fence_proxy_async();
    __syncthreads();

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    const int row_lo = wq * 16 + g, row_hi = row_lo + 8; /* row_hi % 8 == row_lo % 8 == g */
    const uint32_t pbase = base + WG_P;

    if (w == 0) {
        const float sl2 = a.scale * 1.4426950408889634f;
        float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
        unsigned char *ps = bp + WG_P;
        for (int i = 0; i < n; i++) {
            const int ti = tb + i, buf = i & 1;
            if (i > 0) named_bar_sync(BAR_KREADY, 256);
            const uint32_t qs = base + WG_Q, ks = base + WG_K + buf * WG_TILE;
            float s[32];
#pragma unroll
            for (int j = 0; j < 32; j++) s[j] = 0.f;
            wg_fence_acc<32>(s);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 36; kk++) {
                const uint32_t off = (kk >> 2) * WG_PANEL + (kk & 3) * 32;
                wgmma_64(s, wg_desc(qs + off), wg_desc(ks + off));
            }
            wg_commit();
            wg_wait<0>();
            wg_fence_acc<32>(s);

            /* s[4j + e]: row row_lo (e < 2) / row_hi, key 8j + 2t4 + (e & 1) of the tile; the
             * maxima are of the raw scores (scale > 0), p = 2^((s - m) scale log2 e) */
            if (ti == ntiles - 1) {
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (ti * MLA_WG_KT + 8 * j + 2 * t4 + (e & 1) >= nkeys) s[4 * j + e] = -INFINITY;
            }
            float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                mx_lo = fmaxf(mx_lo, fmaxf(s[4 * j], s[4 * j + 1]));
                mx_hi = fmaxf(mx_hi, fmaxf(s[4 * j + 2], s[4 * j + 3]));
            }
#pragma unroll
            for (int off = 1; off <= 2; off <<= 1) {
                mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
                mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
            }
            const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
            const float corr_lo = ex2_approx((m_lo - mn_lo) * sl2), corr_hi = ex2_approx((m_hi - mn_hi) * sl2);
            m_lo = mn_lo;
            m_hi = mn_hi;
            l_lo *= corr_lo;
            l_hi *= corr_hi;
            const float b_lo = -mn_lo * sl2, b_hi = -mn_hi * sl2;
            uint32_t pk[16];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float p0 = ex2_approx(fmaf(s[4 * j], sl2, b_lo)), p1 = ex2_approx(fmaf(s[4 * j + 1], sl2, b_lo));
                const float p2 = ex2_approx(fmaf(s[4 * j + 2], sl2, b_hi)), p3 = ex2_approx(fmaf(s[4 * j + 3], sl2, b_hi));
                l_lo += p0 + p1;
                l_hi += p2 + p3;
                pk[2 * j] = pack_bf16(p0, p1);
                pk[2 * j + 1] = pack_bf16(p2, p3);
            }
            if (i > 0) named_bar_sync(BAR_PFREE, 256); /* warpgroup 1 is done with P, corr of i - 1 */
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int chunk = (j ^ g) << 4;
                *(uint32_t *)(ps + row_lo * 128 + chunk + 4 * t4) = pk[2 * j];
                *(uint32_t *)(ps + row_hi * 128 + chunk + 4 * t4) = pk[2 * j + 1];
            }
            if (t4 == 0) {
                corr_s[row_lo] = corr_lo;
                corr_s[row_hi] = corr_hi;
            }
            fence_proxy_async(); /* the P stores -> the wgmma reads (both warpgroups) */
            named_bar_sync(BAR_PREADY, 256);
            if (__any_sync(0xffffffffu, corr_lo != 1.f || corr_hi != 1.f)) rescale_rows(o, corr_lo, corr_hi);
            wg_fence_acc(o);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                wgmma_256<1>(o, wg_desc(pbase + kk * 32), wg_desc_mn(ks + kk * 2048, WG_PANEL, 1024));
            wg_commit();
            wg_wait<0>();
            wg_fence_acc(o);
            if (i + 2 < n) named_bar_arrive(BAR_KFREE, 256); /* buffer i & 1 may take tile i + 2 */
        }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
            l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
        }
        if (t4 == 0) {
            lsum_s[row_lo] = l_lo;
            lsum_s[row_hi] = l_hi;
        }
        if (a.nsplit > 1 && t4 == 0) {
            const long pl = ((long)t * H + h0 + row_lo) * a.nsplit + split, ph = ((long)t * H + h0 + row_hi) * a.nsplit + split;
            a.ml[pl * 2] = m_lo * a.scale; /* the combine's m: of the scaled scores */
            a.ml[pl * 2 + 1] = l_lo;
            a.ml[ph * 2] = m_hi * a.scale;
            a.ml[ph * 2 + 1] = l_hi;
        }
    } else {
        for (int i = 0; i < n; i++) {
            const int buf = i & 1;
            named_bar_sync(BAR_PREADY, 256);
            const float corr_lo = corr_s[row_lo], corr_hi = corr_s[row_hi];
            if (__any_sync(0xffffffffu, corr_lo != 1.f || corr_hi != 1.f)) rescale_rows(o, corr_lo, corr_hi);
            const uint32_t ks = base + WG_K + buf * WG_TILE;
            wg_fence_acc(o);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                wgmma_256<1>(o, wg_desc(pbase + kk * 32), wg_desc_mn(ks + 4 * WG_PANEL + kk * 2048, WG_PANEL, 1024));
            wg_commit();
            wg_wait<0>();
            wg_fence_acc(o);
            if (i + 1 < n) {
                cp_async_wait<0>(); /* tile i + 1, the only copies in flight */
                fence_proxy_async();
                named_bar_arrive(BAR_KREADY, 256);
            }
            if (i + 2 < n) {
                named_bar_sync(BAR_KFREE, 256); /* warpgroup 0 is done with tile i's buffer */
                load_tile(tb + i + 2, buf);
            }
            if (i + 1 < n) named_bar_sync(BAR_PFREE, 256);
        }
    }
    __syncthreads(); /* lsum_s */
    const float L_lo = lsum_s[row_lo], L_hi = lsum_s[row_hi];
    const int hl = h0 + row_lo, hh = h0 + row_hi;
    if (a.nsplit == 1) {
        const float il = 1.0f / L_lo, ih = 1.0f / L_hi;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            const int col = w * 256 + 8 * j + 2 * t4;
            *(uint32_t *)(a.out + ((long)t * H + hl) * 512 + col) = pack_bf16(o[4 * j] * il, o[4 * j + 1] * il);
            *(uint32_t *)(a.out + ((long)t * H + hh) * 512 + col) = pack_bf16(o[4 * j + 2] * ih, o[4 * j + 3] * ih);
        }
        return;
    }
    const long pl = ((long)t * H + hl) * a.nsplit + split, ph = ((long)t * H + hh) * a.nsplit + split;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const int col = w * 256 + 8 * j + 2 * t4;
        *(float2 *)(a.part + pl * 512 + col) = make_float2(o[4 * j], o[4 * j + 1]);
        *(float2 *)(a.part + ph * 512 + col) = make_float2(o[4 * j + 2], o[4 * j + 3]);
    }
}

void mla_decode_wg_launch(cuda_state *st, const dec_args &a, int n_tokens) {
    static bool attr = false; /* host-only, set once */
    if (!attr) {
        if (cuda_note(st, cudaFuncSetAttribute(k_mla_decode_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM),
                      "mla_decode_wg smem attribute"))
            return;
        attr = true;
    }
    unsigned blocks = (unsigned)(a.n_heads / 64) * (unsigned)a.nsplit * (unsigned)n_tokens;
    cuda_launch_pdl(st, st->pdl >= 2, k_mla_decode_wg, dim3(blocks), dim3(256), (size_t)WG_SMEM, a);
    CUDA_LAUNCHED(st, "mla_decode_wg");
}
