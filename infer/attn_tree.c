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
 * shared slots in place runs for all the query heads and rows of a kv head
 * (the NN kernel's passes of up to 8 rows: each value row loaded once a
 * pass), then each row's sums resume over its ancestors gathered into a
 * buffer.
 *
 * With the AVX-512 kernel (head sizes 32, 64, 128) the scores of a kv
 * head's query heads and rows come instead from its keys transposed once
 * (infer_attn_scores_kt_avx512: 16 keys in the lanes, so no horizontal sum
 * per score, and the softmax's scaling and maximum fused in; the same bits
 * as the matmul and infer_div_max): the shared slots in one call, the tree
 * slots in a second, and a row's maximum is the shared slots' and its
 * ancestors' (a maximum does not depend on the order it is taken in, but
 * for the sign of a +0/-0 tie, which changes no output: x - (+-0) and
 * exp(+-0) are the same). Only where a kv head has 16 to 256 query rows
 * (heads x tree rows; TREE_KT_MIN_ROWS: below that the transpose costs
 * more than it saves).
 *
 * The arithmetic is infer_attn_list's: every score is its own dot product
 * (the kernels give a row's bits whatever the batch), the softmax runs over
 * the same array, and values are summed in list order by the same NN
 * kernel. So a tree row gets the bits plain decoding gives at its position
 * (test_spec, test_verify_kernels). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "infer_matmul.h"

/* Floats of one kv head's transposed keys: T slots padded to 16, and 16
 * more (the tree slots' call starts at slot base: its last column's
 * masked-off lanes read past the padding). */
static size_t kt_floats(uint32_t hs, uint32_t T)
{
    return (size_t)hs * ((T + 15) & ~15u) + 16;
}

/* Rows a kv head's transposed-key scores take at most (its maxima on the
 * stack); more go through the matmul. */
#define TREE_KT_ROWS 256u
/* Fewer query rows a kv head than this keep the matmul (the prefill's rule,
 * ATT_KT_MIN_ROWS: transposing costs about 2 rows' scores); in g18's
 * harness (kjv6L-1k's 8/2 heads of 32, the KV out of the L2; noisy, 10-20%
 * between rounds at load 9) 3 tree rows (12) were ~8% slower through the
 * transposed keys, 2 even, 4 ~9% faster. */
#define TREE_KT_MIN_ROWS 16u

/* Whether a tree of n rows takes its scores from transposed keys with
 * kernel k (AVX-512, head sizes 32/64/128, 16-256 query rows a kv head). */
static int tree_kt(enum infer_matmul_kernel k, const struct format_config *c, uint32_t n)
{
#if SLUICE_KERNELS_X86
    size_t rows = (size_t)(c->n_heads / c->n_kv_heads) * n;
    return k == INFER_MATMUL_AVX512 && infer_matmul_kernel_available(k) &&
           INFER_ATT_KT_HS(c->head_dim) && rows <= TREE_KT_ROWS && rows >= TREE_KT_MIN_ROWS;
#else
    (void)k, (void)c, (void)n;
    return 0;
#endif
}

/* heads heads and kv kv heads: every head's scores of every row against T
 * slots; per kv head, a row's gathered ancestors (n at most) and, with kt,
 * the transposed keys; every head's query rows gathered (the value sums'
 * place too) */
static size_t tree_floats(uint32_t heads, uint32_t kv, uint32_t hs, uint32_t n, uint32_t T,
                          int kt)
{
    return (size_t)heads * n * T + (size_t)kv * hs * n + (kt ? (size_t)kv * kt_floats(hs, T) : 0) +
           (size_t)heads * n * hs;
}

size_t infer_attn_tree_floats(const struct format_config *c, uint32_t n, uint32_t T)
{
    return tree_floats(c->n_heads, c->n_kv_heads, c->head_dim, n, T,
                       tree_kt(infer_matmul_kernel_used(), c, n));
}

/* The scores of query heads [ha, hb) (one kv head's, transposed into kt,
 * ldt) for every row, into sh (head ha's first row) at stride T, packed
 * per row to its list and softmaxed: the bits of the matmul and
 * infer_softmax_scaled. qg: (hb - ha) * n * hs floats. */
static void scores_kt(enum infer_matmul_kernel k, const struct format_config *c,
                      const struct infer_attn_rows *rows, const float *q, uint32_t ha, uint32_t hb,
                      const uint32_t *anc, const uint32_t *depth, const float *kt, size_t ldt,
                      float *qg, float *sh)
{
#if SLUICE_KERNELS_X86
    uint32_t n = rows->n, base = rows->base, T = base + n, hs = c->head_dim;
    uint32_t nq = (hb - ha) * n, qdim = c->n_heads * hs;
    float maxv[TREE_KT_ROWS], tail[TREE_KT_ROWS];
    float sq = sqrtf((float)hs);
    /* query rows in the scores' order: head-major, then row */
    for (uint32_t h = ha; h < hb; h++)
        for (uint32_t i = 0; i < n; i++)
            memcpy(qg + ((size_t)(h - ha) * n + i) * hs, q + (size_t)i * qdim + (size_t)h * hs,
                   sizeof(float) * hs);
    if (base)
        infer_attn_scores_kt_avx512(sh, T, qg, hs, nq, kt, ldt, base, hs, sq, maxv);
    infer_attn_scores_kt_avx512(sh + base, T, qg, hs, nq, kt + base, ldt, n, hs, sq, tail);
    for (uint32_t r = 0; r < nq; r++) {
        uint32_t i = r % n;
        float *a = sh + (size_t)r * T, m = base ? maxv[r] : -INFINITY;
        const uint32_t *ai = anc + (size_t)i * (n + 1);
        for (uint32_t j = 0; j < depth[i]; j++) { /* ai[j] >= j: packs in place */
            float x = a[base + ai[j]];
            a[base + j] = x;
            m = x > m ? x : m; /* the fold's rule: strictly greater (NaN never wins) */
        }
        infer_softmax_after_max(k, a, base + depth[i], m);
    }
#else
    (void)k, (void)c, (void)rows, (void)q, (void)ha, (void)hb, (void)anc, (void)depth;
    (void)kt, (void)ldt, (void)qg, (void)sh;
#endif
}

/* Rows whose ancestor lists go on the stack; larger trees allocate them. */
#define TREE_STACK_ROWS 16

int infer_attn_tree(const struct format_config *c, const float *kc, const float *vc,
                    const struct infer_attn_rows *rows, const float *q, uint32_t h0, uint32_t h1,
                    float *out)
{
    enum infer_matmul_kernel k = infer_matmul_kernel_used();
    uint32_t n = rows->n, base = rows->base, T = base + n;
    const int use_kt = tree_kt(k, c, n);
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
        s = own = sl_malloc(sizeof(float) * tree_floats(h1 - h0, g1 - g0, hs, n, T, use_kt));
    }
    uint32_t nh = own ? h1 - h0 : c->n_heads, nkv = own ? g1 - g0 : c->n_kv_heads;
    float *vbs = s ? s + (size_t)nh * n * T : NULL;
    float *kts = s ? vbs + (size_t)nkv * hs * n : NULL;
    float *qgs = s ? kts + (use_kt ? (size_t)nkv * kt_floats(hs, T) : 0) : NULL;
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
#if SLUICE_KERNELS_X86
    for (uint32_t g = g0; use_kt && g < g1; g++) {
        uint32_t ha = g * kv_mul > h0 ? g * kv_mul : h0;
        uint32_t hb = (g + 1) * kv_mul < h1 ? (g + 1) * kv_mul : h1;
        size_t ldt = (T + 15) & ~15u;
        float *kt = kts + (size_t)(g - goff) * kt_floats(hs, T);
        infer_keys_transpose(kt, ldt, kc + (size_t)g * hs, kv_dim, T, hs);
        memset(kt + hs * ldt, 0, sizeof(float) * 16);
        scores_kt(k, c, rows, q, ha, hb, anc, depth, kt, ldt, qgs + (size_t)(ha - hoff) * n * hs,
                  s + (size_t)(ha - hoff) * n * T);
    }
#endif
    float sq = sqrtf((float)hs);
    for (uint32_t h = h0; !use_kt && h < h1; h++) {
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
    /* values: per kv head, the shared slots read in place for all its
     * heads' rows in one product (each value row loaded once per pass of
     * the kernel's rows, not once per tree row), into the gathered queries'
     * place (head-major, then row: the probabilities' order); then per row
     * its ancestors gathered and the sum resumed over them (the bits of one
     * sum over the list), copied out */
    for (uint32_t g = h0 / kv_mul; g * kv_mul < h1; g++) {
        uint32_t ha = g * kv_mul > h0 ? g * kv_mul : h0;
        uint32_t hb = (g + 1) * kv_mul < h1 ? (g + 1) * kv_mul : h1;
        const float *vh = vc + (size_t)g * hs;
        float *vb = vbs + (size_t)(g - goff) * n * hs;
        float *yg = qgs + (size_t)(ha - hoff) * n * hs;
        const float *pg = s + (size_t)(ha - hoff) * n * T;
        infer_matmul_nn(k, yg, hs, pg, T, vh, kv_dim, (hb - ha) * n, base, hs);
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t *ai = anc + (size_t)i * (n + 1);
            for (uint32_t j = 0; j < depth[i]; j++)
                memcpy(vb + (size_t)j * hs, vh + (size_t)(base + ai[j]) * kv_dim,
                       sizeof(float) * hs);
            /* the heads [ha, hb) of row i: probabilities at stride n * T,
             * sums at stride n * hs */
            infer_matmul_nn_resume(k, yg + (size_t)i * hs, (size_t)n * hs, pg + (size_t)i * T + base,
                                   (size_t)n * T, vb, hs, hb - ha, depth[i], hs);
            for (uint32_t h = ha; h < hb; h++)
                memcpy(out + (size_t)i * qdim + (size_t)h * hs,
                       yg + ((size_t)(h - ha) * n + i) * hs, sizeof(float) * hs);
        }
    }
    free(own);
    free(anc_own);
    return 0;
}
