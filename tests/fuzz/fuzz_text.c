/* fuzz_text.c: libFuzzer target for text: prompts (`sluice run -p`) and
 * calibration and evaluation text (`--calib`, `--text`) through the BPE
 * tokenizer. The input, up to its first NUL, is encoded with a vocabulary of
 * byte-fallback tokens, single characters and merges; then:
 *   - every id is inside the vocabulary;
 *   - the pieces, bytes restored, spell exactly " " + text (no byte lost,
 *     changed or invented: the dummy-prefix space, then the text);
 *   - encode_stream (the calibration path) gives the same ids, as its
 *     header promises for a vocabulary whose pieces hold no inner spaces;
 *   - the -ENOSPC count equals the real count.
 * Replayed in ctest by fuzz_replay.c. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_corpus.h"
#include "infer.h"

static struct infer_tokenizer *tk;
static struct format_config cfg;
static char *strs[512];
static uint32_t lens[512];
static float scores[512];
static struct format_tokenizer vocab;

static void add_piece(const char *s, size_t len, float score)
{
    uint32_t i = vocab.n_tokens++;
    strs[i] = malloc(len + 1);
    memcpy(strs[i], s, len);
    strs[i][len] = 0;
    lens[i] = (uint32_t)len;
    scores[i] = score;
    if (len > vocab.max_token_len)
        vocab.max_token_len = (uint32_t)len;
}

static void setup(void)
{
    if (tk)
        return;
    static const char *const pieces[] = {
        " ", "e", "t", "a", "o", "n", " t", "th", " th", "he", " the", "in", "an", " a",
        "er", "re", "on", " o", "at", "en", "nd", " and", "é", "\xe2\x96\x81", "ee",
    };
    add_piece("<unk>", 5, 0);
    add_piece("<s>", 3, 0);
    add_piece("</s>", 4, 0);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        add_piece(s, 6, 0);
    }
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
        add_piece(pieces[i], strlen(pieces[i]), (float)(i % 7) - 3.0f * (float)(i % 3));
    vocab.scores = scores;
    vocab.lens = lens;
    vocab.tokens = (const char *const *)strs;
    cfg.vocab_size = vocab.n_tokens;
    cfg.bos_id = 1;
    cfg.eos_id = 2;
    struct sl_err err;
    if (infer_tokenizer_create(&vocab, &cfg, &tk, &err) < 0) {
        fprintf(stderr, "fuzz_text: %s\n", err.msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 14)
        return 0; /* long texts are many short pieces: no new paths, only slower runs */
    setup();
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    size_t tlen = strlen(text);
    uint32_t n = 0, need = 0;
    int ret = infer_tokenizer_encode(tk, text, 0, NULL, 0, &need);
    if (ret != 0 && ret != -ENOSPC)
        goto out; /* -ENOMEM */
    int *ids = malloc(sizeof(int) * (need + 1));
    if (!ids)
        goto out;
    if (infer_tokenizer_encode(tk, text, 0, ids, need + 1, &n) != 0 || n != need) {
        fprintf(stderr, "fuzz_text: counted %u tokens, encoded %u\n", need, n);
        abort();
    }
    /* the pieces spell " " + text */
    char *back = malloc(tlen + 2);
    size_t bl = 0;
    int ok = back != NULL;
    for (uint32_t i = 0; ok && i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= vocab.n_tokens) {
            fprintf(stderr, "fuzz_text: id %d outside the vocabulary\n", ids[i]);
            abort();
        }
        size_t pl;
        const char *p = infer_tokenizer_decode(tk, -1, ids[i], &pl);
        if (bl + pl > tlen + 1) {
            ok = 0;
            break;
        }
        memcpy(back + bl, p, pl);
        bl += pl;
    }
    if (!ok || (tlen ? bl != tlen + 1 || back[0] != ' ' || memcmp(back + 1, text, tlen)
                     : bl != 0)) {
        fprintf(stderr, "fuzz_text: the %u tokens do not spell the text (%zu bytes, %zu back)\n",
                n, tlen, bl);
        abort();
    }
    free(back);
    /* the calibration path agrees */
    int *sids = NULL;
    uint32_t sn = 0;
    if (infer_tokenizer_encode_stream(tk, text, tlen, &sids, &sn) == 0) {
        if (sn != n || (n && memcmp(sids, ids, n * sizeof(int)))) {
            fprintf(stderr, "fuzz_text: encode_stream gives %u tokens, encode %u\n", sn, n);
            abort();
        }
        free(sids);
    }
    free(ids);
out:
    free(text);
    return 0;
}

int fuzz_target_seeds(void (*add)(void *ctx, const uint8_t *data, size_t size), void *ctx)
{
    static const char *const seeds[] = {
        "the quick brown fox and the lazy dog",
        "In the beginning God created the heaven and the earth.",
        "  two  spaces\tand a tab\nand a newline",
        "caf\xc3\xa9 na\xc3\xafve \xe2\x96\x81 \xf0\x9f\x98\x80 \xff\xfe",
        "",
        " ",
        "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee",
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++)
        add(ctx, (const uint8_t *)seeds[i], strlen(seeds[i]));
    return 0;
}
