/* json_py.c - JSON text the way Python's json.dumps(v, ensure_ascii=False) writes it: ", " and
 * ": " separators, object keys in their order, strings escaped like Python (\" \\ \n \r \t \b \f,
 * other control characters as \u00XX with lowercase hex, everything else raw UTF-8), integers
 * as is, floats as Python's repr (shortest round-trip digits; exponent form when the decimal
 * exponent is < -4 or >= 16, e.g. 1e-05, 1e+16, 0.0001, 1.0).
 * Used where a protocol gives an object but the chat format wants JSON text (Anthropic tool_use
 * input, Responses reasoning / tool outputs given as structures), so the prompt shows the
 * arguments as the Python-based reference stacks would. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/json_py.h"
#include "recipe/proto_util.h"

static void put_string(di_strbuf *b, const char *s, size_t n) {
    sb_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (!esc) continue;
        sb_put(b, s + run, i - run);
        sb_puts(b, esc);
        run = i + 1;
    }
    sb_put(b, s + run, n - run);
    sb_put(b, "\"", 1);
}

/* Python repr of a finite double. */
static void put_real(di_strbuf *b, double x) {
    char tmp[40], digits[24], out[64];
    if (!isfinite(x)) {  /* jansson never holds these; Python would write NaN / Infinity */
        sb_puts(b, isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity");
        return;
    }
    int prec = 0;
    for (; prec < 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec, x);
        if (strtod(tmp, NULL) == x) break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    const char *p = tmp;
    int neg = 0;
    if (*p == '-') { neg = 1; p++; }
    size_t nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    digits[nd] = '\0';
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = '\0';
    int decpt = exp10 + 1;  /* value = 0.DIGITS * 10^decpt */
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (decpt >= -3 && decpt <= 16) {
        /* fixed notation (Python: -4 < exp10 < 16) */
        if (decpt <= 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -decpt; i++) out[o++] = '0';
            for (size_t i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i < decpt; i++) out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)decpt < nd)
                for (size_t i = (size_t)decpt; i < nd; i++) out[o++] = digits[i];
            else
                out[o++] = '0';
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    }
    sb_puts(b, out);
}

static void put(di_strbuf *b, const json_t *v) {
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        sb_put(b, "{", 1);
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach((json_t *)v, k, x) {
            if (!first) sb_put(b, ", ", 2);
            first = 0;
            put_string(b, k, strlen(k));
            sb_put(b, ": ", 2);
            put(b, x);
        }
        sb_put(b, "}", 1);
        break;
    }
    case JSON_ARRAY:
        sb_put(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) sb_put(b, ", ", 2);
            put(b, json_array_get(v, i));
        }
        sb_put(b, "]", 1);
        break;
    case JSON_STRING: put_string(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v));
        sb_puts(b, num);
        break;
    case JSON_REAL: put_real(b, json_real_value(v)); break;
    case JSON_TRUE: sb_puts(b, "true"); break;
    case JSON_FALSE: sb_puts(b, "false"); break;
    case JSON_NULL: sb_puts(b, "null"); break;
    }
}

char *di_json_dumps_py(const json_t *v) {
    di_strbuf b = {0};
    put(&b, v);
    sb_put(&b, "", 0);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
