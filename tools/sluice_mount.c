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
            "usage: sluice mount MODEL.sluice DIR [-f] [-o OPTION[,OPTION...]]\n"
            "\n"
            "Serves a container read-only at DIR (FUSE): config.json, tokenizer.bin (llama2.c\n"
            "format), manifest.json, stats.json, and one directory per slice (embed/,\n"
            "layer.NNN/, head/) holding slice.bin and one <role>.bin per tensor, byte-identical\n"
            "to the container, plus for quantized tensors the computed views <role>.int8 (rows x\n"
            "cols int8 codes) and <role>.scales (rows float32). model.gguf is the model as a\n"
            "GGUF v3 file that llama.cpp loads (the bytes `sluice export --gguf` writes),\n"
            "computed on read from the slices. Every served byte has passed its slice's\n"
            "checksum and the tensor checks inspect and run make; a corrupt or malformed slice\n"
            "reads as EIO (in model.gguf, every range that needs it) and the daemon logs it.\n"
            "\n"
            "Checks DIR (exists, is an empty directory, not mounted) and the container (opened\n"
            "and validated) first, then mounts and goes to the background; -f stays in the\n"
            "foreground (log lines on stderr). Root mounts directly; other users through\n"
            "fusermount3. Unmount with `sluice umount DIR`.\n"
            "\n"
            "Cold reads: the daemon does the disk reads, so to limit its bandwidth start it in\n"
            "the limited cgroup: -o cgroup=/sys/fs/cgroup/blkio/GROUP, or run it under\n"
            "../shared/tools/flashrun (`flashrun -m 800 -- sluice mount M DIR`), or move the pid\n"
            "from stats.json into the group.\n"
            "\n"
            "Options (-o, comma separated; defaults are the measured best):\n"
            "  nonempty             mount over a non-empty directory\n"
            "  prefetch=N           slices read ahead of a sequential reader (default 1; 0: off)\n"
            "  cache_mb=N           memory for verified slices (default: room for 3 slices, at\n"
            "                       least 256 MiB); slices over half of it go through the page cache\n"
            "  pagecache            verify and serve every slice through the page cache\n"
            "  nosplice             page-cache slices: copy through the daemon, no splice\n"
            "  direct_io            slice files bypass the kernel's page cache\n"
            "  no_keep_cache        drop a file's cached pages when it is opened again\n"
            "  max_background=N     FUSE requests in flight (default 128; kernel default 12)\n"
            "  max_readahead=BYTES  kernel readahead window (default 4194304)\n"
            "  max_pages=N          request size in 4 KiB pages, 1..256 (default 256 = 1 MiB)\n"
            "  single               single-threaded request loop\n"
            "  max_threads=N        worker threads of the multithreaded loop (default 64)\n"
            "  noclone_fd           one /dev/fuse descriptor shared by the workers\n"
            "  cgroup=DIR           join this cgroup (its cgroup.procs) before serving\n"
            "  log=FILE             append log lines (corrupt slices, errors) to FILE\n"
            "  gguf=T               model.gguf's quantized tensors: q8_0 (default; rows not a\n"
            "                       multiple of 32 as f16), f16 or f32 (see sluice export)\n"
            "  gguf_cache=SIZE      memory for converted 1 MiB chunks of model.gguf, bytes with\n"
            "                       an optional K, M or G suffix (default 64M; 0: none)\n"
            "  gguf_warm=N          threads converting model.gguf's chunks ahead of its\n"
            "                       readers, from its open on, up to half the cache ahead\n"
            "                       (default 1; 0: convert on read only)\n"
            "  anything else goes to the kernel/libfuse (e.g. allow_other)\n");
}

int cmd_mount(int argc, char **argv)
{
    struct fs_options o;
    fs_options_init(&o);
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    static char extra[4096];
    extra[0] = 0;
    char *lists[16];
    int nlists = 0, ret = 2;
    struct sl_err err = {{0}};
    struct tools_args args = {"sluice mount", usage, argc, argv, 0};
    for (args.i = 1; args.i < argc; args.i++) {
        const char *a = argv[args.i], *value;
        if (tools_args_help(&args)) {
            ret = 0;
            goto out;
        } else if (!strcmp(a, "-f")) {
            o.foreground = 1;
        } else if (!strcmp(a, "-o")) {
            if (tools_args_value(&args, &value) < 0)
                goto out;
            if (nlists == 16) {
                fprintf(stderr, "sluice mount: too many -o\n");
                goto out;
            }
            char *list = lists[nlists++] = strdup(value), *save = NULL;
            if (!list) {
                fprintf(stderr, "sluice mount: out of memory\n");
                goto out;
            }
            for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                int k = fs_options_parse(&o, t, &err);
                if (k < 0) {
                    fprintf(stderr, "sluice mount: %s\n", err.msg);
                    goto out;
                }
                if (k == 0) {
                    size_t l = strlen(extra);
                    if (l + strlen(t) + 2 > sizeof extra) {
                        fprintf(stderr, "sluice mount: -o list too long\n");
                        goto out;
                    }
                    snprintf(extra + l, sizeof extra - l, "%s%s", l ? "," : "", t);
                }
            }
        } else if (a[0] == '-' || npos == 2) {
            tools_args_unexpected(&args);
            goto out;
        } else {
            pos[npos++] = a;
        }
    }
    if (npos != 2) {
        fprintf(stderr, "sluice mount: needs MODEL.sluice and DIR\n\n");
        usage(stderr);
        goto out;
    }
    o.container = pos[0];
    o.mountpoint = pos[1];
    o.fuse_opts = extra[0] ? extra : NULL;
    ret = 0;
    if (fs_mount_run(&o, &err) < 0) {
        fprintf(stderr, "sluice mount: %s\n", err.msg);
        ret = 1;
    }
out:
    for (int i = 0; i < nlists; i++)
        free(lists[i]);
    return ret;
}
