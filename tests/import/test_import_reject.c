/* test_import_reject.c: the importers' rejection paths on models written by
 * the test (part of test_import_gen; test_import_gen.c has main): truncation
 * at every header byte and at random data offsets, bad values in every
 * format, each error naming the file, nothing left at the output path; and
 * source detection. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gen_models.h"
#include "import.h"
#include "test_import_gen_internal.h"
#include "testutil.h"

/* ---- rejections ------------------------------------------------------------------------ */

/* Import must fail with a message containing `want` (and, when given, `file`,
 * the name of the offending file), leaving nothing at the output path. */
static void reject(const char *src, const char *tok, const char *want, const char *file)
{
    struct import_opts o = {.tokenizer = tok, .dtype = -1};
    struct sl_err err = {{0}};
    const char *out = ig_tmp("rej.sluice");
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

void test_reject_llama2c(void **st)
{
    (void)st;
    struct gen_model m;
    assert_int_equal(gen_model_create(&m, 0, test_seed() + 30), 0);
    assert_int_equal(gen_write_llama2c(&m, ig_tmp("m.bin"), ig_tmp("tok.bin")), 0);
    size_t len, tlen;
    uint8_t *b = slurp(ig_tmp("m.bin"), &len);
    uint8_t *t = slurp(ig_tmp("tok.bin"), &tlen);
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    /* truncations: every 4 bytes of the start, then random lengths, then len - 1 */
    for (size_t cut = 0; cut < len; cut += cut < 256 ? 4 : 1 + test_rng_below(&rng, 40000)) {
        assert_int_equal(gen_write_file(ig_tmp("cut.bin"), b, cut), 0);
        reject(ig_tmp("cut.bin"), ig_tmp("tok.bin"), NULL, "cut.bin");
    }
    assert_int_equal(gen_write_file(ig_tmp("cut.bin"), b, len - 1), 0);
    reject(ig_tmp("cut.bin"), ig_tmp("tok.bin"), "truncated", "cut.bin");
    /* trailing bytes */
    uint8_t *big = calloc(1, len + 8);
    memcpy(big, b, len);
    assert_int_equal(gen_write_file(ig_tmp("long.bin"), big, len + 8), 0);
    reject(ig_tmp("long.bin"), ig_tmp("tok.bin"), "trailing", "long.bin");
    /* the classifier flag flipped: sizes no longer match */
    memcpy(big, b, len);
    sl_store_le32(big + 20, m.cfg.vocab_size);
    assert_int_equal(gen_write_file(ig_tmp("flip.bin"), big, len), 0);
    reject(ig_tmp("flip.bin"), ig_tmp("tok.bin"), "implies", "flip.bin");
    /* a header with zero/negative/indivisible fields */
    static const struct {
        int field;
        int32_t v;
    } bad[] = {{0, 0}, {0, -64}, {1, 0}, {2, 0},  {3, 0},         {3, 7},         {4, 0},
               {4, 3}, {5, 0},   {6, 0}, {6, -1}, {5, INT32_MIN}, {0, INT32_MAX}, {1, INT32_MAX}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(big, b, len);
        sl_store_le32(big + 4 * bad[i].field, (uint32_t)bad[i].v);
        assert_int_equal(gen_write_file(ig_tmp("hdr.bin"), big, len), 0);
        reject(ig_tmp("hdr.bin"), ig_tmp("tok.bin"), NULL, "hdr.bin");
    }
    free(big);
    /* the tokenizer: missing, truncated at every byte, trailing, bad lengths */
    reject(ig_tmp("m.bin"), NULL, "--tokenizer", "m.bin");
    reject(ig_tmp("m.bin"), ig_tmp("nonexistent.tok"), NULL, "nonexistent.tok");
    for (size_t cut = 0; cut < tlen; cut += 1 + test_rng_below(&rng, 8)) {
        assert_int_equal(gen_write_file(ig_tmp("cut.tok"), t, cut), 0);
        reject(ig_tmp("m.bin"), ig_tmp("cut.tok"), NULL, "cut.tok");
    }
    uint8_t *tb = calloc(1, tlen + 4);
    memcpy(tb, t, tlen);
    assert_int_equal(gen_write_file(ig_tmp("long.tok"), tb, tlen + 4), 0);
    reject(ig_tmp("m.bin"), ig_tmp("long.tok"), "bytes after", "long.tok");
    sl_store_le32(tb, 0);
    assert_int_equal(gen_write_file(ig_tmp("z.tok"), tb, tlen), 0);
    reject(ig_tmp("m.bin"), ig_tmp("z.tok"), NULL, "z.tok");
    memcpy(tb, t, tlen);
    sl_store_le32(tb + 8, 0x7fffffff); /* token 0's length */
    assert_int_equal(gen_write_file(ig_tmp("len.tok"), tb, tlen), 0);
    reject(ig_tmp("m.bin"), ig_tmp("len.tok"), "length", "len.tok");
    free(tb);
    free(t);
    free(b);
    gen_model_destroy(&m);
}

void test_reject_gguf(void **st)
{
    (void)st;
    struct gen_model m;
    assert_int_equal(gen_model_create(&m, 0, test_seed() + 40), 0);
    struct gen_gguf_opts o = {.weights = GEN_Q8_0, .alignment = 64};
    assert_int_equal(gen_write_gguf(&m, ig_tmp("m.gguf"), &o), 0);
    size_t len;
    uint8_t *b = slurp(ig_tmp("m.gguf"), &len);
    uint8_t *c = malloc(len);
    struct test_rng rng;
    test_rng_init(&rng, test_seed() + 1);
    /* truncation at every byte of the metadata and tensor infos, then at
     * random points of the data */
    size_t hdr_end = find_bytes(b, len, "blk.1.ffn_down.weight") + 64;
    for (size_t cut = 0; cut < len; cut += cut < hdr_end ? 1 : 1 + test_rng_below(&rng, 9000)) {
        assert_int_equal(gen_write_file(ig_tmp("cut.gguf"), b, cut), 0);
        reject(ig_tmp("cut.gguf"), NULL, NULL, cut >= 4 ? "cut.gguf" : NULL);
    }
    assert_int_equal(gen_write_file(ig_tmp("cut.gguf"), b, len - 1), 0);
    reject(ig_tmp("cut.gguf"), NULL, "outside the data", "cut.gguf");
    /* version */
    static const uint32_t versions[] = {0, 1, 4, 5, 0xffffffffu};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        uint32_t v = versions[i];
        memcpy(c, b, len);
        sl_store_le32(c + 4, v);
        assert_int_equal(gen_write_file(ig_tmp("v.gguf"), c, len), 0);
        char want[32];
        snprintf(want, sizeof want, "version %u", v);
        reject(ig_tmp("v.gguf"), NULL, want, "v.gguf");
    }
    /* huge counts */
    memcpy(c, b, len);
    sl_store_le64(c + 8, UINT64_MAX);
    assert_int_equal(gen_write_file(ig_tmp("n.gguf"), c, len), 0);
    reject(ig_tmp("n.gguf"), NULL, "implausible", "n.gguf");
    memcpy(c, b, len);
    sl_store_le64(c + 16, 1000); /* more keys than there are */
    assert_int_equal(gen_write_file(ig_tmp("n.gguf"), c, len), 0);
    reject(ig_tmp("n.gguf"), NULL, NULL, "n.gguf");
    /* a string length beyond the file */
    memcpy(c, b, len);
    sl_store_le64(c + 24, UINT64_MAX - 3);
    assert_int_equal(gen_write_file(ig_tmp("s.gguf"), c, len), 0);
    reject(ig_tmp("s.gguf"), NULL, "truncated", "s.gguf");
    /* an unknown value type (test.u8's type) */
    memcpy(c, b, len);
    sl_store_le32(c + find_bytes(c, len, "test.u8") + 7, 13);
    assert_int_equal(gen_write_file(ig_tmp("t.gguf"), c, len), 0);
    reject(ig_tmp("t.gguf"), NULL, "value type 13", "t.gguf");
    /* a hyperparameter of the wrong type: block_count as a string */
    memcpy(c, b, len);
    sl_store_le32(c + find_bytes(c, len, "llama.block_count") + 17, 8);
    assert_int_equal(gen_write_file(ig_tmp("h.gguf"), c, len), 0);
    reject(ig_tmp("h.gguf"), NULL, NULL, "h.gguf");
    /* head_count_kv that does not divide head_count */
    memcpy(c, b, len);
    sl_store_le32(c + find_bytes(c, len, "llama.attention.head_count_kv") + 29 + 4, 3);
    assert_int_equal(gen_write_file(ig_tmp("kv.gguf"), c, len), 0);
    reject(ig_tmp("kv.gguf"), NULL, NULL, "kv.gguf");
    /* an unsupported architecture */
    memcpy(c, b, len);
    memcpy(c + find_bytes(c, len, "llama"), "gemma", 5);
    assert_int_equal(gen_write_file(ig_tmp("a.gguf"), c, len), 0);
    reject(ig_tmp("a.gguf"), NULL, "gemma", "a.gguf");
    /* unsupported tensor types: Q4_0 (2), I8 (24); Q4_K (12) is read, but its
     * blocks of 256 do not fit rows of 64 (test_import_kquant has the rest) */
    static const uint32_t types[] = {2, 24, 99, 12};
    for (size_t i = 0; i < 4; i++) {
        memcpy(c, b, len);
        sl_store_le32(c + find_bytes(c, len, "blk.0.attn_k.weight") + 19 + 4 + 16, types[i]);
        assert_int_equal(gen_write_file(ig_tmp("ty.gguf"), c, len), 0);
        char want[64];
        snprintf(want, sizeof want, "ggml type %u", types[i]);
        reject(ig_tmp("ty.gguf"), NULL, types[i] == 12 ? "not a multiple of 256" : want, "ty.gguf");
    }
    /* shapes: a dimension that disagrees, a 3-D tensor, 0 and 5 dimensions */
    memcpy(c, b, len);
    sl_store_le64(c + find_bytes(c, len, "blk.1.ffn_up.weight") + 19 + 4 + 8, 97);
    assert_int_equal(gen_write_file(ig_tmp("sh.gguf"), c, len), 0);
    reject(ig_tmp("sh.gguf"), NULL, "ffn_up", "sh.gguf");
    for (uint32_t nd = 0; nd < 6; nd += 5) {
        memcpy(c, b, len);
        sl_store_le32(c + find_bytes(c, len, "blk.1.ffn_up.weight") + 19, nd);
        assert_int_equal(gen_write_file(ig_tmp("nd.gguf"), c, len), 0);
        reject(ig_tmp("nd.gguf"), NULL, "dimensions", "nd.gguf");
    }
    /* a misaligned and an out-of-range tensor offset */
    size_t toff = find_bytes(c, len, "blk.1.ffn_up.weight") + 19 + 4 + 16 + 4;
    memcpy(c, b, len);
    sl_store_le64(c + toff, sl_load_le64(b + toff) + 2);
    assert_int_equal(gen_write_file(ig_tmp("al.gguf"), c, len), 0);
    reject(ig_tmp("al.gguf"), NULL, "aligned", "al.gguf");
    memcpy(c, b, len);
    sl_store_le64(c + toff, UINT64_MAX - 63);
    assert_int_equal(gen_write_file(ig_tmp("off.gguf"), c, len), 0);
    reject(ig_tmp("off.gguf"), NULL, "outside", "off.gguf");
    /* issue 21: the tensors must tile the data section: one moved on by
     * the alignment (a gap, then an overlap), bytes left after the last */
    {
        uint32_t ga = sl_load_le32(b + find_bytes(b, len, "general.alignment") + 17 + 4);
        memcpy(c, b, len);
        sl_store_le64(c + toff, sl_load_le64(b + toff) + ga);
        assert_int_equal(gen_write_file(ig_tmp("gap.gguf"), c, len), 0);
        reject(ig_tmp("gap.gguf"), NULL, "must tile the data section", "gap.gguf");
        uint8_t *e = calloc(1, len + 2 * ga);
        memcpy(e, b, len);
        assert_int_equal(gen_write_file(ig_tmp("ext.gguf"), e, len + 2 * ga), 0);
        reject(ig_tmp("ext.gguf"), NULL, "bytes after the last tensor", "ext.gguf");
        free(e);
    }
    /* general.alignment not a power of two */
    memcpy(c, b, len);
    sl_store_le32(c + find_bytes(c, len, "general.alignment") + 17 + 4, 48);
    assert_int_equal(gen_write_file(ig_tmp("ga.gguf"), c, len), 0);
    reject(ig_tmp("ga.gguf"), NULL, "alignment", "ga.gguf");
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
        assert_int_equal(gen_write_file(ig_tmp("nm.gguf"), c, len), 0);
        reject(ig_tmp("nm.gguf"), NULL, names[i].want, "nm.gguf");
    }
    /* a missing tensor: the count one short drops the last (blk.1.ffn_down) */
    memcpy(c, b, len);
    sl_store_le64(c + 8, sl_load_le64(b + 8) - 1);
    assert_int_equal(gen_write_file(ig_tmp("mi.gguf"), c, len), 0);
    reject(ig_tmp("mi.gguf"), NULL, "'blk.1.ffn_down.weight' is missing", "mi.gguf");
    /* a tokenizer other than SentencePiece's (llama 3's "gpt2" BPE) */
    memcpy(c, b, len);
    memcpy(c + find_bytes(c, len, "tokenizer.ggml.model") + 20 + 4 + 8, "gpt2x", 5);
    assert_int_equal(gen_write_file(ig_tmp("tm.gguf"), c, len), 0);
    reject(ig_tmp("tm.gguf"), NULL, "tokenizer.ggml.model 'gpt2x'", "tm.gguf");
    /* partial rotary: rope.dimension_count of half the head */
    memcpy(c, b, len);
    sl_store_le32(c + find_bytes(c, len, "llama.rope.dimension_count") + 26 + 4,
                  m.cfg.head_dim / 2);
    assert_int_equal(gen_write_file(ig_tmp("rd.gguf"), c, len), 0);
    reject(ig_tmp("rd.gguf"), NULL, "rope.dimension_count", "rd.gguf");
    /* scores that disagree with the tokens in count */
    memcpy(c, b, len);
    sl_store_le64(c + find_bytes(c, len, "tokenizer.ggml.scores") + 21 + 4 + 4, 299);
    assert_int_equal(gen_write_file(ig_tmp("sc.gguf"), c, len), 0);
    reject(ig_tmp("sc.gguf"), NULL, NULL, "sc.gguf");
    free(c);
    free(b);
    /* rope scaling (absent from the files above): "none" is fine, others not */
    o.extra_key = "llama.rope.scaling.type";
    o.extra_val = "none";
    assert_int_equal(gen_write_gguf(&m, ig_tmp("rs.gguf"), &o), 0);
    struct format_reader *r = ig_import_ok(ig_tmp("rs.gguf"), NULL, -1, ig_tmp("rs.sluice"));
    format_reader_close(r);
    o.extra_val = "yarn";
    assert_int_equal(gen_write_gguf(&m, ig_tmp("rs.gguf"), &o), 0);
    reject(ig_tmp("rs.gguf"), NULL, "llama.rope.scaling.type 'yarn'", "rs.gguf");
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
    ig_mkdir_p(dst);
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

void test_reject_safetensors(void **st)
{
    (void)st;
    struct gen_model m;
    assert_int_equal(gen_model_create(&m, 1, test_seed() + 50), 0);
    assert_int_equal(gen_write_llama2c(&m, ig_tmp("m.bin"), ig_tmp("tok.bin")), 0);
    char hf[4096], tok[4096], cut[4096], sd[4096]; /* tmp()'s buffers are reused */
    snprintf(hf, sizeof hf, "%s", ig_tmp("hfr"));
    snprintf(tok, sizeof tok, "%s", ig_tmp("tok.bin"));
    snprintf(cut, sizeof cut, "%s", ig_tmp("hfc"));
    snprintf(sd, sizeof sd, "%s", ig_tmp("hfs"));
    ig_mkdir_p(hf);
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
        edit_config(hf, ig_tmp(d), edits[i].from, edits[i].to);
        /* errors about config.json name it, shape errors the weights in it */
        reject(ig_tmp(d), tok, edits[i].want, edits[i].file ? edits[i].file : ig_tmp(d));
    }
    /* no tokenizer; a directory without config.json */
    reject(hf, NULL, "--tokenizer", hf);
    ig_mkdir_p(ig_tmp("empty"));
    reject(ig_tmp("empty"), tok, "config.json", "empty");
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
        reject(cut, tok, "'model.layers.0.self_attn.q_proj.bias' is not part", "model.safetensors");
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
    ig_mkdir_p(sd);
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

void test_detect(void **st)
{
    (void)st;
    enum import_source kind;
    struct sl_err err;
    assert_true(import_source_detect(ig_tmp("does-not-exist"), &kind, &err) < 0);
    assert_non_null(strstr(err.msg, "does-not-exist"));
    write_text(ig_tmp("junk.bin"), "0123456789012345678901234567890123456789");
    assert_true(import_source_detect(ig_tmp("junk.bin"), &kind, &err) < 0);
    assert_non_null(strstr(err.msg, "unrecognized"));
    write_text(ig_tmp("empty.bin"), "");
    assert_true(import_source_detect(ig_tmp("empty.bin"), &kind, &err) < 0);
    reject(ig_tmp("empty.bin"), NULL, "unrecognized", "empty.bin");
    /* a container is recognized and not imported again */
    struct gen_model m;
    assert_int_equal(gen_model_create(&m, 1, 1), 0);
    assert_int_equal(gen_write_llama2c(&m, ig_tmp("d.bin"), ig_tmp("d.tok")), 0);
    format_reader_close(ig_import_ok(ig_tmp("d.bin"), ig_tmp("d.tok"), -1, ig_tmp("d.sluice")));
    assert_int_equal(import_source_detect(ig_tmp("d.sluice"), &kind, &err), 0);
    assert_int_equal(kind, IMPORT_SRC_SLUICE);
    assert_string_equal(import_source_name(kind), "sluice");
    reject(ig_tmp("d.sluice"), NULL, "already", "d.sluice");
    /* a bad --dtype */
    struct import_opts o = {.tokenizer = ig_tmp("d.tok"), .dtype = FORMAT_ENC_F16 + 100};
    assert_int_equal(import_model(ig_tmp("d.bin"), &o, ig_tmp("x.sluice"), &err), -EINVAL);
    gen_model_destroy(&m);
}
