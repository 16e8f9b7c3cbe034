/* bench_load.c: `sluice bench load` (being written). */
#include <stdio.h>

#include "sluice.h"

int bench_load(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice bench load: not available in this build yet\n");
    return 1;
}
