/* cuda_gemm_rows.cu - the "few rows" plain GEMM: y[j, n] (+)= sum_k x[j, k] W[mat][n, k] for
 * 2..16 rows j of a decode step (attention and dense projections at batch 2-16, the per-head
 * absorptions of a bmm), launched with programmatic dependent launch so that the weights,
 * which no kernel writes, are already in registers when the previous kernel ends.
 *
 * Why a kernel of its own (DEEPINFER_CUDA_ROWS_GEMM, an experiment, off by default): at 16 rows
 * cuBLASLt streams the 8-13 MB attention projections at 1.4-2.0 TB/s (docs/PERF.md: o_proj
 * 5.8 us, q_proj 6.3 us in graph replay), mostly its start-up, which a plain launch cannot
 * hide; the one-token GEMV hides it with PDL and takes 3.6 us for the same q_proj.
 *
 * Work split (as k_gemm_small, cuda_gemm_small.cu): a warp owns 16 weight rows (the mma's
 * M = 16 side, rows g and g + 8 of each quad) and a K slice; the 8 warps of a block are R row
 * groups times S K slices, reduced through shared memory. Each warp loads its first U 32-wide
 * K chunks of weights (16 bytes per thread per row) before pdl_wait(), then the token rows
 * (coherent loads: an earlier kernel wrote them), in two halves to bound the registers.
 * The K permutation inside a chunk is the one k_gemm_small documents: thread t4 of a quad feeds
 * elements 8*t4 .. 8*t4+7 of both operands to two mma steps, which leaves the dot products as
 * they are.
 *
 * Owner: cuda. Invariants: rows >= T, weight rows >= N and k >= K read nothing and add zeros;
 * each output element is written by exactly one thread, after pdl_wait(). */
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_wload.cuh"

/* columns k..k+7 of weight row n as 8 bf16 mma operands (fp8 dequantized with its block scale) */
template <bool FP8>
static __device__ __forceinline__ uint4 rows_w8(const wview &w, int mat, int n, int k, bool ok) {
    if (!ok) return make_uint4(0, 0, 0, 0);
    uint4 v = wp_load<FP8>(w, mat, n, k, true);
    return FP8 ? fp8x8_to_bf16x8(make_uint2(v.x, v.y), wp_scale(w, mat, n, k, true)) : v;
}

/* NT: n8 token tiles (8 * NT >= T rows); U: 32-wide K chunks per batch of weight loads. */
template <int NT, int U, bool FP8>
__global__ void __launch_bounds__(256, 2) k_gemm_rows(gemm_args a, int R, int S, int kslice) {
    extern __shared__ float red[]; /* [8 warps][32 lanes][NT * 4] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    pdl_launch_dependents();
    const int mat = blockIdx.y, rg = warp % R, ks = warp / R;
    const int K = a.w.cols, N = a.w.rows, T = a.r.T;
    const int n_lo = (blockIdx.x * R + rg) * 16 + g, n_hi = n_lo + 8;
    const bool ok_lo = n_lo < N, ok_hi = n_hi < N;
    const int kb = ks * kslice, ke = min(K, kb + kslice);

    uint4 wl[U], wh[U];
    auto load_w = [&](int k) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int kk = k + u * 32 + 8 * t4;
            bool in = kk < ke;
            wl[u] = rows_w8<FP8>(a.w, mat, n_lo, kk, in && ok_lo);
            wh[u] = rows_w8<FP8>(a.w, mat, n_hi, kk, in && ok_hi);
        }
    };
    load_w(kb); /* constant data: before the wait */
    pdl_wait();

    const bf16 *xp[NT];
    bool okt[NT];
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int j = nt * 8 + g;
        okt[nt] = j < T;
        xp[nt] = a.x + mat * a.x_mat_stride + (long)(okt[nt] ? j : 0) * a.ldx;
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    }
    for (int k = kb; k < ke; k += 32 * U) {
        if (k != kb) load_w(k);
#pragma unroll
        for (int h = 0; h < 2; h++) { /* token rows in two halves of U / 2 chunks */
            uint4 xv[U / 2][NT];
#pragma unroll
            for (int u = 0; u < U / 2; u++) {
                int kk = k + (h * (U / 2) + u) * 32 + 8 * t4;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    xv[u][nt] = (kk < ke && okt[nt]) ? ld_act16(xp[nt] + kk) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U / 2; u++) {
                const uint4 &l = wl[h * (U / 2) + u], &hi = wh[h * (U / 2) + u];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    mma16816(acc[nt], l.x, hi.x, l.y, hi.y, xv[u][nt].x, xv[u][nt].y);
                    mma16816(acc[nt], l.z, hi.z, l.w, hi.w, xv[u][nt].z, xv[u][nt].w);
                }
            }
        }
    }
    if (S > 1) { /* split-K: warps ks > 0 hand their partial sums to warp ks == 0 */
        float *mine = red + ((long)warp * 32 + lane) * NT * 4;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) mine[nt * 4 + c] = acc[nt][c];
        __syncthreads();
        if (ks != 0) return;
        for (int s = 1; s < S; s++) {
            const float *o = red + ((long)(warp + s * R) * 32 + lane) * NT * 4;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[nt][c] += o[nt * 4 + c];
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++) { /* tokens 2*t4 and 2*t4 + 1 of the tile; c = h: row g, 2 + h: g + 8 */
            int j = nt * 8 + 2 * t4 + h;
            if (j >= T) continue;
            long base = mat * a.o.y_mat_stride + (long)j * a.o.ldy;
#pragma unroll
            for (int q = 0; q < 2; q++) {
                int n = q ? n_hi : n_lo;
                if (!(q ? ok_hi : ok_lo)) continue;
                float v = acc[nt][2 * q + h];
                if (a.o.f32) {
                    float *y = (float *)a.o.y + base + n;
                    *y = a.o.accumulate ? *y + v : v;
                } else {
                    bf16 *y = (bf16 *)a.o.y + base + n;
                    *y = __float2bfloat16_rn(a.o.accumulate ? __bfloat162float(*y) + v : v);
                }
            }
        }
}

template <int NT, bool FP8>
static void launch_rows_t(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    const int U = 8;
    int K = a->w.cols, groups = ceil_div_i(a->w.rows, 16);
    /* split K across the block's warps until the grid has ~2 blocks of 8 warps per SM */
    int want = st->n_sm * 16, S = 1;
    while (S < 8 && (long)groups * a->n_mat * S < want && ceil_div_i(K, 2 * S) >= 32 * U / 2) S *= 2;
    int R = 8 / S;
    int kslice = (ceil_div_i(K, S) + 31) & ~31;
    dim3 grid(ceil_div_i(groups, R), a->n_mat);
    size_t smem = S > 1 ? (size_t)8 * 32 * NT * 4 * sizeof(float) : 0;
    if (s == st->stream) {
        cuda_launch_pdl(st, st->pdl >= 1, k_gemm_rows<NT, U, FP8>, grid, dim3(256), smem, *a, R, S, kslice);
    } else { /* side lane: a plain launch (its pdl_wait is then a no-op) */
        cuda_carveout(st, (const void *)k_gemm_rows<NT, U, FP8>);
        k_gemm_rows<NT, U, FP8><<<grid, 256, smem, s>>>(*a, R, S, kslice);
        CUDA_LAUNCHED(st, "gemm_rows");
    }
}

void launch_gemm_rows(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    DI_ASSERT(!a->r.offsets && !a->r.active && a->o.silu_I <= 0 && a->r.T <= 16);
    if (a->r.T <= 8) {
        if (a->w.fp8) launch_rows_t<1, true>(st, a, s);
        else launch_rows_t<1, false>(st, a, s);
    } else {
        if (a->w.fp8) launch_rows_t<2, true>(st, a, s);
        else launch_rows_t<2, false>(st, a, s);
    }
}
