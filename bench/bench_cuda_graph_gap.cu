/* bench_cuda_graph_gap.cu - what it costs to run CUDA graphs back to back, with synthetic
 * kernels shaped like a decode step (docs/PERF.md: "the step-start gap").
 *
 * Every kernel spins for a given time on all SMs and stamps its start and end (globaltimer).
 * A "step" graph is: a first kernel, 8 layers of a main-lane chain beside a side-lane chain
 * (forked and joined per layer, as the model's side lane is), a long "lm_head" and a short
 * "sampler". Variants (each graph launched N times back to back, asynchronously, as the
 * engine's chained steps are):
 *   multi        the step as the model captures it (fork / join per layer)
 *   single       every kernel on one stream (no fork)
 *   head_first   multi, but the step starts with the previous step's lm_head + sampler
 *                (a graph boundary after the layers instead of after the sampler)
 *   multi_evwait multi, each launch preceded by a copy on another stream and an event wait
 *                (what copy_in does before a chained step)
 *   multi2       two steps per graph
 *   multi_copyout multi, each launch followed by an event record on the launch stream, a wait
 *                on another stream and a 64-byte copy to pinned memory with a fence after it
 *                (what copy_out does after a step's graph)
 *   multi_io     both copies; multi_prio: the lanes at the highest / lowest stream priority,
 *                instantiated with node priorities (DEEPINFER_CUDA_LANE_PRIORITY)
 *   model_like   both copies, priorities and two graphs in turn (the model's parities);
 *                model_like_hf the same with the head_first graph
 * each with plain launches and with PDL (programmatic stream serialization) launches.
 * Reported per variant: time per step, the critical path's kernel time, the difference, and
 * the waits between consecutive critical-path kernels of the last graph.
 *
 * What it showed (2026-12-05, H200, docs/PERF.md): none of these synthetic graphs has the
 * ~10 us wait after its first kernel that the model's decode graphs show (the waits between
 * critical-path kernels are 0.3-1.0 us, except "single", whose second kernel waits 6-7 us);
 * so the model graph's gap comes from something these lack (its ~400 nodes, programmatic edges
 * across lanes, node priorities, memset / copy nodes), and a long first kernel hides it there
 * (the same session's probe).
 *
 *   bench_cuda_graph_gap [--iters 40]
 */
#include "cuda_rt_bench.cuh"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

enum { MAX_NODES = 512 };

/* spins ns nanoseconds on every block; block 0 stamps [start, end] of node id */
__global__ void k_spin(unsigned long long ns, unsigned long long *stamp, int id, int pdl) {
    if (pdl) asm volatile("griddepcontrol.wait;\n" ::: "memory");
    unsigned long long t0 = gtime();
    if (pdl) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    while (gtime() - t0 < ns) {
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        stamp[2 * id] = t0;
        stamp[2 * id + 1] = gtime();
    }
}

struct builder {
    cudaStream_t main, side;
    int prio = 0; /* graphs instantiated with cudaGraphInstantiateFlagUseNodePriority */
    cudaEvent_t fork, join;
    unsigned long long *stamp;
    int pdl, n_sm, nodes = 0;
    std::vector<double> crit; /* critical-path kernel times (us) in order */
    std::vector<int> crit_id;
    void launch(cudaStream_t s, double us, bool critical) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(n_sm);
        cfg.blockDim = dim3(128);
        cfg.stream = s;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = pdl ? 1 : 0;
        int id = nodes++;
        CK(cudaLaunchKernelEx(&cfg, k_spin, (unsigned long long)(us * 1000.0), stamp, id, pdl));
        if (critical) {
            crit.push_back(us);
            crit_id.push_back(id);
        }
    }
    void layers(bool lanes) {
        for (int l = 0; l < 8; l++) {
            if (lanes) {
                CK(cudaEventRecord(fork, main));
                CK(cudaStreamWaitEvent(side, fork, 0));
                launch(side, 3, false);
                launch(side, 2, false);
            } else {
                launch(main, 3, false);
                launch(main, 2, false);
            }
            launch(main, 2, true);
            launch(main, 4, true);
            if (lanes) {
                CK(cudaEventRecord(join, side));
                CK(cudaStreamWaitEvent(main, join, 0));
            }
            launch(main, 6, true);
            launch(main, 10, true);
        }
    }
};

static cudaGraphExec_t build(builder &b, const char *kind) {
    b.nodes = 0;
    b.crit.clear();
    b.crit_id.clear();
    CK(cudaStreamBeginCapture(b.main, cudaStreamCaptureModeGlobal));
    bool lanes = strcmp(kind, "single") != 0;
    int steps = strcmp(kind, "multi2") == 0 ? 2 : 1;
    for (int s = 0; s < steps; s++) {
        if (!strcmp(kind, "head_first")) {
            b.launch(b.main, 125, true); /* the previous step's lm_head and sampler */
            b.launch(b.main, 5, true);
            b.launch(b.main, 2, true); /* embed */
            b.layers(true);
        } else {
            b.launch(b.main, 2, true); /* embed */
            b.layers(lanes);
            b.launch(b.main, 125, true);
            b.launch(b.main, 5, true);
        }
    }
    cudaGraph_t g;
    CK(cudaStreamEndCapture(b.main, &g));
    cudaGraphExec_t e;
    CK(cudaGraphInstantiate(&e, g, b.prio ? cudaGraphInstantiateFlagUseNodePriority : 0));
    CK(cudaGraphDestroy(g));
    return e;
}

int main(int argc, char **argv) {
    int iters = 40;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--iters")) iters = atoi(argv[++i]);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    builder b;
    b.n_sm = prop.multiProcessorCount;
    CK(cudaStreamCreateWithFlags(&b.main, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b.side, cudaStreamNonBlocking));
    cudaStream_t copy;
    CK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&b.fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&b.join, cudaEventDisableTiming));
    cudaEvent_t ev_in, t0, t1;
    CK(cudaEventCreateWithFlags(&ev_in, cudaEventDisableTiming));
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    CK(cudaMalloc(&b.stamp, MAX_NODES * 2 * sizeof(unsigned long long)));
    void *dmeta, *hmeta;
    CK(cudaMalloc(&dmeta, 4096));
    CK(cudaMallocHost(&hmeta, 4096));
    memset(hmeta, 0, 4096);
    printf("%s, %d SMs; %d launches per variant\n", prop.name, b.n_sm, iters);
    printf("waits (us) on the last graph's critical path: before its 2nd / 3rd / 4th kernel, the largest (@ index), the sum\n");
    printf("%-13s %-4s %9s %9s %9s %7s %7s %7s %11s %8s\n", "variant", "pdl", "us/step", "kernels", "overhead", "w2", "w3",
           "w4", "max", "sum");
    /* the model's lanes: main at the highest stream priority, side at the lowest */
    int lo = 0, hi = 0;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t main_hi, side_lo, out;
    CK(cudaStreamCreateWithPriority(&main_hi, cudaStreamNonBlocking, hi));
    CK(cudaStreamCreateWithPriority(&side_lo, cudaStreamNonBlocking, lo));
    CK(cudaStreamCreateWithFlags(&out, cudaStreamNonBlocking));
    cudaEvent_t ev_out, fence[2];
    CK(cudaEventCreateWithFlags(&ev_out, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&fence[0], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&fence[1], cudaEventDisableTiming));
    void *hout;
    CK(cudaMallocHost(&hout, 4096));
    cudaStream_t main0 = b.main, side0 = b.side;
    /* name, graph kind, copy_in before each launch, copy_out after it, lane priorities, two
     * graphs (the model's parities) in turn */
    struct variant {
        const char *name, *kind;
        int in, out, prio, two;
    } vs[] = {
        {"multi", "multi", 0, 0, 0, 0},          {"single", "single", 0, 0, 0, 0},
        {"head_first", "head_first", 0, 0, 0, 0}, {"multi_evwait", "multi", 1, 0, 0, 0},
        {"multi2", "multi2", 0, 0, 0, 0},        {"multi_copyout", "multi", 0, 1, 0, 0},
        {"multi_io", "multi", 1, 1, 0, 0},       {"multi_prio", "multi", 0, 0, 1, 0},
        {"model_like", "multi", 1, 1, 1, 1},     {"model_like_hf", "head_first", 1, 1, 1, 1},
    };
    for (int pdl = 0; pdl < 2; pdl++)
        for (const variant &v : vs) {
            const char *kind = v.kind;
            b.pdl = pdl;
            b.prio = v.prio;
            b.main = v.prio ? main_hi : main0;
            b.side = v.prio ? side_lo : side0;
            cudaGraphExec_t e = build(b, kind), e2 = v.two ? build(b, kind) : NULL;
            int steps = !strcmp(kind, "multi2") ? 2 : 1, launches = 0;
            auto one = [&]() {
                if (v.in) { /* copy_in: the next step's metadata on a copy lane, the main lane waits */
                    CK(cudaMemcpyAsync(dmeta, hmeta, 1024, cudaMemcpyHostToDevice, copy));
                    CK(cudaEventRecord(ev_in, copy));
                    CK(cudaStreamWaitEvent(b.main, ev_in, 0));
                }
                CK(cudaGraphLaunch(e2 && (launches & 1) ? e2 : e, b.main));
                if (v.out) { /* copy_out: the tokens back on another lane under a fence */
                    CK(cudaEventRecord(ev_out, b.main));
                    CK(cudaStreamWaitEvent(out, ev_out, 0));
                    CK(cudaMemcpyAsync(hout, dmeta, 64, cudaMemcpyDeviceToHost, out));
                    CK(cudaEventRecord(fence[launches & 1], out));
                }
                launches++;
            };
            for (int w = 0; w < 3; w++) one();
            CK(cudaStreamSynchronize(b.main));
            CK(cudaEventRecord(t0, b.main));
            for (int i = 0; i < iters; i++) one();
            CK(cudaEventRecord(t1, b.main));
            CK(cudaStreamSynchronize(b.main));
            CK(cudaGetLastError());
            float ms;
            CK(cudaEventElapsedTime(&ms, t0, t1));
            double per = ms * 1000.0 / iters / steps, kern = 0;
            for (double c : b.crit) kern += c;
            kern /= steps;
            std::vector<unsigned long long> st(2 * b.nodes);
            CK(cudaMemcpy(st.data(), b.stamp, st.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
            /* waits on the critical path of the last graph: start of kernel i - end of kernel i-1 */
            double sum = 0, mx = 0, d[3] = {0, 0, 0};
            int at = 0;
            for (size_t i = 1; i < b.crit_id.size(); i++) {
                double w = ((double)st[2 * b.crit_id[i]] - (double)st[2 * b.crit_id[i - 1] + 1]) / 1000.0;
                if (i <= 3) d[i - 1] = w;
                sum += w;
                if (w > mx) mx = w, at = (int)i;
            }
            printf("%-13s %-4d %9.1f %9.1f %9.1f %7.1f %7.1f %7.1f %7.1f@%-3d %8.1f\n", v.name, pdl, per, kern,
                   per - kern, d[0], d[1], d[2], mx, at, sum);
            CK(cudaStreamSynchronize(out));
            CK(cudaGraphExecDestroy(e));
            if (e2) CK(cudaGraphExecDestroy(e2));
        }
    return 0;
}
