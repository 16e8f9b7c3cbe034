/* unpack.c: kernel dispatch and whole-tensor unpacking. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "unpack_internal.h"

static const char *const kernel_names[UNPACK_KERNEL_COUNT] = {"scalar", "avx2", "avx512", "neon"};

const char *unpack_kernel_name(enum unpack_kernel k)
{
    return (unsigned)k < UNPACK_KERNEL_COUNT ? kernel_names[k] : "unknown";
}

static const struct unpack_kernels *kernels_of(enum unpack_kernel k)
{
    switch (k) {
    case UNPACK_KERNEL_SCALAR:
        return &unpack_kernels_scalar;
#if SLUICE_KERNELS_X86
    case UNPACK_KERNEL_AVX2:
        return &unpack_kernels_avx2;
    case UNPACK_KERNEL_AVX512:
        return &unpack_kernels_avx512;
#endif
#if SLUICE_KERNELS_ARM64
    case UNPACK_KERNEL_NEON:
        return &unpack_kernels_neon;
#endif
    default:
        return NULL;
    }
}

int unpack_kernel_available(enum unpack_kernel k)
{
    const struct sl_cpu_features *f = sl_cpu_features();
    if (!kernels_of(k))
        return 0;
    switch (k) {
    case UNPACK_KERNEL_SCALAR:
        return 1;
    case UNPACK_KERNEL_AVX2:
        return f->avx2;
    case UNPACK_KERNEL_AVX512:
        return f->avx512;
    case UNPACK_KERNEL_NEON:
        return f->neon;
    default:
        return 0;
    }
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

int unpack_tensor_init(struct unpack_tensor *u, uint32_t encoding, const void *data,
                       uint64_t len, uint64_t rows, uint64_t cols, struct sl_err *err)
{
    memset(u, 0, sizeof *u);
    int ret = format_packed_parse(encoding, data, len, rows, cols, &u->layout, err);
    if (ret < 0)
        return ret;
    u->row_off = malloc(sizeof(uint64_t) * rows);
    if (!u->row_off) {
        sl_err_set(err, "out of memory");
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

void unpack_tensor_rows(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                        uint32_t r1, int8_t *q)
{
    const struct unpack_kernels *kt = kernels_of(k);
    unpack_row_fn *fn = u->layout.encoding == FORMAT_ENC_ADAPTIVE   ? kt->adaptive
                        : u->layout.encoding == FORMAT_ENC_BITPLANE ? kt->bitplane
                                                                     : kt->int4int8;
    uint32_t cols = u->layout.cols;
    for (uint32_t r = r0; r < r1; r++)
        fn(u->layout.data + u->row_off[r], cols, format_packed_width(u->layout.widths, r),
           q + (size_t)(r - r0) * cols);
}

void unpack_row(uint32_t encoding, enum unpack_kernel k, const void *src, uint32_t cols,
                uint32_t width, int8_t *dst)
{
    const struct unpack_kernels *kt = kernels_of(unpack_kernel_available(k) ? k
                                                                           : UNPACK_KERNEL_SCALAR);
    unpack_row_fn *fn = encoding == FORMAT_ENC_ADAPTIVE   ? kt->adaptive
                        : encoding == FORMAT_ENC_BITPLANE ? kt->bitplane
                                                          : kt->int4int8;
    fn(src, cols, width, dst);
}

static int unpack_q8(const struct format_tensor_info *t, const uint8_t *p, int8_t *q,
                     float *scale)
{
    uint64_t rows = t->shape[0], cols = t->shape[1];
    for (uint64_t r = 0; r < rows; r++)
        scale[r] = sl_load_lef32(p + 4 * r);
    memcpy(q, p + sl_align_up(rows * 4, 64), rows * cols);
    return 0;
}

int unpack_tensor_int8(const struct format_tensor_info *t, const void *data, int8_t *q_out,
                       float *scale_out, struct sl_err *err)
{
    const struct format_encoding_traits *tr = format_encoding_traits(t->encoding);
    if (!tr || !tr->quantized || t->n_dims != 2) {
        sl_err_set(err, "tensor '%s' (%s) is not a quantized matrix", t->name,
                   tr ? tr->name : "unknown encoding");
        return -EINVAL;
    }
    if (t->encoding == FORMAT_ENC_Q8_CHANNEL) {
        if (tr->size(t->shape[0], t->shape[1]) != t->length) {
            sl_err_set(err, "tensor '%s' has %llu bytes, its shape needs %llu", t->name,
                       (unsigned long long)t->length,
                       (unsigned long long)tr->size(t->shape[0], t->shape[1]));
            return -EINVAL;
        }
        int ret = tr->validate(data, t->length, t->shape[0], t->shape[1], err);
        return ret < 0 ? ret : unpack_q8(t, data, q_out, scale_out);
    }
    struct unpack_tensor u;
    int ret = unpack_tensor_init(&u, t->encoding, data, t->length, t->shape[0], t->shape[1], err);
    if (ret < 0)
        return ret;
    for (uint32_t r = 0; r < u.layout.rows; r++)
        scale_out[r] = unpack_tensor_scale(&u, r);
    unpack_tensor_rows(&u, unpack_kernel_best(), 0, u.layout.rows, q_out);
    unpack_tensor_fini(&u);
    return 0;
}
