/* npu_gemm_internal.h: the prepared-weight layout and the kernel entry
 * points, one set per instruction-set file (STYLE.md 12). The build defines
 * SLUICE_KERNELS_X86 when it compiles the x86 files; the CPU's features decide
 * at run time which of them may run.
 *
 * A GEMM call is two steps:
 *   1. prep: the activations A [m][k] (int8, row stride lda_in) are copied to
 *      a staging buffer laid out for the kernel and its register tiling
 *      (npu_gemm_args.tile): k padded with zeros to a multiple of 4, rows
 *      grouped by the tile's row count R as [m/R][k4/4][R][4], so the four
 *      bytes the tile broadcasts for its R rows are adjacent; for the
 *      vpdpbusd kernels every byte is offset by +128 (XOR 0x80) so it reads
 *      as an unsigned byte; the AMX kernel stages signed bytes as its tiles,
 *      16 rows x 64 bytes each (1 KiB, contiguous), k and m padded with
 *      zeros to multiples of 64 and 16 (npu_gemm_amx.c).
 *      npu_gemm_prep_bytes says how large it is.
 *   2. gemm: for output channels r in [r0, r1) and rows i < m, the kernel
 *      computes acc[i][r] = sum_j A[i][j] * B[r][j] (int32, exact) and writes
 *      either c[i * ldc + (r - r0)] = acc, or (c == NULL) the dequantized
 *      y[i * ldy + (r - r0)] = (act_scale * scale[r]) * (float)acc: first the
 *      float product of the two scales, then times the accumulator converted
 *      to float (round to nearest), so every kernel gives identical floats;
 *      with npu_gemm_args.add, y[i * ldy + (r - r0)] += that float (the
 *      product rounded, then the sum rounded: the bits of storing it and
 *      adding it to y after). */
#ifndef SLUICE_NPU_GEMM_INTERNAL_H
#define SLUICE_NPU_GEMM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "npu.h"

/* Prepared weights B [n][k]: only the packed form is kept (the scalar kernel
 * reads it through npu_gemm_b_at). */
struct npu_gemm_b {
    uint32_t n, k;
    uint32_t k4, n16;      /* k rounded up to 4, n to 16 */
    int8_t *packed;        /* [n16/16][k4/4][16][4], zero beyond n and k */
    int32_t *rowsum;       /* [n16] sum of each row's codes (the +128 correction / 128) */
    /* [n16 / 16] 1 where a code of the 16-channel block is beyond +-64 (set
     * by every packer, as npu_pack_wide_scalar defines it): blocks within it take the
     * AVX2 kernel's shorter step, unsigned activations times codes whose
     * pair sums cannot saturate (2 x 255 x 64 < 32768), then the rowsum
     * correction, as the VNNI kernels do */
    uint8_t *wide;
    /* [n16 / 16] 1 where every code of the block is within +-NPU_GEMM_TINY
     * (set with wide, by every packer): the few-rows AVX2 kernel adds four maddubs in int16 */
    uint8_t *tiny;
    size_t cap_bytes;      /* packed's allocation, and n16's largest value that */
    uint32_t cap_n16;      /* rowsum, wide and tiny hold (npu_gemm_b_reshape) */
};

/* The few-rows kernel (npu_gemm_rows_avx2.c): 1..NPU_GEMM_ROWS_MAX rows, on
 * blocks whose codes are within +-NPU_GEMM_TINY (4 x 2 x 255 x 16 < 2^15). */
#define NPU_GEMM_ROWS_MAX 16
#define NPU_GEMM_TINY 16

/* Two-step preparation (npu_gemm_b_create is both): allocate, then fill
 * rows [r0, r1) from src [r1 - r0][k]; r0 a multiple of 16 and r1 a multiple
 * of 16 or n, so concurrent fills of disjoint ranges never share a block.
 * -EINVAL for a bad range, -ERANGE when a code is -128 (the range is written
 * anyway; the weights must not be used). */
int npu_gemm_b_alloc(uint32_t n, uint32_t k, struct npu_gemm_b **out);
int npu_gemm_b_set_rows(struct npu_gemm_b *b, const int8_t *src, uint32_t r0, uint32_t r1);
/* b's memory for n x k (contents undefined until set_rows fills every row):
 * 0, -EINVAL (a zero or too large dimension), -ENOSPC (the packed codes do
 * not fit) or -ENOMEM (the per-row arrays could not grow); b unchanged on failure. */
int npu_gemm_b_reshape(struct npu_gemm_b *b, uint32_t n, uint32_t k);

/* B[r][j] read from the packed layout: block r / 16, group j / 4, 64 bytes
 * per (block, group): row r % 16 at byte 4 * (r % 16), then j % 4. */
static inline int8_t npu_gemm_b_at(const struct npu_gemm_b *b, uint32_t r, uint32_t j)
{
    return b->packed[((size_t)(r / 16) * (b->k4 / 4) + j / 4) * 64 + (r % 16) * 4 + j % 4];
}

/* Bytes one 16-channel block of the packed weights takes. */
static inline size_t npu_gemm_b_block_bytes(const struct npu_gemm_b *b)
{
    return (size_t)b->k4 / 4 * 64;
}

struct npu_gemm_args {
    const struct npu_gemm_b *b;
    const uint8_t *a;      /* prepared activations (prep with the same tile) */
    uint32_t m, r0, r1;    /* rows, output channels [r0, r1) */
    int32_t *c;            /* int32 output, or NULL for the float one */
    size_t ldc;
    float *y;              /* float output when c is NULL */
    size_t ldy;
    /* 1: the float output is added to what y holds (y = y + s * acc, two
     * roundings: a residual add fused into the output write); c NULL */
    int add;
    float act_scale;       /* per-tensor activation scale */
    const float *scale;    /* per-channel weight scales [n] */
    int tile;              /* register tiling (index into the kernel's table; 0 = default) */
    /* NULL, or (the AMX kernel only, npu_gemm_direct) the int8 activations
     * themselves, [m][k] with row stride lda: the kernel reads every whole
     * row tile of 16 rows straight from them (all m rows when m < 16), and a
     * holds only the prep of the rest (rows m / 16 * 16 .. m - 1, when m > 16
     * is not a multiple of 16). No copy of the activations for a call. */
    const int8_t *xq;
    size_t lda;
};

typedef void npu_prep_fn(const int8_t *a, size_t lda_in, uint32_t m, uint32_t k, uint32_t k4,
                         int tile, uint8_t *out);
typedef void npu_gemm_fn(const struct npu_gemm_args *g);
/* Packs rows [r0, r1) of B from src [r1 - r0][k] (r0 % 16 == 0; r1 % 16 == 0
 * or r1 == n, then the padding rows up to n16 are zeroed too): packed codes,
 * rowsum, and wide of every block of the range. Returns 1 when a code is
 * -128, else 0. */
typedef int npu_pack_fn(struct npu_gemm_b *b, const int8_t *src, uint32_t r0, uint32_t r1);
/* The definition of wide and tiny (npu_gemm_scalar.c): for each 16-row
 * block of [r0, r1) (whole blocks, as npu_pack_fn's ranges), wide 1 when one
 * of its codes is beyond +-64, else 0; tiny 1 when every code is within
 * +-NPU_GEMM_TINY, else 0. */
void npu_pack_wide_scalar(struct npu_gemm_b *b, const int8_t *src, uint32_t r0, uint32_t r1);

/* What a kernel variant provides. tiles: how many register tilings it has
 * (npu_gemm_args.tile < tiles); tile_names: "6x64" = rows x channels. */
/* Activation quantization (npu.h): xq[i] = clamp(rint(x[i] * inv), -127,
 * 127), NaN to 0; and max |x| over the finite x (0 if none). */
typedef void npu_quant_fn(const float *x, size_t n, float inv, int8_t *xq);
typedef float npu_absmax_fn(const float *x, size_t n);

struct npu_kernel_ops {
    npu_prep_fn *prep;
    npu_gemm_fn *gemm;
    npu_pack_fn *pack;     /* NULL: the scalar packer */
    npu_quant_fn *quant;   /* NULL: the scalar one */
    npu_absmax_fn *absmax; /* NULL: the scalar one */
    int tiles;
    const char *const *tile_names;
    /* Graphs of more rows than this take tiling 0 without timing the others
     * (npu_graph.c; UINT32_MAX: every graph with several tilings is timed). */
    uint32_t probe_max_m;
};

extern const struct npu_kernel_ops npu_ops_scalar;
extern const struct npu_kernel_ops npu_ops_avx2;
extern const struct npu_kernel_ops npu_ops_avx512vnni;
extern const struct npu_kernel_ops npu_ops_avxvnni;
extern const struct npu_kernel_ops npu_ops_amx;

/* The AVX-512 packer, quantizer and max-abs (npu_gemm_avx512vnni.c), which
 * the AMX kernel shares. */
npu_pack_fn npu_pack_avx512vnni;
npu_quant_fn npu_quant_avx512;
npu_absmax_fn npu_absmax_avx512;

/* The ops of a kernel (scalar when the kernel is not compiled in). */
const struct npu_kernel_ops *npu_kernel_ops(enum npu_kernel k);
/* 1 when ops' gemm reads npu_gemm_args.xq for k input channels: the AMX
 * kernel, k a multiple of 64 (whole tiles: no zero padding, no read past a
 * row). Then a caller preps only the rows past the last whole row tile. */
int npu_gemm_direct(const struct npu_kernel_ops *ops, uint32_t k);

/* Staging bytes for m rows (npu_gemm_args.a) under any tiling (row counts
 * R <= 16 round m up), with room for over-reads. */
static inline size_t npu_gemm_prep_bytes(uint32_t k4, uint32_t m)
{
    return ((size_t)m + 15) * (((size_t)k4 + 63) & ~(size_t)63) + 64; /* AMX: k to 64 */
}

/* Offset of row i, k-group gq (4 bytes) in a staging buffer with R-row tiles. */
static inline size_t npu_gemm_a_off(uint32_t i, uint32_t gq, uint32_t k4, uint32_t R)
{
    return (size_t)(i / R) * R * k4 + (size_t)gq * R * 4 + (size_t)(i % R) * 4;
}

/* One row's staging from byte j0 (a multiple of 4) on, a 4-byte group at a
 * time: bytes flipped to unsigned (^ 0x80), group g at dst + g * step, the
 * last group's bytes past k zero (the vpdpbusd kernels' scalar path). */
static inline void npu_prep_row_groups(const uint8_t *src, uint8_t *dst, uint32_t j0, uint32_t k,
                                       uint32_t k4, size_t step)
{
    const uint32_t kf = k & ~3u;
    for (uint32_t j = j0; j < kf; j += 4) {
        uint32_t v;
        memcpy(&v, src + j, 4);
        v ^= 0x80808080u;
        memcpy(dst + (size_t)(j / 4) * step, &v, 4);
    }
    if (kf < k4) {
        uint8_t t[4] = {0, 0, 0, 0};
        for (uint32_t q = 0; kf + q < k; q++)
            t[q] = src[kf + q] ^ 0x80;
        memcpy(dst + (size_t)(kf / 4) * step, t, 4);
    }
}

/* The vpdpbusd kernels' staging of A for R-row tiles, byte by byte (the
 * reference for their prep; npu_gemm_scalar.c): rows [0, m) only. */
void npu_prep_vnni_ref(const int8_t *a, size_t lda_in, uint32_t m, uint32_t k, uint32_t k4,
                       uint32_t R, uint8_t *out);

/* Output channels of blocks [bl, bl + nb) (nb 1 or 2; the rest of the
 * contract as npu_gemm_args, m <= NPU_GEMM_ROWS_MAX, every code of the blocks
 * within +-NPU_GEMM_TINY, a staged by the AVX2 kernel's prep): the AVX2
 * few-rows kernel, and its scalar reference, which computes the kernel's own
 * steps (int16 pair sums with maddubs' saturation, four groups added in
 * int16 with wrap-around, then int32), so the tests can tell that those steps
 * never saturate or wrap. */
void npu_gemm_rows_avx2(const struct npu_gemm_args *g, uint32_t bl, int nb);
void npu_gemm_rows_ref(const struct npu_gemm_args *g, uint32_t bl, int nb);
/* The AVX2 GEMM without the few-rows kernel (its 3x32 tiles everywhere): the
 * tests compare the two. */
void npu_gemm_avx2_tiles(const struct npu_gemm_args *g);

/* The AMX kernel's memory blocking (npu_gemm_amx.c), for the tests: the
 * staged activations of one row block at most `budget` bytes (whole row
 * pairs; at least one pair; one block of all rows when that gives fewer than
 * `min_tiles` row tiles), and outputs of more than 16 rows and at least `nt`
 * bytes streamed with non-temporal stores; 0 restores the default of each.
 * Not for use while another thread runs the kernel. */
void npu_amx_blocking(size_t budget, size_t nt, uint32_t min_tiles);

/* Register-only peak loops: iters x (16 x 64 | 12 x 32) multiply-adds. */
uint64_t npu_peak_avx512vnni(uint64_t iters);
uint64_t npu_peak_amx(uint64_t iters); /* iters x 4 x 16 x 16 x 64 */
uint64_t npu_peak_avx2(uint64_t iters);
uint64_t npu_peak_avx2_tiny(uint64_t iters); /* iters x 16 x 32 */

#endif
