/*  fuzz_util.h - helpers shared by the fuzz targets.

    Parsers that read a directory or a file (tokenizer.json, config.json, tensor records, JSONL
    prompt files) are fed through a private scratch directory: each input is written to a
    file there and the real loader opens it, so the fuzzed path is the one production runs.
    The directory is made once per process (in $TMPDIR, else /tmp) and removed at exit.
    Inputs that carry two files use a NUL byte as the separator (JSON text never contains one).
*/
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Logs only errors (the fuzzed code logs every refusal). Idempotent. */
void fuzz_quiet(void);
/* The scratch directory (created on first use; aborts when it cannot be). */
const char *fuzz_dir(void);
/* Writes data to <fuzz_dir>/name, or removes it when data is NULL. Aborts on I/O errors. */
void fuzz_write(const char *name, const uint8_t *data, size_t len);
/* Path of <fuzz_dir>/name in a static buffer. */
const char *fuzz_path(const char *name);
/* Splits data at its first NUL: a = data[0, alen), b = the rest (NULL when there is no NUL). */
void fuzz_split(const uint8_t *data, size_t size, size_t *alen, const uint8_t **b, size_t *blen);
/* A NUL-terminated copy (caller frees). */
char *fuzz_strndup(const uint8_t *data, size_t size);

#endif
