/* common_cpu.c: CPU feature detection, once, with OS support for wide
 * registers checked through XGETBV (STYLE.md 13). */
#include "common.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static struct sl_cpu_features g_hw;
static struct sl_cpu_features g_eff;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__)
static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect_x86(struct sl_cpu_features *f)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d))
        return;
    int amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* "AuthenticAMD" */
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    if (amd) {
        f->amd_family = (a >> 8) & 0xf;
        if (f->amd_family == 0xf)
            f->amd_family += (a >> 20) & 0xff;
    }
    int osxsave = (c >> 27) & 1;
    int fma = (c >> 12) & 1;
    int f16c = (c >> 29) & 1;
    int popcnt = (c >> 23) & 1;
    if (!osxsave)
        return;
    uint64_t xcr0 = read_xcr0();
    int os_ymm = (xcr0 & 0x6) == 0x6;
    int os_zmm = (xcr0 & 0xe6) == 0xe6;
    if (__get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid_count(7, 0, a, b, c, d);
    int avx2 = (b >> 5) & 1;
    int bmi2 = (b >> 8) & 1;
    int avx512f = (b >> 16) & 1;
    int avx512dq = (b >> 17) & 1;
    int avx512bw = (b >> 30) & 1;
    int avx512vl = (b >> 31) & 1;
    int avx512vnni = (c >> 11) & 1;
    int amx = ((d >> 24) & 1) && ((d >> 25) & 1); /* AMX-TILE and AMX-INT8 */
    __cpuid_count(7, 1, a, b, c, d);
    int avxvnni = (a >> 4) & 1;
    f->avx2 = os_ymm && avx2 && fma && f16c && bmi2 && popcnt;
    f->avx512 = f->avx2 && os_zmm && avx512f && avx512dq && avx512bw && avx512vl;
    f->avx512vnni = f->avx512 && avx512vnni;
    f->avxvnni = f->avx2 && avxvnni;
    /* XCR0 bits 17 and 18: the OS saves the tile configuration and data;
     * and the process must be granted the tile data state (Linux:
     * arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 18), asked here,
     * once, before any thread uses a tile; refused, no AMX) */
    f->amx = f->avx512vnni && amx && (xcr0 & 0x60000) == 0x60000 &&
             syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
}
#endif

static void detect(void)
{
    memset(&g_hw, 0, sizeof g_hw);
#if defined(__x86_64__)
    detect_x86(&g_hw);
#elif defined(__aarch64__)
    g_hw.neon = 1; /* ASIMD is mandatory on AArch64 */
#endif
    g_eff = g_hw;
    const char *force = getenv("SLUICE_SIMD");
    if (force && *force) {
        if (!strcmp(force, "scalar")) {
            memset(&g_eff, 0, sizeof g_eff);
        } else if (!strcmp(force, "avx2")) {
            g_eff.avx512 = g_eff.avx512vnni = g_eff.amx = 0;
        } else if (!strcmp(force, "avx512")) {
            g_eff.avxvnni = g_eff.amx = 0; /* keep what the CPU has at that level */
        }
    }
}

const struct sl_cpu_features *sl_cpu_features(void)
{
    pthread_once(&g_once, detect);
    return &g_eff;
}

const struct sl_cpu_features *sl_cpu_features_hw(void)
{
    pthread_once(&g_once, detect);
    return &g_hw;
}

long sl_cpu_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}
