/* pipeline_exec.c: the executors. The emulated NPU's device thread pulls
 * its jobs from the NPU queue (pl_npu_next) and reports them done
 * (pl_npu_done); CPU workers run the CPU queue and, idle, steal from the
 * NPU's (EdgeFlow 4.3); the prefault thread faults in weight memory while a
 * worker idles. Calls pipeline_queue.c and pipeline_ops.c. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "pipeline.h"

/* The NPU device thread's next job: the best of the NPU queue, waiting for
 * one; NULL when the run is done or stopping. */
struct npu_job *pl_npu_next(void *ctx)
{
    struct pl *p = ctx;
    pthread_mutex_lock(&p->lock);
    while (!p->npu_q.n && !p->done && !p->stop)
        pthread_cond_wait(&p->cv, &p->lock);
    struct npu_job *j = NULL;
    if (p->npu_q.n && !p->stop) {
        uint32_t ti = pl_queue_pop(p, &p->npu_q);
        struct task *t = &p->tasks[ti];
        /* where keeping a tail fails, the run is stopping: dispatch nothing */
        if (!pl_granular(p->o->policy) || pl_keep_tail(p, ti) == 0) {
            pl_prepare_job(p, t);
            t->executor = 0;
            t->t0 = sl_now_ns();
            t->cpu_ns = p->o->trace_path ? pl_thread_cpu_ns() : 0;
            p->running++;
            p->npu_running = ti;
            j = &t->job;
        }
    }
    pthread_mutex_unlock(&p->lock);
    return j;
}

/* A job the NPU finished: its task completes, or the run fails. */
void pl_npu_done(void *ctx, struct npu_job *j)
{
    struct pl *p = ctx;
    struct task *t = j->user;
    if (j->status == 0)
        pl_mm_residual(p, t, j->add); /* on the device thread, before its time ends */
    uint64_t cpu1 = p->o->trace_path ? pl_thread_cpu_ns() : 0;
    pthread_mutex_lock(&p->lock);
    t->t1 = sl_now_ns();
    t->cpu_ns = t->cpu_ns && cpu1 > t->cpu_ns ? cpu1 - t->cpu_ns : 0; /* 0: a clock read failed */
    p->busy[0] += t->t1 - t->t0;
    p->running--;
    p->npu_running = UINT32_MAX;
    p->npu_idle_t0 = t->t1;
    /* workers that went idle while the NPU ran sleep without a deadline:
     * wake them so that they arm the late rule for what is still queued */
    if (p->npu_q.n && p->idle_workers)
        pthread_cond_broadcast(&p->cv);
    p->npu_actual_s += (double)(t->t1 - t->t0) / 1e9;
    p->npu_est_s += t->est;
    if (j->status < 0) {
        struct sl_err e = {{0}};
        npu_job_validate(j, &e);
        sl_err_prefix(&e, "%s of layer %d, chunk %u", format_role_name(t->role), t->layer,
                      t->chunk);
        pl_fail(p, j->status, e.msg);
    } else {
        /* on failure pl_fail has stopped the run: pl_npu_next returns NULL */
        pl_complete(p, (uint32_t)(t - p->tasks));
    }
    pl_stall_update(p);
    struct npu_weights *unmap = pl_pool_take_unmap(p);
    pthread_mutex_unlock(&p->lock);
    npu_weights_destroy(unmap);
}

/* The prefault thread (full): while a CPU worker is idle, faults in the
 * weight memory of layers whose unpacking has not begun, a 2 MiB step at a
 * time. It is a thread of its own so that a task turning ready never waits
 * for a step: in a VM a step sometimes takes milliseconds (the host backs
 * the guest's memory lazily), and the worker takes the task at once. At
 * most the step under way then overlaps the work. */
/* The reclaim thread (packed residency): frees the int8 copies of layers
 * whose matmuls are all done, at idle priority, off the workers' and the
 * NPU's way; with no_decode it also drops the page table entries of those
 * layers' mapped slices. It ends when told and no int8 copy is left. */
void *pl_reclaim_worker(void *arg)
{
    struct pl *p = arg;
    struct sched_param sp = {0};
    (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->n_drop && !p->n_rel && !p->drop_end)
            pthread_cond_wait(&p->drop_cv, &p->lock);
        if (!p->n_drop && p->n_rel) {
            int layer = (int)p->rel_layer[--p->n_rel] - 1;
            pthread_mutex_unlock(&p->lock);
            pl_map_release(p, layer);
            pthread_mutex_lock(&p->lock);
            continue;
        }
        if (!p->n_drop)
            break;
        struct npu_weights *w = p->drop[--p->n_drop];
        pthread_mutex_unlock(&p->lock);
        npu_weights_destroy(w);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

void *pl_prefault_worker(void *arg)
{
    struct pl *p = arg;
    /* the lowest priority: a worker or the NPU thread that wakes takes the
     * core from it at once (if the kernel refuses, it still only steps while
     * a worker is idle) */
    struct sched_param sp = {0};
    (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
    pthread_mutex_lock(&p->lock);
    while (!p->done && !p->stop && p->next_pf < p->n_pf) {
        if (!p->idle_workers) {
            pthread_cond_wait(&p->pf_cv, &p->lock);
            continue;
        }
        struct prefault *f = &p->pf[p->next_pf++];
        if (f->layer != PL_PF_ACTS && f->layer <= p->unpack_layer)
            continue; /* its unpacking faults it in itself */
        f->t0 = sl_now_ns();
        pthread_mutex_unlock(&p->lock);
        int r = f->w ? npu_weights_prefault(f->w, f->off, f->len)
                     : pl_prefault_region(f->addr + f->off, f->len);
        pthread_mutex_lock(&p->lock);
        f->t1 = sl_now_ns();
        p->prefault_ns += f->t1 - f->t0;
        if (r == -EINVAL)
            p->next_pf = p->n_pf; /* the kernel cannot (no MADV_POPULATE_WRITE): stop trying */
        /* another error skips this step only: a prefault is an optimization,
         * and the task that uses the memory faults it in or fails itself */
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* A CPU worker: the CPU queue first, then stolen NPU work, then idle. */
void *pl_cpu_worker(void *arg)
{
    struct pl_worker_arg *wa = arg;
    struct pl *p = wa->p;
    int id = wa->id;
    int steal_on = pl_granular(p->o->policy);
    pthread_mutex_lock(&p->lock);
    for (;;) {
        uint32_t ti = UINT32_MAX;
        while (!p->done && !p->stop) {
            if (p->cpu_q.n) {
                ti = pl_queue_pop_cpu(p);
                break;
            }
            /* EdgeFlow 4.3: an idle CPU takes an NPU task when the NPU's
             * queue is longer than the threshold (and under steal_ahead) */
            if (steal_on && (ti = pl_steal(p, sl_now_ns())) != UINT32_MAX) {
                pl_prepare_job(p, &p->tasks[ti]);
                p->stolen++;
                break;
            }
            /* nothing to run: the prefault thread may fault in weight
             * memory the unpacking will fill meanwhile */
            p->idle_workers++;
            if (p->next_pf < p->n_pf)
                pthread_cond_signal(&p->pf_cv);
            uint64_t late = steal_on ? pl_npu_late_at(p) : 0;
            if (late) { /* look again when the NPU would be late */
                /* p->cv runs on CLOCK_MONOTONIC, sl_now_ns's clock; a
                 * timeout or an early wake-up both just look again */
                struct timespec ts = {.tv_sec = (time_t)(late / 1000000000u),
                                      .tv_nsec = (long)(late % 1000000000u)};
                (void)pthread_cond_timedwait(&p->cv, &p->lock, &ts);
            } else {
                pthread_cond_wait(&p->cv, &p->lock);
            }
            p->idle_workers--;
        }
        if (ti == UINT32_MAX)
            break;
        struct task *t = &p->tasks[ti];
        t->executor = id;
        t->t0 = sl_now_ns();
        p->running++;
        if (t->op == PL_UNPACK) {
            int layer = t->layer < 0 ? (int)p->c->n_layers : t->layer;
            p->unpack_layer = layer > p->unpack_layer ? layer : p->unpack_layer;
        }
        pthread_mutex_unlock(&p->lock);
        uint64_t cpu0 = p->o->trace_path ? pl_thread_cpu_ns() : 0;
        int ret = pl_run_task(p, ti, id, p->att_scratch[id]);
        uint64_t cpu1 = p->o->trace_path ? pl_thread_cpu_ns() : 0;
        pthread_mutex_lock(&p->lock);
        t->t1 = sl_now_ns();
        t->cpu_ns = cpu0 && cpu1 > cpu0 ? cpu1 - cpu0 : 0; /* 0: a clock read failed */
        p->busy[id] += t->t1 - t->t0;
        p->running--;
        /* a failed task or completion has stopped the run (pl_fail): the
         * loop ends */
        if (ret == 0)
            pl_complete(p, ti);
        pl_stall_update(p);
        struct npu_weights *unmap = pl_pool_take_unmap(p);
        if (unmap) { /* the state is read again under the lock at the top */
            pthread_mutex_unlock(&p->lock);
            npu_weights_destroy(unmap);
            pthread_mutex_lock(&p->lock);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}
