/* serve_batch.c: continuous batching: steps handed in by the generating
 * sessions, gathered and run as one forward pass by a leading caller
 * (serve_batch.h). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_batch.h"

struct entry {
    struct infer_session *s;
    const int *tokens;
    uint32_t n, done; /* rows run so far (a prompt runs in chunks) */
    int step;
    int finished, ret;
    uint64_t t_in;    /* handed in (sl_now_ns) */
    struct sl_err err;
};

struct serve_batch {
    pthread_mutex_t mu;
    pthread_cond_t cv_in;   /* a step handed in, or a session left: the gathering leader */
    pthread_cond_t cv_done; /* a step ran: those waiting on it */
    struct infer_multi *mb;
    uint32_t parallel, chunk, max_rows;
    uint32_t members;  /* sessions that joined */
    struct entry **pending;
    uint32_t n_pending;
    int leading;
    /* the leader's */
    struct infer_session_rows *rows;
    struct entry **taken;
    uint32_t *take;
    struct serve_batch_stats stats;
};

int serve_batch_create(struct infer_model *m, uint32_t parallel, uint32_t chunk,
                       double npu_share, struct serve_batch **out, struct sl_err *err)
{
    struct serve_batch *b = calloc(1, sizeof *b);
    if (!b) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    b->parallel = parallel ? parallel : 1;
    b->chunk = chunk ? chunk : 256;
    /* a whole prompt chunk always fits beside everyone else's decode row */
    b->max_rows = b->chunk + b->parallel;
    b->pending = calloc(b->parallel, sizeof *b->pending);
    b->taken = calloc(b->parallel, sizeof *b->taken);
    b->take = calloc(b->parallel, sizeof *b->take);
    b->rows = calloc(b->parallel, sizeof *b->rows);
    int ret = b->pending && b->taken && b->take && b->rows ? 0 : -ENOMEM;
    if (ret < 0) {
        sl_err_set(err, "out of memory");
        goto fail;
    }
    struct infer_multi_opts mo = {.max_rows = b->max_rows, .no_npu = !(npu_share > 0),
                                  .npu_share = npu_share};
    if ((ret = infer_multi_create(m, &mo, &b->mb, err)) < 0)
        goto fail;
    if ((ret = -pthread_mutex_init(&b->mu, NULL)) < 0) {
        sl_err_set(err, "cannot create a mutex");
        infer_multi_destroy(b->mb);
        goto fail;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    ret = -pthread_cond_init(&b->cv_in, &ca);
    if (ret == 0 && (ret = -pthread_cond_init(&b->cv_done, &ca)) < 0)
        pthread_cond_destroy(&b->cv_in);
    pthread_condattr_destroy(&ca);
    if (ret < 0) {
        sl_err_set(err, "cannot create a condition variable");
        pthread_mutex_destroy(&b->mu);
        infer_multi_destroy(b->mb);
        goto fail;
    }
    *out = b;
    return 0;
fail:
    free(b->pending);
    free(b->taken);
    free(b->take);
    free(b->rows);
    free(b);
    return ret;
}

void serve_batch_destroy(struct serve_batch *b)
{
    if (!b)
        return;
    infer_multi_destroy(b->mb);
    pthread_cond_destroy(&b->cv_in);
    pthread_cond_destroy(&b->cv_done);
    pthread_mutex_destroy(&b->mu);
    free(b->pending);
    free(b->taken);
    free(b->take);
    free(b->rows);
    free(b);
}

void serve_batch_join(struct serve_batch *b)
{
    pthread_mutex_lock(&b->mu);
    b->members++;
    pthread_mutex_unlock(&b->mu);
}

void serve_batch_leave(struct serve_batch *b)
{
    pthread_mutex_lock(&b->mu);
    b->members--;
    pthread_cond_signal(&b->cv_in); /* a gathering leader may stop waiting for it */
    pthread_mutex_unlock(&b->mu);
}

/* Rows entry e runs in this step: a decode row, or its prompt's next chunk
 * up to the next multiple of chunk from its start (where
 * infer_session_prefill would cut it). */
static uint32_t next_rows(const struct serve_batch *b, const struct entry *e)
{
    uint32_t left = e->n - e->done, to_cut = b->chunk - e->done % b->chunk;
    return left < to_cut ? left : to_cut;
}

/* Chooses the step (called locked): every decode row handed in, then
 * prompt chunks in the order handed in, each only whole, while they fit. */
static uint32_t choose(struct serve_batch *b)
{
    uint32_t k = 0, rows = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < b->n_pending; i++) {
            struct entry *e = b->pending[i];
            if (e->step != (pass == 0))
                continue;
            uint32_t r = next_rows(b, e);
            if (rows + r > b->max_rows)
                continue;
            b->taken[k] = e;
            b->take[k] = r;
            b->rows[k] = (struct infer_session_rows){.s = e->s, .tokens = e->tokens + e->done,
                                                     .n = r, .step = e->step};
            rows += r;
            k++;
        }
    return k;
}

static void deadline_at(struct timespec *ts, uint64_t t_ns)
{
    /* sl_now_ns is CLOCK_MONOTONIC, as the condition variable's clock */
    ts->tv_sec = (time_t)(t_ns / 1000000000u);
    ts->tv_nsec = (long)(t_ns % 1000000000u);
}

/* Gathers, runs and completes one step (called and returning locked). */
static void lead(struct serve_batch *b)
{
    b->leading = 1;
    uint64_t oldest = UINT64_MAX;
    for (uint32_t i = 0; i < b->n_pending; i++)
        oldest = b->pending[i]->t_in < oldest ? b->pending[i]->t_in : oldest;
    struct timespec ts;
    deadline_at(&ts, oldest + (uint64_t)SERVE_BATCH_GATHER_US * 1000u);
    while (b->n_pending < b->members && sl_now_ns() < oldest + SERVE_BATCH_GATHER_US * 1000ull)
        pthread_cond_timedwait(&b->cv_in, &b->mu, &ts);
    uint32_t k = choose(b), rows = 0;
    for (uint32_t i = 0; i < k; i++)
        rows += b->take[i];
    pthread_mutex_unlock(&b->mu);
    struct sl_err err = {{0}};
    int ret = infer_session_run_multi(b->mb, b->rows, k, &err);
    pthread_mutex_lock(&b->mu);
    b->stats.steps++;
    b->stats.rows += rows;
    b->stats.multi_steps += k > 1;
    for (uint32_t i = 0; i < k; i++) {
        struct entry *e = b->taken[i];
        e->done += b->take[i];
        if (ret < 0) {
            e->ret = ret;
            e->err = err;
        }
        if (ret < 0 || e->done == e->n) {
            e->finished = 1;
            for (uint32_t j = 0; j < b->n_pending; j++)
                if (b->pending[j] == e) {
                    b->pending[j] = b->pending[--b->n_pending];
                    break;
                }
        }
    }
    b->leading = 0;
    pthread_cond_broadcast(&b->cv_done);
}

int serve_batch_run(struct serve_batch *b, struct infer_session *s, const int *tokens, uint32_t n,
                    int step, struct sl_err *err)
{
    if (n == 0)
        return 0;
    struct entry e = {.s = s, .tokens = tokens, .n = n, .step = step, .t_in = sl_now_ns()};
    pthread_mutex_lock(&b->mu);
    if (b->n_pending == b->parallel) { /* more sessions than it was made for */
        pthread_mutex_unlock(&b->mu);
        sl_err_set(err, "more than %u sessions hand steps in", b->parallel);
        return -EBUSY;
    }
    b->pending[b->n_pending++] = &e;
    if (b->leading)
        pthread_cond_signal(&b->cv_in);
    while (!e.finished) {
        if (!b->leading)
            lead(b);
        else
            pthread_cond_wait(&b->cv_done, &b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    if (e.ret < 0)
        *err = e.err;
    return e.ret;
}

void serve_batch_stats(struct serve_batch *b, struct serve_batch_stats *st)
{
    pthread_mutex_lock(&b->mu);
    *st = b->stats;
    pthread_mutex_unlock(&b->mu);
}
