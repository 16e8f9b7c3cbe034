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
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--list")) {
            size_t n;
            const struct import_synth_shape *s = import_synth_shapes(&n);
            for (size_t k = 0; k < n; k++)
                printf("%-16s %s\n", s[k].name, s[k].description);
            return 0;
        } else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            shape = argv[++i];
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            if (tools_parse_u64(argv[++i], &seed)) {
                fprintf(stderr, "sluice synth: bad --seed '%s'\n", argv[i]);
                return 2;
            }
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!shape || !out) {
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
