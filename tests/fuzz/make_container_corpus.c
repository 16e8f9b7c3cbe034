/* make_container_corpus.c: writes the container part of the committed corpus
 * (tests/fuzz/corpus/fuzz_format/): a tiny model in every encoding, and edits
 * of it that every reader must refuse, most with every checksum resealed so
 * that only the structural checks can catch them (issue 21, findings 3 and 4).
 * test_agree.sh checks that inspect, run and mount agree on each file.
 *   make_container_corpus OUTDIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "container_edit.h"
#include "testutil.h"

static const char *out_dir;

static int put(const char *name, const uint8_t *b, size_t n)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", out_dir, name);
    FILE *f = fopen(p, "wb");
    int ok = f && fwrite(b, 1, n, f) == n;
    if (f)
        ok &= fclose(f) == 0;
    if (!ok)
        fprintf(stderr, "make_container_corpus: cannot write %s\n", p);
    return ok ? 0 : -1;
}

static uint8_t *model(uint32_t enc, size_t *len)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/model.tmp", test_tmpdir());
    if (ce_write_model(p, enc) < 0)
        exit(1);
    uint8_t *b = test_read_file(p, len);
    if (!b)
        exit(1);
    remove(p);
    return b;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_container_corpus OUTDIR\n");
        return 2;
    }
    out_dir = argv[1];
    static const struct {
        uint32_t enc;
        const char *name;
    } encs[] = {{FORMAT_ENC_F32, "f32"},
                {FORMAT_ENC_Q8_CHANNEL, "q8"},
                {FORMAT_ENC_ADAPTIVE, "adaptive"},
                {FORMAT_ENC_INT4INT8, "int4int8"},
                {FORMAT_ENC_BITPLANE, "bitplane"}};
    int bad = 0;
    for (size_t i = 0; i < sizeof encs / sizeof encs[0]; i++) {
        size_t len;
        uint8_t *b = model(encs[i].enc, &len);
        char name[128];
        snprintf(name, sizeof name, "ok-%s", encs[i].name);
        bad |= put(name, b, len);
        long t = ce_find_tensor(b, len, "blk.0.attn_q.weight");
        if (t < 0)
            return 1;
        uint64_t tl;
        uint8_t *tb = ce_tensor_bytes(b, t, &tl);
        uint8_t *copy = malloc(len);
        /* resealed edits of the tensor's bytes */
        for (int k = 0; k < 3; k++) {
            memcpy(copy, b, len);
            tb = ce_tensor_bytes(copy, t, &tl);
            const char *what = NULL;
            if (encs[i].enc == FORMAT_ENC_Q8_CHANNEL) {
                uint64_t off = sl_align_up(32 * 4, 64);
                if (k == 0)
                    tb[off + 5] = 0x80, what = "code-128";
                else if (k == 1)
                    sl_store_lef32(tb + 4, 1.0f / 0.0f), what = "scale-inf";
            } else if (encs[i].enc >= FORMAT_ENC_ADAPTIVE) {
                if (k == 0)
                    tb[3] ^= 0x20, what = "magic"; /* finding 4 */
                else if (k == 1)
                    sl_store_le32(tb + 4, 2), what = "version";
                else
                    tb[FORMAT_PACKED_HEADER] ^= 0x07, what = "width";
            }
            if (!what)
                continue;
            ce_reseal(copy, t);
            snprintf(name, sizeof name, "bad-%s-%s-resealed", encs[i].name, what);
            bad |= put(name, copy, len);
        }
        if (encs[i].enc == FORMAT_ENC_ADAPTIVE) {
            /* finding 3: a NaN activation scale in the index, resealed */
            memcpy(copy, b, len);
            uint8_t *e = copy + sl_load_le64(copy + 80) + (uint64_t)t * 192;
            sl_store_lef32(e + 136, 0.0f / 0.0f);
            ce_reseal(copy, t);
            bad |= put("bad-act-scale-nan-resealed", copy, len);
            /* a flipped data byte (the checksum catches it) */
            memcpy(copy, b, len);
            tb = ce_tensor_bytes(copy, t, &tl);
            tb[tl - 1] ^= 1;
            bad |= put("bad-data-flip", copy, len);
            /* truncated, and a flipped header byte */
            bad |= put("bad-truncated", b, len - 4096);
            memcpy(copy, b, len);
            copy[20] ^= 4;
            bad |= put("bad-header-flip", copy, len);
        }
        free(copy);
        free(b);
    }
    return bad ? 1 : 0;
}
