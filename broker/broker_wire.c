/*  broker_wire.c - protobuf wire format by hand for GenUnit envelopes.

    Field numbers come from proto/anvil.proto (Envelope.version = 1, Envelope.gen_unit = 47;
    GenUnit 1..10; Task.index = 2). The size is computed first so the message is written in
    one pass into one buffer. The field walk used to look for a task's own sampling checks
    every length against the buffer, so a damaged stored task is reported, never overread.
*/
#include "broker_wire.h"
#include "anv_msg.h"

#include <stdlib.h>
#include <string.h>

enum { S_VARINT = 0, S_I64 = 1, S_LEN = 2, S_I32 = 5 };

static size_t s_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *s_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static uint8_t *s_tag(uint8_t *p, uint32_t field, int type)
{
    return s_varint(p, ((uint64_t)field << 3) | (uint64_t)type);
}

static size_t s_tag_len(uint32_t field)
{
    return s_varint_len((uint64_t)field << 3);
}

/* reads a varint at *p (< end); false when it runs past end or is longer than 10 bytes */
static bool s_read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*p >= end)
            return false;
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

int broker_wire_has_field(const uint8_t *p, size_t n, uint32_t field)
{
    const uint8_t *end = p + n;
    int found = 0;
    while (p < end) {
        uint64_t key, v;
        if (!s_read_varint(&p, end, &key) || (key >> 3) == 0)
            return -1;
        if ((key >> 3) == field)
            found = 1;
        switch ((int)(key & 7)) {
        case S_VARINT:
            if (!s_read_varint(&p, end, &v))
                return -1;
            break;
        case S_I64:
            if ((size_t)(end - p) < 8)
                return -1;
            p += 8;
            break;
        case S_LEN:
            if (!s_read_varint(&p, end, &v) || v > (uint64_t)(end - p))
                return -1;
            p += v;
            break;
        case S_I32:
            if ((size_t)(end - p) < 4)
                return -1;
            p += 4;
            break;
        default: /* groups (3, 4) are not used by anvil.proto */
            return -1;
        }
    }
    return found;
}

static size_t s_str_len(uint32_t field, size_t len)
{
    return s_tag_len(field) + s_varint_len(len) + len;
}

static uint8_t *s_bytes(uint8_t *p, uint32_t field, const void *b, size_t len)
{
    p = s_tag(p, field, S_LEN);
    p = s_varint(p, len);
    if (len)
        memcpy(p, b, len);
    return p + len;
}

static uint8_t *s_uint(uint8_t *p, uint32_t field, uint64_t v)
{
    return s_varint(s_tag(p, field, S_VARINT), v);
}

static size_t s_uint_len(uint32_t field, uint64_t v)
{
    return s_tag_len(field) + s_varint_len(v);
}

uint8_t *broker_wire_gen_unit(const broker_wire_gen_t *u, size_t *len)
{
    const char *lease = u->lease_id ? u->lease_id : "", *job = u->job_id ? u->job_id : "";
    size_t ll = strlen(lease), jl = strlen(job);
    size_t task_body = u->task_len + s_uint_len(2, u->task_index); /* Task + index */
    size_t body = s_str_len(1, ll) + s_str_len(2, jl) + s_str_len(3, task_body);
    if (u->sampling)
        body += s_str_len(4, u->sampling_len);
    for (size_t i = 0; i < u->n_samples; i++)
        body += s_uint_len(5, u->samples[i]);
    body += s_uint_len(6, u->base_seed) + s_uint_len(7, u->attempt) +
            s_uint_len(8, u->lease_ms) + s_uint_len(9, u->chat ? 1 : 0);
    if (u->has_max_weight_lag)
        body += s_uint_len(10, u->max_weight_lag);
    size_t total = s_uint_len(1, ANVIL_PROTOCOL_VERSION) + s_str_len(47, body);
    uint8_t *buf = malloc(total), *p = buf;
    if (!buf)
        return NULL;
    p = s_uint(p, 1, ANVIL_PROTOCOL_VERSION);
    p = s_tag(p, 47, S_LEN);
    p = s_varint(p, body);
    p = s_bytes(p, 1, lease, ll);
    p = s_bytes(p, 2, job, jl);
    p = s_tag(p, 3, S_LEN);
    p = s_varint(p, task_body);
    if (u->task_len)
        memcpy(p, u->task, u->task_len);
    p += u->task_len;
    p = s_uint(p, 2, u->task_index);
    if (u->sampling)
        p = s_bytes(p, 4, u->sampling, u->sampling_len);
    for (size_t i = 0; i < u->n_samples; i++)
        p = s_uint(p, 5, u->samples[i]);
    p = s_uint(p, 6, u->base_seed);
    p = s_uint(p, 7, u->attempt);
    p = s_uint(p, 8, u->lease_ms);
    p = s_uint(p, 9, u->chat ? 1 : 0);
    if (u->has_max_weight_lag)
        p = s_uint(p, 10, u->max_weight_lag);
    *len = (size_t)(p - buf);
    return buf;
}
