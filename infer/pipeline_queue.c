/* pipeline_queue.c: the ready queues and what moves tasks through them. A
 * task whose last dependency finishes joins its device's queue; executors
 * take the best under the policy (full: position-guided keys; sequential and
 * layer_overlap: first come first served; llmnpu: llm.npu 3.4's
 * contribution). The stealing rules decide what an idle CPU worker takes
 * from the NPU's queue (EdgeFlow 4.3, with our steal-ahead, split and tail
 * rules: see pipeline.c). Everything here runs with p->lock held. Calls
 * pipeline_graph.c (a matmul's linear, cutting a task) and the loader
 * (releasing a slice). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"

int pl_queue_init(struct pl *p)
{
    /* a task is in at most one queue at a time, and the task array does not
     * grow after pl_graph_reserve: a push never needs more */
    p->npu_q.items = sl_malloc(sizeof(uint32_t) * (p->cap_tasks ? p->cap_tasks : 1));
    p->cpu_q.items = sl_malloc(sizeof(uint32_t) * (p->cap_tasks ? p->cap_tasks : 1));
    if (!p->npu_q.items || !p->cpu_q.items) {
        pl_queue_fini(p);
        return -ENOMEM;
    }
    p->npu_q.cap = p->cpu_q.cap = p->cap_tasks;
    return 0;
}

void pl_queue_fini(struct pl *p)
{
    free(p->npu_q.items);
    free(p->cpu_q.items);
    memset(&p->npu_q, 0, sizeof p->npu_q);
    memset(&p->cpu_q, 0, sizeof p->cpu_q);
}

/* -ENOSPC only where the sizing of pl_queue_init was wrong. */
static int qpush(struct queue *q, uint32_t t)
{
    if (q->n == q->cap)
        return -ENOSPC;
    q->items[q->n++] = t;
    return 0;
}

/* qpush, failing the run where it cannot. */
static int push(struct pl *p, struct queue *q, uint32_t ti)
{
    int ret = qpush(q, ti);
    if (ret < 0) {
        char msg[96];
        snprintf(msg, sizeof msg, "a ready queue is full (%u of %u tasks)", q->n, q->cap);
        pl_fail(p, ret, msg);
    }
    return ret;
}

/* llm.npu 3.4: the contribution of running a ready task: the estimated time
 * of the NPU tasks its completion makes ready; positive for CPU tasks (more
 * NPU work unlocked is better), negative for NPU tasks. */
static double contribution(const struct pl *p, uint32_t ti)
{
    const struct task *t = &p->tasks[ti];
    double s = 0;
    for (uint32_t e = 0; e < t->n_succ; e++) {
        const struct task *u = &p->tasks[p->edges[t->succ_off + e]];
        if (u->deps == 1 && u->dev == PL_DEV_NPU)
            s += u->est;
    }
    return t->dev == PL_DEV_CPU ? s : -s;
}

/* Index of the task to run next in q under the policy (lock held). */
static uint32_t qbest(const struct pl *p, const struct queue *q)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < q->n; i++) {
        const struct task *a = &p->tasks[q->items[i]], *b = &p->tasks[q->items[best]];
        int better;
        switch (p->o->policy) {
        case INFER_POLICY_LAYER_OVERLAP:
        case INFER_POLICY_SEQUENTIAL:
            better = a->ready_seq < b->ready_seq;
            break;
        case INFER_POLICY_LLMNPU: {
            double ca = contribution(p, q->items[i]), cb = contribution(p, q->items[best]);
            better = ca > cb || (ca == cb && a->ready_seq < b->ready_seq);
            break;
        }
        default:
            better = a->key < b->key;
        }
        if (better)
            best = i;
    }
    return best;
}

/* Index of the task the policy would run last (full: the largest key). */
static uint32_t qlast(const struct pl *p, const struct queue *q)
{
    uint32_t last = 0;
    for (uint32_t i = 1; i < q->n; i++)
        if (p->tasks[q->items[i]].key > p->tasks[q->items[last]].key)
            last = i;
    return last;
}

static uint32_t qtake(struct queue *q, uint32_t i)
{
    uint32_t t = q->items[i];
    q->items[i] = q->items[--q->n];
    return t;
}

uint32_t pl_queue_pop(const struct pl *p, struct queue *q)
{
    return qtake(q, qbest(p, q));
}

/* A CPU worker's next task (lock held). Under full's keys (the granular
 * policies), while the NPU has nothing queued and the best-keyed ready task
 * is an attention piece, the best-keyed ready task
 * whose completion makes an NPU task ready (contribution > 0: the next
 * (layer, chunk)'s norm before Q/K/V, the last attention piece before O, the
 * last SwiGLU piece before the down projection) goes ahead of better-keyed
 * ones that make none ready: the position-guided keys put a whole layer's
 * attention (tens of ms of a CPU worker for a late chunk) before the next
 * layer's first norm, and the NPU would wait for all of it although a 1 ms
 * norm gives it Q/K/V to compute meanwhile. Otherwise pl_queue_pop. */
uint32_t pl_queue_pop_cpu(struct pl *p)
{
    struct queue *q = &p->cpu_q;
    /* only ahead of attention (the pattern measured): elsewhere, e.g. the
     * load phase's verification and unpacking, the keys' order is kept (with
     * the rule applied to every task, a 128-token prompt lost 9 of 9 cold
     * starts in two runs and won in others: docs/BENCHMARKS.md, issue 22,
     * ninth session) */
    uint32_t b = qbest(p, q);
    if (pl_granular(p->o->policy) && !p->npu_q.n && q->n && p->tasks[q->items[b]].op == PL_ATTN) {
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < q->n; i++)
            if ((best == UINT32_MAX || p->tasks[q->items[i]].key < p->tasks[q->items[best]].key) &&
                contribution(p, q->items[i]) > 0)
                best = i;
        if (best != UINT32_MAX)
            b = best;
    }
    return qtake(q, b);
}

/* Keeps the stall clock (lock held): the pipeline is stalled while no task
 * runs and none is ready, which in a cold start means every unit waits for
 * the disk. Bubbles are idle time outside such stalls: a unit waiting for the
 * other one (or for a dependency) while there was work in the pipeline. */
void pl_stall_update(struct pl *p)
{
    int stalled = !p->running && !p->npu_q.n && !p->cpu_q.n && !p->done;
    if (stalled && !p->stall_t0) {
        p->stall_t0 = sl_now_ns();
    } else if (!stalled && p->stall_t0) {
        p->stall_ns += sl_now_ns() - p->stall_t0;
        p->stall_t0 = 0;
    }
}

int pl_make_ready(struct pl *p, uint32_t ti)
{
    struct task *t = &p->tasks[ti];
    t->ready_seq = p->ready_counter++;
    t->t_ready = sl_now_ns();
    const struct infer_linear *lin = t->op == PL_MM ? pl_graph_linear(p, t->layer, t->role) : NULL;
    /* float weights cannot go to the NPU (int8 graphs only): CPU */
    if (t->op == PL_MM && lin && !lin->npu)
        t->dev = PL_DEV_CPU;
    if (t->op == PL_VERIFY && t->slice == UINT32_MAX) { /* the sequential barrier */
        t->dev = PL_DEV_CPU;
    }
    if (pl_acts_waits(p, ti)) /* a norm whose (layer, chunk) has no activation set yet */
        return 0;
    if (pl_pool_waits(p, t)) { /* its int8 storage is not admitted yet */
        p->parked[p->n_parked++] = ti;
        return 0;
    }
    int ret = push(p, t->dev == PL_DEV_NPU ? &p->npu_q : &p->cpu_q, ti);
    if (ret < 0)
        return ret;
    pl_stall_update(p);
    pthread_cond_broadcast(&p->cv);
    return 0;
}

void pl_fail(struct pl *p, int e, const char *msg)
{
    if (!p->error) {
        p->error = e;
        snprintf(p->err.msg, sizeof p->err.msg, "%s", msg);
    }
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_cond_broadcast(&p->pf_cv);
}

/* The loader's ring space of a slice whose unpacking is all done. */
static void release_slice(struct pl *p, uint32_t s)
{
    if (p->ls && p->slice_sl[s].data)
        loader_stream_release(p->ls, &p->slice_sl[s]);
}

/* Packed residency (lock held): the last matmul of `layer` is done, so its
 * linears' int8 copies go to the reclaim thread (their packed bytes stay
 * for decoding). A linear without packed bytes (q8, float) keeps its own. */
static void drop_layer(struct pl *p, int layer)
{
    static const uint8_t roles[] = {FORMAT_ROLE_WQ, FORMAT_ROLE_WK, FORMAT_ROLE_WV,
                                    FORMAT_ROLE_WO, FORMAT_ROLE_W_GATE, FORMAT_ROLE_W_UP,
                                    FORMAT_ROLE_W_DOWN};
    for (size_t i = 0; i < (layer < 0 ? 1 : sizeof roles); i++) {
        struct infer_linear *lin =
            pl_graph_linear(p, layer, layer < 0 ? FORMAT_ROLE_CLASSIFIER : roles[i]);
        if (lin && lin->upk && lin->npu && p->n_drop < p->cap_drop) {
            p->drop[p->n_drop++] = lin->npu;
            lin->npu = NULL;
        }
    }
    if (p->rel_layer && layer >= 0 && p->n_rel < p->c->n_layers + 1)
        p->rel_layer[p->n_rel++] = (uint32_t)layer + 1;
    pthread_cond_signal(&p->drop_cv);
}

/* Task ti finished (lock held): successors, slice release, completion. */
int pl_complete(struct pl *p, uint32_t ti)
{
    struct task *t = &p->tasks[ti];
    for (uint32_t e = 0; e < t->n_succ; e++) {
        uint32_t u = p->edges[t->succ_off + e];
        int ret = --p->tasks[u].deps == 0 ? pl_make_ready(p, u) : 0;
        if (ret < 0)
            return ret;
    }
    if (t->op == PL_UNPACK && --p->slice_left[t->slice] == 0)
        release_slice(p, t->slice);
    if (t->op == PL_MM && pl_pool_mm_done(p, t)) {
        /* storage back in the pool: the next linears may come in, and their
         * parked unpacking tasks with them */
        int ret = pl_pool_admit(p);
        if (ret < 0) {
            pl_fail(p, ret, "out of memory for the int8 weights of the prefill");
            return ret;
        }
        for (uint32_t i = 0; i < p->n_parked;) {
            uint32_t u = p->parked[i];
            if (pl_pool_waits(p, &p->tasks[u])) {
                i++;
                continue;
            }
            p->parked[i] = p->parked[--p->n_parked];
            if ((ret = pl_make_ready(p, u)) < 0)
                return ret;
        }
    }
    if (pl_acts_done(p, t)) { /* its activation set is free: the next (layer, chunk)s */
        uint32_t u;
        while ((u = pl_acts_unpark(p)) != UINT32_MAX) {
            int ret = pl_make_ready(p, u);
            if (ret < 0)
                return ret;
        }
    }
    if (t->op == PL_MM && p->mm_left && --p->mm_left[t->layer + 1] == 0)
        drop_layer(p, t->layer);
    if (--p->remaining == 0) {
        p->done = 1;
        p->t_logits = sl_now_ns();
        pthread_cond_broadcast(&p->cv);
        pthread_cond_broadcast(&p->pf_cv);
    }
    return 0;
}

/* ---- stealing: the rules are pure functions of the queue state and the
 * time, so that a test can drive them on a synthetic queue ---------------- */

void pl_npu_ahead(const struct pl *p, uint32_t last, uint64_t now_ns, double *ahead, double *own)
{
    double pace = p->npu_est_s > 0 ? p->npu_actual_s / p->npu_est_s : 1.0;
    double a = 0;
    for (uint32_t i = 0; i < p->npu_q.n; i++)
        if (i != last)
            a += p->tasks[p->npu_q.items[i]].est;
    a *= pace;
    if (p->npu_running != UINT32_MAX) {
        const struct task *r = &p->tasks[p->npu_running];
        double left = r->est * pace - (double)(now_ns - r->t0) / 1e9;
        a += left > 0 ? left : 0;
    }
    *ahead = a;
    *own = p->tasks[p->npu_q.items[last]].est * pace;
}

/* Split stealing: the NPU's last queued matmul (at queue index `last`)
 * outlasts the rest of the NPU's work, so taking it whole would leave the
 * NPU waiting for the CPU, and leaving it whole leaves the CPU idle while
 * the NPU works through it. Cut its output channels instead (on 16-channel
 * blocks, both parts at least 32): the NPU keeps the first part in its
 * queue, and the CPU gets the rest, sized so both finish together ((ahead +
 * own) / 2 of work each, at the NPU's pace). The whole task where the NPU's
 * part would be under 32 channels; nothing where the CPU's would be. */
static struct pl_steal steal_split(const struct pl *p, uint32_t last, double ahead, double own)
{
    const struct task *t = &p->tasks[p->npu_q.items[last]];
    uint32_t rows = t->r1 - t->r0;
    if (t->op != PL_MM || own <= 0)
        return (struct pl_steal){PL_STEAL_NONE, 0, 0};
    double share = (ahead + own) / (2 * own); /* of the task, for the CPU */
    /* over 1 where steal_ahead > 1 asked for more margin than the NPU's
     * other work gives, though it outlasts the task: all of it (the cut
     * would be larger than the task) */
    uint32_t cpu_rows = share >= 1 ? rows : (uint32_t)(share * rows) & ~15u;
    if (cpu_rows < 32)
        return (struct pl_steal){PL_STEAL_NONE, 0, 0};
    /* the NPU's part would be under 32 channels: the NPU's other work is
     * nearly as long as the task, so take it whole (the NPU then waits at
     * most those few channels' time) rather than leave the CPU idle */
    if (rows - cpu_rows < 32)
        return (struct pl_steal){PL_STEAL_WHOLE, last, 0};
    return (struct pl_steal){PL_STEAL_CUT, last, cpu_rows};
}

uint64_t pl_npu_late_at(const struct pl *p)
{
    if (!p->npu_q.n || p->npu_running != UINT32_MAX || !(p->o->steal_ahead > 0))
        return 0;
    uint64_t t = p->tasks[p->npu_q.items[qbest(p, &p->npu_q)]].t_ready;
    return (t > p->npu_idle_t0 ? t : p->npu_idle_t0) + PL_NPU_LATE_NS;
}

/* The NPU late (pl_npu_late_at): its best queued task, whole. Then, with
 * more than steal_threshold queued, the last in priority order (the
 * top with steal_top); otherwise under steal_ahead the last when the NPU's
 * other work outlasts it (the CPU finishes it before the NPU would have
 * started it), or a cut of it (steal_split) when it does not. */
struct pl_steal pl_steal_decide(const struct pl *p, uint64_t now_ns)
{
    const struct pl_steal none = {PL_STEAL_NONE, 0, 0};
    if (!p->npu_q.n)
        return none;
    uint64_t late = pl_npu_late_at(p);
    if (late && now_ns >= late)
        return (struct pl_steal){PL_STEAL_WHOLE, qbest(p, &p->npu_q), 0};
    if (p->npu_q.n > p->o->steal_threshold)
        return (struct pl_steal){PL_STEAL_WHOLE,
                                 p->o->steal_top ? qbest(p, &p->npu_q) : qlast(p, &p->npu_q), 0};
    if (!(p->o->steal_ahead > 0))
        return none;
    uint32_t last = qlast(p, &p->npu_q);
    double ahead, own;
    pl_npu_ahead(p, last, now_ns, &ahead, &own);
    if (ahead >= own * p->o->steal_ahead)
        return (struct pl_steal){PL_STEAL_WHOLE, last, 0};
    return p->o->no_steal_split ? none : steal_split(p, last, ahead, own);
}

uint32_t pl_steal(struct pl *p, uint64_t now_ns)
{
    struct pl_steal s = pl_steal_decide(p, now_ns);
    uint32_t ci;
    uint64_t late = pl_npu_late_at(p);
    switch (s.how) {
    case PL_STEAL_WHOLE:
        p->npu_late += late && now_ns >= late;
        return qtake(&p->npu_q, s.at);
    case PL_STEAL_CUT: /* the NPU's part stays queued, the new task is the CPU's */
        ci = pl_graph_cut(p, p->npu_q.items[s.at], s.rows);
        p->splits += ci != UINT32_MAX;
        return ci;
    default:
        return UINT32_MAX;
    }
}

/* Keeping a stealable tail (the NPU dispatching matmul `ti`): when it is
 * the NPU's last queued task and the CPU has nothing queued, the CPU goes
 * idle while the NPU works through the whole piece, and a running job cannot
 * be cut. Its second half goes back into the NPU's queue instead: a CPU
 * worker that turns idle meanwhile steals it (whole, or cut again so both
 * finish together); otherwise the NPU runs it next, at the cost of one more
 * dispatch (and of staging its activations once more). Only with cutting on
 * and pieces of 64 channels or more. */
uint32_t pl_tail_rows(const struct pl *p, uint32_t ti)
{
    const struct task *t = &p->tasks[ti];
    uint32_t rows = t->r1 - t->r0;
    if (p->npu_q.n || p->cpu_q.n || t->op != PL_MM || rows < 64 || p->o->no_steal_split ||
        !(p->o->steal_ahead > 0))
        return 0;
    return (rows / 2) & ~15u;
}

int pl_keep_tail(struct pl *p, uint32_t ti)
{
    uint32_t tail = pl_tail_rows(p, ti);
    uint32_t ci = tail ? pl_graph_cut(p, ti, tail) : UINT32_MAX;
    if (ci == UINT32_MAX)
        return 0;
    int ret = push(p, &p->npu_q, ci);
    if (ret < 0)
        return ret;
    p->tails++;
    pthread_cond_broadcast(&p->cv);
    return 0;
}
