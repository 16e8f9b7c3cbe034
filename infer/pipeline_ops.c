/* pipeline_ops.c: what one task computes. The arithmetic of every operator
 * is exactly that of infer_forward with max_batch = chunk (the same
 * infer_op_* calls on the same rows), so the logits are bit-identical to a
 * sequential run; matmul pieces, attention head groups and SwiGLU pieces
 * compute disjoint columns, and attention pieces of query rows disjoint
 * rows, with the same bits as the whole. Calls
 * pipeline_weights.c, pipeline_graph.c and pl_fail (pipeline_queue.c). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "unpack.h"

/* The role whose int8 codes (layer, role) reads: q and v take k's, up takes
 * gate's, where both are int8 and their act scales are the same (the same
 * input, scale and rounding: the same codes, quantized once); else role. */
static uint32_t code_lead(const struct pl *p, int layer, uint32_t role)
{
    uint32_t lead = role == FORMAT_ROLE_WQ || role == FORMAT_ROLE_WV ? FORMAT_ROLE_WK
                    : role == FORMAT_ROLE_W_UP                       ? FORMAT_ROLE_W_GATE
                                                                     : role;
    float a = p->lin_info[layer + 1][role].act, l = p->lin_info[layer + 1][lead].act;
    if (lead == role || !p->lin_info[layer + 1][role].int8 ||
        !p->lin_info[layer + 1][lead].int8 || !(a > 0 ? a == l : l <= 0))
        return role;
    return lead;
}

/* Points the q/v and up inputs of the chunk's (freshly bound) set at their
 * lead's codes where code_lead shares them (before any of them is written
 * or read: PL_NORM runs before the layer's other tasks of the chunk). */
static void share_codes(struct pl *p, struct chunkbuf *b, int layer)
{
    static const uint32_t roles[] = {FORMAT_ROLE_WQ, FORMAT_ROLE_WV, FORMAT_ROLE_W_UP};
    for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++)
        b->xq[roles[k]] = b->xq[code_lead(p, layer, roles[k])];
}

static void quantize_for(struct pl *p, struct chunkbuf *b, int layer, uint32_t role,
                         const float *x, uint32_t rows, uint32_t cols)
{
    if (!p->lin_info[layer + 1][role].int8)
        return; /* float weights take the float input */
    uint32_t lead = code_lead(p, layer, role);
    if (lead != role) { /* its lead quantized the same input first */
        b->act[role] = b->act[lead];
        return;
    }
    size_t n = (size_t)rows * cols;
    float act = p->lin_info[layer + 1][role].act;
    float s = act > 0 ? act : npu_act_scale_dynamic(x, n);
    npu_quantize_act(x, n, s, b->xq[role]);
    b->act[role] = s;
}

/* quantize_for of columns [c0, c1) of rows [r0, r0 + rows) of x [][cols] (a
 * piece of the producer, or the trimmed last layer's last row; static scales
 * only, see input_splits and trim_allowed): the same codes. */
static void quantize_cols(struct pl *p, struct chunkbuf *b, int layer, uint32_t role,
                          const float *x, uint32_t r0, uint32_t rows, uint32_t cols, uint32_t c0,
                          uint32_t c1)
{
    if (r0 == 0 && rows == b->n && c0 == 0 && c1 == cols) {
        quantize_for(p, b, layer, role, x, rows, cols);
        return;
    }
    if (!p->lin_info[layer + 1][role].int8)
        return;
    float s = p->lin_info[layer + 1][role].act;
    if (code_lead(p, layer, role) == role) /* else its lead wrote the codes */
        for (uint32_t r = r0; r < r0 + rows; r++)
            npu_quantize_act(x + (size_t)r * cols + c0, c1 - c0, s,
                             b->xq[role] + (size_t)r * cols + c0);
    if (c0 == 0 && r0 + rows == b->n) /* one writer (the pieces of attention's rows: the
                                         last); the matmuls read it after every piece */
        b->act[role] = s;
}

/* SwiGLU over columns [f0, f1) of rows [r0, r0 + rows) with down's codes
 * written row by row, each right after its row (from L1: a chunk's whole
 * piece, written first, was re-read from beyond L2), where down quantizes
 * with a static scale (quantize_cols per row: its codes and act, the
 * SwiGLU's bits, both elementwise). Returns 0 without doing anything where
 * that does not apply (a dynamic scale needs the whole piece first; float
 * weights take the float input). */
static int swiglu_quantized(struct pl *p, struct chunkbuf *b, int layer, uint32_t r0,
                            uint32_t rows, uint32_t F, uint32_t f0, uint32_t f1)
{
    const uint32_t role = FORMAT_ROLE_W_DOWN;
    if (!p->lin_info[layer + 1][role].int8 || !(p->lin_info[layer + 1][role].act > 0))
        return 0;
    for (uint32_t r = r0; r < r0 + rows; r++) {
        infer_step_swiglu(b->g + (size_t)r * F, b->u + (size_t)r * F, 1, F, f0, f1);
        quantize_cols(p, b, layer, role, b->g, r, 1, F, f0, f1);
    }
    return 1;
}

/* The rows a task computes: [*r0, *r0 + return) of its chunk (PL_TRIM_LAST:
 * the last one). */
static uint32_t task_rows(const struct chunkbuf *b, const struct task *t, uint32_t *r0)
{
    *r0 = t->trim == PL_TRIM_LAST ? b->n - 1 : 0;
    return t->trim == PL_TRIM_LAST ? 1 : b->n;
}

static const float *mm_input(struct chunkbuf *b, uint32_t role, uint32_t *cols,
                             const struct format_config *c)
{
    uint32_t D = c->dim;
    switch (role) {
    case FORMAT_ROLE_WO:
        *cols = c->n_heads * c->head_dim;
        return b->att;
    case FORMAT_ROLE_W_DOWN:
        *cols = c->hidden_dim;
        return b->g;
    case FORMAT_ROLE_CLASSIFIER:
        *cols = D;
        return b->xh;
    case FORMAT_ROLE_W_GATE:
    case FORMAT_ROLE_W_UP:
        *cols = D;
        return b->xf;
    default:
        *cols = D;
        return b->xb;
    }
}

static float *mm_output(struct pl *p, struct chunkbuf *b, uint32_t role)
{
    switch (role) {
    case FORMAT_ROLE_WQ:
        return b->q;
    case FORMAT_ROLE_WK:
        return b->k;
    case FORMAT_ROLE_WV:
        return b->v;
    case FORMAT_ROLE_WO:
        return b->o;
    case FORMAT_ROLE_W_GATE:
        return b->g;
    case FORMAT_ROLE_W_UP:
        return b->u;
    case FORMAT_ROLE_W_DOWN:
        return b->d;
    default:
        return p->logits;
    }
}


/* The role whose clipped elements (layer, role)'s term reads: the first
 * linear with a term of the same input (Q/K/V; gate/up) at the same
 * activation scale (the same elements), else its own. */
static uint32_t clip_lead(const struct pl *p, int layer, uint32_t role)
{
    static const uint32_t qkv[] = {FORMAT_ROLE_WQ, FORMAT_ROLE_WK, FORMAT_ROLE_WV};
    static const uint32_t gu[] = {FORMAT_ROLE_W_GATE, FORMAT_ROLE_W_UP};
    int is_qkv = role >= FORMAT_ROLE_WQ && role <= FORMAT_ROLE_WV;
    int n = is_qkv ? 3 : role == FORMAT_ROLE_W_GATE || role == FORMAT_ROLE_W_UP ? 2 : 0;
    const uint32_t *g = is_qkv ? qkv : gu;
    for (int k = 0; k < n && g[k] != role; k++)
        if (p->lin_info[layer + 1][g[k]].term &&
            p->lin_info[layer + 1][g[k]].act == p->lin_info[layer + 1][role].act)
            return g[k];
    return role;
}

/* The clipped elements of (layer, role)'s input, found once per input and
 * scale (clip_lead) into the chunk's cache, from the codes quantize_for
 * wrote (infer_find_clipped_q: what infer_linear_exec finds), by the first
 * shadow piece to run (gate/up: by PL_FFN_NORM, whose float output the up
 * matmul overwrites): *out, or -ENOMEM. */
static int find_clips(struct pl *p, struct chunkbuf *b, int layer, uint32_t role,
                      const struct pl_clips **out)
{
    uint32_t lead = clip_lead(p, layer, role);
    struct pl_clips *pc = &b->clips[lead];
    pthread_mutex_lock(&pc->mu);
    if (pc->layer != layer) {
        uint32_t cols;
        const float *x = mm_input(b, lead, &cols, p->c);
        uint32_t n = lead == FORMAT_ROLE_CLASSIFIER ? 1 : b->n; /* the head: the last row */
        float act = p->lin_info[layer + 1][lead].act;
        float s = act > 0 ? act : npu_act_scale_dynamic(x, (size_t)n * cols);
        pc->ret = infer_find_clipped_q(&pc->buf, x, b->xq[lead], n, cols, s, &pc->clip);
        pc->layer = layer;
    }
    int ret = pc->ret;
    pthread_mutex_unlock(&pc->mu);
    *out = pc;
    return ret;
}

/* PL_SHADOW: the model's linear term on what the quantizer clips of the
 * matmul's input, for the task's piece of output channels, added in place
 * to the matmul's output (the task comes after that piece of the matmul and
 * before its consumers: the same float sums as the forward's y += term);
 * a down projection's piece is then added to the residual stream x (the
 * forward's x += y, the chunk's d being the set's scratch). */
static int run_shadow(struct pl *p, struct chunkbuf *b, const struct task *t, struct sl_err *err)
{
    int layer = t->layer;
    uint32_t role = t->role;
    const struct pl_clips *pc;
    int ret = find_clips(p, b, layer, role, &pc);
    if (ret < 0) {
        sl_err_set(err, "out of memory finding the clipped inputs of layer %d %s", layer,
                   format_role_name(role));
        return ret;
    }
    const struct infer_linear *lin = pl_graph_linear(p, layer, role);
    struct infer_clipped clip = pc->clip; /* read only once found */
    clip.store = 0;                       /* added to the NPU's output rows */
    clip.r0 = t->r0;
    clip.r1 = t->r1;
    uint32_t n = role == FORMAT_ROLE_CLASSIFIER ? 1 : b->n;
    ret = p->m->term(p->m->term_ctx, layer, role, &clip, mm_output(p, b, role), n, lin->rows);
    if (ret < 0)
        sl_err_set(err, "the linear term of layer %d %s failed (%d)", layer,
                   format_role_name(role), ret);
    else if (role == FORMAT_ROLE_W_DOWN) /* the piece with its term, to x (the forward's sums) */
        for (uint32_t r = 0; r < b->n; r++)
            infer_op_add(b->x + (size_t)r * lin->rows + t->r0, b->d + (size_t)r * lin->rows + t->r0,
                         t->r1 - t->r0);
    return ret;
}

/* Output channels [r0, r1) of n rows straight from a linear's packed bytes
 * (unpack_tensor_dot): the int8 path's sums and formula (npu.h), so the
 * same floats as the NPU's. */
static int mm_packed(const struct infer_linear *lin, const int8_t *xq, uint32_t n, float act,
                     float *y, uint32_t r0, uint32_t r1, struct sl_err *err)
{
    int32_t *acc = sl_malloc(sizeof *acc * (size_t)n * (r1 - r0));
    if (!acc) {
        sl_err_set(err, "out of memory for a packed matmul's sums");
        return -ENOMEM;
    }
    int ret = unpack_tensor_dot(lin->upk, unpack_kernel_best(), r0, r1, xq, n, acc, r1 - r0);
    for (uint32_t i = 0; ret == 0 && i < n; i++)
        for (uint32_t r = r0; r < r1; r++) {
            float s = act * unpack_tensor_scale(lin->upk, r);
            y[(size_t)i * lin->rows + r] = s * (float)acc[(size_t)i * (r1 - r0) + (r - r0)];
        }
    free(acc);
    if (ret < 0)
        sl_err_set(err, "a packed matmul (%u x %u) failed", lin->rows, lin->cols);
    return ret;
}

/* An o or down projection without a linear term: each piece adds its
 * output channels to the residual stream as soon as it is computed (x += o
 * or x += d, the same elementwise sums as the forward's residual), an NPU
 * job in its own output write (pl_prepare_job: npu_job.add, y = x), so o
 * and d are scratch of the (layer, chunk)'s activation set, and PL_FFN_NORM
 * only normalizes; with a term its shadow task adds d after the term, and
 * PL_FFN_NORM adds o. */
int pl_mm_adds_residual(const struct pl *p, const struct task *t)
{
    return t->op == PL_MM && (t->role == FORMAT_ROLE_WO || t->role == FORMAT_ROLE_W_DOWN) &&
           t->layer >= 0 && !p->lin_info[t->layer + 1][t->role].term;
}

void pl_mm_residual(struct pl *p, const struct task *t, int fused)
{
    if (fused || !pl_mm_adds_residual(p, t))
        return;
    struct chunkbuf *b = &p->cb[t->chunk];
    size_t D = p->c->dim;
    const float *y = mm_output(p, b, t->role);
    uint32_t r0 = t->r0, r1 = t->r1 > t->r0 ? t->r1 : (uint32_t)D, i0;
    uint32_t n = task_rows(b, t, &i0);
    for (uint32_t r = i0; r < i0 + n; r++)
        infer_op_add(b->x + r * D + r0, y + r * D + r0, r1 - r0);
}

/* Attention of query rows [q0, q1) of the chunk, kv heads [kv0, kv1): with
 * store_kv, every row's keys roped and stored with the values first (what
 * infer_step_attention does first), then the rows' queries roped and
 * attended over the cache up to each row's position (none where q0 == q1).
 * Used by the pieces of a kv head group (pl_graph_build: the one with
 * q0 == 0 stores, the others run after it) and by the trimmed last layer
 * (enum pl_trim: the last row only, or keys and values only). Dense causal
 * attention computes a query row with the same bits whatever rows, heads
 * or block it is computed with (infer_op_attention: every score its own dot
 * product, every output one chain over the keys in order), so a piece's rows
 * get the whole chunk's bits (infer_attn.c). */
static int attn_rows(struct pl *p, struct chunkbuf *b, const struct task *t,
                     const struct infer_rows *rows, uint32_t kv0, uint32_t kv1, int store_kv,
                     uint32_t q0, uint32_t q1, float *scratch)
{
    const struct format_config *c = p->c;
    uint32_t hd = c->head_dim, mul = c->n_heads / c->n_kv_heads, Q = c->n_heads * hd;
    /* the rotations from the run's table (rows->pos are the prompt's
     * positions b->pos0..): the same bits as computing them per call */
    const struct infer_rope_table *rt = p->rope.cos ? &p->rope : NULL;
    if (store_kv) {
        if (rt)
            infer_op_rope_table(b->k, b->n, c->n_kv_heads, hd, kv0, kv1, rt, b->pos0);
        else
            infer_op_rope_rows(b->k, b->n, c->n_kv_heads, hd, kv0, kv1, rows->pos, c->rope_theta);
        infer_kv_write(p->st->kv, (uint32_t)t->layer, rows->slot0, b->n, b->k, b->v, kv0, kv1);
    }
    if (q1 == q0)
        return 0;
    float *q = b->q + (size_t)q0 * Q;
    if (rt)
        infer_op_rope_table(q, q1 - q0, c->n_heads, hd, kv0 * mul, kv1 * mul, rt, b->pos0 + q0);
    else
        infer_op_rope_rows(q, q1 - q0, c->n_heads, hd, kv0 * mul, kv1 * mul, rows->pos + q0,
                           c->rope_theta);
    struct infer_attn_rows vis = {.n = q1 - q0, .base = b->pos0 + q0};
    return p->st->attn->run(p->st->attn, c, p->st->kv, (uint32_t)t->layer, &vis, q, kv0 * mul,
                            kv1 * mul, b->att + (size_t)q0 * Q, scratch);
}

/* Runs task ti on worker `w` (0: the NPU device thread; CPU workers 1..). */
int pl_run_task(struct pl *p, uint32_t ti, int w, float *att_scratch)
{
    struct task *t = &p->tasks[ti];
    const struct format_config *c = p->c;
    struct sl_err err = {{0}};
    uint32_t D = c->dim, Q = c->n_heads * c->head_dim;
    uint32_t F = c->hidden_dim;
    struct chunkbuf *b = &p->cb[t->chunk];
    uint32_t i0, nr = task_rows(b, t, &i0); /* the rows it computes */
    int ret = 0;
    switch (t->op) {
    case PL_VERIFY: {
        if (t->slice == UINT32_MAX)
            return 0; /* barrier */
        const struct format_slice_info *s = format_reader_slice(p->r, t->slice);
        const uint8_t *data = p->slice_data[t->slice];
        /* mapped slices are hashed by the driver as they come (pipeline_map.c) */
        if (!p->slice_ok || !p->slice_ok[t->slice])
            ret = format_slice_verify(p->r, t->slice, data, &err);
        for (uint32_t k = s->first_tensor; ret == 0 && k < s->first_tensor + s->n_tensors; k++) {
            const struct format_tensor_info *ti2 = format_reader_tensor(p->r, k);
            if (ti2->n_dims != 1)
                continue;
            float **dst = ti2->role == FORMAT_ROLE_ATTN_NORM ? &p->m->layers[ti2->layer].attn_norm
                          : ti2->role == FORMAT_ROLE_FFN_NORM ? &p->m->layers[ti2->layer].ffn_norm
                                                              : &p->m->out_norm;
            ret = pl_weights_decode_norm(ti2, data + (ti2->offset - s->offset), dst);
            if (ret < 0)
                sl_err_set(&err, "norm '%s' cannot be decoded", ti2->name);
        }
        break;
    }
    case PL_UNPACK: {
        uint64_t t0 = sl_now_ns();
        const struct format_slice_info *s = format_reader_slice(p->r, t->slice);
        const struct format_tensor_info *ti2 = format_reader_tensor(p->r, (uint32_t)t->tensor);
        struct infer_linear *lin = pl_graph_linear(p, t->layer, t->role);
        const uint8_t *data = p->slice_data[t->slice] + (ti2->offset - s->offset);
        /* the worker's scratch where its rows fit (fill_linear allocates otherwise) */
        int8_t *scratch = ti2->shape[1] <= p->fill_cols ? p->fill_scratch[w] : NULL;
        if (p->lin_info[t->layer + 1][t->role].packed_mm) { /* its matmul reads the packed bytes */
            ret = 0;
        } else if (t->r1 > t->r0 || lin->npu) { /* a piece, or storage from the pool */
            uint32_t r1 = t->r1 > t->r0 ? t->r1 : lin->rows;
            ret = pl_weights_fill(lin, ti2, data, t->r0, r1, scratch, &err);
        } else {
            ret = pl_weights_unpack(lin, ti2, data, p->m->force_dynamic_act, 0, 1, scratch, &err);
        }
        /* packed residency: the first piece (or the whole tensor) keeps the bytes */
        if (ret == 0 && p->o->resident == INFER_RESIDENT_PACKED && t->r0 == 0)
            ret = pl_weights_keep_bytes(lin, ti2, data, p->m->slices != NULL, &err);
        pthread_mutex_lock(&p->lock);
        p->unpack_ns += sl_now_ns() - t0;
        pthread_mutex_unlock(&p->lock);
        break;
    }
    case PL_NORM: {
        pl_acts_bind(p, t->chunk, t->layer);
        share_codes(p, b, t->layer);
        infer_step_attn_norm(p->m, t->layer, b->xb, b->x, b->n);
        quantize_for(p, b, t->layer, FORMAT_ROLE_WK, b->xb, b->n, D); /* q's and v's lead */
        if (t->trim != PL_TRIM_KV) /* PL_TRIM_KV: no queries */
            quantize_for(p, b, t->layer, FORMAT_ROLE_WQ, b->xb, b->n, D);
        quantize_for(p, b, t->layer, FORMAT_ROLE_WV, b->xb, b->n, D);
        break;
    }
    case PL_ATTN: {
        /* kv heads [kv0, kv1) and their query heads (a group, or all) */
        const uint32_t hd = c->head_dim, mul = c->n_heads / c->n_kv_heads;
        uint32_t kv0 = t->r1 > t->r0 ? t->r0 : 0, kv1 = t->r1 > t->r0 ? t->r1 : c->n_kv_heads;
        struct infer_rows rows = {.n = b->n, .slot0 = b->pos0, .pos = p->positions + b->pos0,
                                  .vis = {.n = b->n, .base = b->pos0}};
        if (t->trim != PL_TRIM_NONE) {
            uint32_t q0 = t->trim == PL_TRIM_KV ? b->n : b->n - 1; /* no queries, or the last */
            ret = attn_rows(p, b, t, &rows, kv0, kv1, 1, q0, b->n, att_scratch);
        } else if (t->q1 > t->q0) { /* a piece of the rows */
            i0 = t->q0;
            nr = t->q1 - t->q0;
            ret = attn_rows(p, b, t, &rows, kv0, kv1, t->q0 == 0, t->q0, t->q1, att_scratch);
        } else {
            ret = infer_step_attention(p->m, p->st->kv, p->st->attn, t->layer, &rows, b->q, b->k,
                                       b->v, kv0, kv1, b->att, att_scratch);
        }
        if (ret < 0)
            sl_err_set(&err, "attention failed in layer %d", t->layer);
        if (t->trim != PL_TRIM_KV)
            quantize_cols(p, b, t->layer, FORMAT_ROLE_WO, b->att, i0, nr, Q, kv0 * mul * hd,
                          kv1 * mul * hd);
        break;
    }
    case PL_FFN_NORM:
        /* o's pieces added o to x already, unless o has a term; xf may be o */
        infer_step_ffn_norm(p->m, t->layer, b->x + (size_t)i0 * D,
                            p->lin_info[t->layer + 1][FORMAT_ROLE_WO].term ? b->o + (size_t)i0 * D
                                                                           : NULL,
                            b->xf + (size_t)i0 * D, nr);
        quantize_cols(p, b, t->layer, FORMAT_ROLE_W_GATE, b->xf, i0, nr, D, 0, D);
        quantize_cols(p, b, t->layer, FORMAT_ROLE_W_UP, b->xf, i0, nr, D, 0, D);
        /* their clipped elements now: the up matmul's output takes xf's memory */
        for (uint32_t r = FORMAT_ROLE_W_GATE; ret == 0 && r <= FORMAT_ROLE_W_UP; r++) {
            const struct pl_clips *pc;
            if (p->lin_info[t->layer + 1][r].term && find_clips(p, b, t->layer, r, &pc) < 0) {
                sl_err_set(&err, "out of memory finding the clipped inputs of layer %d",
                           t->layer);
                ret = -ENOMEM;
            }
        }
        break;
    case PL_SWIGLU: {
        uint32_t f0 = t->r1 > t->r0 ? t->r0 : 0, f1 = t->r1 > t->r0 ? t->r1 : F;
        if (swiglu_quantized(p, b, t->layer, i0, nr, F, f0, f1))
            break;
        infer_step_swiglu(b->g + (size_t)i0 * F, b->u + (size_t)i0 * F, nr, F, f0, f1);
        quantize_cols(p, b, t->layer, FORMAT_ROLE_W_DOWN, b->g, i0, nr, F, f0, f1);
        break;
    }
    case PL_HEAD: {
        /* the first token needs the last row only */
        float *xl = b->x + (size_t)(b->n - 1) * D;
        infer_step_head_norm(p->m, b->xh, xl, 1);
        quantize_for(p, b, -1, FORMAT_ROLE_CLASSIFIER, b->xh, 1, D);
        break;
    }
    case PL_SHADOW:
        ret = run_shadow(p, b, t, &err);
        break;
    case PL_MM: {
        const struct infer_linear *lin = pl_graph_linear(p, t->layer, t->role);
        uint32_t cols;
        const float *x = mm_input(b, t->role, &cols, c);
        float *y = mm_output(p, b, t->role);
        uint32_t rows = t->role == FORMAT_ROLE_CLASSIFIER ? 1 : nr;
        x += (size_t)i0 * cols; /* PL_TRIM_LAST: int8 weights (trim_allowed), only here */
        y += (size_t)i0 * lin->rows;
        if (!lin->npu && lin->upk) { /* packed residency's one-row matmuls (lin_info packed_mm) */
            ret = mm_packed(lin, b->xq[t->role] + (size_t)i0 * cols, rows, b->act[t->role], y,
                            t->r0, t->r1, &err);
            if (ret == 0)
                pl_mm_residual(p, t, 0);
            break;
        }
        if (!lin->npu) {
            infer_op_matmul(y, x, lin->w, (enum infer_wtype)lin->wtype, rows, lin->rows, lin->cols,
                            t->r0, t->r1);
            pl_mm_residual(p, t, 0);
            break;
        }
        /* an NPU job on a CPU worker: stolen work, run with the same code as
         * the device (the device thread itself never comes here), on the
         * worker's staging (kept for the chunk's next piece) */
        ret = npu_graph_run_cached(t->job.graph, &t->job, p->steal_stage[w], &p->steal_held[w],
                                   &err);
        t->job.stolen = 1;
        if (ret < 0)
            sl_err_prefix(&err, "the NPU refused a stolen job");
        else
            pl_mm_residual(p, t, t->job.add);
        (void)x;
        (void)y;
        (void)rows;
        break;
    }
    default:
        break;
    }
    if (ret < 0) {
        pthread_mutex_lock(&p->lock);
        pl_fail(p, ret, err.msg[0] ? err.msg : "a pipeline task failed");
        pthread_mutex_unlock(&p->lock);
    }
    return ret;
}

/* Fills an NPU task's job (lock held, when it is dispatched). */
void pl_prepare_job(struct pl *p, struct task *t)
{
    const struct infer_linear *lin = pl_graph_linear(p, t->layer, t->role);
    struct chunkbuf *b = &p->cb[t->chunk];
    uint32_t cols;
    mm_input(b, t->role, &cols, p->c);
    t->job.graph = p->graph[t->role == FORMAT_ROLE_WK ? FORMAT_ROLE_WV : t->role];
    t->job.w = lin->npu;
    uint32_t i0, nr = task_rows(b, t, &i0); /* PL_TRIM_LAST: the last row */
    t->job.xq = b->xq[t->role] + (size_t)i0 * cols;
    t->job.rows = t->role == FORMAT_ROLE_CLASSIFIER ? 1 : nr;
    t->job.act_scale = b->act[t->role];
    /* an o or down projection without a term: straight into the residual
     * stream (x's rows are D = lin->rows apart, as o's and d's) */
    t->job.add = pl_mm_adds_residual(p, t);
    t->job.y = (t->job.add ? b->x : mm_output(p, b, t->role)) + (size_t)i0 * lin->rows;
    t->job.ldy = lin->rows;
    t->job.r0 = t->r0;
    t->job.r1 = t->r1;
    t->job.user = t;
    /* every piece of a (layer, chunk, role) reads the same activations */
    t->job.stage_key = p->stage_key0 +
                       ((uint64_t)(t->layer + 1) * p->n_chunks + t->chunk) * FORMAT_ROLE_COUNT +
                       t->role;
}
