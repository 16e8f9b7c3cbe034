/* fuzz_corpus.c: replays a libFuzzer corpus (a file or a folder of files) through
 * the target linked beside it. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_corpus.h"
#include "testutil.h"

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

long fuzz_replay_path(const char *path, void (*keep)(void *ctx, const uint8_t *data, size_t size),
                      void *ctx)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return errno == ENOENT ? 0 : -1;
    if (S_ISDIR(st.st_mode)) {
        struct dirent **ents;
        int n = scandir(path, &ents, NULL, by_name);
        if (n < 0) {
            fprintf(stderr, "fuzz replay: cannot list %s\n", path);
            return -1;
        }
        long total = 0;
        for (int i = 0; i < n; i++) {
            char sub[4096];
            if (total >= 0 && ents[i]->d_name[0] != '.') {
                snprintf(sub, sizeof sub, "%s/%s", path, ents[i]->d_name);
                long k = fuzz_replay_path(sub, keep, ctx);
                total = k < 0 ? -1 : total + k;
            }
            free(ents[i]);
        }
        free(ents);
        return total;
    }
    if (!S_ISREG(st.st_mode))
        return 0;
    size_t len;
    uint8_t *b = test_read_file(path, &len);
    if (!b) {
        fprintf(stderr, "fuzz replay: cannot read %s\n", path);
        return -1;
    }
    LLVMFuzzerTestOneInput(b, len);
    if (keep)
        keep(ctx, b, len);
    free(b);
    return 1;
}
