/* test_loader_mount.c: the loader reading a real `sluice mount` of a
 * container (every slice verified and compared with the container's bytes,
 * FUSE files read buffered by policy, O_DIRECT when asked), and `sluice bench
 * load` end to end (warm only: cold runs drop the machine's page cache). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loader.h"
#include "quantizer.h"
#include "testutil.h"

static const char *bin;
static char model[4096], mnt[4096];

static void stream_mount(const struct format_reader *r, const uint8_t *whole, int always_direct)
{
    struct loader_request *reqs;
    uint32_t n;
    struct sl_err err;
    assert_int_equal(loader_requests_from_mount(r, mnt, &reqs, &n, &err), 0);
    struct loader_opts o = {.verify = r, .always_direct = always_direct, .queue_depth = 8,
                            .chunk_bytes = 256 << 10};
    struct loader_stream *s;
    if (loader_stream_open(reqs, n, &o, &s, &err) != 0)
        fail_msg("%s", err.msg);
    struct loader_slice sl;
    uint32_t k = 0;
    int ret;
    while ((ret = loader_stream_next(s, &sl, &err)) == 1) {
        const struct format_slice_info *si = format_reader_slice(r, (uint32_t)sl.tag);
        assert_int_equal(sl.index, k);
        assert_int_equal(sl.length, si->length);
        assert_memory_equal(sl.data, whole + si->offset, si->length);
        loader_stream_release(s, &sl);
        k++;
    }
    if (ret != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(k, n);
    struct loader_stats stt;
    loader_stream_stats(s, &stt);
    fprintf(stderr, "mount (always_direct %d): %u slices, direct %d, %u files buffered, %s\n",
            always_direct, n, stt.direct, stt.buffered_files, stt.note);
    if (!always_direct) {
        assert_int_equal(stt.buffered_files, n);
        assert_non_null(strstr(stt.note, "FUSE"));
    }
    loader_stream_close(s);
    free(reqs);
}

static void test_mount(void **st)
{
    (void)st;
    if (access("/dev/fuse", R_OK | W_OK) != 0) {
        fprintf(stderr, "SKIP: /dev/fuse is not available here\n");
        skip();
    }
    if (test_system("'%s' mount '%s' '%s'", bin, model, mnt) != 0) {
        fprintf(stderr, "SKIP: sluice mount failed here\n");
        skip();
    }
    struct sl_err err;
    struct format_reader *r;
    assert_int_equal(format_reader_open(model, &r, &err), 0);
    size_t len;
    uint8_t *whole = test_read_file(model, &len);
    assert_non_null(whole);
    stream_mount(r, whole, 0);
    stream_mount(r, whole, 1);
    free(whole);
    format_reader_close(r);
    assert_int_equal(test_system("'%s' umount '%s'", bin, mnt), 0);
}

static void test_bench(void **st)
{
    (void)st;
    char out[4096];
    snprintf(out, sizeof out, "%s/bench.json", test_tmpdir());
    assert_int_equal(test_system("'%s' bench load '%s' --warm-only --runs 2 --json --ring-mib 8 "
                                 "--queue-depth 4 --chunk-kib 256 > '%s'", bin, model, out), 0);
    char *text = test_read_file(out, NULL);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(j, "cold")));
    assert_true(cJSON_GetObjectItem(j, "raw_warm_mbps")->valuedouble > 0);
    const cJSON *res = cJSON_GetObjectItem(j, "results");
    const char *want[] = {"uring_direct", "uring_mount", "buffered", "mmap", "pread_pool"};
    for (int i = 0; i < 5; i++) {
        const cJSON *e = NULL, *it;
        cJSON_ArrayForEach(it, res)
        {
            if (!strcmp(cJSON_GetObjectItem(it, "method")->valuestring, want[i]))
                e = it;
        }
        assert_non_null(e);
        assert_non_null(cJSON_GetObjectItem(e, "mbps_min"));
        assert_non_null(cJSON_GetObjectItem(e, "mbps_median"));
        assert_non_null(cJSON_GetObjectItem(e, "ratio_to_raw"));
        assert_non_null(cJSON_GetObjectItem(e, "peak_rss_mb"));
        double warm = cJSON_GetObjectItem(e, "warm_mbps_median")->valuedouble;
        /* the mount is measured when FUSE works here; the rest always */
        if (strcmp(want[i], "uring_mount") != 0 || access("/dev/fuse", R_OK | W_OK) == 0)
            assert_true(warm > 0);
        if (!strcmp(want[i], "uring_direct"))
            assert_int_equal(cJSON_GetObjectItem(e, "ring_mb")->valuedouble, 8);
    }
    cJSON_Delete(j);
    free(text);
    /* bad arguments */
    assert_int_equal(test_system("'%s' bench load '%s' --runs 0 2>/dev/null", bin, model), 2);
    assert_int_equal(test_system("'%s' bench load '%s' --methods nope 2>/dev/null", bin, model), 2);
    assert_int_equal(test_system("'%s' bench load /nonexistent.sluice 2>/dev/null", bin), 1);
}

int main(void)
{
    bin = test_sluice_bin();
    if (!bin)
        test_skip_all("the sluice binary is not available ($SLUICE_BIN)");
    const char *dir = test_tmpdir();
    snprintf(model, sizeof model, "%s/tiny.sluice", dir);
    snprintf(mnt, sizeof mnt, "%s/mnt", dir);
    mkdir(mnt, 0755);
    struct sl_err err;
    if (quantizer_synth("tiny", 5, model, NULL, NULL, &err) < 0)
        fail_msg("synth: %s", err.msg);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mount),
        cmocka_unit_test(test_bench),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
