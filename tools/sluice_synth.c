/* sluice_synth.c: `sluice synth --shape NAME -o MODEL.sluice [--seed S]`. */
#include <stdio.h>
#include <string.h>

#include "import.h"
#include "sluice.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: sluice synth --shape NAME -o MODEL.sluice [--seed S]\n"
               "       sluice synth --list\n\n"
               "Writes a deterministic model with random weights in the shape of a real\n"
               "architecture, stored as F16, with trained-model-like statistics (per-channel\n"
               "scale spread, heavy tails, a few massive-activation channels). The same shape\n"
               "and seed (default 1) give a byte-identical file. Memory stays bounded: tensors\n"
               "are generated and written one at a time (llama3-8b writes about 16 GB; the\n"
               "largest tensor, 1 GB, is the most held in memory). Rows are generated on all\n"
               "CPUs (at most 16; SLUICE_SYNTH_THREADS=N sets the count); the bytes do not\n"
               "depend on it. Progress goes to stderr.\n");
}

int cmd_synth(int argc, char **argv)
{
    const char *shape = NULL, *out = NULL;
    uint64_t seed = 1;
    int list = 0;
    struct tools_args args = {"sluice synth", usage, argc, argv, 0};
    for (args.i = 1; args.i < argc; args.i++) {
        const char *a = argv[args.i];
        int bad = 0;
        if (tools_args_help(&args)) {
            return 0;
        } else if (!strcmp(a, "--list")) {
            list = 1;
        } else if (!strcmp(a, "--shape")) {
            bad = tools_args_value(&args, &shape);
        } else if (!strcmp(a, "-o")) {
            bad = tools_args_value(&args, &out);
        } else if (!strcmp(a, "--seed")) {
            bad = tools_args_u64(&args, 0, UINT64_MAX, &seed);
        } else {
            bad = tools_args_unexpected(&args);
        }
        if (bad)
            return 2;
    }
    if (list) {
        size_t n;
        const struct import_synth_shape *s = import_synth_shapes(&n);
        for (size_t k = 0; k < n; k++)
            printf("%-16s %s\n", s[k].name, s[k].description);
        return 0;
    }
    if (!shape || !out) {
        fprintf(stderr, "sluice synth: needs --shape NAME and -o MODEL.sluice\n\n");
        usage(stderr);
        return 2;
    }
    struct tools_progress p;
    tools_progress_init(&p, "synth");
    struct sl_err err = {{0}};
    int ret = import_synth(shape, seed, out, tools_progress_cb, &p, &err);
    tools_progress_end(&p);
    if (ret < 0) {
        fprintf(stderr, "sluice synth: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "sluice synth: wrote %s (%s, seed %llu)\n", out, shape,
            (unsigned long long)seed);
    return 0;
}
