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
};

int cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: sluice bench KIND [ARGS...]\n\nkinds:\n");
        for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
            fprintf(f, "  %-10s %s\n", benches[i].name, benches[i].summary);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name))
            return benches[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "sluice bench: unknown benchmark '%s'\n", argv[1]);
    return 2;
}
