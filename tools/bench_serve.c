/* bench_serve.c: `sluice bench serve MODEL.sluice`: time to first token
 * (p50, p99) and total tokens/s of `sluice serve` at 1, 4 and 16 concurrent
 * streaming clients over loopback, side by side with llama.cpp's
 * llama-server on the same model (its GGUF), the two measured level by
 * level, interleaved run by run; and, with --cold, the first request to a
 * --lazy server against `sluice run`'s cold time to first token, both under
 * flashrun (page cache dropped, reads limited), interleaved. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

#define MAX_LEVELS 8
#define N_PROMPTS 8
static const char *const prompts[N_PROMPTS] = {
    "In the beginning", "And God said",        "The LORD is my shepherd", "Blessed are the",
    "And it came to pass", "Jesus wept",       "Then said he unto them,", "Praise ye the LORD"};

struct opts {
    const char *model, *llama, *gguf, *flashrun;
    uint32_t levels[MAX_LEVELS], n_levels;
    uint32_t requests, max_tokens, runs, parallel, slots, threads, cold, mbps, lanes;
    double npu_share;
    int json, unbatched;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- servers as children --------------------------------------------------------------- */

struct srv {
    pid_t pid;
    int port;
    char log[256];
};

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void srv_stop(struct srv *s)
{
    if (s->pid <= 0)
        return;
    kill(-s->pid, SIGTERM); /* its process group: flashrun's children too */
    for (int i = 0; i < 100; i++) {
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
            s->pid = 0;
            return;
        }
        usleep(50000);
    }
    kill(-s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

/* Starts argv (its own process group, output to a log file) and waits until
 * GET /health answers 200 on s->port. */
static int srv_start(const char *const *argv, const char *name, struct srv *s)
{
    snprintf(s->log, sizeof s->log, "%s/sluice-bench-serve-%d-%s.log",
             getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp", (int)getpid(),
             name);
    s->pid = fork();
    if (s->pid < 0)
        return -errno;
    if (s->pid == 0) {
        setpgid(0, 0);
        /* a bench killed mid-run (timeout, Ctrl-C) must not leave its servers
         * running, holding the port and whatever descriptors it inherited */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() == 1)
            _exit(127);
        int fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    setpgid(s->pid, s->pid);
    char url[96], err[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/health", s->port);
    for (int i = 0; i < 1200; i++) { /* 60 s */
        struct serve_client_result r;
        if (serve_client_get(url, NULL, &r, err, sizeof err) == 0 && r.status == 200) {
            serve_client_result_free(&r);
            return 0;
        }
        serve_client_result_free(&r);
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
            s->pid = 0;
            break;
        }
        usleep(50000);
    }
    fprintf(stderr, "sluice bench serve: %s did not come up (its log: %s)\n", name, s->log);
    srv_stop(s);
    return -ETIMEDOUT;
}

/* ---- one level: C clients x N streaming requests ------------------------------------- */

struct level {
    double ttft_p50, ttft_p99, tok_s;
    uint32_t errors;
};

struct worker {
    const char *url;
    uint32_t id, n, max_tokens, errors;
    double *ttft; /* [n] */
    uint64_t tokens;
};

static char *request_body(const char *prompt, uint32_t max_tokens)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", prompt);
    cJSON_AddNumberToObject(o, "max_tokens", max_tokens);
    cJSON_AddNumberToObject(o, "temperature", 0);
    cJSON_AddBoolToObject(o, "stream", 1);
    cJSON_AddItemToObject(cJSON_AddObjectToObject(o, "stream_options"), "include_usage",
                          cJSON_CreateTrue());
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void *worker_main(void *p)
{
    struct worker *w = p;
    for (uint32_t k = 0; k < w->n; k++) {
        char *body = request_body(prompts[(w->id + k) % N_PROMPTS], w->max_tokens);
        struct serve_client_result r;
        char err[256];
        int ret = body ? serve_client_post(w->url, NULL, body, 1, 300, &r, err, sizeof err) : -1;
        free(body);
        if (ret < 0 || r.status != 200 || !r.done || r.bad_event || !r.ttft_s) {
            w->errors++;
            w->ttft[k] = -1;
        } else {
            w->ttft[k] = r.ttft_s;
            /* usage when the server gives it, else the events with text */
            w->tokens += r.completion_tokens ? r.completion_tokens : r.events - 1;
        }
        if (ret == 0)
            serve_client_result_free(&r);
    }
    return NULL;
}

static int run_level(int port, uint32_t clients, const struct opts *o, struct level *out)
{
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", port);
    struct worker *w = calloc(clients, sizeof *w);
    pthread_t *th = calloc(clients, sizeof *th);
    double *all = calloc((size_t)clients * o->requests, sizeof *all);
    if (!w || !th || !all) {
        free(w);
        free(th);
        free(all);
        return -ENOMEM;
    }
    double t0 = now_s();
    uint32_t started = 0;
    for (uint32_t c = 0; c < clients; c++) {
        w[c] = (struct worker){.url = url, .id = c, .n = o->requests, .max_tokens = o->max_tokens,
                               .ttft = all + (size_t)c * o->requests};
        if (pthread_create(&th[c], NULL, worker_main, &w[c]) != 0)
            break;
        started++;
    }
    uint64_t tokens = 0;
    uint32_t errors = (clients - started) * o->requests;
    for (uint32_t c = 0; c < started; c++) {
        pthread_join(th[c], NULL);
        tokens += w[c].tokens;
        errors += w[c].errors;
    }
    double wall = now_s() - t0;
    size_t n = 0;
    for (size_t i = 0; i < (size_t)started * o->requests; i++)
        if (all[i] >= 0)
            all[n++] = all[i];
    *out = (struct level){.tok_s = wall > 0 ? (double)tokens / wall : 0, .errors = errors};
    int ret = tools_stats_percentile(all, n, 0.5, &out->ttft_p50);
    if (ret == 0)
        ret = tools_stats_percentile(all, n, 0.99, &out->ttft_p99);
    free(w);
    free(th);
    free(all);
    return ret;
}

/* ---- cold: sluice run vs the first request to a lazy server ---------------------------- */

static int cold_run(const struct opts *o, double *ttft)
{
    int fd[2];
    if (pipe(fd) < 0)
        return -errno;
    char mb[16], exe[4096];
    snprintf(mb, sizeof mb, "%u", o->mbps);
    ssize_t en = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (en <= 0) {
        int e = errno;
        close(fd[0]);
        close(fd[1]);
        return -e;
    }
    exe[en] = 0;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 2);
        execl(o->flashrun, o->flashrun, "-m", mb, "-f", o->model, "--", exe,
              "run", o->model, "-p", prompts[0], "-n", "8", "--json", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[16384];
    size_t len = 0;
    ssize_t r;
    while ((r = read(fd[0], buf + len, sizeof buf - 1 - len)) > 0)
        len += (size_t)r;
    buf[len] = 0;
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    cJSON *j = cJSON_Parse(buf);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "ttft_s");
    int ok = cJSON_IsNumber(t) && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (ok)
        *ttft = t->valuedouble;
    cJSON_Delete(j);
    return ok ? 0 : -ECHILD;
}

static int cold_lazy(const struct opts *o, double *ttft)
{
    struct srv s = {.port = free_port()};
    char mb[16], port[16], exe[4096];
    snprintf(mb, sizeof mb, "%u", o->mbps);
    snprintf(port, sizeof port, "%d", s.port);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -errno;
    exe[n] = 0;
    const char *argv[] = {o->flashrun, "-m", mb, "-f", o->model, "--", exe, "serve", o->model,
                          "--lazy", "--port", port, "--parallel", "1", NULL};
    int ret = srv_start(argv, "lazy", &s);
    if (ret < 0)
        return ret;
    char url[96], err[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", s.port);
    char *body = request_body(prompts[0], 8);
    struct serve_client_result r;
    ret = body ? serve_client_post(url, NULL, body, 1, 120, &r, err, sizeof err) : -ENOMEM;
    free(body);
    if (ret == 0) {
        if (r.status == 200 && r.done && r.ttft_s > 0 && strstr(r.body, "\"cold_start\":true"))
            *ttft = r.ttft_s;
        else
            ret = -EPROTO;
        serve_client_result_free(&r);
    }
    srv_stop(&s);
    unlink(s.log);
    return ret;
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

static int parse_levels(const char *s, struct opts *o)
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

static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.requests = 8, .max_tokens = 32, .runs = 3, .mbps = 800,
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

static int start_servers(const struct opts *o, struct srv *srv, int n_srv)
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
        srv[i].port = free_port();
        snprintf(port[i], sizeof port[i], "%d", srv[i].port);
    }
    const char *sl[] = {exe,       "serve",     o->model, "--port",      port[0], "--parallel",
                        par,       "--queue",   "4096",   "--max-conns", "4096",  "--npu-share",
                        share,     NULL,        NULL,     NULL};
    if (o->lanes) {
        sl[13] = "--batch-lanes";
        sl[14] = lanes;
    }
    int ret = srv_start(sl, "sluice", &srv[0]), at = 1;
    if (ret == 0 && o->unbatched) {
        sl[4] = port[at];
        sl[13] = "--no-batch";
        sl[14] = NULL;
        ret = srv_start(sl, "sluice-nobatch", &srv[at++]);
    }
    if (ret == 0 && o->llama) {
        const char *ll[] = {o->llama, "-m",  o->gguf, "--host", "127.0.0.1", "--port", port[at],
                            "-np",    slots, "-c",    ctx,      "-t",        thr,      NULL};
        ret = srv_start(ll, "llama-server", &srv[at]);
    }
    /* one request each before measuring */
    for (int i = 0; ret == 0 && i < n_srv; i++) {
        struct opts one = *o;
        one.requests = 1;
        struct level l;
        ret = run_level(srv[i].port, 1, &one, &l);
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
    struct opts o;
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
    struct srv srv[N_SERVERS] = {{0}};
    struct cell *cells = calloc((size_t)o.n_levels * N_SERVERS, sizeof *cells);
    double *cold_run_s = calloc(o.cold + 1, sizeof(double)), *cold_lazy_s =
                                                                  calloc(o.cold + 1, sizeof(double));
    if (!cells || !cold_run_s || !cold_lazy_s) {
        fprintf(stderr, "sluice bench serve: out of memory\n");
        return 1;
    }
    uint32_t n_cold = 0;
    for (uint32_t k = 0; k < o.cold && ret == 0; k++) { /* A/B: run, then lazy serve */
        if ((ret = cold_run(&o, &cold_run_s[n_cold])) < 0 ||
            (ret = cold_lazy(&o, &cold_lazy_s[n_cold])) < 0)
            fprintf(stderr, "sluice bench serve: cold run %u failed (%s)\n", k, strerror(-ret));
        else
            n_cold++;
    }
    if (ret == 0)
        ret = start_servers(&o, srv, n_srv);
    for (uint32_t r = 0; r < o.runs && ret == 0; r++)
        for (uint32_t l = 0; l < o.n_levels && ret == 0; l++)
            for (int s = 0; s < n_srv && ret == 0; s++) {
                struct level lv;
                struct cell *c = &cells[l * N_SERVERS + (uint32_t)s];
                ret = run_level(srv[s].port, o.levels[l], &o, &lv);
                c->p50[r] = lv.ttft_p50;
                c->p99[r] = lv.ttft_p99;
                c->tps[r] = lv.tok_s;
                c->errors += lv.errors;
            }
    for (int s = 0; s < n_srv; s++)
        srv_stop(&srv[s]);
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
