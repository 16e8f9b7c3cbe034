/* test_fs.c: real mounts through the sluice binary (label "integration"),
 * what a mount serves; the daemon's life, mount errors, an ordinary user and
 * cgroups are in test_fs_life.c (one test binary).
 * Containers: one written here with the format writer (every quantized
 * encoding), one from `sluice quantize`, and the real kjv6L model imported
 * from ../shared when present.
 * - every file is byte-identical to its container range (tensors, slices),
 *   int8/scales views equal unpack_tensor_int8's output, config.json,
 *   tokenizer.bin and manifest.json agree with the index, directory listings
 *   and sizes are exact, inode numbers are stable across mounts; under every
 *   serving configuration (memory, page cache with and without splice,
 *   direct_io, a tiny cache with evictions, an untuned loop);
 * - 16 concurrent readers at random files and offsets read the right bytes;
 * - writes, creates, mkdir, rmdir, unlink, rename, links, truncate, chmod:
 *   EROFS;
 * - a corrupted slice reads as EIO (all its files), is logged, the others
 *   read. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "format.h"
#include "fs_cli.h"
#include "fs_testmodel.h"
#include "import.h"
#include "test_fs_internal.h"
#include "testutil.h"
#include "unpack.h"

const char *tf_bin, *tf_dir;
char tf_model[PATH_MAX];
static char qmodel[PATH_MAX];

int tf_run(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return test_system("timeout 60 %s", cmd);
}

void tf_umount_at(const char *mnt)
{
    if (fs_cli_run("umount '%s'", mnt) != 0) {
        char *e = fs_cli_said();
        fail_msg("umount %s failed: %s", mnt, e ? e : "?");
    }
}

int tf_is_mounted(const char *mnt)
{
    return test_system("grep -q ' %s .* - fuse.sluice ' /proc/self/mountinfo", mnt) == 0;
}

/* After each test, pass or fail: no mount of ours stays behind. */
static int cleanup_mounts(void **st)
{
    (void)st;
    test_system("for m in $(awk '$5 ~ \"^%s/\" && $0 ~ / - fuse.sluice / {print $5}' "
                "/proc/self/mountinfo); do '%s' umount --lazy \"$m\" 2>/dev/null; done",
                tf_dir, tf_bin);
    return 0;
}

/* ---- expected contents ---------------------------------------------------------------- */

static void expect_add(struct expected *x, const char *path, const void *b, size_t len, int copy)
{
    x->f = realloc(x->f, sizeof *x->f * (size_t)(x->n + 1));
    struct expect *e = &x->f[x->n++];
    snprintf(e->path, sizeof e->path, "%s", path);
    e->len = len;
    if (copy) {
        e->bytes = malloc(len ? len : 1);
        memcpy(e->bytes, b, len);
    } else {
        e->bytes = (uint8_t *)b;
    }
}

static void dirname_of(const struct format_slice_info *si, char *d, size_t n)
{
    if (si->kind == FORMAT_SLICE_LAYER)
        snprintf(d, n, "layer.%03d", si->layer);
    else
        snprintf(d, n, "%s", si->kind == FORMAT_SLICE_EMBED ? "embed" : "head");
}

struct expected tf_expected_of(const char *container)
{
    struct expected x = {0};
    size_t clen;
    uint8_t *c = test_read_file(container, &clen);
    assert_non_null(c);
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open(container, &r, &err), 0);
    char p[256];
    for (uint32_t t = 0; t < format_reader_n_tensors(r); t++) {
        const struct format_tensor_info *ti = format_reader_tensor(r, t);
        char d[32];
        dirname_of(format_reader_slice(r, ti->slice), d, sizeof d);
        snprintf(p, sizeof p, "%s/%s.bin", d, format_role_name(ti->role));
        expect_add(&x, p, c + ti->offset, ti->length, 1);
        if (!format_encoding_traits(ti->encoding)->quantized)
            continue;
        uint64_t rows = ti->shape[0], cols = ti->shape[1];
        int8_t *q = malloc(rows * cols);
        float *sc = malloc(rows * 4);
        assert_int_equal(unpack_tensor_int8(ti, c + ti->offset, q, sc, &err), 0);
        snprintf(p, sizeof p, "%s/%s.int8", d, format_role_name(ti->role));
        expect_add(&x, p, q, rows * cols, 0);
        uint8_t *le = malloc(rows * 4);
        for (uint64_t k = 0; k < rows; k++)
            sl_store_lef32(le + 4 * k, sc[k]);
        snprintf(p, sizeof p, "%s/%s.scales", d, format_role_name(ti->role));
        expect_add(&x, p, le, rows * 4, 0);
        free(sc);
    }
    for (uint32_t i = 0; i < format_reader_n_slices(r); i++) {
        const struct format_slice_info *si = format_reader_slice(r, i);
        char d[32];
        dirname_of(si, d, sizeof d);
        snprintf(p, sizeof p, "%s/slice.bin", d);
        expect_add(&x, p, c + si->offset, si->length, 1);
    }
    /* tokenizer.bin: llama2.c layout, rebuilt from the index */
    const struct format_tokenizer *tok = format_reader_tokenizer(r);
    size_t tl = 4;
    for (uint32_t i = 0; i < tok->n_tokens; i++)
        tl += 8 + tok->lens[i];
    uint8_t *tb = malloc(tl), *q = tb + 4;
    sl_store_le32(tb, tok->max_token_len);
    for (uint32_t i = 0; i < tok->n_tokens; i++) {
        sl_store_lef32(q, tok->scores[i]);
        sl_store_le32(q + 4, tok->lens[i]);
        memcpy(q + 8, tok->tokens[i], tok->lens[i]);
        q += 8 + tok->lens[i];
    }
    expect_add(&x, "tokenizer.bin", tb, tl, 0);
    format_reader_close(r);
    free(c);
    return x;
}

void tf_expected_free(struct expected *x)
{
    for (int i = 0; i < x->n; i++)
        free(x->f[i].bytes);
    free(x->f);
}

/* ---- whole-mount check ------------------------------------------------------------------- */

static void check_listing(const char *mnt, const struct expected *x)
{
    /* every expected file is listed with its exact size; nothing else is */
    char p[PATH_MAX];
    int listed = 0;
    snprintf(p, sizeof p, "cd '%s' && find . -type f | sort > '%s/listing'", mnt, tf_dir);
    assert_int_equal(tf_run("sh -c \"%s\"", p), 0);
    snprintf(p, sizeof p, "%s/listing", tf_dir);
    char *ls = test_read_file(p, NULL);
    assert_non_null(ls);
    for (char *line = strtok(ls, "\n"); line; line = strtok(NULL, "\n")) {
        const char *name = line + 2; /* "./" */
        listed++;
        if (!strcmp(name, "config.json") || !strcmp(name, "manifest.json") ||
            !strcmp(name, "stats.json") || !strcmp(name, "model.gguf")) /* test_fs_gguf */
            continue;
        int found = 0;
        for (int i = 0; i < x->n; i++)
            if (!strcmp(x->f[i].path, name)) {
                struct stat st;
                snprintf(p, sizeof p, "%s/%s", mnt, name);
                assert_int_equal(stat(p, &st), 0);
                assert_int_equal(st.st_size, x->f[i].len);
                assert_int_equal(st.st_mode & 0777, 0444);
                found = 1;
            }
        if (!found)
            fail_msg("unexpected file %s in the mount", name);
    }
    assert_int_equal(listed, x->n + 4);
    free(ls);
}

static void check_all_files(const char *container, const char *mnt)
{
    struct expected x = tf_expected_of(container);
    char p[PATH_MAX];
    for (int i = 0; i < x.n; i++) {
        snprintf(p, sizeof p, "%s/%s", mnt, x.f[i].path);
        size_t len;
        uint8_t *b = test_read_file(p, &len);
        if (!b)
            fail_msg("cannot read %s", p);
        assert_int_equal(len, x.f[i].len);
        if (memcmp(b, x.f[i].bytes, len))
            fail_msg("%s differs from the container", x.f[i].path);
        free(b);
    }
    check_listing(mnt, &x);

    /* manifest.json agrees with the index; its paths name the files */
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open(container, &r, &err), 0);
    snprintf(p, sizeof p, "%s/manifest.json", mnt);
    char *mj = test_read_file(p, NULL);
    cJSON *m = cJSON_Parse(mj);
    assert_non_null(m);
    cJSON *ts = cJSON_GetObjectItem(m, "tensors");
    assert_int_equal(cJSON_GetArraySize(ts), format_reader_n_tensors(r));
    for (int i = 0; i < cJSON_GetArraySize(ts); i++) {
        cJSON *t = cJSON_GetArrayItem(ts, i);
        const struct format_tensor_info *ti = format_reader_tensor(r, (uint32_t)i);
        assert_string_equal(cJSON_GetObjectItem(t, "name")->valuestring, ti->name);
        assert_int_equal((int)cJSON_GetObjectItem(t, "layer")->valuedouble, ti->layer);
        assert_string_equal(cJSON_GetObjectItem(t, "role")->valuestring,
                            format_role_name(ti->role));
        assert_string_equal(cJSON_GetObjectItem(t, "encoding")->valuestring,
                            format_encoding_traits(ti->encoding)->name);
        cJSON *sh = cJSON_GetObjectItem(t, "shape");
        assert_int_equal(cJSON_GetArraySize(sh), ti->n_dims);
        for (uint32_t d = 0; d < ti->n_dims; d++)
            assert_int_equal((uint64_t)cJSON_GetArrayItem(sh, (int)d)->valuedouble, ti->shape[d]);
        assert_int_equal((uint64_t)cJSON_GetObjectItem(t, "offset")->valuedouble, ti->offset);
        assert_int_equal((uint64_t)cJSON_GetObjectItem(t, "length")->valuedouble, ti->length);
        char sum[17];
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)ti->checksum);
        assert_string_equal(cJSON_GetObjectItem(t, "checksum")->valuestring, sum);
        const char *path = cJSON_GetObjectItem(t, "path")->valuestring;
        int found = 0;
        for (int k = 0; k < x.n; k++)
            if (!strcmp(x.f[k].path, path)) {
                found = 1;
                assert_int_equal(x.f[k].len, ti->length);
            }
        assert_true(found);
    }
    cJSON *ss = cJSON_GetObjectItem(m, "slices");
    assert_int_equal(cJSON_GetArraySize(ss), format_reader_n_slices(r));
    for (int i = 0; i < cJSON_GetArraySize(ss); i++) {
        cJSON *s = cJSON_GetArrayItem(ss, i);
        const struct format_slice_info *si = format_reader_slice(r, (uint32_t)i);
        assert_int_equal((uint64_t)cJSON_GetObjectItem(s, "offset")->valuedouble, si->offset);
        assert_int_equal((uint64_t)cJSON_GetObjectItem(s, "length")->valuedouble, si->length);
    }
    /* config.json */
    snprintf(p, sizeof p, "%s/config.json", mnt);
    char *cj = test_read_file(p, NULL);
    cJSON *cfg = cJSON_Parse(cj);
    assert_non_null(cfg);
    const struct format_config *c = format_reader_config(r);
    assert_int_equal((uint32_t)cJSON_GetObjectItem(cfg, "dim")->valuedouble, c->dim);
    assert_int_equal((uint32_t)cJSON_GetObjectItem(cfg, "hidden_dim")->valuedouble, c->hidden_dim);
    assert_int_equal((uint32_t)cJSON_GetObjectItem(cfg, "n_layers")->valuedouble, c->n_layers);
    assert_int_equal((uint32_t)cJSON_GetObjectItem(cfg, "n_kv_heads")->valuedouble, c->n_kv_heads);
    assert_int_equal((uint32_t)cJSON_GetObjectItem(cfg, "vocab_size")->valuedouble, c->vocab_size);
    fprintf(stderr, "  %s: %d files identical\n", container, x.n);
    cJSON_Delete(cfg);
    free(cj);
    cJSON_Delete(m);
    free(mj);
    format_reader_close(r);
    tf_expected_free(&x);
}

static ino_t ino_of(const char *mnt, const char *rel)
{
    char p[PATH_MAX];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", mnt, rel);
    assert_int_equal(stat(p, &st), 0);
    return st.st_ino;
}

static void test_bytes(void **st)
{
    (void)st;
    static const char *configs[] = {
        NULL,                      /* the defaults: memory slices, prefetch */
        "pagecache",               /* splice from the container */
        "pagecache,nosplice",      /* copy through the daemon */
        "direct_io,no_keep_cache", /* no kernel page cache */
        "cache_mb=1,prefetch=2",   /* evictions; the biggest slices via the page cache */
        "single,noclone_fd,max_pages=32,max_background=12,max_readahead=131072",
    };
    char mnt[PATH_MAX];
    snprintf(mnt, sizeof mnt, "%s/m1", tf_dir);
    ino_t first = 0;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        fprintf(stderr, "-o %s\n", configs[i] ? configs[i] : "(defaults)");
        fs_cli_mount(tf_model, mnt, configs[i]);
        check_all_files(tf_model, mnt);
        ino_t ino = ino_of(mnt, "layer.001/w_up.int8");
        if (i == 0)
            first = ino;
        assert_int_equal(ino, first); /* stable inode numbers */
        tf_umount_at(mnt);
    }
}

static void test_quantized(void **st)
{
    (void)st;
    char mnt[PATH_MAX];
    snprintf(mnt, sizeof mnt, "%s/m2", tf_dir);
    fs_cli_mount(qmodel, mnt, NULL);
    check_all_files(qmodel, mnt);
    tf_umount_at(mnt);
}

static void test_real_model(void **st)
{
    (void)st;
    const char *m = test_shared_path("models/kjv6L.bin");
    if (!m)
        skip();
    char src[PATH_MAX], tok[PATH_MAX], out[PATH_MAX], mnt[PATH_MAX];
    snprintf(src, sizeof src, "%s", m);
    snprintf(tok, sizeof tok, "%s", test_shared_path("models/kjv6L.tok1024.bin"));
    snprintf(out, sizeof out, "%s/kjv.sluice", tf_dir);
    struct import_opts o = {.tokenizer = tok, .dtype = -1};
    struct sl_err err;
    assert_int_equal(import_model(src, &o, out, &err), 0);
    snprintf(mnt, sizeof mnt, "%s/m3", tf_dir);
    fs_cli_mount(out, mnt, NULL);
    check_all_files(out, mnt);
    tf_umount_at(mnt);
}

/* ---- concurrency ------------------------------------------------------------------------- */

struct reader_arg {
    const char *mnt;
    const struct expected *x;
    uint64_t seed;
    int bad;
};

static void *reader(void *p)
{
    struct reader_arg *a = p;
    struct test_rng g;
    test_rng_init(&g, a->seed);
    static __thread uint8_t buf[300000];
    for (int i = 0; i < 150; i++) {
        const struct expect *e = &a->x->f[test_rng_below(&g, (uint32_t)a->x->n)];
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", a->mnt, e->path);
        int fd = open(path, O_RDONLY);
        if (fd < 0) {
            a->bad = 1;
            continue;
        }
        for (int k = 0; k < 4; k++) {
            uint64_t o = test_rng_below(&g, (uint32_t)e->len + 1);
            size_t n = 1 + test_rng_below(&g, sizeof buf);
            size_t want = o + n > e->len ? e->len - o : n;
            ssize_t got = pread(fd, buf, n, (off_t)o);
            if (got != (ssize_t)want || memcmp(buf, e->bytes + o, want))
                a->bad = 1;
        }
        close(fd);
    }
    return NULL;
}

static void concurrent(const char *opts)
{
    char mnt[PATH_MAX];
    snprintf(mnt, sizeof mnt, "%s/m4", tf_dir);
    fs_cli_mount(tf_model, mnt, opts);
    struct expected x = tf_expected_of(tf_model);
    pthread_t th[16];
    struct reader_arg a[16];
    for (int i = 0; i < 16; i++) {
        a[i] = (struct reader_arg){mnt, &x, test_seed() + (uint64_t)i * 7919, 0};
        assert_int_equal(pthread_create(&th[i], NULL, reader, &a[i]), 0);
    }
    for (int i = 0; i < 16; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].bad, 0);
    }
    tf_expected_free(&x);
    tf_umount_at(mnt);
}

static void test_concurrent(void **st)
{
    (void)st;
    concurrent(NULL);
    concurrent("cache_mb=1,direct_io"); /* every read reaches the daemon; evictions */
    concurrent("pagecache");
}

/* ---- read-only ------------------------------------------------------------------------------ */

static void expect_erofs(int ret, const char *what)
{
    if (ret != -1 || errno != EROFS)
        fail_msg("%s: expected EROFS, got %d (%s)", what, ret, strerror(errno));
}

static void test_erofs(void **st)
{
    (void)st;
    char mnt[PATH_MAX], p[PATH_MAX + 64], q[PATH_MAX + 64];
    snprintf(mnt, sizeof mnt, "%s/m5", tf_dir);
    fs_cli_mount(tf_model, mnt, NULL);
    snprintf(p, sizeof p, "%s/new", mnt);
    expect_erofs(open(p, O_CREAT | O_WRONLY, 0644), "create");
    snprintf(p, sizeof p, "%s/layer.000/slice.bin", mnt);
    expect_erofs(open(p, O_WRONLY), "open for writing");
    expect_erofs(open(p, O_RDWR), "open read-write");
    expect_erofs(open(p, O_RDONLY | O_TRUNC), "open with O_TRUNC");
    expect_erofs(truncate(p, 0), "truncate");
    expect_erofs(chmod(p, 0666), "chmod");
    expect_erofs(utimes(p, NULL), "utimes");
    expect_erofs(unlink(p), "unlink");
    snprintf(q, sizeof q, "%s/other.bin", mnt);
    expect_erofs(rename(p, q), "rename");
    expect_erofs(link(p, q), "link");
    expect_erofs(symlink("x", q), "symlink");
    snprintf(p, sizeof p, "%s/newdir", mnt);
    expect_erofs(mkdir(p, 0755), "mkdir");
    snprintf(p, sizeof p, "%s/layer.000", mnt);
    expect_erofs(rmdir(p), "rmdir");
    /* and reading still works */
    snprintf(p, sizeof p, "%s/config.json", mnt);
    char *c = test_read_file(p, NULL);
    assert_non_null(c);
    free(c);
    tf_umount_at(mnt);
}

/* ---- corruption ---------------------------------------------------------------------------- */

static void corrupt(const char *opts)
{
    size_t len;
    uint8_t *c = test_read_file(tf_model, &len);
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open(tf_model, &r, &err), 0);
    const struct format_tensor_info *t =
        format_reader_tensor(r, (uint32_t)format_reader_find(r, 0, FORMAT_ROLE_W_UP));
    c[t->offset + t->length / 2] ^= 0x20;
    format_reader_close(r);
    char bad[PATH_MAX], mnt[PATH_MAX], p[PATH_MAX + 64], log[PATH_MAX], o[PATH_MAX + 64];
    snprintf(bad, sizeof bad, "%s/bad.sluice", tf_dir);
    snprintf(log, sizeof log, "%s/bad.log", tf_dir);
    unlink(log);
    FILE *f = fopen(bad, "wb");
    assert_int_equal(fwrite(c, 1, len, f), len);
    fclose(f);
    free(c);
    snprintf(mnt, sizeof mnt, "%s/m6", tf_dir);
    snprintf(o, sizeof o, "log=%s%s%s", log, opts ? "," : "", opts ? opts : "");
    fs_cli_mount(bad, mnt, o); /* the index is intact: it mounts */
    const char *same[] = {"w_up.bin", "attn_norm.bin", "slice.bin", "w_up.int8", "wq.scales"};
    char buf[4096];
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        snprintf(p, sizeof p, "%s/layer.000/%s", mnt, same[i]);
        int fd = open(p, O_RDONLY);
        ssize_t k = fd >= 0 ? read(fd, buf, sizeof buf) : -1;
        int e = errno;
        if (fd >= 0)
            close(fd);
        if (k != -1 || e != EIO)
            fail_msg("%s: expected EIO, got %zd (%s)", same[i], k, strerror(e));
    }
    snprintf(p, sizeof p, "%s/layer.001/w_up.bin", mnt); /* another slice reads fine */
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    assert_true(read(fd, buf, sizeof buf) > 0);
    close(fd);
    snprintf(p, sizeof p, "%s/stats.json", mnt);
    char *sj = test_read_file(p, NULL);
    cJSON *j = cJSON_Parse(sj);
    assert_int_equal(
        (int)cJSON_GetObjectItem(cJSON_GetObjectItem(j, "store"), "verify_failures")->valuedouble,
        1);
    cJSON_Delete(j);
    free(sj);
    tf_umount_at(mnt);
    char *lt = test_read_file(log, NULL);
    assert_non_null(lt);
    assert_non_null(strstr(lt, "checksum mismatch in slice 'layer 0'"));
    assert_non_null(strstr(lt, bad));
    free(lt);
}

static void test_corrupt(void **st)
{
    (void)st;
    corrupt(NULL);
    corrupt("pagecache");
}

int main(void)
{
    tf_dir = fs_cli_setup(60);
    tf_bin = fs_cli_bin();
    snprintf(tf_model, sizeof tf_model, "%s/model.sluice", tf_dir);
    snprintf(qmodel, sizeof qmodel, "%s/tiny-q.sluice", tf_dir);
    struct sl_err err = {{0}};
    if (fs_test_model_write(tf_model, test_seed(), 3, 256, &err) < 0)
        fail_msg("writing the test model: %s", err.msg);
    char tiny[PATH_MAX];
    snprintf(tiny, sizeof tiny, "%s/tiny.sluice", tf_dir);
    if (import_synth("tiny", 7, tiny, NULL, NULL, &err) < 0)
        fail_msg("synth: %s", err.msg);
    if (tf_run("'%s' quantize '%s' -o '%s' --bits 5 --calib-tokens 256 >/dev/null 2>&1", tf_bin,
               tiny, qmodel) != 0)
        fail_msg("sluice quantize failed on the tiny model");
#define T(f) cmocka_unit_test_teardown(f, cleanup_mounts)
    const struct CMUnitTest tests[] = {
        T(test_bytes),   T(test_quantized),  T(test_real_model),   T(test_concurrent),
        T(test_erofs),   T(test_corrupt),    T(test_unmount_busy), T(test_dead_mount),
        T(test_sigterm), T(test_foreground), T(test_mount_errors), T(test_nonroot),
        T(test_cgroup),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
