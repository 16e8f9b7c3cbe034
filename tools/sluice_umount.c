/* sluice_umount.c: `sluice umount DIR [--lazy]`. */
#include <stdio.h>
#include <string.h>

#include "fs.h"
#include "sluice.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: sluice umount DIR [--lazy]\n\n"
               "Unmounts a `sluice mount` (umount2 as root, fusermount3 -u otherwise) and\n"
               "waits (up to 10 s) for every thread of its daemon to exit. Fails while files\n"
               "are open in it, unless --lazy. A dead mount (its daemon was killed) is\n"
               "cleaned up.\n"
               "  --lazy, -z  detach the mount at once: open files stay readable and the\n"
               "              daemon exits when the last one is closed\n");
}

int cmd_umount(int argc, char **argv)
{
    const char *dir = NULL;
    int lazy = 0;
    struct tools_args args = {"sluice umount", usage, argc, argv, 0};
    for (args.i = 1; args.i < argc; args.i++) {
        const char *a = argv[args.i];
        if (tools_args_help(&args)) {
            return 0;
        } else if (!strcmp(a, "--lazy") || !strcmp(a, "-z")) {
            lazy = 1;
        } else if (tools_args_operand(&args, &dir) < 0) {
            return 2;
        }
    }
    if (tools_args_need(&args, dir, "DIR") < 0)
        return 2;
    struct sl_err err = {{0}};
    if (fs_unmount(dir, lazy, &err) < 0) {
        fprintf(stderr, "sluice umount: %s\n", err.msg);
        return 1;
    }
    return 0;
}
