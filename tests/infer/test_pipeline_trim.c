/* test_pipeline_trim.c: the pipeline's last layer computes only what the
 * first token needs (every row's keys and values; queries, attention output,
 * O and the FFN of the prompt's last row), and the logits stay bit-identical
 * to infer_forward, which computes every row of every layer. On a synthetic
 * model with static activation scales (calibrated through the runtime's
 * observer), for every policy, prompts of several chunks (the last one
 * short), of exactly one chunk and of one token, int8 and packed residency:
 * the same logits as the forward, fewer tasks than with no_trim_last, and
 * three decoding steps after the prefill equal the forward's (the last
 * layer's cache holds every prompt row). With dynamic scales the trim is
 * refused (a row's scale would depend on the others): the same task count
 * as with no_trim_last. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "infer.h"
#include "quantizer.h"
#include "testutil.h"

static char dyn_model[4096], static_model[4096], float_model[4096];

static int *prompt(uint32_t n, uint32_t vocab, uint32_t salt)
{
    int *ids = malloc(sizeof(int) * n);
    for (uint32_t i = 0; ids && i < n; i++)
        ids[i] = i == 0 ? 1 : 3 + (int)((i * 2654435761u + salt) % (vocab - 3));
    return ids;
}

static int setup(void **st)
{
    (void)st;
    const char *dir = test_tmpdir();
    struct sl_err err = {{0}};
    snprintf(float_model, sizeof float_model, "%s/trim.sluice", dir);
    snprintf(dyn_model, sizeof dyn_model, "%s/trim-dyn.sluice", dir);
    snprintf(static_model, sizeof static_model, "%s/trim-static.sluice", dir);
    if (import_synth("tiny", 23, float_model, NULL, NULL, &err) < 0)
        return -1;
    struct quantizer_opts o = {.method = QUANTIZER_METHOD_EDGEFLOW, .bits = 5,
                               .budget = QUANTIZER_BUDGET_TENSOR, .alpha = -1,
                               .encoding = FORMAT_ENC_ADAPTIVE};
    if (quantizer_quantize(float_model, NULL, &o, dyn_model, NULL, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    struct infer_model *m;
    struct infer_state *s;
    if (infer_model_load(float_model, NULL, &m, &err) < 0)
        return -1;
    const struct format_config *c = infer_model_config(m);
    struct quantizer_calib *calib;
    if (quantizer_calib_create(c, 64, &calib) < 0)
        return -1;
    infer_model_set_observer(m, quantizer_calib_observe, calib);
    int ret = infer_state_create(m, 256, &s, &err);
    int *ids = prompt(200, c->vocab_size, 5);
    float *lg = malloc(sizeof(float) * c->vocab_size);
    if (ret == 0 && ids && lg)
        ret = infer_forward(m, s, ids, 200, 0, lg, INFER_LOGITS_LAST, &err);
    free(lg);
    free(ids);
    if (s)
        infer_state_destroy(s);
    infer_model_destroy(m);
    if (ret == 0)
        ret = quantizer_quantize(float_model, calib, &o, static_model, NULL, &err);
    quantizer_calib_destroy(calib);
    if (ret < 0)
        fprintf(stderr, "%s\n", err.msg);
    return ret;
}

/* One prefill; its logits in lg, its task count returned. The model and
 * state are kept for decoding (*pm, *ps). No stealing cuts (no_steal_split):
 * the task count is the graph's. */
static uint32_t prefill(const char *model, enum infer_policy pol, enum infer_resident res,
                        uint32_t chunk, const int *ids, uint32_t n, int no_trim, float *lg,
                        struct infer_model **pm, struct infer_state **ps)
{
    struct sl_err err = {{0}};
    struct infer_pipeline_opts o;
    infer_pipeline_opts_init(&o);
    o.policy = pol;
    o.chunk = chunk;
    o.split = chunk == 16 ? 16 : 48;
    o.no_steal_split = 1;
    o.resident = res;
    o.no_trim_last = no_trim;
    struct infer_pipeline_stats st;
    if (infer_pipeline_prefill(model, ids, n, &o, pm, ps, lg, &st, &err) < 0)
        fail_msg("%s, policy %s, chunk %u, %u tokens, no_trim %d: %s", model,
                 infer_policy_name(pol), chunk, n, no_trim, err.msg);
    return st.tasks;
}

/* Trimmed and untrimmed prefill against the forward; 1 if the trim cut
 * tasks. */
static int check(const char *model, enum infer_policy pol, enum infer_resident res,
                 uint32_t chunk, uint32_t n)
{
    struct sl_err err = {{0}};
    struct infer_model *m, *pm, *um;
    struct infer_state *s, *ps, *us;
    assert_int_equal(infer_model_load(model, NULL, &m, &err), 0);
    uint32_t V = infer_model_config(m)->vocab_size;
    int *ids = prompt(n, V, n * 13 + chunk);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V),
          *u = malloc(sizeof(float) * V);
    assert_true(ids && a && b && u);
    assert_int_equal(infer_state_create(m, chunk, &s, &err), 0);
    assert_int_equal(infer_forward(m, s, ids, n, 0, a, INFER_LOGITS_LAST, &err), 0);
    uint32_t trimmed = prefill(model, pol, res, chunk, ids, n, 0, b, &pm, &ps);
    uint32_t whole = prefill(model, pol, res, chunk, ids, n, 1, u, &um, &us);
    if (memcmp(a, b, sizeof(float) * V) != 0)
        fail_msg("%s, policy %s, chunk %u, %u tokens: trimmed logits differ from the forward",
                 model, infer_policy_name(pol), chunk, n);
    if (memcmp(a, u, sizeof(float) * V) != 0)
        fail_msg("%s, policy %s, chunk %u, %u tokens: untrimmed logits differ", model,
                 infer_policy_name(pol), chunk, n);
    assert_true(trimmed <= whole);
    /* decoding reads the last layer's keys and values of every prompt row */
    for (uint32_t k = 0; k < 3; k++) {
        int t = 7 + (int)k * 11;
        assert_int_equal(infer_forward(m, s, &t, 1, n + k, a, INFER_LOGITS_LAST, &err), 0);
        assert_int_equal(infer_forward(pm, ps, &t, 1, n + k, b, INFER_LOGITS_LAST, &err), 0);
        if (memcmp(a, b, sizeof(float) * V) != 0)
            fail_msg("%s, policy %s, chunk %u, %u tokens: decode step %u differs", model,
                     infer_policy_name(pol), chunk, n, k);
    }
    infer_state_destroy(us);
    infer_model_destroy(um);
    infer_state_destroy(ps);
    infer_model_destroy(pm);
    infer_state_destroy(s);
    infer_model_destroy(m);
    free(ids);
    free(a);
    free(b);
    free(u);
    return trimmed < whole;
}

static void test_trim_static(void **st)
{
    (void)st;
    for (int p = 0; p < INFER_POLICY_COUNT; p++) {
        enum infer_policy pol = (enum infer_policy)p;
        /* three chunks, the last of 22 rows: fewer tasks */
        assert_true(check(static_model, pol, INFER_RESIDENT_INT8, 64, 150));
        /* one chunk: the same tasks, each over fewer rows */
        check(static_model, pol, INFER_RESIDENT_INT8, 64, 64);
        check(static_model, pol, INFER_RESIDENT_INT8, 16, 1);
    }
    assert_true(check(static_model, INFER_POLICY_FULL, INFER_RESIDENT_INT8, 16, 40));
    assert_true(check(static_model, INFER_POLICY_FULL, INFER_RESIDENT_PACKED, 64, 150));
}

static void test_trim_refused_dynamic(void **st)
{
    (void)st;
    assert_false(check(dyn_model, INFER_POLICY_FULL, INFER_RESIDENT_INT8, 64, 150));
    assert_false(check(float_model, INFER_POLICY_FULL, INFER_RESIDENT_INT8, 64, 150));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trim_static),
        cmocka_unit_test(test_trim_refused_dynamic),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
