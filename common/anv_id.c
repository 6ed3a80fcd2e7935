/*  anv_id.c - ULID generation.

    The random part comes from getrandom(2). A mutex keeps the last (ms, random) pair so ids
    generated within the same millisecond increase by one instead of drawing fresh randomness.
*/
#include "anv_id.h"
#include "anv_time.h"

#include <pthread.h>
#include <string.h>
#include <sys/random.h>

static const char s_alphabet[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t s_last_ms = -1;
static uint8_t s_last_rand[10];

char *anv_id_new(char out[ANV_ID_SIZE])
{
    uint8_t b[16];
    pthread_mutex_lock(&s_lock);
    int64_t ms = anv_wall_ms();
    if (ms <= s_last_ms) {
        ms = s_last_ms;
        for (int i = 9; i >= 0 && ++s_last_rand[i] == 0; i--)
            ;
    } else {
        if (getrandom(s_last_rand, sizeof s_last_rand, 0) != (ssize_t)sizeof s_last_rand) {
            /* getrandom on a booted kernel does not fail for 10 bytes; mix the clock in anyway */
            int64_t ns = anv_now_ns();
            memcpy(s_last_rand, &ns, 8);
        }
        s_last_ms = ms;
    }
    for (int i = 0; i < 6; i++)
        b[i] = (uint8_t)(ms >> (40 - 8 * i));
    memcpy(b + 6, s_last_rand, 10);
    pthread_mutex_unlock(&s_lock);

    /* 128 bits -> 26 base32 digits, most significant first (the first digit holds 3 bits) */
    for (int i = 0; i < ANV_ID_LEN; i++) {
        int bit = 128 - 5 * (ANV_ID_LEN - i); /* first bit of this digit, may be negative */
        unsigned v = 0;
        for (int k = 0; k < 5; k++) {
            int pos = bit + k;
            v <<= 1;
            if (pos >= 0)
                v |= (b[pos / 8] >> (7 - pos % 8)) & 1u;
        }
        out[i] = s_alphabet[v];
    }
    out[ANV_ID_LEN] = 0;
    return out;
}

static int s_digit(char c)
{
    const char *p = c ? strchr(s_alphabet, c) : NULL;
    return p ? (int)(p - s_alphabet) : -1;
}

bool anv_id_valid(const char *s)
{
    if (!s || strlen(s) != ANV_ID_LEN)
        return false;
    for (int i = 0; i < ANV_ID_LEN; i++)
        if (s_digit(s[i]) < 0)
            return false;
    return s_digit(s[0]) <= 7;
}

int64_t anv_id_time_ms(const char *s)
{
    if (!anv_id_valid(s))
        return -1;
    /* the first 10 digits hold 50 bits: 2 zero bits then the 48-bit timestamp */
    int64_t v = 0;
    for (int i = 0; i < 10; i++)
        v = (v << 5) | s_digit(s[i]);
    return v;
}
