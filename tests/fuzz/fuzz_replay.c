/* fuzz_replay.c: replays a fuzz target without libFuzzer, in ctest (so that
 * the ASan+UBSan build runs it too): every file of the folders or files named
 * (the committed corpus, a libFuzzer corpus, a crash file), the target's
 * built-in seeds, and N deterministic mutations of all of them (bit flips, random 32- and 64-bit
 * stores, ASCII and JSON punctuation, deletions, insertions, truncations, extensions).
 *   <target>_replay [--mutations N] [PATH...]     seed: $SLUICE_TEST_SEED
 *   <target>_replay --write-seeds DIR             the built-in seeds as files
 *                                                 (a starting corpus) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fuzz_corpus.h"
#include "testutil.h"

struct inputs {
    uint8_t **data;
    size_t *len;
    size_t n, cap;
    const char *write_dir; /* --write-seeds */
    int failed;
};

static void add(void *ctx, const uint8_t *d, size_t n)
{
    struct inputs *in = ctx;
    if (in->write_dir) {
        char p[4096];
        snprintf(p, sizeof p, "%s/seed%03zu", in->write_dir, in->n++);
        FILE *f = fopen(p, "wb");
        int ok = f && fwrite(d, 1, n, f) == n;
        if (f)
            ok &= fclose(f) == 0;
        in->failed |= !ok;
        return;
    }
    if (in->n == in->cap) {
        size_t cap = in->cap ? 2 * in->cap : 16;
        uint8_t **nd = realloc(in->data, cap * sizeof *nd);
        if (nd)
            in->data = nd;
        size_t *nl = nd ? realloc(in->len, cap * sizeof *nl) : NULL;
        if (!nl) {
            in->failed = 1;
            return;
        }
        in->len = nl;
        in->cap = cap;
    }
    uint8_t *b = malloc(n ? n : 1);
    if (!b) {
        in->failed = 1;
        return;
    }
    memcpy(b, d, n);
    in->data[in->n] = b;
    in->len[in->n++] = n;
}

static size_t mutate(struct test_rng *rng, uint8_t *b, size_t len, size_t cap)
{
    size_t pos = len ? test_rng_below(rng, (uint32_t)len) : 0;
    switch (test_rng_below(rng, 8)) {
    case 0: /* bit flips */
        for (int j = 0, nf = 1 + (int)test_rng_below(rng, 4); len && j < nf; j++)
            b[test_rng_below(rng, (uint32_t)len)] ^= (uint8_t)(1u << test_rng_below(rng, 8));
        return len;
    case 1: /* a random little-endian 32-bit value, often small */
        if (pos + 4 <= len)
            sl_store_le32(b + pos, (uint32_t)test_rng_u64(rng) >> test_rng_below(rng, 32));
        return len;
    case 2: /* a random 64-bit value */
        if (pos + 8 <= len)
            sl_store_le64(b + pos, test_rng_u64(rng) >> test_rng_below(rng, 64));
        return len;
    case 3: /* an ASCII digit, JSON punctuation or option syntax */
        if (len)
            b[pos] = (uint8_t) "0123456789-.e[]{}\",: x=,"[test_rng_below(rng, 25)];
        return len;
    case 4: { /* bytes deleted */
        size_t nd = 1 + test_rng_below(rng, 16);
        if (pos + nd <= len) {
            memmove(b + pos, b + pos + nd, len - pos - nd);
            len -= nd;
        }
        return len;
    }
    case 5: { /* bytes inserted */
        size_t ni = 1 + test_rng_below(rng, 16);
        if (len + ni > cap)
            return len;
        memmove(b + pos + ni, b + pos, len - pos);
        for (size_t j = 0; j < ni; j++)
            b[pos + j] = (uint8_t)test_rng_u64(rng);
        return len + ni;
    }
    case 6: /* truncation */
        return pos;
    default: { /* extension with garbage (none when the buffer is full) */
        if (len >= cap)
            return len;
        size_t ne = 1 + test_rng_below(rng, (uint32_t)(cap - len));
        for (size_t j = 0; j < ne; j++)
            b[len + j] = (uint8_t)test_rng_u64(rng);
        return len + ne;
    }
    }
}

int main(int argc, char **argv)
{
    struct inputs in = {0};
    if (argc == 3 && !strcmp(argv[1], "--write-seeds")) {
        in.write_dir = argv[2];
        if (fuzz_target_seeds(add, &in) < 0 || in.failed) {
            fprintf(stderr, "%s: cannot write the seeds to %s\n", argv[0], argv[2]);
            return 1;
        }
        return 0;
    }
    long mutations = 1000;
    int first = 1;
    if (argc > 2 && !strcmp(argv[1], "--mutations")) {
        mutations = strtol(argv[2], NULL, 10);
        first = 3;
    }
    long replayed = 0;
    for (int i = first; i < argc; i++) {
        long k = fuzz_replay_path(argv[i], add, &in); /* kept as mutation bases too */
        if (k < 0)
            return 1;
        replayed += k;
    }
    size_t from_files = in.n;
    if (fuzz_target_seeds(add, &in) < 0 || in.failed) {
        fprintf(stderr, "%s: cannot make the built-in seeds\n", argv[0]);
        return 1;
    }
    for (size_t i = from_files; i < in.n; i++)
        LLVMFuzzerTestOneInput(in.data[i], in.len[i]);
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    size_t maxlen = 0;
    for (size_t i = 0; i < in.n; i++)
        maxlen = in.len[i] > maxlen ? in.len[i] : maxlen;
    size_t cap = maxlen + 8192;
    uint8_t *m = malloc(cap);
    if (!m)
        return 1;
    for (long k = 0; in.n && k < mutations; k++) {
        size_t s = test_rng_below(&rng, (uint32_t)in.n);
        memcpy(m, in.data[s], in.len[s]);
        size_t len = in.len[s];
        for (int j = 0, nm = 1 + (int)test_rng_below(&rng, 3); j < nm; j++)
            len = mutate(&rng, m, len, cap);
        LLVMFuzzerTestOneInput(m, len);
    }
    printf("%s: %ld corpus files, %zu built-in seeds and %ld mutations of them replayed "
           "without a crash\n",
           argv[0], replayed, in.n - from_files, in.n ? mutations : 0);
    free(m);
    for (size_t i = 0; i < in.n; i++)
        free(in.data[i]);
    free(in.data);
    free(in.len);
    return 0;
}
