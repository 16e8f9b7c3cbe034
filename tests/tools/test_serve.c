/* test_serve.c: `sluice serve` driven over loopback by real clients
 * (libcurl, raw sockets), on kjv6L from ../shared quantized at test time:
 * the endpoints; greedy answers (JSON, SSE, chat) equal to `sluice run`'s
 * text; 16 concurrent streaming clients x 20 requests, every answer equal to
 * its prompt's single-client greedy text, in bounded time and RSS; bad input
 * (malformed JSON, wrong types, out-of-range values, a 10 MB body, an
 * unknown model, a client sending a byte a second) answered with 4xx in
 * OpenAI's shape while others are served; a client that leaves cancels its
 * generation; the queue's 429; --lazy's cold start; --api-key's 401. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "serve_client.h"
#include "testutil.h"

static const char *bin, *dir;
static char model[4096];

struct server {
    pid_t pid;
    int port;
    char log[4200];
};

static struct server main_srv;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Starts `sluice serve MODEL --port 0 ARGS...` and waits for its address. */
static int server_start(struct server *s, const char *name, const char *const *args)
{
    snprintf(s->log, sizeof s->log, "%s/%s.log", dir, name);
    const char *argv[32] = {bin, "serve", model, "--port", "0"};
    int n = 5;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    s->pid = fork();
    if (s->pid == 0) {
        int fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        execv(bin, (char **)argv);
        _exit(127);
    }
    for (int tries = 0; tries < 600; tries++) {
        usleep(50000);
        char *log = test_read_file(s->log, NULL);
        const char *p = log ? strstr(log, "listening on http://127.0.0.1:") : NULL;
        if (p) {
            s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
            free(log);
            return 0;
        }
        free(log);
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid)
            break;
    }
    fprintf(stderr, "server %s did not start; its log:\n", name);
    test_system("cat %s >&2", s->log);
    return -1;
}

/* SIGTERM; the server must stop cleanly (exit 0). */
static void server_stop(struct server *s)
{
    kill(s->pid, SIGTERM);
    int st = 0;
    waitpid(s->pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        test_system("cat %s >&2", s->log);
        fail_msg("the server did not exit cleanly (status %d)", st);
    }
}

static void url(const struct server *s, const char *path, char *out, size_t n)
{
    snprintf(out, n, "http://127.0.0.1:%d%s", s->port, path);
}

static long rss_kib(pid_t pid)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r"); /* /proc files have no size: read them line by line */
    char line[256];
    long k = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            k = atol(line + 6);
    if (f)
        fclose(f);
    return k;
}

/* `sluice run MODEL -p PROMPT -n N --json [--temp T --top-p P --seed S]`'s
 * text (sampling when temp is not NULL). */
static char *run_text_sampled(const char *prompt, int n, const char *temp, const char *top_p,
                              const char *seed)
{
    int fd[2];
    if (pipe(fd) < 0)
        return NULL;
    char nbuf[16];
    snprintf(nbuf, sizeof nbuf, "%d", n);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        if (temp)
            execl(bin, bin, "run", model, "-p", prompt, "-n", nbuf, "--json", "--temp", temp,
                  "--top-p", top_p, "--seed", seed, (char *)NULL);
        else
            execl(bin, bin, "run", model, "-p", prompt, "-n", nbuf, "--json", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char *out = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 > cap) {
            cap = cap * 2 + 8192;
            out = realloc(out, cap);
        }
        ssize_t r = read(fd[0], out + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd[0]);
    waitpid(pid, NULL, 0);
    out[len] = 0;
    cJSON *j = cJSON_Parse(out);
    free(out);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "text");
    char *text = cJSON_IsString(t) ? strdup(t->valuestring) : NULL;
    cJSON_Delete(j);
    return text;
}

static char *run_text(const char *prompt, int n)
{
    return run_text_sampled(prompt, n, NULL, NULL, NULL);
}

static char *json_string(const char *s)
{
    cJSON *j = cJSON_CreateString(s);
    char *p = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return p;
}

static char *completion_body(const char *prompt, int n, int stream)
{
    char *p = json_string(prompt);
    char *b = malloc(strlen(p) + 128);
    sprintf(b, "{\"model\":\"m\",\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,\"stream\":%s}",
            p, n, stream ? "true" : "false");
    free(p);
    return b;
}

static int post(const struct server *s, const char *path, const char *key, const char *body,
                int stream, struct serve_client_result *r)
{
    char u[128], err[256];
    url(s, path, u, sizeof u);
    int ret = serve_client_post(u, key, body, stream, 60, r, err, sizeof err);
    if (ret < 0)
        fprintf(stderr, "%s\n", err);
    return ret;
}

/* The answer is an error in OpenAI's shape with this status. */
static void assert_error_shape(const struct serve_client_result *r, long status)
{
    if (r->status != status)
        fail_msg("status %ld, want %ld: %s", r->status, status, r->body);
    cJSON *j = cJSON_Parse(r->body);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    assert_true(cJSON_IsObject(e));
    assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "message")));
    assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "type")));
    assert_non_null(cJSON_GetObjectItemCaseSensitive(e, "param"));
    assert_non_null(cJSON_GetObjectItemCaseSensitive(e, "code"));
    cJSON_Delete(j);
}

static double metric_key(const struct server *s, const char *name, const char *key)
{
    char u[128], err[256];
    url(s, "/metrics", u, sizeof u);
    struct serve_client_result r;
    if (serve_client_get(u, key, &r, err, sizeof err) < 0)
        fail_msg("%s", err);
    char k[128];
    snprintf(k, sizeof k, "\n%s ", name);
    const char *p = strstr(r.body, k);
    double v = p ? atof(p + strlen(k)) : -1;
    serve_client_result_free(&r);
    return v;
}

static double metric(const struct server *s, const char *name)
{
    return metric_key(s, name, NULL);
}

#define N_PROMPTS 8
#define GEN 24
static const char *prompts[N_PROMPTS] = {
    "In the beginning",          "And God said",           "The LORD is my shepherd",
    "Blessed are the",           "And it came to pass",    "Jesus wept",
    "Then said he unto them,",   "Praise ye the LORD"};
static char *expected[N_PROMPTS]; /* single-client greedy texts */

static void test_endpoints(void **state)
{
    (void)state;
    struct serve_client_result r;
    char u[128], err[256];
    url(&main_srv, "/health", u, sizeof u);
    assert_int_equal(serve_client_get(u, NULL, &r, err, sizeof err), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"status\":\"ok\""));
    serve_client_result_free(&r);
    url(&main_srv, "/v1/models", u, sizeof u);
    assert_int_equal(serve_client_get(u, NULL, &r, err, sizeof err), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"id\":\"m\""));
    serve_client_result_free(&r);
    url(&main_srv, "/metrics", u, sizeof u);
    assert_int_equal(serve_client_get(u, NULL, &r, err, sizeof err), 0);
    static const char *names[] = {"sluice_ttft_seconds_bucket{le=\"+Inf\"}",
                                  "sluice_tokens_per_second", "sluice_queue_length",
                                  "sluice_active_sessions", "sluice_storage_bytes_streamed_total"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strstr(r.body, names[i]))
            fail_msg("/metrics lacks %s", names[i]);
    serve_client_result_free(&r);
    /* the eager server streamed the model at start-up */
    assert_true(metric(&main_srv, "sluice_storage_bytes_streamed_total") > 1e6);
}

/* Greedy answers, JSON and SSE, completions and chat, equal sluice run's. */
static void test_greedy_equals_run(void **state)
{
    (void)state;
    for (int i = 0; i < N_PROMPTS; i++) {
        char *run = run_text(prompts[i], GEN);
        assert_non_null(run);
        for (int stream = 0; stream < 2; stream++) {
            struct serve_client_result r;
            char *b = completion_body(prompts[i], GEN, stream);
            assert_int_equal(post(&main_srv, "/v1/completions", NULL, b, stream, &r), 0);
            free(b);
            assert_int_equal(r.status, 200);
            assert_false(r.bad_event);
            if (stream)
                assert_true(r.done);
            size_t pl = strlen(prompts[i]);
            if (strncmp(run, prompts[i], pl) || strcmp(run + pl, r.text))
                fail_msg("prompt '%s' (stream %d): run printed '%s', serve answered '%s'",
                         prompts[i], stream, run, r.text);
            assert_true(r.completion_tokens >= 1 && r.completion_tokens <= GEN);
            assert_true(r.prompt_tokens >= 1);
            if (!stream)
                expected[i] = strdup(r.text);
            serve_client_result_free(&r);
        }
        free(run);
    }
    /* sampling: the same temperature, top_p and seed give run's text too */
    for (int i = 0; i < 3; i++) {
        char *run = run_text_sampled(prompts[i], GEN, "0.8", "0.9", "7");
        assert_non_null(run);
        char *p = json_string(prompts[i]);
        char b[512];
        snprintf(b, sizeof b, "{\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0.8,"
                 "\"top_p\":0.9,\"seed\":7,\"stream\":true}", p, GEN);
        free(p);
        struct serve_client_result r;
        assert_int_equal(post(&main_srv, "/v1/completions", NULL, b, 1, &r), 0);
        assert_int_equal(r.status, 200);
        size_t pl = strlen(prompts[i]);
        if (strncmp(run, prompts[i], pl) || strcmp(run + pl, r.text))
            fail_msg("sampled '%s': run printed '%s', serve answered '%s'", prompts[i], run,
                     r.text);
        serve_client_result_free(&r);
        free(run);
    }
    /* chat: the transcript template, the same text as run on it */
    const char *chat_prompt = "User: Tell me of the land of Egypt\nAssistant:";
    char *run = run_text(chat_prompt, GEN);
    for (int stream = 0; stream < 2; stream++) {
        char b[512];
        snprintf(b, sizeof b,
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Tell me of the "
                 "land of Egypt\"}],\"max_tokens\":%d,\"temperature\":0,\"stream\":%s}",
                 GEN, stream ? "true" : "false");
        struct serve_client_result r;
        assert_int_equal(post(&main_srv, "/v1/chat/completions", NULL, b, stream, &r), 0);
        assert_int_equal(r.status, 200);
        assert_false(r.bad_event);
        size_t pl = strlen(chat_prompt);
        /* the reply ends at the template's turn end "\nUser:" */
        const char *turn = strstr(run + pl, "\nUser:");
        size_t want = turn ? (size_t)(turn - run - pl) : strlen(run + pl);
        assert_true(want > 10); /* a real reply, not an empty one */
        if (strncmp(run, chat_prompt, pl) || strlen(r.text) != want ||
            strncmp(run + pl, r.text, want))
            fail_msg("chat (stream %d): run printed '%s', serve answered '%s'", stream, run,
                     r.text);
        serve_client_result_free(&r);
    }
    free(run);
}

/* ---- load ---------------------------------------------------------------------------- */

#define CLIENTS 16
#define PER_CLIENT 20

struct load_arg {
    int id, errors, per_client;
    const struct server *srv;
    char *const *want;
    char msg[512];
};

static void *load_client(void *p)
{
    struct load_arg *a = p;
    char *const *want = a->want;
    for (int k = 0; k < a->per_client; k++) {
        int i = (a->id + k) % N_PROMPTS;
        char *b = completion_body(prompts[i], GEN, 1);
        struct serve_client_result r;
        int ret = post(a->srv, "/v1/completions", NULL, b, 1, &r);
        free(b);
        if (ret < 0 || r.status != 200 || !r.done || r.bad_event || strcmp(r.text, want[i])) {
            if (!a->errors++)
                snprintf(a->msg, sizeof a->msg, "client %d request %d: status %ld, done %d, "
                         "text '%s' want '%s'", a->id, k, r.status, r.done,
                         r.text ? r.text : "", want[i]);
        }
        serve_client_result_free(&r);
    }
    return NULL;
}

/* CLIENTS streaming clients, per_client requests each, every answer
 * checked against want; the time taken; the number of errors. */
static int load_run(const struct server *srv, char *const *want, int per_client, double *secs)
{
    double t0 = now_s();
    pthread_t th[CLIENTS];
    struct load_arg args[CLIENTS];
    for (int c = 0; c < CLIENTS; c++) {
        args[c] = (struct load_arg){.id = c, .per_client = per_client, .srv = srv, .want = want};
        assert_int_equal(pthread_create(&th[c], NULL, load_client, &args[c]), 0);
    }
    int errors = 0;
    for (int c = 0; c < CLIENTS; c++) {
        pthread_join(th[c], NULL);
        if (args[c].errors)
            fprintf(stderr, "%d errors, first: %s\n", args[c].errors, args[c].msg);
        errors += args[c].errors;
    }
    *secs = now_s() - t0;
    return errors;
}

/* The sessions' steps were batched: passes of several sessions, more rows
 * than passes. */
static void check_batched(const struct server *srv, const char *what)
{
    double steps = metric(srv, "sluice_batch_steps_total");
    double rows = metric(srv, "sluice_batch_rows_total");
    double multi = metric(srv, "sluice_batch_multi_steps_total");
    fprintf(stderr, "%s: %.0f forward passes, %.0f rows (%.2f a pass), %.0f of several sessions\n",
            what, steps, rows, rows / steps, multi);
    assert_true(steps > 0 && multi > 0 && rows > steps);
}

static void test_load(void **state)
{
    (void)state;
    for (int i = 0; i < N_PROMPTS; i++)
        assert_non_null(expected[i]);
    long rss0 = rss_kib(main_srv.pid);
    double dt;
    int errors = load_run(&main_srv, expected, PER_CLIENT, &dt);
    long rss1 = rss_kib(main_srv.pid);
    fprintf(stderr, "load: %d clients x %d streaming requests in %.2f s, %d errors, server RSS "
            "%ld -> %ld KiB\n", CLIENTS, PER_CLIENT, dt, errors, rss0, rss1);
    assert_int_equal(errors, 0);
    assert_true(dt < 60);
    /* bounded: the weights once, a KV cache per session, buffers per connection */
    assert_true(rss1 > 0 && rss1 < rss0 + 64 * 1024);
    assert_int_equal((int)metric(&main_srv, "sluice_active_sessions"), 0);
    assert_int_equal((int)metric(&main_srv, "sluice_queue_length"), 0);
    check_batched(&main_srv, "load (q5, --parallel 4)");
}

/* The float model (one float GEMM a pass) with a session per client: every
 * answer equals `sluice run`'s on that model, as with the sessions alone. */
static void test_load_float(void **state)
{
    (void)state;
    char q5[sizeof model];
    snprintf(q5, sizeof q5, "%s", model);
    snprintf(model, sizeof model, "%s/kjv.sluice", dir);
    char *want[N_PROMPTS] = {0};
    for (int i = 0; i < N_PROMPTS; i++) {
        char *run = run_text(prompts[i], GEN);
        size_t pl = strlen(prompts[i]);
        assert_non_null(run);
        assert_int_equal(strncmp(run, prompts[i], pl), 0);
        want[i] = strdup(run + pl);
        free(run);
    }
    const char *args[] = {"--parallel", "16", "--model-id", "m", NULL};
    struct server fs;
    int started = server_start(&fs, "float", args);
    snprintf(model, sizeof model, "%s", q5);
    assert_int_equal(started, 0);
    double dt;
    int errors = load_run(&fs, want, 4, &dt);
    fprintf(stderr, "load (F32, --parallel 16): %d clients x 4 streaming requests in %.2f s, "
            "%d errors\n", CLIENTS, dt, errors);
    assert_int_equal(errors, 0);
    check_batched(&fs, "load (F32, --parallel 16)");
    server_stop(&fs);
    for (int i = 0; i < N_PROMPTS; i++)
        free(want[i]);
}

/* ---- bad input ----------------------------------------------------------------------- */

static void test_bad_input(void **state)
{
    (void)state;
    static const struct {
        const char *path, *body;
        long status;
    } cases[] = {
        {"/v1/completions", "{\"prompt\": \"a\",", 400},
        {"/v1/completions", "not json", 400},
        {"/v1/completions", "[1,2]", 400},
        {"/v1/completions", "{}", 400},
        {"/v1/completions", "{\"prompt\": 5}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": \"ten\"}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": 2.5}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": 0}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": 1e12}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": 256}", 400}, /* 2 + 256 > 256 + 1 */
        {"/v1/completions", "{\"prompt\": \"a\", \"temperature\": -0.5}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"temperature\": \"hot\"}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"top_p\": 1.5}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"stream\": \"yes\"}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"stop\": [1]}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"seed\": \"x\"}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"n\": 2}", 400},
        {"/v1/completions", "{\"prompt\": \"a\", \"model\": \"gpt-4\"}", 404},
        {"/v1/completions", "{\"prompt\": \"a\", \"model\": 7}", 400},
        {"/v1/chat/completions", "{\"messages\": []}", 400},
        {"/v1/chat/completions", "{\"messages\": \"hi\"}", 400},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"wizard\", \"content\": \"a\"}]}",
         400},
        {"/v1/chat/completions", "{\"messages\": [{\"content\": \"a\"}]}", 400},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400},
        {"/v1/nothing", "{}", 404},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct serve_client_result r;
        assert_int_equal(post(&main_srv, cases[i].path, NULL, cases[i].body, 0, &r), 0);
        if (r.status != cases[i].status)
            fail_msg("%s %s: status %ld, want %ld: %s", cases[i].path, cases[i].body, r.status,
                     cases[i].status, r.body);
        assert_error_shape(&r, cases[i].status);
        serve_client_result_free(&r);
    }
    /* a prompt longer than the context */
    size_t n = 5000;
    char *big = malloc(n + 64);
    strcpy(big, "{\"prompt\":\"");
    for (size_t i = 0; i < 600; i++)
        strcat(big, "Lo ");
    strcat(big, "\"}");
    struct serve_client_result r;
    assert_int_equal(post(&main_srv, "/v1/completions", NULL, big, 0, &r), 0);
    assert_error_shape(&r, 400);
    assert_non_null(strstr(r.body, "context_length_exceeded"));
    serve_client_result_free(&r);
    free(big);
    /* a 10 MB body */
    n = 10u << 20;
    big = malloc(n + 32);
    memset(big, ' ', n);
    memcpy(big, "{\"prompt\":\"", 11);
    strcpy(big + n, "\"}");
    assert_int_equal(post(&main_srv, "/v1/completions", NULL, big, 0, &r), 0);
    assert_error_shape(&r, 413);
    serve_client_result_free(&r);
    free(big);
    /* and the server still answers */
    char *b = completion_body(prompts[0], GEN, 0);
    assert_int_equal(post(&main_srv, "/v1/completions", NULL, b, 0, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.text, expected[0]);
    serve_client_result_free(&r);
    free(b);
}

static int connect_to(const struct server *s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

struct slow_arg {
    char answer[1024];
    double took;
};

/* Declares a 40-byte body and sends it a byte a second. */
static void *slow_client(void *p)
{
    struct slow_arg *a = p;
    double t0 = now_s();
    int fd = connect_to(&main_srv);
    if (fd < 0)
        return NULL;
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       "application/json\r\nContent-Length: 40\r\n\r\n";
    send(fd, head, strlen(head), MSG_NOSIGNAL);
    size_t len = 0;
    for (int i = 0; i < 40; i++) {
        if (send(fd, "{", 1, MSG_NOSIGNAL) != 1)
            break;
        struct timeval tv = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ssize_t r = recv(fd, a->answer + len, sizeof a->answer - 1 - len, 0);
        if (r == 0)
            break;
        if (r > 0)
            len += (size_t)r;
    }
    a->answer[len] = 0;
    a->took = now_s() - t0;
    close(fd);
    return NULL;
}

static void test_slow_client(void **state)
{
    (void)state;
    struct slow_arg a;
    memset(&a, 0, sizeof a);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, slow_client, &a), 0);
    /* others are served meanwhile */
    for (int k = 0; k < 5; k++) {
        char *b = completion_body(prompts[k], GEN, 1);
        struct serve_client_result r;
        assert_int_equal(post(&main_srv, "/v1/completions", NULL, b, 1, &r), 0);
        assert_int_equal(r.status, 200);
        assert_string_equal(r.text, expected[k]);
        serve_client_result_free(&r);
        free(b);
        usleep(200000);
    }
    pthread_join(th, NULL);
    fprintf(stderr, "slow client: answered after %.1f s: %.60s\n", a.took, a.answer);
    assert_non_null(strstr(a.answer, "HTTP/1.1 408"));
    assert_non_null(strstr(a.answer, "\"error\":{\"message\""));
    assert_true(a.took < 10); /* --timeout 2 */
}

/* A streaming client that leaves after the first event: the generation ends. */
static void test_disconnect_cancels(void **state)
{
    (void)state;
    double before = metric(&main_srv, "sluice_cancelled_total");
    int fd = connect_to(&main_srv);
    assert_true(fd >= 0);
    /* greedy "In the beginning" repeats itself until max_tokens */
    const char *body = "{\"prompt\":\"In the beginning\",\"max_tokens\":240,\"temperature\":0,"
                       "\"stream\":true}";
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    char buf[256];
    assert_true(recv(fd, buf, sizeof buf, 0) > 0);
    close(fd);
    double after = before;
    for (int i = 0; i < 500 && after == before; i++) { /* up to 10 s on a loaded machine */
        usleep(20000);
        after = metric(&main_srv, "sluice_cancelled_total");
    }
    assert_true(after == before + 1);
    assert_int_equal((int)metric(&main_srv, "sluice_active_sessions"), 0);
}

/* ---- other servers ------------------------------------------------------------------- */

struct q_arg {
    struct server *s;
    long status;
    int ok;
};

static void *queue_client(void *p)
{
    struct q_arg *a = p;
    char *b = completion_body("In the beginning", 200, 0);
    struct serve_client_result r;
    if (post(a->s, "/v1/completions", NULL, b, 0, &r) == 0) {
        a->status = r.status;
        if (r.status == 429) {
            cJSON *j = cJSON_Parse(r.body);
            a->ok = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "error"));
            cJSON_Delete(j);
        } else {
            a->ok = r.status == 200 && r.completion_tokens >= 1;
        }
    }
    serve_client_result_free(&r);
    free(b);
    return NULL;
}

static void test_queue_full(void **state)
{
    (void)state;
    struct server s;
    const char *args[] = {"--parallel", "1", "--queue", "1", "--model-id", "m", NULL};
    assert_int_equal(server_start(&s, "queue", args), 0);
    pthread_t th[8];
    struct q_arg a[8];
    for (int i = 0; i < 8; i++) {
        a[i] = (struct q_arg){.s = &s};
        pthread_create(&th[i], NULL, queue_client, &a[i]);
    }
    int n429 = 0, n200 = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        assert_true(a[i].ok);
        n429 += a[i].status == 429;
        n200 += a[i].status == 200;
    }
    fprintf(stderr, "queue: %d answered, %d refused with 429\n", n200, n429);
    assert_true(n429 >= 1 && n200 >= 2); /* one generating, one waiting */
    server_stop(&s);
}

struct lazy_arg {
    struct server *s;
    const char *body;
    int ok, cold;
};

static void *lazy_client(void *p)
{
    struct lazy_arg *a = p;
    struct serve_client_result r;
    if (post(a->s, "/v1/completions", "sekrit", a->body, 1, &r) == 0) {
        a->ok = r.status == 200 && r.done && !strcmp(r.text, expected[2]);
        a->cold = strstr(r.body, "\"cold_start\":true") != NULL;
        serve_client_result_free(&r);
    }
    return NULL;
}

static void test_lazy_and_key(void **state)
{
    (void)state;
    struct server s;
    const char *args[] = {"--lazy", "--api-key", "sekrit", "--model-id", "m", "--parallel", "2",
                          NULL};
    assert_int_equal(server_start(&s, "lazy", args), 0);
    assert_int_equal((int)metric(&s, "sluice_model_loaded"), -1); /* /metrics needs the key */
    struct serve_client_result r;
    char u[128], err[256];
    url(&s, "/health", u, sizeof u);
    assert_int_equal(serve_client_get(u, NULL, &r, err, sizeof err), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"model_loaded\":false"));
    serve_client_result_free(&r);
    url(&s, "/metrics", u, sizeof u);
    assert_int_equal(serve_client_get(u, "sekrit", &r, err, sizeof err), 0);
    assert_non_null(strstr(r.body, "\nsluice_storage_bytes_streamed_total 0\n"));
    serve_client_result_free(&r);
    char *b = completion_body(prompts[2], GEN, 1);
    assert_int_equal(post(&s, "/v1/completions", NULL, b, 1, &r), 0);
    assert_error_shape(&r, 401);
    serve_client_result_free(&r);
    assert_int_equal(post(&s, "/v1/completions", "wrong", b, 1, &r), 0);
    assert_error_shape(&r, 401);
    serve_client_result_free(&r);
    /* three first requests at once: one cold-starts the model, all get its text */
    struct lazy_arg la[3];
    pthread_t th[3];
    for (int k = 0; k < 3; k++) {
        la[k] = (struct lazy_arg){.s = &s, .body = b};
        assert_int_equal(pthread_create(&th[k], NULL, lazy_client, &la[k]), 0);
    }
    int colds = 0;
    for (int k = 0; k < 3; k++) {
        pthread_join(th[k], NULL);
        assert_true(la[k].ok);
        colds += la[k].cold;
    }
    assert_int_equal(colds, 1);
    assert_int_equal(post(&s, "/v1/completions", "sekrit", b, 1, &r), 0); /* warm */
    assert_int_equal(r.status, 200);
    assert_string_equal(r.text, expected[2]);
    assert_non_null(strstr(r.body, "\"cold_start\":false"));
    serve_client_result_free(&r);
    assert_true(metric_key(&s, "sluice_storage_bytes_streamed_total", "sekrit") > 1e6);
    free(b);
    server_stop(&s);
}

/* MODEL as a `sluice mount` directory: its manifest names the container. */
static void test_mounted_dir(void **state)
{
    (void)state;
    char mnt[4200];
    snprintf(mnt, sizeof mnt, "%s/mnt", dir);
    if (test_system("mkdir -p '%s' && '%s' mount '%s' '%s' >/dev/null 2>&1", mnt, bin, model,
                    mnt) != 0) {
        fprintf(stderr, "note: sluice mount failed here (no FUSE?); a mounted MODEL is not "
                        "tested\n");
        skip();
    }
    struct server s;
    const char *args[] = {"--parallel", "1", NULL};
    char saved[4096];
    snprintf(saved, sizeof saved, "%s", model);
    snprintf(model, sizeof model, "%s", mnt);
    int ret = server_start(&s, "mounted", args);
    snprintf(model, sizeof model, "%s", saved);
    if (ret == 0) {
        struct serve_client_result r;
        char u[128], err[256];
        url(&s, "/v1/models", u, sizeof u);
        assert_int_equal(serve_client_get(u, NULL, &r, err, sizeof err), 0);
        assert_non_null(strstr(r.body, "\"id\":\"kjv-q5\""));
        serve_client_result_free(&r);
        char *b = completion_body(prompts[1], GEN, 0);
        char *m = strstr(b, "\"model\":\"m\",");
        memmove(m, m + 12, strlen(m + 12) + 1); /* no model named */
        assert_int_equal(post(&s, "/v1/completions", NULL, b, 0, &r), 0);
        assert_int_equal(r.status, 200);
        assert_string_equal(r.text, expected[1]);
        serve_client_result_free(&r);
        free(b);
        server_stop(&s);
    }
    test_system("'%s' umount '%s' >/dev/null 2>&1", bin, mnt);
    assert_int_equal(ret, 0);
}

int main(void)
{
    bin = test_sluice_bin();
    const char *m = test_shared_path("models/kjv6L.bin");
    char bin_m[4096], tok[4096], calib[4096];
    if (!bin)
        test_skip_all("the sluice binary is not known ($SLUICE_BIN)");
    if (!m)
        test_skip_all("../shared/models/kjv6L.bin is absent");
    snprintf(bin_m, sizeof bin_m, "%s", m);
    snprintf(tok, sizeof tok, "%s", test_shared_path("models/kjv6L.tok1024.bin"));
    snprintf(calib, sizeof calib, "%s", test_shared_path("models/kjv6L.calib.txt"));
    char dl_err[300];
    if (serve_client_global_init(dl_err, sizeof dl_err) < 0)
        test_skip_all("%s", dl_err);
    dir = test_tmpdir();
    snprintf(model, sizeof model, "%s/kjv-q5.sluice", dir);
    /* kjv6L quantized here: 5-bit uniform with static activation scales */
    if (test_system("'%s' import '%s' --tokenizer '%s' -o '%s/kjv.sluice' >/dev/null 2>&1 && "
                    "'%s' quantize '%s/kjv.sluice' -o '%s' --bits 5 --method uniform --calib "
                    "'%s' >/dev/null 2>&1",
                    bin, bin_m, tok, dir, bin, dir, model, calib) != 0) {
        fprintf(stderr, "cannot import and quantize kjv6L\n");
        return 1;
    }
    const char *args[] = {"--parallel", "4", "--queue", "64", "--timeout", "2",
                          "--model-id", "m", NULL};
    if (server_start(&main_srv, "main", args) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoints),      cmocka_unit_test(test_greedy_equals_run),
        cmocka_unit_test(test_load),           cmocka_unit_test(test_load_float),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_slow_client),    cmocka_unit_test(test_disconnect_cancels),
        cmocka_unit_test(test_queue_full),     cmocka_unit_test(test_lazy_and_key),
        cmocka_unit_test(test_mounted_dir),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    server_stop(&main_srv);
    for (int i = 0; i < N_PROMPTS; i++)
        free(expected[i]);
    return failed ? 1 : 0;
}
