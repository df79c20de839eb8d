/* cuda_graph_fill.cu - rewrites the small memset nodes of a captured decode graph into fill
 * kernels. cuBLASLt issues a cudaMemsetAsync of a few bytes (a counter in its workspace) before
 * some algorithms, e.g. the routed experts' pointer-array gate/up GEMM of 16-128-token steps;
 * in a replayed graph a memset node between two kernels left a gap of 8-14 us before that
 * GEMM (bench_cuda_e2e --trace, docs/PERF.md 2026-12-02). A kernel node writing the same bytes
 * takes the memset's place, with the same incoming and outgoing edges.
 *
 * Owner: cuda. Invariants: only 1-D memsets of at most FILL_MAX_BYTES whose edges are all
 * plain (no programmatic or port data) are rewritten; anything else is left as it is, and any
 * failure before the graph changes leaves it unchanged. Switch: st->graph_fill
 * (DEEPINFER_CUDA_GRAPH_FILL, default on). */
#include <stdlib.h>

#include "backend/cuda/cuda_internal.h"

enum { FILL_MAX_BYTES = 1 << 16, FILL_MAX_EDGES = 64 };

/* dst[i] = value for i < width elements of esize (1, 2 or 4) bytes: cudaMemset's semantics
 * (the low esize bytes of value). */
__global__ void k_graph_fill(void *dst, unsigned value, int esize, unsigned long long width) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < width;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        if (esize == 4) ((unsigned *)dst)[i] = value;
        else if (esize == 2) ((unsigned short *)dst)[i] = (unsigned short)value;
        else ((unsigned char *)dst)[i] = (unsigned char)value;
    }
}

static bool plain_edges(const cudaGraphEdgeData *e, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (e[i].type != cudaGraphDependencyTypeDefault || e[i].from_port != 0 || e[i].to_port != 0) return false;
    return true;
}

/* 1 if node was replaced by a fill kernel, 0 if left as it is */
static int replace_one(cudaGraph_t g, cudaGraphNode_t node) {
    cudaMemsetParams p;
    if (cudaGraphMemsetNodeGetParams(node, &p) != cudaSuccess) return 0;
    if (p.height != 1 || (p.elementSize != 1 && p.elementSize != 2 && p.elementSize != 4) ||
        p.width * p.elementSize > FILL_MAX_BYTES || p.width == 0)
        return 0;
    cudaGraphNode_t in[FILL_MAX_EDGES], out[FILL_MAX_EDGES];
    cudaGraphEdgeData ein[FILL_MAX_EDGES], eout[FILL_MAX_EDGES];
    size_t nin = FILL_MAX_EDGES, nout = FILL_MAX_EDGES;
    if (cudaGraphNodeGetDependencies(node, NULL, NULL, &nin) != cudaSuccess || nin > FILL_MAX_EDGES) return 0;
    if (cudaGraphNodeGetDependentNodes(node, NULL, NULL, &nout) != cudaSuccess || nout > FILL_MAX_EDGES) return 0;
    if (cudaGraphNodeGetDependencies(node, in, ein, &nin) != cudaSuccess ||
        cudaGraphNodeGetDependentNodes(node, out, eout, &nout) != cudaSuccess)
        return 0;
    if (!plain_edges(ein, nin) || !plain_edges(eout, nout)) return 0;
    void *dst = p.dst;
    unsigned value = p.value;
    int esize = (int)p.elementSize;
    unsigned long long width = p.width;
    void *args[4] = {&dst, &value, &esize, &width};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)k_graph_fill;
    kp.gridDim = dim3((unsigned)((width + 255) / 256 < 64 ? (width + 255) / 256 : 64));
    kp.blockDim = dim3(256);
    kp.kernelParams = args;
    cudaGraphNode_t k = NULL;
    if (cudaGraphAddKernelNode(&k, g, in, nin, &kp) != cudaSuccess) return 0;
    for (size_t i = 0; i < nout; i++)
        if (cudaGraphAddDependencies(g, &k, &out[i], NULL, 1) != cudaSuccess) {
            cudaGraphDestroyNode(k); /* its edges go with it: the graph is as before */
            return 0;
        }
    cudaGraphDestroyNode(node); /* and the memset's edges */
    return 1;
}

int cuda_graph_fill_memsets(cudaGraph_t g) {
    size_t n = 0;
    if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess || n == 0) return 0;
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(n * sizeof *nodes);
    if (!nodes) return 0;
    int replaced = 0;
    if (cudaGraphGetNodes(g, nodes, &n) == cudaSuccess)
        for (size_t i = 0; i < n; i++) {
            cudaGraphNodeType t;
            if (cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == cudaGraphNodeTypeMemset)
                replaced += replace_one(g, nodes[i]);
        }
    free(nodes);
    cudaGetLastError(); /* a refused edit is not an error of the step */
    return replaced;
}
