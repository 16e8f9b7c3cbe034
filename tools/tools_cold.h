/* tools_cold.h: the cold-start environment of ../shared/tools/flashrun, for
 * benchmarks that run contenders in child processes: drop the page cache,
 * limit read bandwidth of the device holding a file with a blkio cgroup (v1
 * blkio.throttle.read_bps_device, or v2 io.max), and move processes into it.
 * Needs root; tools_cold_available() says whether it can be done here. */
#ifndef SLUICE_TOOLS_COLD_H
#define SLUICE_TOOLS_COLD_H

#include <stdint.h>
#include <sys/types.h>

#include "common.h"

struct tools_cgroup {
    char dir[256];
    int v2;
    int created;
    unsigned major, minor;
};

/* 1 if running as root with a blkio/io cgroup controller and drop_caches. */
int tools_cold_available(char *why, size_t len);

/* sync, then echo 3 > /proc/sys/vm/drop_caches. */
int tools_drop_caches(struct sl_err *err);

/* A fresh cgroup limiting reads from the whole disk under `file` to
 * read_bps bytes/s (0: no limit, the group still isolates the process). */
int tools_cgroup_create(const char *file, uint64_t read_bps, struct tools_cgroup *cg,
                        struct sl_err *err);
int tools_cgroup_join(const struct tools_cgroup *cg, pid_t pid, struct sl_err *err);
/* Moves pid (a process joined for a while, e.g. a FUSE daemon that outlives
 * the benchmark) back to the root of the hierarchy, so the group can go. */
int tools_cgroup_leave(const struct tools_cgroup *cg, pid_t pid, struct sl_err *err);
void tools_cgroup_destroy(struct tools_cgroup *cg);

#endif
