/*  fuzz_broker.c - fuzz target: messages from workers and clients through the broker's own
    handlers (broker_workers_on_message, broker_clients_on_message), after anv_msg_decode, as
    the broker's loop runs them.

    Input: up to 16 frames, each [u8 from][u16 little-endian length][payload]; bit 0 of `from`
    picks the client socket (else the worker socket), bits 1-2 one of four peer identities, so
    one input can be a READY followed by results, heartbeats with leases, a disconnect, or a
    submit followed by status and watch. Every payload goes through the same decoder the
    socket reader uses, then to the handler. After the frames the broker runs its periodic
    tick with the peers' deadlines passed (dead workers are released) and a commit.

    The broker is the real broker_t with no Redis behind it: its store points at a unix socket
    that does not exist, so every script call fails at once as when Redis is down, which is
    the path a hostile or broken peer must not be able to crash either. Its ROUTER sockets are
    not bound (every send is unroutable and counted). One broker per input: no state leaks
    from one input to the next, and LeakSanitizer sees everything a handler kept.
*/
#include "anv_error.h"
#include "anv_msg.h"
#include "anv_time.h"
#include "broker_internal.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static zsock_t *s_clients, *s_workers;

static void s_destroy_worker(void **item)
{
    broker_worker_destroy((broker_worker_t **)item);
}

static void s_destroy_lease(void **item)
{
    free(*item);
    *item = NULL;
}

static zsock_t *s_router(void)
{
    zsock_t *s = zsock_new(ZMQ_ROUTER);
    if (!s)
        abort();
    zsock_set_router_mandatory(s, 1);
    zsock_set_linger(s, 0);
    return s;
}

/* the state broker_new builds, minus Redis and the bound endpoints */
static broker_t *s_broker(void)
{
    if (!s_clients) {
        zsys_init();
        zsys_set_logstream(NULL);
        s_clients = s_router();
        s_workers = s_router();
    }
    broker_t *b = calloc(1, sizeof *b);
    if (!b)
        abort();
    b->cfg.client_endpoint = "inproc://fuzz-clients";
    b->cfg.worker_endpoint = "inproc://fuzz-workers";
    b->cfg.redis_url = "unix:/nonexistent/anvil-fuzz.sock";
    b->cfg.redis_timeout_ms = 10;
    b->cfg.lease_ms = 30000;
    b->cfg.max_attempts = 3;
    b->cfg.heartbeat_ms = 1000;
    b->cfg.heartbeat_misses = 3;
    b->cfg.batch = 64;
    b->cfg.max_msg = 1 << 20;
    b->started_ms = anv_wall_ms();
    b->jobs = zhashx_new();
    b->by_ident = zhashx_new();
    b->by_id = zhashx_new();
    b->leases = zhashx_new();
    b->watches = zlistx_new();
    b->args = broker_args_new();
    b->store = broker_store_new(b->cfg.redis_url, 10);
    if (!b->jobs || !b->by_ident || !b->by_id || !b->leases || !b->watches || !b->args ||
        !b->store)
        abort();
    zhashx_set_destructor(b->by_ident, s_destroy_worker);
    zhashx_set_destructor(b->leases, s_destroy_lease);
    broker_clients_watch_destructor(b->watches);
    b->clients = s_clients;
    b->workers_sock = s_workers;
    return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    broker_t *b = s_broker();
    size_t at = 0;
    for (int k = 0; k < 16 && at + 3 <= size; k++) {
        uint8_t from = data[at];
        size_t len = (size_t)data[at + 1] | (size_t)data[at + 2] << 8;
        at += 3;
        if (len > size - at)
            len = size - at;
        int err = 0;
        Anvil__Envelope *env = anv_msg_decode(data + at, len, (size_t)b->cfg.max_msg, &err);
        at += len;
        if (!env)
            continue;
        char ident[8];
        snprintf(ident, sizeof ident, "%c%d", from & 1 ? 'c' : 'w', (from >> 1) & 3);
        zframe_t *id = zframe_new(ident, strlen(ident));
        if (from & 1)
            broker_clients_on_message(b, id, env);
        else
            broker_workers_on_message(b, id, env);
        anv_msg_free(&env);
        zframe_destroy(&id);
    }
    int64_t later = anv_now_ms() + 60000;
    b->redis_retry_ms = 0;
    broker_workers_tick(b, later);
    broker_clients_tick(b, later);
    (void)broker_commit(b);
    b->clients = b->workers_sock = NULL; /* kept for the next input */
    broker_destroy(&b);
    return 0;
}
