/*  exec_extract.h - the candidate code inside a model completion.

    Rule: drop everything up to the last `</think>` (a completion with `<think>` and no
    `</think>` never finished reasoning and has no answer), then take the last fenced block
    whose info string is python, py or python3 (``` or ~~~ fences, fence of 3+ characters,
    closed by the same fence). No block, an unterminated block or an empty one is a format
    error with its reason.
*/
#ifndef EXEC_EXTRACT_H
#define EXEC_EXTRACT_H

#include <stddef.h>

/* Returns the code (caller frees) or NULL with the reason in err. */
char *exec_extract_code(const char *completion, char *err, size_t errlen);

#endif
