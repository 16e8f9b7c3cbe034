/* bench_unpack.c: `sluice bench unpack` (being written). */
#include <stdio.h>

#include "sluice.h"

int bench_unpack(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice bench unpack: not available in this build yet\n");
    return 1;
}
