/* tools_spec.c: --spec for the generating commands (tools_spec.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "tools_spec.h"

void tools_spec_usage(FILE *f)
{
    fprintf(f,
            "  --spec off|auto  speculative decoding (sd.npu): drafts retrieved from the\n"
            "                   prompt, the text so far and the history, verified as a tree\n"
            "                   in one batched forward; greedy text is identical to off.\n"
            "                   auto falls back to off for a model with dynamic activation\n"
            "                   scales (rows would change each other's results) (default off)\n"
            "  --spec-rows N    verification rows: 4, 8 or 16 (default 8)\n"
            "  --spec-calibrate in-context calibration: after the first token, the prompt's\n"
            "                   logits at every position add the model's likely wording as\n"
            "                   drafts (costs one more pass over the prompt)\n"
            "  --spec-no-reuse  no reuse of rejected draft segments\n");
}

int tools_spec_arg(struct tools_args *a, const char *s, struct tools_spec *o)
{
    static const char *const modes[] = {"off", "auto"};
    int bad = 0;
    if (!strcmp(s, "--spec")) {
        bad = tools_args_choice(a, modes, 2, &o->on);
    } else if (!strcmp(s, "--spec-rows")) {
        bad = tools_args_u32(a, 4, 16, &o->rows);
        if (!bad && o->rows != 4 && o->rows != 8 && o->rows != 16) {
            fprintf(stderr, "%s: --spec-rows wants 4, 8 or 16, not %u\n", a->cmd, o->rows);
            bad = 1;
        }
    } else if (!strcmp(s, "--spec-calibrate")) {
        o->calibrate = 1;
    } else if (!strcmp(s, "--spec-no-reuse")) {
        o->no_reuse = 1;
    } else {
        return 0;
    }
    return bad ? -1 : 1;
}

/* The history's file belongs to a vocabulary: token ids mean the same. */
static uint64_t vocab_tag(struct infer_session *s)
{
    const struct format_tokenizer *t =
        format_reader_tokenizer(infer_model_reader(infer_session_model(s)));
    XXH3_state_t *h = XXH3_createState();
    if (!h)
        return 0;
    XXH3_64bits_reset(h);
    for (uint32_t i = 0; t && i < t->n_tokens; i++) {
        XXH3_64bits_update(h, t->tokens[i], t->lens[i]);
        XXH3_64bits_update(h, "", 1);
    }
    uint64_t v = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return v;
}

static void on_round(void *ctx, uint64_t t0, uint64_t t1, uint32_t rows, uint32_t accepted)
{
    struct tools_spec_result *r = ctx;
    if (r->n_rounds == r->cap_rounds) {
        uint32_t cap = r->cap_rounds ? r->cap_rounds * 2 : 256;
        struct tools_spec_round *n = realloc(r->rounds, sizeof *n * cap);
        if (!n)
            return; /* the trace loses rounds; the statistics stay whole */
        r->rounds = n;
        r->cap_rounds = cap;
    }
    r->rounds[r->n_rounds++] = (struct tools_spec_round){t0, t1, rows, accepted};
}

void tools_spec_result_free(struct tools_spec_result *r)
{
    free(r->rounds);
    r->rounds = NULL;
    r->n_rounds = r->cap_rounds = 0;
}

int tools_spec_generate(const struct tools_spec *o, struct infer_session *s, const int *prompt,
                        uint32_t n, uint32_t max_tokens, const int *stop, uint32_t n_stop,
                        infer_token_fn on_token, void *ctx, uint32_t *n_out,
                        struct tools_spec_result *r, struct sl_err *err)
{
    memset(r, 0, sizeof *r);
    if (o->on && !infer_spec_exact(infer_session_model(s)))
        r->off_why = "dynamic activation scales";
    if (!o->on || r->off_why)
        return infer_session_generate(s, max_tokens, stop, n_stop, on_token, ctx, n_out, err);
    struct infer_spec_store *h = NULL;
    struct infer_spec *sp = NULL;
    int ret = 0;
    if (o->history_dir)
        ret = infer_spec_store_open(o->history_dir, o->kind ? o->kind : "default", vocab_tag(s),
                                    o->history_max ? o->history_max : 65536, &h, err);
    struct infer_spec_opts so = {.max_rows = o->rows,
                                 .calibrate = o->calibrate,
                                 .no_reuse = o->no_reuse,
                                 .on_round = o->trace ? on_round : NULL,
                                 .round_ctx = r};
    if (ret == 0 && h)
        so.history = infer_spec_store_tokens(h, &so.n_history);
    if (ret == 0)
        ret = infer_spec_create(s, prompt, n, &so, &sp, err);
    if (ret == 0) {
        r->on = 1;
        ret = infer_spec_generate(sp, max_tokens, stop, n_stop, on_token, ctx, n_out, err);
        infer_spec_stats(sp, &r->st);
    }
    if (ret == 0 && h) {
        uint32_t ng;
        const int *g = infer_spec_generated(sp, &ng);
        ret = infer_spec_store_add(h, g, ng, err);
    }
    infer_spec_destroy(sp);
    infer_spec_store_close(h);
    return ret;
}

void tools_spec_json(cJSON *j, const struct tools_spec_result *r)
{
    cJSON *o = cJSON_AddObjectToObject(j, "spec");
    if (!o)
        return;
    const struct infer_spec_stats *s = &r->st;
    cJSON_AddStringToObject(o, "mode", r->on ? "auto" : "off");
    if (r->off_why)
        cJSON_AddStringToObject(o, "off_because", r->off_why);
    if (!r->on)
        return;
    uint32_t fw = s->rounds + s->plain_steps;
    cJSON_AddNumberToObject(o, "rounds", s->rounds);
    cJSON_AddNumberToObject(o, "plain_steps", s->plain_steps);
    cJSON_AddNumberToObject(o, "plain_steps_draft_skipped", s->skipped);
    cJSON_AddNumberToObject(o, "drafted", s->drafted);
    cJSON_AddNumberToObject(o, "accepted", s->accepted);
    cJSON_AddNumberToObject(o, "acceptance_rate",
                            s->drafted ? (double)s->accepted / s->drafted : 0);
    /* tokens per verification: the accepted drafts plus the model's own token */
    cJSON_AddNumberToObject(o, "mean_acceptance_length",
                            s->rounds ? (double)(s->accepted + s->rounds) / s->rounds : 0);
    cJSON_AddNumberToObject(o, "tokens_per_forward", fw ? (double)s->tokens / fw : 0);
    /* decode time per token against the one-row steps of this run, when it had some */
    double step = s->plain_steps >= 8 ? s->plain_s / s->plain_steps : 0;
    double spent = s->verify_s + s->plain_s + s->draft_s + s->calib_s;
    if (step > 0 && spent > 0)
        cJSON_AddNumberToObject(o, "speedup_est", step * s->tokens / spent);
    else
        cJSON_AddNullToObject(o, "speedup_est");
    cJSON_AddNumberToObject(o, "reuse_drafted", s->reuse_drafted);
    cJSON_AddNumberToObject(o, "reuse_accepted", s->reuse_accepted);
    cJSON_AddNumberToObject(o, "calib_sequences", s->calib_seqs);
    cJSON_AddNumberToObject(o, "calib_drafted", s->calib_drafted);
    cJSON_AddNumberToObject(o, "calib_accepted", s->calib_accepted);
    cJSON_AddNumberToObject(o, "history_drafted", s->history_drafted);
    cJSON_AddNumberToObject(o, "history_accepted", s->history_accepted);
    cJSON *sh = cJSON_AddArrayToObject(o, "rounds_by_rows_4_8_16");
    for (int i = 0; sh && i < 3; i++)
        cJSON_AddItemToArray(sh, cJSON_CreateNumber(s->shapes[i]));
    cJSON_AddNumberToObject(o, "draft_s", s->draft_s);
    cJSON_AddNumberToObject(o, "verify_s", s->verify_s);
    cJSON_AddNumberToObject(o, "plain_s", s->plain_s);
    cJSON_AddNumberToObject(o, "calib_s", s->calib_s);
}

void tools_spec_line(char *buf, size_t size, const struct tools_spec_result *r)
{
    const struct infer_spec_stats *s = &r->st;
    buf[0] = 0;
    if (r->off_why)
        snprintf(buf, size, "spec: off (%s)\n", r->off_why);
    if (!r->on)
        return;
    snprintf(buf, size,
             "spec: %u verifications, %u plain steps; drafted %u, accepted %u (%.0f%%); mean "
             "acceptance length %.2f; %.2f tokens per forward\n",
             s->rounds, s->plain_steps, s->drafted, s->accepted,
             s->drafted ? 100.0 * s->accepted / s->drafted : 0.0,
             s->rounds ? (double)(s->accepted + s->rounds) / s->rounds : 0.0,
             s->rounds + s->plain_steps ? (double)s->tokens / (s->rounds + s->plain_steps) : 0.0);
}

void tools_spec_print(FILE *f, const struct tools_spec_result *r)
{
    char line[320];
    tools_spec_line(line, sizeof line, r);
    fputs(line, f);
}

static cJSON *event(const char *ph, double ts, uint32_t rows, uint32_t accepted)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", "verify");
    cJSON_AddStringToObject(e, "cat", "spec");
    cJSON_AddStringToObject(e, "ph", ph);
    cJSON_AddNumberToObject(e, "pid", 1);
    cJSON_AddNumberToObject(e, "tid", 200);
    cJSON_AddNumberToObject(e, "ts", ts);
    if (ph[0] == 'B') {
        cJSON *a = cJSON_AddObjectToObject(e, "args");
        cJSON_AddNumberToObject(a, "rows", rows);
        cJSON_AddNumberToObject(a, "accepted", accepted);
    }
    return e;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1))) {
            size_t len = fread(text, 1, (size_t)n, f);
            text[len] = 0;
        }
    }
    fclose(f);
    return text;
}

static int write_atomic(const char *path, const char *out, struct sl_err *err)
{
    size_t tl = strlen(path) + 8;
    char *tmp = malloc(tl);
    if (!tmp) {
        sl_err_set(err, "out of memory for the trace");
        return -ENOMEM;
    }
    snprintf(tmp, tl, "%s.tmp", path);
    int ret = 0;
    FILE *f = fopen(tmp, "wb");
    size_t n = strlen(out);
    if (!f || fwrite(out, 1, n, f) != n || fputc('\n', f) == EOF)
        ret = -(errno ? errno : EIO);
    if (f && fclose(f) != 0 && ret == 0)
        ret = -(errno ? errno : EIO);
    if (ret == 0 && rename(tmp, path) != 0)
        ret = -errno;
    if (ret < 0) {
        sl_err_set(err, "%s: cannot write the trace (%s)", path, strerror(-ret));
        unlink(tmp);
    }
    free(tmp);
    return ret;
}

int tools_spec_trace(const char *path, uint64_t t0_ns, const struct tools_spec_result *r,
                     struct sl_err *err)
{
    char *text = slurp(path);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    cJSON *ev = j ? cJSON_GetObjectItem(j, "traceEvents") : NULL;
    if (!cJSON_IsArray(ev)) {
        cJSON_Delete(j);
        sl_err_set(err, "%s: not a trace this run wrote", path);
        return -EINVAL;
    }
    cJSON *other = cJSON_GetObjectItem(j, "otherData");
    if (!other)
        other = cJSON_AddObjectToObject(j, "otherData");
    cJSON *tmp = cJSON_CreateObject();
    if (other && tmp) {
        tools_spec_json(tmp, r);
        cJSON *sp = cJSON_DetachItemFromObject(tmp, "spec");
        if (sp)
            cJSON_AddItemToObject(other, "spec", sp);
    }
    cJSON_Delete(tmp);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "name", "thread_name");
    cJSON_AddStringToObject(m, "ph", "M");
    cJSON_AddNumberToObject(m, "pid", 1);
    cJSON_AddNumberToObject(m, "tid", 200);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(m, "args"), "name", "speculative decoding");
    cJSON_AddItemToArray(ev, m);
    for (uint32_t i = 0; i < r->n_rounds; i++) {
        const struct tools_spec_round *q = &r->rounds[i];
        if (q->t0 < t0_ns)
            continue;
        cJSON_AddItemToArray(ev, event("B", (double)(q->t0 - t0_ns) / 1e3, q->rows, q->accepted));
        cJSON_AddItemToArray(ev, event("E", (double)(q->t1 - t0_ns) / 1e3, 0, 0));
    }
    char *out = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!out) {
        sl_err_set(err, "out of memory for the trace");
        return -ENOMEM;
    }
    int ret = write_atomic(path, out, err);
    free(out);
    return ret;
}
