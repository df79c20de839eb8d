/* cuda_rt_bench.cuh - what the CUDA-runtime-only benchmarks (bench_cuda_graph_gap,
 * bench_cuda_l2pin, bench_cuda_pdl_join: no deepinfer library) share: a checked runtime call
 * that exits with the call's text and the error, and the device's globaltimer in nanoseconds
 * (comparable across SMs and kernels, which is what their stamps need). */
#ifndef DI_BENCH_CUDA_RT_BENCH_CUH
#define DI_BENCH_CUDA_RT_BENCH_CUH
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                       \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static __device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
#endif
