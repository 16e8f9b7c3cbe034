/* test_fs_gguf.c: MOUNT/model.gguf through a real mount (label
 * "integration"), against `sluice export --gguf` of the same container:
 * - read in random pieces by 16 threads at once (pread), and through mmap,
 *   it equals the exported file byte for byte, with the default cache, a
 *   cache of one chunk (evictions) and none; stats.json counts the cache;
 * - -o gguf=f16 serves what `export --type f16` writes;
 * - warmers: an open alone converts the whole (small) file and pushes it into
 *   the page cache, so reading it sends no read to the daemon; they stay
 *   within half the cache ahead of the reader; -o gguf_warm=0 has none;
 * - a corrupt slice: every range of a tensor in it reads as EIO, the others
 *   read right, the daemon logs it; `sluice export` of that container fails
 *   and leaves no file;
 * - bad -o gguf=, gguf_cache= and gguf_warm= values are refused with a message. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format.h"
#include "fs_cli.h"
#include "fs_testmodel.h"
#include "gguf.h"
#include "testutil.h"

static const char *bin, *dir;
static char model[PATH_MAX], mnt[PATH_MAX];

static void umount_it(void)
{
    test_system("'%s' umount '%s' 2>/dev/null || '%s' umount --lazy '%s' 2>/dev/null", bin, mnt,
                bin, mnt);
}

static int cleanup(void **st)
{
    (void)st;
    umount_it();
    return 0;
}

static uint8_t *exported(const char *container, const char *type, size_t *len)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/export-%s.gguf", dir, type);
    if (fs_cli_run("export --gguf '%s' --type %s '%s'", p, type, container) != 0) {
        char *e = fs_cli_said();
        fail_msg("sluice export failed: %s", e ? e : "?");
    }
    fs_cli_assert_said("sluice export: wrote");
    uint8_t *b = test_read_file(p, len);
    assert_non_null(b);
    return b;
}

struct reader_arg {
    const uint8_t *want;
    size_t len;
    uint64_t seed;
    int bad;
};

/* The number after "key": in stats.json's "gguf" object (or the whole text). */
static uint64_t gguf_stat(const char *json, const char *key)
{
    const char *g = strstr(json, "\"gguf\":");
    assert_non_null(g);
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = strstr(g, k);
    if (!p)
        fail_msg("no %s in stats.json's gguf object", key);
    return strtoull(p + strlen(k), NULL, 10);
}

static char *stats(void)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/stats.json", mnt);
    char *s = test_read_file(p, NULL);
    assert_non_null(s);
    return s;
}

static void *reader(void *p)
{
    struct reader_arg *a = p;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/model.gguf", mnt);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        a->bad = 1;
        return NULL;
    }
    struct test_rng g;
    test_rng_init(&g, a->seed);
    uint8_t *buf = malloc(3 << 20);
    for (int i = 0; i < 120 && !a->bad; i++) {
        uint64_t off = test_rng_u64(&g) % a->len;
        size_t n = 1 + test_rng_below(&g, i % 4 == 0 ? (3u << 20) : 20000);
        size_t expect = a->len - off < n ? a->len - off : n, got = 0;
        while (got < expect) {
            ssize_t k = pread(fd, buf + got, n - got, (off_t)(off + got));
            if (k <= 0)
                break;
            got += (size_t)k;
        }
        if (got != expect || memcmp(buf, a->want + off, expect))
            a->bad = 1;
    }
    free(buf);
    close(fd);
    return NULL;
}

static void check_concurrent(const uint8_t *want, size_t len)
{
    pthread_t th[16];
    struct reader_arg a[16];
    for (int i = 0; i < 16; i++) {
        a[i] = (struct reader_arg){want, len, test_seed() * 31 + (uint64_t)i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, reader, &a[i]), 0);
    }
    for (int i = 0; i < 16; i++) {
        pthread_join(th[i], NULL);
        if (a[i].bad)
            fail_msg("reader %d: model.gguf differs from the exported file", i);
    }
}

static void check_mmap(const uint8_t *want, size_t len)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/model.gguf", mnt);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal((size_t)st.st_size, len);
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    if (memcmp(m, want, len))
        fail_msg("model.gguf through mmap differs from the exported file");
    munmap(m, len);
    close(fd);
}

static void test_pieces(void **st)
{
    (void)st;
    size_t len;
    uint8_t *want = exported(model, "q8_0", &len);
    const char *opts[3] = {NULL, "gguf_cache=1M", "gguf_cache=0"};
    for (int i = 0; i < 3; i++) {
        fs_cli_mount(model, mnt, opts[i]);
        check_concurrent(want, len);
        check_mmap(want, len);
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/stats.json", mnt);
        char *s = test_read_file(p, NULL);
        assert_non_null(s);
        assert_non_null(strstr(s, "\"gguf\": {\"type\": \"Q8_0\""));
        assert_non_null(strstr(s, "\"errors\": 0}"));
        if (i == 0) /* converted by a reader or ahead of them */
            assert_true(gguf_stat(s, "misses") + gguf_stat(s, "warmed") > 0);
        if (i == 2)
            assert_non_null(strstr(s, "\"hits\": 0, \"misses\": 0,"));
        free(s);
        umount_it();
    }
    free(want);
}

/* Waits (up to 10 s) until stats.json's gguf `key` reaches n; returns it. */
static uint64_t wait_stat(const char *key, uint64_t n)
{
    uint64_t w = 0;
    for (int i = 0; i < 1000; i++) {
        char *s = stats();
        w = gguf_stat(s, key);
        free(s);
        if (w >= n)
            break;
        usleep(10000);
    }
    return w;
}

/* Pages the kernel has dropped so far, machine-wide: drop_caches writes and
 * what reclaim took (/proc/vmstat; 0 where it cannot be read). */
static uint64_t pages_dropped(void)
{
    static const char *const keys[] = {"drop_pagecache", "pgsteal_kswapd", "pgsteal_direct",
                                       "pgsteal_khugepaged", "pgsteal_proactive", "pginodesteal",
                                       "kswapd_inodesteal"};
    FILE *f = fopen("/proc/vmstat", "r");
    if (!f)
        return 0;
    char key[64];
    unsigned long long v;
    uint64_t n = 0;
    while (fscanf(f, "%63s %llu", key, &v) == 2)
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (!strcmp(key, keys[i]))
                n += v;
    fclose(f);
    return n;
}

/* Opens MOUNT/model.gguf, waits until the warmers have pushed all n_chunks,
 * reads it whole (it must equal want) and returns stats.json after that. */
static char *read_pushed(const char *path, const uint8_t *want, size_t len, uint64_t n_chunks)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    /* (a chunk counts as warmed before its push ends) */
    assert_int_equal(wait_stat("pushed", n_chunks), n_chunks);
    char *s = stats();
    assert_int_equal(gguf_stat(s, "warmed"), n_chunks);
    assert_int_equal(gguf_stat(s, "misses"), 0);
    free(s);
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    size_t got = 0;
    while (got < len) {
        ssize_t k = read(fd, buf + got, len - got);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    assert_int_equal(got, len);
    assert_memory_equal(buf, want, len);
    free(buf);
    close(fd);
    return stats();
}

static void test_warm(void **st)
{
    (void)st;
    size_t len;
    uint8_t *want = exported(model, "q8_0", &len);
    uint64_t n_chunks = (len + GGUF_VIEW_CHUNK - 1) / GGUF_VIEW_CHUNK;
    assert_true(n_chunks >= 4);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/model.gguf", mnt);

    /* the default: an open converts the whole file and pushes it into the
     * page cache; reading it then sends no read to the daemon. A try during
     * which the kernel dropped pages (a cold-start benchmark's drop_caches,
     * reclaim) may read some through the daemon: it is tried again. */
    for (int attempt = 1;; attempt++) {
        fs_cli_mount(model, mnt, NULL);
        uint64_t dropped = pages_dropped();
        char *s = read_pushed(path, want, len, n_chunks);
        umount_it();
        if (!strstr(s, "\"model.gguf\": {")) {
            free(s);
            break;
        }
        if (pages_dropped() == dropped)
            fail_msg("model.gguf was read through the daemon although it was pushed: %s", s);
        free(s);
        if (attempt == 5) {
            fprintf(stderr, "note: the kernel dropped pages during each of 5 tries: whether "
                            "reads of a pushed model.gguf reach the daemon is not checked\n");
            break;
        }
        fprintf(stderr, "note: the kernel dropped pages during try %d; again\n", attempt);
    }
    /* a cache of 2 chunks: warmers stay one chunk ahead of the reader */
    fs_cli_mount(model, mnt, "gguf_cache=2M");
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM), 0);
    assert_int_equal(wait_stat("pushed", 1), 1);
    usleep(200000);
    char *s = stats();
    assert_int_equal(gguf_stat(s, "warmed"), 1);
    free(s);
    /* a read that misses the page cache where the warmed part ends moves
     * the frontier: two more chunks are warmed, not the fourth */
    uint8_t b[4096];
    assert_int_equal(pread(fd, b, sizeof b, GGUF_VIEW_CHUNK), (ssize_t)sizeof b);
    assert_memory_equal(b, want + GGUF_VIEW_CHUNK, sizeof b);
    assert_int_equal(wait_stat("warmed", 3), 3);
    usleep(200000);
    s = stats();
    assert_int_equal(gguf_stat(s, "warmed"), 3);
    free(s);
    close(fd);
    umount_it();

    /* none */
    fs_cli_mount(model, mnt, "gguf_warm=0");
    check_concurrent(want, len);
    s = stats();
    assert_int_equal(gguf_stat(s, "warmed"), 0);
    assert_true(gguf_stat(s, "misses") > 0);
    free(s);
    umount_it();
    free(want);
}

static void test_f16(void **st)
{
    (void)st;
    size_t len;
    uint8_t *want = exported(model, "f16", &len);
    fs_cli_mount(model, mnt, "gguf=f16");
    check_concurrent(want, len);
    umount_it();
    free(want);
}

static void test_corrupt(void **st)
{
    (void)st;
    size_t len;
    uint8_t *want = exported(model, "q8_0", &len);
    char bad[PATH_MAX], log[PATH_MAX], opts[PATH_MAX + 64];
    snprintf(bad, sizeof bad, "%s/bad.sluice", dir);
    snprintf(log, sizeof log, "%s/daemon.log", dir);
    assert_int_equal(test_system("cp '%s' '%s'", model, bad), 0);
    struct sl_err err = {{0}};
    struct format_reader *r;
    struct gguf_view *v;
    struct gguf_view_opts o;
    gguf_view_opts_init(&o);
    assert_int_equal(format_reader_open(model, &r, &err), 0);
    assert_int_equal(gguf_view_create(r, &o, &v, &err), 0);
    uint32_t bs = 2; /* layer 1 (slice 0 is the embedding) */
    const struct format_slice_info *si = format_reader_slice(r, bs);
    int fd = open(bad, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    off_t at = (off_t)(si->offset + si->length / 2);
    assert_int_equal(pread(fd, &b, 1, at), 1);
    b ^= 0x01;
    assert_int_equal(pwrite(fd, &b, 1, at), 1);
    close(fd);

    for (int cached = 0; cached < 2; cached++) {
        /* with the cache too: a chunk spanning the bad slice fails as a
         * whole, and the read falls back to its own range */
        snprintf(opts, sizeof opts, "%slog=%s", cached ? "" : "gguf_cache=0,", log);
        fs_cli_mount(bad, mnt, opts);
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/model.gguf", mnt);
        /* no readahead: a read must not pull in pages of the corrupt slice */
        fd = open(path, O_RDONLY);
        assert_true(fd >= 0);
        assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM), 0);
        int n_bad = 0;
        for (uint32_t i = 0; i < gguf_view_n_tensors(v); i++) {
            const struct gguf_view_tensor *t = gguf_view_tensor(v, i);
            uint32_t slice = format_reader_tensor(r, t->tensor)->slice;
            /* a page-aligned 4 KiB read inside the tensor */
            uint64_t off = (t->offset + 4095) / 4096 * 4096;
            if (off + 4096 > t->offset + t->size)
                continue;
            uint8_t buf[4096];
            ssize_t k = pread(fd, buf, 4096, (off_t)off);
            if (slice == bs) {
                if (k != -1 || errno != EIO)
                    fail_msg("tensor %s in the corrupt slice: read gave %zd, not EIO", t->name, k);
                n_bad++;
            } else {
                if (k != 4096 || memcmp(buf, want + off, 4096))
                    fail_msg("tensor %s (cache %d): wrong bytes or error %zd", t->name, cached, k);
            }
        }
        close(fd);
        assert_true(n_bad > 0);
        umount_it();
    }
    char *lg = test_read_file(log, NULL);
    assert_non_null(lg);
    assert_non_null(strstr(lg, "model.gguf"));
    free(lg);

    /* export refuses it and writes nothing */
    char out[PATH_MAX];
    snprintf(out, sizeof out, "%s/bad.gguf", dir);
    assert_int_equal(fs_cli_run("export --gguf '%s' '%s'", out, bad), 1);
    fs_cli_assert_said("checksum");
    assert_int_equal(test_system("ls '%s' | grep -q '^bad.gguf'", dir), 1);
    gguf_view_destroy(v);
    format_reader_close(r);
    free(want);
}

static void test_bad_options(void **st)
{
    (void)st;
    mkdir(mnt, 0755);
    assert_int_equal(fs_cli_run("mount -o gguf=q4 '%s' '%s'", model, mnt), 2);
    fs_cli_assert_said("gguf=q8_0, gguf=f16 or gguf=f32");
    assert_int_equal(fs_cli_run("mount -o gguf_cache=12X '%s' '%s'", model, mnt), 2);
    fs_cli_assert_said("gguf_cache");
    assert_int_equal(fs_cli_run("mount -o gguf_warm=9 '%s' '%s'", model, mnt), 2);
    fs_cli_assert_said("gguf_warm");
    assert_int_equal(fs_cli_run("export --gguf x.gguf --alignment 48 '%s'", model), 2);
    fs_cli_assert_said("power of two");
}

int main(void)
{
    dir = fs_cli_setup(120);
    bin = fs_cli_bin();
    snprintf(model, sizeof model, "%s/m.sluice", dir);
    snprintf(mnt, sizeof mnt, "%s/mnt", dir);
    struct sl_err err = {{0}};
    if (fs_test_model_write(model, test_seed(), 6, 224, &err) < 0)
        fail_msg("writing the test model: %s", err.msg);
#define T(f) cmocka_unit_test_teardown(f, cleanup)
    const struct CMUnitTest tests[] = {T(test_pieces), T(test_warm), T(test_f16), T(test_corrupt),
                                       T(test_bad_options)};
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
