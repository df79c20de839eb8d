/* cuda_sample.cuh - the exact arithmetic the device samplers share with the CPU sampler of
 * src/sampling (docs/engine.md "Sampler"): exp_fixed, the Philox draw, the (y desc, id asc)
 * order key and a token's 32.32 fixed-point weight. Every fp32 operation is an explicit
 * round-to-nearest intrinsic (no contraction), so the results equal the CPU's bit for bit.
 *
 * Owner: cuda. Included by cuda_sample.cu (one block per row) and cuda_sample_cluster.cu (one
 * thread-block cluster per row). */
#ifndef DI_BACKEND_CUDA_SAMPLE_CUH
#define DI_BACKEND_CUDA_SAMPLE_CUH
#include "backend/cuda/cuda_internal.h"

/* ---------------------------------------------------------------- exact helpers ---- */

static __device__ float exp_fixed(float d) { /* di_sampling_exp, operation for operation */
    if (!(d > -87.0f)) return 0.0f;
    if (d > 0.0f) d = 0.0f;
    float t = __fmul_rn(d, 0x1.715476p+0f);
    float kf = floorf(__fadd_rn(t, 0.5f));
    float r = __fsub_rn(d, __fmul_rn(kf, 0x1.63p-1f));
    r = __fsub_rn(r, __fmul_rn(kf, -0x1.bd0106p-13f));
    float p = 0x1.a01a02p-13f;
    p = __fadd_rn(__fmul_rn(p, r), 0x1.6c16c2p-10f);
    p = __fadd_rn(__fmul_rn(p, r), 0x1.111112p-7f);
    p = __fadd_rn(__fmul_rn(p, r), 0x1.555556p-5f);
    p = __fadd_rn(__fmul_rn(p, r), 0x1.555556p-3f);
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    uint32_t bits = (uint32_t)((int)kf + 127) << 23;
    return __fmul_rn(p, __uint_as_float(bits));
}

static __device__ uint32_t philox_u32(uint64_t seed, uint32_t position, uint32_t stream, uint32_t draw) {
    uint32_t c0 = position, c1 = stream, c2 = draw, c3 = 0x53414d50u; /* DI_RNG_DOMAIN_SAMPLE */
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
    }
    return c0;
}

static __device__ __forceinline__ uint64_t key_of(float y, int id) {
    if (y == 0.0f) y = 0.0f; /* -0 and +0 compare equal: same key bits */
    uint32_t u = __float_as_uint(y);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}

static __device__ __forceinline__ uint64_t weight_of(float y, float m, float *p_out) {
    float d = __fsub_rn(y, m);
    float pr = d < -23.0f ? 0.0f : exp_fixed(d);
    *p_out = pr;
    return (uint64_t)__float2ull_rz(__fmul_rn(pr, 4294967296.0f));
}

/* y of element i (temperature applied) */
static __device__ __forceinline__ float y_of(const float *x, int i, float T) {
    float v = x[i];
    return T != 1.0f ? __fdiv_rn(v, T) : v;
}

#endif
