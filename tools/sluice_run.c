/* sluice_run.c: `sluice run` (being written; see docs/ARCHITECTURE.md). */
#include <stdio.h>

#include "sluice.h"

int cmd_run(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice run: not available in this build yet\n");
    return 1;
}
