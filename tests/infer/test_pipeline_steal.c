/* test_pipeline_steal.c: the pipeline's stealing rules on a synthetic NPU
 * queue with an injected clock, deterministically: the count threshold
 * (EdgeFlow 4.3: the last task, or the top with steal_top), steal-ahead
 * (the NPU's other work, scaled by its pace, including what is left of its
 * running task at the given time, outlasts the task), split stealing (a cut
 * sized so both finish together, on 16-channel blocks, both parts at least
 * 32 channels), the kept tail and the late rule. Then the rules applied: the task taken
 * out of the queue, or a cut made as a new task with the right channels. */
#include <math.h>
#include <stdlib.h>

#include "pipeline.h"
#include "testutil.h"

#define NS 1000000000ull

struct fixture {
    struct infer_pipeline_opts o;
    struct pl *p;
    uint32_t items[64];
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    if (!f || !(f->p = calloc(1, sizeof *f->p)) ||
        !(f->p->tasks = calloc(64, sizeof *f->p->tasks)))
        return -1;
    f->o = (struct infer_pipeline_opts){.policy = INFER_POLICY_FULL,
                                        .steal_threshold = UINT32_MAX, .steal_ahead = 1.0};
    f->p->o = &f->o;
    pthread_mutex_init(&f->p->lock, NULL);
    pthread_cond_init(&f->p->cv, NULL);
    pthread_cond_init(&f->p->pf_cv, NULL);
    f->p->cap_tasks = 64;
    f->p->npu_running = UINT32_MAX;
    f->p->npu_q = (struct queue){.items = f->items, .cap = 64};
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    pthread_mutex_destroy(&f->p->lock);
    pthread_cond_destroy(&f->p->cv);
    pthread_cond_destroy(&f->p->pf_cv);
    free(f->p->tasks);
    free(f->p);
    free(f);
    return 0;
}

/* A matmul of channels [0, rows) with priority key and estimate est
 * (seconds), queued on the NPU unless `queued` is 0. Its task index. */
static uint32_t mm(struct pl *p, uint64_t key, double est, uint32_t rows, int queued)
{
    uint32_t ti = p->n_tasks++;
    p->tasks[ti] = (struct task){.op = PL_MM, .dev = PL_DEV_NPU, .key = key, .est = est,
                                 .r1 = rows, .executor = -1};
    if (queued)
        p->npu_q.items[p->npu_q.n++] = ti;
    return ti;
}

static void expect(const struct pl *p, uint64_t now, enum pl_steal_how how, uint32_t task,
                   uint32_t rows)
{
    struct pl_steal s = pl_steal_decide(p, now);
    assert_int_equal(s.how, how);
    if (how != PL_STEAL_NONE)
        assert_int_equal(p->npu_q.items[s.at], task);
    if (how == PL_STEAL_CUT)
        assert_int_equal(s.rows, rows);
}

static void test_threshold(void **state)
{
    struct fixture *f = *state;
    struct pl *p = f->p;
    expect(p, 0, PL_STEAL_NONE, 0, 0); /* nothing queued */
    f->o.steal_threshold = 2;
    f->o.steal_ahead = 0;
    uint32_t b = mm(p, 20, 1, 256, 1), a = mm(p, 10, 1, 256, 1);
    expect(p, 0, PL_STEAL_NONE, 0, 0); /* two queued: not over the threshold */
    uint32_t c = mm(p, 30, 1, 256, 1);
    expect(p, 0, PL_STEAL_WHOLE, c, 0); /* the last in priority order */
    f->o.steal_top = 1;
    expect(p, 0, PL_STEAL_WHOLE, a, 0); /* EdgeFlow's: the top */
    (void)b;
}

static void test_ahead(void **state)
{
    struct fixture *f = *state;
    struct pl *p = f->p;
    double ahead, own;
    mm(p, 10, 1.0, 256, 1);
    uint32_t b = mm(p, 20, 1.0, 256, 1);
    pl_npu_ahead(p, 1, 0, &ahead, &own);
    assert_true(ahead == 1.0 && own == 1.0);
    expect(p, 0, PL_STEAL_WHOLE, b, 0); /* ahead == own: the CPU is in time */
    p->tasks[0].est = 0.5;              /* not in time: a cut, share 1.5 / 2 */
    expect(p, 0, PL_STEAL_CUT, b, 192);
    f->o.steal_ahead = 0.5; /* less margin asked for: in time */
    expect(p, 0, PL_STEAL_WHOLE, b, 0);
    /* more margin asked for than the NPU's other work gives, but more work
     * ahead than the task's own (share over 1): the balanced cut would be
     * the whole task and more, so the whole task */
    f->o.steal_ahead = 2.0;
    p->tasks[0].est = 1.5;
    p->tasks[b].r1 = 100;
    expect(p, 0, PL_STEAL_WHOLE, b, 0);
    p->tasks[b].r1 = 256;
    f->o.steal_ahead = 0;
    expect(p, 0, PL_STEAL_NONE, 0, 0); /* no steal-ahead, under the threshold */
}

static void test_split(void **state)
{
    struct fixture *f = *state;
    struct pl *p = f->p;
    mm(p, 10, 0.5, 256, 1);
    uint32_t b = mm(p, 20, 1.5, 256, 1);
    /* share (0.5 + 1.5) / 3 = 2/3 of 256 = 170.7: 160 on 16-channel blocks */
    expect(p, 0, PL_STEAL_CUT, b, 160);
    f->o.no_steal_split = 1;
    expect(p, 0, PL_STEAL_NONE, 0, 0);
    f->o.no_steal_split = 0;
    /* the NPU's part would be 16 channels: taken whole */
    p->tasks[0].est = 1.4; /* share 2.9 / 3 of 256 = 247: 240, leaving 16 */
    expect(p, 0, PL_STEAL_WHOLE, b, 0);
    /* the CPU's part would be 16 channels: nothing */
    p->npu_q.n = 0;
    p->n_tasks = 0;
    uint32_t c = mm(p, 20, 1.0, 48, 1); /* alone: share 1/2 of 48 = 24: 16 */
    expect(p, 0, PL_STEAL_NONE, 0, 0);
    p->tasks[c].r1 = 64; /* 32 and 32 */
    expect(p, 0, PL_STEAL_CUT, c, 32);
}

/* The NPU's running task counts with what is left of it at the injected
 * time, at the NPU's pace so far. */
static void test_clock_and_pace(void **state)
{
    struct fixture *f = *state;
    struct pl *p = f->p;
    double ahead, own;
    uint32_t r = mm(p, 5, 2.0, 256, 0);
    p->tasks[r].t0 = 1 * NS;
    p->npu_running = r;
    uint32_t b = mm(p, 20, 1.0, 256, 1);
    pl_npu_ahead(p, 0, 1 * NS + NS / 2, &ahead, &own);
    assert_true(ahead == 1.5 && own == 1.0);
    expect(p, 1 * NS + NS / 2, PL_STEAL_WHOLE, b, 0); /* 1.5 s left */
    expect(p, 2 * NS + NS / 2, PL_STEAL_CUT, b, 192); /* 0.5 s left: share 3/4 */
    expect(p, 9 * NS, PL_STEAL_CUT, b, 128);          /* overdue: nothing left, half */
    /* pace 2 (the NPU took twice its estimates): 2 s left of 4 at 3 s */
    p->npu_actual_s = 2.0;
    p->npu_est_s = 1.0;
    pl_npu_ahead(p, 0, 3 * NS, &ahead, &own);
    assert_true(ahead == 2.0 && own == 2.0);
    expect(p, 3 * NS, PL_STEAL_WHOLE, b, 0);
    expect(p, 4 * NS, PL_STEAL_CUT, b, 192); /* 1 s left of 2 s own: share 3/4 */
}

static void test_tail(void **state)
{
    struct fixture *f = *state;
    struct pl *p = f->p;
    uint32_t t = mm(p, 10, 1.0, 256, 0); /* dispatched: out of the queue */
    assert_int_equal(pl_tail_rows(p, t), 128);
    p->tasks[t].r1 = 100; /* 50 on 16-channel blocks: 48 */
    assert_int_equal(pl_tail_rows(p, t), 48);
    p->tasks[t].r1 = 48; /* under 64 channels: no tail */
    assert_int_equal(pl_tail_rows(p, t), 0);
    p->tasks[t].r1 = 256;
    f->o.no_steal_split = 1;
    assert_int_equal(pl_tail_rows(p, t), 0);
    f->o.no_steal_split = 0;
    f->o.steal_ahead = 0;
    assert_int_equal(pl_tail_rows(p, t), 0);
    f->o.steal_ahead = 1.0;
    mm(p, 20, 1.0, 256, 1); /* other NPU work queued: no tail */
    assert_int_equal(pl_tail_rows(p, t), 0);
    p->npu_q.n = 0;
    uint32_t cpu_item = 0;
    p->cpu_q = (struct queue){.items = &cpu_item, .n = 1, .cap = 1}; /* CPU work queued */
    assert_int_equal(pl_tail_rows(p, t), 0);
    p->cpu_q.n = 0;
    /* applied: the second half becomes a queued task */
    assert_int_equal(pl_keep_tail(p, t), 0);
    assert_int_equal(p->tails, 1);
    assert_int_equal(p->npu_q.n, 1);
    const struct task *c = &p->tasks[p->npu_q.items[0]];
    assert_int_equal(p->tasks[t].r1, 128);
    assert_int_equal(c->r0, 128);
    assert_int_equal(c->r1, 256);
    assert_int_equal(p->remaining, 1);
}

/* pl_steal applies the decision: a whole task leaves the queue; a cut
 * leaves the NPU's part queued and returns a new task with the CPU's
 * channels, its estimate in proportion; no cut once the reserve is spent. */
static void test_apply(void **state)
{
    struct fixture *f = *state;
    struct pl *p = f->p;
    mm(p, 10, 0.5, 256, 1);
    uint32_t b = mm(p, 20, 1.5, 256, 1);
    uint32_t ci = pl_steal(p, 0);
    assert_int_equal(ci, 2);
    assert_int_equal(p->splits, 1);
    assert_int_equal(p->npu_q.n, 2); /* the NPU's part stays */
    assert_int_equal(p->tasks[b].r1, 96);
    assert_int_equal(p->tasks[ci].r0, 96);
    assert_int_equal(p->tasks[ci].r1, 256);
    assert_true(fabs(p->tasks[ci].est - 1.5 * 160 / 256) < 1e-12);
    assert_true(fabs(p->tasks[b].est + p->tasks[ci].est - 1.5) < 1e-12);
    assert_true(p->tasks[ci].key > p->tasks[b].key);
    p->cap_tasks = p->n_tasks; /* the reserve is spent */
    p->tasks[0].est = 0.25;   /* the NPU's part of b, 0.5625 s, ahead 0.25: a cut */
    assert_int_equal(pl_steal(p, 0), UINT32_MAX);
    assert_int_equal(p->splits, 1);
    p->tasks[0].est = 1.0; /* ahead 1.0 >= 0.5625: b whole */
    assert_int_equal(pl_steal(p, 0), b);
    assert_int_equal(p->npu_q.n, 1);
    assert_int_equal(p->npu_q.items[0], 0);
}

/* The late rule: nothing runs on the NPU and its best queued task has
 * waited PL_NPU_LATE_NS since it turned ready and since the NPU last
 * finished: the CPU takes that task whole, even a piece too small to cut;
 * not before, not while the NPU runs, not without steal-ahead. */
static void test_late(void **state)
{
    struct fixture *f = *state;
    struct pl *p = f->p;
    const uint64_t L = PL_NPU_LATE_NS;
    uint32_t a = mm(p, 20, 1.0, 32, 1);
    p->tasks[a].t_ready = 1 * NS;
    assert_int_equal(pl_npu_late_at(p), 1 * NS + L);
    expect(p, 1 * NS + L - 1, PL_STEAL_NONE, 0, 0); /* alone, 32 channels: no cut */
    expect(p, 1 * NS + L, PL_STEAL_WHOLE, a, 0);
    /* the NPU finished a task after a turned ready: late from then */
    p->npu_idle_t0 = 2 * NS;
    assert_int_equal(pl_npu_late_at(p), 2 * NS + L);
    expect(p, 1 * NS + L, PL_STEAL_NONE, 0, 0);
    expect(p, 2 * NS + L, PL_STEAL_WHOLE, a, 0);
    /* the best in priority order, not the last; and the rule comes first */
    uint32_t b = mm(p, 10, 1.0, 32, 1);
    p->tasks[b].t_ready = 1 * NS;
    expect(p, 2 * NS + L, PL_STEAL_WHOLE, b, 0);
    f->o.steal_threshold = 1; /* would take the last (a) */
    expect(p, 2 * NS + L, PL_STEAL_WHOLE, b, 0);
    expect(p, 2 * NS, PL_STEAL_WHOLE, a, 0);
    f->o.steal_threshold = UINT32_MAX;
    /* the NPU running: no late rule */
    uint32_t r = mm(p, 5, 10.0, 256, 0);
    p->tasks[r].t0 = 1 * NS;
    p->npu_running = r;
    assert_int_equal(pl_npu_late_at(p), 0);
    p->npu_running = UINT32_MAX;
    /* no steal-ahead (EdgeFlow's rule alone): none */
    f->o.steal_ahead = 0;
    assert_int_equal(pl_npu_late_at(p), 0);
    expect(p, 9 * NS, PL_STEAL_NONE, 0, 0);
    f->o.steal_ahead = 1.0;
    /* applied: b leaves the queue, counted */
    assert_int_equal(pl_steal(p, 2 * NS + L), b);
    assert_int_equal(p->npu_late, 1);
    assert_int_equal(p->npu_q.n, 1);
    assert_int_equal(pl_steal(p, 2 * NS + L), a);
    assert_int_equal(p->npu_late, 2);
    assert_int_equal(pl_npu_late_at(p), 0); /* queue empty */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_threshold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ahead, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clock_and_pace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tail, setup, teardown),
        cmocka_unit_test_setup_teardown(test_apply, setup, teardown),
        cmocka_unit_test_setup_teardown(test_late, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
