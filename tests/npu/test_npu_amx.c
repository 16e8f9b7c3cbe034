/* test_npu_amx.c: the AMX kernel (npu_gemm_amx.c) against the scalar
 * reference, bit for bit, int32 and dequantized float outputs: random m in
 * 1..600 (row tiles of 16 and pairs of them, partial last tiles, m < 16 with
 * short tiles), odd n, k not a multiple of 64 (the zero-padded last k step)
 * nor of 4, output ranges [r0, r1) starting and ending inside 16-channel
 * blocks, extreme codes (a = 127 against b = -127); a staging buffer filled
 * with junk before the prep (nothing may depend on it); the few-row shapes
 * of decode and verification (m = 1, 4, 8, 16); where k is a multiple of
 * 64, the activations also read straight from their rows (row strides k and
 * beyond, only a partial last row tile staged); the memory blocking forced
 * small (row blocks of 1-3 row pairs, whole output rows streamed) and at
 * its defaults; each float output also added to a random residual in y
 * (npu_gemm_args.add: streamed or not, the residual prefetched) against
 * the residual plus the scalar reference's float; two threads running the
 * kernel at once (each configures its own tiles); the kernel table (AMX is
 * the best kernel, its peak above vpdpbusd's). Skips, saying so, where the
 * CPU, the compiler or the OS does not allow AMX. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "npu_gemm_internal.h"
#include "testutil.h"

static struct test_rng rng;

/* direct: the whole row tiles read straight from a copy of a with row
 * stride lda (npu_gemm_args.xq; k a multiple of 64), only the rows past
 * them staged (the staging NULL when there are none, so nothing else can be
 * read from it) */
static void run(const struct npu_kernel_ops *ops, int tile, const struct npu_gemm_b *b,
                const int8_t *a, uint32_t m, uint32_t r0, uint32_t r1, const float *scale,
                int32_t *c, float *y, float *ya, int direct, size_t lda)
{
    const size_t bytes = npu_gemm_prep_bytes(b->k4, m);
    uint8_t *stage = malloc(bytes);
    assert_non_null(stage);
    memset(stage, 0x5a, bytes);
    struct npu_gemm_args g = {.b = b, .a = stage, .m = m, .r0 = r0, .r1 = r1, .c = c,
                              .ldc = r1 - r0, .act_scale = 0.0173f, .scale = scale,
                              .tile = tile};
    int8_t *xs = NULL;
    if (direct) {
        /* the rows lda apart, junk between them (never read) */
        xs = malloc((size_t)m * lda);
        assert_non_null(xs);
        memset(xs, 0x77, (size_t)m * lda);
        for (uint32_t i = 0; i < m; i++)
            memcpy(xs + (size_t)i * lda, a + (size_t)i * b->k, b->k);
        const uint32_t whole = m / 16 * 16;
        g.xq = xs;
        g.lda = lda;
        if (m > 16 && whole < m)
            ops->prep(xs + (size_t)whole * lda, lda, m - whole, b->k, b->k4, tile, stage);
        else
            g.a = NULL;
    } else {
        ops->prep(a, b->k, m, b->k, b->k4, tile, stage);
    }
    ops->gemm(&g);
    g.c = NULL, g.y = y, g.ldy = r1 - r0;
    ops->gemm(&g);
    if (ya) {
        g.y = ya, g.add = 1;
        ops->gemm(&g);
    }
    free(stage);
    free(xs);
}

static void check(uint32_t m, uint32_t n, uint32_t k, uint32_t r0, uint32_t r1, int extreme)
{
    int8_t *a = malloc((size_t)m * k), *bw = malloc((size_t)n * k);
    float *scale = malloc(sizeof(float) * n);
    assert_true(a && bw && scale);
    for (size_t i = 0; i < (size_t)m * k; i++)
        a[i] = extreme ? 127 : (int8_t)((int)test_rng_below(&rng, 255) - 127);
    for (size_t i = 0; i < (size_t)n * k; i++)
        bw[i] = extreme ? -127 : (int8_t)((int)test_rng_below(&rng, 255) - 127);
    for (uint32_t r = 0; r < n; r++)
        scale[r] = 1e-3f * (1.0f + test_rng_float(&rng));
    struct npu_gemm_b *b;
    assert_int_equal(npu_gemm_b_create(bw, n, k, &b), 0);
    const uint32_t w = r1 - r0;
    const size_t cnt = (size_t)m * w;
    /* the kernel's outputs 64-byte aligned, so whole 16-channel rows can be
     * streamed (npu_amx_blocking) */
    const size_t cb = (sizeof(int32_t) * cnt + 63) & ~(size_t)63;
    int32_t *c0 = malloc(sizeof(int32_t) * cnt), *c1 = aligned_alloc(64, cb);
    float *y0 = malloc(sizeof(float) * cnt), *y1 = aligned_alloc(64, cb);
    float *base = malloc(sizeof(float) * cnt), *want = malloc(sizeof(float) * cnt);
    float *ya = aligned_alloc(64, cb);
    assert_true(c0 && c1 && y0 && y1 && base && want && ya);
    run(&npu_ops_scalar, 0, b, a, m, r0, r1, scale, c0, y0, NULL, 0, k);
    for (size_t i = 0; i < cnt; i++) {
        base[i] = (test_rng_float(&rng) - 0.5f) * (i % 3 ? 40.0f : 1e5f);
        want[i] = base[i] + y0[i];
    }
    const struct npu_kernel_ops *amx = npu_kernel_ops(NPU_KERNEL_AMX);
    assert_int_equal(npu_gemm_direct(amx, k), k % 64 == 0);
    assert_false(npu_gemm_direct(&npu_ops_scalar, k));
    for (int t = 0; t < 2 * npu_kernel_tiles(NPU_KERNEL_AMX); t++) {
        const int direct = t % 2;
        if (direct && !npu_gemm_direct(amx, k))
            continue;
        memset(c1, 0x55, sizeof(int32_t) * cnt);
        memset(y1, 0x55, sizeof(float) * cnt);
        /* the direct rows at stride k, or further apart */
        const size_t lda = k + (size_t)(t / 2 + m % 2) * 64;
        memcpy(ya, base, sizeof(float) * cnt);
        run(amx, t / 2, b, a, m, r0, r1, scale, c1, y1, ya, direct, lda);
        for (size_t i = 0; i < cnt; i++)
            if (c0[i] != c1[i] || memcmp(&y0[i], &y1[i], sizeof(float)) ||
                memcmp(&ya[i], &want[i], sizeof(float)))
                fail_msg("amx tile %d%s m=%u n=%u k=%u [%u,%u): [%zu][%zu] %d / %.9g / added "
                         "%.9g, scalar %d / %.9g / %.9g",
                         t / 2, direct ? " direct" : "", m, n, k, r0, r1, i / w, i % w, c1[i],
                         (double)y1[i], (double)ya[i], c0[i], (double)y0[i], (double)want[i]);
    }
    /* the public entry with the best kernel (AMX here) */
    memset(c1, 0x55, sizeof(int32_t) * cnt);
    npu_gemm_s8(b, a, m, r0, r1, c1, w);
    assert_memory_equal(c0, c1, sizeof(int32_t) * cnt);
    free(c0), free(c1), free(y0), free(y1), free(base), free(want), free(ya);
    npu_gemm_b_destroy(b);
    free(a), free(bw), free(scale);
}

static void test_amx_random(void **st)
{
    (void)st;
    for (int t = 0; t < 60; t++) {
        const uint32_t m = 1 + test_rng_below(&rng, t < 20 ? 40 : 600);
        uint32_t n = 1 + test_rng_below(&rng, 150) * 2; /* odd n */
        const uint32_t k = 1 + test_rng_below(&rng, t % 3 ? 400 : 1200);
        uint32_t r0 = 0, r1 = n;
        if (t % 2) {
            r0 = test_rng_below(&rng, n);
            r1 = r0 + 1 + test_rng_below(&rng, n - r0);
        }
        check(m, n, k, r0, r1, 0);
    }
    /* k a multiple of 64: the activations read straight from their rows too
     * (whole tiles, odd tiles, partial last tiles, m < 16) */
    for (int t = 0; t < 24; t++) {
        const uint32_t m = 1 + test_rng_below(&rng, t < 8 ? 40 : 300);
        const uint32_t n = 1 + test_rng_below(&rng, 100);
        const uint32_t k = 64 * (1 + test_rng_below(&rng, t % 2 ? 8 : 40));
        const uint32_t r0 = t % 3 ? 0 : test_rng_below(&rng, n);
        check(m, n, k, r0, n, t == 7);
    }
    /* k a multiple of 64 (no tail step) and 64 + a few; full pairs of tiles */
    check(64, 64, 256, 0, 64, 0);
    check(33, 48, 68, 5, 47, 0);
    check(600, 37, 2051, 3, 37, 0);
    check(17, 35, 2051, 0, 35, 1); /* a = 127, b = -127 everywhere */
    check(32, 32, 5632, 0, 32, 1);
    /* several k chunks of tiling 1 (16 steps of 64), with and without a tail */
    check(70, 50, 64 * 40, 0, 50, 0);
    check(45, 33, 64 * 33 + 20, 1, 30, 0);
    check(33, 17, 64 * 17, 0, 17, 1);
}

/* The memory blocking forced small: row blocks of one, two and three row
 * pairs (the last block's odd tile, the next panel's prefetch), every
 * output of more than 16 rows streamed (whole aligned 16-channel rows;
 * partial blocks and ranges starting inside a block take the ordinary
 * store), with both tilings. */
static void test_amx_blocking(void **st)
{
    (void)st;
    static const size_t pairs[] = {1, 2, 3};
    for (int p = 0; p < 3; p++)
        for (int t = 0; t < 12; t++) {
            const uint32_t k = t % 3 ? 64 * (1 + test_rng_below(&rng, 40)) + (t % 2) * 20
                                     : 1 + test_rng_below(&rng, 1500);
            /* budget: `pairs` row pairs of this k (32 rows x k padded to 64) */
            npu_amx_blocking(pairs[p] * 32 * (((size_t)k + 63) & ~(size_t)63), 1, 2);
            const uint32_t m = 1 + test_rng_below(&rng, 300);
            const uint32_t n = 16 * (1 + test_rng_below(&rng, 12)) + (t % 4 == 3 ? 7 : 0);
            uint32_t r0 = 0, r1 = n;
            if (t % 4 == 1)
                r0 = 16 * test_rng_below(&rng, n / 16);
            if (t % 4 == 2) {
                r0 = test_rng_below(&rng, n);
                r1 = r0 + 1 + test_rng_below(&rng, n - r0);
            }
            check(m, n, k, r0, r1, t == 5);
        }
    /* fewer row tiles than the minimum: one block of all rows */
    npu_amx_blocking(2 * 32 * 320, 1, 6);
    check(200, 40, 300, 0, 40, 0);
    npu_amx_blocking(0, 0, 0);
    /* the defaults: a row block split by the budget (k = 5632: 10 row tiles
     * of 16 in 1 MiB; k = 14336: 4, fewer than the minimum, so one block),
     * outputs of over 16 rows and 64 KiB or more streamed */
    check(400, 96, 5632, 0, 96, 0);
    check(520, 512, 200, 0, 512, 0);
    check(40, 450, 300, 0, 450, 0);
    check(16, 1100, 300, 0, 1100, 0); /* 16 rows: cached */
    check(70, 40, 14336, 0, 40, 0);
    check(40, 40, 33000, 0, 40, 0); /* not even one row pair in the budget: one block */
}

/* decode and verification shapes: m = 1, 4, 8, 16 rows */
static void test_amx_few_rows(void **st)
{
    (void)st;
    static const uint32_t ms[] = {1, 4, 8, 16};
    for (size_t i = 0; i < 4; i++) {
        check(ms[i], 96, 2048, 0, 96, 0);
        check(ms[i], 45, 130, 7, 41, 0);
    }
}

struct thr {
    const struct npu_gemm_b *b;
    const int8_t *a;
    uint32_t m, n;
    int32_t *c;
};

static void *thr_main(void *p)
{
    struct thr *t = p;
    for (int rep = 0; rep < 20; rep++)
        npu_gemm_s8_kernel(NPU_KERNEL_AMX, t->b, t->a, t->m, 0, t->n, t->c, t->n);
    return NULL;
}

/* two threads at once on different shapes (m < 16 and m > 16: different
 * tile configurations), each checked against the scalar kernel */
static void test_amx_threads(void **st)
{
    (void)st;
    const uint32_t n = 80, k = 300, ms[2] = {5, 70};
    int8_t *bw = malloc((size_t)n * k);
    assert_non_null(bw);
    for (size_t i = 0; i < (size_t)n * k; i++)
        bw[i] = (int8_t)((int)test_rng_below(&rng, 255) - 127);
    struct npu_gemm_b *b;
    assert_int_equal(npu_gemm_b_create(bw, n, k, &b), 0);
    struct thr t[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        int8_t *a = malloc((size_t)ms[i] * k);
        assert_non_null(a);
        for (size_t j = 0; j < (size_t)ms[i] * k; j++)
            a[j] = (int8_t)((int)test_rng_below(&rng, 255) - 127);
        t[i] = (struct thr){b, a, ms[i], n, malloc(sizeof(int32_t) * ms[i] * n)};
        assert_non_null(t[i].c);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, thr_main, &t[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 2; i++) {
        int32_t *ref = malloc(sizeof(int32_t) * t[i].m * n);
        assert_non_null(ref);
        npu_gemm_s8_kernel(NPU_KERNEL_SCALAR, b, t[i].a, t[i].m, 0, n, ref, n);
        assert_memory_equal(ref, t[i].c, sizeof(int32_t) * t[i].m * n);
        free(ref);
        free((void *)t[i].a);
        free(t[i].c);
    }
    npu_gemm_b_destroy(b);
    free(bw);
}

static void test_amx_table(void **st)
{
    (void)st;
    assert_int_equal(npu_kernel_best(), NPU_KERNEL_AMX);
    /* fewer rows than a tile pass pays for go to the VNNI kernel */
    for (uint32_t m = 0; m < NPU_AMX_MIN_ROWS; m++)
        assert_int_equal(npu_kernel_for_rows(m), NPU_KERNEL_AVX512VNNI);
    for (uint32_t m = NPU_AMX_MIN_ROWS; m < 600; m += 37)
        assert_int_equal(npu_kernel_for_rows(m), NPU_KERNEL_AMX);
    assert_string_equal(npu_kernel_name(NPU_KERNEL_AMX), "amx");
    assert_int_equal(npu_kernel_tiles(NPU_KERNEL_AMX), 2);
    /* The peaks are timed: on a loaded machine one 50 ms probe can lose its
     * core for most of its window, so a few tries are allowed; AMX must win
     * at least one of them outright (it is ~10x VNNI's peak where it runs). */
    int won = 0;
    for (int t = 0; t < 8 && !won; t++) {
        const double amx = npu_gemm_peak_gops(NPU_KERNEL_AMX, 0.05);
        const double vnni = npu_gemm_peak_gops(NPU_KERNEL_AVX512VNNI, 0.05);
        enum npu_kernel which;
        const double best = npu_gemm_peak_best(0.05, &which);
        printf("peak (try %d): amx %.0f GOPS, avx512vnni %.0f GOPS, best %.0f (%s)\n", t + 1, amx,
               vnni, best, npu_kernel_name(which));
        assert_true(vnni > 0);
        won = amx > vnni && which == NPU_KERNEL_AMX;
    }
    assert_true(won);
}

int main(void)
{
    if (!npu_kernel_available(NPU_KERNEL_AMX))
        test_skip_all("AMX is not available here (CPU without AMX-TILE/AMX-INT8, OS without "
                      "tile state or ARCH_REQ_XCOMP_PERM refused, SLUICE_SIMD, or a compiler "
                      "without -mamx-int8)");
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_amx_random), cmocka_unit_test(test_amx_blocking),
        cmocka_unit_test(test_amx_few_rows),
        cmocka_unit_test(test_amx_threads), cmocka_unit_test(test_amx_table)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
