/* test_pipeline_feed.c: what a CPU worker takes next (pl_queue_pop_cpu) on
 * a synthetic graph, deterministically. With the NPU's queue empty, under
 * full and sequential_granular, and an attention piece next by key, the
 * best-keyed ready CPU task whose completion makes an NPU task ready (its
 * last dependency) goes first, ahead of better-keyed tasks that make none
 * ready; with any other task next by key, the keys' order; a successor with other
 * unfinished dependencies, or a CPU successor, does not count. With NPU work
 * queued, or under the FIFO policies, the queue's own order (best key, or
 * first ready). Each pop takes the task out of the queue. */
#include <stdlib.h>

#include "pipeline.h"
#include "testutil.h"

struct fixture {
    struct infer_pipeline_opts o;
    struct pl *p;
    uint32_t cpu_items[16], npu_items[16], edges[16];
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    if (!f || !(f->p = calloc(1, sizeof *f->p)) ||
        !(f->p->tasks = calloc(16, sizeof *f->p->tasks)))
        return -1;
    f->o = (struct infer_pipeline_opts){.policy = INFER_POLICY_FULL};
    f->p->o = &f->o;
    f->p->cap_tasks = 16;
    f->p->npu_running = UINT32_MAX;
    f->p->cpu_q = (struct queue){.items = f->cpu_items, .cap = 16};
    f->p->npu_q = (struct queue){.items = f->npu_items, .cap = 16};
    f->p->edges = f->edges;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    free(f->p->tasks);
    free(f->p);
    free(f);
    return 0;
}

/* A task on dev with this key, `deps` unfinished dependencies and the n
 * successors succ[] (their edges appended to p->edges); queued on its
 * device where `queued`. Its index. */
static uint32_t task(struct pl *p, uint8_t op, uint8_t dev, uint64_t key, int deps,
                     const uint32_t *succ, uint32_t n, int queued)
{
    uint32_t ti = p->n_tasks++;
    p->tasks[ti] = (struct task){.op = op, .dev = dev, .key = key, .deps = deps, .est = 1e-3,
                                 .succ_off = p->n_edges, .n_succ = n, .executor = -1,
                                 .ready_seq = ti};
    for (uint32_t e = 0; e < n; e++)
        p->edges[p->n_edges++] = succ[e];
    if (queued) {
        struct queue *q = dev == PL_DEV_NPU ? &p->npu_q : &p->cpu_q;
        q->items[q->n++] = ti;
    }
    return ti;
}

/* Graph: 0 wq matmul (NPU, waits on 3 only), 1 wo matmul (NPU, waits on 3
 * and 4), 2 swiglu (CPU, not queued); queued CPU tasks: 3 attention piece
 * (key 10, feeds 1 which still waits on 4), 4 attention piece (key 11, its
 * completion would make 1 ready only after 3), 5 norm (key 20, feeds 0), 6
 * ffn norm (key 25, feeds the CPU task 2). Then 0 waits on 5 alone. */
static void build(struct pl *p)
{
    p->n_tasks = p->n_edges = 0;
    p->cpu_q.n = p->npu_q.n = 0;
    task(p, PL_MM, PL_DEV_NPU, 30, 1, NULL, 0, 0);           /* 0 */
    task(p, PL_MM, PL_DEV_NPU, 31, 2, NULL, 0, 0);           /* 1 */
    task(p, PL_SWIGLU, PL_DEV_CPU, 32, 1, NULL, 0, 0);       /* 2 */
    task(p, PL_ATTN, PL_DEV_CPU, 10, 0, (uint32_t[]){1}, 1, 1); /* 3 */
    task(p, PL_ATTN, PL_DEV_CPU, 11, 0, (uint32_t[]){1}, 1, 1); /* 4 */
    task(p, PL_NORM, PL_DEV_CPU, 20, 0, (uint32_t[]){0}, 1, 1); /* 5 */
    task(p, PL_FFN_NORM, PL_DEV_CPU, 25, 0, (uint32_t[]){2}, 1, 1); /* 6 */
}

static void test_feeds_idle_npu(void **state)
{
    struct fixture *f = *state;
    struct pl *p = f->p;
    static const enum infer_policy pols[] = {INFER_POLICY_FULL,
                                             INFER_POLICY_SEQUENTIAL_GRANULAR};
    for (size_t k = 0; k < sizeof pols / sizeof pols[0]; k++) {
        f->o.policy = pols[k];
        build(p);
        /* attention next by key: the norm, the only task whose completion
         * makes NPU work ready, goes ahead of it */
        assert_int_equal(pl_queue_pop_cpu(p), 5);
        assert_int_equal(p->cpu_q.n, 3);
        /* the NPU's queue still empty, none left feeds it: the best key */
        assert_int_equal(pl_queue_pop_cpu(p), 3);
        /* 3 done: now 4 is wo's last dependency, ahead of a better-keyed
         * attention piece that feeds nothing */
        p->tasks[1].deps = 1;
        task(p, PL_ATTN, PL_DEV_CPU, 2, 0, NULL, 0, 1); /* 7 */
        assert_int_equal(pl_queue_pop_cpu(p), 4);
        assert_int_equal(pl_queue_pop_cpu(p), 7);
        assert_int_equal(pl_queue_pop_cpu(p), 6);
        assert_int_equal(p->cpu_q.n, 0);
        /* the best key not attention (a verification, an unpacking, a
         * norm): the keys' order, feeding or not */
        build(p);
        task(p, PL_UNPACK, PL_DEV_CPU, 1, 0, NULL, 0, 1); /* 7: the best key */
        assert_int_equal(pl_queue_pop_cpu(p), 7);
        assert_int_equal(pl_queue_pop_cpu(p), 5);
    }
}

static void test_npu_busy_keeps_keys(void **state)
{
    struct fixture *f = *state;
    struct pl *p = f->p;
    f->o.policy = INFER_POLICY_FULL;
    build(p);
    task(p, PL_MM, PL_DEV_NPU, 40, 0, NULL, 0, 1); /* NPU work queued */
    assert_int_equal(pl_queue_pop_cpu(p), 3);
    assert_int_equal(pl_queue_pop_cpu(p), 4);
    assert_int_equal(pl_queue_pop_cpu(p), 5);
    assert_int_equal(pl_queue_pop_cpu(p), 6);
    /* FIFO policies: first ready, NPU queue or not */
    static const enum infer_policy fifo[] = {INFER_POLICY_SEQUENTIAL,
                                             INFER_POLICY_LAYER_OVERLAP};
    for (size_t k = 0; k < sizeof fifo / sizeof fifo[0]; k++) {
        f->o.policy = fifo[k];
        build(p);
        assert_int_equal(pl_queue_pop_cpu(p), 3);
        assert_int_equal(pl_queue_pop_cpu(p), 4);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_feeds_idle_npu),
        cmocka_unit_test(test_npu_busy_keeps_keys),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
