/* test_sampler.c: greedy picks the argmax; a seed makes sampling
 * deterministic; top-k and top-p never pick outside their candidate sets and
 * sample in proportion within them. */
#include <math.h>
#include <string.h>

#include "infer.h"
#include "testutil.h"

static void test_greedy(void **st)
{
    (void)st;
    struct infer_sampler *s;
    struct infer_sampler_params p = {0};
    assert_int_equal(infer_sampler_create(5, &p, &s), 0);
    float l[5] = {0.1f, 3.0f, -1.0f, 2.9f, 0.0f};
    assert_int_equal(infer_sampler_sample(s, l), 1);
    infer_sampler_destroy(s);
}

static int draw(uint64_t seed, float temp, float top_p, uint32_t top_k, int *out, int n)
{
    struct infer_sampler *s;
    struct infer_sampler_params p = {temp, top_p, top_k, seed};
    if (infer_sampler_create(6, &p, &s))
        return -1;
    for (int i = 0; i < n; i++) {
        float l[6] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
        out[i] = infer_sampler_sample(s, l);
    }
    infer_sampler_destroy(s);
    return 0;
}

static void test_deterministic(void **st)
{
    (void)st;
    int a[200], b[200], c[200];
    draw(7, 1.0f, 0, 0, a, 200);
    draw(7, 1.0f, 0, 0, b, 200);
    draw(8, 1.0f, 0, 0, c, 200);
    assert_memory_equal(a, b, sizeof a);
    assert_true(memcmp(a, c, sizeof a) != 0);
}

static void test_topk_topp(void **st)
{
    (void)st;
    enum { N = 20000 };
    static int o[N];
    int count[6];
    /* top-k 2: only tokens 0 and 1, in ratio e^2 : e^1 */
    draw(test_seed() | 1, 1.0f, 0, 2, o, N);
    memset(count, 0, sizeof count);
    for (int i = 0; i < N; i++)
        count[o[i]]++;
    assert_int_equal(count[0] + count[1], N);
    double ratio = (double)count[0] / count[1];
    assert_true(fabs(ratio - exp(1.0)) < 0.25);
    /* top-p 0.7: probabilities are .54 .20 .12 .07 .03 .004: {0, 1} has .74 > .7 */
    draw(test_seed() | 1, 1.0f, 0.7f, 0, o, N);
    memset(count, 0, sizeof count);
    for (int i = 0; i < N; i++)
        count[o[i]]++;
    assert_int_equal(count[0] + count[1], N);
    /* plain sampling reaches the tail */
    draw(test_seed() | 1, 1.0f, 0, 0, o, N);
    memset(count, 0, sizeof count);
    for (int i = 0; i < N; i++)
        count[o[i]]++;
    assert_true(count[4] > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_topk_topp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
