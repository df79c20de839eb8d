/* request_json.h - OpenAI-shaped JSON <-> engine requests and outputs, for `deepinfer
 * generate --input/--output` (and later the server).
 *
 * Owner: engine. A request object has exactly one of
 *   "prompt" (string), "prompt_token_ids" (array of ints), "messages" (Chat Completions; needs
 *   the recipe layer, rejected with DI_ERR_UNSUPPORTED until it is merged)
 * plus optional sampling fields named as in the OpenAI API: max_tokens (alias
 * max_completion_tokens), min_tokens, temperature, top_p, top_k, min_p, seed, stop (string or
 * array), stop_token_ids, n, logprobs (int 0..20, or bool with top_logprobs), top_logprobs,
 * presence_penalty, frequency_penalty, repetition_penalty, ignore_eos, skip_special_tokens,
 * logit_bias ({"id": bias}), priority; and "id" / "custom_id", echoed in the output. Absent or
 * null fields take the defaults given by the caller; unknown fields are errors (typos must not
 * pass silently). Errors name `where` and the field.
 * A "messages" request is rendered with the DeepSeek chat format through the recipe layer
 * (recipe/recipe.h: di_recipe_request_prepare, Chat Completions rules: tools, tool_choice,
 * response_format, reasoning_effort / thinking, add_generation_prompt, ... are accepted;
 * "model" is optional here) and tokenized with the engine's tokenizer.
 * An output object (one line per request, input order):
 *   n == 1: {"text", "token_ids", "finish_reason", "usage", ...}
 *   n > 1:  {"choices": [{"index", "text", "token_ids", "finish_reason", ...}], "usage", ...}
 * with "stop_reason" (matched stop string or stop token id) and "logprobs" when present,
 * usage = {"prompt_tokens", "completion_tokens", "total_tokens",
 *          "prompt_tokens_details": {"cached_tokens"}},
 * metrics = {"queue_s", "ttft_s", "tpot_s", "e2e_s"}. */
#ifndef DI_ENGINE_REQUEST_JSON_H
#define DI_ENGINE_REQUEST_JSON_H
#include <jansson.h>
#include "deepinfer.h"

typedef struct di_request_json {
    di_request_input in;      /* points into the storage below and into `defaults`' arrays */
    char *prompt;
    int32_t *ids;
    char **stops;
    int n_stops;
    int32_t *stop_ids;
    int32_t *bias_ids;
    float *bias_vals;
    json_t *echo_id;          /* "id" / "custom_id" value (owned reference) */
    const char *echo_key;
} di_request_json;

struct di_tokenizer;

/* `tok` (may be NULL: then "messages" requests are rejected) and `chat_format` (0 = V3, see
 * recipe/encode.h di_chat_format) serve "messages" requests. */
di_status di_request_json_parse(const json_t *obj, const di_request_input *defaults, const char *where,
                                const struct di_tokenizer *tok, int chat_format, di_request_json *out);
void di_request_json_free(di_request_json *r);

/* The output object of a finished (or running) request; NULL on out-of-memory. */
json_t *di_request_output_json(const di_request_output *o, const di_request_json *req);
#endif
