/* engine_internal.h - the engine's own structures, shared by engine.c (life cycle, step
 * loop), output.c (token appending, stop checks, text, reported outputs) and generate.c.
 *
 * Owner: engine. A request owns n completions; completion k owns sequence k (the RNG stream
 * k). Completion 0 is the leader: it alone is queued until its prompt is computed, holding n
 * running seats; then completions 1..n-1 fork from it (sharing its blocks) with their own
 * first tokens sampled from the same logits row. Invariants: n_finished counts completions
 * with finish != NONE; a request leaves `active` at the start of the step after the one that
 * reported it finished. */
#ifndef DI_ENGINE_ENGINE_INTERNAL_H
#define DI_ENGINE_ENGINE_INTERNAL_H
#include <stddef.h>
#include <stdint.h>
#include "deepinfer.h"
#include "engine/block_manager.h"
#include "engine/codec.h"
#include "engine/executor.h"
#include "engine/runner.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "sampling/penalties.h"
#include "sampling/sampler.h"

/* What every generated token touches is in the first 64 bytes of a completion (and of its
 * sequence, right after), copies of the request's per-token constants included, and
 * completions are allocated 64-byte aligned (di_engine_prepare_request): with hundreds of
 * running sequences a step's data does not fit in L1, so the cache lines touched per
 * sequence set the step's cost. Steady decode of a plain request touches the request itself
 * only to report it (stream_outputs). */
typedef struct di_completion {
    /* hot (64 bytes) */
    _Alignas(64) int n_gen;          /* generated tokens (seq.len - prompt_len) */
    di_finish_reason finish;
    int max_new;                     /* = req max_new */
    int min_tokens;                  /* = req params.min_tokens */
    uint64_t last_token_ns;
    void *detok;
    char *text;                      /* decoded output, NUL-terminated at text_len */
    size_t text_len;
    size_t visible;                  /* bytes that may be shown (stop-string hold-back) */
    uint8_t plain_greedy;            /* di_sampler_plain_greedy(&req params) */
    uint8_t penalized;               /* di_penalties_active(&req params): counts kept */
    uint8_t check_stop_ids;          /* stop_token_ids given, or EOS not ignored */
    uint8_t has_stop_strs;           /* req params.n_stop > 0 */
    uint8_t fork_pending;            /* completion 0 of an n > 1 request before the fork */
    uint8_t sched_seen;              /* its first scheduled step is recorded in the request */
    di_seq seq;                      /* its first 64 bytes are hot too */
    /* cold */
    di_token_logprob *logprobs;      /* [max_new] when params.logprobs >= 0 */
    di_token_counts counts;          /* output token counts, when a penalty is active */
    size_t text_cap;
    size_t stop_checked;             /* text searched for stop strings up to here */
    int stop_index;                  /* matched stop string, -1 */
    int32_t stop_token;              /* EOS / stop id that ended it, -1 */
} di_completion;

/* The completion that holds an engine sequence (every di_seq the engine schedules is one). */
static inline di_completion *di_seq_completion(di_seq *s) {
    return (di_completion *)((char *)s - offsetof(di_completion, seq));
}

_Static_assert(DI_SAMPLING_MAX_N <= INT16_MAX, "di_req.n is an int16_t");

typedef struct di_req {
    /* hot: what the report reads and writes, in the request's first cache line: these 16
       bytes, then out's request_id .. completion_tokens (the fields a token changes) */
    _Alignas(64) di_completion *comp; /* [n], 64-byte aligned */
    int16_t n;                       /* <= DI_SAMPLING_MAX_N */
    int16_t n_finished;
    uint8_t touched;                 /* a completion finished since the last report */
    uint8_t out_ready;               /* the constant fields of out / outc are set */
    uint8_t out_timed;               /* out's cached_tokens, queue_s and ttft_s are final */
    di_request_output out;           /* at offset 16 */
    /* cold */
    int64_t id;
    uint64_t first_sched_ns, first_token_ns;
    uint8_t forked;                  /* completions 1..n-1 exist as running sequences */
    uint8_t reported_final;
    int max_new;                     /* effective max_tokens */
    di_sampling_params params;       /* arrays below are owned deep copies */
    char **stop_strs;
    int32_t *stop_ids;
    int32_t *bias_ids;
    float *bias_vals;
    uint64_t seed;
    int prompt_len;
    int cached_tokens;
    di_token_counts prompt_counts;   /* when repetition_penalty != 1 */
    uint64_t arrival_ns, finish_ns;
    di_completion_output *outc;      /* [n], 64-byte aligned */
} di_req;

struct di_engine {
    di_engine_params params;
    int max_batch_tokens, max_seqs, max_model_len;
    di_executor ex;
    di_codec codec;
    int has_codec;
    di_block_manager *bm;
    di_scheduler *sched;
    di_runner *runner;
    di_sampler *sampler;
    di_req **active;                 /* by id order */
    int n_active, cap_active;
    int n_final_unreported;          /* requests all finished, final output not reported yet */
    int n_to_reap;                   /* requests whose final output the last step reported */
    const di_request_output **outs;  /* [cap_active] this step's report */
    int64_t next_id;
    di_engine_stats stats;
    /* sampling inside the executor (ex.forward_sample, e.g. on the GPU): [max_seqs] each */
    di_sample_row *srows;
    int32_t *stokens, *sstatus;
    int32_t *row_ident;              /* [max_seqs] 0, 1, 2, ...: row_of of an all-decode step */
    int32_t *chain_map;              /* [max_seqs] a chained step's rows: their rows in the step before */
    uint8_t *chain_keep;             /* [max_seqs] rows of the step in flight that go on */
    /* asynchronous steps (ex.launch_sample): the plan of the step launched and not yet
     * collected (NULL: none). Each di_engine_step collects one step; before that it launches
     * the next decode step chained to it when the batch goes on unchanged (docs/engine.md) */
    const di_step_plan *flight;
    uint64_t steps_sampled_in_executor, steps_sampled_on_host;
    uint64_t steps_chained;          /* steps launched chained to the one in flight */
};

/* The engine's tokenizer (NULL without one). */
const struct di_tokenizer *di_engine_tokenizer(const di_engine *e);

/* Creates an engine over an executor and an optional codec (both taken over, even on error). */
di_status di_engine_create_with(const di_engine_params *p, di_executor *ex, di_codec *codec, di_engine **out);

/* Validates r and builds a request (not queued). */
di_status di_engine_prepare_request(di_engine *e, const di_request_input *r, const char *where, di_req **out);
/* Queues a prepared request and assigns its id. */
di_status di_engine_enqueue(di_engine *e, di_req *q);
void di_req_free(di_engine *e, di_req *q);

/* output.c */
/* Appends a sampled token to completion c of q: counts, logprobs, text, stop / length
 * checks; finishes the completion (releasing its blocks) when done. */
di_status di_engine_append_token(di_engine *e, di_req *q, di_completion *c, int32_t token,
                                 const di_token_logprob *lp, uint64_t now_ns);
/* Ends completion k with `reason` (abort / length) if it is still running. */
void di_engine_finish_completion(di_engine *e, di_req *q, int k, di_finish_reason reason, uint64_t now_ns);
/* This step's report: e->outs[0 .. *n_outs) are the requests that produced tokens or
 * finished (only the finished ones without stream_outputs), in id order, their outputs
 * refreshed; a request reported finished is marked to be freed at the next step. */
void di_engine_report(di_engine *e, size_t *n_outs);
#endif
