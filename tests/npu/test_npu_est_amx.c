/* test_npu_est_amx.c: the attention estimate's AMX int8 GEMM
 * (npu_est_amx.c) bit for bit against the exact scalar GEMM (the
 * specification), int32 and dequantized float outputs: random shapes (k
 * short of its multiple of 64, channel ranges starting and ending inside
 * 16-channel blocks, odd row counts, output strides wider than the range),
 * extreme operands (+-127 everywhere: the largest sums), the staging's zero
 * padding; and graph jobs with npu_job.a_max (AMX where the CPU has it)
 * against the same jobs without (the device's usual kernel). Where the CPU
 * or the OS lacks AMX the kernel tests skip and say so. Seed printed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "npu_est.h"
#include "npu_gemm_internal.h"
#include "npu_internal.h"
#include "testutil.h"

static struct test_rng rng;

struct out {
    int32_t *c;
    float *y;
};

/* fn (NULL: the scalar GEMM on its own staging) over rows m, channels
 * [r0, r1), outputs ld apart (ld >= r1 - r0; the gap keeps a marker) */
static void run(int amx, const struct npu_gemm_b *pb, const int8_t *a, uint32_t m, uint32_t k,
                uint32_t r0, uint32_t r1, size_t ld, const float *scale, struct out *o)
{
    uint8_t *st = malloc(npu_gemm_prep_bytes(pb->k4, m));
    assert_non_null(st);
    memset(st, 0x5a, npu_gemm_prep_bytes(pb->k4, m)); /* the staging must pad by itself */
    if (amx)
        npu_est_amx_prep(a, m, k, pb->k4, st);
    else
        npu_ops_scalar.prep(a, k, m, k, pb->k4, 0, st);
    memset(o->c, 0x55, sizeof(int32_t) * m * ld);
    memset(o->y, 0x55, sizeof(float) * m * ld);
    struct npu_gemm_args g = {.b = pb, .a = st, .m = m, .r0 = r0, .r1 = r1, .c = o->c,
                              .ldc = ld, .act_scale = 0.0173f, .scale = scale};
    if (amx)
        npu_est_gemm_amx(&g);
    else
        npu_ops_scalar.gemm(&g);
    g.c = NULL;
    g.y = o->y;
    g.ldy = ld;
    if (amx)
        npu_est_gemm_amx(&g);
    else
        npu_ops_scalar.gemm(&g);
    free(st);
}

static void check(uint32_t m, uint32_t n, uint32_t k, uint32_t r0, uint32_t r1, size_t ld,
                  int extreme)
{
    int8_t *a = malloc((size_t)m * k), *b = malloc((size_t)n * k);
    float *scale = malloc(sizeof(float) * n);
    assert_true(a && b && scale);
    for (size_t i = 0; i < (size_t)m * k; i++)
        a[i] = extreme ? 127 : (int8_t)((int)test_rng_below(&rng, 255) - 127);
    for (uint32_t r = 0; r < n; r++) {
        int8_t s = test_rng_below(&rng, 2) ? 127 : -127;
        for (uint32_t j = 0; j < k; j++)
            b[(size_t)r * k + j] = extreme ? s : (int8_t)((int)test_rng_below(&rng, 255) - 127);
        scale[r] = (0.5f + test_rng_float(&rng)) * 1e-3f;
    }
    struct npu_gemm_b *pb;
    assert_int_equal(npu_gemm_b_create(b, n, k, &pb), 0);
    struct out o[2];
    for (int i = 0; i < 2; i++) {
        o[i].c = malloc(sizeof(int32_t) * m * ld);
        o[i].y = malloc(sizeof(float) * m * ld);
        assert_true(o[i].c && o[i].y);
    }
    run(0, pb, a, m, k, r0, r1, ld, scale, &o[0]);
    run(1, pb, a, m, k, r0, r1, ld, scale, &o[1]);
    for (size_t i = 0; i < (size_t)m * ld; i++)
        if (o[1].c[i] != o[0].c[i] || memcmp(&o[1].y[i], &o[0].y[i], sizeof(float)))
            fail_msg("amx m=%u n=%u k=%u [%u, %u) ld %zu: [%zu][%zu] = %d / %.9g, exact %d / "
                     "%.9g",
                     m, n, k, r0, r1, ld, i / ld, i % ld, o[1].c[i], (double)o[1].y[i],
                     o[0].c[i], (double)o[0].y[i]);
    for (int i = 0; i < 2; i++) {
        free(o[i].c);
        free(o[i].y);
    }
    npu_gemm_b_destroy(pb);
    free(a);
    free(b);
    free(scale);
}

static int have_amx(void)
{
    if (npu_est_amx_available())
        return 1;
    fprintf(stderr, "AMX int8 not available here (CPU, OS or SLUICE_SIMD): kernel not tested\n");
    return 0;
}

static void test_random(void **state)
{
    (void)state;
    if (!have_amx())
        skip();
    for (int it = 0; it < 300; it++) {
        uint32_t m = 1 + test_rng_below(&rng, 70);
        uint32_t n = 1 + test_rng_below(&rng, 300);
        uint32_t k = 64 * (1 + test_rng_below(&rng, 3)) - test_rng_below(&rng, 4);
        uint32_t r0 = test_rng_below(&rng, 4) ? 0 : test_rng_below(&rng, n);
        uint32_t r1 = test_rng_below(&rng, 4) ? n : r0 + 1 + test_rng_below(&rng, n - r0);
        size_t ld = (r1 - r0) + (test_rng_below(&rng, 2) ? 0 : test_rng_below(&rng, 40));
        check(m, n, k, r0, r1, ld, 0);
    }
    /* the attention's shapes: whole tiles of rows and a key bucket */
    check(32, 512, 64, 0, 512, 512, 0);
    check(16, 256, 128, 0, 256, 256, 0);
}

static void test_extremes(void **state)
{
    (void)state;
    if (!have_amx())
        skip();
    check(33, 70, 192, 0, 70, 70, 1);
    check(16, 32, 128, 0, 32, 32, 1);
}

/* Graph jobs with a_max on a device of the default kernel (AMX where
 * available) against the same jobs without a_max: the same floats. */
static void test_graph(void **state)
{
    (void)state;
    const uint32_t K = 64, N = 256;
    struct sl_err err = {{0}};
    struct npu_device *dev;
    assert_int_equal(npu_device_create(&dev), 0);
    for (uint32_t M = 16; M <= 48; M += 16) {
        const struct npu_graph *gr;
        assert_int_equal(npu_device_graph(dev, M, K, N, &gr, &err), 0);
        assert_int_equal(gr->amx_est, npu_est_amx_available());
        struct npu_graph_info gi;
        npu_graph_info(gr, &gi);
        void *scr = malloc(gi.scratch_bytes);
        int8_t *x = malloc((size_t)M * K), *b = malloc((size_t)N * K);
        float *sc = malloc(sizeof(float) * N), *y0 = malloc(sizeof(float) * M * N),
              *y1 = malloc(sizeof(float) * M * N);
        assert_true(scr && x && b && sc && y0 && y1);
        for (size_t i = 0; i < (size_t)M * K; i++)
            x[i] = (int8_t)((int)test_rng_below(&rng, 127) - 63);
        for (size_t i = 0; i < (size_t)N * K; i++)
            b[i] = (int8_t)((int)test_rng_below(&rng, 255) - 127);
        for (uint32_t r = 0; r < N; r++)
            sc[r] = (0.5f + test_rng_float(&rng)) * 1e-2f;
        struct npu_weights *w;
        assert_int_equal(npu_weights_alloc(N, K, &w), 0);
        assert_int_equal(npu_weights_fill(w, 0, N, b, sc), 0);
        for (uint32_t rows = M - 5; rows <= M; rows += 5) {
            struct npu_job j0 = {.graph = gr, .w = w, .xq = x, .rows = rows,
                                 .act_scale = 0.02f, .y = y0};
            struct npu_job j1 = j0;
            j1.y = y1;
            j1.a_max = 63;
            memset(y1, 0, sizeof(float) * M * N);
            assert_int_equal(npu_graph_run(gr, &j0, scr, &err), 0);
            assert_int_equal(npu_graph_run(gr, &j1, scr, &err), 0);
            assert_memory_equal(y0, y1, sizeof(float) * rows * N);
            /* kept staging: one staged the usual way, the estimate over it,
             * the first again: it must stage again */
            uint64_t held = 0, key = npu_stage_keys(1);
            struct npu_job c0 = j0, c1 = j1, c2 = j0;
            c0.stage_key = c1.stage_key = c2.stage_key = key;
            c2.y = y1;
            assert_int_equal(npu_graph_run_cached(gr, &c0, scr, &held, &err), 0);
            assert_int_equal(npu_graph_run_cached(gr, &c1, scr, &held, &err), 0);
            assert_memory_equal(y0, y1, sizeof(float) * rows * N);
            memset(y1, 0, sizeof(float) * M * N);
            assert_int_equal(npu_graph_run_cached(gr, &c2, scr, &held, &err), 0);
            assert_memory_equal(y0, y1, sizeof(float) * rows * N);
        }
        npu_weights_destroy(w);
        free(scr);
        free(x);
        free(b);
        free(sc);
        free(y0);
        free(y1);
    }
    npu_device_destroy(dev);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    fprintf(stderr, "amx estimate kernel: %s\n",
            npu_est_amx_available() ? "tested" : "not on this CPU or OS: skipped");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_extremes),
        cmocka_unit_test(test_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
