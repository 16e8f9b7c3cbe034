/* infer_linear.c: linear layers, float or int8, and their forward pass. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "infer_matmul.h"
#include "npu.h"
#include "unpack.h"

#ifndef SLUICE_KERNELS_X86
#define SLUICE_KERNELS_X86 0
#endif

int infer_linear_init(struct infer_linear *lin, const struct format_tensor_info *t,
                      const void *data, int borrow, int force_dynamic_act, struct sl_err *err)
{
    memset(lin, 0, sizeof *lin);
    lin->rows = (uint32_t)t->shape[0];
    lin->cols = (uint32_t)(t->n_dims == 2 ? t->shape[1] : 1);
    size_t n = (size_t)lin->rows * lin->cols;
    const struct format_encoding_traits *tr = format_encoding_traits(t->encoding);
    if (!tr->quantized) {
        /* F16 and BF16 stay 16-bit; all three are little-endian in the
         * container as in memory on the targets this builds for, so they can
         * be used where they lie (FORMAT_TENSOR_ALIGN keeps them aligned) */
        int half = t->encoding == FORMAT_ENC_F16 || t->encoding == FORMAT_ENC_BF16;
        lin->wtype = t->encoding == FORMAT_ENC_F16    ? INFER_W_F16
                     : t->encoding == FORMAT_ENC_BF16 ? INFER_W_BF16
                                                      : INFER_W_F32;
        if (borrow && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__) {
            lin->w = (void *)(uintptr_t)data;
            lin->w_borrowed = 1;
            return 0;
        }
        lin->w = sl_alloc_aligned(n * (half ? 2 : sizeof(float)), 64);
        if (!lin->w) {
            sl_err_set(err, "out of memory for tensor '%s'", t->name);
            return -ENOMEM;
        }
        if (half)
            memcpy(lin->w, data, n * 2);
        else if (format_decode_float(t->encoding, data, lin->w, n) < 0) {
            sl_err_set(err, "tensor '%s' has encoding %u, not a float", t->name, t->encoding);
            infer_linear_fini(lin);
            return -EINVAL;
        }
        return 0;
    }
    lin->q = sl_alloc_aligned(n, 64);
    lin->scale = sl_malloc(sizeof(float) * lin->rows);
    if (!lin->q || !lin->scale) {
        infer_linear_fini(lin);
        sl_err_set(err, "out of memory for tensor '%s'", t->name);
        return -ENOMEM;
    }
    int ret = unpack_tensor_int8(t, data, lin->q, lin->scale, err);
    if (ret < 0) {
        sl_err_prefix(err, "tensor '%s'", t->name);
        infer_linear_fini(lin);
        return ret;
    }
    lin->act_scale = force_dynamic_act ? 0.0f : t->act_scale;
    if (!format_act_scale_valid(lin->act_scale)) { /* format_reader_open refuses it first */
        sl_err_set(err,
                   "tensor '%s' has activation scale %g; it must be positive and finite, or 0 "
                   "for dynamic scaling",
                   t->name, (double)lin->act_scale);
        infer_linear_fini(lin);
        return -EINVAL;
    }
    ret = npu_weights_create(lin->q, lin->scale, lin->rows, lin->cols, &lin->npu);
    if (ret < 0) {
        sl_err_set(err, "tensor '%s': cannot prepare int8 weights (%s)", t->name, strerror(-ret));
        infer_linear_fini(lin);
        return ret;
    }
    /* the NPU's copy is the only one kept: matmuls use it, and lookups (an
     * int8 embedding) read rows back from it (npu_weights_row) */
    sl_free_aligned(lin->q);
    free(lin->scale);
    lin->q = NULL;
    lin->scale = NULL;
    return 0;
}

void infer_linear_fini(struct infer_linear *lin)
{
    if (!lin->w_borrowed)
        sl_free_aligned(lin->w);
    sl_free_aligned(lin->q);
    free(lin->scale);
    npu_weights_destroy(lin->npu);
    if (lin->upk) {
        unpack_tensor_fini(lin->upk);
        free(lin->upk);
    }
    if (!lin->packed_borrowed)
        sl_free_aligned(lin->packed);
    memset(lin, 0, sizeof *lin);
}

void infer_op_linear_int8(float *y, const float *x, const struct infer_linear *lin, uint32_t n,
                          int8_t *xq)
{
    size_t len = (size_t)n * lin->cols;
    float s = lin->act_scale > 0 ? lin->act_scale : npu_act_scale_dynamic(x, len);
    npu_quantize_act(x, len, s, xq);
    npu_linear_s8(lin->npu, xq, n, s, y);
}


/* The offset of the first block of 8 (from x) with an element whose x * inv
 * is beyond [-127, 127], or len rounded down to 8 when there is none: the
 * same products as the scalar loop below, and |u| > 127 is u > 127 or
 * u < -127 (false for NaN). Four lanes at a time (GCC and Clang vector
 * extensions; any ISA); infer_clip_next_avx2 equals it. */
typedef float sl_v4f __attribute__((vector_size(16)));
typedef int32_t sl_v4i __attribute__((vector_size(16)));

size_t infer_clip_next_scalar(const float *x, size_t len, float inv)
{
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        sl_v4i any = {0, 0, 0, 0};
        for (int j = 0; j < 8; j += 4) {
            sl_v4f u;
            memcpy(&u, x + i + j, sizeof u);
            u = u * inv;
            any |= (u > 127.0f) | (u < -127.0f);
        }
        if (any[0] | any[1] | any[2] | any[3])
            return i;
    }
    return i;
}

static size_t clip_next(const float *x, size_t len, float inv)
{
#if SLUICE_KERNELS_X86
    if (infer_matmul_kernel_used() != INFER_MATMUL_SCALAR)
        return infer_clip_next_avx2(x, len, inv);
#endif
    return infer_clip_next_scalar(x, len, inv);
}

/* Records element i (v = x[i] * inv, clipped) in c, growing b: -ENOMEM. */
static int clip_push(struct infer_clipbuf *b, struct infer_clipped *c, size_t i, uint32_t cols,
                     float v)
{
    if (c->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        uint32_t *r = sl_realloc(b->row, cap * sizeof *r);
        if (r)
            b->row = r;
        uint32_t *cc = r ? sl_realloc(b->col, cap * sizeof *cc) : NULL;
        if (cc)
            b->col = cc;
        float *e = cc ? sl_realloc(b->excess, cap * sizeof *e) : NULL;
        if (!e)
            return -ENOMEM;
        b->excess = e;
        b->cap = cap;
    }
    b->row[c->n] = (uint32_t)(i / cols);
    b->col[c->n] = (uint32_t)(i % cols);
    b->excess[c->n] = v > 0 ? v - 127.0f : v + 127.0f;
    c->n++;
    return 0;
}

/* A fresh list for activations quantized with scale s; and the finished
 * list pointing at the buffer's arrays (which clip_push may have moved). */
static void clip_begin(struct infer_clipped *c, float s)
{
    c->n = 0;
    c->act_scale = s;
    c->store = 0;
    c->r0 = c->r1 = 0;
}

static void clip_end(const struct infer_clipbuf *b, struct infer_clipped *c)
{
    c->row = b->row;
    c->col = b->col;
    c->excess = b->excess;
}

int infer_find_clipped(struct infer_clipbuf *b, const float *x, uint32_t n, uint32_t cols,
                       float s, struct infer_clipped *c)
{
    size_t len = (size_t)n * cols;
    float inv = 1.0f / s;
    clip_begin(c, s);
    size_t end = 0; /* the elements before end are checked one by one */
    int ret = 0;
    for (size_t i = 0; ret == 0 && i < len; i++) {
        if (i >= end) { /* skip the blocks of 8 with nothing clipped */
            i += clip_next(x + i, len - i, inv);
            end = i + 8;
            if (i >= len)
                break;
        }
        float v = x[i] * inv; /* the quantizer's x / s (npu_quantize_act) */
        if (v > 127.0f || v < -127.0f) /* not inside the range, nor NaN (quantized to 0) */
            ret = clip_push(b, c, i, cols, v);
    }
    clip_end(b, c);
    return ret;
}

size_t infer_clip_next_q_scalar(const int8_t *xq, size_t len)
{
    size_t i = 0;
    for (; i + 32 <= len; i += 32) {
        int any = 0;
        for (int j = 0; j < 32; j++)
            any |= xq[i + j] == 127 || xq[i + j] == -127;
        if (any)
            return i;
    }
    return i;
}

static size_t clip_next_q(const int8_t *xq, size_t len)
{
#if SLUICE_KERNELS_X86
    if (infer_matmul_kernel_used() != INFER_MATMUL_SCALAR)
        return infer_clip_next_q_avx2(xq, len);
#endif
    return infer_clip_next_q_scalar(xq, len);
}

/* x * inv > 127 rounds to 127 or more and x * inv < -127 to -127 or less,
 * which the quantizer clamps to +-127: only those codes are looked at, the
 * test on each being infer_find_clipped's (the same products). */
int infer_find_clipped_q(struct infer_clipbuf *b, const float *x, const int8_t *xq, uint32_t n,
                         uint32_t cols, float s, struct infer_clipped *c)
{
    if (!(s > 0) || !isfinite(s)) /* npu_quantize_act zeroes the codes */
        return infer_find_clipped(b, x, n, cols, s, c);
    size_t len = (size_t)n * cols;
    float inv = 1.0f / s;
    clip_begin(c, s);
    size_t end = 0; /* the codes before end are looked at one by one */
    int ret = 0;
    for (size_t i = 0; ret == 0 && i < len; i++) {
        if (i >= end) { /* skip the blocks of 32 without +-127 */
            i += clip_next_q(xq + i, len - i);
            end = i + 32;
            if (i >= len)
                break;
        }
        if (xq[i] != 127 && xq[i] != -127)
            continue;
        float v = x[i] * inv;
        if (v > 127.0f || v < -127.0f)
            ret = clip_push(b, c, i, cols, v);
    }
    clip_end(b, c);
    return ret;
}

void infer_clipbuf_free(struct infer_clipbuf *b)
{
    free(b->row);
    free(b->col);
    free(b->excess);
    memset(b, 0, sizeof *b);
}

int infer_quantize_clipped(struct infer_state *st, const float *x, uint32_t n, uint32_t cols,
                           float s, int8_t *xq, struct infer_clipped *c)
{
    npu_quantize_act(x, (size_t)n * cols, s, xq);
    struct infer_clipbuf b = {st->clip_row, st->clip_col, st->clip_excess, st->clip_cap};
    int ret = infer_find_clipped_q(&b, x, xq, n, cols, s, c);
    st->clip_row = b.row;
    st->clip_col = b.col;
    st->clip_excess = b.excess;
    st->clip_cap = b.cap;
    return ret;
}

int infer_term_wants(const struct infer_model *m, int layer, uint32_t role)
{
    return m->term && (!m->term_wants || m->term_wants(m->term_ctx, layer, role));
}

/* The NPU graph rows for a batch of n: decode and verification shapes, or
 * the state's batch (prefill chunks). */
static uint32_t graph_rows(const struct infer_state *s, uint32_t n)
{
    static const uint32_t small[] = {1, 4, 8, 16};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
        if (n <= small[i])
            return small[i];
    return s->max_batch;
}

/* A linear's output channels shared with the state's device thread: the
 * device's share [0, end) is handed out in chunks from an atomic counter;
 * the device thread takes them, and so does the calling thread once its own
 * share is done, so a device thread that starts late (a busy machine) costs
 * at most one chunk of waiting. part computes channels [r0, r1) of ops; each
 * channel is computed the same way whatever the range, so any split gives
 * the same bits. */
typedef void split_part_fn(const void *ops, uint32_t r0, uint32_t r1);
struct split_shared {
    split_part_fn *part;
    const void *ops;
    uint32_t end, chunk;
    _Atomic uint32_t next;
};

static void split_drain(struct split_shared *sh)
{
    uint32_t r0;
    while ((r0 = atomic_fetch_add(&sh->next, sh->chunk)) < sh->end)
        sh->part(sh->ops, r0, sh->end - r0 < sh->chunk ? sh->end : r0 + sh->chunk);
}

static int split_run(void *arg)
{
    split_drain(arg);
    return 0;
}

/* Channels [0, rows) of ops: [0, r_dev) offered to the device thread in
 * chunks of about an eighth (a multiple of unit), [r_dev, rows) on this
 * thread, which then takes the chunks not yet started; a call the device
 * thread has not started at all is taken back (npu_ticket_revoke) rather
 * than waited for. */
static int split_with_device(struct infer_state *s, split_part_fn *part, const void *ops,
                             uint32_t r_dev, uint32_t rows, uint32_t unit, struct sl_err *err)
{
    uint32_t chunk = r_dev / 8 / unit * unit;
    struct split_shared sh = {.part = part, .ops = ops, .end = r_dev,
                              .chunk = chunk < unit ? unit : chunk};
    atomic_init(&sh.next, 0);
    struct npu_ticket *t = NULL;
    int ret = npu_device_call(s->dev, split_run, &sh, &t, err);
    if (ret < 0)
        return ret;
    part(ops, r_dev, rows);
    split_drain(&sh);
    ret = npu_ticket_revoke(s->dev, t);
    if (ret == -ECANCELED)
        return 0;
    if (ret < 0) {
        sl_err_set(err, "the device thread did not run its part of a matmul (%d)", ret);
        return ret;
    }
    s->npu_jobs++;
    return 0;
}

/* A few rows' int8 linear on activations staged once (linear_s8_few). */
struct s8_part {
    const struct npu_weights *w;
    const void *stage;
    uint32_t n, ldy;
    float act;
    float *y;
};

static void s8_part_do(const void *ops, uint32_t r0, uint32_t r1)
{
    const struct s8_part *p = ops;
    npu_linear_s8_staged(p->w, p->stage, p->n, p->act, p->y, p->ldy, r0, r1);
}

#define S8_CHUNK 64 /* output channels: a multiple of the GEMM's 16-channel tiles */

/* The few-rows split (a decode step, a draft tree's verification): the NPU
 * graph job took a fixed half of the channels and the calling thread
 * waited for it; on a busy machine the device thread is often not running
 * when its half is due (the 8-row verification of tinyllama int8 read
 * x1.5-1.6 of a one-row step by the median against x1.24-1.30 by the
 * minimum). Here the device thread's half is host work in chunks (the same
 * GEMM, npu_linear_s8_staged, on activations staged once), shared as a
 * float linear's is (split_with_device). The bits are those of every other
 * split: each output channel is computed the same way whatever the range
 * (npu.h). */
int infer_reserve_aligned(void **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    void *p = sl_alloc_aligned(need, 64);
    if (!p)
        return -ENOMEM;
    sl_free_aligned(*buf);
    *buf = p;
    *cap = need;
    return 0;
}

static int linear_s8_few(struct infer_state *s, const struct infer_linear *lin,
                         const int8_t *xq, uint32_t n, float act, float *y, uint32_t r_dev,
                         struct sl_err *err)
{
    if (infer_reserve_aligned(&s->stage, &s->stage_cap, npu_stage_bytes(n, lin->cols)) < 0) {
        sl_err_set(err, "out of memory for a linear's activations");
        return -ENOMEM;
    }
    npu_stage_act(xq, n, lin->cols, s->stage);
    struct s8_part op = {lin->npu, s->stage, n, lin->rows, act, y};
    return split_with_device(s, s8_part_do, &op, r_dev, lin->rows, S8_CHUNK, err);
}

/* y = x W^T of an int8 linear: the NPU device takes the first npu_share of
 * the output channels while this thread computes the rest (bit-identical to
 * one thread: every output channel is computed the same way, npu.h); a few
 * rows share the device's part (linear_s8_few). */
static int linear_s8(struct infer_state *s, const struct infer_linear *lin, const int8_t *xq,
                     uint32_t n, float act, float *y, struct sl_err *err)
{
    uint32_t rows = lin->rows;
    uint32_t r_npu = 0;
    /* a hand-off to the device thread costs ~10-20 us (a wake-up): worth it
     * from about a million weights (~100 us of int8 streaming) */
    if (s && s->dev && rows >= 32 && infer_split_work(s, lin, n) >= s->npu_min_weights)
        r_npu = (uint32_t)(rows * s->npu_share) / 16 * 16;
    if (r_npu == 0) {
        npu_linear_s8(lin->npu, xq, n, act, y);
        return 0;
    }
    if (n <= INFER_MATMUL_ROWS_MAX)
        return linear_s8_few(s, lin, xq, n, act, y, r_npu, err);
    const struct npu_graph *g;
    int ret = npu_device_graph(s->dev, graph_rows(s, n), lin->cols, rows, &g, err);
    if (ret < 0)
        return ret;
    struct npu_job job = {.graph = g, .w = lin->npu, .a_type = NPU_DTYPE_INT8, .xq = xq,
                          .rows = n, .r0 = 0, .r1 = r_npu, .act_scale = act, .y = y, .ldy = rows};
    struct npu_ticket *t;
    ret = npu_device_submit(s->dev, &job, &t, err);
    if (ret < 0)
        return ret;
    npu_linear_s8_range(lin->npu, xq, n, act, y, rows, r_npu, rows);
    ret = npu_ticket_wait(t);
    if (ret < 0) {
        sl_err_set(err, "the NPU did not run a matmul (%d)", ret);
        return ret;
    }
    s->npu_jobs++;
    return 0;
}

uint64_t infer_split_work(const struct infer_state *s, const struct infer_linear *lin,
                          uint32_t n)
{
    return (uint64_t)lin->rows * lin->cols * (s->split_work ? n : 1);
}

/* A float linear's operands; float_part_do computes output channels
 * [r0, r1) (infer_op_matmul computes each channel the same way whatever the
 * range, so a split gives the same bits). */
struct float_part {
    const struct infer_linear *lin;
    const float *x;
    uint32_t n;
    float *y;
};

static void float_part_do(const struct float_part *p, uint32_t r0, uint32_t r1)
{
    infer_op_matmul(p->y, p->x, p->lin->w, p->lin->wtype, p->n, p->lin->rows, p->lin->cols, r0, r1);
}

static void float_part_run(const void *ops, uint32_t r0, uint32_t r1)
{
    float_part_do(ops, r0, r1);
}

/* A float linear: the first npu_share of the output channels on the state's
 * device thread (host work, npu_device_call) beside the calling thread,
 * for a multi-sequence step's states (split_work) and for one to a few rows
 * (a decode step, a draft tree's verification: INFER_MATMUL_ROWS_MAX at
 * most), once the multiply-adds of all rows reach npu_min_weights
 * (FEW_SPLIT_MIN for a few rows: measured on kjv6L-1k, where a one-row step's
 * and a 2-row tree's 256 x 688 linears gain from it); else the calling
 * thread (a smaller linear is worth less than the hand-off). The calling
 * thread then takes what the device thread has not started of its share
 * (split_with_device), and takes the call back if the thread has not started it
 * at all (npu_ticket_revoke): on a busy machine the split costs a queue
 * push, not a wait. */
#define FEW_SPLIT_MIN (1u << 17)
#define SHARE_CHUNK 48 /* output channels: a multiple of the tiles' 3 and 4 */
static int linear_float(struct infer_state *s, const struct infer_linear *lin, const float *x,
                        uint32_t n, float *y, struct sl_err *err)
{
    uint32_t rows = lin->rows, r_dev = 0;
    int few = n <= INFER_MATMUL_ROWS_MAX;
    uint64_t least = s ? s->npu_min_weights : 0;
    if (s && !s->split_work && FEW_SPLIT_MIN < least)
        least = FEW_SPLIT_MIN;
    if (s && s->dev && (s->split_work || few) && rows >= 32 &&
        (uint64_t)rows * lin->cols * n >= least)
        r_dev = (uint32_t)(rows * s->npu_share) / 16 * 16;
    struct float_part own = {lin, x, n, y};
    if (r_dev == 0) {
        float_part_do(&own, 0, rows);
        return 0;
    }
    return split_with_device(s, float_part_run, &own, r_dev, rows, SHARE_CHUNK, err);
}

int infer_linear_exec(const struct infer_model *m, struct infer_state *s, int layer,
                      uint32_t role, const struct infer_linear *lin, float *y, const float *x,
                      uint32_t n, struct sl_err *err)
{
    int ret = 0;
    if (lin->w) {
        if ((ret = linear_float(s, lin, x, n, y, err)) < 0)
            return ret;
    } else {
        size_t len = (size_t)n * lin->cols;
        float act = lin->act_scale > 0 ? lin->act_scale : npu_act_scale_dynamic(x, len);
        struct infer_clipped clip = {0};
        int term = infer_term_wants(m, layer, role);
        if (term)
            ret = infer_quantize_clipped(s, x, n, lin->cols, act, s->xq, &clip);
        else
            npu_quantize_act(x, len, act, s->xq);
        if (ret == 0)
            ret = !lin->npu && lin->upk ? infer_linear_packed(s, lin, s->xq, n, act, y, err)
                                        : linear_s8(s, lin, s->xq, n, act, y, err);
        if (ret == 0 && term)
            ret = m->term(m->term_ctx, layer, role, &clip, y, n, lin->rows);
        if (ret < 0) {
            if (!err || !err->msg[0])
                sl_err_set(err, "the int8 linear of layer %d failed (%d)", layer, ret);
            return ret;
        }
    }
    if (m->observe)
        m->observe(m->observe_ctx, layer, role, x, n, lin->cols, y, lin->rows);
    return 0;
}

int infer_linear_exec_group(const struct infer_model *m, struct infer_state *s, int layer,
                            uint32_t count, const uint32_t *roles,
                            const struct infer_linear *const *lins, float *const *ys,
                            const float *x, uint32_t n, struct sl_err *err)
{
    int joint = count >= 2 && count <= INFER_PACKED_GROUP_MAX && !m->observe;
    for (uint32_t j = 0; joint && j < count; j++)
        joint = !lins[j]->w && infer_packed_shares(s, lins[j], n) &&
                lins[j]->cols == lins[0]->cols && !infer_term_wants(m, layer, roles[j]);
    if (joint) {
        /* each linear's activations as infer_linear_exec quantizes them;
         * linears of one scale share them */
        size_t len = (size_t)n * lins[0]->cols;
        if ((count - 1) * len > s->xq_group_cap) {
            int8_t *g = sl_realloc(s->xq_group, (count - 1) * len);
            if (!g) {
                sl_err_set(err, "out of memory for a packed group's activations");
                return -ENOMEM;
            }
            s->xq_group = g;
            s->xq_group_cap = (count - 1) * len;
        }
        float act[INFER_PACKED_GROUP_MAX], dyn = 0.0f;
        const int8_t *xq[INFER_PACKED_GROUP_MAX];
        for (uint32_t j = 0; j < count; j++) {
            if (lins[j]->act_scale > 0) {
                act[j] = lins[j]->act_scale;
            } else {
                if (dyn == 0.0f)
                    dyn = npu_act_scale_dynamic(x, len);
                act[j] = dyn;
            }
            xq[j] = NULL;
            for (uint32_t i = 0; i < j && !xq[j]; i++)
                if (act[i] == act[j])
                    xq[j] = xq[i];
            if (!xq[j]) {
                int8_t *b = j ? s->xq_group + (j - 1) * len : s->xq;
                npu_quantize_act(x, len, act[j], b);
                xq[j] = b;
            }
        }
        int ret = infer_linear_packed_group(s, count, lins, xq, act, ys, n, err);
        if (ret < 0 && (!err || !err->msg[0]))
            sl_err_set(err, "the int8 linears of layer %d failed (%d)", layer, ret);
        return ret;
    }
    for (uint32_t j = 0; j < count; j++) {
        int ret = infer_linear_exec(m, s, layer, roles[j], lins[j], ys[j], x, n, err);
        if (ret < 0)
            return ret;
    }
    return 0;
}

void infer_model_set_linear_term(struct infer_model *m, infer_linear_term_fn fn, void *ctx)
{
    m->term = fn;
    m->term_ctx = ctx;
}

void infer_model_set_linear_term_filter(struct infer_model *m, infer_linear_term_wants_fn fn)
{
    m->term_wants = fn;
}

struct infer_linear *infer_model_linear(struct infer_model *m, int layer, uint32_t role)
{
    if (layer < 0)
        return role == FORMAT_ROLE_CLASSIFIER ? m->cls : NULL;
    if ((uint32_t)layer >= m->cfg.n_layers)
        return NULL;
    struct infer_layer *l = &m->layers[layer];
    switch (role) {
    case FORMAT_ROLE_WQ:
        return &l->wq;
    case FORMAT_ROLE_WK:
        return &l->wk;
    case FORMAT_ROLE_WV:
        return &l->wv;
    case FORMAT_ROLE_WO:
        return &l->wo;
    case FORMAT_ROLE_W_GATE:
        return &l->w_gate;
    case FORMAT_ROLE_W_UP:
        return &l->w_up;
    case FORMAT_ROLE_W_DOWN:
        return &l->w_down;
    default:
        return NULL;
    }
}
