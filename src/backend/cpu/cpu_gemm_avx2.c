/* cpu_gemm_avx2.c - the GEMM kernels compiled for AVX2 + FMA (8 lanes), whatever the build's
 * baseline; cpu_matmul.c calls them only after checking the CPU supports both. See
 * cpu_gemm_kernels.h. Owner: model. */
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2,fma")
#define GEMM_LANES 8
#define GEMM_SUFFIX avx2
#include "backend/cpu/cpu_gemm_kernels.h"
#endif
