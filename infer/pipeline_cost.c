/* pipeline_cost.c: the graph's cost model. Each task gets a priority key
 * (full and sequential_granular: EdgeFlow 4.3's position-guided priority;
 * the others rank by arrival or by llm.npu 3.4's contribution, computed
 * from these estimates) and an estimated time in seconds, from operation
 * counts and nominal rates (the NPU's matmuls at 300 GOPS, attention at 50,
 * unpacking at 10 G weights/s): llm.npu's heuristic and the stealing rules
 * compare them, scaled by the NPU's measured pace. Calls nothing in the
 * pipeline. */
#include "pipeline.h"

/* topological order inside a layer, for tie-breaking */
static uint32_t op_order(uint32_t op, uint32_t role)
{
    switch (op) {
    case PL_NORM:
        return 0;
    case PL_ATTN:
        return 2;
    case PL_FFN_NORM:
        return 4;
    case PL_SWIGLU:
        return 6;
    case PL_HEAD:
        return 8;
    case PL_MM:
    case PL_SHADOW: /* beside its matmul */
        return role <= FORMAT_ROLE_WV ? 1 : role == FORMAT_ROLE_WO ? 3
               : role == FORMAT_ROLE_W_DOWN ? 7 : role == FORMAT_ROLE_CLASSIFIER ? 9 : 5;
    default:
        return 0;
    }
}

/* Output channels of a linear of this role. */
static uint32_t rows_of_role(const struct format_config *c, uint32_t role)
{
    uint32_t nd;
    uint64_t sh[2];
    format_role_shape(c, role == FORMAT_ROLE_CLASSIFIER && c->tied_embedding ? FORMAT_ROLE_TOK_EMBD
                                                                             : role,
                      &nd, sh);
    return (uint32_t)sh[0];
}

void pl_cost_assign(struct pl *p)
{
    const struct format_config *c = p->c;
    uint32_t L = c->n_layers, D = c->dim, Q = c->n_heads * c->head_dim, F = c->hidden_dim;
    for (uint32_t i = 0; i < p->n_tasks; i++) {
        struct task *t = &p->tasks[i];
        uint64_t layer = t->layer < 0 ? L + 1 : (uint64_t)t->layer;
        if (t->op == PL_VERIFY || t->op == PL_UNPACK) {
            /* weights just before their first use, by the first chunk: a
             * layer's verification after every task of the layer before, each
             * tensor's unpacking after the operators that precede its matmul
             * (so the NPU's next input is computed before weights it needs
             * later are unpacked, and Q/K/V are unpacked before O and the FFN) */
            uint64_t use = (layer + 1) << 44;
            t->key = t->op == PL_VERIFY
                         ? use - 128
                         : use + ((uint64_t)op_order(PL_MM, t->role) << 24) + t->r0 - 64 + t->role;
        } else
            /* layer first, then the chunk's position in the prompt, then the
             * operator's place in the layer (EdgeFlow's position-guided
             * priority inside a layer: an earlier chunk's FFN before a later
             * chunk's Q/K/V; across layers the chunks stay in step, so the
             * last layers still have two chunks' work to overlap) */
            t->key = ((layer + 1) << 44) | ((uint64_t)t->chunk << 28) |
                     ((uint64_t)op_order(t->op, t->role) << 24) | t->r0;
        /* the trimmed last layer (enum pl_trim): one row, or no attention */
        double rows = t->trim == PL_TRIM_LAST && t->op != PL_NORM ? 1 : p->cb[t->chunk].n;
        if (t->op == PL_MM) {
            const uint32_t cols = t->role == FORMAT_ROLE_WO ? Q
                                  : t->role == FORMAT_ROLE_W_DOWN ? F : D;
            t->est = 2.0 * (t->role == FORMAT_ROLE_CLASSIFIER ? 1 : rows) * cols * (t->r1 - t->r0) /
                     3e11;
        } else if (t->op == PL_ATTN) {
            double ctx = p->cb[t->chunk].pos0 + p->cb[t->chunk].n;
            double share = t->r1 > t->r0 ? (double)(t->r1 - t->r0) / c->n_kv_heads : 1.0;
            t->est = t->trim == PL_TRIM_KV ? 0 : 4.0 * rows * ctx * Q * share / 5e10;
            if (t->q1 > t->q0) { /* query rows [q0, q1): their share of the causal work */
                double p0 = p->cb[t->chunk].pos0;
                t->est *= (pl_attn_rows_work(p0, t->q1) - pl_attn_rows_work(p0, t->q0)) /
                          pl_attn_rows_work(p0, rows);
            }
        } else if (t->op == PL_SHADOW) {
            t->est = rows * (t->r1 - t->r0) * 0.01 / 1e10; /* a few outliers a row */
        } else if (t->op == PL_UNPACK) {
            t->est = (double)(t->r1 > t->r0 ? t->r1 - t->r0 : rows_of_role(c, t->role)) * D / 1e10;
        } else {
            t->est = rows * (D + F) * 10 / 1e10;
        }
    }
}
