/* test_packed_rows.c: a packed linear (packed residency) over a few rows at
 * once (infer_resident_rows.c: the codes unpacked once per call, a tile of
 * channels at a time, then the NPU's GEMM) gives the bits of the row path
 * (unpack_tensor_dot, one activation row at a time), for every linear of an
 * adaptive 5-bit and a bitplane 4-bit model, 4 to 16 rows, tiles of 16, 48
 * channels and the default, with the device thread taking half the channels
 * (or, where a dot kernel takes the rows, chunks from the two ends:
 * test_packed_group checks that path) and without it (tiles of 16 and 48 set: that path even where
 * unpack_tensor_dot unpacks once for all rows, AVX-512 VNNI; the default:
 * unpack_tensor_dot's multi-row kernels there, and from 6 rows on AMX
 * unpack_tensor_dot_tiles); and every allocation failing in turn gives
 * -ENOMEM or the same bits, never anything else (with the tile path, and
 * with the default paths: 8 rows take unpack_tensor_dot_tiles on AMX). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "npu.h"
#include "quantizer.h"
#include "testutil.h"
#include "tiny_q5.h"

static char q_model[4096], bp_model[4096];

static int setup(void **st)
{
    (void)st;
    char float_model[4096];
    struct sl_err err;
    if (tiny_q5_models(13, float_model, q_model) < 0)
        return -1;
    snprintf(bp_model, sizeof bp_model, "%s/tiny-bp4-rows.sluice", test_tmpdir());
    struct quantizer_opts o = {.method = QUANTIZER_METHOD_EDGEFLOW,
                               .bits = 4,
                               .budget = QUANTIZER_BUDGET_TENSOR,
                               .alpha = -1,
                               .encoding = FORMAT_ENC_BITPLANE};
    if (quantizer_quantize(float_model, NULL, &o, bp_model, NULL, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static void same_bits(const char *model, int no_npu, uint32_t tile, struct test_rng *g)
{
    struct infer_session *s = tiny_packed_session(model, no_npu);
    struct infer_model *m = infer_session_model(s);
    struct infer_state *st = infer_session_state(s);
    struct sl_err err = {{0}};
    infer_packed_rows_set_tile(tile);
    static const uint32_t ns[] = {4, 5, 6, 8, 12, 13, 16};
    uint32_t checked = 0;
    for (int l = -1; l < (int)infer_model_config(m)->n_layers; l++)
        for (uint32_t role = FORMAT_ROLE_WQ; role <= FORMAT_ROLE_CLASSIFIER; role++) {
            struct infer_linear *lin = infer_model_linear(m, l, role);
            if (!lin || !lin->upk || lin->npu)
                continue;
            uint32_t rows = lin->rows, cols = lin->cols;
            int8_t *xq = malloc((size_t)16 * cols);
            float *want = malloc(sizeof(float) * 16 * rows),
                  *got = malloc(sizeof(float) * 16 * rows);
            for (size_t i = 0; i < (size_t)16 * cols; i++)
                xq[i] = (int8_t)((int)test_rng_below(g, 255) - 127);
            float act = 0.01f + (float)test_rng_below(g, 100) * 1e-4f;
            for (uint32_t i = 0; i < 16; i++) /* one row at a time: the row path */
                assert_int_equal(infer_linear_packed(st, lin, xq + (size_t)i * cols, 1, act,
                                                     want + (size_t)i * rows, &err),
                                 0);
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                memset(got, 0xff, sizeof(float) * 16 * rows);
                assert_int_equal(infer_linear_packed(st, lin, xq, ns[k], act, got, &err), 0);
                if (memcmp(got, want, sizeof(float) * ns[k] * rows) != 0)
                    fail_msg("%s layer %d role %u, %u rows, tile %u, no_npu %d: bits differ", model,
                             l, role, ns[k], tile, no_npu);
                if (no_npu)
                    continue;
                /* a multi-sequence step's split (infer_multi.c): the device
                 * thread takes rows [0, r_npu) and this thread the rest,
                 * each part's products written at its own rows */
                int split = st->split_work;
                uint64_t min_w = st->npu_min_weights;
                st->split_work = 1;
                st->npu_min_weights = 1;
                memset(got, 0xff, sizeof(float) * 16 * rows);
                int ret = infer_linear_packed(st, lin, xq, ns[k], act, got, &err);
                st->split_work = split;
                st->npu_min_weights = min_w;
                assert_int_equal(ret, 0);
                if (memcmp(got, want, sizeof(float) * ns[k] * rows) != 0)
                    fail_msg("%s layer %d role %u, %u rows, tile %u: bits differ in a split step",
                             model, l, role, ns[k], tile);
            }
            free(xq);
            free(want);
            free(got);
            checked++;
        }
    assert_true(checked >= 8);
    infer_packed_rows_set_tile(0);
    infer_session_destroy(s);
}

static void test_same_bits(void **st)
{
    (void)st;
    struct test_rng g;
    test_rng_init(&g, test_seed() + 17);
    const uint32_t tiles[3] = {16, 48, 0};
    for (int t = 0; t < 3; t++)
        for (int no_npu = 0; no_npu < 2; no_npu++) {
            same_bits(q_model, no_npu, tiles[t], &g);
            same_bits(bp_model, no_npu, tiles[t], &g);
        }
}

/* Every allocation of a first few-rows call (fresh tile scratch) failing
 * in turn: -ENOMEM with a sentence (and the state still usable), or the
 * same bits. */
static void faults(uint32_t tile, uint32_t min_failed)
{
    struct sl_err err = {{0}};
    infer_packed_rows_set_tile(tile);
    uint32_t failed = 0;
    for (long k = 1;; k++) {
        struct infer_session *s = tiny_packed_session(q_model, 0);
        struct infer_model *m = infer_session_model(s);
        struct infer_linear *lin = infer_model_linear(m, 0, FORMAT_ROLE_W_GATE);
        assert_non_null(lin->upk);
        uint32_t rows = lin->rows, cols = lin->cols, n = 8;
        int8_t *xq = malloc((size_t)n * cols);
        float *want = malloc(sizeof(float) * n * rows), *got = malloc(sizeof(float) * n * rows);
        for (size_t i = 0; i < (size_t)n * cols; i++)
            xq[i] = (int8_t)((int)(i * 37 % 255) - 127);
        for (uint32_t i = 0; i < n; i++)
            assert_int_equal(infer_linear_packed(infer_session_state(s), lin, xq + (size_t)i * cols,
                                                 1, 0.02f, want + (size_t)i * rows, &err),
                             0);
        memset(&err, 0, sizeof err);
        sl_fault_alloc_arm(k);
        int ret = infer_linear_packed(infer_session_state(s), lin, xq, n, 0.02f, got, &err);
        long count = sl_fault_alloc_count();
        sl_fault_alloc_arm(0);
        int done = count < k;
        if (ret == 0) { /* nothing failed, or a failure with a fallback (staging) */
            assert_memory_equal(got, want, sizeof(float) * n * rows);
        } else {
            assert_int_equal(ret, -ENOMEM);
            assert_true(err.msg[0] != 0);
            failed++;
            /* the state is still usable */
            assert_int_equal(
                infer_linear_packed(infer_session_state(s), lin, xq, n, 0.02f, got, &err), 0);
            assert_memory_equal(got, want, sizeof(float) * n * rows);
        }
        free(xq);
        free(want);
        free(got);
        infer_session_destroy(s);
        if (done)
            break;
    }
    infer_packed_rows_set_tile(0);
    assert_true(failed >= min_failed);
}

static void test_faults(void **st)
{
    (void)st;
    faults(16, 3);
    /* the default: the sums' and (on AMX) the stage's allocations */
    faults(0, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits),
        cmocka_unit_test(test_faults),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
