/* serve_api.c: a completion request from body to answer (serve_api.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_api.h"
#include "serve_text.h"

struct serve_call {
    struct serve_api *a;
    struct serve_req req;
    int *ids;
    uint32_t n_ids;
    struct serve_slot *slot;
    struct serve_gen gen;
    char *stops[SERVE_MAX_STOP + 1]; /* the request's, and the template's turn end */
    uint32_t n_stops;
    uint64_t t_arrival, t_first;
    int cold, gen_ready, counted;
    char id[48];
    long long created;
    serve_cancel_fn gone;
    void *gctx;
    /* streaming */
    char *out;
    size_t out_len, out_off, out_cap;
    int phase; /* 0: role chunk next (chat), 1: tokens, 2: [DONE] next, 3: ended */
};

char *serve_api_error(int status, const char *type, const char *code, const char *message)
{
    struct serve_error e;
    serve_error_set(&e, status, type, NULL, code, "%s", message);
    return serve_error_json(&e);
}

static int fail(struct serve_error *e, int *status, char **json)
{
    *status = e->status;
    *json = serve_error_json(e);
    return 0;
}

/* The prompt text: the completion's, or the chat rendered with the model's
 * template (whose turn end becomes one more stop sequence). */
static int build_prompt(struct serve_call *c, char **text, struct serve_error *e)
{
    struct serve_req *r = &c->req;
    for (uint32_t i = 0; i < r->n_stop; i++)
        c->stops[c->n_stops++] = r->stop[i];
    if (r->kind == SERVE_COMPLETIONS) {
        *text = r->prompt;
        return 0;
    }
    const char *turn_end;
    enum serve_template t = serve_template_detect(serve_engine_chat_template(c->a->e));
    *text = serve_template_render(t, r->msgs, r->n_msgs, &turn_end);
    if (!*text) {
        serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return -ENOMEM;
    }
    c->stops[c->n_stops++] = (char *)turn_end;
    return 0;
}

static int tokenize(struct serve_call *c, const char *text, struct serve_error *e)
{
    const struct format_config *cfg = serve_engine_config(c->a->e);
    uint32_t n = 0;
    int ret = infer_tokenizer_encode(serve_engine_tokenizer(c->a->e), text, 1, NULL, 0, &n);
    if (ret < 0 && ret != -ENOSPC) {
        serve_error_set(e, 500, "server_error", NULL, NULL, "cannot encode the prompt");
        return ret;
    }
    if (n > cfg->seq_len) {
        serve_error_set(e, 400, "invalid_request_error",
                        c->req.kind == SERVE_CHAT ? "messages" : "prompt",
                        "context_length_exceeded",
                        "This model's maximum context length is %u tokens; the prompt is %u",
                        cfg->seq_len, n);
        return -EINVAL;
    }
    c->ids = malloc(sizeof(int) * (n ? n : 1));
    if (!c->ids) {
        serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return -ENOMEM;
    }
    infer_tokenizer_encode(serve_engine_tokenizer(c->a->e), text, 1, c->ids, n, &c->n_ids);
    /* sluice run's room: the last token taken need not be run */
    uint32_t room = cfg->seq_len - c->n_ids + 1;
    if (c->req.max_tokens_set && c->req.max_tokens > room) {
        serve_error_set(e, 400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                        "This model's maximum context length is %u tokens; you requested %u "
                        "(%u in the prompt, %u to generate, at most %u fit)",
                        cfg->seq_len, c->n_ids + c->req.max_tokens, c->n_ids, c->req.max_tokens,
                        room);
        return -EINVAL;
    }
    if (!c->req.max_tokens_set) /* OpenAI's defaults: 16 for completions, the rest for chat */
        c->req.max_tokens = c->req.kind == SERVE_COMPLETIONS && room > 16 ? 16 : room;
    return 0;
}

static void call_id(struct serve_call *c)
{
    static atomic_uint_fast64_t counter;
    uint64_t k = atomic_fetch_add(&counter, 1) + 1;
    snprintf(c->id, sizeof c->id, "%s-%" PRIx64 "%06" PRIx64,
             c->req.kind == SERVE_CHAT ? "chatcmpl" : "cmpl", (uint64_t)(sl_now_ns() & 0xffffffffffull), (uint64_t)k);
    c->created = (long long)time(NULL);
}

static void add_usage(cJSON *o, const struct serve_call *c)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    if (!u)
        return;
    cJSON_AddNumberToObject(u, "prompt_tokens", c->n_ids);
    cJSON_AddNumberToObject(u, "completion_tokens", c->gen.taken);
    cJSON_AddNumberToObject(u, "total_tokens", c->n_ids + c->gen.taken);
}

/* Sluice's own fields: whether this request cold-started the model and its
 * time to first token. */
static void add_timing(cJSON *o, const struct serve_call *c)
{
    cJSON *s = cJSON_AddObjectToObject(o, "sluice");
    if (!s)
        return;
    cJSON_AddBoolToObject(s, "cold_start", c->cold);
    cJSON_AddNumberToObject(s, "ttft_s",
                            c->t_first ? (double)(c->t_first - c->t_arrival) / 1e9 : 0.0);
    if (c->gen_ready && (c->gen.spec_r.on || c->gen.spec_r.off_why)) {
        struct tools_spec_result r;
        serve_gen_spec_result(&c->gen, &r);
        tools_spec_json(s, &r); /* "spec": drafted, accepted, mean acceptance length... */
    }
}

/* The server's log: a line on stderr per reply that speculated. */
static void log_spec(const struct serve_call *c)
{
    if (!c->gen_ready || !(c->gen.spec_r.on || c->gen.spec_r.off_why))
        return;
    struct tools_spec_result r;
    serve_gen_spec_result(&c->gen, &r);
    char line[320];
    tools_spec_line(line, sizeof line, &r);
    fprintf(stderr, "sluice serve: %s: %u tokens; %s", c->id, c->gen.taken,
            line[0] ? line : "spec: no round\n");
}

static const char *finish_name(enum serve_finish f)
{
    return f == SERVE_STOP ? "stop" : f == SERVE_LENGTH ? "length" : NULL;
}

/* A response object or chunk: choices[0] with text (or message/delta). */
static cJSON *envelope(const struct serve_call *c, int chunk, const char *text, size_t n,
                       int role, const char *finish)
{
    int chat = c->req.kind == SERVE_CHAT;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object",
                            chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                 : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", c->a->model_id);
    cJSON *arr = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    if (!arr || !ch) {
        cJSON_Delete(ch);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddItemToArray(arr, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    char *t = malloc(n + 1);
    if (!t) {
        cJSON_Delete(o);
        return NULL;
    }
    memcpy(t, text, n);
    t[n] = 0;
    if (chat) {
        cJSON *m = cJSON_AddObjectToObject(ch, chunk ? "delta" : "message");
        if (role || !chunk)
            cJSON_AddStringToObject(m, "role", "assistant");
        if (!chunk || n || role)
            cJSON_AddStringToObject(m, "content", t);
    } else {
        cJSON_AddStringToObject(ch, "text", t);
    }
    free(t);
    cJSON_AddNullToObject(ch, "logprobs");
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    return o;
}

static int client_gone(struct serve_call *c)
{
    return c->gone && c->gone(c->gctx);
}

static void note_first(struct serve_call *c)
{
    if (!c->t_first && c->gen.taken) {
        c->t_first = sl_now_ns();
        serve_metrics_ttft(c->a->m, (double)(c->t_first - c->t_arrival) / 1e9);
    }
}

/* Runs the generation to its end (non-streaming). */
static int run_all(struct serve_call *c, struct sl_err *err)
{
    while (c->gen.finish == SERVE_MORE) {
        int ret = serve_gen_next(&c->gen, err);
        if (ret < 0)
            return ret;
        note_first(c);
        if ((c->gen.taken & 7) == 0 && client_gone(c))
            return -ECANCELED;
    }
    return 0;
}

int serve_api_complete(struct serve_api *a, enum serve_kind kind, const char *body, size_t len,
                       uint64_t t_arrival_ns, serve_cancel_fn gone, void *gctx, int *status,
                       char **json, struct serve_call **stream)
{
    *json = NULL;
    *stream = NULL;
    struct serve_error e;
    struct sl_err err = {{0}};
    struct serve_call *c = calloc(1, sizeof *c);
    if (!c) {
        serve_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return fail(&e, status, json);
    }
    c->a = a;
    c->t_arrival = t_arrival_ns;
    c->gone = gone;
    c->gctx = gctx;
    struct serve_limits lim = {.model_id = a->model_id};
    int ret = serve_engine_open(a->e, &err);
    if (ret < 0) {
        serve_error_set(&e, 503, "server_error", NULL, NULL, "the model cannot be opened: %s",
                        err.msg);
        goto out_fail;
    }
    lim.max_tokens = serve_engine_config(a->e)->seq_len;
    if (serve_req_parse(kind, body, len, &lim, &c->req, &e) < 0)
        goto out_fail;
    char *text;
    if (build_prompt(c, &text, &e) < 0)
        goto out_fail;
    ret = tokenize(c, text, &e);
    if (text != c->req.prompt)
        free(text);
    if (ret < 0)
        goto out_fail;
    call_id(c);
    double cold_ttft;
    ret = serve_engine_acquire(a->e, c->ids, c->n_ids, gone, gctx, &c->slot, &c->cold, &cold_ttft,
                               &err);
    if (ret == -ECANCELED) {
        serve_call_free(c);
        return -ECANCELED;
    }
    if (ret == -EBUSY) {
        serve_error_set(&e, 429, "rate_limit_exceeded", NULL, "rate_limit_exceeded",
                        "every session is busy and the queue is full; try again later");
        goto out_fail;
    }
    if (ret < 0) {
        serve_error_set(&e, ret == -EINVAL ? 400 : 500,
                        ret == -EINVAL ? "invalid_request_error" : "server_error", NULL, NULL,
                        "%s", err.msg);
        goto out_fail;
    }
    struct infer_sampler_params sp = {.temperature = (float)c->req.temperature,
                                      .top_p = (float)c->req.top_p,
                                      .seed = c->req.seed};
    if ((ret = serve_gen_init(&c->gen, a->e, c->slot, &sp, c->req.max_tokens, c->stops,
                              c->n_stops, c->ids[c->n_ids - 1], &err)) < 0) {
        serve_error_set(&e, 500, "server_error", NULL, NULL, "%s", err.msg);
        goto out_fail;
    }
    c->gen_ready = 1;
    *status = 200;
    if (c->req.stream) {
        c->phase = kind == SERVE_CHAT ? 0 : 1;
        *stream = c;
        return 0;
    }
    if ((ret = run_all(c, &err)) == -ECANCELED) {
        serve_call_free(c);
        return -ECANCELED;
    }
    if (ret < 0) {
        serve_error_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s", err.msg);
        goto out_fail;
    }
    cJSON *o = envelope(c, 0, c->gen.text ? c->gen.text : "", c->gen.len, 0,
                        finish_name(c->gen.finish));
    if (o) {
        add_usage(o, c);
        add_timing(o, c);
        *json = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
    }
    log_spec(c);
    c->counted = 1;
    serve_metrics_tokens(a->m, c->n_ids, c->gen.taken);
    serve_call_free(c);
    if (!*json) {
        *status = 500;
        *json = serve_api_error(500, "server_error", NULL, "out of memory");
    }
    return 0;
out_fail:
    serve_call_free(c);
    return fail(&e, status, json);
}

/* ---- server-sent events --------------------------------------------------------------- */

static int out_put(struct serve_call *c, const char *s, size_t n)
{
    if (c->out_len + n > c->out_cap) {
        size_t cap = (c->out_len + n) * 2 + 256;
        char *p = realloc(c->out, cap);
        if (!p)
            return -ENOMEM;
        c->out = p;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, s, n);
    c->out_len += n;
    return 0;
}

static int out_event(struct serve_call *c, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s)
        return -ENOMEM;
    int ret = out_put(c, "data: ", 6);
    if (ret == 0)
        ret = out_put(c, s, strlen(s));
    if (ret == 0)
        ret = out_put(c, "\n\n", 2);
    free(s);
    return ret;
}

/* Fills c->out with the next event(s). */
static int produce(struct serve_call *c)
{
    struct sl_err err = {{0}};
    if (c->phase == 0) { /* chat: the assistant's role first, as OpenAI does */
        c->phase = 1;
        return out_event(c, envelope(c, 1, "", 0, 1, NULL));
    }
    if (c->phase == 2) {
        c->phase = 3;
        return out_put(c, "data: [DONE]\n\n", 14);
    }
    for (;;) {
        if (client_gone(c))
            return -ECANCELED;
        int ret = serve_gen_next(&c->gen, &err);
        if (ret < 0)
            return ret;
        note_first(c);
        size_t from, n;
        serve_gen_take(&c->gen, &from, &n);
        if (c->gen.finish != SERVE_MORE) {
            if (n && (ret = out_event(c, envelope(c, 1, c->gen.text + from, n, 0, NULL))) < 0)
                return ret;
            cJSON *o = envelope(c, 1, "", 0, 0, finish_name(c->gen.finish));
            if (o) {
                add_usage(o, c);
                add_timing(o, c);
            }
            log_spec(c);
            c->counted = 1;
            serve_metrics_tokens(c->a->m, c->n_ids, c->gen.taken);
            serve_engine_release(c->a->e, c->slot); /* the session is free before [DONE] */
            c->slot = NULL;
            c->phase = 2;
            if ((ret = out_event(c, o)) < 0 || !c->req.include_usage)
                return ret;
            /* stream_options.include_usage: OpenAI's usage chunk, no choices */
            cJSON *u = envelope(c, 1, "", 0, 0, NULL);
            if (u) {
                cJSON_DeleteItemFromArray(cJSON_GetObjectItemCaseSensitive(u, "choices"), 0);
                add_usage(u, c);
            }
            return out_event(c, u);
        }
        if (n)
            return out_event(c, envelope(c, 1, c->gen.text + from, n, 0, NULL));
    }
}

ssize_t serve_call_read(struct serve_call *c, char *buf, size_t max)
{
    if (c->out_off == c->out_len) {
        c->out_len = c->out_off = 0;
        if (c->phase == 3)
            return -1;
        if (produce(c) < 0)
            return -2;
    }
    size_t n = c->out_len - c->out_off;
    if (n > max)
        n = max;
    memcpy(buf, c->out + c->out_off, n);
    c->out_off += n;
    return (ssize_t)n;
}

void serve_call_free(struct serve_call *c)
{
    if (!c)
        return;
    if (c->gen_ready && !c->counted) { /* ended early: the client left or an error */
        serve_metrics_cancelled(c->a->m);
        serve_metrics_tokens(c->a->m, 0, c->gen.taken);
    }
    if (c->gen_ready)
        serve_gen_free(&c->gen);
    if (c->slot)
        serve_engine_release(c->a->e, c->slot);
    free(c->ids);
    free(c->out);
    serve_req_free(&c->req);
    free(c);
}
