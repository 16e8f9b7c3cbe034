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

#include "infer_shadow_internal.h"

struct shadow_lin *shd_lin_of(const struct infer_shadow *sh, int layer, uint32_t role)
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
struct shadow_scratch *shd_scratch_take(struct infer_shadow *sh)
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

void shd_scratch_give(struct infer_shadow *sh, struct shadow_scratch *x)
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
void *shd_scratch_fit(void *old, size_t cap, size_t n, size_t el, int aligned, size_t *got)
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

/* x's buffers for a call of `cols` columns, ne elements, nt token rows.
 * -ENOMEM leaves x usable (what grew is kept, with true capacities). */
int shd_scratch_grow(struct shadow_scratch *x, uint32_t cols, uint32_t ne, uint32_t nt)
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
        struct shadow_lin *l = shd_lin_of(sh, e->layer, e->role);
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
