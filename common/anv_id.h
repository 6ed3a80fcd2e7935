/*  anv_id.h - time-sortable unique ids.

    ULID layout: 48 bits of Unix milliseconds then 80 random bits, in Crockford base32, 26
    characters. Ids made later sort later as strings; within one millisecond of one process
    the random part is incremented, so ids stay strictly increasing. Thread-safe.
*/
#ifndef ANV_ID_H
#define ANV_ID_H

#include <stdbool.h>
#include <stdint.h>

#define ANV_ID_LEN 26
#define ANV_ID_SIZE (ANV_ID_LEN + 1)

/* Writes a new id and its terminating NUL into `out`. Returns out. */
char *anv_id_new(char out[ANV_ID_SIZE]);
/* True when `s` has the shape of an id (26 Crockford base32 characters). */
bool anv_id_valid(const char *s);
/* Unix milliseconds encoded in a valid id; -1 if `s` is not one. */
int64_t anv_id_time_ms(const char *s);

#endif
