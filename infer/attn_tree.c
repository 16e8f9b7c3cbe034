/* attn_tree.c: dense attention for a draft tree's rows (the verification of
 * speculative decoding): row i sees the slots [0, base), its ancestors and
 * itself (slots base + r).
 *
 * infer_attn_list runs each (row, head) on its own: a one-row dot product
 * per key, and every value row of the list copied before the sum. Here,
 * for each query head, the scores of all rows against every slot
 * [0, base + n) come from one matmul (each key read once for the tree: the
 * few-rows kernel), each row's list scores are packed in place (the shared
 * slots, then its ancestors in order) and go through the same softmax
 * steps; for the values, one probabilities x values matmul over the
 * shared slots in place runs for all the query heads of a kv head, then
 * resumes over the row's ancestors gathered into a buffer.
 *
 * The arithmetic is infer_attn_list's: every score is its own dot product
 * (the kernels give a row's bits whatever the batch), the softmax runs over
 * the same array, and values are summed in list order by the same NN
 * kernel. So a tree row gets the bits plain decoding gives at its position
 * (test_spec, test_attn_tree). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "infer_matmul.h"

size_t infer_attn_tree_floats(const struct format_config *c, uint32_t n, uint32_t T)
{
    /* every head's scores of every row against T slots; per kv head, a
     * row's gathered ancestors (n at most) */
    return (size_t)c->n_heads * n * T + (size_t)c->n_kv_heads * c->head_dim * n;
}

/* Rows whose ancestor lists go on the stack; larger trees allocate them. */
#define TREE_STACK_ROWS 16

int infer_attn_tree(const struct format_config *c, const float *kc, const float *vc,
                    const struct infer_attn_rows *rows, const float *q, uint32_t h0, uint32_t h1,
                    float *out)
{
    enum infer_matmul_kernel k = infer_matmul_kernel_used();
    uint32_t n = rows->n, base = rows->base, T = base + n;
    uint32_t hs = c->head_dim, qdim = c->n_heads * hs, kv_mul = c->n_heads / c->n_kv_heads;
    size_t kv_dim = (size_t)c->n_kv_heads * hs;
    if (n == 0 || h0 >= h1)
        return 0;
    /* scores of head h, row i at s + ((h - hoff) * n + i) * T; kv head g's
     * gathered values (a row's ancestors: n at most) at vbs + (g - goff) * n * hs. In the shared scratch
     * every head and kv head has its own place (hoff = goff = 0); memory of
     * this call's own holds only [h0, h1) and their kv heads. */
    uint32_t g0 = h0 / kv_mul, g1 = (h1 + kv_mul - 1) / kv_mul, hoff = 0, goff = 0;
    float *own = NULL, *s = rows->tree_scratch;
    if (!s || rows->tree_floats < infer_attn_tree_floats(c, n, T)) {
        hoff = h0;
        goff = g0;
        s = own = sl_malloc(sizeof(float) * ((size_t)(h1 - h0) * n * T + (size_t)(g1 - g0) * hs * n));
    }
    float *vbs = s ? s + (size_t)(own ? h1 - h0 : c->n_heads) * n * T : NULL;
    uint32_t anc_st[TREE_STACK_ROWS * (TREE_STACK_ROWS + 1)], depth_st[TREE_STACK_ROWS];
    uint32_t *anc = anc_st, *depth = depth_st, *anc_own = NULL;
    if (n > TREE_STACK_ROWS) {
        anc = anc_own = sl_malloc(sizeof(uint32_t) * (size_t)n * (n + 2));
        depth = anc ? anc + (size_t)n * (n + 1) : NULL;
    }
    if (!s || !anc) {
        free(own);
        free(anc_own);
        return -ENOMEM;
    }
    /* row i's ancestors and itself, ascending: anc[i * (n + 1) ..] */
    for (uint32_t i = 0; i < n; i++) {
        uint32_t d = 0;
        for (int32_t r = (int32_t)i; r >= 0; r = rows->parent[r])
            d++;
        depth[i] = d;
        uint32_t at = d;
        for (int32_t r = (int32_t)i; r >= 0; r = rows->parent[r])
            anc[i * (n + 1) + --at] = (uint32_t)r;
    }
    float sq = sqrtf((float)hs);
    for (uint32_t h = h0; h < h1; h++) {
        float *sh = s + (size_t)(h - hoff) * n * T;
        const float *kh = kc + (size_t)(h / kv_mul) * hs;
        infer_matmul_nt(k, sh, T, q + (size_t)h * hs, qdim, kh, INFER_W_F32, kv_dim, n, hs, 0, T);
        for (uint32_t i = 0; i < n; i++) {
            float *a = sh + (size_t)i * T;
            const uint32_t *ai = anc + (size_t)i * (n + 1);
            for (uint32_t j = 0; j < depth[i]; j++) /* ai[j] >= j: packs in place */
                a[base + j] = a[base + ai[j]];
            uint32_t len = base + depth[i];
            infer_softmax_scaled(k, a, len, sq);
        }
    }
    /* values: per kv head and row, the shared slots read in place, then the
     * row's ancestors gathered, the sum resumed over them (the bits of one
     * sum over the list) */
    for (uint32_t g = h0 / kv_mul; g * kv_mul < h1; g++) {
        uint32_t ha = g * kv_mul > h0 ? g * kv_mul : h0;
        uint32_t hb = (g + 1) * kv_mul < h1 ? (g + 1) * kv_mul : h1;
        const float *vh = vc + (size_t)g * hs;
        float *vb = vbs + (size_t)(g - goff) * n * hs;
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t *ai = anc + (size_t)i * (n + 1);
            for (uint32_t j = 0; j < depth[i]; j++)
                memcpy(vb + (size_t)j * hs, vh + (size_t)(base + ai[j]) * kv_dim,
                       sizeof(float) * hs);
            /* the heads [ha, hb) of row i: probabilities at stride n * T */
            float *oi = out + (size_t)i * qdim + (size_t)ha * hs;
            const float *pi = s + ((size_t)(ha - hoff) * n + i) * T;
            infer_matmul_nn(k, oi, hs, pi, (size_t)n * T, vh, kv_dim, hb - ha, base, hs);
            infer_matmul_nn_resume(k, oi, hs, pi + base, (size_t)n * T, vb, hs, hb - ha, depth[i],
                                   hs);
        }
    }
    free(own);
    free(anc_own);
    return 0;
}
