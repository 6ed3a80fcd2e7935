/*  anv_time.c - clocks: CLOCK_MONOTONIC for durations, CLOCK_REALTIME for timestamps. */
#include "anv_time.h"

#include <errno.h>
#include <time.h>

static int64_t s_clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t anv_now_ns(void)
{
    return s_clock_ns(CLOCK_MONOTONIC);
}

int64_t anv_now_ms(void)
{
    return s_clock_ns(CLOCK_MONOTONIC) / 1000000LL;
}

double anv_now_s(void)
{
    return (double)s_clock_ns(CLOCK_MONOTONIC) / 1e9;
}

int64_t anv_wall_ms(void)
{
    return s_clock_ns(CLOCK_REALTIME) / 1000000LL;
}

void anv_sleep_ms(int64_t ms)
{
    struct timespec req = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&req, &req) != 0 && errno == EINTR)
        ;
}
