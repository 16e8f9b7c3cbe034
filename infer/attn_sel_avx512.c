/* attn_sel_avx512.c: sparse attention's exact stage with AVX-512F, the bits
 * of infer_attn_list under the AVX-512 matmul kernels (attn_sparse.h; the
 * scalar twin is attn_sel_row_ref16 in attn_sel.c).
 *
 * Where the dense kernel is the AVX-512 one, the AVX2 exact stage
 * (attn_sel_avx2.c) would give other bits than dense attention (its dots
 * are 8-lane chains), so before this file such machines ran every kept
 * (row, head) through infer_attn_list: the keys and values gathered per
 * pair and two matmul calls. Here, as in attn_sel_rows_avx2, the pairs of
 * one kv head walk the keys in blocks read once for all of them, with:
 * - every score the 16-lane FMA chain of infer_matmul_tile_avx512, folded
 *   as _mm512_reduce_add_ps folds it (the two 256-bit halves added, then
 *   ((l0 + l2) + (l1 + l3)) of the 128-bit sum of those: four keys' folds
 *   share one transpose);
 * - the softmax as infer_div_max_avx512 and infer_exp_sum_avx512 compute it,
 *   but per key block while its scores are in L1 (the scaling and the
 *   maximum), each block's weights divided just before the values pass;
 * - each output column one FMA chain over the kept values in list order
 *   from 0, as infer_matmul_nn_avx512's (here head size 64: two pairs
 *   interleaved, 8 chains in flight).
 *
 * The pieces shared with the shared selection's kernels (attn_group_avx512.c)
 * are in attn_avx512_inl.h. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attn_avx512_inl.h"
#include "attn_sparse.h"
#include "infer_div_max_avx512_inl.h"
#include "infer_matmul.h"

/* rows t0..t1 of src (stride ld) into dst (stride hs) */
static void pack_rows(float *dst, const float *src, size_t ld, uint32_t hs, uint32_t t0,
                      uint32_t t1)
{
    for (uint32_t t = t0; t < t1; t++) {
        const float *s = src + (size_t)t * ld;
        float *d = dst + (size_t)(t - t0) * hs;
        for (uint32_t c = 0; c < hs; c += 16)
            _mm512_storeu_ps(d + c, _mm512_loadu_ps(s + c));
    }
}

/* values_t(64) for two pairs at once (outputs oa, ob; weights a, b; lists la
 * over [ja, ea), lb over [jb, eb)): eight FMA chains in flight instead of
 * four (one pair's four chains waited on the FMA latency), each pair's
 * chains in its own list order: the same bits as one pair at a time */
static inline __attribute__((always_inline)) void
values2_64(float *oa, const float *a, const uint32_t *la, uint32_t ja, uint32_t ea, float *ob,
           const float *b, const uint32_t *lb, uint32_t jb, uint32_t eb, const float *vb0,
           size_t ld, uint32_t t0)
{
    __m512 x[4], y[4];
    for (int i = 0; i < 4; i++) {
        x[i] = _mm512_loadu_ps(oa + 16 * i);
        y[i] = _mm512_loadu_ps(ob + 16 * i);
    }
    uint32_t n = ea - ja < eb - jb ? ea - ja : eb - jb;
    for (uint32_t s = 0; s < n; s++) {
        const float *va = vb0 + (size_t)(la[ja + s] - t0) * ld;
        const float *vb = vb0 + (size_t)(lb[jb + s] - t0) * ld;
        __m512 pa = _mm512_set1_ps(a[ja + s]), pb = _mm512_set1_ps(b[jb + s]);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            x[i] = _mm512_fmadd_ps(pa, _mm512_loadu_ps(va + 16 * i), x[i]);
            y[i] = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vb + 16 * i), y[i]);
        }
    }
    for (int i = 0; i < 4; i++) {
        _mm512_storeu_ps(oa + 16 * i, x[i]);
        _mm512_storeu_ps(ob + 16 * i, y[i]);
    }
    if (ea - ja > n)
        values_t(64, oa, a, vb0, ld, 64, la, ja + n, ea, t0);
    if (eb - jb > n)
        values_t(64, ob, b, vb0, ld, 64, lb, jb + n, eb, t0);
}

/* infer_div_max_avx512's step over one block's new scores a[0..n), while
 * they are in L1 (the pass over a pair's whole list after the scores read
 * 128 pairs' lists from L2: about half of the softmax's div_max samples):
 * each score x / d (x * (1 / d) where d is a power of two, as there: the
 * same bits), and the largest of them (ordered compares: NaN never wins) */
static inline __attribute__((always_inline)) float
div_max_blk(float *a, uint32_t n, int pow2, __m512 iv, __m512 dv, float mx)
{
    __m512 acc = infer_div_max16_avx512(a, n, pow2, iv, dv);
    float b = _mm512_reduce_max_ps(acc); /* no NaN in acc: the largest, or -inf */
    return b > mx ? b : mx;
}

/* the softmax's last step over one block's weights a[0..n) just before the
 * values read them: each x / sum, rounded once (infer_div_max_avx512's bits
 * whatever sum is: where it multiplies by 1 / sum, sum is a power of two
 * and the product is the quotient) */
static inline __attribute__((always_inline)) void div_blk(float *a, uint32_t n, __m512 sv)
{
    for (uint32_t t = 0; t < n; t += 16) {
        __mmask16 m = n - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - t)) - 1);
        _mm512_mask_storeu_ps(a + t, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, a + t), sv));
    }
}

void attn_sel_rows_avx512(uint32_t R, const struct attn_sel_pair *p, const float *kh,
                          const float *vh, size_t kv_dim, uint32_t hs, uint32_t kb, uint32_t T,
                          uint32_t *cur, float *pack)
{
    struct blk_ends ends; /* the scores pass's block ends for the values pass */
    blk_ends_init(&ends, R, T, kb);
    /* the softmax's first step (scaling, maximum) block by block, for up
     * to PAIRS_MAX pairs (mx: their maxima so far) */
    enum { PAIRS_MAX = 128 };
    float mx[PAIRS_MAX], sm[PAIRS_MAX], d = sqrtf((float)hs);
    int early = R <= PAIRS_MAX;
    __m512 iv, dv = _mm512_set1_ps(d);
    int pow2 = infer_div_pow2(d, &iv);
    for (uint32_t r = 0; r < R; r++) {
        cur[r] = 0;
        if (early)
            mx[r] = -INFINITY;
    }
    for (uint32_t t0 = 0, b = 0; t0 < T; t0 += kb, b++) {
        uint32_t t1 = T - t0 < kb ? T : t0 + kb;
        const float *kb0 = kh + (size_t)t0 * kv_dim;
        size_t ld = kv_dim;
        if (pack) {
            pack_rows(pack, kh, kv_dim, hs, t0, t1);
            kb0 = pack;
            ld = hs;
        }
        for (uint32_t r = 0; r < R; r++) {
            uint32_t j = cur[r], e = blk_ends_find(&ends, b, r, p[r].list, j, p[r].len, t1);
            if (e > j) {
                scores_blk(p[r].a + j, p[r].q, kb0, ld, hs, p[r].list + j, e - j, t0);
                if (early)
                    mx[r] = div_max_blk(p[r].a + j, e - j, pow2, iv, dv, mx[r]);
            }
            cur[r] = e;
        }
    }
    for (uint32_t r = 0; r < R; r++) {
        float maxv = early ? mx[r] : infer_div_max_avx512(p[r].a, p[r].len, d);
        float sum = infer_exp_sum_avx512(p[r].a, p[r].len, maxv);
        if (early)
            sm[r] = sum; /* divided block by block in the values pass */
        else
            (void)infer_div_max_avx512(p[r].a, p[r].len, sum);
        cur[r] = 0;
        for (uint32_t c = 0; c < hs; c++)
            p[r].out[c] = 0.0f;
    }
    for (uint32_t t0 = 0, b = 0; t0 < T; t0 += kb, b++) {
        uint32_t t1 = T - t0 < kb ? T : t0 + kb;
        const float *vb0 = vh + (size_t)t0 * kv_dim;
        size_t ld = kv_dim;
        if (pack) {
            pack_rows(pack, vh, kv_dim, hs, t0, t1);
            vb0 = pack;
            ld = hs;
        }
        uint32_t r = 0;
        if (hs == 64)
            for (; r + 2 <= R; r += 2) {
                uint32_t ja = cur[r], jb = cur[r + 1];
                uint32_t ea = blk_ends_get(&ends, b, r, p[r].list, ja, p[r].len, t1);
                uint32_t eb = blk_ends_get(&ends, b, r + 1, p[r + 1].list, jb, p[r + 1].len, t1);
                cur[r] = ea;
                cur[r + 1] = eb;
                if (early) {
                    div_blk(p[r].a + ja, ea - ja, _mm512_set1_ps(sm[r]));
                    div_blk(p[r + 1].a + jb, eb - jb, _mm512_set1_ps(sm[r + 1]));
                }
                values2_64(p[r].out, p[r].a, p[r].list, ja, ea, p[r + 1].out, p[r + 1].a,
                           p[r + 1].list, jb, eb, vb0, ld, t0);
            }
        for (; r < R; r++) {
            uint32_t j0 = cur[r], e = blk_ends_get(&ends, b, r, p[r].list, j0, p[r].len, t1);
            cur[r] = e;
            if (e == j0)
                continue;
            if (early)
                div_blk(p[r].a + j0, e - j0, _mm512_set1_ps(sm[r]));
            values_hs(p[r].out, p[r].a, vb0, ld, hs, p[r].list, j0, e, t0);
        }
    }
}

void attn_sel_row_avx512(float *out, const float *qh, const float *kh, const float *vh,
                         size_t kv_dim, uint32_t hs, const uint32_t *list, uint32_t len, float *a)
{
    struct attn_sel_pair p = {.q = qh, .list = list, .len = len, .a = a, .out = out};
    uint32_t cur;
    attn_sel_rows_avx512(1, &p, kh, vh, kv_dim, hs, list[len - 1] + 1, list[len - 1] + 1, &cur,
                         NULL);
}
