/* test_fs_store.c: the machinery behind the FUSE callbacks, without a mount
 * (so it also runs under the sanitizers): the node table, verified slices in
 * memory and through the page cache, prefetch, eviction under 16 concurrent
 * readers, corrupt and changed containers, the SIGBUS guard, the int8 and
 * scales views at random offsets against unpack_tensor_int8, options and
 * stats.json. */
#include <cjson/cJSON.h>
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

#include "../../fs/fs_internal.h"
#include "fs_testmodel.h"
#include "testutil.h"
#include "unpack.h"

static const char *dir;
static char model[PATH_MAX];
static uint8_t *content;
static size_t content_len;

static struct fs_state *state_open(const char *path, const char *opts)
{
    struct fs_state *s = calloc(1, sizeof *s);
    assert_non_null(s);
    fs_options_init(&s->opts);
    s->log_fd = -1;
    s->mount_ns = sl_now_ns();
    struct sl_err err = {{0}};
    char *words = strdup(opts ? opts : ""), *save = NULL;
    for (char *w = strtok_r(words, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        assert_int_equal(fs_options_parse(&s->opts, w, &err), 1);
        if (!strncmp(w, "log=", 4)) { /* what fs_mount_run does with it */
            s->log_fd = open(w + 4, O_WRONLY | O_CREAT | O_APPEND, 0644);
            assert_true(s->log_fd >= 0);
            s->opts.log_path = NULL;
        }
    }
    free(words);
    assert_non_null(realpath(path, s->container));
    assert_int_equal(format_reader_open(s->container, &s->r, &err), 0);
    assert_int_equal(fs_gguf_create(s, &err), 0); /* as fs_mount_run does */
    assert_int_equal(fs_tree_build(s, &err), 0);
    assert_int_equal(fs_store_create(s, &s->store, &err), 0);
    assert_int_equal(fs_store_start(s->store, &err), 0);
    return s;
}

static void state_close(struct fs_state *s)
{
    fs_store_destroy(s->store);
    gguf_view_destroy(s->gguf);
    fs_tree_free(s);
    format_reader_close(s->r);
    if (s->log_fd >= 0)
        close(s->log_fd);
    free(s);
}

static struct fs_node *find(struct fs_state *s, const char *d, const char *name)
{
    struct fs_node *dn = fs_tree_lookup(s, 0, d);
    assert_non_null(dn);
    return fs_tree_lookup(s, (uint32_t)(dn->ino - 1), name);
}

/* ---- the node table ------------------------------------------------------------------ */

static void test_tree(void **st)
{
    (void)st;
    struct fs_state *s = state_open(model, NULL), *s2 = state_open(model, NULL);
    const char *top[] = {"config.json", "tokenizer.bin", "manifest.json", "stats.json", "model.gguf",
                         "embed", "layer.000", "layer.001", "layer.002", "head"};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        assert_non_null(fs_tree_lookup(s, 0, top[i]));
    assert_null(fs_tree_lookup(s, 0, "layer.003"));
    assert_null(fs_tree_lookup(s, 0, "nothing"));
    uint32_t nt = format_reader_n_tensors(s->r);
    for (uint32_t t = 0; t < nt; t++) {
        const struct format_tensor_info *ti = format_reader_tensor(s->r, t);
        const struct format_slice_info *si = format_reader_slice(s->r, ti->slice);
        char d[32], f[64];
        fs_slice_dirname(si, d, sizeof d);
        snprintf(f, sizeof f, "%s.bin", format_role_name(ti->role));
        struct fs_node *n = find(s, d, f);
        assert_non_null(n);
        assert_int_equal(n->kind, FS_RANGE);
        assert_int_equal(n->size, ti->length);
        assert_int_equal(n->off, ti->offset - si->offset);
        /* inode numbers depend on the container only */
        assert_int_equal(find(s2, d, f)->ino, n->ino);
        snprintf(f, sizeof f, "%s.int8", format_role_name(ti->role));
        struct fs_node *v = find(s, d, f);
        if (format_encoding_traits(ti->encoding)->quantized) {
            assert_non_null(v);
            assert_int_equal(v->size, ti->shape[0] * ti->shape[1]);
            snprintf(f, sizeof f, "%s.scales", format_role_name(ti->role));
            assert_int_equal(find(s, d, f)->size, ti->shape[0] * 4);
        } else {
            assert_null(v);
        }
    }
    for (uint32_t i = 0; i < format_reader_n_slices(s->r); i++) {
        char d[32];
        fs_slice_dirname(format_reader_slice(s->r, i), d, sizeof d);
        assert_int_equal(find(s, d, "slice.bin")->size, format_reader_slice(s->r, i)->length);
    }
    /* manifest.json agrees with the index */
    struct fs_node *m = fs_tree_lookup(s, 0, "manifest.json");
    cJSON *j = cJSON_ParseWithLength(m->data, m->size);
    assert_non_null(j);
    cJSON *ts = cJSON_GetObjectItem(j, "tensors");
    assert_int_equal(cJSON_GetArraySize(ts), nt);
    for (uint32_t t = 0; t < nt; t++) {
        const struct format_tensor_info *ti = format_reader_tensor(s->r, t);
        cJSON *e = cJSON_GetArrayItem(ts, (int)t);
        assert_string_equal(cJSON_GetObjectItem(e, "name")->valuestring, ti->name);
        assert_int_equal((uint64_t)cJSON_GetObjectItem(e, "offset")->valuedouble, ti->offset);
        assert_int_equal((uint64_t)cJSON_GetObjectItem(e, "length")->valuedouble, ti->length);
        char sum[17];
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)ti->checksum);
        assert_string_equal(cJSON_GetObjectItem(e, "checksum")->valuestring, sum);
        cJSON *h = cJSON_GetObjectItem(e, "bits_hist");
        assert_int_equal(cJSON_GetArraySize(h), FORMAT_MAX_BITS);
        for (int b = 1; b <= FORMAT_MAX_BITS; b++)
            assert_int_equal((uint32_t)cJSON_GetArrayItem(h, b - 1)->valuedouble, ti->bits_hist[b]);
    }
    cJSON_Delete(j);
    state_close(s2);
    state_close(s);
}

/* ---- slices ----------------------------------------------------------------------------- */

static void check_slices(const char *opts)
{
    struct fs_state *s = state_open(model, opts);
    for (uint32_t i = 0; i < format_reader_n_slices(s->r); i++) {
        const struct format_slice_info *si = format_reader_slice(s->r, i);
        struct fs_pin pin;
        assert_int_equal(fs_slice_acquire(s, i, &pin), 0);
        assert_int_equal(pin.mapped, s->opts.pagecache);
        assert_int_equal(pin.pos, (off_t)si->offset);
        assert_memory_equal(pin.data, content + si->offset, si->length);
        fs_slice_release(s, &pin);
    }
    assert_int_equal(fs_slice_acquire(s, format_reader_n_slices(s->r), &(struct fs_pin){0}),
                     -EINVAL);
    state_close(s);
}

static void test_slices_memory(void **st)
{
    (void)st;
    check_slices(NULL);
}

static void test_slices_pagecache(void **st)
{
    (void)st;
    check_slices("pagecache");
}

/* Sequential reading: every slice after the first was queued by a prefetch
 * before the reader asked; without prefetch, every first access waits. */
static void test_prefetch(void **st)
{
    (void)st;
    for (int depth = 0; depth <= 2; depth++) {
        char o[32];
        snprintf(o, sizeof o, "prefetch=%d", depth);
        struct fs_state *s = state_open(model, o);
        uint32_t n = format_reader_n_slices(s->r);
        for (uint32_t i = 0; i < n; i++) {
            struct fs_pin pin;
            assert_int_equal(fs_slice_acquire(s, i, &pin), 0);
            fs_slice_release(s, &pin);
        }
        struct fs_store_stats ss;
        fs_store_get_stats(s->store, &ss);
        uint64_t total = 0;
        for (uint32_t i = 0; i < n; i++)
            total += format_reader_slice(s->r, i)->length;
        fprintf(stderr, "depth %d: loads %llu hits %llu prefetches %llu waits %llu\n", depth, (unsigned long long)ss.loads, (unsigned long long)ss.prefetch_hits, (unsigned long long)ss.prefetches, (unsigned long long)ss.waits);
        assert_int_equal(ss.loads, n); /* each slice read once */
        assert_int_equal(ss.bytes_read, total);
        assert_int_equal(ss.prefetch_hits, depth ? n - 1 : 0);
        /* a prefetch still queued when the reader comes is a demand load */
        assert_true(ss.prefetches <= (depth ? n - 1 : 0));
        if (!depth)
            assert_int_equal(ss.waits, n);
        state_close(s);
    }
}

struct hammer {
    struct fs_state *s;
    const uint8_t *truth; /* the container's bytes */
    uint64_t seed;
    int bad;
};

static void *hammer_main(void *p)
{
    struct hammer *h = p;
    struct test_rng g;
    test_rng_init(&g, h->seed);
    uint32_t n = format_reader_n_slices(h->s->r);
    for (int it = 0; it < 300; it++) {
        uint32_t i = test_rng_below(&g, n);
        const struct format_slice_info *si = format_reader_slice(h->s->r, i);
        uint64_t off = test_rng_below(&g, (uint32_t)si->length);
        uint64_t len = 1 + test_rng_below(&g, (uint32_t)(si->length - off));
        struct fs_pin pin;
        if (fs_slice_acquire(h->s, i, &pin) != 0) {
            h->bad = 1;
            continue;
        }
        if (memcmp(pin.data + off, h->truth + si->offset + off, len))
            h->bad = 1;
        fs_slice_release(h->s, &pin);
    }
    return NULL;
}

/* 16 readers at random slices and offsets, with a budget (1 MiB) smaller
 * than the slices served from memory together: loads, evictions and reloads
 * race with the readers' pins. A model of its own, with enough layers that
 * the memory slices cannot all fit whatever their random sizes. */
static void test_concurrent_eviction(void **st)
{
    (void)st;
    char path[PATH_MAX];
    struct sl_err err;
    snprintf(path, sizeof path, "%s/evict.sluice", dir);
    if (fs_test_model_write(path, test_seed() + 99, 10, 256, &err) < 0)
        fail_msg("writing %s: %s", path, err.msg);
    size_t len;
    uint8_t *truth = test_read_file(path, &len);
    assert_non_null(truth);
    struct fs_state *s = state_open(path, "cache_mb=1");
    uint32_t n = format_reader_n_slices(s->r), mem = 0;
    uint64_t mem_bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t l = format_reader_slice(s->r, i)->length;
        if (l <= (1u << 19)) {
            mem++;
            mem_bytes += l;
        }
    }
    pthread_t th[16];
    struct hammer h[16];
    for (int i = 0; i < 16; i++) {
        h[i] = (struct hammer){s, truth, test_seed() + (uint64_t)i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, hammer_main, &h[i]), 0);
    }
    for (int i = 0; i < 16; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(h[i].bad, 0);
    }
    /* one more pass in order: it must evict even if the hammering's timing
     * never made it (readers waiting on a slot keep it loaded) */
    for (uint32_t i = 0; i < n; i++) {
        struct fs_pin pin;
        assert_int_equal(fs_slice_acquire(s, i, &pin), 0);
        fs_slice_release(s, &pin);
    }
    struct fs_store_stats ss;
    fs_store_get_stats(s->store, &ss);
    fprintf(stderr,
            "%u slices, %u in memory (%llu bytes): %llu loads, %llu evictions, %llu waits\n", n,
            mem, (unsigned long long)mem_bytes, (unsigned long long)ss.loads,
            (unsigned long long)ss.evictions, (unsigned long long)ss.waits);
    assert_true(mem >= 3);
    assert_true(mem_bytes > ss.budget);
    assert_true(ss.evictions > 0);
    assert_true(ss.resident <= ss.budget);
    state_close(s);
    free(truth);
    unlink(path);
}

/* ---- corrupt and changed containers -------------------------------------------------------- */

static void write_copy(const char *path, const uint8_t *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void check_corrupt(const char *mode)
{
    char bad[PATH_MAX], log[PATH_MAX], opts[PATH_MAX + 32];
    snprintf(bad, sizeof bad, "%s/bad-%s.sluice", dir, mode);
    snprintf(log, sizeof log, "%s/bad-%s.log", dir, mode);
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open(model, &r, &err), 0);
    const struct format_slice_info *si = format_reader_slice(r, 2); /* layer 1 */
    uint8_t *c = malloc(content_len);
    memcpy(c, content, content_len);
    c[si->offset + si->length / 3] ^= 0x01;
    write_copy(bad, c, content_len);
    free(c);
    format_reader_close(r);
    snprintf(opts, sizeof opts, "%s%slog=%s", mode, *mode ? "," : "", log);
    struct fs_state *s = state_open(bad, opts);
    struct fs_pin pin;
    assert_int_equal(fs_slice_acquire(s, 2, &pin), -EIO);
    assert_int_equal(fs_slice_acquire(s, 2, &pin), -EIO); /* the verdict is kept */
    assert_int_equal(fs_slice_acquire(s, 1, &pin), 0);
    fs_slice_release(s, &pin);
    assert_int_equal(fs_slice_acquire(s, 3, &pin), 0);
    fs_slice_release(s, &pin);
    /* the views of the bad slice fail too */
    struct fs_view *v;
    assert_int_equal(fs_view_open(s, find(s, "layer.001", "wq.int8"), &v), -EIO);
    struct fs_store_stats ss;
    fs_store_get_stats(s->store, &ss);
    assert_int_equal(ss.verify_failures, 1);
    state_close(s);
    char *text = test_read_file(log, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "checksum mismatch"));
    assert_non_null(strstr(text, "layer 1"));
    free(text);
}

static void test_corrupt_memory(void **st)
{
    (void)st;
    check_corrupt("");
}

static void test_corrupt_pagecache(void **st)
{
    (void)st;
    check_corrupt("pagecache");
}

/* A container rewritten in place after mount: page-cache slices refuse
 * (their bytes are no longer the verified ones); memory slices serve their
 * verified copies. */
static void test_changed(void **st)
{
    (void)st;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/changed.sluice", dir);
    write_copy(p, content, content_len);
    struct fs_state *pc = state_open(p, "pagecache"), *mem = state_open(p, NULL);
    struct fs_pin pin;
    assert_int_equal(fs_slice_acquire(pc, 1, &pin), 0);
    fs_slice_release(pc, &pin);
    assert_int_equal(fs_slice_acquire(mem, 1, &pin), 0);
    fs_slice_release(mem, &pin);
    struct timespec ts[2] = {{0, UTIME_NOW}, {12345, 0}};
    assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
    assert_int_equal(fs_slice_acquire(pc, 1, &pin), -EIO);
    assert_int_equal(fs_slice_acquire(mem, 1, &pin), 0);
    assert_memory_equal(pin.data, content + format_reader_slice(mem->r, 1)->offset,
                        format_reader_slice(mem->r, 1)->length);
    fs_slice_release(mem, &pin);
    state_close(pc);
    state_close(mem);
}

static int touch_fn(void *p)
{
    volatile const uint8_t *b = p;
    return b[8192] == 0x5a ? 1 : 0;
}

/* A mapping whose file shrank: the access raises SIGBUS, the guard makes it
 * -EIO; outside the guard nothing changes. */
static void test_sigbus_guard(void **st)
{
    (void)st;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/shrinks", dir);
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    uint8_t page[4096];
    memset(page, 0x5a, sizeof page);
    for (int i = 0; i < 4; i++)
        assert_int_equal(write(fd, page, sizeof page), (ssize_t)sizeof page);
    uint8_t *m = mmap(NULL, 4 * 4096, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    /* install the store's handler */
    struct fs_state *s = state_open(model, NULL);
    assert_int_equal(fs_guarded(touch_fn, m), 1);
    assert_int_equal(ftruncate(fd, 4096), 0);
    assert_int_equal(fs_guarded(touch_fn, m), -EIO);
    assert_int_equal(fs_guarded(touch_fn, m), -EIO); /* and again: the mask was restored */
    state_close(s);
    munmap(m, 4 * 4096);
    close(fd);
}

/* ---- views ------------------------------------------------------------------------------ */

static void check_views(const char *opts)
{
    struct fs_state *s = state_open(model, opts);
    struct test_rng g;
    test_rng_init(&g, test_seed() ^ 0x77);
    int checked = 0;
    for (uint32_t t = 0; t < format_reader_n_tensors(s->r); t++) {
        const struct format_tensor_info *ti = format_reader_tensor(s->r, t);
        if (!format_encoding_traits(ti->encoding)->quantized)
            continue;
        uint64_t rows = ti->shape[0], cols = ti->shape[1];
        int8_t *q = malloc(rows * cols);
        float *sc = malloc(rows * 4);
        struct sl_err err;
        assert_int_equal(unpack_tensor_int8(ti, content + ti->offset, q, sc, &err), 0);
        char d[32], f[64];
        fs_slice_dirname(format_reader_slice(s->r, ti->slice), d, sizeof d);
        snprintf(f, sizeof f, "%s.int8", format_role_name(ti->role));
        struct fs_view *v;
        assert_int_equal(fs_view_open(s, find(s, d, f), &v), 0);
        char *buf = malloc(rows * cols + 100);
        /* the whole view, then random pieces (row-crossing, partial rows, past the end) */
        assert_int_equal(fs_view_read(s, v, buf, rows * cols + 100, 0), (ssize_t)(rows * cols));
        assert_memory_equal(buf, q, rows * cols);
        for (int k = 0; k < 50; k++) {
            uint64_t off = test_rng_below(&g, (uint32_t)(rows * cols + 10));
            size_t size = 1 + test_rng_below(&g, (uint32_t)(3 * cols));
            ssize_t got = fs_view_read(s, v, buf, size, off);
            uint64_t want = off >= rows * cols ? 0
                            : size < rows * cols - off ? size
                                                       : rows * cols - off;
            assert_int_equal(got, (ssize_t)want);
            assert_memory_equal(buf, q + (off < rows * cols ? off : 0), want);
        }
        fs_view_close(v);
        snprintf(f, sizeof f, "%s.scales", format_role_name(ti->role));
        assert_int_equal(fs_view_open(s, find(s, d, f), &v), 0);
        assert_int_equal(fs_view_read(s, v, buf, rows * 4 + 8, 0), (ssize_t)(rows * 4));
        for (uint64_t r = 0; r < rows; r++)
            assert_true(sl_load_lef32(buf + 4 * r) == sc[r]);
        assert_int_equal(fs_view_read(s, v, buf, 6, rows * 4 - 2), 2);
        fs_view_close(v);
        free(buf);
        free(q);
        free(sc);
        checked++;
    }
    assert_true(checked >= 8);
    state_close(s);
}

static void test_views_memory(void **st)
{
    (void)st;
    check_views(NULL);
}

static void test_views_pagecache(void **st)
{
    (void)st;
    check_views("pagecache");
}

/* ---- options and stats ------------------------------------------------------------------- */

static void test_options(void **st)
{
    (void)st;
    struct fs_options o;
    struct sl_err err;
    fs_options_init(&o);
    assert_int_equal(o.max_background, 128);
    assert_int_equal(o.max_pages, 256);
    assert_int_equal(o.prefetch, 1);
    assert_int_equal(o.splice, 1);
    assert_int_equal(fs_options_parse(&o, "max_background=12", &err), 1);
    assert_int_equal(o.max_background, 12);
    assert_int_equal(fs_options_parse(&o, "max_pages=32", &err), 1);
    assert_int_equal(fs_options_parse(&o, "max_pages=257", &err), -EINVAL);
    assert_non_null(strstr(err.msg, "max_pages"));
    assert_int_equal(fs_options_parse(&o, "max_pages=", &err), -EINVAL);
    assert_int_equal(fs_options_parse(&o, "prefetch=x", &err), -EINVAL);
    assert_int_equal(fs_options_parse(&o, "max_background=0", &err), -EINVAL);
    assert_int_equal(fs_options_parse(&o, "nosplice", &err), 1);
    assert_int_equal(o.splice, 0);
    assert_int_equal(fs_options_parse(&o, "no_keep_cache", &err), 1);
    assert_int_equal(o.keep_cache, 0);
    assert_int_equal(fs_options_parse(&o, "direct_io", &err), 1);
    assert_int_equal(o.direct_io, 1);
    assert_int_equal(fs_options_parse(&o, "cgroup=/x/y", &err), 1);
    assert_string_equal(o.cgroup, "/x/y");
    assert_int_equal(fs_options_parse(&o, "allow_other", &err), 0); /* for libfuse */
    assert_int_equal(fs_options_parse(&o, "fsname=x", &err), 0);
}

static void test_stats(void **st)
{
    (void)st;
    struct fs_state *s = state_open(model, NULL);
    struct fs_node *n = find(s, "layer.000", "slice.bin");
    atomic_fetch_add(&n->bytes_served, 1000);
    atomic_fetch_add(&n->reads_served, 2);
    struct fs_pin pin;
    assert_int_equal(fs_slice_acquire(s, 1, &pin), 0);
    fs_slice_release(s, &pin);
    size_t len;
    char *text = fs_stats_json(s, &len);
    assert_non_null(text);
    assert_int_equal(strlen(text), len);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    assert_int_equal((int)cJSON_GetObjectItem(j, "pid")->valuedouble, getpid());
    cJSON *f = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "files"), "layer.000/slice.bin");
    assert_non_null(f);
    assert_int_equal((int)cJSON_GetObjectItem(f, "bytes")->valuedouble, 1000);
    assert_int_equal((int)cJSON_GetObjectItem(f, "reads")->valuedouble, 2);
    assert_int_equal((int)cJSON_GetObjectItem(j, "bytes")->valuedouble, 1000);
    cJSON *store = cJSON_GetObjectItem(j, "store");
    assert_true(cJSON_GetObjectItem(store, "loads")->valuedouble >= 1);
    cJSON_Delete(j);
    free(text);
    /* one size for the whole mount, even with every counter at its widest */
    assert_int_equal(len, fs_tree_lookup(s, 0, "stats.json")->size);
    for (uint32_t i = 1; i < s->n_nodes; i++) {
        atomic_store(&s->nodes[i].bytes_served, UINT64_MAX);
        atomic_store(&s->nodes[i].reads_served, UINT64_MAX);
    }
    text = fs_stats_json(s, &len);
    assert_int_equal(len, fs_tree_lookup(s, 0, "stats.json")->size);
    j = cJSON_Parse(text);
    assert_non_null(j); /* nothing was cut */
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "files")), s->n_nodes - 1 - 5);
    cJSON_Delete(j);
    free(text);
    state_close(s);
}

int main(void)
{
    dir = test_tmpdir();
    if (!dir)
        test_skip_all("no temporary directory");
    snprintf(model, sizeof model, "%s/m.sluice", dir);
    struct sl_err err = {{0}};
    if (fs_test_model_write(model, test_seed(), 3, 256, &err) < 0)
        fail_msg("writing the test model: %s", err.msg);
    content = test_read_file(model, &content_len);
    if (!content)
        fail_msg("reading %s", model);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree),
        cmocka_unit_test(test_slices_memory),
        cmocka_unit_test(test_slices_pagecache),
        cmocka_unit_test(test_prefetch),
        cmocka_unit_test(test_concurrent_eviction),
        cmocka_unit_test(test_corrupt_memory),
        cmocka_unit_test(test_corrupt_pagecache),
        cmocka_unit_test(test_changed),
        cmocka_unit_test(test_sigbus_guard),
        cmocka_unit_test(test_views_memory),
        cmocka_unit_test(test_views_pagecache),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_stats),
    };
    int ret = cmocka_run_group_tests(tests, NULL, NULL);
    free(content);
    return ret;
}
