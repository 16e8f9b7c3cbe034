/* test_tools_child.c: the benchmark child runner (tools_child.c):
 * - exec: /bin/true; a shell that prints and exits 3 (output captured, the
 *   status reported, not an error); output larger than the first buffer;
 *   standard error sent to /dev/null; a child killed by a signal;
 * - a function run in the child: its output and exit status;
 * - errors: an exec that fails (-ENOENT, the path in the sentence); a cgroup
 *   that cannot be joined (the child is killed and reaped, nothing left);
 *   options naming neither or both of a program and a function;
 * - every case leaves no child behind (no zombie).
 * With the argument "cgroup" only the real cgroup case runs: a child joins a
 * fresh blkio/io cgroup and sees itself in it (root and a cgroup controller,
 * and a block device under the build directory; exit 77 otherwise). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "tools_child.h"
#include "tools_cold.h"

static void assert_no_child_left(void)
{
    errno = 0;
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
    assert_int_equal(errno, ECHILD);
}

/* Runs argv (argv[0] the program) and returns the result; asserts it ran. */
static void run_ok(const char *const *argv, int null_stderr, struct tools_child_result *r)
{
    struct tools_child_opts o = {
        .path = argv[0], .argv = argv, .capture = 1, .null_stderr = null_stderr};
    struct sl_err err = {{0}};
    int ret = tools_child_run(&o, r, &err);
    if (ret != 0)
        fail_msg("tools_child_run: %d: %s", ret, err.msg);
    assert_no_child_left();
}

static void test_exec(void **state)
{
    (void)state;
    struct tools_child_result r;
    const char *t[] = {"/bin/true", NULL};
    run_ok(t, 0, &r);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.term_signal, 0);
    assert_non_null(r.out);
    assert_int_equal(r.out_len, 0);
    assert_true(r.wall_ns > 0);
    assert_true(r.peak_rss_mb > 0);
    tools_child_result_fini(&r);
    assert_null(r.out);

    /* a non-zero exit is a result, not an error */
    const char *sh[] = {"/bin/sh", "-c", "echo hello; echo noise >&2; exit 3", NULL};
    run_ok(sh, 1, &r);
    assert_int_equal(r.exit_code, 3);
    assert_string_equal(r.out, "hello\n");
    tools_child_result_fini(&r);

    /* more output than the first buffer holds */
    const char *big[] = {"/bin/sh", "-c", "head -c 100000 /dev/zero | tr '\\000' a", NULL};
    run_ok(big, 0, &r);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.out_len, 100000);
    assert_int_equal(strlen(r.out), 100000);
    assert_int_equal(r.out[99999], 'a');
    tools_child_result_fini(&r);

    /* killed by a signal */
    const char *kill9[] = {"/bin/sh", "-c", "kill -9 $$", NULL};
    run_ok(kill9, 0, &r);
    assert_int_equal(r.exit_code, -1);
    assert_int_equal(r.term_signal, SIGKILL);
    tools_child_result_fini(&r);
}

static int child_fn(void *arg)
{
    const char *text = arg;
    return write(STDOUT_FILENO, text, strlen(text)) == (ssize_t)strlen(text) ? 5 : 1;
}

static void test_function(void **state)
{
    (void)state;
    struct tools_child_opts o = {.fn = child_fn, .arg = "from the child", .capture = 1};
    struct tools_child_result r;
    struct sl_err err = {{0}};
    assert_int_equal(tools_child_run(&o, &r, &err), 0);
    assert_no_child_left();
    assert_int_equal(r.exit_code, 5);
    assert_string_equal(r.out, "from the child");
    tools_child_result_fini(&r);
    /* without capture: out is empty, stdout goes to /dev/null */
    o.capture = 0;
    o.null_stdout = 1;
    assert_int_equal(tools_child_run(&o, &r, &err), 0);
    assert_no_child_left();
    assert_int_equal(r.exit_code, 5);
    assert_string_equal(r.out, "");
    tools_child_result_fini(&r);
}

static void test_errors(void **state)
{
    (void)state;
    struct tools_child_result r;
    struct sl_err err = {{0}};
    /* an exec that fails: an error with the path, not an exit status */
    const char *none[] = {"/nonexistent/sluice-test-prog", NULL};
    struct tools_child_opts o = {.path = none[0], .argv = none, .capture = 1};
    assert_int_equal(tools_child_run(&o, &r, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "cannot execute /nonexistent/sluice-test-prog"));
    assert_null(r.out);
    assert_no_child_left();
    /* the same without capture */
    o.capture = 0;
    assert_int_equal(tools_child_run(&o, &r, &err), -ENOENT);
    assert_no_child_left();

    /* a cgroup that cannot be joined: the child never runs */
    struct tools_cgroup cg = {.dir = "/nonexistent/sluice-test-cgroup"};
    const char *t[] = {"/bin/true", NULL};
    struct tools_child_opts oc = {.path = t[0], .argv = t, .cg = &cg, .capture = 1};
    memset(&err, 0, sizeof err);
    assert_int_equal(tools_child_run(&oc, &r, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "cannot move"));
    assert_non_null(strstr(err.msg, "sluice-test-cgroup"));
    assert_null(r.out);
    assert_no_child_left();

    /* neither a program nor a function, or both */
    struct tools_child_opts bad = {.capture = 1};
    assert_int_equal(tools_child_run(&bad, &r, &err), -EINVAL);
    bad.path = t[0];
    bad.argv = t;
    bad.fn = child_fn;
    assert_int_equal(tools_child_run(&bad, &r, &err), -EINVAL);
    assert_no_child_left();
}

/* ---- a real cgroup (root only) ----------------------------------------------- */

static struct tools_cgroup real_cg;

static void test_cgroup(void **state)
{
    (void)state;
    const char *cat[] = {"/bin/cat", "/proc/self/cgroup", NULL};
    struct tools_child_opts o = {.path = cat[0], .argv = cat, .cg = &real_cg, .capture = 1};
    struct tools_child_result r;
    struct sl_err err = {{0}};
    if (tools_child_run(&o, &r, &err) != 0)
        fail_msg("%s", err.msg);
    assert_no_child_left();
    assert_int_equal(r.exit_code, 0);
    /* the group's directory name, e.g. sluice.<pid>.<n>, is on the child's line */
    const char *leaf = strrchr(real_cg.dir, '/') + 1;
    if (!strstr(r.out, leaf))
        fail_msg("the child is not in %s:\n%s", real_cg.dir, r.out);
    tools_child_result_fini(&r);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "cgroup")) {
        char why[256];
        if (!tools_cold_available(why, sizeof why))
            test_skip_all("%s", why);
        struct sl_err err = {{0}};
        /* the disk holding this test binary; no read limit (0) */
        if (tools_cgroup_create("/proc/self/exe", 0, &real_cg, &err) < 0)
            test_skip_all("cannot create a cgroup here: %s", err.msg);
        const struct CMUnitTest tests[] = {cmocka_unit_test(test_cgroup)};
        int ret = cmocka_run_group_tests(tests, NULL, NULL);
        tools_cgroup_destroy(&real_cg);
        return ret;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exec),
        cmocka_unit_test(test_function),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
