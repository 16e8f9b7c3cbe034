/* test_multi.c: several sequences in one forward pass (continuous batching,
 * infer_forward_multi / infer_session_run_multi) against each sequence run
 * alone. Sessions of different prompt lengths join at different rounds,
 * step at different positions, sit rounds out and come back; after every
 * round each participant's logits must equal, bit for bit, a reference
 * session that ran the same tokens on its own (infer_session_prefill /
 * infer_session_step), and at the end every cache slot must too. Float
 * weights, int8 with static activation scales (one GEMM over all rows) and
 * int8 with dynamic scales (one call per sequence), with the step's NPU
 * device thread taking part of every matmul (float ones too) or not. Then the refusals: a state
 * twice, too many rows, past the context, a step of two tokens, another
 * model; nothing of a refused or failed call stays in a cache. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "infer_internal.h"
#include "quantizer.h"
#include "testutil.h"
#include "tiny_q5.h"

static char float_model[4096], q_model[4096];

static int setup(void **st)
{
    (void)st;
    return tiny_q5_models(5, float_model, q_model);
}

enum act { ACT_FLOAT, ACT_STATIC, ACT_DYNAMIC };

static struct infer_model *load(enum act a)
{
    struct sl_err err = {{0}};
    struct infer_load_opts lo = {.force_dynamic_act = a == ACT_DYNAMIC};
    struct infer_model *m;
    assert_int_equal(infer_model_load(a == ACT_FLOAT ? float_model : q_model, &lo, &m, &err), 0);
    if (a == ACT_STATIC) { /* fixed per-tensor scales: rows no longer share one */
        const struct format_config *c = infer_model_config(m);
        for (int l = -1; l < (int)c->n_layers; l++)
            for (uint32_t role = 0; role < 64; role++) {
                struct infer_linear *lin = infer_model_linear(m, l, role);
                if (lin && !lin->w)
                    lin->act_scale = 0.02f + 0.001f * (float)(l + 1);
            }
    }
    if (a != ACT_FLOAT)
        assert_true(infer_model_is_quantized(m));
    return m;
}

#define K 6
#define ROUNDS 14

/* Sessions join, step and pause at random; each round is one multi step,
 * and every event is replayed on the sequence's reference session alone. */
static void against_alone(enum act a, int npu, struct test_rng *rng)
{
    struct sl_err err = {{0}};
    struct infer_model *m = load(a);
    const struct format_config *c = infer_model_config(m);
    size_t V = c->vocab_size;
    const uint32_t max_batch = 64;
    struct infer_multi_opts mo = {.max_rows = max_batch + K, .no_npu = !npu,
                                  .npu_min_weights = 1};
    struct infer_multi *mb;
    assert_int_equal(infer_multi_create(m, &mo, &mb, &err), 0);
    assert_int_equal(infer_multi_max_rows(mb), max_batch + K);
    struct infer_session_opts so = {.max_batch = max_batch, .no_npu = 1};
    struct infer_session *ref[K], *ses[K];
    uint32_t plen[K] = {1, 7, 30, 19, 3, 64}; /* prompts of different lengths */
    int *prompt[K];
    int started[K] = {0};
    for (uint32_t i = 0; i < K; i++) {
        assert_int_equal(infer_session_create(m, &so, &ref[i], &err), 0);
        assert_int_equal(infer_session_create(m, &so, &ses[i], &err), 0);
        prompt[i] = malloc(sizeof(int) * plen[i]);
        assert_non_null(prompt[i]);
        for (uint32_t j = 0; j < plen[i]; j++)
            prompt[i][j] = j == 0 ? 1 : 3 + (int)test_rng_below(rng, (uint32_t)V - 3);
    }
    uint32_t events = 0, multi_rounds = 0;
    for (int round = 0; round < ROUNDS; round++) {
        struct infer_session_rows rows[K];
        int tok[K];
        uint32_t k = 0, total = 0;
        for (uint32_t i = 0; i < K; i++) {
            if (!started[i]) {
                /* sequence 0 starts at once, the rest at random rounds */
                if ((i > 0 && test_rng_below(rng, 3) != 0) || total + plen[i] > max_batch)
                    continue;
                rows[k++] = (struct infer_session_rows){.s = ses[i], .tokens = prompt[i],
                                                        .n = plen[i]};
                total += plen[i];
                started[i] = 1;
                continue;
            }
            if (test_rng_below(rng, 4) == 0 ||
                infer_session_len(ses[i]) + 1 > c->seq_len)
                continue; /* sits this round out */
            tok[i] = 3 + (int)test_rng_below(rng, (uint32_t)V - 3);
            rows[k++] = (struct infer_session_rows){.s = ses[i], .tokens = &tok[i], .n = 1,
                                                    .step = 1};
            total++;
        }
        if (k == 0)
            continue;
        /* the entries in a random order: the order of rows must not matter */
        for (uint32_t i = k; i > 1; i--) {
            uint32_t j = test_rng_below(rng, i);
            struct infer_session_rows t = rows[i - 1];
            rows[i - 1] = rows[j];
            rows[j] = t;
        }
        assert_int_equal(infer_session_run_multi(mb, rows, k, &err), 0);
        multi_rounds += k > 1;
        for (uint32_t e = 0; e < k; e++) {
            uint32_t i = 0;
            while (ses[i] != rows[e].s)
                i++;
            if (rows[e].step)
                assert_int_equal(infer_session_step(ref[i], rows[e].tokens[0], &err), 0);
            else
                assert_int_equal(infer_session_prefill(ref[i], rows[e].tokens, rows[e].n, &err),
                                 0);
            assert_int_equal(infer_session_len(ses[i]), infer_session_len(ref[i]));
            assert_non_null(infer_session_logits(ses[i]));
            assert_memory_equal(infer_session_logits(ses[i]), infer_session_logits(ref[i]),
                                sizeof(float) * V);
            events++;
        }
    }
    assert_true(multi_rounds >= ROUNDS / 2); /* rounds of several sequences did happen */
    /* every slot of every cache, keys and values of every layer */
    for (uint32_t i = 0; i < K; i++) {
        struct infer_kv *a_kv = infer_state_kv(infer_session_state(ses[i]));
        struct infer_kv *b_kv = infer_state_kv(infer_session_state(ref[i]));
        uint32_t len = infer_kv_len(a_kv);
        assert_int_equal(len, infer_kv_len(b_kv));
        for (uint32_t s = 0; s < len; s++)
            assert_int_equal(infer_kv_pos(a_kv, s), infer_kv_pos(b_kv, s));
        size_t kvd = (size_t)c->n_kv_heads * c->head_dim;
        for (uint32_t l = 0; l < c->n_layers && len; l++) {
            assert_memory_equal(infer_kv_keys(a_kv, l), infer_kv_keys(b_kv, l),
                                sizeof(float) * kvd * len);
            assert_memory_equal(infer_kv_values(a_kv, l), infer_kv_values(b_kv, l),
                                sizeof(float) * kvd * len);
        }
        struct infer_session_stats sa, sb;
        infer_session_stats(ses[i], &sa);
        infer_session_stats(ref[i], &sb);
        assert_int_equal(sa.prompt_tokens, sb.prompt_tokens);
        assert_int_equal(sa.decoded, sb.decoded);
    }
    /* the work was split with the device thread (float matmuls too, split
     * the same way); int8 parts are waited for, so the thread ran some. A
     * float part it has not started is taken back by the calling thread, so
     * on a busy machine (ctest -j) it may have run none of them. */
    if (npu) {
        assert_true(infer_multi_dev_calls(mb) > 0);
        if (a != ACT_FLOAT)
            assert_true(infer_multi_npu_jobs(mb) > 0);
    }
    printf("  %s, npu %d: %u events in %d rounds\n",
           a == ACT_FLOAT ? "float" : a == ACT_STATIC ? "int8 static" : "int8 dynamic", npu,
           events, ROUNDS);
    for (uint32_t i = 0; i < K; i++) {
        infer_session_destroy(ref[i]);
        infer_session_destroy(ses[i]);
        free(prompt[i]);
    }
    infer_multi_destroy(mb);
    infer_model_destroy(m);
}

static void test_float(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    against_alone(ACT_FLOAT, 0, &rng);
    against_alone(ACT_FLOAT, 1, &rng);
}

static void test_int8_static(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 1);
    against_alone(ACT_STATIC, 0, &rng);
    against_alone(ACT_STATIC, 1, &rng);
}

static void test_int8_dynamic(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 2);
    against_alone(ACT_DYNAMIC, 0, &rng);
    against_alone(ACT_DYNAMIC, 1, &rng);
}

/* Refusals leave every cache as it was. */
static void test_refusals(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_model *m = load(ACT_FLOAT), *m2 = load(ACT_FLOAT);
    const struct format_config *c = infer_model_config(m);
    struct infer_multi_opts mo = {.max_rows = 8, .no_npu = 1};
    struct infer_multi *mb;
    assert_int_equal(infer_multi_create(m, &mo, &mb, &err), 0);
    struct infer_state *a, *b;
    assert_int_equal(infer_state_create(m, 8, &a, &err), 0);
    assert_int_equal(infer_state_create(m, 8, &b, &err), 0);
    int toks[16];
    for (int i = 0; i < 16; i++)
        toks[i] = 3 + i;
    float *lg = malloc(sizeof(float) * c->vocab_size);
    assert_non_null(lg);
    struct infer_seq two[2] = {{.s = a, .tokens = toks, .n = 3, .logits = lg},
                               {.s = a, .tokens = toks, .n = 1}};
    err.msg[0] = 0;
    assert_int_equal(infer_forward_multi(mb, two, 2, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "share one state"));
    two[1].s = b;
    two[1].n = 6; /* 3 + 6 rows > 8 */
    assert_int_equal(infer_forward_multi(mb, two, 2, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "exceeds"));
    two[1].n = 0;
    assert_int_equal(infer_forward_multi(mb, two, 2, &err), -EINVAL);
    assert_int_equal(infer_kv_len(infer_state_kv(a)), 0);
    assert_int_equal(infer_kv_len(infer_state_kv(b)), 0);
    /* past the context: b nearly full */
    struct infer_kv *kvb = infer_state_kv(b);
    kvb->len = c->seq_len - 1;
    two[1].n = 2;
    assert_int_equal(infer_forward_multi(mb, two, 2, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "context"));
    assert_int_equal(infer_kv_len(infer_state_kv(a)), 0);
    assert_int_equal(infer_kv_len(kvb), c->seq_len - 1);
    kvb->len = 0;
    /* accepted: both advance, no logits wanted for b */
    two[1].n = 5;
    assert_int_equal(infer_forward_multi(mb, two, 2, &err), 0);
    assert_int_equal(infer_kv_len(infer_state_kv(a)), 3);
    assert_int_equal(infer_kv_len(kvb), 5);
    assert_int_equal(infer_forward_multi(mb, two, 0, &err), 0);
    /* sessions: a step of two tokens, a session of another model */
    struct infer_session_opts so = {.no_npu = 1};
    struct infer_session *s1, *s2;
    assert_int_equal(infer_session_create(m, &so, &s1, &err), 0);
    assert_int_equal(infer_session_create(m2, &so, &s2, &err), 0);
    struct infer_session_rows r[2] = {{.s = s1, .tokens = toks, .n = 2, .step = 1}};
    assert_int_equal(infer_session_run_multi(mb, r, 1, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "not 1"));
    r[0].step = 0;
    r[1] = (struct infer_session_rows){.s = s2, .tokens = toks, .n = 1};
    assert_int_equal(infer_session_run_multi(mb, r, 2, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "another model"));
    assert_int_equal(infer_session_len(s1), 0);
    assert_null(infer_session_logits(s1));
    assert_int_equal(infer_session_run_multi(mb, r, 1, &err), 0);
    assert_int_equal(infer_session_len(s1), 2);
    assert_non_null(infer_session_logits(s1));
    infer_session_destroy(s1);
    infer_session_destroy(s2);
    free(lg);
    infer_state_destroy(a);
    infer_state_destroy(b);
    infer_multi_destroy(mb);
    infer_multi_destroy(NULL);
    infer_model_destroy(m);
    infer_model_destroy(m2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float),
        cmocka_unit_test(test_int8_static),
        cmocka_unit_test(test_int8_dynamic),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
