/* sluice_quantize.c: `sluice quantize SRC -o OUT --bits B ...`: calibrate the
 * float model (the runtime with an observer), then quantize (the quantizer).
 * This file is where the two modules meet; neither links the other. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "infer.h"
#include "quantizer.h"
#include "sluice.h"
#include "tools_calib.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice quantize SRC -o MODEL.sluice --bits B [--method M] [--calib TEXT]\n"
            "                       [--budget tensor|global] [--alpha A] [--act static|dynamic]\n"
            "                       [--encoding adaptive|int4int8|bitplane] [--calib-tokens N]\n"
            "                       [--tokenizer FILE]\n\n"
            "Quantizes a float model: SRC is a float .sluice container or any model `sluice\n"
            "import` reads (llama2.c needs --tokenizer). The float model is run over the\n"
            "calibration text (one token stream cut into chunks of at most the context length,\n"
            "each starting with BOS; at most --calib-tokens tokens, default 4096) to record\n"
            "activation statistics; without --calib it runs on deterministic random tokens\n"
            "(fine for synthetic models, poor for real ones). Then:\n"
            "  --method edgeflow     NPU-aware smoothing (alpha by grid search on [0,1] unless\n"
            "                        --alpha) + per-channel widths 1..8 from the relative-error\n"
            "                        metric and greedy allocation (default)\n"
            "  --method uniform      per-channel INT-B, no smoothing\n"
            "  --method smoothquant  SmoothQuant migration (alpha 0.5) + per-channel INT-B\n"
            "  --method cmpq         widths allocated by RE weighted with output-channel\n"
            "                        activation magnitude, no smoothing\n"
            "  --bits B              average bits per weight (integer for uniform/smoothquant)\n"
            "  --budget              tensor: B per tensor (the paper); global: B over the whole\n"
            "                        model (default: tensor, measured better: docs/BENCHMARKS.md)\n"
            "  --act                 static per-tensor activation scales from calibration\n"
            "                        (default) or dynamic per matmul\n"
            "  --encoding            packed layout of the weights (default adaptive)\n"
            "Norm weights stay float. Prints progress and a summary; writes atomically.\n");
}

int cmd_quantize(int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *calib_path = NULL, *tokenizer = NULL;
    struct quantizer_opts o = {.method = QUANTIZER_METHOD_EDGEFLOW, .bits = 0,
                               .budget = QUANTIZER_BUDGET_TENSOR, .alpha = -1,
                               .encoding = FORMAT_ENC_ADAPTIVE};
    uint32_t calib_tokens = 4096;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-o") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(a, "--bits") && i + 1 < argc) {
            bad = tools_parse_double(argv[++i], &o.bits) || o.bits < 1 || o.bits > 8;
        } else if (!strcmp(a, "--method") && i + 1 < argc) {
            bad = quantizer_method_parse(argv[++i], &o.method) < 0;
        } else if (!strcmp(a, "--calib") && i + 1 < argc) {
            calib_path = argv[++i];
        } else if (!strcmp(a, "--calib-tokens") && i + 1 < argc) {
            bad = tools_parse_u32(argv[++i], &calib_tokens) || calib_tokens < 2;
        } else if (!strcmp(a, "--tokenizer") && i + 1 < argc) {
            tokenizer = argv[++i];
        } else if (!strcmp(a, "--budget") && i + 1 < argc) {
            i++;
            o.budget = !strcmp(argv[i], "tensor") ? QUANTIZER_BUDGET_TENSOR
                                                  : QUANTIZER_BUDGET_GLOBAL;
            bad = strcmp(argv[i], "tensor") && strcmp(argv[i], "global");
        } else if (!strcmp(a, "--alpha") && i + 1 < argc) {
            bad = tools_parse_double(argv[++i], &o.alpha) || o.alpha < 0 || o.alpha > 1;
        } else if (!strcmp(a, "--act") && i + 1 < argc) {
            i++;
            o.act_dynamic = !strcmp(argv[i], "dynamic");
            bad = strcmp(argv[i], "static") && strcmp(argv[i], "dynamic");
        } else if (!strcmp(a, "--encoding") && i + 1 < argc) {
            i++;
            o.encoding = !strcmp(argv[i], "adaptive")   ? FORMAT_ENC_ADAPTIVE
                         : !strcmp(argv[i], "int4int8") ? FORMAT_ENC_INT4INT8
                         : !strcmp(argv[i], "bitplane") ? FORMAT_ENC_BITPLANE
                                                        : 0;
            bad = o.encoding == 0;
        } else if (a[0] == '-' || src) {
            usage(stderr);
            return 2;
        } else {
            src = a;
        }
        if (bad) {
            fprintf(stderr, "sluice quantize: bad value for %s: '%s'\n", a, argv[i]);
            return 2;
        }
    }
    if (!src || !out || o.bits == 0) {
        usage(stderr);
        return 2;
    }
    struct sl_err err = {{0}};
    char tmp[4096] = "";
    const char *container = src;
    int status = 1;
    struct quantizer_calib *calib = NULL;
    enum quantizer_source kind;
    if (quantizer_source_detect(src, &kind, &err) < 0)
        goto fail;
    if (kind != QUANTIZER_SRC_SLUICE) {
        const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(tmp, sizeof tmp, "%s/sluice-quantize-%d.sluice", dir, (int)getpid());
        struct quantizer_import_opts io = {.tokenizer = tokenizer, .dtype = -1};
        fprintf(stderr, "sluice quantize: importing %s\n", src);
        if (quantizer_import(src, &io, tmp, &err) < 0)
            goto fail;
        container = tmp;
    }
    struct tools_progress prog;
    tools_progress_init(&prog, "calibrate");
    uint64_t t0 = sl_now_ns();
    uint32_t used = 0;
    if (tools_calibrate(container, calib_path, calib_tokens, &calib, &used, &prog, &err) < 0) {
        tools_progress_end(&prog);
        goto fail;
    }
    tools_progress_end(&prog);
    fprintf(stderr, "sluice quantize: calibrated on %u tokens of %s in %.1f s\n", used,
            calib_path ? calib_path : "random tokens", (double)(sl_now_ns() - t0) / 1e9);
    tools_progress_init(&prog, "quantize");
    o.progress = tools_progress_cb;
    o.progress_ctx = &prog;
    struct quantizer_report rep;
    t0 = sl_now_ns();
    if (quantizer_quantize(container, calib, &o, out, &rep, &err) < 0) {
        tools_progress_end(&prog);
        goto fail;
    }
    tools_progress_end(&prog);
    double bpw = rep.weights ? rep.code_bytes * 8.0 / rep.weights : 0;
    printf("%s: %s, %g bits average (%s budget), %s activations, in %.1f s\n", out,
           quantizer_method_name(o.method), o.bits,
           o.budget == QUANTIZER_BUDGET_GLOBAL ? "global" : "per-tensor",
           o.act_dynamic ? "dynamic" : "static", (double)(sl_now_ns() - t0) / 1e9);
    printf("file %llu bytes; %llu quantized weights at %.3f bits per weight (codes, widths, "
           "scales)\n",
           (unsigned long long)rep.file_bytes, (unsigned long long)rep.weights, bpw);
    if (o.method == QUANTIZER_METHOD_EDGEFLOW)
        printf("smoothing: mean alpha %.2f\n", rep.mean_alpha);
    printf("channels per width     1       2       3       4       5       6       7       8   "
           "mean\n");
    for (int r = 0; r < FORMAT_ROLE_COUNT; r++) {
        uint64_t tot = 0, sum = 0;
        for (int b = 1; b <= 8; b++) {
            tot += rep.hist[r][b];
            sum += (uint64_t)b * rep.hist[r][b];
        }
        if (!tot)
            continue;
        printf("%-18s", format_role_name((enum format_role)r));
        for (int b = 1; b <= 8; b++)
            printf(" %7u", rep.hist[r][b]);
        printf(" %6.2f\n", (double)sum / tot);
    }
    status = 0;
fail:
    if (status)
        fprintf(stderr, "sluice quantize: %s\n", err.msg);
    quantizer_calib_destroy(calib);
    if (tmp[0])
        unlink(tmp);
    return status;
}
