/* cuda_gemm_wgmma.cu - the Hopper grouped expert GEMM: warpgroup MMA (wgmma.mma_async
 * m64n256k16, bf16 in, fp32 accumulate) from 128-byte-swizzled shared-memory tiles, for the
 * routed experts of steps with at least st->wgmma_min_rows (16) rows per expert on average:
 * prefill and large decode batches (the caller's tile table has BM = 128, or 64 where the
 * experts average at most st->wgmma_bm64_max (32) rows; with few rows most of a tile is empty,
 * but the weights still stream once, which is what the time is made of).
 *
 * Owner: cuda. Persistent CTAs (one per SM) of two warpgroups; each computes BM x 256 output
 * tiles of one expert: at BM = 128 warpgroup w owns rows 64w..64w+63 (m64n256k16), K in steps
 * of 64 through a 4-stage cp.async ring prefetched two steps ahead across tile boundaries (the
 * third buffer is still read by the wgmma group left in flight); at BM = 64 both warpgroups
 * read the same 64 rows and split the 256 weight rows (m64n128k16), and the smaller A tile
 * leaves room for a 5-stage ring prefetched three steps ahead (decode batch 256 on an H100:
 * gate+up 301 -> 284 us per layer, the step +2.7%; docs/PERF.md 2026-12-05). Every thread
 * copies 16-byte chunks straight into the swizzled layout the wgmma descriptors describe:
 * chunk c (8 bf16 of K) of tile row r lives at r * 128 + ((c ^ (r % 8)) * 16) inside a
 * 1024-byte aligned tile, i.e. the canonical K-major SWIZZLE_128B layout (8-row atoms 1024
 * bytes apart).
 * A rows are gathered through perm (gate+up) or contiguous (down); rows past an expert's count,
 * weight rows past N and K past the end are zero-filled by cp.async, and only valid outputs are
 * written. With silu_I > 0 the B tile holds gate rows n0..n0+127 in rows 0..127 and the up rows
 * I+n0.. in rows 128..255, so each thread's accumulators hold gate and up of the same output
 * column (accumulator groups j and j + 16, 128 columns apart) and the epilogue writes
 * silu(gate) * up (at BM = 64 warpgroup h's 128 rows are gate n0 + 64h.. then the same up
 * rows: accumulator groups j and j + 8). Measured (H200, ncu, V2-Lite at 8192 tokens): tensor
 * pipe ~65-70% busy, L2 ~59%, so the gap to cuBLAS is most likely pipeline bubbles (a CTA-wide
 * barrier per step).
 * bf16 weights and bf16 output only (gemm_wgmma_ok); fp8 stays on cuda_gemm_tiled.cu. Every
 * output element is one fixed-order fp32 sum: deterministic. */
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

enum { WBN = 256, WBK = 64, WTHREADS = 256, W_B_BYTES = WBN * WBK * 2 };

/* The two tile heights. BM = 128: warpgroup w owns A rows 64w.. against all 256 B rows
 * (m64n256k16), a 4-stage ring prefetched 2 steps ahead. BM = 64 (decode-sized experts, at most
 * a few dozen rows each): both warpgroups read the same 64 A rows, warpgroup w B rows 128w..
 * (m64n128k16); the smaller A tile leaves room for a 5-stage ring prefetched 3 steps ahead, so
 * a CTA keeps ~50% more weight bytes in flight. Slot (g + DIST) % STAGES is refilled at step g
 * once the MMAs of g - 2 retired: DIST <= STAGES - 2. */
template <int BM>
struct wcfg {
    static constexpr int a_bytes = BM * WBK * 2, stage = a_bytes + W_B_BYTES;
    static constexpr int stages = BM == 128 ? 4 : 5, dist = stages - 2;
    static constexpr int smem = stages * stage + 1024; /* + slack to align the ring to 1024 bytes */
    static constexpr int acc = BM == 128 ? 128 : 64;  /* accumulators per thread */
};
static_assert(wcfg<128>::smem <= CUDA_MAX_SMEM && wcfg<64>::smem <= CUDA_MAX_SMEM, "ring fits shared memory");

/* The output tile t of a grouped GEMM: n tile t % ntiles (fastest, so the CTAs working at the
 * same time share their A rows in L2), row tile t / ntiles of the tile table. */
struct wtile {
    int mat, m0, r0, cnt, n0;
};

static __device__ __forceinline__ wtile wtile_of(const gemm_args &a, int t, int ntiles, int bn, int bm) {
    wtile w;
    int mt = t / ntiles, lo = 0, hi = a.n_mat; /* largest e with tile_off[e] <= mt */
    while (hi - lo > 1) {
        int mid = (lo + hi) >> 1;
        if (a.r.tile_off[mid] <= mt) lo = mid;
        else hi = mid;
    }
    w.mat = lo;
    w.m0 = (mt - a.r.tile_off[lo]) * bm;
    w.r0 = a.r.offsets[lo];
    w.cnt = a.r.offsets[lo + 1] - w.r0;
    w.n0 = (t % ntiles) * bn;
    return w;
}

/* Persistent: CTA b computes tiles b, b + gridDim.x, ... One flat pipeline runs over all of
 * its (tile, k step) pairs, so the next tile's first stages load during this tile's last steps
 * and epilogue. Step g reads ring buffer g % stages and, once every thread passed the barrier
 * of step g (so both warpgroups retired the MMAs of step g - 2), refills buffer
 * (g + dist) % stages = (g - 2) % stages. */
template <bool SILU, int BM>
__global__ void __launch_bounds__(WTHREADS, 1) k_gemm_wgmma(gemm_args a, int ntiles) {
    typedef wcfg<BM> C;
    extern __shared__ unsigned char wsm_raw[];
    const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31;
    const int total = a.r.tile_off[a.n_mat] * ntiles, step = gridDim.x;
    if ((int)blockIdx.x >= total) return;
    const int K = a.w.cols, N = a.w.rows, I = a.o.silu_I, BN = SILU ? WBN / 2 : WBN;
    const int KT = (K + WBK - 1) / WBK;

    /* the ring, 1024-byte aligned (the swizzle pattern repeats every 1024 bytes) */
    const uint32_t raw = smem_u32(wsm_raw);
    const uint32_t ring = (raw + 1023u) & ~1023u;
    unsigned char *ring_p = wsm_raw + (ring - raw);

    /* this thread's copies: chunk c of rows tid/8 + 32i (A: i < BM / 32, B: i < 8); the swizzled
     * chunk is the same for all of them (32i keeps r % 8) */
    const int c = tid & 7, rr = tid >> 3, sw = ((c ^ (rr & 7)) << 4) + rr * 128;
    const bf16 *a_src[BM / 32];
    bool a_ok[BM / 32];
    const bf16 *b_src[WBN / 32];
    bool b_ok[WBN / 32];
    auto set_sources = [&](int t) {
        wtile w = wtile_of(a, t, ntiles, BN, BM);
#pragma unroll
        for (int i = 0; i < BM / 32; i++) {
            int j = w.m0 + rr + 32 * i;
            a_ok[i] = j < w.cnt;
            int xr = a_ok[i] ? (a.r.perm ? a.r.perm[w.r0 + j] : w.r0 + j) : 0;
            a_src[i] = a.x + (long)xr * a.ldx + c * 8;
        }
        const bf16 *wbase = (const bf16 *)a.w.data + w.mat * a.w.mat_stride;
#pragma unroll
        for (int i = 0; i < WBN / 32; i++) {
            int row = rr + 32 * i, wr;
            bool ok;
            if (SILU && BM == 128) { /* gate rows n0.. in rows 0..127, up rows in 128..255 */
                int p = w.n0 + (row & 127);
                wr = row < 128 ? p : I + p;
                ok = p < I;
            } else if (SILU) { /* warpgroup h's 128 rows: gate n0 + 64h.., then up */
                int p = w.n0 + 64 * (row >> 7) + (row & 63);
                wr = (row & 64) ? I + p : p;
                ok = p < I;
            } else {
                wr = w.n0 + row;
                ok = wr < N;
            }
            b_ok[i] = ok;
            b_src[i] = wbase + (long)(ok ? wr : 0) * K + c * 8;
        }
    };

    /* the loader's position: tile lt, k step lk, ring slot ls */
    int lt = blockIdx.x, lk = 0, ls = 0;
    set_sources(lt);
    auto load_next = [&]() {
        if (lt < total) {
            unsigned char *As = ring_p + (ls % C::stages) * C::stage;
            unsigned char *Bs = As + C::a_bytes;
            const int kb = lk * WBK;
            const bool kok = kb + c * 8 < K;
#pragma unroll
            for (int i = 0; i < BM / 32; i++) {
                bool ok = a_ok[i] && kok;
                cp_async16(As + sw + i * 32 * 128, ok ? (const void *)(a_src[i] + kb) : (const void *)a.x,
                           ok ? 16 : 0);
            }
#pragma unroll
            for (int i = 0; i < WBN / 32; i++) {
                bool ok = b_ok[i] && kok;
                cp_async16(Bs + sw + i * 32 * 128, ok ? (const void *)(b_src[i] + kb) : a.w.data, ok ? 16 : 0);
            }
            ls++;
            if (++lk == KT) {
                lk = 0;
                lt += step;
                if (lt < total) set_sources(lt);
            }
        }
        cp_async_commit(); /* one group per step, empty or not, keeps the wait counts exact */
    };

#pragma unroll
    for (int s = 0; s < C::dist; s++) load_next();

    constexpr int NACC = C::acc, NJ = NACC / 4; /* NJ column groups of 8 per thread */
    float d[NACC];
    int g = 0; /* flat step: ring slot g % stages */
    const int t4 = lane & 3;
    for (int t = blockIdx.x; t < total; t += step) {
#pragma unroll
        for (int i = 0; i < NACC; i++) d[i] = 0.f;
        for (int kt = 0; kt < KT; kt++, g++) {
            cp_async_wait<C::dist - 1>(); /* this thread's copies of step g have landed */
            fence_proxy_async();
            __syncthreads(); /* everyone's copies of g landed; MMAs of g - 2 retired in both warpgroups */
            const uint32_t as = ring + (g % C::stages) * C::stage, bs = as + C::a_bytes;
            wg_fence_acc<NACC>(d);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < WBK / 16; kk++) {
                if (BM == 128) wgmma_256(d, wg_desc(as + wg * 64 * 128 + kk * 32), wg_desc(bs + kk * 32));
                else wgmma_128(d, wg_desc(as + kk * 32), wg_desc(bs + wg * 128 * 128 + kk * 32));
            }
            wg_commit();
            load_next(); /* step g + dist into slot (g - 2) % stages, while the MMAs run */
            wg_wait<1>(); /* the MMAs of g - 1 are done */
            wg_fence_acc<NACC>(d);
        }
        wg_wait<0>();
        wg_fence_acc<NACC>(d);

        /* epilogue: d[4j + h] is row 16wq + lane/4 (+8 for h >= 2) of the warpgroup's 64 rows,
         * column 8j + 2(lane%4) + (h & 1) of its B rows; SILU pairs gate column j with up j + NJ/2 */
        const wtile w = wtile_of(a, t, ntiles, BN, BM);
        const int mrow = BM == 128 ? wg * 64 : 0;
        const int ncol = BM == 128 ? 0 : (SILU ? 64 : 128) * wg; /* the warpgroup's first column */
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            int m = w.m0 + mrow + wq * 16 + (lane >> 2) + hr * 8;
            if (m >= w.cnt) continue;
            bf16 *y = (bf16 *)a.o.y + (long)(w.r0 + m) * a.o.ldy;
            if (SILU) {
#pragma unroll
                for (int j = 0; j < NJ / 2; j++) {
                    int col = w.n0 + ncol + 8 * j + 2 * t4;
                    if (col >= I) continue;
                    float v0 = silu_f(d[4 * j + 2 * hr]) * d[4 * (j + NJ / 2) + 2 * hr];
                    float v1 = silu_f(d[4 * j + 2 * hr + 1]) * d[4 * (j + NJ / 2) + 2 * hr + 1];
                    *(uint32_t *)(y + col) = pack_bf16(v0, v1);
                }
            } else {
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    int col = w.n0 + ncol + 8 * j + 2 * t4;
                    if (col >= N) continue;
                    *(uint32_t *)(y + col) = pack_bf16(d[4 * j + 2 * hr], d[4 * j + 2 * hr + 1]);
                }
            }
        }
    }
    cp_async_wait<0>();
}

/* The shapes k_gemm_wgmma serves: grouped bf16 GEMMs whose tile table has BM = 128 or 64, bf16
 * output written (not accumulated) with 4-byte-aligned column pairs. */
int gemm_wgmma_ok(const gemm_args *a) {
    if (!a->r.offsets || !a->r.tile_off || (a->r.tile_bm != 128 && a->r.tile_bm != 64) || a->w.fp8) return 0;
    if (a->o.f32 || a->o.accumulate || a->o.y_mat_stride != 0 || a->x_mat_stride != 0) return 0;
    if (a->w.cols % 8 != 0 || a->ldx % 8 != 0 || a->o.ldy % 2 != 0 || ((uintptr_t)a->o.y & 3) != 0) return 0;
    if (a->o.silu_I > 0 ? a->o.silu_I % 2 != 0 : a->w.rows % 2 != 0) return 0;
    return 1;
}

template <bool SILU, int BM>
static void launch_w(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    static bool attr_set = false; /* per instantiation; host-only, set once */
    if (!attr_set) {
        if (cuda_note(st,
                      cudaFuncSetAttribute(k_gemm_wgmma<SILU, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           wcfg<BM>::smem),
                      "gemm_wgmma smem attribute"))
            return;
        attr_set = true;
    }
    int ntiles = SILU ? ceil_div_i(a->o.silu_I, WBN / 2) : ceil_div_i(a->w.rows, WBN);
    /* persistent: one CTA per SM (the tile count lives on the device), fewer if the tile
     * table's upper bound is smaller */
    long tiles = (long)(ceil_div_i(a->r.T, BM) + a->n_mat) * ntiles;
    int grid = tiles < st->n_sm ? (int)tiles : st->n_sm;
    k_gemm_wgmma<SILU, BM><<<grid, WTHREADS, wcfg<BM>::smem, s>>>(*a, ntiles);
    CUDA_LAUNCHED(st, "gemm_wgmma");
}

void launch_gemm_wgmma(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    bool bm64 = a->r.tile_bm == 64;
    if (a->o.silu_I > 0) bm64 ? launch_w<true, 64>(st, a, s) : launch_w<true, 128>(st, a, s);
    else bm64 ? launch_w<false, 64>(st, a, s) : launch_w<false, 128>(st, a, s);
}
