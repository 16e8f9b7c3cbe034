/* neon_insns.c: the driver of scripts/neon-insns.sh (not part of the CMake
 * build: it is cross-compiled for aarch64 and run under qemu-user, which
 * counts the instructions executed inside the NEON unpack kernels).
 *
 *   neon_insns ENCODING WIDTH ROWS REPS
 *
 * Unpacks ROWS rows of 4096 weights of one width with the NEON kernel of
 * ENCODING (adaptive, bitplane or int4int8), REPS times over, from random
 * code bytes (any byte string is a valid row). The script runs it with two
 * REPS and takes the difference, so that only the kernels' steady state is
 * counted. Prints a checksum so the work cannot be optimized away. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unpack_internal.h"

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: neon_insns adaptive|bitplane|int4int8 WIDTH ROWS REPS\n");
        return 2;
    }
    const uint32_t cols = 4096;
    uint32_t b = (uint32_t)atoi(argv[2]), rows = (uint32_t)atoi(argv[3]);
    int reps = atoi(argv[4]);
    unpack_row_fn *fn;
    size_t row_bytes;
    if (!strcmp(argv[1], "adaptive")) {
        fn = unpack_kernels_neon.adaptive;
        row_bytes = (size_t)b * cols / 8;
    } else if (!strcmp(argv[1], "bitplane")) {
        fn = unpack_kernels_neon.bitplane;
        row_bytes = (size_t)b * cols / 8;
    } else if (!strcmp(argv[1], "int4int8")) {
        fn = unpack_kernels_neon.int4int8;
        row_bytes = b <= 4 ? cols / 2 : cols;
    } else {
        fprintf(stderr, "neon_insns: unknown encoding '%s'\n", argv[1]);
        return 2;
    }
    if (b < 1 || b > 8 || rows < 1 || reps < 1) {
        fprintf(stderr, "neon_insns: bad width, rows or reps\n");
        return 2;
    }
    uint8_t *src = malloc(row_bytes * rows);
    int8_t *dst = malloc(cols);
    if (!src || !dst)
        return 1;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < row_bytes * rows; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        src[i] = (uint8_t)x;
    }
    long sum = 0;
    for (int r = 0; r < reps; r++)
        for (uint32_t i = 0; i < rows; i++) {
            fn(src + row_bytes * i, cols, b, dst, 0);
            sum += dst[(i * 131) % cols];
        }
    printf("%ld\n", sum);
    free(src);
    free(dst);
    return 0;
}
