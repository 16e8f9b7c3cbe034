/* bench_serve_internal.h: what the two files of `sluice bench serve` share:
 * bench_serve.c (options, the servers under test, the report) and
 * bench_serve_load.c (servers as child processes, the clients of one level,
 * the cold runs). */
#ifndef SLUICE_BENCH_SERVE_INTERNAL_H
#define SLUICE_BENCH_SERVE_INTERNAL_H

#include <stdint.h>
#include <sys/types.h>

#define MAX_LEVELS 8

struct bs_opts {
    const char *model, *llama, *gguf, *flashrun;
    uint32_t levels[MAX_LEVELS], n_levels;
    uint32_t requests, max_tokens, runs, parallel, slots, threads, cold, mbps, lanes;
    double npu_share;
    int json, unbatched;
};

/* A server as a child process: its pid (its own process group), port, log. */
struct bs_srv {
    pid_t pid;
    int port;
    char log[256];
};

/* One level's result. */
struct bs_level {
    double ttft_p50, ttft_p99, tok_s;
    uint32_t errors;
};

/* A free loopback TCP port, or -1. */
int bs_free_port(void);
/* Starts argv (its own process group, output to a log file) and waits until
 * GET /health answers 200 on s->port (60 s at most). */
int bs_srv_start(const char *const *argv, const char *name, struct bs_srv *s);
/* SIGTERM to its process group, SIGKILL after 5 s; reaps it. */
void bs_srv_stop(struct bs_srv *s);
/* `clients` clients, each o->requests streaming requests one after another,
 * against the server on port. */
int bs_run_level(int port, uint32_t clients, const struct bs_opts *o, struct bs_level *out);
/* One cold `sluice run` under flashrun: its ttft_s. */
int bs_cold_run(const struct bs_opts *o, double *ttft);
/* The first request to a cold `sluice serve --lazy` under flashrun. */
int bs_cold_lazy(const struct bs_opts *o, double *ttft);

#endif
