/* test_loader.c: the streaming loader delivers every request's bytes, whole
 * and in order, inside its ring, whatever happens underneath: out-of-order
 * completions, injected short reads, EAGAIN, EINTR and ENOMEM, an EIO
 * (reported with file and offset), io_uring unavailable (pread pool), O_DIRECT
 * refused (tmpfs, or injected where tmpfs accepts it), unaligned ranges,
 * requests larger than the ring, a consumer that holds slices (their bytes
 * must survive until released), a consumer on another thread, caller
 * descriptors, a real container's slices with their checksums, and
 * requests read into buffers of their own (no ring). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "import.h"
#include "loader.h"
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

/* Streams reqs and checks every byte, tag and the order. The consumer keeps
 * up to `hold` slices unreleased and checks their bytes again when it
 * releases them (the ring must not have reused their space); `slow` sleeps
 * per slice. Returns next()'s final value; fills the stats. */
static int stream_check_hold(const struct loader_request *reqs, uint32_t n,
                             const struct loader_opts *o, const uint8_t *truth,
                             struct loader_stats *stats, struct sl_err *err, int slow,
                             uint32_t hold)
{
    struct loader_stream *s;
    int ret = loader_stream_open(reqs, n, o, &s, err);
    if (ret < 0)
        return ret;
    struct loader_slice held[8];
    uint32_t nheld = 0, expect = 0;
    assert_true(hold <= 8);
    struct loader_slice sl;
    while ((ret = loader_stream_next(s, &sl, err)) == 1) {
        assert_int_equal(sl.index, expect);
        assert_int_equal(sl.tag, reqs[expect].tag);
        assert_int_equal(sl.length, reqs[expect].length);
        assert_int_equal((uintptr_t)sl.data % 4096, 0);
        if (memcmp(sl.data, truth + reqs[expect].offset, sl.length) != 0)
            fail_msg("request %u: bytes differ", expect);
        if (slow)
            usleep(2000);
        if (hold) {
            if (nheld == hold) {
                const struct loader_slice *h = &held[0];
                if (memcmp(h->data, truth + reqs[h->index].offset, h->length) != 0)
                    fail_msg("request %u: overwritten before it was released", h->index);
                loader_stream_release(s, h);
                memmove(held, held + 1, sizeof held[0] * (hold - 1));
                nheld--;
            }
            held[nheld++] = sl;
        } else {
            loader_stream_release(s, &sl);
        }
        expect++;
    }
    for (uint32_t i = 0; i < nheld; i++) {
        if (ret == 0 && memcmp(held[i].data, truth + reqs[held[i].index].offset,
                               held[i].length) != 0)
            fail_msg("request %u: overwritten before it was released", held[i].index);
        loader_stream_release(s, &held[i]);
    }
    if (ret == 0)
        assert_int_equal(expect, n);
    loader_stream_stats(s, stats);
    loader_stream_close(s);
    if (ret == 0) {
        assert_int_equal(stats->requests, n);
        assert_true(stats->peak_bytes <= stats->ring_bytes);
    }
    return ret;
}

static int stream_check(const struct loader_request *reqs, uint32_t n,
                        const struct loader_opts *o, const uint8_t *truth,
                        struct loader_stats *stats, struct sl_err *err, int slow)
{
    return stream_check_hold(reqs, n, o, truth, stats, err, slow, 0);
}

/* Consecutive requests of 1..8 size units (plus up to 4000 bytes, and
 * unaligned offsets, when !aligned). */
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
    /* always_direct: the test wrote the file, it is in the page cache */
    struct loader_opts o = {.queue_depth = 8, .chunk_bytes = 128 << 10, .ring_bytes = 4 << 20,
                            .always_direct = 1};
    struct loader_stats stt;
    struct sl_err err;
    assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
    assert_int_equal(stt.backend, LOADER_BACKEND_URING);
    assert_int_equal(stt.ring_bytes, 4 << 20); /* as asked: larger than any request + chunk */
    assert_int_equal(stt.direct, 1);           /* ext4/xfs/btrfs under $TMPDIR take O_DIRECT */
    assert_int_equal(stt.bytes, r[n - 1].offset + r[n - 1].length);
    fprintf(stderr, "basic: %u requests, %llu reads, direct %d, fixed %d, mirror %d, peak %llu "
            "of %llu ring bytes, %llu out of order\n", n, (unsigned long long)stt.reads,
            stt.direct, stt.fixed, stt.mirror, (unsigned long long)stt.peak_bytes,
            (unsigned long long)stt.ring_bytes, (unsigned long long)stt.out_of_order);
    if (geteuid() == 0)
        assert_int_equal(stt.fixed, 1); /* no RLIMIT_MEMLOCK in the way */
    /* plain reads, no registration; and the default ring */
    o.no_register = 1;
    assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
    assert_int_equal(stt.fixed, 0);
    assert_int_equal(stream_check(r, n, NULL, content, &stt, &err, 0), 0);
    assert_true(stt.ring_bytes >= (32u << 20));
    /* nothing to read */
    struct loader_stream *s;
    struct loader_slice sl;
    assert_int_equal(loader_stream_open(r, 0, NULL, &s, &err), 0);
    assert_int_equal(loader_stream_next(s, &sl, &err), 0);
    loader_stream_close(s);
    loader_stream_close(NULL);
}

/* The consumer keeps slices unreleased: the ring fills, the reader waits,
 * nothing is overwritten early, nothing is lost; with the ring mirrored and
 * plain, and slices that wrap around the ring's end. */
static void test_bounded_ring(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 2);
    struct loader_request r[64];
    uint32_t n = make_reqs(r, 64, 192 << 10, 1, &rng); /* up to 1.5 MiB, sizes not dividing the ring */
    for (int mirror = 1; mirror >= 0; mirror--) {
        struct loader_faults f = {.no_mirror = !mirror};
        /* holding 2 slices of up to 1.5 MiB while the next is read needs 4.5 MiB;
         * the plain ring can lose up to one request (1.5 MiB) at its end */
        uint64_t ring = mirror ? 5u << 20 : 7u << 20;
        struct loader_opts o = {.queue_depth = 4, .chunk_bytes = 256 << 10,
                                .ring_bytes = ring, .faults = &f};
        struct loader_stats stt;
        struct sl_err err;
        for (uint32_t hold = 1; hold <= 2; hold++) {
            assert_int_equal(stream_check_hold(r, n, &o, content, &stt, &err, 1, hold), 0);
            assert_int_equal(stt.mirror, mirror);
            assert_int_equal(stt.ring_bytes, ring);
            assert_true(stt.peak_bytes <= stt.ring_bytes);
            /* the slow consumer let it fill: a 1.5 MiB request did not fit */
            assert_true(stt.peak_bytes > (mirror ? (7u << 19) : (2u << 20)));
        }
    }
}

static void test_unaligned(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 3);
    struct loader_request r[64];
    struct loader_stats stt;
    struct sl_err err;
    /* unaligned lengths and offsets: whatever cannot go O_DIRECT goes buffered */
    uint32_t n = make_reqs(r, 64, 64 << 10, 0, &rng);
    struct loader_opts o = {.queue_depth = 4, .chunk_bytes = 64 << 10, .ring_bytes = 1 << 20,
                            .always_direct = 1};
    assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
    assert_int_equal(stt.direct, 0);
    /* aligned offsets, unaligned lengths: the tails are read whole-block, still O_DIRECT */
    uint64_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        r[i].offset = off;
        off = (off + r[i].length + 4095) & ~4095ull;
    }
    assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
    assert_int_equal(stt.direct, 1);
    /* a request running to the end of the file whose length is not a block multiple */
    struct loader_request tail = {.path = path, .fd = -1, .offset = FILE_BYTES - 8192 - 4096,
                                  .length = 8192 + 4096};
    char odd[4096];
    snprintf(odd, sizeof odd, "%s.odd", path);
    FILE *fp = fopen(odd, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(content, 1, FILE_BYTES - 1000, fp), FILE_BYTES - 1000);
    fclose(fp);
    tail.path = odd;
    tail.length -= 1000;
    assert_int_equal(stream_check(&tail, 1, &o, content, &stt, &err, 0), 0);
    /* a request past the end of the file: an error naming it, no hang */
    tail.length += 1000;
    assert_int_equal(stream_check(&tail, 1, &o, content, &stt, &err, 0), -EIO);
    assert_non_null(strstr(err.msg, odd));
    assert_non_null(strstr(err.msg, "end of file"));
    unlink(odd);
}

/* Requests larger than the ring: the ring grows to the largest request plus
 * one chunk (a request is delivered whole), and no further. */
static void test_large_requests(void **st)
{
    (void)st;
    struct loader_request big[3];
    for (int i = 0; i < 3; i++)
        big[i] = (struct loader_request){.path = path, .fd = -1,
                                         .offset = 4096 + (uint64_t)i * (7 << 20),
                                         .length = 7 << 20, .tag = (uint64_t)i};
    struct loader_opts o = {.queue_depth = 4, .chunk_bytes = 64 << 10, .ring_bytes = 1 << 20};
    struct loader_stats stt;
    struct sl_err err;
    assert_int_equal(stream_check(big, 3, &o, content, &stt, &err, 0), 0);
    assert_int_equal(stt.ring_bytes, (7u << 20) + (64u << 10));
    assert_true(stt.peak_bytes <= stt.ring_bytes);
    /* also for the pread pool and the plain ring */
    struct loader_faults f = {.no_mirror = 1};
    o.faults = &f;
    o.force_pread = 1;
    assert_int_equal(stream_check(big, 3, &o, content, &stt, &err, 1), 0);
    assert_int_equal(stt.backend, LOADER_BACKEND_PREAD);
    assert_int_equal(stt.ring_bytes, (7u << 20) + (64u << 10));
}

/* Completions held back and handled after later ones: delivery stays in order. */
static void test_out_of_order(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 4);
    struct loader_request r[64];
    uint32_t n = make_reqs(r, 64, 64 << 10, 1, &rng);
    struct loader_faults f = {.delay_every = 3};
    for (int pread = 0; pread < 2; pread++) {
        struct loader_opts o = {.queue_depth = 8, .chunk_bytes = 32 << 10,
                                .ring_bytes = 2 << 20, .faults = &f, .force_pread = pread};
        struct loader_stats stt;
        struct sl_err err;
        /* parked completions reorder requests only if another request's
         * reads complete meanwhile, which depends on thread timing (a loaded
         * machine can serialize the pread workers): every pass checks the
         * contents, and some pass must have seen requests out of order */
        uint64_t seen = 0;
        for (int pass = 0; pass < 50 && !seen; pass++) {
            assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
            fprintf(stderr, "%s: %llu of %u requests completed out of order\n",
                    pread ? "pread" : "uring", (unsigned long long)stt.out_of_order, n);
            seen = stt.out_of_order;
        }
        assert_true(seen > 0);
    }
}

static void test_faults(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 5);
    struct loader_request r[64];
    uint32_t n = make_reqs(r, 64, 128 << 10, 1, &rng);
    struct {
        const char *name;
        struct loader_faults f;
    } plans[] = {
        {"short reads", {.short_read_every = 3}},
        {"EAGAIN", {.eagain_every = 4}},
        {"EINTR", {.eintr_every = 5}},
        {"ENOMEM", {.enomem_every = 6}},
        {"all", {.short_read_every = 3, .eagain_every = 5, .eintr_every = 7, .enomem_every = 11,
                 .delay_every = 13}},
    };
    for (int pread = 0; pread < 2; pread++) {
        for (size_t p = 0; p < sizeof plans / sizeof plans[0]; p++) {
            struct loader_opts o = {.queue_depth = 8, .chunk_bytes = 64 << 10,
                                    .ring_bytes = 2 << 20, .faults = &plans[p].f,
                                    .force_pread = pread};
            struct loader_stats stt;
            struct sl_err err;
            if (stream_check(r, n, &o, content, &stt, &err, 0) != 0)
                fail_msg("%s (%s): %s", plans[p].name, pread ? "pread" : "uring", err.msg);
            assert_true(stt.retries > 0);
            if (plans[p].f.enomem_every)
                assert_true(stt.min_depth < 8); /* fewer reads in flight */
        }
        /* an I/O error: reported with the file and the offset, no crash, no hang,
         * and it stays reported */
        struct loader_faults e = {.eio_at = 10};
        struct loader_opts o = {.queue_depth = 8, .chunk_bytes = 64 << 10, .ring_bytes = 2 << 20,
                                .faults = &e, .force_pread = pread};
        struct loader_stream *s;
        struct sl_err err;
        assert_int_equal(loader_stream_open(r, n, &o, &s, &err), 0);
        struct loader_slice sl;
        int ret;
        while ((ret = loader_stream_next(s, &sl, &err)) == 1)
            loader_stream_release(s, &sl);
        assert_int_equal(ret, -EIO);
        assert_non_null(strstr(err.msg, path));
        assert_non_null(strstr(err.msg, "offset"));
        memset(&err, 0, sizeof err);
        assert_int_equal(loader_stream_next(s, &sl, &err), -EIO);
        assert_non_null(strstr(err.msg, path));
        loader_stream_close(s);
    }
}

static int warnings;
static void count_warning(void *user, const char *msg)
{
    (void)user;
    assert_non_null(msg);
    warnings++;
}

static void test_fallbacks(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 6);
    struct loader_request r[32];
    uint32_t n = make_reqs(r, 32, 256 << 10, 1, &rng);
    struct loader_stats stt;
    struct sl_err err;
    /* io_uring setup fails (no io_uring in the kernel, or forbidden by
     * seccomp): the pread pool takes over, with a warning */
    int errs[2] = {ENOSYS, EPERM};
    for (int i = 0; i < 2; i++) {
        struct loader_faults f = {.uring_setup_errno = errs[i]};
        struct loader_opts o = {.faults = &f, .warn = count_warning};
        warnings = 0;
        assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
        assert_int_equal(stt.backend, LOADER_BACKEND_PREAD);
        assert_non_null(strstr(stt.note, "io_uring"));
        assert_non_null(strstr(stt.note, strerror(errs[i])));
        assert_int_equal(warnings, 1);
    }
    /* forced through the environment */
    setenv("SLUICE_LOADER", "pread", 1);
    struct loader_opts od = {.always_direct = 1};
    assert_int_equal(stream_check(r, n, &od, content, &stt, &err, 0), 0);
    assert_int_equal(stt.backend, LOADER_BACKEND_PREAD);
    assert_int_equal(stt.direct, 1);
    unsetenv("SLUICE_LOADER");
    /* O_DIRECT refused by the file system: at open, or at the first read */
    for (int at_read = 0; at_read < 2; at_read++) {
        struct loader_faults f = {.direct_open_einval = !at_read, .direct_read_einval = at_read};
        struct loader_opts o = {.faults = &f, .warn = count_warning, .always_direct = 1};
        warnings = 0;
        assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
        assert_int_equal(stt.direct, 0);
        assert_non_null(strstr(stt.note, "O_DIRECT"));
        assert_non_null(strstr(stt.note, path));
        assert_int_equal(warnings, 1); /* once per file */
    }
    /* tmpfs: refuses O_DIRECT before Linux 6.6, accepts it since */
    char shm[256];
    snprintf(shm, sizeof shm, "/dev/shm/sluice-loader-test.%d", (int)getpid());
    FILE *fp = fopen(shm, "wb");
    if (fp) {
        assert_int_equal(fwrite(content, 1, 8 << 20, fp), 8 << 20);
        fclose(fp);
        struct loader_request rs[4];
        for (int i = 0; i < 4; i++)
            rs[i] = (struct loader_request){.path = shm, .fd = -1, .offset = (uint64_t)i << 21,
                                            .length = 2 << 20, .tag = (uint64_t)i};
        /* tmpfs pages are page cache: by default it is read buffered */
        assert_int_equal(stream_check(rs, 4, NULL, content, &stt, &err, 0), 0);
        assert_int_equal(stt.direct, 0);
        assert_int_equal(stt.buffered_files, 1);
        assert_non_null(strstr(stt.note, "page cache"));
        int ret = stream_check(rs, 4, &od, content, &stt, &err, 0);
        unlink(shm);
        assert_int_equal(ret, 0);
        fprintf(stderr, "tmpfs: O_DIRECT %s\n", stt.direct ? "accepted" : "refused, read buffered");
        if (!stt.direct)
            assert_non_null(strstr(stt.note, "O_DIRECT"));
    } else {
        fprintf(stderr, "note: /dev/shm unavailable, the real tmpfs case not run\n");
    }
    /* a missing file fails at open with its name */
    struct loader_request miss = {.path = "/nonexistent/model.sluice", .fd = -1, .length = 4096};
    struct loader_stream *s;
    assert_int_equal(loader_stream_open(&miss, 1, NULL, &s, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "/nonexistent/model.sluice"));
    /* bad ranges */
    struct loader_request bad = {.path = path, .fd = -1, .offset = UINT64_MAX - 10, .length = 100};
    assert_int_equal(loader_stream_open(&bad, 1, NULL, &s, &err), -EINVAL);
    bad.offset = 0;
    bad.length = 0;
    assert_int_equal(loader_stream_open(&bad, 1, NULL, &s, &err), -EINVAL);
}

/* O_DIRECT for a cold file, buffered for one in the page cache. */
static void test_cache_policy(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 9);
    struct loader_request r[32];
    uint32_t n = make_reqs(r, 32, 256 << 10, 1, &rng);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fdatasync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0); /* out of the cache */
    struct loader_stats stt;
    struct sl_err err;
    assert_int_equal(stream_check(r, n, NULL, content, &stt, &err, 0), 0);
    if (!stt.direct)
        fprintf(stderr, "note: pages stayed cached after POSIX_FADV_DONTNEED (%s)\n", stt.note);
    else
        assert_int_equal(stt.buffered_files, 0);
    /* now cached: read buffered, with a note */
    struct loader_opts o = {.no_direct = 1};
    assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
    assert_int_equal(stream_check(r, n, NULL, content, &stt, &err, 0), 0);
    assert_int_equal(stt.direct, 0);
    assert_int_equal(stt.buffered_files, 1);
    assert_non_null(strstr(stt.note, "page cache"));
    assert_non_null(strstr(stt.note, path));
    close(fd);
}

/* Requests on the caller's descriptors (reopened with O_DIRECT when possible). */
static void test_descriptors(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 7);
    struct loader_request r[32];
    uint32_t n = make_reqs(r, 32, 256 << 10, 1, &rng);
    int fd = open(path, O_RDONLY);
    int dfd = open(path, O_RDONLY | O_DIRECT);
    assert_true(fd >= 0 && dfd >= 0);
    for (uint32_t i = 0; i < n; i++) {
        r[i].path = NULL;
        r[i].fd = i % 2 ? dfd : fd;
    }
    struct loader_stats stt;
    struct sl_err err;
    struct loader_opts od = {.always_direct = 1};
    assert_int_equal(stream_check(r, n, &od, content, &stt, &err, 0), 0);
    assert_int_equal(stt.direct, 1);
    struct loader_opts o = {.no_direct = 1};
    for (uint32_t i = 0; i < n; i++)
        r[i].fd = fd;
    assert_int_equal(stream_check(r, n, &o, content, &stt, &err, 0), 0);
    assert_int_equal(stt.direct, 0);
    /* the loader leaves the caller's descriptors open */
    assert_true(fcntl(fd, F_GETFD) >= 0 && fcntl(dfd, F_GETFD) >= 0);
    close(fd);
    close(dfd);
}

/* The consumer on its own thread, releasing from yet another. */
struct consumer {
    struct loader_stream *s;
    const struct loader_request *reqs;
    uint32_t got;
    int ret, bad;
    struct loader_slice pending[4];
    int npending;
    pthread_mutex_t lock;
};

static void *releaser(void *arg)
{
    struct consumer *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->lock);
        int done = c->ret <= 0 && c->npending == 0;
        if (c->npending) {
            struct loader_slice sl = c->pending[0];
            memmove(c->pending, c->pending + 1, sizeof sl * (size_t)(c->npending - 1));
            c->npending--;
            pthread_mutex_unlock(&c->lock);
            loader_stream_release(c->s, &sl);
            continue;
        }
        pthread_mutex_unlock(&c->lock);
        if (done)
            return NULL;
        usleep(100);
    }
}

static void *consume(void *arg)
{
    struct consumer *c = arg;
    struct loader_slice sl;
    int ret;
    struct sl_err err;
    while ((ret = loader_stream_next(c->s, &sl, &err)) == 1) {
        if (sl.index != c->got ||
            memcmp(sl.data, content + c->reqs[sl.index].offset, sl.length) != 0)
            c->bad = 1;
        c->got++;
        for (;;) {
            pthread_mutex_lock(&c->lock);
            if (c->npending < 4) {
                c->pending[c->npending++] = sl;
                pthread_mutex_unlock(&c->lock);
                break;
            }
            pthread_mutex_unlock(&c->lock);
            usleep(100);
        }
    }
    pthread_mutex_lock(&c->lock);
    c->ret = ret;
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

static void test_threads(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 8);
    struct loader_request r[64];
    uint32_t n = make_reqs(r, 64, 128 << 10, 1, &rng);
    struct loader_opts o = {.queue_depth = 8, .chunk_bytes = 128 << 10, .ring_bytes = 6 << 20};
    struct consumer c = {.reqs = r, .ret = 1};
    pthread_mutex_init(&c.lock, NULL);
    struct sl_err err;
    assert_int_equal(loader_stream_open(r, n, &o, &c.s, &err), 0);
    pthread_t t1, t2;
    assert_int_equal(pthread_create(&t1, NULL, consume, &c), 0);
    assert_int_equal(pthread_create(&t2, NULL, releaser, &c), 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    assert_int_equal(c.ret, 0);
    assert_int_equal(c.got, n);
    assert_int_equal(c.bad, 0);
    loader_stream_close(c.s);
    pthread_mutex_destroy(&c.lock);
    /* closed in the middle, with reads in flight and slices unreleased */
    struct loader_stream *s;
    assert_int_equal(loader_stream_open(r, n, &o, &s, &err), 0);
    struct loader_slice sl;
    assert_int_equal(loader_stream_next(s, &sl, &err), 1);
    loader_stream_close(s);
}

struct run_state {
    const struct format_reader *r;
    uint32_t k;
    int bad;
};

static int on_slice(void *user, const struct loader_slice *sl)
{
    struct run_state *rs = user;
    struct sl_err err;
    if (sl->index != rs->k || format_slice_verify(rs->r, (uint32_t)sl->tag, sl->data, &err) != 0)
        rs->bad = 1;
    rs->k++;
    return 0;
}

static int stop_at_two(void *user, const struct loader_slice *sl)
{
    (void)user;
    return sl->index == 2 ? 42 : 0;
}

static void test_container(void **st)
{
    (void)st;
    char model[4096], bad[4096];
    snprintf(model, sizeof model, "%s/tiny.sluice", test_tmpdir());
    snprintf(bad, sizeof bad, "%s/bad.sluice", test_tmpdir());
    struct sl_err err;
    assert_int_equal(import_synth("tiny", 3, model, NULL, NULL, &err), 0);
    struct format_reader *r;
    assert_int_equal(format_reader_open(model, &r, &err), 0);
    struct loader_request *reqs;
    uint32_t n;
    assert_int_equal(loader_requests_from_container(r, NULL, &reqs, &n, &err), 0);
    assert_int_equal(n, format_reader_n_slices(r));
    /* a ring smaller than a slice (it grows), checksums verified by the loader */
    struct loader_opts o = {.ring_bytes = 64 << 10, .verify = r, .chunk_bytes = 16 << 10};
    struct loader_stream *s;
    assert_int_equal(loader_stream_open(reqs, n, &o, &s, &err), 0);
    struct run_state rs = {.r = r};
    assert_int_equal(loader_stream_run(s, on_slice, &rs, &err), 0);
    assert_int_equal(rs.k, n);
    assert_int_equal(rs.bad, 0);
    struct loader_stats stt;
    loader_stream_stats(s, &stt);
    assert_int_equal(stt.requests, n);
    assert_true(stt.first_ns > 0 && stt.first_ns <= stt.elapsed_ns);
    loader_stream_close(s);
    /* the callback stops the stream */
    assert_int_equal(loader_stream_open(reqs, n, &o, &s, &err), 0);
    assert_int_equal(loader_stream_run(s, stop_at_two, NULL, &err), 42);
    loader_stream_close(s);
    /* a corrupt slice: -EIO naming the slice, nothing wrong delivered */
    size_t len;
    uint8_t *whole = test_read_file(model, &len);
    assert_non_null(whole);
    const struct format_slice_info *s1 = format_reader_slice(r, 1);
    whole[s1->offset + s1->length / 2] ^= 0x10;
    FILE *fp = fopen(bad, "wb");
    assert_int_equal(fwrite(whole, 1, len, fp), len);
    fclose(fp);
    whole[s1->offset + s1->length / 2] ^= 0x10;
    free(reqs);
    assert_int_equal(loader_requests_from_container(r, bad, &reqs, &n, &err), 0);
    assert_int_equal(loader_stream_open(reqs, n, &o, &s, &err), 0);
    struct loader_slice sl;
    int ret;
    uint32_t k = 0;
    while ((ret = loader_stream_next(s, &sl, &err)) == 1) {
        k++;
        loader_stream_release(s, &sl);
    }
    assert_int_equal(ret, -EIO);
    assert_int_equal(k, 1);
    assert_non_null(strstr(err.msg, "checksum"));
    assert_non_null(strstr(err.msg, bad));
    loader_stream_close(s);
    free(reqs);
    /* a verify tag that is not a slice of that length */
    struct loader_request odd = {.path = model, .fd = -1, .offset = 0, .length = 4096, .tag = 0};
    assert_int_equal(loader_stream_open(&odd, 1, &o, &s, &err), -EINVAL);
    /* the mount's layout */
    assert_int_equal(loader_requests_from_mount(r, "/mnt/m", &reqs, &n, &err), 0);
    assert_string_equal(reqs[0].path, "/mnt/m/embed/slice.bin");
    assert_string_equal(reqs[1].path, "/mnt/m/layer.000/slice.bin");
    assert_string_equal(reqs[n - 1].path, "/mnt/m/head/slice.bin");
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(reqs[i].offset, 0);
        assert_int_equal(reqs[i].length, format_reader_slice(r, i)->length);
        assert_int_equal(reqs[i].tag, i);
    }
    free(reqs);
    /* a batch of small reads (embedding rows), also through the pread path */
    int fd = open(model, O_RDONLY);
    uint64_t offs[3] = {0, 8192, 100}, lens[3] = {64, 4096, 7};
    for (int v = 0; v < 4; v++) { /* pread or io_uring, the descriptor or a reopened one */
        int pread = v & 1;
        uint8_t b0[64], b1[4096], b2[7];
        void *bufs[3] = {b0, b1, b2};
        if (pread)
            setenv("SLUICE_LOADER", "pread", 1);
        memset(b0, 0, sizeof b0);
        memset(b1, 0, sizeof b1);
        memset(b2, 0, sizeof b2);
        assert_int_equal(v < 2 ? loader_read_batch(fd, offs, lens, bufs, 3, &err)
                               : loader_read_batch_random(fd, offs, lens, bufs, 3, &err),
                         0);
        unsetenv("SLUICE_LOADER");
        assert_memory_equal(b0, whole, 64);
        assert_memory_equal(b1, whole + 8192, 4096);
        assert_memory_equal(b2, whole + 100, 7);
    }
    uint64_t past[1] = {len - 10}, plen[1] = {100};
    uint8_t pb[100];
    void *pbufs[1] = {pb};
    assert_int_equal(loader_read_batch(fd, past, plen, pbufs, 1, &err), -EIO);
    assert_non_null(strstr(err.msg, "end of file"));
    assert_int_equal(loader_read_batch_random(fd, past, plen, pbufs, 1, &err), -EIO);
    assert_non_null(strstr(err.msg, "end of file"));
    /* the reopened description is closed again: the next descriptor number
     * is the one the reopen took */
    int probe = open(model, O_RDONLY);
    assert_true(probe >= 0);
    assert_int_equal(loader_read_batch_random(fd, offs, lens, (void *[3]){whole, whole, whole}, 1,
                                              &err), 0);
    int probe2 = open(model, O_RDONLY);
    assert_int_equal(probe2, probe + 1);
    close(probe2);
    close(probe);
    free(whole);
    close(fd);
    format_reader_close(r);
}

/* Requests with buffers of their own: read straight into them (never the
 * ring: requests larger than the ring, held all at once), any backend, with
 * short reads and retries; the bytes stay the caller's after close. Mixed
 * or unaligned buffers are refused. */
static void test_own_buffers(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 11);
    struct loader_request r[8];
    uint64_t off = 0;
    for (uint32_t i = 0; i < 8; i++) {
        uint64_t len = (2u << 20) + test_rng_below(&rng, 4000) + 1; /* larger than the ring */
        r[i] = (struct loader_request){.path = path, .fd = -1, .offset = off, .length = len,
                                       .tag = 7 + i};
        off = (off + len + 4095) & ~4095ull;
    }
    uint8_t *bufs = sl_alloc_aligned(off, 4096);
    assert_non_null(bufs);
    for (uint32_t i = 0; i < 8; i++)
        r[i].dest = bufs + r[i].offset;
    struct loader_faults f = {.short_read_every = 3, .eagain_every = 5};
    for (int variant = 0; variant < 3; variant++) {
        memset(bufs, 0, off);
        struct loader_opts o = {.queue_depth = 4, .chunk_bytes = 256 << 10, .ring_bytes = 1 << 20,
                                .force_pread = variant == 1, .faults = variant == 2 ? &f : NULL};
        struct loader_stats stt;
        struct sl_err err;
        assert_int_equal(stream_check_hold(r, 8, &o, content, &stt, &err, 0, 8), 0);
        assert_int_equal(stt.peak_bytes, 0); /* nothing went through the ring */
        for (uint32_t i = 0; i < 8; i++) /* still there after close */
            assert_memory_equal(bufs + r[i].offset, content + r[i].offset, r[i].length);
    }
    struct loader_stream *s;
    struct sl_err err;
    struct loader_request mixed[2] = {r[0], r[1]};
    mixed[1].dest = NULL;
    assert_int_equal(loader_stream_open(mixed, 2, NULL, &s, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "every request"));
    mixed[1] = r[1];
    mixed[1].dest = bufs + 100;
    assert_int_equal(loader_stream_open(mixed, 2, NULL, &s, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "aligned"));
    sl_free_aligned(bufs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),         cmocka_unit_test(test_bounded_ring),
        cmocka_unit_test(test_unaligned),     cmocka_unit_test(test_large_requests),
        cmocka_unit_test(test_out_of_order),  cmocka_unit_test(test_faults),
        cmocka_unit_test(test_fallbacks),     cmocka_unit_test(test_descriptors),
        cmocka_unit_test(test_threads),       cmocka_unit_test(test_container),
        cmocka_unit_test(test_cache_policy),  cmocka_unit_test(test_own_buffers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
