/* cuda_pdl.cuh - programmatic dependent launch (Hopper): a kernel launched with
 * cuda_launch_pdl may start while the kernel before it on the stream is still running, once
 * every block of that kernel has executed pdl_launch_dependents() (or exited). It must call
 * pdl_wait() before it reads anything an earlier kernel wrote and before it writes anything,
 * and every one of its threads calls pdl_wait() before exiting, so that the kernel never
 * completes before its predecessor (the next kernel's wait then covers the whole chain). Before
 * the wait a kernel may read only data that no kernel still running can be writing: constant
 * data (weights), and data written before the PDL chain it belongs to began (a kernel of a PDL
 * chain can overlap the whole chain back to its last plain launch or non-kernel operation): the
 * step's uploads (metadata, copied before the step's first kernel), the KV cache of earlier
 * steps, and the router's ids in k_small_down (cuda_moe_small.cu: k_small_gu releases it only
 * after its own wait). That is what overlaps the previous kernel's tail and the launch latency.
 * DEEPINFER_CUDA_PDL (st->pdl): 0 launches everything plainly (the waits are then no-ops); 1
 * (default) the GEMV and small-expert kernels, the vectorised RMSNorms (DEEPINFER_CUDA_NORM_PDL),
 * the decode router pair (DEEPINFER_CUDA_ROUTE_PDL), the samplers (DEEPINFER_CUDA_SAMPLE_PDL),
 * small steps' silu_mul (DEEPINFER_CUDA_SILU_PDL) and rope_kv_write (DEEPINFER_CUDA_ROPE_PDL), the
 * dense MLA decode kernel when it loads early (DEEPINFER_CUDA_MLA_EARLY), the routed experts'
 * combine releasing the next norm (DEEPINFER_CUDA_COMBINE_PDL), and the 16-128-token expert
 * path's permutation (released by k_route), SiLU-mul and combine (DEEPINFER_CUDA_MOE_PDL; the
 * add + RMSNorm that takes over a deferred combine reads the routing rows and weights before its
 * wait: the router and the permutation wrote them before the down GEMM, a plain launch); 2 also RoPE,
 * the KV-cache write and MLA decode attention with its combine (measured: no gain at batch 1,
 * about 1-2% slower at batch 16-64; docs/PERF.md, "Small-batch decode").
 * Releasing a successor early pays when it has few blocks or weights to preload while the SMs
 * are not needed elsewhere; a successor of many blocks that wait resident takes the slots of
 * the work beside it: k_route releasing k_small_gu early lost 7% at batch 1, and so did
 * silu_mul releasing the shared experts' down GEMV (docs/PERF.md, 2026-12-02 morning), and the
 * q half of rope_kv_write now releases W_UK only after its wait (DEEPINFER_CUDA_ROPE_LATE).
 * Across the lanes (DEEPINFER_CUDA_LANES_PROG, default on): in a captured graph the first PDL
 * launch after a side-lane fork or join gets programmatic edges from the kernels it depends on
 * on either lane (cuda_capture_prog_edges), so the same rules hold across lanes: its pdl_wait()
 * waits for all of them, and "the chain" then spans both lanes (reads before the wait stay
 * limited to the data listed above).
 *
 * Owner: cuda. griddepcontrol needs sm_90; CUDA graphs capture the launches as programmatic
 * dependency edges. */
#ifndef DI_BACKEND_CUDA_PDL_CUH
#define DI_BACKEND_CUDA_PDL_CUH
#include "backend/cuda/cuda_internal.h"

/* Whether a kernel with a PDL switch of its own (st->norm_pdl, st->route_pdl, ...) is launched
 * with PDL: when that switch (and the launch's shape condition) says so and DEEPINFER_CUDA_PDL
 * is not 0. */
static inline bool pdl_with(const cuda_state *st, bool on) { return st->pdl >= 1 && on; }

static __device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
static __device__ __forceinline__ void pdl_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/* Activation loads in PDL kernels: data an earlier kernel wrote is read with an L2-coherent
 * ld.global.cg in volatile asm, which the compiler keeps after pdl_wait() (itself volatile asm).
 * Never __ldg / ld.global.nc for such data: that path is only for data that is read-only for
 * the kernel's whole lifetime, and the compiler may hoist it above the wait. */
static __device__ __forceinline__ uint4 ld_act16(const void *p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
static __device__ __forceinline__ float4 ld_act16f(const void *p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
    return v;
}

/* kernel<<<grid, block, smem, st->stream>>>(args...) in thread-block clusters of `cluster`
 * blocks along x (0: no cluster attribute), with programmatic stream serialisation allowed
 * when `pdl` is true; launch errors are recorded in st under `what`. */
template <typename... KArgs, typename... Args>
static void cuda_launch_cluster(cuda_state *st, bool pdl, unsigned cluster, const char *what, void (*kernel)(KArgs...),
                                dim3 grid, dim3 block, size_t smem, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st->stream;
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[n++].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
    if (cluster) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = cluster;
        at[n].val.clusterDim.y = 1;
        at[n++].val.clusterDim.z = 1;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    if (pdl && st->capturing && st->lanes_prog) cuda_capture_prog_edges(st);
    cuda_note(st, cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...), what);
}

/* kernel<<<grid, block, smem, st->stream>>>(args...), with programmatic stream serialisation
 * allowed when `pdl` is true; launch errors are recorded in st. */
template <typename... KArgs, typename... Args>
static void cuda_launch_pdl(cuda_state *st, bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                            Args... args) {
    cuda_launch_cluster(st, pdl, 0, "kernel launch (pdl)", kernel, grid, block, smem, args...);
}
#endif
