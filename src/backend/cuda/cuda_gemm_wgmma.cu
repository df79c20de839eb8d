/* cuda_gemm_wgmma.cu - the Hopper grouped expert GEMM: warpgroup MMA (wgmma.mma_async
 * m64n256k16, bf16 in, fp32 accumulate) from 128-byte-swizzled shared-memory tiles, for the
 * routed experts of prefill (many rows per expert; the caller's tile table has BM = 128).
 *
 * Owner: cuda. Persistent CTAs (one per SM) of two warpgroups; each computes 128 x 256 output
 * tiles of one expert (warpgroup w owns rows 64w..64w+63); K in steps of 64 through a 4-stage
 * cp.async ring, prefetched two steps ahead across tile boundaries (the third buffer is still
 * read by the wgmma group left in flight). Every thread copies 16-byte chunks straight into
 * the swizzled layout the wgmma descriptors describe: chunk c (8 bf16 of K) of tile row r
 * lives at r * 128 + ((c ^ (r % 8)) * 16) inside a 1024-byte aligned tile, i.e. the canonical
 * K-major SWIZZLE_128B layout (8-row atoms 1024 bytes apart).
 * A rows are gathered through perm (gate+up) or contiguous (down); rows past an expert's count,
 * weight rows past N and K past the end are zero-filled by cp.async, and only valid outputs are
 * written. With silu_I > 0 the B tile holds gate rows n0..n0+127 in rows 0..127 and the up rows
 * I+n0.. in rows 128..255, so each thread's accumulators hold gate and up of the same output
 * column (accumulator groups j and j + 16, 128 columns apart) and the epilogue writes
 * silu(gate) * up. Measured (H200, ncu, V2-Lite at 8192 tokens): tensor pipe ~65-70% busy,
 * L2 ~59%, so the gap to cuBLAS is most likely pipeline bubbles (a CTA-wide barrier per step).
 * bf16 weights and bf16 output only (gemm_wgmma_ok); fp8 stays on cuda_gemm_tiled.cu. Every
 * output element is one fixed-order fp32 sum: deterministic. */
#include "backend/cuda/cuda_mma.cuh"

enum { WBM = 128, WBN = 256, WBK = 64, WSTAGES = 4, WDIST = 2, WTHREADS = 256 };
enum { W_A_BYTES = WBM * WBK * 2, W_B_BYTES = WBN * WBK * 2, W_STAGE = W_A_BYTES + W_B_BYTES };
enum { W_SMEM = WSTAGES * W_STAGE + 1024 }; /* + slack to align the ring to 1024 bytes */

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DI_WGMMA 1
#endif

/* Shared-memory matrix descriptor of a K-major bf16 tile with 128-byte rows, SWIZZLE_128B:
 * start address >> 4 (bits 0-13), leading byte offset (unused for swizzled K-major, 1),
 * stride byte offset = 1024 (8-row atoms, >> 4, bits 32-45), layout type 1 = 128B swizzle
 * (bits 62-63). Base offset 0: every tile starts 1024-byte aligned; the k16 slices of a
 * 64-wide tile start 32 bytes apart (the swizzle applies to the computed address). */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

static __device__ __forceinline__ void wg_fence() {
#ifdef DI_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void wg_commit() {
#ifdef DI_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
static __device__ __forceinline__ void wg_wait() {
#ifdef DI_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* keeps the compiler from moving accumulator reads / writes across the async MMAs */
static __device__ __forceinline__ void wg_fence_acc(float *d) {
#pragma unroll
    for (int i = 0; i < 128; i++) asm volatile("" : "+f"(d[i])::"memory");
}
/* cp.async writes (generic proxy) -> visible to wgmma reads (async proxy) */
static __device__ __forceinline__ void fence_proxy_async() {
#ifdef DI_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* d[64 x 256] += A[64 x 16] . B[256 x 16]^T, both K-major in shared memory */
static __device__ __forceinline__ void wgmma_256(float *d, uint64_t da, uint64_t db) {
#ifdef DI_WGMMA
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
        "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
        "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
        "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
        "}, %128, %129, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(1));
#else
    (void)d;
    (void)da;
    (void)db;
    __trap();
#endif
}

/* The output tile t of a grouped GEMM: n tile t % ntiles (fastest, so the CTAs working at the
 * same time share their A rows in L2), row tile t / ntiles of the tile table. */
struct wtile {
    int mat, m0, r0, cnt, n0;
};

static __device__ __forceinline__ wtile wtile_of(const gemm_args &a, int t, int ntiles, int bn) {
    wtile w;
    int mt = t / ntiles, lo = 0, hi = a.n_mat; /* largest e with tile_off[e] <= mt */
    while (hi - lo > 1) {
        int mid = (lo + hi) >> 1;
        if (a.r.tile_off[mid] <= mt) lo = mid;
        else hi = mid;
    }
    w.mat = lo;
    w.m0 = (mt - a.r.tile_off[lo]) * WBM;
    w.r0 = a.r.offsets[lo];
    w.cnt = a.r.offsets[lo + 1] - w.r0;
    w.n0 = (t % ntiles) * bn;
    return w;
}

/* Persistent: CTA b computes tiles b, b + gridDim.x, ... One flat pipeline runs over all of
 * its (tile, k step) pairs, so the next tile's first stages load during this tile's last steps
 * and epilogue. Step g reads ring buffer g % 4 and, once every thread passed the barrier of
 * step g (so both warpgroups retired the MMAs of step g - 2), refills buffer (g + 2) % 4. */
template <bool SILU>
__global__ void __launch_bounds__(WTHREADS, 1) k_gemm_wgmma(gemm_args a, int ntiles) {
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

    /* this thread's copies: chunk c of rows tid/8 + 32i (A: i < 4, B: i < 8); the swizzled
     * chunk is the same for all of them (32i keeps r % 8) */
    const int c = tid & 7, rr = tid >> 3, sw = ((c ^ (rr & 7)) << 4) + rr * 128;
    const bf16 *a_src[WBM / 32];
    bool a_ok[WBM / 32];
    const bf16 *b_src[WBN / 32];
    bool b_ok[WBN / 32];
    auto set_sources = [&](int t) {
        wtile w = wtile_of(a, t, ntiles, BN);
#pragma unroll
        for (int i = 0; i < WBM / 32; i++) {
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
            if (SILU) {
                int p = w.n0 + (row & 127);
                wr = row < 128 ? p : I + p;
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
            unsigned char *As = ring_p + (ls % WSTAGES) * W_STAGE;
            unsigned char *Bs = As + W_A_BYTES;
            const int kb = lk * WBK;
            const bool kok = kb + c * 8 < K;
#pragma unroll
            for (int i = 0; i < WBM / 32; i++) {
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
    for (int s = 0; s < WDIST; s++) load_next();

    float d[128];
    int g = 0; /* flat step: ring slot g % 4 */
    const int t4 = lane & 3;
    for (int t = blockIdx.x; t < total; t += step) {
#pragma unroll
        for (int i = 0; i < 128; i++) d[i] = 0.f;
        for (int kt = 0; kt < KT; kt++, g++) {
            cp_async_wait<WDIST - 1>(); /* this thread's copies of step g have landed */
            fence_proxy_async();
            __syncthreads(); /* everyone's copies of g landed; MMAs of g - 2 retired in both warpgroups */
            const uint32_t as = ring + (g % WSTAGES) * W_STAGE, bs = as + W_A_BYTES;
            wg_fence_acc(d);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < WBK / 16; kk++)
                wgmma_256(d, wg_desc(as + wg * 64 * 128 + kk * 32), wg_desc(bs + kk * 32));
            wg_commit();
            load_next(); /* step g + 2 into slot (g + 2) % 4 = (g - 2) % 4, while the MMAs run */
            wg_wait<1>(); /* the MMAs of g - 1 are done */
            wg_fence_acc(d);
        }
        wg_wait<0>();
        wg_fence_acc(d);

        /* epilogue: d[4j + h] is row 16wq + lane/4 (+8 for h >= 2), column 8j + 2(lane%4) + (h & 1) */
        const wtile w = wtile_of(a, t, ntiles, BN);
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            int m = w.m0 + wg * 64 + wq * 16 + (lane >> 2) + hr * 8;
            if (m >= w.cnt) continue;
            bf16 *y = (bf16 *)a.o.y + (long)(w.r0 + m) * a.o.ldy;
            if (SILU) {
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    int col = w.n0 + 8 * j + 2 * t4;
                    if (col >= I) continue;
                    float v0 = silu_f(d[4 * j + 2 * hr]) * d[4 * (j + 16) + 2 * hr];
                    float v1 = silu_f(d[4 * j + 2 * hr + 1]) * d[4 * (j + 16) + 2 * hr + 1];
                    *(uint32_t *)(y + col) = pack_bf16(v0, v1);
                }
            } else {
#pragma unroll
                for (int j = 0; j < 32; j++) {
                    int col = w.n0 + 8 * j + 2 * t4;
                    if (col >= N) continue;
                    *(uint32_t *)(y + col) = pack_bf16(d[4 * j + 2 * hr], d[4 * j + 2 * hr + 1]);
                }
            }
        }
    }
    cp_async_wait<0>();
}

/* The shapes k_gemm_wgmma serves: grouped bf16 GEMMs whose tile table has BM = 128, bf16
 * output written (not accumulated) with 4-byte-aligned column pairs. */
int gemm_wgmma_ok(const gemm_args *a) {
    if (!a->r.offsets || !a->r.tile_off || a->r.tile_bm != WBM || a->w.fp8) return 0;
    if (a->o.f32 || a->o.accumulate || a->o.y_mat_stride != 0 || a->x_mat_stride != 0) return 0;
    if (a->w.cols % 8 != 0 || a->ldx % 8 != 0 || a->o.ldy % 2 != 0 || ((uintptr_t)a->o.y & 3) != 0) return 0;
    if (a->o.silu_I > 0 ? a->o.silu_I % 2 != 0 : a->w.rows % 2 != 0) return 0;
    return 1;
}

template <bool SILU>
static void launch_w(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    static bool attr_set = false; /* per instantiation; host-only, set once */
    if (!attr_set) {
        if (cuda_note(st, cudaFuncSetAttribute(k_gemm_wgmma<SILU>, cudaFuncAttributeMaxDynamicSharedMemorySize, W_SMEM),
                      "gemm_wgmma smem attribute"))
            return;
        attr_set = true;
    }
    int ntiles = SILU ? ceil_div_i(a->o.silu_I, WBN / 2) : ceil_div_i(a->w.rows, WBN);
    /* persistent: one CTA per SM (the tile count lives on the device), fewer if the tile
     * table's upper bound is smaller */
    long tiles = (long)(ceil_div_i(a->r.T, WBM) + a->n_mat) * ntiles;
    int grid = tiles < st->n_sm ? (int)tiles : st->n_sm;
    k_gemm_wgmma<SILU><<<grid, WTHREADS, W_SMEM, s>>>(*a, ntiles);
    CUDA_LAUNCHED(st, "gemm_wgmma");
}

void launch_gemm_wgmma(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    if (a->o.silu_I > 0) launch_w<true>(st, a, s);
    else launch_w<false>(st, a, s);
}
