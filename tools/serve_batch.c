/* serve_batch.c: continuous batching: steps handed in by the generating
 * sessions, gathered and run as one forward pass by a leading caller, on
 * one of a few lanes (serve_batch.h). */
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
    int claimed;      /* in a step that runs now */
    int finished, ret;
    uint64_t t_in;    /* handed in (sl_now_ns) */
    struct sl_err err;
    pthread_cond_t cv; /* its caller waits here: woken when it finished, or to lead */
};

/* One forward pass at a time per lane: its scratch and the leader's lists. */
struct lane {
    struct infer_multi *mb;
    int busy;
    struct infer_session_rows *rows;
    struct entry **taken;
    uint32_t *take;
};

struct serve_batch {
    pthread_mutex_t mu;
    pthread_cond_t cv_in;   /* a step handed in, or a session left: the gathering leader */
    uint32_t parallel, chunk, max_rows, n_lanes;
    uint32_t members;  /* sessions that joined */
    struct entry **pending; /* handed in, not finished (claimed or not) */
    uint32_t n_pending, n_claimed;
    int gathering;     /* a leader is gathering its step */
    struct lane lanes[SERVE_BATCH_MAX_LANES];
    struct serve_batch_stats stats;
};

static void lanes_free(struct serve_batch *b)
{
    for (uint32_t i = 0; i < SERVE_BATCH_MAX_LANES; i++) {
        struct lane *l = &b->lanes[i];
        infer_multi_destroy(l->mb);
        free(l->rows);
        free(l->taken);
        free(l->take);
    }
}

int serve_batch_create(struct infer_model *m, uint32_t parallel, uint32_t chunk, uint32_t lanes,
                       double npu_share, struct serve_batch **out, struct sl_err *err)
{
    struct serve_batch *b = calloc(1, sizeof *b);
    if (!b) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    b->parallel = parallel ? parallel : 1;
    b->chunk = chunk ? chunk : 256;
    b->n_lanes = lanes < 1 ? 1 : lanes > SERVE_BATCH_MAX_LANES ? SERVE_BATCH_MAX_LANES : lanes;
    /* a whole prompt chunk always fits beside everyone else's decode row */
    b->max_rows = b->chunk + b->parallel;
    int ret = (b->pending = calloc(b->parallel, sizeof *b->pending)) ? 0 : -ENOMEM;
    struct infer_multi_opts mo = {.max_rows = b->max_rows, .no_npu = !(npu_share > 0),
                                  .npu_share = npu_share};
    for (uint32_t i = 0; ret == 0 && i < b->n_lanes; i++) {
        struct lane *l = &b->lanes[i];
        l->rows = calloc(b->parallel, sizeof *l->rows);
        l->taken = calloc(b->parallel, sizeof *l->taken);
        l->take = calloc(b->parallel, sizeof *l->take);
        ret = l->rows && l->taken && l->take ? 0 : -ENOMEM;
        if (ret < 0)
            sl_err_set(err, "out of memory");
        else
            ret = infer_multi_create(m, &mo, &l->mb, err);
    }
    if (ret < 0)
        goto fail;
    if ((ret = -pthread_mutex_init(&b->mu, NULL)) < 0) {
        sl_err_set(err, "cannot create a mutex");
        goto fail;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    ret = -pthread_cond_init(&b->cv_in, &ca);
    pthread_condattr_destroy(&ca);
    if (ret < 0) {
        sl_err_set(err, "cannot create a condition variable");
        pthread_mutex_destroy(&b->mu);
        goto fail;
    }
    *out = b;
    return 0;
fail:
    lanes_free(b);
    free(b->pending);
    free(b);
    return ret;
}

void serve_batch_destroy(struct serve_batch *b)
{
    if (!b)
        return;
    lanes_free(b);
    pthread_cond_destroy(&b->cv_in);
    pthread_mutex_destroy(&b->mu);
    free(b->pending);
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

/* Chooses lane l's step (called locked): every unclaimed decode row handed
 * in, then prompt chunks in the order handed in, each only whole, while
 * they fit. */
static uint32_t choose(struct serve_batch *b, struct lane *l)
{
    uint32_t k = 0, rows = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < b->n_pending; i++) {
            struct entry *e = b->pending[i];
            if (e->claimed || e->step != (pass == 0))
                continue;
            uint32_t r = next_rows(b, e);
            uint32_t ctx = infer_model_config(infer_session_model(e->s))->seq_len;
            if (infer_session_len(e->s) + r > ctx) { /* its own error, not the step's */
                sl_err_set(&e->err, "%u tokens after %u exceed the context of %u", r,
                           infer_session_len(e->s), ctx);
                e->ret = -EINVAL;
                e->finished = 1;
                pthread_cond_signal(&e->cv);
                b->pending[i--] = b->pending[--b->n_pending];
                continue;
            }
            if (rows + r > b->max_rows)
                continue;
            e->claimed = 1;
            l->taken[k] = e;
            l->take[k] = r;
            l->rows[k] = (struct infer_session_rows){.s = e->s, .tokens = e->tokens + e->done,
                                                     .n = r, .step = e->step};
            rows += r;
            k++;
        }
    b->n_claimed += k;
    return k;
}

static void deadline_at(struct timespec *ts, uint64_t t_ns)
{
    /* sl_now_ns is CLOCK_MONOTONIC, as the condition variable's clock */
    ts->tv_sec = (time_t)(t_ns / 1000000000u);
    ts->tv_nsec = (long)(t_ns % 1000000000u);
}

static void kick(struct serve_batch *b);

static struct lane *free_lane(struct serve_batch *b)
{
    for (uint32_t i = 0; i < b->n_lanes; i++)
        if (!b->lanes[i].busy)
            return &b->lanes[i];
    return NULL;
}

/* Steps a gathering leader waits for: its share of the sessions that
 * joined and are not in a running step, split among the free lanes (with
 * one lane, all of them; with two, half, so that one half's step runs
 * while the other half sends its tokens). */
static uint32_t gather_share(const struct serve_batch *b)
{
    uint32_t free = 1; /* the gatherer's own lane */
    for (uint32_t i = 0; i < b->n_lanes; i++)
        free += !b->lanes[i].busy;
    uint32_t idle = b->members > b->n_claimed ? b->members - b->n_claimed : 0;
    return (idle + free - 1) / free;
}

/* Gathers, runs and completes one step on lane l (called and returning
 * locked): it waits until its share of the sessions (gather_share) has
 * handed steps in, or the gather time after the oldest unclaimed one
 * passed. */
static void lead(struct serve_batch *b, struct lane *l)
{
    l->busy = 1;
    b->gathering = 1;
    uint64_t oldest = UINT64_MAX;
    for (uint32_t i = 0; i < b->n_pending; i++)
        if (!b->pending[i]->claimed && b->pending[i]->t_in < oldest)
            oldest = b->pending[i]->t_in;
    uint64_t until = oldest + (uint64_t)SERVE_BATCH_GATHER_US * 1000u;
    struct timespec ts;
    deadline_at(&ts, until);
    while (b->n_pending - b->n_claimed < gather_share(b) && sl_now_ns() < until)
        pthread_cond_timedwait(&b->cv_in, &b->mu, &ts);
    b->gathering = 0;
    uint32_t k = choose(b, l), rows = 0;
    for (uint32_t i = 0; i < k; i++)
        rows += l->take[i];
    kick(b); /* another lane may gather meanwhile */
    pthread_mutex_unlock(&b->mu);
    struct sl_err err = {{0}};
    int ret = infer_session_run_multi(l->mb, l->rows, k, &err);
    pthread_mutex_lock(&b->mu);
    b->stats.steps++;
    b->stats.rows += rows;
    b->stats.multi_steps += k > 1;
    b->n_claimed -= k;
    for (uint32_t i = 0; i < k; i++) {
        struct entry *e = l->taken[i];
        e->done += l->take[i];
        e->claimed = 0;
        if (ret < 0) {
            e->ret = ret;
            e->err = err;
        }
        if (ret < 0 || e->done == e->n) {
            e->finished = 1;
            pthread_cond_signal(&e->cv);
            for (uint32_t j = 0; j < b->n_pending; j++)
                if (b->pending[j] == e) {
                    b->pending[j] = b->pending[--b->n_pending];
                    break;
                }
        }
    }
    l->busy = 0;
    kick(b);
}

/* Wakes the caller of the oldest unclaimed entry to lead the next step,
 * when a lane is free and nobody gathers (called locked, whenever one of
 * those changes): one thread woken, not every waiter. */
static void kick(struct serve_batch *b)
{
    if (b->gathering || !free_lane(b))
        return;
    struct entry *best = NULL;
    for (uint32_t i = 0; i < b->n_pending; i++) {
        struct entry *e = b->pending[i];
        if (!e->claimed && (!best || e->t_in < best->t_in))
            best = e;
    }
    if (best)
        pthread_cond_signal(&best->cv);
}

int serve_batch_run(struct serve_batch *b, struct infer_session *s, const int *tokens, uint32_t n,
                    int step, struct sl_err *err)
{
    if (n == 0)
        return 0;
    struct entry e = {.s = s, .tokens = tokens, .n = n, .step = step, .t_in = sl_now_ns()};
    int ret = pthread_cond_init(&e.cv, NULL);
    if (ret) {
        sl_err_set(err, "cannot create a condition variable (%s)", strerror(ret));
        return -ret;
    }
    pthread_mutex_lock(&b->mu);
    if (b->n_pending == b->parallel) { /* more sessions than it was made for */
        pthread_mutex_unlock(&b->mu);
        pthread_cond_destroy(&e.cv);
        sl_err_set(err, "more than %u sessions hand steps in", b->parallel);
        return -EBUSY;
    }
    b->pending[b->n_pending++] = &e;
    if (b->gathering)
        pthread_cond_signal(&b->cv_in);
    while (!e.finished) {
        struct lane *l;
        if (!e.claimed && !b->gathering && (l = free_lane(b)))
            lead(b, l);
        else
            pthread_cond_wait(&e.cv, &b->mu);
    }
    kick(b); /* the leader's entry may be done while others wait */
    pthread_mutex_unlock(&b->mu);
    pthread_cond_destroy(&e.cv);
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
