/* format_checksum_avx512.c: XXH3-64 compiled for AVX-512 (format_checksum's
 * and format_hash's fast path, format_common.c).
 *
 * The system's libxxhash is built for plain x86-64 (SSE2): 6.3-6.7 GB/s over
 * memory the cache has not seen on the Xeon of docs/BENCHMARKS.md, against
 * 9.2-10.2 GB/s for the same function compiled here with AVX-512
 * (XXH_VECTOR follows __AVX512F__; every vector width computes the same XXH3
 * by its definition, and test_format_checksum compares the two on random
 * lengths, alignments and contents). A cold start hashes every slice it
 * reads (649 MB for a 512-token TinyLlama prompt) on the cores the prefill
 * wants, and the loader and the reader the same bytes. Inlined and
 * namespaced: no symbol clashes with the library's. Call only where
 * sl_cpu_features()->avx512. */
#define XXH_INLINE_ALL
#define XXH_NAMESPACE sl_fmt_
#include <xxhash.h>

#include "format_internal.h"

uint64_t fmt_checksum_avx512(const void *data, size_t len) { return XXH3_64bits(data, len); }

void *fmt_hash_avx512_new(void)
{
    XXH3_state_t *st = XXH3_createState();
    if (st)
        (void)XXH3_64bits_reset(st);
    return st;
}

void fmt_hash_avx512_reset(void *st) { (void)XXH3_64bits_reset(st); }

void fmt_hash_avx512_update(void *st, const void *data, size_t len)
{
    (void)XXH3_64bits_update(st, data, len); /* fails only for NULL data, never passed */
}

uint64_t fmt_hash_avx512_digest(const void *st) { return XXH3_64bits_digest(st); }

void fmt_hash_avx512_free(void *st) { (void)XXH3_freeState(st); }
