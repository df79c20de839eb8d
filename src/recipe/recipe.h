/* recipe.h - the recipe layer in one include: OpenAI Chat Completions / Responses and
 * Anthropic Messages requests -> one conversation (conv.h) -> a DeepSeek chat-format prompt
 * (encode.h) -> token ids; and generated tokens -> reasoning / content / tool calls
 * (outparse.h) -> each protocol's response and stream events (proto.h).
 *
 * The engine's entry point is di_recipe_request_prepare: one request body in, everything needed
 * to generate and to parse the output back. Typical use (deepinfer generate --input lines,
 * which have the Chat Completions shape):
 *
 *   di_recipe_request rq;
 *   if (di_recipe_request_prepare(DI_PROTO_CHAT, body, 0, DI_CHAT_FORMAT_V3, tok, &rq, &err)) ...
 *   // generate from rq.ids.data[0..rq.ids.n) with rq.conv->params (max_tokens, temperature,
 *   // top_p, top_k, min_p, penalties, stop, seed, n, logprobs, stream)
 *   di_outparse *p = di_outparse_create(&rq.parser);  // feed each generated (id, bytes)
 *   ...
 *   di_recipe_request_clear(&rq);
 */
#ifndef DI_RECIPE_RECIPE_H
#define DI_RECIPE_RECIPE_H
#include "recipe/conv.h"
#include "recipe/encode.h"
#include "recipe/outparse.h"
#include "recipe/proto.h"
#include "tokenizer/tokenizer.h"

typedef struct di_recipe_request {
    di_conv *conv;               /* messages, tools, options and sampling params */
    di_chat_format format;
    di_prompt prompt;            /* rendered prompt text and its segments */
    di_ids ids;                  /* prompt token ids */
    size_t n_text_fallbacks;     /* <think>/</think> encoded as text (tokenizer lacks them) */
    di_outparse_config parser;   /* output parser settings for this request */
} di_recipe_request;

/* Converts, encodes and tokenizes one request. For V3.1, tools (unless tool_choice is "none")
 * are described in the system prompt (di_encode_opts.tools_prompt); V3 and R1 prompts carry no
 * tool descriptions, as their templates. The parser config gets the tokenizer's control
 * ids, starts in reasoning when the prompt ends inside <think> (di_prompt_ends_in_reasoning), and seeds its tool-call ids
 * with the request seed (or a hash of the prompt when the request has none), so a request's
 * ids are reproducible. Anthropic requests get "toolu_" call ids, OpenAI ones "call_".
 * On a request error *err is filled (API-shaped) and DI_ERR_INVALID_ARG returned; *out is left
 * cleared on any error. */
di_status di_recipe_request_prepare(di_proto proto, const json_t *body, unsigned flags, di_chat_format format,
                                    const di_tokenizer *tok, di_recipe_request *out, di_api_error *err);
void di_recipe_request_clear(di_recipe_request *r);
#endif
