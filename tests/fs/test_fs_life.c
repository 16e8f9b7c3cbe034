/* test_fs_life.c: the daemon's life, mount errors, an ordinary user and
 * cgroups, through the sluice binary (part of test_fs; test_fs.c has main):
 * - unmount while a file is open: plain unmount refuses (busy), --lazy
 *   detaches, the open file stays readable, the daemon exits at close;
 * - a killed daemon leaves a dead mount: mount refuses it, umount cleans it;
 *   SIGTERM unmounts; -f serves in the foreground;
 * - mount errors with their messages: missing or non-directory mount point,
 *   non-empty directory, missing or corrupt container, already mounted, bad
 *   option; umount of what is not a sluice mount;
 * - an ordinary user mounts and unmounts (private mount namespace with its
 *   own /dev/fuse node when the system's is root-only);
 * - -o cgroup= puts the daemon into the cgroup. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format.h"
#include "fs.h"
#include "fs_cli.h"
#include "test_fs_internal.h"
#include "testutil.h"

static pid_t daemon_pid(const char *mnt)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/stats.json", mnt);
    char *t = test_read_file(p, NULL);
    assert_non_null(t);
    cJSON *j = cJSON_Parse(t);
    assert_non_null(j);
    pid_t pid = (pid_t)cJSON_GetObjectItem(j, "pid")->valuedouble;
    cJSON_Delete(j);
    free(t);
    return pid;
}

/* 1 once every thread of pid has exited within about ms (fs_daemon_threads:
 * an exited daemon may wait ~2 s for its reaper, PID 1 of some containers
 * reaps orphans only that often; and its main thread alone turns zombie while
 * the others, holding /dev/fuse, still exit); else 0, with its state on
 * stderr. */
static int wait_gone(pid_t pid, int ms)
{
    for (int i = 0; i < ms / 10; i++) {
        if (fs_daemon_threads(pid) == 0)
            return 1;
        usleep(10000);
    }
    if (fs_daemon_threads(pid) == 0)
        return 1;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "grep -E '^(State|SigBlk|SigCgt)' /proc/%d/status >&2", (int)pid);
    fprintf(stderr, "the daemon (pid %d) is still running after %d ms:\n", (int)pid, ms);
    test_system("%s", cmd);
    return 0;
}

/* ---- unmounting and the daemon's life ------------------------------------------------------ */

void test_unmount_busy(void **st)
{
    (void)st;
    char mnt[PATH_MAX], p[PATH_MAX + 64];
    snprintf(mnt, sizeof mnt, "%s/m7", tf_dir);
    fs_cli_mount(tf_model, mnt, NULL);
    pid_t pid = daemon_pid(mnt);
    snprintf(p, sizeof p, "%s/layer.001/slice.bin", mnt);
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    /* a plain unmount refuses while the file is open, and says why */
    assert_int_not_equal(fs_cli_run("umount '%s'", mnt), 0);
    fs_cli_assert_said("busy");
    assert_true(tf_is_mounted(mnt));
    /* --lazy detaches at once; the open file still reads the right bytes */
    assert_int_equal(fs_cli_run("umount --lazy '%s'", mnt), 0);
    assert_false(tf_is_mounted(mnt));
    struct expected x = tf_expected_of(tf_model);
    const struct expect *e = NULL;
    for (int i = 0; i < x.n; i++)
        if (!strcmp(x.f[i].path, "layer.001/slice.bin"))
            e = &x.f[i];
    uint8_t *buf = malloc(e->len);
    assert_int_equal(pread(fd, buf, e->len, 0), (ssize_t)e->len);
    assert_memory_equal(buf, e->bytes, e->len);
    free(buf);
    tf_expected_free(&x);
    assert_true(fs_daemon_threads(pid) > 0); /* still serving the open file */
    close(fd);
    assert_true(wait_gone(pid, 5000)); /* and gone once it is closed */
}

void test_dead_mount(void **st)
{
    (void)st;
    char mnt[PATH_MAX];
    snprintf(mnt, sizeof mnt, "%s/m8", tf_dir);
    fs_cli_mount(tf_model, mnt, NULL);
    pid_t pid = daemon_pid(mnt);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_true(wait_gone(pid, 5000));
    struct stat s;
    assert_int_equal(stat(mnt, &s), -1);
    assert_int_equal(errno, ENOTCONN);
    assert_int_not_equal(fs_cli_run("mount '%s' '%s'", tf_model, mnt), 0);
    fs_cli_assert_said("dead FUSE mount");
    tf_umount_at(mnt); /* cleans it up */
    assert_false(tf_is_mounted(mnt));
    fs_cli_mount(tf_model, mnt, NULL);
    tf_umount_at(mnt);
}

void test_sigterm(void **st)
{
    (void)st;
    char mnt[PATH_MAX];
    snprintf(mnt, sizeof mnt, "%s/m9", tf_dir);
    /* a few times, the signal right after the first request: it once hit
     * the daemon while its main thread was starting the loop (1 in 60 under
     * load), and the daemon kept serving */
    for (int i = 0; i < 10; i++) {
        fs_cli_mount(tf_model, mnt, NULL);
        pid_t pid = daemon_pid(mnt);
        assert_int_equal(kill(pid, SIGTERM), 0);
        assert_true(wait_gone(pid, 5000));
        assert_false(tf_is_mounted(mnt));
    }
}

void test_foreground(void **st)
{
    (void)st;
    char mnt[PATH_MAX], p[PATH_MAX + 64], status[PATH_MAX];
    snprintf(mnt, sizeof mnt, "%s/m10", tf_dir);
    snprintf(status, sizeof status, "%s/fg.status", tf_dir);
    mkdir(mnt, 0755);
    unlink(status);
    /* -f: the command itself serves; it returns when unmounted */
    assert_int_equal(tf_run("sh -c \"'%s' mount -f '%s' '%s'; echo \\$? > '%s'\" &", tf_bin,
                            tf_model, mnt, status),
                     0);
    int up = 0;
    for (int i = 0; i < 500 && !up; i++) {
        up = tf_is_mounted(mnt);
        if (!up)
            usleep(10000);
    }
    assert_true(up);
    snprintf(p, sizeof p, "%s/layer.002/slice.bin", mnt);
    size_t len;
    uint8_t *b = test_read_file(p, &len);
    assert_non_null(b);
    free(b);
    tf_umount_at(mnt);
    char *s = NULL;
    for (int i = 0; i < 500 && !(s = test_read_file(status, NULL)); i++)
        usleep(10000);
    assert_non_null(s);
    assert_int_equal(atoi(s), 0);
    free(s);
}

/* ---- errors -------------------------------------------------------------------------------- */

void test_mount_errors(void **st)
{
    (void)st;
    char mnt[PATH_MAX], file[PATH_MAX + 64];
    snprintf(mnt, sizeof mnt, "%s/missing-dir", tf_dir);
    assert_int_equal(fs_cli_run("mount '%s' '%s'", tf_model, mnt), 1);
    fs_cli_assert_said("no such directory");
    snprintf(file, sizeof file, "%s/plain-file", tf_dir);
    FILE *f = fopen(file, "w");
    fclose(f);
    assert_int_equal(fs_cli_run("mount '%s' '%s'", tf_model, file), 1);
    fs_cli_assert_said("is not a directory");
    snprintf(mnt, sizeof mnt, "%s/nonempty", tf_dir);
    mkdir(mnt, 0755);
    snprintf(file, sizeof file, "%s/x", mnt);
    f = fopen(file, "w");
    fclose(f);
    assert_int_equal(fs_cli_run("mount '%s' '%s'", tf_model, mnt), 1);
    fs_cli_assert_said("is not empty");
    /* ... unless asked */
    fs_cli_mount(tf_model, mnt, "nonempty");
    tf_umount_at(mnt);
    snprintf(mnt, sizeof mnt, "%s/m11", tf_dir);
    mkdir(mnt, 0755);
    assert_int_equal(fs_cli_run("mount /nonexistent.sluice '%s'", mnt), 1);
    fs_cli_assert_said("no such file");
    snprintf(file, sizeof file, "%s/garbage.sluice", tf_dir);
    f = fopen(file, "w");
    fputs("not a container, not even close to one; a few bytes of text", f);
    fclose(f);
    assert_int_equal(fs_cli_run("mount '%s' '%s'", file, mnt), 1);
    fs_cli_assert_said(file);
    /* a truncated container */
    snprintf(file, sizeof file, "%s/short.sluice", tf_dir);
    assert_int_equal(tf_run("head -c 100000 '%s' > '%s'", tf_model, file), 0);
    assert_int_equal(fs_cli_run("mount '%s' '%s'", file, mnt), 1);
    fs_cli_assert_said(file);
    assert_int_equal(fs_cli_run("mount -o max_pages=1000 '%s' '%s'", tf_model, mnt), 2);
    fs_cli_assert_said("max_pages");
    fs_cli_mount(tf_model, mnt, NULL);
    assert_int_equal(fs_cli_run("mount '%s' '%s'", tf_model, mnt), 1);
    fs_cli_assert_said("already a mount point");
    tf_umount_at(mnt);
    assert_false(tf_is_mounted(mnt));
    assert_int_equal(fs_cli_run("umount '%s'", mnt), 1);
    fs_cli_assert_said("not mounted");
    assert_int_equal(fs_cli_run("umount /proc"), 1);
    fs_cli_assert_said("not a sluice mount");
    assert_int_equal(fs_cli_run("umount '%s/nowhere'", tf_dir), 1);
    assert_int_equal(fs_cli_run("mount '%s'", tf_model), 2);
}

/* ---- an ordinary user ---------------------------------------------------------------------- */

/* As root: a private mount namespace whose /dev/fuse is a private node open
 * to everyone (the system's may be root-only), then nobody mounts, reads
 * and unmounts there through fusermount3. Nothing outside changes. */
void test_nonroot(void **st)
{
    (void)st;
    if (geteuid() != 0 ||
        test_system("command -v setpriv >/dev/null && command -v unshare >/dev/null")) {
        fprintf(stderr, "note: needs root, setpriv and unshare: the ordinary-user mount is "
                        "not tested here\n");
        skip();
    }
    char base[] = "/tmp/sluice-user.XXXXXX";
    assert_non_null(mkdtemp(base));
    chmod(base, 0755);
    char script[PATH_MAX + 64];
    snprintf(script, sizeof script, "%s/run.sh", base);
    FILE *f = fopen(script, "w");
    assert_non_null(f);
    fprintf(f,
            "set -e\n"
            "if [ ! -w /dev/fuse ] || [ \"$(stat -c %%a /dev/fuse)\" != 666 ]; then\n"
            "  mknod -m 0666 %s/fuse c 10 229 || exit 77\n"
            "  mount --bind %s/fuse /dev/fuse || exit 77\n"
            "fi\n"
            "as='setpriv --reuid=nobody --regid=nogroup --clear-groups'\n"
            "$as '%s' mount %s/m.sluice %s/mnt\n"
            "$as cmp %s/mnt/layer.001/slice.bin %s/slice1\n"
            "grep ' %s/mnt .* - fuse.sluice .*user_id=65534' /proc/self/mountinfo >/dev/null\n"
            "$as '%s' umount %s/mnt\n"
            "! grep -q ' %s/mnt ' /proc/self/mountinfo\n",
            base, base, tf_bin, base, base, base, base, base, tf_bin, base, base);
    fclose(f);
    /* layer 1's bytes, for cmp */
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open(tf_model, &r, &err), 0);
    const struct format_slice_info *si = format_reader_slice(r, 2);
    assert_int_equal(tf_run("cp '%s' %s/m.sluice && mkdir %s/mnt && "
                            "dd if='%s' of=%s/slice1 bs=4096 skip=%llu count=%llu status=none && "
                            "chown -R nobody %s",
                            tf_model, base, base, tf_model, base,
                            (unsigned long long)(si->offset / 4096),
                            (unsigned long long)(si->length / 4096), base),
                     0);
    format_reader_close(r);
    int ret = tf_run("unshare -m --propagation private sh %s", script);
    tf_run("rm -rf '%s'", base);
    if (ret == 77) {
        fprintf(stderr, "note: cannot make a private /dev/fuse node here: skipped\n");
        skip();
    }
    assert_int_equal(ret, 0);
}

void test_cgroup(void **st)
{
    (void)st;
    if (geteuid() != 0 || access("/sys/fs/cgroup/blkio", W_OK) != 0) {
        fprintf(stderr, "note: needs root and the blkio cgroup (v1)\n");
        skip();
    }
    char group[PATH_MAX], mnt[PATH_MAX], opts[PATH_MAX + 16];
    snprintf(group, sizeof group, "/sys/fs/cgroup/blkio/sluice-test-fs.%d", (int)getpid());
    assert_int_equal(mkdir(group, 0755), 0);
    snprintf(mnt, sizeof mnt, "%s/m12", tf_dir);
    snprintf(opts, sizeof opts, "cgroup=%s", group);
    fs_cli_mount(tf_model, mnt, opts);
    pid_t pid = daemon_pid(mnt);
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "grep -qx '%d' %s/cgroup.procs", (int)pid, group);
    int in = test_system("%s", cmd);
    tf_umount_at(mnt);
    rmdir(group);
    assert_int_equal(in, 0);
    snprintf(opts, sizeof opts, "cgroup=%s/none", tf_dir);
    assert_int_equal(fs_cli_run("mount -o '%s' '%s' '%s'", opts, tf_model, mnt), 1);
    fs_cli_assert_said("cannot join the cgroup");
    assert_false(tf_is_mounted(mnt));
}
