/* test_import_kquant.c: GGUF files with Q4_K, Q5_K, Q6_K and Q8_0 tensors,
 * written here (a one-layer Llama, dim 256, FFN 512), imported to float.
 * 1. Exactness: blocks of random bytes (every byte string is a valid block;
 *    only the fp16 scales are kept finite) must import to exactly the floats
 *    of a decoder written here per weight from the format's definition (bit
 *    positions computed from the weight's index, not the importer's loops).
 * 2. Meaning: random normal weights quantized by the reference quantizers
 *    below (per sub-block min/scale search, 6-bit scales, fp16 super-scales,
 *    round to nearest) import close to the originals (error within the
 *    quantization step), so a misread nibble, bit plane or scale order, which
 *    random bytes alone would not reveal, fails.
 * 3. A K-quant tensor whose rows are not a multiple of 256 is refused. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format.h"
#include "import.h"
#include "testutil.h"

enum { T_F32 = 0, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14 };
#define DIM 256
#define FFN 512
#define VOCAB 256

static const char *dir;

static uint64_t block_bytes(uint32_t t)
{
    return t == T_Q8_0 ? 34 : t == T_Q4_K ? 144 : t == T_Q5_K ? 176 : t == T_Q6_K ? 210 : 4;
}

static uint64_t block_n(uint32_t t)
{
    return t == T_Q8_0 ? 32 : t == T_F32 ? 1 : 256;
}

/* ---- an independent decoder: weight i of a block ------------------------------------ */

static float f16(const uint8_t *p)
{
    return sl_f16_to_f32(sl_load_le16(p));
}

/* 6-bit scale and min of sub-block j of the 12 packed bytes s */
static void sm6(const uint8_t *s, int j, float *sc, float *m)
{
    int lo = j < 4;
    unsigned a = lo ? (s[j] & 63u) : ((s[j + 4] & 15u) | ((unsigned)(s[j - 4] >> 6) << 4));
    unsigned b = lo ? (s[j + 4] & 63u) : ((unsigned)(s[j + 4] >> 4) | ((unsigned)(s[j] >> 6) << 4));
    *sc = (float)a;
    *m = (float)b;
}

static float weight(uint32_t t, const uint8_t *b, int i)
{
    if (t == T_Q8_0)
        return f16(b) * (float)(int8_t)b[2 + i];
    if (t == T_Q4_K || t == T_Q5_K) {
        int sub = i / 32, chunk = i / 64, hi = sub % 2, l = i % 32;
        const uint8_t *qs = b + (t == T_Q4_K ? 16 : 48) + 32 * chunk;
        unsigned q = hi ? (unsigned)(qs[l] >> 4) : (qs[l] & 15u);
        if (t == T_Q5_K)
            q |= ((b[16 + l] >> sub) & 1u) << 4; /* plane 2*chunk + hi = sub */
        float sc, m;
        sm6(b + 4, sub, &sc, &m);
        float dsc = f16(b) * sc, dm = f16(b + 2) * m;
        float p = dsc * (float)q;
        return p - dm;
    }
    /* Q6_K: half h (128 weights), quarter k = (i % 128) / 32, lane l */
    int h = i / 128, k = (i % 128) / 32, l = i % 32;
    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
    unsigned lo = k % 2 ? ql[l + 32] : ql[l];
    lo = k < 2 ? (lo & 15u) : (lo >> 4);
    unsigned top = (qh[l] >> (2 * k)) & 3u;
    int q = (int)(lo | (top << 4)) - 32;
    int8_t sc = (int8_t)b[192 + 8 * h + 2 * k + l / 16];
    return (f16(b + 208) * (float)sc) * (float)q;
}

/* ---- reference quantizers ---------------------------------------------------------------- */

static int nearest(float x)
{
    return (int)lrintf(x);
}

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Q4_K / Q5_K: per 32 weights x = sc * q - m with q in [0, 2^bits - 1]. */
static void quant_k45(uint32_t t, const float *x, uint8_t *b)
{
    int nq = t == T_Q4_K ? 15 : 31;
    float scale[8], minv[8], maxs = 0, maxm = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = 0; /* min <= 0, as the format's subtracted min needs */
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        scale[j] = (hi - lo) / (float)nq;
        minv[j] = -lo;
        maxs = fmaxf(maxs, scale[j]);
        maxm = fmaxf(maxm, minv[j]);
    }
    memset(b, 0, block_bytes(t));
    uint16_t dh = sl_f32_to_f16(maxs / 63), mh = sl_f32_to_f16(maxm / 63);
    sl_store_le16(b, dh);
    sl_store_le16(b + 2, mh);
    float d = sl_f16_to_f32(dh), dmin = sl_f16_to_f32(mh);
    uint8_t *s = b + 4;
    for (int j = 0; j < 8; j++) {
        unsigned sc = d > 0 ? (unsigned)clampi(nearest(scale[j] / d), 0, 63) : 0;
        unsigned m = dmin > 0 ? (unsigned)clampi(nearest(minv[j] / dmin), 0, 63) : 0;
        if (j < 4) {
            s[j] |= (uint8_t)sc;
            s[j + 4] |= (uint8_t)m;
        } else {
            s[j + 4] |= (uint8_t)((sc & 15) | ((m & 15) << 4));
            s[j - 4] |= (uint8_t)((sc >> 4) << 6);
            s[j] |= (uint8_t)((m >> 4) << 6);
        }
        float step = d * (float)sc, off = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            int i = 32 * j + l;
            int q = step > 0 ? clampi(nearest((x[i] + off) / step), 0, nq) : 0;
            int chunk = i / 64, hi = j % 2;
            uint8_t *qs = b + (t == T_Q4_K ? 16 : 48) + 32 * chunk;
            qs[l] |= (uint8_t)((q & 15) << (hi ? 4 : 0));
            if (t == T_Q5_K && (q & 16))
                b[16 + l] |= (uint8_t)(1u << j);
        }
    }
}

/* Q6_K: per 16 weights x = d * sc * (q - 32), sc int8, q in [0, 63]. */
static void quant_q6(const float *x, uint8_t *b)
{
    float sub[16], amax = 0;
    for (int j = 0; j < 16; j++) {
        float a = 0;
        for (int l = 0; l < 16; l++)
            a = fmaxf(a, fabsf(x[16 * j + l]));
        sub[j] = a / 31;
        amax = fmaxf(amax, sub[j]);
    }
    memset(b, 0, 210);
    uint16_t dh = sl_f32_to_f16(amax / 127);
    sl_store_le16(b + 208, dh);
    float d = sl_f16_to_f32(dh);
    for (int j = 0; j < 16; j++) {
        int sc = d > 0 ? clampi(nearest(sub[j] / d), -128, 127) : 0;
        b[192 + j] = (uint8_t)(int8_t)sc;
        float step = d * (float)sc;
        for (int l = 0; l < 16; l++) {
            int i = 16 * j + l;
            int q = step > 0 ? clampi(nearest(x[i] / step) + 32, 0, 63) : 32;
            int h = i / 128, k = (i % 128) / 32, ll = i % 32;
            uint8_t *ql = b + 64 * h + (k % 2 ? 32 : 0), *qh = b + 128 + 32 * h;
            ql[ll] |= (uint8_t)((q & 15) << (k < 2 ? 0 : 4));
            qh[ll] |= (uint8_t)((q >> 4) << (2 * k));
        }
    }
}

static void quant_q8(const float *x, uint8_t *b)
{
    float a = 0;
    for (int l = 0; l < 32; l++)
        a = fmaxf(a, fabsf(x[l]));
    uint16_t dh = sl_f32_to_f16(a / 127);
    sl_store_le16(b, dh);
    float d = sl_f16_to_f32(dh);
    for (int l = 0; l < 32; l++)
        b[2 + l] = (uint8_t)(int8_t)(d > 0 ? clampi(nearest(x[l] / d), -127, 127) : 0);
}

/* ---- a one-layer GGUF ---------------------------------------------------------------------- */

struct tdef {
    const char *name;
    uint32_t type;
    uint64_t rows, cols; /* cols 1: a norm */
    uint8_t *bytes;
    uint64_t len;
    float *orig; /* what was quantized (meaning test) */
};

struct buf {
    uint8_t *p;
    size_t len;
};

static void put(struct buf *b, const void *p, size_t n)
{
    b->p = realloc(b->p, b->len + n);
    assert_non_null(b->p);
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void u32(struct buf *b, uint32_t v)
{
    uint8_t x[4];
    sl_store_le32(x, v);
    put(b, x, 4);
}

static void u64(struct buf *b, uint64_t v)
{
    uint8_t x[8];
    sl_store_le64(x, v);
    put(b, x, 8);
}

static void str(struct buf *b, const char *s)
{
    u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void kv_u32(struct buf *b, const char *k, uint32_t v)
{
    str(b, k);
    u32(b, 4);
    u32(b, v);
}

static void write_gguf(const char *path, struct tdef *t, size_t n)
{
    struct buf b = {0};
    put(&b, "GGUF", 4);
    u32(&b, 3);
    u64(&b, n);
    u64(&b, 10);
    str(&b, "general.architecture"), u32(&b, 8), str(&b, "llama");
    kv_u32(&b, "llama.embedding_length", DIM);
    kv_u32(&b, "llama.feed_forward_length", FFN);
    kv_u32(&b, "llama.block_count", 1);
    kv_u32(&b, "llama.attention.head_count", 4);
    kv_u32(&b, "llama.attention.head_count_kv", 2);
    kv_u32(&b, "llama.context_length", 64);
    str(&b, "tokenizer.ggml.model"), u32(&b, 8), str(&b, "llama");
    str(&b, "tokenizer.ggml.tokens"), u32(&b, 9), u32(&b, 8), u64(&b, VOCAB);
    for (int i = 0; i < VOCAB; i++) {
        char s[16];
        snprintf(s, sizeof s, "t%d", i);
        str(&b, s);
    }
    str(&b, "tokenizer.ggml.scores"), u32(&b, 9), u32(&b, 6), u64(&b, VOCAB);
    for (int i = 0; i < VOCAB; i++) {
        uint8_t x[4];
        sl_store_lef32(x, -(float)i);
        put(&b, x, 4);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        str(&b, t[i].name);
        u32(&b, t[i].cols == 1 ? 1 : 2);
        u64(&b, t[i].cols == 1 ? t[i].rows : t[i].cols);
        if (t[i].cols != 1)
            u64(&b, t[i].rows);
        u32(&b, t[i].type);
        u64(&b, off);
        off = sl_align_up(off + t[i].len, 32);
    }
    size_t pad = sl_align_up(b.len, 32) - b.len;
    uint8_t zero[32] = {0};
    put(&b, zero, pad);
    for (size_t i = 0; i < n; i++) {
        put(&b, t[i].bytes, t[i].len);
        put(&b, zero, sl_align_up(t[i].len, 32) - t[i].len);
    }
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b.p, 1, b.len, f), b.len);
    fclose(f);
    free(b.p);
}

/* The model: every block type on some tensor, norms F32. */
static size_t model(struct tdef *t, uint32_t qk_type)
{
    static const char *const names[] = {
        "token_embd.weight",     "blk.0.attn_norm.weight", "blk.0.attn_q.weight",
        "blk.0.attn_k.weight",   "blk.0.attn_v.weight",    "blk.0.attn_output.weight",
        "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight",  "blk.0.ffn_up.weight",
        "blk.0.ffn_down.weight", "output_norm.weight"};
    const uint64_t rows[] = {VOCAB, DIM, DIM, DIM / 2, DIM / 2, DIM, DIM, FFN, FFN, DIM, DIM};
    const uint64_t cols[] = {DIM, 1, DIM, DIM, DIM, DIM, 1, DIM, DIM, FFN, 1};
    const uint32_t types[] = {T_Q6_K, T_F32,  T_Q4_K, T_Q5_K, T_Q8_0, T_Q6_K,
                              T_F32,  T_Q4_K, T_Q5_K, T_Q6_K, T_F32};
    for (size_t i = 0; i < 11; i++) {
        t[i] = (struct tdef){names[i], types[i], rows[i], cols[i], NULL, 0, NULL};
        if (qk_type && types[i] != T_F32 && i != 0)
            t[i].type = qk_type; /* one type throughout, for the refusal test */
    }
    return 11;
}

static void fill_random_blocks(struct tdef *t, struct test_rng *g)
{
    uint64_t n = t->rows * t->cols, nb = n / block_n(t->type);
    t->len = nb * block_bytes(t->type);
    t->bytes = malloc(t->len);
    assert_non_null(t->bytes);
    for (uint64_t k = 0; k < t->len; k++)
        t->bytes[k] = (uint8_t)test_rng_u64(g);
    for (uint64_t k = 0; k < nb; k++) {
        uint8_t *b = t->bytes + k * block_bytes(t->type);
        if (t->type == T_F32) {
            sl_store_lef32(b, test_rng_normal(g));
            continue;
        }
        /* finite fp16 scales of a sensible size */
        uint16_t d = sl_f32_to_f16(0.001f + 0.01f * test_rng_float(g));
        uint16_t dm = sl_f32_to_f16(0.001f + 0.01f * test_rng_float(g));
        if (t->type == T_Q6_K) {
            sl_store_le16(b + 208, d);
        } else {
            sl_store_le16(b, d);
            if (t->type != T_Q8_0)
                sl_store_le16(b + 2, dm);
        }
    }
}

static void fill_quantized(struct tdef *t, struct test_rng *g)
{
    uint64_t n = t->rows * t->cols, nb = n / block_n(t->type);
    t->len = nb * block_bytes(t->type);
    t->bytes = calloc(1, t->len);
    t->orig = malloc(n * sizeof(float));
    assert_non_null(t->bytes);
    assert_non_null(t->orig);
    for (uint64_t i = 0; i < n; i++)
        t->orig[i] = 0.05f * test_rng_normal(g) + (t->type == T_Q4_K ? 0.01f : 0);
    for (uint64_t k = 0; k < nb; k++) {
        uint8_t *b = t->bytes + k * block_bytes(t->type);
        const float *x = t->orig + k * block_n(t->type);
        if (t->type == T_F32)
            sl_store_lef32(b, x[0]);
        else if (t->type == T_Q8_0)
            quant_q8(x, b);
        else if (t->type == T_Q6_K)
            quant_q6(x, b);
        else
            quant_k45(t->type, x, b);
    }
}

static void free_model(struct tdef *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(t[i].bytes);
        free(t[i].orig);
    }
}

static struct format_reader *import_it(const char *gguf, const char *out)
{
    struct import_opts o = {.dtype = -1};
    struct sl_err err = {{0}};
    if (import_model(gguf, &o, out, &err) < 0)
        fail_msg("import %s: %s", gguf, err.msg);
    struct format_reader *r;
    assert_int_equal(format_reader_open(out, &r, &err), 0);
    return r;
}

static float *tensor_floats(struct format_reader *r, const char *name, uint64_t n)
{
    struct sl_err err = {{0}};
    int i = format_reader_find_name(r, name);
    assert_true(i >= 0);
    const struct format_tensor_info *ti = format_reader_tensor(r, (uint32_t)i);
    assert_int_equal(ti->encoding, FORMAT_ENC_F32);
    assert_int_equal(format_tensor_numel(ti), n);
    float *v = malloc(n * sizeof(float));
    void *raw = malloc(ti->length);
    assert_int_equal(format_reader_read_tensor(r, (uint32_t)i, raw, ti->length, &err), 0);
    assert_int_equal(format_decode_float(ti->encoding, raw, v, n), 0);
    free(raw);
    return v;
}

static void test_exact(void **st)
{
    (void)st;
    struct test_rng g;
    test_rng_init(&g, test_seed());
    struct tdef t[11];
    size_t n = model(t, 0);
    for (size_t i = 0; i < n; i++)
        fill_random_blocks(&t[i], &g);
    char p[512], q[512];
    snprintf(p, sizeof p, "%s/exact.gguf", dir);
    snprintf(q, sizeof q, "%s/exact.sluice", dir);
    write_gguf(p, t, n);
    struct format_reader *r = import_it(p, q);
    for (size_t i = 0; i < n; i++) {
        uint64_t cnt = t[i].rows * t[i].cols;
        float *v = tensor_floats(r, t[i].name, cnt);
        uint64_t bn = block_n(t[i].type);
        for (uint64_t k = 0; k < cnt; k++) {
            const uint8_t *b = t[i].bytes + (k / bn) * block_bytes(t[i].type);
            float want =
                t[i].type == T_F32 ? sl_load_lef32(b) : weight(t[i].type, b, (int)(k % bn));
            if (v[k] != want)
                fail_msg("%s (type %u) weight %llu: imported %.9g, the format says %.9g", t[i].name,
                         t[i].type, (unsigned long long)k, (double)v[k], (double)want);
        }
        free(v);
    }
    format_reader_close(r);
    free_model(t, n);
}

static void test_meaning(void **st)
{
    (void)st;
    struct test_rng g;
    test_rng_init(&g, test_seed() ^ 0x5eed);
    struct tdef t[11];
    size_t n = model(t, 0);
    for (size_t i = 0; i < n; i++)
        fill_quantized(&t[i], &g);
    char p[512], q[512];
    snprintf(p, sizeof p, "%s/meaning.gguf", dir);
    snprintf(q, sizeof q, "%s/meaning.sluice", dir);
    write_gguf(p, t, n);
    struct format_reader *r = import_it(p, q);
    for (size_t i = 0; i < n; i++) {
        uint64_t cnt = t[i].rows * t[i].cols;
        float *v = tensor_floats(r, t[i].name, cnt);
        double err2 = 0, ref2 = 0, worst = 0;
        for (uint64_t k = 0; k < cnt; k++) {
            double e = (double)v[k] - (double)t[i].orig[k];
            err2 += e * e;
            ref2 += (double)t[i].orig[k] * t[i].orig[k];
            worst = fmax(worst, fabs(e));
        }
        double rel = sqrt(err2 / ref2);
        /* the step of each format relative to the weights' spread */
        double bound = t[i].type == T_F32    ? 0
                       : t[i].type == T_Q8_0 ? 0.02
                       : t[i].type == T_Q6_K ? 0.05
                       : t[i].type == T_Q5_K ? 0.08
                                             : 0.15;
        if (rel > bound)
            fail_msg("%s (type %u): relative RMS error %.4f > %.2f (worst %.4g): misread layout?",
                     t[i].name, t[i].type, rel, bound, worst);
        free(v);
    }
    format_reader_close(r);
    free_model(t, n);
}

int main(void)
{
    dir = test_tmpdir();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact),
        cmocka_unit_test(test_meaning),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
