/* pipeline_verify_avx512.c: the slices' XXH3-64, with AVX-512.
 *
 * The driver hashes every slice it maps (pipeline_map.c), 649 MB for a
 * 512-token TinyLlama prompt, on the 2 cores the prefill's compute wants
 * (5% of a cold 512-token run's CPU samples, docs/BENCHMARKS.md, eleventh
 * session, y22b). format_checksum calls the system's libxxhash, built for
 * plain x86-64 (SSE2): 6.3-6.7 GB/s over memory the cache has not seen on
 * this Xeon, against 9.2-10.2 GB/s for the same function compiled here with
 * AVX-512 (XXH_VECTOR follows __AVX512F__; every vector width computes the
 * same XXH3 by its definition, and the test compares the two on random
 * lengths and contents). Inlined and namespaced: no symbol clashes with the
 * library's. */
#define XXH_INLINE_ALL
#define XXH_NAMESPACE sl_pl_
#include <xxhash.h>

#include "pipeline.h"

uint64_t pl_checksum_avx512(const void *data, size_t len) { return XXH3_64bits(data, len); }
