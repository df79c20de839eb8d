/* cuda_mma.cuh - tensor-core and async-copy primitives shared by the CUDA kernels (inline PTX):
 * mma.sync m16n8k16 bf16 -> f32, ldmatrix (plain and transposed), cp.async with zero-fill,
 * and fp8 e4m3 -> bf16 conversion with a block scale.
 *
 * Owner: cuda. Fragment layouts are those of the PTX ISA for m16n8k16 (.row.col): with
 * g = lane / 4 and t = lane % 4, A regs {a0a1, a2a3, a4a5, a6a7} hold (row g, k 2t..2t+1),
 * (row g+8, k 2t..), (row g, k 2t+8..), (row g+8, k 2t+8..); B regs {b0b1, b2b3} hold
 * (k 2t..2t+1, col g), (k 2t+8.., col g); C {c0,c1,c2,c3} hold (row g, col 2t..2t+1),
 * (row g+8, col 2t..2t+1). The lower-index element sits in the low 16 bits of a register. */
#ifndef DI_BACKEND_CUDA_MMA_CUH
#define DI_BACKEND_CUDA_MMA_CUH
#include <cuda_fp16.h>

#include "backend/cuda/cuda_internal.h"

static __device__ __forceinline__ void mma16816(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

static __device__ __forceinline__ void ldsm_x2(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(p)));
}

static __device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

/* 16-byte async copy global -> shared; copies src_bytes (0..16) and zero-fills the rest. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* 2^x (MUFU, flushes subnormal results to 0; 2^-inf = 0) */
static __device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* Two fp8 e4m3 (low byte first) -> two bf16 scaled by s, packed. */
static __device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint16_t v, float s) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v, __NV_E4M3);
    float2 f = __half22float2(*(__half2 *)&h);
    return pack_bf16(f.x * s, f.y * s);
}

/* 8 fp8 (as a uint2) -> 8 scaled bf16 (as a uint4). */
static __device__ __forceinline__ uint4 fp8x8_to_bf16x8(uint2 v, float s) {
    uint4 r;
    r.x = fp8x2_to_bf16x2((uint16_t)(v.x & 0xffff), s);
    r.y = fp8x2_to_bf16x2((uint16_t)(v.x >> 16), s);
    r.z = fp8x2_to_bf16x2((uint16_t)(v.y & 0xffff), s);
    r.w = fp8x2_to_bf16x2((uint16_t)(v.y >> 16), s);
    return r;
}

static __device__ __forceinline__ float silu_f(float g) { return g / (1.0f + expf(-g)); }

/* 8 bf16 outputs silu(g[j]) * u[j] in fp32, rounded once (k_silu_mul's arithmetic). */
static __device__ __forceinline__ uint4 silu_mul_bf16x8(uint4 gr, uint4 ur) {
    uint4 o;
    const bf16 *g = (const bf16 *)&gr, *u = (const bf16 *)&ur;
    bf16 *y = (bf16 *)&o;
#pragma unroll
    for (int j = 0; j < 8; j++) y[j] = __float2bfloat16_rn(silu_f(__bfloat162float(g[j])) * __bfloat162float(u[j]));
    return o;
}
#endif
