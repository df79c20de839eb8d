/* backend.h - the compute backend op table: memory, weights and every op of the DeepSeek
 * forward pass, as a struct of function pointers plus capabilities (ggml-style).
 *
 * Owner: model. The forward pass (src/model/deepseek.c) is written once against this table.
 * The CPU backend (src/backend/cpu/, fp32 activations, threads) is the readable reference;
 * the CUDA backend (src/backend/cuda/, bf16 activations, cuBLASLt, one stream) implements the
 * same ops with device pointers, and every CUDA op gets a CPU-parity test.
 *
 * Conventions (apply to every op below):
 *  - Pointers marked "device" live in the backend's memory (from be->alloc; on the CPU backend
 *    plain host memory). Host scalars (counts, sizes, scales) are passed by value.
 *  - "act" is the backend's activation dtype, be->caps.act_dtype (CPU: F32; CUDA: BF16).
 *    Elements are addressed in units of that dtype (strides are in elements, not bytes).
 *    Buffers documented as "f32" are float32 on every backend; "i32" are int32.
 *  - The residual stream h (and everything added into it) is f32 on EVERY backend, as are
 *    the router's input and logits (HF computes DeepseekV3TopkRouter in fp32): embed /
 *    gather_rows / add / add_rmsnorm take it as f32, whatever the act dtype.
 *  - Matrix shapes are row-major [rows, cols]. A linear layer stores W as [out, in] and
 *    computes y = x · Wᵀ (like torch.nn.Linear).
 *  - Ops are asynchronous with respect to the host on backends that can be (CUDA: enqueued
 *    on the backend's stream, no host sync, capturable into a CUDA graph). Only download()
 *    and sync() wait. Ops do not allocate: scratch memory comes from the caller, sized by the
 *    *_scratch_bytes() queries at startup. Ops return void; a violated shape/stride contract
 *    is an internal bug (DI_ASSERT), and asynchronous device faults surface from sync().
 *  - Batch metadata (positions, slot mapping, block tables, sequence starts, context lengths)
 *    is uploaded once per step by the model into device int32 arrays (di_attn_batch) and
 *    shared by all layers; host-side counts travel alongside.
 *  - Reductions use fp32 accumulation on every backend (sums, dot products, softmax).
 *
 * Invariants: a backend never sees sequences beyond di_attn_batch, never frees memory it did
 * not allocate, and every op's result is independent of how the CPU backend splits work over
 * threads (fixed reduction order), so results are bit-reproducible for a given batch. */
#ifndef DI_BACKEND_BACKEND_H
#define DI_BACKEND_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "deepinfer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tokens per KV-cache block (paged latent cache). */
#define DI_KV_BLOCK_SIZE 64

typedef enum di_device { DI_DEVICE_CPU = 0, DI_DEVICE_CUDA = 1 } di_device;

typedef struct di_backend di_backend;

/* ---------------------------------------------------------------------------------------
 * Weights
 * ------------------------------------------------------------------------------------- */

/* One matrix as read from a checkpoint (host memory, typically mmapped). The matrix is rows
 * [row0, row0 + rows) of a source tensor with `cols` columns and row stride `cols`; `data`
 * points at row 0 of the source, so FP8 block scales index by absolute source row:
 * scale[(row0 + r) / block_rows * scale_cols + c / block_cols], with
 * scale_cols = ceil(cols / block_cols). */
typedef struct di_host_matrix {
    const char *name;       /* tensor name, for messages */
    di_dtype dtype;         /* F32, BF16, F16 or F8_E4M3 */
    int row0, rows, cols;
    const void *data;       /* [src_rows, cols] host, row-major, dtype */
    const float *scale;     /* F8_E4M3 only: weight_scale_inv, fp32 host [ceil(src_rows/br), ceil(cols/bc)] */
    int block_rows, block_cols;  /* F8 scale block (128 x 128 for DeepSeek) */
} di_host_matrix;

/* How weight_upload lays out the uploaded matrices. */
typedef enum di_weight_layout {
    DI_WEIGHT_PLAIN = 0,      /* as in the file: [rows, cols] = [out, in] */
    DI_WEIGHT_TRANSPOSED = 1  /* each matrix stored transposed, [cols, rows]: matmul/bmm then
                               * compute y = x · M with M the source matrix as in the file */
} di_weight_layout;

/* A weight on the backend: n matrices of identical shape [rows, cols] (n = 1 for a plain
 * linear or a norm vector (rows = 1); n = n_experts for stacked expert weights; n = n_heads for
 * the per-head MLA absorption matrices). `rows`/`cols` are the stored (post-layout) shape: the
 * op computes y = x · W[i]ᵀ with W[i] of shape [rows, cols], so out dim = rows, in dim = cols.
 * The backend chooses the storage dtype: the CPU backend dequantizes everything to F32 at
 * upload; CUDA keeps F8_E4M3 with fp32 block scales [n, ceil(rows/br), ceil(cols/bc)] where the
 * layout allows it, BF16 otherwise. Fields other than n/rows/cols are backend-private. */
typedef struct di_weight {
    int n, rows, cols;
    di_dtype dtype;         /* storage dtype on the backend */
    void *data;             /* device [n, rows, cols] */
    void *scale;            /* device f32 block scales or NULL */
    int block_rows, block_cols;
    size_t bytes;           /* device bytes held (data + scale) */
} di_weight;

/* ---------------------------------------------------------------------------------------
 * Per-op parameter structs
 * ------------------------------------------------------------------------------------- */

/* RoPE for the rope slice of q heads and for k_pe (HF semantics).
 *   interleave = 1 (HF `rope_interleave` true, DeepSeek's layout; and always for deepseek_v2):
 *     pairs (x[2i], x[2i+1]) rotate by angle pos * inv_freq[i]; results stay in place.
 *     (HF writes the rotated pairs in "evens then odds" order; q and k are permuted alike,
 *     so every q·k, and hence every output, is identical. Our cache keeps pair order.)
 *   interleave = 0: NeoX halves, pairs (x[i], x[i + dim/2]).
 * y_a = (x_a cos φ - x_b sin φ) * mscale, y_b = (x_b cos φ + x_a sin φ) * mscale, where
 * φ = (float)pos * inv_freq[i] computed in fp32 (as HF), cos/sin evaluated accurately, and
 * mscale is YaRN's attention_factor (1.0 for V3). */
typedef struct di_rope_params {
    int dim;                /* rotated width (qk_rope_head_dim), even */
    int interleave;
    float mscale;           /* cos/sin multiplier (HF attention_scaling) */
    const float *inv_freq;  /* device f32 [dim / 2] */
} di_rope_params;

/* The step's attention metadata, uploaded once per step. Sequence i owns batch tokens
 * [seq_start[i], seq_start[i+1]); they are the last q_len = seq_start[i+1] - seq_start[i]
 * positions of its context: token j of the sequence is at position ctx_len[i] - q_len + j and
 * attends causally to context positions [0, that position]. Context position p of sequence i
 * lives in cache slot block_table[i * max_blocks + p / 64] * 64 + p % 64. */
typedef struct di_attn_batch {
    const int32_t *positions;     /* device i32 [n_tokens] */
    const int32_t *slot_mapping;  /* device i32 [n_tokens] cache slot written by each token */
    const int32_t *seq_start;     /* device i32 [n_seqs + 1] */
    const int32_t *seq_ctx_len;   /* device i32 [n_seqs] */
    const int32_t *block_table;   /* device i32 [n_seqs, max_blocks] */
    int n_tokens, n_seqs, max_blocks;
    int max_q_len;                /* host: max over sequences of q_len (grid sizing) */
    int max_ctx_len;              /* host: max over sequences of ctx_len */
    /* Sparse attention (DeepSeek-V3.2 DSA), per layer; sel_pos == NULL means dense. Token t
     * attends only to the sel_count[t] context positions sel_pos[t * sel_stride + j], sorted
     * ascending, all <= its own position (written by indexer_topk). */
    const int32_t *sel_pos;       /* device i32 [n_tokens, sel_stride] or NULL */
    const int32_t *sel_count;     /* device i32 [n_tokens] */
    int sel_stride;               /* host: index_topk */
} di_attn_batch;

/* DeepSeek-V3.2 lightning indexer of one layer. */
typedef struct di_indexer_dims {
    int n_heads;          /* index_n_heads */
    int head_dim;         /* index_head_dim (the index-key cache width) */
    int topk;             /* index_topk */
    float scale;          /* head_dim^-0.5 */
    float weight_scale;   /* n_heads^-0.5 */
} di_indexer_dims;

/* MLA dimensions of one attention layer. */
typedef struct di_mla_dims {
    int n_heads;          /* H */
    int nope_dim;         /* dn = qk_nope_head_dim */
    int rope_dim;         /* dr = qk_rope_head_dim */
    int v_dim;            /* dv = v_head_dim */
    int kv_rank;          /* r = kv_lora_rank; cache width = r + dr */
    float softmax_scale;  /* sigma (YaRN mscale_all_dim applied) */
} di_mla_dims;

/* Most routed experts a layer may have (DeepSeek-V3: 256, Kimi-K2: 384). */
#define DI_MAX_EXPERTS 1024

typedef enum di_route_method {
    DI_ROUTE_NOAUX_TC = 0,          /* V3: sigmoid, + e_score_correction_bias for selection */
    DI_ROUTE_GREEDY,                /* V2: softmax, plain top-k */
    DI_ROUTE_GROUP_LIMITED_GREEDY   /* V2: softmax, groups scored by max */
} di_route_method;

typedef struct di_route_params {
    di_route_method method;
    int n_experts;        /* E */
    int top_k;            /* k */
    int n_group;          /* groups of E / n_group contiguous experts (1 = no grouping) */
    int topk_group;       /* groups kept */
    int norm_topk_prob;   /* renormalise selected weights: w / (sum w + 1e-20) */
    float routed_scaling_factor;
} di_route_params;

/* matmul flags */
#define DI_MM_ACCUMULATE 1u   /* y += x · Wᵀ instead of y = x · Wᵀ: each y element gets the
                               * finished fp32 dot product added once */
#define DI_MM_OUT_F32    2u   /* y is f32 instead of act (logits; with DI_MM_ACCUMULATE: a
                               * projection added straight into the f32 residual stream) */

/* Workspace sizing for di_backend.reserve (extensions). */
typedef struct di_backend_reserve {
    int max_tokens;          /* most tokens in one step */
    int max_seqs;            /* most sequences in one step */
    int vocab_size;          /* logits row width (sample op) */
    di_mla_dims mla;         /* attention shape (split-KV decode partials) */
} di_backend_reserve;

/* Per-row parameters of the device sampler (the subset of di_sampling_params that the GPU
 * implements; penalties, logit bias and min_tokens stay on the host). */
typedef struct di_sample_row {
    float temperature;       /* < 1e-5: greedy (lowest id among the maxima) */
    float top_p;             /* (0, 1]; 1 = off */
    float min_p;             /* [0, 1]; 0 = off */
    int32_t top_k;           /* <= 0 or >= V: off */
    uint64_t seed;           /* request seed (Philox key) */
    uint32_t position;       /* position of the token being sampled */
    uint32_t stream;         /* completion index */
} di_sample_row;

/* status codes of the sample op */
#define DI_SAMPLE_OK 0
#define DI_SAMPLE_ERR_NAN 1        /* a logit is NaN or +inf */
#define DI_SAMPLE_ERR_MASKED 2     /* every logit is -inf */
#define DI_SAMPLE_ERR_ZERO 3       /* no token has a non-zero weight */

/* ---------------------------------------------------------------------------------------
 * Capabilities and the op table
 * ------------------------------------------------------------------------------------- */
typedef struct di_backend_caps {
    di_dtype act_dtype;       /* activations and the KV cache: F32 (CPU) / BF16 (CUDA); the
                               * residual stream and the router are f32 on both */
    int keeps_fp8;            /* 1 if F8 weights stay F8 (+scales) on the device */
    size_t memory_bytes;      /* device memory available for weights + KV + workspace (0 = unknown) */
    int n_threads;            /* CPU threads (1 for CUDA) */
} di_backend_caps;

#define DI_BACKEND_FENCES 4

struct di_backend {
    const char *name;         /* "cpu", "cuda" */
    di_device device;
    di_backend_caps caps;
    void *impl;               /* backend-private state */

    void (*destroy)(di_backend *be);

    /* ---- memory ---- */
    /* Device allocation (zeroed is NOT guaranteed). Startup only, never in a step. */
    di_status (*alloc)(di_backend *be, size_t bytes, void **out);
    void (*free)(di_backend *be, void *ptr);                       /* free(NULL) ok */
    /* host -> device copy; may be asynchronous once the host buffer is pinned staging memory */
    void (*upload)(di_backend *be, void *dst, const void *src, size_t bytes);
    /* device -> host copy; waits for all queued ops first */
    di_status (*download)(di_backend *be, void *dst, const void *src, size_t bytes);
    void (*memset)(di_backend *be, void *dst, int byte, size_t bytes);
    /* waits for every queued op; reports asynchronous failures */
    di_status (*sync)(di_backend *be);

    /* ---- asynchronous copies (all five NULL: absent; steps then run synchronously) ----
     * They let a step be queued while an earlier one runs, its metadata sent and its tokens
     * fetched without the host waiting (model/decode_async.c).
     *   host_alloc / host_free: pinned host memory (startup only).
     *   copy_in: host -> device on a copy lane that does NOT wait for queued ops; the main
     *     lane's next ops wait for it. The caller guarantees that no queued op reads or writes
     *     dst, and leaves src (pinned) unchanged until an op issued after it has completed.
     *   copy_out: device -> host (pinned) after every op issued so far, on a copy lane;
     *     fence f (0 <= f < DI_BACKEND_FENCES) marks its completion. Inside a graph capture
     *     the copy and the fence become part of the graph: each replay copies and marks f,
     *     while the ops captured after it go on (a step's tokens leave mid-graph).
     *   fence_wait: the host waits for the last copy_out marked f; reports asynchronous
     *     failures like sync. */
    di_status (*host_alloc)(di_backend *be, size_t bytes, void **out);
    void (*host_free)(di_backend *be, void *ptr);                  /* free(NULL) ok */
    void (*copy_in)(di_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy_out)(di_backend *be, void *dst, const void *src, size_t bytes, int fence);
    di_status (*fence_wait)(di_backend *be, int fence);

    /* ---- weights (load time) ---- */
    /* Uploads n matrices: matrix i is the row-concatenation of parts[i * n_parts + 0 ..
     * n_parts - 1] (all with the same cols; e.g. gate_proj then up_proj of expert i), stored
     * with `layout`. Dequantizes / converts to the backend's storage dtype. All parts of all
     * matrices must have equal row counts per part index. Errors name the tensor. */
    di_status (*weight_upload)(di_backend *be, int n, int n_parts, const di_host_matrix *parts,
                               di_weight_layout layout, di_weight *out);
    void (*weight_free)(di_backend *be, di_weight *w);            /* zeroes *w; ok on zeroed */

    /* ---- elementwise / small ops ---- */
    /* out[t, :] = table[ids[t], :].  out: device f32 [T, D] (the residual stream);
     * table: weight n=1 [vocab, D]; ids: device i32 [T], each in [0, vocab) (checked by the
     * model on the host). */
    void (*embed)(di_backend *be, float *out, const di_weight *table, const int32_t *ids, int T);

    /* out[t, :] = rmsnorm(x[t, :]) ⊙ w, rmsnorm(v) = v / sqrt(mean(v²) + eps) in fp32.
     * x: device act [T, D] with row stride ldx; out: device act with row stride ldo (may equal
     * x with ldo == ldx: in place); w: weight n=1 rows=1 cols=D. */
    void (*rmsnorm)(di_backend *be, void *out, int ldo, const void *x, int ldx,
                    const di_weight *w, float eps, int T, int D);

    /* Fused residual add + norm: h += delta (if delta != NULL; fp32 add, h stays f32), then
     * out = rmsnorm(h) ⊙ w, statistics in fp32 over the f32 row, the product rounded once to
     * act. out_f32 (optional, NULL = none) receives the same normed row unrounded in f32 (the
     * router's input). h: device f32 [T, D]; delta: device act [T, D]; out: device act
     * [T, D]; out_f32: device f32 [T, D]; all contiguous; out, out_f32 != h. */
    void (*add_rmsnorm)(di_backend *be, float *h, const void *delta, void *out, float *out_f32,
                        const di_weight *w, float eps, int T, int D);

    /* out[t, i] = silu(gu[t, i]) * gu[t, I + i].  gu: device act [T, 2I]; out: device act [T, I]. */
    void (*silu_mul)(di_backend *be, void *out, const void *gu, int T, int I);

    /* Optional (NULL = none): act = silu_mul(matmul(x, gate_up)) in one op, the same bits as
     * matmul into a bf16 [T, 2I] buffer then silu_mul. gate_up: weight n=1 [2I, D] (gate rows,
     * then up rows); x: device act [T, ldx]; act: device act [T, I]. Returns 0, having issued
     * nothing, for calls it does not take (the caller then runs matmul + silu_mul). */
    int (*matmul_silu)(di_backend *be, void *act, const void *x, int ldx, const di_weight *gate_up, int I, int T);

    /* y[i] += x[i] for i < n, in fp32.  y: device f32 (the residual stream); x: device act. */
    void (*add)(di_backend *be, float *y, const void *x, size_t n);

    /* out[i, :] = x[rows[i], :].  x: device f32 [T, D] (residual rows); rows: device i32 [n];
     * out: device f32 [n, D]. */
    void (*gather_rows)(di_backend *be, float *out, const float *x, const int32_t *rows, int n, int D);

    /* ---- GEMMs ---- */
    /* y = x · Wᵀ (or +=, see DI_MM_*).  x: device act [T, W.cols] row stride ldx;
     * y: device act (or f32 with DI_MM_OUT_F32) [T, W.rows] row stride ldy; W: n=1.
     * Accumulation in fp32. FP8 weights: weight-only dequantization semantics (W = Wq · S per
     * 128x128 block); a backend may quantize activations only if it documents the error. */
    void (*matmul)(di_backend *be, void *y, int ldy, const void *x, int ldx, const di_weight *W,
                   int T, unsigned flags);

    /* Batched per-head matmul (MLA absorption): for t < T, h < W.n:
     *   y[t, h, :] = x[t, h, :] · W[h]ᵀ      (x: W.cols values, y: W.rows values)
     * x: device act, element (t, h, j) at x[t * ldx + h * hsx + j];
     * y: device act, element (t, h, i) at y[t * ldy + h * hsy + i].
     * Used as q̃_h = W_UK_hᵀ q_h^nope (W uploaded TRANSPOSED from kv_b_proj's k rows) and
     * o_h = W_UV_h ō_h (W = kv_b_proj's v rows, PLAIN). */
    void (*bmm)(di_backend *be, void *y, int ldy, int hsy, const void *x, int ldx, int hsx,
                const di_weight *W, int T);

    /* ---- positions and cache ---- */
    /* Rotates, in place, the rope slice of n_heads heads of each of T rows:
     * element j of head h of row t is x[t * ldx + h * hs + j], j < rp->dim, at position
     * positions[t]. Used for q (n_heads = H, hs = dn + dr, x = q + dn) and k_pe (n_heads = 1). */
    void (*rope)(di_backend *be, void *x, int ldx, int n_heads, int hs, const int32_t *positions,
                 int T, const di_rope_params *rp);

    /* cache[slot_mapping[t], :] = kv[t, :] for t < T (width W = r + dr: normed latent c, then
     * roped k_pe).  cache: device act [n_slots, W] of one layer; kv: device act, row stride ldkv.
     * A negative slot skips the token. */
    void (*kv_write)(di_backend *be, void *cache, const void *kv, int ldkv,
                     const int32_t *slot_mapping, int T, int W);

    /* For i < n: copies whole cache block src[i] to dst[i] in every one of n_layers layers
     * (layer l at cache + l * layer_stride elements; block = 64 slots * W values).
     * src, dst: HOST int arrays (block ids are known on the host when copy-on-write is planned). */
    void (*kv_copy_blocks)(di_backend *be, void *cache, size_t layer_stride, int n_layers, int W,
                           const int32_t *src, const int32_t *dst, int n);

    /* ---- attention ---- */
    /* Naive MLA attention for sequences [seq_begin, seq_end) (prefill chunks). For each such
     * sequence the whole context's latents [0, ctx_len) are read from the paged cache
     * (already written by kv_write for this step's tokens) and decompressed through W_kvb:
     *   [k_nope_h | v_h] = W_kvb[h*(dn+dv) : (h+1)*(dn+dv), :] · c_s,   k_h = [k_nope_h | k_pe_s]
     * then out[t, h, :] = Σ_s softmax_s(σ q[t,h,:]·k_{h,s}, causal) v_{h,s}. Online softmax over
     * context tiles, so memory is linear in context length. With ab->sel_pos, s ranges over the
     * token's selected positions only (V3.2 DSA).
     * q: device act [n_tokens, H, dn + dr] (rope applied), row stride ldq (elements);
     * out: device act [n_tokens, H, dv] contiguous (only rows of these sequences are written);
     * cache: device act [n_slots, r + dr] of the layer; W_kvb: n=1 [H*(dn+dv), r];
     * scratch: device, at least mla_prefill_scratch_bytes(be, dims, max_tokens) bytes where
     * max_tokens >= this step's token count. */
    void (*mla_prefill)(di_backend *be, void *out, const void *q, int ldq, const void *cache,
                        const di_weight *W_kvb, const di_attn_batch *ab, int seq_begin, int seq_end,
                        const di_mla_dims *d, void *scratch, size_t scratch_bytes);
    size_t (*mla_prefill_scratch_bytes)(di_backend *be, const di_mla_dims *d, int max_tokens);

    /* Weight-absorbed MLA attention over the paged latent cache for sequences
     * [seq_begin, seq_end) (decode; q_len >= 1 per sequence, causal within the step):
     *   score_{t,h,s} = σ (q̃[t,h,:] · c_s + q_pe[t,h,:] · k_pe_s),  s <= pos(t)
     *   out[t, h, :] = Σ_s softmax_s(score) c_s     (the r-dim latent "ō")
     * (s over the token's selected positions when ab->sel_pos != NULL)
     * qt: device act [n_tokens, H, r] (q̃ = W_UKᵀ q_nope) contiguous;
     * qpe: device act, element (t, h, j) at qpe[t * ldqpe + h * hsqpe + j], j < dr (roped);
     * out: device act [n_tokens, H, r] contiguous; cache: device act [n_slots, r + dr].
     * All heads of a token read each cache block once. */
    void (*mla_decode)(di_backend *be, void *out, const void *qt, const void *qpe, int ldqpe,
                       int hsqpe, const void *cache, const di_attn_batch *ab, int seq_begin,
                       int seq_end, const di_mla_dims *d);

    /* ---- mixture of experts ---- */
    /* Router: logits = x · W_gᵀ with fp32 inputs and arithmetic (W_g as stored, converted to
     * fp32; HF's DeepseekV3TopkRouter does F.linear(x.float(), W.float())), then per token:
     *  NOAUX_TC: s = sigmoid(logits); b = s + bias (selection only); with n_group > 1, group
     *    score = sum of the two largest b in the group, keep the topk_group best groups, others
     *    masked to -inf (HF transformers 5.17 V3); idx = top_k of masked b; w = s[idx].
     *  GREEDY: s = softmax(logits); idx = top_k of s; w = s[idx].
     *  GROUP_LIMITED_GREEDY: s = softmax(logits); group score = max s in group; keep
     *    topk_group groups, others masked to 0.0 (HF V2); idx = top_k; w = s[idx].
     *  then if norm_topk_prob: w /= (Σ w + 1e-20); finally w *= routed_scaling_factor.
     * Ties select the lower expert index. topk_idx / topk_w rows are sorted by expert index
     * (order does not change the result; it fixes the combine order).
     * x: device f32 [T, D] (the normed hidden state before any act rounding: add_rmsnorm's
     * out_f32); W_g: n=1 [E, D]; bias: weight n=1 rows=1 cols=E or NULL;
     * topk_idx: device i32 [T, k]; topk_w: device f32 [T, k]; scratch: device f32 [T, 2E].
 * E is at most DI_MAX_EXPERTS. */
    void (*moe_route)(di_backend *be, int32_t *topk_idx, float *topk_w, const float *x,
                      const di_weight *W_g, const di_weight *bias, const di_route_params *rp,
                      int T, float *scratch);

    /* All routed experts of a layer in one op:
     *   out[t, :] = Σ_{j<k} topk_w[t, j] · down_e( silu(gate_e x_t) ⊙ up_e x_t ),  e = topk_idx[t, j]
     * (sum in j order, fp32). Tokens are permuted by expert internally so each expert runs one
     * GEMM over its tokens; no host synchronisation is needed to learn per-expert counts.
     * x: device act [T, D]; out: device act [T, D] (overwritten; add shared experts after);
     * gate_up: n=E [2I, D] (gate rows first); down: n=E [D, I];
     * scratch: device, >= moe_scratch_bytes(be, max_tokens, k, D, I, E) with max_tokens >= T. */
    void (*moe_experts)(di_backend *be, void *out, const void *x, const int32_t *topk_idx,
                        const float *topk_w, int k, const di_weight *gate_up,
                        const di_weight *down, int T, void *scratch, size_t scratch_bytes);
    size_t (*moe_scratch_bytes)(di_backend *be, int max_tokens, int k, int D, int I, int E);

    /* ---- DeepSeek-V3.2 sparse attention (DSA) ---- */
    /* LayerNorm with bias (the indexer's k_norm): out = (x - mean) / sqrt(var + eps) ⊙ w + b,
     * statistics in fp32 over D. x / out: device act, row strides ldx / ldo; w, b: n=1 rows=1. */
    void (*layernorm)(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w,
                      const di_weight *b, float eps, int T, int D);

    /* Lightning-indexer top-k (transformers 5.17 DeepseekV32Indexer, fp32 scores) for the
     * tokens of sequences [seq_begin, seq_end): for token t at position p, over context
     * positions s <= p,
     *   I[t, s] = Σ_h (w[t, h] · weight_scale) · relu(scale · q[t, h, :] · k_s)
     * then the min(topk, p + 1) positions with the largest I (ties: lower position), written
     * sorted ascending to sel_pos[t * d->topk ..] (device i32 [n_tokens, topk]) and their count
     * to sel_count[t] (device i32 [n_tokens]); the model then points ab->sel_pos/sel_count at
     * them for the attention ops. ab's own sel fields are ignored here.
     * q: device act [n_tokens, n_heads, head_dim] (roped), w: device f32 [n_tokens, n_heads],
     * index_cache: device act [n_slots, head_dim] (this step's keys already written).
     * scratch: >= indexer_scratch_bytes(be, max_tokens, max_ctx) bytes. */
    void (*indexer_topk)(di_backend *be, int32_t *sel_pos, int32_t *sel_count, const void *q,
                         const float *w, const void *index_cache, const di_attn_batch *ab, int seq_begin,
                         int seq_end, const di_indexer_dims *d, void *scratch, size_t scratch_bytes);
    size_t (*indexer_scratch_bytes)(di_backend *be, int max_tokens, int max_ctx);

    /* ---- extensions (CUDA backend; every member below may be NULL, and the CPU backend
     * leaves them NULL: callers check before use) ---- */

    /* Refuses a model whose shapes this backend's kernels cannot run: DI_ERR_UNSUPPORTED with
     * a message naming the config.json field, its value and the limit (`where` prefixes it).
     * ix is NULL for a model without the V3.2 indexer. Called once at load, before any weight
     * is uploaded. NULL: every shape runs (the CPU backend). */
    di_status (*check_dims)(di_backend *be, const char *where, const di_mla_dims *mla, const di_indexer_dims *ix);

    /* Sizes the backend's private step workspace (GEMM workspace, FP8 activation buffers,
     * split-KV partials, sampling status, pinned staging) once at load, after every
     * weight_upload and before the first op. Never called in a step. */
    di_status (*reserve)(di_backend *be, const di_backend_reserve *r);

    /* Samples one token per logits row on the device, bit-identical to the CPU sampler
     * (src/sampling, docs/engine.md "Sampler") for the parameters di_sample_row carries
     * (greedy / temperature / top-k / top-p / min-p; counter-based Philox keyed by (seed,
     * position, stream)). logits: device f32 [n, V] (row stride V); rows: device [n];
     * tokens: device i32 [n]; status: device i32 [n], 0 = ok, else a DI_SAMPLE_ERR_* code
     * (the token is then -1). n <= reserve.max_tokens, V <= reserve.vocab_size. */
    void (*sample)(di_backend *be, int32_t *tokens, int32_t *status, const float *logits, int n,
                   int V, const di_sample_row *rows);

    /* Routed and shared experts of a MoE layer in one op, for the shapes where the backend has
     * a fused path (CUDA: steps of 1-4 tokens); returns 0 without doing anything otherwise, and
     * the caller runs moe_experts and the shared-expert matmuls. When it returns 1:
     *   out = moe_experts(...) + down_s(silu(gate_s x) ⊙ up_s x)
     * summed in fp32 (routed in j order, then the shared experts) and rounded to act once.
     * sh_gate_up: n=1 [2 Is, D] (gate rows first); sh_down: n=1 [D, Is]; the other arguments as
     * moe_experts. The choice depends on shapes only (T, k, the weights, scratch_bytes), never
     * on data, so a captured graph replays the same path. */
    int (*moe_experts_shared)(di_backend *be, void *out, const void *x, const int32_t *topk_idx,
                              const float *topk_w, int k, const di_weight *gate_up,
                              const di_weight *down, const di_weight *sh_gate_up,
                              const di_weight *sh_down, int T, void *scratch, size_t scratch_bytes);

    /* The routed experts of moe_experts with their weighted sum (the combine) left to the next
     * add_rmsnorm_experts; returns 0 without doing anything where the backend has no such path
     * (CUDA: the 16-128-token padded path), and the caller runs moe_experts. When it returns 1,
     * the caller calls add_rmsnorm_experts with the same scratch, topk_w, k and T before
     * anything writes them again. The choice depends on shapes only (as moe_experts_shared).
     * Arguments as moe_experts. */
    int (*moe_experts_defer)(di_backend *be, const void *x, const int32_t *topk_idx, const float *topk_w,
                             int k, const di_weight *gate_up, const di_weight *down, int T, void *scratch,
                             size_t scratch_bytes);
    /* add_rmsnorm with delta = the out that moe_experts would have written for the last
     * moe_experts_defer (same scratch, topk_w, k, T), bit for bit:
     *   moe_experts(..., tmp, ...); add_rmsnorm(h, tmp, out, out_f32, w, eps, T, D). */
    void (*add_rmsnorm_experts)(di_backend *be, float *h, const void *scratch, const float *topk_w, int k,
                                void *out, float *out_f32, const di_weight *w, float eps, int T, int D);

    /* The latent's RMSNorm, RoPE of q and of k_pe, and the latent-cache write in one op (NULL:
     * the caller runs the four). Exactly, bit for bit:
     *   if (kv_norm) rmsnorm(kv, ldkv, kv, ldkv, kv_norm, eps, T, kv_rope);
     *   rope(q, ldq, n_heads, hsq, positions, T, rp);
     *   rope(kv + kv_rope, ldkv, 1, ldkv, positions, T, rp);
     *   kv_write(cache, kv, ldkv, slot_mapping, T, W);
     * q points at the rope slice of head 0 of row 0 (as for rope); kv_rope is the offset of
     * k_pe in a kv row (r), kv_rope + rp->dim <= W. kv's latent is normed and its k_pe rotated
     * in place too. kv_norm: NULL, or an f32 weight of kv_rope columns. Either half alone:
     * n_heads = 0 (q unused) does only the kv part (norm, k_pe, cache write); kv = NULL (cache,
     * kv_norm unused) only rotates q, with the same bits as the whole op. */
    void (*rope_kv_write)(di_backend *be, void *q, int ldq, int n_heads, int hsq, void *kv, int ldkv,
                          int kv_rope, void *cache, const int32_t *slot_mapping, int W,
                          const int32_t *positions, int T, const di_rope_params *rp, const di_weight *kv_norm,
                          float eps);

    /* MLA decode attention and the W_UV projection in one op (NULL: the caller runs the two).
     * Exactly, bit for bit:
     *   mla_decode(be, olat, qt, qpe, ldqpe, hsqpe, cache, ab, seq_begin, seq_end, d);
     *   bmm(be, o, ldo, hso, olat, H * r, r, w_uv, n_tokens);
     * (n_tokens: the decode tokens, those of sequences [seq_begin, seq_end)). olat ([tokens, H, r],
     * as mla_decode's out) is scratch: it may be left unwritten. */
    void (*mla_decode_uv)(di_backend *be, void *o, int ldo, int hso, void *olat, const void *qt, const void *qpe,
                          int ldqpe, int hsqpe, const void *cache, const di_attn_batch *ab, int seq_begin,
                          int seq_end, const di_mla_dims *d, const di_weight *w_uv, int n_tokens);

    /* Two-lane concurrency (all three NULL: every op runs in issue order, which is always
     * correct; a backend that has them may overlap independent ops, e.g. a latency-bound chain
     * with a bandwidth-bound one).
     *   side_begin(be, T): the ops issued next run on a side lane, after every op issued before
     *     the call; returns 0 (and everything stays on the main lane) when the backend would not
     *     gain from it for a step of T tokens. The choice depends on T and the backend's
     *     settings only, so a captured graph replays the same lanes.
     *   side_end(be): back to the main lane; the main lane's next ops may run concurrently with
     *     the side lane's.
     *   side_join(be): the main lane's next ops wait for every op issued on the side lane.
     * Between side_begin and side_join the caller guarantees that neither lane writes a buffer
     * the other reads or writes. sync / download / graph_end join an unjoined side lane. */
    int (*side_begin)(di_backend *be, int T);
    void (*side_end)(di_backend *be);
    void (*side_join)(di_backend *be);
    /* Optional: back onto the side lane after side_end without a new fork (its next ops still
     * run after only what was issued before the last side_begin), so that the main lane's ops
     * can be issued first; only between a side_begin that returned 1 and the next side_join.
     * CUDA has it unless DEEPINFER_CUDA_Q_FIRST=0: the model then issues the queries first
     * (measured batch 1 +0.3%, docs/cuda.md). */
    void (*side_resume)(di_backend *be);

    /* CUDA-graph capture of a sequence of ops on the backend's stream: graph_begin, then the
     * ops (no upload/download/sync/alloc in between), then graph_end instantiates the graph
     * into *graph. graph_launch replays it (asynchronously); graph_free releases it
     * (NULL ok). A failed capture leaves the backend usable and returns the error. */
    di_status (*graph_begin)(di_backend *be);
    di_status (*graph_end)(di_backend *be, void **graph);
    di_status (*graph_launch)(di_backend *be, void *graph);
    void (*graph_free)(di_backend *be, void *graph);
};

/* ---- construction ---- */
typedef struct di_backend_options {
    di_device device;
    int n_threads;            /* CPU: 0 = DEEPINFER_THREADS or all cores */
    int device_index;         /* CUDA device ordinal */
    int precision;            /* a di_precision: 0 = the device's default (CPU f32, CUDA bf16);
                               * DI_PRECISION_F32 on CUDA: the fp32 op table (cuda_f32.cu) */
} di_backend_options;

/* Creates a backend; DI_ERR_UNSUPPORTED with a clear message if the device is not built in. */
di_status di_backend_create(const di_backend_options *opts, di_backend **out);
void di_backend_free(di_backend *be);   /* NULL ok */
/* "auto" -> DI_PRECISION_DEFAULT, "bf16" -> BF16, "f32" / "fp32" / "float32" -> F32; -1 otherwise
 * (the CLI's --dtype). */
int di_precision_from_name(const char *name);
/* Bytes per activation element. */
size_t di_backend_act_size(const di_backend *be);

/* The CPU backend (always built). */
di_status di_backend_cpu_create(int n_threads, di_backend **out);
#ifdef DI_HAVE_CUDA
di_status di_backend_cuda_create(int device_index, int precision, di_backend **out);
/* The CUDA backend's check_dims for the op table of `precision` (a di_precision), without a
 * device: host arithmetic only (unit-tested on machines without a GPU). */
di_status di_cuda_check_dims(int precision, const char *where, const di_mla_dims *mla, const di_indexer_dims *ix);
#endif

#ifdef __cplusplus
}
#endif
#endif
