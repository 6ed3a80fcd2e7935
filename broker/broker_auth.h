/*  broker_auth.h - the broker's ZAP handler: CURVE peers allowed by a directory of public keys.

    broker_auth_new() starts an actor that binds the ZAP endpoint (inproc://zeromq.zap.01) in
    CZMQ's context, so it authenticates every CURVE handshake on the broker's sockets. A
    client or worker is let in when its public key is in one of the zcert public files
    (NAME.key) of the allow directory; files ending in `_secret` and names starting with '.'
    are skipped, so a directory holding key pairs, or a Kubernetes secret mount, works as it
    is. The directory is read again at most once a second while handshakes arrive: keys added
    or removed take effect without a restart. Every refusal is logged (at warn) with the
    socket (ZAP domain), the peer address and the key; repeats of the same key from the same
    address are folded into one line a minute.

    CZMQ's zauth would do the lookup too, but its zcertstore aborts the process on two files
    with the same public key (an assert in CZMQ 4.2.1) and it logs only through zsys in
    verbose mode, key and address on different lines.
*/
#ifndef BROKER_AUTH_H
#define BROKER_AUTH_H

#include <stdint.h>

typedef struct broker_auth_t broker_auth_t;

/* Starts the handler on `allow_dir`. Returns NULL (logged) when the directory cannot be read
   or the ZAP endpoint is taken (another handler in this process). */
broker_auth_t *broker_auth_new(const char *allow_dir);
/* Stops the handler. Destroy it after the sockets it guards. NULL-safe, idempotent. */
void broker_auth_destroy(broker_auth_t **self_p);
/* Handshakes allowed and refused since start (thread-safe). */
uint64_t broker_auth_allowed(const broker_auth_t *self);
uint64_t broker_auth_refused(const broker_auth_t *self);
/* Keys in the allow-list at the last reading (thread-safe). */
uint64_t broker_auth_keys(const broker_auth_t *self);

#endif
