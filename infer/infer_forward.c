/* infer_forward.c: the Llama forward pass over a batch of rows, as llama2.c's
 * run.c computes it for one token: per layer, attention then the SwiGLU FFN,
 * each behind an RMSNorm and a residual add. */
#include <errno.h>
#include <string.h>

#include "infer_internal.h"

int infer_embed(const struct infer_model *m, const int *tokens, uint32_t n, float *x,
                struct sl_err *err)
{
    if (!m->globals_loaded) {
        sl_err_set(err, "the embedding is not loaded");
        return -EINVAL;
    }
    return infer_op_embed(m, tokens, n, x, err);
}

/* x [n][D] at positions pos..pos+n-1 through layer l, in place. */
int infer_layer_forward(struct infer_model *m, struct infer_state *s, int layer, float *x,
                        uint32_t n, uint32_t pos, struct sl_err *err)
{
    const struct format_config *c = &m->cfg;
    const struct infer_layer *w = &m->layers[layer];
    if (!w->loaded) {
        sl_err_set(err, "layer %d is not loaded", layer);
        return -EINVAL;
    }
    if (n > s->max_batch || pos + n > c->seq_len) {
        sl_err_set(err, "batch of %u rows at position %u exceeds the state (%u rows, %u positions)",
                   n, pos, s->max_batch, c->seq_len);
        return -EINVAL;
    }
    uint32_t D = c->dim, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
    uint32_t F = c->hidden_dim;
    float *kc = s->key_cache + (size_t)layer * c->seq_len * KV;
    float *vc = s->value_cache + (size_t)layer * c->seq_len * KV;

    /* attention: xb = rmsnorm(x); q, k, v = xb Wq, xb Wk, xb Wv; RoPE */
    infer_op_rmsnorm(s->xb, x, w->attn_norm, n, D, c->norm_eps);
    infer_linear_forward(m, layer, FORMAT_ROLE_WQ, &w->wq, s->q, s->xb, n, s->xq);
    infer_linear_forward(m, layer, FORMAT_ROLE_WK, &w->wk, s->k, s->xb, n, s->xq);
    infer_linear_forward(m, layer, FORMAT_ROLE_WV, &w->wv, s->v, s->xb, n, s->xq);
    infer_op_rope(s->q, n, c->n_heads, c->head_dim, pos, c->rope_theta);
    infer_op_rope(s->k, n, c->n_kv_heads, c->head_dim, pos, c->rope_theta);
    memcpy(kc + (size_t)pos * KV, s->k, (size_t)n * KV * sizeof(float));
    memcpy(vc + (size_t)pos * KV, s->v, (size_t)n * KV * sizeof(float));
    infer_op_attention(s->att_out, s->q, kc, vc, n, pos, c, 0, c->n_heads, s->att);
    /* x += att_out Wo */
    infer_linear_forward(m, layer, FORMAT_ROLE_WO, &w->wo, s->xb, s->att_out, n, s->xq);
    infer_op_add(x, s->xb, (size_t)n * D);

    /* FFN: x += (silu(xb Wg) * (xb Wu)) Wd with xb = rmsnorm(x) */
    infer_op_rmsnorm(s->xb, x, w->ffn_norm, n, D, c->norm_eps);
    infer_linear_forward(m, layer, FORMAT_ROLE_W_GATE, &w->w_gate, s->hb, s->xb, n, s->xq);
    infer_linear_forward(m, layer, FORMAT_ROLE_W_UP, &w->w_up, s->hb2, s->xb, n, s->xq);
    infer_op_swiglu(s->hb, s->hb, s->hb2, (size_t)n * F);
    infer_linear_forward(m, layer, FORMAT_ROLE_W_DOWN, &w->w_down, s->xb, s->hb, n, s->xq);
    infer_op_add(x, s->xb, (size_t)n * D);
    (void)Q;
    return 0;
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
    infer_op_rmsnorm(s->xb, x, m->out_norm, n, m->cfg.dim, m->cfg.norm_eps);
    infer_linear_forward(m, -1, FORMAT_ROLE_CLASSIFIER, &m->cls, logits, s->xb, n, s->xq);
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
    for (uint32_t done = 0; done < n;) {
        uint32_t b = n - done < s->max_batch ? n - done : s->max_batch;
        int ret = infer_embed(m, tokens + done, b, s->x, err);
        for (uint32_t l = 0; ret == 0 && l < c->n_layers; l++)
            ret = infer_layer_forward(m, s, (int)l, s->x, b, pos + done, err);
        if (ret < 0)
            return ret;
        if (mode == INFER_LOGITS_ALL) {
            ret = infer_head_forward(m, s, s->x, b, logits + (size_t)done * c->vocab_size, err);
        } else if (mode == INFER_LOGITS_LAST && done + b == n) {
            /* the first token needs the classifier for the last row only */
            ret = infer_head_forward(m, s, s->x + (size_t)(b - 1) * c->dim, 1, logits, err);
        }
        if (ret < 0)
            return ret;
        done += b;
    }
    return 0;
}
