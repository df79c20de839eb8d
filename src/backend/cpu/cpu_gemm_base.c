/* cpu_gemm_base.c - the GEMM kernels for the build's baseline instruction set (x86-64: SSE2,
 * 4 lanes; 8 lanes when the build itself targets AVX). See cpu_gemm_kernels.h. Owner: model. */
#include "backend/cpu/cpu_internal.h"

#if defined(__AVX__)
#define GEMM_LANES 8
#else
#define GEMM_LANES 4
#endif
#define GEMM_SUFFIX base
#include "backend/cpu/cpu_gemm_kernels.h"
