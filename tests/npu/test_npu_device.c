/* test_npu_device.c: the emulated NPU device (npu.h): graphs built once per
 * shape and shared, refusals (no graph, another device's graph, wrong shape,
 * non-int8 operands, missing weights, bad rows/ranges/scales), jobs through
 * the FIFO, the pull mode, stealing and npu_job_execute all bit-identical to
 * the direct npu_linear_s8_range call (every kernel and tiling, short chunks,
 * padded rows, channel ranges), and stopping with jobs pending (no hang, no
 * leak, every job completed exactly once). Run under ASan and TSan too. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
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
#undef REFUSE
    /* nothing was written and nothing ran */
    for (int i = 0; i < 16 * 32; i++)
        assert_true(isnan(y[i]));
    struct npu_device_stats s;
    npu_device_stats(d, &s);
    assert_int_equal(s.jobs, 0);
    assert_int_equal(s.jobs_refused, 15);
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
 * without padded rows: device FIFO, npu_graph_run, npu_job_execute and
 * stealing all equal the direct call, for full and short chunks and ranges. */
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

struct counter {
    pthread_mutex_t mu;
    int calls, ok, cancelled, other;
};

static void count_done(struct npu_job *j)
{
    struct counter *c = j->user;
    pthread_mutex_lock(&c->mu);
    c->calls++;
    if (j->status == 0)
        c->ok++;
    else if (j->status == -ECANCELED)
        c->cancelled++;
    else
        c->other++;
    pthread_mutex_unlock(&c->mu);
}

struct stealer {
    struct npu_device *d;
    int stolen;
};

static void *steal_main(void *arg)
{
    struct stealer *s = arg;
    int r;
    while ((r = npu_device_steal(s->d)) == 1)
        s->stolen++;
    return NULL;
}

/* Holds the worker inside a job's callback until released. */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, open;
};

static void gate_done(struct npu_job *j)
{
    struct gate *g = j->user;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* Many jobs queued at once while the worker is held: the calling thread
 * steals some (deterministically), then a second thread steals while the
 * released worker drains the rest; every output equals the direct call. */
static void test_queue_steal(void **st)
{
    (void)st;
    struct layer L;
    layer_init(&L, 24, 512, 96);
    struct npu_device *d;
    struct sl_err err = {{0}};
    assert_int_equal(npu_device_create(&d), 0);
    const struct npu_graph *g;
    assert_int_equal(npu_device_graph(d, 24, 512, 96, &g, &err), 0);
    enum { N = 40 };
    float *want = expect(&L, 24, 0, 96);
    float *y0 = nan_buf(24 * 96), *ys[N];
    struct gate gt = {.entered = 0};
    pthread_mutex_init(&gt.mu, NULL);
    pthread_cond_init(&gt.cv, NULL);
    struct npu_job j0 = job_for(g, &L, 24, y0);
    j0.done = gate_done;
    j0.user = &gt;
    assert_int_equal(npu_device_submit(d, &j0, NULL, &err), 0);
    pthread_mutex_lock(&gt.mu);
    while (!gt.entered)
        pthread_cond_wait(&gt.cv, &gt.mu);
    pthread_mutex_unlock(&gt.mu);

    struct npu_ticket *t[N];
    struct counter c = {.calls = 0};
    pthread_mutex_init(&c.mu, NULL);
    for (int i = 0; i < N; i++) {
        ys[i] = nan_buf(24 * 96);
        struct npu_job j = job_for(g, &L, 24, ys[i]);
        j.done = count_done;
        j.user = &c;
        assert_int_equal(npu_device_submit(d, &j, i % 2 ? &t[i] : NULL, &err), 0);
        if (i % 2 == 0)
            t[i] = NULL;
    }
    assert_int_equal(npu_device_queued(d), N);
    for (int i = 0; i < 10; i++) /* the oldest first: jobs 0..9 */
        assert_int_equal(npu_device_steal(d), 1);
    assert_int_equal(npu_device_queued(d), N - 10);
    assert_int_equal(c.calls, 10);
    for (int i = 0; i < 10; i++)
        assert_memory_equal(ys[i], want, sizeof(float) * 24 * 96);
    assert_true(isnan(ys[10][0]));

    struct stealer s = {d, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, steal_main, &s), 0);
    pthread_mutex_lock(&gt.mu);
    gt.open = 1;
    pthread_cond_broadcast(&gt.cv);
    pthread_mutex_unlock(&gt.mu);
    for (int i = 0; i < N; i++)
        if (t[i])
            assert_int_equal(npu_ticket_wait(t[i]), 0);
    npu_device_drain(d);
    pthread_join(th, NULL);
    assert_int_equal(npu_device_queued(d), 0);
    assert_int_equal(npu_device_steal(d), 0);
    assert_int_equal(c.calls, N);
    assert_int_equal(c.ok, N);
    assert_memory_equal(y0, want, sizeof(float) * 24 * 96);
    for (int i = 0; i < N; i++) {
        assert_memory_equal(ys[i], want, sizeof(float) * 24 * 96);
        free(ys[i]);
    }
    struct npu_device_stats stt;
    npu_device_stats(d, &stt);
    assert_int_equal(stt.jobs + stt.jobs_stolen, N + 1);
    assert_int_equal(stt.jobs_stolen, 10 + s.stolen);
    assert_int_equal(stt.max_queued, N);
    fprintf(stderr, "queue: %d jobs, %d stolen by the second thread, device busy %.1f%% of %.1f ms\n",
            N, s.stolen, 100.0 * (double)stt.busy_ns / (double)stt.uptime_ns,
            (double)stt.uptime_ns / 1e6);
    free(want);
    free(y0);
    npu_device_destroy(d);
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&gt.cv);
    pthread_mutex_destroy(&gt.mu);
    layer_fini(&L);
}

/* xq_tag: pieces of one matmul split by channels reuse the staged input on
 * the device (shown by a deliberately stale tag), a new tag or other rows
 * restage, padded rows invalidate; results equal the direct call. */
static void test_tag_reuse(void **st)
{
    (void)st;
    struct layer L;
    layer_init(&L, 40, 300, 100);
    int8_t *xq_old = malloc(40 * 300);
    memcpy(xq_old, L.xq, 40 * 300);
    for (int pad = 0; pad < 2; pad++) {
        struct npu_device_config cfg;
        npu_device_config_init(&cfg);
        cfg.pad_rows = pad;
        struct npu_device *d;
        struct sl_err err = {{0}};
        assert_int_equal(npu_device_create_config(&cfg, &d, &err), 0);
        const struct npu_graph *g;
        assert_int_equal(npu_device_graph(d, 40, 300, 100, &g, &err), 0);
        memcpy(L.xq, xq_old, 40 * 300);
        float *want = expect(&L, 40, 0, 100), *y = nan_buf(40 * 100);
        static const uint32_t cuts[4] = {0, 30, 64, 100};
        for (int piece = 0; piece < 3; piece++) {
            struct npu_job j = job_for(g, &L, 40, y);
            j.r0 = cuts[piece], j.r1 = cuts[piece + 1];
            j.xq_tag = 7;
            assert_int_equal(npu_device_run(d, &j, &err), 0);
        }
        assert_memory_equal(y, want, sizeof(float) * 40 * 100);
        /* new contents under the same tag: the staged copy is reused (the
         * caller broke the contract; this shows the reuse happens) */
        for (size_t i = 0; i < 40 * 300; i++)
            L.xq[i] = (int8_t)(-L.xq[i]);
        float *y2 = nan_buf(40 * 100);
        struct npu_job j = job_for(g, &L, 40, y2);
        j.xq_tag = 7;
        assert_int_equal(npu_device_run(d, &j, &err), 0);
        assert_memory_equal(y2, want, sizeof(float) * 40 * 100);
        /* a new tag restages */
        float *want2 = expect(&L, 40, 0, 100);
        j.xq_tag = 8;
        assert_int_equal(npu_device_run(d, &j, &err), 0);
        assert_memory_equal(y2, want2, sizeof(float) * 40 * 100);
        /* other rows restage too; with pad_rows the padding wipes the stage */
        float *want3 = expect(&L, 33, 0, 100), *y3 = nan_buf(33 * 100);
        j = job_for(g, &L, 33, y3);
        j.xq_tag = 8;
        assert_int_equal(npu_device_run(d, &j, &err), 0);
        assert_memory_equal(y3, want3, sizeof(float) * 33 * 100);
        assert_int_equal(npu_device_run(d, &j, &err), 0);
        assert_memory_equal(y3, want3, sizeof(float) * 33 * 100);
        /* stealing and npu_job_execute never use the device's stage */
        j.xq_tag = 7;
        assert_int_equal(npu_job_execute(&j), 0);
        assert_memory_equal(y3, want3, sizeof(float) * 33 * 100);
        free(want), free(want2), free(want3), free(y), free(y2), free(y3);
        npu_device_destroy(d);
    }
    free(xq_old);
    layer_fini(&L);
}

/* Pull mode: the scheduler's source hands out jobs (one refused), then NULL. */
struct source {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct npu_job jobs[12];
    int next, done, refused, go;
};

static struct npu_job *src_next(void *ctx)
{
    struct source *s = ctx;
    pthread_mutex_lock(&s->mu);
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
    assert_int_equal(npu_device_start(d, src_next, src_done, &s), 0);
    assert_int_equal(npu_device_start(d, src_next, src_done, &s), -EBUSY);
    pthread_mutex_lock(&s.mu);
    s.go = 1;
    pthread_cond_broadcast(&s.cv);
    pthread_mutex_unlock(&s.mu);
    npu_device_join(d);
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
    /* the FIFO still works after the pull mode ended */
    float *y = nan_buf(20 * 48);
    struct npu_job j = job_for(g, &L, 20, y);
    assert_int_equal(npu_device_run(d, &j, &err), 0);
    assert_memory_equal(y, ys[0], sizeof(float) * 20 * 48);
    free(y);
    for (int i = 0; i < 12; i++)
        free(ys[i]);
    npu_device_destroy(d);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    layer_fini(&L);
}

/* Stopping with jobs pending: no hang, each job completed exactly once (run
 * or cancelled), every ticket wakes, nothing leaks (ASan). */
static void test_stop_pending(void **st)
{
    (void)st;
    struct layer L;
    layer_init(&L, 32, 512, 256);
    for (int round = 0; round < 4; round++) {
        struct npu_device *d;
        struct sl_err err = {{0}};
        assert_int_equal(npu_device_create(&d), 0);
        const struct npu_graph *g;
        assert_int_equal(npu_device_graph(d, 32, 512, 256, &g, &err), 0);
        enum { N = 30 };
        float *ys[N];
        struct npu_ticket *t[N];
        struct counter c = {.calls = 0};
        pthread_mutex_init(&c.mu, NULL);
        for (int i = 0; i < N; i++) {
            ys[i] = nan_buf(32 * 256);
            struct npu_job j = job_for(g, &L, 32, ys[i]);
            j.done = count_done;
            j.user = &c;
            assert_int_equal(npu_device_submit(d, &j, round % 2 ? &t[i] : NULL, &err), 0);
        }
        npu_device_destroy(d); /* right away: most jobs are still queued */
        int ok = 0, cancelled = 0;
        if (round % 2)
            for (int i = 0; i < N; i++) {
                int s = npu_ticket_wait(t[i]);
                assert_true(s == 0 || s == -ECANCELED);
                ok += s == 0, cancelled += s == -ECANCELED;
            }
        assert_int_equal(c.calls, N);
        assert_int_equal(c.other, 0);
        assert_int_equal(c.ok + c.cancelled, N);
        if (round % 2) {
            assert_int_equal(ok, c.ok);
            assert_int_equal(cancelled, c.cancelled);
        }
        for (int i = 0; i < N; i++)
            free(ys[i]);
        pthread_mutex_destroy(&c.mu);
    }
    /* a device that never ran anything, and one destroyed while idle */
    struct npu_device *d;
    assert_int_equal(npu_device_create(&d), 0);
    npu_device_destroy(d);
    npu_device_destroy(NULL);
    layer_fini(&L);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graphs),       cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_equal_direct), cmocka_unit_test(test_queue_steal),
        cmocka_unit_test(test_tag_reuse),    cmocka_unit_test(test_pull),
        cmocka_unit_test(test_stop_pending),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
