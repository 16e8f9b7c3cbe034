/* infer_multi.c: several sequences in one forward pass (continuous
 * batching, infer.h "several sequences in one step"). The rows of every
 * sequence are stacked into one batch: embedding, norms, residuals, SwiGLU
 * and the linear layers run once over all of them (one float GEMM, or one
 * int8 GEMM on the NPU device and the calling thread), while RoPE, the KV
 * cache write and attention run per sequence, at its own positions, over its
 * own cache, with its own state's attention implementation. Every row is
 * computed as its own sequence's forward pass computes it (the operators are
 * row-wise and the GEMMs give each row the same bits whatever rows share the
 * call), so each sequence's logits equal running its rows alone, bit for
 * bit. The one operator that is not row-wise is an int8 linear with a
 * dynamic activation scale (one scale over the call's rows): there each
 * sequence's rows run as a call of their own. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "npu.h"

struct infer_multi {
    struct infer_model *m;
    struct infer_state *st; /* scratch for max_rows rows (its own cache is not used) */
    struct npu_device *dev;
    uint32_t max_rows;
    int *tok;          /* [max_rows] the stacked tokens */
    uint32_t *off;     /* [max_rows + 1] first row of each sequence */
    uint32_t *base;    /* [max_rows] each sequence's cache length before the call */
    float *x_last;     /* [max_rows][D] the last rows of the sequences that want logits */
    float *logits;     /* [max_rows][V] their logits */
};

int infer_multi_create(struct infer_model *m, const struct infer_multi_opts *o,
                       struct infer_multi **out, struct sl_err *err)
{
    struct infer_multi_opts d = o ? *o : (struct infer_multi_opts){0};
    if (!d.max_rows)
        d.max_rows = 256;
    struct infer_multi *mb = sl_calloc(1, sizeof *mb);
    if (!mb) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    mb->m = m;
    mb->max_rows = d.max_rows;
    int ret = infer_state_create(m, d.max_rows, &mb->st, err);
    if (ret < 0)
        goto fail;
    size_t R = d.max_rows, D = m->cfg.dim, V = m->cfg.vocab_size;
    mb->tok = sl_malloc(R * sizeof *mb->tok);
    mb->off = sl_malloc((R + 1) * sizeof *mb->off);
    mb->base = sl_malloc(R * sizeof *mb->base);
    mb->x_last = sl_malloc(R * D * sizeof(float));
    mb->logits = sl_malloc(R * V * sizeof(float));
    if (!mb->tok || !mb->off || !mb->base || !mb->x_last || !mb->logits) {
        sl_err_set(err, "out of memory for a step of %u rows", d.max_rows);
        ret = -ENOMEM;
        goto fail;
    }
    if (!d.no_npu) {
        if ((ret = npu_device_create(&mb->dev)) < 0) {
            sl_err_set(err, "cannot start the NPU device (%d)", ret);
            goto fail;
        }
        mb->st->dev = mb->dev;
        mb->st->split_work = 1;
        if (d.npu_share > 0 && d.npu_share < 1)
            mb->st->npu_share = d.npu_share;
        if (d.npu_min_weights)
            mb->st->npu_min_weights = d.npu_min_weights;
    }
    *out = mb;
    return 0;
fail:
    infer_multi_destroy(mb);
    return ret;
}

void infer_multi_destroy(struct infer_multi *mb)
{
    if (!mb)
        return;
    infer_state_destroy(mb->st);
    npu_device_destroy(mb->dev);
    free(mb->tok);
    free(mb->off);
    free(mb->base);
    free(mb->x_last);
    free(mb->logits);
    free(mb);
}

uint32_t infer_multi_max_rows(const struct infer_multi *mb) { return mb->max_rows; }
uint64_t infer_multi_npu_jobs(const struct infer_multi *mb) { return mb->st->npu_jobs; }

uint64_t infer_multi_dev_calls(const struct infer_multi *mb)
{
    uint64_t revoked = 0;
    if (mb->dev) { /* the batch's own device: its revocations are this batch's */
        struct npu_device_stats st;
        npu_device_stats(mb->dev, &st);
        revoked = st.jobs_revoked;
    }
    return mb->st->npu_jobs + revoked;
}
struct infer_model *infer_multi_model(const struct infer_multi *mb) { return mb->m; }

/* The hooks' context: the step's sequences. */
struct multi_ctx {
    struct infer_multi *mb;
    const struct infer_seq *seqs;
    uint32_t k;
};

/* A linear over the stacked rows: one call, or one per sequence where an
 * int8 linear's dynamic activation scale would mix the sequences' rows. */
static int multi_linear(void *ctx, int layer, uint32_t role, const struct infer_linear *lin,
                        float *y, const float *x, struct sl_err *err)
{
    struct multi_ctx *q = ctx;
    struct infer_multi *mb = q->mb;
    struct infer_model *m = mb->m;
    uint32_t k = q->k, total = mb->off[k];
    if (lin->w || lin->act_scale > 0 || k == 1)
        return infer_linear_exec(m, mb->st, layer, role, lin, y, x, total, err);
    for (uint32_t i = 0; i < k; i++) {
        uint32_t r0 = mb->off[i], n = mb->off[i + 1] - r0;
        int ret = infer_linear_exec(m, mb->st, layer, role, lin, y + (size_t)r0 * lin->rows,
                                    x + (size_t)r0 * lin->cols, n, err);
        if (ret < 0)
            return ret;
    }
    return 0;
}

/* Attention per sequence, at its own positions over its own cache. */
static int multi_attention(void *ctx, int l, struct sl_err *err)
{
    struct multi_ctx *q = ctx;
    struct infer_multi *mb = q->mb;
    struct infer_model *m = mb->m;
    struct infer_state *s = mb->st;
    const struct format_config *c = &m->cfg;
    uint32_t Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
    for (uint32_t i = 0; i < q->k; i++) {
        struct infer_state *si = q->seqs[i].s;
        uint32_t r0 = mb->off[i], ni = mb->off[i + 1] - r0;
        struct infer_rows r = {.n = ni, .slot0 = mb->base[i], .pos = s->pos + r0,
                               .vis = {.n = ni, .base = mb->base[i]}};
        int ret = infer_step_attention(m, si->kv, si->attn, l, &r, s->q + (size_t)r0 * Q,
                                       s->k + (size_t)r0 * KV, s->v + (size_t)r0 * KV, 0,
                                       c->n_kv_heads, s->att_out + (size_t)r0 * Q, s->att);
        if (ret < 0) {
            sl_err_set(err, "attention (%s) failed in layer %d", si->attn->name, l);
            return ret;
        }
    }
    return 0;
}

static int check_seqs(const struct infer_multi *mb, const struct infer_seq *seqs, uint32_t k,
                      struct sl_err *err)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < k; i++) {
        const struct infer_seq *q = &seqs[i];
        if (!q->s || !q->tokens || q->n == 0) {
            sl_err_set(err, "sequence %u of the step has no state or no rows", i);
            return -EINVAL;
        }
        if ((uint64_t)q->s->kv->len + q->n > q->s->kv->cap) {
            sl_err_set(err, "sequence %u: %u tokens after %u exceed the context of %u", i, q->n,
                       q->s->kv->len, q->s->kv->cap);
            return -EINVAL;
        }
        for (uint32_t j = 0; j < i; j++)
            if (seqs[j].s == q->s) {
                sl_err_set(err, "sequences %u and %u of the step share one state", j, i);
                return -EINVAL;
            }
        total += q->n;
    }
    if (total > mb->max_rows) {
        sl_err_set(err, "a step of %llu rows exceeds the %u it was made for",
                   (unsigned long long)total, mb->max_rows);
        return -EINVAL;
    }
    return 0;
}

/* The classifier over the last rows of the sequences that want logits,
 * gathered into one batch. */
static int multi_head(struct infer_multi *mb, const struct infer_seq *seqs, uint32_t k,
                      struct sl_err *err)
{
    struct infer_model *m = mb->m;
    size_t D = m->cfg.dim, V = m->cfg.vocab_size;
    uint32_t nl = 0;
    for (uint32_t i = 0; i < k; i++)
        if (seqs[i].logits)
            memcpy(mb->x_last + nl++ * D, mb->st->x + (size_t)(mb->off[i + 1] - 1) * D,
                   D * sizeof(float));
    /* one call; a row at a time where a dynamic activation scale would mix them */
    int one = !m->cls->w && !(m->cls->act_scale > 0);
    for (uint32_t r = 0; r < nl; r += one ? 1 : nl) {
        int ret = infer_head_forward(m, mb->st, mb->x_last + r * D, one ? 1 : nl,
                                     mb->logits + r * V, err);
        if (ret < 0)
            return ret;
    }
    nl = 0;
    for (uint32_t i = 0; i < k; i++)
        if (seqs[i].logits)
            memcpy(seqs[i].logits, mb->logits + nl++ * V, V * sizeof(float));
    return 0;
}

int infer_forward_multi(struct infer_multi *mb, const struct infer_seq *seqs, uint32_t k,
                        struct sl_err *err)
{
    struct infer_model *m = mb->m;
    int ret = check_seqs(mb, seqs, k, err);
    if (ret < 0 || k == 0)
        return ret;
    /* the rows: sequence i's at [off[i], off[i + 1]), positions after its cache */
    uint32_t n = 0;
    for (uint32_t i = 0; i < k; i++) {
        struct infer_kv *kv = seqs[i].s->kv;
        mb->off[i] = n;
        mb->base[i] = kv->len;
        memcpy(mb->tok + n, seqs[i].tokens, sizeof(int) * seqs[i].n);
        for (uint32_t j = 0; j < seqs[i].n; j++)
            mb->st->pos[n + j] = kv->len + j;
        (void)infer_kv_reserve(kv, seqs[i].n, NULL, kv->len); /* room checked above */
        n += seqs[i].n;
    }
    mb->off[k] = n;
    ret = infer_embed(m, mb->tok, n, mb->st->x, err);
    /* each layer as infer_forward runs it, with the linears over the stacked
     * rows and attention per sequence */
    struct multi_ctx q = {mb, seqs, k};
    const struct infer_layer_hooks h = {multi_linear, multi_attention, &q, NULL};
    for (uint32_t l = 0; ret == 0 && l < m->cfg.n_layers; l++)
        ret = infer_layer_run(m, mb->st, (int)l, mb->st->x, n, &h, err);
    if (ret == 0)
        ret = multi_head(mb, seqs, k, err);
    if (ret < 0) /* nothing of a failed step stays in any cache */
        for (uint32_t i = 0; i < k; i++)
            seqs[i].s->kv->len = mb->base[i];
    return ret;
}
