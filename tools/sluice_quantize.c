/* sluice_quantize.c: `sluice quantize` (being written; see docs/ARCHITECTURE.md). */
#include <stdio.h>

#include "sluice.h"

int cmd_quantize(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice quantize: not available in this build yet\n");
    return 1;
}
