/*  anv_msg.c - envelope framing, validation and non-blocking send.

    protobuf-c's unpack validates wire structure and required fields; on top of it we check the
    size before unpacking (so a hostile peer cannot make us allocate a huge message) and the
    version after. Rejections are logged at most once a second per kind, with a count of what
    was suppressed, so a flood of garbage cannot flood the log either.
*/
#include "anv_msg.h"
#include "anv_error.h"
#include "anv_log.h"
#include "anv_time.h"

#include <errno.h>
#include <string.h>

void anv_msg_init(Anvil__Envelope *env)
{
    anvil__envelope__init(env);
    env->version = ANVIL_PROTOCOL_VERSION;
}

static void s_log_reject(const char *why, size_t len)
{
    static __thread int64_t last_ms;
    static __thread unsigned long suppressed;
    int64_t now = anv_now_ms();
    if (now - last_ms < 1000) {
        suppressed++;
        return;
    }
    ANV_WARN("rejected message (%s, %zu bytes; %lu more rejected since last report)", why, len,
             suppressed);
    suppressed = 0;
    last_ms = now;
}

/* protobuf-c keeps an overlong-encoded tag 0 (e.g. 80 00) as an unknown field but refuses the
   canonical tag 0 that it writes back, so such a message would be accepted here and rejected
   by the next hop. Field number 0 is invalid protobuf: refuse it at any depth. */
static bool s_has_field_zero(const ProtobufCMessage *m, int depth)
{
    if (!m || depth > 64)
        return depth > 64;
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return true;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        const char *base = (const char *)m;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *arr = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t k = 0; k < n; k++)
                if (s_has_field_zero(arr[k], depth + 1))
                    return true;
        } else {
            if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                *(const uint32_t *)(base + f->quantifier_offset) != f->id)
                continue;
            if (s_has_field_zero(*(ProtobufCMessage *const *)(base + f->offset), depth + 1))
                return true;
        }
    }
    return false;
}

Anvil__Envelope *anv_msg_decode(const uint8_t *buf, size_t len, size_t max, int *err)
{
    if (!max)
        max = ANV_MSG_MAX_DEFAULT;
    *err = 0;
    if (len > max) {
        *err = ANV_ETOOBIG;
        return NULL;
    }
    if (!buf || len == 0) {
        *err = ANV_EPROTO;
        return NULL;
    }
    Anvil__Envelope *env = anvil__envelope__unpack(NULL, len, buf);
    if (!env) {
        *err = ANV_EPROTO;
        return NULL;
    }
    if (s_has_field_zero(&env->base, 0)) {
        anvil__envelope__free_unpacked(env, NULL);
        *err = ANV_EPROTO;
        return NULL;
    }
    if (env->version != ANVIL_PROTOCOL_VERSION) {
        anvil__envelope__free_unpacked(env, NULL);
        *err = ANV_EVERSION;
        return NULL;
    }
    return env;
}

uint8_t *anv_msg_encode(const Anvil__Envelope *env, size_t *len)
{
    size_t n = anvil__envelope__get_packed_size(env);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    *len = anvil__envelope__pack(env, buf);
    return buf;
}

void anv_msg_free(Anvil__Envelope **env_p)
{
    if (env_p && *env_p) {
        anvil__envelope__free_unpacked(*env_p, NULL);
        *env_p = NULL;
    }
}

static void s_free_buf(void *data, void *hint)
{
    (void)hint;
    free(data);
}

int anv_msg_send(zsock_t *sock, zframe_t *identity, Anvil__Envelope *env, anv_msg_stats_t *st)
{
    env->version = ANVIL_PROTOCOL_VERSION;
    size_t len;
    uint8_t *buf = anv_msg_encode(env, &len);
    if (!buf)
        return -ENOMEM;
    void *zs = zsock_resolve(sock);
    int rc = 0;
    if (identity &&
        zmq_send(zs, zframe_data(identity), zframe_size(identity), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        rc = -errno;
    if (rc == 0) {
        zmq_msg_t msg;
        /* zero copy: libzmq frees the buffer when it is sent */
        zmq_msg_init_data(&msg, buf, len, s_free_buf, NULL);
        buf = NULL;
        if (zmq_msg_send(&msg, zs, ZMQ_DONTWAIT) < 0) {
            rc = -errno;
            zmq_msg_close(&msg);
        }
    }
    free(buf);
    if (st) {
        if (rc == 0)
            st->sent++;
        else if (rc == -EAGAIN)
            st->send_again++;
        else if (rc == -EHOSTUNREACH)
            st->send_unroutable++;
        else
            st->send_failed++;
    }
    return rc;
}

Anvil__Envelope *anv_msg_recv(zsock_t *sock, bool router, bool wait, size_t max,
                              zframe_t **identity, anv_msg_stats_t *st, int *err)
{
    *err = 0;
    if (identity)
        *identity = NULL;
    void *zs = zsock_resolve(sock);
    zmq_msg_t part;
    zmq_msg_init(&part);
    if (zmq_msg_recv(&part, zs, wait ? 0 : ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&part);
        return NULL;
    }
    /* read every frame of the message, keeping the identity and the first payload frame */
    zframe_t *id = NULL;
    zmq_msg_t payload;
    zmq_msg_init(&payload);
    int frames = 1;
    bool have_payload = false;
    if (router) {
        id = zframe_new(zmq_msg_data(&part), zmq_msg_size(&part));
    } else {
        zmq_msg_move(&payload, &part);
        have_payload = true;
    }
    while (zmq_msg_more(have_payload ? &payload : &part)) {
        zmq_msg_t next;
        zmq_msg_init(&next);
        if (zmq_msg_recv(&next, zs, 0) < 0) {
            zmq_msg_close(&next);
            break;
        }
        frames++;
        if (!have_payload) {
            zmq_msg_move(&payload, &next);
            have_payload = true;
        } else {
            int more = zmq_msg_more(&next);
            zmq_msg_close(&next);
            if (!more)
                break;
        }
    }
    zmq_msg_close(&part);

    Anvil__Envelope *env = NULL;
    size_t len = have_payload ? zmq_msg_size(&payload) : 0;
    if (!have_payload || len == 0) {
        *err = ANV_EPROTO;
        if (st)
            st->rejected_empty++;
        s_log_reject("empty", 0);
    } else if (frames != (router ? 2 : 1)) {
        *err = ANV_EPROTO;
        if (st)
            st->rejected_frames++;
        s_log_reject("wrong frame count", len);
    } else {
        env = anv_msg_decode(zmq_msg_data(&payload), len, max, err);
        if (!env && st) {
            if (*err == ANV_ETOOBIG)
                st->rejected_oversize++;
            else if (*err == ANV_EVERSION)
                st->rejected_version++;
            else
                st->rejected_malformed++;
        }
        if (!env)
            s_log_reject(anv_strerror(*err), len);
    }
    zmq_msg_close(&payload);
    if (env) {
        if (st)
            st->received++;
        if (identity)
            *identity = id;
        else
            zframe_destroy(&id);
    } else {
        zframe_destroy(&id);
    }
    return env;
}

const char *anv_msg_body_name(const Anvil__Envelope *env)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(&anvil__envelope__descriptor, env->body_case);
    return f ? f->name : "none";
}
