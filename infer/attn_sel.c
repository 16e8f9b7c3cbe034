/* attn_sel.c: the CPU side of sparse attention, scalar twins of the AVX2
 * kernels (attn_sel_avx2.c) and the dispatch.
 *
 * attn_sel_row computes one query row of one head over a list of slots read
 * in place. Where the dense kernel is the AVX2 one, it runs
 * attn_sel_row_avx2, whose bits are those infer_attn_list gets with the AVX2
 * matmul kernels (the per-key dot is the NT tile's 8-lane FMA chain and its
 * fold, the sum over values the NN kernel's FMA chain in list order); any
 * other kernel runs infer_attn_list itself. So keep 1 stays bit-identical to
 * dense attention on every machine. attn_sel_row_ref is the AVX2 kernel's
 * scalar twin (fmaf, the same lanes and order): the tests check them bit for
 * bit. Where the dense kernel is the AVX-512 one, attn_sel_row_avx512 and
 * attn_sel_rows_avx512 (attn_sel_avx512.c) give its bits; their scalar twin
 * is attn_sel_row_ref16 (16-lane chains, _mm512_reduce_add_ps's fold). */
#include <math.h>

#include "attn_sparse.h"
#include "infer_internal.h"
#include "infer_matmul.h"

/* The two twins' common end: the scores a[0..len) scaled, softmaxed, then
 * out[c] = sum over the list of a[j] * v[j][c], one fmaf chain in list order. */
static void softmax_pv_ref(float *out, const float *vh, size_t kv_dim, uint32_t hs,
                           const uint32_t *list, uint32_t len, float *a)
{
    float maxv = infer_div_max_scalar(a, len, sqrtf((float)hs));
    float sum = infer_exp_sum_scalar(a, len, maxv);
    (void)infer_div_max_scalar(a, len, sum);
    for (uint32_t c = 0; c < hs; c++) {
        float acc = 0.0f;
        for (uint32_t j = 0; j < len; j++)
            acc = fmaf(a[j], vh[(size_t)list[j] * kv_dim + c], acc);
        out[c] = acc;
    }
}

void attn_sel_row_ref(float *out, const float *qh, const float *kh, const float *vh,
                      size_t kv_dim, uint32_t hs, const uint32_t *list, uint32_t len, float *a)
{
    for (uint32_t j = 0; j < len; j++) {
        const float *k = kh + (size_t)list[j] * kv_dim;
        float l[8] = {0};
        for (uint32_t c = 0; c < hs; c += 8)
            for (uint32_t e = 0; e < 8; e++)
                l[e] = fmaf(qh[c + e], k[c + e], l[e]);
        float s[4];
        for (uint32_t e = 0; e < 4; e++)
            s[e] = l[e] + l[e + 4];
        a[j] = (s[0] + s[2]) + (s[1] + s[3]);
    }
    softmax_pv_ref(out, vh, kv_dim, hs, list, len, a);
}

void attn_sel_row_ref16(float *out, const float *qh, const float *kh, const float *vh,
                        size_t kv_dim, uint32_t hs, const uint32_t *list, uint32_t len, float *a)
{
    for (uint32_t j = 0; j < len; j++) {
        const float *k = kh + (size_t)list[j] * kv_dim;
        float l[16] = {0};
        for (uint32_t c = 0; c < hs; c += 16)
            for (uint32_t e = 0; e < 16; e++)
                l[e] = fmaf(qh[c + e], k[c + e], l[e]);
        float s[4]; /* _mm512_reduce_add_ps: halves, quarters, then (0 + 2) + (1 + 3) */
        for (uint32_t e = 0; e < 4; e++)
            s[e] = (l[e] + l[e + 8]) + (l[e + 4] + l[e + 12]);
        a[j] = (s[0] + s[2]) + (s[1] + s[3]);
    }
    softmax_pv_ref(out, vh, kv_dim, hs, list, len, a);
}

void attn_sel_row(float *out, const float *qh, const float *kh, const float *vh, size_t kv_dim,
                  uint32_t hs, const uint32_t *list, uint32_t len, float *a, float *gather)
{
#if SLUICE_KERNELS_X86
    if (hs % 8 == 0 && len > 0 && infer_matmul_kernel_used() == INFER_MATMUL_AVX2) {
        attn_sel_row_avx2(out, qh, kh, vh, kv_dim, hs, list, len, a);
        return;
    }
    if (hs % 16 == 0 && len > 0 && infer_matmul_kernel_used() == INFER_MATMUL_AVX512) {
        attn_sel_row_avx512(out, qh, kh, vh, kv_dim, hs, list, len, a);
        return;
    }
#endif
    infer_attn_list(out, qh, kh, vh, kv_dim, hs, list, len, a, gather);
}

uint32_t attn_above_scalar(const float *s, uint32_t n, float th, uint32_t base, uint32_t *idx,
                           float *val, int *nan)
{
    uint32_t m = 0;
    int any = 0;
    for (uint32_t i = 0; i < n; i++) {
        any |= s[i] != s[i];
        idx[m] = base + i;
        if (val)
            val[m] = s[i];
        m += s[i] >= th;
    }
    *nan = any;
    return m;
}

uint32_t attn_above(const float *s, uint32_t n, float th, uint32_t base, uint32_t *idx,
                    float *val, int *nan)
{
#if SLUICE_KERNELS_X86
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX512))
        return attn_above_avx512(s, n, th, base, idx, val, nan);
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX2))
        return attn_above_avx2(s, n, th, base, idx, val, nan);
#endif
    return attn_above_scalar(s, n, th, base, idx, val, nan);
}

uint32_t attn_keep_above_scalar(const uint32_t *idx, const float *val, uint32_t m, float th,
                                uint32_t *out)
{
    uint32_t o = 0;
    for (uint32_t j = 0; j < m; j++) {
        uint32_t v = idx[j];
        out[o] = v;
        o += val[j] >= th;
    }
    return o;
}

uint32_t attn_keep_above(const uint32_t *idx, const float *val, uint32_t m, float th,
                         uint32_t *out)
{
#if SLUICE_KERNELS_X86
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX512))
        return attn_keep_above_avx512(idx, val, m, th, out);
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX2))
        return attn_keep_above_avx2(idx, val, m, th, out);
#endif
    return attn_keep_above_scalar(idx, val, m, th, out);
}

uint32_t attn_count_scalar(const float *s, uint32_t n, float th)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        m += s[i] >= th;
    return m;
}

void attn_range_scalar(const float *s, uint32_t n, float *lo, float *hi, int *nan)
{
    float l = INFINITY, h = -INFINITY;
    int any = 0;
    for (uint32_t i = 0; i < n; i++) {
        any |= s[i] != s[i];
        l = s[i] < l ? s[i] : l;
        h = s[i] > h ? s[i] : h;
    }
    *lo = l;
    *hi = h;
    *nan = any;
}

uint32_t attn_count(const float *s, uint32_t n, float th)
{
#if SLUICE_KERNELS_X86
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX512))
        return attn_count_avx512(s, n, th);
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX2))
        return attn_count_avx2(s, n, th);
#endif
    return attn_count_scalar(s, n, th);
}

void attn_range(const float *s, uint32_t n, float *lo, float *hi, int *nan)
{
#if SLUICE_KERNELS_X86
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX512)) {
        attn_range_avx512(s, n, lo, hi, nan);
        return;
    }
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX2)) {
        attn_range_avx2(s, n, lo, hi, nan);
        return;
    }
#endif
    attn_range_scalar(s, n, lo, hi, nan);
}

void attn_sel_rows(uint32_t R, const struct attn_sel_pair *p, const float *kh, const float *vh,
                   size_t kv_dim, uint32_t hs, uint32_t kb, uint32_t T, uint32_t *cur,
                   float *gather)
{
#if SLUICE_KERNELS_X86
    int ok = hs % 8 == 0 && kb > 0 && infer_matmul_kernel_used() == INFER_MATMUL_AVX2;
    for (uint32_t r = 0; r < R && ok; r++)
        ok = p[r].len > 0;
    if (ok) {
        /* rows already consecutive (kv_dim == hs): read in place */
        attn_sel_rows_avx2(R, p, kh, vh, kv_dim, hs, kb, T, cur,
                           R >= 16 && kv_dim != hs ? gather : NULL);
        return;
    }
    ok = hs % 16 == 0 && kb > 0 && infer_matmul_kernel_used() == INFER_MATMUL_AVX512;
    for (uint32_t r = 0; r < R && ok; r++)
        ok = p[r].len > 0;
    if (ok) { /* the AVX-512 dense kernel's bits */
        attn_sel_rows_avx512(R, p, kh, vh, kv_dim, hs, kb, T, cur,
                             R >= 16 && kv_dim != hs ? gather : NULL);
        return;
    }
#else
    (void)kb;
    (void)T;
    (void)cur;
#endif
    for (uint32_t r = 0; r < R; r++)
        infer_attn_list(p[r].out, p[r].q, kh, vh, kv_dim, hs, p[r].list, p[r].len, p[r].a, gather);
}
