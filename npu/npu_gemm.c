/* npu_gemm.c: weight preparation and kernel dispatch. The scalar kernel is
 * the specification; the SIMD kernels (npu_gemm_<isa>.c) must match it bit
 * for bit. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "npu_gemm_internal.h"

#ifndef SLUICE_KERNELS_X86
#define SLUICE_KERNELS_X86 0
#endif
#ifndef SLUICE_KERNELS_AMX
#define SLUICE_KERNELS_AMX 0
#endif

static const char *const names[NPU_KERNEL_COUNT] = {"scalar", "avx2", "avx512vnni", "avxvnni",
                                                      "amx"};

const char *npu_kernel_name(enum npu_kernel k)
{
    return (unsigned)k < NPU_KERNEL_COUNT ? names[k] : "unknown";
}

int npu_kernel_available(enum npu_kernel k)
{
    const struct sl_cpu_features *f = sl_cpu_features();
    switch (k) {
    case NPU_KERNEL_SCALAR:
        return 1;
    case NPU_KERNEL_AVX2:
        return SLUICE_KERNELS_X86 && f->avx2;
    case NPU_KERNEL_AVX512VNNI:
        return SLUICE_KERNELS_X86 && f->avx512vnni;
    case NPU_KERNEL_AVXVNNI:
        return SLUICE_KERNELS_X86 && f->avxvnni;
    case NPU_KERNEL_AMX:
#if SLUICE_KERNELS_AMX
        return f->amx;
#else
        return 0;
#endif
    default:
        return 0;
    }
}

enum npu_kernel npu_kernel_best(void)
{
    if (npu_kernel_available(NPU_KERNEL_AMX))
        return NPU_KERNEL_AMX;
    if (npu_kernel_available(NPU_KERNEL_AVX512VNNI))
        return NPU_KERNEL_AVX512VNNI;
    if (npu_kernel_available(NPU_KERNEL_AVXVNNI))
        return NPU_KERNEL_AVXVNNI;
    if (npu_kernel_available(NPU_KERNEL_AVX2))
        return NPU_KERNEL_AVX2;
    return NPU_KERNEL_SCALAR;
}

enum npu_kernel npu_kernel_for_rows(uint32_t m)
{
    enum npu_kernel k = npu_kernel_best();
    if (k == NPU_KERNEL_AMX && m < NPU_AMX_MIN_ROWS)
        k = NPU_KERNEL_AVX512VNNI; /* AMX implies AVX-512 VNNI (sl_cpu_features) */
    return k;
}

const struct npu_kernel_ops *npu_kernel_ops(enum npu_kernel k)
{
    if (!npu_kernel_available(k))
        return &npu_ops_scalar;
    switch (k) {
#if SLUICE_KERNELS_X86
    case NPU_KERNEL_AVX2:
        return &npu_ops_avx2;
    case NPU_KERNEL_AVX512VNNI:
        return &npu_ops_avx512vnni;
    case NPU_KERNEL_AVXVNNI:
        return &npu_ops_avxvnni;
#endif
#if SLUICE_KERNELS_AMX
    case NPU_KERNEL_AMX:
        return &npu_ops_amx;
#endif
    default:
        return &npu_ops_scalar;
    }
}

int npu_gemm_direct(const struct npu_kernel_ops *ops, uint32_t k)
{
#if SLUICE_KERNELS_AMX
    return ops == &npu_ops_amx && k % 64 == 0;
#else
    (void)ops;
    (void)k;
    return 0;
#endif
}

int npu_gemm_b_alloc(uint32_t n, uint32_t k, struct npu_gemm_b **out)
{
    *out = NULL;
    if (n == 0 || k == 0 || k > UINT32_MAX - 3 || n > UINT32_MAX - 15)
        return -EINVAL;
    struct npu_gemm_b *b = calloc(1, sizeof *b);
    if (!b)
        return -ENOMEM;
    b->n = n;
    b->k = k;
    b->k4 = (k + 3) & ~3u;
    b->n16 = (n + 15) & ~15u;
    b->rowsum = sl_alloc_aligned(sizeof(int32_t) * b->n16, 64);
    b->wide = sl_calloc(b->n16 / 16, 1);
    b->tiny = sl_calloc(b->n16 / 16, 1);
    const size_t bytes = (size_t)b->n16 * b->k4;
    const uintptr_t huge = (uintptr_t)2 << 20;
    b->packed = sl_alloc_aligned(bytes, bytes >= huge ? huge : 64);
    if (!b->rowsum || !b->packed || !b->wide || !b->tiny) {
        npu_gemm_b_destroy(b);
        return -ENOMEM;
    }
    b->cap_bytes = bytes;
    b->cap_n16 = b->n16;
    /* Transparent huge pages for large weights: the first fill of a tensor
     * faults its pages in, and at 4 KiB each that costs more than the packing
     * itself (0.4 s per GB here against 0.07 s with 2 MiB pages). Large
     * weights start on a 2 MiB boundary so that only their tail (the last
     * partial 2 MiB) stays in small pages; only whole 2 MiB ranges inside the
     * weights are advised, so the resident size does not grow. Advice only:
     * failure changes nothing. */
    uintptr_t lo = ((uintptr_t)b->packed + huge - 1) & ~(huge - 1);
    uintptr_t hi = ((uintptr_t)b->packed + bytes) & ~(huge - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
    *out = b;
    return 0;
}

int npu_gemm_b_reshape(struct npu_gemm_b *b, uint32_t n, uint32_t k)
{
    if (n == 0 || k == 0 || k > UINT32_MAX - 3 || n > UINT32_MAX - 15)
        return -EINVAL;
    uint32_t k4 = (k + 3) & ~3u, n16 = (n + 15) & ~15u;
    if ((size_t)n16 * k4 > b->cap_bytes)
        return -ENOSPC;
    if (n16 > b->cap_n16) { /* more rows: the per-row arrays grow (small) */
        int32_t *rs = sl_alloc_aligned(sizeof(int32_t) * n16, 64);
        uint8_t *wd = sl_calloc(n16 / 16, 1), *tn = sl_calloc(n16 / 16, 1);
        if (!rs || !wd || !tn) {
            sl_free_aligned(rs);
            free(wd);
            free(tn);
            return -ENOMEM;
        }
        sl_free_aligned(b->rowsum);
        free(b->wide);
        free(b->tiny);
        b->rowsum = rs;
        b->wide = wd;
        b->tiny = tn;
        b->cap_n16 = n16;
    }
    b->n = n;
    b->k = k;
    b->k4 = k4;
    b->n16 = n16;
    return 0;
}

int npu_gemm_b_set_rows(struct npu_gemm_b *b, const int8_t *src, uint32_t r0, uint32_t r1)
{
    if (!src || r0 >= r1 || r1 > b->n || r0 % 16 || (r1 % 16 && r1 != b->n))
        return -EINVAL;
    const struct npu_kernel_ops *ops = npu_kernel_ops(npu_kernel_best());
    npu_pack_fn *pack = ops->pack ? ops->pack : npu_ops_scalar.pack;
    /* the AVX2 kernel negates weights: -128 has no int8 negation */
    return pack(b, src, r0, r1) ? -ERANGE : 0;
}

int npu_gemm_b_create(const int8_t *src, uint32_t n, uint32_t k, struct npu_gemm_b **out)
{
    struct npu_gemm_b *b;
    int ret = src ? npu_gemm_b_alloc(n, k, &b) : -EINVAL;
    if (ret < 0) {
        *out = NULL;
        return ret;
    }
    ret = npu_gemm_b_set_rows(b, src, 0, n);
    if (ret < 0) {
        npu_gemm_b_destroy(b);
        *out = NULL;
        return ret;
    }
    *out = b;
    return 0;
}

void npu_gemm_b_destroy(struct npu_gemm_b *b)
{
    if (!b)
        return;
    sl_free_aligned(b->rowsum);
    sl_free_aligned(b->packed);
    free(b->wide);
    free(b->tiny);
    free(b);
}

int npu_kernel_tiles(enum npu_kernel k)
{
    return npu_kernel_ops(k)->tiles;
}

const char *npu_kernel_tile_name(enum npu_kernel k, int tile)
{
    const struct npu_kernel_ops *ops = npu_kernel_ops(k);
    return tile >= 0 && tile < ops->tiles ? ops->tile_names[tile] : "unknown";
}

void npu_gemm_s8_kernel(enum npu_kernel kern, const struct npu_gemm_b *b, const int8_t *a,
                        uint32_t m, uint32_t r0, uint32_t r1, int32_t *c, size_t ldc)
{
    npu_gemm_s8_tile(kern, 0, b, a, m, r0, r1, c, ldc);
}

void npu_gemm_s8_tile(enum npu_kernel kern, int tile, const struct npu_gemm_b *b,
                      const int8_t *a, uint32_t m, uint32_t r0, uint32_t r1, int32_t *c,
                      size_t ldc)
{
    if (m == 0 || r1 <= r0)
        return;
    const struct npu_kernel_ops *ops = npu_kernel_ops(kern);
    if (tile < 0 || tile >= ops->tiles)
        tile = 0;
    uint8_t *stage = sl_alloc_aligned(npu_gemm_prep_bytes(b->k4, m), 64);
    struct npu_gemm_args g = {.b = b, .m = m, .r0 = r0, .r1 = r1, .c = c, .ldc = ldc};
    if (!stage) {
        /* no memory for the staging copy: one row at a time from the stack
         * would still need k4 bytes; the scalar layout for one row is the
         * row itself when k % 4 == 0, otherwise compute directly */
        for (uint32_t i = 0; i < m; i++)
            for (uint32_t r = r0; r < r1; r++) {
                int32_t acc = 0;
                for (uint32_t j = 0; j < b->k; j++)
                    acc += (int32_t)a[(size_t)i * b->k + j] * npu_gemm_b_at(b, r, j);
                c[(size_t)i * ldc + (r - r0)] = acc;
            }
        return;
    }
    ops->prep(a, b->k, m, b->k, b->k4, tile, stage);
    g.a = stage;
    g.tile = tile;
    ops->gemm(&g);
    sl_free_aligned(stage);
}

void npu_gemm_s8(const struct npu_gemm_b *b, const int8_t *a, uint32_t m, uint32_t r0,
                 uint32_t r1, int32_t *c, size_t ldc)
{
    npu_gemm_s8_kernel(npu_kernel_for_rows(m), b, a, m, r0, r1, c, ldc);
}

#if SLUICE_KERNELS_X86 || SLUICE_KERNELS_AMX /* a scalar-only build has no peak loop */
static double peak_gops(uint64_t (*loop)(uint64_t), double macs_per_iter, double seconds);
#endif

double npu_gemm_peak_gops(enum npu_kernel k, double seconds)
{
    if (!npu_kernel_available(k))
        return 0;
    switch (k) {
#if SLUICE_KERNELS_X86
    case NPU_KERNEL_AVX512VNNI:
        return peak_gops(npu_peak_avx512vnni, 16 * 64, seconds);
    case NPU_KERNEL_AVX2:
        return peak_gops(npu_peak_avx2, 6 * 32, seconds);
#endif
#if SLUICE_KERNELS_AMX
    case NPU_KERNEL_AMX:
        return peak_gops(npu_peak_amx, 4 * 16 * 16 * 64, seconds);
#endif
    default:
        return 0;
    }
}

double npu_gemm_peak_best(double seconds, enum npu_kernel *which)
{
    double best = 0;
    enum npu_kernel bk = NPU_KERNEL_SCALAR;
    for (int k = 0; k < NPU_KERNEL_COUNT; k++) {
        if (!npu_kernel_available((enum npu_kernel)k))
            continue;
        double p = npu_gemm_peak_gops((enum npu_kernel)k, seconds);
        if (p > best)
            best = p, bk = (enum npu_kernel)k;
    }
    if (which)
        *which = bk;
    return best;
}

double npu_gemm_peak_tiny_gops(enum npu_kernel k, double seconds)
{
#if SLUICE_KERNELS_X86
    if (k == NPU_KERNEL_AVX2 && npu_kernel_available(k))
        return peak_gops(npu_peak_avx2_tiny, 16 * 32, seconds);
#endif
    (void)seconds;
    return 0;
}

uint32_t npu_gemm_tiny_rows(enum npu_kernel k, const int8_t *q, uint32_t rows, uint32_t cols)
{
    if (k != NPU_KERNEL_AVX2 || !npu_kernel_available(k))
        return 0;
    /* as npu_gemm_avx2.c dispatches: 32-channel pairs of blocks, where a
     * wide block (a code beyond +-64) takes the pair's tiny one too */
    uint32_t n = 0, tn[2] = {0, 0};
    int wide = 0;
    for (uint32_t r0 = 0; r0 < rows; r0 += 16) {
        const uint32_t r1 = rows - r0 < 16 ? rows : r0 + 16;
        int mx = 0;
        for (size_t i = (size_t)r0 * cols; i < (size_t)r1 * cols; i++)
            mx = abs(q[i]) > mx ? abs(q[i]) : mx;
        tn[r0 / 16 % 2] = mx <= NPU_GEMM_TINY ? r1 - r0 : 0;
        wide |= mx > 64;
        if (r0 / 16 % 2 || r1 == rows) {
            n += wide ? 0 : tn[0] + (r0 / 16 % 2 ? tn[1] : 0);
            tn[0] = tn[1] = 0;
            wide = 0;
        }
    }
    return n;
}

#if SLUICE_KERNELS_X86 || SLUICE_KERNELS_AMX
static double peak_gops(uint64_t (*loop)(uint64_t), double macs_per_iter, double seconds)
{
    volatile uint64_t sink = loop(1000); /* warm up (clock ramps, AVX-512 license) */
    uint64_t iters = 1 << 16;
    double best = 0;
    uint64_t t_end = sl_now_ns() + (uint64_t)(seconds * 1e9);
    while (sl_now_ns() < t_end) {
        uint64_t t0 = sl_now_ns();
        sink += loop(iters);
        uint64_t dt = sl_now_ns() - t0;
        double gops = 2.0 * macs_per_iter * (double)iters / (double)dt;
        if (gops > best)
            best = gops;
        if (dt < 20000000)
            iters *= 2;
    }
    (void)sink;
    return best;
}
#endif
