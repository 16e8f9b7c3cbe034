/* sluice_inspect.c: `sluice inspect` (being written; see docs/ARCHITECTURE.md). */
#include <stdio.h>

#include "sluice.h"

int cmd_inspect(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice inspect: not available in this build yet\n");
    return 1;
}
