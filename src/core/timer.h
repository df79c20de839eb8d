/* timer.h - monotonic clock helpers. */
#ifndef DI_CORE_TIMER_H
#define DI_CORE_TIMER_H
#include <stdint.h>
#include <time.h>

static inline uint64_t di_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline double di_now_s(void) { return (double)di_now_ns() * 1e-9; }
#endif
