/* fuzz_unpack.c: differential fuzz target for packed tensors (STYLE.md 19).
 *
 * Input: byte 0 picks the encoding (adaptive, int4int8, bitplane), bytes 1-2
 * the rows (1..64) and 3-4 the cols (1..2048), little-endian; the rest is the
 * tensor's bytes. Parsing must fail with a message or succeed; when it
 * succeeds every kernel available here, with cached and streaming stores and
 * with the correction, must give exactly the scalar kernel's codes, all in
 * [-127, 127], and unpack_tensor_int8 must agree. Any difference aborts.
 *
 * Built as a libFuzzer binary with -DSLUICE_FUZZ=ON (clang). Without
 * SLUICE_LIBFUZZER, main() replays it in ctest: seeds from the packer (every
 * encoding, random widths and shapes) and deterministic mutations of them
 * (bit flips, byte and word stores in the prefix and the codes, truncations,
 * extensions), plus any files named on the command line (a corpus or crash).
 *   fuzz_unpack_replay [--mutations N] [FILE...]      seed: $SLUICE_TEST_SEED
 *   fuzz_unpack_replay --write-seeds DIR              64 packer seeds (a starting
 *                                                     corpus for libFuzzer) */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unpack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint32_t fuzz_encs[3] = {FORMAT_ENC_ADAPTIVE, FORMAT_ENC_INT4INT8,
                                      FORMAT_ENC_BITPLANE};

static long parsed; /* inputs that passed validation (replay statistics) */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 5)
        return 0;
    uint32_t enc = fuzz_encs[data[0] % 3];
    uint32_t rows = 1 + sl_load_le16(data + 1) % 64, cols = 1 + sl_load_le16(data + 3) % 2048;
    const uint8_t *t = data + 5;
    size_t len = size - 5;
    struct unpack_tensor u;
    struct sl_err err = {{0}};
    int ret = unpack_tensor_init(&u, enc, t, len, rows, cols, &err);
    if (ret < 0) {
        if (ret != -EINVAL || !err.msg[0])
            abort();
        return 0;
    }
    parsed++;
    size_t n = (size_t)rows * cols;
    int8_t *ref = malloc(n), *got = sl_alloc_aligned(n, 64), *whole = malloc(n);
    int32_t *cref = malloc(sizeof(int32_t) * rows), *cgot = malloc(sizeof(int32_t) * rows);
    float *sc = malloc(sizeof(float) * rows);
    if (!ref || !got || !whole || !cref || !cgot || !sc)
        abort();
    if (unpack_tensor_rows(&u, UNPACK_KERNEL_SCALAR, 0, rows, ref, cref) < 0)
        abort();
    for (size_t i = 0; i < n; i++)
        if (ref[i] == -128)
            abort();
    for (int k = 0; k < UNPACK_KERNEL_COUNT; k++) {
        if (!unpack_kernel_available((enum unpack_kernel)k))
            continue;
        for (int store = UNPACK_STORE_AUTO; store <= UNPACK_STORE_STREAM; store++) {
            memset(got, 0x5a, n);
            if (unpack_tensor_rows_store(&u, (enum unpack_kernel)k, 0, rows, got, NULL,
                                         (enum unpack_store)store) < 0 ||
                memcmp(got, ref, n) != 0)
                abort();
        }
        if (unpack_tensor_rows(&u, (enum unpack_kernel)k, 0, rows, got, cgot) < 0 ||
            memcmp(got, ref, n) != 0 || memcmp(cgot, cref, sizeof(int32_t) * rows) != 0)
            abort();
    }
    struct format_tensor_info ti;
    memset(&ti, 0, sizeof ti);
    strcpy(ti.name, "fuzz");
    ti.encoding = enc;
    ti.n_dims = 2;
    ti.shape[0] = rows;
    ti.shape[1] = cols;
    ti.length = len;
    if (unpack_tensor_int8(&ti, t, whole, sc, &err) < 0 || memcmp(whole, ref, n) != 0)
        abort();
    unpack_tensor_fini(&u);
    free(ref);
    sl_free_aligned(got);
    free(whole);
    free(cref);
    free(cgot);
    free(sc);
    return 0;
}

#ifndef SLUICE_LIBFUZZER
#include "quantizer.h"
#include "testutil.h"

/* A fuzz input: the 5-byte shape prefix and a packed tensor from the packer. */
static uint8_t *make_seed(struct test_rng *rng, size_t *size)
{
    int e = (int)test_rng_below(rng, 3);
    uint32_t rows = 1 + test_rng_below(rng, 8);
    uint32_t cols = test_rng_below(rng, 2) ? 1 + test_rng_below(rng, 700)
                                           : 512 * (1 + test_rng_below(rng, 2));
    uint8_t w[8];
    float sc[8];
    int8_t *q = malloc((size_t)rows * cols);
    for (uint32_t r = 0; r < rows; r++) {
        w[r] = (uint8_t)(1 + test_rng_below(rng, 8));
        sc[r] = 0.5f;
        int m = (1 << (w[r] - 1)) - 1;
        for (uint32_t c = 0; c < cols; c++)
            q[(size_t)r * cols + c] =
                (int8_t)(w[r] == 1 ? (test_rng_below(rng, 2) ? 1 : -1)
                                   : (int)test_rng_below(rng, (uint32_t)(2 * m + 1)) - m);
    }
    void *bytes;
    uint64_t len;
    struct sl_err err = {{0}};
    if (quantizer_pack(fuzz_encs[e], q, w, sc, rows, cols, &bytes, &len, &err) < 0) {
        fprintf(stderr, "fuzz_unpack: pack: %s\n", err.msg);
        exit(1);
    }
    uint8_t *in = malloc(5 + len);
    in[0] = (uint8_t)e;
    in[1] = (uint8_t)(rows - 1);
    in[2] = 0;
    in[3] = (uint8_t)((cols - 1) & 0xff);
    in[4] = (uint8_t)((cols - 1) >> 8);
    memcpy(in + 5, bytes, len);
    free(bytes);
    free(q);
    *size = 5 + len;
    return in;
}

/* One deterministic mutation of in (size may change); returns the new buffer. */
static uint8_t *mutate(struct test_rng *rng, uint8_t *in, size_t *size)
{
    size_t prefix = *size < 5 + 192 ? *size : 5 + 192; /* shape, header, widths, scales */
    switch (test_rng_below(rng, 6)) {
    case 0: /* bit flip anywhere */
        in[test_rng_below(rng, (uint32_t)*size)] ^= (uint8_t)(1u << test_rng_below(rng, 8));
        break;
    case 1: /* bit flips in the prefix */
        for (int i = 0; i < 3; i++)
            in[test_rng_below(rng, (uint32_t)prefix)] ^= (uint8_t)(1u << test_rng_below(rng, 8));
        break;
    case 2: /* a random 32-bit word at a header field */
        if (*size >= 5 + 32)
            sl_store_le32(in + 5 + 4 * test_rng_below(rng, 8), (uint32_t)test_rng_u64(rng));
        break;
    case 3: /* truncation */
        *size = test_rng_below(rng, (uint32_t)*size + 1);
        break;
    case 4: { /* extension */
        size_t add = 1 + test_rng_below(rng, 64);
        in = realloc(in, *size + add);
        for (size_t i = 0; i < add; i++)
            in[*size + i] = (uint8_t)test_rng_u64(rng);
        *size += add;
        break;
    }
    default: /* random code bytes (always decodable) */
        for (int i = 0; i < 16 && *size > prefix; i++)
            in[prefix + test_rng_below(rng, (uint32_t)(*size - prefix))] =
                (uint8_t)test_rng_u64(rng);
        break;
    }
    return in;
}

int main(int argc, char **argv)
{
    long mutations = 2000;
    int files = 0;
    if (argc == 3 && !strcmp(argv[1], "--write-seeds")) {
        struct test_rng rng;
        test_rng_init(&rng, 1);
        for (int i = 0; i < 64; i++) {
            size_t size;
            uint8_t *in = make_seed(&rng, &size);
            char path[4096];
            snprintf(path, sizeof path, "%s/seed-%02d", argv[2], i);
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(in, 1, size, f) != size || fclose(f) != 0) {
                fprintf(stderr, "fuzz_unpack: cannot write %s\n", path);
                return 1;
            }
            free(in);
        }
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mutations") && i + 1 < argc) {
            mutations = strtol(argv[++i], NULL, 10);
            continue;
        }
        size_t len;
        uint8_t *d = test_read_file(argv[i], &len);
        if (!d) {
            fprintf(stderr, "fuzz_unpack: cannot read %s\n", argv[i]);
            return 1;
        }
        LLVMFuzzerTestOneInput(d, len);
        free(d);
        files++;
    }
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    long accepted = 0;
    for (long m = 0; m < mutations; m++) {
        size_t size;
        uint8_t *in = make_seed(&rng, &size);
        if (m % 4 == 0) {
            LLVMFuzzerTestOneInput(in, size); /* the seed itself */
            accepted++;
        }
        int rounds = 1 + (int)test_rng_below(&rng, 3);
        for (int r = 0; r < rounds; r++)
            in = mutate(&rng, in, &size);
        LLVMFuzzerTestOneInput(in, size);
        free(in);
    }
    printf("fuzz_unpack: %d files, %ld mutated inputs and %ld seeds replayed (%ld passed "
           "validation and were unpacked by every kernel): no difference, no crash\n",
           files, mutations, accepted, parsed);
    return 0;
}
#endif
