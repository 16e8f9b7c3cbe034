/* common.c: errors, half-precision conversion, clocks, allocation. */
#include "common.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void sl_err_set(struct sl_err *err, const char *fmt, ...)
{
    if (!err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

void sl_err_prefix(struct sl_err *err, const char *fmt, ...)
{
    if (!err)
        return;
    char old[SL_ERR_MAX];
    memcpy(old, err->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof err->msg - 2)
        return;
    size_t used = (size_t)n;
    err->msg[used++] = ':';
    err->msg[used++] = ' ';
    size_t room = sizeof err->msg - used - 1;
    size_t olen = strnlen(old, sizeof old);
    if (olen > room)
        olen = room;
    memcpy(err->msg + used, old, olen);
    err->msg[used + olen] = 0;
}

float sl_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t sl_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t exp = (u >> 23) & 0xff;
    uint32_t man = u & 0x7fffff;
    if (exp == 0xff) /* inf or NaN (keep a quiet NaN) */
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        int shift = 14 - e;
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1)))
        half++; /* may carry into the exponent, up to infinity: correct */
    return (uint16_t)(sign | half);
}

uint16_t sl_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* Fault injection: armed (1) or not; allocations counted since arming; the
 * one that fails (0: none). */
static atomic_int fault_armed;
static atomic_long fault_seen;
static atomic_long fault_at;

void sl_fault_alloc_arm(long k)
{
    atomic_store(&fault_armed, 0);
    atomic_store(&fault_seen, 0);
    atomic_store(&fault_at, k > 0 ? k : 0);
    atomic_store(&fault_armed, k != 0);
}

long sl_fault_alloc_count(void)
{
    return atomic_load(&fault_seen);
}

/* Whether this allocation is to fail (and it is counted when armed). */
static int fault_now(void)
{
    if (!atomic_load_explicit(&fault_armed, memory_order_relaxed))
        return 0;
    long n = atomic_fetch_add(&fault_seen, 1) + 1;
    return n == atomic_load(&fault_at);
}

void *sl_malloc(size_t size)
{
    return fault_now() ? NULL : malloc(size);
}

void *sl_calloc(size_t n, size_t size)
{
    return fault_now() ? NULL : calloc(n, size);
}

void *sl_realloc(void *p, size_t size)
{
    return fault_now() ? NULL : realloc(p, size);
}

char *sl_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = sl_malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

void *sl_alloc_aligned(size_t size, size_t align)
{
    void *p = NULL;
    if (fault_now())
        return NULL;
    if (size == 0)
        size = align;
    if (posix_memalign(&p, align, sl_align_up(size, align)) != 0)
        return NULL;
    return p;
}

void sl_free_aligned(void *p)
{
    free(p);
}

uint64_t sl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double sl_peak_rss_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    double mb = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long kb;
        if (sscanf(line, "VmHWM: %lu kB", &kb) == 1) {
            mb = (double)kb / 1024.0;
            break;
        }
    }
    fclose(f);
    return mb;
}
