/* cuda_wload.cuh - weight-row loads of the memory-bound GEMV kernels (cuda_gemm_small.cu's
 * k_gemv, cuda_moe_small.cu): 8 consecutive weights of one row per lane, kept as raw bits in
 * registers until used (bf16: one 16-byte load; fp8 e4m3: one 8-byte load plus the row's block
 * scale), so that many loads can be in flight with few registers, then converted to fp32.
 *
 * Owner: cuda. Weights are read-only for the whole step, so these loads use the non-coherent
 * path (__ldg) and may be issued before pdl_wait(). A lane's 8 columns never straddle an fp8
 * scale block (block cols are a multiple of 8). */
#ifndef DI_BACKEND_CUDA_WLOAD_CUH
#define DI_BACKEND_CUDA_WLOAD_CUH
#include <cuda_fp16.h>

#include "backend/cuda/cuda_internal.h"

template <bool FP8>
struct wraw {
    uint4 v;  /* bf16: 8 values; fp8: v.x, v.y hold 8 bytes */
    float s;  /* fp8 block scale */
};

/* The 8 weights at columns kk..kk+7 of row n of matrix `mat` without the fp8 scale (zeros when
 * !ok): bf16 16 bytes; fp8 8 bytes in v.x, v.y. Kernels that load one scale for the rows of a
 * piece that share it call this and wp_scale themselves; wload does both per row. */
template <bool FP8>
static __device__ __forceinline__ uint4 wp_load(const wview &w, int mat, int n, int kk, bool ok) {
    if (!ok) return make_uint4(0, 0, 0, 0);
    if (!FP8) return __ldg((const uint4 *)((const bf16 *)w.data + mat * w.mat_stride + (long)n * w.cols + kk));
    uint2 q = __ldg((const uint2 *)((const uint8_t *)w.data + mat * w.mat_stride + (long)n * w.cols + kk));
    return make_uint4(q.x, q.y, 0, 0);
}

/* the fp8 block scale of (n, kk); 0 when !ok */
static __device__ __forceinline__ float wp_scale(const wview &w, int mat, int n, int kk, bool ok) {
    return ok ? __ldg(w.scale + wscale_at(w, mat, n, kk)) : 0.f;
}

/* columns kk..kk+7 of row n of matrix `mat` with the fp8 scale of that row; zeros when !ok */
template <bool FP8>
static __device__ __forceinline__ wraw<FP8> wload(const wview &w, int mat, int n, int kk, bool ok) {
    wraw<FP8> r;
    r.v = make_uint4(0, 0, 0, 0);
    r.s = 0.f;
    if (!ok) return r;
    r.v = wp_load<FP8>(w, mat, n, kk, true);
    if (FP8) r.s = wp_scale(w, mat, n, kk, true);
    return r;
}

template <bool FP8>
static __device__ __forceinline__ void wfloat(const wraw<FP8> &r, float *f) {
    if (FP8) {
        uint32_t u[2] = {r.v.x, r.v.y};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u[h] & 0xffff), __NV_E4M3);
            __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u[h] >> 16), __NV_E4M3);
            float2 a = __half22float2(*(__half2 *)&lo), b = __half22float2(*(__half2 *)&hi);
            f[h * 4 + 0] = a.x * r.s;
            f[h * 4 + 1] = a.y * r.s;
            f[h * 4 + 2] = b.x * r.s;
            f[h * 4 + 3] = b.y * r.s;
        }
    } else {
        uint32_t u[4] = {r.v.x, r.v.y, r.v.z, r.v.w};
#pragma unroll
        for (int h = 0; h < 4; h++) {
            f[2 * h] = __uint_as_float(u[h] << 16);
            f[2 * h + 1] = __uint_as_float(u[h] & 0xffff0000u);
        }
    }
}

/* a wp_load piece -> 8 fp32 values (fp8: times the scale s; bf16: s unused) */
template <bool FP8>
static __device__ __forceinline__ void wp_float(uint4 v, float s, float *f) {
    wraw<FP8> r;
    r.s = s;
    r.v = v;
    wfloat<FP8>(r, f);
}

/* 8 bf16 (raw 16 bytes) -> fp32 */
static __device__ __forceinline__ void bf16x8_float(uint4 v, float *f) {
    uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int h = 0; h < 4; h++) {
        f[2 * h] = __uint_as_float(u[h] << 16);
        f[2 * h + 1] = __uint_as_float(u[h] & 0xffff0000u);
    }
}
#endif
