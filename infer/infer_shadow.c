/* infer_shadow.c: shadow outlier execution (llm.npu 3.3) on the linear
 * term seam (infer.h). Per shadowed linear: its hot input channels' int8
 * weight columns, resident and input-major (from the container's
 * shadow.linears), and a map from input channel to hot column. The term
 * multiplies each clipped excess by its channel's column (the hot copy, or
 * the NPU's packed weights read in place, infer_shadow_cols.c; the older
 * path gathers whole columns first) into one float accumulator per input
 * row, then adds acc[r] * (s * scale[r]) to y: the NPU's
 * s * scale[r] * sum xq W plus this is s * scale[r] * sum (x / s) W with
 * x / s unclipped (the float-reference identity; the products of int8 codes
 * and float excess are exact in float up to the sums' rounding). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "infer_matmul.h"
#include "npu.h"
#include "unpack.h"

#ifndef SLUICE_KERNELS_X86
#define SLUICE_KERNELS_X86 0
#endif

#define SHADOW_CACHE 64                        /* past the gather: cold columns a call keeps */
#define SHADOW_GATHER_MAX ((size_t)32 << 20) /* default gather_max */

struct shadow_lin {
    const struct format_shadow_linear *e; /* NULL: not described */
    int32_t *slot;                        /* [cols] hot column index, -1: cold */
};

/* One caller's scratch for term_fused, grown on demand (a buffer is
 * replaced, not kept, when a call needs more) and kept between calls in the
 * shadow's pool: one set per term running at once (the calling thread and
 * the device thread run pieces of one matmul's term concurrently; the
 * pipeline's CPU workers too), so after the first calls a term allocates
 * nothing. */
struct shadow_scratch {
    struct shadow_scratch *next; /* in the pool */
    uint32_t *start, *dcol;      /* [cap_cols] */
    const int8_t **hotp;         /* [cap_cols] */
    uint32_t *tok;               /* [cap_ne] */
    float *ex;                   /* [cap_ne] */
    float **out;                 /* [cap_nt] */
    float *acc;                  /* [cap_nt][16 * INFER_SHADOW_COLS_GROUP], aligned */
    int8_t *cols_own;            /* [cap_own] */
    size_t cap_cols, cap_ne, cap_nt, cap_own;
};

struct infer_shadow {
    struct infer_model *m;
    struct format_shadow_linear *e;
    uint32_t n, enabled;
    struct shadow_lin *lin; /* [(n_layers + 1) * FORMAT_ROLE_COUNT], classifier last */
    size_t bytes;
    size_t gather_max; /* bytes of columns a call gathers in one pass */
    int fused;         /* 1: the weights read in place (term_fused) */
    pthread_mutex_t pool_lock;
    struct shadow_scratch *pool; /* the sets no call holds now */
    uint32_t pool_sets;          /* sets made (held by calls or in the pool) */
    /* statistics, added to by concurrent terms (atomics) */
    uint64_t calls, elements, clipped, token_rows, cols_hot, cols_cold;
};

static struct shadow_lin *lin_of(const struct infer_shadow *sh, int layer, uint32_t role)
{
    uint32_t L = sh->m->cfg.n_layers;
    if (role >= FORMAT_ROLE_COUNT || layer < -1 || layer >= (int)L)
        return NULL;
    uint32_t li = layer < 0 ? L : (uint32_t)layer;
    return &sh->lin[(size_t)li * FORMAT_ROLE_COUNT + role];
}

static void scratch_free(struct shadow_scratch *x)
{
    free(x->start);
    free(x->dcol);
    free(x->hotp);
    free(x->tok);
    free(x->ex);
    free(x->out);
    sl_free_aligned(x->acc);
    free(x->cols_own);
    free(x);
}

/* A set from the pool, or a new empty one; NULL: out of memory. */
static struct shadow_scratch *scratch_take(struct infer_shadow *sh)
{
    pthread_mutex_lock(&sh->pool_lock);
    struct shadow_scratch *x = sh->pool;
    if (x)
        sh->pool = x->next;
    pthread_mutex_unlock(&sh->pool_lock);
    if (x)
        return x;
    if (!(x = sl_calloc(1, sizeof *x)))
        return NULL;
    pthread_mutex_lock(&sh->pool_lock);
    sh->pool_sets++;
    pthread_mutex_unlock(&sh->pool_lock);
    return x;
}

static void scratch_give(struct infer_shadow *sh, struct shadow_scratch *x)
{
    pthread_mutex_lock(&sh->pool_lock);
    x->next = sh->pool;
    sh->pool = x;
    pthread_mutex_unlock(&sh->pool_lock);
}

/* A buffer of at least n elements of size el in place of old (its contents
 * not kept), whose capacity is cap: old itself when it is large enough, else
 * a new one of n + n / 4 (old freed). *got: the capacity of what is
 * returned; NULL (out of memory): old is kept, *got = cap. */
static void *scratch_fit(void *old, size_t cap, size_t n, size_t el, int aligned, size_t *got)
{
    *got = cap;
    if (n <= cap)
        return old;
    size_t want = n + n / 4;
    void *q = aligned ? sl_alloc_aligned(want * el, 64) : sl_malloc(want * el);
    if (!q)
        return NULL;
    if (aligned)
        sl_free_aligned(old);
    else
        free(old);
    *got = want;
    return q;
}

#define SCRATCH_FIT(x, field, cap, n, aligned, got, ret)                                          \
    do {                                                                                          \
        if ((ret) == 0) {                                                                         \
            void *q_ = scratch_fit((x)->field, (cap), (n), sizeof *(x)->field, (aligned), &(got)); \
            if (q_)                                                                               \
                (x)->field = q_;                                                                  \
            else if ((n) > (cap)) /* NULL with nothing asked of a new set is no failure */        \
                (ret) = -ENOMEM;                                                                  \
        }                                                                                         \
    } while (0)

/* x's buffers for a call of `cols` columns, ne elements, nt token rows.
 * -ENOMEM leaves x usable (what grew is kept, with true capacities). */
static int scratch_grow(struct shadow_scratch *x, uint32_t cols, uint32_t ne, uint32_t nt)
{
    size_t c = (size_t)cols + 1, e = (size_t)ne + 1, t = nt ? nt : 1;
    size_t c1 = x->cap_cols, c2 = c1, c3 = c1, e1 = x->cap_ne, e2 = e1, t1 = x->cap_nt, t2 = t1;
    int ret = 0;
    SCRATCH_FIT(x, start, x->cap_cols, c, 0, c1, ret);
    SCRATCH_FIT(x, dcol, x->cap_cols, c, 0, c2, ret);
    SCRATCH_FIT(x, hotp, x->cap_cols, c, 0, c3, ret);
    SCRATCH_FIT(x, tok, x->cap_ne, e, 0, e1, ret);
    SCRATCH_FIT(x, ex, x->cap_ne, e, 0, e2, ret);
    SCRATCH_FIT(x, out, x->cap_nt, t, 0, t1, ret);
    /* acc: 16 * INFER_SHADOW_COLS_GROUP floats per token row */
    SCRATCH_FIT(x, acc, x->cap_nt * 16 * INFER_SHADOW_COLS_GROUP, t * 16 * INFER_SHADOW_COLS_GROUP,
                1, t2, ret);
    t2 /= 16 * INFER_SHADOW_COLS_GROUP;
    /* after a failure some buffers grew and some did not: the least of
     * each group's capacities is true of all of them */
    x->cap_cols = c1 < c2 ? (c1 < c3 ? c1 : c3) : (c2 < c3 ? c2 : c3);
    x->cap_ne = e1 < e2 ? e1 : e2;
    x->cap_nt = t1 < t2 ? t1 : t2;
    return ret;
}

int infer_shadow_create(struct infer_model *m, struct infer_shadow **out, struct sl_err *err)
{
    *out = NULL;
    const struct format_reader *r = m->reader;
    const void *v;
    size_t len;
    if (format_reader_meta_get(r, FORMAT_SHADOW_META_KEY, &v, &len) < 0) {
        sl_err_set(err, "%s has no shadow outlier metadata (%s); quantize with --shadow",
                   format_reader_path(r), FORMAT_SHADOW_META_KEY);
        return -ENOENT;
    }
    if (format_reader_version(r) < 2) {
        sl_err_set(err, "%s: %s in a version %u container (it came with version 2)",
                   format_reader_path(r), FORMAT_SHADOW_META_KEY, format_reader_version(r));
        return -EINVAL;
    }
    struct infer_shadow *sh = sl_calloc(1, sizeof *sh);
    if (!sh) {
        sl_err_set(err, "out of memory for shadow execution");
        return -ENOMEM;
    }
    if (pthread_mutex_init(&sh->pool_lock, NULL) != 0) {
        free(sh);
        sl_err_set(err, "cannot create the shadow term's lock");
        return -ENOMEM;
    }
    sh->m = m;
    sh->gather_max = SHADOW_GATHER_MAX;
    sh->fused = 1;
    int ret = format_shadow_parse(&m->cfg, v, len, &sh->e, &sh->n, err);
    if (ret < 0) {
        sl_err_prefix(err, "%s", format_reader_path(r));
        infer_shadow_destroy(sh);
        return ret;
    }
    sh->lin = sl_calloc((size_t)(m->cfg.n_layers + 1) * FORMAT_ROLE_COUNT, sizeof *sh->lin);
    ret = sh->lin ? 0 : -ENOMEM;
    for (uint32_t i = 0; ret == 0 && i < sh->n; i++) {
        const struct format_shadow_linear *e = &sh->e[i];
        struct shadow_lin *l = lin_of(sh, e->layer, e->role);
        l->e = e;
        sh->bytes += (size_t)e->rows * e->n_hot + 4 * (size_t)e->n_hot;
        if (!(e->flags & FORMAT_SHADOW_ON))
            continue;
        sh->enabled++;
        l->slot = sl_malloc(sizeof(int32_t) * e->cols);
        if (!l->slot) {
            ret = -ENOMEM;
            break;
        }
        sh->bytes += sizeof(int32_t) * e->cols;
        for (uint32_t c = 0; c < e->cols; c++)
            l->slot[c] = -1;
        for (uint32_t k = 0; k < e->n_hot; k++)
            l->slot[e->hot[k]] = (int32_t)k;
    }
    if (ret < 0) {
        sl_err_set(err, "out of memory for shadow execution");
        infer_shadow_destroy(sh);
        return ret;
    }
    *out = sh;
    return 0;
}

void infer_shadow_destroy(struct infer_shadow *sh)
{
    if (!sh)
        return;
    if (sh->lin)
        for (size_t i = 0; i < (size_t)(sh->m->cfg.n_layers + 1) * FORMAT_ROLE_COUNT; i++)
            free(sh->lin[i].slot);
    free(sh->lin);
    format_shadow_free(sh->e, sh->n);
    for (struct shadow_scratch *x = sh->pool, *nx; x; x = nx) {
        nx = x->next;
        scratch_free(x);
    }
    pthread_mutex_destroy(&sh->pool_lock);
    free(sh);
}

uint32_t infer_shadow_scratch_sets(struct infer_shadow *sh, uint32_t *pooled)
{
    pthread_mutex_lock(&sh->pool_lock);
    uint32_t made = sh->pool_sets, in = 0;
    for (const struct shadow_scratch *x = sh->pool; x; x = x->next)
        in++;
    pthread_mutex_unlock(&sh->pool_lock);
    if (pooled)
        *pooled = in;
    return made;
}

void infer_shadow_attach(struct infer_model *m, struct infer_shadow *sh)
{
    infer_model_set_linear_term(m, sh ? infer_shadow_term : NULL, sh);
    infer_model_set_linear_term_filter(m, sh ? infer_shadow_wants : NULL);
}

uint32_t infer_shadow_linears(const struct infer_shadow *sh, uint32_t *enabled)
{
    if (enabled)
        *enabled = sh->enabled;
    return sh->n;
}

size_t infer_shadow_bytes(const struct infer_shadow *sh) { return sh->bytes; }

void infer_shadow_set_gather_max(struct infer_shadow *sh, size_t bytes) { sh->gather_max = bytes; }

void infer_shadow_set_fused(struct infer_shadow *sh, int on) { sh->fused = on; }

void infer_shadow_get_stats(const struct infer_shadow *sh, struct infer_shadow_stats *st)
{
    st->calls = __atomic_load_n(&sh->calls, __ATOMIC_RELAXED);
    st->elements = __atomic_load_n(&sh->elements, __ATOMIC_RELAXED);
    st->clipped = __atomic_load_n(&sh->clipped, __ATOMIC_RELAXED);
    st->token_rows = __atomic_load_n(&sh->token_rows, __ATOMIC_RELAXED);
    st->cols_hot = __atomic_load_n(&sh->cols_hot, __ATOMIC_RELAXED);
    st->cols_cold = __atomic_load_n(&sh->cols_cold, __ATOMIC_RELAXED);
}

int infer_shadow_wants(void *ctx, int layer, uint32_t role)
{
    const struct shadow_lin *l = lin_of(ctx, layer, role);
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
    struct shadow_scratch *x = scratch_take(sh);
    int ret = x ? scratch_grow(x, cols, ne, nt) : -ENOMEM;
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
        scratch_give(sh, x);
    return ret;
}

int infer_shadow_term(void *ctx, int layer, uint32_t role, const struct infer_clipped *clip,
                      float *y, uint32_t n, uint32_t rows)
{
    struct infer_shadow *sh = ctx;
    const struct shadow_lin *l = lin_of(sh, layer, role);
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
