/* serve_client.h: a client of OpenAI-compatible servers (libcurl), for
 * `sluice bench serve` and the server's tests: posts a completion request
 * and collects the answer's text, from JSON or from server-sent events,
 * with the time to the first piece of text. */
#ifndef SLUICE_SERVE_CLIENT_H
#define SLUICE_SERVE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

struct serve_client_result {
    long status;               /* HTTP status (0: no answer) */
    char *body;                /* the raw answer (malloc'ed) */
    size_t body_len;
    char *text;                /* the reply's text (malloc'ed; "" when none) */
    size_t text_len;
    char finish[16];           /* finish_reason */
    uint32_t prompt_tokens, completion_tokens; /* usage (0 when absent) */
    uint32_t events;           /* SSE data events, [DONE] included */
    int done;                  /* `data: [DONE]` came (streams) */
    int bad_event;             /* an event that is not JSON or lacks choices */
    double ttft_s;             /* request start to the first non-empty text */
    double total_s;
};

/* Posts body (JSON) to url; stream: parse the answer as server-sent events.
 * api_key may be NULL. Returns 0 (any HTTP status) or -1 with err filled
 * when no answer came (connection refused, timeout after timeout_s). */
int serve_client_post(const char *url, const char *api_key, const char *body, int stream,
                      double timeout_s, struct serve_client_result *r, char *err, size_t err_len);
void serve_client_result_free(struct serve_client_result *r);

/* A GET (e.g. /metrics): the body in r->body. */
int serve_client_get(const char *url, const char *api_key, struct serve_client_result *r,
                     char *err, size_t err_len);

/* Loads libcurl (tools_dl.h) and calls curl_global_init, once per process
 * before threads start; 0, or -1 with a sentence in err. */
int serve_client_global_init(char *err, size_t err_len);

#endif
