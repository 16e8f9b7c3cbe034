/* infer_forward.c: the batched Llama forward pass, as llama2.c's run.c
 * computes it for one token: per layer, attention then the SwiGLU FFN, each
 * behind an RMSNorm and a residual add (the steps of infer_steps.c). One
 * function serves decode (one row), prefill (a chain of rows) and draft
 * verification (a tree of rows with their own positions). */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "npu.h"

int infer_embed(const struct infer_model *m, const int *tokens, uint32_t n, float *x,
                struct sl_err *err)
{
    if (!m->globals_loaded) {
        sl_err_set(err, "the embedding is not loaded");
        return -EINVAL;
    }
    return infer_op_embed(m, tokens, n, x, err);
}

/* Linears of one input x: the hooks' `linears` when it has one, else one
 * by one. */
static int linears(const struct infer_layer_hooks *h, int layer, uint32_t count,
                   const uint32_t *roles, const struct infer_linear *const *lins,
                   float *const *ys, const float *x, struct sl_err *err)
{
    if (h->linears)
        return h->linears(h->ctx, layer, count, roles, lins, ys, x, err);
    for (uint32_t j = 0; j < count; j++) {
        int ret = h->linear(h->ctx, layer, roles[j], lins[j], ys[j], x, err);
        if (ret < 0)
            return ret;
    }
    return 0;
}

int infer_layer_run(struct infer_model *m, struct infer_state *s, int layer, float *x,
                    uint32_t n, const struct infer_layer_hooks *h, struct sl_err *err)
{
    const struct format_config *c = &m->cfg;
    const struct infer_layer *w = &m->layers[layer];
    uint32_t F = c->hidden_dim;
    if (!w->loaded) {
        sl_err_set(err, "layer %d is not loaded", layer);
        return -EINVAL;
    }
    /* attention: xb = rmsnorm(x); q, k, v = xb Wq, xb Wk, xb Wv; RoPE; cache */
    infer_step_attn_norm(m, layer, s->xb, x, n);
    const uint32_t qkv[3] = {FORMAT_ROLE_WQ, FORMAT_ROLE_WK, FORMAT_ROLE_WV};
    const struct infer_linear *qkv_w[3] = {&w->wq, &w->wk, &w->wv};
    float *const qkv_y[3] = {s->q, s->k, s->v};
    int ret = linears(h, layer, 3, qkv, qkv_w, qkv_y, s->xb, err);
    if (ret == 0)
        ret = h->attention(h->ctx, layer, err);
    /* x += att_out Wo; xb = rmsnorm(x) */
    if (ret == 0)
        ret = h->linear(h->ctx, layer, FORMAT_ROLE_WO, &w->wo, s->xb, s->att_out, err);
    if (ret < 0)
        return ret;
    infer_step_ffn_norm(m, layer, x, s->xb, s->xb, n);
    /* FFN: x += (silu(xb Wg) * (xb Wu)) Wd */
    const uint32_t gu[2] = {FORMAT_ROLE_W_GATE, FORMAT_ROLE_W_UP};
    const struct infer_linear *gu_w[2] = {&w->w_gate, &w->w_up};
    float *const gu_y[2] = {s->hb, s->hb2};
    ret = linears(h, layer, 2, gu, gu_w, gu_y, s->xb, err);
    if (ret < 0)
        return ret;
    infer_step_swiglu(s->hb, s->hb2, n, F, 0, F);
    ret = h->linear(h->ctx, layer, FORMAT_ROLE_W_DOWN, &w->w_down, s->xb, s->hb, err);
    if (ret < 0)
        return ret;
    infer_step_residual(x, s->xb, n, c->dim);
    return 0;
}

/* One sequence's rows r: every linear over all of them, attention over its
 * own cache. */
struct rows_ctx {
    struct infer_model *m;
    struct infer_state *s;
    const struct infer_rows *r;
};

static int rows_linear(void *ctx, int layer, uint32_t role, const struct infer_linear *lin,
                       float *y, const float *x, struct sl_err *err)
{
    struct rows_ctx *q = ctx;
    return infer_linear_exec(q->m, q->s, layer, role, lin, y, x, q->r->n, err);
}

static int rows_linears(void *ctx, int layer, uint32_t count, const uint32_t *roles,
                        const struct infer_linear *const *lins, float *const *ys, const float *x,
                        struct sl_err *err)
{
    struct rows_ctx *q = ctx;
    return infer_linear_exec_group(q->m, q->s, layer, count, roles, lins, ys, x, q->r->n, err);
}

/* The kv heads [kv0, kv1) of one layer's attention (and their query heads):
 * every head is computed on its own, so any split gives the same bits. */
static int attn_heads(const struct rows_ctx *q, int layer, uint32_t kv0, uint32_t kv1,
                      float *scratch)
{
    struct infer_state *s = q->s;
    return infer_step_attention(q->m, s->kv, s->attn, layer, q->r, s->q, s->k, s->v, kv0, kv1,
                                s->att_out, scratch);
}

/* The device thread's share of the kv heads [0, end), one head at a time
 * from an atomic counter: the device thread takes them (its scratch
 * att_dev), and so does the calling thread once its own heads are done (its
 * scratch), so a device thread that starts late costs at most one head. */
struct attn_shared {
    const struct rows_ctx *q;
    int layer;
    uint32_t end;
    _Atomic uint32_t next;
};

static int attn_drain(struct attn_shared *a, float *scratch)
{
    uint32_t h;
    int ret = 0;
    while ((h = atomic_fetch_add(&a->next, 1)) < a->end) {
        int r = attn_heads(a->q, a->layer, h, h + 1, scratch);
        ret = ret < 0 ? ret : r;
    }
    return ret;
}

static int attn_shared_run(void *arg)
{
    struct attn_shared *a = arg;
    return attn_drain(a, a->q->s->att_dev);
}

/* Dense attention over a long enough context: the state's device thread
 * takes the first half of the kv heads (host work, npu_device_call) beside
 * the calling thread, as the linears split their channels; decoding's cost
 * that grows with the context is halved. A state whose npu_min_weights is
 * lower than the threshold (tests) splits from that many products. */
#define ATTN_SPLIT_MIN (1u << 18) /* query-key products: ~25 us, past a hand-off's cost */

static int rows_attention(void *ctx, int layer, struct sl_err *err)
{
    struct rows_ctx *q = ctx;
    struct infer_state *s = q->s;
    const struct format_config *c = &q->m->cfg;
    uint32_t nkv = c->n_kv_heads, split = 0;
    uint64_t work = (uint64_t)q->r->n * (q->r->vis.base + q->r->n) * c->n_heads * c->head_dim;
    uint64_t least = s->npu_min_weights < ATTN_SPLIT_MIN ? s->npu_min_weights : ATTN_SPLIT_MIN;
    if (s->dev && s->attn == &infer_attention_dense && !s->split_work && nkv >= 2 &&
        work >= least) {
        if (!s->att_dev &&
            !(s->att_dev = sl_alloc_aligned(sizeof(float) * INFER_ATT_ROWS * c->seq_len, 64))) {
            sl_err_set(err, "out of memory for the attention's scratch");
            return -ENOMEM;
        }
        split = nkv / 2;
    }
    struct attn_shared dev = {.q = q, .layer = layer, .end = split};
    atomic_init(&dev.next, 0);
    struct npu_ticket *t = NULL;
    int ret = 0;
    if (split && (ret = npu_device_call(s->dev, attn_shared_run, &dev, &t, err)) < 0)
        return ret;
    int r_own = attn_heads(q, layer, split, nkv, s->att);
    if (t) {
        int r_rest = attn_drain(&dev, s->att);
        /* not started yet (a busy machine): taken back, its heads are done */
        ret = npu_ticket_revoke(s->dev, t);
        if (ret == -ECANCELED)
            ret = 0;
        else
            s->npu_jobs++;
        r_own = r_own < 0 ? r_own : r_rest;
    }
    if (ret == 0)
        ret = r_own;
    if (ret < 0)
        sl_err_set(err, "attention (%s) failed in layer %d", s->attn->name, layer);
    return ret;
}

/* x [n][D] of the rows r through layer l, in place. */
static int layer_rows(struct infer_model *m, struct infer_state *s, int layer, float *x,
                      const struct infer_rows *r, struct sl_err *err)
{
    struct rows_ctx q = {m, s, r};
    const struct infer_layer_hooks h = {rows_linear, rows_attention, &q, rows_linears};
    return infer_layer_run(m, s, layer, x, r->n, &h, err);
}

/* Layer-granular calibration API: rows at positions pos.. written at slots
 * pos.. (a chain over the slots below). */
int infer_layer_forward(struct infer_model *m, struct infer_state *s, int layer, float *x,
                        uint32_t n, uint32_t pos, struct sl_err *err)
{
    const struct format_config *c = &m->cfg;
    if (n > s->max_batch || (uint64_t)pos + n > s->kv->cap) {
        sl_err_set(err, "batch of %u rows at position %u exceeds the state (%u rows, %u positions)",
                   n, pos, s->max_batch, s->kv->cap);
        return -EINVAL;
    }
    if (layer < 0 || (uint32_t)layer >= c->n_layers) {
        sl_err_set(err, "no layer %d", layer);
        return -EINVAL;
    }
    if (pos + n > s->kv->len) { /* the slots this call writes become part of the cache */
        uint32_t from = pos > s->kv->len ? pos : s->kv->len;
        for (uint32_t i = from; i < pos + n; i++)
            s->kv->pos[i] = i;
        if (pos > s->kv->len) /* slots skipped: treated as positions too */
            for (uint32_t i = s->kv->len; i < pos; i++)
                s->kv->pos[i] = i;
        s->kv->len = pos + n;
    }
    for (uint32_t i = 0; i < n; i++)
        s->pos[i] = pos + i;
    struct infer_rows r = {.n = n, .slot0 = pos, .pos = s->pos,
                           .vis = {.n = n, .base = pos}};
    return layer_rows(m, s, layer, x, &r, err);
}

int infer_head_forward(struct infer_model *m, struct infer_state *s, const float *x, uint32_t n,
                       float *logits, struct sl_err *err)
{
    if (!m->globals_loaded) {
        sl_err_set(err, "the classifier is not loaded");
        return -EINVAL;
    }
    if (n > s->max_batch) {
        sl_err_set(err, "%u rows exceed the state's %u", n, s->max_batch);
        return -EINVAL;
    }
    infer_step_head_norm(m, s->xb, x, n);
    return infer_linear_exec(m, s, -1, FORMAT_ROLE_CLASSIFIER, m->cls, logits, s->xb, n, err);
}

/* The classifier for the rows of this batch [b0, b0 + nb) that are listed;
 * runs of consecutive rows in one call (a batched GEMM). *li: next list entry.
 * An int8 classifier with dynamic activation scales takes its scale from all
 * the rows of a call, so there each row is its own call: a row's logits are
 * then the same whichever other rows were asked for (the last row of a
 * prefill that keeps every row's logits equals the plain prefill's). */
static int head_rows(struct infer_model *m, struct infer_state *s, const struct infer_batch *b,
                     uint32_t b0, uint32_t nb, uint32_t *li, float *logits, struct sl_err *err)
{
    size_t V = m->cfg.vocab_size, D = m->cfg.dim;
    int dynamic = !m->cls->w && !(m->cls->act_scale > 0);
    while (*li < b->n_logits && b->logits_rows[*li] < b0 + nb) {
        uint32_t first = *li, row = b->logits_rows[first];
        uint32_t run = 1;
        while (!dynamic && first + run < b->n_logits && b->logits_rows[first + run] == row + run &&
               row + run < b0 + nb)
            run++;
        int ret = infer_head_forward(m, s, s->x + (size_t)(row - b0) * D, run,
                                     logits + (size_t)first * V, err);
        if (ret < 0)
            return ret;
        *li += run;
    }
    return 0;
}

static int check_batch(const struct infer_model *m, const struct infer_state *s,
                       const struct infer_batch *b, struct sl_err *err)
{
    uint32_t len = s->kv->len;
    if ((uint64_t)len + b->n > s->kv->cap) {
        sl_err_set(err, "%u tokens after %u exceed the context of %u", b->n, len, s->kv->cap);
        return -EINVAL;
    }
    if (b->parent && b->n > s->max_batch) {
        sl_err_set(err, "a tree of %u rows exceeds the batch of %u", b->n, s->max_batch);
        return -EINVAL;
    }
    for (uint32_t i = 0; b->parent && i < b->n; i++)
        if (b->parent[i] < -1 || b->parent[i] >= (int32_t)i) {
            sl_err_set(err, "row %u's parent %d is not an earlier row", i, b->parent[i]);
            return -EINVAL;
        }
    for (uint32_t i = 0; b->pos && i < b->n; i++)
        if (b->pos[i] >= m->cfg.seq_len) {
            sl_err_set(err, "row %u's position %u is past the context of %u", i, b->pos[i],
                       m->cfg.seq_len);
            return -EINVAL;
        }
    for (uint32_t i = 0; i < b->n_logits; i++)
        if (b->logits_rows[i] >= b->n || (i && b->logits_rows[i] <= b->logits_rows[i - 1])) {
            sl_err_set(err, "logits rows must ascend within the batch (entry %u)", i);
            return -EINVAL;
        }
    return 0;
}

/* A tree's attention scratch in the state (infer_attn_tree), grown by half
 * again past what this call needs, so that a growing context reallocates
 * it seldom. */
static int tree_scratch(const struct format_config *c, struct infer_state *s,
                        struct infer_attn_rows *vis, struct sl_err *err)
{
    size_t need = infer_attn_tree_floats(c, vis->n, vis->base + vis->n);
    if (s->tree_cap < need) {
        size_t most = infer_attn_tree_floats(c, vis->n, c->seq_len);
        size_t cap = need + need / 2 < most ? need + need / 2 : most;
        sl_free_aligned(s->tree);
        s->tree_cap = 0;
        if (!(s->tree = sl_alloc_aligned(sizeof(float) * cap, 64))) {
            sl_err_set(err, "out of memory for a draft tree's attention scores (%zu floats)", cap);
            return -ENOMEM;
        }
        s->tree_cap = cap;
    }
    vis->tree_scratch = s->tree;
    vis->tree_floats = s->tree_cap;
    return 0;
}

int infer_forward_batch(struct infer_model *m, struct infer_state *s, const struct infer_batch *b,
                        float *logits, struct sl_err *err)
{
    const struct format_config *c = &m->cfg;
    int ret = check_batch(m, s, b, err);
    if (ret < 0 || b->n == 0)
        return ret;
    uint32_t base = s->kv->len, li = 0;
    for (uint32_t done = 0; done < b->n;) {
        uint32_t nb = b->n - done < s->max_batch ? b->n - done : s->max_batch;
        uint32_t slot0 = base + done;
        for (uint32_t i = 0; i < nb; i++)
            s->pos[i] = b->pos ? b->pos[done + i] : slot0 + i;
        ret = infer_kv_reserve(s->kv, nb, s->pos, 0);
        if (ret == 0)
            ret = infer_embed(m, b->tokens + done, nb, s->x, err);
        struct infer_rows r = {.n = nb, .slot0 = slot0, .pos = s->pos,
                               .vis = {.n = nb, .base = slot0, .parent = b->parent}};
        if (ret == 0 && b->parent)
            ret = tree_scratch(c, s, &r.vis, err);
        for (uint32_t l = 0; ret == 0 && l < c->n_layers; l++)
            ret = layer_rows(m, s, (int)l, s->x, &r, err);
        if (ret == 0)
            ret = head_rows(m, s, b, done, nb, &li, logits, err);
        if (ret < 0) {
            s->kv->len = base; /* nothing of a failed call stays in the cache */
            return ret;
        }
        done += nb;
    }
    return 0;
}

int infer_forward(struct infer_model *m, struct infer_state *s, const int *tokens, uint32_t n,
                  uint32_t pos, float *logits, enum infer_logits_mode mode, struct sl_err *err)
{
    const struct format_config *c = &m->cfg;
    if (n == 0)
        return 0;
    if ((uint64_t)pos + n > c->seq_len) {
        sl_err_set(err, "%u tokens at position %u exceed the context of %u", n, pos, c->seq_len);
        return -EINVAL;
    }
    /* the cache is cut or extended to pos: a sequence restarted or rewound
     * there, or (as this call always allowed) slots skipped, which keep
     * whatever they held */
    for (uint32_t i = s->kv->len; i < pos; i++)
        s->kv->pos[i] = i;
    s->kv->len = pos;
    uint32_t *rows = NULL, last = n - 1;
    struct infer_batch b = {.n = n, .tokens = tokens};
    if (mode == INFER_LOGITS_LAST) {
        b.logits_rows = &last;
        b.n_logits = 1;
    } else if (mode == INFER_LOGITS_ALL) {
        rows = sl_malloc(sizeof *rows * n);
        if (!rows) {
            sl_err_set(err, "out of memory");
            return -ENOMEM;
        }
        for (uint32_t i = 0; i < n; i++)
            rows[i] = i;
        b.logits_rows = rows;
        b.n_logits = n;
    }
    int ret = infer_forward_batch(m, s, &b, logits, err);
    free(rows);
    return ret;
}
