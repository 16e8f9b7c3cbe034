/* unpack_internal.h: the per-row kernels of each instruction set.
 *
 * A row kernel unpacks one row (output channel) of `cols` weights stored with
 * width b (1..8) in one packed encoding to int8 codes. The scalar kernels
 * (unpack_scalar.c) are the specification; each SIMD file (unpack_avx2.c,
 * unpack_avx512.c, unpack_neon.c, compiled with its own flags) provides a
 * table whose entries are bit-exact with them for every input byte string.
 * The build defines SLUICE_KERNELS_X86 or SLUICE_KERNELS_ARM64 for the files
 * it compiles; whether the running CPU may use them is decided at run time
 * (unpack.c). Kernels read exactly format_packed_row_bytes() bytes at src and
 * write exactly cols bytes at dst; no alignment is required of either. */
#ifndef SLUICE_UNPACK_INTERNAL_H
#define SLUICE_UNPACK_INTERNAL_H

#include "unpack.h"

/* stream != 0: the caller guarantees dst is 64-byte aligned and cols a
 * multiple of 64, and asks for non-temporal (cache-bypassing) stores because
 * the output is too large to stay in cache for its consumer; kernels may
 * ignore it (scalar, NEON) and leave their non-temporal stores unfenced: the
 * caller (unpack_tensor_rows_store) ends the call with one store fence. */
typedef void unpack_row_fn(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                           int stream);
/* Sum of n int8 values (n < 2^24, so the sum fits an int32). */
typedef int32_t unpack_sum_fn(const int8_t *q, uint32_t n);

/* The offset of a b-bit code: q = u - off for the unsigned u the SIMD
 * kernels build (b = 1 puts the bit at bit 1, so u is 0 or 2). */
#define UNPACK_DOT_OFF(b) ((b) == 1 ? 1 : (1 << ((b) - 1)) - 1)

/* What a dot kernel gets besides the row and its activations (the same for
 * every row of one activation row): sums of x for removing the offset of
 * unsigned codes, x's tail group copied into zero padding, and whether the
 * row's bytes may be over-read. */
struct unpack_dot_args {
    int32_t xsum_full;  /* sum_c x[c] over the full groups (c < cols / 512 * 512) */
    int32_t xsum_all;   /* sum_c x[c] over all cols */
    const int8_t *xtail; /* x[cols / 512 * 512 .. cols) followed by zeros, 512 + 64 bytes */
    int overread;       /* 1: at least 64 readable bytes follow the row's bytes */
};

/* sum_c q[c] * x[c] over one adaptive row of width b (1..8), q the codes
 * the row kernel gives, x int8 [cols]: the exact integer, which fits an
 * int32 for cols <= UNPACK_CORR_MAX_COLS (|q| <= 127, |x| <= 128). The codes
 * are unpacked in registers (decode straight from packed weights,
 * unpack_tensor_dot); kernels that multiply the unsigned codes u = q + off
 * (vpdpbusd, pmaddubsw) remove the offset with a's sums. */
typedef int32_t unpack_dot_fn(const uint8_t *src, uint32_t cols, uint32_t b, const int8_t *x,
                              const struct unpack_dot_args *a);

/* Multiplies n int8 values of a row (as the row kernels give them) by their
 * blocks' multipliers: q[j] *= m[j / 32], m one byte per block of 32
 * weights, already clamped to format_packed_mult_max (FORMAT-packed.md,
 * header version 2), so that the products stay in [-127, 127]. */
typedef void unpack_mult_fn(int8_t *q, uint32_t n, const uint8_t *m);

struct unpack_kernels {
    unpack_row_fn *adaptive;
    unpack_row_fn *int4int8;
    unpack_row_fn *bitplane;
    unpack_sum_fn *sum;
    unpack_dot_fn *adaptive_dot;
    unpack_mult_fn *mult;
    /* an adaptive row of width b with block multipliers m, as adaptive then
     * mult (NULL: unpack.c does just that) */
    void (*adaptive_mult)(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                          int stream, const uint8_t *m);
    /* the same with the row's multipliers as stored (2 bits each, m - 1,
     * four per byte from bit 0, starting at mraw's bit 0), clamped to
     * format_packed_mult_max(b) in the kernel (NULL: decoded first) */
    void (*adaptive_mult_raw)(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                              int stream, const uint8_t *mraw);
};
void unpack_mult_scalar(int8_t *q, uint32_t n, const uint8_t *m);
#if SLUICE_KERNELS_X86
void unpack_mult_avx2(int8_t *q, uint32_t n, const uint8_t *m);
void unpack_adaptive_mult_avx2(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                               int stream, const uint8_t *m);
void unpack_adaptive_mult_raw_avx2(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                                   int stream, const uint8_t *mraw);
/* unpack_dot_fn for m = 2, 4, 8 or 16 activation rows x[i * cols] at once,
 * out[i * ldo] = row i's sum with a[i]: a row's bytes read and unpacked
 * once for all m rows (AVX-512 VNNI; unpack.c checks for it). */
void unpack_adaptive_dot_m_avx512(const uint8_t *src, uint32_t cols, uint32_t b, const int8_t *x,
                                  uint32_t m, const struct unpack_dot_args *a, int32_t *out,
                                  size_t ldo);
#endif
/* unpack_tensor_dot_tiles' stage (unpack.h): this header, then the m rows'
 * activations as [round_up(cols, 64) / 4][m][4] (groups of 4 inputs of
 * every row in turn, zeros past cols) from UNPACK_TILES_STAGE_HDR bytes. */
struct unpack_tiles_stage {
    uint32_t m, cols;
    int32_t xsum[UNPACK_TILES_ROWS_MAX]; /* sum_c x[i][c] of each row */
};
#define UNPACK_TILES_STAGE_HDR 128
#if SLUICE_KERNELS_AMX
/* unpack_tensor_dot_tiles on an adaptive tensor without block multipliers
 * (checked by unpack.c, as are AMX and the tile permission): rows [r0, r1)
 * into acc[i * ldacc + (r - r0)], its passes upwards or (down) from r1
 * downwards. unpack_amx.c. */
void unpack_adaptive_dot_tiles_amx(const struct unpack_tensor *u, uint32_t r0, uint32_t r1,
                                   const struct unpack_tiles_stage *st, int32_t *acc, size_t ldacc,
                                   int down);
#endif
/* (The AVX-512 table's adaptive_dot needs VNNI besides F+BW; without it
 * unpack.c uses the AVX2 one at that level.) */

extern const struct unpack_kernels unpack_kernels_scalar;
extern const struct unpack_kernels unpack_kernels_avx2;
extern const struct unpack_kernels unpack_kernels_avx512;
extern const struct unpack_kernels unpack_kernels_neon;

/* Software prefetch distances of the x86 SIMD kernels, in weights ahead of
 * the ones being unpacked (each input stream prefetches the bytes that hold
 * the weights this far on, into L1). Packed bytes fresh from flash are in
 * memory, not cache; the hardware prefetchers follow adaptive and int4int8
 * rows (one stream) late and the bitplane baseline's 2-3 plane streams per
 * row hardly at all. Tuned with `sluice bench unpack` (hot: input flushed),
 * each encoding its own best, so the baselines are served as well as
 * adaptive (docs/BENCHMARKS.md). Prefetches past the tensor's end are
 * harmless: they never fault (their addresses are computed as integers, so
 * no pointer runs past its object). */
#ifndef UNPACK_PREFETCH_ADAPTIVE
#define UNPACK_PREFETCH_ADAPTIVE 8192
#endif
#ifndef UNPACK_PREFETCH_INT4INT8
#define UNPACK_PREFETCH_INT4INT8 8192
#endif
#ifndef UNPACK_PREFETCH_BITPLANE
#define UNPACK_PREFETCH_BITPLANE 16384
#endif

/* The AVX-512 dot kernels' second, farther prefetch (weights ahead, into
 * L2; the one-row kernel and the multi-row one, adaptive_dot_m_b): decode streams rows back to
 * back, and the L1 prefetch above alone left it waiting on memory (one
 * thread, 5 bits, rows from memory: 9-16% less kernel time with 16-32 KiB
 * ahead in a microbenchmark; docs/BENCHMARKS.md, w18). */
#ifndef UNPACK_PREFETCH_ADAPTIVE_FAR
#define UNPACK_PREFETCH_ADAPTIVE_FAR 32768
#endif
/* Not on every CPU: on AMD Zen 5 (its L2 stream prefetcher follows the
 * rows by itself) the far prefetch's instructions cost more than it saves:
 * one thread streaming a 5-bit tensor from memory with it was 5-21% slower
 * per CPU second (docs/BENCHMARKS.md, zd22), and packed 8-row verification
 * 7% slower with it in the multi-row kernel (review of zv18). unpack.c
 * decides once (unpack_dot_far_prefetch, unpack.h). */

/* Prefetches the b lines of the adaptive group UNPACK_PREFETCH_ADAPTIVE
 * weights after the one at src (a b-bit group is b 64-byte blocks). The x86
 * kernels call it once per full group. */
static inline __attribute__((always_inline)) void unpack_adaptive_prefetch(const uint8_t *src,
                                                                           uint32_t b)
{
#pragma GCC unroll 8
    for (uint32_t o = 0; o < b * 64; o += 64)
        __builtin_prefetch((const void *)((uintptr_t)src + UNPACK_PREFETCH_ADAPTIVE / 8 * b + o),
                           0, 3);
}

/* The same UNPACK_PREFETCH_ADAPTIVE_FAR weights ahead, into L2 (the
 * AVX-512 one-row kernel's). */
static inline __attribute__((always_inline)) void unpack_adaptive_prefetch_far(const uint8_t *src,
                                                                               uint32_t b)
{
#pragma GCC unroll 8
    for (uint32_t o = 0; o < b * 64; o += 64)
        __builtin_prefetch(
            (const void *)((uintptr_t)src + UNPACK_PREFETCH_ADAPTIVE_FAR / 8 * b + o), 0, 2);
}

/* Prefetches, for a bitplane row whose planes (widths pw, 0-terminated)
 * start at src and each cover `padded` weights, the lines of every plane
 * that hold weights [j + UNPACK_PREFETCH_BITPLANE, + 512): w lines of a
 * w-bit plane. The x86 kernels call it once per 512 weights, with pw their
 * own copy of unpack_planes[b] so that it unrolls to constants. */
static inline __attribute__((always_inline)) void
unpack_bitplane_prefetch(const uint8_t *src, size_t padded, uint32_t j, const uint8_t *pw)
{
#pragma GCC unroll 4
    for (int p = 0; p < 3; p++) {
        const int w = pw[p];
        if (!w)
            break;
#pragma GCC unroll 4
        for (int o = 0; o < w * 64; o += 64)
            __builtin_prefetch(
                (const void *)((uintptr_t)src + (size_t)(j + UNPACK_PREFETCH_BITPLANE) * w / 8 + o),
                0, 3);
        src += padded * w / 8;
    }
}

/* Weightlet widths of a b-bit code, most significant first, 0-terminated
 * (EdgeFlow 4.2: 8 = 4+4, 7 = 4+2+1, ..., 1 = 1). */
extern const uint8_t unpack_planes[9][4];

/* Scalar pieces the SIMD kernels reuse for row ends shorter than a vector:
 * the bitplane weights [j0, cols) of a row; the int4int8 weights [j0, cols). */
void unpack_bitplane_tail_scalar(const uint8_t *src, uint32_t cols, uint32_t b, uint32_t j0,
                                 int8_t *dst);
void unpack_int4int8_tail_scalar(const uint8_t *src, uint32_t cols, uint32_t b, uint32_t j0,
                                 int8_t *dst);

/* The int8 value of an unsigned code u of width b (adaptive and bitplane):
 * b = 1: 2u - 1; else min(u, 2^b - 2) - (2^(b-1) - 1). The clamp maps the
 * one code the packer never writes (2^b - 1) to the top of the grid, so any
 * byte string decodes into [-(2^(b-1) - 1), 2^(b-1) - 1], never to -128. */
static inline int8_t unpack_code_value(uint32_t u, uint32_t b)
{
    if (b == 1)
        return (int8_t)(2 * (int)u - 1);
    uint32_t top = (1u << b) - 2;
    return (int8_t)((int)(u < top ? u : top) - ((1 << (b - 1)) - 1));
}

/* sum_j q[j] * x[j] of n < 2^17 int8 pairs (a row's tail group, unpacked
 * first by the row kernel). */
static inline int32_t unpack_dot_i8(const int8_t *q, const int8_t *x, uint32_t n)
{
    int32_t s = 0;
    for (uint32_t j = 0; j < n; j++)
        s += (int32_t)q[j] * x[j];
    return s;
}

#endif
