/* test_bounded_alloc.c: issue 21, "a header must not be able to make Sluice
 * allocate terabytes". Every file of the committed corpus goes through its
 * reader (the importers through tests/import/fuzz_import.c's harness, the
 * containers through format_reader_open and a read of every slice) while
 * malloc, calloc and realloc are wrapped (-Wl,--wrap) to record the largest
 * single request. The corpus holds headers whose counts and sizes ask for
 * gigabytes (GGUF tensor counts of 2^20 and 2^64-1, a 2^24-token vocabulary
 * with no bytes behind it, shapes of 2^32 x 2^32, llama2.c dimensions of
 * 2^31-1, ...); no request may exceed 16 MB, when the largest input is a
 * few hundred kilobytes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format.h"
#include "fuzz_import.h"
#include "testutil.h"

#define LIMIT (16u << 20)

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);

static size_t largest;

static void note(size_t n)
{
    if (n > largest)
        largest = n;
}

void *__wrap_malloc(size_t n)
{
    note(n);
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    note(size && n > SIZE_MAX / size ? SIZE_MAX : n * size);
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    note(n);
    return __real_realloc(p, n);
}

static const char *corpus(const char *target)
{
    static char p[4096];
    const char *src = getenv("SLUICE_SOURCE_DIR");
    snprintf(p, sizeof p, "%s/tests/fuzz/corpus/%s", src ? src : "../..", target);
    return p;
}

/* Calls fn on every file of the target's corpus; returns how many. */
static int each_file(const char *target, void (*fn)(const char *path, const char *name))
{
    DIR *d = opendir(corpus(target));
    if (!d)
        fail_msg("cannot open %s (SLUICE_SOURCE_DIR?)", corpus(target));
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", corpus(target), e->d_name);
        fn(p, e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

static int kind;

static void import_one(const char *path, const char *name)
{
    size_t len;
    uint8_t *b = test_read_file(path, &len);
    assert_non_null(b);
    uint8_t *in = malloc(len + 1);
    assert_non_null(in);
    in[0] = (uint8_t)kind;
    memcpy(in + 1, b, len);
    largest = 0;
    LLVMFuzzerTestOneInput(in, len + 1);
    if (largest > LIMIT)
        fail_msg("%s (%zu bytes): one allocation of %zu bytes", name, len, largest);
    free(in);
    free(b);
}

static void test_importers(void **state)
{
    (void)state;
    static const char *const targets[FUZZ_IMPORT_KINDS] = {
        "fuzz_gguf", "fuzz_llama2c", "fuzz_tokenizer", "fuzz_safetensors", "fuzz_hfconfig"};
    assert_int_equal(fuzz_import_setup(), 0);
    for (kind = 0; kind < FUZZ_IMPORT_KINDS; kind++)
        assert_true(each_file(targets[kind], import_one) > 0);
}

static void open_one(const char *path, const char *name)
{
    largest = 0;
    struct format_reader *r;
    struct sl_err err;
    if (format_reader_open(path, &r, &err) == 0) {
        for (uint32_t i = 0; i < format_reader_n_slices(r); i++) {
            const struct format_slice_info *s = format_reader_slice(r, i);
            void *buf = malloc(s->length);
            assert_non_null(buf);
            (void)format_reader_read_slice(r, i, buf, s->length, &err);
            free(buf);
        }
        format_reader_close(r);
    }
    if (largest > LIMIT)
        fail_msg("%s: one allocation of %zu bytes", name, largest);
}

static void test_containers(void **state)
{
    (void)state;
    assert_true(each_file("fuzz_format", open_one) > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_importers),
        cmocka_unit_test(test_containers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
