/* serve_engine.c: one model, --parallel sessions over it, a bounded queue
 * and the cold start (serve_engine.h); generation is serve_gen.c. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_batch.h"
#include "serve_engine_internal.h"

int serve_engine_create(const struct serve_engine_opts *o, struct serve_engine **out,
                        struct sl_err *err)
{
    struct serve_engine *e = calloc(1, sizeof *e);
    if (!e) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    e->o = *o;
    e->cold_hold = 1;
    if (!e->o.parallel)
        e->o.parallel = 1;
    e->slots = calloc(e->o.parallel, sizeof *e->slots);
    int ret = e->slots ? pthread_mutex_init(&e->mu, NULL) : ENOMEM;
    if (ret) {
        free(e->slots);
        free(e);
        sl_err_set(err, "out of memory");
        return -ret;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    ret = pthread_cond_init(&e->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (ret) {
        pthread_mutex_destroy(&e->mu);
        free(e->slots);
        free(e);
        sl_err_set(err, "cannot create a condition variable (%s)", strerror(ret));
        return -ret;
    }
    *out = e;
    if (o->lazy)
        return 0;
    /* eager: the model through the cold-start pipeline now, with a BOS prompt */
    if ((ret = serve_engine_open(e, err)) < 0)
        goto fail;
    int bos = (int)e->cfg.bos_id;
    struct serve_slot *slot;
    int cold;
    double ttft;
    e->cold_hold = 0; /* nobody waits for this cold start's first token */
    if ((ret = serve_engine_acquire(e, &bos, 1, NULL, NULL, &slot, &cold, &ttft, err)) < 0)
        goto fail;
    e->cold_hold = 1;
    ret = serve_engine_settle(e, slot, err);
    serve_engine_release(e, slot);
    if (ret < 0)
        goto fail;
    return 0;
fail:
    serve_engine_destroy(e);
    *out = NULL;
    return ret;
}

void serve_engine_destroy(struct serve_engine *e)
{
    if (!e)
        return;
    serve_batch_destroy(e->batch);
    /* slot 0 owns the model (the cold start): the others go first */
    for (uint32_t i = e->n_slots; i-- > 0;) {
        infer_session_destroy(e->slots[i].s);
        free(e->slots[i].hist);
        free(e->slots[i].first_logits);
    }
    free(e->slots);
    infer_tokenizer_destroy(e->tk);
    format_reader_close(e->r);
    free(e->chat_template);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

int serve_engine_open(struct serve_engine *e, struct sl_err *err)
{
    pthread_mutex_lock(&e->mu);
    int ret = 0;
    if (e->opened)
        goto out;
    if ((ret = format_reader_open(e->o.path, &e->r, err)) < 0)
        goto out;
    e->cfg = *format_reader_config(e->r);
    if ((ret = infer_tokenizer_create(format_reader_tokenizer(e->r), &e->cfg, &e->tk, err)) < 0) {
        format_reader_close(e->r);
        e->r = NULL;
        goto out;
    }
    const void *v;
    size_t len;
    if (format_reader_meta_get(e->r, "tokenizer.chat_template", &v, &len) == 0 &&
        (e->chat_template = malloc(len + 1))) {
        memcpy(e->chat_template, v, len);
        e->chat_template[len] = 0;
    }
    e->opened = 1;
out:
    pthread_mutex_unlock(&e->mu);
    return ret;
}

const struct format_config *serve_engine_config(const struct serve_engine *e)
{
    return &e->cfg;
}

const struct infer_tokenizer *serve_engine_tokenizer(const struct serve_engine *e)
{
    return e->tk;
}

const char *serve_engine_chat_template(const struct serve_engine *e)
{
    return e->chat_template;
}

void serve_engine_counters(struct serve_engine *e, struct serve_engine_counters *c)
{
    pthread_mutex_lock(&e->mu);
    *c = (struct serve_engine_counters){.active = e->active,
                                        .sessions = e->n_slots,
                                        .waiting = e->waiting,
                                        .bytes_streamed = e->bytes_streamed,
                                        .cold_ttft_s = e->cold_ttft_s,
                                        .loaded = e->state == ENGINE_READY};
    struct serve_batch *b = e->state == ENGINE_READY ? e->batch : NULL;
    pthread_mutex_unlock(&e->mu);
    if (b) { /* lives as long as the engine once it is ready */
        struct serve_batch_stats st;
        serve_batch_stats(b, &st);
        c->batch_steps = st.steps;
        c->batch_rows = st.rows;
        c->batch_multi = st.multi_steps;
    }
}

static void session_opts(const struct serve_engine *e, struct infer_session_opts *so)
{
    *so = (struct infer_session_opts){.max_batch = e->o.pipeline.chunk ? e->o.pipeline.chunk : 256,
                                      .npu_share = e->o.npu_share,
                                      .no_npu = e->o.npu_share == 0};
}

#define COLD_HOLD_MS 100

static void deadline_in(struct timespec *ts, long ms);

/* On the cold start's thread, the moment the prompt's logits exist. */
static void on_first_logits(void *ctx, struct infer_session *s)
{
    struct serve_engine *e = ctx;
    memcpy(e->slots[0].first_logits, infer_session_logits(s), sizeof(float) * e->cfg.vocab_size);
    pthread_mutex_lock(&e->mu);
    e->cold_t_first = sl_now_ns();
    e->cold_first = 1;
    pthread_cond_broadcast(&e->cv);
    if (e->cold_hold) {
        struct timespec ts;
        deadline_in(&ts, COLD_HOLD_MS);
        while (!e->first_taken && pthread_cond_timedwait(&e->cv, &e->mu, &ts) == 0)
            ;
    }
    pthread_mutex_unlock(&e->mu);
}

/* The cold start's first token was taken: its pipeline goes on. */
void se_first_taken(struct serve_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->first_taken = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void *cold_main(void *arg)
{
    struct serve_engine *e = arg;
    struct infer_session_opts so;
    session_opts(e, &so);
    so.first_logits = on_first_logits;
    so.ctx = e;
    struct infer_session *s = NULL;
    struct sl_err err = {{0}};
    /* the engine's open reader (its tokenizer's): the container is not
     * opened and its index not decompressed again (the model takes a hold
     * of its own) */
    struct infer_pipeline_opts po = e->o.pipeline;
    po.reader = e->r;
    int ret = infer_session_cold_start(e->o.path, e->cold_tokens, e->cold_n, &so, &po, &s,
                                       &e->cold_pst, &err);
    pthread_mutex_lock(&e->mu);
    e->slots[0].s = s;
    e->cold_ret = ret;
    e->cold_err = err;
    e->cold_done = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* The cold start (called without the lock, by the one thread that set
 * ENGINE_LOADING): slot 0 from the pipeline with the request's prompt, on a
 * thread of its own; returns once the prompt's logits exist (the first
 * token can go out then), with slot 0 cold_pending until
 * serve_engine_settle. */
static int engine_load(struct serve_engine *e, const int *tokens, uint32_t n, double *ttft_s,
                       struct sl_err *err)
{
    struct serve_slot *s0 = &e->slots[0];
    s0->hist = malloc(sizeof(int) * e->cfg.seq_len);
    s0->first_logits = malloc(sizeof(float) * e->cfg.vocab_size);
    if (!s0->hist || !s0->first_logits) {
        free(s0->hist);
        free(s0->first_logits);
        *s0 = (struct serve_slot){0};
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    memcpy(s0->hist, tokens, sizeof(int) * n);
    e->cold_tokens = s0->hist;
    e->cold_n = n;
    e->cold_first = e->cold_done = e->first_taken = 0;
    e->cold_t0 = sl_now_ns();
    int ret = pthread_create(&e->cold_thread, NULL, cold_main, e);
    if (ret) {
        free(s0->hist);
        free(s0->first_logits);
        *s0 = (struct serve_slot){0};
        sl_err_set(err, "cannot start the cold start's thread (%s)", strerror(ret));
        return -ret;
    }
    pthread_mutex_lock(&e->mu);
    while (!e->cold_first && !e->cold_done)
        pthread_cond_wait(&e->cv, &e->mu);
    int failed = !e->cold_first;
    pthread_mutex_unlock(&e->mu);
    s0->cold_pending = 1;
    if (failed) { /* it ended without logits: an error */
        ret = serve_engine_settle(e, s0, err);
        return ret < 0 ? ret : -EIO;
    }
    *ttft_s = (double)(e->cold_t_first - e->cold_t0) / 1e9;
    s0->n_hist = n;
    return 0;
}

int serve_engine_settle(struct serve_engine *e, struct serve_slot *slot, struct sl_err *err)
{
    if (!slot->cold_pending)
        return 0;
    se_first_taken(e); /* whether or not a token was: the callback must not hold on */
    pthread_join(e->cold_thread, NULL);
    slot->cold_pending = 0;
    int ret = e->cold_ret;
    struct serve_slot *slots = e->slots;
    uint32_t k = 1;
    if (ret < 0) {
        *err = e->cold_err;
    } else {
        /* packed residency: the int8 copies go now, while slot 0's session is
         * the model's only one; its first step would drop them while other
         * slots' steps (in another lane, or a speculating reply's own
         * forward) read them */
        infer_session_drop_int8(slots[0].s);
        struct infer_session_opts so;
        session_opts(e, &so);
        for (; k < e->o.parallel; k++) {
            if (!(slots[k].hist = malloc(sizeof(int) * e->cfg.seq_len))) {
                ret = -ENOMEM;
                sl_err_set(err, "out of memory");
                break;
            }
            if ((ret = infer_session_create(infer_session_model(slots[0].s), &so, &slots[k].s,
                                            err)) < 0)
                break;
        }
        if (ret == 0 && !e->o.no_batch &&
            (ret = serve_batch_create(infer_session_model(slots[0].s), e->o.parallel,
                                      so.max_batch, e->o.batch_lanes ? e->o.batch_lanes : 1,
                                      e->o.npu_share, &e->batch, err)) < 0)
            k = e->o.parallel - 1; /* every session goes */
    }
    pthread_mutex_lock(&e->mu);
    if (ret < 0) {
        for (uint32_t i = k + 1; i-- > 0;) {
            infer_session_destroy(slots[i].s);
            free(slots[i].hist);
            free(slots[i].first_logits);
            slots[i] = (struct serve_slot){.busy = i == 0};
        }
        e->state = ENGINE_EMPTY; /* the next request tries again */
    } else {
        e->n_slots = e->o.parallel;
        e->bytes_streamed += e->cold_pst.bytes_read;
        e->cold_ttft_s = (double)(e->cold_t_first - e->cold_t0) / 1e9;
        e->state = ENGINE_READY;
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return ret;
}

const float *serve_engine_logits(const struct serve_slot *slot)
{
    return slot->cold_pending ? slot->first_logits : infer_session_logits(slot->s);
}

/* tokens[0..n) appended to the slot's session: a step of the batch, or on
 * this thread alone. */
int se_engine_run(struct serve_engine *e, struct serve_slot *sl, const int *tokens, uint32_t n,
                      int step, struct sl_err *err)
{
    if (!e->batch)
        return step ? infer_session_step(sl->s, tokens[0], err)
                    : infer_session_prefill(sl->s, tokens, n, err);
    if (!sl->joined) {
        serve_batch_join(e->batch);
        sl->joined = 1;
    }
    return serve_batch_run(e->batch, sl->s, tokens, n, step, err);
}

/* The slot's context becomes tokens[0..n), reusing the common prefix. */
static int slot_prepare(struct serve_engine *e, struct serve_slot *sl, const int *tokens,
                        uint32_t n, struct sl_err *err)
{
    uint32_t l = 0;
    while (l < n && l < sl->n_hist && sl->hist[l] == tokens[l])
        l++;
    if (l == n && sl->n_hist == n && infer_session_logits(sl->s))
        return 0; /* the logits of this very context are there */
    if (l == n)
        l = n - 1; /* run the last token again for its logits */
    int ret = infer_session_rewind(sl->s, l, err);
    sl->n_hist = l;
    if (ret == 0)
        ret = se_engine_run(e, sl, tokens + l, n - l, 0, err);
    if (ret < 0) {
        sl->n_hist = 0;
        infer_session_rewind(sl->s, 0, err);
        return ret;
    }
    memcpy(sl->hist + l, tokens + l, sizeof(int) * (n - l));
    sl->n_hist = n;
    return 0;
}

static void deadline_in(struct timespec *ts, long ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_nsec += ms * 1000000L;
    ts->tv_sec += ts->tv_nsec / 1000000000L;
    ts->tv_nsec %= 1000000000L;
}

static struct serve_slot *free_slot(struct serve_engine *e)
{
    for (uint32_t i = 0; i < e->n_slots; i++)
        if (!e->slots[i].busy)
            return &e->slots[i];
    return NULL;
}

int serve_engine_acquire(struct serve_engine *e, const int *tokens, uint32_t n,
                         serve_cancel_fn cancel, void *cctx, struct serve_slot **slot, int *cold,
                         double *ttft_s, struct sl_err *err)
{
    *cold = 0;
    *ttft_s = 0;
    if (n == 0 || n > e->cfg.seq_len) {
        sl_err_set(err, "the prompt is %u tokens; the context holds %u", n, e->cfg.seq_len);
        return -EINVAL;
    }
    pthread_mutex_lock(&e->mu);
    struct serve_slot *sl = NULL;
    int queued = 0, ret = 0;
    for (;;) {
        if (e->state == ENGINE_READY && (sl = free_slot(e)))
            break;
        if (e->state == ENGINE_EMPTY)
            break; /* this thread loads the model */
        if (!queued) {
            if (e->waiting >= e->o.queue) {
                pthread_mutex_unlock(&e->mu);
                return -EBUSY;
            }
            e->waiting++;
            queued = 1;
        }
        struct timespec ts;
        deadline_in(&ts, 100);
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        if (cancel && cancel(cctx)) {
            ret = -ECANCELED;
            break;
        }
    }
    if (queued)
        e->waiting--;
    if (ret < 0) {
        pthread_mutex_unlock(&e->mu);
        return ret;
    }
    if (!sl) { /* the cold start */
        e->state = ENGINE_LOADING;
        e->active++;
        pthread_mutex_unlock(&e->mu);
        ret = engine_load(e, tokens, n, ttft_s, err);
        pthread_mutex_lock(&e->mu);
        if (ret < 0) {
            e->active--;
            e->state = ENGINE_EMPTY;
        } else {
            (sl = &e->slots[0])->busy = 1; /* READY once settled */
        }
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        if (ret < 0)
            return ret;
        *cold = 1;
        *slot = sl;
        return 0;
    }
    sl->busy = 1;
    e->active++;
    pthread_mutex_unlock(&e->mu);
    if ((ret = slot_prepare(e, sl, tokens, n, err)) < 0) {
        serve_engine_release(e, sl);
        return ret;
    }
    *slot = sl;
    return 0;
}

void serve_engine_release(struct serve_engine *e, struct serve_slot *slot)
{
    struct sl_err err;
    serve_engine_settle(e, slot, &err); /* a failure leaves the engine empty */
    if (slot->joined) {
        serve_batch_leave(e->batch);
        slot->joined = 0;
    }
    pthread_mutex_lock(&e->mu);
    slot->busy = 0;
    e->active--;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}
