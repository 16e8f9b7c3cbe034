/* tools_cold.c: see tools_cold.h. The same method as ../shared/tools/flashrun. */
#include "tools_cold.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = write(fd, text, strlen(text));
    int e = n < 0 ? -errno : 0;
    close(fd);
    return e;
}

int tools_cold_available(char *why, size_t len)
{
    if (geteuid() != 0) {
        snprintf(why, len, "not root: cannot drop the page cache or create a blkio cgroup");
        return 0;
    }
    if (access("/proc/sys/vm/drop_caches", W_OK) != 0) {
        snprintf(why, len, "/proc/sys/vm/drop_caches is not writable");
        return 0;
    }
    struct stat st;
    if (stat("/sys/fs/cgroup/blkio", &st) != 0 && stat("/sys/fs/cgroup/cgroup.controllers", &st) != 0) {
        snprintf(why, len, "no blkio (v1) or io (v2) cgroup controller");
        return 0;
    }
    return 1;
}

int tools_drop_caches(struct sl_err *err)
{
    sync();
    int ret = write_file("/proc/sys/vm/drop_caches", "3");
    if (ret < 0)
        sl_err_set(err, "cannot drop the page cache: %s", strerror(-ret));
    return ret;
}

/* major:minor of the whole disk holding `file` (partitions are throttled
 * through their disk). */
static int disk_of(const char *file, unsigned *maj, unsigned *min, struct sl_err *err)
{
    struct stat st;
    if (stat(file, &st) < 0) {
        int e = errno;
        sl_err_set(err, "%s: %s", file, strerror(e));
        return -e;
    }
    unsigned a = major(st.st_dev), b = minor(st.st_dev);
    char p[PATH_MAX], real[PATH_MAX];
    snprintf(p, sizeof p, "/sys/dev/block/%u:%u", a, b);
    if (!realpath(p, real)) {
        sl_err_set(err, "%s: device %u:%u is not a block device (cannot throttle it)", file, a,
                   b);
        return -ENODEV;
    }
    char part[PATH_MAX + 16];
    snprintf(part, sizeof part, "%s/partition", real);
    if (access(part, F_OK) == 0) {
        char dev[PATH_MAX + 16];
        snprintf(dev, sizeof dev, "%s/../dev", real);
        FILE *f = fopen(dev, "r");
        if (!f || fscanf(f, "%u:%u", &a, &b) != 2) {
            if (f)
                fclose(f);
            sl_err_set(err, "%s: cannot find the disk of partition %s", file, real);
            return -ENODEV;
        }
        fclose(f);
    }
    *maj = a;
    *min = b;
    return 0;
}

int tools_cgroup_create(const char *file, uint64_t read_bps, struct tools_cgroup *cg,
                        struct sl_err *err)
{
    memset(cg, 0, sizeof *cg);
    int ret = disk_of(file, &cg->major, &cg->minor, err);
    if (ret < 0)
        return ret;
    static unsigned counter;
    struct stat st;
    char line[128];
    /* cgroup v1 (blkio) when mounted, else v2 (io) */
    int v1 = stat("/sys/fs/cgroup/blkio", &st) == 0;
    cg->v2 = !v1;
    if (!v1)
        (void)write_file("/sys/fs/cgroup/cgroup.subtree_control", "+io");
    snprintf(cg->dir, sizeof cg->dir, "%s/sluice.%d.%u",
             v1 ? "/sys/fs/cgroup/blkio" : "/sys/fs/cgroup", (int)getpid(), counter++);
    if (mkdir(cg->dir, 0755) < 0 && errno != EEXIST) {
        int e = errno;
        sl_err_set(err, "cannot create cgroup %s: %s", cg->dir, strerror(e));
        return -e;
    }
    cg->created = 1;
    if (read_bps) {
        char f[300];
        snprintf(f, sizeof f, "%s/%s", cg->dir, v1 ? "blkio.throttle.read_bps_device" : "io.max");
        snprintf(line, sizeof line, "%u:%u %s%llu", cg->major, cg->minor,
                 v1 ? "" : "rbps=", (unsigned long long)read_bps);
        ret = write_file(f, line);
    }
    if (ret < 0) {
        sl_err_set(err, "cannot set the read limit in %s: %s", cg->dir, strerror(-ret));
        tools_cgroup_destroy(cg);
    }
    return ret;
}

int tools_cgroup_join(const struct tools_cgroup *cg, pid_t pid, struct sl_err *err)
{
    char f[300], v[32];
    snprintf(f, sizeof f, "%s/cgroup.procs", cg->dir);
    snprintf(v, sizeof v, "%d", (int)pid);
    int ret = write_file(f, v);
    if (ret < 0)
        sl_err_set(err, "cannot move %d into %s: %s", (int)pid, cg->dir, strerror(-ret));
    return ret;
}

int tools_cgroup_leave(const struct tools_cgroup *cg, pid_t pid, struct sl_err *err)
{
    char v[32];
    snprintf(v, sizeof v, "%d", (int)pid);
    const char *root = cg->v2 ? "/sys/fs/cgroup/cgroup.procs" : "/sys/fs/cgroup/blkio/cgroup.procs";
    int ret = write_file(root, v);
    if (ret < 0)
        sl_err_set(err, "cannot move %d back to %s: %s", (int)pid, root, strerror(-ret));
    return ret;
}

void tools_cgroup_destroy(struct tools_cgroup *cg)
{
    if (cg->created)
        rmdir(cg->dir); /* fails while processes remain; they are gone by now */
    cg->created = 0;
}
