/* serve_req.c: request bodies of /v1/completions and /v1/chat/completions
 * to struct serve_req (libcjson), with OpenAI's rules and error shape: every
 * field of the wrong type or out of range is a 400 naming the field. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_req.h"

void serve_error_set(struct serve_error *e, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->param = param;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *serve_error_json(const struct serve_error *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *in = o ? cJSON_AddObjectToObject(o, "error") : NULL;
    char *s = NULL;
    if (in && cJSON_AddStringToObject(in, "message", e->message) &&
        cJSON_AddStringToObject(in, "type", e->type ? e->type : "invalid_request_error") &&
        (e->param ? cJSON_AddStringToObject(in, "param", e->param)
                  : cJSON_AddNullToObject(in, "param")) &&
        (e->code ? cJSON_AddStringToObject(in, "code", e->code)
                 : cJSON_AddNullToObject(in, "code")))
        s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static int bad(struct serve_error *e, const char *param, const char *fmt, const char *what)
{
    serve_error_set(e, 400, "invalid_request_error", param, NULL, fmt, what);
    return -EINVAL;
}

static int nomem(struct serve_error *e)
{
    serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return -ENOMEM;
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

/* A JSON number that is a whole number in [min, max]. */
static int whole(const cJSON *v, double min, double max, double *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < min || d > max)
        return -1;
    *out = d;
    return 0;
}

/* A number in [min, max]; null leaves *out. */
static int number_in(const cJSON *o, const char *key, double min, double max, double *out,
                     struct serve_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v))
        return bad(e, key, "'%s' must be a number", key);
    if (!(v->valuedouble >= min && v->valuedouble <= max)) {
        serve_error_set(e, 400, "invalid_request_error", key, "invalid_value",
                        "'%s' must be between %g and %g, not %g", key, min, max, v->valuedouble);
        return -EINVAL;
    }
    *out = v->valuedouble;
    return 0;
}

/* "text" or [{"type":"text","text":...}, ...] concatenated; null is "". */
static int content_text(const cJSON *c, char **out, struct serve_error *e)
{
    if (!c || cJSON_IsNull(c))
        return (*out = dup_str("")) ? 0 : nomem(e);
    if (cJSON_IsString(c))
        return (*out = dup_str(c->valuestring)) ? 0 : nomem(e);
    if (!cJSON_IsArray(c))
        return bad(e, "messages", "a message's '%s' must be a string or an array of text parts",
                   "content");
    size_t len = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return bad(e, "messages", "%s", "only text content parts are supported");
        len += strlen(text->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s)
        return nomem(e);
    s[0] = 0;
    len = 0;
    cJSON_ArrayForEach(p, c)
    {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(s + len, t, n + 1);
        len += n;
    }
    *out = s;
    return 0;
}

static int parse_messages(const cJSON *o, struct serve_req *r, struct serve_error *e)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!m)
        return bad(e, "messages", "'%s' is required", "messages");
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0)
        return bad(e, "messages", "'%s' must be a non-empty array", "messages");
    int n = cJSON_GetArraySize(m);
    r->msgs = calloc((size_t)n, sizeof *r->msgs);
    if (!r->msgs)
        return nomem(e);
    const cJSON *it;
    cJSON_ArrayForEach(it, m)
    {
        if (!cJSON_IsObject(it))
            return bad(e, "messages", "each of '%s' must be an object", "messages");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        if (!cJSON_IsString(role))
            return bad(e, "messages", "each message needs a string '%s'", "role");
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer"))
            rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant")) {
            serve_error_set(e, 400, "invalid_request_error", "messages", "invalid_value",
                            "a message's role must be system, developer, user or assistant, "
                            "not '%.64s'", rs);
            return -EINVAL;
        }
        struct serve_msg *sm = &r->msgs[r->n_msgs];
        if (!(sm->role = dup_str(rs)))
            return nomem(e);
        r->n_msgs++;
        int ret = content_text(cJSON_GetObjectItemCaseSensitive(it, "content"), &sm->content, e);
        if (ret < 0)
            return ret;
    }
    return 0;
}

static int parse_prompt(const cJSON *o, struct serve_req *r, struct serve_error *e)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (!p || cJSON_IsNull(p))
        return bad(e, "prompt", "'%s' is required", "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child))
        p = p->child;
    if (!cJSON_IsString(p))
        return bad(e, "prompt", "'%s' must be a string (or an array of one string)", "prompt");
    return (r->prompt = dup_str(p->valuestring)) ? 0 : nomem(e);
}

static int parse_stop(const cJSON *o, struct serve_req *r, struct serve_error *e)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (!s || cJSON_IsNull(s))
        return 0;
    if (cJSON_IsString(s)) {
        if (!s->valuestring[0])
            return 0;
    } else if (!cJSON_IsArray(s) || cJSON_GetArraySize(s) > SERVE_MAX_STOP) {
        return bad(e, "stop", "'%s' must be a string or an array of at most 4 strings", "stop");
    }
    const cJSON *first = cJSON_IsString(s) ? s : s->child;
    for (const cJSON *it = first; it; it = cJSON_IsString(s) ? NULL : it->next) {
        if (!cJSON_IsString(it))
            return bad(e, "stop", "'%s' must be a string or an array of at most 4 strings",
                       "stop");
        size_t n = strlen(it->valuestring);
        if (n > SERVE_MAX_STOP_LEN)
            return bad(e, "stop", "a '%s' sequence is longer than 64 bytes", "stop");
        if (n == 0)
            continue;
        if (!(r->stop[r->n_stop] = dup_str(it->valuestring)))
            return nomem(e);
        r->n_stop++;
    }
    return 0;
}

static int parse_common(const cJSON *o, const struct serve_limits *lim, struct serve_req *r,
                        struct serve_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v))
            return bad(e, "model", "'%s' must be a string", "model");
        if (lim && lim->model_id && strcmp(v->valuestring, lim->model_id)) {
            serve_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                            "The model '%.80s' does not exist; this server has '%.80s'",
                            v->valuestring, lim->model_id);
            return -EINVAL;
        }
        if (!(r->model = dup_str(v->valuestring)))
            return nomem(e);
    }
    const char *mt = "max_tokens";
    v = cJSON_GetObjectItemCaseSensitive(o, mt);
    if ((!v || cJSON_IsNull(v)) && r->kind == SERVE_CHAT) {
        mt = "max_completion_tokens";
        v = cJSON_GetObjectItemCaseSensitive(o, mt);
    }
    if (v && !cJSON_IsNull(v)) {
        double d;
        if (whole(v, 1, 4294967295.0, &d) < 0)
            return bad(e, mt, "'%s' must be a whole number of at least 1", mt);
        if (lim && lim->max_tokens && d > lim->max_tokens) {
            serve_error_set(e, 400, "invalid_request_error", mt, "context_length_exceeded",
                            "'%s' is %.0f, more than the model's context of %u tokens", mt, d,
                            lim->max_tokens);
            return -EINVAL;
        }
        r->max_tokens = (uint32_t)d;
        r->max_tokens_set = 1;
    }
    int ret;
    if ((ret = number_in(o, "temperature", 0, 2, &r->temperature, e)) < 0 ||
        (ret = number_in(o, "top_p", 0, 1, &r->top_p, e)) < 0)
        return ret;
    v = cJSON_GetObjectItemCaseSensitive(o, "seed");
    if (v && !cJSON_IsNull(v)) {
        double d;
        if (whole(v, -9007199254740992.0, 9007199254740992.0, &d) < 0)
            return bad(e, "seed", "'%s' must be a whole number", "seed");
        r->seed = (uint64_t)(int64_t)d;
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "n");
    if (v && !cJSON_IsNull(v)) {
        double d;
        if (whole(v, 1, 1, &d) < 0)
            return bad(e, "n", "'%s' must be 1 (one choice per request)", "n");
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "stream");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v))
            return bad(e, "stream", "'%s' must be a boolean", "stream");
        r->stream = cJSON_IsTrue(v);
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    if (v && !cJSON_IsNull(v)) {
        const cJSON *u = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "include_usage")
                                           : NULL;
        if (!cJSON_IsObject(v) || (u && !cJSON_IsBool(u)))
            return bad(e, "stream_options", "'%s' must be an object with a boolean include_usage",
                       "stream_options");
        r->include_usage = cJSON_IsTrue(u);
    }
    return parse_stop(o, r, e);
}

int serve_req_parse(enum serve_kind kind, const char *body, size_t len,
                    const struct serve_limits *lim, struct serve_req *r, struct serve_error *e)
{
    *r = (struct serve_req){.kind = kind, .temperature = 1.0, .top_p = 1.0, .seed = 42};
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    while (o && end && end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' ||
                                            *end == '\r'))
        end++;
    if (o && end && end < body + len) { /* something after the object */
        cJSON_Delete(o);
        o = NULL;
    }
    if (!o) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        serve_error_set(e, 400, "invalid_request_error", NULL, NULL,
                        "We could not parse the JSON body of your request (near byte %zu); "
                        "expected a JSON object",
                        at);
        return -EINVAL;
    }
    int ret;
    if (!cJSON_IsObject(o))
        ret = bad(e, NULL, "%s", "the request body must be a JSON object");
    else if ((ret = kind == SERVE_CHAT ? parse_messages(o, r, e) : parse_prompt(o, r, e)) == 0)
        ret = parse_common(o, lim, r, e);
    cJSON_Delete(o);
    if (ret < 0)
        serve_req_free(r);
    return ret;
}

void serve_req_free(struct serve_req *r)
{
    free(r->model);
    free(r->prompt);
    for (uint32_t i = 0; i < r->n_msgs; i++) {
        free(r->msgs[i].role);
        free(r->msgs[i].content);
    }
    free(r->msgs);
    for (uint32_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    enum serve_kind k = r->kind;
    *r = (struct serve_req){.kind = k};
}
