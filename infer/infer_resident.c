/* infer_resident.c: decoding straight from packed weights (`--resident
 * packed`): the packed linear path (the codes unpacked in registers by
 * unpack_tensor_dot, output channels split between the session's NPU device
 * thread and the calling thread), and dropping the int8 copies a cold start
 * used for its prefill. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "infer_internal.h"
#include "npu.h"
#include "unpack.h"

static const char *const resident_names[] = {"int8", "packed", "auto"};

const char *infer_resident_name(enum infer_resident r)
{
    return (unsigned)r < 3 ? resident_names[r] : "unknown";
}

int infer_resident_parse(const char *s, enum infer_resident *out)
{
    for (int i = 0; i < 3; i++)
        if (s && !strcmp(s, resident_names[i])) {
            *out = (enum infer_resident)i;
            return 0;
        }
    return -EINVAL;
}

enum infer_resident infer_resident_resolve(enum infer_resident res, const struct format_reader *r,
                                           int no_shadow)
{
    if (res != INFER_RESIDENT_AUTO)
        return res;
    const void *v;
    size_t len;
    if (!no_shadow && format_reader_meta_get(r, FORMAT_SHADOW_META_KEY, &v, &len) == 0)
        return INFER_RESIDENT_INT8;
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0)
        llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (llc <= 0)
        llc = 32l << 20;
    uint64_t int8 = 0;
    for (uint32_t i = 0; i < format_reader_n_tensors(r); i++) {
        const struct format_tensor_info *t = format_reader_tensor(r, i);
        if (t->n_dims == 2 && format_encoding_traits(t->encoding)->quantized)
            int8 += t->shape[0] * t->shape[1];
    }
    return int8 > (uint64_t)llc ? INFER_RESIDENT_PACKED : INFER_RESIDENT_INT8;
}

/* Every linear of the model, tied classifier once. */
static int linears(struct infer_model *m, struct infer_linear **out, int cap)
{
    int n = 0;
    if (cap < 2)
        return 0;
    out[n++] = &m->embed;
    out[n++] = &m->cls_own;
    for (uint32_t l = 0; m->layers && l < m->cfg.n_layers && n + 7 <= cap; l++) {
        struct infer_layer *y = &m->layers[l];
        struct infer_linear *ls[7] = {&y->wq, &y->wk, &y->wv, &y->wo,
                                      &y->w_gate, &y->w_up, &y->w_down};
        for (int i = 0; i < 7; i++)
            out[n++] = ls[i];
    }
    return n;
}

#define MAX_LINEARS (2 + 7 * 4096)

size_t infer_model_drop_int8(struct infer_model *m)
{
    struct infer_linear **ls = malloc(sizeof *ls * MAX_LINEARS);
    if (!ls)
        return 0; /* nothing dropped: the int8 copies keep working */
    int n = linears(m, ls, MAX_LINEARS);
    size_t freed = 0;
    for (int i = 0; i < n; i++)
        if (ls[i]->upk && ls[i]->npu) {
            freed += npu_weights_bytes(ls[i]->npu);
            npu_weights_destroy(ls[i]->npu);
            ls[i]->npu = NULL;
        }
    free(ls);
    return freed;
}

void infer_model_weight_bytes(const struct infer_model *m, size_t *int8_bytes,
                              size_t *packed_bytes)
{
    *int8_bytes = *packed_bytes = 0;
    struct infer_linear **ls = malloc(sizeof *ls * MAX_LINEARS);
    if (!ls)
        return;
    int n = linears((struct infer_model *)m, ls, MAX_LINEARS);
    for (int i = 0; i < n; i++) {
        if (ls[i]->npu)
            *int8_bytes += npu_weights_bytes(ls[i]->npu);
        if (ls[i]->upk)
            *packed_bytes += ls[i]->upk->layout.data - (const uint8_t *)ls[i]->packed +
                             ls[i]->upk->layout.data_len;
    }
    free(ls);
}

/* Output channels [r0, r1) of a packed linear for n rows: y[i * ldy + r] =
 * (act * scale[r]) * acc, the int8 path's formula (npu.h), so the floats
 * are the same. acc: [n][rows] scratch (only [r0, r1) of each row used). */
struct packed_part {
    const struct infer_linear *lin;
    const int8_t *xq;
    uint32_t n, r0, r1;
    float act;
    float *y;
    int32_t *acc;
    struct infer_rows_tile **tile; /* this thread's tile scratch (a few rows) */
};

/* From this many rows, a packed linear unpacks its codes once for all rows
 * (infer_resident_rows.c) rather than once per row. */
#define PACKED_ROWS_MIN 4

static int packed_part_run(void *arg)
{
    const struct packed_part *p = arg;
    const struct infer_linear *lin = p->lin;
    if (p->r1 <= p->r0)
        return 0;
    if (p->n >= PACKED_ROWS_MIN) {
        int r = infer_packed_rows(p->tile, lin, p->xq, p->n, p->act, p->y, p->r0, p->r1);
        if (r != -ERANGE) /* -ERANGE: a code the NPU's layout cannot hold */
            return r;
    }
    int ret = unpack_tensor_dot(lin->upk, unpack_kernel_best(), p->r0, p->r1, p->xq, p->n,
                                p->acc + p->r0, lin->rows);
    if (ret < 0)
        return ret;
    for (uint32_t i = 0; i < p->n; i++)
        for (uint32_t r = p->r0; r < p->r1; r++) {
            float s = p->act * unpack_tensor_scale(lin->upk, r);
            p->y[(size_t)i * lin->rows + r] = s * (float)p->acc[(size_t)i * lin->rows + r];
        }
    return 0;
}

int infer_linear_packed(struct infer_state *s, const struct infer_linear *lin, const int8_t *xq,
                        uint32_t n, float act, float *y, struct sl_err *err)
{
    size_t need = (size_t)n * lin->rows;
    if (need > s->acc_cap) {
        int32_t *a = sl_realloc(s->acc, need * sizeof *a);
        if (!a) {
            sl_err_set(err, "out of memory for a packed matmul's sums");
            return -ENOMEM;
        }
        s->acc = a;
        s->acc_cap = need;
    }
    uint32_t rows = lin->rows, r_npu = 0;
    if (s->dev && rows >= 32 && infer_split_work(s, lin, n) >= s->npu_min_weights)
        r_npu = (uint32_t)(rows * s->npu_share) / 16 * 16;
    struct packed_part dev = {lin, xq, n, 0, r_npu, act, y, s->acc, &s->rows_tile[1]};
    struct packed_part own = {lin, xq, n, r_npu, rows, act, y, s->acc, &s->rows_tile[0]};
    struct npu_ticket *t = NULL;
    int ret = 0;
    if (r_npu > 0 && (ret = npu_device_call(s->dev, packed_part_run, &dev, &t, err)) < 0)
        return ret;
    ret = packed_part_run(&own);
    int ret_dev = t ? npu_ticket_wait(t) : 0;
    if (ret == 0 && ret_dev < 0)
        ret = ret_dev;
    if (ret < 0) {
        sl_err_set(err, "a packed matmul (%u x %u) failed (%s)", rows, lin->cols, strerror(-ret));
        return ret;
    }
    if (t)
        s->npu_jobs++;
    return 0;
}
