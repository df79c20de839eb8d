/* tok_json.c - a strict, allocation-free JSON scanner for the two large fields of tokenizer.json
 * (model.vocab with ~100K+ entries and model.merges). jansson needs ~200 ms for a 8 MB
 * tokenizer.json; scanning these fields directly into the tokenizer's tables takes a few ms.
 * Everything else in the file is still parsed by jansson (see tok_load.c).
 *
 * Invariants: the cursor never reads past `end`; every error names the file (`where`), the
 * byte offset from `base` and what was expected. Strings are validated as RFC 8259 requires
 * (no raw control characters, valid escapes, \u surrogate pairs, valid UTF-8). */
#include <stdio.h>
#include <string.h>

#include "core/utf8.h"
#include "tokenizer/tok_internal.h"

#define MAX_DEPTH 256

/* bytes that end the plain-ASCII fast path of a string: quote, backslash, controls, non-ASCII */
static const unsigned char g_special[256] = {
    [0 ... 0x1f] = 1, ['"'] = 1, ['\\'] = 1, [0x80 ... 0xff] = 1,
};

di_status di_tok_json_fail(const di_tok_json_cursor *c, const char *what) {
    size_t off = (size_t)(c->p - c->base);
    if (c->p >= c->end)
        return di_error(DI_ERR_FORMAT, "%s: invalid JSON at byte %zu: %s, got end of file", c->where, off, what);
    unsigned char ch = (unsigned char)*c->p;
    if (ch >= 0x20 && ch < 0x7f)
        return di_error(DI_ERR_FORMAT, "%s: invalid JSON at byte %zu: %s, got '%c'", c->where, off, what, ch);
    return di_error(DI_ERR_FORMAT, "%s: invalid JSON at byte %zu: %s, got byte 0x%02x", c->where, off, what, ch);
}

di_status di_tok_json_skip_ws(di_tok_json_cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
    return DI_OK;
}

di_status di_tok_json_expect(di_tok_json_cursor *c, char ch) {
    di_tok_json_skip_ws(c);
    if (c->p >= c->end || *c->p != ch) {
        char what[32];
        snprintf(what, sizeof what, "expected '%c'", ch);
        return di_tok_json_fail(c, what);
    }
    c->p++;
    return DI_OK;
}

static int hex4(const char *p, uint32_t *v) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        char h = p[i];
        x <<= 4;
        if (h >= '0' && h <= '9') x |= (uint32_t)(h - '0');
        else if (h >= 'a' && h <= 'f') x |= (uint32_t)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') x |= (uint32_t)(h - 'A' + 10);
        else return 0;
    }
    *v = x;
    return 1;
}

/* Scans a string starting at the opening quote, appending the decoded bytes to buf (a NUL
 * follows them but is not counted). With buf == NULL it only validates. */
static di_status scan_string(di_tok_json_cursor *c, di_tok_buf *buf) {
    if (c->p >= c->end || *c->p != '"') return di_tok_json_fail(c, "expected a string");
    c->p++;
    for (;;) {
        const char *run = c->p;
        /* fast path: plain ASCII characters */
        while (c->p < c->end && !g_special[(unsigned char)*c->p]) c->p++;
        if (buf && c->p > run) DI_TRY(di_tok_buf_put(buf, run, (size_t)(c->p - run)));
        if (c->p >= c->end) return di_tok_json_fail(c, "unterminated string");
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '"') { c->p++; break; }
        if (ch < 0x20) return di_tok_json_fail(c, "control character in string (must be escaped)");
        if (ch >= 0x80) {
            uint32_t cp;
            int n = di_tok_utf8_next((const unsigned char *)c->p, (size_t)(c->end - c->p), &cp);
            if (!n) return di_tok_json_fail(c, "invalid UTF-8 in string");
            if (buf) DI_TRY(di_tok_buf_put(buf, c->p, (size_t)n));
            c->p += n;
            continue;
        }
        /* escape */
        if (c->end - c->p < 2) return di_tok_json_fail(c, "unterminated escape");
        char e = c->p[1];
        char out;
        switch (e) {
        case '"': out = '"'; break;
        case '\\': out = '\\'; break;
        case '/': out = '/'; break;
        case 'b': out = '\b'; break;
        case 'f': out = '\f'; break;
        case 'n': out = '\n'; break;
        case 'r': out = '\r'; break;
        case 't': out = '\t'; break;
        case 'u': {
            uint32_t v;
            if (c->end - c->p < 6 || !hex4(c->p + 2, &v)) return di_tok_json_fail(c, "invalid \\u escape");
            c->p += 6;
            if (v >= 0xdc00 && v <= 0xdfff) { c->p -= 6; return di_tok_json_fail(c, "lone low surrogate in \\u escape"); }
            if (v >= 0xd800 && v <= 0xdbff) {
                uint32_t lo;
                if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' || !hex4(c->p + 2, &lo) ||
                    lo < 0xdc00 || lo > 0xdfff)
                    return di_tok_json_fail(c, "high surrogate not followed by a low surrogate \\u escape");
                c->p += 6;
                v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
            }
            if (buf) {
                char u[4];
                int n = di_utf8_encode(v, u);
                DI_TRY(di_tok_buf_put(buf, u, (size_t)n));
            }
            continue;
        }
        default: return di_tok_json_fail(c, "invalid escape in string");
        }
        if (buf) DI_TRY(di_tok_buf_put(buf, &out, 1));
        c->p += 2;
    }
    if (buf) {
        DI_TRY(di_tok_buf_reserve(buf, 1));
        buf->p[buf->n] = '\0';
    }
    return DI_OK;
}

di_status di_tok_json_string(di_tok_json_cursor *c, di_tok_buf *buf, const char **out, size_t *len) {
    di_tok_json_skip_ws(c);
    buf->n = 0;
    DI_TRY(scan_string(c, buf));
    *out = buf->p;
    *len = buf->n;
    return DI_OK;
}

di_status di_tok_json_string_ref(di_tok_json_cursor *c, di_tok_buf *buf, const char **out, size_t *len) {
    di_tok_json_skip_ws(c);
    if (c->p < c->end && *c->p == '"') {
        /* zero-copy when the string is plain ASCII without escapes (the common case) */
        const char *q = c->p + 1;
        for (;;) {
            while (q < c->end && !g_special[(unsigned char)*q]) q++;
            if (q >= c->end || (unsigned char)*q < 0x80) break;
            uint32_t cp;
            int n = di_tok_utf8_next((const unsigned char *)q, (size_t)(c->end - q), &cp);
            if (!n) break; /* invalid UTF-8: the slow path reports it */
            q += n;
        }
        if (q < c->end && *q == '"') {
            *out = c->p + 1;
            *len = (size_t)(q - c->p - 1);
            c->p = q + 1;
            return DI_OK;
        }
    }
    buf->n = 0;
    DI_TRY(scan_string(c, buf));
    *out = buf->p;
    *len = buf->n;
    return DI_OK;
}

di_status di_tok_json_string_append(di_tok_json_cursor *c, di_tok_buf *buf) {
    di_tok_json_skip_ws(c);
    return scan_string(c, buf);
}

static di_status skip_number(di_tok_json_cursor *c) {
    const char *p = c->p;
    if (p < c->end && *p == '-') p++;
    if (p >= c->end) { c->p = p; return di_tok_json_fail(c, "expected a digit"); }
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') { while (p < c->end && *p >= '0' && *p <= '9') p++; }
    else { c->p = p; return di_tok_json_fail(c, "expected a digit"); }
    if (p < c->end && *p == '.') {
        p++;
        if (p >= c->end || *p < '0' || *p > '9') { c->p = p; return di_tok_json_fail(c, "expected a digit after '.'"); }
        while (p < c->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < c->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < c->end && (*p == '+' || *p == '-')) p++;
        if (p >= c->end || *p < '0' || *p > '9') { c->p = p; return di_tok_json_fail(c, "expected an exponent digit"); }
        while (p < c->end && *p >= '0' && *p <= '9') p++;
    }
    c->p = p;
    return DI_OK;
}

static di_status skip_value_depth(di_tok_json_cursor *c, int depth) {
    if (depth > MAX_DEPTH) return di_tok_json_fail(c, "nesting deeper than 256 levels");
    di_tok_json_skip_ws(c);
    if (c->p >= c->end) return di_tok_json_fail(c, "expected a value");
    char ch = *c->p;
    if (ch == '"') return scan_string(c, NULL);
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        c->p++;
        di_tok_json_skip_ws(c);
        if (c->p < c->end && *c->p == close) { c->p++; return DI_OK; }
        for (;;) {
            if (ch == '{') {
                di_tok_json_skip_ws(c);
                DI_TRY(scan_string(c, NULL));
                DI_TRY(di_tok_json_expect(c, ':'));
            }
            DI_TRY(skip_value_depth(c, depth + 1));
            di_tok_json_skip_ws(c);
            if (c->p < c->end && *c->p == ',') { c->p++; continue; }
            if (c->p < c->end && *c->p == close) { c->p++; return DI_OK; }
            return di_tok_json_fail(c, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    if (ch == '-' || (ch >= '0' && ch <= '9')) return skip_number(c);
    static const char *const lits[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(lits[i]);
        if ((size_t)(c->end - c->p) >= n && memcmp(c->p, lits[i], n) == 0) { c->p += n; return DI_OK; }
    }
    return di_tok_json_fail(c, "expected a value");
}

di_status di_tok_json_skip_value(di_tok_json_cursor *c) { return skip_value_depth(c, 0); }
