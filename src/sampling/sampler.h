/* sampler.h - turns one row of logits into a token: penalties, logit bias, min_tokens mask,
 * greedy or temperature / top-k / top-p / min-p, and a draw with the counter-based RNG.
 *
 * Owner: sampling. A di_sampler holds vocab-sized scratch, allocated once (no allocation per
 * call); one sampler serves any number of rows, one at a time (use one sampler per thread).
 *
 * Reproducibility contract (docs/engine.md "Sampler" has the full specification): the chosen
 * token is a function of the row, the params, (seed, position, stream) and the counts only,
 * computed with integer arithmetic and IEEE fp32 operations (+, -, *, /, floor, compares; no
 * fused multiply-add, no libm transcendental) so a CUDA kernel can reproduce it bit for bit:
 *   x      = logits after penalties, bias and the min_tokens mask
 *   greedy = lowest id among the maxima of x                   (temperature < 1e-5)
 *   y_i    = x_i / T (skipped when T == 1)
 *   C      = top_k > 0 ? the k largest by (y desc, id asc) : all ids
 *   m      = max_{C} y;  p_i = di_sampling_exp(y_i - m);  q_i = (uint64)(p_i * 2^32)
 *   top_p  : order C by (y desc, id asc), keep i iff (sum of q over the tokens before i)
 *            * 2^24 < floor(top_p * 2^24) * sum_C q   (the first token is always kept)
 *   min_p  : keep i iff p_i >= min_p (p of the most likely token is exactly 1)
 *   draw   : r = di_rng_u32(seed, position, stream, 0); W = sum_K q; t = (r * W) >> 32;
 *            walk K in ascending id, first token with running sum > t.
 * Logprobs are log-softmax of the raw row (before penalties / temperature), in double with
 * libm: reporting values, not part of the bit-exact contract. */
#ifndef DI_SAMPLING_SAMPLER_H
#define DI_SAMPLING_SAMPLER_H
#include <stdint.h>
#include "deepinfer.h"
#include "sampling/penalties.h"

#define DI_SAMPLING_MAX_N 128           /* most completions per request (params 'n') */

typedef struct di_sampler di_sampler;

/* Everything about one row besides its logits. */
typedef struct di_sample_request {
    const di_sampling_params *params;
    uint64_t seed;                          /* effective seed of the request */
    uint32_t position;                      /* position of the token being sampled */
    uint32_t stream;                        /* completion index */
    int n_generated;                        /* output tokens so far (for min_tokens) */
    const di_token_counts *prompt_counts;   /* NULL: no repetition penalty from the prompt */
    const di_token_counts *output_counts;   /* NULL: nothing generated */
    const int32_t *eos_ids;                 /* masked while n_generated < min_tokens */
    int n_eos;                              /*   (unless ignore_eos) */
} di_sample_request;

di_status di_sampler_create(int vocab_size, di_sampler **out);
void di_sampler_free(di_sampler *s);
int di_sampler_vocab(const di_sampler *s);

/* Samples one token from logits[vocab]. When lp != NULL and params->logprobs >= 0, fills the
 * chosen token's logprob and the top params->logprobs alternatives. Non-finite logits other
 * than -inf, or a row where everything is masked, are DI_ERR_BACKEND. */
di_status di_sampler_sample(di_sampler *s, const float *logits, const di_sample_request *rq,
                            int32_t *token, di_token_logprob *lp);

/* The greedy choice over a row that needs no preparation (no penalties, bias or mask): the
 * lowest id among the maxima of logits[0..vocab). NaN / +inf / all -inf are DI_ERR_BACKEND,
 * as in di_sampler_sample, which uses it for greedy rows. */
di_status di_sampler_argmax(const float *logits, int vocab, int32_t *token);

/* 1 if, for these params, di_sampler_sample picks di_sampler_argmax of the raw row whenever
 * no min_tokens mask applies (n_generated >= min_tokens) and fills no logprobs: greedy, no
 * penalty, no logit bias, logprobs off. Lets a caller skip the per-row request setup. */
int di_sampler_plain_greedy(const di_sampling_params *p);

/* The exact distribution the draw uses (non-greedy params): the kept tokens in ascending id
 * order and their integer weights. ids / weights have room for vocab entries. Returns the
 * count in *n. For tests and for documenting the math. */
di_status di_sampler_distribution(di_sampler *s, const float *logits, const di_sample_request *rq,
                                  int32_t *ids, uint64_t *weights, int *n);

/* Log-softmax of the raw row into lp (chosen token + top-N). */
void di_sampler_logprobs(di_sampler *s, const float *logits, int32_t token, int top_n, di_token_logprob *lp);

/* exp(d) for d <= 0 in fp32 with the fixed operation sequence of docs/engine.md (0 for
 * d <= -87 or NaN). Exactly 1 at d = 0. */
float di_sampling_exp(float d);
#endif
