/* cuda_gemm_few.cu - y = x · Wᵀ for a few rows of x (2-16: the projections and per-head
 * absorptions of decode steps of a few sequences), plain or strided-batched, bf16 or fp8
 * weights. cuBLASLt runs these at 1.3-2.3 TB/s with a ~5 us floor (docs/PERF.md: o_proj 2048 x
 * 2048 at 16 rows 5.3 us, 38% of copy), and cannot start loading before the kernel ahead of it
 * ends; this kernel streams the weights once at the copy rate's pace and issues its first
 * weight loads before its PDL wait.
 *
 * Owner: cuda. Layout of the work:
 *  - a block of 8 warps owns 128 weight rows (16 per warp: one m16 tile) and one K slice;
 *    the C blocks of a thread-block cluster (C = 1, 2, 4 or 8, chosen so the grid fills the
 *    SMs) take the C slices of the same rows;
 *  - a warp walks its slice in 32-column chunks, each lane loading 16 bytes (8 weights) of row
 *    g and of row g + 8 straight into registers as the mma.sync A fragments, in two register
 *    buffers of FEW_H chunks (the second is loading while the first is used); with the K order
 *    inside a chunk permuted identically for both operands (cuda_gemm_small.cu's trick), the B
 *    fragments are 16-byte reads of x;
 *  - x (the block's K slice of all rows, zero-padded to 8 or 16 rows) is copied once into
 *    shared memory after the PDL wait (row stride an odd multiple of 64 bytes: the 16-byte
 *    fragment reads of a quarter warp hit distinct banks), so the 8 warps read it from there
 *    instead of each fetching it from L2;
 *  - partial sums go to shared memory; with C > 1 the cluster syncs and block q of the cluster
 *    adds element range q of all C blocks' partials through distributed shared memory, in rank
 *    order (deterministic: the bits depend only on the shapes), then writes y (+= y when
 *    accumulating; f32 or bf16).
 * Invariants: rows >= N, tokens >= T and columns >= K read nothing and add zeros; each output
 * element is written by exactly one thread; weights are read before pdl_wait() (constant),
 * x and y only after it. */
#include <cooperative_groups.h>

#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_wload.cuh"

namespace cg = cooperative_groups;

enum {
    FEW_WARPS = 8,
    FEW_BN = 16 * FEW_WARPS, /* weight rows per block */
    FEW_H = 4,               /* 32-column chunks per register buffer */
    FEW_MAX_SMEM = 160 * 1024,
};

/* columns k..k+7 of row n as bf16 mma operands (fp8: dequantized with the block scale) */
template <bool FP8>
static __device__ __forceinline__ uint4 few_bf16(const wraw<FP8> &r) {
    if (FP8) return fp8x8_to_bf16x8(make_uint2(r.v.x, r.v.y), r.s);
    return r.v;
}

template <bool FP8>
static __device__ __forceinline__ void few_load(wraw<FP8> (&w)[FEW_H][2], const wview &wv, int mat, int n_lo,
                                                bool ok_lo, bool ok_hi, int k, int ke, int t4) {
#pragma unroll
    for (int u = 0; u < FEW_H; u++) {
        int kk = k + u * 32 + 8 * t4;
        bool in = kk < ke;
        w[u][0] = wload<FP8>(wv, mat, n_lo, kk, in && ok_lo);
        w[u][1] = wload<FP8>(wv, mat, n_lo + 8, kk, in && ok_hi);
    }
}

/* acc += the chunks of w (columns k.. of the slice starting at kb) times x from shared memory */
template <int NT, bool FP8>
static __device__ __forceinline__ void few_mma(float (&acc)[NT][4], const wraw<FP8> (&w)[FEW_H][2], const bf16 *xs,
                                               int xld, int k, int kb, int ke, int g, int t4) {
#pragma unroll
    for (int u = 0; u < FEW_H; u++) {
        int kk = k + u * 32;
        if (kk >= ke) break; /* uniform over the warp */
        uint4 lo = few_bf16<FP8>(w[u][0]), hi = few_bf16<FP8>(w[u][1]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            uint4 xv = *(const uint4 *)(xs + (nt * 8 + g) * xld + (kk - kb) + 8 * t4);
            mma16816(acc[nt], lo.x, hi.x, lo.y, hi.y, xv.x, xv.y);
            mma16816(acc[nt], lo.z, hi.z, lo.w, hi.w, xv.z, xv.w);
        }
    }
}

/* the output element e of a block's partials: warp e / (128 NT), lane (e / (4 NT)) % 32, tile
 * nt and register q of the mma C fragment -> weight row and token */
template <int NT>
static __device__ __forceinline__ void few_store(const gemm_args &a, int mat, int rb, int e, float v) {
    int q = e & 3, nt = (e >> 2) % NT, lane = (e / (4 * NT)) & 31, warp = e / (128 * NT);
    int n = rb * FEW_BN + warp * 16 + (lane >> 2) + (q >> 1) * 8;
    int j = nt * 8 + 2 * (lane & 3) + (q & 1);
    if (n >= a.w.rows || j >= a.r.T) return;
    long off = mat * a.o.y_mat_stride + (long)j * a.o.ldy + n;
    if (a.o.f32) {
        float *y = (float *)a.o.y + off;
        *y = a.o.accumulate ? *y + v : v;
    } else {
        bf16 *y = (bf16 *)a.o.y + off;
        *y = __float2bfloat16_rn(a.o.accumulate ? __bfloat162float(*y) + v : v);
    }
}

/* grid (C x row blocks, matrices), cluster (C, 1, 1); NT: 8-token tiles (T <= 8 NT) */
template <int NT, bool FP8>
__global__ void __launch_bounds__(256) k_gemm_few(gemm_args a, int C, int kslice, int xld) {
    extern __shared__ __align__(16) unsigned char few_smem[];
    bf16 *xs = (bf16 *)few_smem;                                      /* [8 NT][xld] */
    float *red = (float *)(few_smem + (size_t)8 * NT * xld * 2);      /* [256 threads][4 NT] */
    pdl_launch_dependents();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int kc = (int)(blockIdx.x % C), rb = (int)(blockIdx.x / C), mat = blockIdx.y;
    const int K = a.w.cols, N = a.w.rows, T = a.r.T;
    const int n_lo = rb * FEW_BN + warp * 16 + g;
    const bool ok_lo = n_lo < N, ok_hi = n_lo + 8 < N;
    const int kb = kc * kslice, ke = min(K, kb + kslice);

    wraw<FP8> w0[FEW_H][2], w1[FEW_H][2];
    few_load<FP8>(w0, a.w, mat, n_lo, ok_lo, ok_hi, kb, ke, t4);
    few_load<FP8>(w1, a.w, mat, n_lo, ok_lo, ok_hi, kb + 32 * FEW_H, ke, t4);
    pdl_wait(); /* x comes from the previous kernel */

    /* x[0 .. 8 NT) x [kb, kb + kslice) -> shared memory, zeros past T and K */
    const bf16 *xb = a.x + mat * a.x_mat_stride;
    const int pieces = kslice / 8;
    for (int i = threadIdx.x; i < 8 * NT * pieces; i += 256) {
        int j = i / pieces, c = (i - j * pieces) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (j < T && kb + c < ke) v = ld_act16(xb + (long)j * a.ldx + kb + c);
        *(uint4 *)(xs + j * xld + c) = v;
    }
    __syncthreads();

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    for (int k = kb; k < ke; k += 64 * FEW_H) {
        few_mma<NT, FP8>(acc, w0, xs, xld, k, kb, ke, g, t4);
        if (k + 64 * FEW_H < ke) few_load<FP8>(w0, a.w, mat, n_lo, ok_lo, ok_hi, k + 64 * FEW_H, ke, t4);
        few_mma<NT, FP8>(acc, w1, xs, xld, k + 32 * FEW_H, kb, ke, g, t4);
        if (k + 96 * FEW_H < ke) few_load<FP8>(w1, a.w, mat, n_lo, ok_lo, ok_hi, k + 96 * FEW_H, ke, t4);
    }

    const int E = 256 * 4 * NT; /* a block's partials */
    float *mine = red + threadIdx.x * 4 * NT;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 4; q++) mine[nt * 4 + q] = acc[nt][q];
    if (C == 1) {
#pragma unroll
        for (int i = 0; i < 4 * NT; i++) few_store<NT>(a, mat, rb, threadIdx.x * 4 * NT + i, mine[i]);
        return;
    }
    cg::cluster_group cl = cg::this_cluster();
    cl.sync(); /* every block's partials are in its shared memory */
    const int per = E / C;
    for (int e = kc * per + threadIdx.x; e < (kc + 1) * per; e += 256) {
        float v = 0.f;
        for (int q = 0; q < C; q++) v += cl.map_shared_rank(red, q)[e];
        few_store<NT>(a, mat, rb, e, v);
    }
    cl.sync(); /* no block leaves while another still reads its shared memory */
}

/* ---------------------------------------------------------------- host ---- */

typedef struct few_plan {
    int nt, C, kslice, xld;
    size_t smem;
} few_plan;

/* The launch shape for this GEMM, or 0 when the kernel does not take it: C = the fewest
 * cluster blocks (1, 2, 4, 8) whose grid has st->few_want blocks per SM, each slice keeping
 * at least two chunks; the slice of x must fit shared memory. */
static int few_plan_of(const cuda_state *st, const gemm_args *a, few_plan *p) {
    int T = a->r.T, K = a->w.cols;
    if (T < 1 || T > 16 || a->r.offsets || a->o.silu_I > 0) return 0;
    p->nt = T <= 8 ? 1 : 2;
    long blocks = (long)ceil_div_i(a->w.rows, FEW_BN) * a->n_mat, want = (long)st->n_sm * st->few_want;
    int C = 1;
    while (C < st->few_max_c && blocks * C < want && ceil_div_i(K, 2 * C) >= 64) C *= 2;
    p->C = C;
    p->kslice = (ceil_div_i(K, C) + 31) & ~31;
    p->xld = p->kslice % 64 == 32 ? p->kslice : p->kslice + 32; /* row stride = 64 mod 128 bytes */
    p->smem = (size_t)8 * p->nt * p->xld * 2 + (size_t)256 * 4 * p->nt * sizeof(float);
    return p->smem <= FEW_MAX_SMEM;
}

int gemm_few_ok(const cuda_state *st, const gemm_args *a) {
    few_plan p;
    if (st->few_max_rows < a->r.T || a->r.T < 2) return 0;
    double bytes = (double)a->w.rows * a->w.cols * a->n_mat * (a->w.fp8 ? 1 : 2);
    if (bytes > (double)st->few_max_mb * 1048576.0) return 0;
    return few_plan_of(st, a, &p);
}

template <int NT, bool FP8>
static void few_launch(cuda_state *st, const gemm_args *a, const few_plan &p, cudaStream_t s) {
    static bool attr = false; /* host-only, once per instantiation */
    if (!attr) {
        if (cuda_note(st, cudaFuncSetAttribute(k_gemm_few<NT, FP8>, cudaFuncAttributeMaxDynamicSharedMemorySize, FEW_MAX_SMEM),
                      "gemm_few smem attribute"))
            return;
        attr = true;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(p.C * ceil_div_i(a->w.rows, FEW_BN)), (unsigned)a->n_mat);
    cfg.blockDim = dim3(256);
    cfg.dynamicSmemBytes = p.smem;
    cfg.stream = s;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)p.C;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = s == st->stream && st->pdl >= 1;
    cfg.attrs = at;
    cfg.numAttrs = 2;
    cuda_note(st, cudaLaunchKernelEx(&cfg, k_gemm_few<NT, FP8>, *a, p.C, p.kslice, p.xld), "gemm_few launch");
    CUDA_LAUNCHED(st, "gemm_few");
}

void launch_gemm_few(cuda_state *st, const gemm_args *a, cudaStream_t s) {
    few_plan p;
    DI_ASSERT(few_plan_of(st, a, &p));
    if (a->w.fp8) {
        if (p.nt == 1) few_launch<1, true>(st, a, p, s);
        else few_launch<2, true>(st, a, p, s);
    } else {
        if (p.nt == 1) few_launch<1, false>(st, a, p, s);
        else few_launch<2, false>(st, a, p, s);
    }
}
