/* testutil.h: helpers shared by the cmocka tests.
 *
 * - skips: tests that cannot run here exit 77 (ctest SKIP_RETURN_CODE) with a
 *   message on stderr, never a pass (STYLE.md 17);
 * - ../shared: found through $SLUICE_SHARED (set by ctest), else ../shared
 *   relative to the source tree;
 * - randomness: one seed per test binary, printed, overridable with
 *   $SLUICE_TEST_SEED so a failure can be replayed (STYLE.md 18);
 * - temporary directories removed at exit. */
#ifndef SLUICE_TESTUTIL_H
#define SLUICE_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#define TEST_SKIP_CODE 77

/* Prints "SKIP: <reason>" and exits 77. For a whole test binary. */
void test_skip_all(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* Path of a file under ../shared ("models/kjv6L.bin"), or NULL (with a
 * message on stderr naming what is missing) when ../shared is absent. The
 * returned string is static storage, valid until the next call. */
const char *test_shared_path(const char *rel);

/* The shared folder itself, or NULL. */
const char *test_shared_dir(void);

/* Path of the built `sluice` binary ($SLUICE_BIN), or NULL. */
const char *test_sluice_bin(void);

/* A fresh private directory under $TMPDIR (or /tmp), removed with its
 * contents at exit. Static storage per call (up to 16 directories). */
const char *test_tmpdir(void);
/* NAME inside one scratch directory of this binary (made at the first
 * call); the path lives in a ring of 64 buffers, so a caller may keep up to
 * 64 at once. */
const char *test_tmp_path(const char *name);

/* Seed for this binary: $SLUICE_TEST_SEED or time-based; printed once. */
uint64_t test_seed(void);

/* splitmix64 / xoshiro-style generator seeded from test_seed(). */
struct test_rng {
    uint64_t s;
};
void test_rng_init(struct test_rng *r, uint64_t seed);
uint64_t test_rng_u64(struct test_rng *r);
uint32_t test_rng_below(struct test_rng *r, uint32_t n); /* uniform in [0, n) */
float test_rng_float(struct test_rng *r);                /* uniform in [0, 1) */
float test_rng_normal(struct test_rng *r);               /* standard normal */

/* Reads a whole file into a malloc'ed buffer (NUL-terminated); NULL on error. */
void *test_read_file(const char *path, size_t *len);

/* Up to max whitespace-separated decimal ints of a text file (the golden
 * *.ids.txt files) into ids; how many, or -1 if it cannot be opened. */
int test_read_ints(const char *path, int *ids, int max);

/* The replay drivers' command line, [--mutations N] [FILE...]: N into
 * *mutations (left as it is without the option), then each FILE (a libFuzzer
 * corpus or crash file) fed whole to the fuzz target one. 0, or -1 having
 * printed which file could not be read. */
int test_fuzz_replay_files(int argc, char **argv, int (*one)(const uint8_t *, size_t),
                           long *mutations);

/* Runs a shell command, returns its exit status (-1 if it could not run). */
int test_system(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
