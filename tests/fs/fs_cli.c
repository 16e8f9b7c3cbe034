/* fs_cli.c: the sluice binary as the mount tests drive it (fs_cli.h). */
#include "fs_cli.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static const char *bin;
static char errfile[PATH_MAX];
static unsigned timeout;

const char *fs_cli_setup(unsigned timeout_s)
{
    bin = test_sluice_bin();
    if (!bin)
        test_skip_all("the sluice binary is not available ($SLUICE_BIN)");
    if (access("/dev/fuse", F_OK) != 0)
        test_skip_all("/dev/fuse is not available here");
    if (access("/dev/fuse", R_OK | W_OK) != 0 && geteuid() != 0)
        test_skip_all("/dev/fuse is not open to this user");
    if (test_system("command -v fusermount3 >/dev/null") != 0)
        test_skip_all("fusermount3 is not installed");
    timeout = timeout_s;
    const char *dir = test_tmpdir();
    snprintf(errfile, sizeof errfile, "%s/stderr", dir);
    return dir;
}

const char *fs_cli_bin(void)
{
    return bin;
}

int fs_cli_run(const char *fmt, ...)
{
    char args[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof args)
        fail_msg("sluice arguments of %d bytes do not fit in %zu", n, sizeof args);
    return test_system("timeout %u '%s' %s 2>'%s'", timeout, bin, args, errfile);
}

char *fs_cli_said(void)
{
    return test_read_file(errfile, NULL);
}

void fs_cli_assert_said(const char *what)
{
    char *e = fs_cli_said();
    assert_non_null(e);
    if (!strstr(e, what))
        fail_msg("expected \"%s\" in: %s", what, e);
    free(e);
}

void fs_cli_mount(const char *container, const char *mnt, const char *opts)
{
    mkdir(mnt, 0755);
    if (fs_cli_run("mount %s%s%s '%s' '%s'", opts ? "-o '" : "", opts ? opts : "", opts ? "'" : "",
                  container, mnt) != 0) {
        char *e = fs_cli_said();
        fail_msg("mount %s on %s (-o %s) failed: %s", container, mnt, opts ? opts : "-",
                 e ? e : "?");
    }
}
