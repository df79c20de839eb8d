/* status.c - thread-local error messages (see status.h). */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DI_ERROR_MAX 2048
static _Thread_local char g_msg[DI_ERROR_MAX];

di_status di_error(di_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return code;
}

di_status di_error_context(di_status code, const char *fmt, ...) {
    char prefix[DI_ERROR_MAX];
    char old[DI_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > DI_ERROR_MAX - 3) n = DI_ERROR_MAX - 3;
    memcpy(g_msg, prefix, n);
    g_msg[n] = ':';
    g_msg[n + 1] = ' ';
    size_t room = DI_ERROR_MAX - (n + 2) - 1, m = strlen(old);
    if (m > room) m = room;
    memcpy(g_msg + n + 2, old, m);
    g_msg[n + 2 + m] = '\0';
    return code;
}

void di_error_clear(void) { g_msg[0] = '\0'; }

const char *di_last_error(void) { return g_msg; }

const char *di_status_name(di_status s) {
    switch (s) {
    case DI_OK: return "ok";
    case DI_ERR_INVALID_ARG: return "invalid argument";
    case DI_ERR_IO: return "I/O error";
    case DI_ERR_FORMAT: return "malformed input";
    case DI_ERR_NOMEM: return "out of memory";
    case DI_ERR_UNSUPPORTED: return "unsupported";
    case DI_ERR_NOT_FOUND: return "not found";
    case DI_ERR_BACKEND: return "backend error";
    case DI_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

void di_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "deepinfer: internal invariant violated: %s (%s:%d)\n", expr, file, line);
    abort();
}
