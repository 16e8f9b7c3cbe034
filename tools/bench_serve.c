/* bench_serve.c: `sluice bench serve MODEL.sluice`: time to first token
 * (p50, p99) and total tokens/s of `sluice serve` at 1, 4 and 16 concurrent
 * streaming clients over loopback, side by side with llama.cpp's
 * llama-server on the same model (its GGUF), the two measured level by
 * level, interleaved run by run; and, with --cold, the first request to a
 * --lazy server against `sluice run`'s cold time to first token, both under
 * flashrun (page cache dropped, reads limited), interleaved. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_serve_internal.h"
#include "serve_client.h"
#include "sluice.h"
#include "tools_stats.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench serve MODEL.sluice [--llama-server PATH --gguf FILE]\n"
            "                          [--clients LIST] [--requests N] [--max-tokens N]\n"
            "                          [--runs K] [--parallel N] [--slots N] [--threads N]\n"
            "                          [--npu-share F] [--batch-lanes N] [--unbatched]\n"
            "                          [--cold K --flashrun PATH [--flash-mbps N]] [--json]\n\n"
            "Starts `sluice serve MODEL` (and llama-server on FILE, the same model as GGUF)\n"
            "on loopback and, for each number of concurrent clients, has every client send\n"
            "N streaming greedy completion requests one after another (8 prompts in turn,\n"
            "max_tokens 32 by default): time to first token (request sent to the first\n"
            "text received; p50 and p99 of the level's requests) and total tokens/s\n"
            "(completion tokens of the level / its wall time). The servers run side by side\n"
            "and are measured in turn, level by level, K runs (min and median over the runs;\n"
            "the machine's other load shows in the spread). One request warms each first.\n"
            "  --llama-server PATH  llama.cpp's llama-server binary (optional)\n"
            "  --gguf FILE      the model for llama-server\n"
            "  --clients LIST   concurrency levels, comma separated (default 1,4,16)\n"
            "  --requests N     requests per client per level, 1..10000 (default 8)\n"
            "  --max-tokens N   max_tokens of every request, 1..100000 (default 32)\n"
            "  --runs K         rounds over the levels, 1..100 (default 3)\n"
            "  --parallel N     sluice serve --parallel (sessions), 1..256 (default: the\n"
            "                   largest level)\n"
            "  --slots N        llama-server -np (slots, context 256 each; it batches them\n"
            "                   into one forward pass), 1..256 (default: the largest level)\n"
            "  --threads N      llama-server's threads, 1..256 (default 1: on a loaded\n"
            "                   2-core machine, 2 threads decoded 25x slower)\n"
            "  --npu-share F    sluice serve --npu-share, 0 <= F < 1 (default 0)\n"
            "  --batch-lanes N  sluice serve --batch-lanes, 1..8 (default: serve's)\n"
            "  --unbatched      also `sluice serve --no-batch` (each session its own forward\n"
            "                   passes), measured in turn with the others\n"
            "  --cold K         also K cold runs of each of: `sluice run MODEL -p PROMPT -n 8`\n"
            "                   (its ttft_s, from process start) and the first request to\n"
            "                   `sluice serve MODEL --lazy` (sent once it listens; measured\n"
            "                   by the client), each under flashrun, interleaved; 0..100\n"
            "                   (default 0)\n"
            "  --flashrun PATH  ../shared/tools/flashrun (needs root), for --cold\n"
            "  --flash-mbps N   flashrun's read limit, 1..100000 MB/s (default 800)\n"
            "  --json           one JSON object on stdout (the table goes to stderr)\n");
}

/* ---- the report -------------------------------------------------------------------------- */

#define N_SERVERS 3
static const char *server_names[N_SERVERS];

struct cell { /* one (level, server): a value per run */
    double p50[100], p99[100], tps[100];
    uint32_t errors;
};

static cJSON *minmed(double *v, size_t n, double scale)
{
    struct tools_stats st;
    tools_stats_compute(v, n, &st);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "min", st.min * scale);
    cJSON_AddNumberToObject(o, "median", st.median * scale);
    return o;
}

static int parse_levels(const char *s, struct bs_opts *o)
{
    o->n_levels = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        uint32_t v;
        if (o->n_levels == MAX_LEVELS || tools_parse_u32(t, &v) < 0 || v < 1 || v > 1024)
            return -1;
        o->levels[o->n_levels++] = v;
    }
    return o->n_levels ? 0 : -1;
}

static int parse(int argc, char **argv, struct bs_opts *o)
{
    *o = (struct bs_opts){.requests = 8, .max_tokens = 32, .runs = 3, .mbps = 800,
                       .threads = 1};
    parse_levels("1,4,16", o);
    struct tools_args a = {"sluice bench serve", usage, argc, argv, 0};
    for (a.i = 1; a.i < argc; a.i++) {
        const char *s = argv[a.i], *v;
        int bad = 0;
        if (tools_args_help(&a)) {
            return 1;
        } else if (!strcmp(s, "--llama-server")) {
            bad = tools_args_value(&a, &o->llama);
        } else if (!strcmp(s, "--gguf")) {
            bad = tools_args_value(&a, &o->gguf);
        } else if (!strcmp(s, "--clients")) {
            bad = tools_args_value(&a, &v);
            if (!bad && parse_levels(v, o) < 0) {
                fprintf(stderr, "sluice bench serve: --clients wants up to 8 numbers in 1..1024, "
                                "comma separated, not '%s'\n", v);
                bad = 1;
            }
        } else if (!strcmp(s, "--requests")) {
            bad = tools_args_u32(&a, 1, 10000, &o->requests);
        } else if (!strcmp(s, "--max-tokens")) {
            bad = tools_args_u32(&a, 1, 100000, &o->max_tokens);
        } else if (!strcmp(s, "--runs")) {
            bad = tools_args_u32(&a, 1, 100, &o->runs);
        } else if (!strcmp(s, "--parallel")) {
            bad = tools_args_u32(&a, 1, 256, &o->parallel);
        } else if (!strcmp(s, "--slots")) {
            bad = tools_args_u32(&a, 1, 256, &o->slots);
        } else if (!strcmp(s, "--threads")) {
            bad = tools_args_u32(&a, 1, 256, &o->threads);
        } else if (!strcmp(s, "--npu-share")) {
            bad = tools_args_double(&a, 0, 1, TOOLS_ARGS_BELOW_MAX, &o->npu_share);
        } else if (!strcmp(s, "--cold")) {
            bad = tools_args_u32(&a, 0, 100, &o->cold);
        } else if (!strcmp(s, "--flashrun")) {
            bad = tools_args_value(&a, &o->flashrun);
        } else if (!strcmp(s, "--flash-mbps")) {
            bad = tools_args_u32(&a, 1, 100000, &o->mbps);
        } else if (!strcmp(s, "--json")) {
            o->json = 1;
        } else if (!strcmp(s, "--batch-lanes")) {
            bad = tools_args_u32(&a, 1, 8, &o->lanes);
        } else if (!strcmp(s, "--unbatched")) {
            o->unbatched = 1;
        } else {
            bad = tools_args_operand(&a, &o->model);
        }
        if (bad)
            return -1;
    }
    if (tools_args_need(&a, o->model, "MODEL") < 0)
        return -1;
    if (!o->llama != !o->gguf) {
        fprintf(stderr, "sluice bench serve: --llama-server and --gguf go together\n");
        return -1;
    }
    if (o->cold && !o->flashrun) {
        fprintf(stderr, "sluice bench serve: --cold needs --flashrun PATH\n");
        return -1;
    }
    uint32_t top = 0;
    for (uint32_t i = 0; i < o->n_levels; i++)
        if (o->levels[i] > top)
            top = o->levels[i] > 256 ? 256 : o->levels[i];
    if (!o->parallel)
        o->parallel = top;
    if (!o->slots)
        o->slots = top;
    return 0;
}

static int start_servers(const struct bs_opts *o, struct bs_srv *srv, int n_srv)
{
    char par[16], slots[16], port[N_SERVERS][16], ctx[16], thr[16], share[32], lanes[16],
        exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -errno;
    exe[n] = 0;
    snprintf(par, sizeof par, "%u", o->parallel);
    snprintf(slots, sizeof slots, "%u", o->slots);
    snprintf(ctx, sizeof ctx, "%u", o->slots * 256);
    snprintf(thr, sizeof thr, "%u", o->threads);
    snprintf(share, sizeof share, "%g", o->npu_share);
    snprintf(lanes, sizeof lanes, "%u", o->lanes);
    for (int i = 0; i < n_srv; i++) {
        srv[i].port = bs_free_port();
        snprintf(port[i], sizeof port[i], "%d", srv[i].port);
    }
    const char *sl[] = {exe,       "serve",     o->model, "--port",      port[0], "--parallel",
                        par,       "--queue",   "4096",   "--max-conns", "4096",  "--npu-share",
                        share,     NULL,        NULL,     NULL};
    if (o->lanes) {
        sl[13] = "--batch-lanes";
        sl[14] = lanes;
    }
    int ret = bs_srv_start(sl, "sluice", &srv[0]), at = 1;
    if (ret == 0 && o->unbatched) {
        sl[4] = port[at];
        sl[13] = "--no-batch";
        sl[14] = NULL;
        ret = bs_srv_start(sl, "sluice-nobatch", &srv[at++]);
    }
    if (ret == 0 && o->llama) {
        const char *ll[] = {o->llama, "-m",  o->gguf, "--host", "127.0.0.1", "--port", port[at],
                            "-np",    slots, "-c",    ctx,      "-t",        thr,      NULL};
        ret = bs_srv_start(ll, "llama-server", &srv[at]);
    }
    /* one request each before measuring */
    for (int i = 0; ret == 0 && i < n_srv; i++) {
        struct bs_opts one = *o;
        one.requests = 1;
        struct bs_level l;
        ret = bs_run_level(srv[i].port, 1, &one, &l);
        if (ret == 0 && l.errors) {
            fprintf(stderr, "sluice bench serve: %s failed its first request (log: %s)\n",
                    server_names[i], srv[i].log);
            ret = -EPROTO;
        }
    }
    return ret;
}

int bench_serve(int argc, char **argv)
{
    struct bs_opts o;
    int ret = parse(argc, argv, &o);
    if (ret)
        return ret > 0 ? 0 : 2;
    char dl_err[300];
    if (serve_client_global_init(dl_err, sizeof dl_err) < 0) {
        fprintf(stderr, "sluice bench serve: %s\n", dl_err);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    int n_srv = 0;
    server_names[n_srv++] = "sluice";
    if (o.unbatched)
        server_names[n_srv++] = "sluice-nobatch";
    if (o.llama)
        server_names[n_srv++] = "llama-server";
    struct bs_srv srv[N_SERVERS] = {{0}};
    struct cell *cells = calloc((size_t)o.n_levels * N_SERVERS, sizeof *cells);
    double *cold_run_s = calloc(o.cold + 1, sizeof(double)), *cold_lazy_s =
                                                                  calloc(o.cold + 1, sizeof(double));
    if (!cells || !cold_run_s || !cold_lazy_s) {
        fprintf(stderr, "sluice bench serve: out of memory\n");
        return 1;
    }
    uint32_t n_cold = 0;
    for (uint32_t k = 0; k < o.cold && ret == 0; k++) { /* A/B: run, then lazy serve */
        if ((ret = bs_cold_run(&o, &cold_run_s[n_cold])) < 0 ||
            (ret = bs_cold_lazy(&o, &cold_lazy_s[n_cold])) < 0)
            fprintf(stderr, "sluice bench serve: cold run %u failed (%s)\n", k, strerror(-ret));
        else
            n_cold++;
    }
    if (ret == 0)
        ret = start_servers(&o, srv, n_srv);
    for (uint32_t r = 0; r < o.runs && ret == 0; r++)
        for (uint32_t l = 0; l < o.n_levels && ret == 0; l++)
            for (int s = 0; s < n_srv && ret == 0; s++) {
                struct bs_level lv;
                struct cell *c = &cells[l * N_SERVERS + (uint32_t)s];
                ret = bs_run_level(srv[s].port, o.levels[l], &o, &lv);
                c->p50[r] = lv.ttft_p50;
                c->p99[r] = lv.ttft_p99;
                c->tps[r] = lv.tok_s;
                c->errors += lv.errors;
            }
    for (int s = 0; s < n_srv; s++)
        bs_srv_stop(&srv[s]);
    if (ret < 0) {
        fprintf(stderr, "sluice bench serve: %s\n", strerror(-ret));
        return 1;
    }
    FILE *t = o.json ? stderr : stdout;
    fprintf(t, "%u runs; each level: C clients x %u streaming requests of max_tokens %u; "
               "min / median over the runs\n", o.runs, o.requests, o.max_tokens);
    fprintf(t, "%-8s %-14s %21s %21s %21s %7s\n", "clients", "server", "TTFT p50 ms",
            "TTFT p99 ms", "tokens/s", "errors");
    cJSON *j = cJSON_CreateObject(), *lv = cJSON_AddArrayToObject(j, "levels");
    cJSON_AddStringToObject(j, "model", o.model);
    if (o.gguf)
        cJSON_AddStringToObject(j, "gguf", o.gguf);
    cJSON_AddNumberToObject(j, "runs", o.runs);
    cJSON_AddNumberToObject(j, "requests_per_client", o.requests);
    cJSON_AddNumberToObject(j, "max_tokens", o.max_tokens);
    cJSON_AddNumberToObject(j, "parallel", o.parallel);
    cJSON_AddNumberToObject(j, "slots", o.slots);
    cJSON_AddNumberToObject(j, "llama_threads", o.threads);
    cJSON_AddNumberToObject(j, "npu_share", o.npu_share);
    if (o.lanes)
        cJSON_AddNumberToObject(j, "batch_lanes", o.lanes);
    for (uint32_t l = 0; l < o.n_levels; l++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "clients", o.levels[l]);
        for (int s = 0; s < n_srv; s++) {
            struct cell *c = &cells[l * N_SERVERS + (uint32_t)s];
            struct tools_stats a, b, d;
            tools_stats_compute(c->p50, o.runs, &a);
            tools_stats_compute(c->p99, o.runs, &b);
            tools_stats_compute(c->tps, o.runs, &d);
            fprintf(t, "%-8u %-14s %10.1f / %8.1f %10.1f / %8.1f %10.1f / %8.1f %7u\n",
                    o.levels[l], server_names[s], a.min * 1e3, a.median * 1e3, b.min * 1e3,
                    b.median * 1e3, d.min, d.median, c->errors);
            cJSON *so = cJSON_AddObjectToObject(e, server_names[s]);
            cJSON_AddItemToObject(so, "ttft_p50_ms", minmed(c->p50, o.runs, 1e3));
            cJSON_AddItemToObject(so, "ttft_p99_ms", minmed(c->p99, o.runs, 1e3));
            cJSON_AddItemToObject(so, "tokens_per_s", minmed(c->tps, o.runs, 1));
            cJSON_AddNumberToObject(so, "errors", c->errors);
        }
        cJSON_AddItemToArray(lv, e);
    }
    if (o.cold) {
        struct tools_stats a, b;
        tools_stats_compute(cold_run_s, n_cold, &a);
        tools_stats_compute(cold_lazy_s, n_cold, &b);
        /* each lazy run against the `sluice run` just before it: the machine's
         * drift between pairs cancels */
        double *pair = calloc(n_cold + 1, sizeof *pair);
        struct tools_stats pr = {0};
        if (pair) {
            for (uint32_t k = 0; k < n_cold; k++)
                pair[k] = cold_run_s[k] > 0 ? cold_lazy_s[k] / cold_run_s[k] : 0;
            tools_stats_compute(pair, n_cold, &pr);
        }
        fprintf(t, "cold (flashrun -m %u, %u runs): sluice run TTFT %.1f / %.1f ms, first "
                   "request to a --lazy server %.1f / %.1f ms (min / median); ratio of medians "
                   "%.3f, median of the paired ratios %.3f\n", o.mbps, n_cold, a.min * 1e3,
                a.median * 1e3, b.min * 1e3, b.median * 1e3, a.median > 0 ? b.median / a.median : 0,
                pr.median);
        cJSON *c = cJSON_AddObjectToObject(j, "cold");
        cJSON_AddNumberToObject(c, "flash_mbps", o.mbps);
        cJSON_AddNumberToObject(c, "runs", n_cold);
        cJSON_AddItemToObject(c, "run_ttft_ms", minmed(cold_run_s, n_cold, 1e3));
        cJSON_AddItemToObject(c, "lazy_serve_ttft_ms", minmed(cold_lazy_s, n_cold, 1e3));
        cJSON_AddNumberToObject(c, "ratio_median", a.median > 0 ? b.median / a.median : 0);
        cJSON_AddNumberToObject(c, "paired_ratio_median", pr.median);
        cJSON *rr = cJSON_AddArrayToObject(c, "run_ms"), *ll = cJSON_AddArrayToObject(c, "lazy_ms");
        for (uint32_t k = 0; k < n_cold; k++) {
            cJSON_AddItemToArray(rr, cJSON_CreateNumber(cold_run_s[k] * 1e3));
            cJSON_AddItemToArray(ll, cJSON_CreateNumber(cold_lazy_s[k] * 1e3));
        }
        free(pair);
    }
    if (o.json) {
        char *s = cJSON_PrintUnformatted(j);
        if (s)
            printf("%s\n", s);
        free(s);
    }
    cJSON_Delete(j);
    free(cells);
    free(cold_run_s);
    free(cold_lazy_s);
    for (int s = 0; s < n_srv; s++)
        unlink(srv[s].log);
    return 0;
}
