/* cuda_gemm_tiled.cu - the tiled tensor-core GEMM: BM x 128 output tiles, K in steps of 32
 * through a 4-stage cp.async pipeline, 8 warps of mma.sync m16n8k16 (bf16 in, fp32 out).
 * Serves grouped expert GEMMs (a device-computed tile table maps blocks to experts: no host
 * synchronisation), batched per-head GEMMs, and fp8 weights with weight-only dequantization
 * (each fp8 stage is scaled into a bf16 tile before the tensor cores read it).
 *
 * Owner: cuda. Shared-memory rows are 32 bf16 padded to 40 (80 bytes) so ldmatrix reads are
 * bank-conflict free. With silu_I > 0 the B tile interleaves gate and up rows (row 2i = gate
 * n0+i, row 2i+1 = up n0+i), so each thread holds gate and up of the same output in c0/c1 and
 * the epilogue writes silu(gate) * up directly. Invariants: rows beyond a matrix's count and
 * k beyond K are zero-filled by cp.async; only valid outputs are written. */
#include "backend/cuda/cuda_mma.cuh"

enum { TBN = 128, TBK = 32, TLD = 40, TSTAGES = 4, FP8LD = 48 };

template <int BM, bool FP8>
struct tiled_smem {
    static constexpr int a_bytes = BM * TLD * 2;
    static constexpr int b_bytes = FP8 ? TBN * FP8LD : TBN * TLD * 2;
    static constexpr int stage = a_bytes + b_bytes;
    static constexpr int total = TSTAGES * stage + (FP8 ? TBN * TLD * 2 : 0);
};

template <int BM, bool FP8, bool SILU>
__global__ void __launch_bounds__(256) k_gemm_tiled(gemm_args a) {
    extern __shared__ __align__(16) unsigned char sm[];
    typedef tiled_smem<BM, FP8> L;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    int mat, m0, r0 = 0, cnt;
    if (a.r.offsets) {
        int bx = blockIdx.x, n_mat = a.n_mat;
        if (bx >= a.r.tile_off[n_mat]) return;
        int lo = 0, hi = n_mat; /* largest e with tile_off[e] <= bx */
        while (hi - lo > 1) {
            int mid = (lo + hi) >> 1;
            if (a.r.tile_off[mid] <= bx) lo = mid;
            else hi = mid;
        }
        mat = lo;
        m0 = (bx - a.r.tile_off[mat]) * BM;
        r0 = a.r.offsets[mat];
        cnt = a.r.offsets[mat + 1] - r0;
    } else {
        mat = blockIdx.z;
        m0 = blockIdx.x * BM;
        cnt = a.r.T;
    }
    const int K = a.w.cols, N = a.w.rows, I = a.o.silu_I;
    const int n0 = blockIdx.y * (SILU ? TBN / 2 : TBN);
    const int KT = (K + TBK - 1) / TBK;

    /* per-thread load assignments (fixed for the whole K loop) */
    const bf16 *a_src[BM / 64];
    bool a_ok[BM / 64];
#pragma unroll
    for (int i = 0; i < BM / 64; i++) {
        int row = tid / 4 + i * 64, j = m0 + row;
        a_ok[i] = j < cnt;
        int xr = a_ok[i] ? (a.r.offsets ? (a.r.perm ? a.r.perm[r0 + j] : r0 + j) : j) : 0;
        a_src[i] = a.x + mat * a.x_mat_stride + (long)xr * a.ldx + (tid % 4) * 8;
    }
    /* weight rows this thread copies: bf16: 2 rows x one 16-byte chunk; fp8: 1 row x 16 bytes */
    const int b_rows = FP8 ? 1 : 2;
    long b_row[2];
    bool b_ok[2];
#pragma unroll
    for (int i = 0; i < b_rows; i++) {
        int row = FP8 ? tid / 2 : tid / 4 + i * 64;
        int wr;
        bool ok;
        if (SILU) {
            int p = n0 + row / 2;
            wr = (row & 1) ? I + p : p;
            ok = p < I;
        } else {
            wr = n0 + row;
            ok = wr < N;
        }
        b_row[i] = ok ? wr : 0;
        b_ok[i] = ok;
    }

    auto load_stage = [&](int stage, int kt) {
        unsigned char *As = sm + stage * L::stage;
        unsigned char *Bs = As + L::a_bytes;
        int kbase = kt * TBK;
#pragma unroll
        for (int i = 0; i < BM / 64; i++) {
            int row = tid / 4 + i * 64, kc = kbase + (tid % 4) * 8;
            bool ok = a_ok[i] && kc < K;
            cp_async16(As + (row * TLD + (tid % 4) * 8) * 2, ok ? (const void *)(a_src[i] + kbase) : (const void *)a.x,
                       ok ? 16 : 0);
        }
        if (FP8) {
            int row = tid / 2, ch = tid % 2, kc = kbase + ch * 16;
            int nb = K - kc;
            nb = nb < 0 ? 0 : (nb > 16 ? 16 : nb);
            bool ok = b_ok[0] && nb > 0;
            const uint8_t *src = (const uint8_t *)a.w.data + mat * a.w.mat_stride + b_row[0] * K + kc;
            cp_async16(Bs + row * FP8LD + ch * 16, ok ? (const void *)src : a.w.data, ok ? nb : 0);
        } else {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int row = tid / 4 + i * 64, kc = kbase + (tid % 4) * 8;
                bool ok = b_ok[i] && kc < K;
                const bf16 *src = (const bf16 *)a.w.data + mat * a.w.mat_stride + b_row[i] * K + kc;
                cp_async16(Bs + (row * TLD + (tid % 4) * 8) * 2, ok ? (const void *)src : a.w.data, ok ? 16 : 0);
            }
        }
    };

    constexpr int MI = BM / 32, NJ = 4; /* warp tile (BM/2) x 32 */
    const int wm = warp % 2, wn = warp / 2;
    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

#pragma unroll
    for (int s = 0; s < TSTAGES - 1; s++) {
        if (s < KT) load_stage(s, s);
        cp_async_commit();
    }
    unsigned char *Bconv = sm + TSTAGES * L::stage;
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<TSTAGES - 2>();
        __syncthreads();
        if (kt + TSTAGES - 1 < KT) load_stage((kt + TSTAGES - 1) % TSTAGES, kt + TSTAGES - 1);
        cp_async_commit();
        unsigned char *As = sm + (kt % TSTAGES) * L::stage;
        const unsigned char *Bs = As + L::a_bytes;
        if (FP8) { /* scale this stage's fp8 rows into the bf16 tile */
            int row = tid / 2, ch = tid % 2, kc = kt * TBK + ch * 16;
            float s = 0.f;
            if (b_ok[0] && kc < K)
                s = __ldg(a.w.scale + wscale_at(a.w, mat, b_row[0], kc));
            uint4 raw = *(const uint4 *)(Bs + row * FP8LD + ch * 16);
            uint4 lo = fp8x8_to_bf16x8(make_uint2(raw.x, raw.y), s);
            uint4 hi = fp8x8_to_bf16x8(make_uint2(raw.z, raw.w), s);
            uint4 *d = (uint4 *)(Bconv + (row * TLD + ch * 16) * 2);
            d[0] = lo;
            d[1] = hi;
            __syncthreads();
            Bs = Bconv;
        }
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t af[MI][4], bfr[NJ / 2][4];
#pragma unroll
            for (int i = 0; i < MI; i++) {
                int row = wm * (BM / 2) + i * 16 + (lane & 15);
                ldsm_x4(af[i], As + (row * TLD + kk * 16 + (lane >> 4) * 8) * 2);
            }
#pragma unroll
            for (int j = 0; j < NJ / 2; j++) {
                int row = wn * 32 + j * 16 + ((lane >> 4) & 1) * 8 + (lane & 7);
                ldsm_x4(bfr[j], Bs + (row * TLD + kk * 16 + ((lane >> 3) & 1) * 8) * 2);
            }
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NJ; j++)
                    mma16816(acc[i][j], af[i][0], af[i][1], af[i][2], af[i][3], bfr[j / 2][(j & 1) * 2],
                             bfr[j / 2][(j & 1) * 2 + 1]);
        }
    }
    cp_async_wait<0>();

    /* epilogue */
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            int m = m0 + wm * (BM / 2) + i * 16 + g + hr * 8;
            if (m >= cnt) continue;
            long yrow = a.r.offsets ? r0 + m : m;
            long base = mat * a.o.y_mat_stride + yrow * a.o.ldy;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                int c = wn * 32 + j * 8 + 2 * t4;
                float v0 = acc[i][j][hr * 2], v1 = acc[i][j][hr * 2 + 1];
                if (SILU) {
                    int col = n0 + c / 2;
                    if (col >= I) continue;
                    float v = silu_f(v0) * v1;
                    bf16 *y = (bf16 *)a.o.y + base + col;
                    if (a.o.f32) {
                        float *yf = (float *)a.o.y + base + col;
                        *yf = a.o.accumulate ? *yf + v : v;
                    } else {
                        *y = __float2bfloat16_rn(a.o.accumulate ? __bfloat162float(*y) + v : v);
                    }
                    continue;
                }
                int col = n0 + c;
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    if (col + q >= N) continue;
                    float v = q ? v1 : v0;
                    if (a.o.f32) {
                        float *yf = (float *)a.o.y + base + col + q;
                        *yf = a.o.accumulate ? *yf + v : v;
                    } else {
                        bf16 *y = (bf16 *)a.o.y + base + col + q;
                        *y = __float2bfloat16_rn(a.o.accumulate ? __bfloat162float(*y) + v : v);
                    }
                }
            }
        }
}

template <int BM, bool FP8, bool SILU>
static void launch_t(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    typedef tiled_smem<BM, FP8> L;
    static bool attr_set = false; /* per instantiation; host-only, set once */
    if (!attr_set) {
        if (cuda_note(st, cudaFuncSetAttribute(k_gemm_tiled<BM, FP8, SILU>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               L::total),
                      "gemm_tiled smem attribute"))
            return;
        attr_set = true;
    }
    int ntiles = a->o.silu_I > 0 ? ceil_div_i(a->o.silu_I, TBN / 2) : ceil_div_i(a->w.rows, TBN);
    dim3 grid;
    if (a->r.offsets) grid = dim3(ceil_div_i(a->r.T, BM) + a->n_mat, ntiles, 1);
    else grid = dim3(ceil_div_i(a->r.T, BM), ntiles, a->n_mat);
    k_gemm_tiled<BM, FP8, SILU><<<grid, 256, L::total, s>>>(*a);
    CUDA_LAUNCHED(st, "gemm_tiled");
}

template <bool FP8, bool SILU>
static void launch_bm(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    /* grouped GEMMs use the BM their tile table was built for; plain ones pick by rows */
    int bm = a->r.offsets ? a->r.tile_bm : (a->r.T >= 128 ? 128 : 64);
    if (bm == 128) launch_t<128, FP8, SILU>(st, a, s);
    else launch_t<64, FP8, SILU>(st, a, s);
}

void launch_gemm_tiled(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    bool silu = a->o.silu_I > 0;
    if (a->w.fp8 && a->w.cols % 16 != 0) { /* fp8 rows must be 16-byte aligned for cp.async */
        launch_gemm_generic(st, a, s);
        return;
    }
    if (a->w.fp8) {
        if (silu) launch_bm<true, true>(st, a, s);
        else launch_bm<true, false>(st, a, s);
    } else {
        if (silu) launch_bm<false, true>(st, a, s);
        else launch_bm<false, false>(st, a, s);
    }
}
