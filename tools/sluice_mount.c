/* sluice_mount.c: `sluice mount MODEL.sluice DIR [-f] [-o OPTIONS]`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs.h"
#include "sluice.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice mount MODEL.sluice DIR [-f] [-o OPTION[,OPTION...]]\n\n"
            "Serves a container read-only at DIR (FUSE): config.json, tokenizer.bin,\n"
            "manifest.json, stats.json, and a directory per slice (embed/, layer.NNN/, head/)\n"
            "holding slice.bin, one <role>.bin per tensor (byte-identical to the container),\n"
            "and for quantized tensors the computed views <role>.int8 and <role>.scales.\n"
            "Every served byte has passed its slice's checksum; a corrupt slice reads as EIO.\n"
            "Runs in the background once mounted (-f: stay in the foreground). Unmount with\n"
            "`sluice umount DIR`. Works for root and, through fusermount3, for other users.\n"
            "To measure cold reads through the mount, start it inside the read-limited\n"
            "cgroup (the daemon does the disk reads), e.g.\n"
            "  ../shared/tools/flashrun -m 800 -- sluice mount M DIR   (or sluice bench load).\n"
            "Options (-o, comma separated):\n"
            "  nonempty             mount over a non-empty directory\n"
            "  single               single-threaded request loop (default: multithreaded)\n"
            "  nosplice             copy through user space instead of splicing from the file\n"
            "  direct_io            bypass the page cache for slice files\n"
            "  no_keep_cache        drop cached pages when a file is opened\n"
            "  max_background=N     FUSE requests in flight (default 128)\n"
            "  max_readahead=BYTES  kernel readahead (default 1048576)\n"
            "  anything else is passed to libfuse (e.g. allow_other)\n");
}

int cmd_mount(int argc, char **argv)
{
    struct fs_options o = {0};
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    static char extra[1024];
    extra[0] = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-f")) {
            o.foreground = 1;
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            char *list = strdup(argv[++i]), *save = NULL;
            for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (!strcmp(t, "nonempty"))
                    o.allow_nonempty = 1;
                else if (!strcmp(t, "single"))
                    o.single_thread = 1;
                else if (!strcmp(t, "nosplice"))
                    o.no_splice = 1;
                else if (!strcmp(t, "direct_io"))
                    o.direct_io = 1;
                else if (!strcmp(t, "no_keep_cache"))
                    o.no_keep_cache = 1;
                else if (!strncmp(t, "max_background=", 15)) {
                    if (tools_parse_u32(t + 15, &o.max_background)) {
                        fprintf(stderr, "sluice mount: bad %s\n", t);
                        free(list);
                        return 2;
                    }
                } else if (!strncmp(t, "max_readahead=", 14)) {
                    if (tools_parse_u32(t + 14, &o.max_readahead)) {
                        fprintf(stderr, "sluice mount: bad %s\n", t);
                        free(list);
                        return 2;
                    }
                } else {
                    size_t l = strlen(extra);
                    snprintf(extra + l, sizeof extra - l, "%s%s", l ? "," : "", t);
                }
            }
            free(list);
        } else if (argv[i][0] == '-' || npos == 2) {
            usage(stderr);
            return 2;
        } else {
            pos[npos++] = argv[i];
        }
    }
    if (npos != 2) {
        usage(stderr);
        return 2;
    }
    o.container = pos[0];
    o.mountpoint = pos[1];
    o.fuse_opts = extra[0] ? extra : NULL;
    struct sl_err err = {{0}};
    if (fs_mount_run(&o, &err) < 0) {
        fprintf(stderr, "sluice mount: %s\n", err.msg);
        return 1;
    }
    return 0;
}
