/*  anv_jsonl.c - JSONL lines with the Unicode line separators escaped (anv_jsonl.h). */
#include "anv_jsonl.h"

int anv_jsonl_write(const char *s, FILE *out)
{
    /* U+2028 and U+2029 are E2 80 A8 / A9 in UTF-8, U+0085 is C2 85; E2 and C2 are lead
       bytes, never continuations, so these byte runs are those characters wherever they are */
    const char *run = s;
    for (const char *p = s; *p; p++) {
        const unsigned char *u = (const unsigned char *)p;
        const char *esc = NULL;
        int len = 0;
        if (u[0] == 0xe2 && u[1] == 0x80 && (u[2] == 0xa8 || u[2] == 0xa9))
            esc = u[2] == 0xa8 ? "\\u2028" : "\\u2029", len = 3;
        else if (u[0] == 0xc2 && u[1] == 0x85)
            esc = "\\u0085", len = 2;
        if (!esc)
            continue;
        if (fwrite(run, 1, (size_t)(p - run), out) != (size_t)(p - run) || fputs(esc, out) < 0)
            return -1;
        p += len - 1;
        run = p + 1;
    }
    if (fputs(run, out) < 0 || fputc('\n', out) < 0)
        return -1;
    return 0;
}
