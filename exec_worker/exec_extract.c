/*  exec_extract.c - last fenced python block after the reasoning.

    Design: a line scanner (fences are recognised only at the start of a line, up to three
    spaces of indent, as CommonMark does); the last complete python block wins.
*/
#define _GNU_SOURCE
#include "exec_extract.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *s_last(const char *hay, const char *needle)
{
    const char *last = NULL, *p = hay;
    size_t n = strlen(needle);
    while ((p = strstr(p, needle)) != NULL) {
        last = p;
        p += n;
    }
    return last;
}

/* Fence at the start of line `l` (length len): returns its length, 0 when none. */
static size_t s_fence(const char *l, size_t len, char *ch, const char **info, size_t *infolen)
{
    size_t i = 0;
    while (i < len && i < 3 && l[i] == ' ')
        i++;
    if (i >= len || (l[i] != '`' && l[i] != '~'))
        return 0;
    char c = l[i];
    size_t n = 0;
    while (i + n < len && l[i + n] == c)
        n++;
    if (n < 3)
        return 0;
    size_t j = i + n;
    while (j < len && isspace((unsigned char)l[j]))
        j++;
    size_t k = j;
    while (k < len && !isspace((unsigned char)l[k]))
        k++;
    *ch = c;
    *info = l + j;
    *infolen = k - j;
    return n;
}

static bool s_is_python(const char *info, size_t n)
{
    return (n == 6 && strncasecmp(info, "python", 6) == 0) ||
           (n == 2 && strncasecmp(info, "py", 2) == 0) ||
           (n == 7 && strncasecmp(info, "python3", 7) == 0);
}

char *exec_extract_code(const char *completion, char *err, size_t errlen)
{
    if (!completion) {
        snprintf(err, errlen, "empty completion");
        return NULL;
    }
    const char *text = completion, *end_think = s_last(completion, "</think>");
    if (end_think)
        text = end_think + strlen("</think>");
    else if (strstr(completion, "<think>")) {
        snprintf(err, errlen, "reasoning never finished: <think> without </think>");
        return NULL;
    }
    const char *best = NULL, *open_start = NULL;
    size_t best_len = 0, fence_len = 0;
    char fence_ch = 0;
    bool in_py = false, in_block = false, unterminated = false;
    for (const char *l = text; *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        char ch;
        const char *info;
        size_t infolen, f = s_fence(l, len, &ch, &info, &infolen);
        if (!in_block && f) {
            in_block = true;
            fence_ch = ch;
            fence_len = f;
            in_py = s_is_python(info, infolen);
            open_start = nl ? nl + 1 : l + len;
        } else if (in_block && f && ch == fence_ch && f >= fence_len && infolen == 0) {
            if (in_py) {
                best = open_start;
                best_len = (size_t)(l - open_start);
            }
            in_block = false;
        }
        l = nl ? nl + 1 : l + len;
    }
    if (in_block && in_py)
        unterminated = true;
    if (!best) {
        snprintf(err, errlen, unterminated ? "the last python block is not closed"
                                           : "no fenced python block in the answer");
        return NULL;
    }
    bool blank = true;
    for (size_t i = 0; i < best_len; i++)
        if (!isspace((unsigned char)best[i]))
            blank = false;
    if (blank) {
        snprintf(err, errlen, "the python block is empty");
        return NULL;
    }
    char *code = malloc(best_len + 1);
    if (!code) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    memcpy(code, best, best_len);
    code[best_len] = '\0';
    return code;
}
