/* test_format.c: container round trip and every rejection path of the reader
 * and the writer (truncation, bad magic, wrong version, corrupt header,
 * out-of-bounds offsets, checksum mismatches, bad activation scales, bad
 * writer input). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format.h"
#include "testutil.h"

/* Byte offsets from docs/FORMAT.md, used to forge corrupt files. */
#define H_VERSION 8
#define H_META_SUM 96
#define H_INDEX_OFFSET 80
#define H_INDEX_SUM 104
#define H_CHECKSUM 4088
#define T_OFFSET 112
#define T_ACT_SCALE 136
#define T_SIZE 192

struct model {
    struct format_config cfg;
    struct format_tokenizer tok;
    float scores[16];
    uint32_t lens[16];
    const char *strs[16];
    char storage[16][8];
    /* tensor bytes in add order */
    struct format_tensor_desc desc[64];
    uint8_t *data[64];
    uint64_t len[64];
    int n;
};

static void add_f32(struct model *m, struct test_rng *rng, const char *name, int layer,
                    uint32_t role, uint64_t rows, uint64_t cols, uint32_t enc)
{
    struct format_tensor_desc *d = &m->desc[m->n];
    memset(d, 0, sizeof *d);
    d->name = strdup(name);
    d->layer = layer;
    d->role = role;
    d->encoding = enc;
    d->n_dims = cols ? 2 : 1;
    d->shape[0] = rows;
    d->shape[1] = cols;
    uint64_t n = rows * (cols ? cols : 1);
    uint64_t len;
    uint8_t *p;
    if (enc == FORMAT_ENC_Q8_CHANNEL) {
        uint64_t soff = (rows * 4 + 63) / 64 * 64;
        len = soff + n;
        p = calloc(1, len);
        for (uint64_t r = 0; r < rows; r++)
            sl_store_lef32(p + 4 * r, 0.01f + test_rng_float(rng));
        for (uint64_t i = 0; i < n; i++)
            p[soff + i] = (uint8_t)(int8_t)((int)test_rng_below(rng, 255) - 127);
        d->act_scale = 0.5f;
        d->bits_hist[8] = (uint32_t)rows;
    } else {
        len = n * 4;
        p = malloc(len);
        for (uint64_t i = 0; i < n; i++)
            sl_store_lef32(p + 4 * i, test_rng_normal(rng));
    }
    m->data[m->n] = p;
    m->len[m->n] = len;
    m->n++;
}

static void make_model(struct model *m, int tied, int q8)
{
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    memset(m, 0, sizeof *m);
    m->cfg = (struct format_config){.arch = FORMAT_ARCH_LLAMA, .dim = 8, .hidden_dim = 12,
                                    .n_layers = 2, .n_heads = 2, .n_kv_heads = 1,
                                    .head_dim = 4, .vocab_size = 10, .seq_len = 16,
                                    .tied_embedding = (uint32_t)tied, .bos_id = 1, .eos_id = 2,
                                    .rope_theta = 10000.0f, .norm_eps = 1e-5f};
    for (int i = 0; i < 10; i++) {
        snprintf(m->storage[i], sizeof m->storage[i], "t%d%c", i, i == 3 ? 0 : 'x');
        m->strs[i] = m->storage[i];
        m->lens[i] = i == 3 ? 4 : (uint32_t)strlen(m->storage[i]); /* token 3 holds a NUL */
        m->scores[i] = -(float)i;
    }
    m->tok = (struct format_tokenizer){10, 4, m->scores, m->lens, m->strs};
    uint32_t lin = q8 ? FORMAT_ENC_Q8_CHANNEL : FORMAT_ENC_F32;
    if (!tied)
        add_f32(m, &rng, "token_embd.weight", -1, FORMAT_ROLE_TOK_EMBD, 10, 8, FORMAT_ENC_F32);
    for (int l = 0; l < 2; l++) {
        char nm[64];
#define ADD(suffix, role, r, c, e)                                                           \
    snprintf(nm, sizeof nm, "blk.%d." suffix, l);                                            \
    add_f32(m, &rng, nm, l, role, r, c, e)
        ADD("attn_norm.weight", FORMAT_ROLE_ATTN_NORM, 8, 0, FORMAT_ENC_F32);
        ADD("attn_q.weight", FORMAT_ROLE_WQ, 8, 8, lin);
        ADD("attn_k.weight", FORMAT_ROLE_WK, 4, 8, lin);
        ADD("attn_v.weight", FORMAT_ROLE_WV, 4, 8, lin);
        ADD("attn_output.weight", FORMAT_ROLE_WO, 8, 8, lin);
        ADD("ffn_norm.weight", FORMAT_ROLE_FFN_NORM, 8, 0, FORMAT_ENC_F32);
        ADD("ffn_gate.weight", FORMAT_ROLE_W_GATE, 12, 8, lin);
        ADD("ffn_up.weight", FORMAT_ROLE_W_UP, 12, 8, lin);
        ADD("ffn_down.weight", FORMAT_ROLE_W_DOWN, 8, 12, lin);
#undef ADD
    }
    add_f32(m, &rng, "output_norm.weight", -1, FORMAT_ROLE_OUT_NORM, 8, 0, FORMAT_ENC_F32);
    if (tied)
        add_f32(m, &rng, "token_embd.weight", -1, FORMAT_ROLE_TOK_EMBD, 10, 8, FORMAT_ENC_F32);
    else
        add_f32(m, &rng, "output.weight", -1, FORMAT_ROLE_CLASSIFIER, 10, 8, lin);
}

static void free_model(struct model *m)
{
    for (int i = 0; i < m->n; i++) {
        free((void *)m->desc[i].name);
        free(m->data[i]);
    }
}

static int write_model(const struct model *m, const char *path, struct sl_err *err)
{
    struct format_writer *w;
    int ret = format_writer_create(path, &w, err);
    if (ret < 0)
        return ret;
    ret = format_writer_set_config(w, &m->cfg, err);
    if (!ret)
        ret = format_writer_set_tokenizer(w, &m->tok, err);
    if (!ret)
        ret = format_writer_set_meta(w, "quant.method", "none", 4, err);
    if (!ret)
        ret = format_writer_set_meta(w, "empty", "", 0, err);
    for (int i = 0; !ret && i < m->n; i++)
        ret = format_writer_add_tensor(w, &m->desc[i], m->data[i], m->len[i], err);
    if (!ret)
        ret = format_writer_finish(w, err);
    format_writer_destroy(w);
    return ret;
}

static char *path_in_tmp(const char *name)
{
    static char buf[4][512];
    static int k;
    static const char *dir;
    if (!dir)
        dir = test_tmpdir();
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static void check_roundtrip(int tied, int q8)
{
    struct model m;
    struct sl_err err = {{0}};
    make_model(&m, tied, q8);
    char *path = path_in_tmp(tied ? "tied.sluice" : "untied.sluice");
    int ret = write_model(&m, path, &err);
    if (ret)
        fail_msg("write: %s", err.msg);

    struct format_reader *r;
    ret = format_reader_open(path, &r, &err);
    if (ret)
        fail_msg("open: %s", err.msg);
    const struct format_config *c = format_reader_config(r);
    assert_memory_equal(c, &m.cfg, sizeof *c);
    const struct format_tokenizer *tok = format_reader_tokenizer(r);
    assert_int_equal(tok->n_tokens, 10);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(tok->lens[i], m.lens[i]);
        assert_memory_equal(tok->tokens[i], m.strs[i], m.lens[i]);
        assert_true(tok->scores[i] == m.scores[i]);
    }
    const void *v;
    size_t vl;
    assert_int_equal(format_reader_meta_get(r, "quant.method", &v, &vl), 0);
    assert_int_equal(vl, 4);
    assert_memory_equal(v, "none", 4);
    assert_int_equal(format_reader_meta_get(r, "empty", &v, &vl), 0);
    assert_int_equal(vl, 0);
    assert_int_equal(format_reader_meta_get(r, "missing", &v, &vl), -ENOENT);
    assert_int_equal(format_reader_meta_count(r), 2);

    assert_int_equal(format_reader_n_tensors(r), (uint32_t)m.n);
    assert_int_equal(format_reader_n_slices(r), tied ? 3 : 4);
    for (int i = 0; i < m.n; i++) {
        const struct format_tensor_info *t = format_reader_tensor(r, (uint32_t)i);
        assert_string_equal(t->name, m.desc[i].name);
        assert_int_equal(t->role, m.desc[i].role);
        assert_int_equal(t->layer, m.desc[i].layer);
        assert_int_equal(t->encoding, m.desc[i].encoding);
        assert_int_equal(t->length, m.len[i]);
        assert_true(t->act_scale == m.desc[i].act_scale);
        assert_memory_equal(t->bits_hist, m.desc[i].bits_hist, sizeof t->bits_hist);
        assert_int_equal(t->offset % FORMAT_TENSOR_ALIGN, 0);
        uint8_t *buf = malloc(t->length);
        ret = format_reader_read_tensor(r, (uint32_t)i, buf, t->length, &err);
        if (ret)
            fail_msg("read %s: %s", t->name, err.msg);
        assert_memory_equal(buf, m.data[i], m.len[i]);
        assert_int_equal(format_tensor_verify(r, (uint32_t)i, buf, &err), 0);
        free(buf);
        assert_int_equal(format_reader_find_name(r, t->name), i);
        assert_int_equal(format_reader_find(r, t->layer, t->role), i);
    }
    /* a tied model's classifier is the embedding */
    int cls = format_reader_find(r, -1, FORMAT_ROLE_CLASSIFIER);
    assert_true(cls >= 0);
    assert_int_equal(format_reader_tensor(r, (uint32_t)cls)->role,
                     tied ? FORMAT_ROLE_TOK_EMBD : FORMAT_ROLE_CLASSIFIER);
    for (uint32_t s = 0; s < format_reader_n_slices(r); s++) {
        const struct format_slice_info *si = format_reader_slice(r, s);
        assert_int_equal(si->offset % FORMAT_ALIGN, 0);
        assert_int_equal(si->length % FORMAT_ALIGN, 0);
        uint8_t *buf = malloc(si->length);
        ret = format_reader_read_slice(r, s, buf, si->length, &err);
        if (ret)
            fail_msg("slice %u: %s", s, err.msg);
        assert_int_equal(format_slice_verify(r, s, buf, &err), 0);
        free(buf);
    }
    /* execution order: embedding (untied), layers, head */
    assert_int_equal(format_reader_slice(r, 0)->kind,
                     tied ? FORMAT_SLICE_LAYER : FORMAT_SLICE_EMBED);
    assert_int_equal(format_reader_slice(r, format_reader_n_slices(r) - 1)->kind,
                     FORMAT_SLICE_HEAD);
    format_reader_close(r);
    free_model(&m);
}

static void test_roundtrip_untied(void **state) { (void)state; check_roundtrip(0, 0); }
static void test_roundtrip_tied(void **state) { (void)state; check_roundtrip(1, 0); }
static void test_roundtrip_q8(void **state) { (void)state; check_roundtrip(0, 1); }

/* ---- corrupt files ------------------------------------------------------------ */

static uint8_t *good_file(size_t *len)
{
    struct model m;
    struct sl_err err;
    make_model(&m, 0, 1);
    char *path = path_in_tmp("good.sluice");
    assert_int_equal(write_model(&m, path, &err), 0);
    free_model(&m);
    uint8_t *buf = test_read_file(path, len);
    assert_non_null(buf);
    return buf;
}

static int open_bytes(const uint8_t *buf, size_t len, struct sl_err *err)
{
    char *path = path_in_tmp("bad.sluice");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
    struct format_reader *r = NULL;
    memset(err, 0, sizeof *err);
    int ret = format_reader_open(path, &r, err);
    format_reader_close(r);
    if (ret < 0) {
        assert_non_null(strstr(err->msg, path)); /* every message names the file */
    }
    return ret;
}

static void reseal_header(uint8_t *buf)
{
    sl_store_le64(buf + H_CHECKSUM, format_checksum(buf, H_CHECKSUM));
}

static void test_truncated(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = good_file(&len);
    struct sl_err err;
    size_t cuts[] = {0, 1, 7, 8, 100, 4095, 4096, 4097, len / 2, len - 200, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        int ret = open_bytes(buf, cuts[i], &err);
        assert_true(ret < 0);
        if (cuts[i] >= 8)
            assert_true(strstr(err.msg, "truncated") || strstr(err.msg, "shorter"));
    }
    assert_int_equal(open_bytes(buf, len, &err), 0);
    free(buf);
}

static void test_bad_magic(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = good_file(&len);
    struct sl_err err;
    buf[0] = 'X';
    assert_int_equal(open_bytes(buf, len, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "bad magic"));
    free(buf);
}

static void test_wrong_version(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = good_file(&len);
    struct sl_err err;
    sl_store_le32(buf + H_VERSION, FORMAT_VERSION + 1);
    reseal_header(buf);
    assert_int_equal(open_bytes(buf, len, &err), -EINVAL);
    char want[32];
    snprintf(want, sizeof want, "version %u", FORMAT_VERSION + 1);
    assert_non_null(strstr(err.msg, want));
    sl_store_le32(buf + H_VERSION, 0);
    reseal_header(buf);
    assert_int_equal(open_bytes(buf, len, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "version 0"));
    free(buf);
}

/* A version 1 container (written before the shadow metadata) still loads,
 * and says so. */
static void test_version1_loads(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = good_file(&len);
    struct sl_err err = {{0}};
    assert_int_equal(sl_load_le32(buf + H_VERSION), FORMAT_VERSION_PLAIN); /* no code tables */
    sl_store_le32(buf + H_VERSION, 1);
    reseal_header(buf);
    assert_int_equal(open_bytes(buf, len, &err), 0);
    free(buf);
}

static void test_corrupt_header(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = good_file(&len);
    struct sl_err err;
    buf[200] ^= 1; /* inside the config block; checksum not resealed */
    assert_int_equal(open_bytes(buf, len, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "header checksum"));
    free(buf);
}

static void test_out_of_bounds_offset(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = good_file(&len);
    struct sl_err err;
    uint64_t index = sl_load_le64(buf + H_INDEX_OFFSET);
    uint64_t index_len = sl_load_le64(buf + H_INDEX_OFFSET + 8);
    /* tensor 3: offset far past the end, with all checksums resealed so only
     * the bounds check can catch it */
    sl_store_le64(buf + index + 3 * T_SIZE + T_OFFSET, (uint64_t)1 << 62);
    sl_store_le64(buf + H_INDEX_SUM, format_checksum(buf + index, index_len));
    reseal_header(buf);
    assert_int_equal(open_bytes(buf, len, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "outside"));
    /* an offset+length that overflows 64 bits */
    sl_store_le64(buf + index + 3 * T_SIZE + T_OFFSET, UINT64_MAX - 10);
    sl_store_le64(buf + H_INDEX_SUM, format_checksum(buf + index, index_len));
    reseal_header(buf);
    assert_int_equal(open_bytes(buf, len, &err), -EINVAL);
    free(buf);
}

static void test_meta_corrupt(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = good_file(&len);
    struct sl_err err;
    uint64_t meta = sl_load_le64(buf + 40);
    buf[meta + 5] ^= 0x40;
    assert_int_equal(open_bytes(buf, len, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "metadata checksum"));
    free(buf);
}

static void test_data_checksum(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = good_file(&len);
    struct sl_err err;
    char *path = path_in_tmp("flip.sluice");
    /* open a good copy to find tensor 2, then flip one of its bytes */
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, len, f);
    fclose(f);
    struct format_reader *r;
    assert_int_equal(format_reader_open(path, &r, &err), 0);
    const struct format_tensor_info *t = format_reader_tensor(r, 2);
    uint64_t off = t->offset + t->length / 2;
    uint32_t slice = t->slice;
    format_reader_close(r);
    buf[off] ^= 0x10;
    f = fopen(path, "wb");
    fwrite(buf, 1, len, f);
    fclose(f);
    /* opening succeeds (data checksums are verified on read) ... */
    assert_int_equal(format_reader_open(path, &r, &err), 0);
    t = format_reader_tensor(r, 2);
    uint8_t *tb = malloc(t->length);
    /* ... reading the tensor or its slice fails with EIO naming both */
    assert_int_equal(format_reader_read_tensor(r, 2, tb, t->length, &err), -EIO);
    assert_non_null(strstr(err.msg, "checksum mismatch"));
    assert_non_null(strstr(err.msg, t->name));
    const struct format_slice_info *s = format_reader_slice(r, slice);
    uint8_t *sb = malloc(s->length);
    assert_int_equal(format_reader_read_slice(r, slice, sb, s->length, &err), -EIO);
    assert_non_null(strstr(err.msg, "slice"));
    /* the other tensors still read */
    const struct format_tensor_info *t0 = format_reader_tensor(r, 0);
    uint8_t *b0 = malloc(t0->length);
    assert_int_equal(format_reader_read_tensor(r, 0, b0, t0->length, &err), 0);
    free(b0);
    free(sb);
    free(tb);
    format_reader_close(r);
    free(buf);
}

static void test_missing_file(void **state)
{
    (void)state;
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open("/nonexistent/x.sluice", &r, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "/nonexistent/x.sluice"));
    assert_int_equal(format_reader_open(test_tmpdir(), &r, &err), -EINVAL); /* a directory */
}

/* ---- activation scales (issue 21, finding 3) ----------------------------------- */

/* good_file()'s tensor 2 (blk.0.attn_q.weight, q8, act_scale 0.5) with its
 * act_scale set to v and the index and header checksums resealed, so only the
 * value check can catch it. */
static void forge_act_scale(uint8_t *buf, float v)
{
    uint64_t index = sl_load_le64(buf + H_INDEX_OFFSET);
    uint64_t index_len = sl_load_le64(buf + H_INDEX_OFFSET + 8);
    assert_string_equal((const char *)buf + index + 2 * T_SIZE, "blk.0.attn_q.weight");
    sl_store_lef32(buf + index + 2 * T_SIZE + T_ACT_SCALE, v);
    sl_store_le64(buf + H_INDEX_SUM, format_checksum(buf + index, index_len));
    reseal_header(buf);
}

static const struct {
    float v;
    const char *shown; /* as the message prints it */
} bad_act[] = {{NAN, "nan"}, {-1.0f, "-1"}, {INFINITY, "inf"}, {-INFINITY, "-inf"}};

static void test_act_scale_rejected(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = good_file(&len);
    struct sl_err err;
    for (size_t i = 0; i < sizeof bad_act / sizeof bad_act[0]; i++) {
        forge_act_scale(buf, bad_act[i].v);
        assert_int_equal(open_bytes(buf, len, &err), -EINVAL);
        assert_non_null(strstr(err.msg, "'blk.0.attn_q.weight'"));
        assert_non_null(strstr(err.msg, "activation scale"));
        if (!strstr(err.msg, bad_act[i].shown))
            fail_msg("message does not show %s: %s", bad_act[i].shown, err.msg);
    }
    /* 0 (dynamic) and any positive finite value, however small or large, open */
    const float good[] = {0.0f, 1e-30f, 0.25f, 3e38f};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        forge_act_scale(buf, good[i]);
        if (open_bytes(buf, len, &err) != 0)
            fail_msg("act_scale %g refused: %s", (double)good[i], err.msg);
    }
    free(buf);
}

static void test_act_scale_writer(void **state)
{
    (void)state;
    struct model q;
    struct sl_err err;
    make_model(&q, 0, 1);
    char *path = path_in_tmp("act.sluice");
    struct format_writer *w;
    assert_int_equal(format_writer_create(path, &w, &err), 0);
    assert_int_equal(format_writer_set_config(w, &q.cfg, &err), 0);
    assert_int_equal(format_writer_add_tensor(w, &q.desc[0], q.data[0], q.len[0], &err), 0);
    assert_int_equal(format_writer_add_tensor(w, &q.desc[1], q.data[1], q.len[1], &err), 0);
    for (size_t i = 0; i < sizeof bad_act / sizeof bad_act[0]; i++) {
        struct format_tensor_desc d = q.desc[2];
        d.act_scale = bad_act[i].v;
        assert_int_equal(format_writer_add_tensor(w, &d, q.data[2], q.len[2], &err), -EINVAL);
        assert_non_null(strstr(err.msg, "'blk.0.attn_q.weight'"));
        if (!strstr(err.msg, bad_act[i].shown))
            fail_msg("message does not show %s: %s", bad_act[i].shown, err.msg);
    }
    assert_int_equal(format_writer_add_tensor(w, &q.desc[2], q.data[2], q.len[2], &err), 0);
    format_writer_destroy(w);
    free_model(&q);
}

/* inspect, run and mount (the built binary) refuse the container with the
 * reader's message; none of them falls back to dynamic scaling. */
static void test_act_scale_cli(void **state)
{
    (void)state;
    const char *bin = test_sluice_bin();
    if (!bin)
        skip();
    size_t len;
    uint8_t *buf = good_file(&len);
    const char *dir = test_tmpdir();
    char model[512], errf[512], mnt[512];
    snprintf(model, sizeof model, "%s/act.sluice", dir);
    snprintf(errf, sizeof errf, "%s/act.err", dir);
    snprintf(mnt, sizeof mnt, "%s/mnt", dir);
    assert_int_equal(mkdir(mnt, 0755), 0);
    for (size_t i = 0; i < sizeof bad_act / sizeof bad_act[0]; i++) {
        forge_act_scale(buf, bad_act[i].v);
        FILE *f = fopen(model, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(buf, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
        const char *cmds[] = {"inspect %s", "run %s -p hello -n 4", "mount %s %s -f"};
        for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
            char args[1200];
            snprintf(args, sizeof args, cmds[c], model, mnt);
            int rc = test_system("timeout 20 %s %s >/dev/null 2>%s", bin, args, errf);
            char *e = test_read_file(errf, NULL);
            assert_non_null(e);
            if (rc != 1 || !strstr(e, model) || !strstr(e, "'blk.0.attn_q.weight'") ||
                !strstr(e, "activation scale") || !strstr(e, bad_act[i].shown))
                fail_msg("sluice %s: exit %d, stderr: %s", args, rc, e);
            free(e);
        }
    }
    free(buf);
}

/* ---- writer rejections ---------------------------------------------------------- */

static void test_writer_rejects(void **state)
{
    (void)state;
    struct model m;
    struct sl_err err;
    make_model(&m, 0, 0);
    const char *dir = test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/w.sluice", dir);

    struct format_writer *w;
    assert_int_equal(format_writer_create(path, &w, &err), 0);
    /* tensor before config */
    assert_int_equal(format_writer_add_tensor(w, &m.desc[0], m.data[0], m.len[0], &err), -EINVAL);
    struct format_config bad = m.cfg;
    bad.n_kv_heads = 3; /* does not divide 2 heads */
    assert_int_equal(format_writer_set_config(w, &bad, &err), -EINVAL);
    assert_int_equal(format_writer_set_config(w, &m.cfg, &err), 0);
    assert_int_equal(format_writer_set_tokenizer(w, &m.tok, &err), 0);
    /* wrong length */
    assert_int_equal(format_writer_add_tensor(w, &m.desc[0], m.data[0], m.len[0] - 4, &err),
                     -EINVAL);
    /* wrong shape */
    struct format_tensor_desc d = m.desc[0];
    d.shape[1] = 9;
    assert_int_equal(format_writer_add_tensor(w, &d, m.data[0], 10 * 9 * 4, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "shape"));
    /* out of order: layer 0's wq before the embedding is fine; then the embedding is late */
    assert_int_equal(format_writer_add_tensor(w, &m.desc[1], m.data[1], m.len[1], &err), 0);
    assert_int_equal(format_writer_add_tensor(w, &m.desc[0], m.data[0], m.len[0], &err), -EINVAL);
    assert_non_null(strstr(err.msg, "order"));
    /* same role twice */
    d = m.desc[1];
    d.name = "other";
    assert_int_equal(format_writer_add_tensor(w, &d, m.data[1], m.len[1], &err), -EINVAL);
    /* a quantized norm */
    d = m.desc[6];
    d.encoding = FORMAT_ENC_Q8_CHANNEL;
    assert_int_equal(format_writer_add_tensor(w, &d, m.data[6], m.len[6], &err), -EINVAL);
    /* incomplete model: finish refuses and leaves nothing behind */
    assert_int_equal(format_writer_finish(w, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "tensors were added"));
    format_writer_destroy(w);
    assert_int_equal(count_files(dir), 0);

    /* a q8 tensor with code -128 is rejected */
    struct model q;
    make_model(&q, 0, 1);
    assert_int_equal(format_writer_create(path, &w, &err), 0);
    assert_int_equal(format_writer_set_config(w, &q.cfg, &err), 0);
    assert_int_equal(format_writer_add_tensor(w, &q.desc[0], q.data[0], q.len[0], &err), 0);
    assert_int_equal(format_writer_add_tensor(w, &q.desc[1], q.data[1], q.len[1], &err), 0);
    q.data[2][64] = 0x80;
    assert_int_equal(format_writer_add_tensor(w, &q.desc[2], q.data[2], q.len[2], &err), -EINVAL);
    assert_non_null(strstr(err.msg, "-128"));
    format_writer_destroy(w);
    assert_int_equal(count_files(dir), 0);
    free_model(&q);
    free_model(&m);
}

int main(void)
{
    test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_untied),
        cmocka_unit_test(test_roundtrip_tied),
        cmocka_unit_test(test_roundtrip_q8),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bad_magic),
        cmocka_unit_test(test_wrong_version),
        cmocka_unit_test(test_version1_loads),
        cmocka_unit_test(test_corrupt_header),
        cmocka_unit_test(test_out_of_bounds_offset),
        cmocka_unit_test(test_meta_corrupt),
        cmocka_unit_test(test_data_checksum),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_act_scale_rejected),
        cmocka_unit_test(test_act_scale_writer),
        cmocka_unit_test(test_act_scale_cli),
        cmocka_unit_test(test_writer_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
