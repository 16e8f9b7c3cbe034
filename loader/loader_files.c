/* loader_files.c: the stream's files: each request's file opened once (a
 * path, or a caller's descriptor reopened), O_DIRECT where it can help, the
 * buffered descriptor on first need, and the shared pread and warning helpers. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "loader_internal.h"

#define FUSE_MAGIC 0x65735546 /* FUSE_SUPER_MAGIC, linux/magic.h */
#define CACHE_SAMPLES 64

int64_t loader_pread_once(int fd, void *buf, uint64_t len, uint64_t off)
{
    for (;;) {
        ssize_t k = pread(fd, buf, (size_t)len, (off_t)off);
        if (k >= 0)
            return k;
        if (errno != EINTR)
            return -errno;
    }
}

void loader_warn(struct loader_stream *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->note, sizeof s->note, fmt, ap);
    va_end(ap);
    if (s->opts.warn)
        s->opts.warn(s->opts.warn_user, s->note);
}

const char *loader_file_name(const struct loader_file *f)
{
    return f->path ? f->path : "(caller's descriptor)";
}

/* ---- files ------------------------------------------------------------------------ */

int loader_reopen_fd(int fd, int flags)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    return open(p, O_RDONLY | O_CLOEXEC | flags);
}

static int open_direct(struct loader_stream *s, struct loader_file *f)
{
    if (s->have_faults && s->faults.direct_open_einval) {
        errno = EINVAL;
        return -1;
    }
    return f->path ? open(f->path, O_RDONLY | O_CLOEXEC | O_DIRECT)
                   : loader_reopen_fd(f->caller_fd, O_DIRECT);
}

/* The index of the request's file, opened on first sight. */
int loader_file_index(struct loader_stream *s, const struct loader_request *r, struct sl_err *err)
{
    for (uint32_t i = 0; i < s->n_files; i++) {
        const struct loader_file *f = &s->files[i];
        if (r->path ? (f->path && !strcmp(f->path, r->path)) : (!f->path && f->caller_fd == r->fd))
            return (int)i;
    }
    struct loader_file *f = &s->files[s->n_files];
    memset(f, 0, sizeof *f);
    f->caller_fd = f->fd_direct = f->fd_buffered = -1;
    if (!r->path) {
        if (r->fd < 0) {
            sl_err_set(err, "loader: request without a path or a descriptor");
            return -EINVAL;
        }
        f->caller_fd = r->fd;
        int fl = fcntl(r->fd, F_GETFL);
        if (fl < 0) {
            int e = errno;
            sl_err_set(err, "loader: descriptor %d: %s", r->fd, strerror(e));
            return -e;
        }
        if (fl & O_DIRECT) {
            f->fd_direct = r->fd;
        } else {
            f->fd_buffered = r->fd;
            if (!s->opts.no_direct) {
                f->fd_direct = open_direct(s, f);
                f->own_direct = f->fd_direct >= 0;
            }
        }
        if (f->fd_direct < 0 && !s->opts.no_direct)
            loader_warn(s, "descriptor %d: cannot reopen it with O_DIRECT, reading buffered",
                        r->fd);
        return (int)s->n_files++;
    }
    f->path = sl_strdup(r->path);
    if (!f->path) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    if (!s->opts.no_direct) {
        f->fd_direct = open_direct(s, f);
        if (f->fd_direct >= 0) {
            f->own_direct = 1;
        } else if (errno == EINVAL) {
            loader_warn(s, "%s: O_DIRECT refused (EINVAL), reading buffered", r->path);
            f->warned = 1;
        } else {
            int e = errno;
            sl_err_set(err, "%s: cannot open: %s", r->path, strerror(e));
            free(f->path);
            return -e;
        }
    }
    if (f->fd_direct < 0) {
        f->fd_buffered = open(r->path, O_RDONLY | O_CLOEXEC);
        if (f->fd_buffered < 0) {
            int e = errno;
            sl_err_set(err, "%s: cannot open: %s", r->path, strerror(e));
            free(f->path);
            return -e;
        }
        f->own_buffered = 1;
    }
    return (int)s->n_files++;
}

/* The buffered descriptor of a file, opened on first need; -1 if impossible. */
int loader_buffered_fd(struct loader_file *f)
{
    if (f->fd_buffered < 0) {
        f->fd_buffered = f->path ? open(f->path, O_RDONLY | O_CLOEXEC) : loader_reopen_fd(f->caller_fd, 0);
        f->own_buffered = f->fd_buffered >= 0;
    }
    return f->fd_buffered;
}

/* 1 if the pages of [lo, hi) of the file are in the page cache: every one of
 * CACHE_SAMPLES pages spread over it (mincore through a mapping that is never
 * touched, so nothing is read). */
static int file_cached(int fd, uint64_t lo, uint64_t hi)
{
    lo &= ~(uint64_t)(LOADER_ALIGN - 1);
    if (hi <= lo || hi - lo > (uint64_t)SIZE_MAX / 2)
        return 0;
    size_t len = (size_t)(hi - lo);
    uint8_t *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)lo);
    if (p == MAP_FAILED)
        return 0;
    int cached = 1;
    for (uint64_t k = 0; k < CACHE_SAMPLES && cached; k++) {
        uint64_t at = (uint64_t)len * k / CACHE_SAMPLES & ~(uint64_t)(LOADER_ALIGN - 1);
        unsigned char v = 0;
        if (mincore(p + at, 1, &v) < 0 || !(v & 1))
            cached = 0;
    }
    munmap(p, len);
    return cached;
}

/* Files read buffered where O_DIRECT cannot help (see loader_opts.always_direct). */
void loader_choose_direct(struct loader_stream *s)
{
    for (uint32_t i = 0; i < s->n_files; i++) {
        struct loader_file *f = &s->files[i];
        if (f->fd_direct < 0 || s->opts.always_direct)
            continue;
        const char *why = NULL;
        struct statfs sfs;
        if (fstatfs(f->fd_direct, &sfs) == 0 && sfs.f_type == FUSE_MAGIC) {
            why = "on FUSE";
        } else {
            uint64_t lo = UINT64_MAX, hi = 0;
            for (uint32_t j = 0; j < s->n; j++) {
                const struct loader_req_state *q = &s->reqs[j];
                if (q->file != i)
                    continue;
                if (q->r.offset < lo)
                    lo = q->r.offset;
                if (q->r.offset + q->r.length > hi)
                    hi = q->r.offset + q->r.length;
            }
            if (file_cached(f->fd_direct, lo, hi))
                why = "in the page cache already";
        }
        if (!why)
            continue;
        snprintf(s->note, sizeof s->note, "%s: %s, reading buffered", loader_file_name(f), why);
        if (f->own_direct)
            close(f->fd_direct);
        f->fd_direct = -1;
        f->own_direct = 0;
    }
}
