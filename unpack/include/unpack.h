/*
 * unpack.h: quantized weight tensors to int8 codes and per-row scales
 * (EdgeFlow 4.2, SPEC.md section 2).
 *
 *   int8_t *q = malloc(rows * cols);
 *   float *scale = malloc(rows * sizeof(float));
 *   int32_t *corr = malloc(rows * sizeof(int32_t));   // optional
 *   if (unpack_tensor_int8_corr(info, bytes, q, scale, corr, &err) < 0)
 *       fprintf(stderr, "sluice: %s: %s\n", path, err.msg);
 *   // weight[r][c] = scale[r] * q[r * cols + c]
 *
 * Encodings: q8 (FORMAT_ENC_Q8_CHANNEL, a copy), and the packed adaptive,
 * int4int8 and bitplane layouts of docs/FORMAT-packed.md. The scalar
 * unpacker of each encoding is its specification; the SIMD variants (AVX2,
 * AVX-512, NEON) are bit-exact with it for every input and are chosen at run
 * time from sl_cpu_features() (the SLUICE_SIMD environment variable forces a
 * lower level). Every tensor is validated before it is read: corrupt bytes
 * give -EINVAL and a sentence, never a crash. Unpacked codes always lie in
 * [-127, 127] (never -128): for adaptive and bitplane on the row's symmetric
 * b-bit grid whatever the code bytes, for int4int8 on the 4- or 8-bit grid.
 *
 * Row-level use (tests, benchmarks, the pipeline's chunked unpacking):
 *   struct unpack_tensor u;
 *   unpack_tensor_init(&u, FORMAT_ENC_ADAPTIVE, bytes, len, rows, cols, &err);
 *   unpack_tensor_rows(&u, unpack_kernel_best(), r0, r0 + 64, q, NULL);
 *   unpack_tensor_fini(&u);
 *
 * Thread safety: no shared mutable state; any thread may call anything, and
 * unpack_tensor_rows may run concurrently on disjoint row ranges of one view.
 */
#ifndef SLUICE_UNPACK_H
#define SLUICE_UNPACK_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "format.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows longer than this cannot have a correction: 128 * 127 * cols must fit
 * an int32. */
#define UNPACK_CORR_MAX_COLS (1u << 17)

/* Unpacks a whole quantized tensor (q8, adaptive, int4int8 or bitplane):
 * q_out [rows][cols] int8 codes, scale_out [rows] float dequantization
 * scales (weight = scale * code), with the fastest kernel available. `data`
 * is the tensor's t->length bytes. Returns 0, or -EINVAL (err names the
 * tensor and the problem) for a float encoding, a tensor that is not 2-D,
 * or malformed bytes; nothing is written to the outputs on error. */
int unpack_tensor_int8(const struct format_tensor_info *t, const void *data, int8_t *q_out,
                       float *scale_out, struct sl_err *err);

/* The same, and when corr_out is not NULL also corr_out [rows], the
 * per-channel correction the int8 GEMM needs with vpdpbusd (unsigned
 * activations a + 128 times signed weights): corr[r] = 128 * sum_c q[r][c],
 * so that sum_c (a_c + 128) q[r][c] - corr[r] = sum_c a_c q[r][c].
 * -EOVERFLOW when corr_out is given and cols > UNPACK_CORR_MAX_COLS. */
int unpack_tensor_int8_corr(const struct format_tensor_info *t, const void *data,
                            int8_t *q_out, float *scale_out, int32_t *corr_out,
                            struct sl_err *err);

/* ---- kernels ------------------------------------------------------------------ */

enum unpack_kernel {
    UNPACK_KERNEL_SCALAR = 0, /* the specification; always available */
    UNPACK_KERNEL_AVX2,       /* x86-64 with AVX2 */
    UNPACK_KERNEL_AVX512,     /* x86-64 with AVX-512 F+BW (+VL, DQ) */
    UNPACK_KERNEL_NEON,       /* aarch64 */
    UNPACK_KERNEL_COUNT
};

/* "scalar", "avx2", "avx512", "neon" ("unknown" otherwise). */
const char *unpack_kernel_name(enum unpack_kernel k);
/* 1 if the kernel is compiled into this build and allowed by the CPU, the
 * OS and SLUICE_SIMD; else 0. */
int unpack_kernel_available(enum unpack_kernel k);
/* The available kernels, slowest (scalar) first, in out[]; returns how many. */
int unpack_kernels_available(enum unpack_kernel out[UNPACK_KERNEL_COUNT]);
/* The fastest available kernel (what unpack_tensor_int8 uses). */
enum unpack_kernel unpack_kernel_best(void);

/* ---- row-level access to a packed tensor --------------------------------------- */

/* A validated view of a packed tensor (adaptive, int4int8 or bitplane),
 * caller-owned (init/fini); a parameter block, not to be modified. The
 * tensor's bytes must stay valid and unchanged while the view is used. */
struct unpack_tensor {
    struct format_packed_layout layout; /* views into the bytes (format.h) */
    uint64_t *row_off;                  /* byte offset of each row's codes in layout.data */
};

/* Validates len bytes at data as a rows x cols tensor of `encoding` and
 * builds the row index. -EINVAL (malformed; err says why) or -ENOMEM; on
 * error *u needs no fini. */
int unpack_tensor_init(struct unpack_tensor *u, uint32_t encoding, const void *data,
                       uint64_t len, uint64_t rows, uint64_t cols, struct sl_err *err);
/* Frees the row index; accepts a zeroed or already finished view. */
void unpack_tensor_fini(struct unpack_tensor *u);

/* Width (1..8) and dequantization scale of a row (row < rows). */
uint32_t unpack_tensor_width(const struct unpack_tensor *u, uint32_t row);
float unpack_tensor_scale(const struct unpack_tensor *u, uint32_t row);

/* Unpacks rows [r0, r1) into q[(r - r0) * cols + c] with kernel k, and when
 * corr is not NULL writes corr[r - r0] = 128 * sum_c q[r][c]. Returns 0;
 * -EINVAL if k is not available or the range is not within the tensor;
 * -EOVERFLOW if corr is given and cols > UNPACK_CORR_MAX_COLS; -ENOMEM (a
 * tensor with block multipliers: a row's worth of them). One row
 * (r1 = r0 + 1) unpacks one output channel. Stores as UNPACK_STORE_AUTO. */
int unpack_tensor_rows(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                       uint32_t r1, int8_t *q, int32_t *corr);

/* How the int8 output is written. Non-temporal (streaming) stores bypass the
 * caches: about twice the speed when the output goes to memory anyway, but
 * the consumer then reads it from memory. They need q 64-byte aligned and
 * cols a multiple of 64, and only the AVX2 and AVX-512 kernels use them;
 * otherwise (and when a correction is asked for, which reads the rows back)
 * the stores are ordinary. */
enum unpack_store {
    UNPACK_STORE_AUTO = 0, /* streaming when one call writes >= UNPACK_STREAM_MIN_BYTES */
    UNPACK_STORE_CACHED,   /* always ordinary stores */
    UNPACK_STORE_STREAM,   /* streaming whenever possible */
};

/* Outputs at least this large are not expected to stay in cache until they
 * are used (a core's share of the last-level cache on the machines Sluice
 * targets is smaller); unpack_tensor_int8 of a large tensor is such a case. */
#define UNPACK_STREAM_MIN_BYTES (8u << 20)

/* unpack_tensor_rows with an explicit store policy (tests, benchmarks). */
int unpack_tensor_rows_store(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                             uint32_t r1, int8_t *q, int32_t *corr, enum unpack_store store);

/* Dot products straight from the packed rows, for decoding from packed
 * weights: acc[i * ldacc + (r - r0)] = sum_c q[r][c] * x[i * cols + c] for
 * activation rows i < m and output channels r in [r0, r1), with q[r] the
 * codes unpack_tensor_rows gives, exact in int32 (the same integers an int8
 * GEMM of the unpacked rows computes). Adaptive rows are unpacked in
 * registers (AVX-512 VNNI vpdpbusd, AVX2 pmaddubsw, NEON widening
 * multiplies; every kernel bit-exact with the scalar one): a row's packed
 * bytes are read once for all m rows and never stored as int8. int4int8 and
 * bitplane rows go through a row buffer. x is int8 [m][cols] (any values).
 * ldacc is ignored when m = 1. Returns 0; -EINVAL if k is not available, m
 * is 0, the range is not within the tensor or ldacc < r1 - r0; -EOVERFLOW
 * if cols > UNPACK_CORR_MAX_COLS; -ENOMEM (baselines' row buffer).
 * Concurrent calls on disjoint ranges of one view are fine. */
int unpack_tensor_dot(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                      uint32_t r1, const int8_t *x, uint32_t m, int32_t *acc, size_t ldacc);

/* 1 where kernel k's unpack_tensor_dot of u with m > 1 reads and unpacks
 * each row once for up to 16 activation rows at a time (AVX-512 with VNNI,
 * and u adaptive without block multipliers: the codes multiplied with every
 * row while in registers), so that m rows cost about one row's unpacking;
 * 0 where it unpacks the row again for every activation row (the results
 * are the same integers). */
int unpack_dot_multirow(const struct unpack_tensor *u, enum unpack_kernel k);

/* A few activation rows on the AMX tile unit (a draft tree's verification):
 * passes of 32 output channels (two blocks of 16), each 512-weight group
 * unpacked in registers into a piece in L1 and multiplied there with all m
 * rows (TDPBUSD), the
 * activations staged once per call. The same integers as unpack_tensor_dot.
 *   void *st = sl_alloc_aligned(unpack_dot_tiles_stage_bytes(cols, m), 64);
 *   unpack_dot_tiles_stage(cols, x, m, st);          // x int8 [m][cols]
 *   unpack_tensor_dot_tiles(u, r0, r1, st, acc, ldacc);
 * unpack_dot_tiles_takes: 1 where it serves u with m rows (1..16): an
 * adaptive tensor without block multipliers, cols <= UNPACK_CORR_MAX_COLS,
 * a build with the AMX kernel, and a CPU and OS with AMX (sl_cpu_features,
 * which asks for the tile permission); else 0. The stage must be 64-byte
 * aligned; stage returns -EINVAL for m outside 1..16 or cols = 0. dot_tiles
 * returns 0; -EINVAL if it does not take u with the stage's m, the stage's
 * cols differ from u's, the range is not within the tensor, or m > 1 and
 * ldacc < r1 - r0. Concurrent calls on disjoint ranges may share a stage.
 * _down: the same, its passes taken from r1 downwards, each prefetching the
 * rows below it (for a caller that walks a tensor's rows downwards). */
#define UNPACK_TILES_ROWS_MAX 16
int unpack_dot_tiles_takes(const struct unpack_tensor *u, uint32_t m);
size_t unpack_dot_tiles_stage_bytes(uint32_t cols, uint32_t m);
int unpack_dot_tiles_stage(uint32_t cols, const int8_t *x, uint32_t m, void *stage);
int unpack_tensor_dot_tiles(const struct unpack_tensor *u, uint32_t r0, uint32_t r1,
                            const void *stage, int32_t *acc, size_t ldacc);
int unpack_tensor_dot_tiles_down(const struct unpack_tensor *u, uint32_t r0, uint32_t r1,
                                 const void *stage, int32_t *acc, size_t ldacc);

/* unpack_tensor_dot's work on one activation row x [cols] that does not
 * depend on the output channels (x's sums, its tail group), done once by
 * unpack_dot_x_init for a product that a caller splits into many ranges (a
 * decode step's chunks); unpack_tensor_dot_x is then unpack_tensor_dot with
 * m = 1 on rows [r0, r1) (acc[r - r0]), the same results and errors. px
 * must come from x and this tensor's cols; it is only read, so threads may
 * share it. */
struct unpack_dot_x {
    int32_t xsum_full, xsum_all;
    int8_t xtail[FORMAT_PACKED_GROUP + 64];
};
void unpack_dot_x_init(const struct unpack_tensor *u, const int8_t *x, struct unpack_dot_x *px);
/* unpack_tensor_dot for m activation rows x [m][cols] with each row's
 * px[i] made by unpack_dot_x_init: the same results and errors, without
 * summing the rows again on every call (a product split into chunks). */
int unpack_tensor_dot_xm(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                         uint32_t r1, const int8_t *x, uint32_t m, const struct unpack_dot_x *px,
                         int32_t *acc, size_t ldacc);
int unpack_tensor_dot_x(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                        uint32_t r1, const int8_t *x, const struct unpack_dot_x *px, int32_t *acc);

/* Whether the AVX-512 dot kernels (unpack_tensor_dot, unpack_tensor_dot_x,
 * unpack_tensor_dot_xm: one row and several) issue their far prefetch into
 * L2 besides the near one (unpack_internal.h): 1 or 0. Decided once: 0 on
 * AMD family 0x1A (Zen 5) or later (faster without it there), 1 elsewhere
 * (the Intel Xeon it was tuned on; other CPUs were not measured). The
 * environment variable SLUICE_DOT_FAR=0 or 1 overrides that (other values
 * are ignored), and
 * unpack_dot_set_far_prefetch(0 or 1) overrides both (tests, benchmarks;
 * -1 goes back to the default). Prefetches change no result. */
int unpack_dot_far_prefetch(void);
void unpack_dot_set_far_prefetch(int mode);

/* Column c of the tensor: out[r] = q[r][c] for every row r (the codes
 * unpack_tensor_rows gives, block multipliers applied), decoded element by
 * element without unpacking the rows (the shadow outlier term's weight
 * columns with packed residency). Returns 0, or -EINVAL for c >= cols. */
int unpack_tensor_col(const struct unpack_tensor *u, uint32_t c, int8_t *out);
/* The same for rows [r0, r1) only: out[r] for r0 <= r < r1 (out indexed by
 * row as above, the rest untouched). -EINVAL for c >= cols or a range
 * outside the tensor. */
int unpack_tensor_col_rows(const struct unpack_tensor *u, uint32_t c, uint32_t r0, uint32_t r1,
                           int8_t *out);

/* Unpacks one row (output channel) given only its code bytes, as stored in
 * a packed tensor of `encoding` (adaptive, int4int8 or bitplane) with width
 * 1..8: src holds format_packed_row_bytes(encoding, width, cols) bytes (the
 * row starts at format_packed_prefix_bytes(rows) + the sum of the earlier
 * rows' row bytes), dst receives cols int8 codes. For reading single rows
 * (embedding lookups) without the whole tensor. Returns 0, or -EINVAL for a
 * float/unknown encoding, a width outside 1..8, cols = 0 or a kernel that is
 * not available. */
int unpack_row(uint32_t encoding, enum unpack_kernel k, const void *src, uint32_t cols,
               uint32_t width, int8_t *dst);
/* After unpack_row of row `row` (width `width`) of the tensor whose prefix
 * is lay: multiplies its lay->cols values by the row's block multipliers
 * where the tensor has them (header version 2); else nothing. 0 or -ENOMEM. */
int unpack_row_mult(const struct format_packed_layout *lay, uint32_t row, uint32_t width,
                    int8_t *q);

#ifdef __cplusplus
}
#endif

#endif
