/* fs_cli.h: the sluice binary as the mount tests (test_fs, test_fs_gguf)
 * drive it: every run under a timeout with its stderr kept in a file, the
 * messages checked from there, mounts that fail the test when they fail. */
#ifndef SLUICE_FS_CLI_H
#define SLUICE_FS_CLI_H

/* Skips the whole test (status 77) unless the sluice binary, /dev/fuse (open
 * to this user, or root) and fusermount3 are there; then makes the scratch
 * directory (returned) with the file every run's stderr goes to. Each run
 * is killed after timeout_s seconds. */
const char *fs_cli_setup(unsigned timeout_s);
/* The binary fs_cli_setup found. */
const char *fs_cli_bin(void);

/* Runs `sluice ARGS` with its stderr to the file; its exit status. */
int fs_cli_run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last run's stderr (malloc'd; NULL if it cannot be read). */
char *fs_cli_said(void);
/* The last run's stderr contains `what`, or the test fails. */
void fs_cli_assert_said(const char *what);
/* `sluice mount [-o opts] container mnt` (mnt made first), or the test
 * fails with the message. opts NULL: none. */
void fs_cli_mount(const char *container, const char *mnt, const char *opts);

#endif
