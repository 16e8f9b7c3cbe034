/* test_import.c: the importers on the real models in ../shared/models
 * (skipped when absent; test_import_gen covers the same paths on models it
 * writes itself).
 * - the same model through each importer: llama2.c and GGUF tensors
 *   bit-identical, tokenizers identical; safetensors (BF16) within bf16
 *   rounding of llama2.c after the RoPE un-permutation (a wrong permutation
 *   gives differences of the weights' own size);
 * - rejection paths: truncation at many lengths, bad magic, wrong GGUF
 *   version, unsupported architecture and tensor type, shape mismatch,
 *   missing tokenizer; nothing is left at the output path. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "import.h"
#include "testfmt.h"
#include "testutil.h"

static char models[4096];

static const char *model(const char *name)
{
    static char buf[4][4096];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 4096, "%s/%s", models, name);
    return p;
}

static int have_shared(void)
{
    const char *p = test_shared_path("models");
    if (!p)
        return 0;
    snprintf(models, sizeof models, "%s", p);
    return 1;
}

static struct format_reader *import_open(const char *src, const char *tok, uint32_t seq,
                                         const char *out)
{
    struct import_opts o = {.tokenizer = tok, .dtype = -1, .seq_len = seq};
    struct sl_err err;
    if (import_model(src, &o, out, &err) < 0)
        fail_msg("import %s: %s", src, err.msg);
    struct format_reader *r;
    if (format_reader_open(out, &r, &err) < 0)
        fail_msg("open %s: %s", out, err.msg);
    return r;
}

static void assert_same_tokenizer(struct format_reader *a, struct format_reader *b)
{
    const struct format_tokenizer *x = format_reader_tokenizer(a), *y = format_reader_tokenizer(b);
    assert_int_equal(x->n_tokens, y->n_tokens);
    for (uint32_t i = 0; i < x->n_tokens; i++) {
        assert_int_equal(x->lens[i], y->lens[i]);
        assert_memory_equal(x->tokens[i], y->tokens[i], x->lens[i]);
        assert_true(x->scores[i] == y->scores[i]);
    }
}

static void test_cross_format(void **st)
{
    (void)st;
    struct format_reader *a =
        import_open(model("kjv6L.bin"), model("kjv6L.tok1024.bin"), 0, test_tmp_path("a.sluice"));
    struct format_reader *g =
        import_open(model("kjv6L.gguf"), NULL, 256, test_tmp_path("g.sluice"));
    struct format_reader *h =
        import_open(model("kjv6L-hf"), model("kjv6L.tok1024.bin"), 0, test_tmp_path("h.sluice"));
    const struct format_config *ca = format_reader_config(a);
    assert_int_equal(ca->dim, 256);
    assert_int_equal(ca->hidden_dim, 688);
    assert_int_equal(ca->n_layers, 6);
    assert_int_equal(ca->n_heads, 8);
    assert_int_equal(ca->n_kv_heads, 2);
    assert_int_equal(ca->vocab_size, 1024);
    assert_int_equal(ca->seq_len, 256);
    assert_int_equal(ca->tied_embedding, 1);
    assert_memory_equal(ca, format_reader_config(g), sizeof *ca);
    assert_memory_equal(ca, format_reader_config(h), sizeof *ca);
    assert_same_tokenizer(a, g);
    assert_same_tokenizer(a, h);
    for (uint32_t i = 0; i < format_reader_n_tensors(a); i++) {
        const struct format_tensor_info *t = format_reader_tensor(a, i);
        uint64_t n1, n2, n3;
        float *x = test_tensor_f32(a, t->layer, t->role, &n1, NULL);
        float *y = test_tensor_f32(g, t->layer, t->role, &n2, NULL);
        float *z = test_tensor_f32(h, t->layer, t->role, &n3, NULL);
        assert_int_equal(n1, n2);
        assert_int_equal(n1, n3);
        assert_memory_equal(x, y, n1 * sizeof(float)); /* GGUF F32: bit-identical */
        for (uint64_t k = 0; k < n1; k++) {
            /* BF16 keeps 8 significant bits: relative error <= 2^-8 */
            if (fabsf(z[k] - x[k]) > fabsf(x[k]) * (1.0f / 256.0f) + 1e-30f)
                fail_msg("%s[%llu]: bf16 %g vs f32 %g (RoPE permutation wrong?)", t->name,
                         (unsigned long long)k, (double)z[k], (double)x[k]);
        }
        free(x);
        free(y);
        free(z);
    }
    format_reader_close(a);
    format_reader_close(g);
    format_reader_close(h);
}

/* aidreams260K: llama2.c and GGUF (its only formats) give identical containers
 * apart from the source metadata: config, tokenizer, every tensor's bytes. */
static void test_cross_format_aidreams(void **st)
{
    (void)st;
    struct format_reader *a = import_open(
        model("aidreams260K.bin"), model("aidreams260K.tok512.bin"), 0, test_tmp_path("a2.sluice"));
    struct format_reader *g =
        import_open(model("aidreams260K.gguf"), NULL, 0, test_tmp_path("g2.sluice"));
    const struct format_config *ca = format_reader_config(a), *cg = format_reader_config(g);
    assert_int_equal(ca->dim, 64);
    assert_int_equal(ca->hidden_dim, 172);
    assert_int_equal(ca->n_layers, 4);
    assert_int_equal(ca->n_heads, 4);
    assert_int_equal(ca->n_kv_heads, 4);
    assert_int_equal(ca->vocab_size, 512);
    assert_int_equal(ca->seq_len, 128);
    assert_int_equal(ca->tied_embedding, 1);
    assert_int_equal(ca->bos_id, 1);
    assert_int_equal(ca->eos_id, 2);
    assert_true(ca->rope_theta == 10000.0f);
    assert_true(ca->norm_eps == 1e-5f);
    assert_int_equal(ca->rope_layout, FORMAT_ROPE_INTERLEAVED);
    /* the GGUF converter wrote output.weight, a copy of the embedding: tied */
    assert_memory_equal(ca, cg, sizeof *ca);
    assert_same_tokenizer(a, g);
    /* llama2.c's "\n<s>\n" control tokens are stored bare, as GGUF names them */
    const struct format_tokenizer *t = format_reader_tokenizer(a);
    assert_int_equal(t->lens[1], 3);
    assert_memory_equal(t->tokens[1], "<s>", 3);
    assert_int_equal(t->lens[3 + 0x0a], 6);
    assert_memory_equal(t->tokens[3 + 0x0a], "<0x0A>", 6);
    assert_int_equal(format_reader_n_tensors(a), format_reader_n_tensors(g));
    for (uint32_t i = 0; i < format_reader_n_tensors(a); i++) {
        const struct format_tensor_info *x = format_reader_tensor(a, i);
        const struct format_tensor_info *y = format_reader_tensor(g, i);
        assert_string_equal(x->name, y->name);
        assert_int_equal(x->encoding, FORMAT_ENC_F32);
        assert_int_equal(y->encoding, FORMAT_ENC_F32);
        assert_int_equal(x->length, y->length);
        assert_int_equal(x->checksum, y->checksum);
        uint64_t n1, n2;
        float *p = test_tensor_f32(a, x->layer, x->role, &n1, NULL);
        float *q = test_tensor_f32(g, y->layer, y->role, &n2, NULL);
        assert_int_equal(n1, n2);
        assert_memory_equal(p, q, n1 * sizeof(float));
        free(p);
        free(q);
    }
    format_reader_close(a);
    format_reader_close(g);
}

static int try_import(const char *src, const char *tok, const char *out, struct sl_err *err)
{
    struct import_opts o = {.tokenizer = tok, .dtype = -1};
    memset(err, 0, sizeof *err);
    int ret = import_model(src, &o, out, err);
    struct stat stt;
    assert_int_not_equal(stat(out, &stt), 0); /* nothing left behind on failure */
    return ret;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void test_truncations(void **st)
{
    (void)st;
    const char *srcs[2] = {"aidreams260K.bin", "aidreams260K.gguf"};
    for (int s = 0; s < 2; s++) {
        size_t len;
        uint8_t *b = test_read_file(model(srcs[s]), &len);
        assert_non_null(b);
        size_t cuts[] = {0, 3, 4, 8, 20, 27, 28, 100, 1000, 5000, len / 3, len / 2, len - 1};
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
            const char *p = test_tmp_path(s ? "cut.gguf" : "cut.bin");
            write_bytes(p, b, cuts[i]);
            struct sl_err err;
            int ret =
                try_import(p, model("aidreams260K.tok512.bin"), test_tmp_path("cut.sluice"), &err);
            if (ret == 0)
                fail_msg("%s cut at %zu imported", srcs[s], cuts[i]);
            assert_true(strlen(err.msg) > 0);
        }
        /* trailing garbage is refused for llama2.c (the size must match exactly) */
        if (s == 0) {
            uint8_t *bigger = calloc(1, len + 4);
            memcpy(bigger, b, len);
            write_bytes(test_tmp_path("long.bin"), bigger, len + 4);
            struct sl_err err;
            assert_true(try_import(test_tmp_path("long.bin"), model("aidreams260K.tok512.bin"),
                                   test_tmp_path("x.sluice"), &err) < 0);
            assert_non_null(strstr(err.msg, "trailing"));
            free(bigger);
        }
        free(b);
    }
    /* a tokenizer with the wrong number of tokens */
    struct sl_err err;
    assert_true(try_import(model("kjv6L.bin"), model("aidreams260K.tok512.bin"),
                           test_tmp_path("x.sluice"), &err) < 0);
    assert_non_null(strstr(err.msg, "tok512"));
    /* a missing tokenizer */
    assert_true(try_import(model("kjv6L.bin"), NULL, test_tmp_path("x.sluice"), &err) < 0);
    assert_non_null(strstr(err.msg, "--tokenizer"));
}

/* Patches a little-endian u32 found after `key` in a GGUF copy. */
static uint8_t *gguf_patch(const char *key, size_t skip, uint32_t v, size_t *len)
{
    uint8_t *b = test_read_file(model("aidreams260K.gguf"), len);
    assert_non_null(b);
    uint8_t *p = memmem(b, *len, key, strlen(key));
    assert_non_null(p);
    sl_store_le32(p + strlen(key) + skip, v);
    return b;
}

static void test_gguf_rejections(void **st)
{
    (void)st;
    struct sl_err err;
    size_t len;
    uint8_t *b = test_read_file(model("aidreams260K.gguf"), &len);
    /* bad magic */
    b[0] = 'X';
    write_bytes(test_tmp_path("m.gguf"), b, len);
    assert_true(try_import(test_tmp_path("m.gguf"), NULL, test_tmp_path("x.sluice"), &err) < 0);
    b[0] = 'G';
    /* version 1 and 4 */
    sl_store_le32(b + 4, 4);
    write_bytes(test_tmp_path("v.gguf"), b, len);
    assert_true(try_import(test_tmp_path("v.gguf"), NULL, test_tmp_path("x.sluice"), &err) < 0);
    assert_non_null(strstr(err.msg, "version 4"));
    free(b);
    /* architecture: the string value "llama" becomes "gpt2x" */
    b = test_read_file(model("aidreams260K.gguf"), &len);
    uint8_t *p = memmem(b, len, "general.architecture", 20);
    assert_non_null(p);
    memcpy(p + 20 + 4 + 8, "gpt2x", 5);
    write_bytes(test_tmp_path("a.gguf"), b, len);
    assert_true(try_import(test_tmp_path("a.gguf"), NULL, test_tmp_path("x.sluice"), &err) < 0);
    assert_non_null(strstr(err.msg, "gpt2x"));
    free(b);
    /* a tensor type: token_embd.weight's type (after name, n_dims, 2 dims) = Q4_0 (2) */
    b = gguf_patch("token_embd.weight", 4 + 16, 2, &len);
    write_bytes(test_tmp_path("t.gguf"), b, len);
    assert_true(try_import(test_tmp_path("t.gguf"), NULL, test_tmp_path("x.sluice"), &err) < 0);
    assert_non_null(strstr(err.msg, "ggml type 2"));
    free(b);
    /* a shape that disagrees with the hyperparameters: blk.0.attn_q ne[0] = 65 */
    b = gguf_patch("blk.0.attn_q.weight", 4, 65, &len);
    write_bytes(test_tmp_path("s.gguf"), b, len);
    assert_true(try_import(test_tmp_path("s.gguf"), NULL, test_tmp_path("x.sluice"), &err) < 0);
    assert_non_null(strstr(err.msg, "attn_q"));
    free(b);
    /* not a model at all */
    write_bytes(test_tmp_path("junk.bin"), "hello world, this is not a model!", 33);
    assert_true(try_import(test_tmp_path("junk.bin"), NULL, test_tmp_path("x.sluice"), &err) < 0);
    assert_non_null(strstr(err.msg, "unrecognized"));
}

static void test_safetensors_rejections(void **st)
{
    (void)st;
    struct sl_err err;
    const char *dir = test_tmp_path("hf");
    mkdir(dir, 0755);
    char cfg[8192];
    size_t len;
    char *c = test_read_file(model("kjv6L-hf/config.json"), &len);
    /* an architecture other than llama */
    char *mt = strstr(c, "\"llama\"");
    assert_non_null(mt);
    snprintf(cfg, sizeof cfg, "%.*s\"mistral\"%s", (int)(mt - c), c, mt + 7);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_bytes(path, cfg, strlen(cfg));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    symlink(model("kjv6L-hf/model.safetensors"), path);
    assert_true(try_import(dir, model("kjv6L.tok1024.bin"), test_tmp_path("x.sluice"), &err) < 0);
    assert_non_null(strstr(err.msg, "mistral"));
    /* intermediate_size inconsistent with the tensors */
    char *hs = strstr(c, "\"intermediate_size\": 688");
    assert_non_null(hs);
    snprintf(cfg, sizeof cfg, "%.*s\"intermediate_size\": 700%s", (int)(hs - c), c, hs + 24);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_bytes(path, cfg, strlen(cfg));
    assert_true(try_import(dir, model("kjv6L.tok1024.bin"), test_tmp_path("x.sluice"), &err) < 0);
    assert_non_null(strstr(err.msg, "shape"));
    /* a truncated safetensors file */
    write_bytes(path, c, len);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    size_t slen;
    uint8_t *s = test_read_file(model("kjv6L-hf/model.safetensors"), &slen);
    write_bytes(path, s, slen / 2);
    assert_true(try_import(dir, model("kjv6L.tok1024.bin"), test_tmp_path("x.sluice"), &err) < 0);
    write_bytes(path, s, 6);
    assert_true(try_import(dir, model("kjv6L.tok1024.bin"), test_tmp_path("x.sluice"), &err) < 0);
    free(s);
    free(c);
}

/* Contents of a file as a string ("" when unreadable). */
static char *slurp_text(const char *p)
{
    size_t n;
    char *s = test_read_file(p, &n);
    return s ? s : calloc(1, 1);
}

/* The command line tools: help, a conversion, errors and exit codes. */
static void test_cli(void **st)
{
    (void)st;
    const char *bin = test_sluice_bin();
    if (!bin)
        skip();
    const char *out = test_tmp_path("cli.out"), *errf = test_tmp_path("cli.err");
    assert_int_equal(test_system("%s import --help >%s 2>%s", bin, out, errf), 0);
    char *o = slurp_text(out);
    assert_non_null(strstr(o, "usage: sluice import"));
    assert_non_null(strstr(o, "--dtype"));
    free(o);
    assert_int_equal(test_system("%s import >%s 2>%s", bin, out, errf), 2);
    /* GGUF F32 -> f16 container, progress on stderr */
    const char *m = test_tmp_path("cli.sluice");
    assert_int_equal(test_system("%s import %s --dtype f16 -o %s >%s 2>%s", bin,
                                 model("kjv6L.gguf"), m, out, errf),
                     0);
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open(m, &r, &err), 0);
    for (uint32_t i = 0; i < format_reader_n_tensors(r); i++)
        assert_int_equal(format_reader_tensor(r, i)->encoding, FORMAT_ENC_F16);
    const void *v;
    uint64_t n;
    assert_int_equal(format_reader_meta_get(r, "source.format", &v, &n), 0);
    assert_memory_equal(v, "gguf", 4);
    format_reader_close(r);
    char *e = slurp_text(errf);
    assert_non_null(strstr(e, "sluice import: wrote"));
    free(e);
    /* errors: "sluice import: <file>: <problem>", exit 1, no output */
    const char *m2 = test_tmp_path("cli2.sluice");
    assert_int_equal(
        test_system("%s import %s -o %s >%s 2>%s", bin, model("kjv6L.bin"), m2, out, errf), 1);
    e = slurp_text(errf);
    assert_non_null(strstr(e, "sluice import: "));
    assert_non_null(strstr(e, "kjv6L.bin"));
    assert_non_null(strstr(e, "--tokenizer"));
    free(e);
    struct stat sb;
    assert_int_not_equal(stat(m2, &sb), 0);
    assert_int_equal(test_system("%s import %s --dtype f8 -o %s >%s 2>%s", bin, model("kjv6L.gguf"),
                                 m2, out, errf),
                     2);
    /* synth: list, determinism through the tool, an unknown shape */
    assert_int_equal(test_system("%s synth --list >%s 2>%s", bin, out, errf), 0);
    o = slurp_text(out);
    assert_non_null(strstr(o, "tinyllama-1.1b"));
    assert_non_null(strstr(o, "llama3-8b"));
    free(o);
    assert_int_equal(test_system("%s synth --shape tiny --seed 4 -o %s 2>%s && %s synth "
                                 "--shape tiny --seed 4 -o %s 2>%s && cmp -s %s %s",
                                 bin, m, errf, bin, m2, errf, m, m2),
                     0);
    assert_int_equal(test_system("%s synth --shape huge -o %s >%s 2>%s", bin, m2, out, errf), 1);
    e = slurp_text(errf);
    assert_non_null(strstr(e, "sluice synth: unknown shape 'huge'"));
    free(e);
}

int main(void)
{
    if (!have_shared())
        test_skip_all("the real models (../shared/models) are not here");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cross_format),
        cmocka_unit_test(test_cross_format_aidreams),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_gguf_rejections),
        cmocka_unit_test(test_safetensors_rejections),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
