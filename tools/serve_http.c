/* serve_http.c: libmicrohttpd glue (serve_http.h): routes, the API key,
 * request bodies with a size limit and a deadline, JSON answers and
 * server-sent events pulled from serve_api's calls. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "serve_api.h"
#include "serve_http.h"
#include "tools_dl.h"

struct serve_http {
    struct serve_http_opts o;
    struct serve_api api;
    struct MHD_Daemon *d;
    uint16_t port;
};

enum route { R_NONE = 0, R_COMPLETIONS, R_CHAT, R_MODELS, R_HEALTH, R_METRICS };

/* One request's state, from its headers to its answer. */
struct req {
    enum route route;
    char *body;
    size_t len, cap;
    uint64_t t0;
    int too_big, too_slow, status;
    struct MHD_Connection *conn;
};

static enum MHD_Result send_buf(struct MHD_Connection *conn, int status, char *body,
                                const char *type)
{
    if (!body) {
        status = 500;
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                      "\"param\":null,\"code\":null}}");
        if (!body)
            return MHD_NO;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(struct serve_http *h, struct req *q, int status,
                                  const char *type, const char *code, const char *msg)
{
    q->status = status;
    serve_metrics_status(h->api.m, status);
    return send_buf(q->conn, status, serve_api_error(status, type, code, msg),
                    "application/json");
}

/* The client closed its side (or the socket failed). */
static int conn_gone(void *ctx)
{
    struct MHD_Connection *conn = ctx;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
        return 1;
    char c;
    ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* 408 in the middle of a body: libmicrohttpd queues answers only before
 * the body or after all of it, so this fixed answer is written to the
 * socket directly and the connection closed (MHD_NO). */
static enum MHD_Result send_timeout(struct serve_http *h, struct req *q)
{
    q->status = 408;
    serve_metrics_status(h->api.m, 408);
    char *body = serve_api_error(408, "invalid_request_error", "request_timeout",
                                 "the request body did not arrive in time");
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(q->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (body && ci) {
        char head[160];
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                         strlen(body));
        if (send(ci->connect_fd, head, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) == n)
            (void)!send(ci->connect_fd, body, strlen(body), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    free(body);
    return MHD_NO;
}

static int key_ok(const struct serve_http *h, struct MHD_Connection *conn)
{
    if (!h->o.api_key)
        return 1;
    const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!v || strncmp(v, "Bearer ", 7))
        return 0;
    v += 7;
    size_t a = strlen(v), b = strlen(h->o.api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a; i++) /* time independent of where they differ */
        diff |= (unsigned)(unsigned char)v[i] ^ (unsigned char)h->o.api_key[i % (b ? b : 1)];
    return diff == 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    ssize_t n = serve_call_read(cls, buf, max);
    return n == -1 ? MHD_CONTENT_READER_END_OF_STREAM
                   : n < 0 ? MHD_CONTENT_READER_END_WITH_ERROR : n;
}

static void stream_free(void *cls)
{
    serve_call_free(cls);
}

static enum MHD_Result complete(struct serve_http *h, struct req *q)
{
    int status;
    char *json;
    struct serve_call *call;
    int ret = serve_api_complete(&h->api, q->route == R_CHAT ? SERVE_CHAT : SERVE_COMPLETIONS,
                                 q->body ? q->body : "", q->len, q->t0, conn_gone, q->conn,
                                 &status, &json, &call);
    if (ret == -ECANCELED)
        return MHD_NO; /* the client left: close */
    q->status = status;
    serve_metrics_status(h->api.m, status);
    if (!call)
        return send_buf(q->conn, status, json, "application/json");
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, call, stream_free);
    if (!r) {
        serve_call_free(call);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result res = MHD_queue_response(q->conn, 200, r);
    MHD_destroy_response(r);
    return res;
}

static enum MHD_Result answer_get(struct serve_http *h, struct req *q)
{
    q->status = 200;
    serve_metrics_status(h->api.m, 200);
    if (q->route == R_METRICS)
        return send_buf(q->conn, 200, serve_metrics_render(h->api.m, h->api.e),
                        "text/plain; version=0.0.4");
    char *s = NULL;
    size_t n = strlen(h->o.model_id) + 160;
    if ((s = malloc(n))) {
        if (q->route == R_HEALTH) {
            struct serve_engine_counters c;
            serve_engine_counters(h->api.e, &c);
            snprintf(s, n, "{\"status\":\"ok\",\"model_loaded\":%s}", c.loaded ? "true" : "false");
        } else {
            /* the id has no quote or backslash (sluice_serve.c checks) */
            snprintf(s, n,
                     "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\","
                     "\"created\":0,\"owned_by\":\"sluice\"}]}",
                     h->o.model_id);
        }
    }
    return send_buf(q->conn, 200, s, "application/json");
}

static enum route route_of(const char *url, int *post)
{
    static const struct {
        const char *url;
        enum route r;
        int post;
    } routes[] = {{"/v1/completions", R_COMPLETIONS, 1},
                  {"/v1/chat/completions", R_CHAT, 1},
                  {"/v1/models", R_MODELS, 0},
                  {"/health", R_HEALTH, 0},
                  {"/metrics", R_METRICS, 0}};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].url)) {
            *post = routes[i].post;
            return routes[i].r;
        }
    return R_NONE;
}

/* The first call, with the headers: route, method, key, declared size. */
static enum MHD_Result begin(struct serve_http *h, struct req *q, const char *url,
                             const char *method)
{
    int post = 0;
    q->route = route_of(url, &post);
    if (q->route == R_NONE)
        return send_error(h, q, 404, "invalid_request_error", "not_found", "no such endpoint");
    if (strcmp(method, post ? "POST" : "GET"))
        return send_error(h, q, 405, "invalid_request_error", "method_not_allowed",
                          post ? "this endpoint takes POST" : "this endpoint takes GET");
    if (q->route != R_HEALTH && !key_ok(h, q->conn))
        return send_error(h, q, 401, "authentication_error", "invalid_api_key",
                          "a valid API key is needed: Authorization: Bearer KEY");
    const char *cl = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > h->o.max_body) {
        q->too_big = 1;
        return send_error(h, q, 413, "invalid_request_error", "request_too_large",
                          "the request body is larger than the server's limit");
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    struct serve_http *h = cls;
    struct req *q = *con_cls;
    if (!q) {
        if (!(q = calloc(1, sizeof *q)))
            return MHD_NO;
        q->t0 = sl_now_ns();
        q->conn = conn;
        *con_cls = q;
        return begin(h, q, url, method);
    }
    if (q->status) {
        *upload_data_size = 0; /* answered already: the rest of the body is dropped */
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if ((double)(sl_now_ns() - q->t0) / 1e9 > h->o.timeout_s) {
            q->too_slow = 1;
            return send_timeout(h, q);
        }
        if (q->too_big || q->len + n > h->o.max_body) {
            q->too_big = 1;
            return MHD_YES; /* dropped; answered at its end */
        }
        if (q->len + n + 1 > q->cap) {
            size_t cap = (q->len + n + 1) * 2;
            if (cap > h->o.max_body + 1)
                cap = h->o.max_body + 1;
            char *p = realloc(q->body, cap);
            if (!p)
                return MHD_NO;
            q->body = p;
            q->cap = cap;
        }
        memcpy(q->body + q->len, upload_data, n);
        q->len += n;
        q->body[q->len] = 0;
        return MHD_YES;
    }
    if (q->too_big)
        return send_error(h, q, 413, "invalid_request_error", "request_too_large",
                          "the request body is larger than the server's limit");
    if (q->route == R_COMPLETIONS || q->route == R_CHAT)
        return complete(h, q);
    return answer_get(h, q);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    struct req *q = *con_cls;
    if (!q)
        return;
    free(q->body);
    free(q);
    *con_cls = NULL;
}

int serve_http_start(const struct serve_http_opts *o, struct serve_engine *e,
                     struct serve_metrics *m, struct serve_http **out, struct sl_err *err)
{
    int ret = tools_dl_mhd(err);
    if (ret < 0)
        return ret;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[8];
    snprintf(port, sizeof port, "%u", o->port);
    int g = getaddrinfo(o->host, port, &hints, &ai);
    if (g) {
        sl_err_set(err, "cannot resolve --host '%s': %s", o->host, gai_strerror(g));
        return -EINVAL;
    }
    struct serve_http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    h->o = *o;
    h->api = (struct serve_api){.e = e, .m = m, .model_id = o->model_id};
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_AUTO | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    h->d = MHD_start_daemon(flags, o->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
                            ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT, o->timeout_s,
                            MHD_OPTION_CONNECTION_LIMIT, o->max_conns,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        free(h);
        sl_err_set(err, "cannot listen on %s port %u (in use, or not an address of this machine)",
                   o->host, o->port);
        return -EADDRINUSE;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : o->port;
    *out = h;
    return 0;
}

uint16_t serve_http_port(const struct serve_http *h)
{
    return h->port;
}

void serve_http_stop(struct serve_http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->d);
    free(h);
}
