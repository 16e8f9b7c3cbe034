/* npu_store_avx512.h: the store the AVX-512 kernels share
 * (npu_gemm_avx512vnni.c, npu_gemm_amx.c). Include it only from files built
 * with the AVX-512 flags. */
#ifndef SLUICE_NPU_STORE_AVX512_H
#define SLUICE_NPU_STORE_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#include "npu_gemm_internal.h"

/* Row i, channels c0..c0+15 of the exact int32 sums v, only the channels
 * inside [r0, r1): int32 into c, or (act_scale * scale[r]) * (float)acc into
 * y, the two scales' product first, as the scalar GEMM computes it (with
 * g->add, added to y's value: two roundings, as the scalar GEMM). */
static inline __attribute__((always_inline)) void
npu_avx512_store16(__m512i v, const struct npu_gemm_args *g, uint32_t i, uint32_t c0)
{
    const uint32_t lo = g->r0, hi = g->r1;
    const uint32_t s = c0 < lo ? lo - c0 : 0;
    const uint32_t e = c0 + 16 > hi ? hi - c0 : 16;
    const __mmask16 keep = (__mmask16)(((1u << e) - 1) & ~((1u << s) - 1));
    const __mmask16 out = (__mmask16)((1u << (e - s)) - 1);
    if (g->c) {
        int32_t *dst = g->c + (size_t)i * g->ldc + (c0 + s - lo);
        if (keep == 0xffff) {
            _mm512_storeu_si512(dst, v);
        } else {
            if (s) /* the range starts inside this block: move its lanes down */
                v = _mm512_maskz_compress_epi32(keep, v);
            _mm512_mask_storeu_epi32(dst, out, v);
        }
    } else {
        float *dst = g->y + (size_t)i * g->ldy + (c0 + s - lo);
        __m512 sc = _mm512_mul_ps(_mm512_set1_ps(g->act_scale),
                                  _mm512_maskz_loadu_ps(keep, g->scale + c0));
        __m512 f = _mm512_mul_ps(sc, _mm512_cvtepi32_ps(v));
        if (keep == 0xffff) {
            if (g->add)
                f = _mm512_add_ps(_mm512_loadu_ps(dst), f);
            _mm512_storeu_ps(dst, f);
        } else {
            if (s)
                f = _mm512_maskz_compress_ps(keep, f);
            if (g->add)
                f = _mm512_add_ps(_mm512_maskz_loadu_ps(out, dst), f);
            _mm512_mask_storeu_ps(dst, out, f);
        }
    }
}

#endif
