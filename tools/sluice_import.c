/* sluice_import.c: `sluice import` (being written; see docs/ARCHITECTURE.md). */
#include <stdio.h>

#include "sluice.h"

int cmd_import(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice import: not available in this build yet\n");
    return 1;
}
