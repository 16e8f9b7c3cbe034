/* test_loader_mount.c: the loader reading a real `sluice mount` of a
 * container (every slice verified and compared with the container's bytes,
 * FUSE files read buffered by policy, O_DIRECT when asked; its config.json
 * equal to `sluice inspect --json`'s config), and `sluice bench
 * load` end to end (warm only: cold runs drop the machine's page cache).
 * A mount that fails where /dev/fuse opens and fusermount3 is installed is a
 * failure; only FUSE being unavailable (no device, no fusermount3, opening
 * or mounting not permitted) skips the mount, and then the binary exits 77. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "import.h"
#include "loader.h"
#include "testutil.h"

static const char *bin;
static char model[4096], mnt[4096];
/* why FUSE cannot be used here ("" when it can): the mount test is then
 * skipped and the binary exits 77 even when the rest passed */
static char fuse_why[512];

/* FUSE is unavailable only for reasons outside Sluice: no /dev/fuse, no
 * fusermount3, or this process may not open the device. */
static void probe_fuse(void)
{
    if (access("/dev/fuse", F_OK) != 0) {
        snprintf(fuse_why, sizeof fuse_why, "/dev/fuse does not exist here");
        return;
    }
    int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        snprintf(fuse_why, sizeof fuse_why, "/dev/fuse cannot be opened: %s", strerror(errno));
        return;
    }
    close(fd);
    if (test_system("command -v fusermount3 >/dev/null") != 0)
        snprintf(fuse_why, sizeof fuse_why, "fusermount3 is not installed");
}

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

/* The mount's config.json and `sluice inspect --json`'s "config" are one
 * writer's output (fs_config_json): equal, key for key. */
static void same_config_as_inspect(void)
{
    char p[4096], out[4096];
    snprintf(p, sizeof p, "%s/config.json", mnt);
    snprintf(out, sizeof out, "%s/inspect.json", test_tmpdir());
    assert_int_equal(test_system("'%s' inspect '%s' --json > '%s'", bin, model, out), 0);
    char *a = test_read_file(p, NULL), *b = test_read_file(out, NULL);
    assert_non_null(a);
    assert_non_null(b);
    cJSON *mounted = cJSON_Parse(a), *inspected = cJSON_Parse(b);
    assert_non_null(mounted);
    assert_non_null(inspected);
    const cJSON *cfg = cJSON_GetObjectItem(inspected, "config");
    assert_non_null(cfg);
    const cJSON *arch = cJSON_GetObjectItem(cfg, "architecture");
    if (!cJSON_IsString(arch) || strcmp(arch->valuestring, "llama") != 0)
        fail_msg("inspect's config has no \"architecture\": \"llama\":\n%s", b);
    if (!cJSON_Compare(mounted, cfg, 1))
        fail_msg("config.json and inspect's config differ:\n%s\n%s", a, b);
    cJSON_Delete(mounted);
    cJSON_Delete(inspected);
    free(a);
    free(b);
}

static void test_mount(void **st)
{
    (void)st;
    if (fuse_why[0]) {
        fprintf(stderr, "SKIP: %s\n", fuse_why);
        skip();
    }
    char log[4096];
    snprintf(log, sizeof log, "%s/mount.log", test_tmpdir());
    int rc = test_system("'%s' mount '%s' '%s' 2>'%s'", bin, model, mnt, log);
    if (rc != 0) {
        size_t len = 0;
        char *msg = test_read_file(log, &len);
        while (msg && len && msg[len - 1] == '\n')
            msg[--len] = 0;
        const char *m = msg && msg[0] ? msg : "(nothing on its standard error)";
        /* the kernel or fusermount3 refusing this process is the one way a
         * working /dev/fuse still cannot mount (a container without the
         * capability): a skip; anything else is Sluice's failure */
        if (strstr(m, "not permitted") || strstr(m, "Permission denied")) {
            snprintf(fuse_why, sizeof fuse_why, "mounting is not permitted here: %s", m);
            free(msg);
            fprintf(stderr, "SKIP: %s\n", fuse_why);
            skip();
        }
        fail_msg("sluice mount failed (exit %d) although /dev/fuse opens and fusermount3 is "
                 "installed: %s", rc, m);
    }
    struct sl_err err;
    struct format_reader *r;
    assert_int_equal(format_reader_open(model, &r, &err), 0);
    size_t len;
    uint8_t *whole = test_read_file(model, &len);
    assert_non_null(whole);
    stream_mount(r, whole, 0);
    stream_mount(r, whole, 1);
    same_config_as_inspect();
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
        if (strcmp(want[i], "uring_mount") != 0 || !fuse_why[0])
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
    if (import_synth("tiny", 5, model, NULL, NULL, &err) < 0)
        fail_msg("synth: %s", err.msg);
    probe_fuse();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mount),
        cmocka_unit_test(test_bench),
    };
    int ret = cmocka_run_group_tests(tests, NULL, NULL);
    /* a passing run without the mount is not a pass (STYLE.md 17) */
    if (ret == 0 && fuse_why[0])
        test_skip_all("the mount test did not run: %s", fuse_why);
    return ret;
}
