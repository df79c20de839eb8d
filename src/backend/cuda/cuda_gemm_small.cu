/* cuda_gemm_small.cu - the "small-M" GEMM: y[j, n] = sum_k x[j, k] W[n, k] for few rows j per
 * matrix (decode steps, experts with a handful of tokens). Memory-bound on the weights, so
 * the weights are streamed once, 16 bytes per thread per access, straight into mma.sync
 * A-fragments (weight rows are the M = 16 side, tokens the N = 8 side), with split-K across
 * the warps of a block when there are few weight rows.
 *
 * Owner: cuda. The K dimension inside each 32-wide chunk is permuted identically for A and B
 * (thread t4 of a quad loads elements 8*t4 .. 8*t4+7 of both the weight row and the token
 * row and feeds elements {0,1},{2,3} to the first mma and {4,5},{6,7} to the second), which
 * leaves every dot product unchanged and lets both operands come from one 16-byte load.
 * Invariants: rows >= the matrix's count, weight rows >= N, and k >= K read nothing and add
 * zeros; each output element is written by exactly one thread. */
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_wload.cuh"

/* columns k..k+7 of row n as 8 bf16 mma operands (fp8 dequantized with its block scale) */
template <bool FP8>
static __device__ __forceinline__ uint4 load_w8(const wview &w, int mat, int n, int k, bool ok) {
    if (!ok) return make_uint4(0, 0, 0, 0);
    uint4 v = wp_load<FP8>(w, mat, n, k, true);
    return FP8 ? fp8x8_to_bf16x8(make_uint2(v.x, v.y), wp_scale(w, mat, n, k, true)) : v;
}

/* NT: n8 token tiles per pass (8*NT tokens); U: 32-wide K chunks loaded before computing. */
template <int NT, int U, bool FP8, bool SILU>
__global__ void __launch_bounds__(256) k_gemm_small(gemm_args a, int R, int S, int kslice) {
    extern __shared__ float red[]; /* [8 warps][32 lanes][NT*4] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int mat = blockIdx.y;
    if (a.r.active) { /* grouped: blockIdx.y walks the experts that have tokens */
        if (mat >= *a.r.n_active) return;
        mat = a.r.active[mat];
    }
    int r0 = 0, cnt = a.r.T;
    if (a.r.offsets) {
        r0 = a.r.offsets[mat];
        cnt = a.r.offsets[mat + 1] - r0;
    }
    if (cnt <= 0) return; /* uniform over the block */
    const int rg = warp % R, ks = warp / R;
    const int K = a.w.cols, I = a.o.silu_I, N = a.w.rows;
    const int gi = blockIdx.x * R + rg;
    int n_lo, n_hi;
    bool ok_lo, ok_hi;
    if (SILU) {
        int i = gi * 8 + g;
        n_lo = i;
        n_hi = I + i;
        ok_lo = ok_hi = i < I;
    } else {
        n_lo = gi * 16 + g;
        n_hi = n_lo + 8;
        ok_lo = n_lo < N;
        ok_hi = n_hi < N;
    }
    const int kb = ks * kslice, ke = min(K, kb + kslice);
    const bf16 *xb = a.x + mat * a.x_mat_stride;

    for (int j0 = 0; j0 < cnt; j0 += 8 * NT) {
        float acc[NT][4];
        const bf16 *xp[NT];
        bool okt[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
            int j = j0 + nt * 8 + g;
            okt[nt] = j < cnt;
            int xr = okt[nt] ? (a.r.offsets ? (a.r.perm ? a.r.perm[r0 + j] : r0 + j) : j) : 0;
            xp[nt] = xb + (long)xr * a.ldx;
        }
        for (int k = kb; k < ke; k += 32 * U) {
            uint4 wl[U], wh[U], xv[U][NT];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int kk = k + u * 32 + 8 * t4;
                bool in = kk < ke;
                wl[u] = load_w8<FP8>(a.w, mat, n_lo, kk, in && ok_lo);
                wh[u] = load_w8<FP8>(a.w, mat, n_hi, kk, in && ok_hi);
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    xv[u][nt] = (in && okt[nt]) ? __ldg((const uint4 *)(xp[nt] + kk)) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    mma16816(acc[nt], wl[u].x, wh[u].x, wl[u].y, wh[u].y, xv[u][nt].x, xv[u][nt].y);
                    mma16816(acc[nt], wl[u].z, wh[u].z, wl[u].w, wh[u].w, xv[u][nt].z, xv[u][nt].w);
                }
        }
        if (S > 1) { /* split-K: warps ks > 0 hand their partial sums to warp ks == 0 */
            float *mine = red + ((long)warp * 32 + lane) * NT * 4;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) mine[nt * 4 + c] = acc[nt][c];
            __syncthreads();
            if (ks == 0)
                for (int s = 1; s < S; s++) {
                    const float *o = red + ((long)(warp + s * R) * 32 + lane) * NT * 4;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int c = 0; c < 4; c++) acc[nt][c] += o[nt * 4 + c];
                }
            __syncthreads();
        }
        if (ks != 0) continue;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int h = 0; h < 2; h++) { /* tokens 2*t4 and 2*t4 + 1 of the tile */
                int j = j0 + nt * 8 + 2 * t4 + h;
                if (j >= cnt) continue;
                long yrow = a.r.offsets ? r0 + j : j;
                long base = mat * a.o.y_mat_stride + yrow * a.o.ldy;
                float v[2];
                int col[2];
                bool ok[2];
                if (SILU) {
                    v[0] = silu_f(acc[nt][h]) * acc[nt][2 + h];
                    col[0] = n_lo;
                    ok[0] = ok_lo;
                    ok[1] = false;
                } else {
                    v[0] = acc[nt][h];
                    v[1] = acc[nt][2 + h];
                    col[0] = n_lo;
                    col[1] = n_hi;
                    ok[0] = ok_lo;
                    ok[1] = ok_hi;
                }
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    if (!ok[q]) continue;
                    if (a.o.f32) {
                        float *y = (float *)a.o.y + base + col[q];
                        *y = a.o.accumulate ? *y + v[q] : v[q];
                    } else {
                        bf16 *y = (bf16 *)a.o.y + base + col[q];
                        *y = __float2bfloat16_rn(a.o.accumulate ? __bfloat162float(*y) + v[q] : v[q]);
                    }
                }
            }
        }
    }
}

template <int NT, int U, bool FP8, bool SILU>
static void launch_t(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    int K = a->w.cols;
    int groups = a->o.silu_I > 0 ? ceil_div_i(a->o.silu_I, 8) : ceil_div_i(a->w.rows, 16);
    int mats = a->n_mat;
    if (a->r.offsets && a->r.T < mats) mats = a->r.T; /* experts that can be active */
    int want = st->n_sm * 24, S = 1;
    while (S < 8 && (long)groups * mats * S < want && ceil_div_i(K, 2 * S) >= 128) S *= 2;
    int R = 8 / S;
    int kslice = (ceil_div_i(K, S) + 31) & ~31;
    dim3 grid(ceil_div_i(groups, R), a->r.active ? mats : a->n_mat);
    size_t smem = S > 1 ? (size_t)8 * 32 * NT * 4 * sizeof(float) : 0;
    k_gemm_small<NT, U, FP8, SILU><<<grid, 256, smem, s>>>(*a, R, S, kslice);
    CUDA_LAUNCHED(st, "gemm_small");
}

template <bool FP8, bool SILU>
static void launch_nt(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    int per = a->r.offsets ? a->r.max_per_mat : a->r.T;
    if (a->r.offsets) { /* experts: size the token tile for the expected, not the worst, count */
        int avg = ceil_div_i(a->r.T, a->n_mat);
        int guess = avg * 2 > 8 ? avg * 2 : 8;
        per = per < guess ? per : guess;
    }
    if (per <= 8) launch_t<1, 8, FP8, SILU>(st, a, s);
    else if (per <= 16) launch_t<2, 8, FP8, SILU>(st, a, s);
    else launch_t<4, 4, FP8, SILU>(st, a, s);
}

/* ---------------------------------------------------------------- GEMV ---- */
/* For at most a few rows per matrix: each warp owns RW weight rows (SILU: RW/2 gate/up pairs)
 * and a K slice; every load instruction reads 512 contiguous bytes of one weight row (lane l
 * takes elements 8l..8l+7 of each 256-wide step), FMA in fp32 against NT token rows, then a
 * warp reduction and, with split-K, a block reduction. fp8 rows are dequantized with their
 * block scale per 8 elements (a 128-column block never straddles a lane's 8 elements).
 * Launched with programmatic dependent launch (cuda_pdl.cuh): a plain GEMV issues its first
 * weight loads, then waits for the previous kernel, then reads x (coherent loads). */
template <int NT, int RW, int U, bool FP8, bool SILU, bool SS>
__global__ void __launch_bounds__(256) k_gemv(gemm_args a, int R, int S, int kslice) {
    __shared__ float red[8][RW][NT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    pdl_launch_dependents();
    /* PDL: plain GEMVs load their first weights before waiting for the previous kernel; grouped
     * ones need the row mapping an earlier kernel wrote */
    bool waited = false;
    if (a.r.offsets || a.r.active) {
        pdl_wait();
        waited = true;
    }
    int mat = blockIdx.y;
    if (a.r.active) {
        if (mat >= *a.r.n_active) return;
        mat = a.r.active[mat];
    }
    int r0 = 0, cnt = a.r.T;
    if (a.r.offsets) {
        r0 = a.r.offsets[mat];
        cnt = a.r.offsets[mat + 1] - r0;
    }
    if (cnt <= 0) return;
    const int rg = warp % R, ks = warp / R, gi = blockIdx.x * R + rg;
    const int K = a.w.cols, I = a.o.silu_I, N = a.w.rows;
    int rows[RW];
    bool rok[RW];
#pragma unroll
    for (int r = 0; r < RW; r++) {
        if (SILU) { /* rows 0..RW/2-1 gate, RW/2.. the matching up rows */
            int i = gi * (RW / 2) + (r % (RW / 2));
            rows[r] = r < RW / 2 ? i : I + i;
            rok[r] = i < I;
        } else {
            rows[r] = gi * RW + r;
            rok[r] = rows[r] < N;
        }
    }
    const int kb = ks * kslice, ke = min(K, kb + kslice);
    const bf16 *xb = a.x + mat * a.x_mat_stride;
    for (int j0 = 0; j0 < cnt; j0 += NT) {
        float acc[RW][NT];
        const bf16 *xp[NT];
        bool okt[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int j = j0 + t;
            okt[t] = j < cnt;
            int xr = okt[t] ? (a.r.offsets ? (a.r.perm ? a.r.perm[r0 + j] : r0 + j) : j) : 0;
            xp[t] = xb + (long)xr * a.ldx;
#pragma unroll
            for (int r = 0; r < RW; r++) acc[r][t] = 0.f;
        }
        for (int k0 = kb + lane * 8; k0 < ke; k0 += 256 * U) {
            /* weights as raw bits (few registers, many loads in flight), converted when used;
             * SS (fp8): one scale load per piece for each group of rows that shares it */
            wraw<FP8> w[U][RW];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int k = k0 + u * 256;
                bool in = k < ke;
                if (SS) {
#pragma unroll
                    for (int r = 0; r < RW; r++) w[u][r].v = wp_load<FP8>(a.w, mat, rows[r], k, in && rok[r]);
#pragma unroll
                    for (int q = 0; q < (SILU ? 2 : 1); q++) {
                        float sq = wp_scale(a.w, mat, rows[q * (RW / 2)], k, in && rok[q * (RW / 2)]);
#pragma unroll
                        for (int r = 0; r < RW; r++)
                            if ((SILU && r >= RW / 2 ? 1 : 0) == q) w[u][r].s = sq;
                    }
                } else {
#pragma unroll
                    for (int r = 0; r < RW; r++) w[u][r] = wload<FP8>(a.w, mat, rows[r], k, in && rok[r]);
                }
            }
            if (!waited) {
                pdl_wait();
                waited = true;
            }
            uint4 xr[U][NT];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int k = k0 + u * 256;
                bool in = k < ke;
#pragma unroll
                for (int t = 0; t < NT; t++) xr[u][t] = (in && okt[t]) ? ld_act16(xp[t] + k) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                float x[NT][8];
#pragma unroll
                for (int t = 0; t < NT; t++) bf16x8_float(xr[u][t], x[t]);
#pragma unroll
                for (int r = 0; r < RW; r++) {
                    float wf[8];
                    wfloat<FP8>(w[u][r], wf);
#pragma unroll
                    for (int t = 0; t < NT; t++)
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[r][t] = fmaf(wf[e], x[t][e], acc[r][t]);
                }
            }
        }
        if (!waited) { /* a lane whose K slice was empty */
            pdl_wait();
            waited = true;
        }
#pragma unroll
        for (int r = 0; r < RW; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
        if (S > 1) {
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < RW; r++)
#pragma unroll
                    for (int t = 0; t < NT; t++) red[warp][r][t] = acc[r][t];
            __syncthreads();
            if (ks == 0)
                for (int q = 1; q < S; q++)
#pragma unroll
                    for (int r = 0; r < RW; r++)
#pragma unroll
                        for (int t = 0; t < NT; t++) acc[r][t] += red[warp + q * R][r][t];
            __syncthreads();
        }
        if (ks != 0 || lane >= NT) continue;
        /* lane t writes token j0 + t (NT <= 32) */
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t != lane || !okt[t]) continue;
            long yrow = a.r.offsets ? r0 + j0 + t : j0 + t;
            long base = mat * a.o.y_mat_stride + yrow * a.o.ldy;
#pragma unroll
            for (int r = 0; r < (SILU ? RW / 2 : RW); r++) {
                if (!rok[r]) continue;
                float v = acc[r][t];
                if (SILU) {
                    float gv = acc[r][t], uv = acc[r + RW / 2][t];
                    if (a.o.silu_round) {
                        gv = __bfloat162float(__float2bfloat16_rn(gv));
                        uv = __bfloat162float(__float2bfloat16_rn(uv));
                    }
                    v = silu_f(gv) * uv;
                }
                int col = rows[r];
                if (a.o.f32) {
                    float *y = (float *)a.o.y + base + col;
                    *y = a.o.accumulate ? *y + v : v;
                } else {
                    bf16 *y = (bf16 *)a.o.y + base + col;
                    *y = __float2bfloat16_rn(a.o.accumulate ? __bfloat162float(*y) + v : v);
                }
            }
        }
    }
}

/* K slices of a GEMV of `groups` row groups over `mats` matrices: split K over the warps of a
 * block while the grid is short of st->gemv_want warps per SM (st->side_gemv_want on the side
 * lane) and each slice keeps at least st->gemv_min_k columns */
int gemv_splits(const cuda_state *st, int groups, int mats, int K) {
    int want = st->n_sm * (st->on_side ? st->side_gemv_want : st->gemv_want), S = 1;
    while (S < 8 && (long)groups * mats * S < want && ceil_div_i(K, 2 * S) >= st->gemv_min_k) S *= 2;
    return S;
}

/* U = 16-byte weight loads in flight per lane and row in one K step: bf16 1; fp8 (8-byte loads)
 * 2 at 1-2 tokens, else 1. Measured on v2lite-8l (bf16, 2026-12-01, same calls): U = 1 instead
 * of 2 took batch-1 decode from 1088-1094 to 1145-1147 tok/s and batches 2 / 4 / 8 up 3%: more
 * resident warps beat more loads per warp. RW = 4 rows per warp (2: 1068 tok/s, 8: 1094-1122). */
template <int NT, bool FP8, bool SILU, bool SS>
static void launch_gemv_t(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    constexpr int RW = 4, U = FP8 && NT <= 2 ? 2 : 1;
    int K = a->w.cols;
    int groups = a->o.silu_I > 0 ? ceil_div_i(a->o.silu_I, RW / 2) : ceil_div_i(a->w.rows, RW);
    int mats = a->n_mat;
    if (a->r.offsets && a->r.T < mats) mats = a->r.T;
    int S = gemv_splits(st, groups, mats, K);
    int R = 8 / S;
    int kslice = (ceil_div_i(K, S) + 255) & ~255;
    dim3 grid(ceil_div_i(groups, R), a->r.active ? mats : a->n_mat);
    if (s == st->stream) cuda_launch_pdl(st, st->pdl >= 1, k_gemv<NT, RW, U, FP8, SILU, SS>, grid, dim3(256), 0, *a, R, S, kslice);
    else k_gemv<NT, RW, U, FP8, SILU, SS><<<grid, 256, 0, s>>>(*a, R, S, kslice);
    CUDA_LAUNCHED(st, "gemv");
}

/* SS (fp8, one row per pass): a warp's rows (4 consecutive rows; SILU: 2 gate rows and the 2
 * matching up rows) lie in one block of scale rows whenever the block height is a multiple of
 * the group (DeepSeek's 128), so one scale load per piece serves the group. Measured
 * (bench_cuda_decode gemv --fp8, 2026-12-02, docs/PERF.md): at one row 3-40% faster on weights
 * of 6-45 MB (dense down 13.7 -> 8.2 us), the same at 4 MB, 5-7% slower below 2 MB; at 4 rows
 * mixed (-34% to +40%), so only one-row passes over weights of at least 4 MiB take it. */
template <bool FP8, bool SILU>
static void launch_gemv_nt(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    int per = a->r.offsets ? ceil_div_i(a->r.T, a->n_mat) * 2 : a->r.T;
    if (per <= 1) {
        const int g = SILU ? 2 : 4;
        double bytes = (double)a->w.rows * a->w.cols * a->n_mat;
        if (FP8 && a->w.br % g == 0 && (!SILU || a->o.silu_I % g == 0) && bytes >= 4.0 * 1048576.0)
            launch_gemv_t<1, FP8, SILU, FP8>(st, a, s);
        else
            launch_gemv_t<1, FP8, SILU, false>(st, a, s);
    } else if (per <= 2) {
        launch_gemv_t<2, FP8, SILU, false>(st, a, s);
    } else {
        launch_gemv_t<4, FP8, SILU, false>(st, a, s);
    }
}

void launch_gemv(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    bool silu = a->o.silu_I > 0;
    if (a->w.fp8) {
        if (silu) launch_gemv_nt<true, true>(st, a, s);
        else launch_gemv_nt<true, false>(st, a, s);
    } else {
        if (silu) launch_gemv_nt<false, true>(st, a, s);
        else launch_gemv_nt<false, false>(st, a, s);
    }
}

void launch_gemm_small(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    bool silu = a->o.silu_I > 0;
    if (a->w.fp8) {
        if (silu) launch_nt<true, true>(st, a, s);
        else launch_nt<true, false>(st, a, s);
    } else {
        if (silu) launch_nt<false, true>(st, a, s);
        else launch_nt<false, false>(st, a, s);
    }
}
