/* container_edit.c: see container_edit.h. The byte offsets are those of
 * docs/FORMAT.md (header fields, 192-byte tensor entries, then 48-byte slice
 * entries in the index). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "container_edit.h"
#include "quantizer.h"

enum {
    H_N_TENSORS = 68,
    H_INDEX_OFFSET = 80,
    H_INDEX_LENGTH = 88,
    H_INDEX_SUM = 104,
    H_CHECKSUM = 4088
};
enum { T_SIZE = 192, T_OFFSET = 112, T_LENGTH = 120, T_CHECKSUM = 128, T_SLICE = 140 };
enum { S_SIZE = 48, S_OFFSET = 8, S_LENGTH = 16, S_CHECKSUM = 24 };

static uint32_t rng_state = 12345;
static uint32_t rnd(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state >> 8;
}

/* A tensor of rows x cols in `enc`: bytes (malloc'ed) and length. */
static void *encode(uint32_t enc, uint32_t rows, uint32_t cols, uint64_t *len)
{
    size_t n = (size_t)rows * cols;
    if (enc == FORMAT_ENC_F32) {
        float *f = malloc(n * 4);
        for (size_t i = 0; f && i < n; i++)
            f[i] = ((float)(rnd() % 2001) - 1000.0f) / 4000.0f;
        *len = n * 4;
        return f;
    }
    if (enc == FORMAT_ENC_Q8_CHANNEL) {
        uint64_t off = sl_align_up((uint64_t)rows * 4, 64);
        uint8_t *b = calloc(1, off + n);
        for (uint32_t r = 0; b && r < rows; r++)
            sl_store_lef32(b + 4 * r, 0.002f);
        for (size_t i = 0; b && i < n; i++)
            b[off + i] = (uint8_t)(int8_t)((int)(rnd() % 255) - 127);
        *len = off + n;
        return b;
    }
    int8_t *q = malloc(n);
    uint8_t *w = malloc(rows);
    float *sc = malloc(rows * sizeof *sc);
    void *out = NULL;
    if (q && w && sc) {
        for (uint32_t r = 0; r < rows; r++) {
            w[r] = (uint8_t)(2 + r % 7); /* widths 2..8 */
            sc[r] = 0.01f;
            int m = (1 << (w[r] - 1)) - 1;
            for (uint32_t c = 0; c < cols; c++)
                q[(size_t)r * cols + c] = (int8_t)((int)(rnd() % (uint32_t)(2 * m + 1)) - m);
        }
        struct sl_err err = {{0}};
        if (quantizer_pack(enc, q, w, sc, rows, cols, &out, len, &err) < 0) {
            fprintf(stderr, "container_edit: pack: %s\n", err.msg);
            out = NULL;
        }
    }
    free(q);
    free(w);
    free(sc);
    return out;
}

int ce_write_model(const char *path, uint32_t encoding)
{
    rng_state = 12345;
    struct format_config c = {.arch = FORMAT_ARCH_LLAMA,
                              .dim = 32,
                              .hidden_dim = 32,
                              .n_layers = 1,
                              .n_heads = 2,
                              .n_kv_heads = 2,
                              .head_dim = 16,
                              .vocab_size = 8,
                              .seq_len = 32,
                              .tied_embedding = 1,
                              .bos_id = 1,
                              .eos_id = 2,
                              .rope_theta = 10000,
                              .norm_eps = 1e-5f};
    const char *strs[8] = {"<unk>", "<s>", "</s>", " ", "a", "b", "c", " a"};
    uint32_t lens[8] = {5, 3, 4, 1, 1, 1, 1, 2};
    float scores[8] = {0, 0, 0, -1, -2, -3, -4, -1};
    struct format_tokenizer tok = {8, 5, scores, lens, strs};
    static const struct {
        int layer;
        uint32_t role;
        int linear;
    } ts[] = {{0, FORMAT_ROLE_ATTN_NORM, 0}, {0, FORMAT_ROLE_WQ, 1},
              {0, FORMAT_ROLE_WK, 1},        {0, FORMAT_ROLE_WV, 1},
              {0, FORMAT_ROLE_WO, 1},        {0, FORMAT_ROLE_FFN_NORM, 0},
              {0, FORMAT_ROLE_W_GATE, 1},    {0, FORMAT_ROLE_W_UP, 1},
              {0, FORMAT_ROLE_W_DOWN, 1},    {-1, FORMAT_ROLE_OUT_NORM, 0},
              {-1, FORMAT_ROLE_TOK_EMBD, 0}}; /* tied: the head slice holds it */
    struct sl_err err = {{0}};
    struct format_writer *w = NULL;
    int ret = format_writer_create(path, &w, &err);
    if (!ret)
        ret = format_writer_set_config(w, &c, &err);
    if (!ret)
        ret = format_writer_set_tokenizer(w, &tok, &err);
    for (size_t i = 0; !ret && i < sizeof ts / sizeof ts[0]; i++) {
        uint32_t nd;
        uint64_t shape[2];
        format_role_shape(&c, ts[i].role, &nd, shape);
        uint32_t enc = ts[i].linear ? encoding : FORMAT_ENC_F32;
        char name[FORMAT_NAME_MAX];
        format_tensor_name(ts[i].layer, ts[i].role, name, sizeof name);
        struct format_tensor_desc d = {.name = name,
                                       .layer = ts[i].layer,
                                       .role = ts[i].role,
                                       .encoding = enc,
                                       .n_dims = nd,
                                       .shape = {shape[0], nd == 2 ? shape[1] : 0}};
        uint64_t len;
        void *b = encode(enc, (uint32_t)shape[0], nd == 2 ? (uint32_t)shape[1] : 1, &len);
        if (!b) {
            ret = -1;
            break;
        }
        if (enc >= FORMAT_ENC_ADAPTIVE)
            for (uint32_t r = 0; r < shape[0]; r++)
                d.bits_hist[2 + r % 7]++;
        ret = format_writer_add_tensor(w, &d, b, len, &err);
        free(b);
    }
    if (!ret)
        ret = format_writer_finish(w, &err);
    if (ret)
        fprintf(stderr, "container_edit: %s: %s\n", path, err.msg);
    format_writer_destroy(w);
    return ret ? -1 : 0;
}

long ce_find_tensor(const uint8_t *buf, size_t len, const char *name)
{
    uint64_t io = sl_load_le64(buf + H_INDEX_OFFSET);
    uint32_t n = sl_load_le32(buf + H_N_TENSORS);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t e = io + (uint64_t)i * T_SIZE;
        if (e + T_SIZE <= len && !strncmp((const char *)buf + e, name, 64))
            return i;
    }
    return -1;
}

uint8_t *ce_tensor_bytes(uint8_t *buf, long tensor, uint64_t *len)
{
    uint8_t *e = buf + sl_load_le64(buf + H_INDEX_OFFSET) + (uint64_t)tensor * T_SIZE;
    *len = sl_load_le64(e + T_LENGTH);
    return buf + sl_load_le64(e + T_OFFSET);
}

void ce_reseal(uint8_t *buf, long tensor)
{
    uint64_t io = sl_load_le64(buf + H_INDEX_OFFSET);
    uint32_t nt = sl_load_le32(buf + H_N_TENSORS);
    uint8_t *e = buf + io + (uint64_t)tensor * T_SIZE;
    sl_store_le64(e + T_CHECKSUM,
                  format_checksum(buf + sl_load_le64(e + T_OFFSET), sl_load_le64(e + T_LENGTH)));
    uint8_t *s = buf + io + (uint64_t)nt * T_SIZE + (uint64_t)sl_load_le32(e + T_SLICE) * S_SIZE;
    sl_store_le64(s + S_CHECKSUM,
                  format_checksum(buf + sl_load_le64(s + S_OFFSET), sl_load_le64(s + S_LENGTH)));
    sl_store_le64(buf + H_INDEX_SUM, format_checksum(buf + io, sl_load_le64(buf + H_INDEX_LENGTH)));
    sl_store_le64(buf + H_CHECKSUM, format_checksum(buf, H_CHECKSUM));
}
