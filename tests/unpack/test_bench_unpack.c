/* test_bench_unpack.c: `sluice bench unpack` end to end on a small tensor:
 * one JSON result per kernel available here, encoding and bit mix, with
 * every key the issue and --help promise, positive rates, adaptive and
 * bitplane at equal size, int4int8 larger; bad arguments exit 2. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "unpack.h"

static const char *bin;

static const cJSON *find(const cJSON *res, const char *kernel, const char *enc, int avg)
{
    const cJSON *it, *hit = NULL;
    int n = 0;
    cJSON_ArrayForEach(it, res)
    {
        if (!strcmp(cJSON_GetObjectItem(it, "kernel")->valuestring, kernel) &&
            !strcmp(cJSON_GetObjectItem(it, "encoding")->valuestring, enc) &&
            cJSON_GetObjectItem(it, "avg_bits")->valueint == avg) {
            hit = it;
            n++;
        }
    }
    assert_int_equal(n, 1);
    return hit;
}

static void test_json(void **st)
{
    (void)st;
    char out[4096];
    snprintf(out, sizeof out, "%s/unpack.json", test_tmpdir());
    /* 1100 columns: two full adaptive groups and a tail group, vector tails */
    assert_int_equal(test_system("'%s' bench unpack --rows 48 --cols 1100 --reps 2 --json > '%s'",
                                 bin, out),
                     0);
    char *text = test_read_file(out, NULL);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    const cJSON *res = cJSON_GetObjectItem(j, "results");
    assert_true(cJSON_IsArray(res));
    enum unpack_kernel ks[UNPACK_KERNEL_COUNT];
    int nk = unpack_kernels_available(ks);
    assert_int_equal(cJSON_GetArraySize(res), nk * 4 * 4);
    static const char *const keys[] = {
        "bytes_per_weight", "gbps",     "gbps_best",     "cycles_per_weight",
        "cycles_per_weight_min", "ticks_per_weight", "gbps_cached_stores", "gbps_hot",
        "gbps_hot_best", "gbps_warm", "gbps_warm_best", "reps"};
    for (int k = 0; k < nk; k++) {
        const char *kn = unpack_kernel_name(ks[k]);
        for (int avg = 4; avg <= 7; avg++) {
            const cJSON *e[4] = {find(res, kn, "adaptive", avg), find(res, kn, "int4int8", avg),
                                 find(res, kn, "bitplane", avg), find(res, kn, "adaptive+m", avg)};
            for (int i = 0; i < 4; i++) {
                for (size_t q = 0; q < sizeof keys / sizeof keys[0]; q++) {
                    const cJSON *v = cJSON_GetObjectItem(e[i], keys[q]);
                    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0))
                        fail_msg("%s %s %d bits: %s missing or not positive", kn,
                                 cJSON_GetObjectItem(e[i], "encoding")->valuestring, avg, keys[q]);
                }
                assert_true(cJSON_GetObjectItem(e[i], "gbps_best")->valuedouble >=
                            cJSON_GetObjectItem(e[i], "gbps")->valuedouble);
                assert_true(cJSON_GetObjectItem(e[i], "gbps_warm_best")->valuedouble >=
                            cJSON_GetObjectItem(e[i], "gbps_warm")->valuedouble);
            }
            double bpw_a = cJSON_GetObjectItem(e[0], "bytes_per_weight")->valuedouble;
            double bpw_i = cJSON_GetObjectItem(e[1], "bytes_per_weight")->valuedouble;
            double bpw_b = cJSON_GetObjectItem(e[2], "bytes_per_weight")->valuedouble;
            assert_true(bpw_a == bpw_b); /* equal size, by construction of the layouts */
            /* the multipliers are not code bytes (data_len) */
            assert_true(cJSON_GetObjectItem(e[3], "bytes_per_weight")->valuedouble == bpw_a);
            assert_true(bpw_i > bpw_a);
            /* the mix averages avg bits per weight of codes (scales and widths
             * add under 1%) */
            assert_true(bpw_a * 8 >= avg && bpw_a * 8 < avg + 0.5);
        }
    }
    cJSON_Delete(j);
    free(text);
}

static void test_args(void **st)
{
    (void)st;
    assert_int_equal(test_system("'%s' bench unpack --help > /dev/null", bin), 0);
    assert_int_equal(test_system("'%s' bench unpack --rows 0 2>/dev/null", bin), 2);
    assert_int_equal(test_system("'%s' bench unpack --cols 1000000 2>/dev/null", bin), 2);
    assert_int_equal(test_system("'%s' bench unpack --seconds -1 2>/dev/null", bin), 2);
    assert_int_equal(test_system("'%s' bench unpack --nope 2>/dev/null", bin), 2);
}

int main(void)
{
    bin = test_sluice_bin();
    if (!bin)
        test_skip_all("the sluice binary is not available ($SLUICE_BIN)");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
