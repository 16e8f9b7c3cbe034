/* fs_gguf.c: model.gguf, the GGUF view (gguf.h) over the slice store: the
 * view asks for slices, the store hands out verified bytes (pinned), and a
 * conversion over a page-cache slice runs under the SIGBUS guard. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fs_internal.h"

static int src_acquire(void *ctx, uint32_t slice, const uint8_t **data, void **token,
                       struct sl_err *err)
{
    struct fs_state *s = ctx;
    struct fs_pin *pin = malloc(sizeof *pin);
    if (!pin) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    int ret = fs_slice_acquire(s, slice, pin);
    if (ret < 0) {
        free(pin);
        sl_err_set(err, "slice %u is unreadable or failed its checksum", slice);
        return ret;
    }
    *data = pin->data;
    *token = pin;
    return 0;
}

static void src_release(void *ctx, uint32_t slice, void *token)
{
    (void)slice;
    struct fs_pin *pin = token;
    fs_slice_release(ctx, pin);
    free(pin);
}

static int src_guard(void *ctx, int (*fn)(void *), void *arg)
{
    (void)ctx;
    return fs_guarded(fn, arg);
}

int fs_gguf_create(struct fs_state *s, struct sl_err *err)
{
    struct gguf_view_opts o;
    gguf_view_opts_init(&o);
    o.qtype = s->opts.gguf_qtype;
    o.cache_bytes = s->opts.gguf_cache;
    int ret = gguf_view_create(s->r, &o, &s->gguf, err);
    if (ret < 0)
        return ret;
    s->gguf_src = (struct gguf_source){s, src_acquire, src_release, src_guard};
    return 0;
}

ssize_t fs_gguf_read(struct fs_state *s, char *buf, size_t size, uint64_t off)
{
    struct sl_err err = {{0}};
    ssize_t k = gguf_view_read(s->gguf, &s->gguf_src, buf, size, off, &err);
    if (k < 0 && atomic_fetch_add(&s->gguf_logged, 1) < 10)
        fs_log(s, "%s: model.gguf [%llu, +%zu): %s", s->container, (unsigned long long)off, size,
               err.msg[0] ? err.msg : strerror((int)-k));
    return k;
}
