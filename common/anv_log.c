/*  anv_log.c - one-line logs to stderr, plain or JSON.

    The line is formatted into a stack buffer and written with one write(2), which POSIX makes
    atomic for pipes up to PIPE_BUF and which keeps lines whole in practice for files. Messages
    longer than the buffer are cut and end in "...". JSON escaping is done by hand because the
    only inputs are our own format strings and arguments (no allocation on the log path).
*/
#include "anv_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

volatile int anv_log_threshold = ANV_LOG_INFO;
static char s_component[32] = "anvil";
static bool s_json;

static const char *s_level_names[] = {"error", "warn", "info", "debug", "trace"};

void anv_log_init(const char *component)
{
    snprintf(s_component, sizeof s_component, "%s", component ? component : "anvil");
}

void anv_log_set_level(anv_log_level_t level)
{
    anv_log_threshold = (int)level;
}

void anv_log_set_json(bool on)
{
    s_json = on;
}

int anv_log_level_parse(const char *name)
{
    for (int i = 0; i < (int)(sizeof s_level_names / sizeof *s_level_names); i++)
        if (name && strcmp(name, s_level_names[i]) == 0)
            return i;
    return -1;
}

static size_t s_json_escape(char *dst, size_t cap, const char *src)
{
    size_t n = 0;
    for (; *src && n + 7 < cap; src++) {
        unsigned char c = (unsigned char)*src;
        if (c == '"' || c == '\\') {
            dst[n++] = '\\';
            dst[n++] = (char)c;
        } else if (c < 0x20) {
            n += (size_t)snprintf(dst + n, cap - n, "\\u%04x", c);
        } else {
            dst[n++] = (char)c;
        }
    }
    dst[n] = 0;
    return n;
}

void anv_log_write(anv_log_level_t level, const char *job, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m >= (int)sizeof msg)
        memcpy(msg + sizeof msg - 4, "...", 4);

    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char ts[64];
    snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (long)(tv.tv_usec / 1000));
    const char *lv = (unsigned)level < 5 ? s_level_names[level] : "?";

    char line[4608];
    int n;
    if (s_json) {
        char esc[4096];
        s_json_escape(esc, sizeof esc, msg);
        n = snprintf(line, sizeof line,
                     "{\"ts\":\"%s\",\"pid\":%d,\"component\":\"%s\",\"level\":\"%s\","
                     "\"msg\":\"%s\"",
                     ts, (int)getpid(), s_component, lv, esc);
        if (job && n < (int)sizeof line) {
            char jesc[256];
            s_json_escape(jesc, sizeof jesc, job);
            n += snprintf(line + n, sizeof line - (size_t)n, ",\"job\":\"%s\"", jesc);
        }
        if (n < (int)sizeof line - 2)
            n += snprintf(line + n, sizeof line - (size_t)n, "}\n");
    } else {
        n = snprintf(line, sizeof line, "%s %d %s %s %s%s%s\n", ts, (int)getpid(), s_component,
                     lv, msg, job ? " job=" : "", job ? job : "");
    }
    if (n > (int)sizeof line - 1) {
        n = (int)sizeof line - 1;
        line[n - 1] = '\n';
    }
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
