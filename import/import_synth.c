/* import_synth.c: deterministic synthetic models of real architectures'
 * shapes, stored as F16, for tests and benchmarks at sizes no real model here
 * has.
 *
 * The statistics imitate trained Llama checkpoints closely enough that
 * quantization is not trivially easy:
 * - per-output-channel scales spread log-normally (sigma 0.35), so channels
 *   differ in range and adaptive bit allocation has something to allocate;
 * - heavy tails: each weight is a near-Gaussian draw, and 1 in 64 is scaled
 *   by 4 (a scale mixture with excess kurtosis);
 * - a few "massive activation" channels: 0.2% of the model width (at least
 *   2) carry norm weights of 6..14, so the inputs of Q/K/V, gate/up and the
 *   classifier have outlier channels, as SmoothQuant and EdgeFlow's smoothing
 *   expect; the weight columns reading those channels are shrunk by the same
 *   factor, which keeps the products (and the model) numerically tame;
 * - weights scaled by 1/sqrt(fan-in), the output projections (wo, down) by a
 *   further 1/sqrt(2 L) as in GPT-2-style initialization, so the residual
 *   stream stays bounded through the layers.
 * Every value comes from a per-(tensor, row) seeded generator, so the file is
 * a pure function of (shape, seed), whatever the number of threads the rows
 * of a tensor are generated on. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "import_internal.h"

/* A Llama-architecture config as the checkpoints have it: interleaved RoPE,
 * BOS 1, EOS 2, RMSNorm eps 1e-5. */
#define LLAMA_CFG(dim_, ffn, layers, heads, kv_heads, hd, vocab, ctx, theta)                      \
    {.arch = FORMAT_ARCH_LLAMA,                                                                    \
     .dim = (dim_),                                                                                \
     .hidden_dim = (ffn),                                                                          \
     .n_layers = (layers),                                                                         \
     .n_heads = (heads),                                                                           \
     .n_kv_heads = (kv_heads),                                                                     \
     .head_dim = (hd),                                                                             \
     .vocab_size = (vocab),                                                                        \
     .seq_len = (ctx),                                                                             \
     .rope_layout = FORMAT_ROPE_INTERLEAVED,                                                       \
     .bos_id = 1,                                                                                  \
     .eos_id = 2,                                                                                  \
     .rope_theta = (theta),                                                                        \
     .norm_eps = 1e-5f}

/* LLAMA_CFG(dim, ffn, layers, heads, kv heads, head dim, vocab, context, RoPE theta) */
static const struct import_synth_shape shapes[] = {
    {"tiny",
     "2 layers, dim 128, GQA 4/2 heads, vocab 512 (for tests, ~1 MB)",
     LLAMA_CFG(128, 352, 2, 4, 2, 32, 512, 512, 10000.0f)},
    {"small",
     "8 layers, dim 512, GQA 8/2 heads, vocab 4096 (~54 MB)",
     LLAMA_CFG(512, 1408, 8, 8, 2, 64, 4096, 1024, 10000.0f)},
    {"tinyllama-1.1b",
     "TinyLlama-1.1B: 22 layers, dim 2048, ffn 5632, GQA 32/4, vocab 32000 (~2.2 GB)",
     LLAMA_CFG(2048, 5632, 22, 32, 4, 64, 32000, 2048, 10000.0f)},
    {"llama3-8b",
     "Llama-3-8B: 32 layers, dim 4096, ffn 14336, GQA 32/8, vocab 128256 (~16 GB)",
     LLAMA_CFG(4096, 14336, 32, 32, 8, 128, 128256, 8192, 500000.0f)},
};

const struct import_synth_shape *import_synth_shapes(size_t *n)
{
    *n = sizeof shapes / sizeof shapes[0];
    return shapes;
}

/* ---- randomness ------------------------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct rng {
    uint64_t s[4];
};

static void rng_seed(struct rng *r, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t x = mix64(a * 0x9e3779b97f4a7c15ull ^ mix64(b + 0x632be59bd9b4e019ull) ^
                       mix64(c + 0x85157af5ull));
    for (int i = 0; i < 4; i++)
        r->s[i] = x = mix64(x + 0x9e3779b97f4a7c15ull);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(struct rng *r) /* xoshiro256** */
{
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

/* Near-Gaussian (Irwin-Hall of four 16-bit uniforms, unit variance) with a
 * 1-in-64 scale mixture for heavy tails. Two draws per call of the generator. */
static float heavy_normal(struct rng *r)
{
    uint64_t u = rng_next(r);
    float s = (float)(u & 0xffff) + (float)((u >> 16) & 0xffff) + (float)((u >> 32) & 0xffff) +
              (float)(u >> 48);
    float z = (s / 65536.0f - 2.0f) * 1.7320508f;
    uint64_t v = rng_next(r);
    return (v & 63) == 0 ? 4.0f * z : z;
}

/* A standard normal (Box-Muller), for the few per-channel scales. */
static double normal(struct rng *r)
{
    double u1 = ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (double)(rng_next(r) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- the model's statistics ---------------------------------------------------------- */

struct synth {
    const struct format_config *cfg;
    uint64_t seed;
    uint32_t n_outliers;
    uint32_t *outlier_ch; /* the massive-activation channels of the model width */
    float *outlier_gain;  /* their norm weights */
};

/* Gain of input channel c of a weight reading the normed residual stream. */
static float outlier_gain(const struct synth *s, uint32_t c)
{
    for (uint32_t i = 0; i < s->n_outliers; i++)
        if (s->outlier_ch[i] == c)
            return s->outlier_gain[i];
    return 1.0f;
}

static int reads_normed_stream(uint32_t role)
{
    return role == FORMAT_ROLE_WQ || role == FORMAT_ROLE_WK || role == FORMAT_ROLE_WV ||
           role == FORMAT_ROLE_W_GATE || role == FORMAT_ROLE_W_UP || role == FORMAT_ROLE_CLASSIFIER;
}

/* Rows [r0, r1) of a 2-D tensor. Each row has its own generator, so any
 * split of the rows among threads gives the same bytes. */
struct gen_job {
    const struct synth *s;
    uint64_t tid, r0, r1, cols;
    float base;
    const float *colscale;
    uint16_t *out;
};

static void *gen_rows(void *arg)
{
    const struct gen_job *j = arg;
    for (uint64_t i = j->r0; i < j->r1; i++) {
        struct rng r;
        rng_seed(&r, j->s->seed, j->tid, i + 1);
        float g = j->base * (float)exp(0.35 * normal(&r));
        uint16_t *o = j->out + i * j->cols;
        for (uint64_t k = 0; k < j->cols; k++)
            o[k] = sl_f32_to_f16(g * j->colscale[k] * heavy_normal(&r));
    }
    return NULL;
}

/* Threads for generation: $SLUICE_SYNTH_THREADS (1..64) when set, else the
 * online CPUs (at most 16). */
static unsigned synth_threads(void)
{
    const char *e = getenv("SLUICE_SYNTH_THREADS");
    long n = e && *e ? strtol(e, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
    if (e && *e)
        return n >= 1 && n <= 64 ? (unsigned)n : 1;
    return n < 1 ? 1 : n > 16 ? 16 : (unsigned)n;
}

/* Fills tensor (layer, role) of rows x cols as F16 into out, on up to
 * `threads` threads. 0 or -ENOMEM. */
static int gen_tensor(const struct synth *s, int layer, uint32_t role, uint64_t rows,
                      uint64_t cols, unsigned threads, uint16_t *out)
{
    const struct format_config *c = s->cfg;
    uint64_t tid = (uint64_t)(layer + 1) * 64 + role;
    if (cols == 1) { /* a norm: around 1, outlier channels large */
        struct rng r;
        rng_seed(&r, s->seed, tid, 0);
        for (uint64_t i = 0; i < rows; i++) {
            /* every norm, the final one too: the classifier reads the same
             * outlier channels (its columns are shrunk to match) */
            float w = (1.0f + 0.1f * (float)normal(&r)) * outlier_gain(s, (uint32_t)i);
            out[i] = sl_f32_to_f16(w);
        }
        return 0;
    }
    float base = 1.0f / sqrtf((float)cols);
    if (role == FORMAT_ROLE_WO || role == FORMAT_ROLE_W_DOWN)
        base /= sqrtf(2.0f * (float)c->n_layers);
    if (role == FORMAT_ROLE_TOK_EMBD)
        base = 1.0f;
    float *colscale = malloc(sizeof(float) * cols);
    if (!colscale)
        return -ENOMEM;
    for (uint64_t j = 0; j < cols; j++)
        colscale[j] = reads_normed_stream(role) ? 1.0f / outlier_gain(s, (uint32_t)j) : 1.0f;
    struct gen_job jobs[64];
    pthread_t th[64];
    /* at least 16K weights a thread: thread start-up is not worth it below */
    uint64_t nt = threads;
    if (nt > rows)
        nt = rows;
    while (nt > 1 && rows * cols / nt < 16384)
        nt--;
    uint64_t started = 0;
    for (uint64_t t = 0; t < nt; t++) {
        jobs[t] = (struct gen_job){.s = s,
                                   .tid = tid,
                                   .r0 = rows * t / nt,
                                   .r1 = rows * (t + 1) / nt,
                                   .cols = cols,
                                   .base = base,
                                   .colscale = colscale,
                                   .out = out};
        /* job 0 runs here; a thread that cannot start leaves its rows to us */
        if (t > 0 && pthread_create(&th[t], NULL, gen_rows, &jobs[t]) == 0)
            started |= 1ull << t;
    }
    for (uint64_t t = 0; t < nt; t++)
        if (!(started >> t & 1))
            gen_rows(&jobs[t]);
    for (uint64_t t = 1; t < nt; t++)
        if (started >> t & 1)
            pthread_join(th[t], NULL);
    free(colscale);
    return 0;
}

/* ---- vocabulary ------------------------------------------------------------------------ */

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

/* <unk> <s> </s>, the 256 byte tokens, the printable ASCII characters, then
 * deterministic letter strings (half with a leading space) until vocab_size,
 * scored so that longer, earlier pieces merge first. */
static int synth_vocab(const struct synth *s, struct import_vocab *v, struct sl_err *err)
{
    uint32_t n = s->cfg->vocab_size;
    memset(v, 0, sizeof *v);
    size_t cap = 1;
    while (cap < 2 * (size_t)n)
        cap <<= 1;
    uint64_t *set = calloc(cap, sizeof(uint64_t));
    if (!set || qi_vocab_alloc(v, n) < 0) {
        free(set);
        sl_err_set(err, "out of memory building the vocabulary");
        return -ENOMEM;
    }
    uint32_t k = 0;
    char buf[16];
#define ADD(str, len, score)                                                                       \
    do {                                                                                           \
        uint64_t h_ = hash_bytes(str, len) | 1;                                                    \
        size_t slot_ = h_ & (cap - 1);                                                             \
        int dup_ = 0;                                                                              \
        while (set[slot_]) {                                                                       \
            if (set[slot_] == h_) {                                                                \
                dup_ = 1;                                                                          \
                break;                                                                             \
            }                                                                                      \
            slot_ = (slot_ + 1) & (cap - 1);                                                       \
        }                                                                                          \
        if (!dup_ && k < n) {                                                                      \
            set[slot_] = h_;                                                                       \
            v->strs[k] = malloc((len) + 1);                                                        \
            if (!v->strs[k])                                                                       \
                goto oom;                                                                          \
            memcpy(v->strs[k], str, len);                                                          \
            v->strs[k][len] = 0;                                                                   \
            v->lens[k] = (uint32_t)(len);                                                          \
            v->scores[k] = (score);                                                                \
            k++;                                                                                   \
        }                                                                                          \
    } while (0)
    ADD("<unk>", 5, 0.0f);
    ADD("<s>", 3, 0.0f);
    ADD("</s>", 4, 0.0f);
    for (int b = 0; b < 256 && k < n; b++) {
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        ADD(buf, 6, 0.0f);
    }
    for (int ch = 32; ch < 127 && k < n; ch++) {
        buf[0] = (char)ch;
        ADD(buf, 1, -1e6f);
    }
    static const char letters[] = "etaoinshrdlcumwfgypbvkjxqz";
    struct rng r;
    rng_seed(&r, s->seed, 0x70c, 0);
    uint64_t attempts = 0;
    while (k < n && attempts < 64ull * n) {
        attempts++;
        uint64_t u = rng_next(&r);
        int space = u & 1;
        int len = 2 + (int)((u >> 1) % 6);
        int p = 0;
        if (space)
            buf[p++] = ' ';
        for (int i = 0; i < len; i++) {
            /* skewed towards frequent letters: min of two draws */
            uint64_t a = rng_next(&r);
            int x = (int)(a % 26), y = (int)((a >> 8) % 26);
            buf[p++] = letters[x < y ? x : y];
        }
        ADD(buf, (size_t)p, -(float)k);
    }
#undef ADD
    free(set);
    if (k < n) {
        import_vocab_free(v);
        sl_err_set(err, "could not build %u distinct tokens", n);
        return -EINVAL;
    }
    qi_vocab_publish(v);
    return 0;
oom:
    free(set);
    import_vocab_free(v);
    sl_err_set(err, "out of memory building the vocabulary");
    return -ENOMEM;
}

int import_synth(const char *shape, uint64_t seed, const char *out_path,
                 import_progress_fn progress, void *progress_ctx, struct sl_err *err)
{
    const struct import_synth_shape *sh = NULL;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!strcmp(shapes[i].name, shape))
            sh = &shapes[i];
    if (!sh) {
        sl_err_set(err, "unknown shape '%s' (see sluice synth --list)", shape);
        return -EINVAL;
    }
    const struct format_config *c = &sh->cfg;
    struct synth s = {.cfg = c, .seed = seed};
    s.n_outliers = c->dim / 500 > 2 ? c->dim / 500 : 2;
    s.outlier_ch = malloc(sizeof(uint32_t) * s.n_outliers);
    s.outlier_gain = malloc(sizeof(float) * s.n_outliers);
    struct import_vocab vocab = {0};
    struct format_writer *w = NULL;
    uint16_t *buf = NULL;
    int ret = -ENOMEM;
    if (!s.outlier_ch || !s.outlier_gain) {
        sl_err_set(err, "out of memory");
        goto out;
    }
    struct rng r;
    rng_seed(&r, seed, 0x0a7, 0);
    for (uint32_t i = 0; i < s.n_outliers; i++) {
        uint32_t ch;
        int again;
        do { /* distinct channels */
            ch = (uint32_t)(rng_next(&r) % c->dim);
            again = 0;
            for (uint32_t j = 0; j < i; j++)
                again |= s.outlier_ch[j] == ch;
        } while (again);
        s.outlier_ch[i] = ch;
        s.outlier_gain[i] = 6.0f + 8.0f * (float)(rng_next(&r) >> 11) / 9007199254740992.0f;
    }
    ret = synth_vocab(&s, &vocab, err);
    if (ret < 0)
        goto out;
    ret = format_writer_create(out_path, &w, err);
    if (ret == 0)
        ret = format_writer_set_config(w, c, err);
    if (ret == 0)
        ret = format_writer_set_tokenizer(w, &vocab.tok, err);
    char seedtxt[32];
    snprintf(seedtxt, sizeof seedtxt, "%" PRIu64, seed);
    if (ret == 0)
        ret = format_writer_set_meta(w, "source.format", "synth", 5, err);
    if (ret == 0)
        ret = format_writer_set_meta(w, "synth.shape", shape, strlen(shape), err);
    if (ret == 0)
        ret = format_writer_set_meta(w, "synth.seed", seedtxt, strlen(seedtxt), err);
    if (ret < 0)
        goto out;
    size_t n = qi_order_count(c);
    unsigned threads = synth_threads();
    uint64_t total = 0, done = 0, maxel = 0;
    for (size_t i = 0; i < n; i++) {
        int layer;
        uint32_t role, nd;
        uint64_t shp[2];
        qi_order_at(c, i, &layer, &role);
        format_role_shape(c, role, &nd, shp);
        uint64_t el = shp[0] * (nd == 2 ? shp[1] : 1);
        total += el;
        if (el > maxel)
            maxel = el;
    }
    buf = malloc(maxel * 2);
    if (!buf) {
        ret = -ENOMEM;
        sl_err_set(err, "out of memory (%" PRIu64 " bytes for the largest tensor)", maxel * 2);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        int layer;
        uint32_t role, nd;
        uint64_t shp[2];
        qi_order_at(c, i, &layer, &role);
        format_role_shape(c, role, &nd, shp);
        uint64_t cols = nd == 2 ? shp[1] : 1;
        char name[FORMAT_NAME_MAX];
        format_tensor_name(layer, role, name, sizeof name);
        ret = gen_tensor(&s, layer, role, shp[0], cols, threads, buf);
        if (ret < 0) {
            sl_err_set(err, "out of memory generating %s", name);
            goto out;
        }
        struct format_tensor_desc d = {.name = name,
                                       .layer = layer,
                                       .role = role,
                                       .encoding = FORMAT_ENC_F16,
                                       .n_dims = nd,
                                       .shape = {shp[0], nd == 2 ? shp[1] : 0}};
        ret = format_writer_add_tensor(w, &d, buf, shp[0] * cols * 2, err);
        if (ret < 0)
            goto out;
        done += shp[0] * cols;
        if (progress)
            progress(progress_ctx, name, done, total);
    }
    ret = format_writer_finish(w, err);
out:
    free(buf);
    format_writer_destroy(w);
    import_vocab_free(&vocab);
    free(s.outlier_ch);
    free(s.outlier_gain);
    return ret;
}
