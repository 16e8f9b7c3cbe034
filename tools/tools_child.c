/* tools_child.c: see tools_child.h.
 *
 * Three pipes, all close-on-exec:
 *   go      parent -> child: one byte once the child sits in its cgroup, so
 *           that not one read of the contender escapes the limit; the parent
 *           keeps its read end open until it has written (no SIGPIPE if the
 *           child is gone);
 *   out     child's stdout -> parent (capture only);
 *   report  child -> parent: struct child_report when redirecting or exec
 *           fails; end of file without a report means the exec happened (or
 *           fn started). */
#include "tools_child.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum child_stage { STAGE_REDIRECT = 1, STAGE_EXEC };

struct child_report {
    int stage; /* enum child_stage */
    int errnum;
};

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* Points `target` at /dev/null (O_WRONLY); 0 or -errno. */
static int to_devnull(int target)
{
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int ret = dup2(fd, target) < 0 ? -errno : 0;
    close(fd);
    return ret;
}

/* The exec'ed child's environment: the parent's, less any SLUICE_EXEC_NS,
 * plus SLUICE_EXEC_NS=<20 digits> that the child fills in just before execve
 * (CLOCK_MONOTONIC ns, as sl_now_ns): `sluice` counts its time to first token
 * from there, so that the exec and the dynamic loader count too. */
#define EXEC_NS_KEY "SLUICE_EXEC_NS="
#define EXEC_NS_DIGITS 20

struct exec_env {
    char **envp;
    char *stamp; /* the entry "SLUICE_EXEC_NS=000..." */
};

static int exec_env_make(struct exec_env *x)
{
    size_t n = 0;
    while (environ && environ[n])
        n++;
    x->envp = malloc((n + 2) * sizeof *x->envp);
    x->stamp = malloc(sizeof EXEC_NS_KEY + EXEC_NS_DIGITS);
    if (!x->envp || !x->stamp) {
        free(x->envp);
        free(x->stamp);
        x->envp = NULL;
        x->stamp = NULL;
        return -ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], EXEC_NS_KEY, sizeof EXEC_NS_KEY - 1))
            x->envp[k++] = environ[i];
    memcpy(x->stamp, EXEC_NS_KEY, sizeof EXEC_NS_KEY - 1);
    memset(x->stamp + sizeof EXEC_NS_KEY - 1, '0', EXEC_NS_DIGITS);
    x->stamp[sizeof EXEC_NS_KEY - 1 + EXEC_NS_DIGITS] = 0;
    x->envp[k++] = x->stamp;
    x->envp[k] = NULL;
    return 0;
}

static void exec_env_free(struct exec_env *x)
{
    free(x->envp);
    free(x->stamp);
    x->envp = NULL;
    x->stamp = NULL;
}

/* Async-signal-safe: writes the clock into the stamp's digits. */
static void exec_env_stamp(struct exec_env *x)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t v = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    char *d = x->stamp + sizeof EXEC_NS_KEY - 1;
    for (int i = EXEC_NS_DIGITS - 1; i >= 0; i--, v /= 10)
        d[i] = (char)('0' + v % 10);
}

/* The child's side: only async-signal-safe calls until fn or the exec (the
 * parent may have threads). Never returns. */
static void child_main(const struct tools_child_opts *o, struct exec_env *env, int go[2],
                       int out[2], int rep[2])
{
    /* the parent's ends: holding go's write end would keep the read below
     * from ever seeing the parent give up */
    close_fd(&go[1]);
    close_fd(&out[0]);
    close_fd(&rep[0]);
    int go_rd = go[0], out_wr = out[1], rep_wr = rep[1];
    struct child_report rep_msg = {STAGE_REDIRECT, 0};
    char go_byte;
    ssize_t k;
    do
        k = read(go_rd, &go_byte, 1);
    while (k < 0 && errno == EINTR);
    if (k != 1)
        _exit(127); /* the parent gave up on us before the start */
    int ret = 0;
    if (o->capture)
        ret = dup2(out_wr, STDOUT_FILENO) < 0 ? -errno : 0;
    else if (o->null_stdout)
        ret = to_devnull(STDOUT_FILENO);
    if (ret == 0 && o->null_stderr)
        ret = to_devnull(STDERR_FILENO);
    if (ret < 0) {
        rep_msg.errnum = -ret;
        goto report;
    }
    if (o->path) {
        exec_env_stamp(env);
        execve(o->path, (char *const *)o->argv, env->envp);
        rep_msg.stage = STAGE_EXEC;
        rep_msg.errnum = errno;
        goto report;
    }
    close(go_rd);
    if (out_wr >= 0)
        close(out_wr);
    close(rep_wr);
    _exit(o->fn(o->arg) & 0xff);
report:
    /* a short write leaves the parent with end of file and exit status 127 */
    (void)!write(rep_wr, &rep_msg, sizeof rep_msg);
    _exit(127);
}

/* Reads fd to its end into a malloc'ed, NUL-terminated buffer; 0 or -errno. */
static int read_to_end(int fd, char **out, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    if (!b)
        return -ENOMEM;
    for (;;) {
        if (cap - n < 2) {
            char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(b, cap * 2);
            if (!nb) {
                free(b);
                return -ENOMEM;
            }
            b = nb;
            cap *= 2;
        }
        ssize_t k = read(fd, b + n, cap - n - 1);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            int e = errno;
            free(b);
            return -e;
        }
        if (k == 0)
            break;
        n += (size_t)k;
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

/* Reaps pid; 0 or -errno. */
static int reap(pid_t pid, int *status, struct rusage *ru)
{
    while (wait4(pid, status, 0, ru) < 0) {
        if (errno != EINTR)
            return -errno;
    }
    return 0;
}

int tools_child_run(const struct tools_child_opts *o, struct tools_child_result *r,
                    struct sl_err *err)
{
    memset(r, 0, sizeof *r);
    const char *what = o->path ? o->path : "the benchmark child";
    int go[2] = {-1, -1}, out[2] = {-1, -1}, rep[2] = {-1, -1};
    int ret, status;
    pid_t pid;
    struct exec_env env = {NULL, NULL};
    if (!o->path == !o->fn || (o->path && !o->argv)) {
        sl_err_set(err, "tools_child_run: give either a path with argv or a function");
        return -EINVAL;
    }
    if (o->drop_caches && (ret = tools_drop_caches(err)) < 0)
        return ret;
    if (o->path && (ret = exec_env_make(&env)) < 0) {
        sl_err_set(err, "out of memory");
        return ret;
    }
    if (pipe2(go, O_CLOEXEC) < 0 || pipe2(rep, O_CLOEXEC) < 0 ||
        (o->capture && pipe2(out, O_CLOEXEC) < 0)) {
        ret = -errno;
        sl_err_set(err, "cannot create a pipe for %s: %s", what, strerror(-ret));
        goto fail;
    }
    /* whatever stdio holds now would otherwise be written twice, by the child too */
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0) {
        ret = -errno;
        sl_err_set(err, "cannot fork for %s: %s", what, strerror(-ret));
        goto fail;
    }
    if (pid == 0)
        child_main(o, &env, go, out, rep);
    close_fd(&out[1]);
    close_fd(&rep[1]);
    if (o->cg && (ret = tools_cgroup_join(o->cg, pid, err)) < 0) {
        close_fd(&go[1]); /* the child reads end of file and leaves */
        goto fail_child;
    }
    uint64_t t0 = sl_now_ns();
    ssize_t k;
    do
        k = write(go[1], "g", 1);
    while (k < 0 && errno == EINTR);
    if (k != 1) {
        ret = k < 0 ? -errno : -EIO;
        sl_err_set(err, "cannot start %s (pid %d): %s", what, (int)pid, strerror(-ret));
        goto fail_kill;
    }
    close_fd(&go[1]);
    close_fd(&go[0]);
    if (o->capture) {
        if ((ret = read_to_end(out[0], &r->out, &r->out_len)) < 0) {
            sl_err_set(err, "cannot read the output of %s (pid %d): %s", what, (int)pid,
                       strerror(-ret));
            goto fail_kill;
        }
    } else if (!(r->out = calloc(1, 1))) {
        ret = -ENOMEM;
        sl_err_set(err, "out of memory");
        goto fail_kill;
    }
    struct child_report cr;
    do
        k = read(rep[0], &cr, sizeof cr);
    while (k < 0 && errno == EINTR);
    if (k < 0) {
        ret = -errno;
        sl_err_set(err, "cannot read the start report of %s (pid %d): %s", what, (int)pid,
                   strerror(-ret));
        goto fail_kill;
    }
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    if ((ret = reap(pid, &status, &ru)) < 0) {
        sl_err_set(err, "cannot wait for %s (pid %d): %s", what, (int)pid, strerror(-ret));
        goto fail;
    }
    r->wall_ns = sl_now_ns() - t0;
    if (k == (ssize_t)sizeof cr) {
        ret = cr.errnum > 0 ? -cr.errnum : -EIO;
        const char *doing = cr.stage == STAGE_EXEC ? "execute" : "redirect the output of";
        sl_err_set(err, "cannot %s %s: %s", doing, what, strerror(-ret));
        goto fail;
    }
    r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r->term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    r->peak_rss_mb = (double)ru.ru_maxrss / 1024.0; /* ru_maxrss is in KiB on Linux */
    close_fd(&out[0]);
    close_fd(&rep[0]);
    exec_env_free(&env);
    return 0;
fail_kill:
    kill(pid, SIGKILL);
fail_child:
    (void)reap(pid, &status, NULL); /* the first error is the one to report */
fail:
    exec_env_free(&env);
    free(r->out);
    memset(r, 0, sizeof *r);
    close_fd(&go[0]);
    close_fd(&go[1]);
    close_fd(&out[0]);
    close_fd(&out[1]);
    close_fd(&rep[0]);
    close_fd(&rep[1]);
    return ret;
}

void tools_child_result_fini(struct tools_child_result *r)
{
    free(r->out);
    r->out = NULL;
    r->out_len = 0;
}
