/* bench_spec_report.c: `sluice bench spec`'s summary by task kind: speed
 * against plain decoding, where the time went (verifications against one-row
 * steps), the priced speedup at a fixed verification price, llama-lookup
 * beside it; as text and into the JSON object. */
#include <cjson/cJSON.h>
#include <stdio.h>

#include "bench_spec.h"

void bench_spec_report(const struct bench_spec_sums *S, const struct bench_spec_report_opts *ro,
                       cJSON *root)
{
    uint32_t runs = ro->runs;
    double row_cost = ro->row_cost, verify_fixed = ro->verify_fixed;
    int calibrate = ro->calibrate, lookup = ro->lookup, json = ro->json;
    cJSON *sum = cJSON_AddObjectToObject(root, "by_kind");
    for (int k = 0; k < BENCH_SPEC_KINDS; k++) {
        double copy = S->tasks[k] ? S->copy[k] / S->tasks[k] : 0;
        double sp = S->plain[k] > 0 ? S->spec[k] / S->plain[k] : 0;
        double len = S->rounds[k] ? (double)(S->acc[k] + S->rounds[k]) / S->rounds[k] : 0;
        if (!json)
            printf("%-8s spec/plain %.2fx, mean acceptance length %.2f, accepted %u of %u "
                   "drafts; output %.0f%% copied: %s\n",
                   bench_spec_kinds[k], sp, len, S->acc[k], S->drafted[k], 100 * copy,
                   copy >= BENCH_SPEC_NEAR_VERBATIM ? "near-verbatim" : "not near-verbatim");
        /* where the time went: verifications against one-row steps */
        double v_ms = S->rounds[k] ? 1e3 * S->verify_s[k] / S->rounds[k] : 0;
        double s_ms = S->steps[k] ? 1e3 * S->step_s[k] / S->steps[k] : 0;
        double vrows = S->rounds[k] ? 1.0 + (double)S->drafted[k] / S->rounds[k] : 0;
        if (!json)
            printf("         %u verifications of %.1f rows, %.3f ms each (x%.2f of a one-row "
                   "step); %u one-row steps, %.3f ms each; drafting %.1f%% of the time\n"
                   "         one-row steps: %u without a draft, %u with one the cost model "
                   "skipped; %.2f tokens per forward; %u verifications on the calling "
                   "thread alone\n",
                   S->rounds[k], vrows, v_ms, s_ms > 0 ? v_ms / s_ms : 0, S->steps[k], s_ms,
                   100 * S->draft_s[k] / (S->draft_s[k] + S->verify_s[k] + S->step_s[k] + 1e-12),
                   S->steps[k] - S->skipped[k], S->skipped[k],
                   S->rounds[k] + S->steps[k] ? (double)(S->acc[k] + S->rounds[k] + S->steps[k]) /
                                                    (S->rounds[k] + S->steps[k])
                                              : 0.0,
                   S->alone[k]);
        /* which source drafted the rows and which were accepted */
        static const char *const src_name[4] = {"context", "history", "calib", "reuse"};
        if (!json) {
            printf("         drafts accepted/drafted by source:");
            for (int i = 0; i < 4; i++)
                printf(" %s %u/%u", src_name[i], S->src_accepted[k][i], S->src_drafted[k][i]);
            printf("\n");
        }
        /* the decode's time outside the forwards: speculation's own work
         * (drafting, acceptance, indexes, create/destroy) against plain
         * decoding's (sampling) */
        double nr = S->tasks[k] ? (double)S->tasks[k] * runs : 1;
        double out_s = S->wall_spec_s[k] - S->fwd_spec_s[k],
               out_p = S->wall_plain_s[k] - S->fwd_plain_s[k];
        if (!json)
            printf("         outside the forwards: spec %.2f ms a run (%.1f%% of its decode; "
                   "create/destroy %.2f ms), plain %.2f ms (%.1f%%)\n",
                   1e3 * out_s / nr,
                   S->wall_spec_s[k] > 0 ? 100 * out_s / S->wall_spec_s[k] : 0,
                   1e3 * S->setup_spec_s[k] / nr, 1e3 * out_p / nr,
                   S->wall_plain_s[k] > 0 ? 100 * out_p / S->wall_plain_s[k] : 0);
        /* tokens per CPU second (every thread's): the work ratio, which the
         * load moves less than the wall ratio above */
        double cpu_p = S->cpu_plain_s[k] > 0 ? S->tok_plain[k] / S->cpu_plain_s[k] : 0,
               cpu_sp = S->cpu_spec_s[k] > 0 ? S->tok_spec[k] / S->cpu_spec_s[k] : 0;
        if (!json)
            printf("         by CPU time: spec %.1f tokens/s, plain %.1f: spec/plain %.2fx\n",
                   cpu_sp, cpu_p, cpu_p > 0 ? cpu_sp / cpu_p : 0);
        /* at a fixed price the drafts do not depend on the load: plain
         * decoding's one-row steps (one a token) over speculation's, each
         * verification of n rows counted as 1 + B + A (n - 1) of them */
        uint32_t toks = S->acc[k] + S->rounds[k] + S->steps[k];
        double priced =
            S->steps[k] + S->rounds[k] * (1.0 + verify_fixed) + row_cost * S->drafted[k];
        double spent = S->draft_s[k] + S->verify_s[k] + S->step_s[k] + S->calib_s[k];
        if (!json && calibrate)
            printf("         calibration %.2f ms a run, %.1f%% of speculation's time\n",
                   S->tasks[k] ? 1e3 * S->calib_s[k] / (S->tasks[k] * runs) : 0,
                   spent > 0 ? 100 * S->calib_s[k] / spent : 0);
        double pre_p = S->tasks[k] ? S->prefill_plain_s[k] / (S->tasks[k] * runs) : 0,
               pre_s = S->tasks[k] ? S->prefill_spec_s[k] / (S->tasks[k] * runs) : 0;
        if (!json && calibrate)
            printf("         prefill %.2f ms a run, plain's %.2f ms (x%.2f: %s)\n", 1e3 * pre_s,
                   1e3 * pre_p, pre_p > 0 ? pre_s / pre_p : 0,
                   calibrate == 2 ? "every row's logits" : "the last row's");
        if (!json && row_cost > 0)
            printf("         priced at 1 + %.2f + %.2f (n - 1) one-row steps a verification: "
                   "%u tokens in %.1f steps, %.3fx plain\n",
                   verify_fixed, row_cost, toks, priced, priced > 0 ? toks / priced : 0);
        if (!json && lookup)
            printf("         llama-lookup/llama plain %.2fx; tokens/s spec/lookup %.2fx\n",
                   S->lplain[k] > 0 ? S->look[k] / S->lplain[k] : 0,
                   S->look[k] > 0 ? S->spec[k] / S->look[k] : 0);
        if (!json)
            printf("         best runs: spec/plain %.2fx%s",
                   S->best_plain[k] > 0 ? S->best_spec[k] / S->best_plain[k] : 0,
                   lookup ? "" : "\n");
        if (!json && lookup)
            printf(", llama-lookup/llama plain %.2fx, spec/lookup %.2fx\n",
                   S->best_lplain[k] > 0 ? S->best_look[k] / S->best_lplain[k] : 0,
                   S->best_look[k] > 0 ? S->best_spec[k] / S->best_look[k] : 0);
        cJSON *o = cJSON_AddObjectToObject(sum, bench_spec_kinds[k]);
        cJSON_AddNumberToObject(o, "copy_share", copy);
        cJSON_AddBoolToObject(o, "near_verbatim", copy >= BENCH_SPEC_NEAR_VERBATIM);
        cJSON_AddNumberToObject(o, "verifications", S->rounds[k]);
        cJSON_AddNumberToObject(o, "verify_rows_mean", vrows);
        cJSON_AddNumberToObject(o, "verify_ms_mean", v_ms);
        cJSON_AddNumberToObject(o, "one_row_steps", S->steps[k]);
        cJSON_AddNumberToObject(o, "one_row_steps_draft_skipped", S->skipped[k]);
        cJSON_AddNumberToObject(o, "verifications_alone", S->alone[k]);
        cJSON_AddNumberToObject(o, "step_ms_mean", s_ms);
        cJSON_AddNumberToObject(o, "calib_s", S->calib_s[k]);
        cJSON_AddNumberToObject(o, "prefill_plain_s", S->prefill_plain_s[k]);
        cJSON_AddNumberToObject(o, "prefill_spec_s", S->prefill_spec_s[k]);
        cJSON_AddNumberToObject(o, "decode_plain_s", S->wall_plain_s[k]);
        cJSON_AddNumberToObject(o, "forwards_plain_s", S->fwd_plain_s[k]);
        cJSON_AddNumberToObject(o, "decode_spec_s", S->wall_spec_s[k]);
        cJSON_AddNumberToObject(o, "forwards_spec_s", S->fwd_spec_s[k]);
        cJSON_AddNumberToObject(o, "spec_create_destroy_s", S->setup_spec_s[k]);
        cJSON_AddNumberToObject(o, "cpu_plain_s", S->cpu_plain_s[k]);
        cJSON_AddNumberToObject(o, "cpu_spec_s", S->cpu_spec_s[k]);
        cJSON_AddNumberToObject(o, "spec_over_plain_cpu", cpu_p > 0 ? cpu_sp / cpu_p : 0);
        cJSON_AddNumberToObject(o, "spec_over_plain", sp);
        cJSON_AddNumberToObject(o, "spec_over_plain_best_runs",
                                S->best_plain[k] > 0 ? S->best_spec[k] / S->best_plain[k] : 0);
        if (lookup) {
            cJSON_AddNumberToObject(o, "lookup_over_llama_plain_best_runs",
                                    S->best_lplain[k] > 0 ? S->best_look[k] / S->best_lplain[k]
                                                          : 0);
            cJSON_AddNumberToObject(o, "lookup_over_llama_plain",
                                    S->lplain[k] > 0 ? S->look[k] / S->lplain[k] : 0);
            cJSON_AddNumberToObject(o, "spec_over_lookup_tps",
                                    S->look[k] > 0 ? S->spec[k] / S->look[k] : 0);
        }
        cJSON_AddNumberToObject(o, "mean_acceptance_length", len);
        cJSON *bs = cJSON_AddObjectToObject(o, "drafts_by_source");
        for (int i = 0; bs && i < 4; i++) {
            cJSON *e = cJSON_AddObjectToObject(bs, src_name[i]);
            cJSON_AddNumberToObject(e, "drafted", S->src_drafted[k][i]);
            cJSON_AddNumberToObject(e, "accepted", S->src_accepted[k][i]);
        }
        if (row_cost > 0)
            cJSON_AddNumberToObject(o, "priced_over_plain", priced > 0 ? toks / priced : 0);
    }
}
