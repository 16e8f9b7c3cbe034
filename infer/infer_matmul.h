/* infer_matmul.h: the float matmul kernels behind infer_op_matmul_f32 and
 * infer_op_attention (internal to the infer module).
 *
 * Two shapes, both on row-major operands with explicit row strides:
 * - NT: y[i][r] = dot(x[i][0..cols), w[r][0..cols)): a linear layer (y = x
 *   W^T) and attention scores (Q K^T). A kernel computes one tile of mr
 *   (1..4) x rows against nr (1..4) w rows; infer_matmul.c does the cache
 *   blocking around the tiles.
 * - NN: y[i][0..cols) = sum_t p[i][t] * v[t][0..cols): attention's
 *   probabilities times values, for mr (1..4) rows of p at a time.
 *
 * The kernel is picked once by CPU features (SLUICE_SIMD lowers it). The
 * scalar kernels are the reference; the SIMD kernels sum NT dot products in
 * a different order (and use FMA), so they agree with it within float
 * rounding, not bit for bit (test_infer_ops checks the bound). Every kernel
 * computes each output from its own operands only, in an order that does not
 * depend on mr, nr or the blocking: the same row gives the same bits whatever
 * batch it is part of. */
#ifndef SLUICE_INFER_MATMUL_H
#define SLUICE_INFER_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#define INFER_MATMUL_MR 4
#define INFER_MATMUL_NR 4

/* Element types of float weights: F16 and BF16 tensors stay in their
 * 16-bit form in memory (half the bytes) and are widened exactly as the
 * kernels load them, so the results equal those of float32 copies. */
enum infer_wtype {
    INFER_W_F32 = 0,
    INFER_W_F16 = 1,
    INFER_W_BF16 = 2,
};

enum infer_matmul_kernel {
    INFER_MATMUL_SCALAR = 0,
    INFER_MATMUL_AVX2 = 1,
    INFER_MATMUL_AVX512 = 2,
    INFER_MATMUL_COUNT
};

/* NT tile: y[i * ldy + r] for i < mr, r < nr. w holds elements of type wt
 * (enum infer_wtype), converted to float exactly as they
 * are loaded; ldw counts elements. */
typedef void infer_matmul_tile_fn(float *y, size_t ldy, const float *x, size_t ldx, uint32_t mr,
                                  const void *w, size_t ldw, uint32_t nr, uint32_t cols,
                                  uint32_t wt);
/* NN rows: y[i * ldy + c] = sum_{t < T} p[i * ldp + t] * v[t * ldv + c], for
 * i < mr, c < cols (t ascending). add: the sums start from y's values
 * instead of 0 (a sum over keys cut into blocks, resumed block by block,
 * has the bits of the sum in one piece: each step is the same operation on
 * the same running value). */
typedef void infer_matmul_nn_fn(float *y, size_t ldy, const float *p, size_t ldp, uint32_t mr,
                                const float *v, size_t ldv, uint32_t T, uint32_t cols, int add);

infer_matmul_tile_fn infer_matmul_tile_scalar;
infer_matmul_tile_fn infer_matmul_tile_avx2;
infer_matmul_tile_fn infer_matmul_tile_avx512;
/* The NT matmul for a few x rows (1..INFER_MATMUL_ROWS_MAX) on float32
 * weights, with the AVX2 tile's arithmetic (the same bits for every
 * output), w rows [r0, r1) each read once for all n x rows
 * (infer_matmul_rows_avx2.c); infer_matmul_nt takes it for such calls. */
#define INFER_MATMUL_ROWS_MAX 16
void infer_matmul_rows_avx2(float *y, size_t ldy, const float *x, size_t ldx, uint32_t n,
                            const float *w, size_t ldw, uint32_t cols, uint32_t r0, uint32_t r1);
/* The same with the AVX-512 tile's arithmetic (infer_matmul_rows_avx512.c),
 * tiles of 4 w rows (3 for one x row) by up to 6 x rows a pass:
 * infer_matmul_nt takes it where the AVX-512 kernel is the one in use. */
void infer_matmul_rows_avx512(float *y, size_t ldy, const float *x, size_t ldx, uint32_t n,
                              const float *w, size_t ldw, uint32_t cols, uint32_t r0, uint32_t r1);
infer_matmul_nn_fn infer_matmul_nn_scalar;
infer_matmul_nn_fn infer_matmul_nn_avx2;
/* The AVX-512 one takes up to INFER_MATMUL_NN_ROWS_AVX512 rows a call (the
 * others up to INFER_MATMUL_MR): a kv group's 8 query heads in one pass. */
#define INFER_MATMUL_NN_ROWS_AVX512 8
infer_matmul_nn_fn infer_matmul_nn_avx512;

const char *infer_matmul_kernel_name(enum infer_matmul_kernel k);
int infer_matmul_kernel_available(enum infer_matmul_kernel k);
enum infer_matmul_kernel infer_matmul_kernel_best(void);
/* infer_matmul_kernel_best(), computed once. */
enum infer_matmul_kernel infer_matmul_kernel_used(void);

/* NT: y[i][r] (row stride ldy) for i < n, r in [r0, r1), x rows of stride
 * ldx, w rows (of element type wt) of stride ldw, with kernel k (scalar if k
 * is unavailable). */
void infer_matmul_nt(enum infer_matmul_kernel k, float *y, size_t ldy, const float *x, size_t ldx,
                     const void *w, uint32_t wt, size_t ldw, uint32_t n, uint32_t cols, uint32_t r0,
                     uint32_t r1);

/* NN: y[i][c] for i < n, c < cols. */
void infer_matmul_nn(enum infer_matmul_kernel k, float *y, size_t ldy, const float *p, size_t ldp,
                     const float *v, size_t ldv, uint32_t n, uint32_t T, uint32_t cols);
/* The same, the sums resuming from y's values (a sum over keys in two
 * calls, the second with the keys that follow: the bits of one call). */
void infer_matmul_nn_resume(enum infer_matmul_kernel k, float *y, size_t ldy, const float *p,
                            size_t ldp, const float *v, size_t ldv, uint32_t n, uint32_t T,
                            uint32_t cols);

/* The contiguous NT case (a linear layer: ldx = ldw = cols, ldy = rows). */
void infer_matmul_linear_kernel(enum infer_matmul_kernel k, float *y, const float *x, const void *w,
                                uint32_t wt, uint32_t n, uint32_t rows, uint32_t cols, uint32_t r0,
                                uint32_t r1);

/* exp for softmax: a[t] = exp(a[t] - sub) for t < n, in place, returning
 * the sum of the results. The definition is the scalar kernel's, and the
 * SIMD kernels reproduce it bit for bit (test_infer_ops): a Cody-Waite
 * reduction x = n ln2 + r with n = rint(x log2 e), a degree-6 polynomial in r
 * (Cephes' coefficients) evaluated with fmaf, times 2^n; x < -87 gives 0,
 * x > 88 gives infinity, NaN stays NaN (error within 2 ulp of expf). The sum
 * is taken in 16 interleaved partial sums (element t into partial t mod 16),
 * folded pairwise: p[i] + p[i + 8], then + [i + 4], [i + 2], [i + 1]. */
/* the definition's constants, shared by every kernel */
#define INFER_EXP_LOG2E (1.44269504088896341f)
#define INFER_EXP_LN2_HI (0.693359375f)
#define INFER_EXP_LN2_LO (2.12194440e-4f)
#define INFER_EXP_P5 (1.9875691500e-4f)
#define INFER_EXP_P4 (1.3981999507e-3f)
#define INFER_EXP_P3 (8.3334519073e-3f)
#define INFER_EXP_P2 (4.1665795894e-2f)
#define INFER_EXP_P1 (1.6666665459e-1f)
#define INFER_EXP_P0 (5.0000001201e-1f)
#define INFER_EXP_LO (-87.0f)
#define INFER_EXP_HI (88.0f)
typedef float infer_exp_sum_fn(float *a, uint32_t n, float sub);
infer_exp_sum_fn infer_exp_sum_scalar;
infer_exp_sum_fn infer_exp_sum_avx2;
infer_exp_sum_fn infer_exp_sum_avx512;
float infer_exp_sum(enum infer_matmul_kernel k, float *a, uint32_t n, float sub);

/* SwiGLU, h[i] = g[i] * (1 / (1 + exp(-g[i]))) * u[i] for i < n, exp being
 * infer_exp_sum_avx512's (of -g minus 0): the bits infer_op_swiglu's generic
 * path gives with the AVX-512 kernel, in one pass (IEEE division and
 * products, no FMA in the three steps). x86 with AVX-512F only. */
void infer_swiglu_avx512(float *h, const float *g, const float *u, size_t n);

/* RMSNorm, infer_op_rmsnorm's definition: a row's sum of squares in element
 * order (each product rounded, then added), / d, + eps, 1 / sqrt, then
 * out[j] = w[j] * (s * x[j]). The scalar form is the reference; the
 * AVX-512F one runs 16 rows' sums together (one row a lane) and gives
 * the same bits. out may alias x. */
void infer_rmsnorm_scalar(float *out, const float *x, const float *w, uint32_t n, uint32_t d,
                          float eps);
void infer_rmsnorm_avx512(float *out, const float *x, const float *w, uint32_t n, uint32_t d,
                          float eps);
float infer_rmsnorm_ss_scalar(const float *xr, uint32_t d); /* one row's sum of squares */

/* RoPE of one head's interleaved pairs j < half with the row's tables:
 * x[2j] = x[2j] * c[j] - x[2j+1] * s[j], x[2j+1] = x[2j] * s[j] + x[2j+1] *
 * c[j] (two products, then one sum: infer_op_rope_heads's step). The
 * scalar form is the reference; AVX-512F: the same bits, 8 pairs at a time. */
void infer_rope_pairs_scalar(float *xh, const float *cos_tab, const float *sin_tab, uint32_t half);
void infer_rope_pairs_avx512(float *xh, const float *cos_tab, const float *sin_tab,
                             uint32_t half);

/* Softmax scaling: a[t] = a[t] / d for t < n (IEEE division, lane by lane);
 * returns the largest of the results (-INFINITY if n is 0): a value wins
 * only if strictly greater, so NaN never does. The maximum is kept in 16
 * lanes (t & 15) reduced pairwise (lane i against lane i + w, w = 8, 4, 2, 1),
 * the order every kernel follows. */
typedef float infer_div_max_fn(float *a, uint32_t n, float d);
infer_div_max_fn infer_div_max_scalar;
infer_div_max_fn infer_div_max_avx2;
infer_div_max_fn infer_div_max_avx512;
float infer_div_max(enum infer_matmul_kernel k, float *a, uint32_t n, float d);
float infer_div_max_reduce16(float m[16]); /* the lanes' pairwise reduction */

/* Attention's softmax of one row of scores in place: a[t] / sq, exp of
 * that less the row's maximum, then each divided by their sum (the three
 * steps above, in that order, so every caller gets the same bits). */
void infer_softmax_scaled(enum infer_matmul_kernel k, float *a, uint32_t n, float sq);

/* Attention scores against transposed keys (infer_attn_kt_avx512.c), for a
 * prefill's grouped-query rows: keys [0, T) of one kv head (rows of stride
 * ldk, hs columns) as kt[c * ldt + t], zeros in [T, ldt) (ldt >= T, a
 * multiple of 16). The scores kernel takes at least T keys there: lanes
 * past its T (later keys, or those zeros) are masked out of the scores
 * and the maximum. */
void infer_keys_transpose(float *kt, size_t ldt, const float *k, size_t ldk, uint32_t T,
                          uint32_t hs);
/* The head sizes it takes: 32, 64 and 128 (INFER_ATT_KT_HS; each one an
 * unrolled kernel of its own), at most this. */
#define INFER_ATT_KT_MAX_HS 128u
#define INFER_ATT_KT_HS(hs) ((hs) == 32 || (hs) == 64 || (hs) == 128)
/* att[i * lda + t] = dot(q row i, key t) / d for i < nq, t < T, with
 * exactly the bits infer_matmul_nt (AVX-512 kernel) and then
 * infer_div_max(INFER_MATMUL_AVX512, att row, T, d) give, and maxv[i] = that
 * call's return value: the first step of infer_softmax_scaled fused with
 * the scores. INFER_ATT_KT_HS(hs); kt from
 * infer_keys_transpose. x86 with AVX-512F only. */
void infer_attn_scores_kt_avx512(float *att, size_t lda, const float *q, size_t ldq, uint32_t nq,
                                 const float *kt, size_t ldt, uint32_t T, uint32_t hs, float d,
                                 float *maxv);
/* The softmax's two later steps on a row whose first step is done (scaled,
 * maxv its maximum): infer_softmax_scaled = infer_div_max, then this. */
void infer_softmax_after_max(enum infer_matmul_kernel k, float *a, uint32_t n, float maxv);

#endif
