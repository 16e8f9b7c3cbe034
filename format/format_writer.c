/* format_writer.c: streams a container to a temporary file, then fsyncs and
 * renames it into place (docs/FORMAT.md). Tensors are written as they are
 * added, so memory stays bounded whatever the model size. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>
#include <zstd.h>

#include "format_internal.h"

struct meta_kv {
    char *key;
    uint8_t *val;
    size_t len;
};

struct format_writer {
    char *path;
    char tmp[PATH_MAX];
    int fd;
    int finished;
    int have_config;
    int failed;             /* a write error happened: finish refuses */
    int tables;             /* a packed tensor with block multipliers: version 3 */
    struct format_config cfg;

    /* tokenizer (owned copy) */
    uint32_t tok_n, tok_max;
    float *tok_scores;
    uint32_t *tok_lens;
    char **tok_strs;

    struct meta_kv *kv;
    size_t n_kv, cap_kv;

    struct format_tensor_info *tensors;
    uint32_t n_tensors, cap_tensors;
    struct format_slice_info *slices;
    uint32_t n_slices, cap_slices;

    uint64_t pos;           /* current end of data (absolute) */
    int slice_open;
    XXH3_state_t *slice_state;
    int last_rank;          /* exec rank of the previous tensor in the open slice */
};

static int write_all(struct format_writer *w, uint64_t off, const void *buf, uint64_t len,
                     struct sl_err *err)
{
    const uint8_t *p = buf;
    while (len > 0) {
        size_t n = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t k = pwrite(w->fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            sl_err_set(err, "%s: write failed at offset %" PRIu64 ": %s", w->tmp, off,
                       strerror(e));
            w->failed = 1;
            return -e;
        }
        p += k;
        off += (uint64_t)k;
        len -= (uint64_t)k;
    }
    return 0;
}

/* Appends `len` zero bytes at w->pos, feeding the open slice's checksum. */
static int write_zeros(struct format_writer *w, uint64_t len, struct sl_err *err)
{
    static const uint8_t zeros[4096];
    while (len > 0) {
        uint64_t n = len > sizeof zeros ? sizeof zeros : len;
        int ret = write_all(w, w->pos, zeros, n, err);
        if (ret < 0)
            return ret;
        if (w->slice_open)
            XXH3_64bits_update(w->slice_state, zeros, (size_t)n);
        w->pos += n;
        len -= n;
    }
    return 0;
}

int format_writer_create(const char *path, struct format_writer **out, struct sl_err *err)
{
    struct format_writer *w = calloc(1, sizeof *w);
    if (!w) {
        sl_err_set(err, "%s: out of memory", path);
        return -ENOMEM;
    }
    w->fd = -1;
    w->path = strdup(path);
    w->slice_state = XXH3_createState();
    if (!w->path || !w->slice_state) {
        sl_err_set(err, "%s: out of memory", path);
        goto fail;
    }
    int n = snprintf(w->tmp, sizeof w->tmp, "%s.tmp.XXXXXX", path);
    if (n < 0 || (size_t)n >= sizeof w->tmp) {
        sl_err_set(err, "%s: path too long", path);
        free(w->path);
        XXH3_freeState(w->slice_state);
        free(w);
        return -ENAMETOOLONG;
    }
    w->fd = mkstemp(w->tmp);
    if (w->fd < 0) {
        int e = errno;
        sl_err_set(err, "%s: cannot create a temporary file next to it: %s", path, strerror(e));
        free(w->path);
        XXH3_freeState(w->slice_state);
        free(w);
        return -e;
    }
    /* mkstemp makes 0600; a model file is readable by all, like cp's result. */
    (void)fchmod(w->fd, 0644);
    w->pos = FMT_HEADER_SIZE;
    *out = w;
    return 0;
fail:
    free(w->path);
    XXH3_freeState(w->slice_state);
    free(w);
    return -ENOMEM;
}

int format_writer_set_config(struct format_writer *w, const struct format_config *cfg,
                             struct sl_err *err)
{
    if (w->n_tensors > 0) {
        sl_err_set(err, "%s: the config must be set before the first tensor", w->path);
        return -EINVAL;
    }
    int ret = format_config_validate(cfg, w->path, err);
    if (ret < 0)
        return ret;
    w->cfg = *cfg;
    w->have_config = 1;
    return 0;
}

static void free_tokenizer(struct format_writer *w)
{
    if (w->tok_strs)
        for (uint32_t i = 0; i < w->tok_n; i++)
            free(w->tok_strs[i]);
    free(w->tok_strs);
    free(w->tok_scores);
    free(w->tok_lens);
    w->tok_strs = NULL;
    w->tok_scores = NULL;
    w->tok_lens = NULL;
    w->tok_n = 0;
}

int format_writer_set_tokenizer(struct format_writer *w, const struct format_tokenizer *tok,
                                struct sl_err *err)
{
    free_tokenizer(w);
    if (tok->n_tokens == 0 || tok->n_tokens > (1u << 24)) {
        sl_err_set(err, "%s: tokenizer with %u tokens", w->path, tok->n_tokens);
        return -EINVAL;
    }
    w->tok_scores = malloc(sizeof(float) * tok->n_tokens);
    w->tok_lens = malloc(sizeof(uint32_t) * tok->n_tokens);
    w->tok_strs = calloc(tok->n_tokens, sizeof(char *));
    if (!w->tok_scores || !w->tok_lens || !w->tok_strs)
        goto nomem;
    w->tok_n = tok->n_tokens;
    w->tok_max = 0;
    for (uint32_t i = 0; i < tok->n_tokens; i++) {
        uint32_t len = tok->lens[i];
        if (len > 65535) {
            sl_err_set(err, "%s: token %u is %u bytes long", w->path, i, len);
            free_tokenizer(w);
            return -EINVAL;
        }
        w->tok_scores[i] = tok->scores[i];
        w->tok_lens[i] = len;
        w->tok_strs[i] = malloc(len + 1);
        if (!w->tok_strs[i])
            goto nomem;
        memcpy(w->tok_strs[i], tok->tokens[i], len);
        w->tok_strs[i][len] = 0;
        if (len > w->tok_max)
            w->tok_max = len;
    }
    if (tok->max_token_len > w->tok_max)
        w->tok_max = tok->max_token_len;
    return 0;
nomem:
    free_tokenizer(w);
    sl_err_set(err, "%s: out of memory copying the tokenizer", w->path);
    return -ENOMEM;
}

int format_writer_set_meta(struct format_writer *w, const char *key, const void *value,
                           size_t len, struct sl_err *err)
{
    size_t klen = strlen(key);
    if (klen == 0 || klen > FMT_MAX_KEY) {
        sl_err_set(err, "%s: metadata key of %zu bytes (1..255 allowed)", w->path, klen);
        return -EINVAL;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) {
        sl_err_set(err, "%s: out of memory", w->path);
        return -ENOMEM;
    }
    if (len)
        memcpy(copy, value, len);
    for (size_t i = 0; i < w->n_kv; i++) {
        if (!strcmp(w->kv[i].key, key)) {
            free(w->kv[i].val);
            w->kv[i].val = copy;
            w->kv[i].len = len;
            return 0;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        struct meta_kv *kv = realloc(w->kv, cap * sizeof *kv);
        if (!kv) {
            free(copy);
            sl_err_set(err, "%s: out of memory", w->path);
            return -ENOMEM;
        }
        w->kv = kv;
        w->cap_kv = cap;
    }
    w->kv[w->n_kv].key = strdup(key);
    if (!w->kv[w->n_kv].key) {
        free(copy);
        sl_err_set(err, "%s: out of memory", w->path);
        return -ENOMEM;
    }
    w->kv[w->n_kv].val = copy;
    w->kv[w->n_kv].len = len;
    w->n_kv++;
    return 0;
}

static int close_slice(struct format_writer *w, struct sl_err *err)
{
    if (!w->slice_open)
        return 0;
    struct format_slice_info *s = &w->slices[w->n_slices - 1];
    int ret = write_zeros(w, sl_align_up(w->pos, FORMAT_ALIGN) - w->pos, err);
    if (ret < 0)
        return ret;
    s->length = w->pos - s->offset;
    s->checksum = XXH3_64bits_digest(w->slice_state);
    w->slice_open = 0;
    return 0;
}

/* Position of a slice in execution order: embedding, layers, head. */
static int64_t slice_order(uint32_t kind, int32_t layer)
{
    if (kind == FORMAT_SLICE_EMBED)
        return -1;
    if (kind == FORMAT_SLICE_LAYER)
        return layer;
    return INT32_MAX;
}

static int open_slice(struct format_writer *w, uint32_t kind, int32_t layer, struct sl_err *err)
{
    if (w->n_slices == w->cap_slices) {
        uint32_t cap = w->cap_slices ? 2 * w->cap_slices : 64;
        struct format_slice_info *s = realloc(w->slices, cap * sizeof *s);
        if (!s) {
            sl_err_set(err, "%s: out of memory", w->path);
            return -ENOMEM;
        }
        w->slices = s;
        w->cap_slices = cap;
    }
    struct format_slice_info *s = &w->slices[w->n_slices++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->layer = kind == FORMAT_SLICE_LAYER ? layer : -1;
    s->offset = w->pos; /* aligned: the previous slice was padded */
    s->first_tensor = w->n_tensors;
    XXH3_64bits_reset(w->slice_state);
    w->slice_open = 1;
    w->last_rank = -1;
    return 0;
}

int format_writer_add_tensor(struct format_writer *w, const struct format_tensor_desc *d,
                             const void *data, uint64_t len, struct sl_err *err)
{
    int ret;
    if (!w->have_config) {
        sl_err_set(err, "%s: set the config before adding tensors", w->path);
        return -EINVAL;
    }
    if (w->failed || w->finished) {
        sl_err_set(err, "%s: writer is no longer usable", w->path);
        return -EINVAL;
    }
    if (!d->name || strlen(d->name) == 0 || strlen(d->name) >= FORMAT_NAME_MAX) {
        sl_err_set(err, "%s: tensor name missing or longer than %d bytes", w->path,
                   FORMAT_NAME_MAX - 1);
        return -EINVAL;
    }
    for (uint32_t i = 0; i < w->n_tensors; i++) {
        if (!strcmp(w->tensors[i].name, d->name)) {
            sl_err_set(err, "%s: tensor '%s' added twice", w->path, d->name);
            return -EINVAL;
        }
        if (w->tensors[i].layer == d->layer && w->tensors[i].role == d->role) {
            sl_err_set(err, "%s: tensor '%s' repeats %s of layer %d", w->path, d->name,
                       format_role_name(d->role), d->layer);
            return -EINVAL;
        }
    }
    if (d->encoding == FORMAT_ENC_ADAPTIVE && len >= 8 && sl_load_le32((const uint8_t *)data + 4) == 2)
        w->tables = 1; /* header version 2 (docs/FORMAT-packed.md) */
    ret = fmt_check_tensor_meta(&w->cfg, d->name, d->layer, d->role, d->encoding, d->n_dims,
                                d->shape, len, d->act_scale, w->path, err);
    if (ret < 0)
        return ret;
    const struct format_encoding_traits *t = format_encoding_traits(d->encoding);
    if (t->validate) {
        uint64_t cols = d->n_dims == 2 ? d->shape[1] : 1;
        ret = t->validate(data, len, d->shape[0], cols, err);
        if (ret < 0) {
            sl_err_prefix(err, "%s: tensor '%s'", w->path, d->name);
            return ret;
        }
    }

    uint32_t kind = fmt_tensor_slice_kind(&w->cfg, d->layer, d->role);
    int32_t layer = kind == FORMAT_SLICE_LAYER ? d->layer : -1;
    int rank = fmt_exec_rank(d->role);
    if (!w->slice_open || w->slices[w->n_slices - 1].kind != kind ||
        w->slices[w->n_slices - 1].layer != layer) {
        if (w->n_slices > 0) {
            const struct format_slice_info *prev = &w->slices[w->n_slices - 1];
            if (slice_order(kind, layer) <= slice_order(prev->kind, prev->layer)) {
                sl_err_set(err, "%s: tensor '%s' is out of execution order (embedding, layers "
                                "0..%u, head)", w->path, d->name, w->cfg.n_layers - 1);
                return -EINVAL;
            }
        }
        ret = close_slice(w, err);
        if (ret == 0)
            ret = open_slice(w, kind, layer, err);
        if (ret < 0)
            return ret;
    } else if (rank <= w->last_rank) {
        sl_err_set(err, "%s: tensor '%s' (%s) is out of execution order within its slice",
                   w->path, d->name, format_role_name(d->role));
        return -EINVAL;
    }

    if (w->n_tensors == w->cap_tensors) {
        uint32_t cap = w->cap_tensors ? 2 * w->cap_tensors : 256;
        struct format_tensor_info *ti = realloc(w->tensors, cap * sizeof *ti);
        if (!ti) {
            sl_err_set(err, "%s: out of memory", w->path);
            return -ENOMEM;
        }
        w->tensors = ti;
        w->cap_tensors = cap;
    }
    ret = write_zeros(w, sl_align_up(w->pos, FORMAT_TENSOR_ALIGN) - w->pos, err);
    if (ret < 0)
        return ret;
    ret = write_all(w, w->pos, data, len, err);
    if (ret < 0)
        return ret;
    XXH3_64bits_update(w->slice_state, data, (size_t)len);

    struct format_tensor_info *ti = &w->tensors[w->n_tensors++];
    memset(ti, 0, sizeof *ti);
    snprintf(ti->name, sizeof ti->name, "%s", d->name);
    ti->layer = d->layer;
    ti->role = d->role;
    ti->encoding = d->encoding;
    ti->n_dims = d->n_dims;
    memcpy(ti->shape, d->shape, sizeof ti->shape);
    ti->offset = w->pos;
    ti->length = len;
    ti->checksum = format_checksum(data, (size_t)len);
    ti->act_scale = d->act_scale;
    memcpy(ti->bits_hist, d->bits_hist, sizeof ti->bits_hist);
    ti->slice = w->n_slices - 1;
    w->slices[w->n_slices - 1].n_tensors++;
    w->pos += len;
    w->last_rank = rank;
    return 0;
}

/* Metadata block before compression (docs/FORMAT.md "Metadata"). */
static uint8_t *build_meta(const struct format_writer *w, uint64_t *out_len)
{
    uint64_t len = 12;
    for (uint32_t i = 0; i < w->tok_n; i++)
        len += 8 + w->tok_lens[i];
    len += 4;
    for (size_t i = 0; i < w->n_kv; i++)
        len += 2 + strlen(w->kv[i].key) + 8 + w->kv[i].len;
    uint8_t *buf = malloc(len);
    if (!buf)
        return NULL;
    uint8_t *p = buf;
    sl_store_le32(p, w->tok_n);
    sl_store_le32(p + 4, w->tok_max);
    sl_store_le32(p + 8, 0); /* reserved */
    p += 12;
    for (uint32_t i = 0; i < w->tok_n; i++) {
        sl_store_lef32(p, w->tok_scores[i]);
        sl_store_le32(p + 4, w->tok_lens[i]);
        memcpy(p + 8, w->tok_strs[i], w->tok_lens[i]);
        p += 8 + w->tok_lens[i];
    }
    sl_store_le32(p, (uint32_t)w->n_kv);
    p += 4;
    for (size_t i = 0; i < w->n_kv; i++) {
        size_t kl = strlen(w->kv[i].key);
        sl_store_le16(p, (uint16_t)kl);
        memcpy(p + 2, w->kv[i].key, kl);
        p += 2 + kl;
        sl_store_le64(p, w->kv[i].len);
        if (w->kv[i].len)
            memcpy(p + 8, w->kv[i].val, w->kv[i].len);
        p += 8 + w->kv[i].len;
    }
    *out_len = len;
    return buf;
}

static void store_index(const struct format_writer *w, uint8_t *p)
{
    for (uint32_t i = 0; i < w->n_tensors; i++, p += FMT_T_SIZE) {
        const struct format_tensor_info *t = &w->tensors[i];
        memset(p, 0, FMT_T_SIZE);
        memcpy(p + FMT_T_NAME, t->name, strlen(t->name));
        sl_store_le32(p + FMT_T_LAYER, (uint32_t)t->layer);
        sl_store_le32(p + FMT_T_ROLE, t->role);
        sl_store_le32(p + FMT_T_ENCODING, t->encoding);
        sl_store_le32(p + FMT_T_NDIMS, t->n_dims);
        for (int d = 0; d < FORMAT_MAX_DIMS; d++)
            sl_store_le64(p + FMT_T_SHAPE + 8 * d, t->shape[d]);
        sl_store_le64(p + FMT_T_OFFSET, t->offset);
        sl_store_le64(p + FMT_T_LENGTH, t->length);
        sl_store_le64(p + FMT_T_CHECKSUM, t->checksum);
        sl_store_lef32(p + FMT_T_ACT_SCALE, t->act_scale);
        sl_store_le32(p + FMT_T_SLICE, t->slice);
        for (int b = 0; b <= FORMAT_MAX_BITS; b++)
            sl_store_le32(p + FMT_T_BITS_HIST + 4 * b, t->bits_hist[b]);
    }
    for (uint32_t i = 0; i < w->n_slices; i++, p += FMT_S_SIZE) {
        const struct format_slice_info *s = &w->slices[i];
        memset(p, 0, FMT_S_SIZE);
        sl_store_le32(p + FMT_S_KIND, s->kind);
        sl_store_le32(p + FMT_S_LAYER, (uint32_t)s->layer);
        sl_store_le64(p + FMT_S_OFFSET, s->offset);
        sl_store_le64(p + FMT_S_LENGTH, s->length);
        sl_store_le64(p + FMT_S_CHECKSUM, s->checksum);
        sl_store_le32(p + FMT_S_FIRST, s->first_tensor);
        sl_store_le32(p + FMT_S_COUNT, s->n_tensors);
    }
}

static int check_complete(const struct format_writer *w, struct sl_err *err)
{
    const struct format_config *c = &w->cfg;
    if (w->tok_n == 0) {
        sl_err_set(err, "%s: no tokenizer was set", w->path);
        return -EINVAL;
    }
    if (w->tok_n != c->vocab_size) {
        sl_err_set(err, "%s: tokenizer has %u tokens, the config's vocab_size is %u", w->path,
                   w->tok_n, c->vocab_size);
        return -EINVAL;
    }
    uint32_t want = c->n_layers * 9 + 2 + (c->tied_embedding ? 0 : 1);
    if (w->n_tensors != want) {
        sl_err_set(err,
                   "%s: %u tensors were added, a %u-layer %s model needs %u (9 per layer, the "
                   "embedding, the output norm%s)",
                   w->path, w->n_tensors, c->n_layers, c->tied_embedding ? "tied" : "untied",
                   want, c->tied_embedding ? "" : ", the classifier");
        return -EINVAL;
    }
    /* Roles are unique per layer (add_tensor) and shapes are checked, so the
     * count identifies a complete model. */
    return 0;
}

static int fsync_dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return -ENOMEM;
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    free(copy);
    if (dfd < 0)
        return -errno;
    int ret = fsync(dfd) < 0 ? -errno : 0;
    close(dfd);
    return ret;
}

int format_writer_finish(struct format_writer *w, struct sl_err *err)
{
    int ret;
    uint8_t *meta = NULL, *zmeta = NULL, *index = NULL;
    if (w->failed || w->finished) {
        sl_err_set(err, "%s: writer is no longer usable", w->path);
        return -EINVAL;
    }
    if (!w->have_config) {
        sl_err_set(err, "%s: no config was set", w->path);
        return -EINVAL;
    }
    ret = check_complete(w, err);
    if (ret < 0)
        return ret;
    ret = close_slice(w, err);
    if (ret < 0)
        return ret;
    uint64_t data_len = w->pos - FMT_HEADER_SIZE;

    uint64_t meta_raw;
    meta = build_meta(w, &meta_raw);
    if (!meta) {
        sl_err_set(err, "%s: out of memory building metadata", w->path);
        return -ENOMEM;
    }
    size_t zcap = ZSTD_compressBound(meta_raw);
    zmeta = malloc(zcap);
    if (!zmeta) {
        ret = -ENOMEM;
        sl_err_set(err, "%s: out of memory compressing metadata", w->path);
        goto out;
    }
    size_t zlen = ZSTD_compress(zmeta, zcap, meta, meta_raw, 9);
    if (ZSTD_isError(zlen)) {
        ret = -EIO;
        sl_err_set(err, "%s: zstd failed: %s", w->path, ZSTD_getErrorName(zlen));
        goto out;
    }
    uint64_t meta_off = w->pos;
    ret = write_all(w, meta_off, zmeta, zlen, err);
    if (ret < 0)
        goto out;
    uint64_t index_off = sl_align_up(meta_off + zlen, 8);
    uint64_t index_len = (uint64_t)w->n_tensors * FMT_T_SIZE + (uint64_t)w->n_slices * FMT_S_SIZE;
    index = calloc(1, index_len + (index_off - meta_off - zlen));
    if (!index) {
        ret = -ENOMEM;
        sl_err_set(err, "%s: out of memory", w->path);
        goto out;
    }
    /* pad between metadata and index, then the index */
    ret = write_all(w, meta_off + zlen, index, index_off - meta_off - zlen, err);
    if (ret < 0)
        goto out;
    store_index(w, index);
    ret = write_all(w, index_off, index, index_len, err);
    if (ret < 0)
        goto out;
    uint64_t file_size = index_off + index_len;

    uint8_t hdr[FMT_HEADER_SIZE];
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr + FMT_H_MAGIC, FMT_MAGIC, FMT_MAGIC_LEN);
    sl_store_le32(hdr + FMT_H_VERSION, w->tables ? FORMAT_VERSION : FORMAT_VERSION_PLAIN);
    sl_store_le32(hdr + FMT_H_HEADER_SIZE, FMT_HEADER_SIZE);
    sl_store_le64(hdr + FMT_H_FILE_SIZE, file_size);
    sl_store_le64(hdr + FMT_H_DATA_OFFSET, FMT_HEADER_SIZE);
    sl_store_le64(hdr + FMT_H_DATA_LENGTH, data_len);
    sl_store_le64(hdr + FMT_H_META_OFFSET, meta_off);
    sl_store_le64(hdr + FMT_H_META_LENGTH, zlen);
    sl_store_le64(hdr + FMT_H_META_RAW, meta_raw);
    sl_store_le32(hdr + FMT_H_META_COMP, FMT_META_ZSTD);
    sl_store_le32(hdr + FMT_H_N_TENSORS, w->n_tensors);
    sl_store_le32(hdr + FMT_H_N_SLICES, w->n_slices);
    sl_store_le64(hdr + FMT_H_INDEX_OFFSET, index_off);
    sl_store_le64(hdr + FMT_H_INDEX_LENGTH, index_len);
    sl_store_le64(hdr + FMT_H_META_SUM, format_checksum(zmeta, zlen));
    sl_store_le64(hdr + FMT_H_INDEX_SUM, format_checksum(index, index_len));
    fmt_config_store(hdr + FMT_H_CONFIG, &w->cfg);
    sl_store_le64(hdr + FMT_H_CHECKSUM, format_checksum(hdr, FMT_H_CHECKSUM));
    ret = write_all(w, 0, hdr, sizeof hdr, err);
    if (ret < 0)
        goto out;
    if (ftruncate(w->fd, (off_t)file_size) < 0 || fsync(w->fd) < 0) {
        ret = -errno;
        sl_err_set(err, "%s: cannot flush the file: %s", w->tmp, strerror(-ret));
        goto out;
    }
    if (rename(w->tmp, w->path) < 0) {
        ret = -errno;
        sl_err_set(err, "%s: cannot rename %s into place: %s", w->path, w->tmp, strerror(-ret));
        goto out;
    }
    w->finished = 1;
    (void)fsync_dir_of(w->path); /* durability of the rename; failure is not an error */
    ret = 0;
out:
    if (ret < 0)
        w->failed = 1;
    free(index);
    free(zmeta);
    free(meta);
    return ret;
}

void format_writer_destroy(struct format_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    if (!w->finished)
        unlink(w->tmp);
    free_tokenizer(w);
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    free(w->kv);
    free(w->tensors);
    free(w->slices);
    XXH3_freeState(w->slice_state);
    free(w->path);
    free(w);
}
