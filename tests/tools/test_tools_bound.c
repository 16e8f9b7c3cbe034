/* test_tools_bound.c: bench coldstart's bound (tools_bound.c):
 * - the raw read stops one request exactly at the asked bytes (rounded up to
 *   4 KiB), goes on to the file's end, and reports both times in order;
 *   none asked or more than the file: the whole file; a missing or empty
 *   file refused;
 * - a round's bound is never less than its raw read;
 * - per-round ratios skip the rounds without a run or a raw read. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "tools_bound.h"

#define MIB (1u << 20)

static const char *write_file(const char *name, size_t len)
{
    const char *p = test_tmp_path(name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    for (size_t i = 0; i < len; i++)
        assert_int_not_equal(fputc((int)(i * 7 % 251), f), EOF);
    assert_int_equal(fclose(f), 0);
    return p;
}

static void test_raw_read(void **state)
{
    (void)state;
    size_t len = 40 * MIB + 1234; /* crosses two 16 MiB requests, ends unaligned */
    const char *p = write_file("model", len);
    struct tools_raw_read rr;
    int ret = tools_raw_read(p, 20 * MIB + 1, &rr);
    if (ret == -EINVAL) { /* the ratio rules (test_round_and_ratios) still run */
        printf("no O_DIRECT on the temporary directory's file system: raw read not checked\n");
        skip();
    }
    assert_int_equal(ret, 0);
    assert_true(rr.bytes == 20 * MIB + 4096);
    assert_true(rr.file == len);
    assert_true(rr.bytes_s > 0 && rr.bytes_s <= rr.file_s);
    /* a request boundary where one falls anyway */
    assert_int_equal(tools_raw_read(p, 16 * MIB, &rr), 0);
    assert_true(rr.bytes == 16 * MIB && rr.file == len);
    /* under one request */
    assert_int_equal(tools_raw_read(p, 4096, &rr), 0);
    assert_true(rr.bytes == 4096 && rr.file == len);
    /* none asked, all of it, more than the file: the whole file */
    uint64_t asks[] = {0, len, (uint64_t)len + 5000, 1ull << 40};
    for (size_t i = 0; i < sizeof asks / sizeof asks[0]; i++) {
        assert_int_equal(tools_raw_read(p, asks[i], &rr), 0);
        assert_true(rr.bytes == len && rr.file == len);
        assert_true(rr.bytes_s == rr.file_s && rr.file_s > 0);
    }
    assert_int_equal(tools_raw_read(test_tmp_path("missing"), 0, &rr), -ENOENT);
    assert_int_equal(tools_raw_read(write_file("empty", 0), 0, &rr), -ENODATA);
    assert_true(rr.bytes == 0 && rr.bytes_s == 0);
}

static void test_round_and_ratios(void **state)
{
    (void)state;
    assert_true(tools_bound_round(0.8, 0.5) == 0.8);
    assert_true(tools_bound_round(0.8, 1.2) == 1.2);
    assert_true(tools_bound_round(0, 1.2) == 0); /* no raw read: no bound */
    double ttft[] = {1.0, 0, 0.9, 1.25, 1.125};
    double bound[] = {0.5, 0.8, 0, 1.0, 0.5};
    struct tools_stats st;
    assert_int_equal(tools_bound_ratios(ttft, bound, 5, &st), 0);
    assert_int_equal(st.n, 3); /* round 2 ran nothing, round 3 had no bound */
    assert_true(st.min == 1.25 && st.max == 2.25 && st.median == 2);
    assert_int_equal(tools_bound_ratios(ttft, bound, 0, &st), 0);
    assert_int_equal(st.n, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_and_ratios),
        cmocka_unit_test(test_raw_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
