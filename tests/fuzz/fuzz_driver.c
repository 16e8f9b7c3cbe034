/* fuzz_driver.c: replays the reader fuzz target without libFuzzer, in ctest.
 * It writes a valid container with the format writer (the seed), then feeds
 * the target the seed and N deterministic mutations of it: bit flips, byte
 * stores at header and index fields, truncations, extensions, each with the
 * header/metadata/index checksums resealed half of the time so mutations reach
 * the deeper checks. Files named on the command line are replayed too (a
 * libFuzzer corpus or crash file).
 *   fuzz_driver [--mutations N] [FILE...]        seed: $SLUICE_TEST_SEED
 *   fuzz_driver --write-seed PATH                 writes the seed container (a
 *                                                 starting corpus for libFuzzer) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format.h"
#include "testutil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t *make_seed(size_t *len)
{
    struct format_config c = {.arch = FORMAT_ARCH_LLAMA, .dim = 8, .hidden_dim = 8,
                              .n_layers = 1, .n_heads = 2, .n_kv_heads = 2, .head_dim = 4,
                              .vocab_size = 4, .seq_len = 8, .tied_embedding = 1,
                              .bos_id = 1, .eos_id = 2, .rope_theta = 10000, .norm_eps = 1e-5f};
    const char *strs[4] = {"<unk>", "<s>", "</s>", "a"};
    uint32_t lens[4] = {5, 3, 4, 1};
    float scores[4] = {0, 0, 0, -1};
    struct format_tokenizer tok = {4, 5, scores, lens, strs};
    static float buf[8 * 8];
    for (int i = 0; i < 64; i++)
        buf[i] = (float)i * 0.01f;
    struct {
        const char *name;
        int layer;
        uint32_t role, rows, cols;
    } ts[] = {{"n0", 0, FORMAT_ROLE_ATTN_NORM, 8, 0}, {"q", 0, FORMAT_ROLE_WQ, 8, 8},
              {"k", 0, FORMAT_ROLE_WK, 8, 8},         {"v", 0, FORMAT_ROLE_WV, 8, 8},
              {"o", 0, FORMAT_ROLE_WO, 8, 8},         {"n1", 0, FORMAT_ROLE_FFN_NORM, 8, 0},
              {"g", 0, FORMAT_ROLE_W_GATE, 8, 8},     {"u", 0, FORMAT_ROLE_W_UP, 8, 8},
              {"d", 0, FORMAT_ROLE_W_DOWN, 8, 8},     {"on", -1, FORMAT_ROLE_OUT_NORM, 8, 0},
              {"e", -1, FORMAT_ROLE_TOK_EMBD, 4, 8}};
    const char *dir = test_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/seed.sluice", dir);
    struct sl_err err;
    struct format_writer *w;
    if (format_writer_create(path, &w, &err) || format_writer_set_config(w, &c, &err) ||
        format_writer_set_tokenizer(w, &tok, &err) ||
        format_writer_set_meta(w, "k", "v", 1, &err)) {
        fprintf(stderr, "seed: %s\n", err.msg);
        exit(1);
    }
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        struct format_tensor_desc d = {.name = ts[i].name, .layer = ts[i].layer,
                                       .role = ts[i].role, .encoding = FORMAT_ENC_F32,
                                       .n_dims = ts[i].cols ? 2 : 1,
                                       .shape = {ts[i].rows, ts[i].cols}};
        uint64_t n = (uint64_t)ts[i].rows * (ts[i].cols ? ts[i].cols : 1) * 4;
        if (format_writer_add_tensor(w, &d, buf, n, &err)) {
            fprintf(stderr, "seed: %s\n", err.msg);
            exit(1);
        }
    }
    if (format_writer_finish(w, &err)) {
        fprintf(stderr, "seed: %s\n", err.msg);
        exit(1);
    }
    format_writer_destroy(w);
    return test_read_file(path, len);
}

static void reseal(uint8_t *b, size_t len)
{
    if (len < 4096)
        return;
    uint64_t mo = sl_load_le64(b + 40), ml = sl_load_le64(b + 48);
    uint64_t io = sl_load_le64(b + 80), il = sl_load_le64(b + 88);
    if (mo < len && ml <= len - mo)
        sl_store_le64(b + 96, format_checksum(b + mo, ml));
    if (io < len && il <= len - io)
        sl_store_le64(b + 104, format_checksum(b + io, il));
    sl_store_le64(b + 4088, format_checksum(b, 4088));
}

int main(int argc, char **argv)
{
    long mutations = 3000;
    if (argc == 3 && !strcmp(argv[1], "--write-seed")) {
        size_t n;
        uint8_t *b = make_seed(&n);
        FILE *f = fopen(argv[2], "wb");
        int ok = f && fwrite(b, 1, n, f) == n;
        if (f)
            ok &= fclose(f) == 0;
        free(b);
        return ok ? 0 : 1;
    }
    if (test_fuzz_replay_files(argc, argv, LLVMFuzzerTestOneInput, &mutations) < 0)
        return 1;
    size_t len;
    uint8_t *seed = make_seed(&len);
    uint8_t *m = seed ? malloc(len + 8192) : NULL;
    if (!m) {
        fprintf(stderr, "fuzz_driver: cannot read the seed back or out of memory\n");
        free(seed);
        return 1;
    }
    LLVMFuzzerTestOneInput(seed, len);
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    /* interesting offsets: header fields, config, index entries */
    uint64_t io = sl_load_le64(seed + 80);
    for (long k = 0; k < mutations; k++) {
        memcpy(m, seed, len);
        size_t mlen = len;
        int kind = (int)test_rng_below(&rng, 5);
        size_t pos;
        switch (kind) {
        case 0: /* random bit flips anywhere */
            for (int j = 0, nflip = 1 + (int)test_rng_below(&rng, 4); j < nflip; j++) {
                pos = test_rng_below(&rng, (uint32_t)len);
                m[pos] ^= (uint8_t)(1u << test_rng_below(&rng, 8));
            }
            break;
        case 1: /* a random value stored into a header field */
            pos = 8 + 4 * test_rng_below(&rng, 46);
            sl_store_le32(m + pos, (uint32_t)test_rng_u64(&rng) >> test_rng_below(&rng, 32));
            break;
        case 2: /* a random value stored into the index */
            pos = io + 4 * test_rng_below(&rng, (uint32_t)((len - io) / 4));
            if (test_rng_below(&rng, 2))
                sl_store_le64(m + pos - pos % 8, test_rng_u64(&rng) >> test_rng_below(&rng, 64));
            else
                sl_store_le32(m + pos, (uint32_t)test_rng_below(&rng, 64));
            break;
        case 3: /* truncation */
            mlen = test_rng_below(&rng, (uint32_t)len);
            break;
        default: /* extension with garbage */
            mlen = len + 1 + test_rng_below(&rng, 8000);
            for (size_t j = len; j < mlen; j++)
                m[j] = (uint8_t)test_rng_u64(&rng);
            sl_store_le64(m + 16, mlen);
            break;
        }
        if (test_rng_below(&rng, 2))
            reseal(m, mlen);
        LLVMFuzzerTestOneInput(m, mlen);
    }
    printf("fuzz_driver: seed + %ld mutations replayed without a crash\n", mutations);
    free(m);
    free(seed);
    return 0;
}
