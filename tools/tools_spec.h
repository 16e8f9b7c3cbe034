/* tools_spec.h: `--spec off|auto` and its options for the commands that
 * generate (sluice run, chat and serve; the last two through serve_engine's
 * serve_gen, round by round, without the history options), generation through
 * infer_spec_* (or plain infer_session_generate), and its statistics. */
#ifndef SLUICE_TOOLS_SPEC_H
#define SLUICE_TOOLS_SPEC_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "infer.h"
#include "tools_util.h"

struct tools_spec {
    int on;                  /* --spec auto */
    uint32_t rows;           /* --spec-rows 4|8|16 (0: 8) */
    int calibrate;           /* --spec-calibrate */
    int no_reuse;            /* --spec-no-reuse */
    const char *history_dir; /* --spec-history DIR, or NULL */
    const char *kind;        /* --spec-kind NAME (default "default") */
    uint32_t history_max;    /* --spec-history-max N tokens (default 65536) */
    int trace;               /* record the verifications for tools_spec_trace */
};

struct tools_spec_round {
    uint64_t t0, t1;
    uint32_t rows, accepted;
};

struct tools_spec_result {
    int on;              /* speculation ran */
    const char *off_why; /* why auto fell back to plain decoding, or NULL */
    struct infer_spec_stats st;
    struct tools_spec_round *rounds; /* for the trace (malloc'ed; tools_spec_result_free) */
    uint32_t n_rounds, cap_rounds;
};

/* The usage lines of the options above; _history: of the history's
 * (tools_spec_hist.c: sluice run's only). */
void tools_spec_usage(FILE *f);
void tools_spec_usage_history(FILE *f);
/* Parses argv[a->i] if it is one of the options: 1 (taken), -1 (a usage
 * error, printed), 0 (not one of them). */
int tools_spec_arg(struct tools_args *a, const char *s, struct tools_spec *o);
/* The same, the history's options too. */
int tools_spec_arg_history(struct tools_args *a, const char *s, struct tools_spec *o);
/* infer_session_generate, speculatively when o->on and the model allows it
 * exactly (infer_spec_exact); prompt[0..n) is the context so far. Appends
 * the generation to the history when there is one. */
int tools_spec_generate(const struct tools_spec *o, struct infer_session *s, const int *prompt,
                        uint32_t n, uint32_t max_tokens, const int *stop, uint32_t n_stop,
                        infer_token_fn on_token, void *ctx, uint32_t *n_out,
                        struct tools_spec_result *r, struct sl_err *err);
/* "spec": {...} into j; a line on f (or into buf: "" when off). */
void tools_spec_json(cJSON *j, const struct tools_spec_result *r);
void tools_spec_print(FILE *f, const struct tools_spec_result *r);
void tools_spec_line(char *buf, size_t size, const struct tools_spec_result *r);
/* Adds the verifications (spans on their own track, ts from t0_ns, the
 * trace's start) and the statistics (otherData.spec) to the Chrome trace
 * at path, rewritten atomically. 0 or -errno with err. */
int tools_spec_trace(const char *path, uint64_t t0_ns, const struct tools_spec_result *r,
                     struct sl_err *err);
void tools_spec_result_free(struct tools_spec_result *r);

#endif
