/* attn_avx512_inl.h: the AVX-512F pieces that sparse attention's exact
 * stage (attn_sel_avx512.c, one list per (row, head)) and the shared
 * selection's (attn_group_avx512.c, one list per kv head and row) both use,
 * static inline: the dense kernel's 16-lane dot and fold
 * (infer_matmul_tile_avx512's chain, folded as _mm512_reduce_add_ps), the
 * values' per-column FMA chain in list order, and the end of a list's
 * slots in a key block. Included only by files built with the AVX-512
 * flags. */
#ifndef SLUICE_ATTN_AVX512_INL_H
#define SLUICE_ATTN_AVX512_INL_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

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

static __attribute__((noinline, unused)) void
scores_blk(float *a, const float *qh, const float *kh, size_t ld, uint32_t hs,
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

/* values_t specialized for the head sizes that have their own unrolled form
 * (64, 128), the general one otherwise */
static inline __attribute__((always_inline)) void
values_hs(float *out, const float *a, const float *vb0, size_t ld, uint32_t hs,
          const uint32_t *list, uint32_t j0, uint32_t e, uint32_t t0)
{
    if (hs == 64)
        values_t(64, out, a, vb0, ld, hs, list, j0, e, t0);
    else if (hs == 128)
        values_t(128, out, a, vb0, ld, hs, list, j0, e, t0);
    else
        values_t(0, out, a, vb0, ld, hs, list, j0, e, t0);
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

/* The block ends the scores pass finds (list_end per list and key block),
 * kept for the values pass when lists x blocks fits ATTN_ENDS_MAX (16 KB:
 * 128 lists x 32 blocks, T 4096 at head size 64): the values pass's
 * list_end over each list again cost ~10% of the exact stage (its compares
 * waited on the lists, 128 x T entries, in L2). Else each pass finds them. */
#define ATTN_ENDS_MAX 4096u
struct blk_ends {
    uint32_t R;
    int keep;
    uint32_t e[ATTN_ENDS_MAX]; /* e[b * R + r]: block b's end of list r */
};

/* for R lists over T slots in blocks of kb */
static inline void blk_ends_init(struct blk_ends *be, uint32_t R, uint32_t T, uint32_t kb)
{
    uint32_t nb = kb ? (T + kb - 1) / kb : 0;
    be->R = R;
    be->keep = (uint64_t)nb * R <= ATTN_ENDS_MAX;
}

/* the scores pass: list r's end in block b (below t1, from entry j of len), kept */
static inline uint32_t blk_ends_find(struct blk_ends *be, uint32_t b, uint32_t r,
                                     const uint32_t *list, uint32_t j, uint32_t len, uint32_t t1)
{
    uint32_t e = list_end(list, j, len, t1);
    if (be->keep)
        be->e[(size_t)b * be->R + r] = e;
    return e;
}

/* the values pass: the same end, kept or found again */
static inline uint32_t blk_ends_get(const struct blk_ends *be, uint32_t b, uint32_t r,
                                    const uint32_t *list, uint32_t j, uint32_t len, uint32_t t1)
{
    return be->keep ? be->e[(size_t)b * be->R + r] : list_end(list, j, len, t1);
}

#endif
