/*
 * fs.h: a read-only FUSE filesystem over a .sluice container (libfuse3,
 * low-level API).
 *
 *   struct fs_options o = {.container = "m.sluice", .mountpoint = "/mnt/m"};
 *   fs_mount_run(&o, &err);   // validates, mounts, serves until unmounted
 *
 * Layout of the mount:
 *   config.json      the model config
 *   tokenizer.bin    the vocabulary, llama2.c tokenizer file format
 *   manifest.json    {"tensors": [...], "slices": [...]}: name, layer, role,
 *                    shape, encoding, offset, length, checksum, bits
 *                    histogram and `path` (relative to the mount) of each
 *   stats.json       bytes and reads served per file since mount (and the
 *                    daemon's pid)
 *   embed/ layer.NNN/ head/
 *                    one directory per slice: slice.bin (the whole slice),
 *                    <role>.bin per tensor (byte-identical to the
 *                    container's ranges), and for quantized tensors the
 *                    computed views <role>.int8 (rows x cols int8 codes) and
 *                    <role>.scales (rows float32)
 * Every byte served from a slice has passed the slice's checksum (verified
 * once, on first access); a corrupt slice reads as EIO.
 */
#ifndef SLUICE_FS_H
#define SLUICE_FS_H

#include <stdint.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct fs_options {
    const char *container;
    const char *mountpoint;
    int foreground;            /* 0: fork into the background once mounted */
    int single_thread;         /* 1: fuse_session_loop instead of the multithreaded loop */
    int no_splice;             /* 1: copy through user space instead of splicing from the file */
    int direct_io;             /* 1: bypass the page cache for slice files */
    int no_keep_cache;         /* 1: drop cached pages on open (default keeps them) */
    int allow_nonempty;        /* 1: mount over a non-empty directory */
    uint32_t max_background;   /* 0: default 128 */
    uint32_t max_readahead;    /* bytes; 0: default 1 MiB */
    const char *fuse_opts;     /* extra -o options for libfuse (comma separated), or NULL */
};

/* Checks the mount point and the container, mounts, (daemonizes), serves
 * requests until unmounted, and returns 0; or a negative errno with a message
 * (mount point missing, not a directory, not empty, already mounted, no
 * /dev/fuse, container missing or corrupt, mount refused). */
int fs_mount_run(const struct fs_options *o, struct sl_err *err);

/* Unmounts (fusermount3 -u, or umount2 as root; lazy = detach even if files
 * are open) and waits for the daemon to exit (up to 10 s). */
int fs_unmount(const char *mountpoint, int lazy, struct sl_err *err);

#ifdef __cplusplus
}
#endif

#endif
