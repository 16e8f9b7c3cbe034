/* pipeline_weights.c: weight preparation for the pipeline. A quantized
 * tensor is unpacked straight into the NPU's weight layout, in pieces (a
 * matmul piece's channels) or whole, without a row-major copy; the untied
 * embedding stays packed; norms are decoded. Knows nothing of the task
 * graph: the first file in pipeline.h's call order. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pipeline.h"
#include "unpack.h"

/* Sets up a quantized linear before its rows are unpacked: the NPU's weight
 * storage (want_npu) and/or plain int8 rows with their scales (keep_rows). */
int pl_weights_prepare(struct infer_linear *lin, const struct format_tensor_info *t,
                       int force_dynamic, int keep_rows, int want_npu, struct sl_err *err)
{
    uint32_t rows = (uint32_t)t->shape[0], cols = (uint32_t)t->shape[1];
    memset(lin, 0, sizeof *lin);
    lin->rows = rows;
    lin->cols = cols;
    lin->act_scale = force_dynamic ? 0.0f : t->act_scale;
    int ret = want_npu ? npu_weights_alloc(rows, cols, &lin->npu) : 0;
    if (ret < 0) {
        sl_err_set(err, "out of memory for '%s'", t->name);
        return ret;
    }
    if (keep_rows) {
        lin->q = sl_alloc_aligned((size_t)rows * cols, 64);
        lin->scale = sl_malloc(sizeof(float) * rows);
        if (!lin->q || !lin->scale) {
            sl_err_set(err, "out of memory for '%s'", t->name);
            return -ENOMEM;
        }
    }
    return 0;
}

/* Unpacks rows [r0, r1) of a prepared quantized linear from its tensor's
 * bytes, 64 rows at a time, into the NPU's weight layout (the rows never
 * exist whole in row-major form) and/or the kept rows. r0 is a multiple of
 * 16 (the NPU's channel blocks), as is r1 unless it is the last row. */
int pl_weights_fill(struct infer_linear *lin, const struct format_tensor_info *t,
                    const uint8_t *data, uint32_t r0, uint32_t r1, int8_t *scratch,
                    struct sl_err *err)
{
    const uint32_t rows = lin->rows, cols = lin->cols, B = PL_FILL_ROWS;
    /* a CPU worker's scratch (PL_FILL_ROWS x the widest row): allocating
     * per task would fault fresh pages in every task */
    int8_t *tmp = scratch ? scratch : sl_alloc_aligned((size_t)B * cols, 64);
    float sc[PL_FILL_ROWS];
    int ret = 0;
    if (!tmp) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    if (t->encoding == FORMAT_ENC_Q8_CHANNEL) {
        ret = format_q8_validate_rows(data, rows, cols, r0, r1, err);
        const int8_t *codes = (const int8_t *)data + sl_align_up((uint64_t)rows * 4, 64);
        for (uint32_t a = r0; ret == 0 && a < r1; a += B) {
            uint32_t n = r1 - a < B ? r1 - a : B;
            for (uint32_t i = 0; i < n; i++)
                sc[i] = sl_load_lef32(data + 4 * (size_t)(a + i));
            if (lin->npu)
                npu_weights_fill(lin->npu, a, n, codes + (size_t)a * cols, sc);
            if (lin->q) {
                memcpy(lin->q + (size_t)a * cols, codes + (size_t)a * cols, (size_t)n * cols);
                memcpy(lin->scale + a, sc, sizeof(float) * n);
            }
        }
    } else {
        struct unpack_tensor u;
        ret = unpack_tensor_init(&u, t->encoding, data, t->length, rows, cols, err);
        enum unpack_kernel k = unpack_kernel_best();
        for (uint32_t a = r0; ret == 0 && a < r1; a += B) {
            uint32_t n = r1 - a < B ? r1 - a : B;
            ret = unpack_tensor_rows(&u, k, a, a + n, tmp, NULL);
            if (ret < 0) {
                sl_err_set(err, "cannot unpack rows %u..%u", a, a + n);
                break;
            }
            for (uint32_t i = 0; i < n; i++)
                sc[i] = unpack_tensor_scale(&u, a + i);
            if (lin->npu)
                npu_weights_fill(lin->npu, a, n, tmp, sc);
            if (lin->q) {
                memcpy(lin->q + (size_t)a * cols, tmp, (size_t)n * cols);
                memcpy(lin->scale + a, sc, sizeof(float) * n);
            }
        }
        unpack_tensor_fini(&u);
    }
    if (tmp != scratch)
        sl_free_aligned(tmp);
    if (ret < 0)
        sl_err_prefix(err, "tensor '%s'", t->name);
    return ret;
}

/* Unpacks a whole tensor from its slice bytes (a float one is decoded). */
int pl_weights_unpack(struct infer_linear *lin, const struct format_tensor_info *t,
                      const uint8_t *data, int force_dynamic, int keep_rows, int want_npu,
                      int8_t *scratch, struct sl_err *err)
{
    if (!format_encoding_traits(t->encoding)->quantized) {
        memset(lin, 0, sizeof *lin);
        lin->rows = (uint32_t)t->shape[0];
        lin->cols = (uint32_t)t->shape[1];
        return infer_linear_init(lin, t, data, 0, force_dynamic, err);
    }
    int ret = pl_weights_prepare(lin, t, force_dynamic, keep_rows, want_npu, err);
    return ret < 0 ? ret : pl_weights_fill(lin, t, data, 0, lin->rows, scratch, err);
}

/* The untied embedding is only looked up (a few rows per token): a packed
 * one stays packed in memory and infer_op_embed unpacks the rows it needs;
 * INT8 rows are kept as they are. No NPU copy. */
int pl_weights_keep_packed(struct infer_linear *lin, const struct format_tensor_info *t,
                           const uint8_t *data, int borrow, struct sl_err *err)
{
    if (t->encoding == FORMAT_ENC_Q8_CHANNEL)
        return pl_weights_unpack(lin, t, data, 0, 1, 0, NULL, err);
    memset(lin, 0, sizeof *lin);
    lin->rows = (uint32_t)t->shape[0];
    lin->cols = (uint32_t)t->shape[1];
    return pl_weights_keep_bytes(lin, t, data, borrow, err);
}

/* Keeps a quantized linear's packed bytes beside its NPU weights
 * (INFER_RESIDENT_PACKED: decode reads them once the int8 copy is dropped):
 * data itself where it stays (borrow: the model's slices), else a copy.
 * Touches only lin->packed, packed_borrowed and upk, so it may run beside
 * the fills of the linear's other pieces. q8 tensors have no packed form:
 * nothing kept. */
int pl_weights_keep_bytes(struct infer_linear *lin, const struct format_tensor_info *t,
                          const uint8_t *data, int borrow, struct sl_err *err)
{
    if (t->encoding == FORMAT_ENC_Q8_CHANNEL ||
        !format_encoding_traits(t->encoding)->quantized || lin->upk)
        return 0;
    /* large tensors in transparent huge pages, as the NPU's weights
     * (npu_gemm.c): the copy faults 2 MiB at a time, and freeing is cheaper */
    const uintptr_t huge = (uintptr_t)2 << 20;
    uint8_t *bytes = borrow ? (uint8_t *)data
                            : sl_alloc_aligned(t->length, t->length >= huge ? huge : 64);
    struct unpack_tensor *u = sl_calloc(1, sizeof *u);
    if (!bytes || !u) {
        if (!borrow)
            sl_free_aligned(bytes);
        free(u);
        sl_err_set(err, "out of memory keeping '%s' packed", t->name);
        return -ENOMEM;
    }
    if (!borrow) {
        uintptr_t lo = ((uintptr_t)bytes + huge - 1) & ~(huge - 1);
        uintptr_t hi = ((uintptr_t)bytes + t->length) & ~(huge - 1);
        if (hi > lo)
            (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* advice: failure changes nothing */
        memcpy(bytes, data, t->length);
    }
    int ret = unpack_tensor_init(u, t->encoding, bytes, t->length, t->shape[0], t->shape[1], err);
    if (ret < 0) {
        if (!borrow)
            sl_free_aligned(bytes);
        free(u);
        sl_err_prefix(err, "tensor '%s'", t->name);
        return ret;
    }
    lin->packed = bytes;
    lin->packed_borrowed = borrow;
    lin->upk = u;
    return 0;
}

int pl_weights_decode_norm(const struct format_tensor_info *t, const uint8_t *data, float **out)
{
    *out = sl_malloc(sizeof(float) * t->shape[0]);
    if (!*out)
        return -ENOMEM;
    return format_decode_float(t->encoding, data, *out, t->shape[0]);
}
