/* make_container_corpus.c: writes the container part of the committed corpus
 * (tests/fuzz/corpus/fuzz_format/): a tiny model in every encoding, and edits
 * of it that every reader must refuse, most with every checksum resealed so
 * that only the structural checks can catch them (issue 21, findings 3 and 4).
 * test_agree.sh checks that inspect, run and mount agree on each file.
 *   make_container_corpus OUTDIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>

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

/* The image with its metadata replaced by `meta` (stored uncompressed, or
 * with `raw` claimed for a zstd frame when comp), appended at the end;
 * header resealed. *len grows. */
static uint8_t *with_meta(const uint8_t *b, size_t *len, const uint8_t *meta, size_t mlen,
                          int comp, uint64_t raw)
{
    size_t off = sl_align_up(*len, 4096), n = off + sl_align_up(mlen, 4096);
    uint8_t *o = calloc(1, n);
    if (!o)
        exit(1);
    memcpy(o, b, *len);
    memcpy(o + off, meta, mlen);
    sl_store_le64(o + 16, n);
    sl_store_le64(o + 40, off);
    sl_store_le64(o + 48, mlen);
    sl_store_le64(o + 56, comp ? raw : mlen);
    sl_store_le32(o + 64, comp ? 1 : 0);
    sl_store_le64(o + 96, format_checksum(meta, mlen));
    sl_store_le64(o + 4088, format_checksum(o, 4088));
    *len = n;
    return o;
}

/* Metadata edits that ask for memory: a key count of 2^20 - 1 with no keys
 * behind it, and a zstd block claiming 1 GB. */
static int meta_edits(const uint8_t *b, size_t len)
{
    uint64_t mo = sl_load_le64(b + 40), ml = sl_load_le64(b + 48), raw = sl_load_le64(b + 56);
    uint8_t *m = malloc(raw + 4);
    if (!m || ZSTD_decompress(m, raw, b + mo, ml) != raw)
        return -1;
    /* the tokenizer: n, max_len, 4 more bytes, then (score, len, bytes) */
    uint32_t n = sl_load_le32(m);
    size_t p = 12;
    for (uint32_t i = 0; i < n; i++)
        p += 8 + sl_load_le32(m + p + 4);
    sl_store_le32(m + p, (1u << 20) - 1);
    size_t l1 = len;
    uint8_t *o = with_meta(b, &l1, m, p + 4, 0, 0);
    int bad = put("bad-meta-keys-1M", o, l1);
    free(o);
    size_t l2 = len;
    o = with_meta(b, &l2, b + mo, ml, 1, 1ull << 30);
    bad |= put("bad-meta-raw-1G", o, l2);
    free(o);
    free(m);
    return bad;
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
            bad |= meta_edits(b, len);
        }
        free(copy);
        free(b);
    }
    return bad ? 1 : 0;
}
