/*  broker_wire.h - hand-encoded GenUnit envelopes for the dispatch fast path.

    A gen unit is mostly the task as the client submitted it, which Redis holds packed. Instead
    of decoding that Task and encoding it again inside a GenUnit, the broker copies its bytes
    into the GenUnit's `task` field and appends the `index` field (protobuf keeps the last
    value of a repeated scalar field), and copies the job's sampling, packed once per job. The
    bytes are exactly what protobuf-c would accept as Envelope{version, gen_unit}; unit tests
    decode them and compare with the slow path. Tasks with their own sampling overrides take
    the slow path (the sampling must be merged). Pure functions, no state.
*/
#ifndef BROKER_WIRE_H
#define BROKER_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *lease_id, *job_id;
    const uint8_t *task;         /* packed Task as stored (borrowed) */
    size_t task_len;
    uint64_t task_index;
    const uint8_t *sampling;     /* packed SamplingParams, NULL = none */
    size_t sampling_len;
    const uint32_t *samples;     /* sample indices */
    size_t n_samples;
    uint64_t base_seed, lease_ms;
    uint32_t attempt;
    bool chat;
    bool has_max_weight_lag;
    uint64_t max_weight_lag;
} broker_wire_gen_t;

/* Whether the protobuf message in p[0..n) has a top-level field `field`. Returns 1 (yes),
   0 (no) or -1 when the bytes are not a well-formed message. */
int broker_wire_has_field(const uint8_t *p, size_t n, uint32_t field);

/* The packed Envelope {version = ANVIL_PROTOCOL_VERSION, gen_unit = u}; malloc'ed, caller
   frees; NULL when out of memory. */
uint8_t *broker_wire_gen_unit(const broker_wire_gen_t *u, size_t *len);

#endif
