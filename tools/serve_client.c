/* serve_client.c: completion requests over libcurl, answers parsed with
 * libcjson (serve_client.h). */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_client.h"
#include "tools_dl.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct rx {
    struct serve_client_result *r;
    int stream, oom;
    size_t parsed; /* body[0..parsed) went through the SSE parser */
    double t0;
};

static int grow(char **s, size_t *len, const char *add, size_t n)
{
    char *p = realloc(*s, *len + n + 1);
    if (!p)
        return -1;
    memcpy(p + *len, add, n);
    *len += n;
    p[*len] = 0;
    *s = p;
    return 0;
}

/* choices[0]'s text (text, delta.content or message.content), finish_reason
 * and usage, from one answer object. */
static int take_object(struct rx *x, const cJSON *o)
{
    struct serve_client_result *r = x->r;
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (cJSON_IsObject(u)) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        if (cJSON_IsNumber(p))
            r->prompt_tokens = (uint32_t)p->valuedouble;
        if (cJSON_IsNumber(c))
            r->completion_tokens = (uint32_t)c->valuedouble;
    }
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(o, "choices");
    if (!cJSON_IsArray(ch))
        return -1;
    const cJSON *c0 = cJSON_GetArrayItem(ch, 0);
    if (!c0)
        return 0; /* a usage-only chunk */
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(c0, "text");
    if (!t) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(c0, "delta");
        if (!m)
            m = cJSON_GetObjectItemCaseSensitive(c0, "message");
        t = cJSON_GetObjectItemCaseSensitive(m, "content");
    }
    if (cJSON_IsString(t) && t->valuestring[0]) {
        if (!r->ttft_s)
            r->ttft_s = now_s() - x->t0;
        if (grow(&r->text, &r->text_len, t->valuestring, strlen(t->valuestring)) < 0)
            x->oom = 1;
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(c0, "finish_reason");
    if (cJSON_IsString(f))
        snprintf(r->finish, sizeof r->finish, "%s", f->valuestring);
    return 0;
}

/* Complete events ("...\n\n") not parsed yet. */
static void parse_events(struct rx *x)
{
    struct serve_client_result *r = x->r;
    for (;;) {
        char *start = r->body + x->parsed;
        char *end = strstr(start, "\n\n");
        if (!end)
            return;
        *end = 0;
        for (char *line = start; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl)
                *nl = 0;
            if (!strncmp(line, "data: ", 6)) {
                r->events++;
                if (!strcmp(line + 6, "[DONE]")) {
                    r->done = 1;
                } else {
                    cJSON *o = cJSON_Parse(line + 6);
                    if (!o || take_object(x, o) < 0)
                        r->bad_event = 1;
                    cJSON_Delete(o);
                }
            }
            if (nl)
                *nl = '\n';
            line = nl ? nl + 1 : NULL;
        }
        *end = '\n';
        x->parsed = (size_t)(end - r->body) + 2;
    }
}

static size_t on_data(char *p, size_t size, size_t n, void *ctx)
{
    struct rx *x = ctx;
    if (grow(&x->r->body, &x->r->body_len, p, size * n) < 0) {
        x->oom = 1;
        return 0;
    }
    if (x->stream)
        parse_events(x);
    return size * n;
}

static int request(const char *url, const char *api_key, const char *body, int stream,
                   double timeout_s, struct serve_client_result *r, char *err, size_t err_len)
{
    memset(r, 0, sizeof *r);
    CURL *c = curl_easy_init();
    if (!c) {
        snprintf(err, err_len, "curl_easy_init failed");
        return -1;
    }
    struct rx x = {.r = r, .stream = stream, .t0 = now_s()};
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    char auth[512];
    if (api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", api_key);
        h = curl_slist_append(h, auth);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    CURLcode rc = curl_easy_perform(c);
    r->total_s = now_s() - x.t0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK || x.oom) {
        snprintf(err, err_len, "%s: %s", url, x.oom ? "out of memory" : curl_easy_strerror(rc));
        return -1;
    }
    if (!r->body && grow(&r->body, &r->body_len, "", 0) < 0) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    if (!stream && body) {
        cJSON *o = cJSON_Parse(r->body);
        if (o && r->status == 200 && take_object(&x, o) < 0)
            r->bad_event = 1;
        cJSON_Delete(o);
    }
    if (!r->text && grow(&r->text, &r->text_len, "", 0) < 0) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    return 0;
}

int serve_client_post(const char *url, const char *api_key, const char *body, int stream,
                      double timeout_s, struct serve_client_result *r, char *err, size_t err_len)
{
    return request(url, api_key, body, stream, timeout_s, r, err, err_len);
}

int serve_client_get(const char *url, const char *api_key, struct serve_client_result *r,
                     char *err, size_t err_len)
{
    return request(url, api_key, NULL, 0, 30, r, err, err_len);
}

void serve_client_result_free(struct serve_client_result *r)
{
    free(r->body);
    free(r->text);
    memset(r, 0, sizeof *r);
}

int serve_client_global_init(char *err, size_t err_len)
{
    struct sl_err e;
    if (tools_dl_curl(&e) < 0) {
        snprintf(err, err_len, "%s", e.msg);
        return -1;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(err, err_len, "curl_global_init failed");
        return -1;
    }
    return 0;
}
