/* test_util.h - a minimal test harness: CHECK* macros count failures and print where they
 * happened; TEST_MAIN runs the listed test functions and exits non-zero on any failure.
 * Helpers locate test data relative to DI_SOURCE_DIR (set by ctest). */
#ifndef DI_TEST_UTIL_H
#define DI_TEST_UTIL_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_test_failures = 0;
static int g_test_checks = 0;

#define CHECK(cond) do { g_test_checks++; if (!(cond)) { g_test_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_MSG(cond, ...) do { g_test_checks++; if (!(cond)) { g_test_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_EQ_INT(a, b) do { long long a_ = (long long)(a), b_ = (long long)(b); g_test_checks++; \
    if (a_ != b_) { g_test_failures++; fprintf(stderr, "%s:%d: CHECK_EQ_INT failed: %s = %lld, %s = %lld\n", \
    __FILE__, __LINE__, #a, a_, #b, b_); } } while (0)
#define CHECK_EQ_STR(a, b) do { const char *a_ = (a), *b_ = (b); g_test_checks++; \
    if (!a_ || !b_ || strcmp(a_, b_) != 0) { g_test_failures++; fprintf(stderr, \
    "%s:%d: CHECK_EQ_STR failed:\n  %s = \"%s\"\n  %s = \"%s\"\n", __FILE__, __LINE__, #a, a_ ? a_ : "(null)", \
    #b, b_ ? b_ : "(null)"); } } while (0)
#define CHECK_NEAR(a, b, tol) do { double a_ = (a), b_ = (b); g_test_checks++; \
    if (!(fabs(a_ - b_) <= (tol))) { g_test_failures++; fprintf(stderr, \
    "%s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g, tol %.3g\n", __FILE__, __LINE__, #a, a_, #b, b_, (double)(tol)); } } while (0)
/* A di_status call that must succeed; prints di_last_error() otherwise. */
#define CHECK_OK(expr) do { di_status s_ = (expr); g_test_checks++; if (s_ != DI_OK) { g_test_failures++; \
    fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, di_last_error()); } } while (0)

typedef void (*test_fn)(void);
#define RUN(fn) do { fprintf(stderr, "-- %s\n", #fn); fn(); } while (0)
#define TEST_MAIN(...) int main(void) { test_fn fns_[] = {__VA_ARGS__}; \
    for (size_t i_ = 0; i_ < sizeof fns_ / sizeof fns_[0]; i_++) fns_[i_](); \
    fprintf(stderr, "%d checks, %d failures\n", g_test_checks, g_test_failures); \
    return g_test_failures ? 1 : (g_test_checks ? 0 : 1); }

/* Path under the source tree (DI_SOURCE_DIR, else "."); returns a static buffer. */
static inline const char *test_src_path(const char *rel) {
    static char buf[4][4096];
    static int k = 0;
    const char *root = getenv("DI_SOURCE_DIR");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", root ? root : ".", rel);
    return b;
}
/* xorshift64: the tests' reproducible stream of pseudo-random numbers (*s != 0) */
static inline unsigned long long test_xorshift(unsigned long long *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
#endif
