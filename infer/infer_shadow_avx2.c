/* infer_shadow_avx2.c: the shadow term's inner loop with AVX2 (compiled with
 * SLUICE_FLAGS_AVX2; called only where the CPU has it). Bit for bit
 * infer_shadow_axpy_s8_scalar (widen exactly, multiply, then add). */
#include <immintrin.h>
#include <stdint.h>

#include "infer_internal.h"

void infer_shadow_axpy_s8_avx2(float *acc, float e, const int8_t *w, uint32_t n)
{
    const __m256 ve = _mm256_set1_ps(e);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)(w + i))));
        __m256 a = _mm256_loadu_ps(acc + i);
        _mm256_storeu_ps(acc + i, _mm256_add_ps(a, _mm256_mul_ps(ve, f)));
    }
    for (; i < n; i++)
        acc[i] += e * (float)w[i];
}

/* infer_shadow_cols with AVX2: the same products and sums as
 * infer_shadow_cols_scalar, 8 rows a vector. A column's 16 codes of a block
 * are one 64-byte line of 16 int32 (the 4 columns of a group, row by row):
 * shifting its byte to the top and back (arithmetic) sign-extends it. The
 * blocks are taken INFER_SHADOW_COLS_GROUP at a time, so that each token
 * row's outputs are written in runs of that many blocks. */
void infer_shadow_cols_avx2(const struct infer_shadow_cols *k)
{
    /* the lines are scattered (latency-bound), and every block reads the
     * same columns: each read prefetches its column's line pb blocks ahead,
     * at least PF lines ahead in all */
    enum { PF = 32, G = INFER_SHADOW_COLS_GROUP };
    uint32_t nb = k->b1, full = k->rows / 16 < k->b1 ? k->rows / 16 : k->b1;
    uint32_t pb = k->nd ? (PF + k->nd - 1) / k->nd : 1;
    size_t pstep = (size_t)pb * k->block;
    const __m256 vs = _mm256_set1_ps(k->s);
    const __m128i down = _mm_cvtsi32_si128(24);
    for (uint32_t g0 = k->b0; g0 < full; g0 += G) {
        uint32_t gb = full - g0 < G ? full - g0 : G, r0 = g0 * 16;
        for (uint32_t t = 0; t < k->nt; t++) {
            for (uint32_t i = 0; i < 16 * gb; i += 8)
                _mm256_storeu_ps(k->acc + (size_t)t * 16 * G + i, _mm256_setzero_ps());
            /* the outputs this group adds to, scattered rows written by the
             * matmul on another core: asked for now, used after the blocks */
            if (!k->store)
                for (uint32_t i = 0; i < 16 * gb; i += 16)
                    _mm_prefetch((const char *)(k->out[t] + r0 + i), _MM_HINT_T0);
        }
        for (uint32_t bi = 0; bi < gb; bi++) {
            uint32_t b = g0 + bi;
            const int8_t *blk = k->packed + (size_t)b * k->block;
            for (uint32_t d = 0; d < k->nd; d++) {
                uint32_t c = k->col[d];
                __m256 w0, w1;
                if (k->hot[d]) {
                    const int8_t *h = k->hot[d] + (size_t)b * 16;
                    w0 = _mm256_cvtepi32_ps(
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)h)));
                    w1 = _mm256_cvtepi32_ps(
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)(h + 8))));
                } else {
                    const int8_t *line = blk + (size_t)(c / 4) * 64;
                    if (b + pb < nb)
                        _mm_prefetch((const char *)line + pstep, _MM_HINT_T0);
                    __m128i up = _mm_cvtsi32_si128((int)(24 - 8 * (c % 4)));
                    __m256i v0 = _mm256_loadu_si256((const void *)line);
                    __m256i v1 = _mm256_loadu_si256((const void *)(line + 32));
                    w0 = _mm256_cvtepi32_ps(_mm256_sra_epi32(_mm256_sll_epi32(v0, up), down));
                    w1 = _mm256_cvtepi32_ps(_mm256_sra_epi32(_mm256_sll_epi32(v1, up), down));
                }
                for (uint32_t j = k->start[d]; j < k->start[d + 1]; j++) {
                    float *a = k->acc + (size_t)k->tok[j] * 16 * G + bi * 16;
                    __m256 e = _mm256_set1_ps(k->ex[j]);
                    _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), _mm256_mul_ps(e, w0)));
                    _mm256_storeu_ps(
                        a + 8, _mm256_add_ps(_mm256_loadu_ps(a + 8), _mm256_mul_ps(e, w1)));
                }
            }
        }
        for (uint32_t t = 0; t < k->nt; t++) {
            const float *a = k->acc + (size_t)t * 16 * G;
            float *o = k->out[t] + r0;
            int stream = k->store && ((uintptr_t)o & 31) == 0;
            for (uint32_t i = 0; i < 16 * gb; i += 8) {
                __m256 y = _mm256_mul_ps(_mm256_loadu_ps(a + i),
                                         _mm256_mul_ps(vs, _mm256_loadu_ps(k->scale + r0 + i)));
                if (stream) /* read later by another task: past the caches */
                    _mm256_stream_ps(o + i, y);
                else if (k->store)
                    _mm256_storeu_ps(o + i, y);
                else
                    _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(o + i), y));
            }
        }
    }
    _mm_sfence();
    if (full < nb)
        infer_shadow_cols_scalar(k, full > k->b0 ? full : k->b0, nb);
}

/* infer_clip_next_scalar with AVX2: the same products; |u| > 127 (the sign
 * cleared, exact) is u > 127 or u < -127, and false for NaN. Four blocks of
 * 8 are tested at once, then the first of them with a clip is found. */
size_t infer_clip_next_avx2(const float *x, size_t len, float inv)
{
    const __m256 vi = _mm256_set1_ps(inv), lim = _mm256_set1_ps(127.0f);
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    size_t i = 0;
    for (; i + 32 <= len; i += 32) {
        __m256 a = _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi), abs);
        __m256 b = _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vi), abs);
        __m256 c = _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), vi), abs);
        __m256 d = _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), vi), abs);
        __m256 m = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(a, lim, _CMP_GT_OQ),
                                             _mm256_cmp_ps(b, lim, _CMP_GT_OQ)),
                                _mm256_or_ps(_mm256_cmp_ps(c, lim, _CMP_GT_OQ),
                                             _mm256_cmp_ps(d, lim, _CMP_GT_OQ)));
        if (_mm256_movemask_ps(m))
            break;
    }
    for (; i + 8 <= len; i += 8) {
        __m256 a = _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi), abs);
        if (_mm256_movemask_ps(_mm256_cmp_ps(a, lim, _CMP_GT_OQ)))
            return i;
    }
    return i;
}

/* infer_clip_next_q_scalar with AVX2: |code| == 127 (vpabsb keeps -128 as
 * itself). Four blocks of 32 are tested at once, then the first of them
 * with one is found. */
size_t infer_clip_next_q_avx2(const int8_t *xq, size_t len)
{
    const __m256i lim = _mm256_set1_epi8(127);
    size_t i = 0;
    for (; i + 128 <= len; i += 128) {
        const __m256i *p = (const __m256i *)(xq + i);
        __m256i a = _mm256_cmpeq_epi8(_mm256_abs_epi8(_mm256_loadu_si256(p)), lim);
        __m256i b = _mm256_cmpeq_epi8(_mm256_abs_epi8(_mm256_loadu_si256(p + 1)), lim);
        __m256i c = _mm256_cmpeq_epi8(_mm256_abs_epi8(_mm256_loadu_si256(p + 2)), lim);
        __m256i d = _mm256_cmpeq_epi8(_mm256_abs_epi8(_mm256_loadu_si256(p + 3)), lim);
        if (_mm256_movemask_epi8(_mm256_or_si256(_mm256_or_si256(a, b), _mm256_or_si256(c, d))))
            break;
    }
    for (; i + 32 <= len; i += 32) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(xq + i));
        if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_abs_epi8(a), lim)))
            return i;
    }
    return i;
}
