/* bench_coldstart.c: `sluice bench coldstart` (being written). */
#include <stdio.h>

#include "sluice.h"

int bench_coldstart(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice bench coldstart: not available in this build yet\n");
    return 1;
}
