/* test_pipeline_attn_rows.c: the prefill's attention in pieces of query rows
 * (infer_pipeline_opts attn_rows, pipeline_graph.c attn_row_pieces): the
 * first piece of a kv head group stores the chunk's keys and values, every
 * piece attends its own rows. On a synthetic model with static activation
 * scales, policies full and sequential_granular, prompts of several chunks
 * (the last one short) and of one chunk, pieces of 16 and 48 rows, the
 * default and none, the last layer trimmed and not: the logits are
 * bit-identical to infer_forward's, three decoding steps after the prefill
 * too (the cache holds every row's keys and values), and pieces of 16 rows
 * make more tasks than none. Refused (the same task count as none) with
 * dynamic scales (O's input scale is the maximum over every row), with the
 * coarse policies, and for a chunk of at most 16 rows. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer.h"
#include "testutil.h"
#include "tiny_q5.h"

static char dyn_model[4096], static_model[4096], float_model[4096];

/* The float model, its 5-bit copy with dynamic scales and one with static
 * scales calibrated through the runtime's observer. */
static int setup(void **st)
{
    (void)st;
    if (tiny_q5_models(29, float_model, dyn_model) < 0)
        return -1;
    return tiny_q5_static_model(float_model, 7, static_model);
}

/* One prefill with attention pieces of `rows` query rows; its logits in lg,
 * its task count returned; the model and state kept for decoding. No
 * stealing cuts (no_steal_split): the task count is the graph's. */
static uint32_t prefill(const char *model, enum infer_policy pol, uint32_t chunk, uint32_t rows,
                        int no_trim, const int *ids, uint32_t n, float *lg,
                        struct infer_model **pm, struct infer_state **ps)
{
    struct sl_err err = {{0}};
    struct infer_pipeline_opts o;
    infer_pipeline_opts_init(&o);
    o.policy = pol;
    o.chunk = chunk;
    o.split = 48;
    o.no_steal_split = 1;
    o.attn_rows = rows;
    o.no_trim_last = no_trim;
    struct infer_pipeline_stats st;
    if (infer_pipeline_prefill(model, ids, n, &o, pm, ps, lg, &st, &err) < 0)
        fail_msg("%s, policy %s, chunk %u, attn_rows %u, %u tokens: %s", model,
                 infer_policy_name(pol), chunk, rows, n, err.msg);
    return st.tasks;
}

/* Each of attn_rows 16, 48, 0 (default), none against the forward, then
 * decoding; the task counts of 16 rows and of none in *split, *whole. */
static void check(const char *model, enum infer_policy pol, uint32_t chunk, uint32_t n,
                  int no_trim, uint32_t *split, uint32_t *whole)
{
    static const uint32_t rows[] = {16, 48, 0, UINT32_MAX};
    struct sl_err err = {{0}};
    struct infer_model *m;
    struct infer_state *s;
    assert_int_equal(infer_model_load(model, NULL, &m, &err), 0);
    uint32_t V = infer_model_config(m)->vocab_size;
    int *ids = tiny_prompt(n, V, n * 7 + chunk);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    assert_true(ids && a && b);
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        struct infer_model *pm;
        struct infer_state *ps;
        assert_int_equal(infer_state_create(m, chunk, &s, &err), 0);
        assert_int_equal(infer_forward(m, s, ids, n, 0, a, INFER_LOGITS_LAST, &err), 0);
        uint32_t tasks = prefill(model, pol, chunk, rows[k], no_trim, ids, n, b, &pm, &ps);
        if (rows[k] == 16)
            *split = tasks;
        if (rows[k] == UINT32_MAX)
            *whole = tasks;
        if (memcmp(a, b, sizeof(float) * V) != 0)
            fail_msg("%s, policy %s, chunk %u, %u tokens, attn_rows %u, no_trim %d: the "
                     "logits differ from the forward",
                     model, infer_policy_name(pol), chunk, n, rows[k], no_trim);
        for (uint32_t d = 0; d < 3; d++) {
            int t = 5 + (int)d * 13;
            assert_int_equal(infer_forward(m, s, &t, 1, n + d, a, INFER_LOGITS_LAST, &err), 0);
            assert_int_equal(infer_forward(pm, ps, &t, 1, n + d, b, INFER_LOGITS_LAST, &err), 0);
            if (memcmp(a, b, sizeof(float) * V) != 0)
                fail_msg("%s, policy %s, chunk %u, %u tokens, attn_rows %u: decode step %u "
                         "differs",
                         model, infer_policy_name(pol), chunk, n, rows[k], d);
        }
        infer_state_destroy(ps);
        infer_model_destroy(pm);
        infer_state_destroy(s);
    }
    infer_model_destroy(m);
    free(ids);
    free(a);
    free(b);
}

static void test_pieces_same_logits(void **st)
{
    (void)st;
    static const enum infer_policy pols[] = {INFER_POLICY_FULL,
                                             INFER_POLICY_SEQUENTIAL_GRANULAR};
    for (size_t k = 0; k < sizeof pols / sizeof pols[0]; k++) {
        uint32_t split, whole;
        /* three chunks of 64 and one of 22; every layer's attention in pieces */
        check(static_model, pols[k], 64, 214, 1, &split, &whole);
        assert_true(split > whole);
        /* the last layer trimmed (its attention in one piece), the others in pieces */
        check(static_model, pols[k], 64, 214, 0, &split, &whole);
        assert_true(split > whole);
        /* one chunk of 100 rows */
        check(static_model, pols[k], 128, 100, 1, &split, &whole);
        assert_true(split > whole);
    }
}

static void test_pieces_refused(void **st)
{
    (void)st;
    uint32_t split, whole;
    /* a dynamic scale for O's input: one piece */
    check(dyn_model, INFER_POLICY_FULL, 64, 150, 1, &split, &whole);
    assert_int_equal(split, whole);
    /* coarse tasks */
    check(static_model, INFER_POLICY_LAYER_OVERLAP, 64, 150, 1, &split, &whole);
    assert_int_equal(split, whole);
    /* chunks of one row block */
    check(static_model, INFER_POLICY_FULL, 16, 40, 1, &split, &whole);
    assert_int_equal(split, whole);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_same_logits),
        cmocka_unit_test(test_pieces_refused),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
