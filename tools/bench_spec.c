/* bench_spec.c: `sluice bench spec`: decode tokens/s of plain decoding,
 * speculative decoding (infer_spec_*) and, optionally, llama.cpp's
 * llama-lookup on the same prompts, interleaved run by run; medians. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_spec.h"
#include "import.h"
#include "infer.h"
#include "sluice.h"
#include "tools_stats.h"
#include "tools_util.h"

#define TASKS_PER_KIND BENCH_SPEC_TASKS_PER_KIND
#define PASSAGE_VERSES BENCH_SPEC_PASSAGE_VERSES
#define N_KINDS BENCH_SPEC_KINDS
#define COPY_GRAM BENCH_SPEC_COPY_GRAM
#define NEAR_VERBATIM BENCH_SPEC_NEAR_VERBATIM

double bench_spec_stat(const double *v, uint32_t n, int which)
{
    struct tools_stats st;
    if (tools_stats_compute(v, n, &st) < 0)
        return 0;
    return which == 2 ? st.max : which ? st.median : st.min;
}
#define tools_median(v, n) bench_spec_stat(v, n, 1)
#define tools_min(v, n) bench_spec_stat(v, n, 0)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench spec MODEL --text FILE [--tokenizer FILE] [-n N] [--runs R]\n"
            "                         [--rows 4|8|16] [--calibrate|--calibrate-prefill] [--min-match N]\n"
            "                         [--history|--history-shared|--history-shared-all]\n"
            "                         [--row-cost A [--verify-fixed B]] [--lookup BIN --gguf FILE]\n"
            "                         [--json]\n"
            "       sluice bench spec MODEL --verify-cost C [--runs R] [--resident int8|packed]\n"
            "                         [--one-thread] [--json]\n\n"
            "Decode tokens/s of plain greedy decoding against speculative decoding (--spec\n"
            "auto) on the same model and prompts, run for run (plain and spec, each first in\n"
            "every other run, llama.cpp plain, llama-lookup, then again), medians and best\n"
            "runs; checks that the greedy tokens are identical.\n"
            "Tasks are made from FILE (one verse a line, e.g. kjv6L.calib.txt):\n"
            "  restart   quote: a passage of %d verses, then its first verse's opening words\n"
            "  middle    extract: the passage, then the opening words of its fifth verse\n"
            "  continue  the passage, then the opening words of the verse after it\n"
            "  free      the opening words of a verse not in any prompt (no context)\n"
            "%d tasks of each kind. Generation is N tokens (no stop token), after the prompt's\n"
            "prefill (not timed). Column `copy`: the share of the greedy output's tokens that\n"
            "end a %d-gram of the prompt (how verbatim the output is); a kind at %.0f%% or more\n"
            "is reported as near-verbatim. Exit status 1 if the greedy tokens ever differ.\n"
            "  -n N          tokens to generate (default 128)\n"
            "  --runs R      runs of every contender on every task (default 3)\n"
            "  --rows N      verification rows (default 8)\n"
            "  --calibrate   in-context calibration (its pass over the prompt is timed)\n"
            "  --calibrate-prefill  the same from the prefill's logits of every row (the\n"
            "                classifier over every prompt row: its time is the prefill's,\n"
            "                reported beside plain decoding's prefill; at most 1 GiB of\n"
            "                logits: prompt tokens x vocabulary x 4 bytes)\n"
            "  --history     a history store per kind: a task drafts from the greedy outputs\n"
            "                of the earlier tasks of its kind (other passages), as a store of\n"
            "                earlier generations per task kind would hold them\n"
            "  --history-shared  one history store for every task, whatever its kind:\n"
            "                a task drafts from the greedy outputs of all the tasks before it\n"
            "                on other passages, as a store used under one task kind would\n"
            "                hold a user's earlier generations on other texts\n"
            "  --history-shared-all  the same with the earlier tasks on the same passage\n"
            "                too (what the model wrote on this very text: optimistic)\n"
            "  --min-match N shortest n-gram that drafts from the context, 1..4 (default 2;\n"
            "                a 1-gram still drafts when no longer match drafted anything)\n"
            "  --row-cost A  the cost model's price of one more verification row against a\n"
            "                one-row step, 0.01..4 (default: measured as it runs); a fixed price\n"
            "                makes the drafts, and so the tokens per forward, independent of\n"
            "                the load; each kind's line `priced` then gives plain decoding's\n"
            "                one-row steps over speculation's, every verification counted at\n"
            "                that price (a speedup free of the machine's noise, for tuning)\n"
            "  --verify-fixed B  with --row-cost: a verification's fixed cost beside it, in\n"
            "                one-row steps, 0..4 (default 0)\n"
            "  --lookup BIN  llama.cpp's llama-lookup, run on --gguf (the same model) with\n"
            "                the same prompt text, -n N, greedy, one thread, EOS ignored;\n"
            "                its own 'decoded ... t/s' line is taken; also with --draft-max 0\n"
            "                (llama.cpp's plain decoding, column llama)\n"
            "  --verify-cost C  instead: the time of one forward of 1, 4, 8 and 16 rows (a\n"
            "                draft tree) after a context of C tokens, --runs times each,\n"
            "                interleaved (the verification shapes against a decode step),\n"
            "                with each shape's process CPU time (every thread's, spin-waits\n"
            "                included) and its ratio to one row's beside the wall times\n"
            "                (the task runs' options do not go with it)\n"
            "  --shape N     with --verify-cost: only the N-row forward (1, 4, 8 or 16),\n"
            "                to profile one shape (perf record; no ratio unless N is 1)\n"
            "  --one-thread  with --verify-cost: also the same forwards on the calling\n"
            "                thread alone (a session without the NPU device thread),\n"
            "                interleaved with the split ones; not with --resident packed;\n"
            "                with the task runs: plain and speculative decoding both on\n"
            "                the calling thread alone (no hand-offs)\n"
            "  --resident R  with --verify-cost: the model's weights as loaded (default: int8,\n"
            "                or float for a float model) or packed residency\n"
            "                (a cold start that keeps the packed codes, as run --resident\n"
            "                packed; the graph-switching line is the int8 path's, not printed)\n"
            "  --tokenizer F llama2.c tokenizer when MODEL is a llama2.c .bin\n"
            "  --json        one JSON object\n",
            PASSAGE_VERSES, TASKS_PER_KIND, COPY_GRAM, 100 * NEAR_VERBATIM);
}

int bench_spec(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *tokenizer = NULL, *lookup = NULL, *gguf = NULL;
    uint32_t n = 128, runs = 3, rows = 8;
    int json = 0, calibrate = 0, packed = 0;
    uint32_t min_match = 0;
    double row_cost = 0, verify_fixed = 0;
    int one_thread = 0;
    enum bench_spec_hist history = BENCH_SPEC_HIST_NONE;
    uint32_t shape = 0;
    uint32_t cost_ctx = 0;
    struct tools_args a = {"sluice bench spec", usage, argc, argv, 0};
    for (a.i = 1; a.i < argc; a.i++) {
        const char *s = argv[a.i];
        int bad = 0;
        if (tools_args_help(&a)) {
            return 0;
        } else if (!strcmp(s, "--text")) {
            bad = tools_args_value(&a, &text);
        } else if (!strcmp(s, "--tokenizer")) {
            bad = tools_args_value(&a, &tokenizer);
        } else if (!strcmp(s, "--lookup")) {
            bad = tools_args_value(&a, &lookup);
        } else if (!strcmp(s, "--gguf")) {
            bad = tools_args_value(&a, &gguf);
        } else if (!strcmp(s, "-n")) {
            bad = tools_args_u32(&a, 1, 100000, &n);
        } else if (!strcmp(s, "--runs")) {
            bad = tools_args_u32(&a, 1, 1000, &runs);
        } else if (!strcmp(s, "--rows")) {
            bad = tools_args_u32(&a, 4, 16, &rows);
        } else if (!strcmp(s, "--verify-cost")) {
            bad = tools_args_u32(&a, 1, UINT32_MAX, &cost_ctx);
        } else if (!strcmp(s, "--resident")) {
            const char *v = NULL;
            if (!(bad = tools_args_value(&a, &v)) && strcmp(v, "int8") && strcmp(v, "packed")) {
                fprintf(stderr, "sluice bench spec: --resident wants int8 or packed, not '%s'\n",
                        v);
                bad = 1;
            }
            packed = !bad && !strcmp(v, "packed");
        } else if (!strcmp(s, "--calibrate") || !strcmp(s, "--calibrate-prefill")) {
            int want = !strcmp(s, "--calibrate") ? 1 : 2;
            if (calibrate && calibrate != want) {
                fprintf(stderr, "sluice bench spec: --calibrate and --calibrate-prefill are "
                                "two ways of the same calibration: give one\n");
                bad = 1;
            }
            calibrate = want;
        } else if (!strcmp(s, "--min-match")) {
            bad = tools_args_u32(&a, 1, 4, &min_match);
        } else if (!strcmp(s, "--row-cost")) {
            bad = tools_args_double(&a, 0.01, 4, 0, &row_cost);
        } else if (!strcmp(s, "--verify-fixed")) {
            bad = tools_args_double(&a, 0, 4, 0, &verify_fixed);
        } else if (!strcmp(s, "--history")) {
            history = BENCH_SPEC_HIST_KIND;
        } else if (!strcmp(s, "--history-shared")) {
            history = BENCH_SPEC_HIST_SHARED;
        } else if (!strcmp(s, "--history-shared-all")) {
            history = BENCH_SPEC_HIST_SHARED_ALL;
        } else if (!strcmp(s, "--shape")) {
            bad = tools_args_u32(&a, 1, 16, &shape);
            if (!bad && shape != 1 && shape != 4 && shape != 8 && shape != 16) {
                fprintf(stderr, "sluice bench spec: --shape wants 1, 4, 8 or 16\n");
                bad = 1;
            }
        } else if (!strcmp(s, "--one-thread")) {
            one_thread = 1;
        } else if (!strcmp(s, "--json")) {
            json = 1;
        } else {
            bad = tools_args_operand(&a, &model);
        }
        if (bad)
            return 2;
    }
    if ((packed || shape) && !cost_ctx) {
        fprintf(stderr, "sluice bench spec: %s goes with --verify-cost\n",
                packed ? "--resident" : "--shape");
        return 2;
    }
    if (packed && one_thread) {
        fprintf(stderr, "sluice bench spec: --one-thread times the int8 or float weights, not "
                        "--resident packed\n");
        return 2;
    }
    if (cost_ctx && (history || calibrate || row_cost > 0 || min_match || text || lookup)) {
        fprintf(stderr, "sluice bench spec: --verify-cost times forwards alone: --text, --history, "
                        "--calibrate, --row-cost, --min-match and --lookup go with the task runs\n");
        return 2;
    }
    if (verify_fixed > 0 && !(row_cost > 0)) {
        fprintf(stderr, "sluice bench spec: --verify-fixed goes with --row-cost\n");
        return 2;
    }
    if (!model || (!text && !cost_ctx) || (lookup && !gguf) ||
        (rows != 4 && rows != 8 && rows != 16)) {
        fprintf(stderr, "sluice bench spec: want MODEL, --text FILE, --gguf with --lookup, and "
                        "--rows 4, 8 or 16\n\n");
        usage(stderr);
        return 2;
    }
    struct sl_err err = {{0}};
    char tmp[4096] = "";
    const char *path = model;
    enum import_source kind;
    int ret = import_source_detect(model, &kind, &err);
    if (ret == 0 && kind != IMPORT_SRC_SLUICE) {
        const char *dir = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
        snprintf(tmp, sizeof tmp, "%s/sluice-bench-spec-%d.sluice", dir, (int)getpid());
        struct import_opts io = {.tokenizer = tokenizer, .dtype = -1};
        ret = import_model(model, &io, tmp, &err);
        if (ret < 0)
            tmp[0] = 0;
        path = tmp;
    }
    struct infer_model *m = NULL;
    struct infer_tokenizer *tk = NULL;
    if (ret == 0 && cost_ctx && packed) {
        ret = bench_spec_cost(NULL, path, cost_ctx, runs, shape, one_thread, json);
        if (tmp[0])
            unlink(tmp);
        return ret;
    }
    if (ret == 0)
        ret = infer_model_load(path, NULL, &m, &err);
    if (tmp[0])
        unlink(tmp);
    if (ret == 0)
        ret = infer_tokenizer_create(format_reader_tokenizer(infer_model_reader(m)),
                                     infer_model_config(m), &tk, &err);
    if (ret < 0) {
        fprintf(stderr, "sluice bench spec: %s\n", err.msg);
        infer_model_destroy(m);
        return 1;
    }
    if (cost_ctx) {
        ret = bench_spec_cost(m, path, cost_ctx, runs, shape, one_thread, json);
        infer_tokenizer_destroy(tk);
        infer_model_destroy(m);
        return ret;
    }
    if (!infer_spec_exact(m))
        fprintf(stderr,
                "sluice bench spec: %s has dynamic activation scales: greedy text may "
                "differ under speculation\n",
                model);
    uint32_t nl = 0;
    int lerr = 0;
    char **lines = bench_spec_read_lines(text, &nl, &lerr);
    struct bench_spec_task tasks[N_KINDS * TASKS_PER_KIND];
    uint32_t nt = 0;
    int terr = lines ? bench_spec_make_tasks(lines, nl, tasks, &nt) : 0;
    if (!lines || terr < 0) {
        if (!lines)
            fprintf(stderr, "sluice bench spec: %s: %s\n", text, strerror(-lerr));
        else if (terr == -EINVAL)
            fprintf(stderr, "sluice bench spec: %s: want at least %d lines of text\n", text,
                    (TASKS_PER_KIND + 1) * (PASSAGE_VERSES + 2));
        else
            fprintf(stderr, "sluice bench spec: out of memory making the tasks\n");
        for (uint32_t i = 0; i < nt; i++)
            free(tasks[i].prompt);
        bench_spec_free_lines(lines, nl);
        infer_tokenizer_destroy(tk);
        infer_model_destroy(m);
        return 1;
    }
    uint32_t seq = infer_model_config(m)->seq_len;
    int *ids = malloc(sizeof(int) * seq);
    struct bench_spec_keep kp = {.t = malloc(sizeof(int) * n), .cap = n, .no_npu = one_thread};
    struct bench_spec_keep ks = {
        .t = malloc(sizeof(int) * n), .cap = n, .prefill_logits = calibrate == 2,
        .no_npu = one_thread};
    double *v = malloc(sizeof(double) * runs * 4);
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "tasks");
    struct infer_spec_opts so = {.max_rows = rows, .calibrate = calibrate != 0,
                                 .min_match = min_match, .row_cost = (float)row_cost,
                                 .verify_cost = (float)verify_fixed};
    int mismatch = 0, failed = 0;
    /* --history: every task's greedy output, for the later tasks' stores */
    int *outs[N_KINDS * BENCH_SPEC_TASKS_PER_KIND] = {NULL}, *hist = NULL;
    uint32_t n_outs[N_KINDS * BENCH_SPEC_TASKS_PER_KIND] = {0}, n_hist = 0;
    if (!ids || !kp.t || !ks.t || !v || !root || !arr) {
        fprintf(stderr, "sluice bench spec: out of memory\n");
        failed = 1;
        goto done;
    }
    struct bench_spec_sums S = {0}; /* per kind, for the summary */
    if (!json)
        printf("%-8s %6s %9s %9s %9s %9s %8s %8s %7s %6s %5s\n", "task", "prompt", "plain",
               "spec", "llama", "lookup", "spec/pl", "look/lla", "accept", "len", "copy");
    for (uint32_t ti = 0; ti < nt; ti++) {
        uint32_t np;
        if (infer_tokenizer_encode(tk, tasks[ti].prompt, 1, ids, seq - n - 1, &np) < 0) {
            fprintf(stderr, "sluice bench spec: task %u's prompt is too long\n", ti);
            continue;
        }
        double *vp = v, *vs = v + runs, *vl = v + 2 * runs, *vlp = v + 3 * runs;
        struct infer_spec_stats sst = {0}, one;
        free(hist);
        if (bench_spec_history(tasks, outs, n_outs, ti, history, &hist, &n_hist) < 0) {
            fprintf(stderr, "sluice bench spec: out of memory for the history\n");
            failed = 1;
            break;
        }
        so.history = hist;
        so.n_history = n_hist;
        for (uint32_t r = 0; r < runs; r++) { /* statistics: the sums over the runs */
            /* plain first on even runs, speculative first on odd ones, so
             * neither always runs second (with nothing to verify, --row-cost
             * 4, spec/plain read 0.86-0.95x on the context kinds in one run
             * with plain always first, 0.77-1.34x either way at load 7) */
            memset(&one, 0, sizeof one);
            if (r % 2 == 0)
                vp[r] = bench_spec_decode_once(m, ids, np, n, NULL, &kp, NULL, &err);
            vs[r] = bench_spec_decode_once(m, ids, np, n, &so, &ks, &one, &err);
            if (r % 2 == 1)
                vp[r] = bench_spec_decode_once(m, ids, np, n, NULL, &kp, NULL, &err);
            sst.accepted += one.accepted;
            sst.rounds += one.rounds;
            sst.drafted += one.drafted;
            sst.plain_steps += one.plain_steps;
            sst.skipped += one.skipped;
            sst.alone += one.alone;
            sst.plain_s += one.plain_s;
            sst.verify_s += one.verify_s;
            sst.draft_s += one.draft_s;
            sst.calib_s += one.calib_s;
            sst.history_drafted += one.history_drafted;
            sst.history_accepted += one.history_accepted;
            sst.calib_drafted += one.calib_drafted;
            sst.calib_accepted += one.calib_accepted;
            sst.reuse_drafted += one.reuse_drafted;
            sst.reuse_accepted += one.reuse_accepted;
            S.prefill_plain_s[tasks[ti].k] += kp.prefill_s;
            S.prefill_spec_s[tasks[ti].k] += ks.prefill_s;
            S.wall_plain_s[tasks[ti].k] += kp.wall_s;
            S.fwd_plain_s[tasks[ti].k] += kp.fwd_s;
            S.wall_spec_s[tasks[ti].k] += ks.wall_s;
            S.fwd_spec_s[tasks[ti].k] += ks.fwd_s;
            S.setup_spec_s[tasks[ti].k] += ks.setup_s;
            S.cpu_plain_s[tasks[ti].k] += kp.cpu_s;
            S.cpu_spec_s[tasks[ti].k] += ks.cpu_s;
            S.tok_plain[tasks[ti].k] += kp.n;
            S.tok_spec[tasks[ti].k] += ks.n;
            vlp[r] = lookup ? bench_spec_lookup_once(lookup, gguf, tasks[ti].prompt, n, 1) : 0;
            vl[r] = lookup ? bench_spec_lookup_once(lookup, gguf, tasks[ti].prompt, n, 0) : 0;
            if (kp.n != ks.n || memcmp(kp.t, ks.t, sizeof(int) * kp.n))
                mismatch++;
        }
        double mp = tools_median(vp, runs), ms = tools_median(vs, runs),
               ml = tools_median(vl, runs), mlp = tools_median(vlp, runs);
        int k = tasks[ti].k;
        if (history) {
            if (ti >= sizeof outs / sizeof outs[0] ||
                !(outs[ti] = malloc(sizeof(int) * ((size_t)kp.n + 1)))) {
                fprintf(stderr, "sluice bench spec: out of memory for the history\n");
                failed = 1;
                break;
            }
            memcpy(outs[ti], kp.t, sizeof(int) * kp.n);
            n_outs[ti] = kp.n;
        }
        double copy = bench_spec_copy_share(ids, np, kp.t, kp.n);
        S.copy[k] += copy;
        S.tasks[k]++;
        S.plain[k] += mp;
        S.spec[k] += ms;
        S.look[k] += ml;
        S.lplain[k] += mlp;
        /* the best run of each (highest tokens/s): the least disturbed by other load */
        S.best_plain[k] += bench_spec_stat(vp, runs, 2);
        S.best_spec[k] += bench_spec_stat(vs, runs, 2);
        S.best_look[k] += bench_spec_stat(vl, runs, 2);
        S.best_lplain[k] += bench_spec_stat(vlp, runs, 2);
        S.acc[k] += sst.accepted;
        S.rounds[k] += sst.rounds;
        S.drafted[k] += sst.drafted;
        S.steps[k] += sst.plain_steps;
        S.skipped[k] += sst.skipped;
        S.alone[k] += sst.alone;
        S.step_s[k] += sst.plain_s;
        S.verify_s[k] += sst.verify_s;
        S.draft_s[k] += sst.draft_s;
        S.calib_s[k] += sst.calib_s;
        const uint32_t sd[4] = {sst.drafted - sst.history_drafted - sst.calib_drafted -
                                    sst.reuse_drafted,
                                sst.history_drafted, sst.calib_drafted, sst.reuse_drafted};
        const uint32_t sa[4] = {sst.accepted - sst.history_accepted - sst.calib_accepted -
                                    sst.reuse_accepted,
                                sst.history_accepted, sst.calib_accepted, sst.reuse_accepted};
        for (int i = 0; i < 4; i++) {
            S.src_drafted[k][i] += sd[i];
            S.src_accepted[k][i] += sa[i];
        }
        double len = sst.rounds ? (double)(sst.accepted + sst.rounds) / sst.rounds : 0;
        double rate = sst.drafted ? (double)sst.accepted / sst.drafted : 0;
        if (!json)
            printf("%-8s %6u %9.1f %9.1f %9.1f %9.1f %8.2f %8.2f %6.0f%% %6.2f %4.0f%%\n",
                   tasks[ti].kind, np, mp, ms, mlp, ml, mp > 0 ? ms / mp : 0,
                   mlp > 0 ? ml / mlp : 0, 100 * rate, len, 100 * copy);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "kind", tasks[ti].kind);
        cJSON_AddNumberToObject(o, "prompt_tokens", np);
        cJSON_AddNumberToObject(o, "plain_tps_median", mp);
        cJSON_AddNumberToObject(o, "plain_tps_min", tools_min(vp, runs));
        cJSON_AddNumberToObject(o, "spec_tps_median", ms);
        cJSON_AddNumberToObject(o, "spec_tps_min", tools_min(vs, runs));
        if (lookup) {
            cJSON_AddNumberToObject(o, "lookup_tps_median", ml);
            cJSON_AddNumberToObject(o, "lookup_tps_min", tools_min(vl, runs));
            cJSON_AddNumberToObject(o, "llama_plain_tps_median", mlp);
            cJSON_AddNumberToObject(o, "llama_plain_tps_min", tools_min(vlp, runs));
        }
        cJSON_AddNumberToObject(o, "speedup", mp > 0 ? ms / mp : 0);
        cJSON_AddNumberToObject(o, "drafted", sst.drafted);
        cJSON_AddNumberToObject(o, "accepted", sst.accepted);
        cJSON_AddNumberToObject(o, "mean_acceptance_length", len);
        cJSON_AddNumberToObject(o, "copy_share", copy);
        cJSON_AddItemToArray(arr, o);
    }
    bench_spec_report(&S, &(struct bench_spec_report_opts){runs, row_cost, verify_fixed,
                                                           calibrate, lookup != NULL, json},
                      root);
    cJSON_AddNumberToObject(root, "tokens", n);
    cJSON_AddNumberToObject(root, "runs", runs);
    cJSON_AddNumberToObject(root, "rows", rows);
    cJSON_AddBoolToObject(root, "calibrate", calibrate != 0);
    cJSON_AddBoolToObject(root, "calibrate_prefill", calibrate == 2);
    cJSON_AddNumberToObject(root, "min_match", min_match ? min_match : 2);
    cJSON_AddNumberToObject(root, "row_cost", row_cost);
    cJSON_AddNumberToObject(root, "verify_fixed", verify_fixed);
    cJSON_AddBoolToObject(root, "history", history != BENCH_SPEC_HIST_NONE);
    cJSON_AddBoolToObject(root, "history_shared", history >= BENCH_SPEC_HIST_SHARED);
    cJSON_AddStringToObject(root, "history_store", bench_spec_hist_names[history]);
    cJSON_AddBoolToObject(root, "one_thread", one_thread);
    cJSON_AddBoolToObject(root, "greedy_identical", mismatch == 0);
    if (json) {
        char *s = cJSON_PrintUnformatted(root);
        if (s)
            printf("%s\n", s);
        free(s);
    } else {
        printf("greedy tokens %s\n", mismatch ? "DIFFER" : "identical in every run");
    }
done:
    cJSON_Delete(root);
    for (uint32_t i = 0; i < nt; i++)
        free(tasks[i].prompt);
    bench_spec_free_lines(lines, nl);
    free(ids);
    free(kp.t);
    free(ks.t);
    free(v);
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
        free(outs[i]);
    free(hist);
    infer_tokenizer_destroy(tk);
    infer_model_destroy(m);
    return mismatch || failed ? 1 : 0;
}
