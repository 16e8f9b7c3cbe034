/* infer_model.c: loading a container's tensors into the runtime's structs,
 * whole or layer by layer, and the sequence state (KV cache, scratch). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "infer_internal.h"

/* Finds tensor (layer, role) and makes its verified bytes available at *buf:
 * a view into the read-only mapping of the container (no copy; pages come
 * from the page cache and can be dropped again under memory pressure), or,
 * where the file cannot be mapped, the model's reusable read buffer (valid
 * until the next read). *mapped tells which. */
static int read_tensor(struct infer_model *m, int layer, uint32_t role,
                       const struct format_tensor_info **ti, const void **buf, int *mapped,
                       struct sl_err *err)
{
    int i = format_reader_find(m->reader, layer, role);
    if (i < 0) {
        sl_err_set(err, "%s: no %s tensor for layer %d", format_reader_path(m->reader),
                   format_role_name(role), layer);
        return -EINVAL;
    }
    *ti = format_reader_tensor(m->reader, (uint32_t)i);
    if (m->map) {
        /* the reader checked offset + length against the file size at open */
        *buf = (const char *)m->map + (*ti)->offset;
        *mapped = 1;
        return format_tensor_verify(m->reader, (uint32_t)i, *buf, err);
    }
    if ((*ti)->length > m->io_cap) {
        void *nb = sl_realloc(m->io_buf, (*ti)->length);
        if (!nb) {
            sl_err_set(err, "%s: out of memory reading '%s'", format_reader_path(m->reader),
                       (*ti)->name);
            return -ENOMEM;
        }
        m->io_buf = nb;
        m->io_cap = (*ti)->length;
    }
    *buf = m->io_buf;
    *mapped = 0;
    return format_reader_read_tensor(m->reader, (uint32_t)i, m->io_buf, (*ti)->length, err);
}

static int load_norm(struct infer_model *m, int layer, uint32_t role, float **out,
                     struct sl_err *err)
{
    const struct format_tensor_info *t;
    const void *buf;
    int mapped;
    int ret = read_tensor(m, layer, role, &t, &buf, &mapped, err);
    if (ret < 0)
        return ret;
    *out = sl_malloc(sizeof(float) * m->cfg.dim);
    if (!*out) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    ret = format_decode_float(t->encoding, buf, *out, m->cfg.dim);
    if (ret < 0)
        sl_err_set(err, "%s: norm '%s' is not stored as float", format_reader_path(m->reader),
                   t->name);
    return ret;
}

static int load_linear(struct infer_model *m, int layer, uint32_t role, struct infer_linear *lin,
                       struct sl_err *err)
{
    const struct format_tensor_info *t;
    const void *buf;
    int mapped;
    int ret = read_tensor(m, layer, role, &t, &buf, &mapped, err);
    if (ret < 0)
        return ret;
    ret = infer_linear_init(lin, t, buf, mapped, m->force_dynamic_act, err);
    if (ret < 0)
        sl_err_prefix(err, "%s", format_reader_path(m->reader));
    return ret;
}

void infer_model_release_layer(struct infer_model *m, int layer)
{
    if (layer < 0) {
        infer_linear_fini(&m->cls_own); /* empty when tied */
        infer_linear_fini(&m->embed);
        free(m->out_norm);
        m->out_norm = NULL;
        m->globals_loaded = 0;
        return;
    }
    struct infer_layer *l = &m->layers[layer];
    free(l->attn_norm);
    free(l->ffn_norm);
    infer_linear_fini(&l->wq);
    infer_linear_fini(&l->wk);
    infer_linear_fini(&l->wv);
    infer_linear_fini(&l->wo);
    infer_linear_fini(&l->w_gate);
    infer_linear_fini(&l->w_up);
    infer_linear_fini(&l->w_down);
    memset(l, 0, sizeof *l);
}

int infer_model_load_layer(struct infer_model *m, int layer, struct sl_err *err)
{
    int ret;
    if (layer < 0) {
        if (m->globals_loaded)
            return 0;
        ret = load_linear(m, -1, FORMAT_ROLE_TOK_EMBD, &m->embed, err);
        if (!ret)
            ret = load_norm(m, -1, FORMAT_ROLE_OUT_NORM, &m->out_norm, err);
        if (!ret) {
            if (!m->cfg.tied_embedding) /* tied: m->cls is the embedding */
                ret = load_linear(m, -1, FORMAT_ROLE_CLASSIFIER, &m->cls_own, err);
        }
        if (ret < 0)
            infer_model_release_layer(m, -1);
        else
            m->globals_loaded = 1;
        return ret;
    }
    if ((uint32_t)layer >= m->cfg.n_layers) {
        sl_err_set(err, "layer %d outside the model's %u", layer, m->cfg.n_layers);
        return -EINVAL;
    }
    struct infer_layer *l = &m->layers[layer];
    if (l->loaded)
        return 0;
    ret = load_norm(m, layer, FORMAT_ROLE_ATTN_NORM, &l->attn_norm, err);
    if (!ret)
        ret = load_linear(m, layer, FORMAT_ROLE_WQ, &l->wq, err);
    if (!ret)
        ret = load_linear(m, layer, FORMAT_ROLE_WK, &l->wk, err);
    if (!ret)
        ret = load_linear(m, layer, FORMAT_ROLE_WV, &l->wv, err);
    if (!ret)
        ret = load_linear(m, layer, FORMAT_ROLE_WO, &l->wo, err);
    if (!ret)
        ret = load_norm(m, layer, FORMAT_ROLE_FFN_NORM, &l->ffn_norm, err);
    if (!ret)
        ret = load_linear(m, layer, FORMAT_ROLE_W_GATE, &l->w_gate, err);
    if (!ret)
        ret = load_linear(m, layer, FORMAT_ROLE_W_UP, &l->w_up, err);
    if (!ret)
        ret = load_linear(m, layer, FORMAT_ROLE_W_DOWN, &l->w_down, err);
    if (ret < 0)
        infer_model_release_layer(m, layer);
    else
        l->loaded = 1;
    return ret;
}

int infer_model_load(const char *path, const struct infer_load_opts *opts, struct infer_model **out,
                     struct sl_err *err)
{
    struct infer_model *m = sl_calloc(1, sizeof *m);
    if (!m) {
        sl_err_set(err, "%s: out of memory", path);
        return -ENOMEM;
    }
    int ret = 0;
    if (opts && opts->reader) /* open already: its index is not decoded again */
        m->reader = format_reader_ref(opts->reader);
    else
        ret = format_reader_open(path, &m->reader, err);
    if (ret < 0) {
        free(m);
        return ret;
    }
    m->cfg = *format_reader_config(m->reader);
    m->cls = m->cfg.tied_embedding ? &m->embed : &m->cls_own;
    /* Map the whole container read-only: float weights are used in place.
     * If mapping fails (a file system without mmap), tensors are read. */
    if (!(opts && opts->no_mmap)) {
        m->map_len = (size_t)format_reader_file_size(m->reader);
        m->map = mmap(NULL, m->map_len, PROT_READ, MAP_SHARED, format_reader_fd(m->reader), 0);
        if (m->map == MAP_FAILED)
            m->map = NULL;
    }
    m->force_dynamic_act = opts && opts->force_dynamic_act;
    m->layers = sl_calloc(m->cfg.n_layers, sizeof *m->layers);
    if (!m->layers) {
        sl_err_set(err, "%s: out of memory", path);
        infer_model_destroy(m);
        return -ENOMEM;
    }
    if (!(opts && opts->lazy)) {
        ret = infer_model_load_layer(m, -1, err);
        for (uint32_t l = 0; ret == 0 && l < m->cfg.n_layers; l++)
            ret = infer_model_load_layer(m, (int)l, err);
        if (ret < 0) {
            infer_model_destroy(m);
            return ret;
        }
        free(m->io_buf); /* lazy models keep it for the next layer */
        m->io_buf = NULL;
        m->io_cap = 0;
    }
    *out = m;
    return 0;
}

void infer_model_destroy(struct infer_model *m)
{
    if (!m)
        return;
    infer_shadow_destroy(m->shadow);
    if (m->layers)
        for (uint32_t l = 0; l < m->cfg.n_layers; l++)
            infer_model_release_layer(m, (int)l);
    infer_model_release_layer(m, -1);
    if (m->slices_mapped) /* after the linears that point into it */
        munmap(m->slices, m->slices_mapped);
    else
        sl_free_aligned(m->slices);
    free(m->layers);
    free(m->io_buf);
    if (m->map)
        munmap(m->map, m->map_len);
    format_reader_close(m->reader);
    free(m);
}

const struct format_config *infer_model_config(const struct infer_model *m)
{
    return &m->cfg;
}
const struct format_reader *infer_model_reader(const struct infer_model *m)
{
    return m->reader;
}

int infer_model_is_quantized(const struct infer_model *m)
{
    for (uint32_t i = 0; i < format_reader_n_tensors(m->reader); i++) {
        const struct format_tensor_info *t = format_reader_tensor(m->reader, i);
        if (format_encoding_traits(t->encoding)->quantized)
            return 1;
    }
    return 0;
}

void infer_model_set_observer(struct infer_model *m, infer_observe_fn fn, void *ctx)
{
    m->observe = fn;
    m->observe_ctx = ctx;
}

/* ---- state ------------------------------------------------------------------------ */

int infer_state_create(const struct infer_model *m, uint32_t max_batch, struct infer_state **out,
                       struct sl_err *err)
{
    const struct format_config *c = &m->cfg;
    if (max_batch == 0)
        max_batch = 1;
    struct infer_state *s = sl_calloc(1, sizeof *s);
    if (!s) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    int ret = infer_kv_create(c, 0, 0, &s->kv, err);
    if (ret < 0) {
        free(s);
        return ret;
    }
    s->attn = &infer_attention_dense;
    s->npu_share = 0.5;
    s->npu_min_weights = 1u << 20;
    size_t q = (size_t)c->n_heads * c->head_dim, kv = (size_t)c->n_kv_heads * c->head_dim;
    size_t wide = c->dim > q ? c->dim : q;
    size_t widest = wide > c->hidden_dim ? wide : c->hidden_dim;
    size_t nb = max_batch;
    s->max_batch = max_batch;
    /* 64-byte aligned: malloc gives 16 (a large block is mmap'ed behind a
     * 16-byte header), and then every 64-byte vector load of an activation
     * row by the AVX-512 kernels splits a cache line */
    s->x = sl_alloc_aligned(nb * c->dim * sizeof(float), 64);
    s->xb = sl_alloc_aligned(nb * wide * sizeof(float), 64);
    s->q = sl_alloc_aligned(nb * q * sizeof(float), 64);
    s->k = sl_alloc_aligned(nb * kv * sizeof(float), 64);
    s->v = sl_alloc_aligned(nb * kv * sizeof(float), 64);
    s->att_out = sl_alloc_aligned(nb * q * sizeof(float), 64);
    s->att = sl_alloc_aligned((size_t)INFER_ATT_ROWS * c->seq_len * sizeof(float), 64);
    s->hb = sl_alloc_aligned(nb * c->hidden_dim * sizeof(float), 64);
    s->hb2 = sl_alloc_aligned(nb * c->hidden_dim * sizeof(float), 64);
    s->xq = sl_alloc_aligned(nb * widest, 64);
    s->pos = sl_malloc(nb * sizeof *s->pos);
    if (!s->x || !s->xb || !s->q || !s->k || !s->v || !s->att_out || !s->att || !s->hb ||
        !s->hb2 || !s->xq || !s->pos) {
        infer_state_destroy(s);
        sl_err_set(err, "out of memory for the scratch of %u-row batches", max_batch);
        return -ENOMEM;
    }
    *out = s;
    return 0;
}

void infer_state_destroy(struct infer_state *s)
{
    if (!s)
        return;
    infer_kv_destroy(s->kv);
    sl_free_aligned(s->x);
    sl_free_aligned(s->xb);
    sl_free_aligned(s->q);
    sl_free_aligned(s->k);
    sl_free_aligned(s->v);
    sl_free_aligned(s->att_out);
    sl_free_aligned(s->att);
    sl_free_aligned(s->att_dev);
    sl_free_aligned(s->tree);
    sl_free_aligned(s->hb);
    sl_free_aligned(s->hb2);
    sl_free_aligned(s->xq);
    free(s->pos);
    free(s->clip_row);
    free(s->clip_col);
    free(s->clip_excess);
    free(s->acc);
    free(s->xq_group);
    sl_free_aligned(s->stage);
    infer_rows_tile_free(s->rows_tile[0]);
    infer_rows_tile_free(s->rows_tile[1]);
    sl_free_aligned(s->tiles_stage);
    free(s);
}

struct infer_kv *infer_state_kv(struct infer_state *s)
{
    return s->kv;
}

void infer_state_set_attention(struct infer_state *s, const struct infer_attention *a)
{
    s->attn = a ? a : &infer_attention_dense;
}
