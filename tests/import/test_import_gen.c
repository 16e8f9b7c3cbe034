/* test_import_gen.c: the importers on models written by the test itself
 * (gen_models.c), so every variant the real files in ../shared lack is
 * covered and the test needs nothing outside the build:
 * - llama2.c tied and untied (negative vocab_size);
 * - GGUF v2/v3 with F32, F16, BF16 and Q8_0 weights, general.alignment, a
 *   copied output.weight, metadata of every value type incl. nested arrays;
 * - safetensors F32/F16/BF16, single file, file path and 3 shards with an
 *   index, tied and untied, eos_token_id as a list;
 * - --dtype conversions;
 * every tensor compared bit for bit with what its storage holds, tokenizers
 * identical across formats, config fields; then rejection paths (truncation at
 * every header byte and at random data offsets, bad values in every format),
 * each error naming the file, nothing left at the output path. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gen_models.h"
#include "import.h"
#include "testutil.h"

static const char *dir;

static const char *tmp(const char *name)
{
    static char buf[16][4096];
    static int k;
    char *p = buf[k++ % 16];
    snprintf(p, 4096, "%s/%s", dir, name);
    return p;
}

static void mkdir_p(const char *p)
{
    if (mkdir(p, 0755) < 0 && errno != EEXIST)
        fail_msg("mkdir %s: %s", p, strerror(errno));
}

static struct format_reader *import_ok(const char *src, const char *tok, int dtype, const char *out)
{
    struct import_opts o = {.tokenizer = tok, .dtype = dtype};
    struct sl_err err = {{0}};
    if (import_model(src, &o, out, &err) < 0)
        fail_msg("import %s: %s", src, err.msg);
    struct format_reader *r;
    if (format_reader_open(out, &r, &err) < 0)
        fail_msg("open %s: %s", out, err.msg);
    return r;
}

static uint32_t enc_of(enum gen_type t)
{
    return t == GEN_F16 ? FORMAT_ENC_F16 : t == GEN_BF16 ? FORMAT_ENC_BF16 : FORMAT_ENC_F32;
}

/* Every tensor of m in r: 2-D weights stored as w2d, norms as wnorm; dtype
 * -1 keeps the storage precision (Q8_0 -> F32), else the container encoding. */
static void check_tensors(struct format_reader *r, const struct gen_model *m, enum gen_type w2d,
                          enum gen_type wnorm, int dtype)
{
    assert_int_equal(format_reader_n_tensors(r), m->n);
    for (size_t i = 0; i < m->n; i++) {
        int k = format_reader_find(r, m->layer[i], m->role[i]);
        if (k < 0)
            fail_msg("tensor %zu (layer %d role %u) missing", i, m->layer[i], m->role[i]);
        assert_int_equal(k, (int)i); /* execution order */
        const struct format_tensor_info *t = format_reader_tensor(r, (uint32_t)k);
        enum gen_type st = m->cols[i] == 1 ? wnorm : w2d;
        uint32_t enc = dtype >= 0 ? (uint32_t)dtype : enc_of(st);
        assert_int_equal(t->encoding, enc);
        assert_int_equal(t->n_dims, m->cols[i] == 1 ? 1 : 2);
        assert_int_equal(t->shape[0], m->rows[i]);
        if (m->cols[i] != 1)
            assert_int_equal(t->shape[1], m->cols[i]);
        uint64_t n = m->rows[i] * m->cols[i];
        float *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
        void *raw = malloc(t->length);
        gen_expected(m, i, st, want);
        if (enc == FORMAT_ENC_F16)
            for (uint64_t j = 0; j < n; j++)
                want[j] = sl_f16_to_f32(sl_f32_to_f16(want[j]));
        else if (enc == FORMAT_ENC_BF16)
            for (uint64_t j = 0; j < n; j++)
                want[j] = sl_bf16_to_f32(sl_f32_to_bf16(want[j]));
        struct sl_err err;
        assert_int_equal(format_reader_read_tensor(r, (uint32_t)k, raw, t->length, &err), 0);
        assert_int_equal(format_decode_float(t->encoding, raw, got, n), 0);
        for (uint64_t j = 0; j < n; j++)
            if (memcmp(&want[j], &got[j], 4))
                fail_msg("%s[%llu]: got %g, want %g", t->name, (unsigned long long)j,
                         (double)got[j], (double)want[j]);
        free(want);
        free(got);
        free(raw);
    }
}

static void check_tokenizer(struct format_reader *r, const struct gen_model *m)
{
    const struct format_tokenizer *t = format_reader_tokenizer(r);
    assert_int_equal(t->n_tokens, m->cfg.vocab_size);
    for (uint32_t i = 0; i < t->n_tokens; i++) {
        if (t->lens[i] != m->lens[i] || memcmp(t->tokens[i], m->strs[i], m->lens[i]))
            fail_msg("token %u: '%.*s', want '%s'", i, (int)t->lens[i], t->tokens[i], m->strs[i]);
        assert_true(t->scores[i] == m->scores[i]);
    }
}

static void check_meta(struct format_reader *r, const char *fmt, const char *src)
{
    const void *v;
    uint64_t n;
    assert_int_equal(format_reader_meta_get(r, "source.format", &v, &n), 0);
    assert_int_equal(n, strlen(fmt));
    assert_memory_equal(v, fmt, n);
    assert_int_equal(format_reader_meta_get(r, "source.path", &v, &n), 0);
    assert_int_equal(n, strlen(src));
    assert_memory_equal(v, src, n);
}

static void test_llama2c(void **st)
{
    (void)st;
    for (int tied = 0; tied < 2; tied++) {
        struct gen_model m;
        assert_int_equal(gen_model_create(&m, tied, test_seed() + (uint64_t)tied), 0);
        assert_int_equal(gen_write_llama2c(&m, tmp("m.bin"), tmp("tok.bin")), 0);
        enum import_source kind;
        struct sl_err err;
        assert_int_equal(import_source_detect(tmp("m.bin"), &kind, &err), 0);
        assert_int_equal(kind, IMPORT_SRC_LLAMA2C);
        struct format_reader *r = import_ok(tmp("m.bin"), tmp("tok.bin"), -1, tmp("o.sluice"));
        const struct format_config *c = format_reader_config(r);
        struct format_config want = m.cfg;
        want.rope_theta = 10000.0f; /* llama2.c's fixed values */
        want.norm_eps = 1e-5f;
        assert_memory_equal(c, &want, sizeof want);
        check_tensors(r, &m, GEN_F32, GEN_F32, -1);
        check_tokenizer(r, &m);
        check_meta(r, "llama2c", tmp("m.bin"));
        format_reader_close(r);
        /* conversions */
        r = import_ok(tmp("m.bin"), tmp("tok.bin"), FORMAT_ENC_F16, tmp("o16.sluice"));
        check_tensors(r, &m, GEN_F32, GEN_F32, FORMAT_ENC_F16);
        format_reader_close(r);
        r = import_ok(tmp("m.bin"), tmp("tok.bin"), FORMAT_ENC_BF16, tmp("ob.sluice"));
        check_tensors(r, &m, GEN_F32, GEN_F32, FORMAT_ENC_BF16);
        format_reader_close(r);
        gen_model_destroy(&m);
    }
}

static void test_gguf(void **st)
{
    (void)st;
    static const enum gen_type types[] = {GEN_F32, GEN_F16, GEN_BF16, GEN_Q8_0};
    int variant = 0;
    for (int tied = 0; tied < 2; tied++) {
        struct gen_model m;
        assert_int_equal(gen_model_create(&m, tied, test_seed() + 10 + (uint64_t)tied), 0);
        assert_int_equal(gen_write_llama2c(&m, tmp("m.bin"), tmp("tok.bin")), 0);
        struct format_reader *ref = import_ok(tmp("m.bin"), tmp("tok.bin"), -1, tmp("l.sluice"));
        for (size_t t = 0; t < 4; t++, variant++) {
            /* norms: F32 as llama.cpp writes them, also 16-bit and Q8_0 (1-D blocks) */
            enum gen_type norms = tied ? types[t] : GEN_F32;
            struct gen_gguf_opts o = {.version = variant % 2 ? 2 : 3,
                                      .weights = types[t],
                                      .norms = norms,
                                      .alignment = variant % 3 == 1 ? 64 : 0,
                                      .output_copy = tied && t % 2 == 0,
                                      .scores_first = variant % 4 == 3};
            assert_int_equal(gen_write_gguf(&m, tmp("m.gguf"), &o), 0);
            enum import_source kind;
            struct sl_err err;
            assert_int_equal(import_source_detect(tmp("m.gguf"), &kind, &err), 0);
            assert_int_equal(kind, IMPORT_SRC_GGUF);
            struct format_reader *r = import_ok(tmp("m.gguf"), NULL, -1, tmp("g.sluice"));
            assert_memory_equal(format_reader_config(r), &m.cfg, sizeof m.cfg);
            check_tensors(r, &m, types[t], norms, -1);
            check_tokenizer(r, &m);
            check_meta(r, "gguf", tmp("m.gguf"));
            /* the same container tokenizer as from the llama2.c tokenizer file */
            const struct format_tokenizer *a = format_reader_tokenizer(r);
            const struct format_tokenizer *b = format_reader_tokenizer(ref);
            assert_int_equal(a->max_token_len, b->max_token_len);
            format_reader_close(r);
            if (types[t] == GEN_F32) {
                /* F32 GGUF and llama2.c give byte-identical tensors */
                r = import_ok(tmp("m.gguf"), NULL, -1, tmp("g.sluice"));
                for (uint32_t i = 0; i < format_reader_n_tensors(r); i++) {
                    const struct format_tensor_info *x = format_reader_tensor(r, i);
                    const struct format_tensor_info *y = format_reader_tensor(ref, i);
                    assert_int_equal(x->checksum, y->checksum);
                }
                format_reader_close(r);
            }
            if (types[t] == GEN_BF16) { /* widening back to f32 is exact */
                r = import_ok(tmp("m.gguf"), NULL, FORMAT_ENC_F32, tmp("g32.sluice"));
                check_tensors(r, &m, GEN_BF16, norms, FORMAT_ENC_F32);
                format_reader_close(r);
            }
        }
        format_reader_close(ref);
        gen_model_destroy(&m);
    }
}

/* A GGUF's tokenizer.chat_template is kept as metadata (sluice chat uses it). */
static void test_gguf_chat_template(void **st)
{
    (void)st;
    struct gen_model m;
    assert_int_equal(gen_model_create(&m, 1, test_seed() + 40), 0);
    const char *tpl = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                      "<|im_end|>\n{% endfor %}";
    struct gen_gguf_opts o = {.weights = GEN_F32, .norms = GEN_F32,
                              .extra_key = "tokenizer.chat_template", .extra_val = tpl};
    assert_int_equal(gen_write_gguf(&m, tmp("t.gguf"), &o), 0);
    struct format_reader *r = import_ok(tmp("t.gguf"), NULL, -1, tmp("t.sluice"));
    const void *v;
    size_t n;
    assert_int_equal(format_reader_meta_get(r, "tokenizer.chat_template", &v, &n), 0);
    assert_int_equal(n, strlen(tpl));
    assert_memory_equal(v, tpl, n);
    format_reader_close(r);
    /* none without one */
    o.extra_key = NULL;
    assert_int_equal(gen_write_gguf(&m, tmp("t.gguf"), &o), 0);
    r = import_ok(tmp("t.gguf"), NULL, -1, tmp("t.sluice"));
    assert_int_equal(format_reader_meta_get(r, "tokenizer.chat_template", &v, &n), -ENOENT);
    format_reader_close(r);
    gen_model_destroy(&m);
}

static void test_safetensors(void **st)
{
    (void)st;
    static const enum gen_type types[] = {GEN_F32, GEN_F16, GEN_BF16};
    int variant = 0;
    for (int tied = 0; tied < 2; tied++) {
        struct gen_model m;
        assert_int_equal(gen_model_create(&m, tied, test_seed() + 20 + (uint64_t)tied), 0);
        assert_int_equal(gen_write_llama2c(&m, tmp("m.bin"), tmp("tok.bin")), 0);
        for (size_t t = 0; t < 3; t++) {
            for (int shards = 1; shards <= 3; shards += 2, variant++) {
                char d[64];
                snprintf(d, sizeof d, "hf%d", variant);
                char hf[4096];
                snprintf(hf, sizeof hf, "%s", tmp(d));
                mkdir_p(hf);
                struct gen_st_opts o = {
                    .dtype = types[t], .n_shards = shards, .eos_list = variant % 2};
                assert_int_equal(gen_write_safetensors(&m, hf, &o), 0);
                enum import_source kind;
                struct sl_err err;
                assert_int_equal(import_source_detect(hf, &kind, &err), 0);
                assert_int_equal(kind, IMPORT_SRC_SAFETENSORS);
                struct format_reader *r = import_ok(hf, tmp("tok.bin"), -1, tmp("h.sluice"));
                assert_memory_equal(format_reader_config(r), &m.cfg, sizeof m.cfg);
                check_tensors(r, &m, types[t], types[t], -1);
                check_tokenizer(r, &m);
                check_meta(r, "safetensors", hf);
                format_reader_close(r);
                if (shards == 1) { /* the .safetensors file itself */
                    char f[4200];
                    snprintf(f, sizeof f, "%s/model.safetensors", hf);
                    assert_int_equal(import_source_detect(f, &kind, &err), 0);
                    assert_int_equal(kind, IMPORT_SRC_SAFETENSORS);
                    r = import_ok(f, tmp("tok.bin"), FORMAT_ENC_F16, tmp("h16.sluice"));
                    check_tensors(r, &m, types[t], types[t], FORMAT_ENC_F16);
                    format_reader_close(r);
                    /* and as a path relative to the working directory */
                    char cwd[4096], rel[128];
                    assert_non_null(getcwd(cwd, sizeof cwd));
                    assert_int_equal(chdir(dir), 0);
                    snprintf(rel, sizeof rel, "%s/model.safetensors", d);
                    r = import_ok(rel, "tok.bin", -1, "hrel.sluice");
                    check_tensors(r, &m, types[t], types[t], -1);
                    format_reader_close(r);
                    assert_int_equal(chdir(cwd), 0);
                }
            }
        }
        gen_model_destroy(&m);
    }
}

/* ---- rejections ------------------------------------------------------------------------ */

/* Import must fail with a message containing `want` (and, when given, `file`,
 * the name of the offending file), leaving nothing at the output path. */
static void reject(const char *src, const char *tok, const char *want, const char *file)
{
    struct import_opts o = {.tokenizer = tok, .dtype = -1};
    struct sl_err err = {{0}};
    const char *out = tmp("rej.sluice");
    int ret = import_model(src, &o, out, &err);
    if (ret >= 0)
        fail_msg("%s: imported, expected an error about '%s'", src, want ? want : "?");
    assert_true(ret < 0);
    assert_true(strlen(err.msg) > 0);
    if (want && !strstr(err.msg, want))
        fail_msg("%s: error '%s' lacks '%s'", src, err.msg, want);
    if (file && !strstr(err.msg, file))
        fail_msg("%s: error '%s' does not name '%s'", src, err.msg, file);
    struct stat sb;
    assert_int_not_equal(stat(out, &sb), 0);
}

static uint8_t *slurp(const char *p, size_t *n)
{
    uint8_t *b = test_read_file(p, n);
    if (!b)
        fail_msg("cannot read %s", p);
    return b;
}

/* Offset of the first `s` in b (fails when absent). */
static size_t find_bytes(const uint8_t *b, size_t n, const char *s)
{
    const uint8_t *p = memmem(b, n, s, strlen(s));
    if (!p)
        fail_msg("'%s' not found", s);
    return (size_t)(p - b);
}

static void test_reject_llama2c(void **st)
{
    (void)st;
    struct gen_model m;
    assert_int_equal(gen_model_create(&m, 0, test_seed() + 30), 0);
    assert_int_equal(gen_write_llama2c(&m, tmp("m.bin"), tmp("tok.bin")), 0);
    size_t len, tlen;
    uint8_t *b = slurp(tmp("m.bin"), &len);
    uint8_t *t = slurp(tmp("tok.bin"), &tlen);
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    /* truncations: every 4 bytes of the start, then random lengths, then len - 1 */
    for (size_t cut = 0; cut < len; cut += cut < 256 ? 4 : 1 + test_rng_below(&rng, 40000)) {
        assert_int_equal(gen_write_file(tmp("cut.bin"), b, cut), 0);
        reject(tmp("cut.bin"), tmp("tok.bin"), NULL, "cut.bin");
    }
    assert_int_equal(gen_write_file(tmp("cut.bin"), b, len - 1), 0);
    reject(tmp("cut.bin"), tmp("tok.bin"), "truncated", "cut.bin");
    /* trailing bytes */
    uint8_t *big = calloc(1, len + 8);
    memcpy(big, b, len);
    assert_int_equal(gen_write_file(tmp("long.bin"), big, len + 8), 0);
    reject(tmp("long.bin"), tmp("tok.bin"), "trailing", "long.bin");
    /* the classifier flag flipped: sizes no longer match */
    memcpy(big, b, len);
    sl_store_le32(big + 20, m.cfg.vocab_size);
    assert_int_equal(gen_write_file(tmp("flip.bin"), big, len), 0);
    reject(tmp("flip.bin"), tmp("tok.bin"), "implies", "flip.bin");
    /* a header with zero/negative/indivisible fields */
    static const struct {
        int field;
        int32_t v;
    } bad[] = {{0, 0}, {0, -64}, {1, 0}, {2, 0},  {3, 0},         {3, 7},         {4, 0},
               {4, 3}, {5, 0},   {6, 0}, {6, -1}, {5, INT32_MIN}, {0, INT32_MAX}, {1, INT32_MAX}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(big, b, len);
        sl_store_le32(big + 4 * bad[i].field, (uint32_t)bad[i].v);
        assert_int_equal(gen_write_file(tmp("hdr.bin"), big, len), 0);
        reject(tmp("hdr.bin"), tmp("tok.bin"), NULL, "hdr.bin");
    }
    free(big);
    /* the tokenizer: missing, truncated at every byte, trailing, bad lengths */
    reject(tmp("m.bin"), NULL, "--tokenizer", "m.bin");
    reject(tmp("m.bin"), tmp("nonexistent.tok"), NULL, "nonexistent.tok");
    for (size_t cut = 0; cut < tlen; cut += 1 + test_rng_below(&rng, 8)) {
        assert_int_equal(gen_write_file(tmp("cut.tok"), t, cut), 0);
        reject(tmp("m.bin"), tmp("cut.tok"), NULL, "cut.tok");
    }
    uint8_t *tb = calloc(1, tlen + 4);
    memcpy(tb, t, tlen);
    assert_int_equal(gen_write_file(tmp("long.tok"), tb, tlen + 4), 0);
    reject(tmp("m.bin"), tmp("long.tok"), "bytes after", "long.tok");
    sl_store_le32(tb, 0);
    assert_int_equal(gen_write_file(tmp("z.tok"), tb, tlen), 0);
    reject(tmp("m.bin"), tmp("z.tok"), NULL, "z.tok");
    memcpy(tb, t, tlen);
    sl_store_le32(tb + 8, 0x7fffffff); /* token 0's length */
    assert_int_equal(gen_write_file(tmp("len.tok"), tb, tlen), 0);
    reject(tmp("m.bin"), tmp("len.tok"), "length", "len.tok");
    free(tb);
    free(t);
    free(b);
    gen_model_destroy(&m);
}

static void test_reject_gguf(void **st)
{
    (void)st;
    struct gen_model m;
    assert_int_equal(gen_model_create(&m, 0, test_seed() + 40), 0);
    struct gen_gguf_opts o = {.weights = GEN_Q8_0, .alignment = 64};
    assert_int_equal(gen_write_gguf(&m, tmp("m.gguf"), &o), 0);
    size_t len;
    uint8_t *b = slurp(tmp("m.gguf"), &len);
    uint8_t *c = malloc(len);
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 1);
    /* truncation at every byte of the metadata and tensor infos, then at
     * random points of the data */
    size_t hdr_end = find_bytes(b, len, "blk.1.ffn_down.weight") + 64;
    for (size_t cut = 0; cut < len; cut += cut < hdr_end ? 1 : 1 + test_rng_below(&rng, 9000)) {
        assert_int_equal(gen_write_file(tmp("cut.gguf"), b, cut), 0);
        reject(tmp("cut.gguf"), NULL, NULL, cut >= 4 ? "cut.gguf" : NULL);
    }
    assert_int_equal(gen_write_file(tmp("cut.gguf"), b, len - 1), 0);
    reject(tmp("cut.gguf"), NULL, "outside the data", "cut.gguf");
    /* version */
    static const uint32_t versions[] = {0, 1, 4, 5, 0xffffffffu};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        uint32_t v = versions[i];
        memcpy(c, b, len);
        sl_store_le32(c + 4, v);
        assert_int_equal(gen_write_file(tmp("v.gguf"), c, len), 0);
        char want[32];
        snprintf(want, sizeof want, "version %u", v);
        reject(tmp("v.gguf"), NULL, want, "v.gguf");
    }
    /* huge counts */
    memcpy(c, b, len);
    sl_store_le64(c + 8, UINT64_MAX);
    assert_int_equal(gen_write_file(tmp("n.gguf"), c, len), 0);
    reject(tmp("n.gguf"), NULL, "implausible", "n.gguf");
    memcpy(c, b, len);
    sl_store_le64(c + 16, 1000); /* more keys than there are */
    assert_int_equal(gen_write_file(tmp("n.gguf"), c, len), 0);
    reject(tmp("n.gguf"), NULL, NULL, "n.gguf");
    /* a string length beyond the file */
    memcpy(c, b, len);
    sl_store_le64(c + 24, UINT64_MAX - 3);
    assert_int_equal(gen_write_file(tmp("s.gguf"), c, len), 0);
    reject(tmp("s.gguf"), NULL, "truncated", "s.gguf");
    /* an unknown value type (test.u8's type) */
    memcpy(c, b, len);
    sl_store_le32(c + find_bytes(c, len, "test.u8") + 7, 13);
    assert_int_equal(gen_write_file(tmp("t.gguf"), c, len), 0);
    reject(tmp("t.gguf"), NULL, "value type 13", "t.gguf");
    /* a hyperparameter of the wrong type: block_count as a string */
    memcpy(c, b, len);
    sl_store_le32(c + find_bytes(c, len, "llama.block_count") + 17, 8);
    assert_int_equal(gen_write_file(tmp("h.gguf"), c, len), 0);
    reject(tmp("h.gguf"), NULL, NULL, "h.gguf");
    /* head_count_kv that does not divide head_count */
    memcpy(c, b, len);
    sl_store_le32(c + find_bytes(c, len, "llama.attention.head_count_kv") + 29 + 4, 3);
    assert_int_equal(gen_write_file(tmp("kv.gguf"), c, len), 0);
    reject(tmp("kv.gguf"), NULL, NULL, "kv.gguf");
    /* an unsupported architecture */
    memcpy(c, b, len);
    memcpy(c + find_bytes(c, len, "llama"), "gemma", 5);
    assert_int_equal(gen_write_file(tmp("a.gguf"), c, len), 0);
    reject(tmp("a.gguf"), NULL, "gemma", "a.gguf");
    /* unsupported tensor types: Q4_0 (2), I8 (24); Q4_K (12) is read, but its
     * blocks of 256 do not fit rows of 64 (test_import_kquant has the rest) */
    static const uint32_t types[] = {2, 24, 99, 12};
    for (size_t i = 0; i < 4; i++) {
        memcpy(c, b, len);
        sl_store_le32(c + find_bytes(c, len, "blk.0.attn_k.weight") + 19 + 4 + 16, types[i]);
        assert_int_equal(gen_write_file(tmp("ty.gguf"), c, len), 0);
        char want[64];
        snprintf(want, sizeof want, "ggml type %u", types[i]);
        reject(tmp("ty.gguf"), NULL, types[i] == 12 ? "not a multiple of 256" : want, "ty.gguf");
    }
    /* shapes: a dimension that disagrees, a 3-D tensor, 0 and 5 dimensions */
    memcpy(c, b, len);
    sl_store_le64(c + find_bytes(c, len, "blk.1.ffn_up.weight") + 19 + 4 + 8, 97);
    assert_int_equal(gen_write_file(tmp("sh.gguf"), c, len), 0);
    reject(tmp("sh.gguf"), NULL, "ffn_up", "sh.gguf");
    for (uint32_t nd = 0; nd < 6; nd += 5) {
        memcpy(c, b, len);
        sl_store_le32(c + find_bytes(c, len, "blk.1.ffn_up.weight") + 19, nd);
        assert_int_equal(gen_write_file(tmp("nd.gguf"), c, len), 0);
        reject(tmp("nd.gguf"), NULL, "dimensions", "nd.gguf");
    }
    /* a misaligned and an out-of-range tensor offset */
    size_t toff = find_bytes(c, len, "blk.1.ffn_up.weight") + 19 + 4 + 16 + 4;
    memcpy(c, b, len);
    sl_store_le64(c + toff, sl_load_le64(b + toff) + 2);
    assert_int_equal(gen_write_file(tmp("al.gguf"), c, len), 0);
    reject(tmp("al.gguf"), NULL, "aligned", "al.gguf");
    memcpy(c, b, len);
    sl_store_le64(c + toff, UINT64_MAX - 63);
    assert_int_equal(gen_write_file(tmp("off.gguf"), c, len), 0);
    reject(tmp("off.gguf"), NULL, "outside", "off.gguf");
    /* issue 21: the tensors must tile the data section: one moved on by
     * the alignment (a gap, then an overlap), bytes left after the last */
    {
        uint32_t ga = sl_load_le32(b + find_bytes(b, len, "general.alignment") + 17 + 4);
        memcpy(c, b, len);
        sl_store_le64(c + toff, sl_load_le64(b + toff) + ga);
        assert_int_equal(gen_write_file(tmp("gap.gguf"), c, len), 0);
        reject(tmp("gap.gguf"), NULL, "must tile the data section", "gap.gguf");
        uint8_t *e = calloc(1, len + 2 * ga);
        memcpy(e, b, len);
        assert_int_equal(gen_write_file(tmp("ext.gguf"), e, len + 2 * ga), 0);
        reject(tmp("ext.gguf"), NULL, "bytes after the last tensor", "ext.gguf");
        free(e);
    }
    /* general.alignment not a power of two */
    memcpy(c, b, len);
    sl_store_le32(c + find_bytes(c, len, "general.alignment") + 17 + 4, 48);
    assert_int_equal(gen_write_file(tmp("ga.gguf"), c, len), 0);
    reject(tmp("ga.gguf"), NULL, "alignment", "ga.gguf");
    /* tensors the model does not use (biases, rope_freqs, a layer too many)
     * and a duplicate name */
    static const struct {
        const char *from, *to, *want;
    } names[] = {
        {"blk.1.attn_v.weight", "blk.1.attn_v.bias__", "'blk.1.attn_v.bias__' is not part"},
        {"output_norm.weight", "rope_freqs.weight_", "'rope_freqs.weight_' is not part"},
        {"blk.1.attn_v.weight", "blk.2.attn_v.weight", "'blk.2.attn_v.weight' is not part"},
        {"blk.1.attn_v.weight", "blk.01.attn_v.weigh", "'blk.01.attn_v.weigh' is not part"},
        {"blk.1.attn_v.weight", "blk.1.attn_k.weight", "'blk.1.attn_k.weight' appears twice"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        memcpy(c, b, len);
        memcpy(c + find_bytes(c, len, names[i].from), names[i].to, strlen(names[i].to));
        assert_int_equal(gen_write_file(tmp("nm.gguf"), c, len), 0);
        reject(tmp("nm.gguf"), NULL, names[i].want, "nm.gguf");
    }
    /* a missing tensor: the count one short drops the last (blk.1.ffn_down) */
    memcpy(c, b, len);
    sl_store_le64(c + 8, sl_load_le64(b + 8) - 1);
    assert_int_equal(gen_write_file(tmp("mi.gguf"), c, len), 0);
    reject(tmp("mi.gguf"), NULL, "'blk.1.ffn_down.weight' is missing", "mi.gguf");
    /* a tokenizer other than SentencePiece's (llama 3's "gpt2" BPE) */
    memcpy(c, b, len);
    memcpy(c + find_bytes(c, len, "tokenizer.ggml.model") + 20 + 4 + 8, "gpt2x", 5);
    assert_int_equal(gen_write_file(tmp("tm.gguf"), c, len), 0);
    reject(tmp("tm.gguf"), NULL, "tokenizer.ggml.model 'gpt2x'", "tm.gguf");
    /* partial rotary: rope.dimension_count of half the head */
    memcpy(c, b, len);
    sl_store_le32(c + find_bytes(c, len, "llama.rope.dimension_count") + 26 + 4,
                  m.cfg.head_dim / 2);
    assert_int_equal(gen_write_file(tmp("rd.gguf"), c, len), 0);
    reject(tmp("rd.gguf"), NULL, "rope.dimension_count", "rd.gguf");
    /* scores that disagree with the tokens in count */
    memcpy(c, b, len);
    sl_store_le64(c + find_bytes(c, len, "tokenizer.ggml.scores") + 21 + 4 + 4, 299);
    assert_int_equal(gen_write_file(tmp("sc.gguf"), c, len), 0);
    reject(tmp("sc.gguf"), NULL, NULL, "sc.gguf");
    free(c);
    free(b);
    /* rope scaling (absent from the files above): "none" is fine, others not */
    o.extra_key = "llama.rope.scaling.type";
    o.extra_val = "none";
    assert_int_equal(gen_write_gguf(&m, tmp("rs.gguf"), &o), 0);
    struct format_reader *r = import_ok(tmp("rs.gguf"), NULL, -1, tmp("rs.sluice"));
    format_reader_close(r);
    o.extra_val = "yarn";
    assert_int_equal(gen_write_gguf(&m, tmp("rs.gguf"), &o), 0);
    reject(tmp("rs.gguf"), NULL, "llama.rope.scaling.type 'yarn'", "rs.gguf");
    gen_model_destroy(&m);
}

static void write_text(const char *path, const char *s)
{
    assert_int_equal(gen_write_file(path, s, strlen(s)), 0);
}

/* config.json of `hf` with `from` replaced by `to`, written into `dst` (with
 * a symlink to the weights). */
static void edit_config(const char *hf, const char *dst, const char *from, const char *to)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", hf);
    size_t n;
    char *c = (char *)slurp(p, &n);
    char *at = strstr(c, from);
    if (!at)
        fail_msg("'%s' not in config.json", from);
    char *out = malloc(n + strlen(to) + 1);
    sprintf(out, "%.*s%s%s", (int)(at - c), c, to, at + strlen(from));
    mkdir_p(dst);
    snprintf(p, sizeof p, "%s/config.json", dst);
    write_text(p, out);
    char w[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", dst);
    snprintf(w, sizeof w, "%s/model.safetensors", hf);
    unlink(p);
    assert_int_equal(symlink(w, p), 0);
    free(out);
    free(c);
}

static void test_reject_safetensors(void **st)
{
    (void)st;
    struct gen_model m;
    assert_int_equal(gen_model_create(&m, 1, test_seed() + 50), 0);
    assert_int_equal(gen_write_llama2c(&m, tmp("m.bin"), tmp("tok.bin")), 0);
    char hf[4096], tok[4096], cut[4096], sd[4096]; /* tmp()'s buffers are reused */
    snprintf(hf, sizeof hf, "%s", tmp("hfr"));
    snprintf(tok, sizeof tok, "%s", tmp("tok.bin"));
    snprintf(cut, sizeof cut, "%s", tmp("hfc"));
    snprintf(sd, sizeof sd, "%s", tmp("hfs"));
    mkdir_p(hf);
    struct gen_st_opts o = {.dtype = GEN_BF16};
    assert_int_equal(gen_write_safetensors(&m, hf, &o), 0);
    /* config.json edits */
    static const struct {
        const char *from, *to, *want, *file; /* file NULL: the model directory */
    } edits[] = {
        {"\"llama\"", "\"mistral\"", "mistral", NULL},
        {"\"LlamaForCausalLM\"", "\"LlamaForSequenceClassification\"", "LlamaForSequence", NULL},
        {"\"silu\"", "\"gelu\"", "gelu", NULL},
        {"\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\"}", "rope_scaling",
         NULL},
        {"\"hidden_size\": 64", "\"hidden_size\": 64, \"head_dim\": 32", "head_dim", NULL},
        {"\"hidden_size\": 64", "\"hidden_size\": 65", NULL, NULL},
        {"\"hidden_size\": 64", "\"hidden_size\": -64", "hidden_size", NULL},
        {"\"hidden_size\": 64", "\"hidden_size\": 1e30", "hidden_size", NULL},
        {"\"hidden_size\": 64", "\"hidden_size\": \"64\"", "hidden_size", NULL},
        {"\"hidden_size\": 64,", "", "hidden_size", NULL},
        {"\"intermediate_size\": 96", "\"intermediate_size\": 128", "shape", NULL},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4", "shape", NULL},
        {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3", "model.layers.2", NULL},
        {"\"vocab_size\": 300", "\"vocab_size\": 301", NULL, "tok.bin"},
        {"\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false", "lm_head", NULL},
        {"{", "{\"attention_bias\": true, ", "bias", NULL},
        {"{", "[", "JSON", NULL},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        char d[64];
        snprintf(d, sizeof d, "hfe%zu", i);
        edit_config(hf, tmp(d), edits[i].from, edits[i].to);
        /* errors about config.json name it, shape errors the weights in it */
        reject(tmp(d), tok, edits[i].want, edits[i].file ? edits[i].file : tmp(d));
    }
    /* no tokenizer; a directory without config.json */
    reject(hf, NULL, "--tokenizer", hf);
    mkdir_p(tmp("empty"));
    reject(tmp("empty"), tok, "config.json", "empty");
    /* the weights: truncated at every header byte and at random data points */
    char wp[4200];
    snprintf(wp, sizeof wp, "%s/model.safetensors", hf);
    size_t len;
    uint8_t *b = slurp(wp, &len);
    uint64_t hlen = sl_load_le64(b);
    edit_config(hf, cut, "{", "{");
    char cp[4200];
    snprintf(cp, sizeof cp, "%s/model.safetensors", cut);
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 2);
    for (size_t k = 0; k < len;
         k += k < hlen + 8 ? 1 + test_rng_below(&rng, 3) : 1 + test_rng_below(&rng, 5000)) {
        unlink(cp);
        assert_int_equal(gen_write_file(cp, b, k), 0);
        reject(cut, tok, NULL, "model.safetensors");
    }
    /* header edits: dtype, offsets, shape, length */
    char *h = malloc(hlen + 1);
    memcpy(h, b + 8, hlen);
    h[hlen] = 0;
    static const struct {
        const char *from, *to, *want, *file; /* file NULL: the weights */
    } hedits[] = {
        {"\"BF16\"", "\"I8\"  ", "dtype I8", NULL},
        {"\"BF16\"", "\"F64\" ", "dtype F64", NULL},
        {"\"data_offsets\": [0", "\"data_offsets\": [2", "data", NULL},
        {"\"data_offsets\": [0", "\"data_offsets\": [-1", "data", NULL},
        {"\"data_offsets\": [0", "\"data_offsets\": \"0", NULL, NULL},
        {"\"shape\": [300, 64]", "\"shape\": [64, 300]", "shape", NULL},
        {"\"shape\": [300, 64]", "\"shape\": [9e99, 64]", "shape", NULL},
        {"\"shape\": [300, 64]", "\"shape\": [300, 64, 1]", "shape", NULL},
        /* a renamed tensor is an extra one (issue 21, finding 2) */
        {"model.norm.weight", "model.norm.weigh_", "'model.norm.weigh_' is not part", NULL},
        {"{", "[", "JSON object", NULL},
    };
    for (size_t i = 0; i < sizeof hedits / sizeof hedits[0]; i++) {
        char *at = strstr(h, hedits[i].from);
        if (!at)
            fail_msg("'%s' not in the safetensors header", hedits[i].from);
        size_t fl = strlen(hedits[i].from), tl = strlen(hedits[i].to);
        size_t nh = hlen - fl + tl;
        uint8_t *nb = malloc(8 + nh + (len - 8 - hlen));
        sl_store_le64(nb, nh);
        memcpy(nb + 8, h, (size_t)(at - h));
        memcpy(nb + 8 + (at - h), hedits[i].to, tl);
        memcpy(nb + 8 + (at - h) + tl, at + fl, hlen - (size_t)(at - h) - fl);
        memcpy(nb + 8 + nh, b + 8 + hlen, len - 8 - hlen);
        unlink(cp);
        assert_int_equal(gen_write_file(cp, nb, 8 + nh + (len - 8 - hlen)), 0);
        reject(cut, tok, hedits[i].want, hedits[i].file ? hedits[i].file : "model.safetensors");
        free(nb);
    }
    /* issue 21, finding 1: a header length one less than the truth (the
     * header ends in padding, so the JSON still parses) shifts every tensor by
     * a byte; one more, and the data section loses its first byte. Either way
     * the tensors no longer tile the data section. */
    for (int delta = -1; delta <= 1; delta += 2) {
        uint8_t *nb1 = malloc(len + 1);
        memcpy(nb1, b, len);
        memcpy(h, b + 8, hlen);
        if (delta < 0) { /* pad the header by a space, claim the old length */
            memmove(nb1 + 8 + hlen + 1, b + 8 + hlen, len - 8 - hlen);
            nb1[8 + hlen] = ' ';
        }
        sl_store_le64(nb1, delta < 0 ? hlen : hlen + 1);
        if (delta > 0) { /* the data's first byte taken for a header space */
            nb1[8 + hlen] = ' ';
        }
        unlink(cp);
        assert_int_equal(gen_write_file(cp, nb1, delta < 0 ? len + 1 : len), 0);
        reject(cut, tok, "the tensors end at byte", "model.safetensors");
        free(nb1);
    }
    /* issue 21, finding 1: the ranges must tile the data section: the last
     * tensor moved 4 bytes on (4 bytes appended: a gap) or back (an overlap) */
    for (int delta = -4; delta <= 4; delta += 8) {
        const char *key = "\"data_offsets\": [";
        char *last = NULL;
        unsigned long long a = 0, e = 0;
        for (char *q = strstr(h, key); q; q = strstr(q + 1, key)) {
            unsigned long long qa, qe;
            if (sscanf(q + strlen(key), "%llu, %llu", &qa, &qe) == 2 && qe > e)
                last = q, a = qa, e = qe;
        }
        assert_non_null(last);
        char *end = strchr(last, ']');
        assert_non_null(end);
        size_t body = len - 8 - hlen, grow = delta > 0 ? (size_t)delta : 0;
        char *nh = malloc(hlen + 64);
        int k = snprintf(nh, hlen + 64, "%.*s%s%llu, %llu%s", (int)(last - h), h, key,
                         a + (unsigned long long)delta, e + (unsigned long long)delta, end);
        uint8_t *nb3 = calloc(1, 8 + (size_t)k + body + grow);
        sl_store_le64(nb3, (uint64_t)k);
        memcpy(nb3 + 8, nh, (size_t)k);
        memcpy(nb3 + 8 + k, b + 8 + hlen, body);
        unlink(cp);
        assert_int_equal(gen_write_file(cp, nb3, 8 + (size_t)k + body + grow), 0);
        reject(cut, tok, delta > 0 ? "leave a gap" : "overlap", "model.safetensors");
        free(nb3);
        free(nh);
    }
    /* issue 21, finding 2: an extra tensor in the header (its bytes appended
     * so that the data section still tiles) is refused, not dropped */
    {
        const char *extra = ",\"model.layers.0.self_attn.q_proj.bias\":{\"dtype\":\"F32\","
                            "\"shape\":[1],\"data_offsets\":[%zu,%zu]}}";
        char add[256];
        size_t body = len - 8 - hlen;
        snprintf(add, sizeof add, extra, body, body + 4);
        char *close = strrchr(h, '}');
        assert_non_null(close);
        size_t keep = (size_t)(close - h), nh = keep + strlen(add);
        uint8_t *nb2 = calloc(1, 8 + nh + body + 4);
        sl_store_le64(nb2, nh);
        memcpy(nb2 + 8, h, keep);
        memcpy(nb2 + 8 + keep, add, strlen(add));
        memcpy(nb2 + 8 + nh, b + 8 + hlen, body);
        unlink(cp);
        assert_int_equal(gen_write_file(cp, nb2, 8 + nh + body + 4), 0);
        reject(cut, tok, "'model.layers.0.self_attn.q_proj.bias' is not part",
               "model.safetensors");
        free(nb2);
    }
    /* a header length beyond the file */
    uint8_t *nb = malloc(len);
    memcpy(nb, b, len);
    sl_store_le64(nb, UINT64_MAX - 7);
    unlink(cp);
    assert_int_equal(gen_write_file(cp, nb, len), 0);
    reject(cut, tok, "header length", "model.safetensors");
    free(nb);
    free(h);
    free(b);
    /* sharded: a missing shard file, a tensor absent from the weight map, a
     * malformed index */
    mkdir_p(sd);
    o.n_shards = 3;
    assert_int_equal(gen_write_safetensors(&m, sd, &o), 0);
    char p[4200];
    snprintf(p, sizeof p, "%s/model-00002-of-00003.safetensors", sd);
    char q[4200];
    snprintf(q, sizeof q, "%s/moved.safetensors", sd);
    assert_int_equal(rename(p, q), 0);
    reject(sd, tok, NULL, "model-00002-of-00003.safetensors");
    assert_int_equal(rename(q, p), 0);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", sd);
    size_t il;
    char *idx = (char *)slurp(p, &il);
    char *at = strstr(idx, "model.layers.1.mlp.up_proj.weight");
    assert_non_null(at);
    at[3] = 'X';
    write_text(p, idx);
    reject(sd, tok, "up_proj", sd);
    at[3] = 'e';
    /* shard names are plain file names beside the index */
    char *sh = strstr(idx, "\"model-00001-of-00003.safetensors\"");
    assert_non_null(sh);
    memcpy(sh + 1, "../", 3);
    write_text(p, idx);
    reject(sd, tok, "not a file name", "index.json");
    write_text(p, "{\"weight_map\": 5}");
    reject(sd, tok, "weight_map", "index.json");
    write_text(p, "{\"weight_map\": ");
    reject(sd, tok, "JSON", "index.json");
    free(idx);
    gen_model_destroy(&m);
}

static void test_detect(void **st)
{
    (void)st;
    enum import_source kind;
    struct sl_err err;
    assert_true(import_source_detect(tmp("does-not-exist"), &kind, &err) < 0);
    assert_non_null(strstr(err.msg, "does-not-exist"));
    write_text(tmp("junk.bin"), "0123456789012345678901234567890123456789");
    assert_true(import_source_detect(tmp("junk.bin"), &kind, &err) < 0);
    assert_non_null(strstr(err.msg, "unrecognized"));
    write_text(tmp("empty.bin"), "");
    assert_true(import_source_detect(tmp("empty.bin"), &kind, &err) < 0);
    reject(tmp("empty.bin"), NULL, "unrecognized", "empty.bin");
    /* a container is recognized and not imported again */
    struct gen_model m;
    assert_int_equal(gen_model_create(&m, 1, 1), 0);
    assert_int_equal(gen_write_llama2c(&m, tmp("d.bin"), tmp("d.tok")), 0);
    format_reader_close(import_ok(tmp("d.bin"), tmp("d.tok"), -1, tmp("d.sluice")));
    assert_int_equal(import_source_detect(tmp("d.sluice"), &kind, &err), 0);
    assert_int_equal(kind, IMPORT_SRC_SLUICE);
    assert_string_equal(import_source_name(kind), "sluice");
    reject(tmp("d.sluice"), NULL, "already", "d.sluice");
    /* a bad --dtype */
    struct import_opts o = {.tokenizer = tmp("d.tok"), .dtype = FORMAT_ENC_F16 + 100};
    assert_int_equal(import_model(tmp("d.bin"), &o, tmp("x.sluice"), &err), -EINVAL);
    gen_model_destroy(&m);
}

int main(void)
{
    /* ~40 successful imports each fsync their container: on a busy disk that
     * is most of the run time, and durability is not what is tested here */
    if (!getenv("TMPDIR") && access("/dev/shm", W_OK) == 0)
        setenv("TMPDIR", "/dev/shm", 1);
    dir = test_tmpdir();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2c),     cmocka_unit_test(test_gguf),
        cmocka_unit_test(test_gguf_chat_template),
        cmocka_unit_test(test_safetensors), cmocka_unit_test(test_reject_llama2c),
        cmocka_unit_test(test_reject_gguf), cmocka_unit_test(test_reject_safetensors),
        cmocka_unit_test(test_detect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
