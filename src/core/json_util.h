/* json_util.h - typed access to jansson values with errors that name the file and field.
 *
 * Every getter takes `where` (e.g. "model/config.json") used as the message prefix:
 *   "model/config.json: field 'hidden_size': expected a positive integer, got string".
 * Optional getters leave *out untouched when the key is absent or null. */
#ifndef DI_CORE_JSON_UTIL_H
#define DI_CORE_JSON_UTIL_H
#include <jansson.h>
#include <stdint.h>
#include "deepinfer.h"

/* Parses a file / buffer; on failure the message has the line and column. */
di_status di_json_load_file(const char *path, json_t **out);
di_status di_json_loadb(const char *buf, size_t len, const char *where, json_t **out);

/* Name of a json type for messages ("string", "integer", ...). */
const char *di_json_type_name(const json_t *v);

/* Required fields (absent or null -> error). */
di_status di_json_req_int(const json_t *obj, const char *key, const char *where, int64_t *out);
di_status di_json_req_double(const json_t *obj, const char *key, const char *where, double *out);
di_status di_json_req_string(const json_t *obj, const char *key, const char *where, const char **out);
/* Optional fields: absent or null leaves *out unchanged. A present value of the wrong type is
 * an error. Integers are accepted where doubles are expected. */
di_status di_json_opt_int(const json_t *obj, const char *key, const char *where, int64_t *out);
di_status di_json_opt_double(const json_t *obj, const char *key, const char *where, double *out);
di_status di_json_opt_bool(const json_t *obj, const char *key, const char *where, int *out);
di_status di_json_opt_string(const json_t *obj, const char *key, const char *where, const char **out);
#endif
