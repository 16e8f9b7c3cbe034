/* fuzz_format.c: libFuzzer target for the container reader. The input bytes
 * are a container file; opening it must either fail with a message or give a
 * reader whose every tensor and slice can be read and validated by
 * format_slice_validate, the one validator (checksum errors allowed),
 * never crash, hang or leak. Built with -DSLUICE_FUZZ=ON (clang); the same
 * function is replayed in ctest by fuzz_driver.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format.h"
#include "fuzz_corpus.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64]; /* in memory when it can be: inputs are written every run */
    snprintf(path, sizeof path, "%s/sluice-fuzz-XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0)
        return 0;
    size_t off = 0;
    while (off < size) {
        ssize_t k = write(fd, data + off, size - off);
        if (k <= 0)
            break;
        off += (size_t)k;
    }
    close(fd);
    struct format_reader *r = NULL;
    struct sl_err err;
    if (format_reader_open(path, &r, &err) == 0) {
        for (uint32_t i = 0; i < format_reader_n_tensors(r); i++) {
            const struct format_tensor_info *t = format_reader_tensor(r, i);
            void *buf = malloc(t->length ? t->length : 1);
            if (buf)
                (void)format_reader_read_tensor(r, i, buf, t->length, &err);
            free(buf);
        }
        for (uint32_t i = 0; i < format_reader_n_slices(r); i++) {
            const struct format_slice_info *s = format_reader_slice(r, i);
            void *buf = malloc(s->length);
            if (buf) {
                /* the one validator on the raw bytes, whatever their checksum
                 * (a fuzzer cannot forge XXH3), then the checked paths */
                if (pread(format_reader_fd(r), buf, s->length, (off_t)s->offset) ==
                    (ssize_t)s->length) {
                    if (format_slice_validate(r, i, buf, &err) < 0 && !err.msg[0])
                        abort();
                    (void)format_slice_verify(r, i, buf, &err);
                }
                (void)format_reader_read_slice(r, i, buf, s->length, &err);
            }
            free(buf);
        }
        const struct format_tokenizer *tok = format_reader_tokenizer(r);
        volatile uint32_t sink = 0;
        for (uint32_t i = 0; i < tok->n_tokens; i++)
            sink += tok->lens[i] ? (uint8_t)tok->tokens[i][tok->lens[i] - 1] : 0;
        (void)sink;
        format_reader_close(r);
    } else if (err.msg[0] == 0) {
        abort(); /* a failure must always say why */
    }
    unlink(path);
    return 0;
}

/* fuzz_driver.c makes this target's seed (a writer-made container); the
 * corpus replay (fuzz_replay.c) needs none of its own. */
int fuzz_target_seeds(void (*add)(void *ctx, const uint8_t *data, size_t size), void *ctx)
{
    (void)add, (void)ctx;
    return 0;
}
