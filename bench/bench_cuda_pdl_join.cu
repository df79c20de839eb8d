/* bench_cuda_pdl_join.cu - when does a PDL kernel that follows a join of two lanes start, in a
 * captured CUDA graph (docs/PERF.md: MLA decode starts only when W_UK and the side lane's
 * rope_kv_write have ended, although both release it at their start)?
 *
 * The pattern of the model's one-token attention, with spin kernels that stamp their blocks'
 * first start, first return from griddepcontrol.wait and last end (globaltimer):
 *   main: NORM (1 block, 2 us) -> fork -> W1 ("W_UK": G1 blocks, 4 us, releases at its start)
 *   side: R2 ("rope_kv_write": 1 block, 6 us (or 1), releases at its start; the first launch after the
 *         fork, so PDL with a programmatic edge from NORM, as the backend's lane edges do)
 *   join -> K3 ("MLA decode": PDL, 7 blocks, S3 bytes of dynamic shared memory, releases at its
 *         start, then waits) -> K4 ("W_UV": PDL, 64 blocks)
 * Variants (each a graph replayed N times; medians reported):
 *   one_lane        no side lane: K3's only dependency is W1 (plain PDL within one stream)
 *   join_prog       K3 after the join, both in-edges programmatic (cuda_capture_prog_edges)
 *   join_plain      K3 after the join, the side edge a full dependency
 *   join_prog_r2short  join_prog with the side kernel ending before W1 (1 us instead of 6)
 *   join_prog_prio  join_prog with the lanes at the highest / lowest stream priority and the
 *                   graph instantiated with node priorities, as the model's lanes are
 *   *_smem          the same with K3 taking 96 KB of dynamic shared memory (MLA's tiles) while
 *                   W1 runs 2 blocks of 256 threads on every SM
 *   *_carve         ..._smem with every node's kernel at a 100% shared-memory carveout preference
 * Reported (us): K3's first block start relative to W1's end and to R2's end (negative: it
 * started early), and K3's first return from its wait relative to the later of the two ends.
 * Then one more question of PDL semantics: if a PDL kernel exits without waiting, does the
 * PDL kernel after it still wait for the one before it (K4's wait against W1's end)?
 *
 *   bench_cuda_pdl_join [--iters 30]
 */
#include "cuda_rt_bench.cuh"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>


/* stamps of node id: [0] first block start, [1] first return from the wait, [2] last block end */
enum { NODES = 6, NORM = 0, W1 = 1, R2 = 2, K3 = 3, K4 = 4 };

__global__ void k_node(unsigned long long ns, unsigned long long *st, int id, int wait, int touch) {
    extern __shared__ unsigned char smem[];
    unsigned long long t0 = gtime();
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    if (wait) asm volatile("griddepcontrol.wait;\n" ::: "memory");
    unsigned long long t1 = gtime();
    if (touch && threadIdx.x == 0) smem[0] = 1; /* the dynamic shared memory, when there is any */
    while (gtime() - t1 < ns) {
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicMin(st + 3 * id, t0);
        atomicMin(st + 3 * id + 1, t1);
        atomicMax(st + 3 * id + 2, gtime());
    }
}

/* the backend's cuda_capture_prog_edges: the stream's captured kernel dependencies become
 * programmatic edges */
static void prog_edges(cudaStream_t s) {
    cudaStreamCaptureStatus cs;
    const cudaGraphNode_t *deps = NULL;
    const cudaGraphEdgeData *ed = NULL;
    size_t n = 0;
    CK(cudaStreamGetCaptureInfo(s, &cs, NULL, NULL, &deps, &ed, &n));
    if (cs != cudaStreamCaptureStatusActive || n == 0 || n > 8) return;
    cudaGraphNode_t nd[8];
    cudaGraphEdgeData e[8];
    for (size_t i = 0; i < n; i++) {
        nd[i] = deps[i];
        memset(&e[i], 0, sizeof e[i]);
        if (ed) e[i] = ed[i];
        cudaGraphNodeType t;
        CK(cudaGraphNodeGetType(nd[i], &t));
        if (t == cudaGraphNodeTypeKernel && e[i].type == cudaGraphDependencyTypeDefault) {
            e[i].type = cudaGraphDependencyTypeProgrammatic;
            e[i].from_port = cudaGraphKernelNodePortProgrammatic;
        }
    }
    CK(cudaStreamUpdateCaptureDependencies(s, nd, e, n, cudaStreamSetCaptureDependencies));
}

struct variant {
    const char *name;
    bool side, prog, smem, carve;
    double r2_us; /* the side kernel's spin (W1 spins 4 us) */
    bool prio;    /* the lanes at the highest / lowest stream priority, node priorities on (the model's
                   * DEEPINFER_CUDA_LANE_PRIORITY) */
};

static void launch(cudaStream_t s, int blocks, int threads, size_t smem, double us, unsigned long long *st, int id,
                   bool pdl, bool wait = true) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k_node, (unsigned long long)(us * 1000.0), st, id, pdl && wait ? 1 : 0,
                          smem > 0 ? 1 : 0));
}

int main(int argc, char **argv) {
    int iters = 30;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_cuda_pdl_join [--iters N]\n");
            return 2;
        }
    }
    if (iters < 3) iters = 3;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int n_sm = prop.multiProcessorCount;
    printf("%s: %d SMs; medians over %d replays (us; negative = before that end)\n", prop.name, n_sm, iters);
    CK(cudaFuncSetAttribute(k_node, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
    cudaStream_t main_n, side_n, main_p, side_p;
    int p_least = 0, p_greatest = 0;
    CK(cudaDeviceGetStreamPriorityRange(&p_least, &p_greatest));
    CK(cudaStreamCreateWithFlags(&main_n, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&side_n, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithPriority(&main_p, cudaStreamNonBlocking, p_greatest));
    CK(cudaStreamCreateWithPriority(&side_p, cudaStreamNonBlocking, p_least));
    cudaEvent_t fork, join;
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    unsigned long long *st;
    CK(cudaMalloc(&st, (size_t)iters * NODES * 3 * sizeof(unsigned long long)));
    std::vector<unsigned long long> init((size_t)iters * NODES * 3), got(init.size());
    for (size_t i = 0; i < init.size(); i++) init[i] = i % 3 == 2 ? 0ull : ~0ull;
    const variant vs[] = {{"one_lane", false, false, false, false, 6.0, false},
                          {"join_prog", true, true, false, false, 6.0, false},
                          {"join_plain", true, false, false, false, 6.0, false},
                          {"join_prog_r2short", true, true, false, false, 1.0, false},
                          {"join_prog_prio", true, true, false, false, 6.0, true},
                          {"one_lane_smem", false, false, true, false, 6.0, false},
                          {"join_prog_smem", true, true, true, false, 6.0, false},
                          {"join_prog_smem_carve", true, true, true, true, 6.0, false}};
    printf("%-22s %12s %12s %14s %12s\n", "variant", "K3-W1end", "K3-R2end", "K3wait-later", "K3-W1start");
    for (const variant &v : vs) {
        CK(cudaFuncSetAttribute(k_node, cudaFuncAttributePreferredSharedMemoryCarveout, v.carve ? 100 : -1));
        CK(cudaMemcpy(st, init.data(), init.size() * sizeof(unsigned long long), cudaMemcpyHostToDevice));
        std::vector<cudaGraphExec_t> ex((size_t)iters);
        int g1 = v.smem ? 2 * n_sm : 256, t1 = 256;
        cudaStream_t main_s = v.prio ? main_p : main_n, side_s = v.prio ? side_p : side_n;
        for (int it = 0; it < iters; it++) {
            unsigned long long *s = st + (size_t)it * NODES * 3;
            CK(cudaStreamBeginCapture(main_s, cudaStreamCaptureModeThreadLocal));
            launch(main_s, 1, 256, 0, 2.0, s, NORM, false);
            if (v.side) {
                CK(cudaEventRecord(fork, main_s));
                CK(cudaStreamWaitEvent(side_s, fork, 0));
                prog_edges(side_s);
                launch(side_s, 1, 256, 0, v.r2_us, s, R2, true);
            }
            launch(main_s, g1, t1, 0, 4.0, s, W1, true);
            if (v.side) {
                CK(cudaEventRecord(join, side_s));
                CK(cudaStreamWaitEvent(main_s, join, 0));
                if (v.prog) prog_edges(main_s);
            }
            launch(main_s, 7, 128, v.smem ? 96 * 1024 : 0, 2.0, s, K3, true);
            launch(main_s, 64, 256, 0, 2.0, s, K4, true);
            ex[it] = capture_end(main_s, v.prio ? cudaGraphInstantiateFlagUseNodePriority : 0);
        }
        replay_once(ex, main_n);
        CK(cudaMemcpy(got.data(), st, got.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        std::vector<double> a, b, c, d;
        for (int it = 1; it < iters; it++) {
            const unsigned long long *s = got.data() + (size_t)it * NODES * 3;
            double w1_end = (double)s[3 * W1 + 2], r2_end = v.side ? (double)s[3 * R2 + 2] : w1_end;
            double k3 = (double)s[3 * K3], k3w = (double)s[3 * K3 + 1];
            a.push_back((k3 - w1_end) / 1e3);
            b.push_back((k3 - r2_end) / 1e3);
            c.push_back((k3w - std::max(w1_end, r2_end)) / 1e3);
            d.push_back((k3 - (double)s[3 * W1]) / 1e3);
        }
        printf("%-22s %12.2f %12.2f %14.2f %12.2f\n", v.name, median(a), v.side ? median(b) : 0.0, median(c),
               median(d));
    }
    /* A PDL kernel that returns without griddepcontrol.wait (as an all-greedy sampler block could,
     * reading its rows' temperatures before the wait): does the PDL kernel after it still wait for
     * the kernel before it? W1 (4 us) -> K3 (exits at once, waiting or not) -> K4 (PDL and
     * waiting, or a plain launch as a copy node after the sampler is): K4's first return from its
     * wait (its start when plain) relative to W1's end; negative = the chain broke. */
    printf("%-22s %14s\n", "successor of", "K4wait-W1end");
    CK(cudaFuncSetAttribute(k_node, cudaFuncAttributePreferredSharedMemoryCarveout, -1));
    for (int form = 0; form < 3; form++) {
        const int k3_waits = form == 0, k4_pdl = form != 2; /* K4 plain: the full edge a copy node has */
        CK(cudaMemcpy(st, init.data(), init.size() * sizeof(unsigned long long), cudaMemcpyHostToDevice));
        std::vector<cudaGraphExec_t> ex((size_t)iters);
        for (int it = 0; it < iters; it++) {
            unsigned long long *s = st + (size_t)it * NODES * 3;
            CK(cudaStreamBeginCapture(main_n, cudaStreamCaptureModeThreadLocal));
            launch(main_n, 1, 256, 0, 2.0, s, NORM, false);
            launch(main_n, 256, 256, 0, 4.0, s, W1, true);
            launch(main_n, 7, 128, 0, 0.0, s, K3, true, k3_waits != 0);
            launch(main_n, 64, 256, 0, 2.0, s, K4, k4_pdl != 0);
            ex[it] = capture_end(main_n, 0);
        }
        replay_once(ex, main_n);
        CK(cudaMemcpy(got.data(), st, got.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        std::vector<double> w;
        for (int it = 1; it < iters; it++) {
            const unsigned long long *s = got.data() + (size_t)it * NODES * 3;
            /* K4's wait when it is a PDL kernel, else its start */
            w.push_back(((double)s[3 * K4 + (k4_pdl ? 1 : 0)] - (double)s[3 * W1 + 2]) / 1e3);
        }
        const char *what[3] = {"K3 waits, K4 PDL", "K3 no wait, K4 PDL", "K3 no wait, K4 plain"};
        double mid = median(w); /* sorts w */
        printf("%-22s %14.2f  (min %.2f)\n", what[form], mid, w[0]);
    }
    cudaFree(st);
    return 0;
}
