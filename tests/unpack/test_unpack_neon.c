/* test_unpack_neon.c: the NEON unpackers against the scalar specification,
 * bit for bit. Self-contained (no cmocka, which may not exist for arm64): it
 * is cross-compiled for aarch64 with the unpack, format and common sources
 * and run under qemu-user by scripts/test-neon.sh.
 * - every encoding, width 1..8 and many row lengths (tails of every kind),
 *   on random code bytes (so also codes the packer never writes);
 * - the row sums of the vpdpbusd correction;
 * - the public path: pack, unpack_tensor_int8 (which must pick NEON here) and
 *   the correction give the codes back.
 * Prints the seed (SLUICE_TEST_SEED replays); exit 0 pass, 1 mismatch. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quantizer.h"
#include "unpack_internal.h"

/* The format module's traits table lives in format_common.c, which needs
 * xxhash and zstd (not installed for arm64); unpack.c only asks it for the
 * packed encodings' names and validators, so this test provides those. */
static int validate_packed(uint32_t enc, const void *d, uint64_t len, uint64_t rows,
                           uint64_t cols, struct sl_err *err)
{
    return format_packed_parse(enc, d, len, rows, cols, NULL, err);
}
static int v_adaptive(const void *d, uint64_t l, uint64_t r, uint64_t c, struct sl_err *e)
{
    return validate_packed(FORMAT_ENC_ADAPTIVE, d, l, r, c, e);
}
static int v_int4int8(const void *d, uint64_t l, uint64_t r, uint64_t c, struct sl_err *e)
{
    return validate_packed(FORMAT_ENC_INT4INT8, d, l, r, c, e);
}
static int v_bitplane(const void *d, uint64_t l, uint64_t r, uint64_t c, struct sl_err *e)
{
    return validate_packed(FORMAT_ENC_BITPLANE, d, l, r, c, e);
}
const struct format_encoding_traits *format_encoding_traits(uint32_t encoding)
{
    static const struct format_encoding_traits t[FORMAT_ENC_COUNT] = {
        [FORMAT_ENC_ADAPTIVE] = {"adaptive", 1, NULL, v_adaptive},
        [FORMAT_ENC_INT4INT8] = {"int4int8", 1, NULL, v_int4int8},
        [FORMAT_ENC_BITPLANE] = {"bitplane", 1, NULL, v_bitplane},
    };
    return encoding < FORMAT_ENC_COUNT && t[encoding].name ? &t[encoding] : NULL;
}

static uint64_t state;

static uint64_t next(void)
{
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#define CHECK(cond, ...)                                                                        \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            printf("FAIL: " __VA_ARGS__);                                                        \
            printf("\n");                                                                        \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

static int rows_vs_scalar(long *checked)
{
    static const uint32_t cols[] = {1,   7,   8,   9,   15,  16,  17,  31,  33,   64,   100,
                                    172, 256, 504, 511, 512, 513, 688, 1024, 1031, 1500, 2048};
    const struct unpack_kernels *ks = &unpack_kernels_scalar, *kn = &unpack_kernels_neon;
    const char *names[3] = {"adaptive", "int4int8", "bitplane"};
    unpack_row_fn *ref[3] = {ks->adaptive, ks->int4int8, ks->bitplane};
    unpack_row_fn *neon[3] = {kn->adaptive, kn->int4int8, kn->bitplane};
    const uint32_t enc[3] = {FORMAT_ENC_ADAPTIVE, FORMAT_ENC_INT4INT8, FORMAT_ENC_BITPLANE};
    for (int e = 0; e < 3; e++)
        for (uint32_t b = 1; b <= 8; b++)
            for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
                for (int rep = 0; rep < 3; rep++) {
                    uint32_t n = cols[c];
                    uint64_t len = format_packed_row_bytes(enc[e], b, n);
                    uint8_t *src = malloc(len);
                    int8_t *a = malloc(n + 64), *bb = malloc(n + 64);
                    for (uint64_t i = 0; i < len; i++)
                        src[i] = (uint8_t)next();
                    memset(a, 0x11, n + 64);
                    memset(bb, 0x11, n + 64);
                    ref[e](src, n, b, a, 0);
                    neon[e](src, n, b, bb, 1); /* may ignore stream */
                    for (uint32_t j = 0; j < n + 64; j++)
                        CHECK(a[j] == bb[j], "%s width %u cols %u byte %u: neon %d, scalar %d%s",
                              names[e], b, n, j, bb[j], a[j], j >= n ? " (past the row)" : "");
                    CHECK(kn->sum(a, n) == ks->sum(a, n), "sum of %u codes: neon %d, scalar %d",
                          n, kn->sum(a, n), ks->sum(a, n));
                    *checked += n;
                    free(src);
                    free(a);
                    free(bb);
                }
    return 0;
}

/* The dot kernel (decode from packed weights) on arbitrary adaptive code
 * bytes and activations (random, and the extremes -128 / 127): equal to the
 * scalar kernel and to the scalar row unpacked then multiplied. */
static int dot_vs_scalar(long *checked)
{
    static const uint32_t cols[] = {1,   7,   8,   9,   15,  16,  17,  64,   100,  172,
                                    256, 504, 511, 512, 513, 688, 1024, 1031, 1536, 5632};
    const struct unpack_kernels *ks = &unpack_kernels_scalar, *kn = &unpack_kernels_neon;
    for (uint32_t b = 1; b <= 8; b++)
        for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
            for (int rep = 0; rep < 4; rep++) {
                uint32_t n = cols[c], nfull = n / 512 * 512;
                uint64_t len = format_packed_row_bytes(FORMAT_ENC_ADAPTIVE, b, n);
                uint8_t *src = malloc(len);
                int8_t *x = malloc(n), *q = malloc(n);
                for (uint64_t i = 0; i < len; i++)
                    src[i] = (uint8_t)next();
                for (uint32_t i = 0; i < n; i++)
                    x[i] = rep == 1 ? -128 : rep == 2 ? 127 : (int8_t)next();
                struct unpack_dot_args a = {0};
                int8_t xt[FORMAT_PACKED_GROUP + 64] = {0};
                for (uint32_t i = 0; i < n; i++) {
                    a.xsum_all += x[i];
                    if (i < nfull)
                        a.xsum_full += x[i];
                }
                memcpy(xt, x + nfull, n - nfull);
                a.xtail = xt;
                ks->adaptive(src, n, b, q, 0);
                int64_t want = 0;
                for (uint32_t i = 0; i < n; i++)
                    want += (int64_t)q[i] * x[i];
                int32_t r = ks->adaptive_dot(src, n, b, x, &a), g = kn->adaptive_dot(src, n, b, x, &a);
                CHECK(r == want, "scalar dot width %u cols %u: %d, want %lld", b, n, r,
                      (long long)want);
                CHECK(g == r, "neon dot width %u cols %u: %d, scalar %d", b, n, g, r);
                *checked += n;
                free(src);
                free(x);
                free(q);
            }
    return 0;
}

/* Block multipliers: the NEON multiply and the adaptive row multiplied
 * before its stores, against the scalar row then unpack_mult_scalar, on
 * arbitrary code bytes and multipliers 1..format_packed_mult_max(b). */
static int mult_vs_scalar(long *checked)
{
    static const uint32_t cols[] = {1,   7,   31,  32,  33,  64,  100, 172,  256,
                                    504, 512, 513, 688, 1024, 1031, 1100, 2048};
    const struct unpack_kernels *ks = &unpack_kernels_scalar, *kn = &unpack_kernels_neon;
    CHECK(kn->mult && kn->adaptive_mult, "no NEON multiplier kernels");
    for (uint32_t b = 1; b <= 8; b++)
        for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
            for (int rep = 0; rep < 3; rep++) {
                uint32_t n = cols[c], nb = format_packed_mult_blocks(n);
                uint32_t mx = format_packed_mult_max(b);
                uint64_t len = format_packed_row_bytes(FORMAT_ENC_ADAPTIVE, b, n);
                uint8_t *src = malloc(len), *m = malloc(nb);
                int8_t *a = malloc(n + 64), *bb = malloc(n + 64), *cc = malloc(n + 64);
                for (uint64_t i = 0; i < len; i++)
                    src[i] = (uint8_t)next();
                for (uint32_t k = 0; k < nb; k++)
                    m[k] = (uint8_t)(1 + next() % mx);
                memset(a, 0x11, n + 64);
                memset(bb, 0x11, n + 64);
                ks->adaptive(src, n, b, a, 0);
                memcpy(cc, a, n + 64);
                unpack_mult_scalar(a, n, m);
                for (uint32_t j = 0; j < n; j++)
                    CHECK(a[j] == cc[j] * m[j / 32], "scalar multiply width %u byte %u", b, j);
                kn->adaptive_mult(src, n, b, bb, 0, m);
                for (uint32_t j = 0; j < n + 64; j++)
                    CHECK(a[j] == bb[j], "adaptive+m width %u cols %u byte %u: neon %d, scalar %d%s",
                          b, n, j, bb[j], a[j], j >= n ? " (past the row)" : "");
                kn->mult(cc, n, m);
                for (uint32_t j = 0; j < n + 64; j++)
                    CHECK(a[j] == cc[j], "mult width %u cols %u byte %u: neon %d, scalar %d", b, n,
                          j, cc[j], a[j]);
                *checked += n;
                free(src);
                free(m);
                free(a);
                free(bb);
                free(cc);
            }
    return 0;
}

static int public_path(void)
{
    CHECK(unpack_kernel_best() == UNPACK_KERNEL_NEON, "best kernel is %s, not neon",
          unpack_kernel_name(unpack_kernel_best()));
    const uint32_t enc[3] = {FORMAT_ENC_ADAPTIVE, FORMAT_ENC_INT4INT8, FORMAT_ENC_BITPLANE};
    for (int e = 0; e < 3; e++) {
        uint32_t rows = 24, cols = 688;
        int8_t *q = malloc((size_t)rows * cols), *out = malloc((size_t)rows * cols);
        uint8_t w[24];
        float sc[24], sc2[24];
        int32_t corr[24];
        for (uint32_t r = 0; r < rows; r++) {
            w[r] = (uint8_t)(1 + r % 8);
            sc[r] = 0.01f * (float)(r + 1);
            int m = (1 << (w[r] - 1)) - 1;
            for (uint32_t c = 0; c < cols; c++)
                q[(size_t)r * cols + c] =
                    (int8_t)(w[r] == 1 ? (next() & 1 ? 1 : -1) : (int)(next() % (2 * m + 1)) - m);
        }
        void *bytes;
        uint64_t len;
        struct sl_err err = {{0}};
        CHECK(quantizer_pack(enc[e], q, w, sc, rows, cols, &bytes, &len, &err) == 0, "pack: %s",
              err.msg);
        struct format_tensor_info t;
        memset(&t, 0, sizeof t);
        strcpy(t.name, "t");
        t.encoding = enc[e];
        t.n_dims = 2;
        t.shape[0] = rows;
        t.shape[1] = cols;
        t.length = len;
        CHECK(unpack_tensor_int8_corr(&t, bytes, out, sc2, corr, &err) == 0, "unpack: %s",
              err.msg);
        CHECK(memcmp(q, out, (size_t)rows * cols) == 0, "encoding %u: round trip differs", enc[e]);
        CHECK(memcmp(sc, sc2, sizeof sc) == 0, "scales differ");
        for (uint32_t r = 0; r < rows; r++) {
            int32_t s = 0;
            for (uint32_t c = 0; c < cols; c++)
                s += q[(size_t)r * cols + c];
            CHECK(corr[r] == 128 * s, "row %u correction %d, want %d", r, corr[r], 128 * s);
        }
        t.length = len - 1;
        CHECK(unpack_tensor_int8(&t, bytes, out, sc2, &err) == -EINVAL, "truncation accepted");
        free(bytes);
        free(q);
        free(out);
    }
    return 0;
}

int main(void)
{
    const char *env = getenv("SLUICE_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    state = seed;
    printf("random seed: SLUICE_TEST_SEED=%llu\n", (unsigned long long)seed);
    long checked = 0;
    long dotted = 0, multiplied = 0;
    if (rows_vs_scalar(&checked) || dot_vs_scalar(&dotted) || mult_vs_scalar(&multiplied) ||
        public_path())
        return 1;
    printf("neon unpackers bit-exact with scalar on %ld weights; round trips and corrections ok\n",
           checked);
    printf("neon dot kernel bit-exact with scalar on %ld weights\n", dotted);
    printf("neon block multiplier kernels bit-exact with scalar on %ld weights\n", multiplied);
    return 0;
}
