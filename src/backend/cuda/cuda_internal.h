/* cuda_internal.h - shared internals of the CUDA backend (Hopper, sm_90a): the backend's
 * private state, error bookkeeping, bf16/fp8 helpers, the weight view the GEMM kernels read,
 * and the entry points each .cu file exposes to the op table in cuda_backend.cu.
 *
 * Owner: cuda. Invariants:
 *  - every op is enqueued on st->stream and never synchronises the host; a launch or CUDA
 *    error is recorded once in st->err (first error wins) and surfaces from sync()/download();
 *  - ops never allocate: scratch comes from the caller (op arguments) or from the workspace
 *    sized once by reserve();
 *  - activations and the KV cache are bf16; weights are bf16, or fp8 e4m3 with fp32 block
 *    scales (row-major [n][ceil(rows/br)][scale_ld], scale_ld = roundup(ceil(cols/bc), 4)),
 *    or f32 for vectors (rows == 1: norm weights, the router bias). */
#ifndef DI_BACKEND_CUDA_INTERNAL_H
#define DI_BACKEND_CUDA_INTERNAL_H
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <cublasLt.h>
#include <stdint.h>

extern "C" {
#include "core/dtype.h"   /* plain C header without its own extern "C" */
}
#include "backend/backend.h"
#include "core/status.h"

typedef __nv_bfloat16 bf16;

/* One cached cuBLASLt plan (descriptors + algorithm) for a GEMM shape. */
typedef struct lt_plan {
    uint64_t key;
    int valid;                     /* 1: algo found; 0: cuBLASLt has none (use our kernels) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

enum { LT_CACHE = 512 };

/* A small fill the routed experts' permutation kernel does before its cuBLASLt GEMMs (device
 * memory, one per backend; dst NULL: none): cudaMemset's semantics, width elements of esize bytes
 * set to value. cuda_graph_fill.cu registers there the counter memset that cuBLASLt issues before
 * the pointer-array gate+up GEMM, and drops that memset node from the graph. */
typedef struct moe_zero {
    void *dst;
    unsigned value;
    int esize;
    unsigned long long width;
} moe_zero;

/* The routed experts' weighted sum left undone by moe_experts_defer (cuda_moe.cu) for the next
 * add_rmsnorm_experts (cuda_ops.cu): delta[t, :] = bf16(Σ_j w[t, j] · Y[slot_of[t*k + j], :]),
 * fp32 in j order, k_moe_combine_v8's arithmetic. Y NULL: none. Both kernels that sum it hold
 * the k rows of a column piece in registers: k <= COMBINE_MAXK. */
enum { COMBINE_MAXK = 16 };
typedef struct moe_comb {
    const bf16 *Y;
    const int32_t *slot_of;
    const float *w;
    int k;
} moe_comb;

/* Steps of at most this many tokens use the side lane by default (DEEPINFER_CUDA_LANES). */
enum { DEFAULT_LANES_MAX_T = 256 };

typedef struct cuda_state {
    int device;
    int f32;                       /* DI_PRECISION_F32: the fp32 op table (cuda_f32.cu); weights,
                                    * activations and the KV cache are f32 */
    cudaStream_t stream;           /* the stream ops launch on: main_stream, or side_stream
                                    * between side_begin and side_end (cuda_backend.cu, lanes) */
    cudaStream_t main_stream, side_stream;
    cudaEvent_t ev_fork, ev_join;
    cudaStream_t in_stream, out_stream; /* copy lanes of copy_in / copy_out (asynchronous steps) */
    int out_dirty;                      /* a capture forked the out lane (copy_out): graph_end joins it */
    cudaEvent_t ev_in, ev_out, fence[DI_BACKEND_FENCES];
    int lanes;                     /* DEEPINFER_CUDA_LANES (default 1): 0 no side lane; else the
                                    * side lane is used for steps of at most lanes_max_t tokens */
    int lanes_max_t;
    int on_side, side_dirty;       /* issuing on the side lane; side ops not yet joined */
    void *lt_ws_side;              /* the side lane's cuBLASLt workspace (lt_ws_bytes) */
    cublasLtHandle_t lt;
    int n_sm;
    char err[512];                 /* first asynchronous/launch error, "" if none */
    int capturing;                 /* inside graph_begin .. graph_end */
    int lanes_prog;                /* DEEPINFER_CUDA_LANES_PROG (default 1): programmatic edges across
                                    * the lanes in captured graphs (cuda_capture_prog_edges) */
    int prog_side, prog_main;      /* a fork / join since the lane's last PDL launch */
    /* cuBLASLt */
    void *lt_ws;
    size_t lt_ws_bytes;
    int lt_ptr_algo;               /* DEEPINFER_CUDA_LT_PTR_ALGO=i (default 0): pointer-array plans take the
                                    * i-th of cuBLASLt's heuristic results (experiments) */
    int lt_ptr_tile_m;             /* DEEPINFER_CUDA_LT_PTR_TILE_M=M (default 128 on cards of >= 4 TB/s
                                    * peak, e.g. the H200, else 64; 0: off): a pointer-array
                                    * plan whose heuristic first result would cover all slots in fewer
                                    * than 4 waves takes its first result with tiles of at most M rows,
                                    * else of at most 2M (cuda_blaslt.cu ptr_pick) */
    int lt_log;                    /* DEEPINFER_CUDA_LT_LOG=1: each plan's shape, algorithm configuration
                                    * and workspace on stderr when built */
    int graph_fill;                /* DEEPINFER_CUDA_GRAPH_FILL (default 1): captured graphs get their
                                    * small memset nodes rewritten into fill kernels
                                    * (cuda_graph_fill.cu) */
    lt_plan plans[LT_CACHE];
    int fp8_act_quant;             /* DEEPINFER_FP8_ACT_QUANT=1 (default 0): fp8 GEMMs with T % 4 == 0
                                    * and T > 32 quantize activations (1x128) and run cuBLASLt fp8 */
    int gemv;                      /* DEEPINFER_CUDA_GEMV (default 1): FMA GEMV for <= 4 rows */
    int moe_lt;                    /* DEEPINFER_CUDA_MOE_LT (default 2): bf16 experts of 16..128-token
                                    * steps on cuBLASLt batched GEMMs padded to T rows per expert:
                                    * 1 strided over all experts; 2 pointer arrays over
                                    * min(E, T*k) slots, only experts with tokens read from HBM;
                                    * 3 as 2 from 8 tokens on; 4 as 2 with the spare
                                    * slots after the active ones; 0 our grouped kernels */
    moe_zero *moe_zero_dev;        /* device: the fill k_moe_permute does (NULL until reserve) */
    moe_zero moe_zero_host;        /* its host copy (dst NULL: nothing registered yet) */
    int moe_fold;                  /* DEEPINFER_CUDA_MOE_FOLD (default 1): graph_end folds the memset after
                                    * k_moe_permute into it (moe_zero) */
    int mla_uv_multi;              /* DEEPINFER_CUDA_MLA_UV_MULTI (default 1): decode steps of 2-16 tokens
                                    * merge the KV splits inside the W_UV GEMV (k_mla_uv_multi) */
    int moe_defer;                 /* DEEPINFER_CUDA_MOE_DEFER (default 1): moe_experts_defer offered */
    struct {                       /* the last moe_experts_defer (scratch NULL: none pending) */
        const void *scratch;
        int T, D;
        moe_comb c;                /* its rows, slots, routing weights (topk_w) and k */
        bf16 *spare;               /* [T, D] of the scratch nobody reads then (fallback combine) */
    } deferred;
    int moe_direct;                /* DEEPINFER_CUDA_MOE_DIRECT (default 1): the pointer-array expert
                                    * path reads the token rows of x in place (no gather) */
    int moe_pdl;                   /* DEEPINFER_CUDA_MOE_PDL (default 1): the padded expert path's permute,
                                    * SiLU-mul and combine PDL-launched (after k_route / cuBLASLt) */
    int router_smem;               /* DEEPINFER_CUDA_ROUTER_SMEM (default 1): router logits of large
                                    * prefills on the kernel that stages x in shared memory */
    int wgmma;                     /* DEEPINFER_CUDA_WGMMA (default 1): grouped bf16 expert GEMMs with a
                                    * BM = 128 tile table on the wgmma kernel (cuda_gemm_wgmma.cu) */
    int wgmma_min_rows;            /* DEEPINFER_CUDA_WGMMA_MIN_ROWS (default 16; 96 before 2026-12-03):
                                    * grouped bf16 expert GEMMs (wgmma on) whose experts average at least
                                    * this many rows get the BM = 128 tile table and run on the wgmma
                                    * kernel (most of each tile's rows empty: still memory-bound), else
                                    * BM = 64; fp8 / WGMMA=0 keep 96 (cuda_moe.cu tile_rows).
                                    * v2lite-8l, same call: decode batch 256 55.2K -> 72.0K tok/s,
                                    * prefill 512 95.4K -> 127K (16 against 96) */
    int wgmma_bm64_max;            /* DEEPINFER_CUDA_WGMMA_BM64_MAX (default 32; 0 off): wgmma
                                    * expert GEMMs averaging at most this many rows per expert
                                    * take 64-row tiles (a 5-stage copy ring, 3 steps ahead)
                                    * instead of 128: decode batch 256 (24 rows) +2.7%, prefill
                                    * 512 (48 rows) -1.6% with 64 tiles, hence 32 (H100) */
    int lt_algo;                   /* DEEPINFER_CUDA_LT_ALGO=i (experiment, default 0): plain cuBLASLt
                                    * plans take the heuristic's i-th result (LT_LOG lists them) */
    int lt_min_rows;               /* DEEPINFER_CUDA_LT_MIN_ROWS (default 2): plain / batched bf16
                                    * GEMMs with at least this many rows go to cuBLASLt */
    int moe_small;                 /* DEEPINFER_CUDA_MOE_SMALL=N (0..4, default 1): experts of steps of
                                    * at most N tokens without permutation (cuda_moe_small.cu);
                                    * measured faster than the permuted path only at one token */
    int mla_early;                 /* DEEPINFER_CUDA_MLA_EARLY (default 1): the dense mma.sync MLA decode
                                    * kernel, PDL-launched, reads the step's metadata and the cache rows
                                    * of earlier steps before its wait */
    int norm_pdl;                  /* DEEPINFER_CUDA_NORM_PDL (default 1): the vectorised RMSNorm kernels
                                    * launched with PDL (k_add_rmsnorm_v4 loads its weights before
                                    * the wait) */
    int route_pdl;                 /* DEEPINFER_CUDA_ROUTE_PDL (default 1): router logits of <= 32 tokens
                                    * PDL-launched, releasing k_route (PDL) at their start */
    int router_mid;                /* DEEPINFER_CUDA_ROUTER_MID (default 1): router logits of 33-512
                                    * tokens in blocks of 4 experts x 4 tokens (more blocks) instead
                                    * of 8 x 8; the same sums either way. H100: batch 64 / 128 / 256
                                    * +0.25 / +0.8 / +0.3%, prefill 512 +0.5% (2026-12-05) */
    int router_tt;                 /* DEEPINFER_CUDA_ROUTER_TT=1|2|4|8 (default 1): tokens per block of the
                                    * router logits of <= 32-token steps. Measured (2026-12-02,
                                    * v2lite-8l, 3 rounds per call): 2 against 8 batch 1 +1.4%, 16
                                    * +0.9%; 1 against 2 batch 1 +2%, 16 / 64 the same */
    int route_redux;               /* DEEPINFER_CUDA_ROUTE_REDUX=N (default 256; 16 before 2026-12-05
                                    * evening): steps of at most N tokens take k_route's top-k on warp
                                    * reductions of register keys (warp_topk_redux); others (or 0)
                                    * warp_argmax; same ids and bits. Measured faster at 1 and 16
                                    * tokens (2026-12-02), at 128 and 256 (+0.2%, 2026-12-05) */
    int sample_pdl;                /* DEEPINFER_CUDA_SAMPLE_PDL (default 1): the greedy and cluster samplers
                                    * PDL-launched (row parameters read before the wait) */
    int rope_pdl;                  /* DEEPINFER_CUDA_ROPE_PDL (default 1): rope_kv_write of 2-16 tokens
                                    * PDL-launched, its cos / sin table before the wait */
    int rope_late;                 /* DEEPINFER_CUDA_ROPE_LATE (default 1): rope_kv_write's q-only half
                                    * releases its dependent (W_UK) after its wait, not at its start:
                                    * W_UK's 256 early blocks held the SM slots the side lane's latent
                                    * GEMV needed (with lanes_prog: batch 1 +1.2%) */
    int silu_pdl;                  /* DEEPINFER_CUDA_SILU_PDL (default 1): silu_mul of <= 4 tokens
                                    * PDL-launched (waits, releases nothing early) */
    int combine_pdl;               /* DEEPINFER_CUDA_COMBINE_PDL (default 1): the routed experts' combine
                                    * releases its dependent (the next layer's norm, PDL) at its start */
    int down_early;                /* DEEPINFER_CUDA_DOWN_EARLY (default 1): k_small_down reads the expert
                                    * ids and loads its first weights before its PDL wait */
    int lane_priority;             /* DEEPINFER_CUDA_LANE_PRIORITY (default 1): main stream at the
                                    * highest priority, side lane at the lowest, graphs instantiated
                                    * with node priorities */
    int gemv_want, gemv_min_k;     /* GEMV split-K: DEEPINFER_CUDA_GEMV_WANT (warps per SM the grid aims
                                    * for, default 16), DEEPINFER_CUDA_GEMV_MIN_K (least columns per K
                                    * slice, default 512) */
    int side_gemv_want;            /* DEEPINFER_CUDA_SIDE_GEMV_WANT (default 8): the same target for the
                                    * side lane's GEMVs. At one V2-Lite token only the shared experts'
                                    * gate/up changes with it (16: 2 K slices, 352 blocks; 8: one slice,
                                    * 176 blocks, leaving SM slots to the routed experts' kernel beside
                                    * it): batch 1 +0.8% on an H100; 4 and 2 also split the shared
                                    * down GEMV less (-0.2%, -2.5%) (docs/PERF.md, 2026-12-06) */
    int side_sms;                  /* DEEPINFER_CUDA_SIDE_SMS=N (default 3/4 of the SMs; 0: all): the side
                                    * lane's cuBLASLt plans are chosen for N SMs
                                    * (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), the main lane's GEMMs
                                    * running beside them. H100, v2lite-8l: batch 128 / 256 +0.7% /
                                    * +1.1% with 88 or 100 of 132, batches 16-64 within 0.2%
                                    * (docs/PERF.md, 2026-12-06) */
    int gu_silu;                   /* DEEPINFER_CUDA_GU_SILU (default 1): matmul_silu takes one-token
                                    * main-lane calls (the dense FFN's gate/up GEMV with the SiLU-mul in
                                    * its epilogue, no silu_mul launch); 0 declines them */
    int sp_min_tiles;              /* DEEPINFER_CUDA_SPARSE_MIN_TILES (default 2): sparse MLA decode
                                    * uses at most ceil(ceil(sel_stride / 32) / N) KV splits */
    int mla_wgmma;                 /* DEEPINFER_CUDA_MLA_WGMMA (default 1): MLA decode with heads a
                                    * multiple of 64 on the wgmma kernel (cuda_mla_decode_wgmma.cu);
                                    * 0 the mma.sync kernel */
    int mla_uv;                    /* DEEPINFER_CUDA_MLA_UV (default 1): backend.h mla_decode_uv
                                    * merges one-token split KV inside the W_UV GEMV */
    int gemv_rows;                 /* DEEPINFER_CUDA_GEMV_ROWS (default 2, at most 4): plain and per-head
                                    * GEMMs of up to this many rows on the FMA GEMV whatever their width */
    int mla_wide;                  /* DEEPINFER_CUDA_MLA_WIDE (default 1): one-token MLA decode on
                                    * the mma.sync kernel (16 / 32 heads) in up to 128 KV splits
                                    * instead of 64 (cuda_mla_decode.cu n_splits) */
    int mla_split_floor;           /* DEEPINFER_CUDA_MLA_SPLIT_FLOOR (default 1): mma.sync MLA
                                    * decode launches of at most 8 KV splits per token round the
                                    * split count down (at most one wave of blocks: 1 split
                                    * instead of 2 at 256 tokens, 2 instead of 3 at 128); 0 up,
                                    * as before (cuda_mla_decode.cu n_splits) */
    int sample_cluster;            /* DEEPINFER_CUDA_SAMPLE_CLUSTER (default 1): sample on one
                                    * thread-block cluster per row (cuda_sample_cluster.cu; 8 or 4
                                    * blocks by batch size, or forced with 8 / 4); 0 the one-block
                                    * kernel (cuda_sample.cu) */
    int sample_greedy;             /* DEEPINFER_CUDA_SAMPLE_GREEDY (default 1): greedy rows on their
                                    * own streaming kernel (cuda_sample_greedy.cu); 0 in the
                                    * sampling kernel with the other rows */
    int pdl;                       /* DEEPINFER_CUDA_PDL (default 1): programmatic dependent launch;
                                    * 0 off, 1 the GEMV and small-expert kernels, 2 also RoPE,
                                    * kv_write and MLA decode + combine (cuda_pdl.cuh) */
    /* workspace (reserve) */
    int max_tokens, max_seqs, vocab;
    di_mla_dims mla;
    int max_fp8_cols;              /* largest K of an fp8 weight (activation-quant buffers) */
    int max_cols;                  /* largest K of any weight */
    uint8_t *aq;                   /* [roundup(max_tokens,4), max_fp8_cols] fp8 */
    float *aq_scale;               /* [ceil(max_fp8_cols/128), roundup(max_tokens,4)] */
    float *dec_part;               /* split-KV partials */
    size_t dec_part_bytes;
    /* pinned staging for upload() */
    char *pin;
    size_t pin_bytes, pin_used;
} cuda_state;

static inline cuda_state *cst(di_backend *be) { return (cuda_state *)be->impl; }

/* Records the first error (CUDA error code or message); returns nonzero if `e` is an error. */
int cuda_note(cuda_state *st, cudaError_t e, const char *what);
void cuda_note_msg(cuda_state *st, const char *msg);
/* cuda_backend.cu: programmatic lane edges for a captured PDL launch (DEEPINFER_CUDA_LANES_PROG) */
void cuda_capture_prog_edges(cuda_state *st);
/* Checks the last launch error after a kernel launch. */
#define CUDA_LAUNCHED(st, what) cuda_note((st), cudaGetLastError(), (what))

static inline int ceil_div_i(int a, int b) { return (a + b - 1) / b; }
static inline size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Sequence of token t among [lo, hi), or -1 if t is outside their tokens. */
static __device__ __forceinline__ int seq_of(const int32_t *seq_start, int lo, int hi, int t) {
    if (t < seq_start[lo] || t >= seq_start[hi]) return -1;
    while (hi - lo > 1) {
        int mid = (lo + hi) >> 1;
        if (seq_start[mid] <= t) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Context position of token t of sequence seq: a step's tokens of a sequence are the last
 * seq_start[seq + 1] - seq_start[seq] positions of its context of ctx_len[seq]. */
static __device__ __forceinline__ int token_pos(const int32_t *seq_start, const int32_t *ctx_len, int seq, int t) {
    return ctx_len[seq] - (seq_start[seq + 1] - seq_start[seq]) + (t - seq_start[seq]);
}

/* Sum of v over the block (T float or double; blockDim.x a multiple of 32, <= 1024; red: 32 T of
 * shared memory); every thread gets the same sum: a warp-xor tree, then the warps' partials
 * added in warp order. */
template <typename T>
static __device__ __forceinline__ T block_sum(T v, T *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    T s = 0;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

/* Element loads / stores of the kernels templated on the activation type (bf16, or f32 in
 * the f32 op table): fp32 values in registers either way. */
static __device__ __forceinline__ float ld_f(const bf16 *p) { return __bfloat162float(*p); }
static __device__ __forceinline__ float ld_f(const float *p) { return *p; }
static __device__ __forceinline__ void st_f(bf16 *p, float v) { *p = __float2bfloat16_rn(v); }
static __device__ __forceinline__ void st_f(float *p, float v) { *p = v; }

/* ---- weight view ---- */
/* Matrix `mat` of a weight as the kernels read it. */
typedef struct wview {
    const void *data;       /* bf16 or fp8 [rows, cols] of matrix 0 */
    const float *scale;     /* fp8: [ceil(rows/br), sld] of matrix 0, else NULL */
    long mat_stride;        /* elements between matrices */
    long scale_stride;      /* floats between matrices' scale grids */
    int rows, cols, fp8, br, bc, sld;
    int br_sh, bc_sh;       /* log2 of br / bc where they are powers of two, else -1 */
} wview;

static inline int scale_ld(int cols, int bc) { return (ceil_div_i(cols, bc) + 3) & ~3; }

/* log2(b) for a power of two b > 0, else -1 */
static inline int log2_exact(int b) {
    for (int s = 0; s < 31; s++)
        if ((1 << s) == b) return s;
    return -1;
}

/* The row block of row n in w's fp8 scale grid, and the index into w.scale of element (n, k)
 * of matrix mat (fp8). A division by a run-time divisor is a ~20-instruction sequence, and the
 * memory-bound fp8 kernels compute an index per 8 weights, so power-of-two blocks (DeepSeek's
 * 128 x 128) shift instead; n, k >= 0. */
static __device__ __forceinline__ int scale_row(const wview &w, int n) {
    return w.br_sh >= 0 ? n >> w.br_sh : n / w.br;
}
static __device__ __forceinline__ long wscale_at(const wview &w, int mat, int n, int k) {
    int bn = scale_row(w, n), bk = w.bc_sh >= 0 ? k >> w.bc_sh : k / w.bc;
    return mat * w.scale_stride + (long)bn * w.sld + bk;
}

static inline wview wview_of(const di_weight *w) {
    wview v;
    v.data = w->data;
    v.rows = w->rows;
    v.cols = w->cols;
    v.mat_stride = (long)w->rows * w->cols;
    v.fp8 = w->dtype == DI_DTYPE_F8_E4M3;
    v.scale = (const float *)w->scale;
    v.br = w->block_rows;
    v.bc = w->block_cols;
    v.br_sh = v.fp8 ? log2_exact(v.br) : -1;
    v.bc_sh = v.fp8 ? log2_exact(v.bc) : -1;
    v.sld = v.fp8 ? scale_ld(w->cols, w->block_cols) : 0;
    v.scale_stride = v.fp8 ? (long)ceil_div_i(w->rows, w->block_rows) * v.sld : 0;
    return v;
}

/* ---- GEMM (cuda_gemm.cu) ---- */
/* The rows a GEMM reads and writes. Plain: token j reads x row j, writes y row j.
 * Grouped (experts): matrix e handles j < offsets[e+1] - offsets[e]; it reads x row
 * perm[offsets[e] + j] (perm NULL: offsets[e] + j) and writes y row offsets[e] + j. */
typedef struct gemm_rows {
    const int32_t *offsets;  /* device [n_mat + 1] or NULL (plain) */
    const int32_t *perm;     /* device or NULL */
    const int32_t *tile_off; /* device [n_mat + 1]: prefix of ceil(count/BM) (tiled grouped) */
    int tile_bm;             /* BM tile_off was computed for */
    int T;                   /* plain: rows; grouped: total rows (upper bound for grids) */
    int max_per_mat;         /* grouped: upper bound of rows per matrix (host) */
    const int32_t *active;   /* grouped, optional: device list of the matrices with rows ... */
    const int32_t *n_active; /* ... and its length (device); grids then span min(n_mat, T) */
} gemm_rows;

typedef struct gemm_out {
    void *y;
    long ldy;
    long y_mat_stride;       /* batched (bmm): elements between heads' outputs; else 0 */
    int f32;                 /* y is f32 (else bf16) */
    int accumulate;
    int silu_I;              /* > 0: W is [2I, K] gate|up; y[., i] = silu(gate_i) * up_i, i < I */
    int silu_round;          /* with silu_I, GEMV and generic kernels: gate_i and up_i rounded to bf16
                              * first (the bits of a bf16 GEMM, then silu_mul) */
} gemm_out;

/* y = x · W[mat]ᵀ for every matrix of W (n_mat = W->n) with the row mapping `rows`.
 * x: bf16, row stride ldx, matrix stride x_mat_stride (bmm: head offset). */
void cuda_gemm(cuda_state *st, const gemm_out *o, const bf16 *x, long ldx, long x_mat_stride,
               const di_weight *W, const gemm_rows *rows);
/* Plain single-matrix GEMM helper (matmul op and internal users). */
void cuda_linear(cuda_state *st, void *y, long ldy, int y_f32, int accumulate, const bf16 *x,
                 long ldx, const di_weight *W, int T);

/* Kernels behind cuda_gemm (cuda_gemm_small.cu, cuda_gemm_tiled.cu, cuda_blaslt.cu). */
typedef struct gemm_args {
    const bf16 *x;
    long ldx, x_mat_stride;
    gemm_out o;
    wview w;
    gemm_rows r;
    int n_mat;
} gemm_args;
void launch_gemm_small(cuda_state *st, const gemm_args *a, cudaStream_t s);
/* FMA GEMV for at most `max_rows` (<= 4 typical) rows per matrix: coalesced weight rows */
void launch_gemv(cuda_state *st, const gemm_args *a, cudaStream_t s);
/* its K slices per block for `groups` groups of 4 rows over `mats` matrices of K columns */
int gemv_splits(const cuda_state *st, int groups, int mats, int K);
void launch_gemm_tiled(cuda_state *st, const gemm_args *a, cudaStream_t s);
/* Hopper wgmma grouped GEMM (cuda_gemm_wgmma.cu): 1 if it takes these shapes. */
int gemm_wgmma_ok(const gemm_args *a);
/* 1 if bf16 grouped experts averaging avg rows each run on the wgmma kernel's 64-row tiles
 * (DEEPINFER_CUDA_WGMMA_BM64_MAX): cuda_moe.cu builds their tile table with BM = 64 and
 * cuda_gemm.cu sends that table to the wgmma kernel (other 64-row tables go to the small-M /
 * tiled kernels) */
static inline int wgmma_bm64(const cuda_state *st, int avg) {
    return avg >= st->wgmma_min_rows && avg <= st->wgmma_bm64_max;
}
void launch_gemm_wgmma(cuda_state *st, const gemm_args *a, cudaStream_t s);
void launch_gemm_generic(cuda_state *st, const gemm_args *a, cudaStream_t s);
/* cuBLASLt: returns 1 if it ran the GEMM (plain or strided-batched), 0 if it has no plan. */
int lt_gemm(cuda_state *st, const gemm_args *a);
/* A cuBLASLt GEMM shape: y[b][T, N] (+)= x[b][T, K] · W[b][N, K]ᵀ for b < batch, element strides
 * sa / sb / sc between the batch's W / x / y matrices. ptr_array: the matrices' addresses come
 * from device arrays of `batch` pointers instead (CUBLASLT_BATCH_MODE_POINTER_ARRAY); sa / sb /
 * sc then only bound their alignment: every W pointer is a 256-byte aligned base plus a multiple
 * of sa elements, every x / y pointer x_base / y_base plus a multiple of sb / sc. */
typedef struct lt_shape {
    int N, K, T;
    long ldx, ldy;
    int f32, fp8, accumulate, batch;
    long sa, sb, sc;
    int ptr_array;
} lt_shape;
/* plan exists (pointer arrays: x / y are x_base / y_base) */
int lt_ready(cuda_state *st, const lt_shape *g, const void *x, const void *y);
int lt_run(cuda_state *st, const lt_shape *g, const void *W, const void *x, void *y); /* 0: no plan */
/* ptr_array shapes: W_arr / x_arr / y_arr are the device pointer arrays (y_arr also C). 0: no plan */
int lt_run_ptr(cuda_state *st, const lt_shape *g, const void *x_base, const void *y_base, const void *W_arr,
               const void *x_arr, void *y_arr);
void lt_free_plans(cuda_state *st);

/* cuda_graph_fill.cu: the small 1-D memset nodes of g as fill kernels; returns how many */
int cuda_graph_fill_memsets(cuda_state *st, cudaGraph_t g);
/* cuda_moe.cu: the permutation kernel, as a graph node's function */
void *cuda_moe_permute_fn(void);
/* fp8 e4m3 activation quantization, DeepSeek act_quant (1x128 groups, amax clamp 1e-4). */
void launch_act_quant(const bf16 *x, long ldx, int T, int K, uint8_t *q, float *scale, int scale_ld,
                      cudaStream_t s);

/* ---- other op files ---- */
void cuda_embed(di_backend *be, float *out, const di_weight *table, const int32_t *ids, int T);
void cuda_rmsnorm(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w,
                  float eps, int T, int D);
void cuda_add_rmsnorm(di_backend *be, float *h, const void *delta, void *out, float *out_f32, const di_weight *w,
                      float eps, int T, int D);
void cuda_silu_mul(di_backend *be, void *out, const void *gu, int T, int I);
int cuda_matmul_silu(di_backend *be, void *act, const void *x, int ldx, const di_weight *gate_up, int I, int T);
void cuda_add(di_backend *be, float *y, const void *x, size_t n);
void cuda_gather_rows(di_backend *be, float *out, const float *x, const int32_t *rows, int n, int D);
void cuda_rope(di_backend *be, void *x, int ldx, int n_heads, int hs, const int32_t *positions, int T,
               const di_rope_params *rp);
void cuda_rope_kv_write(di_backend *be, void *q, int ldq, int n_heads, int hsq, void *kv, int ldkv, int kv_rope,
                        void *cache, const int32_t *slot_mapping, int W, const int32_t *positions, int T,
                        const di_rope_params *rp, const di_weight *kv_norm, float eps);
void cuda_kv_write(di_backend *be, void *cache, const void *kv, int ldkv, const int32_t *slot_mapping,
                   int T, int W);
void cuda_kv_copy_blocks(di_backend *be, void *cache, size_t layer_stride, int n_layers, int W,
                         const int32_t *src, const int32_t *dst, int n);
void cuda_matmul(di_backend *be, void *y, int ldy, const void *x, int ldx, const di_weight *W, int T,
                 unsigned flags);
void cuda_bmm(di_backend *be, void *y, int ldy, int hsy, const void *x, int ldx, int hsx,
              const di_weight *W, int T);
void cuda_mla_prefill(di_backend *be, void *out, const void *q, int ldq, const void *cache,
                      const di_weight *W_kvb, const di_attn_batch *ab, int seq_begin, int seq_end,
                      const di_mla_dims *d, void *scratch, size_t scratch_bytes);
size_t cuda_mla_prefill_scratch_bytes(di_backend *be, const di_mla_dims *d, int max_tokens);
void cuda_mla_decode(di_backend *be, void *out, const void *qt, const void *qpe, int ldqpe, int hsqpe,
                     const void *cache, const di_attn_batch *ab, int seq_begin, int seq_end,
                     const di_mla_dims *d);
void cuda_mla_decode_uv(di_backend *be, void *o, int ldo, int hso, void *olat, const void *qt, const void *qpe,
                        int ldqpe, int hsqpe, const void *cache, const di_attn_batch *ab, int seq_begin, int seq_end,
                        const di_mla_dims *d, const di_weight *w_uv, int n_tokens);
size_t cuda_mla_decode_part_bytes(cuda_state *st, const di_mla_dims *d, int max_tokens);
/* DeepSeek-V3.2 (cuda_indexer.cu): the indexer's LayerNorm and top-k (cuda_mla_decode /
 * cuda_mla_prefill attend over each token's selected positions when ab->sel_pos != NULL). */
void cuda_layernorm(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w,
                    const di_weight *b, float eps, int T, int D);
void cuda_indexer_topk(di_backend *be, int32_t *sel_pos, int32_t *sel_count, const void *q, const float *w,
                       const void *index_cache, const di_attn_batch *ab, int seq_begin, int seq_end,
                       const di_indexer_dims *d, void *scratch, size_t scratch_bytes);
size_t cuda_indexer_scratch_bytes(di_backend *be, int max_tokens, int max_ctx);
size_t cuda_indexer_generic_smem(const di_indexer_dims *d);
/* The shapes the attention kernels serve, for the load-time check (cuda_limits.cu) */
void cuda_mla_decode_limits(int *max_rank, int *max_rope);
void cuda_mla_prefill_limits(int *max_v, int *max_qk);
size_t cuda_f32_attend_smem(int kv_rank, int rope_dim);
di_status cuda_check_dims(di_backend *be, const char *where, const di_mla_dims *mla, const di_indexer_dims *ix);
/* Dynamic shared memory one block may have on sm_90 (227 KB) */
enum { CUDA_MAX_SMEM = 227 * 1024 };
/* The selection half of moe_route (k_route) over fp32 logits [T, E] already computed (the f32
 * op table's router computes them itself). */
void cuda_route_select(cuda_state *st, const float *logits, const di_weight *bias, const di_route_params *rp, int T,
                       int32_t *topk_idx, float *topk_w);
/* Points the op table at the fp32 ops of cuda_f32.cu (after di_backend_cuda_create filled it
 * with the bf16 ones) and drops the bf16-only fused extensions. */
void cuda_f32_install(di_backend *be);
void cuda_moe_route(di_backend *be, int32_t *topk_idx, float *topk_w, const float *x,
                    const di_weight *W_g, const di_weight *bias, const di_route_params *rp, int T,
                    float *scratch);
void cuda_moe_experts(di_backend *be, void *out, const void *x, const int32_t *topk_idx,
                      const float *topk_w, int k, const di_weight *gate_up, const di_weight *down, int T,
                      void *scratch, size_t scratch_bytes);
size_t cuda_moe_scratch_bytes(di_backend *be, int max_tokens, int k, int D, int I, int E);
/* Experts of 1-4-token steps without permutation (cuda_moe_small.cu): 1 if the shapes (and the
 * scratch size) allow it; sh_gate_up / sh_down NULL: routed experts only. */
int cuda_moe_small_fits(int T, int k, const di_weight *gate_up, const di_weight *down, const di_weight *sh_gate_up,
                        const di_weight *sh_down, size_t scratch_bytes);
void cuda_moe_small(cuda_state *st, void *out, const void *x, const int32_t *topk_idx, const float *topk_w, int k,
                    const di_weight *gate_up, const di_weight *down, const di_weight *sh_gate_up,
                    const di_weight *sh_down, int T, void *scratch);
int cuda_moe_experts_defer(di_backend *be, const void *x, const int32_t *topk_idx, const float *topk_w, int k,
                           const di_weight *gate_up, const di_weight *down, int T, void *scratch, size_t scratch_bytes);
void cuda_add_rmsnorm_experts(di_backend *be, float *h, const void *scratch, const float *topk_w, int k, void *out,
                              float *out_f32, const di_weight *w, float eps, int T, int D);
/* the routed experts' combine kernel (cuda_moe.cu): out = the weighted sum of c's rows */
void cuda_moe_combine_launch(cuda_state *st, bf16 *out, const moe_comb *c, int D, int T);
int cuda_moe_experts_shared(di_backend *be, void *out, const void *x, const int32_t *topk_idx, const float *topk_w,
                            int k, const di_weight *gate_up, const di_weight *down, const di_weight *sh_gate_up,
                            const di_weight *sh_down, int T, void *scratch, size_t scratch_bytes);
/* 1: launched on the cluster kernel; 0: V too large for it (the caller uses the one-block kernel).
 * skip_greedy: leave the greedy rows alone (cuda_sample_greedy has them). */
int cuda_sample_cluster(cuda_state *st, int32_t *tokens, int32_t *status, const float *logits, int n, int V,
                        const di_sample_row *rows, int skip_greedy);
/* the greedy rows of a sample op (every other row untouched) */
void cuda_sample_greedy(cuda_state *st, int32_t *tokens, int32_t *status, const float *logits, int n, int V,
                        const di_sample_row *rows);
void cuda_sample(di_backend *be, int32_t *tokens, int32_t *status, const float *logits, int n, int V,
                 const di_sample_row *rows);
#endif
