/* proto_util.h - internal helpers of the protocol converters: field paths in each API's
 * notation, API-shaped validation errors, typed field getters, and the Python-style JSON
 * serialisation used when a protocol hands us an object where the chat format wants JSON text.
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

/* Tool names must be 1-128 characters of [A-Za-z0-9_.:-] (they are written into the prompt and
 * parsed back from the model's output). */
int di_tool_name_ok(const char *name);


/* Growable text buffer used by the renderers. */
typedef struct di_strbuf { char *s; size_t len, cap; int oom; } di_strbuf;
void sb_put(di_strbuf *b, const char *s, size_t n);
void sb_puts(di_strbuf *b, const char *s);
#endif
