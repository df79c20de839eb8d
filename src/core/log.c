/* log.c - leveled stderr logging (see log.h). */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_level = -1;

static int level_from_env(void) {
    const char *s = getenv("DEEPINFER_LOG");
    if (!s) return DI_LOG_WARN;
    if (!strcmp(s, "error")) return DI_LOG_ERROR;
    if (!strcmp(s, "info")) return DI_LOG_INFO;
    if (!strcmp(s, "debug")) return DI_LOG_DEBUG;
    return DI_LOG_WARN;
}

di_log_level di_log_get_level(void) {
    if (g_level < 0) g_level = level_from_env();
    return (di_log_level)g_level;
}

void di_log_set_level(di_log_level level) { g_level = (int)level; }

void di_log(di_log_level level, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    if ((int)level > (int)di_log_get_level()) return;
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "deepinfer [%s] %s\n", names[level], buf);
}
