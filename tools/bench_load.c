/* bench_load.c: `sluice bench load MODEL`: cold streaming throughput of the
 * ways a model can be read, side by side in one run, each in a fresh child
 * process inside a read-limited blkio cgroup after the page cache is dropped
 * (the method of ../shared/tools/flashrun), contenders interleaved run by run.
 * Reported as ratios to the device's raw bandwidth, measured the same way. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "format.h"
#include "loader.h"
#include "sluice.h"
#include "tools_cold.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench load MODEL.sluice [--mount DIR] [--flash-mbps N] [--runs K]\n"
            "                         [--queue-depth Q] [--chunk-kib C] [--json]\n\n"
            "Cold streaming throughput of reading a container's slices, side by side:\n"
            "  raw           one thread of large (16 MiB) O_DIRECT reads: the device's bandwidth\n"
            "  uring_direct  the loader: io_uring, O_DIRECT, registered ring (Q x C in flight)\n"
            "  uring_mount   the loader reading the layer slice files of a `sluice mount`\n"
            "  buffered      read() of the file in 1 MiB pieces\n"
            "  mmap          mmap with MAP_POPULATE (how llama.cpp loads)\n"
            "  pread_pool    the loader's pread thread pool\n"
            "Each run of each contender is a fresh process, started after the page cache is\n"
            "dropped, inside a blkio cgroup that limits reads from the model's disk to N MB/s\n"
            "(default 800; 0 = no limit); for uring_mount the FUSE daemon runs in that cgroup\n"
            "too (without --mount the benchmark mounts the model itself in a temporary\n"
            "directory). K runs each (default 3), interleaved; min and median MB/s, ratio of\n"
            "medians to raw, peak RSS. Warm (cached, unlimited) numbers follow separately.\n"
            "Needs root for the cold runs; otherwise only warm numbers are reported.\n");
}

enum method { M_RAW, M_URING, M_MOUNT, M_BUFFERED, M_MMAP, M_PREAD, M_COUNT };
static const char *const names[M_COUNT] = {"raw", "uring_direct", "uring_mount",
                                           "buffered", "mmap", "pread_pool"};

struct ctx {
    const char *model;
    const char *mount;       /* NULL when the mount is unavailable */
    struct format_reader *r;
    uint32_t qd, chunk;
};

struct outcome {
    uint64_t bytes, ns;
    int err;
};

static int read_slices(const struct ctx *c, int mount, int pread, struct outcome *o)
{
    struct loader_request *reqs;
    uint32_t n;
    struct sl_err err;
    if (loader_requests_from_container(c->r, NULL, &reqs, &n, &err) < 0)
        return -1;
    char (*paths)[4096] = NULL;
    if (mount) {
        paths = malloc(sizeof *paths * n);
        for (uint32_t i = 0; i < n; i++) {
            const struct format_slice_info *s = format_reader_slice(c->r, i);
            if (s->kind == FORMAT_SLICE_LAYER)
                snprintf(paths[i], sizeof paths[i], "%s/layer.%03d/slice.bin", c->mount, s->layer);
            else
                snprintf(paths[i], sizeof paths[i], "%s/%s/slice.bin", c->mount,
                         s->kind == FORMAT_SLICE_EMBED ? "embed" : "head");
            reqs[i].path = paths[i];
            reqs[i].offset = 0;
        }
    }
    struct loader_opts lo = {.queue_depth = c->qd, .chunk_bytes = c->chunk, .force_pread = pread};
    struct loader_stream *s;
    uint64_t t0 = sl_now_ns();
    int ret = loader_stream_open(reqs, n, &lo, &s, &err);
    if (ret == 0) {
        struct loader_slice sl;
        while ((ret = loader_stream_next(s, &sl, &err)) == 1) {
            o->bytes += sl.length;
            loader_stream_release(s, &sl);
        }
        loader_stream_close(s);
    }
    o->ns = sl_now_ns() - t0;
    if (ret < 0)
        fprintf(stderr, "bench load: %s\n", err.msg);
    free(reqs);
    free(paths);
    return ret;
}

static void run_method(const struct ctx *c, enum method m, struct outcome *o)
{
    memset(o, 0, sizeof *o);
    uint64_t size = format_reader_file_size(c->r);
    if (m == M_URING || m == M_MOUNT || m == M_PREAD) {
        o->err = read_slices(c, m == M_MOUNT, m == M_PREAD, o) < 0;
        return;
    }
    int fd = open(c->model, O_RDONLY | (m == M_RAW ? O_DIRECT : 0));
    if (fd < 0) {
        o->err = 1;
        return;
    }
    uint64_t t0 = sl_now_ns();
    if (m == M_MMAP) {
        void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (p == MAP_FAILED) {
            o->err = 1;
        } else {
            volatile uint8_t sink = ((uint8_t *)p)[size - 1];
            (void)sink;
            o->bytes = size;
            munmap(p, size);
        }
    } else {
        size_t bs = m == M_RAW ? 16u << 20 : 1u << 20;
        uint8_t *buf = sl_alloc_aligned(bs, 4096);
        uint64_t off = 0;
        while (buf && off < size) {
            ssize_t k = pread(fd, buf, bs, (off_t)off);
            if (k <= 0) {
                o->err = k < 0;
                break;
            }
            off += (uint64_t)k;
        }
        o->bytes = off;
        sl_free_aligned(buf);
    }
    o->ns = sl_now_ns() - t0;
    close(fd);
}

/* Runs one contender in a child, in the cgroup (if any), cold or warm. */
static int measure(const struct ctx *c, enum method m, const struct tools_cgroup *cg, int cold,
                   struct outcome *o, double *rss)
{
    struct sl_err err;
    if (cold && tools_drop_caches(&err) < 0) {
        fprintf(stderr, "sluice bench load: %s\n", err.msg);
        return -1;
    }
    int p[2];
    if (pipe(p) < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(p[0]);
        if (cg && tools_cgroup_join(cg, getpid(), &err) < 0)
            _exit(3);
        struct outcome r;
        run_method(c, m, &r);
        ssize_t w = write(p[1], &r, sizeof r);
        _exit(w == sizeof r ? 0 : 4);
    }
    close(p[1]);
    ssize_t got = read(p[0], o, sizeof *o);
    close(p[0]);
    int st;
    struct rusage ru;
    wait4(pid, &st, 0, &ru);
    *rss = tools_child_peak_rss_mb(&ru);
    return got == sizeof *o && WIFEXITED(st) && WEXITSTATUS(st) == 0 && !o->err ? 0 : -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int mount_model(const char *model, const char *dir, const struct tools_cgroup *cg)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct sl_err err;
        if (cg && tools_cgroup_join(cg, getpid(), &err) < 0)
            _exit(3);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, 1);
        execl("/proc/self/exe", "sluice", "mount", model, dir, (char *)NULL);
        _exit(127);
    }
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void umount_model(const char *dir)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "sluice", "umount", dir, (char *)NULL);
        _exit(127);
    }
    int st;
    if (pid > 0)
        waitpid(pid, &st, 0);
}

int bench_load(int argc, char **argv)
{
    const char *model = NULL, *mount = NULL;
    uint32_t mbps = 800, runs = 3, qd = 16, chunk_kib = 1024;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--mount") && i + 1 < argc) {
            mount = argv[++i];
        } else if (!strcmp(argv[i], "--flash-mbps") && i + 1 < argc) {
            bad = tools_parse_u32(argv[++i], &mbps);
        } else if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
            bad = tools_parse_u32(argv[++i], &runs) || runs == 0;
        } else if (!strcmp(argv[i], "--queue-depth") && i + 1 < argc) {
            bad = tools_parse_u32(argv[++i], &qd) || qd == 0;
        } else if (!strcmp(argv[i], "--chunk-kib") && i + 1 < argc) {
            bad = tools_parse_u32(argv[++i], &chunk_kib) || chunk_kib < 4 || chunk_kib % 4;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (argv[i][0] == '-' || model) {
            usage(stderr);
            return 2;
        } else {
            model = argv[i];
        }
        if (bad) {
            fprintf(stderr, "sluice bench load: bad value '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!model) {
        usage(stderr);
        return 2;
    }
    struct sl_err err = {{0}};
    struct ctx c = {.model = model, .qd = qd, .chunk = chunk_kib * 1024};
    if (format_reader_open(model, &c.r, &err) < 0) {
        fprintf(stderr, "sluice bench load: %s\n", err.msg);
        return 1;
    }
    char why[256];
    int cold = tools_cold_available(why, sizeof why);
    if (!cold)
        fprintf(stderr, "sluice bench load: %s; reporting warm numbers only\n", why);
    struct tools_cgroup cg;
    int have_cg = cold && tools_cgroup_create(model, (uint64_t)mbps * 1000000, &cg, &err) == 0;
    if (cold && !have_cg) {
        fprintf(stderr, "sluice bench load: %s\n", err.msg);
        format_reader_close(c.r);
        return 1;
    }
    char tmpdir[256] = "";
    const char *mount_note = NULL;
    if (!mount) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/sluice-bench-mnt.%d", (int)getpid());
        mkdir(tmpdir, 0755);
        if (mount_model(model, tmpdir, have_cg ? &cg : NULL) == 0)
            c.mount = tmpdir;
        else
            mount_note = "sluice mount failed: uring_mount skipped";
    } else {
        c.mount = mount;
        mount_note = have_cg ? "--mount given: its FUSE daemon must already be in the cgroup" : NULL;
    }
    if (mount_note)
        fprintf(stderr, "sluice bench load: %s\n", mount_note);
    double mb[M_COUNT][64], rss[M_COUNT];
    uint32_t nok[M_COUNT] = {0};
    memset(rss, 0, sizeof rss);
    if (runs > 64)
        runs = 64;
    for (uint32_t r = 0; cold && r < runs; r++) {
        for (int m = 0; m < M_COUNT; m++) {
            if (m == M_MOUNT && !c.mount)
                continue;
            struct outcome o;
            double rr;
            if (measure(&c, (enum method)m, &cg, 1, &o, &rr) == 0) {
                mb[m][nok[m]++] = (double)o.bytes / (double)o.ns * 1000.0;
                if (rr > rss[m])
                    rss[m] = rr;
            }
            if (!json)
                fprintf(stderr, "run %u %-12s %s\n", r + 1, names[m],
                        nok[m] ? "done" : "failed");
        }
    }
    /* warm: cached, no limit */
    double warm[M_COUNT] = {0};
    for (int m = 0; m < M_COUNT; m++) {
        if (m == M_MOUNT && !c.mount)
            continue;
        struct outcome o;
        double rr;
        measure(&c, (enum method)m, NULL, 0, &o, &rr); /* fill the cache */
        if (measure(&c, (enum method)m, NULL, 0, &o, &rr) == 0)
            warm[m] = (double)o.bytes / (double)o.ns * 1000.0;
    }
    double med[M_COUNT] = {0}, mins[M_COUNT] = {0};
    for (int m = 0; m < M_COUNT; m++) {
        if (!nok[m])
            continue;
        qsort(mb[m], nok[m], sizeof(double), cmp_double);
        med[m] = mb[m][nok[m] / 2];
        mins[m] = mb[m][0];
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "raw_mbps", med[M_RAW]);
    cJSON_AddNumberToObject(o, "flash_mbps_limit", cold ? mbps : 0);
    cJSON_AddNumberToObject(o, "runs", runs);
    cJSON_AddNumberToObject(o, "bytes", (double)format_reader_file_size(c.r));
    cJSON_AddBoolToObject(o, "cold", cold);
    if (mount_note)
        cJSON_AddStringToObject(o, "note", mount_note);
    cJSON *arr = cJSON_AddArrayToObject(o, "results");
    if (!json)
        printf("%s: %.1f MB, cold at %u MB/s limit, %u runs each\n%-13s %10s %10s %8s %9s %10s\n",
               model, format_reader_file_size(c.r) / 1e6, mbps, runs, "method", "MB/s min",
               "MB/s med", "vs raw", "RSS MiB", "warm MB/s");
    for (int m = 1; m < M_COUNT; m++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "method", names[m]);
        cJSON_AddNumberToObject(e, "mbps_min", mins[m]);
        cJSON_AddNumberToObject(e, "mbps_median", med[m]);
        cJSON_AddNumberToObject(e, "ratio_to_raw", med[M_RAW] > 0 ? med[m] / med[M_RAW] : 0);
        cJSON_AddNumberToObject(e, "peak_rss_mb", rss[m]);
        cJSON_AddNumberToObject(e, "warm_mbps", warm[m]);
        cJSON_AddItemToArray(arr, e);
    }
    if (json) {
        char *s = cJSON_Print(o);
        printf("%s\n", s);
        free(s);
    } else {
        for (int m = 0; m < M_COUNT; m++)
            printf("%-13s %10.1f %10.1f %7.3fx %9.1f %10.1f\n", names[m], mins[m], med[m],
                   med[M_RAW] > 0 ? med[m] / med[M_RAW] : 0, rss[m], warm[m]);
    }
    cJSON_Delete(o);
    if (tmpdir[0]) {
        if (c.mount)
            umount_model(tmpdir);
        rmdir(tmpdir);
    }
    if (have_cg)
        tools_cgroup_destroy(&cg);
    format_reader_close(c.r);
    return 0;
}
