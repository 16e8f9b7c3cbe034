/* test_pipeline_early.c: the weights' first bytes read ahead of the
 * pipeline (infer_pipeline_read_early, pipeline_early.c). With packed
 * residency it starts a thread, and the first layers' pages, dropped from
 * the page cache before, come in without anyone else touching the file;
 * the bytes before the first layer (header, embedding) are not read by it.
 * Where the pipeline reads with O_DIRECT (int8 residency, slices_read) and
 * where AUTO resolves to int8, nothing starts. The file's pages must be
 * droppable (fadvise DONTNEED on a disk file): where they are not (tmpfs),
 * the residency part is skipped and said so. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "format.h"
#include "infer.h"
#include "testutil.h"
#include "tiny_q5.h"

static char float_model[4096], q_model[4096];

static int setup(void **st)
{
    (void)st;
    return tiny_q5_models(31, float_model, q_model);
}

/* Resident pages of [lo, hi) of the file (mincore through a mapping). */
static uint64_t resident(int fd, uint64_t len, uint64_t lo, uint64_t hi)
{
    uint8_t *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    size_t np = (len + 4095) / 4096;
    unsigned char *v = malloc(np);
    assert_non_null(v);
    assert_int_equal(mincore(m, len, v), 0);
    uint64_t n = 0;
    for (uint64_t p = lo / 4096; p < (hi + 4095) / 4096 && p < np; p++)
        n += v[p] & 1;
    free(v);
    munmap(m, len);
    return n;
}

static void test_early_packed(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct format_reader *r;
    assert_int_equal(format_reader_open(q_model, &r, &err), 0);
    uint64_t len = format_reader_file_size(r), lo = len;
    for (uint32_t i = 0; i < format_reader_n_slices(r); i++) {
        const struct format_slice_info *si = format_reader_slice(r, i);
        if (si->kind == FORMAT_SLICE_LAYER && si->offset < lo)
            lo = si->offset;
    }
    assert_true(lo < len);
    int fd = format_reader_fd(r);
    assert_int_equal(fdatasync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    int droppable = resident(fd, len, lo, len) == 0;
    struct infer_pipeline_opts o;
    infer_pipeline_opts_init(&o);
    o.resident = INFER_RESIDENT_PACKED;
    struct infer_early *e = NULL;
    assert_int_equal(infer_pipeline_read_early(r, &o, &e, &err), 0);
    assert_non_null(e);
    uint64_t want = (len - lo + 4095) / 4096, got = 0;
    for (int i = 0; droppable && i < 1000 && (got = resident(fd, len, lo, len)) < want; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    infer_pipeline_early_end(e);
    if (droppable) {
        assert_int_equal(got, want); /* every page from the first layer on */
        uint64_t before = lo > 4096 ? resident(fd, len, 4096, lo - 4096) : 0;
        /* the embedding's pages (the index and header are read by the reader) */
        assert_true(before < (lo - 4096) / 4096 / 2 + 1);
    } else {
        fprintf(stderr, "test_pipeline_early: %s keeps its pages (tmpfs?): residency not checked\n",
                q_model);
    }
    format_reader_close(r);
}

static void test_early_not_where_direct(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct format_reader *r;
    assert_int_equal(format_reader_open(q_model, &r, &err), 0);
    struct infer_pipeline_opts o;
    infer_pipeline_opts_init(&o);
    struct infer_early *e = (struct infer_early *)&o; /* must be overwritten */
    o.resident = INFER_RESIDENT_INT8;
    assert_int_equal(infer_pipeline_read_early(r, &o, &e, &err), 0);
    assert_null(e);
    o.resident = INFER_RESIDENT_PACKED;
    o.slices_read = 1;
    e = (struct infer_early *)&o;
    assert_int_equal(infer_pipeline_read_early(r, &o, &e, &err), 0);
    assert_null(e);
    /* AUTO (and NULL options): as the pipeline resolves it */
    o.slices_read = 0;
    o.resident = INFER_RESIDENT_AUTO;
    int packed = infer_resident_resolve(INFER_RESIDENT_AUTO, r, o.no_shadow) ==
                 INFER_RESIDENT_PACKED;
    e = (struct infer_early *)&o;
    assert_int_equal(infer_pipeline_read_early(r, &o, &e, &err), 0);
    assert_int_equal(e != NULL, packed);
    infer_pipeline_early_end(e);
    e = (struct infer_early *)&o;
    assert_int_equal(infer_pipeline_read_early(r, NULL, &e, &err), 0);
    assert_int_equal(e != NULL, packed);
    infer_pipeline_early_end(e);
    infer_pipeline_early_end(NULL);
    format_reader_close(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_early_packed),
        cmocka_unit_test(test_early_not_where_direct),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
