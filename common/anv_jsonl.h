/*  anv_jsonl.h - one JSON text as one JSONL line.

    JSON allows U+2028, U+2029 and U+0085 raw inside strings, but line splitters that follow
    Unicode (Python's str.splitlines, JavaScript before ES2019) end a line at them, and
    generated text holds them; so every JSONL writer (the CLI's results and imports, the
    engine's anvil-generate) writes its lines through anv_jsonl_write, which escapes them.
*/
#ifndef ANV_JSONL_H
#define ANV_JSONL_H

#include <stdio.h>

/* Writes the JSON text s and a newline to out with U+2028, U+2029 and U+0085 escaped
   (\u2028, \u2029, \u0085). s must be JSON (outside strings those bytes cannot occur).
   Returns 0, or -1 when a write fails. */
int anv_jsonl_write(const char *s, FILE *out);

#endif
