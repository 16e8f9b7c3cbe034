/* attn_group.c: sparse attention's shared selection (`select_group`): one
 * key list per query row and kv head, shared by the query heads of that kv
 * head (GQA's group).
 *
 * attn_group_combine folds the group's int8 estimates into one score per
 * slot: c[t] = max over the heads h of (est_h[t] - off_h), off_h the
 * head's largest estimate plus sqrt(head_dim) times the log of its
 * softmax's denominator, so c[t] / sqrt(head_dim) is the largest of the
 * heads' estimated log-probabilities of slot t. The rule before, each head
 * relative to its largest alone (off_h = max est_h), let a head with a flat
 * row (many keys near its maximum, each of little mass) fill the list with
 * them: on kjv6L-1k (eval --max-chunks 3, keep 0.45) KL 0.00736 / top-1
 * 95.76% against 0.00457 / 96.93% now; the targets need keep 0.65 then,
 * 0.55 now (docs/BENCHMARKS.md, twelfth session, a17). Subtractions and
 * maxima, and a sum of 2^x for the denominators (attn_group_exp2_sum_scalar):
 * plain C, an AVX-512 kernel
 * (attn_group_avx512.c; at 4K keys and 8 heads the plain loop was ~15% of
 * the group selection's time: it has no AVX-512 flags) and an AVX2 one
 * (attn_group_avx2.c), both with the plain loop's bits.
 *
 * attn_group_rows runs the group's heads over the shared list together: the
 * list's keys gathered into consecutive rows once for all heads, the dense
 * kernel's NT matmul (every score its own dot product, each key row read
 * once for the heads), each head's softmax with the kernel's steps, and the
 * NN matmul over the values gathered once (each head's sum in list order).
 * Every head's output is the bits infer_attn_list gives for that head and
 * list: the same dots, the same softmax, the same sums (test_attn_group).
 * With the AVX2 matmul kernel (and hs % 8 == 0) attn_group_rows_avx2 does
 * it without gathering (attn_sel_avx2.c; its scalar twin
 * attn_group_rows_ref), and with the AVX-512 one (hs % 16 == 0)
 * attn_group_rows_avx512 (attn_group_avx512.c; twin attn_group_rows_ref16). */
#include <math.h>

#include "attn_sparse.h"
#include "infer_internal.h"
#include "infer_matmul.h"

void attn_group_combine(const float *est, size_t ld, uint32_t G, uint32_t visible, float sq,
                        float *c)
{
#if SLUICE_KERNELS_X86
    if (infer_matmul_kernel_used() == INFER_MATMUL_AVX512) {
        attn_group_combine_avx512(est, ld, G, visible, sq, c);
        return;
    }
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX2)) {
        attn_group_combine_avx2(est, ld, G, visible, sq, c);
        return;
    }
#endif
    attn_group_combine_scalar(est, ld, G, visible, sq, c);
}

/* (one pass over the row, where infer_div_max and infer_exp_sum on a copy
 * took three and most of the combine's time) */
float attn_group_exp2_sum_scalar(const float *e, uint32_t n, float k, float mk)
{
    float l[16] = {0};
    for (uint32_t t = 0; t < n; t++) {
        float x = fmaf(e[t], k, -mk);
        x = x > -126.0f ? x : -126.0f;
        x = x < 0.0f ? x : 0.0f;
        float fl = floorf(x), f = x - fl;
        float p = fmaf(fmaf(fmaf(ATTN_EXP2_C3, f, ATTN_EXP2_C2), f, ATTN_EXP2_C1), f, ATTN_EXP2_C0);
        l[t & 15] += ldexpf(p, (int)fl);
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++)
            l[i] += l[i + w];
    return l[0];
}

void attn_group_combine_scalar(const float *est, size_t ld, uint32_t G, uint32_t visible,
                               float sq, float *c)
{
    const float k = ATTN_EXP2_LOG2E / sq;
    for (uint32_t j = 0; j < G; j++) {
        const float *e = est + (size_t)j * ld;
        float m = -INFINITY;
        for (uint32_t t = 0; t < visible; t++)
            m = e[t] > m ? e[t] : m;
        /* the softmax's denominator of the estimates: sum of exp((e - m) / sq) */
        float off = m + logf(attn_group_exp2_sum_scalar(e, visible, k, m * k)) * sq;
        if (!isfinite(off))
            off = m;
        if (j == 0) {
            for (uint32_t t = 0; t < visible; t++)
                c[t] = e[t] - off;
        } else {
            for (uint32_t t = 0; t < visible; t++) {
                float d = e[t] - off;
                c[t] = d > c[t] ? d : c[t];
            }
        }
    }
}

void attn_group_rows(float *out, size_t ldo, const float *q, size_t ldq, uint32_t G, uint32_t hs,
                     const float *kh, const float *vh, size_t kv_dim, const uint32_t *list,
                     uint32_t len, float *s, float *gather)
{
    enum infer_matmul_kernel k = infer_matmul_kernel_used();
#if SLUICE_KERNELS_X86
    if (hs % 8 == 0 && len > 0 && k == INFER_MATMUL_AVX2) {
        attn_group_rows_avx2(out, ldo, q, ldq, G, hs, kh, vh, kv_dim, list, len, s);
        return;
    }
    if (hs % 16 == 0 && len > 0 && k == INFER_MATMUL_AVX512) {
        attn_group_rows_avx512(out, ldo, q, ldq, G, hs, kh, vh, kv_dim, list, len, s);
        return;
    }
#endif
    float sq = sqrtf((float)hs);
    infer_gather_rows(gather, kh, kv_dim, hs, list, len);
    infer_matmul_nt(k, s, len, q, ldq, gather, INFER_W_F32, hs, G, hs, 0, len);
    for (uint32_t j = 0; j < G; j++) {
        float *a = s + (size_t)j * len;
        infer_softmax_scaled(k, a, len, sq);
    }
    infer_gather_rows(gather, vh, kv_dim, hs, list, len);
    infer_matmul_nn(k, out, ldo, s, len, gather, hs, G, len, hs);
}

void attn_group_rows_blk(uint32_t R, const struct attn_group_row *w, uint32_t G, size_t ldq,
                         size_t ldo, uint32_t hs, const float *kh, const float *vh, size_t kv_dim,
                         uint32_t kb, uint32_t T, uint32_t *cur, float *gather)
{
#if SLUICE_KERNELS_X86
    int ok = hs % 16 == 0 && kb > 0 && infer_matmul_kernel_used() == INFER_MATMUL_AVX512;
    for (uint32_t r = 0; r < R && ok; r++)
        ok = w[r].len > 0;
    if (ok) {
        attn_group_rows_blk_avx512(R, w, G, ldq, ldo, hs, kh, vh, kv_dim, kb, T, cur);
        return;
    }
#else
    (void)kb;
    (void)T;
    (void)cur;
#endif
    for (uint32_t r = 0; r < R; r++) {
        uint32_t gm = w[r].m ? w[r].m : G;
        if (!w[r].lens) {
            attn_group_rows(w[r].out, ldo, w[r].q, ldq, gm, hs, kh, vh, kv_dim, w[r].list,
                            w[r].len, w[r].s, gather);
            continue;
        }
        for (uint32_t h = 0; h < gm; h++) /* each member its own prefix */
            attn_group_rows(w[r].out + (size_t)h * ldo, ldo, w[r].q + (size_t)h * ldq, ldq, 1, hs,
                            kh, vh, kv_dim, w[r].list, w[r].lens[h], w[r].s + (size_t)h * w[r].len,
                            gather);
    }
}

void attn_group_rows_ref(float *out, size_t ldo, const float *q, size_t ldq, uint32_t G,
                         uint32_t hs, const float *kh, const float *vh, size_t kv_dim,
                         const uint32_t *list, uint32_t len, float *s)
{
    for (uint32_t j = 0; j < G; j++)
        attn_sel_row_ref(out + (size_t)j * ldo, q + (size_t)j * ldq, kh, vh, kv_dim, hs, list, len,
                         s + (size_t)j * len);
}

void attn_group_rows_ref16(float *out, size_t ldo, const float *q, size_t ldq, uint32_t G,
                           uint32_t hs, const float *kh, const float *vh, size_t kv_dim,
                           const uint32_t *list, uint32_t len, float *s)
{
    for (uint32_t j = 0; j < G; j++)
        attn_sel_row_ref16(out + (size_t)j * ldo, q + (size_t)j * ldq, kh, vh, kv_dim, hs, list,
                           len, s + (size_t)j * len);
}
