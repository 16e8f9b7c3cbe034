/* test_attn_kt.c: the prefill's grouped-query scores against transposed
 * keys (infer_attn_scores_kt_avx512, infer_keys_transpose) on random shapes
 * (seed printed), bit for bit:
 * - against a scalar reference of the AVX-512 tile's arithmetic (16 fmaf
 *   lanes from zero, lanes j + j+8, j + j+4, j + j+2, 0 + 1), scaled as
 *   infer_div_max_scalar scales (x / d) with its per-lane maximum;
 * - against the path it replaces: infer_matmul_nt with the AVX-512 kernel,
 *   then infer_div_max(INFER_MATMUL_AVX512) on each row;
 * for head sizes 32, 64 and 128, 1..16 query rows, key counts with and without a
 * tail, d a power of two and not, large scores, signed zeros; nothing past
 * a row's T keys written; the transposed keys' padding zero;
 * - infer_op_attention on a prefill's rows (the grouped rows through the
 *   transposed keys) against the same rows one call each (the row loop). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "infer_internal.h"
#include "infer_matmul.h"
#include "testutil.h"

static struct test_rng rng;

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * test_rng_normal(&rng);
}

static int same_bits(float a, float b)
{
    return !memcmp(&a, &b, sizeof a);
}

/* The AVX-512 tile's dot product, one operation at a time. */
static float dot_avx512_order(const float *x, const float *w, uint32_t cols)
{
    float lane[16] = {0};
    for (uint32_t c = 0; c < cols; c += 16)
        for (uint32_t j = 0; j < 16; j++)
            lane[j] = fmaf(x[c + j], w[c + j], lane[j]);
    for (uint32_t h = 8; h; h /= 2)
        for (uint32_t j = 0; j < h; j++)
            lane[j] = lane[j] + lane[j + h];
    return lane[0];
}

static void test_scores_kt(void **st)
{
    (void)st;
#ifdef SLUICE_KERNELS_X86
    if (!infer_matmul_kernel_available(INFER_MATMUL_AVX512)) {
        fprintf(stderr, "no AVX-512 here: the transposed-key scores are not run\n");
        skip();
    }
    enum { MAXQ = 16, MAXT = 300, PAD = 7 };
    static const uint32_t hss[] = {32, 64, 64, 128};
    size_t maxld = INFER_ATT_KT_MAX_HS + PAD, ldt_max = MAXT + 32;
    float *q = malloc(sizeof(float) * MAXQ * maxld), *k = malloc(sizeof(float) * MAXT * maxld);
    float *kt = malloc(sizeof(float) * INFER_ATT_KT_MAX_HS * ldt_max);
    float *att = malloc(sizeof(float) * MAXQ * (MAXT + PAD));
    float *ref = malloc(sizeof(float) * MAXQ * MAXT), maxv[MAXQ];
    assert_true(q && k && kt && att && ref);
    for (int it = 0; it < 600; it++) {
        uint32_t hs = hss[test_rng_below(&rng, sizeof hss / sizeof hss[0])];
        uint32_t nq = 1 + test_rng_below(&rng, MAXQ), T = 1 + test_rng_below(&rng, MAXT);
        if (it % 3 == 0) /* whole key blocks */
            T = 16 * (1 + test_rng_below(&rng, MAXT / 16));
        size_t ldq = hs + test_rng_below(&rng, PAD), ldk = hs + test_rng_below(&rng, PAD);
        size_t lda = T + test_rng_below(&rng, PAD);
        size_t ldt = ((T + 15) & ~(size_t)15) + 16 * test_rng_below(&rng, 2);
        float d = it % 4 == 0   ? 8.0f
                  : it % 4 == 1 ? 0.5f
                                : sqrtf((float)hs) + 0.25f * (float)(it % 3);
        fill(q, (size_t)nq * ldq, it % 5 == 0 ? 30.0f : 1.0f);
        fill(k, (size_t)T * ldk, 1.0f);
        if (it % 7 == 0) /* exact and signed zeros in the products */
            for (uint32_t c = 0; c < hs; c += 3)
                q[c] = (c & 1) ? -0.0f : 0.0f;
        if (it % 11 == 0) /* a whole key of zeros: a score of 0 (or -0) */
            memset(k, 0, sizeof(float) * ldk);
        for (size_t i = 0; i < INFER_ATT_KT_MAX_HS * ldt_max; i++)
            kt[i] = 7.0f;
        infer_keys_transpose(kt, ldt, k, ldk, T, hs);
        for (uint32_t c = 0; c < hs; c++)
            for (uint32_t t = 0; t < ldt; t++) {
                float want = t < T ? k[t * ldk + c] : 0.0f;
                if (!same_bits(kt[c * ldt + t], want))
                    fail_msg("transpose T=%u hs=%u: kt[%u][%u] %a, want %a", T, hs, c, t,
                             (double)kt[c * ldt + t], (double)want);
            }
        for (size_t i = 0; i < (size_t)nq * lda; i++)
            att[i] = -9.0f;
        infer_attn_scores_kt_avx512(att, lda, q, ldq, nq, kt, ldt, T, hs, d, maxv);
        /* the path it replaces */
        infer_matmul_nt(INFER_MATMUL_AVX512, ref, T, q, ldq, k, INFER_W_F32, ldk, nq, hs, 0, T);
        for (uint32_t i = 0; i < nq; i++) {
            float mref = infer_div_max(INFER_MATMUL_AVX512, ref + i * T, T, d);
            float lanes[16];
            for (int l = 0; l < 16; l++)
                lanes[l] = -INFINITY;
            for (uint32_t t = 0; t < lda; t++) {
                float got = att[i * lda + t];
                if (t >= T) {
                    if (got != -9.0f)
                        fail_msg("nq=%u T=%u hs=%u: [%u][%u] past T written", nq, T, hs, i, t);
                    continue;
                }
                float s = dot_avx512_order(q + i * ldq, k + t * ldk, hs) / d;
                if (s > lanes[t & 15])
                    lanes[t & 15] = s;
                if (!same_bits(got, s) || !same_bits(got, ref[i * T + t]))
                    fail_msg("nq=%u T=%u hs=%u d=%g [%u][%u]: %a, scalar %a, nt+div_max %a", nq, T,
                             hs, (double)d, i, t, (double)got, (double)s, (double)ref[i * T + t]);
            }
            float mscalar = infer_div_max_reduce16(lanes);
            if (!same_bits(maxv[i], mref) || !same_bits(maxv[i], mscalar))
                fail_msg("nq=%u T=%u hs=%u row %u: max %a, scalar %a, div_max %a", nq, T, hs, i,
                         (double)maxv[i], (double)mscalar, (double)mref);
        }
    }
    free(q);
    free(k);
    free(kt);
    free(att);
    free(ref);
#else
    fprintf(stderr, "not x86: the transposed-key scores are not built\n");
    skip();
#endif
}

/* A prefill's rows in one call (16 or more grouped rows: the transposed
 * keys where the AVX-512 kernel is in use) against the same rows one call
 * each (a single row: the row loop), bit for bit, on a few GQA shapes and
 * head ranges. */
static void test_attention_prefill_rows(void **st)
{
    (void)st;
    static const struct {
        uint32_t heads, kv, hd, n, pos0, h0, h1;
    } shapes[] = {
        {8, 2, 64, 40, 0, 0, 8},    {8, 2, 64, 37, 5, 4, 8},  {32, 4, 64, 64, 0, 8, 24},
        {12, 4, 48, 20, 17, 0, 12}, {4, 1, 128, 33, 2, 0, 4}, {6, 2, 40, 18, 1, 0, 6},
        {16, 2, 64, 700, 60, 0, 8}, {8, 4, 32, 24, 0, 0, 8},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        uint32_t H = shapes[s].heads, hd = shapes[s].hd, n = shapes[s].n, pos0 = shapes[s].pos0;
        uint32_t Q = H * hd, KV = shapes[s].kv * hd, T = pos0 + n;
        struct format_config c = {
            .n_heads = H, .n_kv_heads = shapes[s].kv, .head_dim = hd, .seq_len = T};
        float *q = malloc(sizeof(float) * n * Q), *kc = malloc(sizeof(float) * T * KV);
        float *vc = malloc(sizeof(float) * T * KV), *out = malloc(sizeof(float) * n * Q);
        float *one = malloc(sizeof(float) * n * Q);
        float *att = malloc(sizeof(float) * INFER_ATT_ROWS * T);
        assert_true(q && kc && vc && out && one && att);
        fill(q, (size_t)n * Q, 1.5f);
        fill(kc, (size_t)T * KV, 1.0f);
        fill(vc, (size_t)T * KV, 1.0f);
        memset(out, 0, sizeof(float) * n * Q);
        memset(one, 0, sizeof(float) * n * Q);
        infer_op_attention(out, q, kc, vc, n, pos0, &c, shapes[s].h0, shapes[s].h1, att);
        for (uint32_t r = 0; r < n; r++)
            infer_op_attention(one + (size_t)r * Q, q + (size_t)r * Q, kc, vc, 1, pos0 + r, &c,
                               shapes[s].h0, shapes[s].h1, att);
        for (size_t i = 0; i < (size_t)n * Q; i++)
            if (!same_bits(out[i], one[i]))
                fail_msg("shape %zu: out[%zu] %a, one row at a time %a", s, i, (double)out[i],
                         (double)one[i]);
        free(q);
        free(kc);
        free(vc);
        free(out);
        free(one);
        free(att);
    }
}

int main(void)
{
    uint64_t seed = test_seed();
    fprintf(stderr, "test_attn_kt seed %llu (matmul kernel in use: %s)\n", (unsigned long long)seed,
            infer_matmul_kernel_name(infer_matmul_kernel_used()));
    test_rng_init(&rng, seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scores_kt),
        cmocka_unit_test(test_attention_prefill_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
