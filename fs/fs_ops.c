/* fs_ops.c: the FUSE low-level callbacks. Each callback is a thin wrapper over
 * fs_do_<op>(), which returns 0 or -errno; the sign flips in one place, at
 * fuse_reply_err(req, -ret) (libfuse example/passthrough_ll.c). The tree never
 * changes while mounted, so attributes and entries are cached for an hour. */
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs_internal.h"

static const double CACHE_TIMEOUT = 3600.0;

static struct fs_state *state_of(fuse_req_t req)
{
    return fuse_req_userdata(req);
}

static struct fs_node *node_of(struct fs_state *s, fuse_ino_t ino)
{
    return ino >= 1 && ino <= s->n_nodes ? &s->nodes[ino - 1] : NULL;
}

static void fill_attr(struct fs_state *s, const struct fs_node *n, struct stat *st)
{
    memset(st, 0, sizeof *st);
    st->st_ino = n->ino;
    if (n->kind == FS_DIR) {
        st->st_mode = S_IFDIR | 0555;
        st->st_nlink = 2;
        for (uint32_t c = n->first_child; c; c = s->nodes[c - 1].next_sibling)
            st->st_nlink += s->nodes[c - 1].kind == FS_DIR;
    } else {
        st->st_mode = S_IFREG | 0444;
        st->st_nlink = 1;
        st->st_size = (off_t)n->size;
    }
    st->st_blksize = 1 << 20;
    st->st_blocks = (blkcnt_t)((uint64_t)st->st_size + 511) / 512;
    st->st_uid = getuid();
    st->st_gid = getgid();
    st->st_atim = st->st_mtim = st->st_ctim = s->mtime; /* the container's */
}

static double attr_timeout(const struct fs_node *n)
{
    (void)n; /* every size is fixed, stats.json's too (it is padded) */
    return CACHE_TIMEOUT;
}

/* ---- lookup, getattr --------------------------------------------------------------------- */

static int fs_do_lookup(struct fs_state *s, fuse_ino_t parent, const char *name,
                        struct fuse_entry_param *e)
{
    struct fs_node *p = node_of(s, parent);
    if (!p)
        return -ENOENT;
    if (p->kind != FS_DIR)
        return -ENOTDIR;
    struct fs_node *n;
    if (!strcmp(name, "."))
        n = p;
    else if (!strcmp(name, ".."))
        n = &s->nodes[p->parent];
    else
        n = fs_tree_lookup(s, (uint32_t)(p->ino - 1), name);
    if (!n)
        return -ENOENT;
    memset(e, 0, sizeof *e);
    e->ino = n->ino;
    e->generation = 1;
    e->attr_timeout = attr_timeout(n);
    e->entry_timeout = CACHE_TIMEOUT;
    fill_attr(s, n, &e->attr);
    return 0;
}

static void fs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fuse_entry_param e;
    int ret = fs_do_lookup(state_of(req), parent, name, &e);
    if (ret < 0)
        fuse_reply_err(req, -ret);
    else
        fuse_reply_entry(req, &e);
}

static int fs_do_getattr(struct fs_state *s, fuse_ino_t ino, struct stat *st, double *timeout)
{
    struct fs_node *n = node_of(s, ino);
    if (!n)
        return -ENOENT;
    fill_attr(s, n, st);
    *timeout = attr_timeout(n);
    return 0;
}

static void fs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    struct stat st;
    double timeout;
    int ret = fs_do_getattr(state_of(req), ino, &st, &timeout);
    if (ret < 0)
        fuse_reply_err(req, -ret);
    else
        fuse_reply_attr(req, &st, timeout);
}

/* ---- open, read, release ----------------------------------------------------------------- */

static int fs_do_open(struct fs_state *s, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs_node *n = node_of(s, ino);
    if (!n)
        return -ENOENT;
    if (n->kind == FS_DIR)
        return -EISDIR;
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC))
        return -EROFS;
    fi->fh = 0;
    fi->noflush = 1; /* nothing to flush: spare the round trip at close */
    switch (n->kind) {
    case FS_RANGE:
        fi->keep_cache = s->opts.keep_cache;
        fi->direct_io = s->opts.direct_io;
        return 0;
    case FS_GEN:
        fi->keep_cache = 1;
        return 0;
    case FS_GGUF: /* page cache on: llama.cpp maps it */
        fi->keep_cache = s->opts.keep_cache;
        /* its reader starts at the header, whose first chunk needs the first
         * slice: start reading the slices while the reader parses the header,
         * and convert ahead of it */
        fs_gguf_opened(s, ino);
        return 0;
    default:
        break;
    }
    struct fs_view *v;
    int ret = fs_view_open(s, n, &v);
    if (ret < 0)
        return ret;
    fi->fh = (uint64_t)(uintptr_t)v;
    fi->direct_io = n->kind == FS_STATS; /* fresh content at every open */
    fi->keep_cache = n->kind != FS_STATS;
    return 0;
}

static void fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int ret = fs_do_open(state_of(req), ino, fi);
    if (ret < 0)
        fuse_reply_err(req, -ret);
    else
        fuse_reply_open(req, fi);
}

/* What a read replies with: bytes in memory (mem, len), or len bytes of the
 * container at fd/pos to splice. The pin (or owned buffer) lives until the
 * reply is sent. */
struct fs_reply {
    const char *mem;
    size_t len;
    int fd;
    off_t pos;
    struct fs_pin pin;
    char *owned;
};

static int fs_do_read(struct fs_state *s, fuse_ino_t ino, size_t size, off_t off,
                      struct fuse_file_info *fi, struct fs_reply *rep)
{
    memset(rep, 0, sizeof *rep);
    rep->fd = -1;
    struct fs_node *n = node_of(s, ino);
    if (!n)
        return -ENOENT;
    if (n->kind == FS_DIR)
        return -EISDIR;
    if (off < 0)
        return -EINVAL;
    if (n->kind == FS_GGUF) {
        rep->owned = malloc(size ? size : 1);
        if (!rep->owned)
            return -ENOMEM;
        ssize_t k = fs_gguf_read(s, rep->owned, size, (uint64_t)off);
        if (k < 0)
            return (int)k;
        rep->mem = rep->owned;
        rep->len = (size_t)k;
    } else if (fi->fh) { /* a computed view */
        rep->owned = malloc(size ? size : 1);
        if (!rep->owned)
            return -ENOMEM;
        ssize_t k = fs_view_read(s, (struct fs_view *)(uintptr_t)fi->fh, rep->owned, size,
                                 (uint64_t)off);
        if (k < 0)
            return (int)k;
        rep->mem = rep->owned;
        rep->len = (size_t)k;
    } else {
        if ((uint64_t)off >= n->size)
            return 0;
        if (size > n->size - (uint64_t)off)
            size = (size_t)(n->size - (uint64_t)off);
        if (n->kind == FS_GEN) {
            rep->mem = n->data + off;
            rep->len = size;
        } else {
            int ret = fs_slice_acquire(s, n->slice, &rep->pin);
            if (ret < 0)
                return ret;
            rep->len = size;
            if (rep->pin.mapped) { /* page cache: splice (or copy) from the container */
                rep->fd = rep->pin.fd;
                rep->pos = rep->pin.pos + (off_t)n->off + off;
            } else {
                rep->mem = (const char *)rep->pin.data + n->off + (uint64_t)off;
            }
        }
    }
    atomic_fetch_add(&n->bytes_served, rep->len);
    atomic_fetch_add(&n->reads_served, 1);
    return 0;
}

static void fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    struct fs_state *s = state_of(req);
    struct fs_reply rep;
    int ret = fs_do_read(s, ino, size, off, fi, &rep);
    if (ret < 0) {
        fuse_reply_err(req, -ret);
    } else if (rep.fd >= 0) {
        struct fuse_bufvec bv = FUSE_BUFVEC_INIT(rep.len);
        bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK | FUSE_BUF_FD_RETRY;
        bv.buf[0].fd = rep.fd;
        bv.buf[0].pos = rep.pos;
        fuse_reply_data(req, &bv, s->opts.splice ? FUSE_BUF_SPLICE_MOVE : FUSE_BUF_NO_SPLICE);
    } else {
        fuse_reply_buf(req, rep.mem, rep.len);
    }
    fs_slice_release(s, &rep.pin);
    free(rep.owned);
}

static void fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs_state *s = state_of(req);
    const struct fs_node *n = node_of(s, ino);
    if (n && n->kind == FS_GGUF)
        fs_gguf_released(s);
    fs_view_close((struct fs_view *)(uintptr_t)fi->fh);
    fuse_reply_err(req, 0);
}

/* ---- directories ------------------------------------------------------------------------- */

static int fs_do_opendir(struct fs_state *s, fuse_ino_t ino)
{
    struct fs_node *n = node_of(s, ino);
    if (!n)
        return -ENOENT;
    return n->kind == FS_DIR ? 0 : -ENOTDIR;
}

static void fs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int ret = fs_do_opendir(state_of(req), ino);
    if (ret < 0) {
        fuse_reply_err(req, -ret);
    } else {
        fi->cache_readdir = 1;
        fi->keep_cache = 1;
        fuse_reply_open(req, fi);
    }
}

/* Entries: ".", "..", then the children in order; the offset of an entry is
 * its position + 1, so a listing continued at any offset is consistent. */
static int fs_do_readdir(fuse_req_t req, struct fs_state *s, fuse_ino_t ino, size_t size,
                         off_t off, char *buf, size_t *used)
{
    struct fs_node *d = node_of(s, ino);
    if (!d)
        return -ENOENT;
    if (d->kind != FS_DIR)
        return -ENOTDIR;
    *used = 0;
    uint32_t c = d->first_child;
    for (off_t pos = 0;; pos++) {
        const char *name;
        struct fs_node *n;
        if (pos == 0) {
            name = ".", n = d;
        } else if (pos == 1) {
            name = "..", n = &s->nodes[d->parent];
        } else {
            if (!c)
                break;
            n = &s->nodes[c - 1];
            name = n->name;
            c = n->next_sibling;
        }
        if (pos < off)
            continue;
        struct stat st = {.st_ino = n->ino, .st_mode = n->kind == FS_DIR ? S_IFDIR : S_IFREG};
        size_t need = fuse_add_direntry(req, buf + *used, size - *used, name, &st, pos + 1);
        if (need > size - *used)
            break;
        *used += need;
    }
    return 0;
}

static void fs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    (void)fi;
    char *buf = malloc(size ? size : 1);
    size_t used = 0;
    int ret = buf ? fs_do_readdir(req, state_of(req), ino, size, off, buf, &used) : -ENOMEM;
    if (ret < 0)
        fuse_reply_err(req, -ret);
    else
        fuse_reply_buf(req, buf, used);
    free(buf);
}

static void fs_statfs(fuse_req_t req, fuse_ino_t ino)
{
    (void)ino;
    struct fs_state *s = state_of(req);
    struct statvfs sv;
    memset(&sv, 0, sizeof sv);
    sv.f_bsize = 4096;
    sv.f_frsize = 4096;
    sv.f_blocks = format_reader_file_size(s->r) / 4096;
    sv.f_files = s->n_nodes;
    sv.f_namemax = 255;
    sv.f_flag = ST_RDONLY;
    fuse_reply_statfs(req, &sv);
}

/* ---- everything that would change the tree ----------------------------------------------- */

/* The mount is "ro", so the kernel refuses most of these before they arrive;
 * whatever arrives gets EROFS too. */
static int fs_do_modify(void)
{
    return -EROFS;
}

static void erofs(fuse_req_t req)
{
    fuse_reply_err(req, -fs_do_modify());
}

static void fs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *a, int to_set,
                       struct fuse_file_info *fi)
{
    (void)ino, (void)a, (void)to_set, (void)fi;
    erofs(req);
}
static void fs_mknod(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m, dev_t d)
{
    (void)p, (void)n, (void)m, (void)d;
    erofs(req);
}
static void fs_mkdir(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m)
{
    (void)p, (void)n, (void)m;
    erofs(req);
}
static void fs_unlink(fuse_req_t req, fuse_ino_t p, const char *n)
{
    (void)p, (void)n;
    erofs(req);
}
static void fs_symlink(fuse_req_t req, const char *l, fuse_ino_t p, const char *n)
{
    (void)l, (void)p, (void)n;
    erofs(req);
}
static void fs_rename(fuse_req_t req, fuse_ino_t p, const char *n, fuse_ino_t np, const char *nn,
                      unsigned int f)
{
    (void)p, (void)n, (void)np, (void)nn, (void)f;
    erofs(req);
}
static void fs_link(fuse_req_t req, fuse_ino_t i, fuse_ino_t np, const char *nn)
{
    (void)i, (void)np, (void)nn;
    erofs(req);
}
static void fs_write(fuse_req_t req, fuse_ino_t i, const char *b, size_t s, off_t o,
                     struct fuse_file_info *fi)
{
    (void)i, (void)b, (void)s, (void)o, (void)fi;
    erofs(req);
}
static void fs_create(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m,
                      struct fuse_file_info *fi)
{
    (void)p, (void)n, (void)m, (void)fi;
    erofs(req);
}
static void fs_setxattr(fuse_req_t req, fuse_ino_t i, const char *n, const char *v, size_t s,
                        int f)
{
    (void)i, (void)n, (void)v, (void)s, (void)f;
    erofs(req);
}
static void fs_removexattr(fuse_req_t req, fuse_ino_t i, const char *n)
{
    (void)i, (void)n;
    erofs(req);
}
static void fs_fallocate(fuse_req_t req, fuse_ino_t i, int mode, off_t o, off_t l,
                         struct fuse_file_info *fi)
{
    (void)i, (void)mode, (void)o, (void)l, (void)fi;
    erofs(req);
}

/* ---- connection setup -------------------------------------------------------------------- */

static void fs_init(void *userdata, struct fuse_conn_info *conn)
{
    struct fs_state *s = userdata;
    const struct fs_options *o = &s->opts;
    /* Large sequential reads: many requests in flight (the kernel's default
     * of 12 background requests throttles readahead and async direct I/O),
     * big requests (max_pages follows max_write in libfuse), a big readahead
     * window, and splicing from the container's descriptor. */
    if (o->max_background) {
        conn->max_background = o->max_background;
        conn->congestion_threshold = o->max_background * 3 / 4;
    }
    if (o->max_readahead)
        conn->max_readahead = o->max_readahead;
    conn->max_write = o->max_pages * 4096u;
    conn->max_read = o->max_pages * 4096u; /* equals the max_read mount option */
    conn->want &= ~(unsigned)(FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE | FUSE_CAP_SPLICE_READ);
    if (o->splice && (conn->capable & FUSE_CAP_SPLICE_WRITE)) {
        conn->want |= FUSE_CAP_SPLICE_WRITE;
        if (conn->capable & FUSE_CAP_SPLICE_MOVE)
            conn->want |= FUSE_CAP_SPLICE_MOVE;
    }
    if (conn->capable & FUSE_CAP_ASYNC_READ)
        conn->want |= FUSE_CAP_ASYNC_READ;
    if (conn->capable & FUSE_CAP_ASYNC_DIO)
        conn->want |= FUSE_CAP_ASYNC_DIO;
    conn->want &= ~(unsigned)FUSE_CAP_AUTO_INVAL_DATA; /* the files never change */
}

static const struct fuse_lowlevel_ops ops = {
    .init = fs_init,
    .lookup = fs_lookup,
    .getattr = fs_getattr,
    .open = fs_open,
    .read = fs_read,
    .release = fs_release,
    .opendir = fs_opendir,
    .readdir = fs_readdir,
    .statfs = fs_statfs,
    .setattr = fs_setattr,
    .mknod = fs_mknod,
    .mkdir = fs_mkdir,
    .unlink = fs_unlink,
    .rmdir = fs_unlink,
    .symlink = fs_symlink,
    .rename = fs_rename,
    .link = fs_link,
    .write = fs_write,
    .create = fs_create,
    .setxattr = fs_setxattr,
    .removexattr = fs_removexattr,
    .fallocate = fs_fallocate,
};

const struct fuse_lowlevel_ops *fs_ops_table(void)
{
    return &ops;
}
