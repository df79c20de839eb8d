/* cli_test_util.h - helpers for tests that run programs (the deepinfer CLI at $DI_BIN, xz, ...):
 * exit statuses, capturing a command's output, and the small mkmodel checkpoint such tests run
 * the CLI on. Include after test_util.h (test_make_model uses CHECK_OK). */
#ifndef DI_CLI_TEST_UTIL_H
#define DI_CLI_TEST_UTIL_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "core/status.h"
#include "io/mkmodel.h"

/* The exit code in a system() / pclose() status; -1 when the command could not be run or did
 * not exit normally (killed by a signal). */
static inline int test_exit_status(int st) { return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1; }

/* Runs `sh -c cmd`; returns test_exit_status. */
static inline int test_run(const char *cmd) { return test_exit_status(system(cmd)); }

/* Standard output of a shell command, whole (malloc'd, NUL-terminated; *len its length when len
 * is not NULL), or NULL if it could not run or exited non-zero. */
static inline char *test_command_output(const char *cmd, size_t *len) {
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, k;
    char *buf = malloc(cap);
    while (buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (cap - n < 2) buf = realloc(buf, cap *= 2);
    }
    int rc = pclose(f);
    if (!buf || rc != 0) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

/* Writes the mkmodel checkpoint of `preset` (in the dtype it implies) with `seed` into dir. */
static inline void test_make_model(const char *preset, uint64_t seed, const char *dir) {
    di_model_config c;
    di_mk_dtype dt;
    CHECK_OK(di_mkmodel_preset(preset, &c, &dt));
    di_mkmodel_opts o = {0};
    o.seed = seed;
    o.dtype = dt;
    CHECK_OK(di_mkmodel_write(&c, &o, dir));
}
#endif
