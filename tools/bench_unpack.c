/* bench_unpack.c: `sluice bench unpack`: int8 output throughput of every
 * unpack kernel on every packed encoding, side by side in one run, at bit
 * mixes averaging 4, 5, 6 and 7 bits. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quantizer.h"
#include "sluice.h"
#include "tools_util.h"
#include "unpack.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench unpack [--rows N] [--cols N] [--reps N] [--json]\n\n"
            "Unpacks a rows x cols tensor (default 4096 x 4096: 16 MiB of int8 output, larger\n"
            "than L2) to int8 with every kernel this CPU has (scalar, avx2, avx512, neon) for\n"
            "every packed encoding (adaptive, int4int8, bitplane), at per-row bit-width mixes\n"
            "averaging 4, 5, 6 and 7 bits (widths spread around the average as the allocator\n"
            "produces), on one core. Contenders are interleaved rep by rep; reports the median\n"
            "and best int8 output GB/s and cycles per weight. Cycles are TSC cycles (wall time\n"
            "times the TSC rate measured in the same run): this machine exposes no hardware\n"
            "cycle counter, so they are reference cycles, not core cycles.\n");
}

static inline uint64_t rdtsc(void)
{
#if defined(__x86_64__)
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
#else
    return sl_now_ns();
#endif
}

static double tsc_per_ns(void)
{
    uint64_t t0 = sl_now_ns(), c0 = rdtsc();
    while (sl_now_ns() - t0 < 50000000ull)
        ;
    return (double)(rdtsc() - c0) / (double)(sl_now_ns() - t0);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Row widths with mean `avg`: a spread like the greedy allocator's (most rows
 * at avg, some one or two bits either side). */
static void make_widths(uint8_t *w, uint32_t rows, uint32_t avg, uint64_t *seed)
{
    static const int off[8] = {-2, -1, -1, 0, 0, 1, 1, 2}; /* mean 0 */
    for (uint32_t r = 0; r < rows; r++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        int b = (int)avg + off[(*seed >> 33) & 7];
        if (b < 1 || b > 8)
            b = (int)avg;
        w[r] = (uint8_t)b;
    }
}

struct result {
    const char *kernel, *encoding;
    uint32_t avg_bits;
    double bytes_per_weight;
    double *gbps;     /* per rep */
    double *cpw;
};

int bench_unpack(int argc, char **argv)
{
    uint32_t rows = 4096, cols = 4096, reps = 9;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
            bad = tools_parse_u32(argv[++i], &rows) || !rows;
        } else if (!strcmp(argv[i], "--cols") && i + 1 < argc) {
            bad = tools_parse_u32(argv[++i], &cols) || !cols;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            bad = tools_parse_u32(argv[++i], &reps) || !reps;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else {
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "sluice bench unpack: bad value '%s'\n", argv[i]);
            return 2;
        }
    }
    const uint32_t encs[3] = {FORMAT_ENC_ADAPTIVE, FORMAT_ENC_INT4INT8, FORMAT_ENC_BITPLANE};
    const uint32_t avgs[4] = {4, 5, 6, 7};
    size_t n = (size_t)rows * cols;
    int8_t *q = malloc(n), *out = sl_alloc_aligned(n, 64);
    uint8_t *w = malloc(rows);
    float *sc = malloc(sizeof(float) * rows);
    struct result res[4 * 3 * UNPACK_KERNEL_COUNT];
    int nres = 0;
    if (!q || !out || !w || !sc) {
        fprintf(stderr, "sluice bench unpack: out of memory\n");
        return 1;
    }
    double tscr = tsc_per_ns();
    uint64_t seed = 12345;
    for (int a = 0; a < 4; a++) {
        make_widths(w, rows, avgs[a], &seed);
        for (uint32_t r = 0; r < rows; r++) {
            sc[r] = 1.0f;
            int m = (1 << (w[r] - 1)) - 1;
            for (uint32_t c = 0; c < cols; c++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                int v = w[r] == 1 ? ((seed >> 40) & 1 ? 1 : -1)
                                  : (int)((seed >> 33) % (uint64_t)(2 * m + 1)) - m;
                q[(size_t)r * cols + c] = (int8_t)v;
            }
        }
        struct unpack_tensor ut[3];
        void *bytes[3];
        uint64_t len[3];
        int first = nres;
        for (int e = 0; e < 3; e++) {
            struct sl_err err;
            if (quantizer_pack(encs[e], q, w, sc, rows, cols, &bytes[e], &len[e], &err) < 0 ||
                unpack_tensor_init(&ut[e], encs[e], bytes[e], len[e], rows, cols, &err) < 0) {
                fprintf(stderr, "sluice bench unpack: %s\n", err.msg);
                return 1;
            }
            for (int k = 0; k < UNPACK_KERNEL_COUNT; k++) {
                if (!unpack_kernel_available((enum unpack_kernel)k))
                    continue;
                struct result *rr = &res[nres++];
                rr->kernel = unpack_kernel_name((enum unpack_kernel)k);
                rr->encoding = format_encoding_traits(encs[e])->name;
                rr->avg_bits = avgs[a];
                rr->bytes_per_weight = (double)ut[e].layout.data_len / (double)n;
                rr->gbps = calloc(reps, sizeof(double));
                rr->cpw = calloc(reps, sizeof(double));
            }
        }
        /* interleave contenders rep by rep */
        for (uint32_t rep = 0; rep < reps; rep++) {
            int idx = first;
            for (int e = 0; e < 3; e++)
                for (int k = 0; k < UNPACK_KERNEL_COUNT; k++) {
                    if (!unpack_kernel_available((enum unpack_kernel)k))
                        continue;
                    uint64_t c0 = rdtsc(), t0 = sl_now_ns();
                    unpack_tensor_rows(&ut[e], (enum unpack_kernel)k, 0, rows, out, NULL);
                    uint64_t t1 = sl_now_ns(), c1 = rdtsc();
                    res[idx].gbps[rep] = (double)n / (double)(t1 - t0);
                    res[idx].cpw[rep] = (double)(c1 - c0) / (double)n;
                    idx++;
                }
        }
        for (int e = 0; e < 3; e++) {
            unpack_tensor_fini(&ut[e]);
            free(bytes[e]);
        }
        if (!json)
            fprintf(stderr, "bench unpack: %u-bit mix done\n", avgs[a]);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rows", rows);
    cJSON_AddNumberToObject(o, "cols", cols);
    cJSON_AddNumberToObject(o, "reps", reps);
    cJSON_AddNumberToObject(o, "tsc_ghz", tscr);
    cJSON_AddStringToObject(o, "cycles", "tsc");
    cJSON *arr = cJSON_AddArrayToObject(o, "results");
    if (!json)
        printf("%-9s %-7s %4s %6s %10s %10s %10s\n", "encoding", "kernel", "bits", "B/w",
               "GB/s med", "GB/s best", "cyc/w med");
    for (int i = 0; i < nres; i++) {
        struct result *rr = &res[i];
        qsort(rr->gbps, reps, sizeof(double), cmp_double);
        qsort(rr->cpw, reps, sizeof(double), cmp_double);
        double med = rr->gbps[reps / 2], best = rr->gbps[reps - 1], cpw = rr->cpw[reps / 2];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "kernel", rr->kernel);
        cJSON_AddStringToObject(e, "encoding", rr->encoding);
        cJSON_AddNumberToObject(e, "avg_bits", rr->avg_bits);
        cJSON_AddNumberToObject(e, "bytes_per_weight", rr->bytes_per_weight);
        cJSON_AddNumberToObject(e, "gbps", med);
        cJSON_AddNumberToObject(e, "gbps_best", best);
        cJSON_AddNumberToObject(e, "cycles_per_weight", cpw);
        cJSON_AddItemToArray(arr, e);
        if (!json)
            printf("%-9s %-7s %4u %6.3f %10.2f %10.2f %10.3f\n", rr->encoding, rr->kernel,
                   rr->avg_bits, rr->bytes_per_weight, med, best, cpw);
        free(rr->gbps);
        free(rr->cpw);
    }
    if (json) {
        char *s = cJSON_Print(o);
        printf("%s\n", s);
        free(s);
    }
    cJSON_Delete(o);
    free(q);
    sl_free_aligned(out);
    free(w);
    free(sc);
    return 0;
}
