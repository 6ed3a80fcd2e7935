/*  broker_http.h - the broker's HTTP endpoint: Prometheus metrics, a status JSON, a status page.

    libmicrohttpd runs in its own thread and never touches broker state: it serves the latest
    snapshot that the broker loop published with broker_http_publish() (copied under a mutex),
    so a slow or hostile HTTP client cannot stall dispatch. Routes (GET or HEAD):
      /metrics      Prometheus text exposition format 0.0.4
      /api/status   JSON: broker, rates, jobs, workers (see broker/README.md)
      /             the status page (HTML + JS polling /api/status; no external resources)
    Anything else is 404, other methods 405. The object is created and destroyed by the
    loop's thread; publish() and requests() may be called from it while the server runs.
*/
#ifndef BROKER_HTTP_H
#define BROKER_HTTP_H

#include <stddef.h>
#include <stdint.h>

typedef struct broker_http_t broker_http_t;

/* Listens on `listen` ("HOST:PORT", IPv4 address or name; PORT 0 = any free port).
   Returns NULL (logged) when it is malformed or cannot be bound. */
broker_http_t *broker_http_new(const char *listen);
void broker_http_destroy(broker_http_t **self_p);
/* The port actually bound. */
uint16_t broker_http_port(const broker_http_t *self);
/* Replaces the snapshot; takes ownership of both malloc'ed texts (either may be NULL: kept). */
void broker_http_publish(broker_http_t *self, char *metrics, size_t metrics_len, char *status,
                         size_t status_len);
/* Requests answered so far. */
uint64_t broker_http_requests(broker_http_t *self);

#endif
