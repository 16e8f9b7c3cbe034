/* test_one_validator.c: issue 21, finding 4. A container whose packed tensor
 * headers are invalid but whose checksums were all recomputed must be refused
 * by every path that reads tensor data: format_reader_read_slice (inspect),
 * format_reader_read_tensor, format_slice_verify (run's pipeline, the loader,
 * the mount) and format_tensor_verify (lazy loads), all through
 * format_tensor_validate, with a message naming the file and the tensor; and
 * every valid encoding passes all of them. test_agree.sh checks the commands. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "container_edit.h"
#include "testutil.h"

static const uint32_t encs[] = {FORMAT_ENC_F32, FORMAT_ENC_Q8_CHANNEL, FORMAT_ENC_ADAPTIVE,
                                FORMAT_ENC_INT4INT8, FORMAT_ENC_BITPLANE};

/* Runs every checked read of slice `si` / tensor `ti`; returns how many
 * refused, each refusal's message containing `want` (when given). */
static int refusals(struct format_reader *r, uint32_t si, uint32_t ti, const char *want)
{
    const struct format_slice_info *s = format_reader_slice(r, si);
    const struct format_tensor_info *t = format_reader_tensor(r, ti);
    uint8_t *buf = malloc(s->length);
    assert_non_null(buf);
    int n = 0, ret;
    struct sl_err err;
    for (int k = 0; k < 5; k++) {
        memset(&err, 0, sizeof err);
        switch (k) {
        case 0:
            ret = format_reader_read_slice(r, si, buf, s->length, &err);
            break;
        case 1:
            ret = format_slice_verify(r, si, buf, &err); /* buf: the slice, read above */
            break;
        case 2:
            ret = format_slice_validate(r, si, buf, &err);
            break;
        case 3:
            ret = format_reader_read_tensor(r, ti, buf, s->length, &err);
            break;
        default:
            ret = format_tensor_verify(r, ti, buf, &err); /* buf: the tensor */
            break;
        }
        if (ret < 0) {
            assert_int_equal(ret, -EINVAL); /* not a checksum error */
            if (want && !strstr(err.msg, want))
                fail_msg("path %d: '%s' lacks '%s'", k, err.msg, want);
            assert_non_null(strstr(err.msg, t->name));
            assert_non_null(strstr(err.msg, format_reader_path(r)));
            n++;
        }
    }
    free(buf);
    return n;
}

static void check(const char *path, const char *want, int expect_refusals)
{
    struct format_reader *r;
    struct sl_err err;
    if (format_reader_open(path, &r, &err) < 0)
        fail_msg("%s does not open: %s", path, err.msg);
    int ti = format_reader_find(r, 0, FORMAT_ROLE_WQ);
    assert_true(ti >= 0);
    const struct format_tensor_info *t = format_reader_tensor(r, (uint32_t)ti);
    /* the premise: the checksums all hold */
    uint8_t *b = malloc(t->length);
    assert_non_null(b);
    assert_int_equal(pread(format_reader_fd(r), b, t->length, (off_t)t->offset),
                     (ssize_t)t->length);
    assert_true(format_checksum(b, t->length) == t->checksum);
    free(b);
    int n = refusals(r, t->slice, (uint32_t)ti, want);
    if (n != expect_refusals)
        fail_msg("%s: %d of 5 paths refused, expected %d", path, n, expect_refusals);
    format_reader_close(r);
}

static void test_valid_pass(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof encs / sizeof encs[0]; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/ok%zu", test_tmpdir(), i);
        assert_int_equal(ce_write_model(p, encs[i]), 0);
        check(p, NULL, 0);
    }
}

static void test_resealed_invalid_refused(void **state)
{
    (void)state;
    static const struct {
        uint32_t enc;
        int at; /* byte of the tensor to change */
        uint8_t xor ;
        const char *want;
    } edits[] = {
        {FORMAT_ENC_ADAPTIVE, 3, 0x20, "bad magic"},
        {FORMAT_ENC_INT4INT8, 3, 0x20, "bad magic"},
        {FORMAT_ENC_BITPLANE, 3, 0x20, "bad magic"},
        {FORMAT_ENC_ADAPTIVE, 4, 0x02, "version 3"},
        {FORMAT_ENC_ADAPTIVE, 8, 0x01, "33 x 32"}, /* rows in the header */
        {FORMAT_ENC_BITPLANE, FORMAT_PACKED_HEADER, 0x07, "row widths need"},
        {FORMAT_ENC_Q8_CHANNEL, 128 + 7, 0x80, "code -128"}, /* q 7 = 0x80 | small */
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/bad%zu", test_tmpdir(), i);
        assert_int_equal(ce_write_model(p, edits[i].enc), 0);
        size_t len;
        uint8_t *buf = test_read_file(p, &len);
        assert_non_null(buf);
        long t = ce_find_tensor(buf, len, "blk.0.attn_q.weight");
        assert_true(t >= 0);
        uint64_t tl;
        uint8_t *tb = ce_tensor_bytes(buf, t, &tl);
        if (edits[i].enc == FORMAT_ENC_Q8_CHANNEL)
            tb[edits[i].at] = 0x80;
        else
            tb[edits[i].at] ^= edits[i].xor ;
        ce_reseal(buf, t);
        FILE *f = fopen(p, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(buf, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
        free(buf);
        check(p, edits[i].want, 5);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_pass),
        cmocka_unit_test(test_resealed_invalid_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
