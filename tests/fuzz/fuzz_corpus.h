/* fuzz_corpus.h: what the ctest replay drivers of the fuzz targets share. */
#ifndef SLUICE_TEST_FUZZ_CORPUS_H
#define SLUICE_TEST_FUZZ_CORPUS_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Feeds the target every regular file under `path` (a file, or a folder
 * walked recursively in name order; a folder that does not exist counts as
 * empty), and hands each to keep(ctx, ...) too when keep is not NULL.
 * Returns the number of inputs replayed, or -1 (with a message on stderr)
 * when a file cannot be read. */
long fuzz_replay_path(const char *path, void (*keep)(void *ctx, const uint8_t *data, size_t size),
                      void *ctx);

/* The built-in seeds of a target (fuzz_replay.c's targets define it): calls
 * add(ctx, data, size) for each. Returns 0, or -1 when they cannot be made. */
int fuzz_target_seeds(void (*add)(void *ctx, const uint8_t *data, size_t size), void *ctx);

#endif
