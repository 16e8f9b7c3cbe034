/* test_npu_device.c: the emulated NPU device (npu.h): graphs built once per
 * shape and shared, refusals (no graph, another device's graph, wrong shape,
 * non-int8 operands, missing weights, bad rows/ranges/scales, no ticket),
 * submitted jobs, the pull mode and npu_job_execute all bit-identical to the
 * direct npu_linear_s8_range call (every kernel and tiling, short chunks,
 * padded rows, channel ranges), submitters computing while the device
 * works, submitted jobs between pulled ones, and stopping with jobs pending
 * (no hang, no leak, every job completed exactly once, in order), and
 * queued calls taken back (npu_ticket_revoke). Run under ASan and TSan too. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "npu_gemm_internal.h"
#include "testutil.h"

static struct test_rng rng;

/* One linear layer: weights [n][k], a chunk of activations [m][k]. */
struct layer {
    uint32_t m, k, n;
    int8_t *q, *xq;
    float *scale;
    float act;
    struct npu_weights *w;
};

static void layer_init(struct layer *L, uint32_t m, uint32_t k, uint32_t n)
{
    L->m = m, L->k = k, L->n = n;
    L->q = malloc((size_t)n * k);
    L->xq = malloc((size_t)m * k);
    L->scale = malloc(sizeof(float) * n);
    assert_true(L->q && L->xq && L->scale);
    for (size_t i = 0; i < (size_t)n * k; i++)
        L->q[i] = (int8_t)((int)test_rng_below(&rng, 255) - 127);
    for (size_t i = 0; i < (size_t)m * k; i++)
        L->xq[i] = (int8_t)((int)test_rng_below(&rng, 255) - 127);
    for (uint32_t r = 0; r < n; r++)
        L->scale[r] = (0.5f + test_rng_float(&rng)) * 2e-3f;
    L->act = 0.031f;
    assert_int_equal(npu_weights_create(L->q, L->scale, n, k, &L->w), 0);
}

static void layer_fini(struct layer *L)
{
    npu_weights_destroy(L->w);
    free(L->q);
    free(L->xq);
    free(L->scale);
}

/* The direct call: rows x [r0, r1) into a fresh [rows][n] buffer (NaN elsewhere). */
static float *expect(const struct layer *L, uint32_t rows, uint32_t r0, uint32_t r1)
{
    float *y = malloc(sizeof(float) * rows * L->n);
    for (size_t i = 0; i < (size_t)rows * L->n; i++)
        y[i] = NAN;
    npu_linear_s8_range(L->w, L->xq, rows, L->act, y, L->n, r0, r1);
    return y;
}

static float *nan_buf(size_t n)
{
    float *y = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        y[i] = NAN;
    return y;
}

static struct npu_job job_for(const struct npu_graph *g, const struct layer *L, uint32_t rows,
                              float *y)
{
    struct npu_job j;
    memset(&j, 0, sizeof j);
    j.graph = g;
    j.w = L->w;
    j.a_type = NPU_DTYPE_INT8;
    j.xq = L->xq;
    j.rows = rows;
    j.act_scale = L->act;
    j.y = y;
    j.ldy = L->n;
    return j;
}

/* Runs all of L's rows through g on d: the output equals the reference. */
static void run_all_rows(struct npu_device *d, const struct npu_graph *g, const struct layer *L)
{
    struct sl_err err;
    float *want = expect(L, L->m, 0, L->n), *y = nan_buf((size_t)L->m * L->n);
    struct npu_job j = job_for(g, L, L->m, y);
    assert_int_equal(npu_device_run(d, &j, &err), 0);
    assert_memory_equal(y, want, sizeof(float) * L->m * L->n);
    free(want);
    free(y);
}

static void test_graphs(void **st)
{
    (void)st;
    struct npu_device *d, *d2;
    struct sl_err err = {{0}};
    assert_int_equal(npu_device_create(&d), 0);
    const struct npu_graph *g, *g2, *g3;
    assert_null(npu_graph_find(d, 64, 96, 80));
    assert_int_equal(npu_device_graph(d, 64, 96, 80, &g, &err), 0);
    assert_ptr_equal(npu_graph_find(d, 64, 96, 80), g);
    /* chunk-sharing: asking again returns the same graph, not a new build */
    struct npu_graph_desc desc = NPU_GRAPH_DESC_INT8(64, 96, 80);
    assert_int_equal(npu_graph_build(d, &desc, &g2, &err), 0);
    assert_ptr_equal(g, g2);
    assert_int_equal(npu_device_graph(d, 32, 96, 80, &g3, &err), 0);
    assert_ptr_not_equal(g, g3);
    struct npu_device_stats s;
    npu_device_stats(d, &s);
    assert_int_equal(s.graphs_built, 2);
    assert_true(s.build_ns > 0);
    struct npu_graph_info info;
    npu_graph_info(g, &info);
    assert_int_equal(info.desc.m, 64);
    assert_true(info.build_ns > 0 && info.scratch_bytes >= 64 * 96);
    fprintf(stderr, "graph 64x96x80: kernel %s, tiling %s, built in %.3f ms\n",
            npu_kernel_name(info.kernel), info.tile_name, (double)info.build_ns / 1e6);

    /* graphs it does not build */
    struct npu_graph_desc bad = desc;
    bad.a_type = NPU_DTYPE_F32;
    err.msg[0] = 0;
    assert_int_equal(npu_graph_build(d, &bad, &g2, &err), -ENOTSUP);
    assert_non_null(strstr(err.msg, "int8"));
    bad = desc;
    bad.w_type = NPU_DTYPE_F16;
    assert_int_equal(npu_graph_build(d, &bad, &g2, &err), -ENOTSUP);
    bad = desc;
    bad.y_type = NPU_DTYPE_INT32;
    assert_int_equal(npu_graph_build(d, &bad, &g2, &err), -ENOTSUP);
    assert_int_equal(npu_device_graph(d, 0, 96, 80, &g2, &err), -EINVAL);
    assert_int_equal(npu_device_graph(d, 64, NPU_GRAPH_MAX_K + 1, 80, &g2, &err), -EINVAL);
    assert_int_equal(npu_device_graph(d, NPU_GRAPH_MAX_M + 1, 96, 80, &g2, &err), -EINVAL);
    assert_null(g2);

    /* max_graphs */
    struct npu_device_config cfg;
    npu_device_config_init(&cfg);
    cfg.max_graphs = 1;
    assert_int_equal(npu_device_create_config(&cfg, &d2, &err), 0);
    assert_int_equal(npu_device_graph(d2, 8, 8, 8, &g2, &err), 0);
    assert_int_equal(npu_device_graph(d2, 8, 8, 16, &g2, &err), -ENOSPC);
    npu_device_destroy(d2);
    /* configurations it refuses */
    cfg.max_graphs = 0;
    cfg.tile = 99;
    assert_int_equal(npu_device_create_config(&cfg, &d2, &err), -EINVAL);
    cfg.tile = -1;
    cfg.kernel = NPU_KERNEL_COUNT;
    assert_int_equal(npu_device_create_config(&cfg, &d2, &err), -EINVAL);
    npu_device_destroy(d);
}

/* The scalar reference of a job over all channels: npu_gemm_s8_kernel with
 * NPU_KERNEL_SCALAR, dequantized as npu.h defines it. */
static float *scalar_ref(const struct layer *L, const struct npu_gemm_b *b, uint32_t rows)
{
    int32_t *c = malloc(sizeof(int32_t) * rows * L->n);
    float *y = malloc(sizeof(float) * rows * L->n);
    assert_true(c && y);
    npu_gemm_s8_kernel(NPU_KERNEL_SCALAR, b, L->xq, rows, 0, L->n, c, L->n);
    for (uint32_t i = 0; i < rows; i++)
        for (uint32_t r = 0; r < L->n; r++)
            y[(size_t)i * L->n + r] = (L->act * L->scale[r]) * (float)c[(size_t)i * L->n + r];
    free(c);
    return y;
}

/* One linear's (k, n) under the shapes a session uses: prefill (m = 256),
 * decode (m = 1) and draft verification (m = 4, 8, 16). Each m is its own
 * graph, built once, found again, and every one of them runs bit-exactly
 * like the scalar reference, full and short, on the device and stolen, with
 * every kernel this CPU has. */
static void graph_shapes(uint32_t k)
{
    static const uint32_t ms[] = {256, 1, 4, 8, 16};
    enum { NM = sizeof ms / sizeof ms[0] };
    struct layer L;
    layer_init(&L, 256, k, 200);
    struct npu_gemm_b *b;
    assert_int_equal(npu_gemm_b_create(L.q, L.n, L.k, &b), 0);
    for (int kern = 0; kern < NPU_KERNEL_COUNT; kern++) {
        if (!npu_kernel_available((enum npu_kernel)kern))
            continue;
        struct npu_device_config cfg;
        npu_device_config_init(&cfg);
        cfg.kernel = kern;
        struct npu_device *d;
        struct sl_err err = {{0}};
        assert_int_equal(npu_device_create_config(&cfg, &d, &err), 0);
        const struct npu_graph *g[NM];
        for (int i = 0; i < NM; i++) {
            assert_int_equal(npu_device_graph(d, ms[i], L.k, L.n, &g[i], &err), 0);
            for (int j = 0; j < i; j++)
                assert_ptr_not_equal(g[i], g[j]);
        }
        for (int i = 0; i < NM; i++) { /* built once: found, not rebuilt */
            const struct npu_graph *again;
            assert_int_equal(npu_device_graph(d, ms[i], L.k, L.n, &again, &err), 0);
            assert_ptr_equal(again, g[i]);
            assert_ptr_equal(npu_graph_find(d, ms[i], L.k, L.n), g[i]);
        }
        struct npu_device_stats s;
        npu_device_stats(d, &s);
        assert_int_equal(s.graphs_built, NM);
        for (int i = 0; i < NM; i++) {
            struct npu_graph_info info;
            npu_graph_info(g[i], &info);
            assert_int_equal(info.desc.m, ms[i]);
            assert_int_equal(info.kernel, kern);
            fprintf(stderr, "%s graph %ux%ux%u: tiling %s, built in %.3f ms\n",
                    npu_kernel_name(info.kernel), ms[i], L.k, L.n, info.tile_name,
                    (double)info.build_ns / 1e6);
            const uint32_t rows_set[3] = {ms[i], ms[i] > 1 ? ms[i] - 1 : 1,
                                          ms[i] > 2 ? ms[i] / 2 + 1 : 1};
            for (int ri = 0; ri < 3; ri++) {
                uint32_t rows = rows_set[ri];
                float *want = scalar_ref(&L, b, rows);
                float *y1 = nan_buf((size_t)rows * L.n), *y2 = nan_buf((size_t)rows * L.n);
                struct npu_job j = job_for(g[i], &L, rows, y1);
                assert_int_equal(npu_device_run(d, &j, &err), 0);
                j.y = y2;
                assert_int_equal(npu_job_execute(&j), 0);
                assert_memory_equal(y1, want, sizeof(float) * rows * L.n);
                assert_memory_equal(y2, want, sizeof(float) * rows * L.n);
                free(want);
                free(y1);
                free(y2);
            }
        }
        npu_device_destroy(d);
    }
    npu_gemm_b_destroy(b);
    layer_fini(&L);
}

/* k not a multiple of 64 (staged), then a multiple (AMX reads the
 * activations' rows straight: whole row tiles, a partial last one staged);
 * n not a multiple of 16 */
static void test_graph_shapes(void **st)
{
    (void)st;
    graph_shapes(520);
    graph_shapes(512);
}

static void test_refusals(void **st)
{
    (void)st;
    struct npu_device *d, *other;
    struct sl_err err = {{0}};
    assert_int_equal(npu_device_create(&d), 0);
    assert_int_equal(npu_device_create(&other), 0);
    struct layer L, W;
    layer_init(&L, 16, 40, 24);
    layer_init(&W, 16, 40, 32); /* other n */
    const struct npu_graph *g, *go;
    assert_int_equal(npu_device_graph(d, 16, 40, 24, &g, &err), 0);
    assert_int_equal(npu_device_graph(other, 16, 40, 24, &go, &err), 0);
    float *y = nan_buf(16 * 32);
    struct npu_job j;
    struct npu_ticket *t = (struct npu_ticket *)1;

#define REFUSE(expr, code, word)                                                              \
    do {                                                                                      \
        err.msg[0] = 0;                                                                       \
        assert_int_equal(npu_device_submit(d, &j, &t, &err), code);                           \
        assert_null(t);                                                                       \
        assert_non_null(strstr(err.msg, word));                                               \
        assert_int_equal(npu_job_validate(&j, NULL), code == -ENOENT && j.graph ? 0 : code);  \
        (void)(expr);                                                                         \
    } while (0)

    j = job_for(NULL, &L, 16, y); /* no graph */
    REFUSE(0, -ENOENT, "graph");
    j = job_for(go, &L, 16, y); /* another device's graph */
    REFUSE(0, -ENOENT, "another device");
    j = job_for(g, &L, 16, y);
    j.a_type = NPU_DTYPE_F32; /* non-int8 operand */
    REFUSE(0, -ENOTSUP, "int8");
    j = job_for(g, &L, 16, y);
    j.w = NULL; /* missing prepared weights */
    REFUSE(0, -EINVAL, "weights");
    j = job_for(g, &W, 16, y); /* weights of the wrong shape */
    REFUSE(0, -EINVAL, "weights");
    j = job_for(g, &L, 17, y); /* more rows than the graph */
    REFUSE(0, -EINVAL, "rows");
    j = job_for(g, &L, 0, y);
    REFUSE(0, -EINVAL, "rows");
    j = job_for(g, &L, 16, y);
    j.r0 = 3; /* r1 = 0 means all: r0 must be 0 */
    REFUSE(0, -EINVAL, "range");
    j.r0 = 10, j.r1 = 10;
    REFUSE(0, -EINVAL, "range");
    j.r0 = 0, j.r1 = 25;
    REFUSE(0, -EINVAL, "range");
    j = job_for(g, &L, 16, y);
    j.ldy = 20; /* shorter than the channels */
    REFUSE(0, -EINVAL, "stride");
    j = job_for(g, &L, 16, NULL);
    REFUSE(0, -EINVAL, "output");
    j = job_for(g, &L, 16, y);
    j.xq = NULL;
    REFUSE(0, -EINVAL, "input");
    j = job_for(g, &L, 16, y);
    j.act_scale = 0;
    REFUSE(0, -EINVAL, "scale");
    j.act_scale = NAN;
    REFUSE(0, -EINVAL, "scale");
    j = job_for(g, &L, 16, y);
    j.add = 1, j.a_max = 63; /* the estimate kernels do not add */
    REFUSE(0, -EINVAL, "add");
#undef REFUSE
    j = job_for(g, &L, 16, y); /* a good job, but nothing to wait on */
    assert_int_equal(npu_device_submit(d, &j, NULL, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "ticket"));
    /* nothing was written and nothing ran */
    for (int i = 0; i < 16 * 32; i++)
        assert_true(isnan(y[i]));
    struct npu_device_stats s;
    npu_device_stats(d, &s);
    assert_int_equal(s.jobs, 0);
    assert_int_equal(s.jobs_refused, 17);
    /* the same checks on the calling thread */
    j = job_for(g, &L, 17, y);
    assert_int_equal(npu_job_execute(&j), -EINVAL);
    assert_int_equal(j.status, -EINVAL);
    assert_int_equal(npu_graph_run(g, &j, NULL, &err), -EINVAL);
    free(y);
    layer_fini(&L);
    layer_fini(&W);
    npu_device_destroy(other);
    npu_device_destroy(d);
}

/* Every kernel and tiling (forced through the configuration), with and
 * without padded rows: a submitted job, npu_graph_run and npu_job_execute
 * all equal the direct call, for full and short chunks and ranges. */
static void test_equal_direct(void **st)
{
    (void)st;
    struct layer L;
    layer_init(&L, 30, 75, 53);
    for (int kern = 0; kern < NPU_KERNEL_COUNT; kern++) {
        if (!npu_kernel_available((enum npu_kernel)kern))
            continue;
        for (int tile = -1; tile < 3; tile++)
            for (int pad = 0; pad < 2; pad++) {
                struct npu_device_config cfg;
                npu_device_config_init(&cfg);
                cfg.kernel = kern;
                cfg.tile = tile;
                cfg.pad_rows = pad;
                struct npu_device *d;
                struct sl_err err = {{0}};
                int ret = npu_device_create_config(&cfg, &d, &err);
                if (ret == -EINVAL && tile >= 0) /* the kernel has fewer tilings */
                    continue;
                assert_int_equal(ret, 0);
                const struct npu_graph *g;
                assert_int_equal(npu_device_graph(d, L.m, L.k, L.n, &g, &err), 0);
                static const uint32_t rows_set[] = {30, 29, 1, 7};
                for (int ri = 0; ri < 4; ri++) {
                    uint32_t rows = rows_set[ri];
                    uint32_t r0 = ri == 3 ? 5 : 0, r1 = ri == 3 ? 37 : 0;
                    float *want = expect(&L, rows, r0, r1 ? r1 : L.n);
                    float *y1 = nan_buf(rows * L.n), *y2 = nan_buf(rows * L.n),
                          *y3 = nan_buf(rows * L.n);
                    struct npu_job j = job_for(g, &L, rows, y1);
                    j.r0 = r0, j.r1 = r1;
                    assert_int_equal(npu_device_run(d, &j, &err), 0);
                    struct npu_job j2 = j;
                    j2.y = y2;
                    assert_int_equal(npu_graph_run(g, &j2, NULL, &err), 0);
                    assert_int_equal(j2.stolen, 1);
                    struct npu_job j3 = j;
                    j3.y = y3;
                    assert_int_equal(npu_job_execute(&j3), 0);
                    assert_true(j3.t_end >= j3.t_start);
                    /* NaN == NaN bitwise: untouched columns stay untouched */
                    assert_memory_equal(y1, want, sizeof(float) * rows * L.n);
                    assert_memory_equal(y2, want, sizeof(float) * rows * L.n);
                    assert_memory_equal(y3, want, sizeof(float) * rows * L.n);
                    free(want);
                    free(y1);
                    free(y2);
                    free(y3);
                }
                struct npu_device_stats s;
                npu_device_stats(d, &s);
                assert_int_equal(s.jobs, 4);
                assert_true(s.busy_ns > 0 && s.busy_ns <= s.uptime_ns);
                assert_int_equal(s.busy_ns + s.idle_ns, s.uptime_ns);
                uint64_t ops = 0;
                for (int ri = 0; ri < 4; ri++)
                    ops += 2ull * (pad ? L.m : rows_set[ri]) * L.k * (ri == 3 ? 32 : L.n);
                assert_int_equal(s.ops, ops);
                npu_device_destroy(d);
            }
    }
    layer_fini(&L);
}

/* A forced tiling with the default kernel: accepted only when every kernel
 * a graph may get has it (the best one, and the one for few rows, which is
 * AVX-512 VNNI where AMX is best), and then every graph, few rows or many,
 * runs with it and equals the reference; with a forced kernel, that
 * kernel's tilings. */
static void test_forced_tile(void **st)
{
    (void)st;
    const enum npu_kernel big = npu_kernel_best(), small = npu_kernel_for_rows(1);
    const int both = npu_kernel_tiles(big) < npu_kernel_tiles(small) ? npu_kernel_tiles(big)
                                                                     : npu_kernel_tiles(small);
    for (int kern = -1; kern < NPU_KERNEL_COUNT; kern++) {
        if (kern >= 0 && !npu_kernel_available((enum npu_kernel)kern))
            continue;
        const int have = kern < 0 ? both : npu_kernel_tiles((enum npu_kernel)kern);
        for (int tile = 0; tile < 4; tile++) {
            struct npu_device_config cfg;
            npu_device_config_init(&cfg);
            cfg.kernel = kern;
            cfg.tile = tile;
            struct npu_device *d;
            struct sl_err err = {{0}};
            int ret = npu_device_create_config(&cfg, &d, &err);
            if (tile >= have) {
                assert_int_equal(ret, -EINVAL);
                assert_non_null(strstr(err.msg, "register tilings"));
                continue;
            }
            assert_int_equal(ret, 0);
            static const uint32_t ms[] = {1, 40};
            for (int i = 0; i < 2; i++) {
                struct layer L;
                layer_init(&L, ms[i], 75, 53);
                const struct npu_graph *g;
                assert_int_equal(npu_device_graph(d, L.m, L.k, L.n, &g, &err), 0);
                struct npu_graph_info info;
                npu_graph_info(g, &info);
                assert_int_equal(info.tile, tile);
                assert_int_equal(info.kernel, kern >= 0 ? (enum npu_kernel)kern
                                                        : npu_kernel_for_rows(L.m));
                run_all_rows(d, g, &L);
                layer_fini(&L);
            }
            npu_device_destroy(d);
        }
    }
}

/* A kernel without a probe limit times each of its tiles tilings on a
 * 64-row graph. */
static void probe_all(int kern, int tiles)
{
    struct npu_device_config cfg;
    npu_device_config_init(&cfg);
    cfg.kernel = kern;
    struct npu_device *d;
    struct sl_err err = {{0}};
    assert_int_equal(npu_device_create_config(&cfg, &d, &err), 0);
    const struct npu_graph *g;
    assert_int_equal(npu_device_graph(d, 64, 1152, 80, &g, &err), 0);
    struct npu_graph_info info;
    npu_graph_info(g, &info);
    assert_int_equal(info.kernel, kern);
    assert_int_equal(info.tilings_timed, tiles);
    npu_device_destroy(d);
}

/* The probe rule (npu_kernel_ops.probe_max_m): with no tiling forced, every
 * graph of more rows than its kernel's probe_max_m gets tiling 0 untimed
 * (AMX: more than 16 rows), one of at most probe_max_m rows has all its
 * tilings timed; each equals the reference. A kernel without a limit
 * times all its tilings on a 64-row graph. */
static void test_probe_rule(void **st)
{
    (void)st;
    int rule_seen = 0;
    for (int kern = 0; kern < NPU_KERNEL_COUNT; kern++) {
        const struct npu_kernel_ops *ops = npu_kernel_ops((enum npu_kernel)kern);
        if (!npu_kernel_available((enum npu_kernel)kern))
            continue;
        if (ops->probe_max_m == UINT32_MAX) { /* no rule: a big graph times every tiling */
            if (ops->tiles > 1)
                probe_all(kern, ops->tiles);
            continue;
        }
        rule_seen = 1;
        struct npu_device_config cfg;
        npu_device_config_init(&cfg);
        cfg.kernel = kern;
        struct npu_device *d;
        struct sl_err err = {{0}};
        assert_int_equal(npu_device_create_config(&cfg, &d, &err), 0);
        for (int i = 0; i < 3; i++) {
            const uint32_t m = i == 0 ? ops->probe_max_m : i == 1 ? ops->probe_max_m + 1 : 64;
            struct layer L;
            layer_init(&L, m, 1152, 48 + 16 * (uint32_t)i);
            const struct npu_graph *g;
            assert_int_equal(npu_device_graph(d, L.m, L.k, L.n, &g, &err), 0);
            struct npu_graph_info info;
            npu_graph_info(g, &info);
            assert_int_equal(info.kernel, kern);
            if (m > ops->probe_max_m) {
                assert_int_equal(info.tile, 0);
                assert_int_equal(info.tilings_timed, 0);
            } else {
                assert_int_equal(info.tilings_timed, ops->tiles);
            }
            run_all_rows(d, g, &L);
            layer_fini(&L);
        }
        npu_device_destroy(d);
    }
    if (!rule_seen)
        fprintf(stderr, "note: no kernel here has a probe limit (no AMX): the limit's "
                        "part of test_probe_rule is not checked\n");
}

/* Staging keys (npu_job.stage_key): a chunk cut into channel ranges whose
 * jobs share a key gives the direct call's bits, on the device (padded rows
 * too: the zero rows overwrite the staging, which must then be redone) and
 * through npu_graph_run_cached; the staging is really reused: with the
 * activations changed under the same key, the old ones are still what is
 * computed, and a new key (or key 0) stages the new ones. Keys are fresh. */
static void test_stage_keys(void **st)
{
    (void)st;
    struct layer L;
    layer_init(&L, 30, 75, 53);
    uint64_t k1 = npu_stage_keys(3), k2 = npu_stage_keys(1);
    assert_true(k1 != 0 && k2 >= k1 + 3);
    for (int kern = 0; kern < NPU_KERNEL_COUNT; kern++) {
        if (!npu_kernel_available((enum npu_kernel)kern))
            continue;
        for (int pad = 0; pad < 2; pad++) {
            struct npu_device_config cfg;
            npu_device_config_init(&cfg);
            cfg.kernel = kern;
            cfg.pad_rows = pad;
            struct npu_device *d;
            struct sl_err err = {{0}};
            assert_int_equal(npu_device_create_config(&cfg, &d, &err), 0);
            const struct npu_graph *g;
            assert_int_equal(npu_device_graph(d, L.m, L.k, L.n, &g, &err), 0);
            struct npu_graph_info gi;
            npu_graph_info(g, &gi);
            uint8_t *scratch = malloc(gi.scratch_bytes);
            uint64_t held = 0;
            for (uint32_t rows = 30; rows >= 29; rows--) {
                float *want = expect(&L, rows, 0, L.n);
                float *y1 = nan_buf(rows * L.n), *y2 = nan_buf(rows * L.n);
                /* three ranges (inside 16-channel blocks) under one key */
                static const uint32_t cut[4] = {0, 5, 37, 53};
                for (int q = 0; q < 3; q++) {
                    struct npu_job j = job_for(g, &L, rows, y1);
                    j.r0 = cut[q], j.r1 = cut[q + 1], j.stage_key = k1 + (30 - rows);
                    assert_int_equal(npu_device_run(d, &j, &err), 0);
                    j.y = y2;
                    assert_int_equal(npu_graph_run_cached(g, &j, scratch, &held, &err), 0);
                    /* a short job on a padded graph: the zero rows went over it */
                    assert_int_equal(held, pad && rows < L.m ? 0 : j.stage_key);
                }
                assert_memory_equal(y1, want, sizeof(float) * rows * L.n);
                assert_memory_equal(y2, want, sizeof(float) * rows * L.n);
                free(want);
                free(y1);
                free(y2);
            }
            /* the activations change under the last key: the cached run still
             * computes the old ones (reused; padded: staged again, the new
             * ones), a new key the new ones */
            int8_t *old = malloc((size_t)L.m * L.k);
            memcpy(old, L.xq, (size_t)L.m * L.k);
            for (size_t i = 0; i < (size_t)L.m * L.k; i++)
                L.xq[i] = (int8_t)(-L.xq[i]);
            float *want_new = expect(&L, 29, 0, L.n);
            memcpy(L.xq, old, (size_t)L.m * L.k);
            float *want_old = expect(&L, 29, 0, L.n);
            for (size_t i = 0; i < (size_t)L.m * L.k; i++)
                L.xq[i] = (int8_t)(-L.xq[i]);
            float *y = nan_buf(29 * L.n);
            struct npu_job j = job_for(g, &L, 29, y);
            j.stage_key = k1 + 1;
            assert_int_equal(npu_graph_run_cached(g, &j, scratch, &held, &err), 0);
            assert_memory_equal(y, pad ? want_new : want_old, sizeof(float) * 29 * L.n);
            j.stage_key = k2;
            assert_int_equal(npu_graph_run_cached(g, &j, scratch, &held, &err), 0);
            assert_memory_equal(y, want_new, sizeof(float) * 29 * L.n);
            j.stage_key = 0; /* no key: always staged, nothing held */
            memcpy(L.xq, old, (size_t)L.m * L.k);
            assert_int_equal(npu_graph_run_cached(g, &j, scratch, &held, &err), 0);
            assert_memory_equal(y, want_old, sizeof(float) * 29 * L.n);
            assert_int_equal(held, 0);
            /* the device's own staging last held k1 + 1 (29 rows; padded:
             * nothing) */
            for (size_t i = 0; i < (size_t)L.m * L.k; i++)
                L.xq[i] = (int8_t)(-L.xq[i]);
            j.stage_key = k1 + 1;
            assert_int_equal(npu_device_run(d, &j, &err), 0);
            assert_memory_equal(y, pad ? want_new : want_old, sizeof(float) * 29 * L.n);
            memcpy(L.xq, old, (size_t)L.m * L.k);
            /* refusals */
            assert_int_equal(npu_graph_run_cached(g, &j, NULL, &held, &err), -EINVAL);
            assert_int_equal(npu_graph_run_cached(g, &j, scratch, NULL, &err), -EINVAL);
            free(y);
            free(want_new);
            free(want_old);
            free(old);
            free(scratch);
            npu_device_destroy(d);
        }
    }
    layer_fini(&L);
}

/* The session's way to use the device: submit, compute something else on
 * the calling thread, then wait. Several threads at once, each with its own
 * jobs; every result equals the direct call. */
struct submitter {
    struct npu_device *d;
    const struct npu_graph *g;
    const struct layer *L;
    const float *want;
    int ok;
};

static void *submit_main(void *arg)
{
    struct submitter *s = arg;
    const struct layer *L = s->L;
    float *y = nan_buf((size_t)L->m * L->n), *mine = nan_buf((size_t)L->m * L->n);
    s->ok = 1;
    for (int round = 0; round < 10; round++) {
        struct sl_err err = {{0}};
        struct npu_job j = job_for(s->g, L, L->m, y);
        j.r1 = L->n / 2; /* the device takes half the channels ... */
        struct npu_ticket *t;
        if (npu_device_submit(s->d, &j, &t, &err) != 0) {
            s->ok = 0;
            break;
        }
        /* ... while this thread computes the other half */
        npu_linear_s8_range(L->w, L->xq, L->m, L->act, mine, L->n, L->n / 2, L->n);
        if (npu_ticket_wait(t) != 0)
            s->ok = 0;
        for (uint32_t i = 0; i < L->m; i++)
            memcpy(mine + (size_t)i * L->n, y + (size_t)i * L->n, sizeof(float) * L->n / 2);
        if (memcmp(mine, s->want, sizeof(float) * L->m * L->n) != 0)
            s->ok = 0;
    }
    free(y);
    free(mine);
    return NULL;
}

static void test_submit_overlap(void **st)
{
    (void)st;
    struct layer L;
    layer_init(&L, 8, 320, 160);
    struct npu_device *d;
    struct sl_err err = {{0}};
    assert_int_equal(npu_device_create(&d), 0);
    const struct npu_graph *g;
    assert_int_equal(npu_device_graph(d, L.m, L.k, L.n, &g, &err), 0);
    float *want = expect(&L, L.m, 0, L.n);
    enum { T = 3 };
    struct submitter s[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        s[i] = (struct submitter){.d = d, .g = g, .L = &L, .want = want};
        assert_int_equal(pthread_create(&th[i], NULL, submit_main, &s[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_true(s[i].ok);
    }
    struct npu_device_stats stt;
    npu_device_stats(d, &stt);
    assert_int_equal(stt.jobs, T * 10);
    assert_int_equal(stt.ops, 2ull * T * 10 * L.m * L.k * (L.n / 2));
    free(want);
    npu_device_destroy(d);
    layer_fini(&L);
}

/* Pull mode: the scheduler's source hands out jobs (one refused), then
 * NULL. A job submitted while the worker waits inside the source runs right
 * after the pulled job the source returns next, before the source is asked
 * again (npu.h: submitted jobs run between pulled ones). */
struct source {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct npu_job jobs[12];
    int next, done, refused, go, waiting;
    const float *sub_y, *sub_want; /* the submitted job's output and its value */
    size_t sub_bytes;
    int sub_seen_at;               /* the next index when the source first saw it done */
};

static struct npu_job *src_next(void *ctx)
{
    struct source *s = ctx;
    pthread_mutex_lock(&s->mu);
    /* the worker's thread wrote sub_y, if it ran it: no race here */
    if (s->sub_y && s->sub_seen_at < 0 && memcmp(s->sub_y, s->sub_want, s->sub_bytes) == 0)
        s->sub_seen_at = s->next;
    s->waiting = 1;
    pthread_cond_broadcast(&s->cv);
    while (!s->go) /* blocks like a scheduler's empty queue until released */
        pthread_cond_wait(&s->cv, &s->mu);
    struct npu_job *j = s->next < 12 ? &s->jobs[s->next++] : NULL;
    pthread_mutex_unlock(&s->mu);
    return j;
}

static void src_done(void *ctx, struct npu_job *j)
{
    struct source *s = ctx;
    pthread_mutex_lock(&s->mu);
    s->done++;
    if (j->status < 0)
        s->refused++;
    pthread_mutex_unlock(&s->mu);
}

static void test_pull(void **st)
{
    (void)st;
    struct layer L;
    layer_init(&L, 20, 64, 48);
    struct npu_device *d;
    struct sl_err err = {{0}};
    assert_int_equal(npu_device_create(&d), 0);
    const struct npu_graph *g;
    assert_int_equal(npu_device_graph(d, 20, 64, 48, &g, &err), 0);
    struct source s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    float *ys[12];
    for (int i = 0; i < 12; i++) {
        ys[i] = nan_buf(20 * 48);
        s.jobs[i] = job_for(g, &L, 20 - (uint32_t)i, ys[i]);
    }
    s.jobs[5].a_type = NPU_DTYPE_F16; /* refused, reported through done */
    float *want_sub = expect(&L, 20, 0, 48), *y_sub = nan_buf(20 * 48);
    s.sub_y = y_sub;
    s.sub_want = want_sub;
    s.sub_bytes = sizeof(float) * 20 * 48;
    s.sub_seen_at = -1;
    assert_int_equal(npu_device_start(d, src_next, src_done, &s), 0);
    assert_int_equal(npu_device_start(d, src_next, src_done, &s), -EBUSY);
    /* the worker is inside next(), waiting: submit beside it */
    pthread_mutex_lock(&s.mu);
    while (!s.waiting)
        pthread_cond_wait(&s.cv, &s.mu);
    pthread_mutex_unlock(&s.mu);
    struct npu_job js = job_for(g, &L, 20, y_sub);
    struct npu_ticket *t;
    assert_int_equal(npu_device_submit(d, &js, &t, &err), 0);
    pthread_mutex_lock(&s.mu);
    s.go = 1;
    pthread_cond_broadcast(&s.cv);
    pthread_mutex_unlock(&s.mu);
    assert_int_equal(npu_ticket_wait(t), 0);
    npu_device_join(d);
    assert_int_equal(s.sub_seen_at, 1); /* after pulled job 0, before job 1 was asked for */
    assert_memory_equal(y_sub, want_sub, s.sub_bytes);
    assert_int_equal(npu_device_start(d, src_next, src_done, &s), 0); /* ends at once */
    npu_device_join(d);
    assert_int_equal(s.done, 12);
    assert_int_equal(s.refused, 1);
    assert_int_equal(s.jobs[5].status, -ENOTSUP);
    for (int i = 0; i < 12; i++) {
        if (i == 5)
            continue;
        assert_int_equal(s.jobs[i].status, 0);
        assert_int_equal(s.jobs[i].stolen, 0);
        float *want = expect(&L, 20 - (uint32_t)i, 0, 48);
        assert_memory_equal(ys[i], want, sizeof(float) * (20 - i) * 48);
        free(want);
    }
    /* submitting still works after the pull mode ended */
    float *y = nan_buf(20 * 48);
    struct npu_job j = job_for(g, &L, 20, y);
    assert_int_equal(npu_device_run(d, &j, &err), 0);
    assert_memory_equal(y, ys[0], sizeof(float) * 20 * 48);
    struct npu_device_stats stt;
    npu_device_stats(d, &stt);
    assert_int_equal(stt.jobs, 11 + 2);
    assert_int_equal(stt.jobs_refused, 1);
    free(y);
    free(y_sub);
    free(want_sub);
    for (int i = 0; i < 12; i++)
        free(ys[i]);
    npu_device_destroy(d);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    layer_fini(&L);
}

/* Stopping with jobs pending: no hang, each job completed exactly once (run
 * or cancelled), in the order submitted (the ones that ran first), every
 * ticket wakes, nothing leaks (ASan). */
static void test_stop_pending(void **st)
{
    (void)st;
    struct layer L;
    layer_init(&L, 32, 512, 256);
    float *want = expect(&L, 32, 0, 256);
    for (int round = 0; round < 4; round++) {
        struct npu_device *d;
        struct sl_err err = {{0}};
        assert_int_equal(npu_device_create(&d), 0);
        const struct npu_graph *g;
        assert_int_equal(npu_device_graph(d, 32, 512, 256, &g, &err), 0);
        enum { N = 30 };
        float *ys[N];
        struct npu_ticket *t[N];
        for (int i = 0; i < N; i++) {
            ys[i] = nan_buf(32 * 256);
            struct npu_job j = job_for(g, &L, 32, ys[i]);
            assert_int_equal(npu_device_submit(d, &j, &t[i], &err), 0);
        }
        if (round % 2) /* wait for one first: the rest may still be queued */
            assert_int_equal(npu_ticket_wait(t[0]), 0);
        npu_device_destroy(d); /* right away: most jobs are still queued */
        int ok = round % 2, cancelled = 0;
        for (int i = round % 2; i < N; i++) {
            int s = npu_ticket_wait(t[i]);
            assert_true(s == 0 || s == -ECANCELED);
            if (s == 0) {
                assert_int_equal(cancelled, 0); /* run in order: no run after a cancel */
                ok++;
            } else {
                cancelled++;
            }
        }
        assert_int_equal(ok + cancelled, N);
        for (int i = 0; i < N; i++) {
            if (i < ok)
                assert_memory_equal(ys[i], want, sizeof(float) * 32 * 256);
            else
                assert_true(isnan(ys[i][0]));
            free(ys[i]);
        }
    }
    /* a device that never ran anything, and one destroyed while idle */
    struct npu_device *d;
    assert_int_equal(npu_device_create(&d), 0);
    npu_device_destroy(d);
    npu_device_destroy(NULL);
    free(want);
    layer_fini(&L);
}

/* npu_ticket_revoke: a call still queued (behind a call that holds the
 * thread until released) is taken out and never runs, the calls around it
 * still run in order; a call already run gives its status back. */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, entered;
};

static int gate_hold(void *arg)
{
    struct gate *g = arg;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    return 0;
}

static int count_call(void *arg)
{
    (*(int *)arg)++;
    return 7;
}

static void test_revoke(void **st)
{
    (void)st;
    struct npu_device *d;
    struct sl_err err = {{0}};
    assert_int_equal(npu_device_create(&d), 0);
    struct gate g = {.open = 0};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    int runs[3] = {0};
    struct npu_ticket *hold, *t[3];
    assert_int_equal(npu_device_call(d, gate_hold, &g, &hold, &err), 0);
    pthread_mutex_lock(&g.mu); /* the thread is inside gate_hold: the rest stay queued */
    while (!g.entered)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    for (int i = 0; i < 3; i++)
        assert_int_equal(npu_device_call(d, count_call, &runs[i], &t[i], &err), 0);
    assert_int_equal(npu_ticket_revoke(d, t[2]), -ECANCELED); /* the tail */
    assert_int_equal(npu_ticket_revoke(d, t[0]), -ECANCELED); /* the head */
    pthread_mutex_lock(&g.mu);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    /* hold was taken (the thread entered it): revoking it waits for it and
     * gives its status; t[1] then runs (revoking it here would race with the
     * thread taking it) */
    assert_int_equal(npu_ticket_revoke(d, hold), 0);
    assert_int_equal(npu_ticket_wait(t[1]), 7);
    assert_int_equal(runs[0], 0);
    assert_int_equal(runs[1], 1);
    assert_int_equal(runs[2], 0);
    /* the queue still works after taking its head and tail out */
    struct npu_ticket *u;
    assert_int_equal(npu_device_call(d, count_call, &runs[2], &u, &err), 0);
    assert_int_equal(npu_ticket_wait(u), 7);
    assert_int_equal(runs[2], 1);
    struct npu_device_stats stt;
    npu_device_stats(d, &stt);
    assert_int_equal(stt.jobs_revoked, 2);
    assert_int_equal(stt.jobs, 3);
    npu_device_destroy(d);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graphs),         cmocka_unit_test(test_graph_shapes),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_equal_direct),   cmocka_unit_test(test_forced_tile),
        cmocka_unit_test(test_probe_rule),
        cmocka_unit_test(test_stage_keys),
        cmocka_unit_test(test_submit_overlap),
        cmocka_unit_test(test_pull),           cmocka_unit_test(test_stop_pending),
        cmocka_unit_test(test_revoke),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
