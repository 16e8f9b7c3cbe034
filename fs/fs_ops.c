/* fs_ops.c: the FUSE low-level callbacks and the mount/unmount logic. Each
 * callback is a thin wrapper over fs_do_<op>(), which returns -errno; the sign
 * flips in one place, at fuse_reply_err (libfuse example/passthrough_ll.c). */
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#include "fs_internal.h"
#include "unpack.h"

static const double ATTR_TIMEOUT = 3600.0; /* the tree never changes while mounted */

static struct fs_state *state_of(fuse_req_t req)
{
    return fuse_req_userdata(req);
}

static struct fs_node *node_of(struct fs_state *s, fuse_ino_t ino)
{
    return ino >= 1 && ino <= s->n_nodes ? &s->nodes[ino - 1] : NULL;
}

static void fill_attr(const struct fs_node *n, struct stat *st)
{
    memset(st, 0, sizeof *st);
    st->st_ino = n->ino;
    if (n->kind == FS_DIR) {
        st->st_mode = S_IFDIR | 0555;
        st->st_nlink = 2;
    } else {
        st->st_mode = S_IFREG | 0444;
        st->st_nlink = 1;
        st->st_size = (off_t)n->size;
    }
    st->st_blksize = 1 << 20;
    st->st_blocks = (blkcnt_t)((n->size + 511) / 512);
    st->st_uid = getuid();
    st->st_gid = getgid();
}

/* ---- slice verification ---------------------------------------------------------- */

/* 0 when every byte of slice i matches its checksum (checked once). */
static int verify_slice(struct fs_state *s, uint32_t i)
{
    if (__atomic_load_n(&s->verdict[i], __ATOMIC_ACQUIRE) == 1)
        return 0;
    pthread_mutex_lock(&s->slice_lock[i]);
    int v = s->verdict[i];
    if (v == 0) {
        const struct format_slice_info *si = format_reader_slice(s->r, i);
        void *buf = sl_alloc_aligned(si->length, 4096);
        struct sl_err err;
        if (!buf) {
            pthread_mutex_unlock(&s->slice_lock[i]);
            return -ENOMEM;
        }
        /* the read also warms the page cache the served bytes come from */
        int ret = format_reader_read_slice(s->r, i, buf, si->length, &err);
        sl_free_aligned(buf);
        if (ret < 0) {
            syslog(LOG_ERR, "sluice: %s", err.msg);
            fprintf(stderr, "sluice mount: %s\n", err.msg);
            v = -1;
        } else {
            v = 1;
        }
        __atomic_store_n(&s->verdict[i], v, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&s->slice_lock[i]);
    return v == 1 ? 0 : -EIO;
}

/* ---- computed views ---------------------------------------------------------------- */

struct fs_open {
    char *data;    /* computed content (int8, scales, stats); NULL for ranges */
    size_t len;
};

static int compute_view(struct fs_state *s, struct fs_node *n, struct fs_open *fo)
{
    if (n->kind == FS_STATS) {
        fo->data = fs_stats_json(s, &fo->len);
        return fo->data ? 0 : -ENOMEM;
    }
    int ret = verify_slice(s, n->slice);
    if (ret < 0)
        return ret;
    const struct format_tensor_info *t = format_reader_tensor(s->r, (uint32_t)n->tensor);
    void *raw = malloc(t->length);
    int8_t *q = malloc(t->shape[0] * t->shape[1]);
    float *sc = malloc(sizeof(float) * t->shape[0]);
    struct sl_err err;
    if (!raw || !q || !sc) {
        ret = -ENOMEM;
        goto out;
    }
    ret = format_reader_read_tensor(s->r, (uint32_t)n->tensor, raw, t->length, &err);
    if (ret == 0)
        ret = unpack_tensor_int8(t, raw, q, sc, &err);
    if (ret < 0) {
        syslog(LOG_ERR, "sluice: %s: %s", s->container, err.msg);
        ret = -EIO;
        goto out;
    }
    if (n->kind == FS_INT8) {
        fo->data = (char *)q;
        fo->len = t->shape[0] * t->shape[1];
        q = NULL;
    } else {
        fo->data = malloc(4 * t->shape[0]);
        if (!fo->data) {
            ret = -ENOMEM;
            goto out;
        }
        for (uint64_t r = 0; r < t->shape[0]; r++)
            sl_store_lef32(fo->data + 4 * r, sc[r]);
        fo->len = 4 * t->shape[0];
    }
out:
    free(raw);
    free(q);
    free(sc);
    return ret;
}

/* ---- operations ---------------------------------------------------------------------- */

static int fs_do_lookup(struct fs_state *s, fuse_ino_t parent, const char *name,
                        struct fuse_entry_param *e)
{
    struct fs_node *p = node_of(s, parent);
    if (!p)
        return -ENOENT;
    if (p->kind != FS_DIR)
        return -ENOTDIR;
    struct fs_node *n = fs_tree_lookup(s, (uint32_t)(p->ino - 1), name);
    if (!n)
        return -ENOENT;
    memset(e, 0, sizeof *e);
    e->ino = n->ino;
    e->generation = 1;
    e->attr_timeout = n->kind == FS_STATS ? 0 : ATTR_TIMEOUT;
    e->entry_timeout = ATTR_TIMEOUT;
    fill_attr(n, &e->attr);
    if (n->kind == FS_STATS) {
        size_t len;
        char *j = fs_stats_json(s, &len);
        e->attr.st_size = j ? (off_t)len : 0;
        free(j);
    }
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

static int fs_do_getattr(struct fs_state *s, fuse_ino_t ino, struct stat *st)
{
    struct fs_node *n = node_of(s, ino);
    if (!n)
        return -ENOENT;
    fill_attr(n, st);
    if (n->kind == FS_STATS) {
        size_t len;
        char *j = fs_stats_json(s, &len);
        st->st_size = j ? (off_t)len : 0;
        free(j);
    }
    return 0;
}

static void fs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    struct stat st;
    int ret = fs_do_getattr(state_of(req), ino, &st);
    struct fs_node *n = node_of(state_of(req), ino);
    if (ret < 0)
        fuse_reply_err(req, -ret);
    else
        fuse_reply_attr(req, &st, n && n->kind == FS_STATS ? 0 : ATTR_TIMEOUT);
}

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
    if (n->kind == FS_RANGE) {
        fi->keep_cache = !s->opts.no_keep_cache;
        fi->direct_io = s->opts.direct_io;
        return 0;
    }
    if (n->kind == FS_GEN) {
        fi->keep_cache = 1;
        return 0;
    }
    struct fs_open *fo = calloc(1, sizeof *fo);
    if (!fo)
        return -ENOMEM;
    int ret = compute_view(s, n, fo);
    if (ret < 0) {
        free(fo);
        return ret;
    }
    fi->fh = (uint64_t)(uintptr_t)fo;
    fi->direct_io = n->kind == FS_STATS; /* its size changes between opens */
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

static void fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    struct fs_state *s = state_of(req);
    struct fs_node *n = node_of(s, ino);
    int ret = 0;
    if (!n || n->kind == FS_DIR) {
        fuse_reply_err(req, n ? EISDIR : ENOENT);
        return;
    }
    uint64_t total = n->size;
    const char *mem = NULL;
    if (fi->fh) {
        struct fs_open *fo = (struct fs_open *)(uintptr_t)fi->fh;
        mem = fo->data;
        total = fo->len;
    } else if (n->kind == FS_GEN) {
        mem = n->data;
    }
    if (off < 0 || (uint64_t)off >= total) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    if ((uint64_t)off + size > total)
        size = (size_t)(total - (uint64_t)off);
    atomic_fetch_add(&n->bytes_served, size);
    atomic_fetch_add(&n->reads_served, 1);
    if (mem) {
        fuse_reply_buf(req, mem + off, size);
        return;
    }
    ret = verify_slice(s, n->slice);
    if (ret < 0) {
        fuse_reply_err(req, -ret);
        return;
    }
    struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
    bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK | FUSE_BUF_FD_RETRY;
    bv.buf[0].fd = s->fd;
    bv.buf[0].pos = (off_t)(n->off + (uint64_t)off);
    fuse_reply_data(req, &bv, s->opts.no_splice ? FUSE_BUF_NO_SPLICE : FUSE_BUF_SPLICE_MOVE);
}

static void fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    if (fi->fh) {
        struct fs_open *fo = (struct fs_open *)(uintptr_t)fi->fh;
        free(fo->data);
        free(fo);
    }
    fuse_reply_err(req, 0);
}

static void fs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs_node *n = node_of(state_of(req), ino);
    if (!n)
        fuse_reply_err(req, ENOENT);
    else if (n->kind != FS_DIR)
        fuse_reply_err(req, ENOTDIR);
    else
        fuse_reply_open(req, fi);
}

static void fs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    (void)fi;
    struct fs_state *s = state_of(req);
    struct fs_node *d = node_of(s, ino);
    if (!d || d->kind != FS_DIR) {
        fuse_reply_err(req, d ? ENOTDIR : ENOENT);
        return;
    }
    char *buf = malloc(size);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    size_t used = 0;
    off_t idx = 0;
    struct stat st;
    /* entries: ".", "..", then the children; the offset is the entry index + 1 */
    for (int pass = 0;; pass++) {
        const char *name;
        struct fs_node *n;
        if (pass == 0) {
            name = ".", n = d;
        } else if (pass == 1) {
            name = "..", n = &s->nodes[d->parent];
        } else {
            uint32_t c = d->first_child;
            for (int k = 2; c && k < pass; k++)
                c = s->nodes[c - 1].next_sibling;
            if (!c)
                break;
            n = &s->nodes[c - 1];
            name = n->name;
        }
        idx = pass + 1;
        if (idx <= off)
            continue;
        fill_attr(n, &st);
        size_t need = fuse_add_direntry(req, buf + used, size - used, name, &st, idx);
        if (need > size - used)
            break;
        used += need;
    }
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

/* Everything that would change the tree: a read-only file system. */
static void erofs(fuse_req_t req)
{
    fuse_reply_err(req, EROFS);
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

static void fs_init(void *userdata, struct fuse_conn_info *conn)
{
    struct fs_state *s = userdata;
    /* large sequential reads: many requests in flight (the default 12 throttles
     * parallel streams), 1 MiB requests (max_pages follows max_write), big
     * readahead, and splicing straight from the container's descriptor */
    conn->max_background = s->opts.max_background ? s->opts.max_background : 128;
    conn->congestion_threshold = conn->max_background * 3 / 4;
    conn->max_readahead = s->opts.max_readahead ? s->opts.max_readahead : (1u << 20);
    conn->max_write = 1u << 20;
    conn->max_read = 1u << 20; /* must equal the max_read mount option */
    if (!s->opts.no_splice) {
        if (conn->capable & FUSE_CAP_SPLICE_WRITE)
            conn->want |= FUSE_CAP_SPLICE_WRITE;
        if (conn->capable & FUSE_CAP_SPLICE_MOVE)
            conn->want |= FUSE_CAP_SPLICE_MOVE;
    }
    if (conn->capable & FUSE_CAP_ASYNC_READ)
        conn->want |= FUSE_CAP_ASYNC_READ;
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
};

/* ---- mounting ------------------------------------------------------------------------- */

static int is_mountpoint(const char *real)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f)
        return 0;
    char line[8192];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        char mp[4096];
        /* id parent maj:min root mountpoint ... */
        if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) == 1 && !strcmp(mp, real))
            found = 1;
    }
    fclose(f);
    return found;
}

static int check_mountpoint(const struct fs_options *o, char *real, struct sl_err *err)
{
    struct stat st;
    if (stat(o->mountpoint, &st) < 0) {
        int e = errno;
        sl_err_set(err, "mount point %s: %s", o->mountpoint,
                   e == ENOENT ? "does not exist" : strerror(e));
        return -e;
    }
    if (!S_ISDIR(st.st_mode)) {
        sl_err_set(err, "mount point %s is not a directory", o->mountpoint);
        return -ENOTDIR;
    }
    if (!realpath(o->mountpoint, real)) {
        int e = errno;
        sl_err_set(err, "mount point %s: %s", o->mountpoint, strerror(e));
        return -e;
    }
    if (is_mountpoint(real)) {
        sl_err_set(err, "%s is already a mount point", real);
        return -EBUSY;
    }
    if (!o->allow_nonempty) {
        DIR *d = opendir(real);
        if (!d) {
            int e = errno;
            sl_err_set(err, "mount point %s: %s", real, strerror(e));
            return -e;
        }
        struct dirent *de;
        int nonempty = 0;
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
                nonempty = 1;
        closedir(d);
        if (nonempty) {
            sl_err_set(err, "mount point %s is not empty (use -o nonempty to mount over it)", real);
            return -ENOTEMPTY;
        }
    }
    /* existence only: ordinary users mount through fusermount3, which opens
     * /dev/fuse with its own privileges */
    if (stat("/dev/fuse", &st) < 0 || !S_ISCHR(st.st_mode)) {
        sl_err_set(err, "/dev/fuse is not available: load the fuse module or run in a "
                        "container with /dev/fuse");
        return -ENODEV;
    }
    return 0;
}

int fs_mount_run(const struct fs_options *o, struct sl_err *err)
{
    struct fs_state *s = calloc(1, sizeof *s);
    if (!s) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    s->opts = *o;
    s->fd = -1;
    s->mount_ns = sl_now_ns();
    char mnt[PATH_MAX];
    struct fuse_session *se = NULL;
    char *argv[8];
    int argc = 0;
    char optbuf[1024];
    int ret = check_mountpoint(o, mnt, err);
    if (ret < 0)
        goto out;
    if (!realpath(o->container, s->container)) {
        ret = -errno;
        sl_err_set(err, "%s: %s", o->container, ret == -ENOENT ? "no such file" : strerror(-ret));
        goto out;
    }
    ret = format_reader_open(s->container, &s->r, err);
    if (ret < 0)
        goto out;
    s->fd = open(s->container, O_RDONLY | O_CLOEXEC);
    uint32_t ns = format_reader_n_slices(s->r);
    s->verdict = calloc(ns, sizeof *s->verdict);
    s->slice_lock = calloc(ns, sizeof *s->slice_lock);
    if (s->fd < 0 || !s->verdict || !s->slice_lock) {
        ret = -ENOMEM;
        sl_err_set(err, "%s: cannot open or out of memory", s->container);
        goto out;
    }
    for (uint32_t i = 0; i < ns; i++)
        pthread_mutex_init(&s->slice_lock[i], NULL);
    ret = fs_tree_build(s, err);
    if (ret < 0)
        goto out;

    snprintf(optbuf, sizeof optbuf, "ro,fsname=sluice:%s,subtype=sluice,max_read=1048576%s%s",
             s->container, o->fuse_opts ? "," : "", o->fuse_opts ? o->fuse_opts : "");
    argv[argc++] = "sluice";
    argv[argc++] = "-o";
    argv[argc++] = optbuf;
    argv[argc] = NULL;
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    se = fuse_session_new(&args, &ops, sizeof ops, s);
    if (!se) {
        ret = -EINVAL;
        sl_err_set(err, "cannot create the FUSE session (bad -o options?)");
        goto out;
    }
    if (fuse_session_mount(se, mnt) != 0) {
        ret = -EPERM;
        sl_err_set(err, "mounting %s on %s failed (permissions? fusermount3 missing?)",
                   s->container, mnt);
        fuse_session_destroy(se);
        se = NULL;
        goto out;
    }
    if (fuse_set_signal_handlers(se) != 0) {
        ret = -EIO;
        sl_err_set(err, "cannot install signal handlers");
        goto unmount;
    }
    if (!o->foreground && fuse_daemonize(0) != 0) {
        ret = -EIO;
        sl_err_set(err, "cannot daemonize");
        goto unmount;
    }
    s->mount_ns = sl_now_ns();
    if (o->single_thread) {
        ret = fuse_session_loop(se);
    } else {
        struct fuse_loop_config cfg = {.clone_fd = 1, .max_idle_threads = 16};
        ret = fuse_session_loop_mt(se, &cfg);
    }
    if (ret < 0)
        sl_err_set(err, "the FUSE loop failed: %s", strerror(-ret));
    else
        ret = 0;
    fuse_remove_signal_handlers(se);
unmount:
    fuse_session_unmount(se);
    fuse_session_destroy(se);
out:
    if (s->slice_lock)
        for (uint32_t i = 0; s->r && i < format_reader_n_slices(s->r); i++)
            pthread_mutex_destroy(&s->slice_lock[i]);
    free(s->slice_lock);
    free(s->verdict);
    fs_tree_free(s);
    if (s->fd >= 0)
        close(s->fd);
    format_reader_close(s->r);
    free(s);
    return ret;
}

/* The daemon's pid, from stats.json. */
static pid_t daemon_pid(const char *mnt)
{
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/stats.json", mnt);
    FILE *f = fopen(p, "r");
    if (!f)
        return 0;
    char buf[256];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *q = strstr(buf, "\"pid\":");
    return q ? (pid_t)strtol(q + 6, NULL, 10) : 0;
}

int fs_unmount(const char *mountpoint, int lazy, struct sl_err *err)
{
    char real[PATH_MAX];
    if (!realpath(mountpoint, real)) {
        int e = errno;
        sl_err_set(err, "%s: %s", mountpoint, strerror(e));
        return -e;
    }
    if (!is_mountpoint(real)) {
        sl_err_set(err, "%s is not mounted", real);
        return -EINVAL;
    }
    pid_t pid = daemon_pid(real);
    pid_t c = fork();
    if (c < 0) {
        sl_err_set(err, "cannot fork: %s", strerror(errno));
        return -EAGAIN;
    }
    if (c == 0) {
        if (lazy)
            execlp("fusermount3", "fusermount3", "-u", "-z", real, (char *)NULL);
        else
            execlp("fusermount3", "fusermount3", "-u", real, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(c, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        sl_err_set(err, "unmounting %s failed%s", real,
                   WIFEXITED(st) && WEXITSTATUS(st) == 127 ? " (fusermount3 not found)"
                                                           : " (busy? files open: use --lazy)");
        return -EBUSY;
    }
    /* wait for the daemon to finish (it exits when the connection closes) */
    for (int i = 0; pid > 0 && i < 1000; i++) {
        if (kill(pid, 0) < 0 && errno == ESRCH)
            return 0;
        usleep(10000);
    }
    if (pid > 0 && !lazy) {
        sl_err_set(err, "%s unmounted, but daemon %d did not exit within 10 s", real, (int)pid);
        return -ETIMEDOUT;
    }
    return 0;
}
