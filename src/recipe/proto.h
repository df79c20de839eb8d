/* proto.h - the three API protocols: request JSON -> di_conv, and di_out_result / parser events
 * -> response JSON and streaming events.
 *
 *   DI_PROTO_CHAT       OpenAI Chat Completions   POST /v1/chat/completions
 *   DI_PROTO_RESPONSES  OpenAI Responses          POST /v1/responses
 *   DI_PROTO_MESSAGES   Anthropic Messages        POST /v1/messages
 *
 * Converters validate the request and, on bad input, fill a di_api_error shaped the way that
 * API reports it (di_api_error_json):
 *   OpenAI:    {"error": {"message", "type": "invalid_request_error", "param": "messages[2].content",
 *               "code": "invalid_type"}}
 *   Anthropic: {"type": "error", "error": {"type": "invalid_request_error",
 *               "message": "messages.2.content: ..."}}
 * Unknown request fields are ignored (as vLLM / SGLang do); known fields are type- and
 * range-checked. Responses and renderers are pure functions of their inputs (ids and timestamps
 * come from di_render_meta), so they can be tested byte for byte. */
#ifndef DI_RECIPE_PROTO_H
#define DI_RECIPE_PROTO_H
#include <jansson.h>
#include <stdint.h>

#include "recipe/conv.h"
#include "recipe/outparse.h"

typedef enum di_proto { DI_PROTO_CHAT = 0, DI_PROTO_RESPONSES, DI_PROTO_MESSAGES } di_proto;

typedef struct di_api_error {
    int http_status;            /* 400 for request errors */
    char type[48];              /* "invalid_request_error", "api_error", ... */
    char param[256];            /* offending field in the protocol's notation ("" if none) */
    char code[48];              /* OpenAI error code ("" = null) */
    char message[1024];
} di_api_error;

/* The error body for `proto` (a new reference). */
json_t *di_api_error_json(const di_api_error *e, di_proto proto);

/* Converter flags. */
enum {
    DI_CONVERT_RENDER_LINE = 1 << 0  /* `deepinfer render` line: model optional,
                                        add_generation_prompt defaults to false */
};

/* Each returns DI_OK and a new conv, or DI_ERR_INVALID_ARG with *err filled (and the message
 * also in di_last_error()), or DI_ERR_NOMEM. */
di_status di_chat_request_parse(const json_t *req, unsigned flags, di_conv **out, di_api_error *err);
di_status di_responses_request_parse(const json_t *req, unsigned flags, di_conv **out, di_api_error *err);
di_status di_messages_request_parse(const json_t *req, unsigned flags, di_conv **out, di_api_error *err);
di_status di_request_parse(di_proto proto, const json_t *req, unsigned flags, di_conv **out, di_api_error *err);

/* What a response needs besides the generated output. */
typedef struct di_render_meta {
    const char *id;             /* "chatcmpl-..." / "resp_..." / "msg_..." (caller-made) */
    const char *model;
    int64_t created;            /* unix seconds */
    int64_t prompt_tokens;
    int64_t cached_tokens;      /* prompt tokens served from the prefix cache */
    const di_conv *request;     /* echoed settings (Responses), may be NULL */
    uint64_t item_seed;         /* seed of generated item ids (Responses msg_/rs_/fc_ ids) */
} di_render_meta;

/* Non-streaming response bodies. Chat takes n results (one per choice). */
json_t *di_chat_render_response(const di_render_meta *m, const di_out_result *const *results, size_t n);
json_t *di_responses_render_response(const di_render_meta *m, const di_out_result *r);
json_t *di_messages_render_response(const di_render_meta *m, const di_out_result *r);

/* Streaming: a per-response renderer turns parser events into the protocol's stream events.
 * Every call appends events to `out`, a JSON array of {"event": name-or-null, "data": object}
 * (data is the JSON payload; for Chat the final sentinel is {"event": null, "data": "[DONE]"}).
 * di_sse_format writes such an array as Server-Sent Events text. */
typedef struct di_stream di_stream;
/* include_usage: Chat's stream_options.include_usage (ignored by the other protocols, which
 * always report usage). choice: Chat choice index of this stream. */
di_stream *di_stream_create(di_proto proto, const di_render_meta *m, int include_usage, int choice);
void di_stream_free(di_stream *s);
di_status di_stream_begin(di_stream *s, json_t *out);
di_status di_stream_events(di_stream *s, const di_out_event *ev, size_t n, json_t *out);
/* Closes open blocks and emits the final events; r is the parser's finished result. */
di_status di_stream_end(di_stream *s, const di_out_result *r, json_t *out);
/* Appends the SSE text of events to *buf (malloc'd, NUL-terminated; *buf may be NULL). */
di_status di_sse_format(const json_t *events, char **buf, size_t *len);

/* Finish reason in each protocol's vocabulary. */
const char *di_chat_finish_reason(di_finish_reason r);       /* "stop", "length", "tool_calls", ... */
const char *di_messages_stop_reason(di_finish_reason r);     /* "end_turn", "max_tokens", ... */
#endif
