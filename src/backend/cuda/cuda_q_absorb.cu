/* cuda_q_absorb.cu - backend.h q_absorb at one token: the query projection q = W_q x and the
 * W_UK absorption q̃_h = W_UK_hᵀ q_h^nope in one launch, so the absorption no longer waits for
 * a kernel boundary after the query GEMV on the decode step's critical path.
 *
 *   k_q_absorb: one thread-block cluster of QA_CB = 8 blocks per head. Block c computes rows
 *   c * qk/8 .. of the head's qk query rows (each warp qk/64 rows over the whole K) with
 *   k_gemv's arithmetic for that GEMV (the same K slices, the same per-lane fmaf order, the
 *   same xor trees and slice order: launch_gemv_t's split choice is passed in), writes them to
 *   q and keeps them in shared memory; after a cluster barrier it reads the head's dn nope
 *   values from the cluster's blocks (distributed shared memory) and computes rows
 *   c * r/8 .. of q̃_h with k_gemv's arithmetic for the bmm at one token (one split; a row's
 *   dn / 8 <= 16 pieces on the lanes of a half warp, whose xor tree is the full warp's when the
 *   other half adds zeros). So q and q̃ are bit for bit matmul + bmm (test_cuda_ops gemm).
 *   Every weight of both parts is loaded before the PDL wait (weights are constant).
 *
 * Owner: cuda. Shapes: bf16 weights, qk = 192 (nope 128 + rope 64), r = 512, K a multiple of 8
 * up to QA_MAXK; anything else returns 0 and the model runs matmul + bmm. */
#include <cooperative_groups.h>

#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_wload.cuh"

namespace cg = cooperative_groups;

enum { QA_CB = 8, QA_QK = 192, QA_DN = 128, QA_R = 512, QA_MAXK = 2048, QA_MAXS = 8 };
/* rows per block and per warp of the query part; 16-byte pieces per lane; q̃ passes per warp
 * (2 rows per pass, one per half warp) */
enum { QA_RPB = QA_QK / QA_CB, QA_RPW = QA_RPB / 8, QA_NP = QA_MAXK / 256, QA_URW = QA_R / QA_CB / 16 };
static_assert(QA_RPB % 8 == 0 && QA_DN % 8 == 0 && QA_DN <= 128 && (QA_R / QA_CB) % 16 == 0, "q_absorb layout");

typedef struct qa_args {
    bf16 *q, *qt;            /* q [H * qk] (row of the one token), q̃ [H * r] */
    const bf16 *x;           /* [K] */
    wview wq, wuk;           /* [H * qk, K]; H x [r, dn] */
    int K, S, kslice;        /* the query GEMV's K slices as launch_gemv_t splits them */
} qa_args;

__global__ void __launch_bounds__(256, 1) k_q_absorb(qa_args a) {
    __shared__ __align__(16) bf16 qs[QA_RPB]; /* this block's query rows */
    cg::cluster_group cl = cg::this_cluster();
    pdl_launch_dependents();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.x / QA_CB, c = blockIdx.x % QA_CB; /* the cluster is the head */
    const int row0 = h * QA_QK + c * QA_RPB + warp * QA_RPW;  /* the warp's query rows */
    /* every weight first: the warp's query rows (lane: pieces lane*8 + 256 i of each K slice),
     * and its q̃ rows (pass u: rows 2u, 2u + 1 of the warp's, on the two half warps) */
    uint4 w[QA_RPW][QA_NP];
    /* piece i of the lane: column k_i of slice i / ps (ps = pieces per lane and slice), as
     * k_gemv's loop `for (k0 = kb + lane * 8; k0 < ke; k0 += 256)` visits them */
    const int ps = a.kslice / 256;
    int kp[QA_NP];
    bool okp[QA_NP];
#pragma unroll
    for (int i = 0; i < QA_NP; i++) {
        int s = i / ps;
        kp[i] = s * a.kslice + lane * 8 + (i % ps) * 256;
        okp[i] = s < a.S && kp[i] < min(a.K, (s + 1) * a.kslice);
    }
#pragma unroll
    for (int r = 0; r < QA_RPW; r++)
#pragma unroll
        for (int i = 0; i < QA_NP; i++) w[r][i] = wp_load<false>(a.wq, 0, row0 + r, kp[i], okp[i]);
    const int hw = lane >> 4, hl = lane & 15, ur0 = c * (QA_R / QA_CB) + warp * (2 * QA_URW);
    uint4 wu[QA_URW];
#pragma unroll
    for (int u = 0; u < QA_URW; u++) wu[u] = wp_load<false>(a.wuk, h, ur0 + 2 * u + hw, hl * 8, hl * 8 < QA_DN);
    pdl_wait();
    uint4 xv[QA_NP];
#pragma unroll
    for (int i = 0; i < QA_NP; i++) xv[i] = okp[i] ? ld_act16(a.x + kp[i]) : make_uint4(0, 0, 0, 0);
    /* the query rows: per slice a fmaf chain over the lane's pieces, a warp xor tree, then the
     * slices added in order (k_gemv: slice 0's warp adds slices 1.. from shared memory) */
#pragma unroll
    for (int r = 0; r < QA_RPW; r++) {
        float tot = 0.f;
#pragma unroll
        for (int s = 0; s < QA_MAXS; s++) {
            if (s >= a.S) break;
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < QA_NP; i++) {
                if (i / ps != s || !okp[i]) continue;
                float wf[8], xf[8];
                bf16x8_float(w[r][i], wf);
                bf16x8_float(xv[i], xf);
#pragma unroll
                for (int e = 0; e < 8; e++) acc = fmaf(wf[e], xf[e], acc);
            }
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            tot = s == 0 ? acc : tot + acc;
        }
        if (lane == 0) {
            bf16 v = __float2bfloat16_rn(tot);
            qs[warp * QA_RPW + r] = v;
            a.q[row0 + r] = v;
        }
    }
    cl.sync(); /* every block's query rows in its shared memory */
    /* the head's nope piece hl (values 8 hl .. 8 hl + 7): block (8 hl) / RPB holds it */
    uint4 qn = make_uint4(0, 0, 0, 0);
    if (hl * 8 < QA_DN) qn = *(const uint4 *)cl.map_shared_rank(qs + (hl * 8) % QA_RPB, (unsigned)((hl * 8) / QA_RPB));
    float xf[8];
    bf16x8_float(qn, xf);
#pragma unroll
    for (int u = 0; u < QA_URW; u++) {
        float wf[8], acc = 0.f;
        bf16x8_float(wu[u], wf);
        if (hl * 8 < QA_DN)
#pragma unroll
            for (int e = 0; e < 8; e++) acc = fmaf(wf[e], xf[e], acc);
        for (int o = 8; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (hl == 0) a.qt[(long)h * QA_R + ur0 + 2 * u + hw] = __float2bfloat16_rn(acc);
    }
    cl.sync(); /* no block leaves while another may still read its shared memory */
}

int cuda_q_absorb(di_backend *be, void *q, void *qt, const void *x, const di_weight *w_q, const di_weight *w_uk,
                  int H, int T) {
    cuda_state *st = cst(be);
    if (!st->q_absorb || !st->gemv || T != 1 || H <= 0) return 0;
    if (w_q->dtype != DI_DTYPE_BF16 || w_uk->dtype != DI_DTYPE_BF16 || w_q->n != 1 || w_q->rows != H * QA_QK ||
        w_uk->n != H || w_uk->rows != QA_R || w_uk->cols != QA_DN)
        return 0;
    const int K = w_q->cols;
    if (K % 8 != 0 || K > QA_MAXK || ((uintptr_t)x & 15) || ((uintptr_t)w_q->data & 15) || ((uintptr_t)w_uk->data & 15))
        return 0;
    /* the query GEMV's K slices exactly as launch_gemv_t would split it (RW = 4 rows per warp) */
    int S = gemv_splits(st, ceil_div_i(w_q->rows, 4), 1, K);
    int kslice = (ceil_div_i(K, S) + 255) & ~255;
    /* ... and the bmm runs one slice (the q̃ arithmetic above assumes it) */
    if (S > QA_MAXS || S * (kslice / 256) > QA_NP || gemv_splits(st, ceil_div_i(QA_R, 4), H, QA_DN) != 1) return 0;
    qa_args a = {(bf16 *)q, (bf16 *)qt, (const bf16 *)x, wview_of(w_q), wview_of(w_uk), K, S, kslice};
    cuda_launch_cluster(st, st->pdl >= 1, QA_CB, "q_absorb launch", k_q_absorb, dim3((unsigned)(H * QA_CB)), dim3(256),
                        0, a);
    CUDA_LAUNCHED(st, "q_absorb");
    return 1;
}
