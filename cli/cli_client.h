/*  cli_client.h - one request/reply conversation with the broker's client ROUTER.

    A DEALER socket connected to the broker's client endpoint. Every request carries a new
    request_id and the call waits (polling, so that SIGINT is noticed within 100 ms) for the
    reply that echoes it; replies to earlier requests that timed out are dropped. A broker that
    does not answer is reported as ANV_ETIMEOUT with a message that names the endpoint; an
    ErrorReply is returned as its code with its message. Connection-like: the last error is
    kept in errstr, hiredis style. One client belongs to one thread.
    With CURVE keys the DEALER is a CURVE client of the broker's public key, and a monitor on
    its handshakes turns a refused key into ANV_EAUTH at once, instead of a timeout.
*/
#ifndef CLI_CLIENT_H
#define CLI_CLIENT_H

#include "anvil.pb-c.h"

typedef struct cli_client_t cli_client_t;

/* Connects (asynchronously, as ZeroMQ does) to `endpoint`, with CURVE when curve_secret (own
   secret key file) and curve_server (the broker's public key file) are given; both NULL or ""
   = plaintext. Returns NULL when the endpoint is malformed or a key does not load, with the
   reason written to err. */
cli_client_t *cli_client_new(const char *endpoint,
                             const char *curve_secret,
                             const char *curve_server,
                             char *err,
                             size_t errlen);
void cli_client_destroy(cli_client_t **self_p);

/* Sends `req` (its version and request_id are set here) and waits up to timeout_ms for the
   reply with the same request_id and body `expect`. Returns 0 with *reply (the caller frees it
   with anv_msg_free), ANV_ETIMEOUT, ANV_ECANCELLED when interrupted (cli_interrupted),
   ANV_EPROTO for a reply of the wrong kind, ANV_EAUTH when the broker refused our CURVE key, or the code of the broker's ErrorReply (its
   message in errstr). */
int cli_client_call(cli_client_t *self,
                    Anvil__Envelope *req,
                    Anvil__Envelope__BodyCase expect,
                    int timeout_ms,
                    Anvil__Envelope **reply);
const char *cli_client_errstr(const cli_client_t *self);
/* One call on a fresh connection for the one-shot subcommands: prints any failure as
   "anvil <cmd>: <reason>" and returns the exit code (CLI_EXIT_OK with *reply set). */
struct cli_common_t;
/* cli_client_new() on the broker and keys of a subcommand's common options (cli_util.h). */
cli_client_t *cli_client_open(const struct cli_common_t *c, char *err, size_t errlen);
/* The broker, keys and timeout come from the subcommand's common options. */
int cli_rpc(const char *cmd,
            const struct cli_common_t *c,
            Anvil__Envelope *req,
            Anvil__Envelope__BodyCase expect,
            Anvil__Envelope **reply);
const char *cli_client_endpoint(const cli_client_t *self);

#endif
