/* gguf_source.c: slices read from the container file (pread + checksum, by
 * format_reader_read_slice), for `sluice export` and tests, and writing a
 * whole view to a file atomically. The source keeps the last slice it read;
 * a reader asking for another slice while that one is pinned gets a private
 * copy (read and verified for it alone). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_internal.h"

struct fsrc {
    const struct format_reader *r;
    pthread_mutex_t mu;
    uint8_t *buf;
    uint64_t cap;
    uint32_t cur;
    int have;
    uint32_t pins;
};

static int read_slice(struct fsrc *f, uint32_t i, uint8_t **buf, uint64_t *cap, struct sl_err *err)
{
    uint64_t len = format_reader_slice(f->r, i)->length;
    if (len > *cap) {
        uint8_t *b = realloc(*buf, len ? len : 1);
        if (!b) {
            sl_err_set(err, "out of memory reading slice %u", i);
            return -ENOMEM;
        }
        *buf = b;
        *cap = len;
    }
    int ret = format_reader_read_slice(f->r, i, *buf, len, err);
    return ret < 0 ? -EIO : 0;
}

static int fsrc_acquire(void *ctx, uint32_t i, const uint8_t **data, void **token,
                        struct sl_err *err)
{
    struct fsrc *f = ctx;
    pthread_mutex_lock(&f->mu);
    if (!(f->have && f->cur == i) && f->pins == 0) {
        f->have = 0;
        int ret = read_slice(f, i, &f->buf, &f->cap, err);
        if (ret < 0) {
            pthread_mutex_unlock(&f->mu);
            return ret;
        }
        f->have = 1;
        f->cur = i;
    }
    if (f->have && f->cur == i) {
        f->pins++;
        *data = f->buf;
        *token = NULL;
        pthread_mutex_unlock(&f->mu);
        return 0;
    }
    pthread_mutex_unlock(&f->mu);
    uint8_t *own = NULL;
    uint64_t cap = 0;
    int ret = read_slice(f, i, &own, &cap, err);
    if (ret < 0) {
        free(own);
        return ret;
    }
    *data = own;
    *token = own;
    return 0;
}

static void fsrc_release(void *ctx, uint32_t i, void *token)
{
    (void)i;
    struct fsrc *f = ctx;
    if (token) {
        free(token);
        return;
    }
    pthread_mutex_lock(&f->mu);
    f->pins--;
    pthread_mutex_unlock(&f->mu);
}

int gguf_file_source_create(const struct format_reader *r, struct gguf_source *out,
                            struct sl_err *err)
{
    struct fsrc *f = calloc(1, sizeof *f);
    if (!f) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    f->r = r;
    pthread_mutex_init(&f->mu, NULL);
    *out = (struct gguf_source){f, fsrc_acquire, fsrc_release, NULL};
    return 0;
}

void gguf_file_source_destroy(struct gguf_source *src)
{
    struct fsrc *f = src ? src->ctx : NULL;
    if (!f)
        return;
    free(f->buf);
    pthread_mutex_destroy(&f->mu);
    free(f);
    src->ctx = NULL;
}

/* ---- writing a file ------------------------------------------------------------------ */

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int gguf_view_write_file(struct gguf_view *v, const struct gguf_source *src, const char *path,
                         void (*progress)(void *ctx, uint64_t done, uint64_t total), void *ctx,
                         struct sl_err *err)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp) {
        sl_err_set(err, "%s: path too long", path);
        return -ENAMETOOLONG;
    }
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        sl_err_set(err, "%s: cannot create a temporary file beside it: %s", path, strerror(e));
        return -e;
    }
    const size_t step = 16u << 20;
    uint8_t *buf = malloc(step);
    int ret = buf ? 0 : -ENOMEM;
    if (!buf)
        sl_err_set(err, "out of memory");
    uint64_t size = gguf_view_size(v);
    for (uint64_t off = 0; ret == 0 && off < size; off += step) {
        size_t n = size - off < step ? (size_t)(size - off) : step;
        ssize_t k = gguf_view_read(v, src, buf, n, off, err);
        if (k < 0) {
            ret = (int)k;
        } else if ((size_t)k != n) {
            sl_err_set(err, "%s: short conversion at offset %llu", path, (unsigned long long)off);
            ret = -EIO;
        } else if ((ret = write_all(fd, buf, n)) < 0) {
            sl_err_set(err, "%s: write failed: %s", tmp, strerror(-ret));
        }
        if (ret == 0 && progress)
            progress(ctx, off + n, size);
    }
    free(buf);
    if (ret == 0 && fchmod(fd, 0644) < 0) { /* mkstemp made it 0600 */
        ret = -errno;
        sl_err_set(err, "%s: chmod failed: %s", tmp, strerror(errno));
    }
    if (ret == 0 && fsync(fd) < 0) {
        ret = -errno;
        sl_err_set(err, "%s: fsync failed: %s", tmp, strerror(errno));
    }
    if (close(fd) < 0 && ret == 0) {
        ret = -errno;
        sl_err_set(err, "%s: close failed: %s", tmp, strerror(errno));
    }
    if (ret == 0 && rename(tmp, path) < 0) {
        ret = -errno;
        sl_err_set(err, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    }
    if (ret < 0) {
        unlink(tmp);
        return ret;
    }
    /* the rename is durable once the directory is */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = 0;
    else
        snprintf(dir, sizeof dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}
