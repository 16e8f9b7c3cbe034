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
 * as with no_trim_last. With packed residency the trimmed layer's one-row
 * linears (Q, O, gate, up, down) are multiplied straight from their packed
 * codes: none of them takes int8 storage from the pool. With sparse
 * attention (each head's Q bucket from the call's rows and, without a
 * profile, its grid's centre from the first call) the trim keeps Q and
 * attention of the first and the last chunk whole, the chunks between store
 * keys and values only: the same logits and decoding steps as the forward
 * with sparse attention (a fresh instance per run), fewer tasks, and
 * sparse attention really keeping fewer keys than it sees. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer.h"
#include "testutil.h"
#include "tiny_q5.h"

static char dyn_model[4096], static_model[4096], float_model[4096];
static uint64_t last_int8; /* the last prefill's int8 pool bytes given (fresh + reused) */
static struct format_config sparse_cfg; /* the static model's shape, for sparse instances */

/* The float model, its 5-bit copy with dynamic scales and one with static
 * scales calibrated through the runtime's observer. */
static int setup(void **st)
{
    (void)st;
    if (tiny_q5_models(23, float_model, dyn_model) < 0 ||
        tiny_q5_static_model(float_model, 5, static_model) < 0)
        return -1;
    struct sl_err err;
    struct format_reader *r;
    if (format_reader_open(static_model, &r, &err) < 0)
        return -1;
    sparse_cfg = *format_reader_config(r);
    format_reader_close(r);
    return 0;
}

/* Sparse attention variants for check_attn (0: dense attention) */
enum { SP_HEAD = 1, SP_GROUP, SP_ROWS4, SP_MIN_KEYS };

/* A sparse attention instance for the static model (keep 0.3, 2 sinks, a
 * window of 8: most keys left out at these lengths): per head, one list per
 * kv group, blocks of 4 rows, or calls under 40 keys dense (so that a
 * middle chunk's call may be the first to run sparse: no trim). */
static struct infer_sparse *sparse_new(int kind)
{
    struct sl_err err;
    struct infer_sparse_opts o = {.keep = 0.3,
                                  .sinks = 2,
                                  .window = 8,
                                  .select_group = kind == SP_GROUP,
                                  .row_block = kind == SP_ROWS4 ? 4 : 0,
                                  .min_keys = kind == SP_MIN_KEYS ? 40 : 0};
    struct infer_sparse *sp;
    if (infer_sparse_create(&sparse_cfg, NULL, &o, &sp, &err) < 0)
        fail_msg("sparse attention: %s", err.msg);
    return sp;
}

/* One prefill; its logits in lg, its task count returned. The model and
 * state are kept for decoding (*pm, *ps). No stealing cuts (no_steal_split):
 * the task count is the graph's. */
static uint32_t prefill(const char *model, enum infer_policy pol, enum infer_resident res,
                        uint32_t chunk, const int *ids, uint32_t n, int no_trim,
                        struct infer_sparse *sp, float *lg, struct infer_model **pm,
                        struct infer_state **ps)
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
    o.attn = sp ? infer_sparse_attention(sp) : NULL;
    struct infer_pipeline_stats st;
    if (infer_pipeline_prefill(model, ids, n, &o, pm, ps, lg, &st, &err) < 0)
        fail_msg("%s, policy %s, chunk %u, %u tokens, no_trim %d: %s", model,
                 infer_policy_name(pol), chunk, n, no_trim, err.msg);
    last_int8 = st.int8_pool_fresh + st.int8_pool_reused;
    return st.tasks;
}

/* Policies that split matmuls (pipeline.h, pl_granular): packed residency's pool. */
static int pl_granular_policy(enum infer_policy p)
{
    return p == INFER_POLICY_FULL || p == INFER_POLICY_SEQUENTIAL_GRANULAR;
}

/* Trimmed and untrimmed prefill against the forward, dense (sparse 0) or
 * sparse attention (SP_*: a fresh instance for each of the three); 1 if the
 * trim cut tasks. */
static int check_attn(const char *model, enum infer_policy pol, enum infer_resident res,
                      uint32_t chunk, uint32_t n, int sparse)
{
    struct infer_sparse *sf = sparse ? sparse_new(sparse) : NULL,
                        *st = sparse ? sparse_new(sparse) : NULL,
                        *su = sparse ? sparse_new(sparse) : NULL;
    struct sl_err err = {{0}};
    struct infer_model *m, *pm, *um;
    struct infer_state *s, *ps, *us;
    assert_int_equal(infer_model_load(model, NULL, &m, &err), 0);
    uint32_t V = infer_model_config(m)->vocab_size;
    int *ids = tiny_prompt(n, V, n * 13 + chunk);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V),
          *u = malloc(sizeof(float) * V);
    assert_true(ids && a && b && u);
    assert_int_equal(infer_state_create(m, chunk, &s, &err), 0);
    if (sf)
        infer_state_set_attention(s, infer_sparse_attention(sf));
    assert_int_equal(infer_forward(m, s, ids, n, 0, a, INFER_LOGITS_LAST, &err), 0);
    uint32_t trimmed = prefill(model, pol, res, chunk, ids, n, 0, st, b, &pm, &ps);
    uint64_t int8_trimmed = last_int8;
    uint32_t whole = prefill(model, pol, res, chunk, ids, n, 1, su, u, &um, &us);
    if (res == INFER_RESIDENT_PACKED && pl_granular_policy(pol) && !strcmp(model, static_model)) {
        /* the trimmed layer's O, gate, up and down, and Q with dense
         * attention: no int8 copy at all */
        const struct format_config *c = infer_model_config(m);
        uint64_t q = (uint64_t)c->n_heads * c->head_dim,
                 one_row = (sparse ? 1 : 2) * q * c->dim + 3 * (uint64_t)c->hidden_dim * c->dim;
        if (int8_trimmed + one_row > last_int8)
            fail_msg("%s, chunk %u, %u tokens: trimmed run took %llu int8 bytes, untrimmed %llu",
                     model, chunk, n, (unsigned long long)int8_trimmed,
                     (unsigned long long)last_int8);
    }
    if (memcmp(a, b, sizeof(float) * V) != 0)
        fail_msg("%s, policy %s, chunk %u, %u tokens: trimmed logits differ from the forward",
                 model, infer_policy_name(pol), chunk, n);
    if (memcmp(a, u, sizeof(float) * V) != 0)
        fail_msg("%s, policy %s, chunk %u, %u tokens: untrimmed logits differ", model,
                 infer_policy_name(pol), chunk, n);
    assert_true(trimmed <= whole);
    if (st) { /* sparse attention ran, and left keys out */
        struct infer_sparse_stats ss;
        infer_sparse_stats(st, &ss);
        if (n > 16 && !(ss.keys_kept < ss.keys_visible))
            fail_msg("%s, chunk %u, %u tokens: sparse kept %llu of %llu keys", model, chunk, n,
                     (unsigned long long)ss.keys_kept, (unsigned long long)ss.keys_visible);
    }
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
    infer_sparse_destroy(sf);
    infer_sparse_destroy(st);
    infer_sparse_destroy(su);
    return trimmed < whole;
}

static int check(const char *model, enum infer_policy pol, enum infer_resident res,
                 uint32_t chunk, uint32_t n)
{
    return check_attn(model, pol, res, chunk, n, 0);
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
        check(static_model, pol, INFER_RESIDENT_INT8, 16, SP_HEAD);
    }
    assert_true(check(static_model, INFER_POLICY_FULL, INFER_RESIDENT_INT8, 16, 40));
    assert_true(check(static_model, INFER_POLICY_FULL, INFER_RESIDENT_PACKED, 64, 150));
    check(static_model, INFER_POLICY_FULL, INFER_RESIDENT_PACKED, 64, 64);
    check(static_model, INFER_POLICY_FULL, INFER_RESIDENT_PACKED, 16, SP_HEAD);
    check(static_model, INFER_POLICY_SEQUENTIAL_GRANULAR, INFER_RESIDENT_PACKED, 16, 40);
}

/* Sparse attention: the first and last chunks' calls whole (PL_TRIMS_CALLS). */
static void test_trim_sparse(void **st)
{
    (void)st;
    for (int p = 0; p < INFER_POLICY_COUNT; p++) {
        enum infer_policy pol = (enum infer_policy)p;
        /* five chunks, the last of 22 rows: three only store keys and values */
        assert_true(check_attn(static_model, pol, INFER_RESIDENT_INT8, 32, 150, SP_HEAD));
        check_attn(static_model, pol, INFER_RESIDENT_INT8, 64, 64, SP_HEAD);
        check_attn(static_model, pol, INFER_RESIDENT_INT8, 16, 1, SP_HEAD);
    }
    assert_true(check_attn(static_model, INFER_POLICY_FULL, INFER_RESIDENT_INT8, 16, 40, SP_HEAD));
    assert_true(check_attn(static_model, INFER_POLICY_FULL, INFER_RESIDENT_PACKED, 32, 150, SP_HEAD));
    check_attn(static_model, INFER_POLICY_FULL, INFER_RESIDENT_PACKED, 16, 1, SP_HEAD);
    check_attn(static_model, INFER_POLICY_SEQUENTIAL_GRANULAR, INFER_RESIDENT_PACKED, 16, 40, SP_HEAD);
    /* one list per kv group, row blocks; a two-chunk prompt */
    assert_true(check_attn(static_model, INFER_POLICY_FULL, INFER_RESIDENT_INT8, 32, 150, SP_GROUP));
    assert_true(check_attn(static_model, INFER_POLICY_FULL, INFER_RESIDENT_INT8, 32, 150, SP_ROWS4));
    check_attn(static_model, INFER_POLICY_FULL, INFER_RESIDENT_INT8, 32, 50, SP_HEAD);
    /* calls under min_keys run dense, so the first sparse call (the bucket
     * grid's centre) may be a middle chunk's: refused, same logits */
    assert_false(check_attn(static_model, INFER_POLICY_FULL, INFER_RESIDENT_INT8, 32, 150, SP_MIN_KEYS));
    /* dynamic scales: refused with sparse attention too */
    assert_false(check_attn(dyn_model, INFER_POLICY_FULL, INFER_RESIDENT_INT8, 32, 150, SP_HEAD));
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
        cmocka_unit_test(test_trim_sparse),
        cmocka_unit_test(test_trim_refused_dynamic),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
