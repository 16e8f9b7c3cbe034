/* sluice_umount.c: `sluice umount` (being written; see docs/ARCHITECTURE.md). */
#include <stdio.h>

#include "sluice.h"

int cmd_umount(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sluice umount: not available in this build yet\n");
    return 1;
}
