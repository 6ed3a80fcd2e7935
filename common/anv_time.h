/*  anv_time.h - clocks.

    Durations and deadlines use the monotonic clock (never jumps); timestamps stored in Redis
    or shown to people use wall-clock Unix milliseconds.
*/
#ifndef ANV_TIME_H
#define ANV_TIME_H

#include <stdint.h>

/* Monotonic clock in nanoseconds, milliseconds and seconds. */
int64_t anv_now_ns(void);
int64_t anv_now_ms(void);
double anv_now_s(void);
/* Wall clock, Unix epoch milliseconds. */
int64_t anv_wall_ms(void);
/* Sleeps for `ms` milliseconds (restarts after signals). */
void anv_sleep_ms(int64_t ms);

#endif
