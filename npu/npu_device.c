/* npu_device.c: the emulated NPU device (EdgeFlow 4.3): one worker thread
 * running checked jobs on prebuilt graphs, submitted ones (a FIFO of
 * tickets) first, then those a scheduler's source hands out; a registry of
 * graphs built once per shape (llm.npu 3.2); busy and idle accounting for
 * bubble rates. Contracts in npu.h.
 *
 * Locks: dev->mu guards the queue, the flags and the statistics; dev->gmu
 * guards the graph registry (held while a graph builds, so each shape is
 * built once). A ticket has its own lock so it outlives the device; the
 * waiter frees it, so nobody touches a ticket after signalling it. A pulled
 * job's done callback runs with no lock held. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "npu_internal.h"

/* How long the worker and a ticket's waiter poll before sleeping. */
#define NPU_SPIN_NS 50000u

/* One poll of a spin wait: a pause (the core's hint that this is a spin
 * loop); the clock is read once every SPIN_CLOCK_EVERY polls, not on every
 * one (a decode's waits read it millions of times a second otherwise). */
#define SPIN_CLOCK_EVERY 32u
static inline void spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Polls until *flag is nonzero (acquire) or NPU_SPIN_NS have passed. */
#define SPIN_UNTIL(flag)                                                                       \
    do {                                                                                       \
        uint64_t t0_ = sl_now_ns();                                                            \
        for (unsigned i_ = 1; !atomic_load_explicit((flag), memory_order_acquire); i_++) {     \
            spin_pause();                                                                      \
            if (i_ % SPIN_CLOCK_EVERY == 0 && sl_now_ns() - t0_ >= NPU_SPIN_NS)                \
                break;                                                                         \
        }                                                                                      \
    } while (0)

/* A submitted job: the device's copy, queued, then waited for. */
struct npu_ticket {
    struct npu_ticket *next; /* in the queue (dev->mu) */
    struct npu_job job;
    npu_call_fn fn;          /* npu_device_call: host work instead of the job, or NULL */
    void *fn_ctx;
    pthread_mutex_t mu;      /* guards done and status */
    pthread_cond_t cv;
    atomic_int done;         /* also read without mu by a spinning waiter */
    int status;
};

struct npu_device {
    struct npu_device_config cfg;
    pthread_t thread;
    int started;

    pthread_mutex_t mu;
    pthread_cond_t cv_work;  /* worker: a job arrived, a source attached, or stop */
    pthread_cond_t cv_idle;  /* join: the pull mode ended */
    struct npu_ticket *head, *tail;
    atomic_uint queued;      /* submitted jobs not yet taken (read while spinning) */
    int computing;           /* the worker is inside a computation (busy since run_start) */
    int stop;
    int pulling;             /* a job source is attached (npu_device_start) */
    npu_source_fn next;
    npu_done_fn pull_done;
    void *pull_ctx;
    uint64_t t_create, run_start;
    uint64_t busy_ns, jobs_done, jobs_cancelled, jobs_refused, jobs_revoked, ops;

    pthread_mutex_t gmu;
    struct npu_graph **graphs;
    uint32_t ngraphs;
    uint64_t graph_build_ns;
};

void npu_device_config_init(struct npu_device_config *cfg)
{
    cfg->kernel = -1;
    cfg->tile = -1;
    cfg->pad_rows = 0;
    cfg->max_graphs = 64;
}

static uint64_t job_ops(const struct npu_graph *g, const struct npu_job *job)
{
    uint64_t rows = g->pad_rows ? g->desc.m : job->rows;
    return 2 * rows * g->desc.k * (uint64_t)(npu_job_r1(g, job) - job->r0);
}

/* Completes a submitted job with status and wakes its waiter, who frees
 * the ticket: t must not be touched afterwards. */
static void ticket_complete(struct npu_ticket *t, int status)
{
    pthread_mutex_lock(&t->mu);
    t->status = status;
    atomic_store_explicit(&t->done, 1, memory_order_release);
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* Runs a job on the worker (lock not held): computation, accounting. */
static void worker_exec(struct npu_device *d, struct npu_job *job)
{
    const struct npu_graph *g = job->graph;
    pthread_mutex_lock(&d->mu);
    d->computing = 1;
    d->run_start = sl_now_ns();
    pthread_mutex_unlock(&d->mu);
    job->stolen = 0;
    /* only this thread uses g->stage: the graph's mutable part */
    npu_graph_exec(g, job, g->stage, g->held);
    uint64_t t1 = sl_now_ns(), ops = job_ops(g, job);
    pthread_mutex_lock(&d->mu);
    d->busy_ns += t1 - d->run_start;
    d->computing = 0;
    d->jobs_done++;
    d->ops += ops;
    pthread_mutex_unlock(&d->mu);
}

/* Runs a host call on the worker (lock not held), counted as busy time. */
static int worker_call(struct npu_device *d, struct npu_ticket *t)
{
    pthread_mutex_lock(&d->mu);
    d->computing = 1;
    d->run_start = sl_now_ns();
    pthread_mutex_unlock(&d->mu);
    int status = t->fn(t->fn_ctx);
    uint64_t t1 = sl_now_ns();
    pthread_mutex_lock(&d->mu);
    d->busy_ns += t1 - d->run_start;
    d->computing = 0;
    d->jobs_done++;
    pthread_mutex_unlock(&d->mu);
    return status;
}

static void *worker_main(void *arg)
{
    struct npu_device *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        if (!d->head && !d->stop && !d->pulling) {
            /* A session's decode submits the next matmul within microseconds
             * of the last one: spin briefly before sleeping, since a
             * condition-variable wake-up costs about as much as a small job. */
            pthread_mutex_unlock(&d->mu);
            SPIN_UNTIL(&d->queued);
            pthread_mutex_lock(&d->mu);
        }
        while (!d->head && !d->stop && !d->pulling)
            pthread_cond_wait(&d->cv_work, &d->mu);
        if (d->stop)
            break; /* what is still queued is cancelled by destroy */
        if (d->head) { /* submitted jobs first */
            struct npu_ticket *t = d->head;
            atomic_fetch_sub_explicit(&d->queued, 1, memory_order_relaxed);
            d->head = t->next;
            if (!d->head)
                d->tail = NULL;
            pthread_mutex_unlock(&d->mu);
            if (t->fn) {
                ticket_complete(t, worker_call(d, t));
            } else {
                worker_exec(d, &t->job);
                ticket_complete(t, 0);
            }
        } else { /* pull mode */
            npu_source_fn next = d->next;
            npu_done_fn done = d->pull_done;
            void *ctx = d->pull_ctx;
            pthread_mutex_unlock(&d->mu);
            struct npu_job *job = next(ctx);
            if (!job) {
                pthread_mutex_lock(&d->mu);
                d->pulling = 0;
                pthread_cond_broadcast(&d->cv_idle);
                continue;
            }
            job->status = npu_job_validate(job, NULL);
            if (job->status == 0 && job->graph->dev != d)
                job->status = -ENOENT;
            if (job->status == 0) {
                worker_exec(d, job);
            } else {
                pthread_mutex_lock(&d->mu);
                d->jobs_refused++;
                pthread_mutex_unlock(&d->mu);
            }
            done(ctx, job);
        }
        pthread_mutex_lock(&d->mu);
    }
    pthread_cond_broadcast(&d->cv_idle);
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

int npu_device_create(struct npu_device **out)
{
    return npu_device_create_config(NULL, out, NULL);
}

int npu_device_create_config(const struct npu_device_config *cfg, struct npu_device **out,
                             struct sl_err *err)
{
    *out = NULL;
    struct npu_device_config c;
    if (cfg)
        c = *cfg;
    else
        npu_device_config_init(&c);
    if (c.kernel >= 0 && (c.kernel >= NPU_KERNEL_COUNT ||
                          !npu_kernel_available((enum npu_kernel)c.kernel))) {
        sl_err_set(err, "npu: kernel %s is not available on this CPU",
                   npu_kernel_name((enum npu_kernel)c.kernel));
        return -EINVAL;
    }
    /* a forced tiling must exist in every kernel a graph may get: the forced
     * kernel, or else the best one and the one for few rows
     * (npu_kernel_for_rows: VNNI below NPU_AMX_MIN_ROWS where AMX is best) */
    if (c.tile >= 0) {
        const enum npu_kernel ks[2] = {
            c.kernel >= 0 ? (enum npu_kernel)c.kernel : npu_kernel_best(),
            c.kernel >= 0 ? (enum npu_kernel)c.kernel : npu_kernel_for_rows(1)};
        for (int i = 0; i < 2; i++)
            if (c.tile >= npu_kernel_tiles(ks[i])) {
                sl_err_set(err, "npu: kernel %s has %d register tilings, not %d",
                           npu_kernel_name(ks[i]), npu_kernel_tiles(ks[i]), c.tile + 1);
                return -EINVAL;
            }
    }
    if (c.max_graphs == 0)
        c.max_graphs = 64;
    struct npu_device *d = sl_calloc(1, sizeof *d);
    if (!d) {
        sl_err_set(err, "npu: out of memory for the device");
        return -ENOMEM;
    }
    d->cfg = c;
    d->graphs = sl_calloc(c.max_graphs, sizeof *d->graphs);
    if (!d->graphs) {
        free(d);
        sl_err_set(err, "npu: out of memory for the device");
        return -ENOMEM;
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->gmu, NULL);
    pthread_cond_init(&d->cv_work, NULL);
    pthread_cond_init(&d->cv_idle, NULL);
    d->t_create = sl_now_ns();
    int ret = pthread_create(&d->thread, NULL, worker_main, d);
    if (ret != 0) {
        sl_err_set(err, "npu: cannot start the device thread: %s", strerror(ret));
        npu_device_destroy(d);
        return -ret;
    }
    d->started = 1;
    *out = d;
    return 0;
}

void npu_device_destroy(struct npu_device *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    struct npu_ticket *pending = d->head;
    d->head = d->tail = NULL;
    atomic_store_explicit(&d->queued, 0, memory_order_relaxed);
    for (struct npu_ticket *t = pending; t; t = t->next)
        d->jobs_cancelled++;
    pthread_cond_broadcast(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
    if (d->started)
        pthread_join(d->thread, NULL);
    while (pending) {
        struct npu_ticket *next = pending->next;
        ticket_complete(pending, -ECANCELED);
        pending = next;
    }
    for (uint32_t i = 0; i < d->ngraphs; i++)
        npu_graph_destroy(d->graphs[i]);
    free(d->graphs);
    pthread_cond_destroy(&d->cv_idle);
    pthread_cond_destroy(&d->cv_work);
    pthread_mutex_destroy(&d->gmu);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

static int desc_equal(const struct npu_graph_desc *a, const struct npu_graph_desc *b)
{
    return a->m == b->m && a->k == b->k && a->n == b->n && a->a_type == b->a_type &&
           a->w_type == b->w_type && a->y_type == b->y_type;
}

int npu_graph_build(struct npu_device *d, const struct npu_graph_desc *desc,
                    const struct npu_graph **out, struct sl_err *err)
{
    *out = NULL;
    int ret = npu_graph_desc_check(desc, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&d->gmu);
    for (uint32_t i = 0; i < d->ngraphs; i++)
        if (desc_equal(&d->graphs[i]->desc, desc)) {
            *out = d->graphs[i];
            pthread_mutex_unlock(&d->gmu);
            return 0;
        }
    if (d->ngraphs == d->cfg.max_graphs) {
        pthread_mutex_unlock(&d->gmu);
        sl_err_set(err, "npu: no room for graph %ux%ux%u: the device holds %u graphs already",
                   desc->m, desc->k, desc->n, d->cfg.max_graphs);
        return -ENOSPC;
    }
    struct npu_graph *g;
    ret = npu_graph_create(d, &d->cfg, desc, &g, err);
    if (ret == 0) {
        d->graphs[d->ngraphs++] = g;
        *out = g;
        pthread_mutex_lock(&d->mu);
        d->graph_build_ns += g->build_ns;
        pthread_mutex_unlock(&d->mu);
    }
    pthread_mutex_unlock(&d->gmu);
    return ret;
}

int npu_device_graph(struct npu_device *d, uint32_t m, uint32_t k, uint32_t n,
                     const struct npu_graph **out, struct sl_err *err)
{
    struct npu_graph_desc desc = NPU_GRAPH_DESC_INT8(m, k, n);
    return npu_graph_build(d, &desc, out, err);
}

const struct npu_graph *npu_graph_find(struct npu_device *d, uint32_t m, uint32_t k, uint32_t n)
{
    struct npu_graph_desc want = NPU_GRAPH_DESC_INT8(m, k, n);
    const struct npu_graph *g = NULL;
    pthread_mutex_lock(&d->gmu);
    for (uint32_t i = 0; i < d->ngraphs && !g; i++)
        if (desc_equal(&d->graphs[i]->desc, &want))
            g = d->graphs[i];
    pthread_mutex_unlock(&d->gmu);
    return g;
}

static int enqueue(struct npu_device *d, struct npu_ticket *t, struct npu_ticket **ticket,
                   struct sl_err *err);

static void count_refused(struct npu_device *d)
{
    pthread_mutex_lock(&d->mu);
    d->jobs_refused++;
    pthread_mutex_unlock(&d->mu);
}

int npu_device_submit(struct npu_device *d, const struct npu_job *job,
                      struct npu_ticket **ticket, struct sl_err *err)
{
    if (!ticket) {
        sl_err_set(err, "npu: a submitted job needs a ticket to wait on");
        count_refused(d);
        return -EINVAL;
    }
    *ticket = NULL;
    int ret = npu_job_validate(job, err);
    if (ret == 0 && job->graph->dev != d) {
        sl_err_set(err, "npu: graph %ux%ux%u was built on another device, not this one",
                   job->graph->desc.m, job->graph->desc.k, job->graph->desc.n);
        ret = -ENOENT;
    }
    if (ret < 0) {
        count_refused(d);
        return ret;
    }
    struct npu_ticket *t = sl_calloc(1, sizeof *t);
    if (!t) {
        sl_err_set(err, "npu: out of memory for a job");
        return -ENOMEM;
    }
    t->job = *job;
    t->job.status = 0;
    t->job.stolen = 0;
    return enqueue(d, t, ticket, err);
}

int npu_device_call(struct npu_device *d, npu_call_fn fn, void *ctx, struct npu_ticket **ticket,
                    struct sl_err *err)
{
    if (!ticket || !fn) {
        sl_err_set(err, "npu: a call needs a function and a ticket to wait on");
        count_refused(d);
        return -EINVAL;
    }
    *ticket = NULL;
    struct npu_ticket *t = sl_calloc(1, sizeof *t);
    if (!t) {
        sl_err_set(err, "npu: out of memory for a call");
        return -ENOMEM;
    }
    t->fn = fn;
    t->fn_ctx = ctx;
    return enqueue(d, t, ticket, err);
}

/* Queues a ticket (freshly allocated, zeroed but for its work) behind the
 * submitted ones: 0, or -ESHUTDOWN (t freed). */
static int enqueue(struct npu_device *d, struct npu_ticket *t, struct npu_ticket **ticket,
                   struct sl_err *err)
{
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    pthread_mutex_lock(&d->mu);
    if (d->stop) {
        d->jobs_refused++;
        pthread_mutex_unlock(&d->mu);
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
        sl_err_set(err, "npu: the device is shutting down");
        return -ESHUTDOWN;
    }
    if (d->tail)
        d->tail->next = t;
    else
        d->head = t;
    d->tail = t;
    atomic_fetch_add_explicit(&d->queued, 1, memory_order_release);
    pthread_cond_signal(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
    *ticket = t;
    return 0;
}

int npu_ticket_wait(struct npu_ticket *t)
{
    /* the job usually ends within microseconds of the caller's own share */
    SPIN_UNTIL(&t->done);
    pthread_mutex_lock(&t->mu);
    while (!atomic_load_explicit(&t->done, memory_order_relaxed))
        pthread_cond_wait(&t->cv, &t->mu);
    int status = t->status;
    pthread_mutex_unlock(&t->mu);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
    return status;
}

int npu_ticket_revoke(struct npu_device *d, struct npu_ticket *t)
{
    pthread_mutex_lock(&d->mu);
    struct npu_ticket *prev = NULL, *q = d->head;
    while (q && q != t) {
        prev = q;
        q = q->next;
    }
    if (!q) { /* taken (or cancelled by destroy): its end is awaited */
        pthread_mutex_unlock(&d->mu);
        return npu_ticket_wait(t);
    }
    if (prev)
        prev->next = t->next;
    else
        d->head = t->next;
    if (d->tail == t)
        d->tail = prev;
    atomic_fetch_sub_explicit(&d->queued, 1, memory_order_relaxed);
    d->jobs_revoked++;
    pthread_mutex_unlock(&d->mu);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
    return -ECANCELED;
}

int npu_device_run(struct npu_device *d, const struct npu_job *job, struct sl_err *err)
{
    struct npu_ticket *t;
    int ret = npu_device_submit(d, job, &t, err);
    if (ret < 0)
        return ret;
    ret = npu_ticket_wait(t);
    if (ret < 0)
        sl_err_set(err, "npu: the job was cancelled (device stopped)");
    return ret;
}

int npu_device_start(struct npu_device *d, npu_source_fn next, npu_done_fn done, void *ctx)
{
    if (!next || !done)
        return -EINVAL;
    pthread_mutex_lock(&d->mu);
    int ret = d->stop ? -ESHUTDOWN : d->pulling ? -EBUSY : 0;
    if (ret == 0) {
        d->next = next;
        d->pull_done = done;
        d->pull_ctx = ctx;
        d->pulling = 1;
        pthread_cond_signal(&d->cv_work);
    }
    pthread_mutex_unlock(&d->mu);
    return ret;
}

void npu_device_join(struct npu_device *d)
{
    pthread_mutex_lock(&d->mu);
    while (d->pulling && !d->stop)
        pthread_cond_wait(&d->cv_idle, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

void npu_device_stats(struct npu_device *d, struct npu_device_stats *st)
{
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&d->mu);
    uint64_t now = sl_now_ns();
    st->start_ns = d->t_create;
    st->uptime_ns = now - d->t_create;
    st->busy_ns = d->busy_ns + (d->computing ? now - d->run_start : 0);
    if (st->busy_ns > st->uptime_ns)
        st->busy_ns = st->uptime_ns;
    st->idle_ns = st->uptime_ns - st->busy_ns;
    st->jobs = d->jobs_done;
    st->jobs_cancelled = d->jobs_cancelled;
    st->jobs_revoked = d->jobs_revoked;
    st->jobs_refused = d->jobs_refused;
    st->ops = d->ops;
    st->build_ns = d->graph_build_ns;
    pthread_mutex_unlock(&d->mu);
    pthread_mutex_lock(&d->gmu);
    st->graphs_built = d->ngraphs;
    pthread_mutex_unlock(&d->gmu);
}
