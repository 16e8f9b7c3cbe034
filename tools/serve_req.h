/* serve_req.h: an OpenAI-style request body to a struct, or an error in
 * OpenAI's shape; pure functions (bytes in, struct out), no model needed.
 *
 *   struct serve_req r; struct serve_error e;
 *   if (serve_req_parse(SERVE_CHAT, body, len, &lim, &r, &e) < 0)
 *       reply(e.status, serve_error_json(&e));
 *   ...
 *   serve_req_free(&r);
 */
#ifndef SLUICE_SERVE_REQ_H
#define SLUICE_SERVE_REQ_H

#include <stddef.h>
#include <stdint.h>

enum serve_kind { SERVE_COMPLETIONS = 0, SERVE_CHAT = 1 };

#define SERVE_MAX_STOP 4      /* OpenAI's limit on stop sequences */
#define SERVE_MAX_STOP_LEN 64 /* bytes of one stop sequence */

struct serve_msg {
    char *role;    /* system, user, assistant (others refused) */
    char *content; /* text */
};

struct serve_req {
    enum serve_kind kind;
    char *model;             /* NULL: not given (the one model served) */
    char *prompt;            /* completions */
    struct serve_msg *msgs;  /* chat */
    uint32_t n_msgs;
    uint32_t max_tokens;     /* valid when max_tokens_set */
    int max_tokens_set;
    double temperature;      /* 0: greedy; default 1 (OpenAI's) */
    double top_p;            /* default 1 (off) */
    uint64_t seed;           /* default 42 (sluice run's) */
    char *stop[SERVE_MAX_STOP];
    uint32_t n_stop;
    int stream;
    int include_usage;       /* stream_options.include_usage */
};

/* What the server will accept, known before any model is read. */
struct serve_limits {
    const char *model_id;  /* the served model's id: another one is a 404 */
    uint32_t max_tokens;   /* the largest max_tokens (the context length; 0: no limit yet) */
};

/* An error in OpenAI's shape:
 * {"error":{"message":...,"type":...,"param":...,"code":...}} */
struct serve_error {
    int status;        /* HTTP status (400, 401, 404, 408, 413, 429, 500, 503) */
    const char *type;  /* invalid_request_error, authentication_error, ... */
    const char *param; /* the offending field, or NULL */
    const char *code;  /* a machine-readable code, or NULL */
    char message[256];
};

void serve_error_set(struct serve_error *e, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The error's JSON body (malloc'ed), or NULL when out of memory. */
char *serve_error_json(const struct serve_error *e);

/* Parses a request body. Returns 0 with *r filled (free with
 * serve_req_free), or -EINVAL / -ENOMEM with *e filled (status 400, 404 for
 * an unknown model, 500 for memory) and *r left empty. */
int serve_req_parse(enum serve_kind kind, const char *body, size_t len,
                    const struct serve_limits *lim, struct serve_req *r, struct serve_error *e);
void serve_req_free(struct serve_req *r);

#endif
