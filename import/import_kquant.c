/* import_kquant.c: GGUF block-quantized tensors to float, exactly as the
 * format defines them (ggml's block layouts; the arithmetic is float32, one
 * rounding per product and per difference, in the order written below).
 *
 *   Q8_0  34 bytes per 32 weights: f16 d, int8 q[32];          w = d * q
 *   Q4_K 144 bytes per 256: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min)
 *        pairs for 8 sub-blocks of 32, 128 bytes of 4-bit codes;
 *        w = (d * sc) * q - (dmin * m)
 *   Q5_K 176 bytes per 256: as Q4_K plus 32 bytes holding each code's 5th bit
 *   Q6_K 210 bytes per 256: 128 bytes low 4 bits, 64 bytes high 2 bits,
 *        16 int8 scales (sub-blocks of 16), f16 d; w = (d * sc) * (q - 32)
 *
 * Q4_K/Q5_K code layout: each 64 weights of a block take 32 bytes of qs,
 * the first 32 weights in the low nibbles, the next 32 in the high nibbles;
 * Q5_K's bit 4 of weight 64j + l is bit 2j of qh[l], of weight 64j + 32 + l
 * bit 2j + 1. Q6_K: each 128 weights take 64 bytes of ql and 32 of qh; for
 * l < 32 weights l, l + 32, l + 64, l + 96 take the low nibble of ql[l], of
 * ql[l + 32], the high nibble of ql[l], of ql[l + 32], and bits 0-1, 2-3,
 * 4-5, 6-7 of qh[l] as their top two bits. */
#include <string.h>

#include "import_internal.h"

/* Scale and min of sub-block j (0..7) from the 12 packed bytes. */
static void scale_min(const uint8_t *s, int j, unsigned *sc, unsigned *m)
{
    if (j < 4) {
        *sc = s[j] & 63u;
        *m = s[j + 4] & 63u;
    } else {
        *sc = (s[j + 4] & 0xFu) | ((unsigned)(s[j - 4] >> 6) << 4);
        *m = (unsigned)(s[j + 4] >> 4) | ((unsigned)(s[j] >> 6) << 4);
    }
}

static void q4_k(const uint8_t *b, float *y)
{
    float d = sl_f16_to_f32(sl_load_le16(b)), dmin = sl_f16_to_f32(sl_load_le16(b + 2));
    const uint8_t *sc = b + 4, *q = b + 16;
    for (int j = 0; j < 4; j++, q += 32, y += 64) {
        unsigned s0, m0, s1, m1;
        scale_min(sc, 2 * j, &s0, &m0);
        scale_min(sc, 2 * j + 1, &s1, &m1);
        float d0 = d * (float)s0, n0 = dmin * (float)m0;
        float d1 = d * (float)s1, n1 = dmin * (float)m1;
        for (int l = 0; l < 32; l++) {
            float p = d0 * (float)(q[l] & 0xF);
            y[l] = p - n0;
        }
        for (int l = 0; l < 32; l++) {
            float p = d1 * (float)(q[l] >> 4);
            y[32 + l] = p - n1;
        }
    }
}

static void q5_k(const uint8_t *b, float *y)
{
    float d = sl_f16_to_f32(sl_load_le16(b)), dmin = sl_f16_to_f32(sl_load_le16(b + 2));
    const uint8_t *sc = b + 4, *qh = b + 16, *q = b + 48;
    for (int j = 0; j < 4; j++, q += 32, y += 64) {
        unsigned s0, m0, s1, m1;
        scale_min(sc, 2 * j, &s0, &m0);
        scale_min(sc, 2 * j + 1, &s1, &m1);
        float d0 = d * (float)s0, n0 = dmin * (float)m0;
        float d1 = d * (float)s1, n1 = dmin * (float)m1;
        for (int l = 0; l < 32; l++) {
            unsigned v = (q[l] & 0xFu) | (((qh[l] >> (2 * j)) & 1u) << 4);
            float p = d0 * (float)v;
            y[l] = p - n0;
        }
        for (int l = 0; l < 32; l++) {
            unsigned v = (unsigned)(q[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1u) << 4);
            float p = d1 * (float)v;
            y[32 + l] = p - n1;
        }
    }
}

static void q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = sl_f16_to_f32(sl_load_le16(b + 208));
    for (int n = 0; n < 2; n++, ql += 64, qh += 32, sc += 8, y += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = (d * (float)sc[is]) * (float)q1;
            y[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
            y[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
            y[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
        }
    }
}

int qi_type_is_block(enum qi_type t)
{
    return t == QI_Q8_0 || t == QI_Q4_K || t == QI_Q5_K || t == QI_Q6_K;
}

uint64_t qi_block_weights(enum qi_type t)
{
    return t == QI_Q8_0 ? 32 : 256;
}

uint64_t qi_block_bytes(enum qi_type t)
{
    switch (t) {
    case QI_Q8_0:
        return 34;
    case QI_Q4_K:
        return 144;
    case QI_Q5_K:
        return 176;
    case QI_Q6_K:
        return 210;
    default:
        return 0;
    }
}

void qi_dequant(enum qi_type t, const uint8_t *src, float *dst, uint64_t n)
{
    uint64_t bw = qi_block_weights(t), bb = qi_block_bytes(t);
    for (uint64_t k = 0; k < n / bw; k++, src += bb, dst += bw) {
        switch (t) {
        case QI_Q8_0: {
            float d = sl_f16_to_f32(sl_load_le16(src));
            for (int j = 0; j < 32; j++)
                dst[j] = d * (float)(int8_t)src[2 + j];
            break;
        }
        case QI_Q4_K:
            q4_k(src, dst);
            break;
        case QI_Q5_K:
            q5_k(src, dst);
            break;
        case QI_Q6_K:
            q6_k(src, dst);
            break;
        default:
            memset(dst, 0, bw * sizeof *dst);
            break;
        }
    }
}
