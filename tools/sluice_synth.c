/* sluice_synth.c: `sluice synth` (being written; see docs/ARCHITECTURE.md). */
#include <stdio.h>

#include "sluice.h"

int cmd_synth(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice synth: not available in this build yet\n");
    return 1;
}
