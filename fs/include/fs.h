/*
 * fs.h: a read-only FUSE filesystem over a .sluice container (libfuse3,
 * low-level API).
 *
 *   struct fs_options o;
 *   fs_options_init(&o);
 *   o.container = "m.sluice";
 *   o.mountpoint = "/mnt/m";
 *   if (fs_mount_run(&o, &err) < 0)   // validates, mounts, daemonizes, serves
 *       fprintf(stderr, "%s\n", err.msg);
 *   ...
 *   fs_unmount("/mnt/m", 0, &err);   // from any process: unmount, wait for the daemon
 *
 * Layout of the mount (inode numbers are stable: they depend on the container
 * only, in the order below):
 *   config.json      the model config
 *   tokenizer.bin    the vocabulary, llama2.c tokenizer file format (i32
 *                    max_token_length, then per token f32 score, i32 len, bytes)
 *   manifest.json    {"tensors": [...], "slices": [...]}: name, layer, role,
 *                    shape, encoding, offset, length, checksum (hex), bits
 *                    histogram and `path` (relative to the mount) of each
 *   stats.json       bytes and reads served per file since mount, the slice
 *                    store's counters, the GGUF view's cache counters, and
 *                    the daemon's pid
 *   model.gguf       the model as a GGUF v3 file llama.cpp loads (gguf.h),
 *                    computed on read from the verified slices: quantized
 *                    tensors as Q8_0 (or F16/F32 with -o gguf=), a bounded
 *                    cache of converted 1 MiB chunks (-o gguf_cache=),
 *                    filled ahead of the readers from the file's open on
 *                    (-o gguf_warm=); a corrupt slice reads as EIO in every
 *                    range that needs it
 *   embed/ layer.NNN/ head/
 *                    one directory per slice: slice.bin (the whole slice),
 *                    <role>.bin per tensor (byte-identical to the
 *                    container's ranges), and for quantized tensors the
 *                    computed views <role>.int8 (rows x cols int8 codes, what
 *                    unpack_tensor_int8 gives) and <role>.scales (rows
 *                    little-endian float32), computed on read
 *
 * Integrity: no byte is served that has not passed its slice's checksum. A
 * slice is read and verified whole when any of its files is first read; a
 * corrupt slice reads as EIO (every file in it) and the daemon logs a line.
 * Slices up to half the cache budget are kept in the daemon's memory (read
 * with O_DIRECT where the file allows it) and served from exactly the bytes
 * that were hashed; larger slices are verified through the page cache and
 * spliced from the container (the container must then not be rewritten in
 * place while mounted: a change of its size or mtime turns reads into EIO).
 * While a reader streams slice i, the next `prefetch` slices are read and
 * verified in the background, so the disk never waits for the reader.
 */
#ifndef SLUICE_FS_H
#define SLUICE_FS_H

#include <stdint.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What `sluice mount -o` sets; fs_options_init gives the defaults (the tuned
 * configuration; every knob exists to be measured, see docs/BENCHMARKS.md). */
struct fs_options {
    const char *container;
    const char *mountpoint;
    int foreground;            /* 0: fork into the background once mounted */
    int allow_nonempty;        /* 1: mount over a non-empty directory */
    /* request loop */
    int single_thread;         /* 1: fuse_session_loop instead of the multithreaded loop */
    int clone_fd;              /* 1 (default): one /dev/fuse descriptor per worker thread */
    uint32_t max_threads;      /* multithreaded loop: worker threads (default 64: a worker
                                  waiting for a slice load must not hold up the
                                  requests that memory can serve) */
    /* kernel side */
    uint32_t max_background;   /* requests in flight (kernel default 12; default 128) */
    uint32_t max_readahead;    /* bytes (default 4 MiB) */
    uint32_t max_pages;        /* request size in 4 KiB pages, 1..256 (default 256 = 1 MiB) */
    int direct_io;             /* 1: bypass the kernel page cache for slice files */
    int keep_cache;            /* 1 (default): keep cached pages across opens (warm restarts) */
    /* serving */
    int splice;                /* 1 (default): splice page-cache slices from the container fd */
    int pagecache;             /* 1: verify and serve every slice through the page cache */
    uint32_t cache_mb;         /* memory for verified slices; 0: max(256 MiB, 3 x largest slice,
                                  embedding/head slices over twice a layer's not counted) */
    uint32_t prefetch;         /* slices read ahead of a sequential reader (default 1) */
    int store_direct;          /* 1 (default): memory slices are read with O_DIRECT */
    /* process */
    const char *cgroup;        /* directory of a cgroup to join before serving, or NULL */
    const char *log_path;      /* file to append log lines to, or NULL (stderr/syslog) */
    const char *fuse_opts;     /* extra -o options for the kernel/libfuse (comma separated) */
    /* model.gguf (gguf.h) */
    uint32_t gguf_qtype;       /* quantized tensors as GGUF_GGML_Q8_0 (default), _F16 or _F32 */
    uint64_t gguf_cache;       /* bytes of converted 1 MiB chunks kept (default 64 MiB; 0: none) */
    uint32_t gguf_warm;        /* threads converting chunks ahead of model.gguf's readers,
                                  from its open on (default 1; 0: convert on read only) */
};

void fs_options_init(struct fs_options *o);

/* Parses one `-o` word (`max_background=128`, `nosplice`, ...) into o.
 * Returns 1 if it is one of ours, 0 if not (pass it to libfuse), -EINVAL with
 * a message for a bad value. `word` must outlive o (strings are not copied). */
int fs_options_parse(struct fs_options *o, const char *word, struct sl_err *err);

/* Checks the mount point and the container, mounts, (daemonizes), serves
 * requests until unmounted or signalled, unmounts, and returns 0; or a
 * negative errno with a message (mount point missing, not a directory, not
 * empty, already mounted or a dead mount, no /dev/fuse, container missing or
 * corrupt, mount refused). As an ordinary user, mounts through fusermount3.
 * In the background, the calling process returns only on failure; the daemon
 * returns when unmounted. Call from a process with no other threads. */
int fs_mount_run(const struct fs_options *o, struct sl_err *err);

/* Unmounts a sluice mount (umount2 as root, else fusermount3 -u) and waits up
 * to 10 s for its daemon to exit (every thread of it: fs_daemon_threads). Refuses (-EBUSY) while files are open,
 * unless `lazy`: the mount is then detached at once, open files stay readable
 * and the daemon exits when the last one is closed. A dead mount (daemon
 * killed: ENOTCONN) is cleaned up. */
int fs_unmount(const char *mountpoint, int lazy, struct sl_err *err);

/* How many threads of process pid (a mount's daemon: stats.json's "pid")
 * have not exited; 0 once it is gone. A zombie counts as exited, a process
 * whose main thread is a zombie while other threads run does not (those
 * threads may still hold /dev/fuse and the container open). Where /proc
 * cannot be read for a process that kill(pid, 0) finds, it counts as one
 * running thread (never "gone" for want of /proc). What fs_unmount waits for. */
int fs_daemon_threads(int pid);

/* The model config as JSON, the object served as the mount's config.json and
 * printed by `sluice inspect --json`: adds architecture ("llama"), dim,
 * hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size, seq_len,
 * tied_embedding, rope_layout ("interleaved"), rope_theta, norm_eps, bos_id
 * and eos_id to `obj`, a cJSON object the caller owns (declared here without
 * cJSON's header). One writer, so the two cannot drift apart. Returns 0,
 * -EINVAL for an architecture or RoPE layout it has no name for, -ENOMEM
 * (obj may then hold some of the fields). */
struct cJSON;
struct format_config;
int fs_config_json(const struct format_config *c, struct cJSON *obj);

#ifdef __cplusplus
}
#endif

#endif
