/* fuzz_import.c: libFuzzer target for the importers. The first input byte
 * picks which file of a small valid model the rest of the input replaces:
 *   0 a GGUF file, 1 a llama2.c checkpoint (valid tokenizer beside it),
 *   2 a llama2.c tokenizer (valid checkpoint), 3 model.safetensors (valid
 *   config.json), 4 config.json (valid model.safetensors);
 * import_model must then either fail with a message or write a container
 * that opens, never crash, hang or leak. Built with -DSLUICE_FUZZ=ON (clang);
 * replayed in ctest by fuzz_import_driver.c. Compiled with -DFUZZ_IMPORT_KIND=k
 * (tests/fuzz: fuzz_gguf, fuzz_llama2c, ...) the whole input is that one file
 * and fuzz_replay.c replays it, seeded with the reference file. Work files live in a private
 * directory (on /dev/shm when there is one: successful imports fsync). */
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_import.h"
#ifdef FUZZ_IMPORT_KIND
#include "fuzz_corpus.h"
#endif
#include "gen_models.h"
#include "import.h"

static char work[256];

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

static void cleanup(void)
{
    if (work[0])
        nftw(work, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *wpath(const char *name)
{
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", work, name);
    return p;
}

int fuzz_import_setup(void)
{
    if (work[0])
        return 0;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(work, sizeof work, "%s/sluice-fuzz-import-XXXXXX", base);
    if (!mkdtemp(work)) {
        work[0] = 0;
        return -1;
    }
    atexit(cleanup);
    struct gen_model m;
    if (gen_model_create(&m, 0, 42))
        return -1;
    char d[512];
    snprintf(d, sizeof d, "%s/ref", work);
    struct gen_st_opts so = {.dtype = GEN_BF16};
    struct gen_gguf_opts go = {.weights = GEN_Q8_0};
    int ret = mkdir(d, 0755) || gen_write_llama2c(&m, wpath("ref.bin"), wpath("ref.tok")) ||
              gen_write_safetensors(&m, d, &so) || gen_write_gguf(&m, wpath("ref.gguf"), &go) ||
              mkdir(wpath("st"), 0755);
    gen_model_destroy(&m);
    return ret ? -1 : 0;
}

const char *fuzz_import_seed_path(int kind)
{
    static const char *const names[FUZZ_IMPORT_KINDS] = {
        "ref.gguf", "ref.bin", "ref.tok", "ref/model.safetensors", "ref/config.json"};
    return kind >= 0 && kind < FUZZ_IMPORT_KINDS ? wpath(names[kind]) : NULL;
}

static int put(const char *path, const uint8_t *data, size_t size)
{
    unlink(path); /* replaces a symlink too */
    return gen_write_file(path, data, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
#ifdef FUZZ_IMPORT_KIND
    int kind = FUZZ_IMPORT_KIND;
    if (fuzz_import_setup() < 0)
        return 0;
#else
    if (size < 1 || fuzz_import_setup() < 0)
        return 0;
    int kind = data[0] % FUZZ_IMPORT_KINDS;
    data++, size--;
#endif
    const char *src, *tok = NULL;
    char cfg[512], st[512];
    snprintf(cfg, sizeof cfg, "%s/st/config.json", work);
    snprintf(st, sizeof st, "%s/st/model.safetensors", work);
    switch (kind) {
    case 0:
        src = wpath("in.gguf");
        if (put(src, data, size))
            return 0;
        break;
    case 1:
        src = wpath("in.bin");
        tok = wpath("ref.tok");
        if (put(src, data, size))
            return 0;
        break;
    case 2:
        src = wpath("ref.bin");
        tok = wpath("in.tok");
        if (put(tok, data, size))
            return 0;
        break;
    default:
        src = wpath("st");
        tok = wpath("ref.tok");
        unlink(cfg);
        unlink(st);
        if (kind == 3 ? put(st, data, size) || symlink(wpath("ref/config.json"), cfg)
                      : put(cfg, data, size) || symlink(wpath("ref/model.safetensors"), st))
            return 0;
        break;
    }
    const char *out = wpath("out.sluice");
    struct import_opts o = {.tokenizer = tok, .dtype = -1};
    struct sl_err err = {{0}};
    int ret = import_model(src, &o, out, &err);
    if (ret == 0) {
        struct format_reader *r;
        if (format_reader_open(out, &r, &err) < 0) {
            fprintf(stderr,
                    "fuzz_import: an import succeeded but its container does not open: "
                    "%s\n",
                    err.msg);
            abort();
        }
        format_reader_close(r);
        unlink(out);
    } else if (!err.msg[0]) {
        fprintf(stderr, "fuzz_import: an import failed (%d) without a message (kind %d)\n", ret,
                kind);
        abort();
    }
    return 0;
}

#ifdef FUZZ_IMPORT_KIND
/* The seed: the reference model's file of this kind. */
int fuzz_target_seeds(void (*add)(void *ctx, const uint8_t *data, size_t size), void *ctx)
{
    if (fuzz_import_setup() < 0)
        return -1;
    FILE *f = fopen(fuzz_import_seed_path(FUZZ_IMPORT_KIND), "rb");
    if (!f)
        return -1;
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    int bad = ferror(f) || !feof(f);
    fclose(f);
    if (bad)
        return -1;
    add(ctx, buf, n);
    return 0;
}
#endif
