/*  eng_util.c - growable arrays and the byte-string hash map.

    The map is linear probing over a power-of-two table kept at most half full; FNV-1a hashes;
    keys live in a separate arena addressed by offset so that growing the arena does not move
    table entries.
*/
#include "eng_util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int eng_ids_push(eng_ids_t *a, int32_t x)
{
    return eng_ids_append(a, &x, 1);
}

int eng_ids_append(eng_ids_t *a, const int32_t *x, int n)
{
    if (n <= 0)
        return 0;
    if (a->n + n > a->cap) {
        int cap = a->cap ? a->cap : 16;
        while (cap < a->n + n)
            cap *= 2;
        int32_t *v = realloc(a->v, (size_t)cap * sizeof(int32_t));
        if (!v)
            return -ENOMEM;
        a->v = v;
        a->cap = cap;
    }
    memcpy(a->v + a->n, x, (size_t)n * sizeof(int32_t));
    a->n += n;
    return 0;
}

void eng_ids_release(eng_ids_t *a)
{
    free(a->v);
    memset(a, 0, sizeof(*a));
}

int eng_buf_append(eng_buf_t *b, const void *data, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void eng_buf_release(eng_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

typedef struct {
    uint64_t hash;
    size_t off; /* into arena; (size_t)-1 = empty */
    uint32_t len;
    int32_t value;
} s_slot_t;

struct eng_strmap {
    s_slot_t *slots;
    size_t mask, count;
    char *arena;
    size_t arena_n, arena_cap;
};

static uint64_t s_hash(const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static s_slot_t *s_alloc_slots(size_t n)
{
    s_slot_t *s = malloc(n * sizeof(s_slot_t));
    if (s)
        for (size_t i = 0; i < n; i++)
            s[i].off = (size_t)-1;
    return s;
}

eng_strmap_t *eng_strmap_new(size_t expected)
{
    eng_strmap_t *self = calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    size_t n = 16;
    while (n < expected * 2)
        n *= 2;
    self->slots = s_alloc_slots(n);
    if (!self->slots) {
        free(self);
        return NULL;
    }
    self->mask = n - 1;
    return self;
}

void eng_strmap_destroy(eng_strmap_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->slots);
    free((*self_p)->arena);
    free(*self_p);
    *self_p = NULL;
}

static s_slot_t *s_find(const eng_strmap_t *self, const void *key, size_t len, uint64_t h)
{
    for (size_t i = h & self->mask;; i = (i + 1) & self->mask) {
        s_slot_t *s = &self->slots[i];
        if (s->off == (size_t)-1)
            return s;
        if (s->hash == h && s->len == len && memcmp(self->arena + s->off, key, len) == 0)
            return s;
    }
}

static int s_grow(eng_strmap_t *self)
{
    size_t n = (self->mask + 1) * 2;
    s_slot_t *old = self->slots, *slots = s_alloc_slots(n);
    if (!slots)
        return -ENOMEM;
    size_t old_n = self->mask + 1;
    self->slots = slots;
    self->mask = n - 1;
    for (size_t i = 0; i < old_n; i++) {
        if (old[i].off == (size_t)-1)
            continue;
        size_t j = old[i].hash & self->mask;
        while (slots[j].off != (size_t)-1)
            j = (j + 1) & self->mask;
        slots[j] = old[i];
    }
    free(old);
    return 0;
}

int eng_strmap_put(eng_strmap_t *self, const void *key, size_t len, int32_t value)
{
    if (len > UINT32_MAX)
        return -EINVAL;
    if ((self->count + 1) * 2 > self->mask + 1 && s_grow(self))
        return -ENOMEM;
    uint64_t h = s_hash(key, len);
    s_slot_t *s = s_find(self, key, len, h);
    if (s->off != (size_t)-1) {
        s->value = value;
        return 0;
    }
    /* the arena exists before the first key goes in, even an empty one: every stored key's
       bytes are then at a valid address (arena + off), which s_find compares against */
    if (!self->arena || self->arena_n + len > self->arena_cap) {
        size_t cap = self->arena_cap ? self->arena_cap : 4096;
        while (cap < self->arena_n + len)
            cap *= 2;
        char *a = realloc(self->arena, cap);
        if (!a)
            return -ENOMEM;
        self->arena = a;
        self->arena_cap = cap;
    }
    if (len)
        memcpy(self->arena + self->arena_n, key, len);
    s->hash = h;
    s->off = self->arena_n;
    s->len = (uint32_t)len;
    s->value = value;
    self->arena_n += len;
    self->count++;
    return 0;
}

bool eng_strmap_get(const eng_strmap_t *self, const void *key, size_t len, int32_t *value)
{
    const s_slot_t *s = s_find(self, key, len, s_hash(key, len));
    if (s->off == (size_t)-1)
        return false;
    *value = s->value;
    return true;
}

size_t eng_strmap_count(const eng_strmap_t *self)
{
    return self->count;
}

char *eng_utf8_lossy(const char *str, size_t n)
{
    return eng_utf8_lossy_len(str, n, NULL);
}

char *eng_utf8_lossy_len(const char *str, size_t n, size_t *len_out)
{
    const unsigned char *s = (const unsigned char *)str;
    eng_buf_t out = {0};
    int rc = eng_buf_append(&out, "", 0);
    for (size_t i = 0; i < n && !rc;) {
        unsigned char c = s[i];
        size_t need = c < 0x80                 ? 1
                      : c >= 0xc2 && c <= 0xdf ? 2
                      : c >= 0xe0 && c <= 0xef ? 3
                      : c >= 0xf0 && c <= 0xf4 ? 4
                                               : 0;
        /* the second byte's range depends on the lead (no overlongs, surrogates, > U+10FFFF) */
        unsigned char lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
        unsigned char hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
        size_t k = 1;
        while (need > 1 && k < need && i + k < n) {
            unsigned char b = s[i + k];
            if (k == 1 ? (b < lo || b > hi) : (b & 0xc0) != 0x80)
                break;
            k++;
        }
        if (need > 0 && k == need) {
            rc = eng_buf_append(&out, str + i, need);
            i += need;
        } else {
            rc = eng_buf_append(&out, "\xef\xbf\xbd", 3);
            i += k; /* the maximal subpart: the lead and the continuation bytes it accepted */
        }
    }
    if (rc)
        eng_buf_release(&out);
    else if (len_out)
        *len_out = out.n;
    return out.p;
}
