/*  anv_msg.h - framed protobuf envelopes over ZeroMQ.

    A message is one frame holding one packed anvil.Envelope; on a ROUTER socket the peer's
    identity frame comes first. Receiving never trusts the bytes: an empty, oversize, truncated,
    undecodable or wrong-version message is dropped with a counted, logged (rate-limited)
    error, and the caller just sees no message. Sending is non-blocking: a full pipe (HWM) or an
    unknown ROUTER peer (ZMQ_ROUTER_MANDATORY) is returned as an error for the caller to
    retry, requeue or dead-letter: nothing is dropped silently.
    The stats struct belongs to the caller (one per socket, or shared by one thread).
*/
#ifndef ANV_MSG_H
#define ANV_MSG_H

#include "anvil.pb-c.h"

#include <czmq.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ANVIL_PROTOCOL_VERSION 1
#define ANV_MSG_MAX_DEFAULT (64u << 20)

typedef struct {
    uint64_t received;           /* envelopes accepted */
    uint64_t sent;
    uint64_t rejected_empty;     /* no payload frame */
    uint64_t rejected_oversize;
    uint64_t rejected_malformed; /* truncated or not a valid envelope */
    uint64_t rejected_version;
    uint64_t rejected_frames;    /* wrong number of frames */
    uint64_t send_again;         /* send refused: peer's pipe full (EAGAIN) */
    uint64_t send_unroutable;    /* send refused: unknown ROUTER peer (EHOSTUNREACH) */
    uint64_t send_failed;        /* any other send error */
} anv_msg_stats_t;

/* Initialises an envelope with the current protocol version and no body. */
void anv_msg_init(Anvil__Envelope *env);

/* Decodes one payload. Returns the envelope (free with anv_msg_free) or NULL with *err set to
   ANV_ETOOBIG, ANV_EPROTO or ANV_EVERSION. `max` = 0 means ANV_MSG_MAX_DEFAULT. */
Anvil__Envelope *anv_msg_decode(const uint8_t *buf, size_t len, size_t max, int *err);
/* Packs an envelope into a new buffer (caller frees). Returns NULL when out of memory. */
uint8_t *anv_msg_encode(const Anvil__Envelope *env, size_t *len);
void anv_msg_free(Anvil__Envelope **env_p);

/* Sends env (its version is set here). `identity` is the ROUTER peer or NULL on a DEALER;
   it is not consumed. Non-blocking. Returns 0, -EAGAIN, -EHOSTUNREACH or another -errno. */
int anv_msg_send(zsock_t *sock, zframe_t *identity, Anvil__Envelope *env, anv_msg_stats_t *st);
/* Receives one message if one is waiting (non-blocking when `wait` is false).
   On a ROUTER socket (`router` true) the identity is returned in *identity (caller destroys).
   Returns the envelope or NULL when nothing valid arrived: *err is 0 for "nothing waiting"
   and the ANV_E* reason for a rejected message. */
Anvil__Envelope *anv_msg_recv(zsock_t *sock, bool router, bool wait, size_t max,
                              zframe_t **identity, anv_msg_stats_t *st, int *err);
/* Name of an envelope's body, e.g. "gen_unit", for logs. */
const char *anv_msg_body_name(const Anvil__Envelope *env);

#endif
