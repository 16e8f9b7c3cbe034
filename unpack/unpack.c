/* unpack.c: kernel selection and whole-tensor unpacking. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "unpack_internal.h"

static const char *const kernel_names[UNPACK_KERNEL_COUNT] = {"scalar", "avx2", "avx512", "neon"};

/* The kernel tables compiled into this build (NULL: not built for this
 * architecture). */
static const struct unpack_kernels *const kernel_tables[UNPACK_KERNEL_COUNT] = {
    [UNPACK_KERNEL_SCALAR] = &unpack_kernels_scalar,
#if SLUICE_KERNELS_X86
    [UNPACK_KERNEL_AVX2] = &unpack_kernels_avx2,
    [UNPACK_KERNEL_AVX512] = &unpack_kernels_avx512,
#endif
#if SLUICE_KERNELS_ARM64
    [UNPACK_KERNEL_NEON] = &unpack_kernels_neon,
#endif
};

const char *unpack_kernel_name(enum unpack_kernel k)
{
    return (unsigned)k < UNPACK_KERNEL_COUNT ? kernel_names[k] : "unknown";
}

int unpack_kernel_available(enum unpack_kernel k)
{
    if ((unsigned)k >= UNPACK_KERNEL_COUNT || !kernel_tables[k])
        return 0;
    const struct sl_cpu_features *f = sl_cpu_features();
    switch (k) {
    case UNPACK_KERNEL_AVX2:
        return f->avx2;
    case UNPACK_KERNEL_AVX512:
        return f->avx512;
    case UNPACK_KERNEL_NEON:
        return f->neon;
    default:
        return 1;
    }
}

int unpack_kernels_available(enum unpack_kernel out[UNPACK_KERNEL_COUNT])
{
    int n = 0;
    for (int k = 0; k < UNPACK_KERNEL_COUNT; k++)
        if (unpack_kernel_available((enum unpack_kernel)k))
            out[n++] = (enum unpack_kernel)k;
    return n;
}

enum unpack_kernel unpack_kernel_best(void)
{
    static const enum unpack_kernel order[] = {UNPACK_KERNEL_AVX512, UNPACK_KERNEL_AVX2,
                                               UNPACK_KERNEL_NEON};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (unpack_kernel_available(order[i]))
            return order[i];
    return UNPACK_KERNEL_SCALAR;
}

static _Atomic int dot_far_set = -1;  /* unpack_dot_set_far_prefetch's mode */
static _Atomic int dot_far_auto = -1; /* the default, decided once */

int unpack_dot_far_prefetch(void)
{
    int m = atomic_load_explicit(&dot_far_set, memory_order_relaxed);
    if (m >= 0)
        return m;
    m = atomic_load_explicit(&dot_far_auto, memory_order_relaxed);
    if (m >= 0)
        return m;
    const char *e = getenv("SLUICE_DOT_FAR");
    if (e && (!strcmp(e, "0") || !strcmp(e, "1")))
        m = e[0] - '0';
    else
        /* off on AMD family 0x1A (Zen 5) or later, the only AMD CPU the
         * far prefetch was measured on (docs/BENCHMARKS.md, zd22) */
        m = sl_cpu_features_hw()->amd_family < 0x1a;
    atomic_store_explicit(&dot_far_auto, m, memory_order_relaxed);
    return m;
}

void unpack_dot_set_far_prefetch(int mode)
{
    atomic_store_explicit(&dot_far_set, mode == 0 || mode == 1 ? mode : -1, memory_order_relaxed);
}

int unpack_tensor_init(struct unpack_tensor *u, uint32_t encoding, const void *data,
                       uint64_t len, uint64_t rows, uint64_t cols, struct sl_err *err)
{
    memset(u, 0, sizeof *u);
    int ret = format_packed_parse(encoding, data, len, rows, cols, &u->layout, err);
    if (ret < 0)
        return ret;
    u->row_off = malloc(sizeof(uint64_t) * rows);
    if (!u->row_off) {
        sl_err_set(err, "out of memory for the row index of a %" PRIu64 "-row tensor", rows);
        return -ENOMEM;
    }
    uint64_t off = 0;
    for (uint64_t r = 0; r < rows; r++) {
        u->row_off[r] = off;
        off += format_packed_row_bytes(encoding, format_packed_width(u->layout.widths, (uint32_t)r),
                                       cols);
    }
    return 0;
}

void unpack_tensor_fini(struct unpack_tensor *u)
{
    free(u->row_off);
    u->row_off = NULL;
}

uint32_t unpack_tensor_width(const struct unpack_tensor *u, uint32_t row)
{
    return format_packed_width(u->layout.widths, row);
}

float unpack_tensor_scale(const struct unpack_tensor *u, uint32_t row)
{
    return sl_load_lef32(u->layout.scales + 4 * (size_t)row);
}

static unpack_row_fn *row_fn(const struct unpack_kernels *kt, uint32_t encoding)
{
    switch (encoding) {
    case FORMAT_ENC_ADAPTIVE:
        return kt->adaptive;
    case FORMAT_ENC_BITPLANE:
        return kt->bitplane;
    case FORMAT_ENC_INT4INT8:
        return kt->int4int8;
    default:
        return NULL;
    }
}

int unpack_row(uint32_t encoding, enum unpack_kernel k, const void *src, uint32_t cols,
               uint32_t width, int8_t *dst)
{
    if (!unpack_kernel_available(k) || width < 1 || width > FORMAT_MAX_BITS || cols == 0)
        return -EINVAL;
    unpack_row_fn *fn = row_fn(kernel_tables[k], encoding);
    if (!fn)
        return -EINVAL;
    fn(src, cols, width, dst, 0);
    return 0;
}

/* Row r's block multipliers, clamped for width b, into m [blocks]. */
static void row_mults(const struct format_packed_layout *lay, uint32_t r, uint32_t b, uint8_t *m)
{
    uint32_t nb = format_packed_mult_blocks(lay->cols), mx = format_packed_mult_max(b), k = 0;
    uint64_t bit = 2 * (uint64_t)r * nb;
    if (bit % 8 == 0) { /* four at a time from whole bytes */
        const uint8_t *src = lay->mult + bit / 8;
        for (; k + 4 <= nb; k += 4) {
            uint32_t v = src[k / 4];
            if (mx == 4) { /* up to 6 bits: no clamping */
                m[k] = (uint8_t)((v & 3) + 1);
                m[k + 1] = (uint8_t)((v >> 2 & 3) + 1);
                m[k + 2] = (uint8_t)((v >> 4 & 3) + 1);
                m[k + 3] = (uint8_t)((v >> 6) + 1);
                continue;
            }
            for (uint32_t i = 0; i < 4; i++, v >>= 2)
                m[k + i] = (uint8_t)((v & 3) + 1 < mx ? (v & 3) + 1 : mx);
        }
    }
    for (; k < nb; k++) {
        uint32_t v = format_packed_mult(lay->mult, nb, r, k);
        m[k] = (uint8_t)(v < mx ? v : mx);
    }
}

int unpack_row_mult(const struct format_packed_layout *lay, uint32_t row, uint32_t width,
                    int8_t *q)
{
    if (!lay->mult)
        return 0;
    uint8_t *m = malloc(format_packed_mult_blocks(lay->cols));
    if (!m)
        return -ENOMEM;
    row_mults(lay, row, width, m);
    kernel_tables[unpack_kernel_best()]->mult(q, lay->cols, m);
    free(m);
    return 0;
}

/* Orders earlier non-temporal stores before later stores (once per call:
 * a fence per row stalls each row until its stores have drained). */
static void store_fence(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_sfence();
#endif
}

int unpack_tensor_rows_store(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                             uint32_t r1, int8_t *q, int32_t *corr, enum unpack_store store)
{
    if (!unpack_kernel_available(k) || r0 > r1 || r1 > u->layout.rows)
        return -EINVAL;
    uint32_t cols = u->layout.cols;
    if (corr && cols > UNPACK_CORR_MAX_COLS)
        return -EOVERFLOW;
    const struct unpack_kernels *kt = kernel_tables[k];
    unpack_row_fn *fn = row_fn(kt, u->layout.encoding);
    int stream = !corr && ((uintptr_t)q & 63) == 0 && cols % 64 == 0 &&
                 (store == UNPACK_STORE_STREAM ||
                  (store == UNPACK_STORE_AUTO &&
                   (uint64_t)(r1 - r0) * cols >= UNPACK_STREAM_MIN_BYTES));
    uint8_t *m = NULL; /* a row's block multipliers (header version 2) */
    if (u->layout.mult && !(m = malloc(format_packed_mult_blocks(cols))))
        return -ENOMEM;
    for (uint32_t r = r0; r < r1; r++) {
        int8_t *dst = q + (size_t)(r - r0) * cols;
        uint32_t b = format_packed_width(u->layout.widths, r);
        uint64_t mbit = 2 * (uint64_t)r * format_packed_mult_blocks(cols);
        if (m && kt->adaptive_mult_raw && mbit % 8 == 0) { /* multipliers read as stored */
            kt->adaptive_mult_raw(u->layout.data + u->row_off[r], cols, b, dst, stream,
                                  u->layout.mult + mbit / 8);
        } else if (m && kt->adaptive_mult) { /* multiplied in registers, before the stores */
            row_mults(&u->layout, r, b, m);
            kt->adaptive_mult(u->layout.data + u->row_off[r], cols, b, dst, stream, m);
        } else if (m) { /* the same in two steps, from L1 */
            row_mults(&u->layout, r, b, m);
            fn(u->layout.data + u->row_off[r], cols, b, dst, 0);
            kt->mult(dst, cols, m);
        } else {
            fn(u->layout.data + u->row_off[r], cols, b, dst, stream);
        }
        if (corr) /* the row was just written: summed from L1 */
            corr[r - r0] = 128 * kt->sum(dst, cols);
    }
    if (stream) /* the kernels' non-temporal stores ordered before what follows */
        store_fence();
    free(m);
    return 0;
}

int unpack_tensor_rows(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                       uint32_t r1, int8_t *q, int32_t *corr)
{
    return unpack_tensor_rows_store(u, k, r0, r1, q, corr, UNPACK_STORE_AUTO);
}

/* The adaptive dot kernel of level k: the AVX-512 one needs VNNI, else the
 * AVX2 one (bit-exact with it) serves that level. */
static unpack_dot_fn *dot_fn(enum unpack_kernel k)
{
#if SLUICE_KERNELS_X86
    if (k == UNPACK_KERNEL_AVX512 && !sl_cpu_features()->avx512vnni)
        return unpack_kernels_avx2.adaptive_dot;
#endif
    return kernel_tables[k]->adaptive_dot;
}

/* x's sums and zero-padded tail group (unpack_dot_args) for a row of cols. */
static void dot_x_fill(const int8_t *x, uint32_t cols, int32_t *full, int32_t *all,
                       int8_t tail[FORMAT_PACKED_GROUP + 64])
{
    const uint32_t nfull = cols / FORMAT_PACKED_GROUP * FORMAT_PACKED_GROUP;
    int32_t sx = 0;
    for (uint32_t c = 0; c < nfull; c++)
        sx += x[c];
    *full = sx;
    for (uint32_t c = nfull; c < cols; c++)
        sx += x[c];
    *all = sx;
    memset(tail, 0, FORMAT_PACKED_GROUP + 64);
    memcpy(tail, x + nfull, cols - nfull);
}

/* Whether the kernels may read 64 bytes past row r (not the tensor's last). */
static int dot_overread(const struct unpack_tensor *u, uint32_t r, uint32_t b)
{
    return u->layout.data_len - u->row_off[r] >=
           format_packed_row_bytes(FORMAT_ENC_ADAPTIVE, b, u->layout.cols) + 64;
}

static int dot_check(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                     uint32_t r1)
{
    if (!unpack_kernel_available(k) || r0 > r1 || r1 > u->layout.rows)
        return -EINVAL;
    if (u->layout.cols > UNPACK_CORR_MAX_COLS)
        return -EOVERFLOW;
    return 0;
}

int unpack_dot_multirow(const struct unpack_tensor *u, enum unpack_kernel k)
{
    if (u->layout.encoding != FORMAT_ENC_ADAPTIVE || u->layout.mult)
        return 0; /* unpack_tensor_dot's per-row buffer path */
#if SLUICE_KERNELS_X86
    return k == UNPACK_KERNEL_AVX512 && unpack_kernel_available(k) && sl_cpu_features()->avx512vnni;
#else
    (void)k;
    return 0;
#endif
}

#if SLUICE_KERNELS_X86
/* The largest block of activation rows (16, 8, 4, 2 or 1) within n. */
static uint32_t dot_block(uint32_t n)
{
    return n >= 16 ? 16 : n >= 8 ? 8 : n >= 4 ? 4 : n >= 2 ? 2 : 1;
}
#endif

/* unpack_tensor_dot's adaptive path with each activation row's sums and
 * tail (px[i], from unpack_dot_x_init or dot_x_fill) already made. */
static void dot_adaptive(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                         uint32_t r1, const int8_t *x, uint32_t m,
                         const struct unpack_dot_x *px, int32_t *acc, size_t ldacc)
{
    unpack_dot_fn *fn = dot_fn(k);
    const uint32_t cols = u->layout.cols;
#if SLUICE_KERNELS_X86
    const int multi = unpack_dot_multirow(u, k);
#endif
    struct unpack_dot_args args[16];
    for (uint32_t i0 = 0; i0 < m; i0 += 16) {
        uint32_t mi = m - i0 < 16 ? m - i0 : 16;
        for (uint32_t i = 0; i < mi; i++)
            args[i] = (struct unpack_dot_args){px[i0 + i].xsum_full, px[i0 + i].xsum_all,
                                               px[i0 + i].xtail, 0};
        /* row by row: a row's bytes stay in L1 for the next activation rows;
         * where the kernel takes several rows at once (multi), blocks of 16,
         * 8, 4 or 2 of them unpack the row once each */
        for (uint32_t r = r0; r < r1; r++) {
            const uint8_t *src = u->layout.data + u->row_off[r];
            uint32_t b = format_packed_width(u->layout.widths, r);
            int over = dot_overread(u, r, b);
            for (uint32_t i = 0; i < mi;) {
                int32_t *out = acc + (size_t)(i0 + i) * ldacc + (r - r0);
                const int8_t *xi = x + (size_t)(i0 + i) * cols;
#if SLUICE_KERNELS_X86
                uint32_t c = multi ? dot_block(mi - i) : 1;
                if (c > 1) {
                    unpack_adaptive_dot_m_avx512(src, cols, b, xi, c, &args[i], out, ldacc);
                    i += c;
                    continue;
                }
#endif
                args[i].overread = over;
                *out = fn(src, cols, b, xi, &args[i]);
                i++;
            }
        }
    }
}

int unpack_tensor_dot(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                      uint32_t r1, const int8_t *x, uint32_t m, int32_t *acc, size_t ldacc)
{
    if (m == 0 || (m > 1 && ldacc < (size_t)(r1 - r0)))
        return -EINVAL;
    int ret = dot_check(u, k, r0, r1);
    if (ret < 0)
        return ret;
    const uint32_t cols = u->layout.cols;
    if (u->layout.encoding != FORMAT_ENC_ADAPTIVE || u->layout.mult) {
        /* the baselines and block multipliers: each row unpacked to a buffer,
         * then multiplied */
        int8_t *q = malloc(cols);
        if (!q)
            return -ENOMEM;
        for (uint32_t r = r0; r < r1; r++) {
            if (unpack_tensor_rows(u, k, r, r + 1, q, NULL) < 0) {
                free(q);
                return -ENOMEM;
            }
            for (uint32_t i = 0; i < m; i++)
                acc[i * ldacc + (r - r0)] = unpack_dot_i8(q, x + (size_t)i * cols, cols);
        }
        free(q);
        return 0;
    }
    struct unpack_dot_x px[16];
    for (uint32_t i0 = 0; i0 < m; i0 += 16) {
        uint32_t mi = m - i0 < 16 ? m - i0 : 16;
        for (uint32_t i = 0; i < mi; i++)
            dot_x_fill(x + (size_t)(i0 + i) * cols, cols, &px[i].xsum_full, &px[i].xsum_all,
                       px[i].xtail);
        dot_adaptive(u, k, r0, r1, x + (size_t)i0 * cols, mi, px, acc + (size_t)i0 * ldacc,
                     ldacc);
    }
    return 0;
}

int unpack_tensor_dot_xm(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                         uint32_t r1, const int8_t *x, uint32_t m, const struct unpack_dot_x *px,
                         int32_t *acc, size_t ldacc)
{
    if (u->layout.encoding != FORMAT_ENC_ADAPTIVE || u->layout.mult)
        return unpack_tensor_dot(u, k, r0, r1, x, m, acc, ldacc);
    if (m == 0 || (m > 1 && ldacc < (size_t)(r1 - r0)))
        return -EINVAL;
    int ret = dot_check(u, k, r0, r1);
    if (ret < 0)
        return ret;
    dot_adaptive(u, k, r0, r1, x, m, px, acc, ldacc);
    return 0;
}

void unpack_dot_x_init(const struct unpack_tensor *u, const int8_t *x, struct unpack_dot_x *px)
{
    dot_x_fill(x, u->layout.cols, &px->xsum_full, &px->xsum_all, px->xtail);
}

int unpack_tensor_dot_x(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                        uint32_t r1, const int8_t *x, const struct unpack_dot_x *px, int32_t *acc)
{
    if (u->layout.encoding != FORMAT_ENC_ADAPTIVE || u->layout.mult)
        return unpack_tensor_dot(u, k, r0, r1, x, 1, acc, 0);
    int ret = dot_check(u, k, r0, r1);
    if (ret < 0)
        return ret;
    unpack_dot_fn *fn = dot_fn(k);
    const uint32_t cols = u->layout.cols;
    struct unpack_dot_args a = {px->xsum_full, px->xsum_all, px->xtail, 0};
    /* rows that start this far before the end have 64 bytes after them at
     * any width: dot_overread only for the rows past it */
    uint64_t most = format_packed_row_bytes(FORMAT_ENC_ADAPTIVE, 8, cols) + 64;
    uint64_t safe = u->layout.data_len >= most ? u->layout.data_len - most : 0;
    for (uint32_t r = r0; r < r1; r++) {
        uint32_t b = format_packed_width(u->layout.widths, r);
        a.overread = u->row_off[r] <= safe && u->layout.data_len >= most ? 1 : dot_overread(u, r, b);
        acc[r - r0] = fn(u->layout.data + u->row_off[r], cols, b, x, &a);
    }
    return 0;
}

#ifndef SLUICE_KERNELS_AMX
#define SLUICE_KERNELS_AMX 0
#endif

int unpack_dot_tiles_takes(const struct unpack_tensor *u, uint32_t m)
{
    return SLUICE_KERNELS_AMX && m >= 1 && m <= UNPACK_TILES_ROWS_MAX &&
           u->layout.encoding == FORMAT_ENC_ADAPTIVE && !u->layout.mult &&
           u->layout.cols <= UNPACK_CORR_MAX_COLS && sl_cpu_features()->amx;
}

size_t unpack_dot_tiles_stage_bytes(uint32_t cols, uint32_t m)
{
    return UNPACK_TILES_STAGE_HDR + ((size_t)cols + 63) / 64 * 64 * m;
}

int unpack_dot_tiles_stage(uint32_t cols, const int8_t *x, uint32_t m, void *stage)
{
    if (m == 0 || m > UNPACK_TILES_ROWS_MAX || cols == 0)
        return -EINVAL;
    struct unpack_tiles_stage *st = stage;
    st->m = m;
    st->cols = cols;
    uint8_t *out = (uint8_t *)stage + UNPACK_TILES_STAGE_HDR;
    const uint32_t g4 = cols / 4, kp4 = (cols + 63) / 64 * 16; /* groups of 4 inputs */
    for (uint32_t i = 0; i < m; i++) {
        const int8_t *xi = x + (size_t)i * cols;
        int32_t s = 0;
        for (uint32_t c = 0; c < cols; c++)
            s += xi[c];
        st->xsum[i] = s;
        /* row i's groups of 4, m * 4 bytes apart; the partial group and
         * the groups past cols padded with zeros */
        uint8_t *o = out + (size_t)i * 4;
        for (uint32_t g = 0; g < g4; g++)
            memcpy(o + (size_t)g * m * 4, xi + (size_t)g * 4, 4);
        for (uint32_t g = g4; g < kp4; g++) {
            uint8_t v[4] = {0};
            for (uint32_t j = 0; j < 4 && g * 4 + j < cols; j++)
                v[j] = (uint8_t)xi[g * 4 + j];
            memcpy(o + (size_t)g * m * 4, v, 4);
        }
    }
    return 0;
}

static int dot_tiles(const struct unpack_tensor *u, uint32_t r0, uint32_t r1, const void *stage,
                     int32_t *acc, size_t ldacc, int down)
{
    const struct unpack_tiles_stage *st = stage;
    if (!unpack_dot_tiles_takes(u, st->m) || st->cols != u->layout.cols || r0 > r1 ||
        r1 > u->layout.rows || (st->m > 1 && ldacc < (size_t)(r1 - r0)))
        return -EINVAL;
#if SLUICE_KERNELS_AMX
    if (r1 > r0)
        unpack_adaptive_dot_tiles_amx(u, r0, r1, st, acc, ldacc, down);
    return 0;
#else
    (void)acc;
    (void)down;
    return -EINVAL;
#endif
}

int unpack_tensor_dot_tiles(const struct unpack_tensor *u, uint32_t r0, uint32_t r1,
                            const void *stage, int32_t *acc, size_t ldacc)
{
    return dot_tiles(u, r0, r1, stage, acc, ldacc, 0);
}

int unpack_tensor_dot_tiles_down(const struct unpack_tensor *u, uint32_t r0, uint32_t r1,
                                 const void *stage, int32_t *acc, size_t ldacc)
{
    return dot_tiles(u, r0, r1, stage, acc, ldacc, 1);
}

/* q8: float32 scale[rows], zero padding to 64 bytes, int8 q[rows][cols]
 * (format.h); validated by the format module's traits. */
static void unpack_q8(const struct format_tensor_info *t, const uint8_t *p, int8_t *q,
                      float *scale, int32_t *corr)
{
    uint64_t rows = t->shape[0], cols = t->shape[1];
    for (uint64_t r = 0; r < rows; r++)
        scale[r] = sl_load_lef32(p + 4 * r);
    memcpy(q, p + sl_align_up(rows * 4, 64), rows * cols);
    if (corr) {
        const struct unpack_kernels *kt = kernel_tables[unpack_kernel_best()];
        for (uint64_t r = 0; r < rows; r++)
            corr[r] = 128 * kt->sum(q + r * cols, (uint32_t)cols);
    }
}

int unpack_tensor_int8_corr(const struct format_tensor_info *t, const void *data,
                            int8_t *q_out, float *scale_out, int32_t *corr_out,
                            struct sl_err *err)
{
    const struct format_encoding_traits *tr = format_encoding_traits(t->encoding);
    if (!tr || !tr->quantized || t->n_dims != 2) {
        sl_err_set(err, "tensor '%s' (%s, %u-D) is not a quantized matrix", t->name,
                   tr ? tr->name : "unknown encoding", t->n_dims);
        return -EINVAL;
    }
    uint64_t rows = t->shape[0], cols = t->shape[1];
    if (corr_out && cols > UNPACK_CORR_MAX_COLS) {
        sl_err_set(err, "tensor '%s': rows of %" PRIu64 " weights are too long for an int32 "
                        "correction (at most %u)", t->name, cols, UNPACK_CORR_MAX_COLS);
        return -EOVERFLOW;
    }
    if (t->encoding == FORMAT_ENC_Q8_CHANNEL) {
        uint64_t want = tr->size(rows, cols);
        if (want != t->length) {
            sl_err_set(err, "tensor '%s' (q8, %" PRIu64 " x %" PRIu64 ") is %" PRIu64
                            " bytes, its shape needs %" PRIu64,
                       t->name, rows, cols, t->length, want);
            return -EINVAL;
        }
        int ret = tr->validate(data, t->length, rows, cols, err);
        if (ret < 0) {
            sl_err_prefix(err, "tensor '%s'", t->name);
            return ret;
        }
        unpack_q8(t, data, q_out, scale_out, corr_out);
        return 0;
    }
    struct unpack_tensor u;
    int ret = unpack_tensor_init(&u, t->encoding, data, t->length, rows, cols, err);
    if (ret < 0) {
        sl_err_prefix(err, "tensor '%s'", t->name);
        return ret;
    }
    for (uint32_t r = 0; r < u.layout.rows; r++)
        scale_out[r] = unpack_tensor_scale(&u, r);
    ret = unpack_tensor_rows(&u, unpack_kernel_best(), 0, u.layout.rows, q_out, corr_out);
    unpack_tensor_fini(&u);
    return ret;
}

int unpack_tensor_int8(const struct format_tensor_info *t, const void *data, int8_t *q_out,
                       float *scale_out, struct sl_err *err)
{
    return unpack_tensor_int8_corr(t, data, q_out, scale_out, NULL, err);
}
