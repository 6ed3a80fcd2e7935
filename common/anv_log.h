/*  anv_log.h - one-line logs to stderr.

    Each record is one line, written with a single write(2) so lines of concurrent threads and
    processes never interleave: `time pid component level message`, with ` job=<id>` appended
    when the record concerns a job. With JSON output on, the same fields as one JSON object.
    The macros check the level before the arguments are formatted (or even evaluated).
    anv_log_init() is called once by main(); the rest is thread-safe.
*/
#ifndef ANV_LOG_H
#define ANV_LOG_H

#include <stdbool.h>

typedef enum {
    ANV_LOG_ERROR = 0,
    ANV_LOG_WARN = 1,
    ANV_LOG_INFO = 2,
    ANV_LOG_DEBUG = 3,
    ANV_LOG_TRACE = 4,
} anv_log_level_t;

extern volatile int anv_log_threshold;

/* Sets the component name (copied, up to 31 chars) printed on every line. */
void anv_log_init(const char *component);
void anv_log_set_level(anv_log_level_t level);
void anv_log_set_json(bool on);
/* Parses "error|warn|info|debug|trace"; returns -1 when unknown. */
int anv_log_level_parse(const char *name);
/* Writes one record; `job` may be NULL. Use the macros instead. */
void anv_log_write(anv_log_level_t level, const char *job, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define ANV_LOG_AT(lvl, job, ...)                                                                  \
    do {                                                                                           \
        if ((int)(lvl) <= anv_log_threshold)                                                       \
            anv_log_write((lvl), (job), __VA_ARGS__);                                              \
    } while (0)

#define ANV_ERROR(...) ANV_LOG_AT(ANV_LOG_ERROR, NULL, __VA_ARGS__)
#define ANV_WARN(...)  ANV_LOG_AT(ANV_LOG_WARN, NULL, __VA_ARGS__)
#define ANV_INFO(...)  ANV_LOG_AT(ANV_LOG_INFO, NULL, __VA_ARGS__)
#define ANV_DEBUG(...) ANV_LOG_AT(ANV_LOG_DEBUG, NULL, __VA_ARGS__)
#define ANV_TRACE(...) ANV_LOG_AT(ANV_LOG_TRACE, NULL, __VA_ARGS__)
/* Records about one job: `job=<id>` is added to the line. */
#define ANV_JERROR(job, ...) ANV_LOG_AT(ANV_LOG_ERROR, (job), __VA_ARGS__)
#define ANV_JWARN(job, ...)  ANV_LOG_AT(ANV_LOG_WARN, (job), __VA_ARGS__)
#define ANV_JINFO(job, ...)  ANV_LOG_AT(ANV_LOG_INFO, (job), __VA_ARGS__)
#define ANV_JDEBUG(job, ...) ANV_LOG_AT(ANV_LOG_DEBUG, (job), __VA_ARGS__)

#endif
