/* sluice_eval.c: `sluice eval` (being written; see docs/ARCHITECTURE.md). */
#include <stdio.h>

#include "sluice.h"

int cmd_eval(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice eval: not available in this build yet\n");
    return 1;
}
