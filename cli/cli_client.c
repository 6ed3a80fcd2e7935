/*  cli_client.c - one request/reply conversation with the broker's client ROUTER.

    ZeroMQ connects in the background and queues what is sent before the connection is up, so
    an unreachable broker shows as a missing reply: the timeout is the only signal and the
    message says so. Linger is 0 so that a command never hangs at exit on an unsent request.
    request_ids start at a random value so that two runs in the same second never share one.
    With CURVE, the handshake monitor is polled beside the socket: ZAP's refusal ends the call
    with ANV_EAUTH; other handshake failures (a wrong broker key, a plaintext broker) are kept
    and named if the call then times out.
*/
#include "cli_client.h"

#include "anv_curve.h"
#include "anv_error.h"
#include "anv_msg.h"
#include "anv_time.h"
#include "cli_util.h"

#include <czmq.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

struct cli_client_t {
    zsock_t *sock;
    zsock_t *monitor;  /* handshake events; NULL in plaintext */
    anv_curve_t *curve;
    int handshake;     /* worst handshake failure seen: 0, ANV_EPROTO or ANV_EAUTH */
    char *endpoint;
    uint64_t next_id;
    anv_msg_stats_t stats;
    char errstr[512];
};

cli_client_t *cli_client_new(const char *endpoint, const char *curve_secret,
                             const char *curve_server, char *err, size_t errlen)
{
    cli_client_t *self = calloc(1, sizeof *self);
    if (!self || !(self->endpoint = strdup(endpoint))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (!(self->sock = zsock_new(ZMQ_DEALER))) {
        snprintf(err, errlen, "cannot create a ZeroMQ socket: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    zsock_set_linger(self->sock, 0);
    zsock_set_rcvhwm(self->sock, 0); /* results pages are bounded by the request, not here */
    if (anv_curve_client_config(curve_secret, curve_server, &self->curve, err, errlen) != 0)
        goto fail;
    if (self->curve) {
        anv_curve_client(self->curve, self->sock);
        self->monitor = anv_curve_monitor_new(self->sock);
    }
    if (zmq_connect(zsock_resolve(self->sock), endpoint) != 0) {
        snprintf(err, errlen, "cannot use broker endpoint '%s': %s", endpoint,
                 zmq_strerror(zmq_errno()));
        goto fail;
    }
    self->next_id = zclock_time() ^ ((uint64_t)getpid() << 40) ^ (uint64_t)randof(1 << 30);
    return self;
fail:
    cli_client_destroy(&self);
    return NULL;
}

void cli_client_destroy(cli_client_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    cli_client_t *self = *self_p;
    zsock_destroy(&self->monitor);
    zsock_destroy(&self->sock);
    anv_curve_destroy(&self->curve);
    free(self->endpoint);
    free(self);
    *self_p = NULL;
}

int cli_client_call(cli_client_t *self, Anvil__Envelope *req, Anvil__Envelope__BodyCase expect,
                    int timeout_ms, Anvil__Envelope **reply)
{
    *reply = NULL;
    self->errstr[0] = 0;
    uint64_t id = ++self->next_id;
    req->version = ANVIL_PROTOCOL_VERSION;
    req->has_request_id = true;
    req->request_id = id;
    int64_t deadline = anv_now_ms() + timeout_ms;
    void *zs = zsock_resolve(self->sock);
    int rc;
    /* a full pipe is retried until the deadline: nothing is dropped */
    while ((rc = anv_msg_send(self->sock, NULL, req, &self->stats)) == -EAGAIN) {
        if (cli_interrupted)
            return ANV_ECANCELLED;
        if (anv_now_ms() >= deadline)
            break;
        anv_sleep_ms(10);
    }
    if (rc == -EAGAIN) {
        snprintf(self->errstr, sizeof self->errstr,
                 "cannot send to the broker at %s (not connected) within %.1f s: is it running? "
                 "(start a local one with `anvil up`)",
                 self->endpoint, timeout_ms / 1000.0);
        return ANV_ETIMEOUT;
    }
    if (rc) {
        snprintf(self->errstr, sizeof self->errstr, "cannot send to the broker at %s: %s",
                 self->endpoint, strerror(-rc));
        return rc;
    }
    for (;;) {
        if (cli_interrupted)
            return ANV_ECANCELLED;
        if (self->monitor) {
            int h = anv_curve_monitor_read(self->monitor);
            if (h == ANV_EAUTH) {
                snprintf(self->errstr, sizeof self->errstr,
                         "the broker at %s refused this client's CURVE key '%s': its public "
                         "key file must be in the broker's --curve-allow directory",
                         self->endpoint, anv_curve_public_txt(self->curve));
                return ANV_EAUTH;
            }
            if (h)
                self->handshake = h;
        }
        int64_t left = deadline - anv_now_ms();
        if (left <= 0) {
            if (self->handshake)
                snprintf(self->errstr, sizeof self->errstr,
                         "no reply from the broker at %s within %.1f s: the CURVE handshake "
                         "failed (is --curve-server the broker's public key, and does the "
                         "broker run with --curve-secret?)",
                         self->endpoint, timeout_ms / 1000.0);
            else
                snprintf(self->errstr, sizeof self->errstr,
                         "no reply from the broker at %s within %.1f s: is it running? (start a "
                         "local one with `anvil up`, or point --broker / ANVIL_BROKER at one%s)",
                         self->endpoint, timeout_ms / 1000.0,
                         self->curve ? "" : "; a broker with CURVE needs --curve-secret and "
                                            "--curve-server");
            return ANV_ETIMEOUT;
        }
        zmq_pollitem_t items[2] = {{zs, 0, ZMQ_POLLIN, 0},
                                   {self->monitor ? zsock_resolve(self->monitor) : NULL, 0,
                                    ZMQ_POLLIN, 0}};
        int np = self->monitor ? 2 : 1;
        if (zmq_poll(items, np, left < 100 ? left : 100) <= 0 || !(items[0].revents & ZMQ_POLLIN))
            continue; /* timeout slice, EINTR or a handshake event: check again */
        int err = 0;
        Anvil__Envelope *env = anv_msg_recv(self->sock, false, false, 0, NULL, &self->stats,
                                            &err);
        if (!env)
            continue; /* rejected (logged and counted by anv_msg) or spurious */
        if (!env->has_request_id || env->request_id != id) {
            anv_msg_free(&env); /* the late reply to an earlier, timed-out request */
            continue;
        }
        if (env->body_case == ANVIL__ENVELOPE__BODY_ERROR && env->error) {
            snprintf(self->errstr, sizeof self->errstr, "%s", env->error->message);
            rc = env->error->code < 0 ? env->error->code : -env->error->code;
            if (rc == 0)
                rc = ANV_EINTERNAL;
            anv_msg_free(&env);
            return rc;
        }
        if (env->body_case != expect) {
            snprintf(self->errstr, sizeof self->errstr,
                     "the broker at %s answered '%s' to a '%s' request", self->endpoint,
                     anv_msg_body_name(env), anv_msg_body_name(req));
            anv_msg_free(&env);
            return ANV_EPROTO;
        }
        *reply = env;
        return 0;
    }
}

cli_client_t *cli_client_open(const cli_common_t *c, char *err, size_t errlen)
{
    return cli_client_new(c->broker, c->curve_secret, c->curve_server, err, errlen);
}

const char *cli_client_errstr(const cli_client_t *self)
{
    return self->errstr;
}

const char *cli_client_endpoint(const cli_client_t *self)
{
    return self->endpoint;
}

int cli_rpc(const char *cmd, const cli_common_t *cc, Anvil__Envelope *req,
            Anvil__Envelope__BodyCase expect, Anvil__Envelope **reply)
{
    char err[512];
    *reply = NULL;
    cli_client_t *c = cli_client_open(cc, err, sizeof err);
    if (!c) {
        cli_errorf(cmd, "%s", err);
        return CLI_EXIT_USAGE;
    }
    int rc = cli_client_call(c, req, expect, (int)(cc->timeout * 1000), reply);
    if (rc == ANV_ECANCELLED)
        cli_errorf(cmd, "interrupted");
    else if (rc)
        cli_errorf(cmd, "%s", cli_client_errstr(c));
    cli_client_destroy(&c);
    return cli_exit_for(rc);
}
