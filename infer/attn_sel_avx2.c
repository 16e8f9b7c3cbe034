/* attn_sel_avx2.c: the CPU side of sparse attention with AVX2 + FMA
 * (attn_sparse.h has the definitions; attn_sel.c the scalar twins):
 * - attn_sel_row_avx2: one query row of one head over a list of slots, read
 *   in place from the cache (no gathering): every score an 8-lane FMA dot
 *   folded like the matmul kernel's hsum, eight keys at a time (their
 *   chains are independent, so eight hide the FMA latency), the kernels' softmax
 *   steps, then probabilities times values by FMA in list order, 64 columns
 *   (8 accumulators) at a time;
 * - attn_above_avx2: the indices of the scores at or above a threshold, by
 *   8-lane compares and the mask's set bits; attn_keep_above_avx2 the same
 *   compaction of a candidate list by its scores. */
#include <immintrin.h>
#include <math.h>

#include "attn_sparse.h"
#include "infer_matmul.h"

/* the matmul kernel's fold: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), for four
 * vectors at once (a 4x4 transpose puts lane i of each in column i) */
static inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    __m128 t1 = _mm_add_ps(_mm256_castps256_ps128(a1), _mm256_extractf128_ps(a1, 1));
    __m128 t2 = _mm_add_ps(_mm256_castps256_ps128(a2), _mm256_extractf128_ps(a2, 1));
    __m128 t3 = _mm_add_ps(_mm256_castps256_ps128(a3), _mm256_extractf128_ps(a3, 1));
    _MM_TRANSPOSE4_PS(t0, t1, t2, t3); /* t_i = lane i of each */
    return _mm_add_ps(_mm_add_ps(t0, t2), _mm_add_ps(t1, t3));
}

static inline float hsum1(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define AHEAD 8 /* scattered rows miss the caches: ask for a row this many ahead */
static inline void prefetch_row(const float *p, uint32_t n)
{
    for (uint32_t c = 0; c < n; c += 16)
        _mm_prefetch((const char *)(p + c), _MM_HINT_T0);
}

/* a[j] = dot(qh, key of slot list[j]), the key at kh + (list[j] - t0) * kv_dim;
 * HS: hs when it is a constant (64, 128), else 0; PF: prefetch the rows
 * AHEAD keys ahead (scattered rows of the cache; a block already in the
 * caches gains nothing from it) */
static inline __attribute__((always_inline)) void
scores_t(const uint32_t HS, const int PF, float *a, const float *qh, const float *kh,
         size_t kv_dim, uint32_t hs, const uint32_t *list, uint32_t len, uint32_t t0)
{
    if (HS)
        hs = HS;
    uint32_t j = 0;
    /* eight keys at a time: eight independent FMA chains */
    for (; j + 8 <= len; j += 8) {
        if (PF && j + AHEAD + 8 <= len)
            for (uint32_t e = 0; e < 8; e++)
                prefetch_row(kh + (size_t)(list[j + AHEAD + e] - t0) * kv_dim, hs);
        const float *k[8];
        for (int e = 0; e < 8; e++)
            k[e] = kh + (size_t)(list[j + e] - t0) * kv_dim;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m256 a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (uint32_t c = 0; c < hs; c += 8) {
            __m256 q = _mm256_loadu_ps(qh + c);
            a0 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k[0] + c), a0);
            a1 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k[1] + c), a1);
            a2 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k[2] + c), a2);
            a3 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k[3] + c), a3);
            a4 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k[4] + c), a4);
            a5 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k[5] + c), a5);
            a6 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k[6] + c), a6);
            a7 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k[7] + c), a7);
        }
        _mm_storeu_ps(a + j, hsum4(a0, a1, a2, a3));
        _mm_storeu_ps(a + j + 4, hsum4(a4, a5, a6, a7));
    }
    for (; j + 4 <= len; j += 4) {
        const float *k0 = kh + (size_t)(list[j] - t0) * kv_dim;
        const float *k1 = kh + (size_t)(list[j + 1] - t0) * kv_dim;
        const float *k2 = kh + (size_t)(list[j + 2] - t0) * kv_dim;
        const float *k3 = kh + (size_t)(list[j + 3] - t0) * kv_dim;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (uint32_t c = 0; c < hs; c += 8) {
            __m256 q = _mm256_loadu_ps(qh + c);
            a0 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k0 + c), a0);
            a1 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k1 + c), a1);
            a2 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k2 + c), a2);
            a3 = _mm256_fmadd_ps(q, _mm256_loadu_ps(k3 + c), a3);
        }
        _mm_storeu_ps(a + j, hsum4(a0, a1, a2, a3));
    }
    for (; j < len; j++) {
        const float *k0 = kh + (size_t)(list[j] - t0) * kv_dim;
        __m256 a0 = _mm256_setzero_ps();
        for (uint32_t c = 0; c < hs; c += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + c), _mm256_loadu_ps(k0 + c), a0);
        a[j] = hsum1(a0);
    }
}

static void scores_at(float *a, const float *qh, const float *kh, size_t kv_dim, uint32_t hs,
                      const uint32_t *list, uint32_t len, uint32_t t0)
{
    scores_t(0, 1, a, qh, kh, kv_dim, hs, list, len, t0);
}

/* a block of keys: without prefetch where its rows are consecutive (a
 * copy the caches hold), with it where they are read in place (kv_dim
 * apart: decode's scattered cache rows); the common head sizes' loops
 * unrolled */
static void scores_blk(float *a, const float *qh, const float *kh, size_t kv_dim, uint32_t hs,
                       const uint32_t *list, uint32_t len, uint32_t t0)
{
    if (kv_dim != hs)
        scores_t(0, 1, a, qh, kh, kv_dim, hs, list, len, t0);
    else if (hs == 64)
        scores_t(64, 0, a, qh, kh, kv_dim, hs, list, len, t0);
    else if (hs == 128)
        scores_t(128, 0, a, qh, kh, kv_dim, hs, list, len, t0);
    else
        scores_t(0, 0, a, qh, kh, kv_dim, hs, list, len, t0);
}

static void scores(float *a, const float *qh, const float *kh, size_t kv_dim, uint32_t hs,
                   const uint32_t *list, uint32_t len)
{
    scores_at(a, qh, kh, kv_dim, hs, list, len, 0);
}

/* rows t0..t1 of src (stride ld) into dst (stride hs) */
static void pack_rows(float *dst, const float *src, size_t ld, uint32_t hs, uint32_t t0,
                      uint32_t t1)
{
    for (uint32_t t = t0; t < t1; t++) {
        const float *s = src + (size_t)t * ld;
        float *d = dst + (size_t)(t - t0) * hs;
        for (uint32_t c = 0; c < hs; c += 8)
            _mm256_storeu_ps(d + c, _mm256_loadu_ps(s + c));
    }
}

static void values(float *out, const float *a, const float *vh, size_t kv_dim, uint32_t hs,
                   const uint32_t *list, uint32_t len)
{
    uint32_t c0 = 0;
    for (; c0 + 64 <= hs; c0 += 64) {
        __m256 acc[8];
        for (int i = 0; i < 8; i++)
            acc[i] = _mm256_setzero_ps();
        for (uint32_t j = 0; j < len; j++) {
            if (c0 == 0 && j + AHEAD < len)
                prefetch_row(vh + (size_t)list[j + AHEAD] * kv_dim, hs);
            const float *v = vh + (size_t)list[j] * kv_dim + c0;
            __m256 p = _mm256_set1_ps(a[j]);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                acc[i] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * i), acc[i]);
        }
        for (int i = 0; i < 8; i++)
            _mm256_storeu_ps(out + c0 + 8 * i, acc[i]);
    }
    for (; c0 < hs; c0 += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (uint32_t j = 0; j < len; j++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(a[j]),
                                  _mm256_loadu_ps(vh + (size_t)list[j] * kv_dim + c0), acc);
        _mm256_storeu_ps(out + c0, acc);
    }
}

void attn_sel_row_avx2(float *out, const float *qh, const float *kh, const float *vh,
                       size_t kv_dim, uint32_t hs, const uint32_t *list, uint32_t len, float *a)
{
    scores(a, qh, kh, kv_dim, hs, list, len);
    float maxv = infer_div_max_avx2(a, len, sqrtf((float)hs));
    float sum = infer_exp_sum_avx2(a, len, maxv);
    (void)infer_div_max_avx2(a, len, sum);
    values(out, a, vh, kv_dim, hs, list, len);
}

/* left-pack table: for an 8-bit mask, the positions of its set bits in
 * ascending order, one per byte (the rest 0) */
static const uint64_t pack_lut[256] = {
    0x0000000000000000ull, 0x0000000000000000ull, 0x0000000000000001ull, 0x0000000000000100ull,
    0x0000000000000002ull, 0x0000000000000200ull, 0x0000000000000201ull, 0x0000000000020100ull,
    0x0000000000000003ull, 0x0000000000000300ull, 0x0000000000000301ull, 0x0000000000030100ull,
    0x0000000000000302ull, 0x0000000000030200ull, 0x0000000000030201ull, 0x0000000003020100ull,
    0x0000000000000004ull, 0x0000000000000400ull, 0x0000000000000401ull, 0x0000000000040100ull,
    0x0000000000000402ull, 0x0000000000040200ull, 0x0000000000040201ull, 0x0000000004020100ull,
    0x0000000000000403ull, 0x0000000000040300ull, 0x0000000000040301ull, 0x0000000004030100ull,
    0x0000000000040302ull, 0x0000000004030200ull, 0x0000000004030201ull, 0x0000000403020100ull,
    0x0000000000000005ull, 0x0000000000000500ull, 0x0000000000000501ull, 0x0000000000050100ull,
    0x0000000000000502ull, 0x0000000000050200ull, 0x0000000000050201ull, 0x0000000005020100ull,
    0x0000000000000503ull, 0x0000000000050300ull, 0x0000000000050301ull, 0x0000000005030100ull,
    0x0000000000050302ull, 0x0000000005030200ull, 0x0000000005030201ull, 0x0000000503020100ull,
    0x0000000000000504ull, 0x0000000000050400ull, 0x0000000000050401ull, 0x0000000005040100ull,
    0x0000000000050402ull, 0x0000000005040200ull, 0x0000000005040201ull, 0x0000000504020100ull,
    0x0000000000050403ull, 0x0000000005040300ull, 0x0000000005040301ull, 0x0000000504030100ull,
    0x0000000005040302ull, 0x0000000504030200ull, 0x0000000504030201ull, 0x0000050403020100ull,
    0x0000000000000006ull, 0x0000000000000600ull, 0x0000000000000601ull, 0x0000000000060100ull,
    0x0000000000000602ull, 0x0000000000060200ull, 0x0000000000060201ull, 0x0000000006020100ull,
    0x0000000000000603ull, 0x0000000000060300ull, 0x0000000000060301ull, 0x0000000006030100ull,
    0x0000000000060302ull, 0x0000000006030200ull, 0x0000000006030201ull, 0x0000000603020100ull,
    0x0000000000000604ull, 0x0000000000060400ull, 0x0000000000060401ull, 0x0000000006040100ull,
    0x0000000000060402ull, 0x0000000006040200ull, 0x0000000006040201ull, 0x0000000604020100ull,
    0x0000000000060403ull, 0x0000000006040300ull, 0x0000000006040301ull, 0x0000000604030100ull,
    0x0000000006040302ull, 0x0000000604030200ull, 0x0000000604030201ull, 0x0000060403020100ull,
    0x0000000000000605ull, 0x0000000000060500ull, 0x0000000000060501ull, 0x0000000006050100ull,
    0x0000000000060502ull, 0x0000000006050200ull, 0x0000000006050201ull, 0x0000000605020100ull,
    0x0000000000060503ull, 0x0000000006050300ull, 0x0000000006050301ull, 0x0000000605030100ull,
    0x0000000006050302ull, 0x0000000605030200ull, 0x0000000605030201ull, 0x0000060503020100ull,
    0x0000000000060504ull, 0x0000000006050400ull, 0x0000000006050401ull, 0x0000000605040100ull,
    0x0000000006050402ull, 0x0000000605040200ull, 0x0000000605040201ull, 0x0000060504020100ull,
    0x0000000006050403ull, 0x0000000605040300ull, 0x0000000605040301ull, 0x0000060504030100ull,
    0x0000000605040302ull, 0x0000060504030200ull, 0x0000060504030201ull, 0x0006050403020100ull,
    0x0000000000000007ull, 0x0000000000000700ull, 0x0000000000000701ull, 0x0000000000070100ull,
    0x0000000000000702ull, 0x0000000000070200ull, 0x0000000000070201ull, 0x0000000007020100ull,
    0x0000000000000703ull, 0x0000000000070300ull, 0x0000000000070301ull, 0x0000000007030100ull,
    0x0000000000070302ull, 0x0000000007030200ull, 0x0000000007030201ull, 0x0000000703020100ull,
    0x0000000000000704ull, 0x0000000000070400ull, 0x0000000000070401ull, 0x0000000007040100ull,
    0x0000000000070402ull, 0x0000000007040200ull, 0x0000000007040201ull, 0x0000000704020100ull,
    0x0000000000070403ull, 0x0000000007040300ull, 0x0000000007040301ull, 0x0000000704030100ull,
    0x0000000007040302ull, 0x0000000704030200ull, 0x0000000704030201ull, 0x0000070403020100ull,
    0x0000000000000705ull, 0x0000000000070500ull, 0x0000000000070501ull, 0x0000000007050100ull,
    0x0000000000070502ull, 0x0000000007050200ull, 0x0000000007050201ull, 0x0000000705020100ull,
    0x0000000000070503ull, 0x0000000007050300ull, 0x0000000007050301ull, 0x0000000705030100ull,
    0x0000000007050302ull, 0x0000000705030200ull, 0x0000000705030201ull, 0x0000070503020100ull,
    0x0000000000070504ull, 0x0000000007050400ull, 0x0000000007050401ull, 0x0000000705040100ull,
    0x0000000007050402ull, 0x0000000705040200ull, 0x0000000705040201ull, 0x0000070504020100ull,
    0x0000000007050403ull, 0x0000000705040300ull, 0x0000000705040301ull, 0x0000070504030100ull,
    0x0000000705040302ull, 0x0000070504030200ull, 0x0000070504030201ull, 0x0007050403020100ull,
    0x0000000000000706ull, 0x0000000000070600ull, 0x0000000000070601ull, 0x0000000007060100ull,
    0x0000000000070602ull, 0x0000000007060200ull, 0x0000000007060201ull, 0x0000000706020100ull,
    0x0000000000070603ull, 0x0000000007060300ull, 0x0000000007060301ull, 0x0000000706030100ull,
    0x0000000007060302ull, 0x0000000706030200ull, 0x0000000706030201ull, 0x0000070603020100ull,
    0x0000000000070604ull, 0x0000000007060400ull, 0x0000000007060401ull, 0x0000000706040100ull,
    0x0000000007060402ull, 0x0000000706040200ull, 0x0000000706040201ull, 0x0000070604020100ull,
    0x0000000007060403ull, 0x0000000706040300ull, 0x0000000706040301ull, 0x0000070604030100ull,
    0x0000000706040302ull, 0x0000070604030200ull, 0x0000070604030201ull, 0x0007060403020100ull,
    0x0000000000070605ull, 0x0000000007060500ull, 0x0000000007060501ull, 0x0000000706050100ull,
    0x0000000007060502ull, 0x0000000706050200ull, 0x0000000706050201ull, 0x0000070605020100ull,
    0x0000000007060503ull, 0x0000000706050300ull, 0x0000000706050301ull, 0x0000070605030100ull,
    0x0000000706050302ull, 0x0000070605030200ull, 0x0000070605030201ull, 0x0007060503020100ull,
    0x0000000007060504ull, 0x0000000706050400ull, 0x0000000706050401ull, 0x0000070605040100ull,
    0x0000000706050402ull, 0x0000070605040200ull, 0x0000070605040201ull, 0x0007060504020100ull,
    0x0000000706050403ull, 0x0000070605040300ull, 0x0000070605040301ull, 0x0007060504030100ull,
    0x0000070605040302ull, 0x0007060504030200ull, 0x0007060504030201ull, 0x0706050403020100ull,
};

/* set bits of an 8-bit mask (no popcnt instruction assumed) */
static inline uint32_t pop8(unsigned x)
{
    x = x - ((x >> 1) & 0x55u);
    x = (x & 0x33u) + ((x >> 2) & 0x33u);
    return (x + (x >> 4)) & 0x0fu;
}

/* the same with the popcnt instruction (every AVX2 CPU has it; sl_cpu_features'
 * avx2 requires it): the compaction
 * passes count each vector's kept lanes with it (top-k 1.2x faster than
 * with pop8's eight scalar steps, s9/tk) */
#define POPCNT __attribute__((target("popcnt")))
static inline POPCNT uint32_t popc(unsigned x)
{
    return (uint32_t)_mm_popcnt_u32(x);
}

/* the indices of a vector's lanes >= th are written by one left-packed
 * 8-lane store (the table's shuffle of the mask) and the count advanced by
 * its popcount: no branch per set bit (at 20% kept, one mispredicted branch
 * per vector cost more than the compares) */
POPCNT uint32_t attn_above_avx2(const float *s, uint32_t n, float th, uint32_t base,
                                uint32_t *idx, float *val, int *nan)
{
    const __m256 t = _mm256_set1_ps(th);
    __m256 un = _mm256_setzero_ps();
    uint32_t m = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(s + i);
        un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        unsigned bits = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, t, _CMP_GE_OQ));
        __m256i pos = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)pack_lut[bits]));
        /* m <= i: the 8 lanes stored land below i + 8 <= n */
        _mm256_storeu_si256((__m256i *)(idx + m),
                            _mm256_add_epi32(pos, _mm256_set1_epi32((int)(base + i))));
        if (val)
            _mm256_storeu_ps(val + m, _mm256_permutevar8x32_ps(v, pos));
        m += popc(bits);
    }
    int any = _mm256_movemask_ps(un) != 0;
    for (; i < n; i++) {
        any |= s[i] != s[i];
        idx[m] = base + i;
        if (val)
            val[m] = s[i];
        m += s[i] >= th;
    }
    *nan = any;
    return m;
}

POPCNT uint32_t attn_keep_above_avx2(const uint32_t *idx, const float *val, uint32_t m, float th,
                                     uint32_t *out)
{
    const __m256 t = _mm256_set1_ps(th);
    uint32_t o = 0, j = 0;
    for (; j + 8 <= m; j += 8) {
        unsigned bits = (unsigned)_mm256_movemask_ps(
            _mm256_cmp_ps(_mm256_loadu_ps(val + j), t, _CMP_GE_OQ));
        __m256i pos = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)pack_lut[bits]));
        __m256i v = _mm256_loadu_si256((const __m256i *)(idx + j));
        /* o <= j: the 8 lanes stored land below j + 8 <= m (and after the
         * loads of idx[j..j + 8) when out is idx) */
        _mm256_storeu_si256((__m256i *)(out + o), _mm256_permutevar8x32_epi32(v, pos));
        o += popc(bits);
    }
    for (; j < m; j++) {
        uint32_t v = idx[j];
        out[o] = v;
        o += val[j] >= th;
    }
    return o;
}

uint32_t attn_count_avx2(const float *s, uint32_t n, float th)
{
    const __m256 t = _mm256_set1_ps(th);
    __m256i c = _mm256_setzero_si256();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) /* a true compare is -1 in its lane */
        c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(_mm256_loadu_ps(s + i), t,
                                                                  _CMP_GE_OQ)));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    uint32_t m = (uint32_t)_mm_cvtsi128_si32(h);
    for (; i < n; i++)
        m += s[i] >= th;
    return m;
}

void attn_range_avx2(const float *s, uint32_t n, float *lo, float *hi, int *nan)
{
    /* four minima and four maxima, 32 values a step (one chain waited on
     * the latency of vminps/vmaxps); order does not change their values
     * (a zero's sign may differ: callers only compare) */
    __m256 mn[4], mx[4], un = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) {
        mn[j] = _mm256_set1_ps(INFINITY);
        mx[j] = _mm256_set1_ps(-INFINITY);
    }
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 4; j++) {
            __m256 v = _mm256_loadu_ps(s + i + 8 * j);
            un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            mn[j] = _mm256_min_ps(v, mn[j]); /* a NaN lane keeps the second operand */
            mx[j] = _mm256_max_ps(v, mx[j]);
        }
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(s + i);
        un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        mn[0] = _mm256_min_ps(v, mn[0]);
        mx[0] = _mm256_max_ps(v, mx[0]);
    }
    __m256 mn01 = _mm256_min_ps(mn[0], mn[1]), mn23 = _mm256_min_ps(mn[2], mn[3]);
    __m256 mx01 = _mm256_max_ps(mx[0], mx[1]), mx23 = _mm256_max_ps(mx[2], mx[3]);
    float a[8], b[8], l = INFINITY, h = -INFINITY;
    _mm256_storeu_ps(a, _mm256_min_ps(mn01, mn23));
    _mm256_storeu_ps(b, _mm256_max_ps(mx01, mx23));
    for (int j = 0; j < 8; j++) {
        l = a[j] < l ? a[j] : l;
        h = b[j] > h ? b[j] : h;
    }
    int any = _mm256_movemask_ps(un) != 0;
    for (; i < n; i++) {
        any |= s[i] != s[i];
        l = s[i] < l ? s[i] : l;
        h = s[i] > h ? s[i] : h;
    }
    *lo = l;
    *hi = h;
    *nan = any;
}

/* out[hs] += sum over list[j0..e) of a[j] * value row (list[j] - t0) of vb0
 * (rows ld apart), each column one FMA chain in list order, 64 columns (8
 * accumulators) at a time; HS: hs when a constant, else 0 */
static inline __attribute__((always_inline)) void
values_t(const uint32_t HS, float *out, const float *a, const float *vb0, size_t ld, uint32_t hs,
         const uint32_t *list, uint32_t j0, uint32_t e, uint32_t t0)
{
    if (HS)
        hs = HS;
    uint32_t c0 = 0;
    for (; c0 + 64 <= hs; c0 += 64) {
        __m256 acc[8];
        for (int i = 0; i < 8; i++)
            acc[i] = _mm256_loadu_ps(out + c0 + 8 * i);
        for (uint32_t j = j0; j < e; j++) {
            const float *v = vb0 + (size_t)(list[j] - t0) * ld + c0;
            __m256 pj = _mm256_set1_ps(a[j]);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                acc[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * i), acc[i]);
        }
        for (int i = 0; i < 8; i++)
            _mm256_storeu_ps(out + c0 + 8 * i, acc[i]);
    }
    for (; c0 < hs; c0 += 8) {
        __m256 acc = _mm256_loadu_ps(out + c0);
        for (uint32_t j = j0; j < e; j++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(a[j]),
                                  _mm256_loadu_ps(vb0 + (size_t)(list[j] - t0) * ld + c0), acc);
        _mm256_storeu_ps(out + c0, acc);
    }
}

/* the first e >= j with e == len or list[e] >= t1 (list ascending, slots
 * below 2^31): eight entries compared at a time (a block's ~50 entries per
 * pair cost one mispredicted exit, not one per entry scanned) */
static inline uint32_t list_end(const uint32_t *list, uint32_t j, uint32_t len, uint32_t t1)
{
    const __m256i t = _mm256_set1_epi32((int)t1);
    for (; j + 8 <= len; j += 8) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(list + j));
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(t, v)));
        if (m != 0xffu)
            return j + pop8(m); /* ascending: the lanes below t1 come first */
    }
    while (j < len && list[j] < t1)
        j++;
    return j;
}

/* attn_sel_rows_avx2: R (row, head) pairs of one kv head at once, the keys
 * in blocks of kb slots: every pair's scores of the block's keys, then (after
 * each pair's softmax) every pair's sum over the block's values, its 64
 * accumulators per column chunk stored between blocks. A block's keys and
 * values stay in the cache for all R pairs (each of which keeps some of
 * them), where one pair at a time reads every kept row from memory. Each
 * score is the same dot, and each column's sum the same FMA chain in list
 * order, as in attn_sel_row_avx2: the same bits. pack (kb * hs floats, or
 * NULL): the block's keys, then its values, copied into consecutive rows
 * first (cache rows are kv_dim apart: at a stride of a power of two they
 * share few cache sets, and a block of them would not stay cached). */
void attn_sel_rows_avx2(uint32_t R, const struct attn_sel_pair *p, const float *kh,
                        const float *vh, size_t kv_dim, uint32_t hs, uint32_t kb, uint32_t T,
                        uint32_t *cur, float *pack)
{
    for (uint32_t r = 0; r < R; r++)
        cur[r] = 0;
    for (uint32_t t0 = 0; t0 < T; t0 += kb) {
        uint32_t t1 = T - t0 < kb ? T : t0 + kb;
        const float *kb0 = kh + (size_t)t0 * kv_dim;
        size_t ld = kv_dim;
        if (pack) { /* the block's keys in consecutive rows */
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
        float maxv = infer_div_max_avx2(p[r].a, p[r].len, sqrtf((float)hs));
        float sum = infer_exp_sum_avx2(p[r].a, p[r].len, maxv);
        (void)infer_div_max_avx2(p[r].a, p[r].len, sum);
        cur[r] = 0;
        for (uint32_t c = 0; c < hs; c++)
            p[r].out[c] = 0.0f;
    }
    for (uint32_t t0 = 0; t0 < T; t0 += kb) {
        uint32_t t1 = T - t0 < kb ? T : t0 + kb;
        const float *vb0 = vh + (size_t)t0 * kv_dim;
        size_t ld = kv_dim;
        if (pack) { /* the block's values in consecutive rows */
            pack_rows(pack, vh, kv_dim, hs, t0, t1);
            vb0 = pack;
            ld = hs;
        }
        for (uint32_t r = 0; r < R; r++) {
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

/* attn_group_rows_avx2: G query heads of one kv head over one shared list
 * (attn_group_rows; the shared selection), keys and values read in place.
 * Scores two keys x four heads at a time (eight FMA chains, each key row
 * loaded once for the four heads, each query chunk once for the two keys),
 * every dot the 8-lane chain and fold of scores_at (hsum4 folds four heads'
 * lanes as it folds four keys'); each head's softmax by the kernels' steps;
 * then per head its sum over the values in list order, 64 columns (8
 * accumulators) at a time, the list walked in chunks of 32 slots so that a
 * chunk's value rows stay in L1 for all G heads (sums resumed: the same FMA
 * chain as values()). So every head gets attn_sel_row_avx2's bits. s: G *
 * len floats. */
#define GROUP_CHUNK 32u
void attn_group_rows_avx2(float *out, size_t ldo, const float *q, size_t ldq, uint32_t G,
                          uint32_t hs, const float *kh, const float *vh, size_t kv_dim,
                          const uint32_t *list, uint32_t len, float *s)
{
    uint32_t j = 0;
    for (; j + 2 <= len; j += 2) {
        if (j + AHEAD + 2 <= len) {
            prefetch_row(kh + (size_t)list[j + AHEAD] * kv_dim, hs);
            prefetch_row(kh + (size_t)list[j + AHEAD + 1] * kv_dim, hs);
        }
        const float *k0 = kh + (size_t)list[j] * kv_dim, *k1 = kh + (size_t)list[j + 1] * kv_dim;
        for (uint32_t h0 = 0; h0 < G; h0 += 4) {
            uint32_t nh = G - h0 < 4 ? G - h0 : 4;
            const float *q0 = q + (size_t)h0 * ldq;
            const float *q1 = nh > 1 ? q0 + ldq : q0, *q2 = nh > 2 ? q0 + 2 * ldq : q0;
            const float *q3 = nh > 3 ? q0 + 3 * ldq : q0;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            for (uint32_t c = 0; c < hs; c += 8) {
                __m256 x0 = _mm256_loadu_ps(k0 + c), x1 = _mm256_loadu_ps(k1 + c);
                __m256 y0 = _mm256_loadu_ps(q0 + c), y1 = _mm256_loadu_ps(q1 + c);
                __m256 y2 = _mm256_loadu_ps(q2 + c), y3 = _mm256_loadu_ps(q3 + c);
                a0 = _mm256_fmadd_ps(y0, x0, a0);
                a1 = _mm256_fmadd_ps(y1, x0, a1);
                a2 = _mm256_fmadd_ps(y2, x0, a2);
                a3 = _mm256_fmadd_ps(y3, x0, a3);
                b0 = _mm256_fmadd_ps(y0, x1, b0);
                b1 = _mm256_fmadd_ps(y1, x1, b1);
                b2 = _mm256_fmadd_ps(y2, x1, b2);
                b3 = _mm256_fmadd_ps(y3, x1, b3);
            }
            float ra[4], rb[4];
            _mm_storeu_ps(ra, hsum4(a0, a1, a2, a3));
            _mm_storeu_ps(rb, hsum4(b0, b1, b2, b3));
            for (uint32_t e = 0; e < nh; e++) {
                s[(size_t)(h0 + e) * len + j] = ra[e];
                s[(size_t)(h0 + e) * len + j + 1] = rb[e];
            }
        }
    }
    for (; j < len; j++) {
        const float *k0 = kh + (size_t)list[j] * kv_dim;
        for (uint32_t h = 0; h < G; h++) {
            __m256 a0 = _mm256_setzero_ps();
            for (uint32_t c = 0; c < hs; c += 8)
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)h * ldq + c),
                                     _mm256_loadu_ps(k0 + c), a0);
            /* hsum1's fold differs from hsum4's: fold as hsum4 does */
            float r[4];
            _mm_storeu_ps(r, hsum4(a0, a0, a0, a0));
            s[(size_t)h * len + j] = r[0];
        }
    }
    for (uint32_t h = 0; h < G; h++) {
        float *a = s + (size_t)h * len;
        float maxv = infer_div_max_avx2(a, len, sqrtf((float)hs));
        float sum = infer_exp_sum_avx2(a, len, maxv);
        (void)infer_div_max_avx2(a, len, sum);
    }
    for (uint32_t j0 = 0; j0 < len; j0 += GROUP_CHUNK) {
        uint32_t j1 = len - j0 < GROUP_CHUNK ? len : j0 + GROUP_CHUNK;
        for (uint32_t h = 0; h < G; h++) {
            const float *a = s + (size_t)h * len;
            float *o = out + (size_t)h * ldo;
            uint32_t c0 = 0;
            for (; c0 + 64 <= hs; c0 += 64) {
                __m256 acc[8];
                for (int i = 0; i < 8; i++)
                    acc[i] = j0 ? _mm256_loadu_ps(o + c0 + 8 * i) : _mm256_setzero_ps();
                for (uint32_t jj = j0; jj < j1; jj++) {
                    if (h == 0 && c0 == 0 && jj + AHEAD < len)
                        prefetch_row(vh + (size_t)list[jj + AHEAD] * kv_dim, hs);
                    const float *v = vh + (size_t)list[jj] * kv_dim + c0;
                    __m256 p = _mm256_set1_ps(a[jj]);
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++)
                        acc[i] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * i), acc[i]);
                }
                for (int i = 0; i < 8; i++)
                    _mm256_storeu_ps(o + c0 + 8 * i, acc[i]);
            }
            for (; c0 < hs; c0 += 8) {
                __m256 acc = j0 ? _mm256_loadu_ps(o + c0) : _mm256_setzero_ps();
                for (uint32_t jj = j0; jj < j1; jj++)
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(a[jj]),
                                          _mm256_loadu_ps(vh + (size_t)list[jj] * kv_dim + c0),
                                          acc);
                _mm256_storeu_ps(o + c0, acc);
            }
        }
    }
}
