/* penalties.h - per-sequence token counts and the repetition / frequency / presence penalties.
 *
 * di_token_counts is a small open-addressing map token -> count (power-of-two capacity, linear
 * probing, load <= 1/2) so that applying penalties costs O(distinct tokens), not O(context)
 * and not O(vocab). A sequence keeps one for its output tokens and one for its prompt tokens
 * (the prompt one is only needed for the repetition penalty).
 *
 * Penalty math (fp32, in this order, each an IEEE-rounded fp32 operation, no fused multiply-
 * add; docs/engine.md "Sampler"):
 *   for every token t in prompt U output:  l = (l > 0) ? l / r : l * r    (r = repetition)
 *   for every token t in output (count c): l = l - (float)c * f            (f = frequency)
 *                                          l = l - p                       (p = presence)
 * Invariant: counts are >= 1 for present keys; keys are in [0, vocab). */
#ifndef DI_SAMPLING_PENALTIES_H
#define DI_SAMPLING_PENALTIES_H
#include <stdint.h>
#include "deepinfer.h"

typedef struct di_token_counts {
    int32_t *keys;      /* [cap], -1 = empty */
    int32_t *counts;    /* [cap] */
    uint32_t cap;       /* 0 or a power of two */
    uint32_t n;         /* distinct tokens */
} di_token_counts;

/* Adds one occurrence of `token` (>= 0); grows the table as needed. */
di_status di_token_counts_add(di_token_counts *c, int32_t token);
/* Occurrences of `token` (0 if absent). */
int32_t di_token_counts_get(const di_token_counts *c, int32_t token);
/* dst becomes a copy of src (dst's old contents are freed). */
di_status di_token_counts_copy(di_token_counts *dst, const di_token_counts *src);
/* Reserves room for `n` distinct tokens without regrowing. */
di_status di_token_counts_reserve(di_token_counts *c, uint32_t n);
void di_token_counts_clear(di_token_counts *c);
void di_token_counts_free(di_token_counts *c);

/* Applies the penalties of `p` to logits[vocab] in place. `prompt` may be NULL (no prompt
 * tokens count for the repetition penalty); `output` may be NULL (nothing generated yet).
 * `mark` is caller scratch of vocab bytes, all zero on entry and on return. */
void di_penalties_apply(float *logits, int vocab, const di_sampling_params *p,
                        const di_token_counts *prompt, const di_token_counts *output, uint8_t *mark);
/* 1 if any penalty of `p` is active. */
int di_penalties_active(const di_sampling_params *p);
#endif
