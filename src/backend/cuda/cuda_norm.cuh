/* cuda_norm.cuh - the per-piece arithmetic of the vectorised RMSNorm (k_rmsnorm_v8), shared by
 * the kernels that norm a row the way it does: k_rmsnorm_v8 and k_rope_kv_write (cuda_ops.cu),
 * so both give the same bits.
 *
 * Owner: cuda. A row of D bf16 is D / 8 pieces of 8; a thread's pieces' squares are added in
 * order into its partial sum (norm8_in); the partials are summed by a warp-xor tree, then over
 * warps in warp order; inv = 1 / sqrt(sum / D + eps) in double; each output is
 * bf16(w * (v * inv)) (norm8_out). */
#ifndef DI_BACKEND_CUDA_NORM_CUH
#define DI_BACKEND_CUDA_NORM_CUH
#include "backend/cuda/cuda_internal.h"

/* the warp-xor tree of a norm's partial sums */
static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* 8 bf16 -> fp32 with their squares added to ss in order */
static __device__ __forceinline__ void norm8_in(uint4 u, float *v, float &ss) {
    const bf16 *b = (const bf16 *)&u;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        v[e] = __bfloat162float(b[e]);
        ss += v[e] * v[e];
    }
}

/* piece i's 8 outputs bf16(w[8i + e] * (v[e] * inv)), packed */
static __device__ __forceinline__ uint4 norm8_out(const float *w, int i, const float *v, float inv) {
    float4 w0 = ((const float4 *)w)[2 * i], w1 = ((const float4 *)w)[2 * i + 1];
    const float wf[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    uint32_t pk[4];
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
        __nv_bfloat162 p2 = __floats2bfloat162_rn(wf[e] * (v[e] * inv), wf[e + 1] * (v[e + 1] * inv));
        pk[e / 2] = *(const uint32_t *)&p2;
    }
    return make_uint4(pk[0], pk[1], pk[2], pk[3]);
}

/* 1 / sqrt(sum / D + eps), evaluated in double */
static __device__ __forceinline__ float norm_inv(float sum, int D, float eps) {
    return (float)(1.0 / sqrt((double)sum / D + (double)eps));
}
#endif
