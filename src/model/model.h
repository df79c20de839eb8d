/* model.h - a loaded DeepSeek-architecture model on a backend, and its forward pass over a
 * batch. This is the contract between the engine (which plans steps and owns sequences and
 * KV block allocation) and the model (which owns weights, the paged latent KV pool and the
 * activation workspace, and never sees sequences beyond this struct).
 *
 * Owner: model. The forward pass itself (deepseek.c) is written once against the backend op
 * table (backend/backend.h); the CPU backend is the reference, CUDA implements the same ops.
 *
 * KV cache: per layer, blocks of DI_KV_BLOCK_SIZE tokens, each token kv_lora_rank + rope_dim
 * values (the normed latent c then the roped k_pe); DeepSeek-V3.2 adds an index-key cache of
 * index_head_dim values per token with the same slots. Block ids are in [0, di_model_kv_blocks).
 * Token t of the batch writes its latent to slot slot_mapping[t] = block * 64 + offset, which
 * must agree with its sequence's block table (validated).
 *
 * Threading: one forward (or MTP forward / copy_blocks) at a time per model; the workspace is
 * shared. Semantics follow transformers 5.17 (docs/model.md). */
#ifndef DI_MODEL_MODEL_H
#define DI_MODEL_MODEL_H
#include <stddef.h>
#include <stdint.h>
#include "deepinfer.h"
#include "backend/backend.h"   /* di_device, DI_KV_BLOCK_SIZE */
#include "io/config.h"

typedef struct di_model_options {
    di_device device;
    di_precision precision;   /* activations / KV cache (0: the device's default) */
    int n_threads;            /* CPU backend threads; 0 = DEEPINFER_THREADS or all cores */
    int max_batch_tokens;     /* the workspace is sized for this many tokens per step (0 = 2048) */
    int max_seqs;             /* most sequences in one step (0 = 256) */
    int kv_blocks;            /* KV pool size in blocks; 0 = derive from kv_memory_bytes */
    size_t kv_memory_bytes;   /* used when kv_blocks == 0 (0 = a backend default) */
    int load_mtp;             /* also load the MTP layers (num_nextn_predict_layers) */
    int max_context;          /* longest context (tokens) a sequence may reach; sizes the block
                               * tables (0 = max(max_position_embeddings, 4096)) */
} di_model_options;

/* One step's work. Sequences [0, n_decode_seqs) take the weight-absorbed attention path over
 * the latent cache (decode; q_len >= 1 allows speculative verification), sequences
 * [n_decode_seqs, n_seqs) the naive path over decompressed K/V (prefill chunks; their earlier
 * context, if any, is read back from the cache). Within a sequence, tokens are consecutive
 * positions ending at seq_ctx_len - 1. */
typedef struct di_batch {
    int n_tokens;
    const int32_t *token_ids;     /* [n_tokens] */
    const int32_t *positions;     /* [n_tokens] position of each token within its sequence */
    const int32_t *slot_mapping;  /* [n_tokens] cache slot the token's latent is written to */
    int n_seqs;
    int n_decode_seqs;
    const int32_t *seq_start;     /* [n_seqs + 1] tokens of seq i are [seq_start[i], seq_start[i+1]) */
    const int32_t *seq_ctx_len;   /* [n_seqs] context length including this step's tokens */
    const int32_t *block_table;   /* [n_seqs * max_blocks] block ids, row-major */
    int max_blocks;
    int n_logits;
    const int32_t *logits_rows;   /* [n_logits] batch token indices whose logits are returned */
} di_batch;

typedef struct di_model di_model;

/* Loads config.json and the safetensors in `dir`, uploads weights to the backend, allocates
 * the KV pool and workspace. */
di_status di_model_load(const char *dir, const di_model_options *opts, di_model **out);
void di_model_free(di_model *m);
const di_model_config *di_model_config_of(const di_model *m);
int di_model_kv_blocks(const di_model *m);
/* Runs the batch; writes float32 logits for the requested rows, row-major
 * [n_logits, vocab_size], into host memory. Validates the batch first (token ids in range,
 * counts within the options' limits, slots and block ids inside the pool, positions
 * consistent with seq_ctx_len) and returns DI_ERR_INVALID_ARG naming the field otherwise. */
di_status di_model_forward(di_model *m, const di_batch *batch, float *logits);

/* ---- extensions (model engineer) ---- */

/* di_model_forward that can also return the final hidden states (after model.norm, the
 * tensor lm_head sees) of EVERY batch token: host f32 [n_tokens, hidden_size]. logits or
 * hidden may be NULL to skip that output. */
di_status di_model_forward_ex(di_model *m, const di_batch *batch, float *logits, float *hidden);

/* Copies whole KV blocks src[i] -> dst[i] (all layers, MTP layers included, and V3.2's
 * index-key cache) for copy-on-write of shared partial blocks. Block ids must be in
 * [0, di_model_kv_blocks). */
di_status di_model_copy_blocks(di_model *m, const int32_t *src, const int32_t *dst, int n);

/* Number of MTP layers loaded (0 unless options.load_mtp and the config has them). */
int di_model_mtp_layers(const di_model *m);

/* Runs MTP layer k (0-based) for the batch (DeepSeek-V3 §7, vLLM semantics): for each batch
 * token i at position p_i, batch->token_ids[i] must hold the NEXT token t_{i+1}, and
 * hidden_in[i] the main model's final (post-norm) hidden state h_i at p_i:
 *   e = embed(t_{i+1}); u = eh_proj([enorm(e); hnorm(h_i)]); v = decoder_layer_k(u) (its own
 *   KV cache layer, same slots/block tables as the main model, position p_i);
 *   logits = lm_head(shared_head.norm(v)).
 * Writes logits of batch->logits_rows (f32 [n_logits, vocab]) and, if hidden_out != NULL,
 * shared_head.norm(v) of every token (f32 [n_tokens, hidden]) for chaining. */
di_status di_model_mtp_forward(di_model *m, int k, const di_batch *batch, const float *hidden_in,
                               float *logits, float *hidden_out);

/* di_model_forward that samples instead of returning logits: token j is drawn from the logits
 * of batch row logits_rows[j] with rows[j] (greedy / temperature / top-k / top-p / min-p,
 * seeded by (seed, position, stream); bit-identical to src/sampling's di_sampler_sample for
 * the same parameters). On a backend with a sample op (CUDA) the logits never leave the device
 * and only the tokens are copied back; pure decode steps of up to 256 sequences (one token
 * each, logits_rows = 0..n-1) are replayed from CUDA graphs captured per batch-size bucket
 * (DEEPINFER_CUDA_GRAPHS=0 disables them). Elsewhere the logits are sampled on the host.
 * Parameter errors name the row; NaN / fully masked logits are DI_ERR_BACKEND. */
di_status di_model_forward_sample(di_model *m, const di_batch *batch, const di_sample_row *rows, int32_t *tokens);

/* di_model_forward_sample with per-row outcomes (the engine's device-sampling path): status[j]
 * = DI_SAMPLE_OK, or the DI_SAMPLE_ERR_* code (backend.h) of a row that could not be sampled
 * (NaN / +inf logit, every logit -inf, no non-zero weight), whose token is then -1. The other
 * rows are sampled and the forward (KV writes) has run; the return value is an error only for
 * a NULL argument, an invalid batch or rows (nothing ran) or a failed forward. */
di_status di_model_forward_sample_rows(di_model *m, const di_batch *batch, const di_sample_row *rows, int32_t *tokens,
                                       int32_t *status);

/* Asynchronous sampling steps: di_model_sample_launch queues the step that
 * di_model_forward_sample_rows would run and returns without waiting for its tokens;
 * di_model_sample_collect waits for the oldest launched step and gives its tokens and status
 * (as di_model_forward_sample_rows). At most two steps are in flight, and the host can prepare
 * and queue step N+1 while step N computes, so the GPU does not wait for the host between
 * decode steps. chain (NULL: unchained): the input token of row j is the token the previously
 * launched step sampled for its logits row chain[j] (distinct rows; batch->token_ids is
 * ignored); the batch must be a decode step (one token and one logits row per sequence,
 * logits_rows = 0..n-1) of no more rows than that step had. A row of the previous step that
 * failed to sample feeds an arbitrary valid token (its result is meant to be discarded). An
 * unchained launch requires no step in flight. Where the backend lacks asynchronous copies or
 * graphs, or the step is not a graph-replayed decode step, launch runs the step synchronously
 * and collect returns its stored results, so the calls work everywhere with the same results.
 * Errors of launch: the step was not queued (the previous step, when this one was to
 * continue it but could not in place, may have been settled: its results stay collectable,
 * or its collect reports the error); errors of collect: that step's results are lost (later ones stay in flight). */
di_status di_model_sample_launch(di_model *m, const di_batch *batch, const di_sample_row *rows, const int32_t *chain);
di_status di_model_sample_collect(di_model *m, int32_t *tokens, int32_t *status);
/* Steps launched and not collected (0, 1 or 2). */
int di_model_sample_in_flight(const di_model *m);

/* Runs and captures the decode-step CUDA graphs of every batch-size bucket up to the one
 * that holds max_batch sequences (each bucket: one eager step, then the capture), on padding
 * rows only (no cache slot is written, no sampled token is kept), so that the first real
 * decode steps of a server replay a graph instead of paying the eager step, the lazily built
 * GEMM plans and the capture (tens of ms at 16+ sequences). *n_captured (may be NULL) gets the
 * number of buckets now holding a graph. A no-op (DI_OK, 0) where graphs are off (CPU,
 * DEEPINFER_CUDA_GRAPHS=0) or the backend samples on the host. */
di_status di_model_warmup_decode(di_model *m, int max_batch, int *n_captured);

/* The backend the model runs on (ops tests, benchmarks). */
di_backend *di_model_backend(di_model *m);
#endif
