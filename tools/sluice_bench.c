/* sluice_bench.c: `sluice bench KIND ...` dispatches to tools/bench_<kind>.c. */
#include <stdio.h>
#include <string.h>

#include "sluice.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} benches[] = {
    {"unpack", bench_unpack, "weight unpack kernels and baseline encodings (GB/s, cycles/weight)"},
    {"load", bench_load, "cold streaming throughput: io_uring, mount, read, mmap, pread pool"},
    {"gemm", bench_gemm, "int8 GEMM throughput on prefill shapes against measured peak"},
    {"coldstart", bench_coldstart, "cold time to first token, pipeline policies side by side"},
    {"serve", bench_serve, "sluice serve vs llama-server: TTFT p50/p99, tokens/s at 1/4/16 clients"},
    {"spec", bench_spec, "speculative decoding against plain decoding and llama-lookup"},
    {"decode", bench_decode, "decode tokens/s, int8 vs packed resident (and llama-bench)"},
    {"attn", bench_attn, "attention alone: dense float against sparse with NPU estimation"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: sluice bench KIND [ARGS...]\n\nkinds:\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(f, "  %-10s %s\n", benches[i].name, benches[i].summary);
    fprintf(f, "\n'sluice bench KIND --help' describes each.\n");
}

int cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "sluice bench: no KIND given\n\n");
        usage(stderr);
        return 2;
    }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name))
            return benches[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "sluice bench: %s '%s'\n\n",
            argv[1][0] == '-' ? "unknown option" : "unknown benchmark", argv[1]);
    usage(stderr);
    return 2;
}
