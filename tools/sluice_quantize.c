/* sluice_quantize.c: `sluice quantize SRC -o OUT --bits B ...`: calibrate the
 * float model (the runtime with an observer), then quantize (the quantizer).
 * This file is where the two modules meet; neither links the other. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "import.h"
#include "infer.h"
#include "quantizer.h"
#include "sluice.h"
#include "tools_calib.h"
#include "tools_util.h"

#define TEXT_TOKENS 8192  /* default calibration tokens of a text */
#define RANDOM_TOKENS 512 /* ... and of random tokens (no --calib) */
#define SELECT_TOKENS 4096 /* tokens --budget auto scores on */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice quantize SRC -o MODEL.sluice --bits B [--method M] [--calib TEXT]\n"
            "         [--budget auto|tensor|global] [--alpha A] [--act static|dynamic] [options]\n\n"
            "Quantizes a float model. SRC is a float .sluice container or any model `sluice\n"
            "import` reads (llama2.c .bin needs --tokenizer); it is imported to a temporary\n"
            "container first ($TMPDIR or /tmp, removed afterwards).\n\n"
            "Calibration: the float model runs over the text of --calib, tokenized as one\n"
            "stream and cut into chunks of min(context, 512) tokens that each start with BOS,\n"
            "layer by layer (one layer's weights in memory), recording per linear layer the\n"
            "max |x| of every input channel, the max |y| of every output channel and a\n"
            "sample of input rows. Without --calib it runs on %d deterministic random\n"
            "tokens: fine for synthetic models (`sluice synth`), poor for real ones.\n\n"
            "  --bits B              average bits per weight, 1..8 (a float such as 4.5 for\n"
            "                        edgeflow and cmpq; an integer for uniform/smoothquant)\n"
            "  --method edgeflow     NPU-aware smoothing (alpha searched on [0,1] per group\n"
            "                        unless --alpha) + per-channel widths 1..8 from the\n"
            "                        relative-error metric and greedy allocation (default)\n"
            "  --method uniform      per-channel INT-B, no smoothing\n"
            "  --method smoothquant  SmoothQuant migration (alpha 0.5) + per-channel INT-B\n"
            "  --method cmpq         greedy RE allocation with channels weighted by their\n"
            "                        output activation magnitude S_O^2, no smoothing\n"
            "  --budget auto         (default) edgeflow/cmpq: quantize with both budgets\n"
            "                        below, score each against the float model on the\n"
            "                        first --select-tokens calibration tokens (mean KL, as\n"
            "                        `sluice eval --text CALIB --max-chunks K` does) and\n"
            "                        keep the lower; twice the quantizing time plus the\n"
            "                        scoring. Other methods' widths are uniform: tensor\n"
            "  --budget tensor       B per tensor, as in the paper\n"
            "  --budget global       B over all quantized weights of the model\n"
            "  --select-tokens N     tokens --budget auto scores on, at least 4 (default %d; whole\n"
            "                        chunks of min(context, 512) tokens)\n"
            "  --global-objective O  with --budget global: weight (every weight's RE counts\n"
            "                        alike, default) or tensor-mean (every tensor's mean RE)\n"
            "  --uniform-widths      edgeflow/cmpq without the allocation: every channel at B\n"
            "                        bits (ablation)\n"
            "  --alpha A             fixed smoothing exponent in [0, 1] instead of the search\n"
            "  --alpha-steps N       search grid {0, 1/N, ..., 1}, N in 1..1000 (default 10)\n"
            "  --alpha-search S      held-out (default): the search fits its scales on half\n"
            "                        of the calibration rows and measures the error on the\n"
            "                        other half; in-sample: on the rows that set the scales\n"
            "  --alpha-rule R        min (default): the alpha of least search error; 1se: the\n"
            "                        least alpha within one standard error of it\n"
            "  --act static          static per-tensor activation scales from calibration,\n"
            "                        max|x/s|/127 after smoothing (default)\n"
            "  --act dynamic         activation scale per matmul call (max|x|/127)\n"
            "  --clip mse|none       weight scale: the clipped max minimizing the channel's\n"
            "                        squared error (mse, default; also named default), or\n"
            "                        max|w| (none, the paper's); for every method alike\n"
            "  --metric proxy|exact  RE closed form (default) or exact cosine distance\n"
            "  --encoding E          packed layout: adaptive (default), int4int8, bitplane\n"
            "  --float               write the smoothed model unquantized (F32 weights)\n"
            "  --calib TEXT          calibration text (UTF-8)\n"
            "  --calib-tokens N      at most N calibration tokens, at least 2 (default %d of a\n"
            "                        text)\n"
            "  --sample-rows N       input rows kept per layer for the search, 0..65536\n"
            "                        (default 256)\n"
            "  --gptq                round the decoder linears' weights with GPTQ's error\n"
            "                        compensation (Hessian of the kept calibration rows; same\n"
            "                        grids and scales; O(cols^3) per tensor: small models)\n"
            "  --block-mult          with --gptq: each decoder linear's int8 values are its\n"
            "                        b-bit codes times a multiplier 1..4 per block of 32\n"
            "                        weights of a row (2 bits per block; at most 2 at 7\n"
            "                        bits, 1 at 8), the row's scale max|w| / (lim 4): block\n"
            "                        scales the NPU never sees, as it still gets per-channel\n"
            "                        int8 (a version 3 container; adaptive encoding only)\n"
            "  --shadow              shadow outlier execution (llm.npu 3.3; static activations):\n"
            "                        each decoder linear's activation scale covers the bulk\n"
            "                        of its calibration input (--shadow-quantile of |x|\n"
            "                        after smoothing); what it clips runs on the CPU with\n"
            "                        the same int8 weights. Stores the hot channels' weight\n"
            "                        columns and the calibration (a version 2 container)\n"
            "  --shadow-quantile Q   the bulk, in (0, 1) (default 0.99)\n"
            "  --shadow-cover C      hot channels: the fewest holding this share of the\n"
            "                        calibration outliers, in (0, 1] (default 0.8)\n"
            "  --shadow-importance I prune (keep the maximum-based scale, no shadow work) the\n"
            "                        linears whose max|x| / bulk is below I (default 0: none)\n"
            "  --shadow-hot-max H    at most this share of a linear's input channels are hot\n"
            "                        (stored), in [0, 1], 0: no limit (default 0.02)\n"
            "  --tokenizer FILE      llama2.c tokenizer for llama2.c / safetensors sources\n\n"
            "Norm weights stay float (with the smoothing folded in); linear layers and the\n"
            "embedding are packed. Shows progress on stderr, prints a summary (file size,\n"
            "bits per weight, channels per width per tensor role), writes atomically and\n"
            "records the settings as quant.* and calib.* metadata.\n",
            RANDOM_TOKENS, SELECT_TOKENS, TEXT_TOKENS);
}

/* After a usage error: the synopsis, not the whole page. */
static void usage_short(FILE *f)
{
    fprintf(f, "usage: sluice quantize SRC -o MODEL.sluice --bits B [options] (see --help)\n");
}

/* The source must be a float model: a quantized one would be calibrated on
 * its own quantization error and quantized twice. */
static int check_float(const char *path, struct sl_err *err)
{
    struct format_reader *r;
    int ret = format_reader_open(path, &r, err);
    if (ret < 0)
        return ret;
    for (uint32_t i = 0; ret == 0 && i < format_reader_n_tensors(r); i++) {
        const struct format_tensor_info *t = format_reader_tensor(r, i);
        if (format_encoding_traits(t->encoding)->quantized) {
            sl_err_set(err, "%s: tensor '%s' is already quantized (%s); quantize a float model",
                       path, t->name, format_encoding_traits(t->encoding)->name);
            ret = -EINVAL;
        }
    }
    format_reader_close(r);
    return ret;
}

/* --budget auto: what each budget scored, and which one was kept */
struct selection {
    int done;
    struct tools_kl_result res[2];
    uint32_t chunks, ctx;
    int kept;
};

static void summary(const char *out, const struct quantizer_opts *o,
                    const struct quantizer_report *rep, const struct selection *sel, double secs)
{
    printf("%s: %s, %g bits average (%s budget%s), %s activations, in %.1f s\n", out,
           quantizer_method_name(o->method), o->bits,
           o->budget == QUANTIZER_BUDGET_GLOBAL ? "global" : "per-tensor",
           o->budget_select ? ", chosen by --budget auto" : "", o->act_dynamic ? "dynamic" : "static", secs);
    double bpw = rep->weights ? (double)rep->code_bytes * 8.0 / (double)rep->weights : 0;
    printf("file %" PRIu64 " bytes (%.2f MB); %" PRIu64 " quantized weights in %" PRIu64
           " bytes: %.3f bits per weight (codes, widths, scales)\n",
           rep->file_bytes, (double)rep->file_bytes / 1e6, rep->weights, rep->code_bytes, bpw);
    if (rep->mult_bytes)
        printf("block multipliers: %" PRIu64 " bytes of them\n", rep->mult_bytes);
    if (rep->groups) {
        printf("smoothing: %u groups, mean alpha %.2f; groups per alpha:", rep->groups,
               rep->mean_alpha);
        for (int k = 0; k <= 10; k++)
            if (rep->alpha_hist[k])
                printf(" %.1f:%u", k / 10.0, rep->alpha_hist[k]);
        printf("\n");
    }
    if (sel && sel->done) {
        static const char *const names[] = {"per-tensor", "global"};
        for (int b = 0; b < 2; b++)
            printf("budget %-10s KL %.6f +- %.6f, top-1 %.2f%%, perplexity %.4f (float %.4f)%s\n",
                   names[b], sel->res[b].kl_mean, sel->res[b].kl_se, 100 * sel->res[b].top1,
                   sel->res[b].ppl, sel->res[b].ppl_ref, b == sel->kept ? "  <- kept" : "");
        printf("(scored on %llu calibration tokens: %u chunks of %u, the second half of each)\n",
               (unsigned long long)sel->res[0].tokens, sel->chunks, sel->ctx);
    }
    if (o->float_out)
        return;
    printf("channels per width   1       2       3       4       5       6       7       8"
           "     mean\n");
    for (int r = 0; r < FORMAT_ROLE_COUNT; r++) {
        uint64_t tot = 0, sum = 0;
        for (int b = 1; b <= 8; b++) {
            tot += rep->hist[r][b];
            sum += (uint64_t)b * rep->hist[r][b];
        }
        if (!tot)
            continue;
        printf("%-12s", format_role_name((enum format_role)r));
        for (int b = 1; b <= 8; b++)
            printf(" %7u", rep->hist[r][b]);
        printf("  %6.3f\n", (double)sum / (double)tot);
    }
}

static int allocates(const struct quantizer_opts *o)
{
    return (o->method == QUANTIZER_METHOD_EDGEFLOW || o->method == QUANTIZER_METHOD_CMPQ) &&
           !o->uniform_widths && !o->float_out;
}

static int quantize_one(const char *container, const struct quantizer_calib *calib,
                        struct quantizer_opts *o, const char *out, struct quantizer_report *rep,
                        struct sl_err *err)
{
    struct tools_progress prog;
    tools_progress_init(&prog, "quantize");
    o->progress_ctx = &prog;
    int ret = quantizer_quantize(container, calib, o, out, rep, err);
    tools_progress_end(&prog);
    return ret;
}

/* --budget auto: both budgets written next to `out` (hidden temporary
 * names), each scored against the float model on the calibration tokens;
 * the lower mean KL is renamed to `out` (ties: per-tensor, the paper's), the
 * other removed. Nothing is left behind on failure. */
static int quantize_auto(const char *container, const struct quantizer_calib *calib,
                         const int *ids, uint32_t n, uint32_t select_tokens,
                         struct quantizer_opts *o, const char *out, struct quantizer_report *rep,
                         struct selection *sel, struct sl_err *err)
{
    char cand[2][4096];
    const char *slash = strrchr(out, '/');
    int dir_len = slash ? (int)(slash - out + 1) : 0;
    for (int b = 0; b < 2; b++)
        if (snprintf(cand[b], sizeof cand[b], "%.*s.%s.budget-%s.%d", dir_len, out,
                     out + dir_len, b ? "global" : "tensor",
                     (int)getpid()) >= (int)sizeof cand[b]) {
            sl_err_set(err, "%s: path too long", out);
            return -ENAMETOOLONG;
        }
    struct tools_kl_ref *ref = NULL;
    struct quantizer_report reps[2];
    struct tools_progress prog;
    tools_progress_init(&prog, "score");
    int ret = tools_kl_ref_create(container, ids, n, select_tokens, &ref, &prog, err);
    tools_progress_end(&prog);
    if (ret == -EINVAL) { /* too little text to judge by: the paper's budget */
        fprintf(stderr, "sluice quantize: --budget auto: %s; using the per-tensor budget\n",
                err->msg);
        err->msg[0] = 0;
        o->budget = QUANTIZER_BUDGET_TENSOR;
        return quantize_one(container, calib, o, out, rep, err);
    }
    if (ret < 0)
        return ret;
    sel->chunks = tools_kl_ref_chunks(ref);
    sel->ctx = tools_kl_ref_ctx(ref);
    static char note[160];
    snprintf(note, sizeof note,
             "auto: the lower mean KL from the float model on %u calibration chunks of %u tokens",
             sel->chunks, sel->ctx);
    o->budget_select = note;
    for (int b = 0; b < 2 && ret == 0; b++) {
        o->budget = b ? QUANTIZER_BUDGET_GLOBAL : QUANTIZER_BUDGET_TENSOR;
        fprintf(stderr, "sluice quantize: --budget auto: the %s budget\n",
                b ? "global" : "per-tensor");
        ret = quantize_one(container, calib, o, cand[b], &reps[b], err);
        if (ret == 0) {
            tools_progress_init(&prog, "score");
            ret = tools_kl_score(cand[b], ref, &sel->res[b], &prog, err);
            tools_progress_end(&prog);
        }
    }
    tools_kl_ref_destroy(ref);
    int keep = sel->res[1].kl_mean < sel->res[0].kl_mean;
    if (ret == 0 && rename(cand[keep], out) < 0) {
        ret = -errno;
        sl_err_set(err, "%s: cannot rename %s to it: %s", out, cand[keep], strerror(errno));
    }
    if (ret == 0) { /* the rename's durability */
        char dir[4096];
        snprintf(dir, sizeof dir, "%.*s", dir_len ? dir_len : 1, dir_len ? out : ".");
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
        unlink(cand[!keep]);
        sel->done = 1;
        sel->kept = keep;
        o->budget = keep ? QUANTIZER_BUDGET_GLOBAL : QUANTIZER_BUDGET_TENSOR;
        *rep = reps[keep];
    } else {
        unlink(cand[0]);
        unlink(cand[1]);
    }
    return ret;
}

int cmd_quantize(int argc, char **argv)
{
    static const char *const budgets[] = {"tensor", "global", "auto"};
    static const char *const globals[] = {"weight", "tensor-mean"};
    static const char *const metrics[] = {"proxy", "exact"};
    static const char *const clips[] = {"default", "none", "mse"};
    static const char *const acts[] = {"static", "dynamic"};
    static const char *const searches[] = {"held-out", "in-sample"};
    static const char *const rules[] = {"min", "1se"};
    const char *src = NULL, *out = NULL, *calib_path = NULL, *tokenizer = NULL;
    struct quantizer_opts o = {
        .method = QUANTIZER_METHOD_EDGEFLOW, .alpha = -1, .encoding = FORMAT_ENC_ADAPTIVE,
        .shadow_quantile = 0.99, .shadow_cover = 0.8, .shadow_hot_max = 0.02};
    uint32_t calib_tokens = 0, sample_rows = 256, select_tokens = SELECT_TOKENS;
    int budget = 2; /* auto */
    static const char *const encodings[] = {"adaptive", "int4int8", "bitplane"};
    static const enum format_encoding encoding_ids[] = {
        FORMAT_ENC_ADAPTIVE, FORMAT_ENC_INT4INT8, FORMAT_ENC_BITPLANE};
    const char *method;
    struct tools_args args = {"sluice quantize", usage_short, argc, argv, 0};
    for (args.i = 1; args.i < argc; args.i++) {
        const char *a = argv[args.i];
        int bad = 0, v = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--float")) {
            o.float_out = 1;
        } else if (!strcmp(a, "--uniform-widths")) {
            o.uniform_widths = 1;
        } else if (!strcmp(a, "-o")) {
            bad = tools_args_value(&args, &out);
        } else if (!strcmp(a, "--bits")) {
            bad = tools_args_double(&args, 1, 8, 0, &o.bits);
        } else if (!strcmp(a, "--method")) {
            bad = tools_args_value(&args, &method);
            if (!bad && quantizer_method_parse(method, &o.method) < 0) {
                fprintf(stderr, "sluice quantize: --method wants edgeflow, uniform, smoothquant "
                                "or cmpq, not '%s'\n", method);
                bad = 1;
            }
        } else if (!strcmp(a, "--calib")) {
            bad = tools_args_value(&args, &calib_path);
        } else if (!strcmp(a, "--calib-tokens")) {
            bad = tools_args_u32(&args, 2, UINT32_MAX, &calib_tokens);
        } else if (!strcmp(a, "--sample-rows")) {
            bad = tools_args_u32(&args, 0, 65536, &sample_rows);
        } else if (!strcmp(a, "--tokenizer")) {
            bad = tools_args_value(&args, &tokenizer);
        } else if (!strcmp(a, "--budget")) {
            bad = tools_args_choice(&args, budgets, 3, &budget);
        } else if (!strcmp(a, "--select-tokens")) {
            bad = tools_args_u32(&args, 4, UINT32_MAX, &select_tokens);
        } else if (!strcmp(a, "--global-objective")) {
            bad = tools_args_choice(&args, globals, 2, &v);
            o.global = (enum quantizer_global)v;
        } else if (!strcmp(a, "--metric")) {
            bad = tools_args_choice(&args, metrics, 2, &v);
            o.metric = (enum quantizer_metric)v;
        } else if (!strcmp(a, "--clip")) {
            bad = tools_args_choice(&args, clips, 3, &v);
            o.clip = (enum quantizer_clip)v;
        } else if (!strcmp(a, "--gptq")) {
            o.gptq = 1;
        } else if (!strcmp(a, "--block-mult")) {
            o.block_mult = 1;
        } else if (!strcmp(a, "--shadow")) {
            o.shadow = 1;
        } else if (!strcmp(a, "--shadow-quantile")) {
            bad = tools_args_double(&args, 0, 1, TOOLS_ARGS_ABOVE_MIN | TOOLS_ARGS_BELOW_MAX,
                                    &o.shadow_quantile);
        } else if (!strcmp(a, "--shadow-cover")) {
            bad = tools_args_double(&args, 0, 1, TOOLS_ARGS_ABOVE_MIN, &o.shadow_cover);
        } else if (!strcmp(a, "--shadow-hot-max")) {
            bad = tools_args_double(&args, 0, 1, 0, &o.shadow_hot_max);
        } else if (!strcmp(a, "--shadow-importance")) {
            bad = tools_args_double(&args, 0, INFINITY, 0, &o.shadow_min_importance);
        } else if (!strcmp(a, "--alpha")) {
            bad = tools_args_double(&args, 0, 1, 0, &o.alpha);
        } else if (!strcmp(a, "--alpha-steps")) {
            bad = tools_args_u32(&args, 1, 1000, &o.alpha_steps);
        } else if (!strcmp(a, "--alpha-search")) {
            bad = tools_args_choice(&args, searches, 2, &o.search_in_sample);
        } else if (!strcmp(a, "--alpha-rule")) {
            bad = tools_args_choice(&args, rules, 2, &o.alpha_one_se);
        } else if (!strcmp(a, "--act")) {
            bad = tools_args_choice(&args, acts, 2, &o.act_dynamic);
        } else if (!strcmp(a, "--encoding")) {
            bad = tools_args_choice(&args, encodings, 3, &v);
            o.encoding = encoding_ids[v];
        } else {
            bad = tools_args_operand(&args, &src);
        }
        if (bad)
            return 2;
    }
    if (!src || !out || o.bits == 0) {
        fprintf(stderr, "sluice quantize: needs SRC, -o MODEL.sluice and --bits B (see --help)\n");
        return 2;
    }
    if (!calib_tokens)
        calib_tokens = calib_path ? TEXT_TOKENS : RANDOM_TOKENS;
    { /* before minutes of calibration: the output's folder must take files */
        char dir[4096];
        const char *slash = strrchr(out, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - out) + 1 : 1, slash ? out : ".");
        if (access(dir, W_OK | X_OK) < 0) {
            fprintf(stderr, "sluice quantize: %s: cannot write into %s: %s\n", out, dir,
                    strerror(errno));
            return 1;
        }
    }
    struct sl_err err = {{0}};
    char tmp[4096] = "";
    const char *container = src;
    int status = 1;
    struct quantizer_calib *calib = NULL;
    int *ids = NULL; /* the calibration tokens, for --budget auto */
    enum import_source kind;
    if (import_source_detect(src, &kind, &err) < 0)
        goto fail;
    if (kind != IMPORT_SRC_SLUICE) {
        const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(tmp, sizeof tmp, "%s/sluice-quantize-%d.sluice", dir, (int)getpid());
        struct import_opts io = {.tokenizer = tokenizer, .dtype = -1};
        fprintf(stderr, "sluice quantize: importing %s\n", src);
        if (import_model(src, &io, tmp, &err) < 0)
            goto fail;
        container = tmp;
    }
    if (check_float(container, &err) < 0) /* before calibrating, not after */
        goto fail;
    struct tools_progress prog;
    tools_progress_init(&prog, "calibrate");
    uint64_t t0 = sl_now_ns();
    uint32_t used = 0, chunks = 0, n_ids = 0;
    int choose = budget == 2 && allocates(&o);
    int ret = tools_calibrate(container, calib_path, calib_tokens, sample_rows, &calib, &used,
                              &chunks, choose ? &ids : NULL, &n_ids, &prog, &err);
    tools_progress_end(&prog);
    if (ret < 0)
        goto fail;
    fprintf(stderr, "sluice quantize: calibrated on %u tokens (%u chunks) of %s in %.1f s\n", used,
            chunks, calib_path ? calib_path : "random tokens", (double)(sl_now_ns() - t0) / 1e9);
    char source[512];
    snprintf(source, sizeof source, "%s", calib_path ? calib_path : "random tokens");
    o.calib_source = source;
    o.progress = tools_progress_cb;
    o.progress_ctx = &prog;
    struct quantizer_report rep;
    struct selection sel = {0};
    o.budget = budget == 1 ? QUANTIZER_BUDGET_GLOBAL : QUANTIZER_BUDGET_TENSOR;
    t0 = sl_now_ns();
    if (choose)
        ret = quantize_auto(container, calib, ids, n_ids, select_tokens, &o, out, &rep, &sel,
                            &err);
    else
        ret = quantize_one(container, calib, &o, out, &rep, &err);
    if (ret < 0)
        goto fail;
    summary(out, &o, &rep, &sel, (double)(sl_now_ns() - t0) / 1e9);
    status = 0;
fail:
    if (status)
        fprintf(stderr, "sluice quantize: %s\n", err.msg);
    quantizer_calib_destroy(calib);
    free(ids);
    if (tmp[0])
        unlink(tmp);
    return status;
}
