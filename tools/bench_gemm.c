/* bench_gemm.c: `sluice bench gemm` (being written). */
#include <stdio.h>

#include "sluice.h"

int bench_gemm(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice bench gemm: not available in this build yet\n");
    return 1;
}
