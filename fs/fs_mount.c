/* fs_mount.c: options, the checks before mounting, mounting (libfuse mounts
 * directly as root and through fusermount3 for other users), the daemon's
 * life, and unmounting. */

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "fs_internal.h"

/* ---- options ------------------------------------------------------------------------------ */

void fs_options_init(struct fs_options *o)
{
    memset(o, 0, sizeof *o);
    o->clone_fd = 1;
    o->max_threads = 64;
    o->max_background = 128;
    o->max_readahead = 4u << 20;
    o->max_pages = 256;
    o->keep_cache = 1;
    o->splice = 1;
    o->prefetch = 1;
    o->store_direct = 1;
    o->gguf_qtype = GGUF_GGML_Q8_0;
    o->gguf_cache = 64ull << 20;
    o->gguf_warm = 1;
}

/* A byte count with an optional K, M or G suffix (powers of 1024). */
static int parse_size(const char *word, const char *val, uint64_t *out, struct sl_err *err)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    unsigned shift = 0;
    if (*end == 'K' || *end == 'k')
        shift = 10, end++;
    else if (*end == 'M' || *end == 'm')
        shift = 20, end++;
    else if (*end == 'G' || *end == 'g')
        shift = 30, end++;
    if (!*val || *val < '0' || *val > '9' || *end || errno || v > (1ull << 40) >> shift) {
        sl_err_set(err, "bad option %s: want a size in bytes up to 1T (suffix K, M or G)", word);
        return -EINVAL;
    }
    *out = (uint64_t)v << shift;
    return 1;
}

static int parse_u32(const char *word, const char *val, uint32_t lo, uint32_t hi, uint32_t *out,
                     struct sl_err *err)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (!*val || *end || errno || v < lo || v > hi) {
        sl_err_set(err, "bad option %s: want a number in %u..%u", word, lo, hi);
        return -EINVAL;
    }
    *out = (uint32_t)v;
    return 1;
}

int fs_options_parse(struct fs_options *o, const char *w, struct sl_err *err)
{
    static const struct {
        const char *name;
        size_t off;
        int value;
    } flags[] = {
        {"nonempty", offsetof(struct fs_options, allow_nonempty), 1},
        {"single", offsetof(struct fs_options, single_thread), 1},
        {"clone_fd", offsetof(struct fs_options, clone_fd), 1},
        {"noclone_fd", offsetof(struct fs_options, clone_fd), 0},
        {"direct_io", offsetof(struct fs_options, direct_io), 1},
        {"nodirect_io", offsetof(struct fs_options, direct_io), 0},
        {"keep_cache", offsetof(struct fs_options, keep_cache), 1},
        {"no_keep_cache", offsetof(struct fs_options, keep_cache), 0},
        {"splice", offsetof(struct fs_options, splice), 1},
        {"nosplice", offsetof(struct fs_options, splice), 0},
        {"pagecache", offsetof(struct fs_options, pagecache), 1},
        {"store_direct", offsetof(struct fs_options, store_direct), 1},
        {"nostore_direct", offsetof(struct fs_options, store_direct), 0},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(w, flags[i].name)) {
            *(int *)((char *)o + flags[i].off) = flags[i].value;
            return 1;
        }
    const char *eq = strchr(w, '=');
    if (!eq)
        return 0;
    size_t k = (size_t)(eq - w);
    const char *v = eq + 1;
    if (k == 14 && !strncmp(w, "max_background", k))
        return parse_u32(w, v, 1, 65535, &o->max_background, err);
    if (k == 13 && !strncmp(w, "max_readahead", k))
        return parse_u32(w, v, 0, 1u << 30, &o->max_readahead, err);
    if (k == 9 && !strncmp(w, "max_pages", k))
        return parse_u32(w, v, 1, 256, &o->max_pages, err);
    if (k == 11 && !strncmp(w, "max_threads", k))
        return parse_u32(w, v, 1, 1024, &o->max_threads, err);
    if (k == 8 && !strncmp(w, "cache_mb", k))
        return parse_u32(w, v, 1, 1u << 20, &o->cache_mb, err);
    if (k == 8 && !strncmp(w, "prefetch", k))
        return parse_u32(w, v, 0, 64, &o->prefetch, err);
    if (k == 9 && !strncmp(w, "gguf_warm", k))
        return parse_u32(w, v, 0, 8, &o->gguf_warm, err);
    if (k == 10 && !strncmp(w, "gguf_cache", k))
        return parse_size(w, v, &o->gguf_cache, err);
    if (k == 4 && !strncmp(w, "gguf", k)) {
        static const char *const names[] = {"q8_0", "f16", "f32"};
        static const uint32_t types[] = {GGUF_GGML_Q8_0, GGUF_GGML_F16, GGUF_GGML_F32};
        for (int i = 0; i < 3; i++)
            if (!strcmp(v, names[i])) {
                o->gguf_qtype = types[i];
                return 1;
            }
        sl_err_set(err, "bad option %s: want gguf=q8_0, gguf=f16 or gguf=f32", w);
        return -EINVAL;
    }
    if (k == 6 && !strncmp(w, "cgroup", k)) {
        o->cgroup = v;
        return 1;
    }
    if (k == 3 && !strncmp(w, "log", k)) {
        o->log_path = v;
        return 1;
    }
    return 0;
}

/* ---- logging ------------------------------------------------------------------------------- */

void fs_log(struct fs_state *s, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    syslog(LOG_ERR, "%s", msg);
    if (s->opts.foreground)
        fprintf(stderr, "sluice mount: %s\n", msg);
    if (s->log_fd >= 0) {
        char line[1200];
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02dZ sluice[%d]: %s\n",
                         tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                         tm.tm_sec, (int)getpid(), msg);
        if (n > 0 && write(s->log_fd, line, (size_t)n) < 0) {
            /* nowhere left to say it */
        }
    }
}

/* ---- the mount table ---------------------------------------------------------------------- */

/* Undoes the octal escapes of /proc/self/mountinfo ("\040" for a space). */
static void unescape(char *p)
{
    char *q = p;
    while (*p) {
        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' &&
            p[3] >= '0' && p[3] <= '7') {
            *q++ = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0'));
            p += 4;
        } else {
            *q++ = *p++;
        }
    }
    *q = 0;
}

/* 1 if `path` is a mount point (the type of the topmost mount in fstype), 0 if
 * not. */
static int find_mount(const char *path, char *fstype, size_t n)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f)
        return 0;
    char line[8192];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        char mp[4096], type[256];
        /* id parent maj:min root mountpoint options [optional...] - fstype source ... */
        if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1)
            continue;
        unescape(mp);
        if (strcmp(mp, path))
            continue;
        const char *dash = strstr(line, " - ");
        if (!dash || sscanf(dash + 3, "%255s", type) != 1)
            continue;
        found = 1;
        snprintf(fstype, n, "%s", type);
    }
    fclose(f);
    return found;
}

static int check_mountpoint(const struct fs_options *o, char *real, struct sl_err *err)
{
    struct stat st;
    if (stat(o->mountpoint, &st) < 0) {
        int e = errno;
        if (e == ENOTCONN || e == ECONNABORTED)
            sl_err_set(err, "mount point %s is a dead FUSE mount (its daemon is gone): "
                            "run `sluice umount %s` first", o->mountpoint, o->mountpoint);
        else
            sl_err_set(err, "mount point %s: %s", o->mountpoint,
                       e == ENOENT ? "no such directory" : strerror(e));
        return -e;
    }
    if (!S_ISDIR(st.st_mode)) {
        sl_err_set(err, "mount point %s is not a directory", o->mountpoint);
        return -ENOTDIR;
    }
    if (!realpath(o->mountpoint, real)) {
        int e = errno;
        sl_err_set(err, "mount point %s: %s", o->mountpoint, strerror(e));
        return -e;
    }
    char type[256];
    if (find_mount(real, type, sizeof type)) {
        sl_err_set(err, "%s is already a mount point (%s)%s", real, type,
                   !strcmp(type, "fuse.sluice") ? ": unmount it with `sluice umount` first" : "");
        return -EBUSY;
    }
    if (!o->allow_nonempty) {
        DIR *d = opendir(real);
        if (!d) {
            int e = errno;
            sl_err_set(err, "mount point %s: %s", real, strerror(e));
            return -e;
        }
        struct dirent *de;
        int nonempty = 0;
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
                nonempty = 1;
        closedir(d);
        if (nonempty) {
            sl_err_set(err, "mount point %s is not empty (-o nonempty mounts over it)", real);
            return -ENOTEMPTY;
        }
    }
    if (stat("/dev/fuse", &st) < 0 || !S_ISCHR(st.st_mode)) {
        sl_err_set(err, "/dev/fuse is missing: load the fuse module (modprobe fuse) or give the "
                        "container the device");
        return -ENODEV;
    }
    return 0;
}

/* The kernel takes FUSE's max_readahead only as a cap on the mount's backing
 * device's window (128 KiB by default), so a larger window is set where the
 * mount's bdi exposes it (/sys/class/bdi/MAJ:MIN/read_ahead_kb; root). Memory
 * maps (llama.cpp's MAP_POPULATE of model.gguf) fault in read-around windows
 * of that size, one window at a time: 128 KiB windows made model.gguf's
 * sequential population several times slower than 4 MiB ones. Best effort. */
static void set_bdi_readahead(const char *mnt, uint32_t bytes)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f || bytes <= (128u << 10)) {
        if (f)
            fclose(f);
        return;
    }
    char line[8192], dev[64] = "";
    while (fgets(line, sizeof line, f)) {
        char mp[4096], d[64];
        if (sscanf(line, "%*s %*s %63s %*s %4095s", d, mp) != 2)
            continue;
        unescape(mp);
        if (!strcmp(mp, mnt))
            snprintf(dev, sizeof dev, "%s", d);
    }
    fclose(f);
    if (!dev[0])
        return;
    char p[128];
    snprintf(p, sizeof p, "/sys/class/bdi/%s/read_ahead_kb", dev);
    int fd = open(p, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char v[32];
    int n = snprintf(v, sizeof v, "%u\n", bytes >> 10);
    if (write(fd, v, (size_t)n) != n) {
        /* not allowed here: the 128 KiB window stays */
    }
    close(fd);
}

/* ---- fusermount3 ------------------------------------------------------------------------- */

/* fusermount3 -u [-z] MNT; its own message goes to stderr. */
static int run_fusermount_unmount(const char *mnt, int lazy)
{
    pid_t c = fork();
    if (c < 0)
        return -errno;
    if (c == 0) {
        if (lazy)
            execlp("fusermount3", "fusermount3", "-u", "-z", "--", mnt, (char *)NULL);
        else
            execlp("fusermount3", "fusermount3", "-u", "--", mnt, (char *)NULL);
        _exit(127);
    }
    int st;
    while (waitpid(c, &st, 0) < 0)
        if (errno != EINTR)
            return -errno;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
        return -ENOENT;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -ECANCELED; /* it said why */
}

/* ---- the daemon ------------------------------------------------------------------------------ */

static int join_cgroup(const char *dir, struct sl_err *err)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/cgroup.procs", dir);
    int fd = open(p, O_WRONLY | O_CLOEXEC);
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (fd < 0 || write(fd, pid, (size_t)n) != n) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        sl_err_set(err, "cannot join the cgroup %s: %s", dir, strerror(e));
        return -e;
    }
    close(fd);
    return 0;
}

/* Libfuse splits -o lists at commas: escape them (and backslashes) in paths. */
static void escape_opt(char *dst, size_t n, const char *src)
{
    size_t j = 0;
    for (; *src && j + 2 < n; src++) {
        if (*src == ',' || *src == '\\')
            dst[j++] = '\\';
        dst[j++] = *src;
    }
    dst[j] = 0;
}

/* Starts the loader and the warmers with SIGTERM, SIGINT, SIGHUP and SIGQUIT
 * blocked in them, as libfuse blocks them in its workers: libfuse's handler
 * only sets the session's exit flag, and it is the main thread's wait that the
 * signal must interrupt for the loop to see the flag. A signal the kernel gave
 * to a loader or warmer thread (it does when the main thread blocks signals
 * for a moment, inside pthread_create) set the flag with no one to look at it:
 * the daemon kept serving after SIGTERM until the next request (1 in 60
 * SIGTERMs right after the mount, under load). */
static int start_threads(struct fs_state *s, struct sl_err *err)
{
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT);
    int e = pthread_sigmask(SIG_BLOCK, &set, &old);
    if (e) {
        sl_err_set(err, "cannot block signals: %s", strerror(e));
        return -e;
    }
    int ret = fs_store_start(s->store, err);
    if (ret == 0)
        ret = fs_gguf_start(s, err);
    /* a signal that came meanwhile: to this thread (restoring a mask that
     * was in force cannot fail: the only error is EINVAL for a bad `how`) */
    e = pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e && ret == 0) {
        sl_err_set(err, "cannot restore the signal mask: %s", strerror(e));
        ret = -e;
    }
    return ret;
}

int fs_mount_run(const struct fs_options *o, struct sl_err *err)
{
    struct fs_state *s = calloc(1, sizeof *s);
    if (!s) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    s->opts = *o;
    s->log_fd = -1;
    s->mount_ns = sl_now_ns();
    char mnt[PATH_MAX], esc[2 * PATH_MAX], optbuf[3 * PATH_MAX];
    struct fuse_session *se = NULL;
    struct fuse_loop_config *cfg = NULL;
    int mounted = 0, handlers = 0, ret;

    ret = check_mountpoint(o, mnt, err);
    if (ret < 0)
        goto out;
    if (!realpath(o->container, s->container)) {
        ret = -errno;
        sl_err_set(err, "container %s: %s", o->container,
                   ret == -ENOENT ? "no such file" : strerror(-ret));
        goto out;
    }
    ret = format_reader_open(s->container, &s->r, err); /* validates everything but the data */
    if (ret < 0)
        goto out;
    struct stat cst;
    if (stat(s->container, &cst) == 0)
        s->mtime = cst.st_mtim;
    /* a container the GGUF view cannot express (a future architecture or RoPE
     * layout) is still mounted, without model.gguf; the log says why */
    struct sl_err gerr = {{0}};
    int gret = fs_gguf_create(s, &gerr);
    if (gret == -ENOMEM) {
        ret = gret;
        sl_err_set(err, "%s", gerr.msg);
        goto out;
    }
    if ((ret = fs_tree_build(s, err)) < 0 || (ret = fs_store_create(s, &s->store, err)) < 0)
        goto out;
    if (o->log_path) {
        s->log_fd = open(o->log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (s->log_fd < 0) {
            ret = -errno;
            sl_err_set(err, "log file %s: %s", o->log_path, strerror(errno));
            goto out;
        }
    }
    openlog("sluice", LOG_PID, LOG_DAEMON);
    if (gret < 0)
        fs_log(s, "model.gguf is not served: %s", gerr.msg);

    escape_opt(esc, sizeof esc, s->container);
    snprintf(optbuf, sizeof optbuf, "ro,nosuid,nodev,fsname=sluice:%s,subtype=sluice,max_read=%u%s%s",
             esc, o->max_pages * 4096u, o->fuse_opts ? "," : "", o->fuse_opts ? o->fuse_opts : "");
    char *argv[] = {"sluice", "-o", optbuf, NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, argv);
    se = fuse_session_new(&args, fs_ops_table(), sizeof(struct fuse_lowlevel_ops), s);
    fuse_opt_free_args(&args); /* libfuse may have copied them */
    if (!se) {
        ret = -EINVAL;
        sl_err_set(err, "cannot start a FUSE session with -o %s (an unknown option?)", optbuf);
        goto out;
    }
    if (o->cgroup && (ret = join_cgroup(o->cgroup, err)) < 0)
        goto out;

    /* root mounts directly; libfuse has fusermount3 mount for other users */
    if (fuse_session_mount(se, mnt) != 0) {
        ret = -EPERM;
        sl_err_set(err, "mounting %s on %s failed (see the message above%s)", s->container, mnt,
                   access("/dev/fuse", R_OK | W_OK) ? "; /dev/fuse is not open to this user" : "");
        goto out;
    }
    mounted = 1;
    s->se = se;
    set_bdi_readahead(mnt, o->max_readahead);
    if (fuse_set_signal_handlers(se) != 0) {
        ret = -EIO;
        sl_err_set(err, "cannot install signal handlers");
        goto out;
    }
    handlers = 1;
    /* the shell waits until here: a failed mount is its error */
    if (!o->foreground && fuse_daemonize(0) != 0) {
        ret = -EIO;
        sl_err_set(err, "cannot daemonize");
        goto out;
    }
    if ((ret = start_threads(s, err)) < 0)
        goto out;
    s->mount_ns = sl_now_ns();
    if (o->single_thread) {
        ret = fuse_session_loop(se);
    } else {
        cfg = fuse_loop_cfg_create();
        if (!cfg) {
            ret = -ENOMEM;
            sl_err_set(err, "out of memory");
            goto out;
        }
        fuse_loop_cfg_set_clone_fd(cfg, (unsigned)o->clone_fd);
        fuse_loop_cfg_set_max_threads(cfg, o->max_threads);
        fuse_loop_cfg_set_idle_threads(cfg, o->max_threads);
        ret = fuse_session_loop_mt(se, cfg);
    }
    if (ret < 0) {
        sl_err_set(err, "the FUSE request loop failed: %s", strerror(-ret));
        fs_log(s, "%s", err->msg);
    } else {
        ret = 0;
    }
out:
    /* before the session goes: the warmers push pages through it */
    if (fs_gguf_stop(s) < 0) {
        if (se && handlers)
            fuse_remove_signal_handlers(se);
        if (se && mounted)
            fuse_session_unmount(se);
        return ret; /* the process exits next; a warmer still uses the rest */
    }
    if (se) {
        if (handlers)
            fuse_remove_signal_handlers(se);
        if (mounted)
            fuse_session_unmount(se); /* after a signal; harmless after an unmount */
        fuse_session_destroy(se);
    }
    fuse_loop_cfg_destroy(cfg);
    fs_store_destroy(s->store);
    gguf_view_destroy(s->gguf);
    fs_tree_free(s);
    format_reader_close(s->r);
    if (s->log_fd >= 0)
        close(s->log_fd);
    free(s);
    return ret;
}

/* ---- unmounting ------------------------------------------------------------------------------- */

/* The daemon's pid, from stats.json; 0 if unknown. */
static pid_t daemon_pid(const char *mnt)
{
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/stats.json", mnt);
    FILE *f = fopen(p, "r");
    if (!f)
        return 0;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    const cJSON *pid = cJSON_GetObjectItem(j, "pid");
    pid_t r = cJSON_IsNumber(pid) ? (pid_t)pid->valuedouble : 0;
    cJSON_Delete(j);
    return r;
}

/* 1 if the task whose /proc/.../stat is at path runs (a zombie has exited,
 * a task that is gone too: its stat vanished or cannot be read any more);
 * a stat that cannot be opened for another reason counts as running. */
static int task_runs(const char *path)
{
    char buf[512];
    FILE *f = fopen(path, "r");
    if (!f)
        return errno != ENOENT;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    int failed = n == 0 && ferror(f); /* reaped between the open and the read */
    fclose(f);
    if (failed)
        return 0;
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');
    return !(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
}

int fs_daemon_threads(int pid)
{
    if (pid <= 0 || (kill(pid, 0) < 0 && errno == ESRCH))
        return 0;
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/task", pid);
    DIR *d = opendir(p);
    if (!d) /* gone since the kill (ESRCH now), or /proc cannot tell (no /proc,
               hidepid, EACCES): running, as kill(pid, 0) found it */
        return kill(pid, 0) < 0 && errno == ESRCH ? 0 : 1;
    int live = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno) /* a partial count must not read as gone */
                live = live ? live : 1;
            break;
        }
        if (e->d_name[0] == '.')
            continue;
        char sp[320];
        snprintf(sp, sizeof sp, "/proc/%d/task/%s/stat", pid, e->d_name);
        live += task_runs(sp);
    }
    closedir(d);
    return live;
}

int fs_unmount(const char *mountpoint, int lazy, struct sl_err *err)
{
    char real[PATH_MAX];
    int dead = 0;
    if (!realpath(mountpoint, real)) {
        int e = errno;
        if (e != ENOTCONN && e != ECONNABORTED) {
            sl_err_set(err, "%s: %s", mountpoint, strerror(e));
            return -e;
        }
        /* a dead mount: its path cannot be resolved, only named */
        dead = 1;
        if (mountpoint[0] == '/') {
            snprintf(real, sizeof real, "%s", mountpoint);
        } else {
            char cwd[PATH_MAX];
            if (!getcwd(cwd, sizeof cwd)) {
                sl_err_set(err, "getcwd: %s", strerror(errno));
                return -EINVAL;
            }
            snprintf(real, sizeof real, "%s/%s", cwd, mountpoint);
        }
        size_t l = strlen(real);
        while (l > 1 && real[l - 1] == '/')
            real[--l] = 0;
    }
    char type[256];
    if (!find_mount(real, type, sizeof type)) {
        sl_err_set(err, "%s is not mounted", real);
        return -EINVAL;
    }
    if (strcmp(type, "fuse.sluice")) {
        sl_err_set(err, "%s is not a sluice mount (its type is %s)", real, type);
        return -EINVAL;
    }
    pid_t pid = dead ? 0 : daemon_pid(real);
    int ret;
    if (geteuid() == 0) {
        ret = umount2(real, lazy || dead ? MNT_DETACH : 0) < 0 ? -errno : 0;
        if (ret < 0 && ret != -EBUSY)
            ret = run_fusermount_unmount(real, lazy || dead);
    } else {
        ret = run_fusermount_unmount(real, lazy || dead);
    }
    if (ret == -EBUSY) {
        sl_err_set(err, "%s is busy (files are open in it): close them, or unmount with --lazy",
                   real);
        return ret;
    }
    if (ret < 0) {
        sl_err_set(err, "unmounting %s failed: %s", real,
                   ret == -ENOENT       ? "fusermount3 not found"
                   : ret == -ECANCELED ? "fusermount3 refused (its message is above; files open? "
                                         "use --lazy)"
                                       : strerror(-ret));
        return ret;
    }
    if (lazy || pid <= 0)
        return 0; /* lazy: the daemon serves open files until they are closed */
    /* the whole daemon: its main thread may be a zombie while the others
     * still exit (and hold /dev/fuse and the container open) */
    int live = 0;
    for (int i = 0; i < 1000; i++) {
        if (!(live = fs_daemon_threads((int)pid)))
            return 0;
        usleep(10000);
    }
    if (!(live = fs_daemon_threads((int)pid)))
        return 0;
    sl_err_set(err,
               "%s is unmounted, but its daemon (pid %d) did not exit within 10 s "
               "(%d of its threads still run)",
               real, (int)pid, live);
    return -ETIMEDOUT;
}
