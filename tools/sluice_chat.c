/* sluice_chat.c: `sluice chat MODEL`: an interactive chat in the terminal, a
 * client of the server's engine (serve_engine.c: one session, cold-started
 * by the first message; later turns prefill only what is new). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve_engine.h"
#include "serve_model.h"
#include "serve_text.h"
#include "sluice.h"
#include "tools_spec.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice chat MODEL [--system TEXT] [--template T] [-n N] [--temp T]\n"
            "                   [--top-p P] [--seed S] [--npu-share F] [-v] [--spec M]\n\n"
            "An interactive chat: type a message and Enter; the reply streams as it is\n"
            "generated. The conversation is kept (each turn is the whole history, rendered\n"
            "with the model's chat template; the oldest turns are dropped when the context\n"
            "is full). Ctrl-C stops the current reply (what came is kept) and not the\n"
            "program; Ctrl-D (end of input) or /quit ends it; /reset forgets the history.\n"
            "Input need not be a terminal (one message a line). MODEL is a .sluice container\n"
            "or a `sluice mount` directory; the first message cold-starts the model.\n"
            "  --system TEXT    a system message first in the history\n"
            "  --template T     auto (default: the GGUF chat template the container kept,\n"
            "                   recognized by its markers, else transcript), transcript\n"
            "                   (\"User: ...\\nAssistant: ...\"), chatml, llama2 or llama3\n"
            "  -n N             tokens a reply may take at most, 1..1000000 (default: what\n"
            "                   the context leaves)\n"
            "  --temp T         temperature, 0..2 (default 0.7; 0 = greedy)\n"
            "  --top-p P        nucleus sampling, 0..1 (default 0.9)\n"
            "  --seed S         random seed (default 42)\n"
            "  --npu-share F    decode: the NPU device thread's share of each int8 matmul,\n"
            "                   0 <= F < 1 (default 0.5, as sluice run)\n"
            "  -v, --verbose    after each reply, a line on stderr: its tokens, decode\n"
            "                   tokens/s and, with --spec auto, the drafts (verifications,\n"
            "                   drafted, accepted, mean acceptance length)\n"
            "Speculative decoding of each reply (greedy text the same as with --spec off):\n");
    tools_spec_usage(f);
}

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

struct chat {
    struct serve_engine *e;
    struct serve_msg *msgs;
    uint32_t n, cap;
    uint32_t n_gen;
    int template_set;
    enum serve_template tpl;
    struct infer_sampler_params sp;
    int tty, verbose;
};

static int push(struct chat *c, const char *role, const char *text)
{
    if (c->n == c->cap) {
        uint32_t cap = c->cap ? c->cap * 2 : 16;
        struct serve_msg *m = realloc(c->msgs, sizeof *m * cap);
        if (!m)
            return -ENOMEM;
        c->msgs = m;
        c->cap = cap;
    }
    char *r = strdup(role), *t = strdup(text);
    if (!r || !t) {
        free(r);
        free(t);
        return -ENOMEM;
    }
    c->msgs[c->n++] = (struct serve_msg){r, t};
    return 0;
}

static void drop(struct chat *c, uint32_t i)
{
    free(c->msgs[i].role);
    free(c->msgs[i].content);
    memmove(c->msgs + i, c->msgs + i + 1, sizeof *c->msgs * (c->n - i - 1));
    c->n--;
}

/* The history as tokens, dropping the oldest turns (not a system message)
 * until a reply of 16 tokens fits. */
static int history_tokens(struct chat *c, int **ids, uint32_t *n, const char **stop,
                          struct sl_err *err)
{
    const struct format_config *cfg = serve_engine_config(c->e);
    for (;;) {
        char *text = serve_template_render(c->tpl, c->msgs, c->n, stop);
        if (!text)
            return -ENOMEM;
        uint32_t need = 0;
        infer_tokenizer_encode(serve_engine_tokenizer(c->e), text, 1, NULL, 0, &need);
        if (need + 16 <= cfg->seq_len) {
            *ids = malloc(sizeof(int) * need);
            int ret = *ids ? infer_tokenizer_encode(serve_engine_tokenizer(c->e), text, 1, *ids,
                                                    need, n)
                           : -ENOMEM;
            free(text);
            return ret;
        }
        free(text);
        uint32_t first = c->n && !strcmp(c->msgs[0].role, "system") ? 1 : 0;
        if (c->n - first <= 1) {
            sl_err_set(err, "the message is %u tokens with the template; the context holds %u",
                       need, cfg->seq_len);
            return -EINVAL;
        }
        drop(c, first);
    }
}

/* -v: the reply's tokens and speed, and its speculation, on stderr. */
static void report(const struct serve_gen *g, int cold, double ttft, double secs)
{
    fprintf(stderr, "[%u tokens in %.2f s with the prompt, %.1f tokens/s%s", g->taken, secs,
            secs > 0 ? g->taken / secs : 0.0, cold ? "; cold start" : "");
    if (cold)
        fprintf(stderr, ", first token after %.2f s", ttft);
    fprintf(stderr, "]\n");
    struct tools_spec_result r;
    serve_gen_spec_result(g, &r);
    tools_spec_print(stderr, &r);
}

/* One reply, streamed to stdout. */
static int reply(struct chat *c, struct sl_err *err)
{
    int *ids = NULL;
    uint32_t n = 0;
    const char *turn_end;
    int ret = history_tokens(c, &ids, &n, &turn_end, err);
    if (ret < 0)
        return ret;
    const struct format_config *cfg = serve_engine_config(c->e);
    uint32_t room = cfg->seq_len - n + 1;
    uint32_t max = c->n_gen && c->n_gen < room ? c->n_gen : room;
    struct serve_slot *slot;
    int cold;
    double ttft;
    interrupted = 0;
    uint64_t t0 = sl_now_ns();
    ret = serve_engine_acquire(c->e, ids, n, NULL, NULL, &slot, &cold, &ttft, err);
    if (ret < 0) {
        free(ids);
        return ret;
    }
    char *stops[1] = {(char *)turn_end};
    struct serve_gen g;
    ret = serve_gen_init(&g, c->e, slot, &c->sp, max, stops, 1, ids[n - 1], err);
    free(ids);
    if (ret < 0) {
        serve_engine_release(c->e, slot);
        return ret;
    }
    size_t lead = 0; /* spaces before the first word (the transcript's) are not shown */
    while (g.finish == SERVE_MORE && !interrupted) {
        if ((ret = serve_gen_next(&g, err)) < 0)
            break;
        size_t from, k;
        serve_gen_take(&g, &from, &k);
        while (k && from == lead && g.text[from] == ' ') {
            from++;
            k--;
            lead++;
        }
        if (k)
            fwrite(g.text + from, 1, k, stdout);
        fflush(stdout);
    }
    if (ret == 0 && g.finish == SERVE_MORE) { /* Ctrl-C: what can be said is said */
        g.finish = SERVE_STOP;
        size_t from, k;
        serve_gen_take(&g, &from, &k);
        if (k)
            fwrite(g.text + from, 1, k, stdout);
        fprintf(stderr, " [stopped]");
    }
    printf("\n");
    fflush(stdout);
    double secs = (double)(sl_now_ns() - t0) / 1e9;
    serve_engine_release(c->e, slot);
    if (c->verbose)
        report(&g, cold, ttft, secs);
    const char *text = g.text ? g.text : "";
    while (*text == ' ') /* the transcript's "Assistant: " space */
        text++;
    if (ret == 0)
        ret = push(c, "assistant", text);
    serve_gen_free(&g);
    return ret;
}

static void chat_reset(struct chat *c, const char *system)
{
    while (c->n)
        drop(c, c->n - 1);
    if (system)
        push(c, "system", system);
}

int cmd_chat(int argc, char **argv)
{
    static const char *const tpls[] = {"transcript", "chatml", "llama2", "llama3", "auto"};
    const char *model = NULL, *system = NULL;
    double temp = 0.7, top_p = 0.9, share = 0.5;
    uint64_t seed = 42;
    int tpl = 4;
    struct chat c = {0};
    struct tools_spec spec = {0};
    struct tools_args a = {"sluice chat", usage, argc, argv, 0};
    for (a.i = 1; a.i < argc; a.i++) {
        const char *s = argv[a.i];
        int bad = 0;
        if (tools_args_help(&a)) {
            return 0;
        } else if (!strcmp(s, "--system")) {
            bad = tools_args_value(&a, &system);
        } else if (!strcmp(s, "--template")) {
            bad = tools_args_choice(&a, tpls, 5, &tpl);
        } else if (!strcmp(s, "-n")) {
            bad = tools_args_u32(&a, 1, 1000000, &c.n_gen);
        } else if (!strcmp(s, "--temp")) {
            bad = tools_args_double(&a, 0, 2, 0, &temp);
        } else if (!strcmp(s, "--top-p")) {
            bad = tools_args_double(&a, 0, 1, 0, &top_p);
        } else if (!strcmp(s, "--seed")) {
            bad = tools_args_u64(&a, 0, UINT64_MAX, &seed);
        } else if (!strcmp(s, "--npu-share")) {
            bad = tools_args_double(&a, 0, 1, TOOLS_ARGS_BELOW_MAX, &share);
        } else if (!strcmp(s, "-v") || !strcmp(s, "--verbose")) {
            c.verbose = 1;
        } else if ((bad = tools_spec_arg(&a, s, &spec)) != 0) {
            bad = bad < 0;
        } else {
            bad = tools_args_operand(&a, &model);
        }
        if (bad)
            return 2;
    }
    if (tools_args_need(&a, model, "MODEL") < 0)
        return 2;
    c.sp = (struct infer_sampler_params){.temperature = (float)temp, .top_p = (float)top_p,
                                         .seed = seed};
    struct sl_err err = {{0}};
    char path[4096], id[256];
    struct serve_engine_opts eo = {.path = path, .parallel = 1, .queue = 0, .lazy = 1,
                                   .npu_share = share, .spec = spec};
    infer_pipeline_opts_init(&eo.pipeline);
    int ret = serve_model_resolve(model, path, sizeof path, id, sizeof id, &err);
    if (ret == 0)
        ret = serve_engine_create(&eo, &c.e, &err);
    if (ret == 0)
        ret = serve_engine_open(c.e, &err);
    if (ret < 0) {
        fprintf(stderr, "sluice chat: %s\n", err.msg);
        serve_engine_destroy(c.e);
        return 1;
    }
    c.tpl = tpl == 4 ? serve_template_detect(serve_engine_chat_template(c.e))
                     : (enum serve_template)tpl;
    c.tty = isatty(0);
    struct sigaction sa = {.sa_handler = on_sigint}; /* no SA_RESTART: a read returns EINTR */
    sigaction(SIGINT, &sa, NULL);
    if (c.tty)
        fprintf(stderr, "sluice chat: %s, template %s; Ctrl-C stops a reply, Ctrl-D ends\n", id,
                serve_template_name(c.tpl));
    chat_reset(&c, system);
    char line[65536];
    for (;;) {
        if (c.tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        errno = 0;
        if (!fgets(line, sizeof line, stdin)) {
            if (errno == EINTR) { /* Ctrl-C at the prompt: a new prompt */
                clearerr(stdin);
                if (c.tty)
                    fputs("\n", stdout);
                continue;
            }
            break;
        }
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0])
            continue;
        if (!strcmp(line, "/quit"))
            break;
        if (!strcmp(line, "/reset")) {
            chat_reset(&c, system);
            continue;
        }
        if ((ret = push(&c, "user", line)) == 0)
            ret = reply(&c, &err);
        if (ret == -EINVAL) { /* too long: forget it and go on */
            fprintf(stderr, "sluice chat: %s\n", err.msg);
            drop(&c, c.n - 1);
            ret = 0;
        }
        if (ret < 0) {
            fprintf(stderr, "sluice chat: %s\n", err.msg[0] ? err.msg : strerror(-ret));
            break;
        }
    }
    chat_reset(&c, NULL);
    free(c.msgs);
    serve_engine_destroy(c.e);
    return ret < 0 ? 1 : 0;
}
