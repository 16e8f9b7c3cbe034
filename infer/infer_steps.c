/* infer_steps.c: the CPU steps of a Llama layer (llama2.c run.c's order:
 * RMSNorm, Q/K/V, RoPE, attention, O, residual, RMSNorm, gate/up, SwiGLU,
 * down, residual), each defined once. The batched forward runs them in
 * sequence over a batch; the cold-start pipeline runs the same functions as
 * tasks over chunks, head groups and column ranges. Shapes: n rows, D = dim,
 * Q = n_heads * head_dim, KV = n_kv_heads * head_dim, F = hidden_dim. */
#include "infer_internal.h"

void infer_step_attn_norm(const struct infer_model *m, int layer, float *xb, const float *x,
                          uint32_t n)
{
    infer_op_rmsnorm(xb, x, m->layers[layer].attn_norm, n, m->cfg.dim, m->cfg.norm_eps);
}

int infer_step_attention(const struct infer_model *m, struct infer_kv *kv,
                         const struct infer_attention *attn, int layer, const struct infer_rows *r,
                         float *q, float *k, const float *v, uint32_t kv0, uint32_t kv1, float *out,
                         float *scratch)
{
    const struct format_config *c = &m->cfg;
    uint32_t hd = c->head_dim, mul = c->n_heads / c->n_kv_heads;
    infer_op_rope_rows(q, r->n, c->n_heads, hd, kv0 * mul, kv1 * mul, r->pos, c->rope_theta);
    infer_op_rope_rows(k, r->n, c->n_kv_heads, hd, kv0, kv1, r->pos, c->rope_theta);
    infer_kv_write(kv, (uint32_t)layer, r->slot0, r->n, k, v, kv0, kv1);
    return attn->run(attn, c, kv, (uint32_t)layer, &r->vis, q, kv0 * mul, kv1 * mul, out, scratch);
}

void infer_step_ffn_norm(const struct infer_model *m, int layer, float *x, const float *o,
                         float *xb, uint32_t n)
{
    if (o)
        infer_op_add(x, o, (size_t)n * m->cfg.dim);
    infer_op_rmsnorm(xb, x, m->layers[layer].ffn_norm, n, m->cfg.dim, m->cfg.norm_eps);
}

void infer_step_swiglu(float *g, const float *u, uint32_t n, uint32_t F, uint32_t f0, uint32_t f1)
{
    if (f0 == 0 && f1 == F) { /* elementwise: the same bits in one piece or many */
        infer_op_swiglu(g, g, u, (size_t)n * F);
        return;
    }
    for (uint32_t r = 0; r < n; r++) {
        float *gr = g + (size_t)r * F + f0;
        infer_op_swiglu(gr, gr, u + (size_t)r * F + f0, f1 - f0);
    }
}

void infer_step_residual(float *x, const float *d, uint32_t n, uint32_t D)
{
    infer_op_add(x, d, (size_t)n * D);
}

void infer_step_head_norm(const struct infer_model *m, float *xb, const float *x, uint32_t n)
{
    infer_op_rmsnorm(xb, x, m->out_norm, n, m->cfg.dim, m->cfg.norm_eps);
}
