/* loader_ring.c: the ring's memory. Mapped, not allocated with malloc, so no
 * page is touched (zero-filled, or pinned for io_uring) before the reading
 * first reaches it: on the machines measured here first-touching a page costs
 * about 0.6 us per KiB, 150 ms for 256 MiB, which must not stand in front of
 * the first read. The mirror mapping lets a slice wrap around the end of the
 * ring and still be one contiguous buffer. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loader_internal.h"

int loader_ring_init(struct loader_ring *r, uint64_t bytes, int want_mirror)
{
    memset(r, 0, sizeof *r);
    if (bytes == 0 || bytes % LOADER_ALIGN || bytes > (SIZE_MAX >> 2))
        return -EINVAL;
    if (!want_mirror) {
        void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return -ENOMEM;
        r->base = p;
        r->bytes = bytes;
        r->map_bytes = (size_t)bytes;
        return 0;
    }
    int fd = memfd_create("sluice-loader-ring", MFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    int ret = 0;
    uint8_t *base = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) < 0) {
        ret = -errno;
        goto out;
    }
    /* reserve twice the size, then map the file over both halves */
    base = mmap(NULL, 2 * (size_t)bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        ret = -ENOMEM;
        goto out;
    }
    for (int half = 0; half < 2; half++) {
        void *p = mmap(base + (size_t)half * bytes, (size_t)bytes, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_FIXED, fd, 0);
        if (p == MAP_FAILED) {
            ret = -errno;
            munmap(base, 2 * (size_t)bytes);
            goto out;
        }
    }
    r->base = base;
    r->bytes = bytes;
    r->map_bytes = 2 * (size_t)bytes;
    r->mirror = 1;
out:
    close(fd); /* the mappings keep the memory */
    return ret;
}

void loader_ring_fini(struct loader_ring *r)
{
    if (r->base)
        munmap(r->base, r->map_bytes);
    memset(r, 0, sizeof *r);
}
