/* proto_util.h - internal helpers of the protocol converters: field paths in each API's
 * notation, API-shaped validation errors, typed field getters, the Python-style JSON
 * serialisation used when a protocol hands us an object where the chat format wants JSON text,
 * and the request pieces two or more converters read alike (proto_shared.c).
 * Not part of the recipe API; included only by src/recipe/proto_*.c and render_*.c. */
#ifndef DI_RECIPE_PROTO_UTIL_H
#define DI_RECIPE_PROTO_UTIL_H
#include <jansson.h>
#include <stddef.h>

#include "recipe/json_py.h"
#include "recipe/proto.h"

/* A field path: OpenAI style "messages[2].content", Anthropic style "messages.2.content". */
typedef struct di_jpath {
    char s[256];
    size_t len;
    di_proto proto;
} di_jpath;

void jp_init(di_jpath *p, di_proto proto);
/* Push a key / an index; return the previous length for jp_pop. */
size_t jp_key(di_jpath *p, const char *key);
size_t jp_idx(di_jpath *p, size_t i);
static inline void jp_pop(di_jpath *p, size_t len) { p->len = len; p->s[len] = '\0'; }

/* Errors. Each fills *e (http 400, invalid_request_error), records di_error and returns
 * DI_ERR_INVALID_ARG. `path` is the offending field. */
di_status perr_missing(di_api_error *e, const di_jpath *path);
di_status perr_type(di_api_error *e, const di_jpath *path, const char *expected, const json_t *got);
di_status perr_value(di_api_error *e, const di_jpath *path, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
di_status perr_nomem(di_api_error *e);

/* Typed getters on obj[key]. Optional ones leave *out unchanged when the key is absent or null.
 * `p` is the path of obj; the key is appended for messages. */
di_status jopt_string(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, const char **out);
di_status jreq_string(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, const char **out);
di_status jopt_bool(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, int *out);
di_status jopt_number(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, double lo,
                      double hi, double *out);
di_status jopt_int(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, int64_t lo,
                   int64_t hi, int64_t *out);
/* obj[key] when it is an object / array (absent or null -> NULL; other types -> error). */
di_status jopt_object(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, const json_t **out);
di_status jopt_array(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, const json_t **out);
/* A stop field: a string or an array of at most max strings; appended to params->stop. */
di_status jopt_stop(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, size_t max,
                    di_request_params *params);

/* "seed": any 64-bit integer; sets params->seed and has_seed when present. */
di_status jopt_seed(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, di_request_params *params);

/* Tool names must be 1-128 characters of [A-Za-z0-9_.:-] (they are written into the prompt and
 * parsed back from the model's output). */
int di_tool_name_ok(const char *name);

/* ---- request pieces shared by two or more converters (proto_shared.c) ----
 * Where the protocols word an error differently, the wording follows p->proto. */

/* A converter's body: fills c from req (the caller frees c on error). */
typedef di_status (*di_proto_parse_fn)(di_conv *c, const json_t *req, unsigned flags, di_api_error *e);
/* di_*_request_parse: a new conv filled by parse, or NULL and the error. */
di_status di_proto_parse_request(di_proto_parse_fn parse, const json_t *req, unsigned flags, di_conv **out,
                                 di_api_error *e);
/* "model": required, except on `deepinfer render` lines (DI_CONVERT_RENDER_LINE). */
di_status di_proto_model(di_conv *c, const json_t *req, unsigned flags, di_jpath *p, di_api_error *e);

/* "messages": a required, non-empty array; `message` reads each element into c. */
typedef di_status (*di_proto_message_fn)(di_conv *c, const json_t *m, di_jpath *p, di_api_error *e);
di_status di_proto_messages(di_conv *c, const json_t *req, di_proto_message_fn message, di_jpath *p,
                            di_api_error *e);

/* Text of one content part / block (borrowed from the JSON); ctx is the converter's. */
typedef di_status (*di_proto_part_text_fn)(const json_t *part, const void *ctx, di_jpath *p, di_api_error *e,
                                           const char **text);
/* A text field given as a string or as an array of parts whose texts are joined with "\n"
 * (*out malloc'd; NULL on error). `expected` names the accepted types in the type error. */
di_status di_proto_joined_text(const json_t *v, const char *expected, di_proto_part_text_fn part, const void *ctx,
                               di_jpath *p, di_api_error *e, char **out);
/* Appends a `role` message that takes ownership of text (freed if the append fails); *out
 * (may be NULL) is the new message. */
di_status di_proto_add_message(di_conv *c, di_role role, char *text, di_api_error *e, di_message **out);

/* obj["name"] of a tool definition: required, and a valid tool name. */
di_status di_proto_tool_name(const json_t *obj, di_jpath *p, di_api_error *e, const char **name);
/* OpenAI req["tools"] (optional): function tools, {"type": "function", "function": {name,
 * description, parameters, strict}} in Chat Completions, flat {"type": "function", name, ...}
 * in Responses (where strict defaults to true). */
di_status di_proto_openai_tools(di_conv *c, const json_t *req, di_jpath *p, di_api_error *e);
/* The tool choice naming `name`, which must be one of c's tools (p is the choice's path). */
di_status di_proto_named_tool_choice(di_conv *c, const char *name, di_jpath *p, di_api_error *e);
/* OpenAI "tool_choice": "none" | "auto" | "required" | a named function ({"type": "function",
 * "function": {"name"}} in Chat Completions, {"type": "function", "name"} in Responses).
 * Absent: Chat Completions "auto" with tools and "none" without; Responses always "auto" (the
 * API echoes it even without tools). Any choice but "none" needs tools. */
di_status di_proto_openai_tool_choice(di_conv *c, const json_t *req, di_jpath *p, di_api_error *e);
/* OpenAI structured output, fmt = Chat Completions' response_format or Responses' text.format
 * (p is its path): {"type": "text" | "json_object" | "json_schema"}; the json_schema name,
 * schema and strict sit in fmt.json_schema (Chat Completions; schema optional) or in fmt
 * itself (Responses; schema required). */
di_status di_proto_openai_response_format(di_conv *c, const json_t *fmt, di_jpath *p, di_api_error *e);
/* OpenAI reasoning effort obj[key] ("none" ... "xhigh"): kept as sent, and thinking on unless "none". */
di_status di_proto_reasoning_effort(di_conv *c, const json_t *obj, const char *key, di_jpath *p, di_api_error *e);


/* Growable text buffer used by the renderers. */
typedef struct di_strbuf { char *s; size_t len, cap; int oom; } di_strbuf;
void sb_put(di_strbuf *b, const char *s, size_t n);
void sb_puts(di_strbuf *b, const char *s);
#endif
