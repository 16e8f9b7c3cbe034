/* infer_session.c: one conversation with a model: its state (KV cache and
 * scratch), sampler, statistics and the emulated NPU device that runs its
 * int8 matmuls from the cold start's prefill through every decode step. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "npu.h"

struct infer_session {
    struct infer_model *m;
    int own_model;
    struct infer_state *st;
    struct npu_device *dev;
    struct infer_sampler *sampler;
    struct infer_session_opts o;
    uint32_t vocab;
    float *logits;       /* [vocab] of the last position run */
    int has_logits;
    int next;            /* the token infer_session_sample kept, or -1 */
    int drop_int8;       /* packed residency: free the int8 copies before running on */
    struct infer_session_stats stats;
};

/* Everything but the model and state: the cold start makes those. */
static int session_alloc(uint32_t vocab, const struct infer_session_opts *o,
                         struct infer_session **out, struct sl_err *err)
{
    struct infer_session *s = sl_calloc(1, sizeof *s);
    if (!s) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    s->o = o ? *o : (struct infer_session_opts){0};
    if (!s->o.max_batch)
        s->o.max_batch = 256;
    if (!(s->o.npu_share > 0 && s->o.npu_share < 1))
        s->o.npu_share = 0.5;
    s->vocab = vocab;
    s->next = -1;
    s->logits = sl_malloc(sizeof(float) * vocab);
    int ret = s->logits ? infer_sampler_create(vocab, &s->o.sampler, &s->sampler) : -ENOMEM;
    if (ret < 0) {
        sl_err_set(err, "cannot set up sampling (%s)", strerror(-ret));
        goto fail;
    }
    if (!s->o.no_npu) {
        ret = npu_device_create(&s->dev);
        if (ret < 0) {
            sl_err_set(err, "cannot start the NPU device (%s)", strerror(-ret));
            goto fail;
        }
    }
    *out = s;
    return 0;
fail:
    infer_session_destroy(s);
    return ret;
}

/* The state runs its small int8 batches on the session's device too. */
static void attach_state(struct infer_session *s)
{
    s->st->dev = s->dev;
    s->st->npu_share = s->o.npu_share;
    if (s->o.npu_min_weights)
        s->st->npu_min_weights = s->o.npu_min_weights;
}

int infer_session_create(struct infer_model *m, const struct infer_session_opts *o,
                         struct infer_session **out, struct sl_err *err)
{
    struct infer_session *s;
    int ret = session_alloc(m->cfg.vocab_size, o, &s, err);
    if (ret < 0)
        return ret;
    s->m = m;
    ret = infer_state_create(m, s->o.max_batch, &s->st, err);
    if (ret < 0) {
        infer_session_destroy(s);
        return ret;
    }
    attach_state(s);
    *out = s;
    return 0;
}

static void on_first_logits(void *ctx, const float *logits)
{
    struct infer_session *s = ctx;
    (void)logits; /* s->logits: the buffer the pipeline filled */
    s->has_logits = 1;
    if (s->o.first_logits)
        s->o.first_logits(s->o.ctx, s);
}

int infer_session_cold_start(const char *path, const int *tokens, uint32_t n,
                             const struct infer_session_opts *so,
                             const struct infer_pipeline_opts *po, struct infer_session **out,
                             struct infer_pipeline_stats *pst, struct sl_err *err)
{
    struct infer_pipeline_opts p;
    if (po)
        p = *po;
    else
        infer_pipeline_opts_init(&p);
    /* the container opened once (its index read and decompressed once): the
     * caller's reader, or one opened here and handed to the pipeline, whose
     * model holds it from then on; this function closes only what it opened */
    struct format_reader *r = p.reader;
    int ret = 0;
    if (!r && (ret = format_reader_open(path, &r, err)) < 0)
        return ret;
    struct format_reader *own = p.reader ? NULL : r;
    p.reader = r;
    /* the vocabulary size sizes the logits before the pipeline starts */
    uint32_t vocab = format_reader_config(r)->vocab_size;
    p.resident = infer_resident_resolve(p.resident, r, p.no_shadow);
    struct infer_session *s;
    ret = session_alloc(vocab, so, &s, err);
    if (ret < 0) {
        format_reader_close(own);
        return ret;
    }
    p.device = s->dev;
    p.first_logits = on_first_logits;
    p.ctx = s;
    uint64_t t0 = sl_now_ns();
    ret = infer_pipeline_prefill(path, tokens, n, &p, &s->m, &s->st, s->logits, pst, err);
    format_reader_close(own); /* the model holds it where the pipeline kept one */
    if (ret < 0) {
        infer_session_destroy(s);
        return ret;
    }
    s->own_model = 1;
    s->has_logits = 1;
    s->drop_int8 = p.resident == INFER_RESIDENT_PACKED;
    attach_state(s);
    s->stats.prompt_tokens = n;
    s->stats.prefill_s = (double)(sl_now_ns() - t0) / 1e9;
    *out = s;
    return 0;
}

void infer_session_destroy(struct infer_session *s)
{
    if (!s)
        return;
    infer_state_destroy(s->st);
    if (s->own_model)
        infer_model_destroy(s->m);
    npu_device_destroy(s->dev);
    infer_sampler_destroy(s->sampler);
    free(s->logits);
    free(s);
}

struct infer_model *infer_session_model(struct infer_session *s) { return s->m; }
struct infer_state *infer_session_state(struct infer_session *s) { return s->st; }
uint32_t infer_session_len(const struct infer_session *s) { return s->st->kv->len; }
const float *infer_session_logits(const struct infer_session *s)
{
    return s->has_logits ? s->logits : NULL;
}

size_t infer_session_drop_int8(struct infer_session *s)
{
    if (!s->drop_int8)
        return 0;
    s->drop_int8 = 0;
    return infer_model_drop_int8(s->m);
}

/* Runs tokens as a chain after the cache; logits of the last (and, with
 * all, of every row into all[n][vocab]). */
static int run_chain(struct infer_session *s, const int *tokens, uint32_t n, float *all,
                     struct sl_err *err)
{
    const uint32_t last = n - 1;
    infer_session_drop_int8(s); /* after the first token, not before it (its TTFT) */
    s->has_logits = 0;
    s->next = -1;
    uint64_t jobs = s->st->npu_jobs;
    int ret = infer_forward(s->m, s->st, tokens, n, s->st->kv->len, all ? all : s->logits,
                            all ? INFER_LOGITS_ALL : INFER_LOGITS_LAST, err);
    s->stats.npu_jobs += s->st->npu_jobs - jobs;
    if (ret == 0 && all)
        memcpy(s->logits, all + (size_t)last * s->m->cfg.vocab_size,
               sizeof(float) * s->m->cfg.vocab_size);
    if (ret == 0)
        s->has_logits = 1;
    return ret;
}

int infer_session_prefill(struct infer_session *s, const int *tokens, uint32_t n,
                          struct sl_err *err)
{
    return infer_session_prefill_logits(s, tokens, n, NULL, err);
}

int infer_session_prefill_logits(struct infer_session *s, const int *tokens, uint32_t n,
                                 float *all, struct sl_err *err)
{
    if (n == 0)
        return 0;
    uint64_t t0 = sl_now_ns();
    int ret = run_chain(s, tokens, n, all, err);
    if (ret == 0) {
        s->stats.prompt_tokens += n;
        s->stats.prefill_s += (double)(sl_now_ns() - t0) / 1e9;
    }
    return ret;
}

int infer_session_step(struct infer_session *s, int token, struct sl_err *err)
{
    uint64_t t0 = sl_now_ns();
    int ret = run_chain(s, &token, 1, NULL, err);
    if (ret == 0) {
        s->stats.decoded++;
        s->stats.decode_s += (double)(sl_now_ns() - t0) / 1e9;
    }
    return ret;
}

int infer_session_sample(struct infer_session *s, int *token)
{
    if (!s->has_logits)
        return -EINVAL;
    int t = infer_sampler_sample(s->sampler, s->logits);
    if (t < 0)
        return t;
    s->has_logits = 0; /* consumed (rewritten in place by the sampler) */
    s->next = t;
    *token = t;
    return 0;
}

int infer_session_rewind(struct infer_session *s, uint32_t n, struct sl_err *err)
{
    if (infer_kv_truncate(s->st->kv, n) < 0) {
        sl_err_set(err, "cannot rewind to %u tokens: the context holds %u", n, s->st->kv->len);
        return -EINVAL;
    }
    s->has_logits = 0;
    s->next = -1;
    return 0;
}

int infer_session_generate(struct infer_session *s, uint32_t max_tokens, const int *stop,
                           uint32_t n_stop, infer_token_fn on_token, void *ctx, uint32_t *n_out,
                           struct sl_err *err)
{
    uint32_t taken = 0;
    int ret = 0;
    while (taken < max_tokens) {
        int tok = s->next;
        if (tok < 0 && (ret = infer_session_sample(s, &tok)) < 0) {
            sl_err_set(err, "nothing to sample from: run a prompt first");
            break;
        }
        taken++;
        int stopped = 0;
        for (uint32_t i = 0; i < n_stop; i++)
            stopped |= tok == stop[i];
        if (stopped || (on_token && on_token(ctx, tok)))
            break;
        if (s->st->kv->len >= s->st->kv->cap)
            break; /* the context is full: this token cannot be fed back */
        if ((ret = infer_session_step(s, tok, err)) < 0)
            break;
    }
    if (n_out)
        *n_out = taken;
    return ret;
}

void infer_session_stats(const struct infer_session *s, struct infer_session_stats *st)
{
    *st = s->stats;
}

/* ---- for speculative decoding (spec_session.c) ---- */

struct infer_sampler *infer_session_sampler(struct infer_session *s) { return s->sampler; }

int infer_session_take_next(struct infer_session *s, int *token)
{
    if (s->next >= 0) {
        *token = s->next;
        return 0;
    }
    return infer_session_sample(s, token);
}

void infer_session_after_verify(struct infer_session *s, const float *logits, int next,
                                uint32_t steps, double secs, uint64_t npu_jobs)
{
    memcpy(s->logits, logits, sizeof(float) * s->vocab);
    s->has_logits = 1;
    s->next = next;
    s->stats.decoded += steps;
    s->stats.decode_s += secs;
    s->stats.npu_jobs += npu_jobs;
}

/* ---- several sessions in one step (continuous batching) ---- */

int infer_session_run_multi(struct infer_multi *mb, const struct infer_session_rows *r,
                            uint32_t k, struct sl_err *err)
{
    if (k == 0)
        return 0;
    struct infer_seq *seqs = sl_malloc(sizeof *seqs * k);
    if (!seqs) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    int ret = 0;
    for (uint32_t i = 0; i < k && ret == 0; i++) {
        struct infer_session *s = r[i].s;
        if (r[i].step && r[i].n != 1) {
            sl_err_set(err, "a decode step of session %u has %u tokens, not 1", i, r[i].n);
            ret = -EINVAL;
        } else if (s->m != infer_multi_model(mb)) {
            sl_err_set(err, "session %u runs another model than the step's", i);
            ret = -EINVAL;
        }
        seqs[i] = (struct infer_seq){.s = s->st, .tokens = r[i].tokens, .n = r[i].n,
                                     .logits = s->logits};
    }
    for (uint32_t i = 0; i < k && ret == 0; i++)
        infer_session_drop_int8(r[i].s); /* as run_chain: after the first token */
    uint64_t t0 = sl_now_ns(), jobs = infer_multi_npu_jobs(mb);
    if (ret == 0) {
        for (uint32_t i = 0; i < k; i++) {
            r[i].s->has_logits = 0;
            r[i].s->next = -1;
        }
        ret = infer_forward_multi(mb, seqs, k, err);
    }
    free(seqs);
    if (ret < 0)
        return ret;
    double secs = (double)(sl_now_ns() - t0) / 1e9;
    /* the step's time and NPU jobs shared out by rows */
    uint32_t total = 0;
    for (uint32_t i = 0; i < k; i++)
        total += r[i].n;
    uint64_t dj = infer_multi_npu_jobs(mb) - jobs;
    for (uint32_t i = 0; i < k; i++) {
        struct infer_session *s = r[i].s;
        double share = secs * r[i].n / total;
        s->has_logits = 1;
        s->stats.npu_jobs += dj * r[i].n / total;
        if (r[i].step) {
            s->stats.decoded++;
            s->stats.decode_s += share;
        } else {
            s->stats.prompt_tokens += r[i].n;
            s->stats.prefill_s += share;
        }
    }
    return 0;
}
