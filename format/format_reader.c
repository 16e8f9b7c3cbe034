/* format_reader.c: opens and validates a container (docs/FORMAT.md). Every
 * offset and length read from the file is bounds-checked with overflow-safe
 * arithmetic before use; every failure names the file and the problem. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#include "format_reader_internal.h"

/* Fuzzing builds skip the checksum comparisons of the header, metadata and
 * index so that mutations reach the structural checks behind them (the
 * convention libFuzzer projects share); data checksums stay enforced. */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define FMT_ENFORCE_META_SUMS 0
#else
#define FMT_ENFORCE_META_SUMS 1
#endif

int fmt_pread_all(int fd, void *buf, uint64_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len > 0) {
        size_t n = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (k == 0)
            return -ENODATA; /* end of file: the file is shorter than it claims */
        p += k;
        off += (uint64_t)k;
        len -= (uint64_t)k;
    }
    return 0;
}

/* [off, off+len) inside [lo, hi)? */
static int range_ok(uint64_t off, uint64_t len, uint64_t lo, uint64_t hi)
{
    uint64_t end;
    if (sl_add_u64(off, len, &end))
        return 0;
    return off >= lo && end <= hi;
}

static int parse_tokenizer_and_kv(struct format_reader *r, struct sl_err *err)
{
    const uint8_t *p = r->meta, *end = r->meta + r->meta_len;
#define NEED_BYTES(n, what)                                                                  \
    do {                                                                                     \
        if ((uint64_t)(end - p) < (uint64_t)(n)) {                                           \
            sl_err_set(err, "%s: metadata is truncated in %s", r->path, what);               \
            return -EINVAL;                                                                  \
        }                                                                                    \
    } while (0)
    NEED_BYTES(12, "the tokenizer header");
    uint32_t n = sl_load_le32(p), maxlen = sl_load_le32(p + 4);
    p += 12;
    if (n != r->cfg.vocab_size) {
        sl_err_set(err, "%s: tokenizer has %u tokens, the config's vocab_size is %u", r->path, n,
                   r->cfg.vocab_size);
        return -EINVAL;
    }
    if (n > (uint64_t)(end - p) / 8) { /* a score and a length each: 8 bytes at least */
        sl_err_set(err, "%s: metadata is truncated: too short for %u tokens", r->path, n);
        return -EINVAL;
    }
    r->tok_scores = sl_malloc(sizeof(float) * n);
    r->tok_lens = sl_malloc(sizeof(uint32_t) * n);
    r->tok_strs = sl_malloc(sizeof(char *) * n);
    if (!r->tok_scores || !r->tok_lens || !r->tok_strs) {
        sl_err_set(err, "%s: out of memory reading the tokenizer", r->path);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
        NEED_BYTES(8, "a token");
        r->tok_scores[i] = sl_load_lef32(p);
        uint32_t len = sl_load_le32(p + 4);
        p += 8;
        NEED_BYTES(len, "a token's bytes");
        if (len > maxlen) {
            sl_err_set(err, "%s: token %u is %u bytes, longer than the declared maximum %u",
                       r->path, i, len, maxlen);
            return -EINVAL;
        }
        r->tok_lens[i] = len;
        r->tok_strs[i] = (const char *)p;
        p += len;
    }
    r->tok.n_tokens = n;
    r->tok.max_token_len = maxlen;
    r->tok.scores = r->tok_scores;
    r->tok.lens = r->tok_lens;
    r->tok.tokens = r->tok_strs;

    NEED_BYTES(4, "the key-value count");
    uint32_t nkv = sl_load_le32(p);
    p += 4;
    /* a key-value pair is 11 bytes at least: the counts cannot ask for more
     * memory than the metadata's size warrants */
    if (nkv > (1u << 20) || nkv > (uint64_t)(end - p) / 11) {
        sl_err_set(err, "%s: %u metadata keys do not fit in the metadata", r->path, nkv);
        return -EINVAL;
    }
    r->kv = sl_calloc(nkv ? nkv : 1, sizeof *r->kv);
    r->keybuf = sl_malloc((size_t)(end - p) + nkv + 1); /* the keys and their NULs */
    if (!r->kv || !r->keybuf) {
        sl_err_set(err, "%s: out of memory reading metadata", r->path);
        return -ENOMEM;
    }
    char *kb = r->keybuf;
    for (uint32_t i = 0; i < nkv; i++) {
        NEED_BYTES(2, "a key");
        uint16_t kl = sl_load_le16(p);
        p += 2;
        if (kl == 0 || kl > FMT_MAX_KEY) {
            sl_err_set(err, "%s: metadata key %u has length %u", r->path, i, kl);
            return -EINVAL;
        }
        NEED_BYTES(kl, "a key");
        memcpy(kb, p, kl);
        kb[kl] = 0;
        p += kl;
        NEED_BYTES(8, "a value length");
        uint64_t vl = sl_load_le64(p);
        p += 8;
        NEED_BYTES(vl, "a value");
        r->kv[i].key = kb;
        r->kv[i].val = p;
        r->kv[i].len = (size_t)vl;
        kb += kl + 1;
        p += vl;
    }
    r->n_kv = nkv;
    if (p != end) {
        sl_err_set(err, "%s: %zu stray bytes after the metadata", r->path, (size_t)(end - p));
        return -EINVAL;
    }
#undef NEED_BYTES
    return 0;
}

static int load_meta(struct format_reader *r, const uint8_t *hdr, struct sl_err *err)
{
    uint64_t off = sl_load_le64(hdr + FMT_H_META_OFFSET);
    uint64_t len = sl_load_le64(hdr + FMT_H_META_LENGTH);
    uint64_t raw = sl_load_le64(hdr + FMT_H_META_RAW);
    uint32_t comp = sl_load_le32(hdr + FMT_H_META_COMP);
    if (!range_ok(off, len, FMT_HEADER_SIZE, r->size) || len == 0) {
        sl_err_set(err, "%s: metadata range [%" PRIu64 ", +%" PRIu64 ") is outside the file (%"
                        PRIu64 " bytes)", r->path, off, len, r->size);
        return -EINVAL;
    }
    /* a compressed size more than 1024 times the stored one is no tokenizer
     * and key-value list but a decompression bomb: memory stays bounded by the
     * file's size */
    if (raw > FMT_MAX_META_RAW || (comp == FMT_META_NONE && raw != len) ||
        raw / 1024 > len + 1024) {
        sl_err_set(err, "%s: implausible metadata size %" PRIu64, r->path, raw);
        return -EINVAL;
    }
    if (comp != FMT_META_NONE && comp != FMT_META_ZSTD) {
        sl_err_set(err, "%s: unknown metadata compression %u", r->path, comp);
        return -EINVAL;
    }
    uint8_t *stored = sl_malloc(len);
    if (!stored) {
        sl_err_set(err, "%s: out of memory reading metadata", r->path);
        return -ENOMEM;
    }
    int ret = fmt_pread_all(r->fd, stored, len, off);
    if (ret < 0) {
        sl_err_set(err, "%s: cannot read metadata: %s", r->path,
                   ret == -ENODATA ? "file is truncated" : strerror(-ret));
        free(stored);
        return ret == -ENODATA ? -EINVAL : ret;
    }
    uint64_t sum = format_checksum(stored, len);
    if (FMT_ENFORCE_META_SUMS && sum != sl_load_le64(hdr + FMT_H_META_SUM)) {
        sl_err_set(err, "%s: metadata checksum mismatch (stored %016" PRIx64 ", computed %016"
                        PRIx64 ")", r->path, sl_load_le64(hdr + FMT_H_META_SUM), sum);
        free(stored);
        return -EINVAL;
    }
    if (comp == FMT_META_NONE) {
        r->meta = stored;
    } else {
        r->meta = sl_malloc(raw ? raw : 1);
        if (!r->meta) {
            free(stored);
            sl_err_set(err, "%s: out of memory reading metadata", r->path);
            return -ENOMEM;
        }
        size_t got = ZSTD_decompress(r->meta, raw, stored, len);
        free(stored);
        if (ZSTD_isError(got) || got != raw) {
            sl_err_set(err, "%s: metadata does not decompress to its declared %" PRIu64 " bytes%s%s",
                       r->path, raw, ZSTD_isError(got) ? ": " : "",
                       ZSTD_isError(got) ? ZSTD_getErrorName(got) : "");
            return -EINVAL;
        }
    }
    r->meta_len = raw;
    return parse_tokenizer_and_kv(r, err);
}

static int load_index(struct format_reader *r, const uint8_t *hdr, uint64_t data_end,
                      struct sl_err *err)
{
    uint64_t off = sl_load_le64(hdr + FMT_H_INDEX_OFFSET);
    uint64_t len = sl_load_le64(hdr + FMT_H_INDEX_LENGTH);
    uint32_t nt = sl_load_le32(hdr + FMT_H_N_TENSORS);
    uint32_t ns = sl_load_le32(hdr + FMT_H_N_SLICES);
    if (nt == 0 || nt > FMT_MAX_TENSORS || ns == 0 || ns > FMT_MAX_SLICES) {
        sl_err_set(err, "%s: implausible index: %u tensors, %u slices", r->path, nt, ns);
        return -EINVAL;
    }
    if (len != (uint64_t)nt * FMT_T_SIZE + (uint64_t)ns * FMT_S_SIZE ||
        !range_ok(off, len, data_end, r->size)) {
        sl_err_set(err, "%s: index range [%" PRIu64 ", +%" PRIu64 ") is inconsistent with %u "
                        "tensors and %u slices in a %" PRIu64 "-byte file",
                   r->path, off, len, nt, ns, r->size);
        return -EINVAL;
    }
    uint8_t *buf = sl_malloc(len);
    if (!buf) {
        sl_err_set(err, "%s: out of memory reading the index", r->path);
        return -ENOMEM;
    }
    int ret = fmt_pread_all(r->fd, buf, len, off);
    if (ret < 0) {
        sl_err_set(err, "%s: cannot read the index: %s", r->path,
                   ret == -ENODATA ? "file is truncated" : strerror(-ret));
        free(buf);
        return ret == -ENODATA ? -EINVAL : ret;
    }
    uint64_t sum = format_checksum(buf, len);
    if (FMT_ENFORCE_META_SUMS && sum != sl_load_le64(hdr + FMT_H_INDEX_SUM)) {
        sl_err_set(err, "%s: index checksum mismatch (stored %016" PRIx64 ", computed %016" PRIx64
                        ")", r->path, sl_load_le64(hdr + FMT_H_INDEX_SUM), sum);
        free(buf);
        return -EINVAL;
    }
    r->tensors = sl_calloc(nt, sizeof *r->tensors);
    r->slices = sl_calloc(ns, sizeof *r->slices);
    if (!r->tensors || !r->slices) {
        free(buf);
        sl_err_set(err, "%s: out of memory reading the index", r->path);
        return -ENOMEM;
    }
    const uint8_t *p = buf;
    for (uint32_t i = 0; i < nt; i++, p += FMT_T_SIZE) {
        struct format_tensor_info *t = &r->tensors[i];
        if (memchr(p + FMT_T_NAME, 0, FORMAT_NAME_MAX) == NULL || p[FMT_T_NAME] == 0) {
            sl_err_set(err, "%s: tensor %u has an empty or unterminated name", r->path, i);
            free(buf);
            return -EINVAL;
        }
        memcpy(t->name, p + FMT_T_NAME, FORMAT_NAME_MAX);
        t->layer = (int32_t)sl_load_le32(p + FMT_T_LAYER);
        t->role = sl_load_le32(p + FMT_T_ROLE);
        t->encoding = sl_load_le32(p + FMT_T_ENCODING);
        t->n_dims = sl_load_le32(p + FMT_T_NDIMS);
        for (int d = 0; d < FORMAT_MAX_DIMS; d++)
            t->shape[d] = sl_load_le64(p + FMT_T_SHAPE + 8 * d);
        t->offset = sl_load_le64(p + FMT_T_OFFSET);
        t->length = sl_load_le64(p + FMT_T_LENGTH);
        t->checksum = sl_load_le64(p + FMT_T_CHECKSUM);
        t->act_scale = sl_load_lef32(p + FMT_T_ACT_SCALE);
        t->slice = sl_load_le32(p + FMT_T_SLICE);
        for (int b = 0; b <= FORMAT_MAX_BITS; b++)
            t->bits_hist[b] = sl_load_le32(p + FMT_T_BITS_HIST + 4 * b);
    }
    for (uint32_t i = 0; i < ns; i++, p += FMT_S_SIZE) {
        struct format_slice_info *s = &r->slices[i];
        s->kind = sl_load_le32(p + FMT_S_KIND);
        s->layer = (int32_t)sl_load_le32(p + FMT_S_LAYER);
        s->offset = sl_load_le64(p + FMT_S_OFFSET);
        s->length = sl_load_le64(p + FMT_S_LENGTH);
        s->checksum = sl_load_le64(p + FMT_S_CHECKSUM);
        s->first_tensor = sl_load_le32(p + FMT_S_FIRST);
        s->n_tensors = sl_load_le32(p + FMT_S_COUNT);
    }
    free(buf);
    r->n_tensors = nt;
    r->n_slices = ns;
    return 0;
}

/* Structural checks of the index against the config and the data region. */
static int check_index(struct format_reader *r, uint64_t data_off, uint64_t data_end,
                       struct sl_err *err)
{
    const struct format_config *c = &r->cfg;
    uint64_t prev_end = data_off;
    uint32_t next_tensor = 0;
    int64_t prev_order = INT64_MIN;
    for (uint32_t i = 0; i < r->n_slices; i++) {
        const struct format_slice_info *s = &r->slices[i];
        int64_t order;
        if (s->kind == FORMAT_SLICE_EMBED && s->layer == -1 && !c->tied_embedding)
            order = -1;
        else if (s->kind == FORMAT_SLICE_LAYER && s->layer >= 0 &&
                 (uint32_t)s->layer < c->n_layers)
            order = s->layer;
        else if (s->kind == FORMAT_SLICE_HEAD && s->layer == -1)
            order = INT32_MAX;
        else {
            sl_err_set(err, "%s: slice %u has kind %u and layer %d, which this model cannot have",
                       r->path, i, s->kind, s->layer);
            return -EINVAL;
        }
        if (order <= prev_order) {
            sl_err_set(err, "%s: slice %u is out of execution order", r->path, i);
            return -EINVAL;
        }
        prev_order = order;
        if (s->offset % FORMAT_ALIGN || s->length % FORMAT_ALIGN || s->length == 0 ||
            s->offset < prev_end || !range_ok(s->offset, s->length, data_off, data_end)) {
            sl_err_set(err, "%s: slice %u [%" PRIu64 ", +%" PRIu64 ") is misaligned, overlaps, "
                            "or lies outside the data region [%" PRIu64 ", %" PRIu64 ")",
                       r->path, i, s->offset, s->length, data_off, data_end);
            return -EINVAL;
        }
        prev_end = s->offset + s->length;
        if (s->first_tensor != next_tensor || s->n_tensors == 0 ||
            s->n_tensors > r->n_tensors - next_tensor) {
            sl_err_set(err, "%s: slice %u lists tensors [%u, +%u), expected to start at %u",
                       r->path, i, s->first_tensor, s->n_tensors, next_tensor);
            return -EINVAL;
        }
        uint64_t tprev = s->offset;
        int prev_rank = -1;
        for (uint32_t j = s->first_tensor; j < s->first_tensor + s->n_tensors; j++) {
            const struct format_tensor_info *t = &r->tensors[j];
            int ret = fmt_check_tensor_meta(c, t->name, t->layer, t->role, t->encoding, t->n_dims,
                                            t->shape, t->length, t->act_scale, r->path, err);
            if (ret < 0)
                return ret;
            if (t->slice != i || fmt_tensor_slice_kind(c, t->layer, t->role) != s->kind ||
                (s->kind == FORMAT_SLICE_LAYER && t->layer != s->layer)) {
                sl_err_set(err, "%s: tensor '%s' is filed under the wrong slice", r->path, t->name);
                return -EINVAL;
            }
            int rank = fmt_exec_rank(t->role);
            if (rank <= prev_rank) {
                sl_err_set(err, "%s: tensor '%s' repeats a role or is out of order in its slice",
                           r->path, t->name);
                return -EINVAL;
            }
            prev_rank = rank;
            if (t->offset % FORMAT_TENSOR_ALIGN || t->offset < tprev ||
                !range_ok(t->offset, t->length, s->offset, s->offset + s->length)) {
                sl_err_set(err, "%s: tensor '%s' [%" PRIu64 ", +%" PRIu64 ") lies outside its "
                                "slice [%" PRIu64 ", +%" PRIu64 ") or overlaps the previous one",
                           r->path, t->name, t->offset, t->length, s->offset, s->length);
                return -EINVAL;
            }
            tprev = t->offset + t->length;
        }
        next_tensor += s->n_tensors;
    }
    if (next_tensor != r->n_tensors) {
        sl_err_set(err, "%s: %u tensors are in no slice", r->path, r->n_tensors - next_tensor);
        return -EINVAL;
    }
    uint32_t want = c->n_layers * 9 + 2 + (c->tied_embedding ? 0 : 1);
    if (r->n_tensors != want) {
        sl_err_set(err, "%s: %u tensors, a %u-layer model needs %u", r->path, r->n_tensors,
                   c->n_layers, want);
        return -EINVAL;
    }
    /* Ranks are unique per slice, and the count is right, so every layer has
     * its 9 roles once and the head and embedding are complete. Still check
     * that each layer slice holds 9 tensors (a tensor count could balance). */
    for (uint32_t i = 0; i < r->n_slices; i++) {
        const struct format_slice_info *s = &r->slices[i];
        uint32_t need = s->kind == FORMAT_SLICE_LAYER ? 9 : s->kind == FORMAT_SLICE_EMBED ? 1 : 2;
        if (s->n_tensors != need) {
            sl_err_set(err, "%s: slice %u has %u tensors, expected %u", r->path, i, s->n_tensors,
                       need);
            return -EINVAL;
        }
    }
    if (r->n_slices != c->n_layers + 1 + (c->tied_embedding ? 0 : 1)) {
        sl_err_set(err, "%s: %u slices for %u layers", r->path, r->n_slices, c->n_layers);
        return -EINVAL;
    }
    return 0;
}

/* Readers opened (header, metadata and index read, decompressed and
 * validated) by this process: format_reader_opens. */
static atomic_uint_fast64_t g_opens;

uint64_t format_reader_opens(void) { return (uint64_t)atomic_load(&g_opens); }

struct format_reader *format_reader_ref(struct format_reader *r)
{
    atomic_fetch_add_explicit(&r->holders, 1, memory_order_relaxed);
    return r;
}

int format_reader_open(const char *path, struct format_reader **out, struct sl_err *err)
{
    int ret;
    struct format_reader *r = sl_calloc(1, sizeof *r);
    if (!r) {
        sl_err_set(err, "%s: out of memory", path);
        return -ENOMEM;
    }
    atomic_init(&r->holders, 1);
    r->fd = -1;
    r->path = sl_strdup(path);
    if (!r->path) {
        ret = -ENOMEM;
        sl_err_set(err, "%s: out of memory", path);
        goto fail;
    }
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        ret = -errno;
        sl_err_set(err, "%s: cannot open: %s", path, strerror(-ret));
        goto fail;
    }
    struct stat st;
    if (fstat(r->fd, &st) < 0) {
        ret = -errno;
        sl_err_set(err, "%s: cannot stat: %s", path, strerror(-ret));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        ret = -EINVAL;
        sl_err_set(err, "%s: not a regular file", path);
        goto fail;
    }
    r->size = (uint64_t)st.st_size;
    /* the header and the index read as asked, not read ahead: the header's
     * first read of the file read 16 KiB and left a read-ahead mark there,
     * and the next read from it (the embedding's 0.65 MB of widths and
     * scales on the TinyLlama shape, through a file of its own advised
     * random) found the mark and read 4 MB ahead, 3.3 MB that nothing asks
     * for before the first token, charged by a throttled disk before the
     * first weight byte (docs/BENCHMARKS.md, fifteenth session, f22).
     * Normal again once open. Advice: reads work without it. */
    (void)posix_fadvise(r->fd, 0, 0, POSIX_FADV_RANDOM);
    uint8_t hdr[FMT_HEADER_SIZE];
    if (r->size < FMT_HEADER_SIZE) {
        ret = -EINVAL;
        if (r->size >= FMT_MAGIC_LEN && fmt_pread_all(r->fd, hdr, FMT_MAGIC_LEN, 0) == 0 &&
            !memcmp(hdr, FMT_MAGIC, FMT_MAGIC_LEN))
            sl_err_set(err, "%s: truncated: %" PRIu64 " bytes, shorter than the header", path,
                       r->size);
        else
            sl_err_set(err, "%s: not a sluice container (%" PRIu64 " bytes, no header)", path,
                       r->size);
        goto fail;
    }
    ret = fmt_pread_all(r->fd, hdr, sizeof hdr, 0);
    if (ret < 0) {
        sl_err_set(err, "%s: cannot read the header: %s", path, strerror(-ret));
        goto fail;
    }
    ret = -EINVAL;
    if (memcmp(hdr, FMT_MAGIC, FMT_MAGIC_LEN) != 0) {
        sl_err_set(err, "%s: not a sluice container (bad magic)", path);
        goto fail;
    }
    uint32_t version = sl_load_le32(hdr + FMT_H_VERSION);
    if (version < FORMAT_VERSION_MIN || version > FORMAT_VERSION) {
        sl_err_set(err, "%s: container version %u, this build reads versions %u to %u", path,
                   version, FORMAT_VERSION_MIN, FORMAT_VERSION);
        goto fail;
    }
    r->version = version;
    uint64_t hsum = format_checksum(hdr, FMT_H_CHECKSUM);
    if (FMT_ENFORCE_META_SUMS && hsum != sl_load_le64(hdr + FMT_H_CHECKSUM)) {
        sl_err_set(err, "%s: header checksum mismatch (stored %016" PRIx64 ", computed %016" PRIx64
                        "): the header is corrupt", path, sl_load_le64(hdr + FMT_H_CHECKSUM), hsum);
        goto fail;
    }
    if (sl_load_le32(hdr + FMT_H_HEADER_SIZE) != FMT_HEADER_SIZE) {
        sl_err_set(err, "%s: header size %u, expected %u", path,
                   sl_load_le32(hdr + FMT_H_HEADER_SIZE), FMT_HEADER_SIZE);
        goto fail;
    }
    uint64_t declared = sl_load_le64(hdr + FMT_H_FILE_SIZE);
    if (declared != r->size) {
        sl_err_set(err, "%s: file is %" PRIu64 " bytes, its header says %" PRIu64 " (%s)", path,
                   r->size, declared, r->size < declared ? "truncated" : "trailing garbage");
        goto fail;
    }
    uint64_t data_off = sl_load_le64(hdr + FMT_H_DATA_OFFSET);
    uint64_t data_len = sl_load_le64(hdr + FMT_H_DATA_LENGTH);
    if (data_off != FMT_HEADER_SIZE || data_len % FORMAT_ALIGN ||
        !range_ok(data_off, data_len, FMT_HEADER_SIZE, r->size)) {
        sl_err_set(err, "%s: data region [%" PRIu64 ", +%" PRIu64 ") is invalid", path, data_off,
                   data_len);
        goto fail;
    }
    fmt_config_load(hdr + FMT_H_CONFIG, &r->cfg);
    ret = format_config_validate(&r->cfg, path, err);
    if (ret < 0)
        goto fail;
    if (sl_load_le64(hdr + FMT_H_META_OFFSET) < data_off + data_len) {
        ret = -EINVAL;
        sl_err_set(err, "%s: metadata overlaps the data region", path);
        goto fail;
    }
    ret = load_meta(r, hdr, err);
    if (ret < 0)
        goto fail;
    ret = load_index(r, hdr, data_off + data_len, err);
    if (ret < 0)
        goto fail;
    ret = check_index(r, data_off, data_off + data_len, err);
    if (ret < 0)
        goto fail;
    (void)posix_fadvise(r->fd, 0, 0, POSIX_FADV_NORMAL); /* advice */
    atomic_fetch_add_explicit(&g_opens, 1, memory_order_relaxed);
    *out = r;
    return 0;
fail:
    format_reader_close(r);
    return ret;
}

void format_reader_close(struct format_reader *r)
{
    /* the last holder frees; acq_rel: every holder's reads happen before it */
    if (!r || atomic_fetch_sub_explicit(&r->holders, 1, memory_order_acq_rel) != 1)
        return;
    if (r->fd >= 0)
        close(r->fd);
    free(r->tok_scores);
    free(r->tok_lens);
    free(r->tok_strs);
    free(r->kv);
    free(r->keybuf);
    free(r->meta);
    free(r->tensors);
    free(r->slices);
    free(r->path);
    free(r);
}
