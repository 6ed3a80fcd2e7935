/*  eng_util.h - the engine's small containers: a growable int32 array, a growable byte
    buffer and an open-addressing hash map from byte strings to int32.

    Plain data, one owner, no locking. Growth doubles; a failed allocation leaves the container
    as it was and returns -ENOMEM. The map copies its keys into one arena; it never deletes
    (vocabularies and merge tables are built once).
*/
#ifndef ENG_UTIL_H
#define ENG_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t *v;
    int n, cap;
} eng_ids_t;

int eng_ids_push(eng_ids_t *a, int32_t x);
int eng_ids_append(eng_ids_t *a, const int32_t *x, int n);
void eng_ids_release(eng_ids_t *a);

typedef struct {
    char *p; /* always NUL-terminated when non-NULL */
    size_t n, cap;
} eng_buf_t;

int eng_buf_append(eng_buf_t *b, const void *data, size_t n);
void eng_buf_release(eng_buf_t *b);

typedef struct eng_strmap eng_strmap_t;

eng_strmap_t *eng_strmap_new(size_t expected);
void eng_strmap_destroy(eng_strmap_t **self_p);
/* Inserts or overwrites key -> value. */
int eng_strmap_put(eng_strmap_t *self, const void *key, size_t len, int32_t value);
/* Returns true and sets *value when key is present. */
bool eng_strmap_get(const eng_strmap_t *self, const void *key, size_t len, int32_t *value);
size_t eng_strmap_count(const eng_strmap_t *self);

/* A NUL-terminated copy of s[0..n) that is valid UTF-8: each maximal invalid subpart (of an
   invalid, overlong, surrogate, out-of-range or cut sequence) becomes one U+FFFD, the rule of
   Python's errors="replace" and Rust's from_utf8_lossy, so texts compare with HF's decode. Token
   ids stay the exact record; this is for text that goes into JSON or protobuf string fields. The
   caller frees it; NULL when out of memory. */
char *eng_utf8_lossy(const char *s, size_t n);
/* The same, with the result's length in *len_out (it may hold NUL bytes: U+0000 is valid). */
char *eng_utf8_lossy_len(const char *s, size_t n, size_t *len_out);

#endif
