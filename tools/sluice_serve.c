/* sluice_serve.c: `sluice serve MODEL [options]`: an OpenAI-compatible HTTP
 * server (serve_http.c over libmicrohttpd, serve_api.c, serve_engine.c). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "serve_batch.h"
#include "serve_http.h"
#include "serve_model.h"
#include "sluice.h"
#include "tools_spec.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice serve MODEL [--host ADDR] [--port N] [--parallel N] [--queue N]\n"
            "                    [--lazy] [--api-key KEY] [options]\n\n"
            "An OpenAI-compatible HTTP server: POST /v1/completions and /v1/chat/completions\n"
            "(JSON, or server-sent events ending in `data: [DONE]` with \"stream\": true;\n"
            "temperature, top_p, max_tokens, stop, seed; usage in every answer), GET\n"
            "/v1/models, /health and /metrics (Prometheus text). Its errors come in OpenAI's\n"
            "shape (those libmicrohttpd gives itself, for a malformed request line or\n"
            "headers over its memory limit, do not). MODEL is a .sluice container or a\n"
            "directory where `sluice mount` serves one (its container is read). The model is\n"
            "loaded through the cold-start pipeline before listening starts, or with --lazy\n"
            "by the first request. Stops on SIGINT or SIGTERM.\n"
            "  --host ADDR      address to listen on (default 127.0.0.1: this machine only)\n"
            "  --port N         TCP port, 0..65535 (default 8080; 0: any free port); the\n"
            "                   address is printed on stderr once the server listens\n"
            "  --parallel N     sessions generating at once over the one loaded model, each\n"
            "                   with its own KV cache, 1..256 (default 4); their decode\n"
            "                   steps and prompts are batched into one forward pass over\n"
            "                   the weights (continuous batching: the same text as each\n"
            "                   alone)\n"
            "  --batch-lanes N  batched forward passes that may run at once, each on the\n"
            "                   thread of one of its sessions, 1..8 (default 2: while one\n"
            "                   runs, the sessions of the other send their tokens)\n"
            "  --no-batch       every session runs its own forward passes (no batching\n"
            "                   across sessions; for comparison)\n"
            "  --queue N        requests that may wait for a session, 0..65536 (default 64);\n"
            "                   more get 429\n"
            "  --lazy           read nothing until the first request, which cold-starts the\n"
            "                   model with its own prompt (its answer says so, with its time\n"
            "                   to first token); later requests find it loaded\n"
            "  --api-key KEY    require `Authorization: Bearer KEY` (401 otherwise; /health\n"
            "                   is open); default: none\n"
            "  --model-id NAME  the model's id in /v1/models and requests (default: MODEL's\n"
            "                   file name without .sluice); a request naming another gets 404\n"
            "  --max-body N     request body limit in bytes, 1..1073741824 (default 1048576;\n"
            "                   more gets 413)\n"
            "  --timeout S      seconds a request's body may take to arrive (408 after it)\n"
            "                   and an idle connection may stay open, 1..3600 (default 10)\n"
            "  --max-conns N    connections at once, each with its own thread, 1..65536\n"
            "                   (default 256)\n"
            "  --npu-share F    the NPU device thread's share of each int8 matmul of a\n"
            "                   decode step (and of float ones in a batched step), 0 <= F < 1\n"
            "                   (default 0: the stepping thread alone; the text is the same\n"
            "                   for any share)\n"
            "  --chunk N        prefill chunk rows, 1..65536 (default 256)\n"
            "  --cpu-workers N  the cold start's CPU worker threads, 1..8 (default one\n"
            "                   per core the process may run on, at most 8)\n"
            "  --policy P       the cold start's scheduling policy (sluice run --help)\n"
            "Speculative decoding of every reply (the answer's \"sluice\".\"spec\" has its\n"
            "statistics, and a line per reply goes to stderr). A reply that speculates\n"
            "runs its own forward passes (its session leaves the batch while it does): a\n"
            "draft tree of 4-16 rows is verified in one forward with its tree mask, which a\n"
            "batched step's one row a session cannot carry; the others keep batching. Its\n"
            "rows equal one-row steps bit for bit, batched or alone, so greedy text is\n"
            "the same as with --spec off, token for token:\n");
    tools_spec_usage(f);
}

struct serve_opts {
    const char *model;
    struct serve_http_opts http;
    struct serve_engine_opts engine;
};

/* 0, 1 for --help (printed), -1 on a usage error (printed). */
static int serve_parse(int argc, char **argv, struct serve_opts *o)
{
    uint32_t port = 8080, max_body = 1u << 20, timeout = 10, conns = 256;
    const char *policy;
    *o = (struct serve_opts){.http = {.host = "127.0.0.1"},
                             .engine = {.parallel = 4, .queue = 64, .batch_lanes = 2}};
    infer_pipeline_opts_init(&o->engine.pipeline);
    struct tools_args a = {"sluice serve", usage, argc, argv, 0};
    for (a.i = 1; a.i < argc; a.i++) {
        const char *s = argv[a.i];
        int bad = 0;
        if (tools_args_help(&a)) {
            return 1;
        } else if (!strcmp(s, "--host")) {
            bad = tools_args_value(&a, &o->http.host);
        } else if (!strcmp(s, "--port")) {
            bad = tools_args_u32(&a, 0, 65535, &port);
        } else if (!strcmp(s, "--parallel")) {
            bad = tools_args_u32(&a, 1, 256, &o->engine.parallel);
        } else if (!strcmp(s, "--queue")) {
            bad = tools_args_u32(&a, 0, 65536, &o->engine.queue);
        } else if (!strcmp(s, "--lazy")) {
            o->engine.lazy = 1;
        } else if (!strcmp(s, "--no-batch")) {
            o->engine.no_batch = 1;
        } else if (!strcmp(s, "--batch-lanes")) {
            bad = tools_args_u32(&a, 1, SERVE_BATCH_MAX_LANES, &o->engine.batch_lanes);
        } else if (!strcmp(s, "--api-key")) {
            bad = tools_args_value(&a, &o->http.api_key);
        } else if (!strcmp(s, "--model-id")) {
            bad = tools_args_value(&a, &o->http.model_id);
        } else if (!strcmp(s, "--max-body")) {
            bad = tools_args_u32(&a, 1, 1u << 30, &max_body);
        } else if (!strcmp(s, "--timeout")) {
            bad = tools_args_u32(&a, 1, 3600, &timeout);
        } else if (!strcmp(s, "--max-conns")) {
            bad = tools_args_u32(&a, 1, 65536, &conns);
        } else if (!strcmp(s, "--npu-share")) {
            bad = tools_args_double(&a, 0, 1, TOOLS_ARGS_BELOW_MAX, &o->engine.npu_share);
        } else if (!strcmp(s, "--chunk")) {
            bad = tools_args_u32(&a, 1, 65536, &o->engine.pipeline.chunk);
        } else if (!strcmp(s, "--cpu-workers")) {
            bad = tools_args_u32(&a, 1, INFER_PIPELINE_MAX_CPU_WORKERS,
                                 &o->engine.pipeline.cpu_workers);
        } else if ((bad = tools_spec_arg(&a, s, &o->engine.spec)) != 0) {
            bad = bad < 0;
        } else if (!strcmp(s, "--policy")) {
            bad = tools_args_value(&a, &policy);
            if (!bad && infer_policy_parse(policy, &o->engine.pipeline.policy) < 0) {
                fprintf(stderr, "sluice serve: --policy wants full, sequential, layer_overlap, "
                                "llmnpu or sequential_granular, not '%s'\n", policy);
                bad = 1;
            }
        } else {
            bad = tools_args_operand(&a, &o->model);
        }
        if (bad)
            return -1;
    }
    if (tools_args_need(&a, o->model, "MODEL") < 0)
        return -1;
    if (o->http.model_id && strpbrk(o->http.model_id, "\"\\")) {
        fprintf(stderr, "sluice serve: --model-id may not contain '\"' or '\\'\n");
        return -1;
    }
    o->http.port = (uint16_t)port;
    o->http.max_body = max_body;
    o->http.timeout_s = timeout;
    o->http.max_conns = conns;
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    struct serve_opts o;
    int ret = serve_parse(argc, argv, &o);
    if (ret)
        return ret > 0 ? 0 : 2;
    struct sl_err err = {{0}};
    char path[4096], id[256];
    if (serve_model_resolve(o.model, path, sizeof path, id, sizeof id, &err) < 0) {
        fprintf(stderr, "sluice serve: %s\n", err.msg);
        return 1;
    }
    if (!o.http.model_id)
        o.http.model_id = id;
    o.engine.path = path;
    /* signals: taken by sigwait below; every thread inherits the mask */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct serve_metrics metrics;
    struct serve_engine *engine = NULL;
    struct serve_http *http = NULL;
    if ((ret = serve_metrics_init(&metrics)) < 0) {
        fprintf(stderr, "sluice serve: cannot set up metrics (%s)\n", strerror(-ret));
        return 1;
    }
    ret = serve_engine_create(&o.engine, &engine, &err);
    if (ret == 0)
        ret = serve_http_start(&o.http, engine, &metrics, &http, &err);
    if (ret < 0) {
        fprintf(stderr, "sluice serve: %s\n", err.msg[0] ? err.msg : strerror(-ret));
        serve_engine_destroy(engine);
        serve_metrics_destroy(&metrics);
        return 1;
    }
    fprintf(stderr, "sluice serve: %s (%s), %u sessions, listening on http://%s:%u%s%s\n",
            o.http.model_id, path, o.engine.parallel, o.http.host, serve_http_port(http),
            o.engine.lazy ? " (lazy: the first request loads the model)" : "",
            o.engine.spec.on ? ", speculative decoding" : "");
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "sluice serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    serve_http_stop(http);
    serve_engine_destroy(engine);
    serve_metrics_destroy(&metrics);
    return 0;
}
