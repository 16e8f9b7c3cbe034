/* infer_attn.c: attention behind one interface (infer.h struct
 * infer_attention): the dense implementation for chains (causal), draft
 * trees (a row sees the cache and its ancestors) and key selections
 * (sparse attention plugs in by choosing the keys).
 *
 * A chain runs infer_op_attention, the blocked kernel. Any other visible set
 * runs row by row over an ordered list of slots with the same arithmetic as
 * that kernel: every score is its own dot product (infer_matmul_nt gives the
 * same bits for a key whatever its block), the softmax runs over the list
 * as over a contiguous row, and probabilities times values are summed in
 * list order with the kernel's accumulation (FMA in the SIMD kernels,
 * multiply then add in the scalar one), the keys past the leading
 * contiguous run gathered into consecutive rows first. So
 * a tree row whose ancestors are a chain gets exactly the bits plain
 * decoding gives at its position. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "infer_matmul.h"

/* a key's row (a library memcpy per 256-byte row costs more than the copy) */
static inline void copy_row(float *restrict dst, const float *restrict src, uint32_t n)
{
    uint32_t c = 0;
    for (; c + 8 <= n; c += 8)
        for (uint32_t j = 0; j < 8; j++)
            dst[c + j] = src[c + j];
    for (; c < n; c++)
        dst[c] = src[c];
}

/* scattered rows miss the caches: ask for a row this many ahead */
#define PREFETCH_AHEAD 8
static inline void prefetch_row(const float *p, uint32_t n)
{
    for (uint32_t c = 0; c < n; c += 16)
        __builtin_prefetch(p + c, 0, 1);
}

void infer_gather_rows(float *dst, const float *src, size_t ld, uint32_t hs,
                       const uint32_t *list, uint32_t len)
{
    for (uint32_t j = 0; j < len; j++) {
        if (j + PREFETCH_AHEAD < len)
            prefetch_row(src + (size_t)list[j + PREFETCH_AHEAD] * ld, hs);
        copy_row(dst + (size_t)j * hs, src + (size_t)list[j] * ld, hs);
    }
}

/* One query row of one head over the slots list[0..len) (ascending), into
 * out[hs]. a: len floats of scratch. */
void infer_attn_list(float *out, const float *qh, const float *kh, const float *vh, size_t kv_dim,
                     uint32_t hs, const uint32_t *list, uint32_t len, float *a, float *gather)
{
    enum infer_matmul_kernel k = infer_matmul_kernel_used();
    float sq = sqrtf((float)hs);
    /* the leading run 0, 1, ..., run-1 is read in place, the rest gathered
     * into rows of hs: every score is its own dot product, and the sum
     * over values runs in list order either way */
    uint32_t run = 0;
    while (run < len && list[run] == run)
        run++;
    if (run)
        infer_matmul_nt(k, a, run, qh, hs, kh, INFER_W_F32, kv_dim, 1, hs, 0, run);
    if (len > run) {
        infer_gather_rows(gather, kh, kv_dim, hs, list + run, len - run);
        infer_matmul_nt(k, a + run, len - run, qh, hs, gather, INFER_W_F32, hs, 1, hs, 0,
                        len - run);
    }
    infer_softmax_scaled(k, a, len, sq);
    if (len == run) {
        infer_matmul_nn(k, out, hs, a, len, vh, kv_dim, 1, run, hs);
        return;
    }
    infer_gather_rows(gather, vh, kv_dim, hs, list, len);
    infer_matmul_nn(k, out, hs, a, len, gather, hs, 1, len, hs);
}

/* The slots row i of a tree sees: [0, base), its ancestors, itself. */
static uint32_t tree_list(const struct infer_attn_rows *rows, uint32_t i, uint32_t *list)
{
    uint32_t n = 0;
    for (uint32_t s = 0; s < rows->base; s++)
        list[n++] = s;
    /* ancestors, walked up then written ascending */
    uint32_t depth = 0;
    for (int32_t r = (int32_t)i; r >= 0; r = rows->parent[r])
        depth++;
    uint32_t at = n + depth;
    for (int32_t r = (int32_t)i; r >= 0; r = rows->parent[r])
        list[--at] = rows->base + (uint32_t)r;
    return n + depth;
}

static int dense_run(const struct infer_attention *a, const struct format_config *c,
                     const struct infer_kv *kv, uint32_t layer, const struct infer_attn_rows *rows,
                     const float *q, uint32_t h0, uint32_t h1, float *out, float *scratch)
{
    (void)a;
    const float *kc = infer_kv_keys(kv, layer), *vc = infer_kv_values(kv, layer);
    if (!rows->parent && !rows->sel) {
        infer_op_attention(out, q, kc, vc, rows->n, rows->base, c, h0, h1, scratch);
        return 0;
    }
    if (!rows->sel) /* a draft tree: its rows' scores and values together */
        return infer_attn_tree(c, kc, vc, rows, q, h0, h1, out);
    uint32_t hs = c->head_dim, qdim = c->n_heads * hs, kv_mul = c->n_heads / c->n_kv_heads;
    size_t kv_dim = (size_t)c->n_kv_heads * hs;
    uint32_t most = rows->base + rows->n;
    uint32_t *list = sl_malloc(sizeof *list * (most ? most : 1));
    float *gather = sl_malloc(sizeof(float) * hs * (most ? most : 1));
    if (!list || !gather) {
        free(list);
        free(gather);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < rows->n; i++) {
        uint32_t len = 0;
        if (!rows->sel) {
            if (rows->parent)
                len = tree_list(rows, i, list);
            else
                for (len = 0; len <= rows->base + i; len++)
                    list[len] = len;
        }
        for (uint32_t h = h0; h < h1; h++) {
            const uint32_t *l = list;
            if (rows->sel) {
                size_t at = (size_t)i * c->n_heads + h;
                l = rows->sel + at * rows->sel_stride;
                len = rows->n_sel[at];
            }
            if (len == 0) { /* nothing selected: no attention output */
                memset(out + (size_t)i * qdim + (size_t)h * hs, 0, sizeof(float) * hs);
                continue;
            }
            const float *kh = kc + (size_t)(h / kv_mul) * hs, *vh = vc + (size_t)(h / kv_mul) * hs;
            infer_attn_list(out + (size_t)i * qdim + (size_t)h * hs,
                            q + (size_t)i * qdim + (size_t)h * hs, kh, vh, kv_dim, hs, l, len,
                            scratch, gather);
        }
    }
    free(list);
    free(gather);
    return 0;
}

const struct infer_attention infer_attention_dense = {
    .name = "dense", .run = dense_run, .trim = INFER_ATTN_TRIM_ROWS};
