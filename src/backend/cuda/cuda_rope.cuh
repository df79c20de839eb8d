/* cuda_rope.cuh - RoPE's arithmetic (backend.h di_rope_params) for the CUDA kernels that rotate:
 * one position's cos / sin table entry and the rotation of one pair, so that k_rope and
 * k_rope_kv_write (cuda_ops.cu) give the same bits.
 *
 * Owner: cuda. The products are rounded as written (explicit fma / mul): no contraction choice
 * left to the compiler, which could otherwise differ between kernels. */
#ifndef DI_BACKEND_CUDA_ROPE_CUH
#define DI_BACKEND_CUDA_ROPE_CUH
#include "backend/cuda/cuda_internal.h"

/* cos and sin of φ = pos · inv_freq (fp32 product, as HF), evaluated in double, times mscale */
static __device__ __forceinline__ void rope_cos_sin(float pos, float inv_freq, float mscale, float *c, float *s) {
    float phi = __fmul_rn(pos, inv_freq);
    *c = (float)cos((double)phi) * mscale;
    *s = (float)sin((double)phi) * mscale;
}

/* (xa, xb) -> (xa c - xb s, xb c + xa s), each rounded to bf16 once */
static __device__ __forceinline__ void rope_pair(float xa, float xb, float c, float s, bf16 *ya, bf16 *yb) {
    *ya = __float2bfloat16_rn(__fmaf_rn(xa, c, -__fmul_rn(xb, s)));
    *yb = __float2bfloat16_rn(__fmaf_rn(xb, c, __fmul_rn(xa, s)));
}
#endif
