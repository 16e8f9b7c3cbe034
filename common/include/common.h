/*
 * common.h: the few things every Sluice module shares. Header of the `common`
 * library, which depends on nothing but libc.
 *
 *   struct sl_err err = {0};
 *   if (format_reader_open(path, &r, &err) < 0)
 *       fprintf(stderr, "sluice: %s\n", err.msg);
 *
 * - struct sl_err: the error sentence a failing call leaves for the user. Library
 *   code never prints; it returns a negative errno and fills the sentence, naming
 *   the file and what is wrong (STYLE.md 7). Every `err` argument may be NULL.
 * - little-endian loads and stores, F16/BF16 conversion, overflow-checked size
 *   arithmetic, a monotonic clock, peak RSS, CPU feature detection.
 */
#ifndef SLUICE_COMMON_H
#define SLUICE_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ---------------------------------------------------------------- */

#define SL_ERR_MAX 512

struct sl_err {
    char msg[SL_ERR_MAX];
};

/* Fills err->msg (printf-style) unless err is NULL. Returns nothing so that it
 * can precede `return -EINVAL;`. */
void sl_err_set(struct sl_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefixes the message already in err with "<prefix>: ". */
void sl_err_prefix(struct sl_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- little-endian access ---------------------------------------------------- */

static inline uint16_t sl_load_le16(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint16_t)(b[0] | (b[1] << 8));
}

static inline uint32_t sl_load_le32(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
           ((uint32_t)b[3] << 24);
}

static inline uint64_t sl_load_le64(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint64_t)sl_load_le32(b) | ((uint64_t)sl_load_le32(b + 4) << 32);
}

static inline float sl_load_lef32(const void *p)
{
    uint32_t u = sl_load_le32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline void sl_store_le16(void *p, uint16_t v)
{
    uint8_t *b = (uint8_t *)p;
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
}

static inline void sl_store_le32(void *p, uint32_t v)
{
    uint8_t *b = (uint8_t *)p;
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
    b[2] = (uint8_t)(v >> 16);
    b[3] = (uint8_t)(v >> 24);
}

static inline void sl_store_le64(void *p, uint64_t v)
{
    sl_store_le32(p, (uint32_t)v);
    sl_store_le32((uint8_t *)p + 4, (uint32_t)(v >> 32));
}

static inline void sl_store_lef32(void *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    sl_store_le32(p, u);
}

/* ---- half precision ------------------------------------------------------- */

/* IEEE binary16 <-> binary32, exact widening; narrowing rounds to nearest even
 * and keeps infinities and NaNs. */
float sl_f16_to_f32(uint16_t h);
uint16_t sl_f32_to_f16(float f);

static inline float sl_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even; NaN stays NaN. */
uint16_t sl_f32_to_bf16(float f);

/* ---- sizes ----------------------------------------------------------------- */

static inline uint64_t sl_align_up(uint64_t x, uint64_t a) /* a: power of two */
{
    return (x + a - 1) & ~(a - 1);
}

/* Overflow-checked arithmetic: return 0 on success, -EOVERFLOW otherwise. */
static inline int sl_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -75 /* EOVERFLOW */ : 0;
}

static inline int sl_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -75 /* EOVERFLOW */ : 0;
}

/* ---- allocation ------------------------------------------------------------
 * malloc, calloc, realloc and strdup through one seam, so that tests can make
 * any one of them fail (STYLE.md 20). Free with free(). */

void *sl_malloc(size_t size);
void *sl_calloc(size_t n, size_t size);
void *sl_realloc(void *p, size_t size); /* NULL: p untouched, as realloc */
char *sl_strdup(const char *s);

/* 64-byte aligned allocation (free with sl_free_aligned); NULL on failure.
 * Counted and failed like the others. */
void *sl_alloc_aligned(size_t size, size_t align);
void sl_free_aligned(void *p);

/* Fault injection, for tests. sl_fault_alloc_arm(k) restarts the count of
 * allocations through the functions above at zero and, for k > 0, makes the
 * k-th from now fail (only that one); k < 0 counts without failing; k = 0
 * disarms (nothing counted or failed). sl_fault_alloc_count: allocations
 * counted since the last arm. Any thread; the count is process-wide, so a
 * test arms it around work of its own. Disarmed, an allocation costs one
 * relaxed atomic load more. */
void sl_fault_alloc_arm(long k);
long sl_fault_alloc_count(void);

/* ---- time and resources -------------------------------------------------- */

uint64_t sl_now_ns(void);      /* CLOCK_MONOTONIC */
double sl_peak_rss_mb(void);   /* VmHWM of this process, MiB; -1 if unknown */

/* ---- CPU features (STYLE.md 13) -------------------------------------------- */

enum sl_cpu_level {
    SL_CPU_SCALAR = 0,
    SL_CPU_AVX2 = 1,       /* AVX2 + FMA + F16C + BMI2 */
    SL_CPU_AVX512 = 2,     /* F, BW, VL, DQ */
    SL_CPU_NEON = 3,       /* aarch64 ASIMD */
};

struct sl_cpu_features {
    int avx2;          /* with FMA, F16C, BMI2, POPCNT and OS support for YMM */
    int avx512;        /* F+BW+VL+DQ and OS support for ZMM */
    int avx512vnni;
    int avxvnni;       /* the VEX-encoded VNNI of Alder Lake and later */
    int amx;           /* AMX-TILE + AMX-INT8 (with AVX-512 VNNI), OS support for tiles, and
                        * the process granted the tile data state (asked at detection) */
    int neon;
    unsigned amd_family; /* an AMD CPU's family (0x19 Zen 3/4, 0x1A Zen 5); 0 on others */
};

/* Detected once (thread-safe). The environment variable SLUICE_SIMD forces a
 * lower level for tests and benchmarks: "scalar", "avx2", "avx512" (AVX-512
 * without AMX; a level the CPU lacks is never enabled). */
const struct sl_cpu_features *sl_cpu_features(void);

/* The raw detection, ignoring SLUICE_SIMD (what the hardware and OS allow). */
const struct sl_cpu_features *sl_cpu_features_hw(void);

/* The AMX tile configuration that LDTILECFG reads (palette 1: 64 bytes,
 * each tile's rows and bytes per row), for the AMX kernels of every module
 * (npu's GEMMs, unpack's few-row dot products); each configures its own
 * tiles. */
struct sl_amx_tilecfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
/* The number of CPUs this thread may run on (its affinity mask: taskset,
 * cpusets), at least 1; the online CPUs where the mask cannot be read. */
long sl_cpu_count(void);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_COMMON_H */
