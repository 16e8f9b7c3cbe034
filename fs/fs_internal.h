/* fs_internal.h: the node table the FUSE callbacks serve, built once at
 * mount time from the container's index (fs_tree.c). */
#ifndef SLUICE_FS_INTERNAL_H
#define SLUICE_FS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "format.h"
#include "fs.h"

enum fs_kind {
    FS_DIR = 0,
    FS_GEN,      /* content generated at mount time (config, tokenizer, manifest) */
    FS_RANGE,    /* a byte range of the container (a tensor or a whole slice) */
    FS_INT8,     /* computed: a quantized tensor unpacked to int8 codes */
    FS_SCALES,   /* computed: its per-row float32 scales */
    FS_STATS,    /* computed on open: stats.json */
};

struct fs_node {
    uint64_t ino;            /* index + 1; the root is 1 */
    uint32_t parent;         /* index of the parent directory */
    char name[48];
    enum fs_kind kind;
    uint64_t size;
    uint64_t off;            /* FS_RANGE: absolute offset in the container */
    uint32_t slice;          /* FS_RANGE, FS_INT8, FS_SCALES: the slice holding the bytes */
    int32_t tensor;          /* FS_RANGE (tensor files), FS_INT8, FS_SCALES; -1 otherwise */
    char *data;              /* FS_GEN */
    uint32_t first_child;    /* FS_DIR: index + 1 of the first child, 0 = none */
    uint32_t next_sibling;   /* index + 1, 0 = none */
    atomic_uint_fast64_t bytes_served;
    atomic_uint_fast64_t reads_served;
};

struct fs_state {
    struct fs_options opts;
    char container[4096];    /* absolute path */
    struct format_reader *r;
    int fd;                  /* buffered descriptor of the container */
    struct fs_node *nodes;
    uint32_t n_nodes, cap_nodes;
    /* per slice: 0 unverified, 1 good, -1 corrupt; verification is done once,
     * under the slice's lock */
    int *verdict;
    pthread_mutex_t *slice_lock;
    uint64_t mount_ns;
};

/* Builds the node table; fills err on failure. */
int fs_tree_build(struct fs_state *s, struct sl_err *err);
void fs_tree_free(struct fs_state *s);

/* Child of dir `parent` (index) named `name`, or NULL. */
struct fs_node *fs_tree_lookup(struct fs_state *s, uint32_t parent, const char *name);

/* stats.json as of now (malloc'ed; *len its length). */
char *fs_stats_json(struct fs_state *s, size_t *len);

/* The directory name of slice i ("embed", "layer.007", "head"). */
void fs_slice_dirname(const struct format_slice_info *si, char *buf, size_t n);

#endif
