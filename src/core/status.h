/* status.h - error codes and the thread-local error message.
 *
 * Every fallible function returns a di_status. On failure it records a human-readable message
 * naming the file / tensor / field and what was expected, via di_error(), which returns the code
 * so callers can write `return di_error(DI_ERR_FORMAT, "%s: tensor '%s': ...", path, name);`.
 * The message lives in a thread-local buffer and is read with di_last_error().
 * di_error_context() prefixes the current message ("loading model X: " + inner message).
 * DI_ASSERT is for internal invariants only (always on); input errors never assert. */
#ifndef DI_CORE_STATUS_H
#define DI_CORE_STATUS_H

#include "deepinfer.h"  /* di_status enum lives in the public header */

#ifdef __cplusplus
extern "C" {
#endif

/* Records a formatted message for `code` and returns `code`. */
di_status di_error(di_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with a formatted context string; returns `code`. */
di_status di_error_context(di_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Clears the thread's message. */
void di_error_clear(void);

void di_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define DI_ASSERT(e) ((e) ? (void)0 : di_assert_fail(#e, __FILE__, __LINE__))

/* Propagate a non-OK status. */
#define DI_TRY(expr) do { di_status di_try_s_ = (expr); if (di_try_s_ != DI_OK) return di_try_s_; } while (0)

#ifdef __cplusplus
}
#endif
#endif
