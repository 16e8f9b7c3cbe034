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
 * identical across formats, config fields. The rejection paths and source
 * detection are in test_import_reject.c (the same test binary). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gen_models.h"
#include "import.h"
#include "test_import_gen_internal.h"
#include "testutil.h"

static const char *dir;

const char *ig_tmp(const char *name)
{
    static char buf[16][4096];
    static int k;
    char *p = buf[k++ % 16];
    snprintf(p, 4096, "%s/%s", dir, name);
    return p;
}

void ig_mkdir_p(const char *p)
{
    if (mkdir(p, 0755) < 0 && errno != EEXIST)
        fail_msg("mkdir %s: %s", p, strerror(errno));
}

struct format_reader *ig_import_ok(const char *src, const char *tok, int dtype, const char *out)
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
        assert_int_equal(gen_write_llama2c(&m, ig_tmp("m.bin"), ig_tmp("tok.bin")), 0);
        enum import_source kind;
        struct sl_err err;
        assert_int_equal(import_source_detect(ig_tmp("m.bin"), &kind, &err), 0);
        assert_int_equal(kind, IMPORT_SRC_LLAMA2C);
        struct format_reader *r =
            ig_import_ok(ig_tmp("m.bin"), ig_tmp("tok.bin"), -1, ig_tmp("o.sluice"));
        const struct format_config *c = format_reader_config(r);
        struct format_config want = m.cfg;
        want.rope_theta = 10000.0f; /* llama2.c's fixed values */
        want.norm_eps = 1e-5f;
        assert_memory_equal(c, &want, sizeof want);
        check_tensors(r, &m, GEN_F32, GEN_F32, -1);
        check_tokenizer(r, &m);
        check_meta(r, "llama2c", ig_tmp("m.bin"));
        format_reader_close(r);
        /* conversions */
        r = ig_import_ok(ig_tmp("m.bin"), ig_tmp("tok.bin"), FORMAT_ENC_F16, ig_tmp("o16.sluice"));
        check_tensors(r, &m, GEN_F32, GEN_F32, FORMAT_ENC_F16);
        format_reader_close(r);
        r = ig_import_ok(ig_tmp("m.bin"), ig_tmp("tok.bin"), FORMAT_ENC_BF16, ig_tmp("ob.sluice"));
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
        assert_int_equal(gen_write_llama2c(&m, ig_tmp("m.bin"), ig_tmp("tok.bin")), 0);
        struct format_reader *ref =
            ig_import_ok(ig_tmp("m.bin"), ig_tmp("tok.bin"), -1, ig_tmp("l.sluice"));
        for (size_t t = 0; t < 4; t++, variant++) {
            /* norms: F32 as llama.cpp writes them, also 16-bit and Q8_0 (1-D blocks) */
            enum gen_type norms = tied ? types[t] : GEN_F32;
            struct gen_gguf_opts o = {.version = variant % 2 ? 2 : 3,
                                      .weights = types[t],
                                      .norms = norms,
                                      .alignment = variant % 3 == 1 ? 64 : 0,
                                      .output_copy = tied && t % 2 == 0,
                                      .scores_first = variant % 4 == 3};
            assert_int_equal(gen_write_gguf(&m, ig_tmp("m.gguf"), &o), 0);
            enum import_source kind;
            struct sl_err err;
            assert_int_equal(import_source_detect(ig_tmp("m.gguf"), &kind, &err), 0);
            assert_int_equal(kind, IMPORT_SRC_GGUF);
            struct format_reader *r = ig_import_ok(ig_tmp("m.gguf"), NULL, -1, ig_tmp("g.sluice"));
            assert_memory_equal(format_reader_config(r), &m.cfg, sizeof m.cfg);
            check_tensors(r, &m, types[t], norms, -1);
            check_tokenizer(r, &m);
            check_meta(r, "gguf", ig_tmp("m.gguf"));
            /* the same container tokenizer as from the llama2.c tokenizer file */
            const struct format_tokenizer *a = format_reader_tokenizer(r);
            const struct format_tokenizer *b = format_reader_tokenizer(ref);
            assert_int_equal(a->max_token_len, b->max_token_len);
            format_reader_close(r);
            if (types[t] == GEN_F32) {
                /* F32 GGUF and llama2.c give byte-identical tensors */
                r = ig_import_ok(ig_tmp("m.gguf"), NULL, -1, ig_tmp("g.sluice"));
                for (uint32_t i = 0; i < format_reader_n_tensors(r); i++) {
                    const struct format_tensor_info *x = format_reader_tensor(r, i);
                    const struct format_tensor_info *y = format_reader_tensor(ref, i);
                    assert_int_equal(x->checksum, y->checksum);
                }
                format_reader_close(r);
            }
            if (types[t] == GEN_BF16) { /* widening back to f32 is exact */
                r = ig_import_ok(ig_tmp("m.gguf"), NULL, FORMAT_ENC_F32, ig_tmp("g32.sluice"));
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
    struct gen_gguf_opts o = {.weights = GEN_F32,
                              .norms = GEN_F32,
                              .extra_key = "tokenizer.chat_template",
                              .extra_val = tpl};
    assert_int_equal(gen_write_gguf(&m, ig_tmp("t.gguf"), &o), 0);
    struct format_reader *r = ig_import_ok(ig_tmp("t.gguf"), NULL, -1, ig_tmp("t.sluice"));
    const void *v;
    size_t n;
    assert_int_equal(format_reader_meta_get(r, "tokenizer.chat_template", &v, &n), 0);
    assert_int_equal(n, strlen(tpl));
    assert_memory_equal(v, tpl, n);
    format_reader_close(r);
    /* none without one */
    o.extra_key = NULL;
    assert_int_equal(gen_write_gguf(&m, ig_tmp("t.gguf"), &o), 0);
    r = ig_import_ok(ig_tmp("t.gguf"), NULL, -1, ig_tmp("t.sluice"));
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
        assert_int_equal(gen_write_llama2c(&m, ig_tmp("m.bin"), ig_tmp("tok.bin")), 0);
        for (size_t t = 0; t < 3; t++) {
            for (int shards = 1; shards <= 3; shards += 2, variant++) {
                char d[64];
                snprintf(d, sizeof d, "hf%d", variant);
                char hf[4096];
                snprintf(hf, sizeof hf, "%s", ig_tmp(d));
                ig_mkdir_p(hf);
                struct gen_st_opts o = {
                    .dtype = types[t], .n_shards = shards, .eos_list = variant % 2};
                assert_int_equal(gen_write_safetensors(&m, hf, &o), 0);
                enum import_source kind;
                struct sl_err err;
                assert_int_equal(import_source_detect(hf, &kind, &err), 0);
                assert_int_equal(kind, IMPORT_SRC_SAFETENSORS);
                struct format_reader *r =
                    ig_import_ok(hf, ig_tmp("tok.bin"), -1, ig_tmp("h.sluice"));
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
                    r = ig_import_ok(f, ig_tmp("tok.bin"), FORMAT_ENC_F16, ig_tmp("h16.sluice"));
                    check_tensors(r, &m, types[t], types[t], FORMAT_ENC_F16);
                    format_reader_close(r);
                    /* and as a path relative to the working directory */
                    char cwd[4096], rel[128];
                    assert_non_null(getcwd(cwd, sizeof cwd));
                    assert_int_equal(chdir(dir), 0);
                    snprintf(rel, sizeof rel, "%s/model.safetensors", d);
                    r = ig_import_ok(rel, "tok.bin", -1, "hrel.sluice");
                    check_tensors(r, &m, types[t], types[t], -1);
                    format_reader_close(r);
                    assert_int_equal(chdir(cwd), 0);
                }
            }
        }
        gen_model_destroy(&m);
    }
}

int main(void)
{
    /* ~40 successful imports each fsync their container: on a busy disk that
     * is most of the run time, and durability is not what is tested here */
    if (!getenv("TMPDIR") && access("/dev/shm", W_OK) == 0)
        setenv("TMPDIR", "/dev/shm", 1);
    dir = test_tmpdir();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2c),
        cmocka_unit_test(test_gguf),
        cmocka_unit_test(test_gguf_chat_template),
        cmocka_unit_test(test_safetensors),
        cmocka_unit_test(test_reject_llama2c),
        cmocka_unit_test(test_reject_gguf),
        cmocka_unit_test(test_reject_safetensors),
        cmocka_unit_test(test_detect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
