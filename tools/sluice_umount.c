/* sluice_umount.c: `sluice umount DIR [--lazy]`. */
#include <stdio.h>
#include <string.h>

#include "fs.h"
#include "sluice.h"

int cmd_umount(int argc, char **argv)
{
    const char *dir = NULL;
    int lazy = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: sluice umount DIR [--lazy]\n\n"
                   "Unmounts a `sluice mount` (umount2 as root, fusermount3 -u otherwise) and\n"
                   "waits (up to 10 s) for its daemon to exit. Fails while files are open in it,\n"
                   "unless --lazy (-z): the mount is detached at once, open files stay readable\n"
                   "and the daemon exits when the last one is closed. A dead mount (its daemon\n"
                   "was killed) is cleaned up.\n");
            return 0;
        } else if (!strcmp(argv[i], "--lazy") || !strcmp(argv[i], "-z")) {
            lazy = 1;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "usage: sluice umount DIR [--lazy]\n");
            return 2;
        } else {
            dir = argv[i];
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: sluice umount DIR [--lazy]\n");
        return 2;
    }
    struct sl_err err = {{0}};
    if (fs_unmount(dir, lazy, &err) < 0) {
        fprintf(stderr, "sluice umount: %s\n", err.msg);
        return 1;
    }
    return 0;
}
