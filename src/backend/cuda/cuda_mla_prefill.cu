/* cuda_mla_prefill.cu - naive (decompressed) MLA attention for prefill chunks over the paged
 * latent cache, flash-style: memory is linear in context length.
 *
 * For a group of sequences and a window [c0, c0 + CH) of context positions:
 *   1. k_prefill_gather copies the window's cache rows (c | k_pe) into a dense buffer;
 *   2. one GEMM decompresses them: kv[row, h*(dn+dv) + j] = W_kvb[h*(dn+dv) + j, :] · c_row;
 *   3. the attention kernel updates every query of the group with those keys (causal), with an
 *      online softmax whose state (m, l, O in fp32) persists in scratch between windows; the
 *      last window writes out[t, h, :] = O / l in bf16.
 * Usually one window covers the whole context (CH = max context) and the state never leaves
 * registers. Kernels: fast (dn 128, rope 64, dv 128: DeepSeek V2/V3) = a block of 64, 128 or
 * 256 queries x 1 head (variant chosen by shape, see pf_choose), key tiles through a cp.async
 * ring in shared memory, mma.sync for Q·Kᵀ and P·V with P kept in registers, heaviest query
 * tiles first; generic = one warp per (query, head), any shape, and every step with a DSA
 * selection (V3.2: ab->sel_pos; each query walks its listed positions inside the window).
 *
 * Owner: cuda. Scratch (carved from the caller's buffer, sized by
 * cuda_mla_prefill_scratch_bytes for max_tokens): lat [cap, r+dr] bf16, kv [cap, H*(dn+dv)]
 * bf16, state [n_tokens*H][2] f32, acc [n_tokens*H][dv] f32 (this step's tokens), then the
 * dense rows: as many as the rest of the buffer holds (>= max(max_tokens, 4096) rounded to 64
 * when sized by the query). Invariant: rows of the dense buffer that no sequence owns are
 * never read. */
#include <math.h>
#include <stdlib.h>

#include "backend/cuda/cuda_mma.cuh"

typedef struct pf_args {
    bf16 *out;
    const bf16 *q, *lat, *kv, *cache;
    long ldq;
    const int32_t *seq_start, *ctx_len, *block_table;
    int max_blocks, g0, g1, c0, CH;
    int H, dn, dr, dv, r;
    float scale;
    int first, last;
    float *state, *acc;
} pf_args;

/* lat[(seq - g0) * CH + (p - c0)] = cache row of position p of seq, for p < ctx. */
__global__ void k_prefill_gather(pf_args a, int W) {
    long ri = blockIdx.x;
    int seq = a.g0 + (int)(ri / a.CH), p = a.c0 + (int)(ri % a.CH);
    if (seq >= a.g1 || p >= a.ctx_len[seq]) return;
    int blk = a.block_table[(long)seq * a.max_blocks + p / DI_KV_BLOCK_SIZE];
    const bf16 *src = a.cache + ((long)blk * DI_KV_BLOCK_SIZE + p % DI_KV_BLOCK_SIZE) * W;
    bf16 *dst = (bf16 *)a.lat + ri * W;
    if ((W & 7) == 0) {
        for (int i = threadIdx.x; i < W / 8; i += blockDim.x) ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
    } else {
        for (int i = threadIdx.x; i < W; i += blockDim.x) dst[i] = src[i];
    }
}

/* ---------------------------------------------------------------- generic ---- */

enum { PG_MAXV = 16, PG_MAXQ = 24 }; /* per-lane registers: dv <= 512, dn + dr <= 768 */

/* The widest value head and query head (nope + rope) the prefill kernels serve: the generic
 * kernel's (the fast one's 128 / 192 fit it); checked at model load (cuda_limits.cu) */
void cuda_mla_prefill_limits(int *max_v, int *max_qk) {
    *max_v = 32 * PG_MAXV;
    *max_qk = 32 * PG_MAXQ;
}

/* DSA selection (V3.2), a separate parameter of the generic kernel (the fast kernels take none) */
typedef struct pf_sel {
    const int32_t *sel_pos, *sel_count;
    int sel_stride;
} pf_sel;

/* One warp per (query, head) over the window's keys up to its position, or with a selection
 * (sp.sel_pos) over its listed positions inside the window (the list is ascending: the first
 * one found by binary search). */
__global__ void k_prefill_generic(pf_args a, pf_sel sp) {
    int qi = blockIdx.x, seq = a.g0 + blockIdx.z, lane = threadIdx.x & 31;
    int h = blockIdx.y * 4 + (threadIdx.x >> 5);
    if (seq >= a.g1 || h >= a.H) return;
    int t0 = a.seq_start[seq], q_len = a.seq_start[seq + 1] - t0;
    if (qi >= q_len) return;
    int ctx = a.ctx_len[seq], t = t0 + qi, pos = ctx - q_len + qi;
    int dn = a.dn, dr = a.dr, dv = a.dv, W = a.r + dr, kvw = dn + dv, H = a.H;
    float q[PG_MAXQ], o[PG_MAXV];
    const bf16 *qh = a.q + (long)t * a.ldq + (long)h * (dn + dr);
#pragma unroll
    for (int i = 0; i < PG_MAXQ; i++) {
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
    for (int i = 0; i < PG_MAXV; i++) {
        int j = lane + 32 * i;
        o[i] = (!a.first && j < dv) ? a.acc[si * dv + j] : 0.f;
    }
    int kend = min(min(a.c0 + a.CH, ctx), pos + 1);
    const int32_t *sel = sp.sel_pos ? sp.sel_pos + (long)t * sp.sel_stride : NULL;
    int k = a.c0, kstop = kend;
    if (sel) {
        int lo = 0, hi = sp.sel_count[t];
        kstop = hi;
        while (lo < hi) {
            int mid = (lo + hi) >> 1;
            if (sel[mid] < a.c0) lo = mid + 1;
            else hi = mid;
        }
        k = lo;
    }
    for (; k < kstop; k++) {
        int p = sel ? sel[k] : k;
        if (p >= kend) break;
        long row = (long)(seq - a.g0) * a.CH + (p - a.c0);
        const bf16 *kn = a.kv + row * H * kvw + (long)h * kvw, *kp = a.lat + row * W + a.r;
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < PG_MAXQ; i++) {
            int j = lane + 32 * i;
            if (j < dn) d += q[i] * __bfloat162float(kn[j]);
            else if (j < dn + dr) d += q[i] * __bfloat162float(kp[j - dn]);
        }
        for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
        float sc = a.scale * d, mn = fmaxf(m, sc);
        float corr = expf(m - mn), pr = expf(sc - mn);
        l = l * corr + pr;
#pragma unroll
        for (int i = 0; i < PG_MAXV; i++) {
            int j = lane + 32 * i;
            o[i] = o[i] * corr + (j < dv ? pr * __bfloat162float(kn[dn + j]) : 0.f);
        }
        m = mn;
    }
    if (a.last) {
        float inv = 1.0f / l;
#pragma unroll
        for (int i = 0; i < PG_MAXV; i++) {
            int j = lane + 32 * i;
            if (j < dv) a.out[si * dv + j] = __float2bfloat16_rn(o[i] * inv);
        }
    } else {
        if (lane == 0) {
            a.state[si * 2] = m;
            a.state[si * 2 + 1] = l;
        }
#pragma unroll
        for (int i = 0; i < PG_MAXV; i++) {
            int j = lane + 32 * i;
            if (j < dv) a.acc[si * dv + j] = o[i];
        }
    }
}

/* ---------------------------------------------------------------- fast ---- */

/* Block = NW warps x MT m-tiles of 16 queries (BM = 16 * NW * MT queries) x 1 head; KT-key tiles
 * through an ST-stage cp.async ring (one __syncthreads per tile). Q·Kᵀ and P·V with mma.sync;
 * P stays in registers as bf16 A fragments, V is read with ldmatrix.trans. MT == 1 keeps Q's
 * fragments in registers; MT == 2 re-reads them from shared memory every tile, so each K/V
 * fragment feeds two m-tiles (half the shared-memory traffic per mma). Softmax in base 2 (log2 e
 * folded into the scale; m in the saved state is in that domain, only this kernel reads it).
 * Only tiles that cross the diagonal or the window end are masked. Query tiles run heaviest
 * (latest) first: blockIdx.x = head, blockIdx.y = reversed query tile. */
enum { PDN = 128, PDR = 64, PDQ = 192, PDV = 128, PLDK = 200, PLDV = 136 };

template <int NW, int MT, int KT, int ST, int KS>
struct pf_cfg {
    enum { BM = 16 * NW * MT, NT = 32 * NW, SMEM = BM * PLDK * 2 + ST * KT * (PLDK + PLDV) * 2 };
};

template <int NW, int MT, int KT, int ST, int KS>
__global__ void __launch_bounds__(32 * NW) k_prefill_fast(pf_args a) {
    constexpr int BM = 16 * NW * MT, NT = 32 * NW, NR = 2 * MT;
    extern __shared__ __align__(16) unsigned char sm[];
    bf16 *Qs = (bf16 *)sm;
    bf16 *Kb = (bf16 *)(sm + BM * PLDK * 2);
    bf16 *Vb = Kb + ST * KT * PLDK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int seq = a.g0 + blockIdx.z, h = blockIdx.x, H = a.H;
    if (seq >= a.g1) return;
    const int t0 = a.seq_start[seq], q_len = a.seq_start[seq + 1] - t0;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BM;
    if (q0 >= q_len) return;
    const int ctx = a.ctx_len[seq], first_pos = ctx - q_len;
    const int qmax = first_pos + min(q_len, q0 + BM) - 1; /* largest query position of the tile */
    const int kend = min(min(a.c0 + a.CH, ctx), qmax + 1);
    const long rowbase = (long)(seq - a.g0) * a.CH - a.c0; /* dense row of position p: rowbase + p */
    const float sl2 = a.scale * 1.4426950408889634f;

    /* Q tile: its own cp.async group, committed first */
    for (int c = tid; c < BM * 24; c += NT) {
        int i = c / 24, ch = c % 24;
        bool ok = q0 + i < q_len;
        const bf16 *src = a.q + (long)(t0 + q0 + i) * a.ldq + (long)h * PDQ + ch * 8;
        cp_async16(Qs + i * PLDK + ch * 8, ok ? (const void *)src : (const void *)a.q, ok ? 16 : 0);
    }
    cp_async_commit();
    auto load_tile = [&](int k0, int buf) {
        bf16 *Ks = Kb + buf * KT * PLDK, *Vs = Vb + buf * KT * PLDV;
#pragma unroll 1
        for (int c = tid; c < KT * 24; c += NT) { /* K: 16 chunks of k_nope, 8 of k_pe */
            int i = c / 24, ch = c % 24, p = k0 + i;
            bool ok = p < kend;
            long row = rowbase + p;
            const bf16 *src = ch < 16 ? a.kv + row * (H * 256) + (long)h * 256 + ch * 8
                                      : a.lat + row * 576 + 512 + (ch - 16) * 8;
            cp_async16(Ks + i * PLDK + ch * 8, ok ? (const void *)src : (const void *)a.kv, ok ? 16 : 0);
        }
#pragma unroll 1
        for (int c = tid; c < KT * 16; c += NT) {
            int i = c / 16, ch = c % 16, p = k0 + i;
            bool ok = p < kend;
            const bf16 *src = a.kv + (rowbase + p) * (H * 256) + (long)h * 256 + 128 + ch * 8;
            cp_async16(Vs + i * PLDV + ch * 8, ok ? (const void *)src : (const void *)a.kv, ok ? 16 : 0);
        }
    };
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (a.c0 + s * KT < kend) load_tile(a.c0 + s * KT, s);
        cp_async_commit();
    }

    /* state of this thread's rows: r = 2 * mt + (0: row g, 1: row g + 8) of m-tile mt, i.e.
     * query q0 + qrow + RO(r) */
#define RO(r) (((r) >> 1) * 16 + ((r) & 1) * 8)
    const int qrow = q0 + warp * MT * 16 + g, prow = first_pos + qrow;
    float m[NR], l[NR];
    float o[MT][PDV / 8][4];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        m[r] = -INFINITY;
        l[r] = 0.f;
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < PDV / 8; j++) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
    if (!a.first) {
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (qrow + RO(r) >= q_len) continue;
            long si = (long)(t0 + qrow + RO(r)) * H + h;
            m[r] = a.state[si * 2];
            l[r] = t4 == 0 ? a.state[si * 2 + 1] : 0.f;
#pragma unroll
            for (int j = 0; j < PDV / 8; j++) {
                float2 v = *(const float2 *)(a.acc + si * PDV + j * 8 + 2 * t4);
                o[r / 2][j][(r & 1) * 2] = v.x;
                o[r / 2][j][(r & 1) * 2 + 1] = v.y;
            }
        }
    }
    const int wmin = first_pos + q0 + warp * MT * 16; /* smallest query position of this warp */
    const bf16 *Qw = Qs + (warp * MT * 16 + (lane & 15)) * PLDK + (lane >> 4) * 8;
    uint32_t qf[MT == 1 ? PDQ / 16 : 1][4];
    if (MT == 1) {
        cp_async_wait<ST - 1>();
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < PDQ / 16; ks++) ldsm_x4(qf[MT == 1 ? ks : 0], Qw + ks * 16);
    }

    for (int it = 0, kb = a.c0; kb < kend; kb += KT, it++) {
        const int buf = it % ST;
        cp_async_wait<ST - 2>();
        __syncthreads();
        {
            int nk = kb + (ST - 1) * KT;
            if (nk < kend) load_tile(nk, (it + ST - 1) % ST);
            cp_async_commit();
        }
#pragma unroll 1
        for (int sub = 0; sub < KT / KS; sub++) { /* KS-key sub-tiles of the loaded tile */
            const int kbs = kb + sub * KS;
            if (kbs >= kend) break;
            const bf16 *Ks = Kb + (buf * KT + sub * KS) * PLDK, *Vs = Vb + (buf * KT + sub * KS) * PLDV;
            float s[MT][KS / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < KS / 8; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < PDQ / 16; ks++) {
                uint32_t qa[MT][4];
                if (MT == 1) {
#pragma unroll
                    for (int i = 0; i < 4; i++) qa[0][i] = qf[MT == 1 ? ks : 0][i];
                } else {
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) ldsm_x4(qa[mt], Qw + mt * 16 * PLDK + ks * 16);
                }
#pragma unroll
                for (int j2 = 0; j2 < KS / 16; j2++) {
                    uint32_t bfr[4];
                    ldsm_x4(bfr, Ks + (j2 * 16 + ((lane >> 4) & 1) * 8 + (lane & 7)) * PLDK + ks * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816(s[mt][2 * j2], qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3], bfr[0], bfr[1]);
                        mma16816(s[mt][2 * j2 + 1], qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3], bfr[2], bfr[3]);
                    }
                }
            }
            if (kbs + KS > kend || kbs + KS - 1 > wmin) { /* crosses the diagonal or the end */
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int j = 0; j < KS / 8; j++)
#pragma unroll
                        for (int c = 0; c < 4; c++) {
                            int p = kbs + j * 8 + 2 * t4 + (c & 1);
                            if (!(p < kend && p <= prow + RO(2 * mt + (c >> 1)))) s[mt][j][c] = -INFINITY;
                        }
            }
            float u[NR], corr[NR];
            bool same = true;
#pragma unroll
            for (int r = 0; r < NR; r++) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < KS / 8; j++) mx = fmaxf(mx, fmaxf(s[r / 2][j][(r & 1) * 2], s[r / 2][j][(r & 1) * 2 + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float mn = fmaxf(m[r], mx * sl2);
                u[r] = mn == -INFINITY ? 0.f : mn; /* fully masked rows */
                corr[r] = ex2_approx(m[r] - u[r]);
                same = same && corr[r] == 1.f;
                m[r] = mn;
                l[r] *= corr[r];
            }
            if (!__all_sync(0xffffffffu, same)) /* no row of the warp has a new maximum: o stays */
#pragma unroll
                for (int r = 0; r < NR; r++)
#pragma unroll
                    for (int j = 0; j < PDV / 8; j++) {
                        o[r / 2][j][(r & 1) * 2] *= corr[r];
                        o[r / 2][j][(r & 1) * 2 + 1] *= corr[r];
                    }
            uint32_t pf[MT][KS / 16][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < KS / 8; j++) {
                    float ua = u[2 * mt], ub = u[2 * mt + 1];
                    float p0 = ex2_approx(fmaf(s[mt][j][0], sl2, -ua)), p1 = ex2_approx(fmaf(s[mt][j][1], sl2, -ua));
                    float p2 = ex2_approx(fmaf(s[mt][j][2], sl2, -ub)), p3 = ex2_approx(fmaf(s[mt][j][3], sl2, -ub));
                    l[2 * mt] += p0 + p1;
                    l[2 * mt + 1] += p2 + p3;
                    pf[mt][j / 2][(j & 1) * 2] = pack_bf16(p0, p1);
                    pf[mt][j / 2][(j & 1) * 2 + 1] = pack_bf16(p2, p3);
                }
#pragma unroll
            for (int ks = 0; ks < KS / 16; ks++)
#pragma unroll
                for (int j2 = 0; j2 < PDV / 16; j2++) {
                    int m8 = lane >> 3;
                    uint32_t bfr[4];
                    ldsm_x4_t(bfr, Vs + (ks * 16 + (m8 & 1) * 8 + (lane & 7)) * PLDV + j2 * 16 + (m8 >> 1) * 8);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816(o[mt][2 * j2], pf[mt][ks][0], pf[mt][ks][1], pf[mt][ks][2], pf[mt][ks][3], bfr[0], bfr[1]);
                        mma16816(o[mt][2 * j2 + 1], pf[mt][ks][0], pf[mt][ks][1], pf[mt][ks][2], pf[mt][ks][3], bfr[2], bfr[3]);
                    }
                }
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int r = 0; r < NR; r++) {
        float L = l[r];
        L += __shfl_xor_sync(0xffffffffu, L, 1);
        L += __shfl_xor_sync(0xffffffffu, L, 2);
        if (qrow + RO(r) >= q_len) continue;
        long si = (long)(t0 + qrow + RO(r)) * H + h;
        if (a.last) {
            float inv = 1.0f / L;
#pragma unroll
            for (int j = 0; j < PDV / 8; j++)
                *(uint32_t *)(a.out + si * PDV + j * 8 + 2 * t4) = pack_bf16(o[r / 2][j][(r & 1) * 2] * inv, o[r / 2][j][(r & 1) * 2 + 1] * inv);
        } else {
            if (t4 == 0) {
                a.state[si * 2] = m[r];
                a.state[si * 2 + 1] = L;
            }
#pragma unroll
            for (int j = 0; j < PDV / 8; j++)
                *(float2 *)(a.acc + si * PDV + j * 8 + 2 * t4) = make_float2(o[r / 2][j][(r & 1) * 2], o[r / 2][j][(r & 1) * 2 + 1]);
        }
    }
#undef RO
}

/* The fast kernel's variants (DEEPINFER_CUDA_PREFILL_KERNEL=1..PF_NV forces one; 0 or unset:
 * chosen by shape in cuda_mla_prefill). H200, one 8192-token sequence, whole op (gather + GEMM +
 * attention), bench_cuda_ops prefill: 1: 2182 us, 2: 1729, 3: 1562, 4: 1416, 5: 1373, 6: 1944,
 * 7: 1212, 8: 1200, 9: 1308, 10: 1385 (7 spills 72 bytes; the others none). */
typedef void (*pf_kernel_fn)(pf_args);
typedef struct pf_variant {
    pf_kernel_fn fn;
    int bm, threads, smem;
} pf_variant;
#define PF_V(nw, mt, kt, st, ks) \
    {k_prefill_fast<nw, mt, kt, st, ks>, pf_cfg<nw, mt, kt, st, ks>::BM, 32 * nw, pf_cfg<nw, mt, kt, st, ks>::SMEM}
static const pf_variant pf_variants[] = {
    PF_V(4, 1, 64, 2, 64), /* 1: 64 queries, 4 warps */
    PF_V(8, 1, 64, 2, 64), /* 2: 128 queries, 8 warps */
    PF_V(8, 1, 64, 3, 64), /* 3: 128 queries, 8 warps, 3 stages */
    PF_V(4, 2, 32, 2, 32), /* 4: 128 queries, 4 warps x 32 rows, 32-key tiles (2 blocks per SM) */
    PF_V(8, 2, 32, 2, 32), /* 5: 256 queries, 8 warps x 32 rows, 32-key tiles */
    PF_V(4, 2, 64, 2, 64), /* 6: 128 queries, 4 warps x 32 rows */
    PF_V(8, 2, 64, 2, 64), /* 7: 256 queries, 8 warps x 32 rows */
    PF_V(8, 2, 48, 2, 48), /* 8: 256 queries, 8 warps x 32 rows, 48-key tiles (default at 8192) */
    PF_V(8, 2, 64, 2, 32), /* 9: 256 queries, 8 warps x 32 rows, 64-key tiles computed as 2 x 32 */
    PF_V(8, 2, 32, 3, 32), /* 10: 256 queries, 8 warps x 32 rows, 32-key tiles, 3 stages */
};
enum { PF_NV = (int)(sizeof pf_variants / sizeof pf_variants[0]), PF_V64 = 0, PF_V128 = 3, PF_V256 = 7 };

/* ---------------------------------------------------------------- host ---- */

/* Index into pf_variants: DEEPINFER_CUDA_PREFILL_KERNEL=1..PF_NV, else by shape: the 256-query
 * blocks (one per SM) when they fill the GPU at least twice over, else 128-query blocks (two per
 * SM) when those do, else 64-query blocks. */
static int pf_choose(const cuda_state *st, int max_q, int H, int ng) {
    const char *e = getenv("DEEPINFER_CUDA_PREFILL_KERNEL");
    int v = e ? atoi(e) : 0;
    if (v >= 1 && v <= PF_NV) return v - 1;
    long hn = (long)H * ng;
    if (ceil_div_i(max_q, 256) * hn >= 2L * st->n_sm) return PF_V256;
    if (ceil_div_i(max_q, 128) * hn >= 2L * st->n_sm) return PF_V128;
    return PF_V64;
}

static int cap_rows(int max_tokens) {
    int c = max_tokens > 4096 ? max_tokens : 4096;
    return (c + 63) & ~63;
}

typedef struct pf_scratch {
    bf16 *lat, *kv;
    float *state, *acc;
    int cap; /* rows of lat / kv */
} pf_scratch;

static size_t state_bytes(const di_mla_dims *d, int n_tokens) {
    size_t th = (size_t)n_tokens * d->n_heads;
    return align256(th * 2 * sizeof(float)) + align256(th * d->v_dim * sizeof(float));
}
static size_t row_bytes(const di_mla_dims *d) {
    return ((size_t)d->kv_rank + d->rope_dim + (size_t)d->n_heads * (d->nope_dim + d->v_dim)) * 2;
}

size_t cuda_mla_prefill_scratch_bytes(di_backend *be, const di_mla_dims *d, int max_tokens) {
    (void)be;
    return state_bytes(d, max_tokens) + (size_t)cap_rows(max_tokens) * row_bytes(d) + 512;
}

/* state/acc for this step's tokens first, then as many dense rows as the rest holds */
static void carve(pf_scratch *ps, void *base, size_t bytes, const di_mla_dims *d, int n_tokens) {
    size_t th = (size_t)n_tokens * d->n_heads, W = (size_t)d->kv_rank + d->rope_dim, off = 0;
    char *p = (char *)base;
    ps->state = (float *)p;
    off += align256(th * 2 * sizeof(float));
    ps->acc = (float *)(p + off);
    off += align256(th * d->v_dim * sizeof(float));
    size_t rest = bytes > off + 512 ? bytes - off - 512 : 0;
    size_t cap = rest / row_bytes(d);
    cap &= ~(size_t)63;
    if (cap > (size_t)1 << 30) cap = (size_t)1 << 30;
    ps->cap = (int)cap;
    ps->lat = (bf16 *)(p + off);
    off += align256(cap * W * 2);
    ps->kv = (bf16 *)(p + off);
}

void cuda_mla_prefill(di_backend *be, void *out, const void *q, int ldq, const void *cache, const di_weight *W_kvb,
                      const di_attn_batch *ab, int seq_begin, int seq_end, const di_mla_dims *d, void *scratch,
                      size_t scratch_bytes) {
    cuda_state *st = cst(be);
    int H = d->n_heads, dn = d->nope_dim, dr = d->rope_dim, dv = d->v_dim, r = d->kv_rank, W = r + dr;
    int kvw = H * (dn + dv);
    DI_ASSERT(W_kvb->rows == kvw && W_kvb->cols == r && W_kvb->n == 1);
    if (seq_end <= seq_begin || ab->n_tokens <= 0) return;
    DI_ASSERT(scratch_bytes >= cuda_mla_prefill_scratch_bytes(be, d, ab->n_tokens));
    pf_scratch ps;
    carve(&ps, scratch, scratch_bytes, d, ab->n_tokens);
    DI_ASSERT(ps.cap >= 64);
    /* V3.2 with a selection: the generic kernel over each token's listed positions (the model
     * sends such tokens through mla_decode instead; this serves direct callers) */
    pf_sel sp = {ab->sel_pos, ab->sel_count, ab->sel_stride};
    DI_ASSERT(!ab->sel_pos || ab->sel_count);
    int fast = !ab->sel_pos && dn == PDN && dr == PDR && dv == PDV && r == 512 && ldq % 8 == 0 &&
               ((uintptr_t)q & 15) == 0;
    DI_ASSERT(fast || (dv <= 32 * PG_MAXV && dn + dr <= 32 * PG_MAXQ));
    int max_ctx = ab->max_ctx_len > 0 ? ab->max_ctx_len : 1;
    int CH = ((max_ctx + 63) & ~63);
    if (CH > ps.cap) CH = ps.cap & ~63;
    int G = ps.cap / CH;
    if (G < 1) G = 1;
    int max_q = ab->max_q_len > 0 ? ab->max_q_len : ab->n_tokens;
    pf_args a;
    a.out = (bf16 *)out;
    a.q = (const bf16 *)q;
    a.lat = ps.lat;
    a.kv = ps.kv;
    a.cache = (const bf16 *)cache;
    a.ldq = ldq;
    a.seq_start = ab->seq_start;
    a.ctx_len = ab->seq_ctx_len;
    a.block_table = ab->block_table;
    a.max_blocks = ab->max_blocks;
    a.CH = CH;
    a.H = H;
    a.dn = dn;
    a.dr = dr;
    a.dv = dv;
    a.r = r;
    a.scale = d->softmax_scale;
    a.state = ps.state;
    a.acc = ps.acc;
    const pf_variant *pv = NULL;
    if (fast) {
        pv = &pf_variants[pf_choose(st, max_q, H, (seq_end - seq_begin) < G ? seq_end - seq_begin : G)];
        static bool attr[PF_NV];
        int vi = (int)(pv - pf_variants);
        if (!attr[vi]) {
            if (cuda_note(st, cudaFuncSetAttribute(pv->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, pv->smem),
                          "prefill smem attribute"))
                return;
            attr[vi] = true;
        }
    }
    for (int g0 = seq_begin; g0 < seq_end; g0 += G) {
        int g1 = g0 + G < seq_end ? g0 + G : seq_end, ng = g1 - g0;
        a.g0 = g0;
        a.g1 = g1;
        for (int c0 = 0; c0 < max_ctx; c0 += CH) {
            a.c0 = c0;
            a.first = c0 == 0;
            a.last = c0 + CH >= max_ctx;
            long rows = (long)ng * CH;
            k_prefill_gather<<<(unsigned)rows, 64, 0, st->stream>>>(a, W);
            CUDA_LAUNCHED(st, "prefill_gather");
            cuda_linear(st, ps.kv, kvw, 0, 0, ps.lat, W, W_kvb, (int)rows);
            if (fast) {
                dim3 grid(H, ceil_div_i(max_q, pv->bm), ng);
                pv->fn<<<grid, pv->threads, pv->smem, st->stream>>>(a);
            } else {
                dim3 grid(max_q, ceil_div_i(H, 4), ng);
                k_prefill_generic<<<grid, 128, 0, st->stream>>>(a, sp);
            }
            CUDA_LAUNCHED(st, "mla_prefill");
        }
    }
}
