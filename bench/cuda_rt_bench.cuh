/* cuda_rt_bench.cuh - what the CUDA-runtime-only benchmarks (bench_cuda_graph_gap,
 * bench_cuda_l2pin, bench_cuda_pdl_join: no deepinfer library) share: a checked runtime call
 * that exits with the call's text and the error, the device's globaltimer in nanoseconds
 * (comparable across SMs and kernels, which is what their stamps need), the end of a capture
 * as an executable graph, one replay of a list of graphs, and a median. */
#ifndef DI_BENCH_CUDA_RT_BENCH_CUH
#define DI_BENCH_CUDA_RT_BENCH_CUH
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

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

/* ends the capture on s and instantiates its graph (flags: cudaGraphInstantiate's) */
static inline cudaGraphExec_t capture_end(cudaStream_t s, unsigned long long flags) {
    cudaGraph_t g;
    cudaGraphExec_t ex;
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ex, g, flags));
    CK(cudaGraphDestroy(g));
    return ex;
}

/* launches every graph once, in order, on s, waits for them and destroys them */
static inline void replay_once(std::vector<cudaGraphExec_t> &ex, cudaStream_t s) {
    for (cudaGraphExec_t e : ex) CK(cudaGraphLaunch(e, s));
    CK(cudaStreamSynchronize(s));
    for (cudaGraphExec_t e : ex) CK(cudaGraphExecDestroy(e));
    ex.clear();
}

/* the median of x (sorts x) */
static inline double median(std::vector<double> &x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
}
#endif
