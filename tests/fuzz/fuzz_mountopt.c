/* fuzz_mountopt.c: libFuzzer target for `sluice mount -o LIST`: the input is
 * the option string, split at commas as the command splits it, each word
 * through fs_options_parse. A word must be taken (1), passed on to libfuse
 * (0) or refused with a message (-EINVAL); what is taken stays in the ranges
 * fs.h states. Replayed in ctest by fuzz_replay.c. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs.h"
#include "fuzz_corpus.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0; /* the command line's limits are the kernel's, not ours */
    char *list = malloc(size + 1);
    if (!list)
        return 0;
    memcpy(list, data, size);
    list[size] = 0;
    struct fs_options o;
    fs_options_init(&o);
    char *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        struct sl_err err = {{0}};
        int k = fs_options_parse(&o, t, &err);
        if (k != 0 && k != 1 && !(k == -EINVAL && err.msg[0])) {
            fprintf(stderr, "fuzz_mountopt: '%s' gave %d (%s)\n", t, k, err.msg);
            abort();
        }
    }
    if (o.max_background < 1 || o.max_background > 65535 || o.max_pages < 1 || o.max_pages > 256 ||
        o.max_threads < 1 || o.max_threads > 1024 || o.max_readahead > (1u << 30) ||
        o.cache_mb > (1u << 20) || o.prefetch > 64) {
        fprintf(stderr, "fuzz_mountopt: an option outside its range was taken\n");
        abort();
    }
    free(list);
    return 0;
}

int fuzz_target_seeds(void (*add)(void *ctx, const uint8_t *data, size_t size), void *ctx)
{
    static const char *const seeds[] = {
        "max_background=128,max_pages=256,max_readahead=4194304",
        "nosplice,pagecache,cache_mb=64,prefetch=2,single",
        "clone_fd,noclone_fd,direct_io,nodirect_io,keep_cache,no_keep_cache",
        "max_threads=4,store_direct,nostore_direct,nonempty,splice",
        "cgroup=/sys/fs/cgroup/x,log=/tmp/l,allow_other,ro",
        "max_pages=0,max_pages=257,max_background=,prefetch=65,cache_mb=-1",
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++)
        add(ctx, (const uint8_t *)seeds[i], strlen(seeds[i]));
    return 0;
}
