/* proto_util.c - field paths, API-shaped errors and typed getters for the protocol converters
 * (see proto_util.h), and the protocol error body (di_api_error_json). */
#include "recipe/proto_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "core/status.h"

void jp_init(di_jpath *p, di_proto proto) {
    p->s[0] = '\0';
    p->len = 0;
    p->proto = proto;
}

static void jp_append(di_jpath *p, const char *fmt, const char *key, size_t i) {
    size_t room = sizeof p->s - p->len;
    int n = key ? snprintf(p->s + p->len, room, fmt, key) : snprintf(p->s + p->len, room, fmt, i);
    if (n < 0) return;
    p->len = (size_t)n >= room ? sizeof p->s - 1 : p->len + (size_t)n;
}

size_t jp_key(di_jpath *p, const char *key) {
    size_t old = p->len;
    jp_append(p, p->len ? ".%s" : "%s", key, 0);
    return old;
}

size_t jp_idx(di_jpath *p, size_t i) {
    size_t old = p->len;
    jp_append(p, p->proto == DI_PROTO_MESSAGES ? ".%zu" : "[%zu]", NULL, i);
    return old;
}

static di_status fill(di_api_error *e, const di_jpath *path, const char *code, const char *msg) {
    memset(e, 0, sizeof *e);
    e->http_status = 400;
    snprintf(e->type, sizeof e->type, "invalid_request_error");
    if (path) snprintf(e->param, sizeof e->param, "%s", path->s);
    if (code) snprintf(e->code, sizeof e->code, "%s", code);
    if (path && path->proto == DI_PROTO_MESSAGES && path->len)
        snprintf(e->message, sizeof e->message, "%s: %s", path->s, msg);
    else
        snprintf(e->message, sizeof e->message, "%s", msg);
    return di_error(DI_ERR_INVALID_ARG, "%s", e->message);
}

di_status perr_missing(di_api_error *e, const di_jpath *path) {
    char msg[512];
    if (path->proto == DI_PROTO_MESSAGES) snprintf(msg, sizeof msg, "Field required");
    else snprintf(msg, sizeof msg, "Missing required parameter: '%s'.", path->s);
    return fill(e, path, "missing_required_parameter", msg);
}

static const char *a_type(const json_t *v) {
    if (!v) return "nothing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a decimal";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown value";
}

di_status perr_type(di_api_error *e, const di_jpath *path, const char *expected, const json_t *got) {
    char msg[512];
    if (path->proto == DI_PROTO_MESSAGES)
        snprintf(msg, sizeof msg, "Input should be %s, got %s", expected, a_type(got));
    else
        snprintf(msg, sizeof msg, "Invalid type for '%s': expected %s, but got %s instead.", path->s, expected,
                 a_type(got));
    return fill(e, path, "invalid_type", msg);
}

di_status perr_value(di_api_error *e, const di_jpath *path, const char *code, const char *fmt, ...) {
    char detail[512], msg[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (path->proto == DI_PROTO_MESSAGES || !path->len) snprintf(msg, sizeof msg, "%s", detail);
    else snprintf(msg, sizeof msg, "Invalid value for '%s': %s", path->s, detail);
    return fill(e, path, code, msg);
}

di_status perr_nomem(di_api_error *e) {
    memset(e, 0, sizeof *e);
    e->http_status = 500;
    snprintf(e->type, sizeof e->type, "api_error");
    snprintf(e->message, sizeof e->message, "out of memory while reading the request");
    return di_error(DI_ERR_NOMEM, "%s", e->message);
}

json_t *di_api_error_json(const di_api_error *e, di_proto proto) {
    if (proto == DI_PROTO_MESSAGES)
        return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", e->type, "message", e->message);
    json_t *param = e->param[0] ? json_string(e->param) : json_null();
    json_t *code = e->code[0] ? json_string(e->code) : json_null();
    return json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->message, "type", e->type, "param",
                     param, "code", code);
}

/* ---- getters ---- */

static const json_t *present(const json_t *obj, const char *key) {
    const json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* perr_type for obj[key] (p is the path of obj). */
static di_status key_type_error(di_api_error *e, di_jpath *p, const char *key, const char *expected, const json_t *got) {
    size_t o = jp_key(p, key);
    di_status s = perr_type(e, p, expected, got);
    jp_pop(p, o);
    return s;
}

di_status jopt_string(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, const char **out) {
    const json_t *v = present(obj, key);
    if (!v) return DI_OK;
    if (!json_is_string(v)) return key_type_error(e, p, key, "a string", v);
    *out = json_string_value(v);
    return DI_OK;
}

di_status jreq_string(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, const char **out) {
    if (!present(obj, key)) {
        size_t o = jp_key(p, key);
        di_status s = perr_missing(e, p);
        jp_pop(p, o);
        return s;
    }
    return jopt_string(obj, key, p, e, out);
}

di_status jopt_bool(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, int *out) {
    const json_t *v = present(obj, key);
    if (!v) return DI_OK;
    if (!json_is_boolean(v)) return key_type_error(e, p, key, "a boolean", v);
    *out = json_is_true(v);
    return DI_OK;
}

static void fmt_num(char *b, size_t n, double x) {
    if (x == floor(x) && fabs(x) < 1e15) snprintf(b, n, "%.0f", x);
    else snprintf(b, n, "%g", x);
}

di_status jopt_number(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, double lo,
                      double hi, double *out) {
    const json_t *v = present(obj, key);
    if (!v) return DI_OK;
    size_t o = jp_key(p, key);
    di_status s = DI_OK;
    char a[32], b[32];
    if (!json_is_number(v)) {
        s = perr_type(e, p, "a number", v);
    } else {
        double x = json_number_value(v);
        fmt_num(b, sizeof b, x);
        if (x < lo) {
            fmt_num(a, sizeof a, lo);
            s = perr_value(e, p, "decimal_below_min_value", "Expected a value >= %s, but got %s instead.", a, b);
        } else if (x > hi) {
            fmt_num(a, sizeof a, hi);
            s = perr_value(e, p, "decimal_above_max_value", "Expected a value <= %s, but got %s instead.", a, b);
        } else {
            *out = x;
        }
    }
    jp_pop(p, o);
    return s;
}

di_status jopt_int(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, int64_t lo, int64_t hi,
                   int64_t *out) {
    const json_t *v = present(obj, key);
    if (!v) return DI_OK;
    size_t o = jp_key(p, key);
    di_status s = DI_OK;
    if (!json_is_integer(v)) {
        s = perr_type(e, p, "an integer", v);
    } else {
        int64_t x = (int64_t)json_integer_value(v);
        if (x < lo)
            s = perr_value(e, p, "integer_below_min_value", "Expected a value >= %lld, but got %lld instead.",
                           (long long)lo, (long long)x);
        else if (x > hi)
            s = perr_value(e, p, "integer_above_max_value", "Expected a value <= %lld, but got %lld instead.",
                           (long long)hi, (long long)x);
        else
            *out = x;
    }
    jp_pop(p, o);
    return s;
}

di_status jopt_object(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, const json_t **out) {
    const json_t *v = present(obj, key);
    *out = NULL;
    if (!v) return DI_OK;
    if (!json_is_object(v)) return key_type_error(e, p, key, "an object", v);
    *out = v;
    return DI_OK;
}

di_status jopt_array(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, const json_t **out) {
    const json_t *v = present(obj, key);
    *out = NULL;
    if (!v) return DI_OK;
    if (!json_is_array(v)) return key_type_error(e, p, key, "an array", v);
    *out = v;
    return DI_OK;
}

static di_status add_stop(di_request_params *pr, const char *s, di_api_error *e) {
    char **ns = realloc(pr->stop, (pr->n_stop + 1) * sizeof *ns);
    if (!ns) return perr_nomem(e);
    pr->stop = ns;
    if (!(ns[pr->n_stop] = strdup(s))) return perr_nomem(e);
    pr->n_stop++;
    return DI_OK;
}

di_status jopt_stop(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, size_t max,
                    di_request_params *params) {
    const json_t *v = present(obj, key);
    if (!v) return DI_OK;
    size_t o = jp_key(p, key);
    di_status s = DI_OK;
    if (json_is_string(v)) {
        if (!json_string_length(v)) s = perr_value(e, p, "invalid_value", "stop strings must not be empty.");
        else s = add_stop(params, json_string_value(v), e);
    } else if (json_is_array(v)) {
        if (json_array_size(v) > max)
            s = perr_value(e, p, "array_above_max_length", "Expected an array with maximum length %zu, but got an "
                           "array with length %zu instead.", max, json_array_size(v));
        for (size_t i = 0; s == DI_OK && i < json_array_size(v); i++) {
            const json_t *x = json_array_get(v, i);
            size_t o2 = jp_idx(p, i);
            if (!json_is_string(x)) s = perr_type(e, p, "a string", x);
            else if (!json_string_length(x)) s = perr_value(e, p, "invalid_value", "stop strings must not be empty.");
            else s = add_stop(params, json_string_value(x), e);
            jp_pop(p, o2);
        }
    } else {
        s = perr_type(e, p, "a string or an array of strings", v);
    }
    jp_pop(p, o);
    return s;
}

di_status jopt_seed(const json_t *obj, const char *key, di_jpath *p, di_api_error *e, di_request_params *params) {
    if (!present(obj, key)) return DI_OK;
    di_status s = jopt_int(obj, key, p, e, INT64_MIN, INT64_MAX, &params->seed);
    if (s == DI_OK) params->has_seed = 1;
    return s;
}

int di_tool_name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 128) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.' || c == ':'))
            return 0;
    }
    return 1;
}

void sb_put(di_strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 128;
        while (nc < b->len + n + 1) nc *= 2;
        char *p = realloc(b->s, nc);
        if (!p) { b->oom = 1; return; }
        b->s = p;
        b->cap = nc;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void sb_puts(di_strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
