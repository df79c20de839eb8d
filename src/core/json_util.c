/* json_util.c - see json_util.h. */
#include "core/json_util.h"
#include "core/status.h"

di_status di_json_load_file(const char *path, json_t **out) {
    json_error_t e;
    *out = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (!*out) {
        if (e.line < 0 || e.position == 0)
            return di_error(DI_ERR_IO, "%s: %s", path, e.text);
        return di_error(DI_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", path, e.line, e.column, e.text);
    }
    return DI_OK;
}

di_status di_json_loadb(const char *buf, size_t len, const char *where, json_t **out) {
    json_error_t e;
    *out = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &e);
    if (!*out)
        return di_error(DI_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", where, e.line, e.column, e.text);
    return DI_OK;
}

const char *di_json_type_name(const json_t *v) {
    if (!v) return "nothing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "unknown";
}

static const json_t *field(const json_t *obj, const char *key) {
    if (!obj || !json_is_object(obj)) return NULL;
    const json_t *v = json_object_get(obj, key);
    return (v && !json_is_null(v)) ? v : NULL;
}

static di_status as_int(const json_t *v, const char *key, const char *where, int64_t *out) {
    if (json_is_integer(v)) { *out = (int64_t)json_integer_value(v); return DI_OK; }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        /* range check first: converting an out-of-range double to int64 is undefined */
        if (d >= -9.2233720368547758e18 && d < 9.2233720368547758e18 && d == (double)(int64_t)d) {
            *out = (int64_t)d;
            return DI_OK;
        }
    }
    return di_error(DI_ERR_FORMAT, "%s: field '%s': expected an integer, got %s", where, key, di_json_type_name(v));
}

static di_status as_double(const json_t *v, const char *key, const char *where, double *out) {
    if (json_is_number(v)) { *out = json_number_value(v); return DI_OK; }
    return di_error(DI_ERR_FORMAT, "%s: field '%s': expected a number, got %s", where, key, di_json_type_name(v));
}

di_status di_json_req_int(const json_t *obj, const char *key, const char *where, int64_t *out) {
    const json_t *v = field(obj, key);
    if (!v) return di_error(DI_ERR_FORMAT, "%s: missing required field '%s' (an integer)", where, key);
    return as_int(v, key, where, out);
}

di_status di_json_req_double(const json_t *obj, const char *key, const char *where, double *out) {
    const json_t *v = field(obj, key);
    if (!v) return di_error(DI_ERR_FORMAT, "%s: missing required field '%s' (a number)", where, key);
    return as_double(v, key, where, out);
}

di_status di_json_req_string(const json_t *obj, const char *key, const char *where, const char **out) {
    const json_t *v = field(obj, key);
    if (!v) return di_error(DI_ERR_FORMAT, "%s: missing required field '%s' (a string)", where, key);
    if (!json_is_string(v))
        return di_error(DI_ERR_FORMAT, "%s: field '%s': expected a string, got %s", where, key, di_json_type_name(v));
    *out = json_string_value(v);
    return DI_OK;
}

di_status di_json_opt_int(const json_t *obj, const char *key, const char *where, int64_t *out) {
    const json_t *v = field(obj, key);
    return v ? as_int(v, key, where, out) : DI_OK;
}

di_status di_json_opt_double(const json_t *obj, const char *key, const char *where, double *out) {
    const json_t *v = field(obj, key);
    return v ? as_double(v, key, where, out) : DI_OK;
}

di_status di_json_opt_bool(const json_t *obj, const char *key, const char *where, int *out) {
    const json_t *v = field(obj, key);
    if (!v) return DI_OK;
    if (!json_is_boolean(v))
        return di_error(DI_ERR_FORMAT, "%s: field '%s': expected true or false, got %s", where, key, di_json_type_name(v));
    *out = json_is_true(v);
    return DI_OK;
}

di_status di_json_opt_string(const json_t *obj, const char *key, const char *where, const char **out) {
    const json_t *v = field(obj, key);
    if (!v) return DI_OK;
    if (!json_is_string(v))
        return di_error(DI_ERR_FORMAT, "%s: field '%s': expected a string, got %s", where, key, di_json_type_name(v));
    *out = json_string_value(v);
    return DI_OK;
}
