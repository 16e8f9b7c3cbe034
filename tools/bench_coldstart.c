/* bench_coldstart.c: `sluice bench coldstart MODEL`: cold time to first
 * token, side by side in one run, of the full pipeline, its ablations and the
 * in-project baselines, each a fresh `sluice run` process started after the
 * page cache is dropped inside a read-limited blkio cgroup (the method of
 * ../shared/tools/flashrun), contenders interleaved run by run; reported as a
 * ratio to the physical bound max(raw read of the same bytes, ops / GEMM
 * peak), both measured in the same run; the raw read once per round, next to
 * the contenders' runs, and each run's ratio taken against its own round's
 * (tools_bound.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format.h"
#include "infer.h"
#include "npu.h"
#include "sluice.h"
#include "tools_child.h"
#include "tools_cold.h"
#include "tools_bound.h"
#include "tools_stats.h"
#include "tools_tiny.h"
#include "tools_transcode.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench coldstart MODEL.sluice [--prompt-tokens N] [--flash-mbps N]\n"
            "                              [--runs K] [--chunk C] [--trace-dir DIR]\n"
            "                              [--contenders NAME[,NAME...]] [--json]\n\n"
            "Cold time to first token (from the child's execve, so the exec and the dynamic\n"
            "loader count, to the first token; page cache dropped;\n"
            "reads limited to N MB/s, default 800, in a blkio cgroup) of a quantized model with\n"
            "an N-token prompt (default 128), side by side, K runs each (default 3):\n"
            "  full                      EdgeFlow: adaptive packing, granular pipeline\n"
            "                            (sluice run's default --resident)\n"
            "  full_int8, full_packed    the same with --resident int8, packed\n"
            "  llmnpu                    adaptive, llm.npu's out-of-order scheduler\n"
            "  adaptive_layer_overlap    ablation: adaptive packing, coarse layer overlap\n"
            "  int4int8_layer_overlap    ablation: the same widths stored INT4/INT8 padded\n"
            "  layer_overlap_int8        baseline: INT8 container, layer overlap (llm.npu's way)\n"
            "  sequential_read           baseline: INT8, read everything, then compute (MNN's)\n"
            "  sequential_mmap           baseline: INT8, mmap with MAP_POPULATE, then compute\n"
            "                            (llama.cpp's way)\n"
            "  sequential_mmap_granular  a stronger one: the same load, then the full\n"
            "                            pipeline's scheduler (not llama.cpp's)\n"
            "The sequential baselines convert every tensor, then compute in graph order, as\n"
            "a model load does (coarse tasks, first come first served).\n"
            "The INT8 and INT4/INT8 containers hold the same codes and scales as MODEL (same\n"
            "logits, different storage); they are written next to MODEL once and reused.\n"
            "All use the same kernels and threads (the emulated NPU + sluice run's default\n"
            "CPU workers, one per core the process may run on, at most 8).\n"
            "Reports min and median TTFT, a breakdown (start: from the execve to the\n"
            "pipeline's start (exec, dynamic loader, model header, tokenizer); load: from\n"
            "there until the last slice needed arrived; tail: from there to the first\n"
            "token; x raw: (start + load) / its round's raw read (below), scaled to the\n"
            "run's bytes (no raw read that round: at the median whole-file rate), how far\n"
            "the reading is from the raw read of the same bytes; unpack, NPU and CPU busy time; prefalt: idle CPU time spent faulting\n"
            "weight memory in ahead (full only; not in the busy times); stall: no task\n"
            "running or ready anywhere, everything waiting on the disk), peak RSS, bytes\n"
            "read, the NPU/CPU\n"
            "bubble rates (idle share of the time outside stalls: waiting on the other\n"
            "unit while the pipeline had work; medians over the runs; JSON\n"
            "idle_npu/idle_cpu: idle share of the whole TTFT, median run), and the ratio\n"
            "to the bound.\n"
            "The bound of a round is max(raw read, prefill ops / int8 peak of the\n"
            "machine's cores: the fastest int8 kernel's register-only loop, AMX TDPBSSD\n"
            "where the CPU has it, else vpdpbusd or the AVX2 step, times the cores).\n"
            "The raw read: after each round's contender runs, in its own fresh cgroup\n"
            "with the same limit and a dropped page cache, one O_DIRECT read of MODEL\n"
            "from offset 0, 16 MiB requests one at a time, timed from its first request\n"
            "to the end of as many bytes as that round's full run read (rounded up to\n"
            "4 KiB; then on to the file's end for the old rate). So the bound is what\n"
            "reading the same number of bytes takes at that minute, never less; it does\n"
            "not count the process start that the TTFT counts (exec, dynamic loader,\n"
            "index). x bound / x bd min: the median / min over the rounds of a run's\n"
            "TTFT over its own round's bound (a slow minute of the device moves both);\n"
            "bound in the header: the median of the rounds' bounds. x old: the\n"
            "median TTFT over the old bound, full's bytes / the median whole-file raw\n"
            "MB/s (reported beside it; JSON ratio_to_rate_bound, bound_rate_s), and the\n"
            "bytes' time at the limit itself, for comparison (a fresh cgroup's raw read\n"
            "can run ahead of the limit; JSON bytes_at_limit_s).\n"
            "JSON (since the fourteenth session; ratio_to_bound was the median TTFT over\n"
            "the rate bound before it): ratio_to_bound / ratio_to_bound_min /\n"
            "ratio_to_bound_rounds per contender (the per-round median / min / rounds\n"
            "counted), raw_read_s (each round's raw read; 0: it failed), bound_io_s /\n"
            "bound_io_min_s / bound_io_max_s (median / min / max of those),\n"
            "bound_io_measured (false: no raw read worked, every ratio 0), bound_bytes\n"
            "(the bytes of the last round's raw read). The required and tiny ratios are\n"
            "per round in the same way.\n"
            "The prefill ops count every row of every layer; the required bound counts\n"
            "only what the first token needs (the last layer's keys and values of every\n"
            "row, its queries, attention, O and FFN of the last row: what the pipeline\n"
            "computes there when that layer's linears have static activation scales);\n"
            "JSON: bound_required_s, prefill_gops_required, ratio_to_required_bound.\n"
            "The tiny bounds count the GEMM operations on weight blocks whose codes are\n"
            "all within +-16 (most of a 5-bit model's), which the AVX2 kernel runs with a\n"
            "faster step (four maddubs added in int16 per madd), at that step's own peak\n"
            "(a register-only loop of it, measured in the same run; the model's linears\n"
            "are unpacked once before the runs to count them), and the rest at the\n"
            "int8 peak; the same as the bounds above on kernels without such a step\n"
            "(table: x tiny, the median over the tiny bound).\n"
            "JSON: gemm_peak_tiny_gops, prefill_gops_tiny, prefill_gops_tiny_required,\n"
            "bound_tiny_s, bound_tiny_required_s, ratio_to_tiny_bound,\n"
            "ratio_to_tiny_required_bound.\n"
            "--chunk C: prefill chunk rows, as `sluice run --chunk` (default 256, at most\n"
            "65536). --runs: 1..32. --trace-dir DIR: a Chrome trace of every run, written\n"
            "to DIR/CONTENDER.runN.json. --contenders: only these (and full, whose bytes\n"
            "the bound counts), e.g. full_int8,full_packed; default: all. The INT8 and\n"
            "INT4/INT8 containers are written only for contenders that read them; without\n"
            "the INT8 one the memory yardstick is not reported (0).\n"
            "The table goes to standard output (to standard error with --json).\n"
            "Needs root (page cache, cgroups).\n");
}

struct contender {
    const char *name;
    int model;               /* 0: MODEL, 1: INT8, 2: INT4/INT8 */
    const char *policy, *load;
    const char *resident;    /* sluice run --resident; NULL: its default */
};

static const struct contender contenders[] = {
    {"full", 0, "full", "stream", NULL},
    {"full_int8", 0, "full", "stream", "int8"},
    {"full_packed", 0, "full", "stream", "packed"},
    {"llmnpu", 0, "llmnpu", "stream", NULL},
    {"adaptive_layer_overlap", 0, "layer_overlap", "stream", NULL},
    {"int4int8_layer_overlap", 2, "layer_overlap", "stream", NULL},
    {"layer_overlap_int8", 1, "layer_overlap", "stream", NULL},
    {"sequential_read", 1, "sequential", "read", NULL},
    {"sequential_mmap", 1, "sequential", "mmap", NULL},
    {"sequential_mmap_granular", 1, "sequential_granular", "mmap", NULL},
};
#define NC (sizeof contenders / sizeof contenders[0])

struct sample {
    uint32_t round;
    double ttft, start, tail, load, unpack, prefault, npu, cpu, stall, bubble_npu, bubble_cpu, idle_npu,
        idle_cpu, rss, bytes;
};

/* One cold run of `sluice run` in the cgroup; 0 and *s on success, else a
 * negative errno (the run counts as FAILED). */
static int run_once(const char *model, const struct contender *ct, uint32_t tokens,
                    uint32_t chunk, const struct tools_cgroup *cg, const char *trace,
                    struct sample *s)
{
    char nt[16], ch[16];
    snprintf(nt, sizeof nt, "%u", tokens);
    snprintf(ch, sizeof ch, "%u", chunk);
    const char *argv[24];
    int a = 0;
    argv[a++] = "sluice";
    argv[a++] = "run";
    argv[a++] = model;
    argv[a++] = "--prompt-tokens";
    argv[a++] = nt;
    argv[a++] = "-n";
    argv[a++] = "1";
    argv[a++] = "--json";
    argv[a++] = "--policy";
    argv[a++] = ct->policy;
    argv[a++] = "--load";
    argv[a++] = ct->load;
    argv[a++] = "--chunk";
    argv[a++] = ch;
    if (trace) {
        argv[a++] = "--trace";
        argv[a++] = trace;
    }
    if (ct->resident) {
        argv[a++] = "--resident";
        argv[a++] = ct->resident;
    }
    argv[a] = NULL;
    struct tools_child_opts o = {.path = "/proc/self/exe", .argv = argv, .cg = cg,
                                 .drop_caches = 1, .capture = 1, .null_stderr = 1};
    struct tools_child_result res;
    struct sl_err err;
    int ret = tools_child_run(&o, &res, &err);
    if (ret < 0)
        return ret;
    if (res.exit_code != 0) {
        tools_child_result_fini(&res);
        return -ECHILD;
    }
    cJSON *j = cJSON_Parse(res.out);
    double rss = res.peak_rss_mb;
    tools_child_result_fini(&res);
    if (!j)
        return -EPROTO;
    cJSON *pj = cJSON_GetObjectItem(j, "pipeline");
#define NUM(o, k) (cJSON_GetObjectItem(o, k) ? cJSON_GetObjectItem(o, k)->valuedouble : 0)
    s->ttft = NUM(j, "ttft_s");
    s->rss = rss;
    s->load = NUM(pj, "load_s");
    /* the pipeline's own span runs from its start to the first token */
    double span = NUM(pj, "prefill_s");
    s->start = span > 0 && s->ttft > span ? s->ttft - span : 0;
    s->tail = span > s->load ? span - s->load : 0;
    s->unpack = NUM(pj, "unpack_s");
    s->prefault = NUM(pj, "prefault_s");
    s->npu = NUM(pj, "npu_busy_s");
    s->cpu = NUM(pj, "cpu_busy_s");
    s->bubble_npu = NUM(pj, "bubble_npu");
    s->bubble_cpu = NUM(pj, "bubble_cpu");
    s->stall = NUM(pj, "stall_s");
    s->idle_npu = NUM(pj, "idle_npu");
    s->idle_cpu = NUM(pj, "idle_cpu");
    s->bytes = NUM(pj, "bytes_read");
#undef NUM
    cJSON_Delete(j);
    return s->ttft > 0 ? 0 : -EPROTO;
}

struct raw_arg {
    const char *model;
    uint64_t bytes;
};

/* The child of raw_once: the raw read (tools_raw_read), its result written to
 * standard output. */
static int raw_child(void *arg)
{
    const struct raw_arg *ra = arg;
    struct tools_raw_read rr;
    int ret = tools_raw_read(ra->model, ra->bytes, &rr);
    if (ret < 0) {
        fprintf(stderr, "sluice bench coldstart: the raw read of %s: %s\n", ra->model,
                strerror(-ret));
        return 1;
    }
    return write(STDOUT_FILENO, &rr, sizeof rr) == (ssize_t)sizeof rr ? 0 : 1;
}

/* One raw read of `bytes` of the model (0: the whole file) as the cgroup
 * allows it, page cache dropped; 0 and *rr, or -1 when it could not be
 * measured. */
static int raw_once(const char *model, uint64_t bytes, const struct tools_cgroup *cg,
                    struct tools_raw_read *rr)
{
    struct raw_arg ra = {model, bytes};
    struct tools_child_opts o = {.fn = raw_child, .arg = &ra, .cg = cg,
                                 .drop_caches = 1, .capture = 1};
    struct tools_child_result res;
    struct sl_err err;
    if (tools_child_run(&o, &res, &err) < 0) {
        fprintf(stderr, "sluice bench coldstart: the raw read: %s\n", err.msg);
        return -1;
    }
    int ok = res.exit_code == 0 && res.out_len == sizeof *rr;
    if (ok)
        memcpy(rr, res.out, sizeof *rr);
    tools_child_result_fini(&res);
    return ok && rr->bytes_s > 0 && rr->file_s > 0 ? 0 : -1;
}

/* Transcoded variant of `model` next to it (reused while newer than it). */
static int variant(const char *model, const char *tag, uint32_t enc, char *out, size_t n)
{
    snprintf(out, n, "%s.%s.sluice", model, tag);
    struct stat a, b;
    if (stat(model, &a) == 0 && stat(out, &b) == 0 && b.st_mtime >= a.st_mtime)
        return 0;
    struct sl_err err;
    fprintf(stderr, "bench coldstart: writing the %s variant %s\n", tag, out);
    if (tools_transcode(model, out, enc, &err) < 0) {
        fprintf(stderr, "sluice bench coldstart: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* 2 x multiply-adds of the first token's prefill: every layer's linears for
 * every prompt row, attention scores and weighted values, the classifier for
 * the last row. */
static double prefill_ops(const struct format_config *c, uint32_t n)
{
    double D = c->dim, Q = (double)c->n_heads * c->head_dim, KV = (double)c->n_kv_heads * c->head_dim;
    double F = c->hidden_dim;
    double per_token = 2.0 * (D * Q * 2 + D * KV * 2 + 3 * D * F);
    double attn = 2.0 * 2.0 * Q * ((double)n * (n + 1) / 2.0);
    return c->n_layers * (per_token * n + attn) + 2.0 * D * c->vocab_size;
}

/* The part of prefill_ops the first token's logits require: the last layer
 * needs every row's keys and values (the cache) but its queries, attention,
 * O and FFN for the last row only (what the pipeline computes where it trims
 * that layer: infer.h, no_trim_last). */
static double required_ops(const struct format_config *c, uint32_t n)
{
    double D = c->dim, Q = (double)c->n_heads * c->head_dim, F = c->hidden_dim;
    if (c->n_layers == 0 || n == 0)
        return prefill_ops(c, n);
    double rest = 2.0 * (D * Q * 2 + 3 * D * F); /* per row: Q, O, FFN (K/V: every row) */
    double attn = 2.0 * 2.0 * Q * ((double)n * (n + 1) / 2.0); /* every row's */
    double attn_last = 2.0 * 2.0 * Q * n;                        /* the last row's */
    return prefill_ops(c, n) - rest * (n - 1) - (attn - attn_last);
}

int bench_coldstart(int argc, char **argv)
{
    const char *model = NULL, *trace_dir = NULL, *only = NULL;
    uint32_t tokens = 128, mbps = 800, runs = 3, chunk = 256;
    int json = 0;
    struct tools_args args = {"sluice bench coldstart", usage, argc, argv, 0};
    for (args.i = 1; args.i < argc; args.i++) {
        const char *a = argv[args.i];
        int bad = 0;
        if (tools_args_help(&args)) {
            return 0;
        } else if (!strcmp(a, "--prompt-tokens")) {
            bad = tools_args_u32(&args, 1, UINT32_MAX, &tokens);
        } else if (!strcmp(a, "--flash-mbps")) {
            bad = tools_args_u32(&args, 0, UINT32_MAX, &mbps);
        } else if (!strcmp(a, "--runs")) {
            bad = tools_args_u32(&args, 1, 32, &runs);
        } else if (!strcmp(a, "--chunk")) {
            bad = tools_args_u32(&args, 1, 65536, &chunk);
        } else if (!strcmp(a, "--trace-dir")) {
            bad = tools_args_value(&args, &trace_dir);
        } else if (!strcmp(a, "--contenders")) {
            bad = tools_args_value(&args, &only);
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else {
            bad = tools_args_operand(&args, &model);
        }
        if (bad)
            return 2;
    }
    if (tools_args_need(&args, model, "MODEL.sluice") < 0)
        return 2;
    int want[NC];
    for (size_t k = 0; k < NC; k++)
        want[k] = only == NULL || k == 0; /* full: the bound counts its bytes */
    for (const char *c = only; c && *c;) {
        size_t len = strcspn(c, ","), k;
        for (k = 0; k < NC; k++)
            if (strlen(contenders[k].name) == len && !strncmp(c, contenders[k].name, len))
                break;
        if (k == NC) {
            fprintf(stderr, "sluice bench coldstart: --contenders: no contender '%.*s'\n",
                    (int)len, c);
            return 2;
        }
        want[k] = 1;
        c += len + (c[len] == ',');
    }
    char why[256];
    if (!tools_cold_available(why, sizeof why)) {
        fprintf(stderr, "sluice bench coldstart: %s\n", why);
        return 1;
    }
    struct sl_err err = {{0}};
    struct format_reader *r;
    if (format_reader_open(model, &r, &err) < 0) {
        fprintf(stderr, "sluice bench coldstart: %s\n", err.msg);
        return 1;
    }
    struct format_config cfg = *format_reader_config(r);
    format_reader_close(r);
    /* the INT8 and INT4/INT8 containers only where a contender reads them
     * (an 8B model's INT8 copy is 8 GB) */
    int need[3] = {1, 0, 0};
    for (size_t k = 0; k < NC; k++)
        need[contenders[k].model] |= want[k];
    char paths[3][PATH_MAX];
    snprintf(paths[0], sizeof paths[0], "%s", model);
    if ((need[1] && variant(model, "int8", FORMAT_ENC_Q8_CHANNEL, paths[1], sizeof paths[1]) < 0) ||
        (need[2] &&
         variant(model, "int4int8", FORMAT_ENC_INT4INT8, paths[2], sizeof paths[2]) < 0))
        return 1;
    /* the memory target's yardstick: the INT8 weights (codes, scales, norms) and
     * the KV cache (float K and V of every layer) of the prompt; the runtime
     * reserves the cache for the whole context, but pages it never touches
     * are not resident. Without the INT8 container: not reported (0). */
    double int8_bytes = 0;
    if (need[1] && format_reader_open(paths[1], &r, &err) < 0) {
        fprintf(stderr, "sluice bench coldstart: %s\n", err.msg);
        return 1;
    }
    for (uint32_t i = 0; need[1] && i < format_reader_n_tensors(r); i++)
        int8_bytes += (double)format_reader_tensor(r, i)->length;
    if (need[1])
        format_reader_close(r);
    double kv_row = 2.0 * cfg.n_layers * ((double)cfg.dim * cfg.n_kv_heads / cfg.n_heads) * 4;
    double kv_prompt = kv_row * (tokens + 1), kv_context = kv_row * cfg.seq_len;
    double mem_base_mb = int8_bytes > 0 ? (int8_bytes + kv_prompt) / (1024.0 * 1024.0) : 0;
    /* every cold run gets a fresh cgroup, as ../shared/tools/flashrun does:
     * a group's throttle carries state from one run to the next (measured: a
     * shared group let later contenders read above the raw rate) */
    struct tools_cgroup cg;
    if (tools_cgroup_create(model, (uint64_t)mbps * 1000000, &cg, &err) < 0) {
        fprintf(stderr, "sluice bench coldstart: %s\n", err.msg);
        return 1;
    }
    tools_cgroup_destroy(&cg);
    /* the machine's int8 peak: every core's rate of its fastest kernel's
     * instruction (AMX TDPBSSD, vpdpbusd or the AVX2 step) */
    enum npu_kernel peak_kern;
    double peak1 = npu_gemm_peak_best(0.3, &peak_kern);
    long cores = sl_cpu_count(); /* the cores the runs may use (taskset, cpusets) */
    double peak = peak1 * (double)(cores > 0 ? cores : 1);
    /* the tiny step's peak and operations (AVX2 only: the kernel the
     * pipeline runs where VNNI is missing) */
    const enum npu_kernel kern = npu_kernel_best();
    double peak_tiny = npu_gemm_peak_tiny_gops(kern, 0.3) * (double)(cores > 0 ? cores : 1);
    double ops_tiny = 0, ops_tiny_req = 0;
    if (peak_tiny > 0 &&
        tools_tiny_ops(model, kern, tokens, &ops_tiny, &ops_tiny_req, &err) < 0) {
        fprintf(stderr, "sluice bench coldstart: %s\n", err.msg);
        return 1;
    }
    static struct sample samples[NC][32];
    static double tt[NC][32]; /* TTFT by round; 0: failed */
    uint32_t nok[NC] = {0};
    /* by round: the raw read of full's bytes (s), the whole file's MB/s */
    double raw_rd[32] = {0}, raw_rb[32] = {0}, raws[32];
    uint32_t nraw = 0;
    uint64_t raw_bytes = 0;
    for (uint32_t run = 0; run < runs; run++) {
        for (size_t k = 0; k < NC; k++) {
            if (!want[k])
                continue;
            char trace[PATH_MAX];
            if (trace_dir)
                snprintf(trace, sizeof trace, "%s/%s.run%u.json", trace_dir, contenders[k].name,
                         run + 1);
            struct sample s;
            int ok = tools_cgroup_create(model, (uint64_t)mbps * 1000000, &cg, &err) == 0;
            if (ok) {
                ok = run_once(paths[contenders[k].model], &contenders[k], tokens, chunk, &cg,
                              trace_dir ? trace : NULL, &s) == 0;
                tools_cgroup_destroy(&cg);
            }
            if (ok) {
                s.round = run;
                samples[k][nok[k]++] = s;
                tt[k][run] = s.ttft;
            }
            fprintf(stderr, "run %u %-24s %s\n", run + 1, contenders[k].name, ok ? "" : "FAILED");
        }
        /* the round's raw read, right after its runs: as many bytes as full
         * read (this round's run, else the last one that worked) */
        if (nok[0])
            raw_bytes = (uint64_t)samples[0][nok[0] - 1].bytes;
        struct tools_raw_read rr;
        /* no full run yet: the whole file (its rate at least) */
        int ok = tools_cgroup_create(model, (uint64_t)mbps * 1000000, &cg, &err) == 0;
        if (!ok)
            fprintf(stderr, "sluice bench coldstart: the raw read's cgroup: %s\n", err.msg);
        if (ok) {
            ok = raw_once(model, raw_bytes, &cg, &rr) == 0;
            tools_cgroup_destroy(&cg);
        }
        if (ok) {
            raw_rd[run] = rr.bytes_s;
            raw_rb[run] = (double)rr.bytes;
            raws[nraw++] = (double)rr.file / rr.file_s / 1e6;
        }
        fprintf(stderr, "run %u %-24s %s\n", run + 1, "raw read", ok ? "" : "FAILED");
    }
    struct tools_stats raw_st;
    if (tools_stats_compute(raws, nraw, &raw_st) < 0) {
        fprintf(stderr, "sluice bench coldstart: out of memory\n");
        return 1;
    }
    double raw = raw_st.median;
    /* the bound counts what the first token needs: the full pipeline's bytes,
     * read raw in every round next to the runs */
    double bytes_full = (double)raw_bytes;
    double ops = prefill_ops(&cfg, tokens);
    double bound_compute = peak > 0 ? ops / (peak * 1e9) : 0;
    double round_bound[32] = {0}, rd[32];
    uint32_t nrd = 0;
    for (uint32_t run = 0; run < runs; run++) {
        round_bound[run] = tools_bound_round(raw_rd[run], bound_compute);
        if (raw_rd[run] > 0)
            rd[nrd++] = raw_rd[run];
    }
    struct tools_stats rd_st;
    if (tools_stats_compute(rd, nrd, &rd_st) < 0) {
        fprintf(stderr, "sluice bench coldstart: out of memory\n");
        return 1;
    }
    double bound_io = rd_st.median;
    double bound = bound_io > 0 ? tools_bound_round(bound_io, bound_compute) : 0;
    if (!nrd)
        fprintf(stderr, "sluice bench coldstart: no raw read could be measured: the bound and "
                        "every ratio to it are 0 (not measured; JSON bound_io_measured false)\n");
    /* the old rule: full's bytes over the median whole-file rate */
    double bound_rate_io = raw > 0 ? bytes_full / (raw * 1e6) : 0;
    double bound_rate = bound_rate_io > bound_compute ? bound_rate_io : bound_compute;
    /* for comparison only: the bytes at the limit itself (a fresh group's
     * raw read can beat it: measured 0.715 s for 649 MB at 800 MB/s) */
    double bound_limit_io = mbps > 0 ? bytes_full / ((double)mbps * 1e6) : 0;
    /* the same bound over the ops the first token requires (a lower one) */
    double ops_req = required_ops(&cfg, tokens);
    double bound_req_compute = peak > 0 ? ops_req / (peak * 1e9) : 0;
    double bound_req = bound_io > bound_req_compute ? bound_io : bound_req_compute;
    /* the same two with the tiny blocks' operations at the tiny step's peak */
    double tiny_s = peak_tiny > 0 ? ops_tiny / (peak_tiny * 1e9) : 0;
    double tiny_req_s = peak_tiny > 0 ? ops_tiny_req / (peak_tiny * 1e9) : 0;
    double bound_tiny_compute = peak > 0 ? (ops - ops_tiny) / (peak * 1e9) + tiny_s : 0;
    double bound_tiny_req_compute = peak > 0 ? (ops_req - ops_tiny_req) / (peak * 1e9) + tiny_req_s : 0;
    double bound_tiny = bound_io > bound_tiny_compute ? bound_io : bound_tiny_compute;
    double bound_tiny_req = bound_io > bound_tiny_req_compute ? bound_io : bound_tiny_req_compute;
    /* their ratios per round too, against each round's own raw read */
    double round_req[32] = {0}, round_tiny[32] = {0}, round_tiny_req[32] = {0};
    for (uint32_t run = 0; run < runs; run++) {
        round_req[run] = tools_bound_round(raw_rd[run], bound_req_compute);
        round_tiny[run] = tools_bound_round(raw_rd[run], bound_tiny_compute);
        round_tiny_req[run] = tools_bound_round(raw_rd[run], bound_tiny_req_compute);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddNumberToObject(o, "prompt_tokens", tokens);
    cJSON_AddNumberToObject(o, "flash_mbps_limit", mbps);
    cJSON_AddNumberToObject(o, "runs", runs);
    cJSON_AddNumberToObject(o, "raw_mbps", raw);
    cJSON_AddNumberToObject(o, "gemm_peak_gops", peak);
    cJSON_AddNumberToObject(o, "gemm_peak_gops_one_core", peak1);
    cJSON_AddStringToObject(o, "gemm_peak_kernel", npu_kernel_name(peak_kern));
    cJSON_AddNumberToObject(o, "prefill_gops", ops / 1e9);
    cJSON_AddNumberToObject(o, "bound_s", bound);
    cJSON_AddBoolToObject(o, "bound_io_measured", nrd > 0);
    cJSON_AddNumberToObject(o, "bound_io_s", bound_io);
    cJSON_AddNumberToObject(o, "bound_io_min_s", rd_st.min);
    cJSON_AddNumberToObject(o, "bound_io_max_s", rd_st.max);
    cJSON_AddNumberToObject(o, "bound_bytes", bytes_full);
    cJSON_AddNumberToObject(o, "bound_rate_s", bound_rate);
    cJSON_AddNumberToObject(o, "bytes_at_limit_s", bound_limit_io);
    cJSON *rj = cJSON_AddArrayToObject(o, "raw_read_s");
    for (uint32_t run = 0; run < runs; run++)
        cJSON_AddItemToArray(rj, cJSON_CreateNumber(raw_rd[run]));
    cJSON_AddNumberToObject(o, "bound_compute_s", bound_compute);
    cJSON_AddNumberToObject(o, "prefill_gops_required", ops_req / 1e9);
    cJSON_AddNumberToObject(o, "bound_required_s", bound_req);
    cJSON_AddNumberToObject(o, "gemm_peak_tiny_gops", peak_tiny);
    cJSON_AddNumberToObject(o, "prefill_gops_tiny", ops_tiny / 1e9);
    cJSON_AddNumberToObject(o, "prefill_gops_tiny_required", ops_tiny_req / 1e9);
    cJSON_AddNumberToObject(o, "bound_tiny_s", bound_tiny);
    cJSON_AddNumberToObject(o, "bound_tiny_required_s", bound_tiny_req);
    cJSON_AddNumberToObject(o, "int8_weights_mb", int8_bytes / (1024.0 * 1024.0));
    cJSON_AddNumberToObject(o, "kv_cache_prompt_mb", kv_prompt / (1024.0 * 1024.0));
    cJSON_AddNumberToObject(o, "kv_cache_context_mb", kv_context / (1024.0 * 1024.0));
    cJSON *arr = cJSON_AddArrayToObject(o, "results");
    FILE *tf = json ? stderr : stdout; /* the table; with --json, beside the JSON */
    fprintf(tf, "%s: %u-token prompt, %u MB/s limit, %u runs; raw %.0f MB/s, int8 peak %.0f GOPS "
               "(%s, %ld cores)\nbound %.3f s = max(raw read of %.0f MB next to each round: median "
               "%.3f s (min %.3f, max %.3f, %u rounds), %.1f GOPs / peak = %.3f s)"
               "\nold bound %.3f s = max(%.0f MB / median whole-file raw MB/s = %.3f s, compute); "
               "the same MB at the %u MB/s limit: %.3f s (not a bound)"
               "\nrequired bound %.3f s (%.1f GOPs: the last layer's Q, O, FFN, attention of "
               "the last row only)"
               "\ntiny bound %.3f s, required %.3f s (%.1f / %.1f GOPs of tiny blocks at the tiny "
               "step's peak %.0f GOPS)"
               "\nmemory yardstick %.0f MiB = INT8 weights %.0f MiB + KV cache of the prompt %.1f "
               "MiB (RSS/yardstick in the last column)"
               "\n\n%-24s %8s %8s %7s %8s %6s %7s %6s %7s %6s %6s %7s %7s %7s %7s %7s %7s %7s %8s %8s %6s\n",
               model, tokens, mbps, runs, raw, peak, npu_kernel_name(peak_kern), cores, bound,
               bytes_full / 1e6, bound_io, rd_st.min, rd_st.max, nrd, ops / 1e9, bound_compute,
               bound_rate, bytes_full / 1e6, bound_rate_io, mbps, bound_limit_io, bound_req, ops_req / 1e9, bound_tiny, bound_tiny_req,
               ops_tiny / 1e9, ops_tiny_req / 1e9, peak_tiny, mem_base_mb, int8_bytes / 1048576.0,
               kv_prompt / 1048576.0, "policy", "ttft min", "ttft med", "x bound", "x bd min", "x old", "x tiny", "start", "load", "tail", "x raw",
               "unpack", "prefalt", "npu", "cpu", "stall", "bub npu", "bub cpu", "MB read",
               "RSS MiB", "x mem");
    for (size_t k = 0; k < NC; k++) {
        if (!want[k])
            continue;
        uint32_t n = nok[k];
        double t[32], bn[32], bc[32];
        for (uint32_t i = 0; i < n; i++) {
            t[i] = samples[k][i].ttft;
            bn[i] = samples[k][i].bubble_npu;
            bc[i] = samples[k][i].bubble_cpu;
        }
        struct tools_stats ts, bns, bcs, xs, xreq, xtiny, xtreq;
        if (tools_stats_compute(t, n, &ts) < 0 || tools_stats_compute(bn, n, &bns) < 0 ||
            tools_stats_compute(bc, n, &bcs) < 0 ||
            tools_bound_ratios(tt[k], round_bound, runs, &xs) < 0 ||
            tools_bound_ratios(tt[k], round_req, runs, &xreq) < 0 ||
            tools_bound_ratios(tt[k], round_tiny, runs, &xtiny) < 0 ||
            tools_bound_ratios(tt[k], round_tiny_req, runs, &xtreq) < 0) {
            fprintf(stderr, "sluice bench coldstart: out of memory\n");
            cJSON_Delete(o);
            return 1;
        }
        double mn = ts.min, md = ts.median;
        /* the breakdown of the median run */
        struct sample m = {0};
        for (uint32_t i = 0; i < n; i++)
            if (samples[k][i].ttft == md)
                m = samples[k][i];
        double rss = 0;
        for (uint32_t i = 0; i < n; i++)
            rss = samples[k][i].rss > rss ? samples[k][i].rss : rss;
        /* bubble rates: the median of each over the runs (one run's can swing
         * with the page-fault noise of its unpacking) */
        if (n) {
            m.bubble_npu = bns.median;
            m.bubble_cpu = bcs.median;
        }
        double idle = md > m.npu ? md - m.npu : 0;
        /* the median run's exec-to-last-slice time over the raw read of its
         * bytes: its round's (scaled to its bytes), else at the median rate */
        double raw_s = raw > 0 ? m.bytes / (raw * 1e6) : 0;
        if (n && raw_rd[m.round] > 0 && raw_rb[m.round] > 0)
            raw_s = raw_rd[m.round] * m.bytes / raw_rb[m.round];
        double x_raw = raw_s > 0 && m.load > 0 ? (m.start + m.load) / raw_s : 0;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "policy", contenders[k].name);
        cJSON_AddStringToObject(e, "container", paths[contenders[k].model]);
        cJSON_AddNumberToObject(e, "runs_ok", n);
        cJSON_AddNumberToObject(e, "ttft_s_min", mn);
        cJSON_AddNumberToObject(e, "ttft_s_median", md);
        cJSON_AddNumberToObject(e, "ratio_to_bound", xs.median);
        cJSON_AddNumberToObject(e, "ratio_to_bound_min", xs.min);
        cJSON_AddNumberToObject(e, "ratio_to_bound_rounds", (double)xs.n);
        cJSON_AddNumberToObject(e, "ratio_to_rate_bound", bound_rate > 0 ? md / bound_rate : 0);
        cJSON_AddNumberToObject(e, "read_over_raw", x_raw);
        cJSON_AddNumberToObject(e, "ratio_to_required_bound", xreq.median);
        cJSON_AddNumberToObject(e, "ratio_to_tiny_bound", xtiny.median);
        cJSON_AddNumberToObject(e, "ratio_to_tiny_required_bound", xtreq.median);
        cJSON_AddNumberToObject(e, "bytes_read", m.bytes);
        cJSON_AddNumberToObject(e, "peak_rss_mb", rss);
        cJSON_AddNumberToObject(e, "rss_over_int8_kv", mem_base_mb > 0 ? rss / mem_base_mb : 0);
        cJSON_AddNumberToObject(e, "bubble_npu", m.bubble_npu);
        cJSON_AddNumberToObject(e, "bubble_cpu", m.bubble_cpu);
        cJSON_AddNumberToObject(e, "idle_npu", m.idle_npu);
        cJSON_AddNumberToObject(e, "idle_cpu", m.idle_cpu);
        cJSON *b = cJSON_AddObjectToObject(e, "breakdown_s");
        cJSON_AddNumberToObject(b, "start", m.start);
        cJSON_AddNumberToObject(b, "load", m.load);
        cJSON_AddNumberToObject(b, "tail", m.tail);
        cJSON_AddNumberToObject(b, "unpack", m.unpack);
        cJSON_AddNumberToObject(b, "prefault", m.prefault);
        cJSON_AddNumberToObject(b, "npu", m.npu);
        cJSON_AddNumberToObject(b, "cpu", m.cpu);
        cJSON_AddNumberToObject(b, "npu_idle", idle);
        cJSON_AddNumberToObject(b, "stall", m.stall);
        cJSON_AddItemToArray(arr, e);
        fprintf(tf,
                "%-24s %8.3f %8.3f %7.3f %8.3f %6.3f %7.2f %6.3f %7.3f %6.3f %6.3f %7.3f %7.3f %7.3f %7.3f %7.3f "
                "%7.2f %7.2f %8.1f %8.0f %6.2f\n",
                contenders[k].name, mn, md, xs.median, xs.min, bound_rate > 0 ? md / bound_rate : 0,
                xtiny.median, m.start, m.load, m.tail, x_raw, m.unpack,
                m.prefault, m.npu, m.cpu, m.stall, m.bubble_npu, m.bubble_cpu, m.bytes / 1e6, rss,
                mem_base_mb > 0 ? rss / mem_base_mb : 0);
    }
    if (json) {
        char *s = cJSON_Print(o);
        printf("%s\n", s);
        free(s);
    }
    cJSON_Delete(o);
    return 0;
}
