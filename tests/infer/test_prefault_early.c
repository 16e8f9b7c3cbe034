/* test_prefault_early.c: the memory put first in the prefault thread's list
 * (pipeline_prefault.c). pl_prefault_early: the activation memory (the
 * residual stream, then the sets) in 2 MiB steps that cover each region
 * exactly, marked PL_PF_ACTS (never skipped), before the steps that were
 * there; nothing added without the full policy or with no_prefault.
 * pl_prefault_region: a fresh mapping's pages resident afterwards, a byte
 * written before it unchanged, an unmapped range an error (not a crash). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pipeline.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)

static uint8_t *fresh(size_t len)
{
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    return m;
}

/* steps of [addr, addr + len) at a[*k...]: 2 MiB each, the last the rest */
static void check_region(const struct prefault *a, uint32_t *k, const uint8_t *addr, size_t len)
{
    for (size_t off = 0; off < len; off += 2 * MiB, (*k)++) {
        assert_null(a[*k].w);
        assert_ptr_equal(a[*k].addr, addr);
        assert_int_equal(a[*k].off, off);
        assert_int_equal(a[*k].len, len - off < 2 * MiB ? len - off : 2 * MiB);
        assert_int_equal(a[*k].layer, PL_PF_ACTS);
    }
}

static void test_list(void **state)
{
    (void)state;
    struct infer_pipeline_opts o = {.policy = INFER_POLICY_FULL};
    struct pl p;
    memset(&p, 0, sizeof p);
    p.o = &o;
    p.act_x_len = 5 * MiB;
    p.act_x = (float *)fresh(p.act_x_len);
    p.set_len = 4 * MiB + 4096;
    p.set_mem = fresh(p.set_len);
    /* two steps of the weights' list already there (their storage is not read) */
    struct npu_weights *fake = (struct npu_weights *)&p;
    p.pf = calloc(2, sizeof *p.pf);
    assert_non_null(p.pf);
    p.pf[0] = (struct prefault){.w = fake, .off = 0, .len = 2 * MiB, .layer = 3};
    p.pf[1] = (struct prefault){.w = fake, .off = 2 * MiB, .len = 100, .layer = 4};
    p.n_pf = p.cap_pf = 2;

    o.no_prefault = 1; /* ablation: nothing added */
    assert_int_equal(pl_prefault_early(&p), 0);
    assert_int_equal(p.n_pf, 2);
    o.no_prefault = 0;
    o.policy = INFER_POLICY_SEQUENTIAL; /* only full has the prefault thread */
    assert_int_equal(pl_prefault_early(&p), 0);
    assert_int_equal(p.n_pf, 2);
    o.policy = INFER_POLICY_FULL;

    assert_int_equal(pl_prefault_early(&p), 0);
    assert_int_equal(p.n_pf, 3 + 3 + 2);
    assert_true(p.cap_pf >= p.n_pf);
    uint32_t k = 0;
    check_region(p.pf, &k, (const uint8_t *)p.act_x, p.act_x_len);
    check_region(p.pf, &k, p.set_mem, p.set_len);
    assert_int_equal(k, 6);
    assert_ptr_equal(p.pf[6].w, fake);
    assert_int_equal(p.pf[6].layer, 3);
    assert_int_equal(p.pf[7].off, 2 * MiB);
    assert_int_equal(p.pf[7].len, 100);
    assert_int_equal(p.pf[7].layer, 4);
    free(p.pf);
    munmap(p.act_x, p.act_x_len);
    munmap(p.set_mem, p.set_len);
}

static void test_region(void **state)
{
    (void)state;
    const size_t len = 8 * MiB, page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *m = fresh(len);
    m[3 * page + 7] = 0x5a;
    assert_int_equal(pl_prefault_region(NULL, 10), 0);
    assert_int_equal(pl_prefault_region(m, 0), 0);
    int r = pl_prefault_region(m + 100, len - 100); /* from inside the first page */
    if (r == -EINVAL) { /* a kernel before 5.14: the caller stops stepping */
        munmap(m, len);
        skip();
    }
    assert_int_equal(r, 0);
    unsigned char *vec = malloc(len / page);
    assert_non_null(vec);
    assert_int_equal(mincore(m, len, vec), 0);
    for (size_t i = 0; i < len / page; i++)
        if (!(vec[i] & 1))
            fail_msg("page %zu of %zu is not resident", i, len / page);
    free(vec);
    for (size_t i = 0; i < len; i++)
        if (m[i] != (i == 3 * page + 7 ? 0x5a : 0))
            fail_msg("byte %zu changed to %u", i, m[i]);
    munmap(m, len);
    /* a region unmapped meanwhile (a pool storage freed): an error */
    uint8_t *g = fresh(2 * MiB);
    munmap(g, 2 * MiB);
    r = pl_prefault_region(g, 2 * MiB);
    assert_true(r < 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_region),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
