/* test_loader.c: the streaming loader delivers every request's bytes, in
 * order, within its ring, whatever happens underneath: out-of-order
 * completions, injected short reads, EAGAIN and EINTR, an EIO (reported with
 * file and offset), io_uring unavailable (pread pool), O_DIRECT refused
 * (tmpfs), unaligned ranges, requests larger than the ring, a slow consumer,
 * and a real container's slices with their checksums. */
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

#define FILE_BYTES (24u << 20)

static char path[4096];
static uint8_t *content;

static int setup(void **st)
{
    (void)st;
    const char *dir = test_tmpdir();
    snprintf(path, sizeof path, "%s/data.bin", dir);
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    content = malloc(FILE_BYTES);
    for (uint32_t i = 0; i < FILE_BYTES / 8; i++) {
        uint64_t v = test_rng_u64(&rng);
        memcpy(content + 8 * i, &v, 8);
    }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(content, 1, FILE_BYTES, f) != FILE_BYTES)
        return -1;
    fclose(f);
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    free(content);
    return 0;
}

/* Streams reqs and checks every byte and the order; returns the stats. */
static int stream_check(const struct loader_request *reqs, uint32_t n,
                        const struct loader_opts *o, const uint8_t *truth,
                        struct loader_stats *stats, struct sl_err *err, int slow)
{
    struct loader_stream *s;
    int ret = loader_stream_open(reqs, n, o, &s, err);
    if (ret < 0)
        return ret;
    struct loader_slice sl;
    uint32_t expect = 0;
    while ((ret = loader_stream_next(s, &sl, err)) == 1) {
        assert_int_equal(sl.index, expect);
        assert_int_equal(sl.tag, reqs[expect].tag);
        assert_int_equal(sl.length, reqs[expect].length);
        assert_int_equal((uintptr_t)sl.data % 4096, 0);
        if (memcmp(sl.data, truth + reqs[expect].offset, sl.length) != 0)
            fail_msg("request %u: bytes differ", expect);
        if (slow)
            usleep(2000);
        loader_stream_release(s, &sl);
        expect++;
    }
    if (ret == 0)
        assert_int_equal(expect, n);
    loader_stream_stats(s, stats);
    loader_stream_close(s);
    return ret;
}

static uint32_t make_reqs(struct loader_request *r, uint32_t max, uint64_t size_unit,
                          int aligned, struct test_rng *rng)
{
    uint64_t off = 0;
    uint32_t n = 0;
    while (n < max) {
        uint64_t len = (1 + test_rng_below(rng, 8)) * size_unit;
        if (!aligned)
            len += test_rng_below(rng, 4000) + 1;
        if (off + len > FILE_BYTES)
            break;
        r[n] = (struct loader_request){.path = path, .fd = -1, .offset = off, .length = len,
                                       .tag = 1000 + n};
        n++;
        off += len;
        if (aligned)
            off = (off + 4095) & ~4095ull;
    }
    return n;
}

static void test_basic(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 1);
    struct loader_request r[64];
    uint32_t n = make_reqs(r, 64, 256 << 10, 1, &rng);
    struct loader_opts o = {.queue_depth = 8, .chunk_bytes = 128 << 10, .ring_bytes = 4 << 20};
    struct loader_stats stt;
    struct sl_err err;
    assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
    assert_int_equal(stt.backend, LOADER_BACKEND_URING);
    assert_true(stt.peak_bytes <= stt.ring_bytes);
    assert_true(stt.ring_bytes <= (4 << 20) + (2 << 20) + (128 << 10)); /* largest 2 MiB */
    fprintf(stderr, "basic: %u requests, %llu reads, direct %d, peak %llu of %llu ring bytes\n", n,
            (unsigned long long)stt.reads, stt.direct, (unsigned long long)stt.peak_bytes,
            (unsigned long long)stt.ring_bytes);
    /* a slow consumer: the ring fills, the reader waits, nothing is lost */
    assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 1), 0);
    assert_true(stt.peak_bytes <= stt.ring_bytes);
}

static void test_unaligned_and_large(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 2);
    struct loader_request r[64];
    uint32_t n = make_reqs(r, 64, 64 << 10, 0, &rng);
    struct loader_opts o = {.queue_depth = 4, .chunk_bytes = 64 << 10, .ring_bytes = 1 << 20};
    struct loader_stats stt;
    struct sl_err err;
    assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
    /* one request larger than the ring: the ring grows to hold it */
    struct loader_request big = {.path = path, .fd = -1, .offset = 4096, .length = 9 << 20};
    assert_int_equal(stream_check(&big, 1, &o, content, &stt, &err, 0), 0);
    assert_true(stt.ring_bytes >= (9u << 20));
}

static void test_faults(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 3);
    struct loader_request r[64];
    uint32_t n = make_reqs(r, 64, 128 << 10, 1, &rng);
    struct loader_faults f = {.short_read_every = 3, .eagain_every = 5, .eintr_every = 7};
    for (int pread = 0; pread < 2; pread++) {
        struct loader_opts o = {.queue_depth = 8, .chunk_bytes = 64 << 10,
                                .ring_bytes = 2 << 20, .faults = &f, .force_pread = pread};
        struct loader_stats stt;
        struct sl_err err;
        assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
        assert_true(stt.retries > 0);
        /* an I/O error: reported with the file and the offset, no crash, no hang */
        struct loader_faults e = {.eio_at = 10};
        o.faults = &e;
        int ret = stream_check(r, n, &o, content, &stt, &err, 0);
        assert_int_equal(ret, -EIO);
        assert_non_null(strstr(err.msg, path));
        assert_non_null(strstr(err.msg, "offset"));
    }
}

static void test_fallbacks(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 4);
    struct loader_request r[32];
    uint32_t n = make_reqs(r, 32, 256 << 10, 1, &rng);
    struct loader_stats stt;
    struct sl_err err;
    /* io_uring setup fails: the pread pool takes over */
    struct loader_faults f = {.fail_uring_setup = 1};
    struct loader_opts o = {.faults = &f};
    assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
    assert_int_equal(stt.backend, LOADER_BACKEND_PREAD);
    assert_non_null(strstr(stt.note, "io_uring"));
    /* forced through the environment */
    setenv("SLUICE_LOADER", "pread", 1);
    assert_int_equal(stream_check(r, n, NULL, content, &stt, &err, 0), 0);
    assert_int_equal(stt.backend, LOADER_BACKEND_PREAD);
    unsetenv("SLUICE_LOADER");
    /* tmpfs refuses O_DIRECT: buffered, with a note */
    char shm[256];
    snprintf(shm, sizeof shm, "/dev/shm/sluice-loader-test.%d", (int)getpid());
    FILE *fp = fopen(shm, "wb");
    if (!fp) {
        fprintf(stderr, "note: /dev/shm unavailable, O_DIRECT refusal not tested\n");
        return;
    }
    fwrite(content, 1, 8 << 20, fp);
    fclose(fp);
    struct loader_request rs[4];
    for (int i = 0; i < 4; i++)
        rs[i] = (struct loader_request){.path = shm, .fd = -1, .offset = (uint64_t)i << 21,
                                        .length = 2 << 20, .tag = (uint64_t)i};
    int ret = stream_check(rs, 4, NULL, content, &stt, &err, 0);
    unlink(shm);
    assert_int_equal(ret, 0);
    if (stt.direct) {
        /* tmpfs accepts O_DIRECT since Linux 6.6: refuse it by injection */
        fprintf(stderr, "note: this kernel's tmpfs accepts O_DIRECT; injecting EINVAL instead\n");
        struct loader_faults fe = {.direct_einval = 1};
        struct loader_opts oe = {.faults = &fe};
        assert_int_equal(stream_check(r, n, &oe, content, &stt, &err, 0), 0);
    }
    assert_int_equal(stt.direct, 0);
    assert_non_null(strstr(stt.note, "O_DIRECT"));
    /* a missing file fails at open with its name */
    struct loader_request miss = {.path = "/nonexistent/model.sluice", .fd = -1, .length = 4096};
    struct loader_stream *s;
    assert_int_equal(loader_stream_open(&miss, 1, NULL, &s, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "/nonexistent/model.sluice"));
}

static void test_container(void **st)
{
    (void)st;
    char model[4096];
    snprintf(model, sizeof model, "%s/tiny.sluice", test_tmpdir());
    struct sl_err err;
    assert_int_equal(quantizer_synth("tiny", 3, model, NULL, NULL, &err), 0);
    struct format_reader *r;
    assert_int_equal(format_reader_open(model, &r, &err), 0);
    struct loader_request *reqs;
    uint32_t n;
    assert_int_equal(loader_requests_from_container(r, NULL, &reqs, &n, &err), 0);
    assert_int_equal(n, format_reader_n_slices(r));
    struct loader_opts o = {.ring_bytes = 64 << 10}; /* smaller than a slice: grows */
    struct loader_stream *s;
    assert_int_equal(loader_stream_open(reqs, n, &o, &s, &err), 0);
    struct loader_slice sl;
    uint32_t k = 0;
    while (loader_stream_next(s, &sl, &err) == 1) {
        assert_int_equal(format_slice_verify(r, (uint32_t)sl.tag, sl.data, &err), 0);
        loader_stream_release(s, &sl);
        k++;
    }
    assert_int_equal(k, n);
    loader_stream_close(s);
    /* a batch of small reads (embedding rows) */
    int fd = open(model, O_RDONLY);
    uint64_t offs[3] = {0, 8192, 100}, lens[3] = {64, 4096, 7};
    uint8_t b0[64], b1[4096], b2[7];
    void *bufs[3] = {b0, b1, b2};
    assert_int_equal(loader_read_batch(fd, offs, lens, bufs, 3, &err), 0);
    uint8_t *whole = test_read_file(model, NULL);
    assert_memory_equal(b0, whole, 64);
    assert_memory_equal(b1, whole + 8192, 4096);
    assert_memory_equal(b2, whole + 100, 7);
    free(whole);
    close(fd);
    free(reqs);
    format_reader_close(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),     cmocka_unit_test(test_unaligned_and_large),
        cmocka_unit_test(test_faults),    cmocka_unit_test(test_fallbacks),
        cmocka_unit_test(test_container),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
