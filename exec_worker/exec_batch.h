/*  exec_batch.h - one line of an `anvil-exec-worker --score-batch` file.

    A line is a JSON object {"kind"?, "task", "candidate", "globals"?, "static_checks"?}; task
    and candidate are paths, relative ones taken against the batch file's directory. Blank
    lines are skipped; anything else that is not such an object is an error naming the
    problem. Lines come from a user's file, so nothing here asserts on them.
*/
#ifndef EXEC_BATCH_H
#define EXEC_BATCH_H

#include <stddef.h>

typedef struct {
    char *kind;        /* NULL: the worker's --kind */
    char *task_path;   /* resolved against the batch file's directory */
    char *cand_path;
    char *globals;     /* the "globals" object as compact JSON, NULL when absent */
    int static_checks; /* -1 absent, else 0 or 1 */
} exec_batch_item_t;

/* Parses line[0, len) (a trailing newline is fine). Returns 1 with *item filled (release it
   with exec_batch_item_release), 0 for a blank line, ANV_EFORMAT with the reason in err, or
   -ENOMEM. */
int exec_batch_parse(const char *line, size_t len, const char *dir, exec_batch_item_t *item,
                     char *err, size_t errlen);
/* Frees what the item holds and zeroes it; accepts an item that was never filled. */
void exec_batch_item_release(exec_batch_item_t *item);

#endif
