/* test_fs_daemon.c: fs_daemon_threads, what `sluice umount` waits for before
 * it returns: a process is gone only once every thread of it has exited. A
 * daemon's main thread turns zombie while its other threads still exit (and
 * hold /dev/fuse and the container open); a check of the main thread alone
 * (what fs_unmount did before) calls such a process gone. Here a child's main
 * thread exits (pthread_exit) while a second thread waits on a pipe. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fs.h"
#include "testutil.h"

/* The state letter of /proc/PID/stat, or 0 if it cannot be read. */
static char proc_state(pid_t pid)
{
    char p[64], buf[512];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' ? rp[2] : 0;
}

static void *wait_pipe(void *arg)
{
    char c;
    while (read(*(int *)arg, &c, 1) < 0 && errno == EINTR) {
    }
    _exit(0); /* no atexit handlers in the child (the sanitizers' leak check) */
}

static void test_this_process(void **state)
{
    (void)state;
    assert_true(fs_daemon_threads((int)getpid()) >= 1);
    assert_int_equal(fs_daemon_threads(0), 0);
    assert_int_equal(fs_daemon_threads(-1), 0);
}

static void test_zombie_main_thread(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[1]);
        pthread_t t;
        if (pthread_create(&t, NULL, wait_pipe, &fds[0]))
            _exit(3);
        pthread_exit(NULL); /* the main thread only */
    }
    close(fds[0]);
    /* the main thread is a zombie, the other thread waits on the pipe */
    int zombie = 0;
    for (int i = 0; i < 1000 && !zombie; i++) {
        zombie = proc_state(pid) == 'Z';
        if (!zombie)
            usleep(5000);
    }
    assert_true(zombie);
    assert_int_equal(fs_daemon_threads((int)pid), 1);
    usleep(50000); /* and it stays so */
    assert_int_equal(fs_daemon_threads((int)pid), 1);
    /* the last thread exits: the whole process is a zombie (not reaped,
     * this test is its parent), which counts as exited */
    assert_int_equal(write(fds[1], "x", 1), 1);
    close(fds[1]);
    int n = -1;
    for (int i = 0; i < 1000 && n; i++) {
        n = fs_daemon_threads((int)pid);
        if (n)
            usleep(5000);
    }
    assert_int_equal(n, 0);
    assert_int_equal(kill(pid, 0), 0); /* still there, unreaped */
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_this_process),
        cmocka_unit_test(test_zombie_main_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
