/* log.h - leveled logging to stderr. Level from DEEPINFER_LOG (error|warn|info|debug),
 * default warn. Library code logs; it never prints to stdout. */
#ifndef DI_CORE_LOG_H
#define DI_CORE_LOG_H

typedef enum { DI_LOG_ERROR = 0, DI_LOG_WARN = 1, DI_LOG_INFO = 2, DI_LOG_DEBUG = 3 } di_log_level;

void di_log(di_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void di_log_set_level(di_log_level level);
di_log_level di_log_get_level(void);

#define DI_LOG_E(...) di_log(DI_LOG_ERROR, __VA_ARGS__)
#define DI_LOG_W(...) di_log(DI_LOG_WARN, __VA_ARGS__)
#define DI_LOG_I(...) di_log(DI_LOG_INFO, __VA_ARGS__)
#define DI_LOG_D(...) di_log(DI_LOG_DEBUG, __VA_ARGS__)

#endif
