/* test_fs_internal.h: what the two halves of test_fs share: test_fs.c (what
 * a mount serves, and main) and test_fs_life.c (the daemon's life, errors,
 * users, cgroups). */
#ifndef SLUICE_TEST_FS_INTERNAL_H
#define SLUICE_TEST_FS_INTERNAL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* The sluice binary, the scratch directory, the container written there with
 * the format writer (every quantized encoding); set by main. */
extern const char *tf_bin, *tf_dir;
extern char tf_model[PATH_MAX];

/* A shell command under `timeout 60`; its status. */
int tf_run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* `sluice umount MNT`, or the test fails with its message. */
void tf_umount_at(const char *mnt);
/* 1 if a sluice mount is at mnt. */
int tf_is_mounted(const char *mnt);

/* Every file the mount must serve and its exact bytes, from the container. */
struct expect {
    char path[128];
    uint8_t *bytes;
    size_t len;
};

struct expected {
    struct expect *f;
    int n;
};

struct expected tf_expected_of(const char *container);
void tf_expected_free(struct expected *x);

/* test_fs_life.c */
void test_unmount_busy(void **st);
void test_dead_mount(void **st);
void test_sigterm(void **st);
void test_foreground(void **st);
void test_mount_errors(void **st);
void test_nonroot(void **st);
void test_cgroup(void **st);

#endif
