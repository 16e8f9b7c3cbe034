/* test_alloc.c: the relative-error metric, per-channel quantization and the
 * greedy bit allocation (EdgeFlow 4.1, Algorithm 1, Appendix A).
 * - greedy vs exhaustive search over every width assignment (C <= 5
 *   channels, random closed-form RE curves and channel weights, several
 *   budgets): the same minimal total RE;
 * - at scale (2^18 channels): the exchange condition of optimality (no bit
 *   can move from one channel to another and lower the total) and the budget;
 * - costs (global budget): the budget in weights holds, no further bit fits,
 *   uniform costs give the unit-cost answer;
 * - the RE proxy against the exact cosine distance on Gaussian channels:
 *   exact / proxy = c_b = 4^b / (24 (2^(b-1)-1)^2) within 10% for b = 4..8
 *   and 25% for b = 3 (n = 4096; measured worst cases 3-6% and 15%; at 2
 *   bits the uniform-rounding model breaks down, 34%, unchecked), and for
 *   b >= 3 the proxy orders channels of different crest factors (Gaussian
 *   bulk plus 3-9 sigma outliers) as the exact distance does (all but 2 of
 *   66 pairs; at 2 bits it does not: 45 of 66);
 * - quantize/dequantize: codes on the b-bit grid, |w - s q| <= s/2 with the
 *   max scale, the largest weight on the grid's end, the MSE clip never
 *   worse than no clip; the 1-bit case (sign x mean|w|, L2-optimal);
 *   all-zero channels; argument errors. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_internal.h"
#include "testutil.h"

static struct test_rng rng;

/* A closed-form RE curve for a channel of crest factor max/rms = crest. */
static void proxy_curve(double crest, double *re)
{
    re[0] = 0;
    for (uint32_t b = 1; b <= 8; b++)
        re[b] = quantizer_re_proxy(crest, 1.0, b);
}

static double total_re(uint32_t n, const double *re, const double *wt, const uint8_t *w)
{
    double t = 0;
    for (uint32_t c = 0; c < n; c++)
        t += re[c * 9 + w[c]] * (wt ? wt[c] : 1.0);
    return t;
}

/* Exhaustive minimum of sum wt re over widths 1..8 with sum widths <= cap. */
static double exhaustive(uint32_t n, const double *re, const double *wt, uint32_t cap)
{
    uint8_t w[8];
    double best = INFINITY;
    for (uint32_t c = 0; c < n; c++)
        w[c] = 1;
    for (;;) {
        uint32_t sum = 0;
        for (uint32_t c = 0; c < n; c++)
            sum += w[c];
        if (sum <= cap) {
            double t = total_re(n, re, wt, w);
            best = t < best ? t : best;
        }
        uint32_t c = 0;
        while (c < n && w[c] == 8)
            w[c++] = 1;
        if (c == n)
            break;
        w[c]++;
    }
    return best;
}

static void test_greedy_matches_exhaustive(void **st)
{
    (void)st;
    const double budgets[] = {1.0, 1.4, 2.0, 2.5, 3.0, 4.0, 4.5, 5.0, 5.25, 6.0, 7.0, 7.5, 8.0};
    for (int trial = 0; trial < 150; trial++) {
        uint32_t n = 1 + test_rng_below(&rng, 5);
        double re[5 * 9], wt[5];
        for (uint32_t c = 0; c < n; c++) {
            proxy_curve(1.0 + 30.0 * test_rng_float(&rng), re + c * 9);
            wt[c] = exp(6.0 * (test_rng_float(&rng) - 0.5));
        }
        for (size_t k = 0; k < sizeof budgets / sizeof *budgets; k++) {
            double be = budgets[k];
            for (int weighted = 0; weighted < 2; weighted++) {
                const double *w = weighted ? wt : NULL;
                uint8_t widths[5];
                assert_int_equal(quantizer_allocate(n, re, w, NULL, be, widths), 0);
                uint32_t cap = (uint32_t)floor(be * n + 1e-9), sum = 0;
                for (uint32_t c = 0; c < n; c++) {
                    assert_true(widths[c] >= 1 && widths[c] <= 8);
                    sum += widths[c];
                }
                /* the whole budget is spent (up to the 8-bit cap) */
                assert_int_equal(sum, cap < 8 * n ? cap : 8 * n);
                double g = total_re(n, re, w, widths), e = exhaustive(n, re, w, cap);
                if (fabs(g - e) > 1e-12 * fabs(e)) {
                    fprintf(stderr,
                            "trial %d n %u budget %g weighted %d: greedy %.17g, "
                            "exhaustive %.17g\n",
                            trial, n, be, weighted, g, e);
                    fail();
                }
            }
        }
    }
}

/* The optimality condition at scale: with convex curves, the allocation is
 * optimal iff the best gain still available is no larger than the smallest
 * gain already taken (else moving that bit would lower the total). */
static void test_greedy_exchange_condition(void **st)
{
    (void)st;
    const uint32_t n = 1u << 18;
    double *re = malloc(sizeof(double) * 9 * n), *wt = malloc(sizeof(double) * n);
    uint8_t *w = malloc(n);
    assert_non_null(re);
    assert_non_null(wt);
    assert_non_null(w);
    for (uint32_t c = 0; c < n; c++) {
        /* crest factors of Gaussian-like rows (3-5) with a tail of outlier rows */
        double crest = 3 + 2 * test_rng_float(&rng);
        if (test_rng_below(&rng, 50) == 0)
            crest *= 5;
        proxy_curve(crest, re + (size_t)c * 9);
        wt[c] = 0.5 + test_rng_float(&rng);
    }
    const double budgets[] = {3.0, 4.5, 5.0, 6.3};
    for (size_t k = 0; k < 4; k++) {
        uint64_t t0 = sl_now_ns();
        assert_int_equal(quantizer_allocate(n, re, wt, NULL, budgets[k], w), 0);
        double secs = (double)(sl_now_ns() - t0) / 1e9;
        uint64_t sum = 0;
        double best_open = 0, worst_taken = INFINITY;
        for (uint32_t c = 0; c < n; c++) {
            const double *r = re + (size_t)c * 9;
            sum += w[c];
            if (w[c] < 8)
                best_open = fmax(best_open, (r[w[c]] - r[w[c] + 1]) * wt[c]);
            if (w[c] > 1)
                worst_taken = fmin(worst_taken, (r[w[c] - 1] - r[w[c]]) * wt[c]);
        }
        assert_true(sum == (uint64_t)floor(budgets[k] * n + 1e-6));
        assert_true(best_open <= worst_taken);
        fprintf(stderr, "allocate %u channels at %.1f bits: %.3f s\n", n, budgets[k], secs);
        /* O(C log C) takes seconds here under sanitizers; a quadratic
         * allocation would take hours. The bound leaves room for a loaded
         * machine (6.8 s was seen under ASan beside two parallel builds). */
        assert_true(secs < 60.0);
    }
    free(re);
    free(wt);
    free(w);
}

static void test_greedy_costs(void **st)
{
    (void)st;
    for (int trial = 0; trial < 200; trial++) {
        uint32_t n = 1 + test_rng_below(&rng, 64);
        double re[64 * 9];
        uint64_t cost[64], same[64];
        uint8_t w[64], wu[64], ws[64];
        double total = 0;
        uint64_t k = 1 + test_rng_below(&rng, 1000);
        for (uint32_t c = 0; c < n; c++) {
            proxy_curve(1.5 + 20.0 * test_rng_float(&rng), re + c * 9);
            cost[c] = 1 + test_rng_below(&rng, 5000);
            same[c] = k;
            total += (double)cost[c];
        }
        double be = 1.0 + 7.0 * test_rng_float(&rng);
        assert_int_equal(quantizer_allocate(n, re, NULL, cost, be, w), 0);
        double spent = 0;
        for (uint32_t c = 0; c < n; c++)
            spent += (double)cost[c] * (w[c] - 1);
        double budget = (be - 1) * total;
        assert_true(spent <= budget * (1 + 1e-9) + 1e-9);
        for (uint32_t c = 0; c < n; c++) /* maximal: no further bit fits */
            assert_true(w[c] == 8 || (double)cost[c] > budget - spent - 1e-6);
        /* equal costs: the unit-cost allocation */
        assert_int_equal(quantizer_allocate(n, re, NULL, NULL, be, wu), 0);
        assert_int_equal(quantizer_allocate(n, re, NULL, same, be, ws), 0);
        assert_memory_equal(wu, ws, n);
    }
}

/* Curves whose gains do not decrease (the exact metric: 2 bits with the max
 * scale are worse than a 1-bit sign quantizer): the allocation steps along
 * the lower convex hull, so no channel is stuck behind a bad bit, and it
 * stays close to the exhaustive optimum. */
static void test_greedy_nonconvex(void **st)
{
    (void)st;
    /* channel 0: 1 bit 0.5, 2 bits 0.9 (worse), then falling; channel 1 flat */
    double re[2 * 9] = {0, 0.5,  0.9,  0.1,   0.03,  0.01,  0.004,  0.002, 0.001,
                        0, 0.02, 0.01, 0.005, 0.003, 0.002, 0.0015, 0.001, 0.0008};
    uint8_t w[2];
    assert_int_equal(quantizer_allocate(2, re, NULL, NULL, 3.0, w), 0);
    assert_true(w[0] >= 3);
    assert_int_equal(w[0] + w[1], 6);
    double worst = 0, sum_ratio = 0;
    int trials = 0;
    for (int trial = 0; trial < 300; trial++) {
        uint32_t n = 2 + test_rng_below(&rng, 3);
        double r[4 * 9];
        for (uint32_t c = 0; c < n; c++) {
            /* a falling curve with a random bump at 2 bits */
            proxy_curve(2.0 + 10.0 * test_rng_float(&rng), r + c * 9);
            if (test_rng_below(&rng, 2))
                r[c * 9 + 2] = r[c * 9 + 1] * (1.0 + test_rng_float(&rng));
        }
        double be = 1.5 + 5.0 * test_rng_float(&rng);
        uint8_t ww[4];
        assert_int_equal(quantizer_allocate(n, r, NULL, NULL, be, ww), 0);
        uint32_t cap = (uint32_t)floor(be * n + 1e-9), sum = 0;
        for (uint32_t c = 0; c < n; c++)
            sum += ww[c];
        assert_true(sum <= cap && sum + 1 >= cap); /* a 2-bit step may not fit the last bit */
        double g = total_re(n, r, NULL, ww), e = exhaustive(n, r, NULL, cap);
        worst = fmax(worst, g / e);
        sum_ratio += g / e;
        trials++;
    }
    fprintf(stderr, "non-convex curves: greedy / exhaustive total RE: mean %.4f, worst %.3f\n",
            sum_ratio / trials, worst);
    assert_true(sum_ratio / trials < 1.05);
}

static void test_allocate_edges(void **st)
{
    (void)st;
    double re[7 * 9];
    uint8_t w[7];
    for (uint32_t c = 0; c < 7; c++)
        proxy_curve(2.0 + c, re + c * 9);
    assert_int_equal(quantizer_allocate(7, re, NULL, NULL, 1.0, w), 0);
    for (int c = 0; c < 7; c++)
        assert_int_equal(w[c], 1);
    assert_int_equal(quantizer_allocate(7, re, NULL, NULL, 8.0, w), 0);
    for (int c = 0; c < 7; c++)
        assert_int_equal(w[c], 8);
    /* 4.5 x 7 = 31.5 bits: 31 spent; the peakier channels get more */
    assert_int_equal(quantizer_allocate(7, re, NULL, NULL, 4.5, w), 0);
    int sum = 0;
    for (int c = 0; c < 7; c++) {
        sum += w[c];
        if (c)
            assert_true(w[c] >= w[c - 1]);
    }
    assert_int_equal(sum, 31);
    /* 4.1 x 10 = 41 must not lose a bit to rounding */
    double re10[10 * 9];
    uint8_t w10[10];
    for (uint32_t c = 0; c < 10; c++)
        proxy_curve(3.0, re10 + c * 9);
    assert_int_equal(quantizer_allocate(10, re10, NULL, NULL, 4.1, w10), 0);
    sum = 0;
    for (int c = 0; c < 10; c++)
        sum += w10[c];
    assert_int_equal(sum, 41);
    assert_int_equal(quantizer_allocate(7, re, NULL, NULL, 0.99, w), -EINVAL);
    assert_int_equal(quantizer_allocate(7, re, NULL, NULL, 8.01, w), -EINVAL);
    assert_int_equal(quantizer_allocate(7, re, NULL, NULL, NAN, w), -EINVAL);
    assert_int_equal(quantizer_allocate(0, re, NULL, NULL, 4.0, w), 0);
}

static void gaussian(float *w, uint32_t n, double sigma)
{
    for (uint32_t i = 0; i < n; i++)
        w[i] = (float)(sigma * test_rng_normal(&rng));
}

static void test_re_proxy_vs_exact(void **st)
{
    (void)st;
    const uint32_t n = 4096;
    float *w = malloc(sizeof(float) * n);
    assert_non_null(w);
    for (uint32_t b = 1; b <= 8; b++) {
        double worst = 0;
        for (int trial = 0; trial < 20; trial++) {
            gaussian(w, n, 0.01 + test_rng_float(&rng));
            double mx = 0, ms = 0;
            for (uint32_t i = 0; i < n; i++) {
                mx = fmax(mx, fabs((double)w[i]));
                ms += (double)w[i] * w[i];
            }
            ms /= n;
            double p = quantizer_re_proxy(mx, ms, b), e = quantizer_re_exact(w, n, b);
            double cb = ldexp(1.0, 2 * (int)b) / (24.0 * pow(ldexp(1.0, (int)b - 1) - 1, 2));
            double dev = b >= 2 ? fabs(e / (p * cb) - 1) : 0;
            worst = fmax(worst, dev);
            assert_true(e >= 0 && e <= 1);
        }
        fprintf(stderr, "b=%u: worst |exact/(c_b proxy) - 1| = %.3f\n", b, worst);
        if (b >= 4)
            assert_true(worst < 0.10);
        else if (b == 3)
            assert_true(worst < 0.25);
    }
    /* ordering: channels of different crest factors (a Gaussian bulk plus k
     * outliers) rank alike under the proxy and the exact distance, wherever
     * the proxies say the two differ by more than 20%. The outliers sit above
     * the bulk's own maximum (about 3.5-4.3 sigma for 4096 samples): at
     * 3.0-4.0 the first three channels had the same maximum and ranked by
     * chance (seed 1795472020958374 failed at 4 bits). Neighbours closer than
     * that can swap: the exact distance moves by ~1% with the draw, and at 3
     * bits, once the step passes 3 sigma, the bulk rounds to zero and the
     * exact distance stops growing with the crest factor (60 seeds: no
     * swapped pair was more than 9% apart) */
    enum { K = 12 };
    double prox[K], ex[K];
    for (uint32_t b = 2; b <= 8; b++) {
        for (int k = 0; k < K; k++) {
            gaussian(w, n, 1.0);
            for (int o = 0; o < k; o++)
                w[test_rng_below(&rng, n)] = (float)(5.0 + 0.5 * k);
            double mx = 0, ms = 0;
            for (uint32_t i = 0; i < n; i++) {
                mx = fmax(mx, fabs((double)w[i]));
                ms += (double)w[i] * w[i];
            }
            prox[k] = quantizer_re_proxy(mx, ms / n, b);
            ex[k] = quantizer_re_exact(w, n, b);
        }
        int concordant = 0, pairs = 0, apart = 0, apart_alike = 0;
        for (int i = 0; i < K; i++)
            for (int j = i + 1; j < K; j++, pairs++) {
                int alike = (prox[i] < prox[j]) == (ex[i] < ex[j]);
                concordant += alike;
                if (fmax(prox[i], prox[j]) > 1.2 * fmin(prox[i], prox[j])) {
                    apart++;
                    apart_alike += alike;
                }
            }
        fprintf(stderr, "b=%u: %d of %d channel pairs ordered alike; %d of %d pairs with "
                        "proxies >20%% apart\n", b, concordant, pairs, apart_alike, apart);
        if (b >= 3) {
            assert_true(apart >= pairs / 2);
            assert_int_equal(apart_alike, apart);
        }
    }
    free(w);
}

static void test_re_exact_small(void **st)
{
    (void)st;
    /* exactly representable: distance 0 */
    const float a[4] = {1, -1, 1, -1};
    for (uint32_t b = 1; b <= 8; b++)
        assert_true(quantizer_re_exact(a, 4, b) < 1e-12);
    /* {1, 0.6} at 2 bits: scale 1, codes {1, 1}: 1 - 1.6 / (sqrt(1.36) sqrt(2)) */
    const float c[2] = {1.0f, 0.6f};
    double want = 1 - (1.0 + 0.6f) / (sqrt(1.0 + (double)0.6f * 0.6f) * sqrt(2.0));
    assert_true(fabs(quantizer_re_exact(c, 2, 2) - want) < 1e-12);
    /* zero channel */
    const float z[3] = {0, 0, 0};
    assert_true(quantizer_re_exact(z, 3, 4) == 0);
    assert_true(quantizer_re_proxy(0, 0, 4) == 0);
    /* the proxy's closed form */
    assert_true(fabs(quantizer_re_proxy(3.0, 1.0, 4) - 9.0 / 256) < 1e-15);
}

static double row_err(const float *w, uint32_t n, uint32_t b, float s)
{
    int8_t *q = malloc(n);
    quantizer_channel_quantize(w, n, b, s, q);
    double e = 0;
    for (uint32_t i = 0; i < n; i++) {
        double d = (double)w[i] - (double)s * q[i];
        e += d * d;
    }
    free(q);
    return e;
}

static void test_quantize_bounds(void **st)
{
    (void)st;
    const uint32_t n = 777;
    float w[777];
    int8_t q[777];
    for (int trial = 0; trial < 50; trial++) {
        gaussian(w, n, exp(4.0 * (test_rng_float(&rng) - 0.5)));
        if (trial % 3 == 0)
            w[test_rng_below(&rng, n)] *= 20; /* an outlier */
        for (uint32_t b = 2; b <= 8; b++) {
            int g = (1 << (b - 1)) - 1;
            float s = quantizer_channel_scale(w, n, b);
            quantizer_channel_quantize(w, n, b, s, q);
            int reached = 0;
            for (uint32_t i = 0; i < n; i++) {
                assert_true(q[i] >= -g && q[i] <= g);
                assert_true(fabs((double)w[i] - (double)s * q[i]) <= 0.5 * s * (1 + 1e-5));
                reached |= q[i] == g || q[i] == -g;
            }
            assert_true(reached);
            float sm = quantizer_channel_scale_mse(w, n, b);
            assert_true(sm <= s * (1 + 1e-6f) && sm >= 0.4f * s);
            assert_true(row_err(w, n, b, sm) <= row_err(w, n, b, s) * (1 + 1e-9));
        }
    }
    /* clipping pays on a heavy-tailed row at 3 bits */
    gaussian(w, n, 1.0);
    w[5] = 6;
    float s3 = quantizer_channel_scale(w, n, 3), m3 = quantizer_channel_scale_mse(w, n, 3);
    assert_true(m3 < s3);
    assert_true(row_err(w, n, 3, m3) < 0.5 * row_err(w, n, 3, s3));
}

static void test_one_bit(void **st)
{
    (void)st;
    const uint32_t n = 500;
    float w[500];
    int8_t q[500];
    gaussian(w, n, 0.3);
    w[0] = 0.0f;
    float s = quantizer_channel_scale(w, n, 1);
    double m = 0;
    for (uint32_t i = 0; i < n; i++)
        m += fabs((double)w[i]);
    assert_true(fabs(s - m / n) < 1e-6 * s);
    assert_true(quantizer_channel_scale_mse(w, n, 1) == s);
    quantizer_channel_quantize(w, n, 1, s, q);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(q[i], w[i] >= 0 ? 1 : -1);
    /* mean|w| is the L2-optimal sign scale */
    double e0 = row_err(w, n, 1, s);
    for (double f = 0.5; f <= 1.5; f += 0.05)
        if (fabs(f - 1) > 1e-9)
            assert_true(row_err(w, n, 1, (float)(s * f)) > e0);
    /* the proxy at one bit is defined (and larger than at two) */
    assert_true(quantizer_re_proxy(3, 1, 1) > quantizer_re_proxy(3, 1, 2));
}

static void test_zero_channel(void **st)
{
    (void)st;
    float z[16] = {0};
    int8_t q[16];
    for (uint32_t b = 1; b <= 8; b++) {
        float s = quantizer_channel_scale(z, 16, b);
        assert_true(s == 0);
        assert_true(quantizer_channel_scale_mse(z, 16, b) == 0);
        quantizer_channel_quantize(z, 16, b, s, q);
        for (int i = 0; i < 16; i++)
            assert_int_equal(q[i], b == 1 ? 1 : 0);
    }
}

/* The tensor helpers: uniform rules, cmpq weights, the exact metric. */
static void test_tensor_rules(void **st)
{
    (void)st;
    const uint32_t rows = 40, cols = 96;
    float *w = malloc(sizeof(float) * rows * cols);
    float rw[40], tmp[96];
    uint8_t widths[40];
    double re[40 * 9];
    for (uint32_t r = 0; r < rows; r++) {
        gaussian(w + r * cols, cols, 1.0);
        if (r % 4 == 0)
            w[r * cols + 7] = 12; /* peaky rows */
        rw[r] = r < 20 ? 100.0f : 1.0f;
    }
    struct quantizer_tensor_rule u = {.bits = 5, .uniform_bits = 5};
    assert_int_equal(quantizer_tensor_widths(w, rows, cols, NULL, &u, widths), 0);
    for (uint32_t r = 0; r < rows; r++)
        assert_int_equal(widths[r], 5);
    struct quantizer_tensor_rule a = {.bits = 4.5};
    assert_int_equal(quantizer_tensor_widths(w, rows, cols, NULL, &a, widths), 0);
    uint32_t sum = 0, peaky = 0, flat = 0;
    for (uint32_t r = 0; r < rows; r++) {
        sum += widths[r];
        if (r % 4 == 0)
            peaky += widths[r];
        else
            flat += widths[r];
    }
    assert_int_equal(sum, 180);
    assert_true(peaky * 3 > flat); /* a peaky row gets more than a flat one on average */
    /* cmpq: heavily weighted rows get more bits */
    struct quantizer_tensor_rule c = {.bits = 4.5, .row_weight = rw};
    assert_int_equal(quantizer_tensor_widths(w, rows, cols, NULL, &c, widths), 0);
    uint32_t hi = 0, lo = 0;
    for (uint32_t r = 0; r < rows; r++) {
        if (r < 20)
            hi += widths[r];
        else
            lo += widths[r];
    }
    assert_true(hi > lo);
    /* the exact metric is the per-row exact distance */
    assert_int_equal(quantizer_tensor_re(w, rows, cols, NULL, QUANTIZER_METRIC_EXACT,
                                         QUANTIZER_CLIP_NONE, re, tmp),
                     0);
    for (uint32_t b = 1; b <= 8; b++)
        assert_true(fabs(re[3 * 9 + b] - quantizer_re_exact(w + 3 * cols, cols, b)) < 1e-12);
    free(w);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_matches_exhaustive),
        cmocka_unit_test(test_greedy_exchange_condition),
        cmocka_unit_test(test_greedy_costs),
        cmocka_unit_test(test_greedy_nonconvex),
        cmocka_unit_test(test_allocate_edges),
        cmocka_unit_test(test_re_proxy_vs_exact),
        cmocka_unit_test(test_re_exact_small),
        cmocka_unit_test(test_quantize_bounds),
        cmocka_unit_test(test_one_bit),
        cmocka_unit_test(test_zero_channel),
        cmocka_unit_test(test_tensor_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
