/* serve_api.h: one completion request from its body to its answer, without
 * HTTP: validation (serve_req), the prompt (chat template, tokenizer),
 * context checks, a session from the engine's queue, generation, and the
 * OpenAI-shaped JSON answer or server-sent events. serve_http.c carries the
 * bytes. */
#ifndef SLUICE_SERVE_API_H
#define SLUICE_SERVE_API_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "serve_engine.h"
#include "serve_metrics.h"
#include "serve_req.h"

struct serve_api {
    struct serve_engine *e;
    struct serve_metrics *m;
    const char *model_id;
};

struct serve_call;

/* Answers a request body. Either *json (malloc'ed; a response or an error
 * in OpenAI's shape) with *status, or (*status 200) *stream: a streaming
 * answer to pull with serve_call_read. gone(ctx) tells whether the client
 * left (polled while waiting and generating). Returns 0, or -ECANCELED
 * when the client left (nothing to send). */
int serve_api_complete(struct serve_api *a, enum serve_kind kind, const char *body, size_t len,
                       uint64_t t_arrival_ns, serve_cancel_fn gone, void *gctx, int *status,
                       char **json, struct serve_call **stream);

/* The next bytes of the event stream into buf[0..max): their count (at
 * least 1), -1 at its end (after `data: [DONE]`), -2 on an error or when
 * the client left. */
ssize_t serve_call_read(struct serve_call *c, char *buf, size_t max);
/* Ends the call (cancelling its generation if unfinished) and frees it. */
void serve_call_free(struct serve_call *c);

/* An error body in OpenAI's shape (malloc'ed or NULL) for a status. */
char *serve_api_error(int status, const char *type, const char *code, const char *message);

#endif
