/* import_model.c: source detection and the common path that writes an
 * imported model into a float container, one tensor at a time. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "import_internal.h"

const char *import_source_name(enum import_source s)
{
    switch (s) {
    case IMPORT_SRC_SLUICE:
        return "sluice";
    case IMPORT_SRC_LLAMA2C:
        return "llama2c";
    case IMPORT_SRC_GGUF:
        return "gguf";
    case IMPORT_SRC_SAFETENSORS:
        return "safetensors";
    default:
        return "unknown";
    }
}

int qi_map_file(const char *path, const uint8_t **data, uint64_t *size, struct sl_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        sl_err_set(err, "%s: cannot open: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        int e = S_ISREG(st.st_mode) ? errno : EINVAL;
        sl_err_set(err, "%s: not a regular file", path);
        close(fd);
        return -e;
    }
    *size = (uint64_t)st.st_size;
    *data = NULL;
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            sl_err_set(err, "%s: cannot map: %s", path, strerror(e));
            close(fd);
            return -e;
        }
        *data = p;
    }
    close(fd);
    return 0;
}

void *qi_source_new(size_t size, const char *path, const char *format,
                    int (*tensor)(struct qi_source *s, int layer, uint32_t role,
                                  struct qi_tensor *t, struct sl_err *err),
                    void (*destroy)(struct qi_source *s), struct sl_err *err)
{
    struct qi_source *s = calloc(1, size);
    if (!s) {
        sl_err_set(err, "%s: out of memory", path);
        return NULL;
    }
    s->path = path;
    s->format = format;
    s->tensor = tensor;
    s->destroy = destroy;
    s->priv = s;
    return s;
}

void qi_unmap(const uint8_t *data, uint64_t size)
{
    if (data && size)
        munmap((void *)data, (size_t)size);
}

/* Drops the pages of a converted source tensor from this process (they are
 * clean file pages of a private read-only mapping: a later access reads the
 * file again), so importing a model larger than memory keeps RSS at about
 * one tensor instead of the whole source. */
static void release_source(const uint8_t *p, uint64_t len)
{
    long pg = sysconf(_SC_PAGESIZE);
    if (!p || !len || pg <= 0)
        return;
    uintptr_t a = (uintptr_t)p & ~((uintptr_t)pg - 1);
    uintptr_t b = ((uintptr_t)p + len + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

uint64_t qi_type_bytes(enum qi_type t, uint64_t n)
{
    switch (t) {
    case QI_F32:
        return n * 4;
    case QI_F16:
    case QI_BF16:
        return n * 2;
    case QI_Q8_0:
    case QI_Q4_K:
    case QI_Q5_K:
    case QI_Q6_K:
        return n % qi_block_weights(t) ? 0 : n / qi_block_weights(t) * qi_block_bytes(t);
    }
    return 0;
}

/* ---- detection --------------------------------------------------------------- */

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

int import_source_detect(const char *src, enum import_source *out, struct sl_err *err)
{
    *out = IMPORT_SRC_UNKNOWN;
    if (is_dir(src)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/config.json", src);
        if (access(p, R_OK) == 0) {
            *out = IMPORT_SRC_SAFETENSORS;
            return 0;
        }
        sl_err_set(err, "%s: a directory without config.json (expected a Hugging Face model)", src);
        return -EINVAL;
    }
    int fd = open(src, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        sl_err_set(err, "%s: cannot open: %s", src, strerror(e));
        return -e;
    }
    /* the magic only, not read ahead: a read-ahead mark left in the file's
     * first pages makes the next reader's read there (a model's embedding
     * prefix, pipeline_embed.c) read 4 MB ahead (docs/BENCHMARKS.md,
     * fifteenth session, f22). Advice: the read works without it. */
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    uint8_t head[28];
    ssize_t n = pread(fd, head, sizeof head, 0);
    struct stat st;
    int sret = fstat(fd, &st);
    close(fd);
    if (n < 0 || sret < 0) {
        sl_err_set(err, "%s: cannot read", src);
        return -EIO;
    }
    if (n >= 8 && !memcmp(head, "SLUICE\x1a\n", 8)) {
        *out = IMPORT_SRC_SLUICE;
        return 0;
    }
    if (n >= 4 && !memcmp(head, "GGUF", 4)) {
        *out = IMPORT_SRC_GGUF;
        return 0;
    }
    if (ends_with(src, ".safetensors")) {
        *out = IMPORT_SRC_SAFETENSORS;
        return 0;
    }
    if (n == 28) {
        /* llama2.c: 7 positive int32 (vocab may be negative) and a size that matches */
        int32_t h[7];
        for (int i = 0; i < 7; i++)
            h[i] = (int32_t)sl_load_le32(head + 4 * i);
        int plausible = h[0] > 0 && h[1] > 0 && h[2] > 0 && h[3] > 0 && h[4] > 0 && h[5] != 0 &&
                        h[6] > 0 && h[0] % h[3] == 0;
        if (plausible) {
            *out = IMPORT_SRC_LLAMA2C;
            return 0;
        }
    }
    sl_err_set(err,
               "%s: unrecognized model format (expected a llama2.c checkpoint, GGUF, "
               "safetensors, or a sluice container)",
               src);
    return -EINVAL;
}

/* ---- conversion -------------------------------------------------------------------- */

/* Source element i (row-major) as float. */
static float src_elem(const struct qi_tensor *t, uint64_t i)
{
    switch (t->type) {
    case QI_F32:
        return sl_load_lef32(t->data + 4 * i);
    case QI_F16:
        return sl_f16_to_f32(sl_load_le16(t->data + 2 * i));
    case QI_BF16:
        return sl_bf16_to_f32(sl_load_le16(t->data + 2 * i));
    default: /* block types are decoded a row at a time (convert) */
        return 0;
    }
}

static uint32_t native_encoding(enum qi_type t)
{
    return t == QI_F16 ? FORMAT_ENC_F16 : t == QI_BF16 ? FORMAT_ENC_BF16 : FORMAT_ENC_F32;
}

/* Source row of container row r (the Hugging Face rotate-half permutation
 * undone: interleaved row h*hd + 2i + p comes from HF row h*hd + p*hd/2 + i). */
static uint64_t src_row(const struct qi_tensor *t, uint64_t r)
{
    if (!t->hf_rope_heads)
        return r;
    uint64_t hd = t->rows / t->hf_rope_heads;
    uint64_t h = r / hd, w = r % hd, i = w / 2, p = w % 2;
    return h * hd + p * (hd / 2) + i;
}

static void store(uint32_t enc, uint8_t *dst, const float *v, uint64_t n)
{
    for (uint64_t c = 0; c < n; c++) {
        if (enc == FORMAT_ENC_F32)
            sl_store_lef32(dst + 4 * c, v[c]);
        else if (enc == FORMAT_ENC_F16)
            sl_store_le16(dst + 2 * c, sl_f32_to_f16(v[c]));
        else
            sl_store_le16(dst + 2 * c, sl_f32_to_bf16(v[c]));
    }
}

/* Converts a source tensor to `enc` bytes in `out` (rows*cols elements).
 * Block types are decoded a row at a time into `row` (cols floats; a 1-D
 * tensor, whose blocks run along its length, as one row of rows floats). */
static void convert(const struct qi_tensor *t, uint32_t enc, uint8_t *out, float *row)
{
    uint64_t esz = enc == FORMAT_ENC_F32 ? 4 : 2;
    if (qi_type_is_block(t->type)) {
        uint64_t n = t->cols == 1 ? t->rows : t->cols, nrows = t->cols == 1 ? 1 : t->rows;
        uint64_t rb = n / qi_block_weights(t->type) * qi_block_bytes(t->type);
        for (uint64_t r = 0; r < nrows; r++) {
            qi_dequant(t->type, t->data + src_row(t, r) * rb, row, n);
            store(enc, out + r * n * esz, row, n);
        }
        return;
    }
    int same = native_encoding(t->type) == enc;
    for (uint64_t r = 0; r < t->rows; r++) {
        uint64_t sr = src_row(t, r);
        uint8_t *dst = out + r * t->cols * esz;
        if (same) {
            memcpy(dst, t->data + sr * t->cols * esz, t->cols * esz);
            continue;
        }
        for (uint64_t c = 0; c < t->cols; c++) {
            float v = src_elem(t, sr * t->cols + c);
            if (enc == FORMAT_ENC_F32)
                sl_store_lef32(dst + 4 * c, v);
            else if (enc == FORMAT_ENC_F16)
                sl_store_le16(dst + 2 * c, sl_f32_to_f16(v));
            else
                sl_store_le16(dst + 2 * c, sl_f32_to_bf16(v));
        }
    }
}

size_t qi_order_count(const struct format_config *c)
{
    return (size_t)c->n_layers * 9 + 2 + (c->tied_embedding ? 0 : 1);
}

void qi_order_at(const struct format_config *c, size_t i, int *layer, uint32_t *role)
{
    if (!c->tied_embedding) {
        if (i == 0) {
            *layer = -1, *role = FORMAT_ROLE_TOK_EMBD;
            return;
        }
        i--;
    }
    if (i < (size_t)c->n_layers * 9) {
        *layer = (int)(i / 9);
        *role = FORMAT_ROLE_ATTN_NORM + (uint32_t)(i % 9);
        return;
    }
    *layer = -1;
    if (i == (size_t)c->n_layers * 9)
        *role = FORMAT_ROLE_OUT_NORM;
    else
        *role = c->tied_embedding ? FORMAT_ROLE_TOK_EMBD : FORMAT_ROLE_CLASSIFIER;
}

static int write_source(struct qi_source *s, const struct import_opts *o, enum import_source kind,
                        const char *out_path, struct sl_err *err)
{
    struct format_writer *w = NULL;
    uint8_t *buf = NULL;
    uint64_t buf_cap = 0, row_cap = 0;
    float *row = NULL;
    int ret = format_writer_create(out_path, &w, err);
    if (ret < 0)
        return ret;
    ret = format_writer_set_config(w, &s->cfg, err);
    if (ret < 0)
        goto out;
    ret = format_writer_set_tokenizer(w, &s->vocab.tok, err);
    if (ret < 0)
        goto out;
    const char *fmt = import_source_name(kind);
    ret = format_writer_set_meta(w, "source.format", fmt, strlen(fmt), err);
    if (ret == 0)
        ret = format_writer_set_meta(w, "source.path", s->path, strlen(s->path), err);
    if (ret == 0 && s->chat_template)
        ret = format_writer_set_meta(w, "tokenizer.chat_template", s->chat_template,
                                     s->chat_template_len, err);
    if (ret < 0)
        goto out;

    const struct format_config *c = &s->cfg;
    size_t n = qi_order_count(c);
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < n; i++) {
        struct qi_tensor t;
        int layer;
        uint32_t role;
        qi_order_at(c, i, &layer, &role);
        ret = s->tensor(s, layer, role, &t, err);
        if (ret < 0)
            goto out;
        total += t.len;
    }
    for (size_t i = 0; i < n; i++) {
        struct qi_tensor t;
        int layer;
        uint32_t role;
        qi_order_at(c, i, &layer, &role);
        ret = s->tensor(s, layer, role, &t, err);
        if (ret < 0)
            goto out;
        uint32_t enc = o->dtype >= 0 ? (uint32_t)o->dtype : native_encoding(t.type);
        uint64_t bytes = t.rows * t.cols * (enc == FORMAT_ENC_F32 ? 4 : 2);
        if (bytes > buf_cap) {
            free(buf);
            buf = malloc(bytes);
            buf_cap = buf ? bytes : 0;
            if (!buf) {
                sl_err_set(err, "%s: out of memory converting a %" PRIu64 "-byte tensor", s->path,
                           bytes);
                ret = -ENOMEM;
                goto out;
            }
        }
        uint64_t row_n = t.cols == 1 ? t.rows : t.cols;
        if (row_n > row_cap) {
            free(row);
            row = malloc(row_n * sizeof *row);
            row_cap = row ? row_n : 0;
            if (!row) {
                sl_err_set(err, "%s: out of memory", s->path);
                ret = -ENOMEM;
                goto out;
            }
        }
        convert(&t, enc, buf, row);
        release_source(t.data, t.len);
        char name[FORMAT_NAME_MAX];
        format_tensor_name(layer, role, name, sizeof name);
        int is_1d = role == FORMAT_ROLE_ATTN_NORM || role == FORMAT_ROLE_FFN_NORM ||
                    role == FORMAT_ROLE_OUT_NORM;
        struct format_tensor_desc d = {.name = name,
                                       .layer = layer,
                                       .role = role,
                                       .encoding = enc,
                                       .n_dims = is_1d ? 1 : 2,
                                       .shape = {t.rows, is_1d ? 0 : t.cols}};
        ret = format_writer_add_tensor(w, &d, buf, bytes, err);
        if (ret < 0)
            goto out;
        done += t.len;
        if (o->progress)
            o->progress(o->progress_ctx, name, done, total);
    }
    ret = format_writer_finish(w, err);
out:
    free(buf);
    free(row);
    format_writer_destroy(w);
    return ret;
}

int import_model(const char *src, const struct import_opts *opts, const char *out_path,
                 struct sl_err *err)
{
    struct import_opts o = {.dtype = -1};
    if (opts)
        o = *opts;
    if (o.dtype >= 0 && o.dtype != FORMAT_ENC_F32 && o.dtype != FORMAT_ENC_F16 &&
        o.dtype != FORMAT_ENC_BF16) {
        sl_err_set(err, "import: --dtype must be f32, f16 or bf16");
        return -EINVAL;
    }
    enum import_source kind;
    int ret = import_source_detect(src, &kind, err);
    if (ret < 0)
        return ret;
    struct qi_source *s = NULL;
    switch (kind) {
    case IMPORT_SRC_LLAMA2C:
        ret = qi_open_llama2c(src, &o, &s, err);
        break;
    case IMPORT_SRC_GGUF:
        ret = qi_open_gguf(src, &o, &s, err);
        break;
    case IMPORT_SRC_SAFETENSORS:
        ret = qi_open_safetensors(src, &o, &s, err);
        break;
    case IMPORT_SRC_SLUICE:
        sl_err_set(err, "%s: already a sluice container", src);
        return -EINVAL;
    default:
        return -EINVAL;
    }
    if (ret < 0)
        return ret;
    if (o.seq_len)
        s->cfg.seq_len = o.seq_len;
    ret = format_config_validate(&s->cfg, src, err);
    if (ret == 0)
        ret = write_source(s, &o, kind, out_path, err);
    s->destroy(s);
    return ret;
}
