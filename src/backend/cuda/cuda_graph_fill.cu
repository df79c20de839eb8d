/* cuda_graph_fill.cu - rewrites the small memset nodes of a captured decode graph into fill
 * kernels. cuBLASLt issues a cudaMemsetAsync of a few bytes (a counter in its workspace) before
 * some algorithms, e.g. the routed experts' pointer-array gate/up GEMM of 16-128-token steps;
 * in a replayed graph a memset node between two kernels left a gap of 8-14 us before that
 * GEMM (bench_cuda_e2e --trace, docs/PERF.md 2026-12-02). A kernel node writing the same bytes
 * takes the memset's place, with the same incoming and outgoing edges.
 *
 * The one that follows the routed experts' permutation kernel is folded into that kernel
 * instead (fold_one below: no node at all).
 *
 * Owner: cuda. Invariants: only 1-D memsets of at most FILL_MAX_BYTES whose edges are all
 * plain (no programmatic or port data) are rewritten; anything else is left as it is, and any
 * failure before the graph changes leaves it unchanged. Switches: st->graph_fill
 * (DEEPINFER_CUDA_GRAPH_FILL, default on), st->moe_fold (DEEPINFER_CUDA_MOE_FOLD, default on). */
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

/* Folding: a memset whose only predecessor is the routed experts' permutation kernel (the
 * counter cuBLASLt zeroes before the pointer-array gate+up GEMM, in the main lane's workspace)
 * is done by that kernel instead (moe_zero, cuda_internal.h) and its node removed, the kernel
 * then feeding the memset's dependents directly. The kernel does the fill after its PDL wait, so
 * every kernel before it on the lane (the last cuBLASLt GEMM among them) has completed, and the
 * GEMM after it starts only when it completes: the same order as the memset had. One fill is
 * registered per backend (the first one seen); a memset with other parameters is not folded. A
 * permutation kernel in a graph without that memset does the fill anyway: harmless, as no
 * cuBLASLt call of the main lane runs between its wait and its end. */
enum { FOLD_MAX_BYTES = 256 };

/* 1 if node (a memset with parameters p) was folded into the permutation kernel before it */
static int fold_one(cuda_state *st, cudaGraph_t g, cudaGraphNode_t node, const cudaMemsetParams *p) {
    if (!st->moe_fold || !st->moe_zero_dev || !st->lt_ws) return 0;
    const char *d = (const char *)p->dst, *ws = (const char *)st->lt_ws;
    size_t bytes = p->width * p->elementSize;
    if (d < ws || bytes > FOLD_MAX_BYTES || d + bytes > ws + st->lt_ws_bytes) return 0;
    moe_zero z = {p->dst, p->value, (int)p->elementSize, (unsigned long long)p->width};
    const moe_zero &r = st->moe_zero_host;
    if (r.dst && (r.dst != z.dst || r.value != z.value || r.esize != z.esize || r.width != z.width)) return 0;
    cudaGraphNode_t in[2], out[FILL_MAX_EDGES];
    cudaGraphEdgeData ein[2], eout[FILL_MAX_EDGES];
    size_t nin = 0, nout = 0;
    if (cudaGraphNodeGetDependencies(node, NULL, NULL, &nin) != cudaSuccess || nin != 1) return 0;
    if (cudaGraphNodeGetDependentNodes(node, NULL, NULL, &nout) != cudaSuccess || nout > FILL_MAX_EDGES) return 0;
    if (cudaGraphNodeGetDependencies(node, in, ein, &nin) != cudaSuccess ||
        cudaGraphNodeGetDependentNodes(node, out, eout, &nout) != cudaSuccess)
        return 0;
    if (!plain_edges(ein, nin) || !plain_edges(eout, nout)) return 0;
    cudaGraphNodeType t;
    cudaKernelNodeParams kp;
    if (cudaGraphNodeGetType(in[0], &t) != cudaSuccess || t != cudaGraphNodeTypeKernel ||
        cudaGraphKernelNodeGetParams(in[0], &kp) != cudaSuccess || kp.func != cuda_moe_permute_fn())
        return 0;
    if (!r.dst) {
        if (cudaMemcpy(st->moe_zero_dev, &z, sizeof z, cudaMemcpyHostToDevice) != cudaSuccess) return 0;
        st->moe_zero_host = z;
    }
    for (size_t i = 0; i < nout; i++)
        if (cudaGraphAddDependencies(g, &in[0], &out[i], NULL, 1) != cudaSuccess) {
            for (size_t j = 0; j < i; j++) cudaGraphRemoveDependencies(g, &in[0], &out[j], NULL, 1);
            return 0;
        }
    cudaGraphDestroyNode(node); /* and its edges */
    return 1;
}

/* 1 if node was folded or replaced by a fill kernel, 0 if left as it is */
static int replace_one(cuda_state *st, cudaGraph_t g, cudaGraphNode_t node) {
    cudaMemsetParams p;
    if (cudaGraphMemsetNodeGetParams(node, &p) != cudaSuccess) return 0;
    if (p.height != 1 || (p.elementSize != 1 && p.elementSize != 2 && p.elementSize != 4) || p.width == 0) return 0;
    if (fold_one(st, g, node, &p)) return 1;
    if (p.width * p.elementSize > FILL_MAX_BYTES) return 0;
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

int cuda_graph_fill_memsets(cuda_state *st, cudaGraph_t g) {
    size_t n = 0;
    if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess || n == 0) return 0;
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(n * sizeof *nodes);
    if (!nodes) return 0;
    int replaced = 0;
    if (cudaGraphGetNodes(g, nodes, &n) == cudaSuccess)
        for (size_t i = 0; i < n; i++) {
            cudaGraphNodeType t;
            if (cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == cudaGraphNodeTypeMemset)
                replaced += replace_one(st, g, nodes[i]);
        }
    free(nodes);
    cudaGetLastError(); /* a refused edit is not an error of the step */
    return replaced;
}
