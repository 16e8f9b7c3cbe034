/* test_import_gen_internal.h: what the two halves of test_import_gen share:
 * test_import_gen.c (successful imports, and main) and test_import_reject.c
 * (rejections, detection). */
#ifndef SLUICE_TEST_IMPORT_GEN_INTERNAL_H
#define SLUICE_TEST_IMPORT_GEN_INTERNAL_H

#include "format.h"

/* NAME inside the test's scratch directory (a ring of 16 buffers). */
const char *ig_tmp(const char *name);
/* mkdir, an existing directory is fine; else the test fails. */
void ig_mkdir_p(const char *p);
/* Imports src (tokenizer tok, --dtype dtype, -1: keep) into out and opens
 * it, or the test fails with the message. */
struct format_reader *ig_import_ok(const char *src, const char *tok, int dtype, const char *out);

/* test_import_reject.c */
void test_reject_llama2c(void **st);
void test_reject_gguf(void **st);
void test_reject_safetensors(void **st);
void test_detect(void **st);

#endif
