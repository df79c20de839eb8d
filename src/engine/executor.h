/* executor.h - what the engine needs from a model: a forward pass over a batch that returns
 * logits rows, a KV block copy for copy-on-write, and a few facts (vocab, KV pool size, EOS).
 *
 * Owner: engine. Three implementations:
 *   di_executor_model_create  the real model (model/model.h: di_model_forward, di_model_copy_blocks,
 *                             and di_model_forward_sample_rows: device sampling, on by default
 *                             on CUDA; DEEPINFER_DEVICE_SAMPLING=0 / 1 forces it off / on;
 *                             asynchronous steps through di_model_sample_launch / _collect)
 *   di_executor_fake_create   a deterministic synthetic model with its own paged "KV pool" that
 *                             checks every slot / block-table entry and computes logits from the
 *                             whole context read back through the block table (tests)
 *   di_executor_null_create   instant fixed logits (engine overhead benchmark)
 * The batch format is model.h's di_batch; the logits are host fp32 [n_logits, vocab] in a
 * buffer owned by the executor, valid until its next forward. */
#ifndef DI_ENGINE_EXECUTOR_H
#define DI_ENGINE_EXECUTOR_H
#include <stdint.h>
#include "deepinfer.h"
#include "model/model.h"

#define DI_EXECUTOR_MAX_EOS 8

typedef struct di_executor {
    void *ctx;
    int vocab_size;
    int n_kv_blocks;
    int max_model_len;          /* longest context a sequence may reach */
    int n_eos;
    int32_t eos_ids[DI_EXECUTOR_MAX_EOS];
    di_status (*forward)(void *ctx, const di_batch *batch, const float **logits);
    /* Optional (NULL: absent): the forward pass with the sampling done by the executor
     * (di_model_forward_sample_rows: on CUDA the logits never leave the device, decode steps
     * replay CUDA graphs). rows[j] holds the parameters of logits row j; tokens[j] receives its
     * token, status[j] DI_SAMPLE_OK or a DI_SAMPLE_ERR_* code (then tokens[j] = -1). An error
     * return means the forward itself failed. The engine calls it instead of forward when
     * `device_sampling` is set and every row of the step needs nothing beyond di_sample_row
     * (no penalties, logit bias, min_tokens mask, logprobs, or n > 1 first draw). */
    di_status (*forward_sample)(void *ctx, const di_batch *batch, const di_sample_row *rows, int32_t *tokens,
                                int32_t *status);
    int device_sampling;
    /* 1: each row's results are the same bits whatever else is in the batch (the CPU backend),
     * but a token's KV computed in a decode step differs in its last bits from the same token's
     * KV computed in a prefill chunk (the absorbed and the naive MLA round differently). The
     * engine then keeps the two apart (scheduler.h "Exact recompute"), so preemption and
     * prefix-cache reuse change no output bit. */
    int exact_recompute;
    /* Optional (both NULL: absent): asynchronous forward_sample steps, so that the engine can
     * queue the next decode step before the current one's tokens are back (model.h
     * di_model_sample_launch / _collect). launch_sample queues a step and returns;
     * collect_sample waits for the oldest queued step and gives its tokens and status (as
     * forward_sample). chain (NULL: unchained): row j's input token is the token the previously
     * launched step sampled for its row chain[j] (distinct rows; batch token ids ignored; a
     * decode step of no more rows). At most two steps in flight; an unchained launch needs
     * none. DEEPINFER_ASYNC_STEPS=0 turns them off for the real model. */
    di_status (*launch_sample)(void *ctx, const di_batch *batch, const di_sample_row *rows, const int32_t *chain);
    di_status (*collect_sample)(void *ctx, int32_t *tokens, int32_t *status);
    di_status (*copy_blocks)(void *ctx, const int32_t *src, const int32_t *dst, int n);
    void (*destroy)(void *ctx);
} di_executor;

/* Frees the executor's context (no-op on a zeroed struct). */
void di_executor_destroy(di_executor *ex);

/* Loads the model in dir (model/model.h) sized for the engine's limits. device_sampling is
 * on for CUDA, off for the CPU (where di_model_forward_sample_rows samples on the host with
 * the same sampler: forcing it on there exercises the engine's device path in CPU tests). */
di_status di_executor_model_create(const char *dir, const di_model_options *opts, di_executor *out);
/* The model of an executor made by di_executor_model_create (tests reach its backend). */
struct di_model *di_executor_model_of(const di_executor *ex);

/* ---- synthetic executors ---- */

typedef struct di_fake_model_config {
    int vocab_size;             /* > 1 */
    int n_kv_blocks;
    int max_model_len;
    int max_batch_tokens;       /* a batch with more tokens is an error (checks the budget) */
    int max_seqs;
    int32_t eos_id;             /* -1: none */
    uint64_t seed;              /* changes the synthetic "weights" */
    int decode_differs;         /* 1: a token computed by a decode entry (batch index below
                                 * n_decode_seqs) writes another KV value than the same token in a
                                 * prefill chunk, as the real model's two MLA paths round
                                 * differently; the executor then sets exact_recompute */
} di_fake_model_config;

typedef struct di_fake_model_stats {
    uint64_t forwards;
    uint64_t tokens;            /* tokens whose KV was written */
    uint64_t logits_rows;
    uint64_t block_copies;
} di_fake_model_stats;

di_status di_executor_fake_create(const di_fake_model_config *cfg, di_executor *out);
void di_executor_fake_stats(const di_executor *ex, di_fake_model_stats *st);
/* The context hash the fake model derives logits from, for a token sequence computed
 * directly (no cache): lets tests state what the engine must have produced. Positions from
 * n_prompt on are generated tokens, computed by decode entries (it matters with decode_differs). */
uint64_t di_fake_model_context_hash(const di_fake_model_config *cfg, const int32_t *tokens, int n_prompt, int n);
/* The fake model's logits row for a context hash. */
void di_fake_model_logits(const di_fake_model_config *cfg, uint64_t ctx_hash, float *row);

/* Fixed logits (a seeded pseudo-random row repeated), no KV: the forward costs nothing. */
di_status di_executor_null_create(int vocab_size, int n_kv_blocks, int max_model_len, int max_seqs, di_executor *out);
#endif
