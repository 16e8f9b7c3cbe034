/* test_unpack_neon.c: NEON unpackers against the scalar specification, bit
 * for bit, on random code bytes for every encoding, width and many row
 * lengths. Self-contained (no cmocka: it is cross-compiled for aarch64 and
 * run under qemu-user by scripts/test-neon.sh). Exit 0 pass, 1 mismatch. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "unpack_internal.h"

static uint64_t state;

static uint64_t next(void)
{
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int main(void)
{
    const char *env = getenv("SLUICE_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    state = seed;
    printf("random seed: SLUICE_TEST_SEED=%llu\n", (unsigned long long)seed);
    static const uint32_t cols[] = {1, 7, 8, 15, 16, 31, 33, 64, 100, 172, 511, 512, 513, 688, 1024, 1500};
    const struct unpack_kernels *ks = &unpack_kernels_scalar, *kn = &unpack_kernels_neon;
    const char *names[3] = {"adaptive", "int4int8", "bitplane"};
    unpack_row_fn *ref[3] = {ks->adaptive, ks->int4int8, ks->bitplane};
    unpack_row_fn *neon[3] = {kn->adaptive, kn->int4int8, kn->bitplane};
    uint32_t enc[3] = {FORMAT_ENC_ADAPTIVE, FORMAT_ENC_INT4INT8, FORMAT_ENC_BITPLANE};
    long checked = 0;
    for (int e = 0; e < 3; e++)
        for (uint32_t b = 1; b <= 8; b++)
            for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
                for (int rep = 0; rep < 3; rep++) {
                    uint32_t n = cols[c];
                    uint64_t len = format_packed_row_bytes(enc[e], b, n);
                    uint8_t *src = malloc(len + 16);
                    for (uint64_t i = 0; i < len; i++)
                        src[i] = (uint8_t)next();
                    int8_t *a = malloc(n), *bb = malloc(n);
                    memset(a, 0x11, n);
                    memset(bb, 0x22, n);
                    ref[e](src, n, b, a);
                    neon[e](src, n, b, bb);
                    for (uint32_t j = 0; j < n; j++) {
                        if (a[j] != bb[j]) {
                            printf("FAIL %s width %u cols %u weight %u: neon %d, scalar %d\n",
                                   names[e], b, n, j, bb[j], a[j]);
                            return 1;
                        }
                    }
                    checked += n;
                    free(src);
                    free(a);
                    free(bb);
                }
    printf("neon unpackers bit-exact with scalar on %ld weights\n", checked);
    return 0;
}
