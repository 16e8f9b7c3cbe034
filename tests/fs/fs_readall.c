/* fs_readall.c: reads files (or byte ranges of them) one after the other in
 * one process and prints the throughput, for fs_bench.sh: the same reader
 * for the raw container and for the mount.
 *
 *   fs_readall [-d] [-b BYTES] [-t THREADS] PATH[@OFFSET+LENGTH]...
 *     -d          O_DIRECT (buffers and sizes 4 KiB aligned)
 *     -b BYTES    read size (default 1 MiB)
 *     -t THREADS  parallel streams: each thread takes the next file in order
 *                 and reads it whole (default 1)
 * Prints "<bytes> <seconds> <MB/s>". Exit 1 on any error or short file. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int direct;
static size_t bs = 1 << 20;
static char **files;
static int n_files;
static atomic_int next_file;
static atomic_ullong total;
static atomic_int failed;

static void *stream(void *arg)
{
    (void)arg;
    /* in 2 MiB pages where possible, as the daemon's slice buffers are (fewer,
     * larger DMA segments: the same for both sides of a comparison) */
    size_t cap = (bs + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    uint8_t *map = mmap(NULL, cap + (2u << 20), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
        failed = 1;
        return NULL;
    }
    uint8_t *buf = (uint8_t *)(((uintptr_t)map + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1));
    madvise(buf, cap, MADV_HUGEPAGE);
    for (int i; !failed && (i = atomic_fetch_add(&next_file, 1)) < n_files;) {
        char path[4096];
        unsigned long long off = 0, len = ~0ull;
        snprintf(path, sizeof path, "%s", files[i]);
        char *at = strrchr(path, '@');
        if (at) {
            *at = 0;
            if (sscanf(at + 1, "%llu+%llu", &off, &len) != 2) {
                fprintf(stderr, "fs_readall: bad range in %s\n", files[i]);
                failed = 1;
                break;
            }
        }
        int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
        if (fd < 0) {
            fprintf(stderr, "fs_readall: %s: %s\n", path, strerror(errno));
            failed = 1;
            break;
        }
        unsigned long long done = 0;
        while (done < len) {
            size_t want = len - done < bs ? (size_t)(len - done) : bs;
            ssize_t k = pread(fd, buf, want, (off_t)(off + done));
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0) {
                fprintf(stderr, "fs_readall: %s: %s\n", path, strerror(errno));
                failed = 1;
                break;
            }
            if (k == 0)
                break;
            done += (unsigned long long)k;
        }
        if (len != ~0ull && done != len && !failed) {
            fprintf(stderr, "fs_readall: %s: short (%llu of %llu)\n", path, done, len);
            failed = 1;
        }
        total += done;
        close(fd);
    }
    munmap(map, cap + (2u << 20));
    return NULL;
}

int main(int argc, char **argv)
{
    int opt, threads = 1;
    while ((opt = getopt(argc, argv, "db:t:")) != -1) {
        if (opt == 'd') {
            direct = 1;
        } else if (opt == 'b') {
            bs = strtoull(optarg, NULL, 0);
        } else if (opt == 't') {
            threads = atoi(optarg);
        } else {
            fprintf(stderr, "usage: fs_readall [-d] [-b BYTES] [-t THREADS] PATH[@OFFSET+LENGTH]...\n");
            return 2;
        }
    }
    if (!bs || bs % 4096 || threads < 1 || threads > 64) {
        fprintf(stderr, "fs_readall: the read size must be a multiple of 4096, threads 1..64\n");
        return 2;
    }
    files = argv + optind;
    n_files = argc - optind;
    pthread_t th[64];
    double t0 = now();
    for (int i = 0; i < threads; i++)
        if (pthread_create(&th[i], NULL, stream, NULL))
            return 1;
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    double t = now() - t0;
    if (failed)
        return 1;
    printf("%llu %.6f %.1f\n", (unsigned long long)total, t, (double)total / t / 1e6);
    return 0;
}
