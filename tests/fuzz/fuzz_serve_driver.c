/* fuzz_serve_driver.c: replays the request parser's fuzz target without
 * libFuzzer, in ctest: seed bodies (valid and invalid requests of both
 * endpoints) and N deterministic mutations of each (bit flips, byte stores
 * of JSON's structural characters, truncations, splices of two seeds).
 *   fuzz_serve_driver [--mutations N]          seed: $SLUICE_TEST_SEED
 *   fuzz_serve_driver --write-seeds DIR         writes the seed bodies, one file
 *                                               each (a libFuzzer starting corpus) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const seeds[] = {
    "{\"model\":\"m\",\"prompt\":\"In the beginning\",\"max_tokens\":16,\"temperature\":0}",
    "{\"prompt\":[\"x\"],\"stop\":[\"\\n\",\"Amen\"],\"stream\":true,\"stream_options\":"
    "{\"include_usage\":true},\"seed\":-3,\"top_p\":0.5,\"n\":1}",
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
    "\"content\":[{\"type\":\"text\",\"text\":\"Hi \\u00e9\"}]},{\"role\":\"assistant\","
    "\"content\":null}],\"max_completion_tokens\":3,\"stop\":\"END\"}",
    "{\"prompt\":\"a\",\"max_tokens\":1e308,\"temperature\":-0.0}",
    "[1, {\"a\": [true, false, null]}]",
    "",
};

static int write_seeds(const char *dir)
{
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/seed%zu.json", dir, s);
        FILE *f = fopen(path, "wb");
        size_t len = strlen(seeds[s]);
        if (!f || fwrite(seeds[s], 1, len, f) != len || fclose(f) != 0) {
            fprintf(stderr, "fuzz_serve_driver: cannot write %s\n", path);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    uint32_t mutations = 2000;
    if (argc == 3 && !strcmp(argv[1], "--write-seeds"))
        return write_seeds(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "--mutations"))
        mutations = (uint32_t)atoi(argv[2]);
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    static const char special[] = "{}[]\":,\\0-.eE \x80\xff";
    size_t n_seeds = sizeof seeds / sizeof seeds[0];
    uint8_t buf[1024];
    for (size_t s = 0; s < n_seeds; s++) {
        LLVMFuzzerTestOneInput((const uint8_t *)seeds[s], strlen(seeds[s]));
        for (uint32_t m = 0; m < mutations; m++) {
            size_t len = strlen(seeds[s]);
            memcpy(buf, seeds[s], len);
            uint32_t edits = 1 + test_rng_below(&rng, 4);
            for (uint32_t k = 0; k < edits && len; k++) {
                size_t at = test_rng_below(&rng, (uint32_t)len);
                switch (test_rng_below(&rng, 4)) {
                case 0:
                    buf[at] ^= (uint8_t)(1u << test_rng_below(&rng, 8));
                    break;
                case 1:
                    buf[at] = (uint8_t)special[test_rng_below(&rng, sizeof special - 1)];
                    break;
                case 2:
                    len = at;
                    break;
                default: { /* splice another seed's tail */
                    const char *o = seeds[test_rng_below(&rng, (uint32_t)n_seeds)];
                    size_t ol = strlen(o), from = ol ? test_rng_below(&rng, (uint32_t)ol) : 0;
                    size_t add = ol - from;
                    if (at + add > sizeof buf)
                        add = sizeof buf - at;
                    memcpy(buf + at, o + from, add);
                    len = at + add;
                }
                }
            }
            LLVMFuzzerTestOneInput(buf, len);
        }
    }
    printf("replayed %zu seeds x %u mutations\n", n_seeds, mutations);
    return 0;
}
