/* sluice_mount.c: `sluice mount` (being written; see docs/ARCHITECTURE.md). */
#include <stdio.h>

#include "sluice.h"

int cmd_mount(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice mount: not available in this build yet\n");
    return 1;
}
