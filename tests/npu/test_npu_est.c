/* test_npu_est.c: the AVX2 int8 GEMM for narrow activations (npu_est_avx2.c:
 * codes within +-63 with two groups pre-summed in int16, within +-31 with
 * four) bit for bit against its scalar twin (npu_est_gemm_ref: the kernel's
 * own int16 steps) and the exact scalar GEMM (the specification), int32 and
 * dequantized float outputs: random shapes (k not a multiple of 4 or of the
 * presum, channel ranges inside blocks, an odd last block, odd row counts),
 * extreme operands (a at its bound, codes +-64: the largest int16 sums).
 * That the reference does model the int16 steps (beyond the bound it
 * differs from the exact GEMM, so agreement within it is a real check);
 * npu_est_prep's bound check; and a graph job with npu_job.a_max against
 * the same job without (same floats), also where the kernel must not apply
 * (a wide weight block, a code beyond the bound). Seed printed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "npu_est.h"
#include "npu_gemm_internal.h"
#include "testutil.h"

static struct test_rng rng;

static int bound_of(int P)
{
    return P == 4 ? 31 : 63;
}

/* mode 0: random within the bounds; 1: a = +bound, codes +64 (the largest
 * sums); 2: a = -bound or +bound, codes +-64 per row */
static void make(int8_t *a, size_t na, int8_t *b, uint32_t n, uint32_t k, int P, int mode)
{
    const int ab = bound_of(P);
    for (size_t i = 0; i < na; i++)
        a[i] = mode == 1   ? (int8_t)ab
               : mode == 2 ? (int8_t)(test_rng_below(&rng, 2) ? ab : -ab)
                           : (int8_t)((int)test_rng_below(&rng, 2 * (uint32_t)ab + 1) - ab);
    for (uint32_t r = 0; r < n; r++) {
        int8_t s = (int8_t)(mode == 1 || test_rng_below(&rng, 2) ? 64 : -64);
        for (uint32_t j = 0; j < k; j++)
            b[(size_t)r * k + j] =
                mode ? s : (int8_t)((int)test_rng_below(&rng, 129) - 64);
    }
}

struct out {
    int32_t *c;
    float *y;
};

static void run(void (*fn)(const struct npu_gemm_args *, int), int P,
                const struct npu_gemm_b *pb, const uint8_t *stage, uint32_t m, uint32_t r0,
                uint32_t r1, const float *scale, struct out *o)
{
    uint32_t w = r1 - r0;
    memset(o->c, 0x55, sizeof(int32_t) * m * w);
    memset(o->y, 0x55, sizeof(float) * m * w);
    struct npu_gemm_args g = {.b = pb, .a = stage, .m = m, .r0 = r0, .r1 = r1, .c = o->c,
                              .ldc = w, .act_scale = 0.0173f, .scale = scale};
    fn(&g, P);
    g.c = NULL;
    g.y = o->y;
    g.ldy = w;
    fn(&g, P);
}

static void exact(const struct npu_gemm_b *pb, const int8_t *a, uint32_t m, uint32_t k,
                  uint32_t r0, uint32_t r1, const float *scale, struct out *o)
{
    uint32_t w = r1 - r0;
    uint8_t *st = malloc(npu_gemm_prep_bytes(pb->k4, m));
    assert_non_null(st);
    npu_ops_scalar.prep(a, k, m, k, pb->k4, 0, st);
    struct npu_gemm_args g = {.b = pb, .a = st, .m = m, .r0 = r0, .r1 = r1, .c = o->c,
                              .ldc = w, .act_scale = 0.0173f, .scale = scale};
    npu_ops_scalar.gemm(&g);
    g.c = NULL;
    g.y = o->y;
    g.ldy = w;
    npu_ops_scalar.gemm(&g);
    free(st);
}

static int same(const struct out *got, const struct out *ref, uint32_t m, uint32_t w,
                const char *what, uint32_t n, uint32_t k, int P, int fail)
{
    for (size_t i = 0; i < (size_t)m * w; i++)
        if (got->c[i] != ref->c[i] || memcmp(&got->y[i], &ref->y[i], sizeof(float))) {
            if (fail)
                fail_msg("%s P=%d m=%u n=%u k=%u: [%zu][%zu] = %d / %.9g, exact %d / %.9g", what,
                         P, m, n, k, i / w, i % w, got->c[i], (double)got->y[i], ref->c[i],
                         (double)ref->y[i]);
            return 0;
        }
    return 1;
}

static void check(uint32_t m, uint32_t n, uint32_t k, uint32_t r0, uint32_t r1, int P, int mode)
{
    int8_t *a = malloc((size_t)m * k), *b = malloc((size_t)n * k);
    float *scale = malloc(sizeof(float) * n);
    assert_true(a && b && scale);
    make(a, (size_t)m * k, b, n, k, P, mode);
    for (uint32_t r = 0; r < n; r++)
        scale[r] = (0.5f + test_rng_float(&rng)) * 1e-3f;
    struct npu_gemm_b *pb;
    assert_int_equal(npu_gemm_b_create(b, n, k, &pb), 0);
    assert_true(npu_est_blocks_ok(pb, r0, r1));
    const uint32_t w = r1 - r0;
    struct out o[3];
    for (int i = 0; i < 3; i++) {
        o[i].c = malloc(sizeof(int32_t) * m * w);
        o[i].y = malloc(sizeof(float) * m * w);
        assert_true(o[i].c && o[i].y);
    }
    exact(pb, a, m, k, r0, r1, scale, &o[0]);
    uint8_t *st = malloc(npu_gemm_prep_bytes(pb->k4, m));
    assert_non_null(st);
    assert_int_equal(npu_est_prep(a, m, k, pb->k4, P, st), 0);
    run(npu_est_gemm_ref, P, pb, st, m, r0, r1, scale, &o[1]);
    same(&o[1], &o[0], m, w, "reference", n, k, P, 1);
    if (npu_kernel_available(NPU_KERNEL_AVX2)) {
        run(npu_est_gemm_avx2, P, pb, st, m, r0, r1, scale, &o[2]);
        same(&o[2], &o[0], m, w, "avx2", n, k, P, 1);
    }
    for (int i = 0; i < 3; i++) {
        free(o[i].c);
        free(o[i].y);
    }
    free(st);
    npu_gemm_b_destroy(pb);
    free(a);
    free(b);
    free(scale);
}

static void test_random(void **state)
{
    (void)state;
    for (int it = 0; it < 300; it++) {
        int P = test_rng_below(&rng, 2) ? 4 : 2;
        uint32_t m = 1 + test_rng_below(&rng, 40), n = 1 + test_rng_below(&rng, 200);
        uint32_t k = 1 + test_rng_below(&rng, 300);
        if (it % 3 == 0)
            k = test_rng_below(&rng, 2) ? 64 : 128; /* the estimate's head sizes */
        uint32_t r0 = test_rng_below(&rng, n), r1 = r0 + 1 + test_rng_below(&rng, n - r0);
        if (it % 2)
            r0 = 0, r1 = n;
        check(m, n, k, r0, r1, P, 0);
    }
}

static void test_extremes(void **state)
{
    (void)state;
    for (int P = 2; P <= 4; P += 2)
        for (int mode = 1; mode <= 2; mode++) {
            check(5, 48, 64, 0, 48, P, mode);
            check(3, 37, 128, 0, 37, P, mode);
            check(2, 70, 203, 5, 66, P, mode);
        }
}

/* Beyond the bound (staged by hand: npu_est_prep refuses it) the reference's
 * int16 steps wrap and differ from the exact sums. */
static void test_reference_can_fail(void **state)
{
    (void)state;
    const uint32_t m = 2, n = 16, k = 64;
    for (int P = 2; P <= 4; P += 2) {
        int8_t a[2 * 64], b[16 * 64];
        float scale[16];
        for (size_t i = 0; i < sizeof a; i++)
            a[i] = 127;
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = 64;
        for (uint32_t r = 0; r < n; r++)
            scale[r] = 1e-3f;
        struct npu_gemm_b *pb;
        assert_int_equal(npu_gemm_b_create(b, n, k, &pb), 0);
        uint8_t *st = malloc(npu_gemm_prep_bytes(pb->k4, m));
        assert_non_null(st);
        assert_int_equal(npu_est_prep(a, m, k, pb->k4, P, st), -1);
        const int off = P == 4 ? 32 : 64;
        for (uint32_t i = 0; i < m; i++)
            for (uint32_t j = 0; j < k; j++)
                st[(size_t)i * pb->k4 + j] = (uint8_t)(a[(size_t)i * k + j] + off);
        int32_t c0[32], c1[32];
        float y0[32], y1[32];
        struct out o0 = {c0, y0}, o1 = {c1, y1};
        exact(pb, a, m, k, 0, n, scale, &o0);
        run(npu_est_gemm_ref, P, pb, st, m, 0, n, scale, &o1);
        assert_false(same(&o1, &o0, m, n, "reference", n, k, P, 0));
        /* one code past the bound is refused */
        a[17] = (int8_t)(-(P == 4 ? 32 : 64));
        for (size_t i = 0; i < sizeof a; i++)
            a[i] = i == 17 ? a[i] : 0;
        assert_int_equal(npu_est_prep(a, m, k, pb->k4, P, st), -1);
        a[17]++;
        assert_int_equal(npu_est_prep(a, m, k, pb->k4, P, st), 0);
        free(st);
        npu_gemm_b_destroy(pb);
    }
}

/* Graph jobs: a_max set against unset, the same floats, where the kernel
 * applies and where it must not (a wide block; a code beyond a_max). */
static void test_graph(void **state)
{
    (void)state;
    const uint32_t M = 32, K = 64, N = 256;
    struct sl_err err = {{0}};
    struct npu_device_config dc;
    npu_device_config_init(&dc);
    if (npu_kernel_available(NPU_KERNEL_AVX2)) /* the kernel a_max selects, on any x86 */
        dc.kernel = NPU_KERNEL_AVX2;
    struct npu_device *dev;
    assert_int_equal(npu_device_create_config(&dc, &dev, &err), 0);
    const struct npu_graph *gr;
    assert_int_equal(npu_device_graph(dev, M, K, N, &gr, &err), 0);
    struct npu_graph_info gi;
    npu_graph_info(gr, &gi);
    void *scr = malloc(gi.scratch_bytes);
    int8_t *x = malloc((size_t)M * K), *b = malloc((size_t)N * K);
    float *sc = malloc(sizeof(float) * N), *y0 = malloc(sizeof(float) * M * N),
          *y1 = malloc(sizeof(float) * M * N);
    assert_true(scr && x && b && sc && y0 && y1);
    for (int variant = 0; variant < 4; variant++) {
        uint32_t amax = variant == 1 ? 31 : 63;
        for (size_t i = 0; i < (size_t)M * K; i++)
            x[i] = (int8_t)((int)test_rng_below(&rng, 2 * amax + 1) - (int)amax);
        if (variant == 3)
            x[M * K / 2] = (int8_t)(amax + 1); /* beyond: the usual kernel */
        for (size_t i = 0; i < (size_t)N * K; i++)
            b[i] = (int8_t)((int)test_rng_below(&rng, 129) - 64);
        if (variant == 2)
            b[(size_t)40 * K + 3] = 100; /* a wide block: the usual kernel */
        for (uint32_t r = 0; r < N; r++)
            sc[r] = (0.5f + test_rng_float(&rng)) * 1e-2f;
        struct npu_weights *w;
        assert_int_equal(npu_weights_alloc(N, K, &w), 0);
        assert_int_equal(npu_weights_fill(w, 0, N, b, sc), 0);
        struct npu_job j0 = {.graph = gr, .w = w, .xq = x, .rows = M - 3, .act_scale = 0.02f,
                             .y = y0};
        struct npu_job j1 = j0;
        j1.y = y1;
        j1.a_max = amax;
        assert_int_equal(npu_graph_run(gr, &j0, scr, &err), 0);
        assert_int_equal(npu_graph_run(gr, &j1, scr, &err), 0);
        assert_memory_equal(y0, y1, sizeof(float) * (M - 3) * N);
        /* kept staging: a job staged the usual way, then one with the same
         * stage_key and a_max (the narrow kernel, or its fallback after
         * npu_est_prep wrote the staging), then the first again: it must
         * stage again rather than reuse what the narrow kernel left */
        uint64_t held = 0, key = npu_stage_keys(1);
        struct npu_job c0 = j0, c1 = j1, c2 = j0;
        c0.stage_key = c1.stage_key = c2.stage_key = key;
        c2.y = y1;
        assert_int_equal(npu_graph_run_cached(gr, &c0, scr, &held, &err), 0);
        assert_int_equal(npu_graph_run_cached(gr, &c1, scr, &held, &err), 0);
        assert_memory_equal(y0, y1, sizeof(float) * (M - 3) * N);
        memset(y1, 0, sizeof(float) * M * N);
        assert_int_equal(npu_graph_run_cached(gr, &c2, scr, &held, &err), 0);
        assert_memory_equal(y0, y1, sizeof(float) * (M - 3) * N);
        npu_weights_destroy(w);
    }
    free(scr);
    free(x);
    free(b);
    free(sc);
    free(y0);
    free(y1);
    npu_device_destroy(dev);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    fprintf(stderr, "avx2 narrow-activation kernel: %s\n",
            npu_kernel_available(NPU_KERNEL_AVX2) ? "tested" : "not on this CPU: reference only");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_extremes),
        cmocka_unit_test(test_reference_can_fail),
        cmocka_unit_test(test_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
