/* serve_metrics.c: counters and the Prometheus text format (version 0.0.4). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_metrics.h"

/* upper bounds of the TTFT histogram, seconds */
static const double ttft_le[SERVE_TTFT_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                   0.5,   1,    2.5,   5,    10,  30};

int serve_metrics_init(struct serve_metrics *m)
{
    memset(m, 0, sizeof *m);
    return -pthread_mutex_init(&m->mu, NULL);
}

void serve_metrics_destroy(struct serve_metrics *m)
{
    pthread_mutex_destroy(&m->mu);
}

void serve_metrics_ttft(struct serve_metrics *m, double s)
{
    int b = 0;
    while (b < SERVE_TTFT_BUCKETS && s > ttft_le[b])
        b++;
    pthread_mutex_lock(&m->mu);
    m->ttft_count[b]++;
    m->ttft_sum += s;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_tokens(struct serve_metrics *m, uint32_t prompt, uint32_t generated)
{
    uint64_t sec = sl_now_ns() / 1000000000ull;
    int i = (int)(sec % SERVE_RATE_WINDOW);
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += prompt;
    m->generated_tokens += generated;
    if (m->rate_at[i] != sec) {
        m->rate_at[i] = sec;
        m->rate_sec[i] = 0;
    }
    m->rate_sec[i] += generated;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_status(struct serve_metrics *m, int st)
{
    pthread_mutex_lock(&m->mu);
    if (st < 400)
        m->requests_2xx++;
    else if (st < 500)
        m->requests_4xx++;
    else
        m->requests_5xx++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_cancelled(struct serve_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->cancelled++;
    pthread_mutex_unlock(&m->mu);
}

struct out {
    char *s;
    size_t len, cap;
    int failed;
};

static void outf(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(struct out *o, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !o->failed; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->s + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->failed = 1;
            return;
        }
        if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = o->cap * 2 + (size_t)n + 1;
        char *p = realloc(o->s, cap);
        if (!p) {
            o->failed = 1;
            return;
        }
        o->s = p;
        o->cap = cap;
    }
}

char *serve_metrics_render(struct serve_metrics *m, struct serve_engine *e)
{
    struct serve_engine_counters c;
    serve_engine_counters(e, &c);
    struct out o = {.s = malloc(4096), .cap = 4096};
    if (!o.s)
        return NULL;
    o.s[0] = 0;
    pthread_mutex_lock(&m->mu); /* a consistent view */
    const struct serve_metrics *s = m;
    uint64_t now = sl_now_ns() / 1000000000ull, recent = 0;
    for (int i = 0; i < SERVE_RATE_WINDOW; i++)
        if (s->rate_at[i] + SERVE_RATE_WINDOW > now && s->rate_at[i] != now)
            recent += s->rate_sec[i]; /* the last 10 whole seconds */
    outf(&o, "# HELP sluice_ttft_seconds Time from a request's arrival to its first token.\n"
             "# TYPE sluice_ttft_seconds histogram\n");
    uint64_t cum = 0;
    for (int b = 0; b < SERVE_TTFT_BUCKETS; b++) {
        cum += s->ttft_count[b];
        outf(&o, "sluice_ttft_seconds_bucket{le=\"%g\"} %llu\n", ttft_le[b],
             (unsigned long long)cum);
    }
    cum += s->ttft_count[SERVE_TTFT_BUCKETS];
    outf(&o, "sluice_ttft_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    outf(&o, "sluice_ttft_seconds_sum %.6f\nsluice_ttft_seconds_count %llu\n", s->ttft_sum,
         (unsigned long long)cum);
    outf(&o,
         "# HELP sluice_tokens_per_second Tokens generated per second, all sessions, over the "
         "last %d seconds.\n# TYPE sluice_tokens_per_second gauge\nsluice_tokens_per_second "
         "%.3f\n",
         SERVE_RATE_WINDOW, (double)recent / SERVE_RATE_WINDOW);
    outf(&o, "# HELP sluice_generated_tokens_total Tokens generated.\n"
             "# TYPE sluice_generated_tokens_total counter\nsluice_generated_tokens_total %llu\n",
         (unsigned long long)s->generated_tokens);
    outf(&o, "# HELP sluice_prompt_tokens_total Prompt tokens of answered requests.\n"
             "# TYPE sluice_prompt_tokens_total counter\nsluice_prompt_tokens_total %llu\n",
         (unsigned long long)s->prompt_tokens);
    outf(&o,
         "# HELP sluice_requests_total Requests answered, by status class.\n"
         "# TYPE sluice_requests_total counter\n"
         "sluice_requests_total{status=\"2xx\"} %llu\nsluice_requests_total{status=\"4xx\"} "
         "%llu\nsluice_requests_total{status=\"5xx\"} %llu\n",
         (unsigned long long)s->requests_2xx, (unsigned long long)s->requests_4xx,
         (unsigned long long)s->requests_5xx);
    outf(&o, "# HELP sluice_cancelled_total Generations stopped because the client left.\n"
             "# TYPE sluice_cancelled_total counter\nsluice_cancelled_total %llu\n",
         (unsigned long long)s->cancelled);
    outf(&o, "# HELP sluice_queue_length Requests waiting for a session.\n"
             "# TYPE sluice_queue_length gauge\nsluice_queue_length %u\n",
         c.waiting);
    outf(&o, "# HELP sluice_active_sessions Sessions generating now.\n"
             "# TYPE sluice_active_sessions gauge\nsluice_active_sessions %u\n",
         c.active);
    outf(&o, "# HELP sluice_sessions Sessions open on the loaded model.\n"
             "# TYPE sluice_sessions gauge\nsluice_sessions %u\n",
         c.sessions);
    outf(&o,
         "# HELP sluice_storage_bytes_streamed_total Bytes the cold start streamed from "
         "storage.\n# TYPE sluice_storage_bytes_streamed_total counter\n"
         "sluice_storage_bytes_streamed_total %llu\n",
         (unsigned long long)c.bytes_streamed);
    outf(&o, "# HELP sluice_model_loaded 1 once the model is loaded.\n"
             "# TYPE sluice_model_loaded gauge\nsluice_model_loaded %d\n",
         c.loaded);
    outf(&o, "# HELP sluice_cold_start_ttft_seconds The cold start's time to first token.\n"
             "# TYPE sluice_cold_start_ttft_seconds gauge\nsluice_cold_start_ttft_seconds %.6f\n",
         c.cold_ttft_s);
    outf(&o,
         "# HELP sluice_batch_steps_total Forward passes of the sessions' batched steps.\n"
         "# TYPE sluice_batch_steps_total counter\nsluice_batch_steps_total %llu\n"
         "# HELP sluice_batch_rows_total Rows (decode tokens and prompt tokens) in them.\n"
         "# TYPE sluice_batch_rows_total counter\nsluice_batch_rows_total %llu\n"
         "# HELP sluice_batch_multi_steps_total Passes that served more than one session.\n"
         "# TYPE sluice_batch_multi_steps_total counter\nsluice_batch_multi_steps_total %llu\n",
         (unsigned long long)c.batch_steps, (unsigned long long)c.batch_rows,
         (unsigned long long)c.batch_multi);
    pthread_mutex_unlock(&m->mu);
    if (o.failed) {
        free(o.s);
        return NULL;
    }
    return o.s;
}
