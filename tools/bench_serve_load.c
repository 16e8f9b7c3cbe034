/* bench_serve_load.c: the load side of `sluice bench serve`: servers as child
 * processes, C clients x N streaming requests against one, and the cold runs
 * (`sluice run` and the first request to a --lazy server, under flashrun). */
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

#include "bench_serve_internal.h"
#include "serve_client.h"
#include "tools_stats.h"

#define N_PROMPTS 8
static const char *const prompts[N_PROMPTS] = {
    "In the beginning", "And God said",        "The LORD is my shepherd", "Blessed are the",
    "And it came to pass", "Jesus wept",       "Then said he unto them,", "Praise ye the LORD"};


static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
/* ---- servers as children --------------------------------------------------------------- */


int bs_free_port(void)
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

void bs_srv_stop(struct bs_srv *s)
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
int bs_srv_start(const char *const *argv, const char *name, struct bs_srv *s)
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
    bs_srv_stop(s);
    return -ETIMEDOUT;
}

/* ---- one level: C clients x N streaming requests ------------------------------------- */


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

int bs_run_level(int port, uint32_t clients, const struct bs_opts *o, struct bs_level *out)
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
    *out = (struct bs_level){.tok_s = wall > 0 ? (double)tokens / wall : 0, .errors = errors};
    int ret = tools_stats_percentile(all, n, 0.5, &out->ttft_p50);
    if (ret == 0)
        ret = tools_stats_percentile(all, n, 0.99, &out->ttft_p99);
    free(w);
    free(th);
    free(all);
    return ret;
}

/* ---- cold: sluice run vs the first request to a lazy server ---------------------------- */

int bs_cold_run(const struct bs_opts *o, double *ttft)
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
    if (pid < 0) { /* else waitpid(-1) below would reap any child */
        int e = errno;
        close(fd[0]);
        close(fd[1]);
        return -e;
    }
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
    int rerr = 0;
    while (len < sizeof buf - 1) {
        r = read(fd[0], buf + len, sizeof buf - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            rerr = errno;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    buf[len] = 0;
    close(fd[0]);
    int st = 0;
    pid_t w;
    while ((w = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
        ;
    if (w < 0)
        return -errno;
    if (rerr)
        return -rerr;
    cJSON *j = cJSON_Parse(buf);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "ttft_s");
    int ok = cJSON_IsNumber(t) && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (ok)
        *ttft = t->valuedouble;
    cJSON_Delete(j);
    return ok ? 0 : -ECHILD;
}

int bs_cold_lazy(const struct bs_opts *o, double *ttft)
{
    struct bs_srv s = {.port = bs_free_port()};
    char mb[16], port[16], exe[4096];
    snprintf(mb, sizeof mb, "%u", o->mbps);
    snprintf(port, sizeof port, "%d", s.port);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -errno;
    exe[n] = 0;
    const char *argv[] = {o->flashrun, "-m", mb, "-f", o->model, "--", exe, "serve", o->model,
                          "--lazy", "--port", port, "--parallel", "1", NULL};
    int ret = bs_srv_start(argv, "lazy", &s);
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
    bs_srv_stop(&s);
    unlink(s.log);
    return ret;
}
