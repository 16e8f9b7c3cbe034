/* loader_requests.c: request lists for a container's slices, read from the
 * container file or from a mounted slice tree (fs.h's layout). */
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

int loader_requests_from_container(const struct format_reader *r, const char *path,
                                   struct loader_request **reqs, uint32_t *n,
                                   struct sl_err *err)
{
    uint32_t ns = format_reader_n_slices(r);
    struct loader_request *q = sl_calloc(ns ? ns : 1, sizeof *q);
    if (!q) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < ns; i++) {
        const struct format_slice_info *si = format_reader_slice(r, i);
        q[i] = (struct loader_request){.path = path ? path : format_reader_path(r), .fd = -1,
                                       .offset = si->offset, .length = si->length, .tag = i};
    }
    *reqs = q;
    *n = ns;
    return 0;
}

int loader_requests_from_mount(const struct format_reader *r, const char *dir,
                               struct loader_request **reqs, uint32_t *n,
                               struct sl_err *err)
{
    uint32_t ns = format_reader_n_slices(r);
    size_t plen = strlen(dir) + sizeof "/layer.2147483647/slice.bin";
    struct loader_request *q = sl_calloc(1, (ns ? ns : 1) * (sizeof *q + plen));
    if (!q) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    char *paths = (char *)(q + (ns ? ns : 1));
    for (uint32_t i = 0; i < ns; i++) {
        const struct format_slice_info *si = format_reader_slice(r, i);
        char *p = paths + (size_t)i * plen;
        /* the layout of fs.h: one directory per slice holding slice.bin */
        if (si->kind == FORMAT_SLICE_LAYER)
            snprintf(p, plen, "%s/layer.%03d/slice.bin", dir, si->layer);
        else
            snprintf(p, plen, "%s/%s/slice.bin", dir,
                     si->kind == FORMAT_SLICE_EMBED ? "embed" : "head");
        q[i] = (struct loader_request){.path = p, .fd = -1, .offset = 0, .length = si->length,
                                       .tag = i};
    }
    *reqs = q;
    *n = ns;
    return 0;
}
