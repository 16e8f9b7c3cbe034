/* npu_device.c: the emulated NPU: a worker thread that executes validated
 * static-graph jobs (npu.h). Graphs are built once per shape and shared. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "npu.h"
#include "npu_gemm.h"

#define MAX_GRAPHS 64

struct npu_device {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    struct npu_graph *graphs[MAX_GRAPHS];
    uint32_t n_graphs;
    uint64_t build_ns;

    pthread_t thread;
    int running;
    npu_source_fn next;
    npu_done_fn done;
    void *ctx;

    /* the device's own FIFO (npu_device_run) */
    struct npu_job *fifo[64];
    uint32_t fifo_head, fifo_n;
    int stop;

    uint64_t jobs, busy_ns, start_ns;
};

int npu_device_create(struct npu_device **out)
{
    struct npu_device *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->cv, NULL);
    *out = d;
    return 0;
}

/* Builds a graph: picks the kernel, allocates the staging accumulators and
 * touches them, and runs the shape once on zero data so the kernel's code
 * and tiles are warm (what a real NPU's graph compilation and first
 * dispatch cost; here it is real work, measured). */
static int build_graph(uint32_t m, uint32_t k, uint32_t n, struct npu_graph **out)
{
    struct npu_graph *g = calloc(1, sizeof *g);
    if (!g)
        return -ENOMEM;
    uint64_t t0 = sl_now_ns();
    g->m = m;
    g->k = k;
    g->n = n;
    g->kernel = npu_kernel_best();
    g->staging = sl_alloc_aligned(sizeof(int32_t) * (size_t)m * n, 64);
    int8_t *a = calloc((size_t)m, k);
    int8_t *b = calloc(16, k);
    struct npu_gemm_b *pb = NULL;
    int ret = g->staging && a && b ? npu_gemm_b_create(b, 16, k, &pb) : -ENOMEM;
    if (ret == 0) {
        memset(g->staging, 0, sizeof(int32_t) * (size_t)m * n);
        npu_gemm_s8_kernel((enum npu_kernel)g->kernel, pb, a, m, 0, 16, g->staging, n < 16 ? 16 : n);
    }
    npu_gemm_b_destroy(pb);
    free(a);
    free(b);
    if (ret < 0) {
        sl_free_aligned(g->staging);
        free(g);
        return ret;
    }
    g->build_ns = sl_now_ns() - t0;
    *out = g;
    return 0;
}

int npu_device_graph(struct npu_device *d, uint32_t m, uint32_t k, uint32_t n,
                     const struct npu_graph **out, struct sl_err *err)
{
    if (!m || !k || !n || m > 65536 || k > (1u << 20) || n > (1u << 24)) {
        sl_err_set(err, "npu: no graph can have shape %u x %u x %u", m, k, n);
        return -EINVAL;
    }
    pthread_mutex_lock(&d->lock);
    for (uint32_t i = 0; i < d->n_graphs; i++) {
        struct npu_graph *g = d->graphs[i];
        if (g->m == m && g->k == k && g->n == n) {
            *out = g;
            pthread_mutex_unlock(&d->lock);
            return 0;
        }
    }
    if (d->n_graphs == MAX_GRAPHS) {
        pthread_mutex_unlock(&d->lock);
        sl_err_set(err, "npu: graph memory full (%d graphs)", MAX_GRAPHS);
        return -ENOSPC;
    }
    struct npu_graph *g;
    int ret = build_graph(m, k, n, &g);
    if (ret == 0) {
        d->graphs[d->n_graphs++] = g;
        d->build_ns += g->build_ns;
        *out = g;
    } else {
        sl_err_set(err, "npu: cannot build a %u x %u x %u graph: out of memory", m, k, n);
    }
    pthread_mutex_unlock(&d->lock);
    return ret;
}

int npu_job_validate(const struct npu_job *j, struct sl_err *err)
{
    const struct npu_graph *g = j->graph;
    if (!g) {
        sl_err_set(err, "npu: refused: the job has no prebuilt graph");
        return -EINVAL;
    }
    if (!j->w || !j->xq || !j->y) {
        sl_err_set(err, "npu: refused: the job lacks int8 weights, int8 input or an output");
        return -EINVAL;
    }
    if (npu_weights_cols(j->w) != g->k || npu_weights_rows(j->w) != g->n) {
        sl_err_set(err, "npu: refused: weights %u x %u do not match the graph's %u x %u",
                   npu_weights_rows(j->w), npu_weights_cols(j->w), g->n, g->k);
        return -EINVAL;
    }
    if (j->rows == 0 || j->rows > g->m) {
        sl_err_set(err, "npu: refused: %u rows for a graph of %u", j->rows, g->m);
        return -EINVAL;
    }
    if (j->r0 >= j->r1 || j->r1 > g->n) {
        sl_err_set(err, "npu: refused: output range [%u, %u) outside [0, %u)", j->r0, j->r1, g->n);
        return -EINVAL;
    }
    if (!(j->act_scale > 0)) {
        sl_err_set(err, "npu: refused: activation scale %g (static per-tensor scales only)",
                   (double)j->act_scale);
        return -EINVAL;
    }
    return 0;
}

int npu_job_execute(struct npu_job *j)
{
    int ret = npu_job_validate(j, NULL);
    j->t_start = sl_now_ns();
    if (ret == 0)
        npu_linear_s8_range(j->w, j->xq, j->rows, j->act_scale, j->y, j->ldy, j->r0, j->r1);
    j->t_end = sl_now_ns();
    j->status = ret;
    return ret;
}

static void *worker(void *arg)
{
    struct npu_device *d = arg;
    for (;;) {
        struct npu_job *j = d->next(d->ctx);
        if (!j)
            break;
        npu_job_execute(j);
        j->stolen = 0;
        pthread_mutex_lock(&d->lock);
        d->jobs++;
        d->busy_ns += j->t_end - j->t_start;
        pthread_mutex_unlock(&d->lock);
        d->done(d->ctx, j);
    }
    return NULL;
}

int npu_device_start(struct npu_device *d, npu_source_fn next, npu_done_fn done, void *ctx)
{
    if (d->running)
        return -EBUSY;
    d->next = next;
    d->done = done;
    d->ctx = ctx;
    d->start_ns = sl_now_ns();
    if (pthread_create(&d->thread, NULL, worker, d) != 0)
        return -EAGAIN;
    d->running = 1;
    return 0;
}

void npu_device_join(struct npu_device *d)
{
    if (d->running) {
        pthread_join(d->thread, NULL);
        d->running = 0;
    }
}

/* ---- the device's own FIFO ------------------------------------------------------- */

static struct npu_job *fifo_next(void *ctx)
{
    struct npu_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    while (!d->fifo_n && !d->stop)
        pthread_cond_wait(&d->cv, &d->lock);
    struct npu_job *j = NULL;
    if (d->fifo_n) {
        j = d->fifo[d->fifo_head];
        d->fifo_head = (d->fifo_head + 1) % 64;
        d->fifo_n--;
    }
    pthread_mutex_unlock(&d->lock);
    return j;
}

static void fifo_done(void *ctx, struct npu_job *j)
{
    struct npu_device *d = ctx;
    pthread_mutex_lock(&d->lock);
    j->user = (void *)1; /* completion flag for npu_device_run */
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->lock);
}

int npu_device_run(struct npu_device *d, struct npu_job *j, struct sl_err *err)
{
    int ret = npu_job_validate(j, err);
    if (ret < 0)
        return ret;
    if (!d->running && (ret = npu_device_start(d, fifo_next, fifo_done, d)) < 0) {
        sl_err_set(err, "npu: cannot start the device thread");
        return ret;
    }
    if (d->next != fifo_next) {
        sl_err_set(err, "npu: the device is attached to a scheduler");
        return -EBUSY;
    }
    pthread_mutex_lock(&d->lock);
    while (d->fifo_n == 64)
        pthread_cond_wait(&d->cv, &d->lock);
    j->user = NULL;
    d->fifo[(d->fifo_head + d->fifo_n) % 64] = j;
    d->fifo_n++;
    pthread_cond_broadcast(&d->cv);
    while (!j->user)
        pthread_cond_wait(&d->cv, &d->lock);
    pthread_mutex_unlock(&d->lock);
    return j->status;
}

void npu_device_stats(const struct npu_device *d, struct npu_device_stats *o)
{
    struct npu_device *m = (struct npu_device *)d;
    pthread_mutex_lock(&m->lock);
    o->jobs = d->jobs;
    o->graphs_built = d->n_graphs;
    o->build_ns = d->build_ns;
    o->busy_ns = d->busy_ns;
    o->start_ns = d->start_ns;
    pthread_mutex_unlock(&m->lock);
}

void npu_device_destroy(struct npu_device *d)
{
    if (!d)
        return;
    if (d->running && d->next == fifo_next) {
        pthread_mutex_lock(&d->lock);
        d->stop = 1;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->lock);
    }
    npu_device_join(d);
    for (uint32_t i = 0; i < d->n_graphs; i++) {
        sl_free_aligned(d->graphs[i]->staging);
        free(d->graphs[i]);
    }
    pthread_mutex_destroy(&d->lock);
    pthread_cond_destroy(&d->cv);
    free(d);
}
