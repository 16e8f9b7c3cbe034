/* loader_pread.c: the fallback backend: a pool of threads doing pread, fed
 * from a queue, reporting into a completion queue. Used where io_uring cannot
 * be set up, or forced (opts.force_pread, SLUICE_LOADER=pread). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "loader_internal.h"

struct pool {
    pthread_mutex_t lock;
    pthread_cond_t work, done_cv;
    struct loader_io *queue, *queue_tail;
    struct loader_io *done;
    int stop;
    uint32_t n_threads;
    pthread_t threads[64];
};

static void *worker(void *arg)
{
    struct pool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->queue && !p->stop)
            pthread_cond_wait(&p->work, &p->lock);
        if (!p->queue && p->stop)
            break;
        struct loader_io *io = p->queue;
        p->queue = io->next;
        if (!p->queue)
            p->queue_tail = NULL;
        pthread_mutex_unlock(&p->lock);
        io->res = loader_pread_once(io->fd, io->buf, io->rlen, io->off);
        pthread_mutex_lock(&p->lock);
        io->next = p->done;
        p->done = io;
        pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

static int pool_init(struct loader_stream *s, struct sl_err *err)
{
    struct pool *p = sl_calloc(1, sizeof *p);
    if (!p) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    uint32_t n = s->opts.pread_threads < 64 ? s->opts.pread_threads : 64;
    for (uint32_t i = 0; i < n; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p) != 0)
            break;
        p->n_threads++;
    }
    if (!p->n_threads) {
        free(p);
        sl_err_set(err, "cannot start pread threads");
        return -EAGAIN;
    }
    s->be_state = p;
    return 0;
}

static int pool_submit(struct loader_stream *s, struct loader_io *io)
{
    struct pool *p = s->be_state;
    pthread_mutex_lock(&p->lock);
    io->next = NULL;
    io->fixed = 0;
    if (p->queue_tail)
        p->queue_tail->next = io;
    else
        p->queue = io;
    p->queue_tail = io;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->lock);
    return 0;
}

static int pool_wait(struct loader_stream *s, struct loader_io **done, int max)
{
    struct pool *p = s->be_state;
    pthread_mutex_lock(&p->lock);
    while (!p->done)
        pthread_cond_wait(&p->done_cv, &p->lock);
    int k = 0;
    while (p->done && k < max) {
        done[k++] = p->done;
        p->done = p->done->next;
    }
    pthread_mutex_unlock(&p->lock);
    return k;
}

static void pool_fini(struct loader_stream *s)
{
    struct pool *p = s->be_state;
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1; /* workers finish the queue, then exit */
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    for (uint32_t i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done_cv);
    free(p);
    s->be_state = NULL;
}

const struct loader_backend_ops loader_backend_pread = {
    LOADER_BACKEND_PREAD, pool_init, pool_submit, NULL, pool_wait, pool_fini,
};
