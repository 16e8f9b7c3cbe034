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
 * - the softmax by infer_div_max_avx512 and infer_exp_sum_avx512;
 * - each output column one FMA chain over the kept values in list order
 *   from 0, as infer_matmul_nn_avx512's (128 columns, 8 accumulators, at a
 *   time, then 64 with 4; head size 64: two pairs interleaved, 8 chains in
 *   flight). */
#include <immintrin.h>
#include <math.h>

#include "attn_sparse.h"
#include "infer_matmul.h"

/* _mm512_reduce_add_ps of four vectors at once (lane i of the result: of a_i) */
static inline __m128 hsum4_16(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
#define HALF(a)                                                                                    \
    _mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)),               \
                  _mm512_castps512_ps256(a))
    __m256 b0 = HALF(a0), b1 = HALF(a1), b2 = HALF(a2), b3 = HALF(a3);
#undef HALF
    __m128 t0 = _mm_add_ps(_mm256_extractf128_ps(b0, 1), _mm256_castps256_ps128(b0));
    __m128 t1 = _mm_add_ps(_mm256_extractf128_ps(b1, 1), _mm256_castps256_ps128(b1));
    __m128 t2 = _mm_add_ps(_mm256_extractf128_ps(b2, 1), _mm256_castps256_ps128(b2));
    __m128 t3 = _mm_add_ps(_mm256_extractf128_ps(b3, 1), _mm256_castps256_ps128(b3));
    _MM_TRANSPOSE4_PS(t0, t1, t2, t3); /* t_i = lane i of each */
    return _mm_add_ps(_mm_add_ps(t0, t2), _mm_add_ps(t1, t3));
}

/* _mm512_reduce_add_ps of sixteen vectors at once (lane i of the result: of
 * a[i]), the same adds in the same order as one vector at a time (float adds
 * commute, so only the pairing matters): the 256-bit halves of a[k] and
 * a[k + 8] added in one vector, then the 128-bit quarters, then elements
 * (0 + 2) and (1 + 3), then those two; the keys come out in the order
 * 0 2 1 3 8 10 9 11 4 6 5 7 12 14 13 15 and one permute sorts them. */
static inline __attribute__((always_inline)) __m512 hsum16_16(const __m512 a[16])
{
    __m512 s[8], w[4], z[2];
    for (int k = 0; k < 8; k++) /* [k.lo256 | k+8.lo256] + [k.hi256 | k+8.hi256] */
        s[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[k], a[k + 8], 0x44),
                             _mm512_shuffle_f32x4(a[k], a[k + 8], 0xee));
    for (int k = 0; k < 4; k++) /* quarters: lanes of keys k, k+8, k+4, k+12 */
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(s[k], s[k + 4], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(s[k], s[k + 4], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int k = 0; k < 2; k++) /* (e0 + e2), (e1 + e3) of keys k and k + 2 per lane */
        z[k] = _mm512_add_ps(_mm512_shuffle_ps(w[k], w[k + 2], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(w[k], w[k + 2], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i at = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
    return _mm512_permutexvar_ps(at, r);
}

#define AHEAD 8 /* scattered rows miss the caches: ask for a row this many ahead */
static inline void prefetch_row(const float *p, uint32_t n)
{
    for (uint32_t c = 0; c < n; c += 16)
        _mm_prefetch((const char *)(p + c), _MM_HINT_T0);
}

/* a[j] = dot(qh, key of slot list[j]), the key at kh + (list[j] - t0) * ld;
 * HS: hs when a constant (64, 128), else 0; PF: prefetch AHEAD keys ahead */
static inline __attribute__((always_inline)) void
scores_t(const uint32_t HS, const int PF, float *a, const float *qh, const float *kh, size_t ld,
         uint32_t hs, const uint32_t *list, uint32_t len, uint32_t t0)
{
    if (HS)
        hs = HS;
    uint32_t j = 0;
    /* sixteen keys at a time where the rows are in the caches (no prefetch):
     * one fold for the sixteen */
    if (!PF)
        for (; j + 16 <= len; j += 16) {
            const float *k[16];
            __m512 acc[16];
            for (int e = 0; e < 16; e++) {
                k[e] = kh + (size_t)(list[j + e] - t0) * ld;
                acc[e] = _mm512_setzero_ps();
            }
            for (uint32_t c = 0; c < hs; c += 16) {
                __m512 q = _mm512_loadu_ps(qh + c);
#pragma GCC unroll 16
                for (int e = 0; e < 16; e++)
                    acc[e] = _mm512_fmadd_ps(q, _mm512_loadu_ps(k[e] + c), acc[e]);
            }
            _mm512_storeu_ps(a + j, hsum16_16(acc));
        }
    for (; j + 8 <= len; j += 8) {
        if (PF && j + AHEAD + 8 <= len)
            for (uint32_t e = 0; e < 8; e++)
                prefetch_row(kh + (size_t)(list[j + AHEAD + e] - t0) * ld, hs);
        const float *k[8];
        for (int e = 0; e < 8; e++)
            k[e] = kh + (size_t)(list[j + e] - t0) * ld;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m512 a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (uint32_t c = 0; c < hs; c += 16) {
            __m512 q = _mm512_loadu_ps(qh + c);
            a0 = _mm512_fmadd_ps(q, _mm512_loadu_ps(k[0] + c), a0);
            a1 = _mm512_fmadd_ps(q, _mm512_loadu_ps(k[1] + c), a1);
            a2 = _mm512_fmadd_ps(q, _mm512_loadu_ps(k[2] + c), a2);
            a3 = _mm512_fmadd_ps(q, _mm512_loadu_ps(k[3] + c), a3);
            a4 = _mm512_fmadd_ps(q, _mm512_loadu_ps(k[4] + c), a4);
            a5 = _mm512_fmadd_ps(q, _mm512_loadu_ps(k[5] + c), a5);
            a6 = _mm512_fmadd_ps(q, _mm512_loadu_ps(k[6] + c), a6);
            a7 = _mm512_fmadd_ps(q, _mm512_loadu_ps(k[7] + c), a7);
        }
        _mm_storeu_ps(a + j, hsum4_16(a0, a1, a2, a3));
        _mm_storeu_ps(a + j + 4, hsum4_16(a4, a5, a6, a7));
    }
    for (; j < len; j++) {
        const float *k0 = kh + (size_t)(list[j] - t0) * ld;
        __m512 a0 = _mm512_setzero_ps();
        for (uint32_t c = 0; c < hs; c += 16)
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(qh + c), _mm512_loadu_ps(k0 + c), a0);
        a[j] = _mm512_reduce_add_ps(a0);
    }
}

static void scores_blk(float *a, const float *qh, const float *kh, size_t ld, uint32_t hs,
                       const uint32_t *list, uint32_t len, uint32_t t0)
{
    if (ld != hs)
        scores_t(0, 1, a, qh, kh, ld, hs, list, len, t0);
    else if (hs == 64)
        scores_t(64, 0, a, qh, kh, ld, hs, list, len, t0);
    else if (hs == 128)
        scores_t(128, 0, a, qh, kh, ld, hs, list, len, t0);
    else
        scores_t(0, 0, a, qh, kh, ld, hs, list, len, t0);
}

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

/* out[hs] += sum over list[j0..e) of a[j] * value row (list[j] - t0) of vb0
 * (rows ld apart), each column one FMA chain in list order */
static inline __attribute__((always_inline)) void
values_t(const uint32_t HS, float *out, const float *a, const float *vb0, size_t ld, uint32_t hs,
         const uint32_t *list, uint32_t j0, uint32_t e, uint32_t t0)
{
    if (HS)
        hs = HS;
    uint32_t c0 = 0;
    /* 128 columns (8 chains) a pass where the head has them: each key's
     * index and weight read once for all of them */
    for (; c0 + 128 <= hs; c0 += 128) {
        __m512 acc[8];
        for (int i = 0; i < 8; i++)
            acc[i] = _mm512_loadu_ps(out + c0 + 16 * i);
        for (uint32_t j = j0; j < e; j++) {
            const float *v = vb0 + (size_t)(list[j] - t0) * ld + c0;
            __m512 pj = _mm512_set1_ps(a[j]);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                acc[i] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + 16 * i), acc[i]);
        }
        for (int i = 0; i < 8; i++)
            _mm512_storeu_ps(out + c0 + 16 * i, acc[i]);
    }
    for (; c0 + 64 <= hs; c0 += 64) {
        __m512 acc[4];
        for (int i = 0; i < 4; i++)
            acc[i] = _mm512_loadu_ps(out + c0 + 16 * i);
        for (uint32_t j = j0; j < e; j++) {
            const float *v = vb0 + (size_t)(list[j] - t0) * ld + c0;
            __m512 pj = _mm512_set1_ps(a[j]);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                acc[i] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + 16 * i), acc[i]);
        }
        for (int i = 0; i < 4; i++)
            _mm512_storeu_ps(out + c0 + 16 * i, acc[i]);
    }
    for (; c0 < hs; c0 += 16) {
        __m512 acc = _mm512_loadu_ps(out + c0);
        for (uint32_t j = j0; j < e; j++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(a[j]),
                                  _mm512_loadu_ps(vb0 + (size_t)(list[j] - t0) * ld + c0), acc);
        _mm512_storeu_ps(out + c0, acc);
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

/* the first e >= j with e == len or list[e] >= t1 (list ascending) */
static inline uint32_t list_end(const uint32_t *list, uint32_t j, uint32_t len, uint32_t t1)
{
    const __m512i t = _mm512_set1_epi32((int)t1);
    for (; j + 16 <= len; j += 16) {
        __mmask16 m = _mm512_cmplt_epu32_mask(_mm512_loadu_si512(list + j), t);
        if (m != 0xffffu)
            return j + (uint32_t)__builtin_popcount((unsigned)m);
    }
    while (j < len && list[j] < t1)
        j++;
    return j;
}

void attn_sel_rows_avx512(uint32_t R, const struct attn_sel_pair *p, const float *kh,
                          const float *vh, size_t kv_dim, uint32_t hs, uint32_t kb, uint32_t T,
                          uint32_t *cur, float *pack)
{
    for (uint32_t r = 0; r < R; r++)
        cur[r] = 0;
    for (uint32_t t0 = 0; t0 < T; t0 += kb) {
        uint32_t t1 = T - t0 < kb ? T : t0 + kb;
        const float *kb0 = kh + (size_t)t0 * kv_dim;
        size_t ld = kv_dim;
        if (pack) {
            pack_rows(pack, kh, kv_dim, hs, t0, t1);
            kb0 = pack;
            ld = hs;
        }
        for (uint32_t r = 0; r < R; r++) {
            uint32_t j = cur[r], e = list_end(p[r].list, j, p[r].len, t1);
            if (e > j)
                scores_blk(p[r].a + j, p[r].q, kb0, ld, hs, p[r].list + j, e - j, t0);
            cur[r] = e;
        }
    }
    for (uint32_t r = 0; r < R; r++) {
        float maxv = infer_div_max_avx512(p[r].a, p[r].len, sqrtf((float)hs));
        float sum = infer_exp_sum_avx512(p[r].a, p[r].len, maxv);
        (void)infer_div_max_avx512(p[r].a, p[r].len, sum);
        cur[r] = 0;
        for (uint32_t c = 0; c < hs; c++)
            p[r].out[c] = 0.0f;
    }
    for (uint32_t t0 = 0; t0 < T; t0 += kb) {
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
                uint32_t ja = cur[r], ea = list_end(p[r].list, ja, p[r].len, t1);
                uint32_t jb = cur[r + 1], eb = list_end(p[r + 1].list, jb, p[r + 1].len, t1);
                cur[r] = ea;
                cur[r + 1] = eb;
                values2_64(p[r].out, p[r].a, p[r].list, ja, ea, p[r + 1].out, p[r + 1].a,
                           p[r + 1].list, jb, eb, vb0, ld, t0);
            }
        for (; r < R; r++) {
            uint32_t j0 = cur[r], e = list_end(p[r].list, j0, p[r].len, t1);
            cur[r] = e;
            if (e == j0)
                continue;
            if (hs == 64)
                values_t(64, p[r].out, p[r].a, vb0, ld, hs, p[r].list, j0, e, t0);
            else if (hs == 128)
                values_t(128, p[r].out, p[r].a, vb0, ld, hs, p[r].list, j0, e, t0);
            else
                values_t(0, p[r].out, p[r].a, vb0, ld, hs, p[r].list, j0, e, t0);
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

/* attn_group_rows_avx512's values: NH heads (outputs out + h * ldo, weights
 * a + h * len) over the shared list's slots [j0, j1), NC * 16 columns: each
 * value row loaded once for the NH heads, each head's column a FMA chain in
 * list order resumed from out (the same chain as values_t) */
#define VALUES_HEADS(NAME, NH, NC)                                                                \
    static void NAME(float *out, size_t ldo, const float *a, uint32_t len, const float *vh,       \
                     size_t ld, const uint32_t *list, uint32_t j0, uint32_t j1, int pf)           \
    {                                                                                             \
        __m512 acc[NH][NC];                                                                       \
        for (int h = 0; h < NH; h++)                                                              \
            for (int i = 0; i < NC; i++)                                                          \
                acc[h][i] = _mm512_loadu_ps(out + (size_t)h * ldo + 16 * i);                     \
        for (uint32_t j = j0; j < j1; j++) {                                                      \
            if (pf && j + AHEAD < j1)                                                             \
                prefetch_row(vh + (size_t)list[j + AHEAD] * ld, 16 * NC);                         \
            const float *v = vh + (size_t)list[j] * ld;                                           \
            __m512 x[NC];                                                                         \
            for (int i = 0; i < NC; i++)                                                          \
                x[i] = _mm512_loadu_ps(v + 16 * i);                                               \
            for (int h = 0; h < NH; h++) {                                                        \
                __m512 p = _mm512_set1_ps(a[(size_t)h * len + j]);                                \
                for (int i = 0; i < NC; i++)                                                      \
                    acc[h][i] = _mm512_fmadd_ps(p, x[i], acc[h][i]);                              \
            }                                                                                     \
        }                                                                                         \
        for (int h = 0; h < NH; h++)                                                              \
            for (int i = 0; i < NC; i++)                                                          \
                _mm512_storeu_ps(out + (size_t)h * ldo + 16 * i, acc[h][i]);                     \
    }
VALUES_HEADS(values_h4_64, 4, 4)
VALUES_HEADS(values_h2_128, 2, 8)
#undef VALUES_HEADS

/* G query heads of one kv head over one shared list (attn_group_rows; the
 * shared selection), keys and values read in place (rows kv_dim apart),
 * the list walked in chunks of GROUP_CHUNK slots: the first head's scores
 * prefetch the chunk's key rows, the other heads find them in L1; every
 * score scores_t's (the AVX-512 dense kernel's dot and fold); each head's
 * softmax by the kernel's steps; then the values chunk by chunk, each row
 * loaded once for 4 heads (head size 64) or 2 (128), else per head by
 * values_t. Every head gets attn_sel_row_avx512's bits (its twin:
 * attn_group_rows_ref16). s: G * len floats. */
#define GROUP_CHUNK 64u
void attn_group_rows_avx512(float *out, size_t ldo, const float *q, size_t ldq, uint32_t G,
                            uint32_t hs, const float *kh, const float *vh, size_t kv_dim,
                            const uint32_t *list, uint32_t len, float *s)
{
    for (uint32_t j0 = 0; j0 < len; j0 += GROUP_CHUNK) {
        uint32_t n = len - j0 < GROUP_CHUNK ? len - j0 : GROUP_CHUNK;
        for (uint32_t h = 0; h < G; h++) {
            float *a = s + (size_t)h * len + j0;
            const float *qh = q + (size_t)h * ldq;
            if (h == 0)
                scores_t(0, 1, a, qh, kh, kv_dim, hs, list + j0, n, 0);
            else if (hs == 64)
                scores_t(64, 0, a, qh, kh, kv_dim, hs, list + j0, n, 0);
            else if (hs == 128)
                scores_t(128, 0, a, qh, kh, kv_dim, hs, list + j0, n, 0);
            else
                scores_t(0, 0, a, qh, kh, kv_dim, hs, list + j0, n, 0);
        }
    }
    for (uint32_t h = 0; h < G; h++) {
        float *a = s + (size_t)h * len;
        float maxv = infer_div_max_avx512(a, len, sqrtf((float)hs));
        float sum = infer_exp_sum_avx512(a, len, maxv);
        (void)infer_div_max_avx512(a, len, sum);
        for (uint32_t c = 0; c < hs; c++)
            out[(size_t)h * ldo + c] = 0.0f;
    }
    for (uint32_t j0 = 0; j0 < len; j0 += GROUP_CHUNK) {
        uint32_t j1 = len - j0 < GROUP_CHUNK ? len : j0 + GROUP_CHUNK;
        uint32_t h = 0;
        if (hs == 64)
            for (; h + 4 <= G; h += 4)
                values_h4_64(out + (size_t)h * ldo, ldo, s + (size_t)h * len, len, vh, kv_dim,
                             list, j0, j1, h == 0);
        else if (hs == 128)
            for (; h + 2 <= G; h += 2)
                values_h2_128(out + (size_t)h * ldo, ldo, s + (size_t)h * len, len, vh, kv_dim,
                              list, j0, j1, h == 0);
        for (; h < G; h++) {
            float *o = out + (size_t)h * ldo;
            const float *a = s + (size_t)h * len;
            if (hs == 64)
                values_t(64, o, a, vh, kv_dim, hs, list, j0, j1, 0);
            else if (hs == 128)
                values_t(128, o, a, vh, kv_dim, hs, list, j0, j1, 0);
            else
                values_t(0, o, a, vh, kv_dim, hs, list, j0, j1, 0);
        }
    }
}

/* attn_group_rows_avx512 for R rows at once (each its own shared list),
 * walking the keys in blocks of kb slots for all of them as
 * attn_sel_rows_avx512 does, so that a block's key and value rows are read
 * from memory once for the R rows (one row at a time read ~20% of a kv
 * head's rows per row: from L3 at 4K keys). The same bits per head as
 * attn_group_rows_avx512 (each dot and fold, softmax, and each column's
 * chain in list order, resumed block by block). cur: R uint32_t. */
void attn_group_rows_blk_avx512(uint32_t R, const struct attn_group_row *w, uint32_t G,
                                size_t ldq, size_t ldo, uint32_t hs, const float *kh,
                                const float *vh, size_t kv_dim, uint32_t kb, uint32_t T,
                                uint32_t *cur)
{
    for (uint32_t r = 0; r < R; r++)
        cur[r] = 0;
    for (uint32_t t0 = 0; t0 < T; t0 += kb) {
        uint32_t t1 = T - t0 < kb ? T : t0 + kb;
        for (uint32_t r = 0; r < R; r++) {
            uint32_t j = cur[r], e = list_end(w[r].list, j, w[r].len, t1);
            for (uint32_t h = 0; h < G && e > j; h++)
                scores_blk(w[r].s + (size_t)h * w[r].len + j, w[r].q + (size_t)h * ldq, kh, kv_dim,
                           hs, w[r].list + j, e - j, 0);
            cur[r] = e;
        }
    }
    for (uint32_t r = 0; r < R; r++) {
        for (uint32_t h = 0; h < G; h++) {
            float *a = w[r].s + (size_t)h * w[r].len;
            float maxv = infer_div_max_avx512(a, w[r].len, sqrtf((float)hs));
            float sum = infer_exp_sum_avx512(a, w[r].len, maxv);
            (void)infer_div_max_avx512(a, w[r].len, sum);
            for (uint32_t c = 0; c < hs; c++)
                w[r].out[(size_t)h * ldo + c] = 0.0f;
        }
        cur[r] = 0;
    }
    for (uint32_t t0 = 0; t0 < T; t0 += kb) {
        uint32_t t1 = T - t0 < kb ? T : t0 + kb;
        for (uint32_t r = 0; r < R; r++) {
            const uint32_t *list = w[r].list;
            uint32_t len = w[r].len, j0 = cur[r], e = list_end(list, j0, len, t1), h = 0;
            cur[r] = e;
            if (e == j0)
                continue;
            if (hs == 64)
                for (; h + 4 <= G; h += 4)
                    values_h4_64(w[r].out + (size_t)h * ldo, ldo, w[r].s + (size_t)h * len, len, vh,
                                 kv_dim, list, j0, e, 0);
            else if (hs == 128)
                for (; h + 2 <= G; h += 2)
                    values_h2_128(w[r].out + (size_t)h * ldo, ldo, w[r].s + (size_t)h * len, len,
                                  vh, kv_dim, list, j0, e, 0);
            for (; h < G; h++) {
                float *o = w[r].out + (size_t)h * ldo;
                const float *a = w[r].s + (size_t)h * len;
                if (hs == 64)
                    values_t(64, o, a, vh, kv_dim, hs, list, j0, e, 0);
                else if (hs == 128)
                    values_t(128, o, a, vh, kv_dim, hs, list, j0, e, 0);
                else
                    values_t(0, o, a, vh, kv_dim, hs, list, j0, e, 0);
            }
        }
    }
}
