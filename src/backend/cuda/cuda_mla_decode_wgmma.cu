/* cuda_mla_decode_wgmma.cu - the Hopper MLA decode kernel for 64-head groups (DeepSeek-V3/R1,
 * Kimi: 128 heads; Kimi-K2: 64): weight-absorbed attention over the paged latent cache,
 *   S = σ Q̃ [c | k_pe]ᵀ (576 wide),  O = softmax(S) c (512 wide),
 * with warpgroup MMAs (wgmma) from 128-byte-swizzled shared memory.
 *
 * Owner: cuda. One block of two warpgroups per (token, 64-head group, KV split); the block
 * streams its split's 64-key tiles (one 64-row cache block each, 73.7 KB) through a 2-stage
 * cp.async ring written straight into the swizzled layout (chunk c of row r of a 64-column
 * panel at r * 128 + (c ^ r % 8) * 16; the 576 columns are 9 panels of 8 KB), once for all 64
 * heads. The Q tile (64 heads x 576) stays in shared memory. Per tile:
 *   - warpgroup w computes S for keys 32w..32w+31 of the tile: 36 wgmma m64n32k16 (A = Q,
 *     B = K, both K-major);
 *   - row maxima are exchanged through shared memory, then both warpgroups hold the same
 *     running max m; P = exp(S - m) (fp32, rounded to bf16) goes to a 64 x 64 swizzled tile;
 *   - warpgroup w accumulates O[:, 256w..256w+255] += P V: 4 wgmma m64n256k16 with A = P and
 *     B = V = the first 512 columns of the same K tile read MN-major (transposed descriptor),
 *     or, with pv_mma (DEEPINFER_CUDA_MLA_WGMMA=2), mma.sync m16n8k16 + ldmatrix.trans on the
 *     same operands (same accumulator layout).
 * Keys past the token's position are zero-filled and masked to -inf; the first key of every
 * tile is valid, so m stays finite. Output: bf16 directly with one split, else the fp32
 * partials (O, m, l) that k_mla_combine merges (cuda_mla_decode.cu; a.kt = 64). Every sum has
 * a fixed order: deterministic. Shared memory: 3 x 73.7 KB + 8 KB + 1 KB (one block per SM). */
#include <math.h>

#include "backend/cuda/cuda_mla_decode.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

enum { WG_PANEL = 64 * 128, WG_TILE = 9 * WG_PANEL };
enum { WG_Q = 0, WG_K = WG_TILE, WG_P = 3 * WG_TILE, WG_RED = WG_P + WG_PANEL, WG_SMEM = WG_RED + 1024 + 1024 };
static_assert(DI_KV_BLOCK_SIZE == MLA_WG_KT, "a 64-key tile is one cache block");

template <int PV_MMA>
__global__ void __launch_bounds__(256, 1) k_mla_decode_wg(dec_args a) {
    extern __shared__ unsigned char wg_sm_raw[];
    pdl_launch_dependents();
    pdl_wait(); /* PDL (cuda_pdl.cuh): everything below reads the step's data */
    const uint32_t raw = smem_u32(wg_sm_raw), base = (raw + 1023u) & ~1023u;
    unsigned char *bp = wg_sm_raw + (base - raw);
    float *redm = (float *)(bp + WG_RED), *redl = redm + 128;

    const int tid = threadIdx.x, w = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int H = a.n_heads, n_hg = H / 64;
    const int hg = blockIdx.x % n_hg, split = (blockIdx.x / n_hg) % a.nsplit, t = blockIdx.x / (n_hg * a.nsplit);
    const int seq = seq_of(a.seq_start, a.seq_begin, a.seq_end, t);
    if (seq < 0) return;
    const int pos = token_pos(a.seq_start, a.ctx_len, seq, t);
    const int nkeys = pos + 1, ntiles = (nkeys + MLA_WG_KT - 1) / MLA_WG_KT;
    const int tps = (ntiles + a.nsplit - 1) / a.nsplit;
    const int tb = split * tps, te = min(ntiles, tb + tps);
    if (tb >= te) return; /* split past the context: k_mla_combine skips it */
    const int h0 = hg * 64;

    /* this thread's copies: chunk c of rows rr and rr + 32 of every panel (same swizzle) */
    const int c = tid & 7, rr = tid >> 3, sw = rr * 128 + ((c ^ (rr & 7)) << 4);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int h = h0 + rr + 32 * i;
        const bf16 *q = a.qt + ((long)t * H + h) * 512 + c * 8;
#pragma unroll
        for (int p = 0; p < 8; p++) cp_async16(bp + WG_Q + p * WG_PANEL + sw + i * 4096, q + p * 64, 16);
        cp_async16(bp + WG_Q + 8 * WG_PANEL + sw + i * 4096, a.qpe + (long)t * a.ldqpe + (long)h * a.hsqpe + c * 8, 16);
    }
    auto load_tile = [&](int ti, int buf) {
        const long slot0 = (long)a.block_table[(long)seq * a.max_blocks + ti] * MLA_WG_KT;
        unsigned char *ks = bp + WG_K + buf * WG_TILE;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int row = rr + 32 * i;
            const bool ok = ti * MLA_WG_KT + row < nkeys;
            const bf16 *src = a.cache + (ok ? slot0 + row : 0) * 576 + c * 8;
#pragma unroll
            for (int p = 0; p < 9; p++) cp_async16(ks + p * WG_PANEL + sw + i * 4096, src + p * 64, ok ? 16 : 0);
        }
    };
    load_tile(tb, 0);
    cp_async_commit();

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
    const int row_lo = wq * 16 + g, row_hi = row_lo + 8; /* row_hi % 8 == row_lo % 8 == g */

    for (int ti = tb; ti < te; ti++) {
        const int buf = (ti - tb) & 1;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads(); /* tile ti landed for everyone; the MMAs of ti - 1 are retired (waited) */
        if (ti + 1 < te) load_tile(ti + 1, buf ^ 1);
        cp_async_commit();
        const uint32_t qs = base + WG_Q, ks = base + WG_K + buf * WG_TILE;

        /* S[64 heads x 32 keys] of this warpgroup's half of the tile */
        float s[16];
#pragma unroll
        for (int i = 0; i < 16; i++) s[i] = 0.f;
        wg_fence_acc<16>(s);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 36; kk++) {
            const uint32_t off = (kk >> 2) * WG_PANEL + (kk & 3) * 32;
            wgmma_32(s, wg_desc(qs + off), wg_desc(ks + off + w * 32 * 128));
        }
        wg_commit();
        wg_wait<0>();
        wg_fence_acc<16>(s);

        /* s[4j + e]: row row_lo (e < 2) / row_hi, key 32w + 8j + 2t4 + (e & 1) */
        float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = ti * MLA_WG_KT + w * 32 + 8 * j + 2 * t4 + (e & 1);
                const float v = key < nkeys ? s[4 * j + e] * a.scale : -INFINITY;
                s[4 * j + e] = v;
                if (e < 2) mx_lo = fmaxf(mx_lo, v);
                else mx_hi = fmaxf(mx_hi, v);
            }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
            mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
        }
        if (t4 == 0) {
            redm[w * 64 + row_lo] = mx_lo;
            redm[w * 64 + row_hi] = mx_hi;
        }
        __syncthreads();
        const float mn_lo = fmaxf(m_lo, fmaxf(redm[row_lo], redm[64 + row_lo]));
        const float mn_hi = fmaxf(m_hi, fmaxf(redm[row_hi], redm[64 + row_hi]));
        const float corr_lo = expf(m_lo - mn_lo), corr_hi = expf(m_hi - mn_hi);
        m_lo = mn_lo;
        m_hi = mn_hi;
        l_lo *= corr_lo;
        l_hi *= corr_hi;
        unsigned char *ps = bp + WG_P;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float p0 = expf(s[4 * j] - mn_lo), p1 = expf(s[4 * j + 1] - mn_lo);
            const float p2 = expf(s[4 * j + 2] - mn_hi), p3 = expf(s[4 * j + 3] - mn_hi);
            l_lo += p0 + p1;
            l_hi += p2 + p3;
            const int chunk = ((4 * w + j) ^ g) << 4;
            *(uint32_t *)(ps + row_lo * 128 + chunk + 4 * t4) = pack_bf16(p0, p1);
            *(uint32_t *)(ps + row_hi * 128 + chunk + 4 * t4) = pack_bf16(p2, p3);
        }
#pragma unroll
        for (int j = 0; j < 32; j++) {
            o[4 * j] *= corr_lo;
            o[4 * j + 1] *= corr_lo;
            o[4 * j + 2] *= corr_hi;
            o[4 * j + 3] *= corr_hi;
        }
        fence_proxy_async(); /* the P stores -> the wgmma reads */
        __syncthreads();

        /* O[64 x 256 (columns 256w..)] += P[64 x 64] V[64 x 256] */
        if (!PV_MMA) {
            wg_fence_acc(o);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                wgmma_256<1>(o, wg_desc(base + WG_P + kk * 32),
                             wg_desc_mn(ks + 4 * w * WG_PANEL + kk * 2048, WG_PANEL, 1024));
            wg_commit();
            wg_wait<0>();
            wg_fence_acc(o);
        } else {
            const unsigned char *kp = bp + WG_K + buf * WG_TILE;
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t af[4];
                const int arow = wq * 16 + (lane & 15), ach = 2 * kk + (lane >> 4);
                ldsm_x4(af, ps + arow * 128 + ((ach ^ (arow & 7)) << 4));
                const int m8 = lane >> 3, krow = kk * 16 + (m8 & 1) * 8 + (lane & 7);
#pragma unroll
                for (int j2 = 0; j2 < 16; j2++) {
                    const int col = w * 256 + j2 * 16 + (m8 >> 1) * 8;
                    uint32_t bfr[4];
                    ldsm_x4_t(bfr, kp + (col >> 6) * WG_PANEL + krow * 128 + ((((col & 63) >> 3) ^ (krow & 7)) << 4));
                    mma16816(&o[8 * j2], af[0], af[1], af[2], af[3], bfr[0], bfr[1]);
                    mma16816(&o[8 * j2 + 4], af[0], af[1], af[2], af[3], bfr[2], bfr[3]);
                }
            }
        }
    }
    cp_async_wait<0>();

    /* row sums: the quad, then the two warpgroups' key halves */
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
        l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
        l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
    }
    if (t4 == 0) {
        redl[w * 64 + row_lo] = l_lo;
        redl[w * 64 + row_hi] = l_hi;
    }
    __syncthreads();
    const float L_lo = redl[row_lo] + redl[64 + row_lo], L_hi = redl[row_hi] + redl[64 + row_hi];
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
    if (w == 0 && t4 == 0) {
        a.ml[pl * 2] = m_lo;
        a.ml[pl * 2 + 1] = L_lo;
        a.ml[ph * 2] = m_hi;
        a.ml[ph * 2 + 1] = L_hi;
    }
}

template <int PV_MMA>
static void launch_wg(cuda_state *st, const dec_args &a, int n_tokens) {
    static bool attr = false; /* per instantiation; host-only, set once */
    if (!attr) {
        if (cuda_note(st, cudaFuncSetAttribute(k_mla_decode_wg<PV_MMA>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               WG_SMEM),
                      "mla_decode_wg smem attribute"))
            return;
        attr = true;
    }
    unsigned blocks = (unsigned)(a.n_heads / 64) * (unsigned)a.nsplit * (unsigned)n_tokens;
    cuda_launch_pdl(st, st->pdl >= 2, k_mla_decode_wg<PV_MMA>, dim3(blocks), dim3(256), (size_t)WG_SMEM, a);
    CUDA_LAUNCHED(st, "mla_decode_wg");
}

void mla_decode_wg_launch(cuda_state *st, const dec_args &a, int n_tokens, int pv_mma) {
    if (pv_mma) launch_wg<1>(st, a, n_tokens);
    else launch_wg<0>(st, a, n_tokens);
}
