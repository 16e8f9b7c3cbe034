/* serve_metrics.h: the server's counters and their Prometheus text
 * exposition (GET /metrics): requests by status, a time-to-first-token
 * histogram, prompt and generated tokens, generated tokens per second over
 * the last 10 seconds, and the engine's gauges (queue length, active
 * sessions, bytes the cold start streamed from storage). */
#ifndef SLUICE_SERVE_METRICS_H
#define SLUICE_SERVE_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "serve_engine.h"

#define SERVE_TTFT_BUCKETS 12
#define SERVE_RATE_WINDOW 10 /* seconds */

struct serve_metrics {
    pthread_mutex_t mu;
    uint64_t ttft_count[SERVE_TTFT_BUCKETS + 1]; /* the last: +Inf */
    double ttft_sum;
    uint64_t requests_2xx, requests_4xx, requests_5xx, cancelled;
    uint64_t prompt_tokens, generated_tokens;
    uint64_t rate_sec[SERVE_RATE_WINDOW]; /* tokens generated in second rate_at[i] */
    uint64_t rate_at[SERVE_RATE_WINDOW];
};

int serve_metrics_init(struct serve_metrics *m);
void serve_metrics_destroy(struct serve_metrics *m);
void serve_metrics_ttft(struct serve_metrics *m, double seconds);
void serve_metrics_tokens(struct serve_metrics *m, uint32_t prompt, uint32_t generated);
void serve_metrics_status(struct serve_metrics *m, int http_status);
void serve_metrics_cancelled(struct serve_metrics *m);
/* The exposition (malloc'ed), or NULL when out of memory. */
char *serve_metrics_render(struct serve_metrics *m, struct serve_engine *e);

#endif
