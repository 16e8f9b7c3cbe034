/* serve_gen.c: token-at-a-time generation over an engine's slot, with stop
 * sequences and speculative rounds (serve_engine.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "serve_batch.h"
#include "serve_engine_internal.h"
#include "serve_text.h"

int serve_gen_init(struct serve_gen *g, struct serve_engine *e, struct serve_slot *slot,
                   const struct infer_sampler_params *p, uint32_t max_tokens, char *const *stop,
                   uint32_t n_stop, int prev, struct sl_err *err)
{
    *g = (struct serve_gen){.e = e, .slot = slot, .max_tokens = max_tokens, .stop = stop,
                            .n_stop = n_stop, .prev = prev, .pending = -1,
                            .spec = e->o.spec.on ? &e->o.spec : NULL,
                            .spec_r = {.on = e->o.spec.on}};
    g->logits = malloc(sizeof(float) * e->cfg.vocab_size);
    int ret = g->logits ? infer_sampler_create(e->cfg.vocab_size, p, &g->sampler) : -ENOMEM;
    if (ret < 0) {
        free(g->logits);
        g->logits = NULL;
        sl_err_set(err, "cannot set up sampling (%s)", strerror(-ret));
        return ret;
    }
    if (max_tokens == 0)
        g->finish = SERVE_LENGTH;
    return 0;
}

static int text_append(struct serve_gen *g, const char *s, size_t n)
{
    if (g->len + n + 1 > g->cap) {
        size_t cap = (g->len + n + 1) * 2 + 64;
        char *p = realloc(g->text, cap);
        if (!p)
            return -ENOMEM;
        g->text = p;
        g->cap = cap;
    }
    memcpy(g->text + g->len, s, n);
    g->len += n;
    g->text[g->len] = 0;
    return 0;
}

void serve_gen_spec_result(const struct serve_gen *g, struct tools_spec_result *r)
{
    *r = g->spec_r;
    r->rounds = NULL;
    r->n_rounds = r->cap_rounds = 0;
    if (g->sp)
        infer_spec_stats(g->sp, &r->st);
}

/* The pending token fed back with drafts (infer_spec_round): the session
 * leaves the batch for it. 1 when it ran, 0 when speculation is off for
 * the model (run it plainly), or -errno. */
static int spec_round(struct serve_gen *g, struct sl_err *err)
{
    struct serve_slot *sl = g->slot;
    struct serve_engine *e = g->e;
    int ret;
    if (!g->sp) {
        if (!infer_spec_exact(infer_session_model(sl->s))) {
            g->spec_r.off_why = "dynamic activation scales";
            g->spec_r.on = 0;
            g->spec = NULL;
            return 0;
        }
        struct infer_spec_opts so = {.max_rows = g->spec->rows,
                                     .calibrate = g->spec->calibrate,
                                     .no_reuse = g->spec->no_reuse,
                                     .sampler = g->sampler};
        if ((ret = infer_spec_create(sl->s, sl->hist, sl->n_hist, &so, &g->sp, err)) < 0)
            return ret;
    }
    if (sl->joined) { /* the others' steps need not wait for this one's */
        serve_batch_leave(e->batch);
        sl->joined = 0;
    }
    int stop[2] = {(int)e->cfg.bos_id, (int)e->cfg.eos_id}, acc[INFER_SPEC_MAX_ROWS], next;
    uint32_t n;
    if ((ret = infer_spec_round(g->sp, g->pending, g->max_tokens - g->taken, stop, 2, acc, &n,
                                &next, err)) < 0)
        return ret;
    sl->hist[sl->n_hist++] = g->pending;
    memcpy(sl->hist + sl->n_hist, acc, sizeof(int) * n);
    sl->n_hist += n;
    memcpy(g->queue, acc, sizeof(int) * n);
    g->q_n = g->q_ran = g->ahead = n;
    g->q_at = 0;
    if (next >= 0)
        g->queue[g->q_n++] = next;
    return 1;
}

/* The next token from the slot's logits, with g's sampler. */
static int sample_next(struct serve_gen *g, int *tok, struct sl_err *err)
{
    struct serve_slot *sl = g->slot;
    const float *lg = serve_engine_logits(sl);
    if (!lg) {
        sl_err_set(err, "no logits to sample from");
        return -EINVAL;
    }
    memcpy(g->logits, lg, sizeof(float) * g->e->cfg.vocab_size);
    *tok = infer_sampler_sample(g->sampler, g->logits);
    if (sl->cold_pending)
        se_first_taken(g->e);
    if (*tok < 0) {
        sl_err_set(err, "sampling failed (%s)", strerror(-*tok));
        return *tok;
    }
    return 0;
}

int serve_gen_next(struct serve_gen *g, struct sl_err *err)
{
    if (g->finish != SERVE_MORE)
        return 0;
    struct serve_slot *sl = g->slot;
    int ret;
    if (g->pending >= 0) { /* run the previous token: its logits give this one */
        if ((ret = serve_engine_settle(g->e, sl, err)) < 0)
            return ret;
        ret = 0;
        if (g->pending_ran)
            g->ahead--; /* a draft accepted: in the cache already */
        else if (g->spec)
            ret = spec_round(g, err);
        if (ret == 0 && !g->pending_ran)
            ret = se_engine_run(g->e, sl, &g->pending, 1, 1, err);
        if (ret < 0) {
            sl->n_hist = 0; /* unknown state: the next request starts afresh */
            infer_session_rewind(sl->s, 0, err);
            return ret;
        }
        if (ret == 0 && !g->pending_ran)
            sl->hist[sl->n_hist++] = g->pending;
        g->pending = -1;
        g->pending_ran = 0;
    }
    int tok, ran = 0;
    if (g->q_at < g->q_n) { /* decided by the last verification */
        ran = g->q_at < g->q_ran;
        tok = g->queue[g->q_at++];
    } else if ((ret = sample_next(g, &tok, err)) < 0) {
        return ret;
    }
    g->taken++;
    /* as sluice run: BOS or EOS ends the reply (not printed) */
    if (tok == (int)g->e->cfg.bos_id || tok == (int)g->e->cfg.eos_id) {
        g->finish = SERVE_STOP;
        return 0;
    }
    size_t plen;
    const char *piece = infer_tokenizer_decode(g->e->tk, g->prev, tok, &plen);
    g->prev = tok;
    if (infer_piece_printable(piece, plen) && text_append(g, piece, plen) < 0) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    size_t cut, safe;
    if (serve_stop_scan(g->stop, g->n_stop, g->text ? g->text : "", g->len, g->sent, &cut,
                        &safe)) {
        g->len = cut;
        g->text[cut] = 0;
        g->finish = SERVE_STOP;
        return 0;
    }
    /* the last token is not run; nor one the context has no room for */
    if (g->taken >= g->max_tokens || sl->n_hist - g->ahead >= g->e->cfg.seq_len) {
        g->finish = SERVE_LENGTH;
    } else {
        g->pending = tok; /* run at the next call, after this one's text went out */
        g->pending_ran = ran;
    }
    return 0;
}

void serve_gen_take(struct serve_gen *g, size_t *from, size_t *n)
{
    size_t end = g->len;
    if (g->finish == SERVE_MORE) {
        size_t cut;
        if (serve_stop_scan(g->stop, g->n_stop, g->text ? g->text : "", g->len, g->sent, &cut,
                            &end))
            end = cut; /* not reached: serve_gen_next ends the reply there */
    }
    if (end < g->sent)
        end = g->sent;
    *from = g->sent;
    *n = end - g->sent;
    g->sent = end;
}

void serve_gen_free(struct serve_gen *g)
{
    infer_spec_destroy(g->sp);
    infer_sampler_destroy(g->sampler);
    free(g->logits);
    free(g->text);
    *g = (struct serve_gen){0};
}
