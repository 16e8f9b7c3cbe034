/* test_infer_ops.c: the CPU operators against direct, naive formulations:
 * RMSNorm, RoPE (pairs (2i, 2i+1) rotated by pos * theta^(-2i/hd)), causal
 * GQA attention with softmax, SwiGLU, the blocked float matmul, and the int8
 * linear (quantize, int32 GEMM, dequantize) against double arithmetic. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "infer_matmul.h"
#include "npu.h"
#include "testutil.h"

static struct test_rng rng;

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * test_rng_normal(&rng);
}

/* A softmax step (infer_exp_sum, infer_div_max) on every SIMD kernel
 * against the scalar results ref[0..len) and rref, bit for bit (a NaN
 * result matches a NaN). */
typedef float softmax_step(enum infer_matmul_kernel k, float *a, uint32_t n, float p);
static void kernels_match(softmax_step *step, const char *what, const float *x, const float *ref,
                          float *got, uint32_t len, uint32_t n, float p, float rref)
{
    for (int k = 1; k < INFER_MATMUL_COUNT; k++) {
        if (!infer_matmul_kernel_available((enum infer_matmul_kernel)k))
            continue;
        const char *name = infer_matmul_kernel_name((enum infer_matmul_kernel)k);
        memcpy(got, x, sizeof(float) * len);
        float r = step((enum infer_matmul_kernel)k, got, n, p);
        for (uint32_t i = 0; i < len; i++)
            if (memcmp(&got[i], &ref[i], sizeof(float)) != 0)
                fail_msg("%s %s of %.9g with %.9g: %.9g, scalar %.9g (n %u, element %u)", name,
                         what, (double)x[i], (double)p, (double)got[i], (double)ref[i], n, i);
        if (memcmp(&r, &rref, sizeof r) != 0 && !(isnan(r) && isnan(rref)))
            fail_msg("%s %s result %.9g, scalar %.9g (n %u)", name, what, (double)r,
                     (double)rref, n);
    }
}

/* Softmax scaling: every SIMD kernel against the scalar definition bit for
 * bit (the divided values, nothing past n, the returned maximum) at every
 * length and tail, with zeros of both signs, infinities, NaN and zero or
 * negative divisors; the definition against a plain maximum of the
 * quotients (NaN never wins, -inf when empty). */
static void test_div_max(void **st)
{
    (void)st;
    enum { N = 700 };
    float *x = malloc(sizeof(float) * (N + 32)), *ref = malloc(sizeof(float) * (N + 32));
    float *got = malloc(sizeof(float) * (N + 32));
    static const float specials[] = {0.0f,  -0.0f, INFINITY, -INFINITY, NAN,    1e30f,
                                     -1e30f, 1e-40f, -1e-40f, 3.5f,     -3.5f, 8.0f,
                                     0x1p-149f, -3e-39f, 0x1.fffffep127f};
    /* powers of two (the AVX-512 kernel multiplies by the exact inverse
     * there), at the range's ends and past them */
    static const float divisors[] = {8.0f,   0.37f,     -2.0f,     0.0f,      -0.0f,
                                     INFINITY, 1e-30f,  NAN,       1.0f,      0.5f,
                                     -8.0f,  0x1p-126f, 0x1p126f,  0x1p127f,  0x1p-127f,
                                     4.0f};
    for (int round = 0; round < 80; round++) {
        uint32_t n = round < 40 ? (uint32_t)round : 1 + test_rng_below(&rng, N);
        float d = round % 3 ? (float)(0.1 + 10 * test_rng_float(&rng))
                            : divisors[test_rng_below(&rng, 16)];
        int ties = round % 5 == 4; /* few distinct values: ties in every lane */
        for (uint32_t i = 0; i < n + 32; i++) {
            uint32_t pick = test_rng_below(&rng, 8);
            x[i] = ties ? (float)test_rng_below(&rng, 3) - 1.0f
                   : pick == 0 ? specials[test_rng_below(&rng, 15)]
                               : (test_rng_float(&rng) - 0.5f) * 100.0f;
            if (ties && pick == 0)
                x[i] = -0.0f;
        }
        memcpy(ref, x, sizeof(float) * (N + 32));
        float mref = infer_div_max_scalar(ref, n, d);
        float plain = -INFINITY;
        for (uint32_t i = 0; i < n; i++) {
            float q = x[i] / d;
            assert_memory_equal(&ref[i], &q, sizeof q);
            if (q > plain)
                plain = q;
        }
        assert_true(mref == plain || (isnan(mref) && isnan(plain)));
        assert_false(isnan(mref));
        for (uint32_t i = n; i < n + 32; i++)
            assert_memory_equal(&ref[i], &x[i], sizeof(float)); /* nothing past n */
        kernels_match(infer_div_max, "division", x, ref, got, n + 32, n, d, mref);
    }
    free(x);
    free(ref);
    free(got);
}

/* The softmax exp: every SIMD kernel against the scalar definition bit for
 * bit (values and sum) at every length and tail, with the range ends, ties
 * of the reduction, NaN and infinities; the definition against expf within
 * 2 ulp over the softmax range [-87, 0] and beyond. */
static void test_exp_sum(void **st)
{
    (void)st;
    enum { N = 700 };
    float *x = malloc(sizeof(float) * (N + 32)), *ref = malloc(sizeof(float) * (N + 32));
    float *got = malloc(sizeof(float) * (N + 32));
    static const float specials[] = {0.0f,        -0.0f,   -87.0f,   -87.01f,   88.0f, 88.5f,
                                     -1e30f,      1e30f,   INFINITY, -INFINITY, NAN,   -0.5f,
                                     0.34657359f, -86.99f, 1e-30f,   -103.0f};
    for (int round = 0; round < 60; round++) {
        uint32_t n = round < 40 ? (uint32_t)round : 1 + test_rng_below(&rng, N);
        float sub = round % 4 == 0 ? 0.0f : (test_rng_float(&rng) - 0.5f) * 20.0f;
        for (uint32_t i = 0; i < n + 32; i++) {
            uint32_t pick = test_rng_below(&rng, 8);
            x[i] = pick == 0 ? specials[test_rng_below(&rng, 16)]
                             : (test_rng_float(&rng) - 0.9f) * 100.0f;
        }
        memcpy(ref, x, sizeof(float) * (N + 32));
        float sref = infer_exp_sum_scalar(ref, n, sub);
        for (uint32_t i = n; i < n + 32; i++)
            assert_memory_equal(&ref[i], &x[i], sizeof(float)); /* nothing past n */
        kernels_match(infer_exp_sum, "exp", x, ref, got, n + 32, n, sub, sref);
    }
    /* accuracy of the definition against expf */
    double worst = 0;
    for (int i = 0; i < 200000; i++) {
        float v = -100.0f + 190.0f * test_rng_float(&rng);
        float e = v;
        infer_exp_sum_scalar(&e, 1, 0.0f);
        float want = expf(v);
        if (v < -87.0f) {
            assert_true(e == 0.0f);
        } else if (v > 88.0f) {
            assert_true(isinf(e));
        } else if (want >= 1.1754944e-38f) {
            double ulp = ldexp(1.0, ilogb(want) - 23);
            double err = fabs((double)e - (double)want) / ulp;
            worst = err > worst ? err : worst;
        }
    }
    fprintf(stderr, "exp: worst error %.2f ulp of expf\n", worst);
    assert_true(worst <= 2.0);
    free(x);
    free(ref);
    free(got);
}

static void test_rmsnorm(void **st)
{
    (void)st;
    float x[3 * 10], w[10], out[3 * 10];
    fill(x, 30, 2.0f);
    fill(w, 10, 1.0f);
    infer_op_rmsnorm(out, x, w, 3, 10, 1e-5f);
    for (int r = 0; r < 3; r++) {
        double ss = 0;
        for (int j = 0; j < 10; j++)
            ss += (double)x[r * 10 + j] * x[r * 10 + j];
        double inv = 1.0 / sqrt(ss / 10 + 1e-5);
        for (int j = 0; j < 10; j++)
            assert_float_equal(out[r * 10 + j], w[j] * x[r * 10 + j] * inv, 1e-5);
    }
    infer_op_rmsnorm(x, x, w, 3, 10, 1e-5f); /* in place */
    assert_memory_equal(x, out, sizeof out);
}

static void test_rope(void **st)
{
    (void)st;
    enum { H = 3, HD = 8, N = 4 };
    float x[N * H * HD], ref[N * H * HD];
    fill(x, N * H * HD, 1.0f);
    memcpy(ref, x, sizeof x);
    infer_op_rope(x, N, H, HD, 5, 10000.0f);
    for (int r = 0; r < N; r++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < HD / 2; i++) {
                double ang = (5 + r) * pow(10000.0, -2.0 * i / HD);
                const float *a = ref + r * H * HD + h * HD + 2 * i;
                double e0 = a[0] * cos(ang) - a[1] * sin(ang);
                double e1 = a[0] * sin(ang) + a[1] * cos(ang);
                assert_float_equal(x[r * H * HD + h * HD + 2 * i], e0, 1e-4);
                assert_float_equal(x[r * H * HD + h * HD + 2 * i + 1], e1, 1e-4);
            }
    /* a rotation: each pair keeps its length; a large theta (Llama 3's
     * 500000) changes only the frequencies */
    for (int i = 0; i < N * H * HD; i += 2)
        assert_float_equal(hypot(x[i], x[i + 1]), hypot(ref[i], ref[i + 1]), 1e-4);
    memcpy(x, ref, sizeof x);
    infer_op_rope(x, 1, H, HD, 0, 500000.0f);
    for (int i = 0; i < H * HD; i++)
        assert_true(x[i] == ref[i]); /* position 0: the identity */
    infer_op_rope(x + H * HD, 1, H, HD, 7, 500000.0f);
    for (int i = 0; i < HD / 2; i++) {
        double ang = 7 * pow(500000.0, -2.0 * i / HD);
        const float *a = ref + H * HD + 2 * i;
        assert_float_equal(x[H * HD + 2 * i], a[0] * cos(ang) - a[1] * sin(ang), 1e-4);
    }
    /* head ranges (the pipeline's attention groups): the same bits as the
     * whole, the other heads untouched */
    float whole[N * H * HD], part[N * H * HD];
    memcpy(whole, ref, sizeof whole);
    memcpy(part, ref, sizeof part);
    infer_op_rope(whole, N, H, HD, 9, 10000.0f);
    infer_op_rope_heads(part, N, H, HD, 1, 2, 9, 10000.0f);
    for (int r = 0; r < N; r++)
        for (int i = 0; i < H * HD; i++) {
            const float *want = i / HD == 1 ? whole : ref;
            assert_memory_equal(&part[r * H * HD + i], &want[r * H * HD + i], sizeof(float));
        }
    infer_op_rope_heads(part, N, H, HD, 0, 1, 9, 10000.0f);
    infer_op_rope_heads(part, N, H, HD, 2, 3, 9, 10000.0f);
    assert_memory_equal(part, whole, sizeof whole);
}

/* Causal GQA attention against a double-precision transcription of run.c,
 * over shapes that cross the row blocks (INFER_ATT_ROWS), odd head sizes
 * (column tails of the kernels) and several group sizes. */
static void check_attention(uint32_t n_heads, uint32_t n_kv, uint32_t hd, uint32_t n, uint32_t pos0)
{
    struct format_config c = {
        .n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = hd, .seq_len = pos0 + n};
    uint32_t Q = n_heads * hd, KV = n_kv * hd, T = pos0 + n;
    float *q = malloc(sizeof(float) * n * Q), *kc = malloc(sizeof(float) * T * KV);
    float *vc = malloc(sizeof(float) * T * KV), *out = malloc(sizeof(float) * n * Q);
    float *att = malloc(sizeof(float) * INFER_ATT_ROWS * T);
    double *sc = malloc(sizeof(double) * T);
    fill(q, (size_t)n * Q, 1.0f);
    fill(kc, (size_t)T * KV, 1.0f);
    fill(vc, (size_t)T * KV, 1.0f);
    infer_op_attention(out, q, kc, vc, n, pos0, &c, 0, n_heads, att);
    double worst = 0;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t h = 0; h < n_heads; h++) {
            uint32_t kvh = h / (n_heads / n_kv);
            double mx = -1e300, sum = 0;
            for (uint32_t t = 0; t <= pos0 + r; t++) {
                double d = 0;
                for (uint32_t i = 0; i < hd; i++)
                    d += (double)q[r * Q + h * hd + i] * kc[t * KV + kvh * hd + i];
                sc[t] = d / sqrt((double)hd);
                mx = sc[t] > mx ? sc[t] : mx;
            }
            for (uint32_t t = 0; t <= pos0 + r; t++)
                sum += (sc[t] = exp(sc[t] - mx));
            for (uint32_t i = 0; i < hd; i++) {
                double o = 0;
                for (uint32_t t = 0; t <= pos0 + r; t++)
                    o += sc[t] / sum * vc[t * KV + kvh * hd + i];
                double d = fabs(out[r * Q + h * hd + i] - o);
                worst = d > worst ? d : worst;
            }
        }
    if (!(worst < 1e-5))
        fail_msg("attention heads %u/%u hd %u n %u pos0 %u: max error %g", n_heads, n_kv, hd, n,
                 pos0, worst);
    /* one row at a time, continuing the cache (decoding: a kv head's query
     * heads as one product), and one head at a time: bit-identical to the
     * batch */
    float *one = malloc(sizeof(float) * Q);
    for (uint32_t r = 0; r < n; r += 7) {
        infer_op_attention(one, q + r * Q, kc, vc, 1, pos0 + r, &c, 0, n_heads, att);
        assert_memory_equal(one, out + r * Q, sizeof(float) * Q);
        memset(one, 0, sizeof(float) * Q);
        for (uint32_t h = 0; h < n_heads; h++)
            infer_op_attention(one, q + r * Q, kc, vc, 1, pos0 + r, &c, h, h + 1, att);
        assert_memory_equal(one, out + r * Q, sizeof(float) * Q);
    }
    free(one);
    /* every row of one head at a time (one head of a group runs in blocks
     * of rows with the causal mask; the batch, a group's heads a row at a
     * time over the visible keys only): bit-identical columns */
    float *oh = malloc(sizeof(float) * n * Q);
    for (uint32_t h = 0; h < n_heads; h++) {
        infer_op_attention(oh, q, kc, vc, n, pos0, &c, h, h + 1, att);
        for (uint32_t r = 0; r < n; r++)
            assert_memory_equal(oh + r * Q + h * hd, out + r * Q + h * hd, sizeof(float) * hd);
    }
    free(oh);
    free(q);
    free(kc);
    free(vc);
    free(out);
    free(att);
    free(sc);
}

static void test_attention_gqa(void **st)
{
    (void)st;
    check_attention(4, 2, 6, 3, 5);
    check_attention(4, 4, 8, 1, 0);
    check_attention(8, 2, 64, 40, 0);   /* three row blocks, prefill from 0 */
    check_attention(6, 3, 17, 33, 20);  /* odd head size: kernel tails */
    check_attention(4, 1, 80, 17, 100); /* head size over one 64-column NN step */
    check_attention(32, 4, 64, 15, 990); /* TinyLlama's heads, a long context */
    /* rows on both sides of INFER_ATT_GROUP_T (a row at a time, then blocks) */
    check_attention(32, 4, 64, 40, INFER_ATT_GROUP_T - 21);

    /* a head range writes only its columns */
    struct format_config c = {.n_heads = 4, .n_kv_heads = 2, .head_dim = 6, .seq_len = 16};
    enum { Q = 24, KV = 12, N = 3, POS0 = 5 };
    float q[N * Q], kc[16 * KV], vc[16 * KV], out[N * Q], att[INFER_ATT_ROWS * 16];
    fill(q, sizeof q / 4, 1.0f);
    fill(kc, sizeof kc / 4, 1.0f);
    fill(vc, sizeof vc / 4, 1.0f);
    infer_op_attention(out, q, kc, vc, N, POS0, &c, 0, 4, att);
    float out2[N * Q];
    memset(out2, 0, sizeof out2);
    infer_op_attention(out2, q, kc, vc, N, POS0, &c, 1, 3, att);
    for (int r = 0; r < N; r++) {
        for (int j = 0; j < 6; j++)
            assert_true(out2[r * Q + j] == 0 && out2[r * Q + 18 + j] == 0);
        assert_memory_equal(out2 + r * Q + 6, out + r * Q + 6, 12 * sizeof(float));
    }
}

static void test_swiglu_add(void **st)
{
    (void)st;
    float g[7], u[7], h[7], x[7], y[7];
    fill(g, 7, 2.0f);
    fill(u, 7, 1.0f);
    infer_op_swiglu(h, g, u, 7);
    for (int i = 0; i < 7; i++)
        assert_float_equal(h[i], g[i] / (1 + exp(-g[i])) * u[i], 1e-5);
    fill(x, 7, 1.0f);
    memcpy(y, x, sizeof x);
    infer_op_add(x, h, 7);
    for (int i = 0; i < 7; i++)
        assert_true(x[i] == y[i] + h[i]);
}

static void test_matmul(void **st)
{
    (void)st;
    enum { N = 5, R = 70, C = 37 };
    float *x = malloc(sizeof(float) * N * C), *w = malloc(sizeof(float) * R * C);
    float *y = malloc(sizeof(float) * N * R);
    fill(x, N * C, 1.0f);
    fill(w, R * C, 1.0f);
    infer_op_matmul_f32(y, x, w, N, R, C);
    for (int i = 0; i < N; i++)
        for (int r = 0; r < R; r++) {
            double d = 0;
            for (int c = 0; c < C; c++)
                d += (double)x[i * C + c] * w[r * C + c];
            assert_float_equal(y[i * R + r], d, 1e-4);
        }
    free(x);
    free(w);
    free(y);
}

/* Every available SIMD kernel against the scalar reference over a matrix of
 * shapes (tile remainders in rows and input rows, column tails of every
 * length mod 16), within float rounding of the dot products: they sum in a
 * different order and with FMA, so |diff| <= 1e-5 * sum |x| |w|. The range
 * form writes only its columns. */
static void test_matmul_kernels(void **st)
{
    (void)st;
    static const uint32_t ns[] = {1, 2, 3, 4, 5, 7, 9};
    static const uint32_t rs[] = {1, 2, 3, 4, 5, 6, 7, 8, 13, 70};
    static const uint32_t cs[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 259};
    enum { MAXN = 9, MAXR = 70, MAXC = 259 };
    float *x = malloc(sizeof(float) * MAXN * MAXC), *w = malloc(sizeof(float) * MAXR * MAXC);
    float *ref = malloc(sizeof(float) * MAXN * MAXR), *y = malloc(sizeof(float) * MAXN * MAXR);
    uint16_t *w16 = malloc(sizeof(uint16_t) * MAXR * MAXC);
    assert_true(x && w && ref && y && w16);
    int tested[INFER_MATMUL_COUNT] = {0};
    for (uint32_t wt = INFER_W_F32; wt <= INFER_W_BF16; wt++)
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (size_t b = 0; b < sizeof rs / sizeof rs[0]; b++)
                for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
                    uint32_t n = ns[a], R = rs[b], C = cs[c];
                    fill(x, (size_t)n * C, 1.0f);
                    fill(w, (size_t)R * C, 0.5f);
                    /* 16-bit weights, and w set to their exact float values */
                    for (size_t i = 0; wt != INFER_W_F32 && i < (size_t)R * C; i++) {
                        w16[i] = wt == INFER_W_F16 ? sl_f32_to_f16(w[i]) : sl_f32_to_bf16(w[i]);
                        w[i] = wt == INFER_W_F16 ? sl_f16_to_f32(w16[i]) : sl_bf16_to_f32(w16[i]);
                    }
                    const void *wk = wt == INFER_W_F32 ? (const void *)w : (const void *)w16;
                    infer_matmul_linear_kernel(INFER_MATMUL_SCALAR, ref, x, wk, wt, n, R, C, 0, R);
                    if (wt != INFER_W_F32) {
                        /* the scalar kernel on widened weights equals its float32 run */
                        infer_matmul_linear_kernel(INFER_MATMUL_SCALAR, y, x, w, INFER_W_F32, n, R,
                                                   C, 0, R);
                        assert_memory_equal(y, ref, sizeof(float) * n * R);
                    }
                    for (int k = 1; k < INFER_MATMUL_COUNT; k++) {
                        if (!infer_matmul_kernel_available((enum infer_matmul_kernel)k))
                            continue;
                        tested[k] = 1;
                        for (size_t i = 0; i < (size_t)n * R; i++)
                            y[i] = NAN;
                        infer_matmul_linear_kernel((enum infer_matmul_kernel)k, y, x, wk, wt, n, R,
                                                   C, 0, R);
                        for (uint32_t i = 0; i < n; i++)
                            for (uint32_t r = 0; r < R; r++) {
                                double mag = 0;
                                for (uint32_t j = 0; j < C; j++)
                                    mag += fabs((double)x[i * C + j] * w[r * C + j]);
                                double d = fabs((double)y[i * R + r] - ref[i * R + r]);
                                if (!(d <= 1e-5 * mag + 1e-30))
                                    fail_msg("%s wt=%u n=%u rows=%u cols=%u [%u][%u]: %g vs %g",
                                             infer_matmul_kernel_name((enum infer_matmul_kernel)k),
                                             wt, n, R, C, i, r, (double)y[i * R + r],
                                             (double)ref[i * R + r]);
                            }
                        if (wt != INFER_W_F32) {
                            /* widening as they load: the same bits as float32 weights */
                            float *y32 = malloc(sizeof(float) * n * R);
                            infer_matmul_linear_kernel((enum infer_matmul_kernel)k, y32, x, w,
                                                       INFER_W_F32, n, R, C, 0, R);
                            assert_memory_equal(y32, y, sizeof(float) * n * R);
                            free(y32);
                        }
                    }
                }
    /* NN (probabilities times values) with strided operands: p rows of
     * stride T + 3, v rows of stride cols + 5, y rows of stride cols + 2 */
    static const uint32_t Ts[] = {1, 2, 5, 16, 37};
    static const uint32_t ncs[] = {1, 6, 8, 17, 33, 64, 65, 80, 130};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof Ts / sizeof Ts[0]; b++)
            for (size_t c = 0; c < sizeof ncs / sizeof ncs[0]; c++) {
                uint32_t n = ns[a], T = Ts[b], C = ncs[c];
                size_t ldp = T + 3, ldv = C + 5, ldy = C + 2;
                float *p = malloc(sizeof(float) * n * ldp), *v = malloc(sizeof(float) * T * ldv);
                float *r0 = malloc(sizeof(float) * n * ldy), *r1 = malloc(sizeof(float) * n * ldy);
                fill(p, n * ldp, 1.0f);
                fill(v, T * ldv, 1.0f);
                for (size_t i = 0; i < n * ldy; i++)
                    r0[i] = r1[i] = -9.0f; /* the stride gaps must stay untouched */
                infer_matmul_nn(INFER_MATMUL_SCALAR, r0, ldy, p, ldp, v, ldv, n, T, C);
                for (int k = 1; k < INFER_MATMUL_COUNT; k++) {
                    if (!infer_matmul_kernel_available((enum infer_matmul_kernel)k))
                        continue;
                    infer_matmul_nn((enum infer_matmul_kernel)k, r1, ldy, p, ldp, v, ldv, n, T, C);
                    for (uint32_t i = 0; i < n; i++)
                        for (uint32_t j = 0; j < ldy; j++) {
                            double mag = 0;
                            for (uint32_t t = 0; j < C && t < T; t++)
                                mag += fabs((double)p[i * ldp + t] * v[t * ldv + j]);
                            double d = fabs((double)r1[i * ldy + j] - r0[i * ldy + j]);
                            if (!(d <= 1e-5 * mag) && !(j >= C && r1[i * ldy + j] == -9.0f))
                                fail_msg("nn %s n=%u T=%u cols=%u [%u][%u]: %g vs %g",
                                         infer_matmul_kernel_name((enum infer_matmul_kernel)k), n,
                                         T, C, i, j, (double)r1[i * ldy + j],
                                         (double)r0[i * ldy + j]);
                        }
                }
                free(p);
                free(v);
                free(r0);
                free(r1);
            }
    for (int k = 1; k < INFER_MATMUL_COUNT; k++)
        fprintf(stderr, "matmul kernel %s: %s\n",
                infer_matmul_kernel_name((enum infer_matmul_kernel)k),
                tested[k] ? "tested" : "not available here");
    /* a column range leaves the other columns alone */
    uint32_t n = 3, R = 13, C = 33;
    for (size_t i = 0; i < (size_t)n * R; i++)
        y[i] = -7.0f;
    infer_op_matmul(y, x, w, INFER_W_F32, n, R, C, 5, 11);
    infer_matmul_linear_kernel(INFER_MATMUL_SCALAR, ref, x, w, INFER_W_F32, n, R, C, 0, R);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t r = 0; r < R; r++) {
            if (r < 5 || r >= 11)
                assert_true(y[i * R + r] == -7.0f);
            else
                assert_float_equal(y[i * R + r], ref[i * R + r], 1e-4);
        }
    free(x);
    free(w);
    free(w16);
    free(ref);
    free(y);
}

static void test_linear_int8(void **st)
{
    (void)st;
    enum { N = 9, R = 33, C = 45 };
    int8_t q[R * C], xq[N * C];
    float scale[R], x[N * C], y[N * R];
    for (int i = 0; i < R * C; i++)
        q[i] = (int8_t)((int)test_rng_below(&rng, 255) - 127);
    for (int r = 0; r < R; r++)
        scale[r] = 0.01f + test_rng_float(&rng);
    fill(x, N * C, 3.0f);
    struct infer_linear lin = {.rows = R, .cols = C, .q = q, .scale = scale};
    assert_int_equal(npu_weights_create(q, scale, R, C, &lin.npu), 0);
    for (int pass = 0; pass < 2; pass++) {
        lin.act_scale = pass ? 0.02f : 0.0f; /* dynamic, then static (with clipping) */
        infer_op_linear_int8(y, x, &lin, N, xq);
        float s = pass ? 0.02f : npu_act_scale_dynamic(x, N * C);
        /* the quantizer's definition (npu.h): x times the float reciprocal
         * of s, rounded half to even; dividing in double instead rounds an
         * element on the other side of a tie now and then (seed
         * 1795467227123874), one step of q times s * scale off */
        const float inv = 1.0f / s;
        for (int i = 0; i < N; i++)
            for (int r = 0; r < R; r++) {
                int64_t acc = 0;
                for (int c = 0; c < C; c++) {
                    float v = rintf(x[i * C + c] * inv);
                    v = v > 127 ? 127 : v < -127 ? -127 : v;
                    acc += (int64_t)v * q[r * C + c];
                }
                assert_float_equal(y[i * R + r], (double)s * scale[r] * (double)acc,
                                   1e-4 * (1 + fabs((double)s * scale[r] * acc)));
            }
    }
    npu_weights_destroy(lin.npu);
}

/* infer_matmul_nn walks the keys in blocks shared by all rows, each row's
 * sums resumed block by block (add = 1): the bits of the kernel run over
 * all keys in one pass, on every kernel (random shapes past the block size,
 * strided operands, column tails) */
static void test_matmul_nn_blocked(void **st)
{
    (void)st;
    static const uint32_t colss[] = {1, 8, 33, 64, 65, 128, 130};
#ifdef SLUICE_KERNELS_X86
    infer_matmul_nn_fn *const fns[INFER_MATMUL_COUNT] = {
        infer_matmul_nn_scalar, infer_matmul_nn_avx2, infer_matmul_nn_avx512};
#else /* a build without the x86 kernels: none of them is available */
    infer_matmul_nn_fn *const fns[INFER_MATMUL_COUNT] = {infer_matmul_nn_scalar};
#endif
    int blocked = 0;
    for (int it = 0; it < 24; it++) {
        uint32_t n = 1 + test_rng_below(&rng, 40), T = 1 + test_rng_below(&rng, 900);
        uint32_t C = colss[test_rng_below(&rng, sizeof colss / sizeof colss[0])];
        size_t ldp = T + test_rng_below(&rng, 4), ldv = C + test_rng_below(&rng, 70);
        size_t ldy = C + test_rng_below(&rng, 3);
        float *p = malloc(sizeof(float) * n * ldp), *v = malloc(sizeof(float) * T * ldv);
        float *r0 = malloc(sizeof(float) * n * ldy), *r1 = malloc(sizeof(float) * n * ldy);
        assert_non_null(p);
        assert_non_null(v);
        assert_non_null(r0);
        assert_non_null(r1);
        fill(p, n * ldp, 1.0f);
        fill(v, T * ldv, 1.0f);
        /* the widest kernel blocks the keys above its row count */
        blocked += n > INFER_MATMUL_NN_ROWS_AVX512 && (size_t)T * C * sizeof(float) > (32u << 10);
        for (int k = 0; k < INFER_MATMUL_COUNT; k++) {
            if (!infer_matmul_kernel_available((enum infer_matmul_kernel)k))
                continue;
            for (size_t i = 0; i < n * ldy; i++)
                r0[i] = r1[i] = -9.0f;
            for (uint32_t i = 0; i < n; i += INFER_MATMUL_MR) /* one pass over the keys */
                fns[k](r0 + i * ldy, ldy, p + i * ldp, ldp,
                       n - i < INFER_MATMUL_MR ? n - i : INFER_MATMUL_MR, v, ldv, T, C, 0);
            infer_matmul_nn((enum infer_matmul_kernel)k, r1, ldy, p, ldp, v, ldv, n, T, C);
            if (memcmp(r0, r1, sizeof(float) * n * ldy) != 0)
                fail_msg("nn blocked %s n=%u T=%u cols=%u: not the one-pass bits",
                         infer_matmul_kernel_name((enum infer_matmul_kernel)k), n, T, C);
        }
        free(p);
        free(v);
        free(r0);
        free(r1);
    }
    assert_true(blocked > 0);
}

#ifdef SLUICE_KERNELS_X86
static int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}
#endif

/* RMSNorm: the AVX-512 kernel (16 rows a pass, the rest one by one)
 * and infer_op_rmsnorm against the scalar definition bit for bit, at row
 * counts around the passes, lengths with and without a 16-float tail, large,
 * tiny, signed-zero, infinite and NaN inputs, in place and not; nothing past
 * the rows written. */
static void test_rmsnorm_avx512(void **st)
{
    (void)st;
#ifdef SLUICE_KERNELS_X86
    if (!infer_matmul_kernel_available(INFER_MATMUL_AVX512)) {
        fprintf(stderr, "no AVX-512 here: the AVX-512 RMSNorm is not run\n");
        skip();
    }
    enum { MAXN = 70, MAXD = 300 };
    float *x = malloc(sizeof(float) * MAXN * MAXD), *w = malloc(sizeof(float) * MAXD);
    float *ref = malloc(sizeof(float) * (MAXN * MAXD + 1));
    float *got = malloc(sizeof(float) * (MAXN * MAXD + 1));
    assert_true(x && w && ref && got);
    static const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, -1e-30f,
                                     1e-40f, 3e38f};
    static const uint32_t dims[] = {1, 7, 16, 17, 64, 100, 256, 300};
    for (int it = 0; it < 200; it++) {
        uint32_t n = it < MAXN ? (uint32_t)it + 1 : 1 + test_rng_below(&rng, MAXN);
        uint32_t d = dims[test_rng_below(&rng, sizeof dims / sizeof dims[0])];
        float eps = it % 2 ? 1e-5f : 1e-6f;
        fill(x, (size_t)n * d, it % 3 == 0 ? 40.0f : 1.0f);
        fill(w, d, 1.0f);
        if (it % 4 == 0)
            for (size_t i = test_rng_below(&rng, 9); i < (size_t)n * d; i += 9)
                x[i] = specials[test_rng_below(&rng, sizeof specials / sizeof specials[0])];
        if (it % 7 == 0)
            memset(x, 0, sizeof(float) * d); /* a zero row: eps alone */
        infer_rmsnorm_scalar(ref, x, w, n, d, eps);
        ref[(size_t)n * d] = got[(size_t)n * d] = -7.0f;
        int inplace = it % 2;
        if (inplace)
            memcpy(got, x, sizeof(float) * n * d);
        infer_rmsnorm_avx512(got, inplace ? got : x, w, n, d, eps);
        for (size_t i = 0; i < (size_t)n * d; i++)
            if (!same_bits(got[i], ref[i]))
                fail_msg("n=%u d=%u%s: [%zu] %a, scalar %a", n, d, inplace ? " in place" : "", i,
                         (double)got[i], (double)ref[i]);
        assert_true(got[(size_t)n * d] == -7.0f);
        infer_op_rmsnorm(got, x, w, n, d, eps); /* the dispatcher: the same bits */
        assert_memory_equal(got, ref, sizeof(float) * n * d);
    }
    free(x);
    free(w);
    free(ref);
    free(got);
#else
    fprintf(stderr, "a build without the x86 kernels: the AVX-512 RMSNorm is not built\n");
    skip();
#endif
}

/* RoPE pairs: the AVX-512 step against the scalar one bit for bit, every
 * pair count 1..40 (tails of 8 pairs), special values in the head and the
 * tables; nothing past the pairs written. */
static void test_rope_pairs_avx512(void **st)
{
    (void)st;
#ifdef SLUICE_KERNELS_X86
    if (!infer_matmul_kernel_available(INFER_MATMUL_AVX512)) {
        fprintf(stderr, "no AVX-512 here: the AVX-512 RoPE is not run\n");
        skip();
    }
    enum { MAXH = 40 };
    float c[MAXH], s[MAXH], x[2 * MAXH + 1], ref[2 * MAXH + 1], got[2 * MAXH + 1];
    static const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e30f, 1e-40f};
    for (int it = 0; it < 400; it++) {
        uint32_t half = 1 + (uint32_t)it % MAXH;
        for (uint32_t j = 0; j < half; j++) {
            float a = 6.3f * test_rng_float(&rng);
            c[j] = cosf(a);
            s[j] = sinf(a);
        }
        fill(x, 2 * half, it % 3 == 0 ? 100.0f : 1.0f);
        if (it % 4 == 0)
            for (uint32_t i = test_rng_below(&rng, 5); i < 2 * half; i += 5) {
                x[i] = specials[test_rng_below(&rng, 7)];
                if (i / 2 < half && it % 8 == 0)
                    c[i / 2] = specials[test_rng_below(&rng, 7)];
            }
        x[2 * half] = -9.0f;
        memcpy(ref, x, sizeof x);
        memcpy(got, x, sizeof x);
        infer_rope_pairs_scalar(ref, c, s, half);
        infer_rope_pairs_avx512(got, c, s, half);
        for (uint32_t i = 0; i < 2 * half; i++)
            if (!same_bits(got[i], ref[i]))
                fail_msg("half=%u: [%u] %a, scalar %a", half, i, (double)got[i], (double)ref[i]);
        assert_true(got[2 * half] == -9.0f);
    }
#else
    fprintf(stderr, "a build without the x86 kernels: the AVX-512 RoPE is not built\n");
    skip();
#endif
}

/* The run's RoPE table: rotating rows from it gives infer_op_rope_rows's
 * bits (positions in runs and scattered, head ranges, a row offset into the
 * table), on the kernel in use; no table for heads over 1024 wide. */
static void test_rope_table(void **st)
{
    (void)st;
    enum { N = 40, NH = 6, HD = 20 };
    uint32_t pos[N];
    float *x = malloc(sizeof(float) * N * NH * HD), *ref = malloc(sizeof(float) * N * NH * HD);
    assert_true(x && ref);
    for (int it = 0; it < 60; it++) {
        uint32_t p0 = test_rng_below(&rng, 3000);
        for (uint32_t i = 0; i < N; i++) /* runs of consecutive positions with jumps */
            pos[i] = i && test_rng_below(&rng, 4) ? pos[i - 1] + 1 : p0 + test_rng_below(&rng, 5000);
        float theta = it % 2 ? 10000.0f : 500000.0f;
        struct infer_rope_table t;
        assert_int_equal(infer_rope_table_init(&t, pos, N, HD, theta), 0);
        assert_non_null(t.cos);
        uint32_t r0 = test_rng_below(&rng, N), n = 1 + test_rng_below(&rng, N - r0);
        uint32_t h0 = test_rng_below(&rng, NH), h1 = h0 + 1 + test_rng_below(&rng, NH - h0);
        fill(x, (size_t)n * NH * HD, 2.0f);
        memcpy(ref, x, sizeof(float) * n * NH * HD);
        infer_op_rope_rows(ref, n, NH, HD, h0, h1, pos + r0, theta);
        infer_op_rope_table(x, n, NH, HD, h0, h1, &t, r0);
        assert_memory_equal(x, ref, sizeof(float) * n * NH * HD);
        infer_rope_table_fini(&t);
        assert_null(t.cos);
    }
    struct infer_rope_table t;
    assert_int_equal(infer_rope_table_init(&t, pos, N, 2050, 10000.0f), 0);
    assert_null(t.cos);
    free(x);
    free(ref);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),       cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention_gqa), cmocka_unit_test(test_swiglu_add),
        cmocka_unit_test(test_matmul),        cmocka_unit_test(test_matmul_kernels),
        cmocka_unit_test(test_linear_int8),   cmocka_unit_test(test_exp_sum),
        cmocka_unit_test(test_div_max),       cmocka_unit_test(test_matmul_nn_blocked),
        cmocka_unit_test(test_rmsnorm_avx512), cmocka_unit_test(test_rope_pairs_avx512),
        cmocka_unit_test(test_rope_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
