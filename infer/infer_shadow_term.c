/* infer_shadow_term.c: the shadow term itself (infer_shadow.c has the
 * shadow's construction): the int8 axpy, the weight sources (hot copies,
 * NPU weights, packed tensors), the cold-column gather, and
 * infer_shadow_term over both paths (fused: in place; else gathered). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "infer_matmul.h"
#include "infer_shadow_internal.h"
#include "npu.h"
#include "unpack.h"

#ifndef SLUICE_KERNELS_X86
#define SLUICE_KERNELS_X86 0
#endif

int infer_shadow_wants(void *ctx, int layer, uint32_t role)
{
    const struct shadow_lin *l = shd_lin_of(ctx, layer, role);
    return l && l->slot;
}

void infer_shadow_axpy_s8_scalar(float *acc, float e, const int8_t *w, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        acc[i] += e * (float)w[i];
}

void infer_shadow_axpy_s8(float *acc, float e, const int8_t *w, uint32_t n)
{
#if SLUICE_KERNELS_X86
    switch (infer_matmul_kernel_used()) {
    case INFER_MATMUL_AVX512:
        infer_shadow_axpy_s8_avx512(acc, e, w, n);
        return;
    case INFER_MATMUL_AVX2:
        infer_shadow_axpy_s8_avx2(acc, e, w, n);
        return;
    default:
        break;
    }
#endif
    infer_shadow_axpy_s8_scalar(acc, e, w, n);
}

/* Where the term reads a linear's weights: its packed codes where they are
 * kept (packed residency: after the cold start there is no int8 copy, and
 * during it the pipeline's pool frees the copy once the matmuls are done,
 * maybe while a term still runs), column by column (unpack_tensor_col), else
 * the NPU's int8 copy. Both hold the same codes and scales (the copy is
 * unpacked from the same bytes), so the term's bits are the same. */
struct wsrc {
    const struct npu_weights *nw; /* NULL: the packed codes */
    const struct unpack_tensor *upk;
    const float *scale;           /* [rows]; packed: only [r0, r1) filled */
    float *scale_own;
    uint32_t r0, r1;              /* the output channels the call reads */
};

/* A term call reads only output channels [r0, r1) (its matmul piece): the
 * packed source decodes just those scales and column entries. */
static int wsrc_init(struct wsrc *w, const struct infer_linear *lin, uint32_t rows, uint32_t r0,
                     uint32_t r1)
{
    memset(w, 0, sizeof *w);
    w->r0 = r0;
    w->r1 = r1;
    if (lin->upk) {
        w->upk = lin->upk;
        if (lin->upk->layout.rows != rows || !(w->scale_own = sl_malloc(sizeof(float) * rows)))
            return lin->upk->layout.rows != rows ? -EINVAL : -ENOMEM;
        for (uint32_t r = r0; r < r1; r++)
            w->scale_own[r] = unpack_tensor_scale(lin->upk, r);
        w->scale = w->scale_own;
        return 0;
    }
    if (!lin->npu)
        return -EINVAL;
    w->nw = lin->npu;
    w->scale = npu_weights_scales(lin->npu);
    return 0;
}

static int wsrc_packed(const struct wsrc *w) { return w->nw == NULL; }
static const struct npu_weights *wsrc_npu(const struct wsrc *w) { return w->nw; }

/* Column c's codes into out[rows] (packed: rows [r0, r1) only). */
static void wsrc_col(const struct wsrc *w, uint32_t c, int8_t *out)
{
    if (w->nw)
        npu_weights_col(w->nw, c, out);
    else /* c < cols and the range is checked: cannot fail */
        (void)unpack_tensor_col_rows(w->upk, c, w->r0, w->r1, out);
}

/* The columns a call reads that are not resident: each gathered once from
 * the NPU's copy, in one pass over its blocks (npu_weights_gather_cols),
 * up to gather_max bytes; past that, one at a time into a small
 * direct-mapped cache. */

struct cold_cols {
    int32_t *idx;   /* [cols] gathered column index, -1: not gathered */
    uint32_t *list; /* the gathered channels, ascending */
    int8_t *w;      /* [n][rows] */
    uint32_t n;
    int8_t *cache; /* SHADOW_CACHE columns, direct-mapped by channel */
    int32_t tag[SHADOW_CACHE];
};

static void cold_free(struct cold_cols *cc)
{
    free(cc->idx);
    free(cc->list);
    free(cc->w);
    free(cc->cache);
}

static int cold_gather(struct cold_cols *cc, const struct shadow_lin *l, const struct wsrc *ws,
                       const struct infer_clipped *clip, uint32_t rows, uint32_t cols,
                       size_t gather_max)
{
    cc->idx = sl_malloc(sizeof(int32_t) * cols);
    cc->list = sl_malloc(sizeof(uint32_t) * cols);
    if (!cc->idx || !cc->list)
        return -ENOMEM;
    for (uint32_t c = 0; c < cols; c++)
        cc->idx[c] = -1;
    for (uint32_t i = 0; i < clip->n; i++)
        if (l->slot[clip->col[i]] < 0)
            cc->idx[clip->col[i]] = 0; /* wanted */
    size_t capz = gather_max / rows;
    uint32_t cap = capz < cols ? (uint32_t)capz : cols, n = 0, over = 0;
    for (uint32_t c = 0; c < cols; c++) {
        if (cc->idx[c] < 0)
            continue;
        if (n < cap) {
            cc->idx[c] = (int32_t)n;
            cc->list[n++] = c;
        } else {
            cc->idx[c] = -1;
            over = 1;
        }
    }
    cc->n = n;
    if (n && !(cc->w = sl_malloc((size_t)n * rows)))
        return -ENOMEM;
    if (n && !wsrc_packed(ws))
        npu_weights_gather_cols(wsrc_npu(ws), cc->list, n, cc->w);
    for (uint32_t k = 0; n && wsrc_packed(ws) && k < n; k++)
        wsrc_col(ws, cc->list[k], cc->w + (size_t)k * rows);
    if (over) {
        if (!(cc->cache = sl_malloc((size_t)SHADOW_CACHE * rows)))
            return -ENOMEM;
        for (int k = 0; k < SHADOW_CACHE; k++)
            cc->tag[k] = -1;
    }
    return 0;
}

static void count(struct infer_shadow *sh, uint32_t n, uint32_t cols, uint32_t clipped,
                  uint64_t trows, uint64_t hot, uint64_t cold)
{
    __atomic_add_fetch(&sh->calls, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&sh->elements, (uint64_t)n * cols, __ATOMIC_RELAXED);
    __atomic_add_fetch(&sh->clipped, clipped, __ATOMIC_RELAXED);
    __atomic_add_fetch(&sh->token_rows, trows, __ATOMIC_RELAXED);
    __atomic_add_fetch(&sh->cols_hot, hot, __ATOMIC_RELAXED);
    __atomic_add_fetch(&sh->cols_cold, cold, __ATOMIC_RELAXED);
}

/* Whether the elements are in (row, column) order, each row's columns
 * ascending, as infer_find_clipped gives them (the order term_fused keeps). */
static int clip_sorted(const struct infer_clipped *clip, uint32_t n, uint32_t cols)
{
    for (uint32_t i = 0; i < clip->n; i++) {
        if (clip->row[i] >= n || clip->col[i] >= cols)
            return 0;
        if (i && (clip->row[i] < clip->row[i - 1] ||
                  (clip->row[i] == clip->row[i - 1] && clip->col[i] < clip->col[i - 1])))
            return 0;
    }
    return 1;
}

/* The term reading the weights in place (infer_shadow_cols): the elements
 * grouped by column (a stable counting sort), each token row's output
 * written once. Returns 0 or -ENOMEM; counts into *hot, *cold, *trows. */
static int term_fused(struct infer_shadow *sh, const struct shadow_lin *l, const struct wsrc *ws,
                      const struct infer_clipped *clip, float *y, uint32_t rows, uint32_t r0,
                      uint32_t r1, uint64_t *hot, uint64_t *cold, uint64_t *trows)
{
    static const int8_t no_blocks[64]; /* packed source: every column is a copy */
    const struct format_shadow_linear *e = l->e;
    uint32_t cols = e->cols, ne = clip->n;
    uint32_t nt = 0;
    for (uint32_t i = 0; i < ne; i++)
        nt += i == 0 || clip->row[i] != clip->row[i - 1];
    struct shadow_scratch *x = shd_scratch_take(sh);
    int ret = x ? shd_scratch_grow(x, cols, ne, nt) : -ENOMEM;
    uint32_t *start = NULL, *dcol = NULL, *tok = NULL;
    float *ex = NULL, **out = NULL, *acc = NULL;
    const int8_t **hotp = NULL;
    if (ret == 0) {
        start = x->start;
        dcol = x->dcol;
        tok = x->tok;
        ex = x->ex;
        hotp = x->hotp;
        out = x->out;
        acc = x->acc;
        memset(start, 0, sizeof *start * ((size_t)cols + 1));
        for (uint32_t i = 0; i < ne; i++)
            start[clip->col[i]]++;
        uint32_t nd = 0, sum = 0;
        for (uint32_t c = 0; c < cols; c++) { /* start[c]: column c's first place */
            uint32_t k = start[c];
            start[c] = sum;
            sum += k;
            if (k) {
                dcol[nd] = c;
                int32_t h = l->slot[c];
                hotp[nd] = h >= 0 ? e->w + (size_t)h * rows : NULL;
                if (h >= 0)
                    *hot += k;
                else
                    (*cold)++;
                nd++;
            }
        }
        uint32_t t = 0;
        for (uint32_t i = 0; i < ne; i++) {
            if (i && clip->row[i] != clip->row[i - 1])
                t++;
            if (i == 0 || clip->row[i] != clip->row[i - 1])
                out[t] = y + (size_t)clip->row[i] * rows;
            uint32_t p = start[clip->col[i]]++;
            tok[p] = t;
            ex[p] = clip->excess[i];
        }
        /* start[c] is now column c's end: the distinct columns' bounds */
        uint32_t *bound = start; /* in place: step d reads start[dcol[d]], dcol[d] >= d,
                                    before it writes bound[d] */
        uint32_t prev = 0;
        for (uint32_t d = 0; d < nd; d++) {
            uint32_t end = start[dcol[d]];
            bound[d] = prev;
            prev = end;
        }
        bound[nd] = prev;
        struct infer_shadow_cols k = {.nd = nd, .col = dcol, .hot = hotp, .start = bound,
                                      .tok = tok, .ex = ex, .nt = nt, .out = out,
                                      .rows = rows, .b0 = r0 / 16, .b1 = (r1 + 15) / 16,
                                      .scale = ws->scale,
                                      .s = clip->act_scale, .store = clip->store, .acc = acc};
        if (!wsrc_packed(ws)) {
            k.packed = npu_weights_packed(ws->nw, &k.block);
        } else { /* the cold columns decoded from the packed codes, read as copies */
            uint32_t ncold = 0;
            for (uint32_t d = 0; d < nd; d++)
                ncold += !hotp[d];
            size_t got;
            SCRATCH_FIT(x, cols_own, x->cap_own, (size_t)ncold * rows, 0, got, ret);
            if (ret == 0)
                x->cap_own = got;
            for (uint32_t d = 0, j = 0; ret == 0 && d < nd; d++)
                if (!hotp[d]) {
                    wsrc_col(ws, dcol[d], x->cols_own + (size_t)j * rows);
                    hotp[d] = x->cols_own + (size_t)j++ * rows;
                }
            k.packed = no_blocks;
            k.block = 0;
        }
        if (ret == 0) {
            infer_shadow_cols(&k);
            *trows = nt;
        }
    }
    if (x)
        shd_scratch_give(sh, x);
    return ret;
}

int infer_shadow_term(void *ctx, int layer, uint32_t role, const struct infer_clipped *clip,
                      float *y, uint32_t n, uint32_t rows)
{
    struct infer_shadow *sh = ctx;
    const struct shadow_lin *l = shd_lin_of(sh, layer, role);
    if (!l || !l->slot)
        return 0;
    const struct format_shadow_linear *e = l->e;
    struct infer_linear *lin = infer_model_linear(sh->m, layer, role);
    uint32_t r0 = clip->r1 ? clip->r0 : 0, r1 = clip->r1 ? clip->r1 : rows;
    if (!lin || rows != e->rows || r0 >= r1 || r1 > rows)
        return -EINVAL;
    struct wsrc ws;
    int wret = wsrc_init(&ws, lin, rows, r0, r1);
    if (wret < 0)
        return wret;
    uint64_t hot = 0, cold = 0, trows = 0;
    /* in place: whole blocks of 16 output rows (the last may be short) */
    if (clip->n && sh->fused && clip_sorted(clip, n, e->cols) && r0 % 16 == 0 &&
        (r1 % 16 == 0 || r1 == rows)) {
        int ret = term_fused(sh, l, &ws, clip, y, rows, r0, r1, &hot, &cold, &trows);
        if (ret == 0 && r0 == 0) /* the pieces of a call count once */
            count(sh, n, e->cols, clip->n, trows, hot, cold);
        free(ws.scale_own);
        return ret;
    }
    float *acc = NULL, *acc_own = NULL;
    struct cold_cols cc = {0};
    if (clip->n) {
        if (!clip->store)
            acc = acc_own = sl_malloc(sizeof(float) * rows);
        int ret = acc || clip->store
                      ? cold_gather(&cc, l, &ws, clip, rows, e->cols, sh->gather_max)
                      : -ENOMEM;
        if (ret < 0) {
            free(acc_own);
            cold_free(&cc);
            free(ws.scale_own);
            return ret;
        }
        cold = cc.n;
    }
    const float *scale = ws.scale;
    float s = clip->act_scale;
    for (uint32_t i = 0; i < clip->n;) {
        uint32_t r = clip->row[i];
        float *yr = y + (size_t)r * rows;
        if (clip->store)
            acc = yr; /* accumulated in place, then scaled: one pass less */
        memset(acc + r0, 0, sizeof(float) * (r1 - r0));
        for (; i < clip->n && clip->row[i] == r; i++) {
            uint32_t c = clip->col[i];
            int32_t k = l->slot[c];
            const int8_t *w;
            if (k >= 0) {
                w = e->w + (size_t)k * rows;
                hot++;
            } else if (cc.idx[c] >= 0) {
                w = cc.w + (size_t)cc.idx[c] * rows;
            } else { /* past the gather's budget: one column at a time, cached */
                uint32_t slot = c % SHADOW_CACHE;
                w = cc.cache + (size_t)slot * rows;
                if (cc.tag[slot] != (int32_t)c) {
                    wsrc_col(&ws, c, cc.cache + (size_t)slot * rows);
                    cc.tag[slot] = (int32_t)c;
                    cold++;
                }
            }
            infer_shadow_axpy_s8(acc + r0, clip->excess[i], w + r0, r1 - r0);
        }
        if (clip->store)
            for (uint32_t o = r0; o < r1; o++)
                yr[o] = acc[o] * (s * scale[o]); /* = -0.0f + that */
        else
            for (uint32_t o = r0; o < r1; o++)
                yr[o] += acc[o] * (s * scale[o]);
        trows++;
    }
    free(acc_own);
    cold_free(&cc);
    free(ws.scale_own);
    if (r0 == 0) /* the pieces of a call count once */
        count(sh, n, e->cols, clip->n, trows, hot, cold);
    return 0;
}

int infer_model_shadow_enable(struct infer_model *m, struct sl_err *err)
{
    if (m->shadow)
        return 0;
    int ret = infer_shadow_create(m, &m->shadow, err);
    if (ret == 0)
        infer_shadow_attach(m, m->shadow);
    return ret;
}

const struct infer_shadow *infer_model_shadow(const struct infer_model *m) { return m->shadow; }
