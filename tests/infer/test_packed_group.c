/* test_packed_group.c: several packed linears of one input in one split
 * (infer_linear_packed_group: a decode step's q, k and v, or gate and up,
 * the device thread and the calling thread taking chunks from the two ends
 * of their joint channel range) give, bit for bit, what the plain row path
 * (unpack_tensor_dot, then act * scale * sum) gives for each linear alone:
 * groups of 1-3 linears of every layer (also of unequal sizes, in any
 * order, a linear twice), 1-3 rows, 4 and 5 (the multi-row dot kernel on
 * each chunk, where it runs), 6 and 12 (the AMX tile kernel,
 * unpack_tensor_dot_tiles, where it runs), each linear with its own activations
 * and scale, chunks that do or do not divide the linears' channels;
 * infer_linear_exec_group takes the joint split (each linear passes
 * infer_packed_shares) and gives infer_linear_exec's bits one by one
 * (static scales shared or not; with a linear term attached it runs the
 * linears one by one, the old path, not tested here); bad
 * groups (none, too many, too many rows, rows that take infer_packed_rows, no
 * device thread) are refused with a sentence. Random inputs, the seed printed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "npu.h"
#include "testutil.h"
#include "tiny_q5.h"
#include "unpack.h"

static char q_model[4096];

static int setup(void **st)
{
    (void)st;
    char float_model[4096];
    return tiny_q5_models(19, float_model, q_model) < 0 ? -1 : 0;
}

/* The row path's y [n][rows] for one linear. */
static void reference(const struct infer_linear *lin, const int8_t *xq, uint32_t n, float act,
                      float *y)
{
    int32_t *acc = malloc(sizeof *acc * (size_t)n * lin->rows);
    assert_non_null(acc);
    assert_int_equal(unpack_tensor_dot(lin->upk, UNPACK_KERNEL_SCALAR, 0, lin->rows, xq, n, acc,
                                       lin->rows),
                     0);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t r = 0; r < lin->rows; r++) {
            float s = act * unpack_tensor_scale(lin->upk, r);
            y[(size_t)i * lin->rows + r] = s * (float)acc[(size_t)i * lin->rows + r];
        }
    free(acc);
}

static const uint32_t qkv[3] = {FORMAT_ROLE_WQ, FORMAT_ROLE_WK, FORMAT_ROLE_WV};
static const uint32_t gu[2] = {FORMAT_ROLE_W_GATE, FORMAT_ROLE_W_UP};

/* One group of the roles of layer l, n rows, random activations and
 * scales, against the reference; `shared`: the parts as wide as the first
 * take its activations (one buffer, as a layer's q, k and v do: the tile
 * kernel stages them once). */
static void check_group(struct infer_session *s, int l, const uint32_t *roles, uint32_t count,
                        uint32_t n, int shared, struct test_rng *g)
{
    struct infer_model *m = infer_session_model(s);
    struct infer_state *st = infer_session_state(s);
    struct sl_err err = {{0}};
    const struct infer_linear *lins[3];
    int8_t *xq[3];
    float act[3], *got[3], *want[3];
    for (uint32_t j = 0; j < count; j++) {
        lins[j] = infer_model_linear(m, l, roles[j]);
        assert_non_null(lins[j]);
        assert_non_null(lins[j]->upk);
        assert_null(lins[j]->npu);
        size_t nx = (size_t)n * lins[j]->cols, ny = (size_t)n * lins[j]->rows;
        int same = shared && j > 0 && lins[j]->cols == lins[0]->cols;
        xq[j] = same ? xq[0] : malloc(nx);
        got[j] = malloc(sizeof(float) * ny);
        want[j] = malloc(sizeof(float) * ny);
        assert_true(xq[j] && got[j] && want[j]);
        for (size_t i = 0; i < nx && !same; i++)
            xq[j][i] = (int8_t)((int)test_rng_below(g, 255) - 127);
        act[j] = 0.001f + (float)test_rng_below(g, 1000) * 1e-4f;
        memset(got[j], 0xff, sizeof(float) * ny);
        reference(lins[j], xq[j], n, act[j], want[j]);
    }
    assert_int_equal(infer_linear_packed_group(st, count, lins, (const int8_t *const *)xq, act,
                                               got, n, &err),
                     0);
    for (uint32_t j = 0; j < count; j++) {
        if (memcmp(got[j], want[j], sizeof(float) * n * lins[j]->rows) != 0)
            fail_msg("layer %d, linear %u of %u (role %u), %u rows: bits differ", l, j, count,
                     roles[j], n);
        if (j == 0 || xq[j] != xq[0])
            free(xq[j]);
        free(got[j]);
        free(want[j]);
    }
}

static void test_group_bits(void **st)
{
    (void)st;
    struct test_rng g;
    uint64_t seed = test_seed() + 23;
    test_rng_init(&g, seed);
    fprintf(stderr, "seed %llu\n", (unsigned long long)seed);
    struct infer_session *s = tiny_packed_session(q_model, 0);
    const struct format_config *c = infer_model_config(infer_session_model(s));
    static const uint32_t mixed[][3] = {{FORMAT_ROLE_WK, FORMAT_ROLE_WQ, FORMAT_ROLE_W_DOWN},
                                        {FORMAT_ROLE_W_UP, FORMAT_ROLE_WV, 0},
                                        {FORMAT_ROLE_WO, FORMAT_ROLE_WO, FORMAT_ROLE_WK}};
    static const uint32_t mixed_n[] = {3, 2, 3};
    /* chunks of the default size, of 16, and of sizes that do not divide
     * the linears' channels (a chunk clipped at a linear's end), and one
     * larger than any linear */
    static const uint32_t chunks[] = {0, 16, 48, 7, 100000};
    for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
        infer_packed_shared_set_chunk(chunks[ci]);
        for (uint32_t n = 1; n <= 12; n = n < 8 ? n + 1 : n + 4) {
            /* 4-8 rows: the multi-row dot kernel on each chunk where it
             * takes them and the tile kernel does not (AVX-512 VNNI: 4-5 on
             * AMX, 4-8 without); 6-16 rows: where unpack_tensor_dot_tiles
             * takes them (AMX) */
            const struct infer_linear *l0 =
                infer_model_linear(infer_session_model(s), 0, FORMAT_ROLE_WQ);
            if (n > 3 && !infer_packed_tiles_take(l0->upk, n) &&
                infer_packed_rows_take(l0->upk, n)) {
                if (ci == 0)
                    fprintf(stderr, "%u rows: not a shared-range row count here (skipped)\n", n);
                continue;
            }
            for (int l = 0; l < (int)c->n_layers; l++) {
                check_group(s, l, qkv, 3, n, 0, &g);
                check_group(s, l, gu, 2, n, 0, &g);
                check_group(s, l, qkv + 1, 1, n, 0, &g);
                for (int k = 0; k < 3; k++)
                    check_group(s, l, mixed[k], mixed_n[k], n, 0, &g);
                /* one activation buffer, as the forward passes them */
                check_group(s, l, qkv, 3, n, 1, &g);
                check_group(s, l, gu, 2, n, 1, &g);
                check_group(s, l, mixed[0], mixed_n[0], n, 1, &g);
            }
        }
    }
    infer_packed_shared_set_chunk(0);
    infer_session_destroy(s);
}

/* infer_linear_exec_group against infer_linear_exec one by one, on float
 * activations, with the scales as the model has them, then: two equal and
 * one not, all equal (one quantization shared), all dynamic (one scale
 * from x), and a mix of static and dynamic. */
static void test_exec_group(void **st)
{
    (void)st;
    struct test_rng g;
    uint64_t seed = test_seed() + 29;
    test_rng_init(&g, seed);
    fprintf(stderr, "seed %llu\n", (unsigned long long)seed);
    struct infer_session *s = tiny_packed_session(q_model, 0);
    struct infer_model *m = infer_session_model(s);
    struct infer_state *sta = infer_session_state(s);
    struct sl_err err = {{0}};
    const uint32_t n = 2;
    for (int mode = 0; mode < 5; mode++) {
        struct infer_linear *lins[3];
        float saved[3];
        for (int j = 0; j < 3; j++) {
            lins[j] = infer_model_linear(m, 1, qkv[j]);
            saved[j] = lins[j]->act_scale;
        }
        float s0 = saved[0] > 0 ? saved[0] : 0.02f;
        static const float f[5][3] = {{-1, -1, -1}, {1, 1.5f, 1}, {1, 1, 1}, {0, 0, 0},
                                      {1, 0, 0.75f}};
        for (int j = 0; mode > 0 && j < 3; j++)
            lins[j]->act_scale = f[mode][j] * s0;
        uint32_t cols = lins[0]->cols;
        float *x = malloc(sizeof(float) * n * cols);
        assert_non_null(x);
        float *got[3], *want[3];
        for (int j = 0; j < 3; j++) /* else the group would be compared with itself */
            assert_true(infer_packed_shares(sta, lins[j], n));
        for (size_t i = 0; i < (size_t)n * cols; i++)
            x[i] = (test_rng_float(&g) - 0.5f) * 4.0f;
        for (int j = 0; j < 3; j++) {
            want[j] = malloc(sizeof(float) * n * lins[j]->rows);
            got[j] = malloc(sizeof(float) * n * lins[j]->rows);
            assert_true(want[j] && got[j]);
            assert_int_equal(infer_linear_exec(m, sta, 1, qkv[j], lins[j], want[j], x, n, &err),
                             0);
            memset(got[j], 0xff, sizeof(float) * n * lins[j]->rows);
        }
        assert_int_equal(infer_linear_exec_group(m, sta, 1, 3, qkv,
                                                 (const struct infer_linear *const *)lins, got, x,
                                                 n, &err),
                         0);
        for (int j = 0; j < 3; j++) {
            if (memcmp(got[j], want[j], sizeof(float) * n * lins[j]->rows) != 0)
                fail_msg("scales mode %d, linear %d: bits differ", mode, j);
            free(got[j]);
            free(want[j]);
            lins[j]->act_scale = saved[j];
        }
        free(x);
    }
    infer_session_destroy(s);
}

static void test_refused(void **st)
{
    (void)st;
    struct infer_session *s = tiny_packed_session(q_model, 0);
    struct infer_model *m = infer_session_model(s);
    struct infer_state *sta = infer_session_state(s);
    const struct infer_linear *lins[4];
    for (int j = 0; j < 4; j++)
        lins[j] = infer_model_linear(m, 0, FORMAT_ROLE_WQ);
    uint32_t cols = lins[0]->cols, rows = lins[0]->rows;
    int8_t *xq = calloc((size_t)4 * cols, 1);
    float *y = malloc(sizeof(float) * 4 * rows);
    assert_true(xq && y);
    const int8_t *xs[4] = {xq, xq, xq, xq};
    float act[4] = {0.01f, 0.01f, 0.01f, 0.01f};
    float *ys[4] = {y, y, y, y};
    struct sl_err err = {{0}};
    assert_int_equal(infer_linear_packed_group(sta, 0, lins, xs, act, ys, 1, &err), -EINVAL);
    assert_true(err.msg[0] != 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(infer_linear_packed_group(sta, 4, lins, xs, act, ys, 1, &err), -EINVAL);
    assert_true(err.msg[0] != 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(infer_linear_packed_group(sta, 1, lins, xs, act, ys,
                                               UNPACK_TILES_ROWS_MAX + 1, &err),
                     -EINVAL);
    assert_true(err.msg[0] != 0);
    /* 4 rows that go to infer_packed_rows (a tile set), not a dot kernel */
    infer_packed_rows_set_tile(16);
    memset(&err, 0, sizeof err);
    assert_int_equal(infer_linear_packed_group(sta, 1, lins, xs, act, ys, 4, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "cannot join"));
    infer_packed_rows_set_tile(0);
    infer_session_destroy(s);
    /* no device thread: nothing to share the range with */
    s = tiny_packed_session(q_model, 1);
    m = infer_session_model(s);
    lins[0] = infer_model_linear(m, 0, FORMAT_ROLE_WQ);
    memset(&err, 0, sizeof err);
    assert_int_equal(infer_linear_packed_group(infer_session_state(s), 1, lins, xs, act, ys, 1,
                                               &err),
                     -EINVAL);
    assert_non_null(strstr(err.msg, "cannot join"));
    infer_session_destroy(s);
    free(xq);
    free(y);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_bits),
        cmocka_unit_test(test_exec_group),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
