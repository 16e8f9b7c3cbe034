/* bench_load.c: `sluice bench load MODEL`: cold streaming throughput of the
 * ways a model can be read, side by side in one run. Every run of every
 * contender is a fresh child process, started after the page cache is dropped,
 * inside a blkio cgroup limiting reads from the model's disk (the method of
 * ../shared/tools/flashrun); contenders are interleaved run by run (the order
 * rotating), and reported as ratios to the device's raw bandwidth measured
 * the same way. Each contender's time runs from its start until the last byte
 * is available to it (teardown, such as unmapping, is not counted). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format.h"
#include "loader.h"
#include "sluice.h"
#include "tools_child.h"
#include "tools_cold.h"
#include "tools_stats.h"
#include "tools_util.h"

#define MAX_RUNS 64

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench load MODEL.sluice [--mount DIR] [--flash-mbps N] [--runs K]\n"
            "                         [--json] [--warm-only] [--methods LIST] [--verify]\n"
            "                         [--queue-depth Q] [--chunk-kib C] [--ring-mib R]\n"
            "                         [--mount-opts OPTS]\n\n"
            "Streaming throughput of reading every slice of a container, side by side:\n"
            "  raw           large O_DIRECT reads of the whole file (up to 1 GiB each) into a\n"
            "                buffer touched beforehand: the device's own bandwidth\n"
            "  uring_direct  the loader (io_uring, O_DIRECT, registered ring, Q reads of C KiB\n"
            "                in flight) on the container\n"
            "  uring_mount   the loader reading the slice files of a `sluice mount`\n"
            "  buffered      read() of the file in 1 MiB pieces\n"
            "  mmap          mmap with MAP_POPULATE (how llama.cpp loads)\n"
            "  pread_pool    the loader's pread thread pool (its fallback)\n"
            "Cold runs: each run of each contender is a fresh process, started after the page\n"
            "cache is dropped, inside a blkio cgroup that limits reads from the model's disk to\n"
            "N MB/s (default 800; 0 = no limit). For uring_mount the FUSE daemon does the disk\n"
            "reads, so it runs in that cgroup too: without --mount the benchmark mounts the\n"
            "model afresh for every run (`sluice mount`, inside the cgroup; -o OPTS from\n"
            "--mount-opts); with --mount DIR it moves the daemon named in DIR/stats.json into\n"
            "the cgroup. K runs each (default 3), interleaved; MB/s min and median, the ratio\n"
            "of medians to raw, peak RSS of the reading process, and for the loader its ring\n"
            "size and peak use. Warm numbers (page cache kept, no limit; one priming run)\n"
            "follow separately. --verify: the loader also checks every slice's checksum (the\n"
            "mount always does). --methods: a comma-separated subset (raw is always run).\n"
            "Limits: K 1..64, Q 1..256, C a multiple of 4 in 4..1048576, R at least 1 (Q, C\n"
            "and R default to the loader's own).\n"
            "Needs root for the cold runs (cgroups, drop_caches); otherwise, or with\n"
            "--warm-only, only warm numbers are measured. MB = 10^6 bytes.\n");
}

enum method { M_RAW, M_URING, M_MOUNT, M_BUFFERED, M_MMAP, M_PREAD, M_COUNT };
static const char *const names[M_COUNT] = {"raw", "uring_direct", "uring_mount",
                                           "buffered", "mmap", "pread_pool"};

struct ctx {
    const char *model;
    const char *mount;        /* where uring_mount reads, NULL when unavailable */
    struct format_reader *r;
    struct loader_opts lo;
    int verify;
};

/* What a child reports back through a pipe. */
struct outcome {
    uint64_t bytes, ns;
    uint64_t ring_bytes, peak_bytes;
    int direct, fixed;
    int err;
    char msg[200];
};

static void read_slices(const struct ctx *c, int mount, int pread, struct outcome *o)
{
    struct loader_request *reqs;
    uint32_t n;
    struct sl_err err = {{0}};
    uint64_t t0 = sl_now_ns();
    int ret = mount ? loader_requests_from_mount(c->r, c->mount, &reqs, &n, &err)
                    : loader_requests_from_container(c->r, NULL, &reqs, &n, &err);
    if (ret < 0) {
        o->err = 1;
        snprintf(o->msg, sizeof o->msg, "%s", err.msg);
        return;
    }
    struct loader_opts lo = c->lo;
    lo.force_pread = pread;
    lo.verify = c->verify ? c->r : NULL;
    struct loader_stream *s;
    ret = loader_stream_open(reqs, n, &lo, &s, &err);
    if (ret == 0) {
        struct loader_slice sl;
        while ((ret = loader_stream_next(s, &sl, &err)) == 1) {
            o->bytes += sl.length;
            loader_stream_release(s, &sl);
        }
        o->ns = sl_now_ns() - t0;
        struct loader_stats st;
        loader_stream_stats(s, &st);
        o->ring_bytes = st.ring_bytes;
        o->peak_bytes = st.peak_bytes;
        o->direct = st.direct;
        o->fixed = st.fixed;
        if (st.note[0] && ret == 0)
            snprintf(o->msg, sizeof o->msg, "%s", st.note);
        loader_stream_close(s);
    }
    if (ret < 0) {
        o->err = 1;
        snprintf(o->msg, sizeof o->msg, "%s", err.msg);
    }
    free(reqs);
}

static void read_file(const struct ctx *c, enum method m, struct outcome *o)
{
    uint64_t size = format_reader_file_size(c->r);
    int fd = open(c->model, O_RDONLY | O_CLOEXEC | (m == M_RAW ? O_DIRECT : 0));
    if (fd < 0) {
        o->err = 1;
        snprintf(o->msg, sizeof o->msg, "%s: %s", c->model, strerror(errno));
        return;
    }
    if (m == M_MMAP) {
        uint64_t t0 = sl_now_ns();
        void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (p == MAP_FAILED) {
            o->err = 1;
            snprintf(o->msg, sizeof o->msg, "mmap: %s", strerror(errno));
        } else {
            volatile uint8_t sink = ((const uint8_t *)p)[size - 1];
            (void)sink;
            o->ns = sl_now_ns() - t0;
            o->bytes = size;
            munmap(p, size);
        }
        close(fd);
        return;
    }
    /* raw: one buffer for the whole file (at most 1 GiB per read), touched
     * before the clock starts so that only the device is measured */
    size_t bs = m == M_RAW ? (size_t)(size < (1u << 30) ? sl_align_up(size, 4096) : (1u << 30))
                           : (1u << 20);
    uint8_t *buf = sl_alloc_aligned(bs, 4096);
    if (!buf) {
        o->err = 1;
        snprintf(o->msg, sizeof o->msg, "out of memory for a %zu-byte buffer", bs);
        close(fd);
        return;
    }
    memset(buf, 0, bs);
    uint64_t t0 = sl_now_ns(), off = 0;
    while (off < size) {
        ssize_t k = pread(fd, buf, bs, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            o->err = 1;
            snprintf(o->msg, sizeof o->msg, "%s: read at %llu: %s", c->model,
                     (unsigned long long)off, k < 0 ? strerror(errno) : "end of file");
            break;
        }
        off += (uint64_t)k;
    }
    o->ns = sl_now_ns() - t0;
    o->bytes = off;
    o->direct = m == M_RAW;
    sl_free_aligned(buf);
    close(fd);
}

static void run_method(const struct ctx *c, enum method m, struct outcome *o)
{
    memset(o, 0, sizeof *o);
    if (m == M_URING || m == M_MOUNT || m == M_PREAD)
        read_slices(c, m == M_MOUNT, m == M_PREAD, o);
    else
        read_file(c, m, o);
}

/* ---- the mount --------------------------------------------------------------------- */

/* Runs `sluice ARGS` (args[0] is "sluice") to its end, in the cgroup if
 * given; quiet: its output to /dev/null. 0 when it ran and exited 0. */
static int run_sluice(const char *const *args, const struct tools_cgroup *cg, int quiet)
{
    struct tools_child_opts o = {.path = "/proc/self/exe", .argv = args, .cg = cg,
                                 .null_stdout = quiet, .null_stderr = quiet};
    struct tools_child_result res;
    struct sl_err err;
    int ret = tools_child_run(&o, &res, &err);
    if (ret < 0)
        return ret;
    ret = res.exit_code == 0 ? 0 : -ECHILD;
    tools_child_result_fini(&res);
    return ret;
}

/* Mounts the model at dir; the daemon forks from a child already in the cgroup. */
static int mount_model(const char *model, const char *dir, const char *opts,
                       const struct tools_cgroup *cg)
{
    const char *args[] = {"sluice", "mount", model, dir, opts ? "-o" : NULL, opts, NULL};
    return run_sluice(args, cg, 0);
}

static void umount_model(const char *dir)
{
    const char *args[] = {"sluice", "umount", dir, NULL};
    /* a mount left behind makes the next `sluice mount` on dir fail, and
     * that failure is reported where it happens */
    (void)run_sluice(args, NULL, 1);
}

/* The FUSE daemon's pid from DIR/stats.json, 0 if unknown. */
static pid_t mount_daemon(const char *dir)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/stats.json", dir);
    FILE *f = fopen(p, "r");
    if (!f)
        return 0;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    const cJSON *pid = cJSON_GetObjectItem(j, "pid");
    pid_t r = cJSON_IsNumber(pid) ? (pid_t)pid->valuedouble : 0;
    cJSON_Delete(j);
    return r;
}

/* ---- measuring ------------------------------------------------------------------------ */

struct measure_arg {
    const struct ctx *c;
    enum method m;
};

/* The child of measure: runs the contender, its struct outcome written to
 * standard output. */
static int measure_child(void *arg)
{
    const struct measure_arg *a = arg;
    struct outcome r;
    run_method(a->c, a->m, &r);
    return write(STDOUT_FILENO, &r, sizeof r) == (ssize_t)sizeof r ? 0 : 4;
}

/* Runs one contender in a child (in the cgroup if given); 0 and *o, *rss,
 * else -1 with a sentence in o->msg where one is known. */
static int measure(const struct ctx *c, enum method m, const struct tools_cgroup *cg, int cold,
                   struct outcome *o, double *rss)
{
    struct sl_err err;
    memset(o, 0, sizeof *o);
    struct measure_arg a = {c, m};
    struct tools_child_opts co = {.fn = measure_child, .arg = &a, .cg = cg,
                                  .drop_caches = cold, .capture = 1};
    struct tools_child_result res;
    if (tools_child_run(&co, &res, &err) < 0) {
        snprintf(o->msg, sizeof o->msg, "%s", err.msg);
        return -1;
    }
    *rss = res.peak_rss_mb;
    int got = res.out_len == sizeof *o;
    if (got)
        memcpy(o, res.out, sizeof *o);
    int ok = res.exit_code == 0 && got && !o->err && o->ns;
    if (!got)
        snprintf(o->msg, sizeof o->msg, "the child died (exit %d, signal %d)", res.exit_code,
                 res.term_signal);
    tools_child_result_fini(&res);
    return ok ? 0 : -1;
}

struct series {
    double mb[MAX_RUNS];
    uint32_t n;
    double rss, ring_mb, peak_ring_mb;
    int direct, fixed;
    char note[200];
};

static void series_add(struct series *sr, const struct outcome *o, double rss)
{
    sr->mb[sr->n++] = (double)o->bytes / (double)o->ns * 1000.0;
    if (rss > sr->rss)
        sr->rss = rss;
    sr->ring_mb = (double)o->ring_bytes / (1 << 20);
    if ((double)o->peak_bytes / (1 << 20) > sr->peak_ring_mb)
        sr->peak_ring_mb = (double)o->peak_bytes / (1 << 20);
    sr->direct = o->direct;
    sr->fixed = o->fixed;
    if (o->msg[0])
        snprintf(sr->note, sizeof sr->note, "%s", o->msg);
}

static int parse_methods(const char *list, int *want)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (int m = 0; m < M_COUNT; m++)
        want[m] = m == M_RAW;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int m = 0; m < M_COUNT; m++)
            if (!strcmp(t, names[m]))
                want[m] = found = 1;
        if (!found)
            return -1;
    }
    return 0;
}

/* Runs the contenders `runs` times, interleaved; cold (dropped cache, cgroup)
 * or warm (one priming run of each first). */
static void run_all(struct ctx *c, const int *want, uint32_t runs, int cold,
                    const struct tools_cgroup *cg, int fresh_mount, const char *mount_opts,
                    struct series *out, int quiet)
{
    int order[M_COUNT], k = 0;
    for (int m = 0; m < M_COUNT; m++)
        if (want[m])
            order[k++] = m;
    for (uint32_t r = cold ? 1 : 0; r <= runs; r++) {
        for (int j = 0; j < k; j++) {
            enum method m = (enum method)order[(j + r) % k]; /* rotate the order each run */
            int mounted = 0;
            if (m == M_MOUNT && fresh_mount) {
                if (mount_model(c->model, c->mount, mount_opts, cg) < 0) {
                    snprintf(out[m].note, sizeof out[m].note, "sluice mount %s %s failed",
                             c->model, c->mount);
                    if (!quiet)
                        fprintf(stderr, "sluice bench load: %s\n", out[m].note);
                    continue;
                }
                mounted = 1;
            }
            struct outcome o;
            double rss = 0;
            int ret = measure(c, m, cold ? cg : NULL, cold, &o, &rss);
            if (mounted)
                umount_model(c->mount);
            if (r == 0)
                continue; /* warm: the priming run */
            if (ret == 0)
                series_add(&out[m], &o, rss);
            else
                snprintf(out[m].note, sizeof out[m].note, "%s", o.msg[0] ? o.msg : "failed");
            if (!quiet) {
                if (ret == 0)
                    fprintf(stderr, "%s run %u/%u %-12s %8.1f MB/s  peak RSS %6.1f MiB\n",
                            cold ? "cold" : "warm", r, runs, names[m],
                            out[m].mb[out[m].n - 1], rss);
                else
                    fprintf(stderr, "%s run %u/%u %-12s failed: %s\n", cold ? "cold" : "warm", r,
                            runs, names[m], out[m].note);
            }
        }
    }
}

int bench_load(int argc, char **argv)
{
    const char *model = NULL, *mount = NULL, *methods = NULL, *mount_opts = NULL;
    uint32_t mbps = 800, runs = 3, qd = 0, chunk_kib = 0, ring_mib = 0;
    int json = 0, warm_only = 0, verify = 0;
    struct tools_args args = {"sluice bench load", usage, argc, argv, 0};
    for (args.i = 1; args.i < argc; args.i++) {
        int bad = 0;
        const char *a = argv[args.i];
        if (tools_args_help(&args)) {
            return 0;
        } else if (!strcmp(a, "--mount")) {
            bad = tools_args_value(&args, &mount);
        } else if (!strcmp(a, "--mount-opts")) {
            bad = tools_args_value(&args, &mount_opts);
        } else if (!strcmp(a, "--methods")) {
            bad = tools_args_value(&args, &methods);
        } else if (!strcmp(a, "--flash-mbps")) {
            bad = tools_args_u32(&args, 0, UINT32_MAX, &mbps);
        } else if (!strcmp(a, "--runs")) {
            bad = tools_args_u32(&args, 1, MAX_RUNS, &runs);
        } else if (!strcmp(a, "--queue-depth")) {
            bad = tools_args_u32(&args, 1, 256, &qd);
        } else if (!strcmp(a, "--chunk-kib")) {
            bad = tools_args_u32(&args, 4, 1u << 20, &chunk_kib);
            if (!bad && chunk_kib % 4) {
                fprintf(stderr, "sluice bench load: --chunk-kib wants a multiple of 4, not '%s'\n",
                        argv[args.i]);
                bad = 1;
            }
        } else if (!strcmp(a, "--ring-mib")) {
            bad = tools_args_u32(&args, 1, UINT32_MAX, &ring_mib);
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--warm-only")) {
            warm_only = 1;
        } else if (!strcmp(a, "--verify")) {
            verify = 1;
        } else {
            bad = tools_args_operand(&args, &model);
        }
        if (bad)
            return 2;
    }
    if (tools_args_need(&args, model, "MODEL.sluice") < 0)
        return 2;
    int want[M_COUNT];
    for (int m = 0; m < M_COUNT; m++)
        want[m] = 1;
    if (methods && parse_methods(methods, want) < 0) {
        fprintf(stderr, "sluice bench load: unknown method in '%s' (known: uring_direct, "
                "uring_mount, buffered, mmap, pread_pool)\n", methods);
        return 2;
    }
    struct sl_err err = {{0}};
    struct ctx c = {.model = model, .verify = verify};
    c.lo.queue_depth = qd;
    c.lo.chunk_bytes = chunk_kib * 1024;
    c.lo.ring_bytes = (uint64_t)ring_mib << 20;
    if (format_reader_open(model, &c.r, &err) < 0) {
        fprintf(stderr, "sluice bench load: %s\n", err.msg);
        return 1;
    }
    int ret = 1, fresh = 0;
    char why[256] = "", tmpdir[64] = "", mount_note[300] = "";
    pid_t moved = 0;
    int cold = !warm_only && tools_cold_available(why, sizeof why);
    if (!cold && !warm_only)
        fprintf(stderr, "sluice bench load: %s; measuring warm numbers only\n", why);
    struct tools_cgroup cg;
    int have_cg = 0;
    if (cold) {
        if (tools_cgroup_create(model, (uint64_t)mbps * 1000000, &cg, &err) < 0) {
            fprintf(stderr, "sluice bench load: %s\n", err.msg);
            goto out;
        }
        have_cg = 1;
    }
    /* the mount: ours (fresh for every cold run), or the caller's */

    if (want[M_MOUNT] && !mount) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/sluice-bench-mnt.XXXXXX");
        if (!mkdtemp(tmpdir)) {
            tmpdir[0] = 0;
            snprintf(mount_note, sizeof mount_note, "cannot create a mount point: %s",
                     strerror(errno));
        } else {
            c.mount = tmpdir;
            fresh = 1;
        }
    } else if (want[M_MOUNT]) {
        c.mount = mount;
        pid_t d = mount_daemon(mount);
        if (have_cg && d > 0 && tools_cgroup_join(&cg, d, &err) == 0 && (moved = d))
            snprintf(mount_note, sizeof mount_note, "--mount: FUSE daemon %d moved into the "
                     "cgroup", (int)d);
        else if (have_cg)
            snprintf(mount_note, sizeof mount_note, "--mount: the FUSE daemon's pid is unknown "
                     "(no stats.json): its reads are not limited unless it was started in a "
                     "limited cgroup");
    }
    if (mount_note[0])
        fprintf(stderr, "sluice bench load: %s\n", mount_note);
    if (want[M_MOUNT] && !c.mount)
        want[M_MOUNT] = 0;

    static struct series coldr[M_COUNT], warmr[M_COUNT];
    if (cold)
        run_all(&c, want, runs, 1, &cg, fresh, mount_opts, coldr, 0);
    /* warm: one mount for all warm runs (a warm restart keeps its daemon) */
    int warm_mounted = 0;
    if (want[M_MOUNT] && fresh) {
        if (mount_model(model, c.mount, mount_opts, NULL) == 0)
            warm_mounted = 1;
        else
            want[M_MOUNT] = 0;
    }
    run_all(&c, want, runs, 0, NULL, 0, NULL, warmr, 0);
    if (warm_mounted)
        umount_model(c.mount);

    /* min and upper median of each series (0 for one without a run) */
    double cmin[M_COUNT], cmed[M_COUNT], wmin[M_COUNT], wmed[M_COUNT];
    for (int m = 0; m < M_COUNT; m++) {
        struct tools_stats cs, ws;
        if (tools_stats_compute(coldr[m].mb, coldr[m].n, &cs) < 0 ||
            tools_stats_compute(warmr[m].mb, warmr[m].n, &ws) < 0) {
            fprintf(stderr, "sluice bench load: out of memory\n");
            goto out;
        }
        cmin[m] = cs.min;
        cmed[m] = cs.median;
        wmin[m] = ws.min;
        wmed[m] = ws.median;
    }
    uint64_t size = format_reader_file_size(c.r);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddNumberToObject(o, "bytes", (double)size);
    cJSON_AddBoolToObject(o, "cold", cold);
    cJSON_AddNumberToObject(o, "flash_mbps_limit", cold ? mbps : 0);
    cJSON_AddNumberToObject(o, "runs", runs);
    cJSON_AddNumberToObject(o, "raw_mbps", cmed[M_RAW]);
    cJSON_AddNumberToObject(o, "raw_mbps_min", cmin[M_RAW]);
    cJSON_AddNumberToObject(o, "raw_warm_mbps", wmed[M_RAW]);
    cJSON_AddBoolToObject(o, "loader_verifies", verify);
    struct loader_opts eff = c.lo;
    cJSON_AddNumberToObject(o, "queue_depth", eff.queue_depth ? eff.queue_depth : 16);
    cJSON_AddNumberToObject(o, "chunk_kib", eff.chunk_bytes ? eff.chunk_bytes / 1024 : 1024);
    if (mount_note[0])
        cJSON_AddStringToObject(o, "mount_note", mount_note);
    cJSON *arr = cJSON_AddArrayToObject(o, "results");
    for (int m = 1; m < M_COUNT; m++) {
        if (!want[m] && !coldr[m].note[0])
            continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "method", names[m]);
        cJSON_AddNumberToObject(e, "runs_ok", coldr[m].n);
        cJSON_AddNumberToObject(e, "mbps_min", cmin[m]);
        cJSON_AddNumberToObject(e, "mbps_median", cmed[m]);
        cJSON_AddNumberToObject(e, "ratio_to_raw", cmed[M_RAW] > 0 ? cmed[m] / cmed[M_RAW] : 0);
        cJSON_AddNumberToObject(e, "peak_rss_mb", coldr[m].rss);
        cJSON_AddNumberToObject(e, "warm_mbps_min", wmin[m]);
        cJSON_AddNumberToObject(e, "warm_mbps_median", wmed[m]);
        cJSON_AddNumberToObject(e, "warm_ratio_to_raw",
                                wmed[M_RAW] > 0 ? wmed[m] / wmed[M_RAW] : 0);
        cJSON_AddNumberToObject(e, "warm_peak_rss_mb", warmr[m].rss);
        if (m == M_URING || m == M_MOUNT || m == M_PREAD) {
            struct series *sr = coldr[m].n ? &coldr[m] : &warmr[m];
            cJSON_AddNumberToObject(e, "ring_mb", sr->ring_mb);
            cJSON_AddNumberToObject(e, "peak_ring_mb", sr->peak_ring_mb);
            cJSON_AddBoolToObject(e, "direct", sr->direct);
            cJSON_AddBoolToObject(e, "registered", sr->fixed);
        }
        if (coldr[m].note[0])
            cJSON_AddStringToObject(e, "note", coldr[m].note);
        if (warmr[m].note[0])
            cJSON_AddStringToObject(e, "warm_note", warmr[m].note);
        cJSON_AddItemToArray(arr, e);
    }
    if (json) {
        char *s = cJSON_Print(o);
        printf("%s\n", s);
        free(s);
    } else {
        printf("%s: %.1f MB; ", model, (double)size / 1e6);
        if (cold)
            printf("cold at a %u MB/s read limit, %u runs each (MiB = 2^20 bytes, MB = 10^6)\n",
                   mbps, runs);
        else
            printf("warm only, %u runs each\n", runs);
        printf("%-13s %9s %9s %7s %8s %9s %9s %7s %9s\n", "method", "MB/s min", "MB/s med",
               "vs raw", "RSS MiB", "ring MiB", "warm med", "vs raw", "warm RSS");
        for (int m = 0; m < M_COUNT; m++) {
            if (!want[m] && !coldr[m].note[0])
                continue;
            char ring[32] = "-";
            if (m == M_URING || m == M_MOUNT || m == M_PREAD) {
                struct series *sr = coldr[m].n ? &coldr[m] : &warmr[m];
                snprintf(ring, sizeof ring, "%.0f/%.0f", sr->peak_ring_mb, sr->ring_mb);
            }
            printf("%-13s %9.1f %9.1f %6.3fx %8.1f %9s %9.1f %6.3fx %9.1f\n", names[m], cmin[m],
                   cmed[m], cmed[M_RAW] > 0 ? cmed[m] / cmed[M_RAW] : 0, coldr[m].rss, ring,
                   wmed[m], wmed[M_RAW] > 0 ? wmed[m] / wmed[M_RAW] : 0, warmr[m].rss);
        }
        for (int m = 0; m < M_COUNT; m++) {
            if (coldr[m].note[0])
                printf("note: %s (cold): %s\n", names[m], coldr[m].note);
            if (warmr[m].note[0])
                printf("note: %s (warm): %s\n", names[m], warmr[m].note);
        }
        if (!cold)
            printf("note: no cold numbers: %s\n", warm_only ? "--warm-only" : why);
    }
    cJSON_Delete(o);
    ret = 0;
out:
    if (moved)
        tools_cgroup_leave(&cg, moved, &err);
    if (tmpdir[0])
        rmdir(tmpdir);
    if (have_cg)
        tools_cgroup_destroy(&cg);
    format_reader_close(c.r);
    return ret;
}
