/* fuzz_import_driver.c: replays the importer fuzz target without libFuzzer,
 * in ctest: for each input kind, the valid reference file and N
 * deterministic mutations of it (bit flips and random values stored mostly
 * into the header/metadata region, where the parsers' decisions are, byte
 * insertions and deletions, truncations, extensions). Files named on the
 * command line are replayed too (a libFuzzer corpus or crash file).
 *   fuzz_import_driver [--mutations N] [FILE...]   seed: $SLUICE_TEST_SEED
 *   fuzz_import_driver --write-seeds DIR           a starting corpus */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fuzz_import.h"
#include "gen_models.h"
#include "testutil.h"

/* The region worth mutating most: GGUF metadata and tensor infos, the
 * llama2.c header, the safetensors JSON header; the whole of the rest. */
static size_t hot_len(int kind, const uint8_t *b, size_t len)
{
    size_t h = len;
    if (kind == 0) {
        const uint8_t *p = memmem(b, len, "blk.1.ffn_down.weight", 21);
        h = p ? (size_t)(p - b) + 64 : len;
    } else if (kind == 1) {
        h = 28;
    } else if (kind == 3 && len >= 8) {
        h = 8 + (size_t)sl_load_le64(b);
    }
    return h < len ? h : len;
}

int main(int argc, char **argv)
{
    long mutations = 3000;
    if (fuzz_import_setup() < 0) {
        fprintf(stderr, "fuzz_import_driver: cannot create the reference model\n");
        return 1;
    }
    if (argc == 3 && !strcmp(argv[1], "--write-seeds")) {
        for (int k = 0; k < FUZZ_IMPORT_KINDS; k++) {
            size_t n;
            uint8_t *b = test_read_file(fuzz_import_seed_path(k), &n);
            char p[4096];
            snprintf(p, sizeof p, "%s/seed%d", argv[2], k);
            uint8_t *in = malloc(n + 1);
            if (!b || !in)
                return 1;
            in[0] = (uint8_t)k;
            memcpy(in + 1, b, n);
            if (gen_write_file(p, in, n + 1))
                return 1;
            free(in);
            free(b);
        }
        return 0;
    }
    if (test_fuzz_replay_files(argc, argv, LLVMFuzzerTestOneInput, &mutations) < 0)
        return 1;
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    for (int kind = 0; kind < FUZZ_IMPORT_KINDS; kind++) {
        size_t len;
        uint8_t *seed = test_read_file(fuzz_import_seed_path(kind), &len);
        if (!seed || len < 8)
            return 1;
        size_t cap = len + 1 + 9000;
        uint8_t *m = malloc(cap);
        if (!m) {
            free(seed);
            return 1;
        }
        m[0] = (uint8_t)kind;
        memcpy(m + 1, seed, len);
        LLVMFuzzerTestOneInput(m, len + 1);
        size_t hot = hot_len(kind, seed, len);
        for (long k = 0; k < mutations / FUZZ_IMPORT_KINDS; k++) {
            uint8_t *b = m + 1;
            memcpy(b, seed, len);
            size_t blen = len;
            /* positions: 7 in 8 in the hot region */
            uint32_t span = (uint32_t)(test_rng_below(&rng, 8) ? hot : len);
            int op = (int)test_rng_below(&rng, 7);
            size_t pos = test_rng_below(&rng, span);
            switch (op) {
            case 0: /* bit flips */
                for (int j = 0, nf = 1 + (int)test_rng_below(&rng, 4); j < nf; j++) {
                    pos = test_rng_below(&rng, span);
                    b[pos] ^= (uint8_t)(1u << test_rng_below(&rng, 8));
                }
                break;
            case 1: /* a random little-endian 32-bit value, often small */
                if (pos + 4 <= blen)
                    sl_store_le32(b + pos,
                                  (uint32_t)test_rng_u64(&rng) >> test_rng_below(&rng, 32));
                break;
            case 2: /* a random 64-bit value */
                if (pos + 8 <= blen)
                    sl_store_le64(b + pos, test_rng_u64(&rng) >> test_rng_below(&rng, 64));
                break;
            case 3: /* an ASCII digit or JSON punctuation changed */
                b[pos] = (uint8_t) "0123456789-.e[]{}\",: x"[test_rng_below(&rng, 23)];
                break;
            case 4: /* bytes deleted */
            {
                size_t nd = 1 + test_rng_below(&rng, 16);
                if (pos + nd <= blen) {
                    memmove(b + pos, b + pos + nd, blen - pos - nd);
                    blen -= nd;
                }
                break;
            }
            case 5: /* bytes inserted */
            {
                size_t ni = 1 + test_rng_below(&rng, 16);
                memmove(b + pos + ni, b + pos, blen - pos);
                for (size_t j = 0; j < ni; j++)
                    b[pos + j] = (uint8_t)test_rng_u64(&rng);
                blen += ni;
                break;
            }
            default: /* truncation or extension */
                if (test_rng_below(&rng, 2)) {
                    blen = test_rng_below(&rng, (uint32_t)len);
                } else {
                    size_t ne = 1 + test_rng_below(&rng, 8000);
                    for (size_t j = 0; j < ne; j++)
                        b[blen + j] = (uint8_t)test_rng_u64(&rng);
                    blen += ne;
                }
                break;
            }
            LLVMFuzzerTestOneInput(m, blen + 1);
        }
        free(m);
        free(seed);
    }
    printf("fuzz_import_driver: %d references + %ld mutations replayed without a crash\n",
           FUZZ_IMPORT_KINDS, mutations / FUZZ_IMPORT_KINDS * FUZZ_IMPORT_KINDS);
    return 0;
}
