/* params.c - defaults and validation of di_sampling_params (public API, deepinfer.h).
 * Validation errors name the field and the accepted range, e.g.
 * "sampling: field 'top_p': expected a value in (0, 1], got 1.5". */
#include <math.h>
#include <string.h>

#include "core/status.h"
#include "deepinfer.h"
#include "sampling/sampler.h"

void di_sampling_params_init(di_sampling_params *p) {
    memset(p, 0, sizeof *p);
    p->n = 1;
    p->max_tokens = 16;
    p->min_tokens = 0;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = -1;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->logprobs = -1;
    p->skip_special_tokens = 1;
}

static di_status bad(const char *field, const char *expected, double got) {
    return di_error(DI_ERR_INVALID_ARG, "sampling: field '%s': expected %s, got %g", field, expected, got);
}

di_status di_sampling_params_validate(const di_sampling_params *p, int vocab_size) {
    if (p->n < 1 || p->n > DI_SAMPLING_MAX_N) return bad("n", "an integer in [1, 128]", p->n);
    if (p->min_tokens < 0) return bad("min_tokens", "an integer >= 0", p->min_tokens);
    if (p->max_tokens > 0 && p->min_tokens > p->max_tokens)
        return di_error(DI_ERR_INVALID_ARG, "sampling: field 'min_tokens': %d is larger than max_tokens %d",
                        p->min_tokens, p->max_tokens);
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return bad("temperature", "a finite value >= 0", p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) return bad("top_p", "a value in (0, 1]", p->top_p);
    if (p->top_k < -1) return bad("top_k", "-1 or 0 (off) or a positive integer", p->top_k);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) return bad("min_p", "a value in [0, 1]", p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return bad("repetition_penalty", "a finite value > 0", p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return bad("presence_penalty", "a value in [-2, 2]", p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return bad("frequency_penalty", "a value in [-2, 2]", p->frequency_penalty);
    if (p->logprobs < -1 || p->logprobs > DI_MAX_TOP_LOGPROBS)
        return bad("logprobs", "-1 (off) or an integer in [0, 20]", p->logprobs);
    if (p->n_stop < 0 || (p->n_stop > 0 && !p->stop)) return bad("stop", "an array of n_stop strings", p->n_stop);
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0])
            return di_error(DI_ERR_INVALID_ARG, "sampling: field 'stop[%d]': expected a non-empty string", i);
    if (p->n_stop_token_ids < 0 || (p->n_stop_token_ids > 0 && !p->stop_token_ids))
        return bad("stop_token_ids", "an array of n_stop_token_ids ids", p->n_stop_token_ids);
    for (int i = 0; i < p->n_stop_token_ids; i++) {
        int32_t t = p->stop_token_ids[i];
        if (t < 0 || (vocab_size > 0 && t >= vocab_size))
            return di_error(DI_ERR_INVALID_ARG, "sampling: field 'stop_token_ids[%d]': token id %d is outside [0, %d)",
                            i, (int)t, vocab_size);
    }
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && (!p->logit_bias_ids || !p->logit_bias_values)))
        return bad("logit_bias", "n_logit_bias ids and values", p->n_logit_bias);
    for (int i = 0; i < p->n_logit_bias; i++) {
        int32_t t = p->logit_bias_ids[i];
        float v = p->logit_bias_values[i];
        if (t < 0 || (vocab_size > 0 && t >= vocab_size))
            return di_error(DI_ERR_INVALID_ARG, "sampling: field 'logit_bias': token id %d is outside [0, %d)", (int)t,
                            vocab_size);
        if (!(v >= -100.0f && v <= 100.0f))
            return di_error(DI_ERR_INVALID_ARG, "sampling: field 'logit_bias[%d]': expected a value in [-100, 100], got %g",
                            (int)t, (double)v);
    }
    return DI_OK;
}
