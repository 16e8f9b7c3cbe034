/* test_fs.c: real mounts (through the sluice binary) of a synthetic quantized
 * container and, when ../shared is present, the real kjv6L model:
 * - every file of the manifest is byte-identical to its container range;
 *   the int8 and scales views equal unpack_tensor_int8's output;
 * - 16 concurrent readers at random offsets read the right bytes;
 * - writes, creates, mkdir, unlink, rename fail with EROFS;
 * - a corrupted slice reads as EIO (its tensors too), the others still read;
 * - unmounting while a reader holds a file open: plain unmount refuses (busy),
 *   --lazy detaches, the open file stays readable, the daemon exits after;
 * - mount errors: missing or non-directory mount point, non-empty directory,
 *   missing or corrupt container, already mounted. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format.h"
#include "quantizer.h"
#include "testutil.h"
#include "unpack.h"

static const char *bin, *dir;
static char model[4096], qmodel[4096];

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[8400];
    snprintf(full, sizeof full, "timeout 60 %s", cmd);
    return test_system("%s", full);
}

static void mount_at(const char *container, const char *mnt)
{
    mkdir(mnt, 0755);
    if (run("'%s' mount '%s' '%s'", bin, container, mnt) != 0)
        fail_msg("mount %s on %s failed", container, mnt);
}

static void umount_at(const char *mnt)
{
    assert_int_equal(run("'%s' umount '%s'", bin, mnt), 0);
}

/* Compares every manifest file with the container. */
static void check_all_files(const char *container, const char *mnt)
{
    size_t clen, mlen;
    uint8_t *c = test_read_file(container, &clen);
    char p[4096];
    snprintf(p, sizeof p, "%s/manifest.json", mnt);
    char *mj = test_read_file(p, &mlen);
    assert_non_null(c);
    assert_non_null(mj);
    cJSON *m = cJSON_Parse(mj);
    assert_non_null(m);
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open(container, &r, &err), 0);
    cJSON *ts = cJSON_GetObjectItem(m, "tensors");
    assert_int_equal(cJSON_GetArraySize(ts), format_reader_n_tensors(r));
    int views = 0;
    for (int i = 0; i < cJSON_GetArraySize(ts); i++) {
        cJSON *t = cJSON_GetArrayItem(ts, i);
        const struct format_tensor_info *ti = format_reader_tensor(r, (uint32_t)i);
        assert_string_equal(cJSON_GetObjectItem(t, "name")->valuestring, ti->name);
        assert_int_equal((uint64_t)cJSON_GetObjectItem(t, "offset")->valuedouble, ti->offset);
        assert_int_equal((uint64_t)cJSON_GetObjectItem(t, "length")->valuedouble, ti->length);
        snprintf(p, sizeof p, "%s/%s", mnt, cJSON_GetObjectItem(t, "path")->valuestring);
        size_t len;
        uint8_t *b = test_read_file(p, &len);
        assert_non_null(b);
        assert_int_equal(len, ti->length);
        assert_memory_equal(b, c + ti->offset, len);
        cJSON *ip = cJSON_GetObjectItem(t, "int8_path");
        if (ip) {
            uint64_t rows = ti->shape[0], cols = ti->shape[1];
            int8_t *q = malloc(rows * cols);
            float *sc = malloc(rows * 4);
            assert_int_equal(unpack_tensor_int8(ti, b, q, sc, &err), 0);
            snprintf(p, sizeof p, "%s/%s", mnt, ip->valuestring);
            uint8_t *v = test_read_file(p, &len);
            assert_int_equal(len, rows * cols);
            assert_memory_equal(v, q, len);
            free(v);
            snprintf(p, sizeof p, "%s/%s", mnt, cJSON_GetObjectItem(t, "scales_path")->valuestring);
            v = test_read_file(p, &len);
            assert_int_equal(len, rows * 4);
            for (uint64_t k = 0; k < rows; k++)
                assert_true(sl_load_lef32(v + 4 * k) == sc[k]);
            free(v);
            free(q);
            free(sc);
            views++;
        }
        free(b);
    }
    cJSON *ss = cJSON_GetObjectItem(m, "slices");
    for (int i = 0; i < cJSON_GetArraySize(ss); i++) {
        cJSON *s = cJSON_GetArrayItem(ss, i);
        const struct format_slice_info *si = format_reader_slice(r, (uint32_t)i);
        snprintf(p, sizeof p, "%s/%s", mnt, cJSON_GetObjectItem(s, "path")->valuestring);
        size_t len;
        uint8_t *b = test_read_file(p, &len);
        assert_int_equal(len, si->length);
        assert_memory_equal(b, c + si->offset, len);
        free(b);
    }
    /* config.json and tokenizer.bin */
    snprintf(p, sizeof p, "%s/config.json", mnt);
    char *cj = test_read_file(p, NULL);
    cJSON *cfg = cJSON_Parse(cj);
    assert_int_equal((uint32_t)cJSON_GetObjectItem(cfg, "dim")->valuedouble,
                     format_reader_config(r)->dim);
    snprintf(p, sizeof p, "%s/tokenizer.bin", mnt);
    size_t tl;
    uint8_t *tok = test_read_file(p, &tl);
    assert_non_null(tok);
    assert_int_equal(sl_load_le32(tok), format_reader_tokenizer(r)->max_token_len);
    fprintf(stderr, "%s: %d tensors, %d slices, %d int8 views identical\n", container,
            cJSON_GetArraySize(ts), cJSON_GetArraySize(ss), views);
    free(tok);
    cJSON_Delete(cfg);
    free(cj);
    cJSON_Delete(m);
    free(mj);
    free(c);
    format_reader_close(r);
}

static void test_bytes(void **st)
{
    (void)st;
    char mnt[4096];
    snprintf(mnt, sizeof mnt, "%s/m1", dir);
    mount_at(qmodel, mnt);
    check_all_files(qmodel, mnt);
    umount_at(mnt);
    mount_at(model, mnt);
    check_all_files(model, mnt);
    umount_at(mnt);
}

static void test_real_model(void **st)
{
    (void)st;
    const char *m = test_shared_path("models/kjv6L.bin");
    if (!m)
        skip();
    char src[4096], tok[4096], out[4096], mnt[4096];
    snprintf(src, sizeof src, "%s", m);
    snprintf(tok, sizeof tok, "%s", test_shared_path("models/kjv6L.tok1024.bin"));
    snprintf(out, sizeof out, "%s/kjv.sluice", dir);
    struct quantizer_import_opts o = {.tokenizer = tok, .dtype = -1};
    struct sl_err err;
    assert_int_equal(quantizer_import(src, &o, out, &err), 0);
    snprintf(mnt, sizeof mnt, "%s/m2", dir);
    mount_at(out, mnt);
    check_all_files(out, mnt);
    umount_at(mnt);
}

struct reader_arg {
    const char *mnt;
    const uint8_t *content;
    uint64_t off, len;
    unsigned seed;
    int bad;
};

static void *reader(void *p)
{
    struct reader_arg *a = p;
    char path[4096];
    snprintf(path, sizeof path, "%s/layer.001/slice.bin", a->mnt);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        a->bad = 1;
        return NULL;
    }
    uint8_t buf[70000];
    for (int i = 0; i < 200; i++) {
        a->seed = a->seed * 1103515245u + 12345u;
        uint64_t o = a->seed % a->len;
        size_t n = 1 + a->seed % sizeof buf;
        if (o + n > a->len)
            n = a->len - o;
        ssize_t k = pread(fd, buf, n, (off_t)o);
        if (k != (ssize_t)n || memcmp(buf, a->content + a->off + o, n) != 0)
            a->bad = 1;
    }
    close(fd);
    return NULL;
}

static void test_concurrent(void **st)
{
    (void)st;
    char mnt[4096];
    snprintf(mnt, sizeof mnt, "%s/m3", dir);
    mount_at(qmodel, mnt);
    size_t clen;
    uint8_t *c = test_read_file(qmodel, &clen);
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open(qmodel, &r, &err), 0);
    int si = format_reader_find(r, 1, FORMAT_ROLE_WQ);
    const struct format_slice_info *s = format_reader_slice(r, format_reader_tensor(r, (uint32_t)si)->slice);
    pthread_t th[16];
    struct reader_arg a[16];
    for (int i = 0; i < 16; i++) {
        a[i] = (struct reader_arg){mnt, c, s->offset, s->length, (unsigned)(test_seed() + i), 0};
        pthread_create(&th[i], NULL, reader, &a[i]);
    }
    for (int i = 0; i < 16; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].bad, 0);
    }
    /* read-only */
    char p[4200];
    snprintf(p, sizeof p, "%s/new", mnt);
    assert_int_equal(open(p, O_CREAT | O_WRONLY, 0644), -1);
    assert_int_equal(errno, EROFS);
    snprintf(p, sizeof p, "%s/config.json", mnt);
    assert_int_equal(open(p, O_WRONLY), -1);
    assert_int_equal(errno, EROFS);
    snprintf(p, sizeof p, "%s/newdir", mnt);
    assert_int_equal(mkdir(p, 0755), -1);
    assert_int_equal(errno, EROFS);
    snprintf(p, sizeof p, "%s/config.json", mnt);
    assert_int_equal(unlink(p), -1);
    assert_int_equal(errno, EROFS);
    char q[4200];
    snprintf(q, sizeof q, "%s/other.json", mnt);
    assert_int_equal(rename(p, q), -1);
    assert_int_equal(errno, EROFS);
    format_reader_close(r);
    free(c);
    umount_at(mnt);
}

static void test_corrupt(void **st)
{
    (void)st;
    /* flip one byte inside layer 0's wq in a copy */
    size_t len;
    uint8_t *c = test_read_file(qmodel, &len);
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open(qmodel, &r, &err), 0);
    const struct format_tensor_info *t = format_reader_tensor(r, (uint32_t)format_reader_find(r, 0, FORMAT_ROLE_WQ));
    c[t->offset + t->length / 2] ^= 0x20;
    format_reader_close(r);
    char bad[4096], mnt[4096], p[4200];
    snprintf(bad, sizeof bad, "%s/bad.sluice", dir);
    FILE *f = fopen(bad, "wb");
    fwrite(c, 1, len, f);
    fclose(f);
    free(c);
    snprintf(mnt, sizeof mnt, "%s/m4", dir);
    mount_at(bad, mnt);
    char buf[4096];
    snprintf(p, sizeof p, "%s/layer.000/wq.bin", mnt);
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(read(fd, buf, sizeof buf), -1);
    assert_int_equal(errno, EIO);
    close(fd);
    snprintf(p, sizeof p, "%s/layer.000/attn_norm.bin", mnt); /* same slice: also EIO */
    fd = open(p, O_RDONLY);
    assert_int_equal(read(fd, buf, sizeof buf), -1);
    close(fd);
    snprintf(p, sizeof p, "%s/layer.001/wq.bin", mnt); /* another slice reads fine */
    fd = open(p, O_RDONLY);
    assert_true(read(fd, buf, sizeof buf) > 0);
    close(fd);
    umount_at(mnt);
}

static void test_unmount_busy(void **st)
{
    (void)st;
    char mnt[4096], p[4200];
    snprintf(mnt, sizeof mnt, "%s/m5", dir);
    mount_at(qmodel, mnt);
    snprintf(p, sizeof p, "%s/layer.001/slice.bin", mnt);
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    /* a plain unmount refuses while the file is open */
    assert_int_not_equal(run("'%s' umount '%s' 2>/dev/null", bin, mnt), 0);
    /* --lazy detaches; the open file still reads */
    assert_int_equal(run("'%s' umount --lazy '%s'", bin, mnt), 0);
    char buf[4096];
    assert_int_equal(pread(fd, buf, sizeof buf, 0), (ssize_t)sizeof buf);
    close(fd);
}

static void test_mount_errors(void **st)
{
    (void)st;
    char mnt[4096], file[4096];
    snprintf(mnt, sizeof mnt, "%s/missing-dir", dir);
    assert_int_not_equal(run("'%s' mount '%s' '%s' 2>/dev/null", bin, qmodel, mnt), 0);
    snprintf(file, sizeof file, "%s/plain-file", dir);
    FILE *f = fopen(file, "w");
    fclose(f);
    assert_int_not_equal(run("'%s' mount '%s' '%s' 2>/dev/null", bin, qmodel, file), 0);
    snprintf(mnt, sizeof mnt, "%s/nonempty", dir);
    mkdir(mnt, 0755);
    snprintf(file, sizeof file, "%s/x", mnt);
    f = fopen(file, "w");
    fclose(f);
    assert_int_not_equal(run("'%s' mount '%s' '%s' 2>/dev/null", bin, qmodel, mnt), 0);
    snprintf(mnt, sizeof mnt, "%s/m6", dir);
    mkdir(mnt, 0755);
    assert_int_not_equal(run("'%s' mount /nonexistent.sluice '%s' 2>/dev/null", bin, mnt), 0);
    snprintf(file, sizeof file, "%s/garbage.sluice", dir);
    f = fopen(file, "w");
    fputs("not a container", f);
    fclose(f);
    assert_int_not_equal(run("'%s' mount '%s' '%s' 2>/dev/null", bin, file, mnt), 0);
    mount_at(qmodel, mnt);
    assert_int_not_equal(run("'%s' mount '%s' '%s' 2>/dev/null", bin, qmodel, mnt), 0);
    umount_at(mnt);
    assert_int_not_equal(run("'%s' umount '%s' 2>/dev/null", bin, mnt), 0); /* not mounted */
}

/* An ordinary user mounts through fusermount3 (root runs the test as nobody). */
static void test_nonroot(void **st)
{
    (void)st;
    if (geteuid() != 0 || test_system("command -v setpriv >/dev/null") != 0) {
        fprintf(stderr, "note: not root or no setpriv: the ordinary-user mount is not tested\n");
        skip();
    }
    struct stat fu;
    if (stat("/dev/fuse", &fu) < 0 || (fu.st_mode & 0006) != 0006) {
        fprintf(stderr, "note: /dev/fuse is not accessible to ordinary users on this machine "
                        "(mode %o): the ordinary-user mount cannot work here\n",
                fu.st_mode & 0777);
        skip();
    }
    char base[] = "/tmp/sluice-user.XXXXXX";
    assert_non_null(mkdtemp(base));
    chmod(base, 0755);
    assert_int_equal(run("cp '%s' '%s/m.sluice' && mkdir '%s/mnt' && chown -R nobody '%s'", qmodel,
                         base, base, base), 0);
    const char *as = "setpriv --reuid=nobody --regid=nogroup --clear-groups";
    assert_int_equal(run("%s '%s' mount '%s/m.sluice' '%s/mnt'", as, bin, base, base), 0);
    assert_int_equal(run("%s cmp -s '%s/mnt/layer.001/slice.bin' '%s/mnt/layer.001/slice.bin'", as,
                         base, base), 0);
    assert_int_equal(run("%s '%s' umount '%s/mnt'", as, bin, base), 0);
    run("rm -rf '%s'", base);
}

int main(void)
{
    bin = test_sluice_bin();
    if (!bin)
        test_skip_all("the sluice binary is not available ($SLUICE_BIN)");
    if (access("/dev/fuse", R_OK | W_OK) != 0)
        test_skip_all("/dev/fuse is not available here");
    if (test_system("command -v fusermount3 >/dev/null") != 0)
        test_skip_all("fusermount3 is not installed");
    dir = test_tmpdir();
    snprintf(model, sizeof model, "%s/tiny.sluice", dir);
    snprintf(qmodel, sizeof qmodel, "%s/tiny-q.sluice", dir);
    struct sl_err err;
    if (quantizer_synth("tiny", 7, model, NULL, NULL, &err) < 0)
        fail_msg("synth: %s", err.msg);
    if (run("'%s' quantize '%s' -o '%s' --bits 5 --calib-tokens 256 >/dev/null 2>&1", bin, model,
            qmodel) != 0)
        test_skip_all("cannot quantize the test model");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes),       cmocka_unit_test(test_real_model),
        cmocka_unit_test(test_concurrent),  cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_unmount_busy), cmocka_unit_test(test_mount_errors),
        cmocka_unit_test(test_nonroot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
