/* testutil.c: see testutil.h. */
#include "testutil.h"

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void test_skip_all(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "SKIP: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(TEST_SKIP_CODE);
}

const char *test_shared_dir(void)
{
    static char dir[PATH_MAX];
    const char *env = getenv("SLUICE_SHARED");
    const char *cands[3] = {env, "../shared", "../../shared"};
    for (int i = 0; i < 3; i++) {
        struct stat st;
        if (!cands[i] || !*cands[i])
            continue;
        char probe[PATH_MAX];
        snprintf(probe, sizeof probe, "%s/models", cands[i]);
        if (stat(probe, &st) == 0 && S_ISDIR(st.st_mode)) {
            if (!realpath(cands[i], dir))
                snprintf(dir, sizeof dir, "%s", cands[i]);
            return dir;
        }
    }
    return NULL;
}

const char *test_shared_path(const char *rel)
{
    static char path[PATH_MAX];
    const char *dir = test_shared_dir();
    if (!dir) {
        fprintf(stderr, "note: ../shared not found (set SLUICE_SHARED): cannot use %s\n", rel);
        return NULL;
    }
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "note: %s is not readable: %s\n", path, strerror(errno));
        return NULL;
    }
    return path;
}

const char *test_sluice_bin(void)
{
    const char *b = getenv("SLUICE_BIN");
    if (b && access(b, X_OK) == 0)
        return b;
    return NULL;
}

static char tmpdirs[16][PATH_MAX];
static int n_tmpdirs;

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    if (remove(path) != 0)
        fprintf(stderr, "note: could not remove %s: %s\n", path, strerror(errno));
    return 0;
}

static void rm_tmpdirs(void)
{
    for (int i = 0; i < n_tmpdirs; i++)
        nftw(tmpdirs[i], rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *test_tmpdir(void)
{
    if (n_tmpdirs >= 16)
        return NULL;
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    char *d = tmpdirs[n_tmpdirs];
    snprintf(d, PATH_MAX, "%s/sluice-test.XXXXXX", base);
    if (!mkdtemp(d))
        return NULL;
    if (n_tmpdirs++ == 0)
        atexit(rm_tmpdirs);
    return d;
}

const char *test_tmp_path(const char *name)
{
    static const char *dir;
    static char buf[64][4096];
    static int k;
    if (!dir)
        dir = test_tmpdir();
    char *p = buf[k++ % 64];
    snprintf(p, 4096, "%s/%s", dir, name);
    return p;
}

uint64_t test_seed(void)
{
    static uint64_t seed;
    static int done;
    if (!done) {
        const char *env = getenv("SLUICE_TEST_SEED");
        if (env && *env) {
            seed = strtoull(env, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid();
        }
        fprintf(stderr, "random seed: SLUICE_TEST_SEED=%llu\n", (unsigned long long)seed);
        done = 1;
    }
    return seed;
}

void test_rng_init(struct test_rng *r, uint64_t seed)
{
    r->s = seed ^ 0x9e3779b97f4a7c15ull;
}

uint64_t test_rng_u64(struct test_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint32_t test_rng_below(struct test_rng *r, uint32_t n)
{
    return n ? (uint32_t)((test_rng_u64(r) >> 32) * (uint64_t)n >> 32) : 0;
}

float test_rng_float(struct test_rng *r)
{
    return (float)(test_rng_u64(r) >> 40) / 16777216.0f;
}

float test_rng_normal(struct test_rng *r)
{
    float u1 = test_rng_float(r), u2 = test_rng_float(r);
    if (u1 < 1e-7f)
        u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

int test_fuzz_replay_files(int argc, char **argv, int (*one)(const uint8_t *, size_t),
                           long *mutations)
{
    int first = 1;
    if (argc > 2 && !strcmp(argv[1], "--mutations")) {
        *mutations = strtol(argv[2], NULL, 10);
        first = 3;
    }
    for (int i = first; i < argc; i++) {
        size_t n;
        uint8_t *b = test_read_file(argv[i], &n);
        if (!b) {
            fprintf(stderr, "cannot read %s\n", argv[i]);
            return -1;
        }
        one(b, n);
        free(b);
    }
    return 0;
}

void *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    rewind(f);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[n] = 0;
    fclose(f);
    if (len)
        *len = (size_t)n;
    return buf;
}

int test_read_ints(const char *path, int *ids, int max)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int n = 0;
    while (n < max && fscanf(f, "%d", &ids[n]) == 1)
        n++;
    fclose(f);
    return n;
}

int test_system(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof cmd) {
        fprintf(stderr, "test_system: the command does not fit in %zu bytes\n", sizeof cmd);
        return -1;
    }
    int st = system(cmd);
    if (st == -1)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
