/* conv.h - the conversation model every protocol converts into and every chat encoder reads.
 *
 * A di_conv is one request's conversation: messages (system / user / assistant / tool), the tool
 * definitions offered to the model, the request options that change the prompt or decoding
 * (thinking, tool_choice, response_format) and the sampling fields (di_request_params).
 *
 * Ownership: the conv owns every string and JSON value reachable from it; di_conv_free releases
 * all of it. Strings are NUL-terminated UTF-8 (converters reject invalid UTF-8) and may contain
 * any text, including spellings of special tokens: encoders must treat them as plain text.
 *
 * Invariants:
 *   - msg->content == NULL means "null content" (an assistant turn that only calls tools);
 *     "" is an empty string, which chat templates render differently from null.
 *   - msg->has_tool_calls_field is 1 when the source message carried a tool-call list (even an
 *     empty one); templates distinguish "no tool_calls key" from "tool_calls: []".
 *   - tool calls' arguments are JSON text exactly as supplied (Chat Completions passes a string)
 *     or as serialised by di_json_dumps_py when the protocol supplied an object (Anthropic). */
#ifndef DI_RECIPE_CONV_H
#define DI_RECIPE_CONV_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "deepinfer.h"

typedef enum di_role {
    DI_ROLE_SYSTEM = 0,
    DI_ROLE_USER,
    DI_ROLE_ASSISTANT,
    DI_ROLE_TOOL
} di_role;

typedef struct di_tool_call {
    char *id;         /* call id (may be NULL if the client sent none) */
    char *type;       /* "function" */
    char *name;
    char *arguments;  /* JSON text */
} di_tool_call;

typedef struct di_message {
    di_role role;
    char *content;          /* NULL = null content */
    char *reasoning;        /* reasoning / thinking text of an assistant turn, or NULL */
    char *name;             /* optional participant name, or NULL */
    char *tool_call_id;     /* tool turns: the call this output answers */
    di_tool_call *tool_calls;
    size_t n_tool_calls;
    int has_tool_calls_field;
    int prefix;             /* assistant prefix completion (DeepSeek "prefix": true) */
    int is_error;           /* tool result reported as an error (Anthropic is_error) */
} di_message;

typedef struct di_tool {
    char *name;
    char *description;      /* or NULL */
    json_t *parameters;     /* JSON Schema (owned reference) or NULL */
    int strict;
} di_tool;

typedef enum di_tool_choice_mode {
    DI_TOOL_CHOICE_AUTO = 0,
    DI_TOOL_CHOICE_NONE,
    DI_TOOL_CHOICE_REQUIRED,   /* OpenAI "required", Anthropic "any" */
    DI_TOOL_CHOICE_NAMED       /* a specific function */
} di_tool_choice_mode;

typedef enum di_response_format_type {
    DI_RESPONSE_FORMAT_TEXT = 0,
    DI_RESPONSE_FORMAT_JSON_OBJECT,
    DI_RESPONSE_FORMAT_JSON_SCHEMA
} di_response_format_type;

typedef enum di_thinking {
    DI_THINKING_DEFAULT = -1,  /* the format's default (V3.1: off; R1: always on) */
    DI_THINKING_OFF = 0,
    DI_THINKING_ON = 1
} di_thinking;

/* Request options that change the prompt or what decoding must enforce. */
typedef struct di_conv_options {
    di_thinking thinking;
    char *reasoning_effort;          /* as sent ("low", "medium", "high", ...) or NULL */
    int64_t thinking_budget;         /* Anthropic budget_tokens, -1 if none */
    di_tool_choice_mode tool_choice;
    char *tool_choice_name;          /* DI_TOOL_CHOICE_NAMED */
    int parallel_tool_calls;         /* default 1 */
    di_response_format_type response_format;
    char *response_format_name;      /* json_schema name, or NULL */
    json_t *response_schema;         /* json_schema schema (owned reference), or NULL */
    int response_format_strict;
    int add_generation_prompt;       /* default 1 for API requests */
    int continue_final_message;      /* continue the last assistant message (prefill): render it
                                        without its end-of-sentence and no generation prompt */
} di_conv_options;

/* Sampling and decoding fields of a request, in one plain struct for the engine.
 * Unset values: doubles are NAN, integers -1 (seed: has_seed = 0). */
typedef struct di_request_params {
    int64_t max_tokens;          /* max_tokens / max_completion_tokens / max_output_tokens */
    double temperature;
    double top_p;
    int64_t top_k;
    double min_p;
    double presence_penalty;
    double frequency_penalty;
    double repetition_penalty;
    char **stop;                 /* stop strings (owned) */
    size_t n_stop;
    int has_seed;
    int64_t seed;
    int64_t n;                   /* number of choices, default 1 */
    int logprobs;                /* 0/1 */
    int64_t top_logprobs;        /* -1 = unset */
    int stream;                  /* 0/1 */
    int stream_include_usage;    /* Chat Completions stream_options.include_usage */
    int ignore_eos;              /* extension */
} di_request_params;

typedef struct di_conv {
    di_message *msgs;
    size_t n_msgs, cap_msgs;
    di_tool *tools;
    size_t n_tools, cap_tools;
    di_conv_options opt;
    di_request_params params;
    char *model;                 /* requested model name, or NULL */
    char *user;                  /* end-user id, or NULL */
} di_conv;

di_conv *di_conv_create(void);
void di_conv_free(di_conv *c);

/* Appends a zeroed message of `role`; returns it (NULL on out-of-memory). The pointer stays
 * valid only until the next append. */
di_message *di_conv_add_message(di_conv *c, di_role role);
/* Appends a tool call to m (strings copied; any may be NULL except name/arguments). */
di_status di_message_add_tool_call(di_message *m, const char *id, const char *type, const char *name,
                                   const char *arguments);
/* Appends a tool definition (strings copied, parameters reference taken with json_incref). */
di_status di_conv_add_tool(di_conv *c, const char *name, const char *description, json_t *parameters,
                           int strict);
/* Sets *dst to a copy of src (or NULL); frees the old value. */
di_status di_conv_set_str(char **dst, const char *src);
/* Appends src[0..len) to the malloc'd string *dst (NULL = empty), inserting sep first when
 * *dst is non-NULL and sep is non-NULL. */
di_status di_conv_append_str(char **dst, const char *sep, const char *src, size_t len);

/* Defaults: every double NAN, integers -1, n = 1. */
void di_request_params_init(di_request_params *p);
void di_request_params_clear(di_request_params *p);

const char *di_role_name(di_role r);

/* Deterministic ids: prefix + 24 base62 characters derived from (seed, counter).
 * out must hold strlen(prefix) + 25 bytes. */
void di_recipe_make_id(char *out, size_t out_size, const char *prefix, uint64_t seed, uint64_t counter);
#endif
