/* deepinfer.h - the public C API of deepinfer.
 *
 * deepinfer is an inference engine for DeepSeek-architecture mixture-of-experts models
 * (DeepSeek-V3/R1/V3.1/V3.2, V2/V2-Lite, Kimi-K2, Moonlight). This header is what an
 * application links against: status codes, and (as the engine lands) the engine API
 * di_engine_create / di_engine_add_request / di_engine_step / di_engine_abort /
 * di_generate / di_engine_free.
 *
 * Conventions: every fallible call returns a di_status; on failure di_last_error() gives a
 * message naming what was wrong (per thread). Handles are opaque; *_free(NULL) is a no-op. */
#ifndef DEEPINFER_H
#define DEEPINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum di_status {
    DI_OK = 0,
    DI_ERR_INVALID_ARG = 1,  /* a caller passed a bad value (flag, parameter, request field) */
    DI_ERR_IO = 2,           /* a file could not be opened / read / written / mapped */
    DI_ERR_FORMAT = 3,       /* a file or message is malformed (JSON, safetensors, UTF-8, ...) */
    DI_ERR_NOMEM = 4,        /* host or device memory exhausted */
    DI_ERR_UNSUPPORTED = 5,  /* well-formed but not supported (component, dtype, config) */
    DI_ERR_NOT_FOUND = 6,    /* a named thing (tensor, token, file) does not exist */
    DI_ERR_BACKEND = 7,      /* the compute backend failed (CUDA error, ...) */
    DI_ERR_INTERNAL = 8      /* a bug in deepinfer */
} di_status;

/* Message of the last error recorded on this thread (empty if none). */
const char *di_last_error(void);
/* Short name of a status code. */
const char *di_status_name(di_status s);


/* ======================================================================================
 * Engine: offline batch generation with continuous batching (owner: engine).
 *
 * Life cycle:  di_engine_params_init(&ep); ep.model_dir = ...; di_engine_create(&ep, &e);
 *              di_engine_add_request(e, &req, &id) ...;
 *              while (di_engine_has_unfinished(e)) di_engine_step(e, &outs, &n_outs);
 *              di_engine_free(e);
 * or the blocking convenience di_generate(e, reqs, n, &results).
 *
 * Threading: one thread drives an engine (add_request / step / abort are not concurrent).
 * ====================================================================================== */

typedef struct di_engine di_engine;

/* Sampling parameters of one request, named after the OpenAI API fields. Always start from
 * di_sampling_params_init (the defaults below); arrays are copied by di_engine_add_request.
 * Order in which the sampler applies them (see docs/engine.md for the exact float math):
 *   raw logits -> repetition, frequency, presence penalties -> logit_bias -> min_tokens mask
 *   -> greedy argmax if temperature == 0, else: / temperature -> top_k -> top_p -> min_p
 *   -> draw with the counter-based RNG keyed by (seed, position, completion index). */
typedef struct di_sampling_params {
    int n;                       /* completions per prompt, sharing its KV blocks (default 1, max 128) */
    int max_tokens;              /* generated tokens per completion (default 16; <= 0: up to the
                                    context length) */
    int min_tokens;              /* EOS / stop ids / stop strings are ignored before this many (0) */
    float temperature;           /* 0 = greedy (default 1.0); values below 1e-5 are greedy too */
    float top_p;                 /* nucleus mass in (0, 1] (default 1 = off) */
    int top_k;                   /* keep the k most likely tokens; <= 0 = off (default -1) */
    float min_p;                 /* keep tokens with p >= min_p * p_max; [0, 1] (default 0) */
    float repetition_penalty;    /* > 0; 1 = off. Logit l of a token seen in prompt or output
                                    becomes l / r if l > 0 else l * r */
    float presence_penalty;      /* [-2, 2]; subtracted once from tokens present in the output */
    float frequency_penalty;     /* [-2, 2]; subtracted count times (count in the output) */
    int has_seed;                /* 1: use `seed`; 0: derived from the engine seed and request id */
    uint64_t seed;
    int ignore_eos;              /* keep generating after EOS (default 0) */
    int logprobs;                /* -1 = none (default); 0 = chosen token's logprob; N <= 20:
                                    also the N most likely tokens (raw model distribution) */
    int skip_special_tokens;     /* drop special tokens from the output text (default 1) */
    const char *const *stop;     /* [n_stop] stop strings (matched on the output text; the text
                                    ends before the stop string; OpenAI semantics) */
    int n_stop;
    const int32_t *stop_token_ids; /* [n_stop_token_ids] tokens that end generation (kept in
                                    token_ids, not in text), like EOS */
    int n_stop_token_ids;
    const int32_t *logit_bias_ids; /* [n_logit_bias] token ids ... */
    const float *logit_bias_values;/* ... and the values added to their logits, [-100, 100] */
    int n_logit_bias;
} di_sampling_params;

void di_sampling_params_init(di_sampling_params *p);
/* Checks ranges (vocab_size bounds token ids; 0 = unchecked); error names the field. */
di_status di_sampling_params_validate(const di_sampling_params *p, int vocab_size);

/* Precision of activations and the KV cache (weights: see docs/cuda.md "Precision"). */
typedef enum di_precision {
    DI_PRECISION_DEFAULT = 0,    /* the device's: CPU f32, CUDA bf16 */
    DI_PRECISION_BF16 = 1,       /* CUDA only */
    DI_PRECISION_F32 = 2         /* fp32 activations, KV cache and weights (CPU; CUDA's
                                    reference mode) */
} di_precision;

typedef struct di_engine_params {
    const char *model_dir;       /* config.json + *.safetensors (+ tokenizer.json) */
    const char *tokenizer_dir;   /* NULL: model_dir */
    int device;                  /* 0 = CPU, 1 = CUDA */
    int precision;               /* activations and KV cache, a di_precision: 0 = the device's
                                    default (CPU f32, CUDA bf16); DI_PRECISION_F32 on CUDA
                                    computes like the CPU (slower; for reproducing references) */
    int n_threads;               /* CPU threads (0 = DEEPINFER_THREADS or all cores) */
    int max_batch_tokens;        /* token budget per step (default 2048) */
    int max_seqs;                /* most running sequences (default 256) */
    int kv_blocks;               /* KV pool size in 64-token blocks (0 = backend default) */
    size_t kv_memory_bytes;      /* KV pool size in bytes when kv_blocks == 0 (0 = default) */
    int enable_prefix_cache;     /* default 1 */
    int max_model_len;           /* context limit (0 = the model's max_position_embeddings) */
    uint64_t seed;               /* seeds requests that have no seed (default 0) */
    int stream_outputs;          /* 1 (default): di_engine_step reports every request that
                                    produced tokens; 0: only requests that finished */
} di_engine_params;

void di_engine_params_init(di_engine_params *p);

/* One request. Exactly one of prompt (text, tokenized with the model's tokenizer; BOS added
 * as tokenizer_config.json says) or prompt_ids is given. */
typedef struct di_request_input {
    const char *prompt;          /* UTF-8 text, NUL-terminated, or NULL */
    const int32_t *prompt_ids;   /* [n_prompt_ids] or NULL */
    size_t n_prompt_ids;
    int priority;                /* lower = more important (default 0); preempted last */
    di_sampling_params sampling;
} di_request_input;

void di_request_input_init(di_request_input *r);

/* Why a completion ended; shared by the engine and the recipe layer's output parser. The
 * engine reports NONE, STOP (EOS, a stop token id or a stop string; see stop_reason), LENGTH
 * and ABORT; TOOL_CALLS, STOP_SEQUENCE and ERROR are protocol-level outcomes of the output
 * parser (recipe/outparse.h). */
typedef enum di_finish_reason {
    DI_FINISH_NONE = 0,          /* still running */
    DI_FINISH_STOP,              /* EOS, a stop token id or a stop string */
    DI_FINISH_LENGTH,            /* max_tokens or the context limit */
    DI_FINISH_TOOL_CALLS,        /* (output parser) stopped after complete, valid tool calls */
    DI_FINISH_STOP_SEQUENCE,     /* (output parser) a stop string matched */
    DI_FINISH_ABORT,             /* di_engine_abort / cancelled */
    DI_FINISH_ERROR              /* (output parser) malformed model output */
} di_finish_reason;

/* "none", "stop", "length", "tool_calls", "stop_sequence", "abort", "error". */
const char *di_finish_reason_name(di_finish_reason r);

#define DI_MAX_TOP_LOGPROBS 20

typedef struct di_token_logprob {
    int32_t token;               /* the sampled token */
    float logprob;               /* its log-probability under the raw model distribution */
    int n_top;                   /* entries in top_tokens / top_logprobs */
    int32_t top_tokens[DI_MAX_TOP_LOGPROBS];   /* most likely first (ties: lower id first) */
    float top_logprobs[DI_MAX_TOP_LOGPROBS];
} di_token_logprob;

typedef struct di_completion_output {
    int index;                   /* 0 .. n-1 */
    const char *text;            /* decoded output: its first text_len bytes ("" without a
                                    tokenizer). Excludes a matched stop string and EOS / stop
                                    tokens; while running, also a tail that could still begin a
                                    stop string (those bytes may follow text_len in the buffer).
                                    text[text_len] == 0 once finished */
    size_t text_len;
    const int32_t *token_ids;    /* [n_tokens] generated ids (including a final EOS / stop id) */
    size_t n_tokens;
    const di_token_logprob *logprobs;  /* [n_tokens] when logprobs >= 0, else NULL */
    di_finish_reason finish_reason;
    const char *stop_reason;     /* the matched stop string, or NULL */
    int32_t stop_token;          /* the EOS / stop token that ended it, or -1 */
} di_completion_output;

typedef struct di_request_timing {  /* seconds */
    double queue_s;              /* arrival -> first scheduled (once scheduled) */
    double ttft_s;               /* arrival -> first generated token (once there is one) */
    double tpot_s;               /* mean time per output token after the first of the longest
                                    completion (0 if <= 1 token; set when finished) */
    double e2e_s;                /* arrival -> finished (set when finished) */
} di_request_timing;

typedef struct di_request_output {
    int64_t request_id;
    int finished;                /* all completions finished */
    size_t n_choices;
    const di_completion_output *choices;
    size_t prompt_tokens;
    size_t completion_tokens;    /* summed over choices */
    size_t cached_tokens;        /* prompt tokens served from the prefix cache (first admission) */
    di_request_timing timing;
} di_request_output;

/* Loads the model and tokenizer and sizes the KV pool and batch workspace. */
di_status di_engine_create(const di_engine_params *p, di_engine **out);
void di_engine_free(di_engine *e);

/* Validates and queues a request; *request_id identifies it in outputs (ids increase from 0). */
di_status di_engine_add_request(di_engine *e, const di_request_input *r, int64_t *request_id);
/* Finishes a waiting or running request with reason "abort"; its output is reported by the
 * next di_engine_step. Unknown or already finished ids are DI_ERR_NOT_FOUND. */
di_status di_engine_abort(di_engine *e, int64_t request_id);
/* 1 while some request is waiting, running, or has an output not yet reported. */
int di_engine_has_unfinished(const di_engine *e);

/* Runs one step: schedule, forward, sample, update. *outs lists every request that produced
 * tokens or finished in this step (finished ones for the last time; with stream_outputs = 0
 * only the finished ones). The outputs and what
 * they point to are owned by the engine and valid until the next di_engine_step /
 * di_engine_free. */
di_status di_engine_step(di_engine *e, const di_request_output *const **outs, size_t *n_outs);

/* Runs n requests to completion. *results: malloc'd [n] in input order, deep copies (free
 * with di_generate_results_free; their texts are NUL-terminated). Fails without running
 * anything if a request is invalid (the message names its index and field). Requests already
 * queued in the engine also run, but their outputs are not returned. */
di_status di_generate(di_engine *e, const di_request_input *reqs, size_t n, di_request_output **results);
void di_generate_results_free(di_request_output *results, size_t n);

/* Engine counters (cumulative). */
typedef struct di_engine_stats {
    uint64_t steps;
    uint64_t prompt_tokens;       /* prompt tokens of admitted requests */
    uint64_t computed_tokens;     /* tokens run through the model (prefill + decode + recompute) */
    uint64_t generated_tokens;
    uint64_t prefix_hit_tokens;   /* tokens whose KV came from the prefix cache */
    uint64_t preemptions;
    int kv_blocks_total, kv_blocks_free, kv_blocks_cached;
    int running, waiting;
} di_engine_stats;
void di_engine_get_stats(const di_engine *e, di_engine_stats *s);

#ifdef __cplusplus
}
#endif
#endif /* DEEPINFER_H */
