/* test_tools_stats.c: the statistics helper of the benchmarks (tools_stats.c):
 * - min, upper median, max, mean of odd and even counts, one sample and none;
 * - the input keeps its order (a sorted copy is summarized);
 * - percentiles by the nearest rank below, as the KL p99 of `sluice eval`;
 *   p outside [0, 1] refused. */
#include <errno.h>
#include <string.h>

#include "testutil.h"
#include "tools_stats.h"

static void test_summary(void **state)
{
    (void)state;
    double v[] = {5, 1, 4, 2, 3};
    const double before[] = {5, 1, 4, 2, 3};
    struct tools_stats st;
    assert_int_equal(tools_stats_compute(v, 5, &st), 0);
    assert_int_equal(st.n, 5);
    assert_true(st.min == 1 && st.max == 5 && st.median == 3 && st.mean == 3);
    assert_memory_equal(v, before, sizeof v);
    /* even count: the upper median, one of the samples */
    assert_int_equal(tools_stats_compute(v, 4, &st), 0);
    assert_true(st.min == 1 && st.max == 5 && st.median == 4 && st.mean == 3);
    /* one sample */
    assert_int_equal(tools_stats_compute(v + 2, 1, &st), 0);
    assert_true(st.min == 4 && st.max == 4 && st.median == 4 && st.mean == 4);
    /* none: zeros, as an empty series is reported */
    memset(&st, 0xff, sizeof st);
    assert_int_equal(tools_stats_compute(NULL, 0, &st), 0);
    assert_true(st.n == 0 && st.min == 0 && st.max == 0 && st.median == 0 && st.mean == 0);
}

static void test_percentile(void **state)
{
    (void)state;
    double v[101];
    for (int i = 0; i <= 100; i++)
        v[i] = 100 - i; /* 100 .. 0, reversed */
    double p;
    assert_int_equal(tools_stats_percentile(v, 101, 0.99, &p), 0);
    assert_true(p == 99);
    assert_int_equal(tools_stats_percentile(v, 101, 0, &p), 0);
    assert_true(p == 0);
    assert_int_equal(tools_stats_percentile(v, 101, 1, &p), 0);
    assert_true(p == 100);
    assert_true(v[0] == 100 && v[100] == 0);
    /* nearest rank below: of 10 samples, p99 is the 9th (index floor(9 x 0.99) = 8) */
    assert_int_equal(tools_stats_percentile(v + 91, 10, 0.99, &p), 0);
    assert_true(p == 8);
    assert_int_equal(tools_stats_percentile(NULL, 0, 0.5, &p), 0);
    assert_true(p == 0);
    assert_int_equal(tools_stats_percentile(v, 101, 1.5, &p), -EINVAL);
    assert_int_equal(tools_stats_percentile(v, 101, -0.1, &p), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_summary),
        cmocka_unit_test(test_percentile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
