/*  broker_http.c - libmicrohttpd server over a published snapshot.

    MHD_USE_INTERNAL_POLLING_THREAD: one MHD thread accepts and answers; its handler copies the
    current snapshot text under `lock` into the response (MHD_RESPMEM_MUST_COPY), so the broker
    loop only ever blocks for a pointer swap. Connections are limited (64) and time out (10 s);
    request bodies are refused. The page (status.html) is embedded at build time.
*/
#include "broker_http.h"
#include "anv_log.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

extern const char broker_status_html[];

struct broker_http_t {
    struct MHD_Daemon *mhd;
    pthread_mutex_t lock; /* the snapshot and the counter */
    char *metrics, *status;
    size_t metrics_len, status_len;
    uint64_t requests;
    uint16_t port;
};

static enum MHD_Result s_send(struct MHD_Connection *c, unsigned code, const char *type,
                              const char *body, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result s_handler(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version,
                                 const char *upload_data, size_t *upload_data_size,
                                 void **con_cls)
{
    (void)version;
    (void)upload_data;
    broker_http_t *h = cls;
    if (*upload_data_size) /* no request bodies */
        return MHD_NO;
    if (!*con_cls) { /* first call for this request: headers only */
        *con_cls = h;
        return MHD_YES;
    }
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        static const char msg[] = "method not allowed\n";
        return s_send(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", msg, sizeof msg - 1);
    }
    pthread_mutex_lock(&h->lock);
    h->requests++;
    enum MHD_Result ret;
    if (!strcmp(url, "/metrics")) {
        ret = s_send(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                     h->metrics ? h->metrics : "", h->metrics ? h->metrics_len : 0);
    } else if (!strcmp(url, "/api/status")) {
        ret = s_send(c, MHD_HTTP_OK, "application/json", h->status ? h->status : "{}",
                     h->status ? h->status_len : 2);
    } else if (!strcmp(url, "/") || !strcmp(url, "/index.html")) {
        ret = s_send(c, MHD_HTTP_OK, "text/html; charset=utf-8", broker_status_html,
                     strlen(broker_status_html));
    } else {
        static const char msg[] = "not found\n";
        ret = s_send(c, MHD_HTTP_NOT_FOUND, "text/plain", msg, sizeof msg - 1);
    }
    pthread_mutex_unlock(&h->lock);
    return ret;
}

static void s_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[256];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = 0;
    ANV_WARN("http: %s", line);
}

static bool s_parse(const char *listen, struct sockaddr_in *sa)
{
    char host[256];
    const char *colon = listen ? strrchr(listen, ':') : NULL;
    if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof host)
        return false;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || port < 0 || port > 65535)
        return false;
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = 0;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai)
        return false;
    memcpy(sa, ai->ai_addr, sizeof *sa);
    sa->sin_port = htons((uint16_t)port);
    freeaddrinfo(ai);
    return true;
}

broker_http_t *broker_http_new(const char *listen)
{
    struct sockaddr_in sa;
    if (!s_parse(listen, &sa)) {
        ANV_ERROR("bad metrics endpoint '%s': want HOST:PORT", listen ? listen : "");
        return NULL;
    }
    broker_http_t *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    pthread_mutex_init(&h->lock, NULL);
    h->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                              s_handler, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT,
                              10u, MHD_OPTION_EXTERNAL_LOGGER, s_log, NULL, MHD_OPTION_END);
    if (!h->mhd) {
        ANV_ERROR("cannot serve http on '%s' (address in use?)", listen);
        pthread_mutex_destroy(&h->lock);
        free(h);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : ntohs(sa.sin_port);
    ANV_INFO("http on '%s' (port %u): /metrics /api/status /", listen, h->port);
    return h;
}

void broker_http_destroy(broker_http_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    broker_http_t *h = *self_p;
    MHD_stop_daemon(h->mhd);
    free(h->metrics);
    free(h->status);
    pthread_mutex_destroy(&h->lock);
    free(h);
    *self_p = NULL;
}

uint16_t broker_http_port(const broker_http_t *self)
{
    return self->port;
}

void broker_http_publish(broker_http_t *self, char *metrics, size_t metrics_len, char *status,
                         size_t status_len)
{
    char *old_m = NULL, *old_s = NULL;
    pthread_mutex_lock(&self->lock);
    if (metrics) {
        old_m = self->metrics;
        self->metrics = metrics;
        self->metrics_len = metrics_len;
    }
    if (status) {
        old_s = self->status;
        self->status = status;
        self->status_len = status_len;
    }
    pthread_mutex_unlock(&self->lock);
    free(old_m);
    free(old_s);
}

uint64_t broker_http_requests(broker_http_t *self)
{
    pthread_mutex_lock(&self->lock);
    uint64_t n = self->requests;
    pthread_mutex_unlock(&self->lock);
    return n;
}
