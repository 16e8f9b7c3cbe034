/* bench_spec.h: the parts of `sluice bench spec`: bench_spec.c (options and
 * the task runs), bench_spec_tasks.c (the task set), bench_spec_run.c (one
 * decode, ours or llama-lookup's), bench_spec_report.c (the summary by kind)
 * and bench_spec_cost.c (--verify-cost). */
#ifndef SLUICE_BENCH_SPEC_H
#define SLUICE_BENCH_SPEC_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "infer.h"

#define BENCH_SPEC_KINDS 4 /* restart, middle, continue, free */
#define BENCH_SPEC_TASKS_PER_KIND 3
#define BENCH_SPEC_PASSAGE_VERSES 8
#define BENCH_SPEC_COPY_GRAM 4       /* an output token copies the prompt: its 4-gram is there */
#define BENCH_SPEC_NEAR_VERBATIM 0.8 /* share of copied tokens that makes a kind near-verbatim */

extern const char *const bench_spec_kinds[BENCH_SPEC_KINDS];

/* ---- the task set (bench_spec_tasks.c) ---- */

struct bench_spec_task {
    const char *kind;
    int k;       /* index in bench_spec_kinds */
    int passage; /* the passage (or, for free, the verses) it was made from */
    char *prompt;
};

/* The file's non-empty lines; NULL with *err = -errno (the open), -EIO (a
 * read) or -ENOMEM on an error. */
char **bench_spec_read_lines(const char *path, uint32_t *n, int *err);
/* Frees what bench_spec_read_lines returned. */
void bench_spec_free_lines(char **lines, uint32_t n);
/* BENCH_SPEC_TASKS_PER_KIND tasks of every kind from the lines; -EINVAL
 * when there are too few, -ENOMEM (the *nt tasks made are the caller's to
 * free). */
int bench_spec_make_tasks(char **lines, uint32_t n, struct bench_spec_task *t, uint32_t *nt);
/* --history's stores: a task's history is the greedy outputs of the tasks
 * before it, each followed by -1: of its own kind (per kind), of any kind
 * on another passage (shared), or of any kind (shared, the same passage's
 * included). */
enum bench_spec_hist {
    BENCH_SPEC_HIST_NONE = 0,
    BENCH_SPEC_HIST_KIND,
    BENCH_SPEC_HIST_SHARED,
    BENCH_SPEC_HIST_SHARED_ALL
};
extern const char *const bench_spec_hist_names[4];
/* Task ti's history (outs[j][0..n_outs[j]) being task j's output) into
 * *h (the caller's to free; NULL and 0 when empty); -ENOMEM. */
int bench_spec_history(const struct bench_spec_task *t, int *const *outs, const uint32_t *n_outs,
                       uint32_t ti, enum bench_spec_hist mode, int **h, uint32_t *nh);
/* The share of out[0..n)'s tokens that end a BENCH_SPEC_COPY_GRAM-gram
 * (over the prompt's tail and the output) found in the prompt. */
double bench_spec_copy_share(const int *prompt, uint32_t np, const int *out, uint32_t n);

/* ---- one decode (bench_spec_run.c) ---- */

/* The most --calibrate-prefill keeps of the prompt's logits (n x vocab floats). */
#define BENCH_SPEC_LOGITS_MAX (1024 << 20)

struct bench_spec_keep { /* the tokens generated, up to cap */
    int *t;
    uint32_t n, cap;
    int prefill_logits; /* in: a speculative run's prefill keeps every row's logits
                           (calibration from them: --calibrate-prefill) */
    int no_npu;         /* in: the session runs without the NPU device thread
                           (--one-thread: no hand-offs, the calling thread alone) */
    double prefill_s;   /* out: the prefill's time */
    /* out: the decode's timed wall time; of it, the time in forwards (one-row
     * steps and verifications) and, speculative, in infer_spec_create and
     * _destroy (the indexes, calibration) */
    double wall_s, fwd_s, setup_s;
    double cpu_s; /* out: the process's CPU time over the timed decode (every
                     thread's, the device thread's spin-waits included) */
};
/* CPU time of the process (every thread), s: what a decode or forward
 * costs in work, less dependent on the load than the wall time. */
double bench_spec_cpu_s(void);

int bench_spec_keep_tok(void *ctx, int tok);
/* One decode of n tokens after the prompt on a fresh session, plain (so
 * NULL) or speculative (its statistics into sst): tokens/s (0 on error). */
double bench_spec_decode_once(struct infer_model *m, const int *ids, uint32_t np, uint32_t n,
                              const struct infer_spec_opts *so, struct bench_spec_keep *out,
                              struct infer_spec_stats *sst, struct sl_err *err);
/* llama-lookup's decode speed on the prompt (plain: --draft-max 0), or 0. */
double bench_spec_lookup_once(const char *bin, const char *gguf, const char *prompt, uint32_t n,
                              int plain);

/* ---- the summary (bench_spec_report.c) ---- */

/* Per kind: sums over its tasks of medians (best_*: of best runs) and of
 * the speculative runs' statistics. */
struct bench_spec_sums {
    double plain[BENCH_SPEC_KINDS], spec[BENCH_SPEC_KINDS], look[BENCH_SPEC_KINDS],
        lplain[BENCH_SPEC_KINDS], copy[BENCH_SPEC_KINDS];
    double best_plain[BENCH_SPEC_KINDS], best_spec[BENCH_SPEC_KINDS], best_look[BENCH_SPEC_KINDS],
        best_lplain[BENCH_SPEC_KINDS];
    uint32_t acc[BENCH_SPEC_KINDS], rounds[BENCH_SPEC_KINDS], drafted[BENCH_SPEC_KINDS],
        tasks[BENCH_SPEC_KINDS], steps[BENCH_SPEC_KINDS], skipped[BENCH_SPEC_KINDS],
        alone[BENCH_SPEC_KINDS];
    double step_s[BENCH_SPEC_KINDS], verify_s[BENCH_SPEC_KINDS], draft_s[BENCH_SPEC_KINDS],
        calib_s[BENCH_SPEC_KINDS];
    double prefill_plain_s[BENCH_SPEC_KINDS], prefill_spec_s[BENCH_SPEC_KINDS];
    /* decode wall time, of it in forwards, and (spec) in create/destroy */
    double wall_plain_s[BENCH_SPEC_KINDS], fwd_plain_s[BENCH_SPEC_KINDS],
        wall_spec_s[BENCH_SPEC_KINDS], fwd_spec_s[BENCH_SPEC_KINDS],
        setup_spec_s[BENCH_SPEC_KINDS];
    double cpu_plain_s[BENCH_SPEC_KINDS], cpu_spec_s[BENCH_SPEC_KINDS]; /* the decodes' CPU time */
    uint32_t tok_plain[BENCH_SPEC_KINDS], tok_spec[BENCH_SPEC_KINDS]; /* tokens they made */
    /* drafted and accepted rows by source: context, history, calibrated, reused */
    uint32_t src_drafted[BENCH_SPEC_KINDS][4], src_accepted[BENCH_SPEC_KINDS][4];
};

struct bench_spec_report_opts {
    uint32_t runs;
    double row_cost, verify_fixed; /* row_cost > 0: the priced line */
    int calibrate, lookup, json;
};

/* Prints the summary by kind (unless json) and adds "by_kind" to root. */
void bench_spec_report(const struct bench_spec_sums *S, const struct bench_spec_report_opts *ro,
                       cJSON *root);

/* v[0..n): 0 min, 1 median, 2 max (0 on an error). */
double bench_spec_stat(const double *v, uint32_t n, int which);
/* One forward of 1, 4, 8 and 16 rows after a context of ctx tokens, runs
 * times each, interleaved; the graph-switching measurement. 0 or 1. */
/* m: int8 weights; NULL: packed residency, a cold start of path.
 * one_thread (with m): the same forwards, interleaved, on a session without
 * the NPU device thread too. shape (1, 4, 8 or 16; 0: all): only that
 * forward is timed (a profile of one shape). */
int bench_spec_cost(struct infer_model *m, const char *path, uint32_t ctx, uint32_t runs,
                    uint32_t shape, int one_thread, int json);

#endif
