/* bench_cuda_l2pin.cu - whether data kept in the L2's persisting set-aside survives a decode
 * step's worth of streaming reads, and how fast it is read back (docs/PERF.md: the L2-pin lead).
 *
 * A decode step at batch 1 reads ~1.9 GB of weights once each (v2lite-8l), so every byte comes
 * from HBM and no byte is in L2 at its next step. With cudaLimitPersistingL2CacheSize set
 * aside and a kernel launched with a persisting access-policy window over a "hot" buffer, the
 * hot lines should stay in L2 across the other ("cold") reads, which take the normal property.
 * Each round: read the hot buffer (one kernel, 16-byte loads, every SM), then stream `cold`
 * MB of other data (one kernel); the hot kernel's time is taken from globaltimer stamps of its
 * first block start and its last block end. Variants:
 *   plain        no set-aside, no window (the hot buffer comes from HBM every round)
 *   pin          set-aside = hot size, window over the hot buffer, hitRatio 1
 *   pin_ratio    the same with hitRatio 0.9 (a tenth of the lines streaming)
 *   pin_graph    pin, both kernels captured in a CUDA graph and the graph replayed (the launch
 *                attribute must survive capture)
 * for hot sizes of 4-36 MB (capped at the device's persisting maximum). Reported: median hot
 * time over the rounds, its bandwidth, and the cold kernel's bandwidth (the set-aside must not
 * slow the stream down).
 *
 *   bench_cuda_l2pin [--cold MB (1900)] [--rounds N (20)]
 */
#include "cuda_rt_bench.cuh"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>


/* Sums n 16-byte words (grid-stride), one result per block; stamps[0] = the earliest block
 * start (atomicMin), stamps[1] = the latest block end (atomicMax). */
__global__ void k_read(const uint4 *p, size_t n, unsigned *sink, unsigned long long *stamps) {
    unsigned long long t0 = gtime();
    unsigned acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        uint4 a = p[i];
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicXor(sink + blockIdx.x, acc);
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicMin(stamps, t0);
        atomicMax(stamps + 1, gtime());
    }
}

struct variant {
    const char *name;
    bool pin, graph;
    float ratio;
};

static void launch_read(cudaStream_t s, int blocks, const void *p, size_t bytes, unsigned *sink,
                        unsigned long long *stamps, const void *window, size_t window_bytes, float ratio) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(512);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    if (window) {
        at[0].id = cudaLaunchAttributeAccessPolicyWindow;
        at[0].val.accessPolicyWindow.base_ptr = (void *)window;
        at[0].val.accessPolicyWindow.num_bytes = window_bytes;
        at[0].val.accessPolicyWindow.hitRatio = ratio;
        at[0].val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
        at[0].val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
        cfg.attrs = at;
        cfg.numAttrs = 1;
    }
    CK(cudaLaunchKernelEx(&cfg, k_read, (const uint4 *)p, bytes / 16, sink, stamps));
}

int main(int argc, char **argv) {
    size_t cold_mb = 1900;
    int rounds = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cold") && i + 1 < argc) cold_mb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_cuda_l2pin [--cold MB] [--rounds N]\n");
            return 2;
        }
    }
    if (rounds < 3 || cold_mb < 64) {
        fprintf(stderr, "bench_cuda_l2pin: --rounds >= 3 and --cold >= 64 please\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    size_t most = (size_t)prop.persistingL2CacheMaxSize;
    if ((size_t)prop.accessPolicyMaxWindowSize < most) most = (size_t)prop.accessPolicyMaxWindowSize;
    printf("%s: %d SMs, L2 %d MB, persisting at most %.1f MB (window at most %.1f MB), cold stream %zu MB, %d rounds\n",
           prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, prop.persistingL2CacheMaxSize / 1048576.0,
           prop.accessPolicyMaxWindowSize / 1048576.0, cold_mb, rounds);
    if (!most) {
        printf("no persisting L2 on this device\n");
        return 0;
    }
    const int blocks = prop.multiProcessorCount * 4;
    size_t cold_bytes = cold_mb << 20, hot_max = (size_t)36 << 20;
    void *hot, *cold;
    unsigned *sink;
    unsigned long long *stamps;
    CK(cudaMalloc(&hot, hot_max));
    CK(cudaMalloc(&cold, cold_bytes));
    CK(cudaMalloc(&sink, (size_t)blocks * sizeof(unsigned)));
    CK(cudaMalloc(&stamps, (size_t)rounds * 2 * 2 * sizeof(unsigned long long)));
    CK(cudaMemset(hot, 1, hot_max));
    CK(cudaMemset(cold, 2, cold_bytes));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const variant vs[] = {{"plain", false, false, 1.f},
                          {"pin", true, false, 1.f},
                          {"pin_ratio", true, false, 0.9f},
                          {"pin_graph", true, true, 1.f}};
    const int sizes_mb[] = {4, 8, 16, 24, 30, 36};
    printf("%-10s %6s %12s %12s %12s\n", "variant", "hot MB", "hot us", "hot GB/s", "cold GB/s");
    std::vector<unsigned long long> st((size_t)rounds * 4);
    for (int mb : sizes_mb) {
        size_t hb = (size_t)mb << 20;
        if (hb > most) hb = most & ~(size_t)0xffff;
        for (const variant &v : vs) {
            CK(cudaCtxResetPersistingL2Cache());
            CK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, v.pin ? hb : 0));
            CK(cudaMemset(stamps, 0, (size_t)rounds * 4 * sizeof(unsigned long long)));
            /* stamps of round r: hot [4r, 4r+1], cold [4r+2, 4r+3]; the start slots need a high
             * value for atomicMin */
            for (int r = 0; r < rounds; r++) {
                unsigned long long init[4] = {~0ull, 0, ~0ull, 0};
                CK(cudaMemcpy(stamps + 4 * r, init, sizeof init, cudaMemcpyHostToDevice));
            }
            const void *win = v.pin ? hot : NULL;
            if (v.graph) {
                /* one graph per round (its own stamps): hot, then cold */
                std::vector<cudaGraphExec_t> ex((size_t)rounds);
                for (int r = 0; r < rounds; r++) {
                    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                    launch_read(s, blocks, hot, hb, sink, stamps + 4 * r, win, hb, v.ratio);
                    launch_read(s, blocks, cold, cold_bytes, sink, stamps + 4 * r + 2, NULL, 0, 1.f);
                    ex[r] = capture_end(s, 0);
                }
                replay_once(ex, s);
            } else {
                for (int r = 0; r < rounds; r++) {
                    launch_read(s, blocks, hot, hb, sink, stamps + 4 * r, win, hb, v.ratio);
                    launch_read(s, blocks, cold, cold_bytes, sink, stamps + 4 * r + 2, NULL, 0, 1.f);
                }
                CK(cudaStreamSynchronize(s));
            }
            CK(cudaMemcpy(st.data(), stamps, st.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
            std::vector<double> hot_us, cold_us;
            for (int r = 1; r < rounds; r++) { /* round 0 fills the L2 */
                hot_us.push_back((st[4 * r + 1] - st[4 * r]) / 1e3);
                cold_us.push_back((st[4 * r + 3] - st[4 * r + 2]) / 1e3);
            }
            double h = median(hot_us), c = median(cold_us);
            printf("%-10s %6.1f %12.2f %12.0f %12.0f\n", v.name, hb / 1048576.0, h, hb / h / 1e3, cold_bytes / c / 1e3);
        }
    }
    CK(cudaCtxResetPersistingL2Cache());
    CK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0));
    cudaFree(hot);
    cudaFree(cold);
    cudaFree(sink);
    cudaFree(stamps);
    cudaStreamDestroy(s);
    return 0;
}
