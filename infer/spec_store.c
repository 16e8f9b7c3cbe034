/* spec_store.c: the history draft source on disk: earlier generations of one
 * task kind for one model (DIR/KIND-TAG.hist), at most max_tokens tokens
 * (generations separated by -1; the oldest dropped first). File: "SLSPEC1\n",
 * u32 count, then count int32 tokens (little endian, as the host writes
 * them). Every update rewrites it atomically (temporary file + rename). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "infer.h"

#define STORE_MAGIC "SLSPEC1\n"

struct infer_spec_store {
    char *path;
    uint32_t max;
    int *tok;
    uint32_t n;
};

static int kind_ok(const char *k)
{
    size_t n = strlen(k);
    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = k[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static int load(struct infer_spec_store *h, struct sl_err *err)
{
    FILE *f = fopen(h->path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return 0; /* a new history */
        int e = errno;
        sl_err_set(err, "%s: %s", h->path, strerror(e));
        return -e;
    }
    char magic[8];
    uint32_t n;
    int ret = 0;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, STORE_MAGIC, 8) || fread(&n, 4, 1, f) != 1) {
        sl_err_set(err, "%s: not a speculative-decoding history", h->path);
        ret = -EINVAL;
    } else if (n > h->max) {
        sl_err_set(err, "%s: %u tokens, over the bound of %u", h->path, n, h->max);
        ret = -EINVAL;
    } else if (n && !(h->tok = malloc(sizeof(int) * n))) {
        ret = -ENOMEM;
    } else if (n && fread(h->tok, sizeof(int), n, f) != n) {
        sl_err_set(err, "%s: truncated", h->path);
        ret = -EINVAL;
    } else {
        h->n = n;
    }
    fclose(f);
    return ret;
}

int infer_spec_store_open(const char *dir, const char *kind, uint64_t model_tag,
                          uint32_t max_tokens, struct infer_spec_store **out, struct sl_err *err)
{
    if (!kind_ok(kind)) {
        sl_err_set(err, "task kind '%s': want 1..64 characters of A-Z a-z 0-9 _ -", kind);
        return -EINVAL;
    }
    if (max_tokens < 2) {
        sl_err_set(err, "a history bound of %u tokens is too small", max_tokens);
        return -EINVAL;
    }
    struct infer_spec_store *h = calloc(1, sizeof *h);
    size_t len = strlen(dir) + strlen(kind) + 32;
    if (!h || !(h->path = malloc(len))) {
        free(h);
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    snprintf(h->path, len, "%s/%s-%016llx.hist", dir, kind, (unsigned long long)model_tag);
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) { /* one level: DIR itself */
        int e = errno;
        sl_err_set(err, "%s: cannot create the history directory (%s)", dir, strerror(e));
        infer_spec_store_close(h);
        return -e;
    }
    h->max = max_tokens;
    int ret = load(h, err);
    if (ret < 0) {
        if (ret == -ENOMEM)
            sl_err_set(err, "out of memory");
        infer_spec_store_close(h);
        return ret;
    }
    *out = h;
    return 0;
}

void infer_spec_store_close(struct infer_spec_store *h)
{
    if (!h)
        return;
    free(h->path);
    free(h->tok);
    free(h);
}

const int *infer_spec_store_tokens(const struct infer_spec_store *h, uint32_t *n)
{
    *n = h->n;
    return h->tok;
}

int infer_spec_store_add(struct infer_spec_store *h, const int *tokens, uint32_t n,
                         struct sl_err *err)
{
    if (n == 0)
        return 0;
    if (n > h->max - 1) { /* a generation longer than the bound: its newest part */
        tokens += n - (h->max - 1);
        n = h->max - 1;
    }
    uint64_t total = (uint64_t)h->n + n + 1;
    uint32_t drop = 0;
    if (total > h->max) { /* drop the oldest generations, whole, to fit */
        uint64_t over = total - h->max;
        while (drop < h->n && (drop < over || h->tok[drop - 1] != -1))
            drop++;
    }
    uint32_t keep = h->n - drop;
    int *t = malloc(sizeof(int) * ((size_t)keep + n + 1));
    if (!t) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    if (keep)
        memcpy(t, h->tok + drop, sizeof(int) * keep);
    memcpy(t + keep, tokens, sizeof(int) * n);
    t[keep + n] = -1;
    uint32_t nt = keep + n + 1;
    size_t tl = strlen(h->path) + 8;
    char *tmp = malloc(tl);
    FILE *f = NULL;
    int ret = 0;
    if (!tmp) {
        ret = -ENOMEM;
        sl_err_set(err, "out of memory");
    } else {
        snprintf(tmp, tl, "%s.tmp", h->path);
        f = fopen(tmp, "wb");
        if (!f || fwrite(STORE_MAGIC, 1, 8, f) != 8 || fwrite(&nt, 4, 1, f) != 1 ||
            fwrite(t, sizeof(int), nt, f) != nt || fflush(f) != 0 || fsync(fileno(f)) != 0) {
            ret = -(errno ? errno : EIO);
            sl_err_set(err, "%s: cannot write (%s)", tmp, strerror(-ret));
        }
        if (f && fclose(f) != 0 && ret == 0) {
            ret = -(errno ? errno : EIO);
            sl_err_set(err, "%s: cannot write (%s)", tmp, strerror(-ret));
        }
        if (ret == 0 && rename(tmp, h->path) != 0) {
            ret = -errno;
            sl_err_set(err, "%s: cannot rename (%s)", h->path, strerror(errno));
        }
        if (ret < 0)
            unlink(tmp);
    }
    free(tmp);
    if (ret < 0) {
        free(t);
        return ret;
    }
    free(h->tok);
    h->tok = t;
    h->n = nt;
    return 0;
}
