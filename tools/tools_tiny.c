/* tools_tiny.c: the prefill operations of the int8 kernel's tiny step
 * (tools_tiny.h). */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "format.h"
#include "tools_tiny.h"
#include "unpack.h"

int tools_tiny_ops(const char *model, enum npu_kernel k, uint32_t n, double *full,
                   double *required, struct sl_err *err)
{
    *full = *required = 0;
    if (npu_gemm_tiny_rows(k, (const int8_t[16]){0}, 1, 16) == 0)
        return 0; /* no tiny step: nothing to count (a zero row is tiny) */
    struct format_reader *r;
    int rc = format_reader_open(model, &r, err);
    if (rc < 0)
        return rc;
    const uint32_t last = format_reader_config(r)->n_layers - 1;
    void *data = NULL;
    int8_t *q = NULL;
    float *scale = NULL;
    for (uint32_t i = 0; rc == 0 && i < format_reader_n_tensors(r); i++) {
        const struct format_tensor_info *t = format_reader_tensor(r, i);
        if (t->layer < 0 || t->n_dims != 2 || !format_role_is_linear((enum format_role)t->role) ||
            !format_encoding_traits(t->encoding) || !format_encoding_traits(t->encoding)->quantized)
            continue;
        const uint32_t rows = (uint32_t)t->shape[0], cols = (uint32_t)t->shape[1];
        free(data);
        free(q);
        free(scale);
        data = malloc(t->length ? t->length : 1);
        q = malloc((size_t)rows * cols);
        scale = malloc(sizeof(float) * rows);
        if (!data || !q || !scale) {
            sl_err_set(err, "%s: out of memory for tensor %s", model, t->name);
            rc = -ENOMEM;
            break;
        }
        ssize_t got = pread(format_reader_fd(r), data, t->length, (off_t)t->offset);
        if (got != (ssize_t)t->length) {
            rc = got < 0 ? -errno : -EIO;
            sl_err_set(err, "%s: cannot read tensor %s", model, t->name);
            break;
        }
        if (unpack_tensor_int8(t, data, q, scale, err) < 0) {
            rc = -EINVAL; /* a float or malformed tensor: err says which */
            break;
        }
        const double ops = 2.0 * npu_gemm_tiny_rows(k, q, rows, cols) * cols;
        const int kv = t->role == FORMAT_ROLE_WK || t->role == FORMAT_ROLE_WV;
        *full += ops * n;
        *required += ops * ((uint32_t)t->layer == last && !kv ? 1 : n);
    }
    free(data);
    free(q);
    free(scale);
    format_reader_close(r);
    return rc;
}
