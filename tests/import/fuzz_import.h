/* fuzz_import.h: the importer fuzz target's entry points (fuzz_import.c). */
#ifndef SLUICE_TEST_FUZZ_IMPORT_H
#define SLUICE_TEST_FUZZ_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#define FUZZ_IMPORT_KINDS 5 /* gguf, llama2.c, tokenizer, safetensors, config.json */

/* Creates the private work directory with the valid reference model (once). */
int fuzz_import_setup(void);
/* The valid reference file that input kind `kind` replaces. */
const char *fuzz_import_seed_path(int kind);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
