/* serve_http.h: the OpenAI-compatible HTTP layer of `sluice serve` over
 * libmicrohttpd (a thread per connection; generation runs on the
 * connection's thread while it holds one of the engine's sessions).
 *
 * Routes: POST /v1/completions, POST /v1/chat/completions (JSON, or
 * server-sent events with "stream": true, ending in `data: [DONE]`),
 * GET /v1/models, GET /health, GET /metrics (Prometheus text). */
#ifndef SLUICE_SERVE_HTTP_H
#define SLUICE_SERVE_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "serve_engine.h"
#include "serve_metrics.h"

struct serve_http_opts {
    const char *host;      /* numeric address or name to listen on (127.0.0.1) */
    uint16_t port;         /* 0: any free port (serve_http_port tells which) */
    const char *api_key;   /* NULL: no authentication */
    const char *model_id;  /* the id /v1/models lists and requests must name */
    size_t max_body;       /* request bodies over this get 413 */
    unsigned timeout_s;    /* a request's body must arrive within this (408), and an idle
                              connection is closed after it */
    unsigned max_conns;    /* connections at once (each has a thread) */
};

struct serve_http;

int serve_http_start(const struct serve_http_opts *o, struct serve_engine *e,
                     struct serve_metrics *m, struct serve_http **out, struct sl_err *err);
uint16_t serve_http_port(const struct serve_http *h);
/* Stops accepting, closes every connection (generations end) and frees. */
void serve_http_stop(struct serve_http *h);

#endif
