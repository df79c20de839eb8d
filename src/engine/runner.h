/* runner.h - step plan -> batch tensors -> executor forward -> logits rows.
 *
 * Owner: engine. Buffers are sized at create for the engine's limits (max_batch_tokens,
 * max_seqs, max blocks per sequence); a step allocates nothing. For plan entry i the batch has
 * seq i (decode entries first, as the plan orders them: one token each, or several for a
 * resumed sequence under the scheduler's exact recompute), tokens [start, start + n_new) with
 * positions start.., slots block * 64 + offset through the sequence's block table, context
 * length start + n_new, and, when the entry samples, one logits row for its last token:
 * row_of[i] is that row (or -1). Copy-on-write copies of the plan run before the forward. */
#ifndef DI_ENGINE_RUNNER_H
#define DI_ENGINE_RUNNER_H
#include <stdint.h>
#include "deepinfer.h"
#include "engine/executor.h"
#include "engine/scheduler.h"

typedef struct di_runner di_runner;

di_status di_runner_create(int max_batch_tokens, int max_seqs, int max_blocks_per_seq, di_runner **out);
void di_runner_free(di_runner *r);

/* Fills the batch for `plan` (token ids are read from the sequences now, at launch time). */
const di_batch *di_runner_prepare(di_runner *r, const di_step_plan *plan);
/* prepare + copies + forward. *logits: [batch n_logits, vocab], *row_of: [plan n_seqs]. */
di_status di_runner_run(di_runner *r, di_executor *ex, const di_step_plan *plan, const float **logits,
                        const int32_t **row_of);
/* prepare + copies + ex->forward_sample: rows[j] are the sampling parameters of logits row j
 * (rows are numbered like row_of: plan entries that sample, in plan order); tokens[j] and
 * status[j] receive each row's token and DI_SAMPLE_* code. */
di_status di_runner_run_sample(di_runner *r, di_executor *ex, const di_step_plan *plan, const di_sample_row *rows,
                               int32_t *tokens, int32_t *status, const int32_t **row_of);
/* prepare + copies + ex->launch_sample (asynchronous; the tokens come from ex->collect_sample).
 * chain (NULL: unchained): for a plan from di_scheduler_schedule_chained, the row of the
 * previous launched step whose token is each row's input (executor.h). */
di_status di_runner_launch_sample(di_runner *r, di_executor *ex, const di_step_plan *plan, const di_sample_row *rows,
                                  const int32_t *chain);
#endif
