/* bench_unpack.c: `sluice bench unpack`: int8 output throughput of every
 * unpack kernel on every packed encoding, side by side in one run, at bit
 * mixes averaging 4, 5, 6 and 7 bits (EdgeFlow 5.4.2). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "quantizer.h"
#include "sluice.h"
#include "tools_stats.h"
#include "tools_util.h"
#include "unpack.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench unpack [--rows N] [--cols N] [--seconds S] [--reps N] [--json]\n"
            "\n"
            "Unpacks a rows x cols weight tensor (default 4096 x 4096; --rows 1..1048576,\n"
            "--cols 1..131072) to int8 with every kernel this build and CPU have (scalar,\n"
            "avx2, avx512, neon) for every packed encoding (adaptive, int4int8, bitplane,\n"
            "and adaptive+m: adaptive with a multiplier 1..4 per block of 32 weights),\n"
            "side by side in one run, on one core, at per-channel bit-width mixes averaging\n"
            "4, 5, 6 and 7 bits. The widths come from the quantizer's greedy allocator\n"
            "(quantizer_allocate) run on synthetic channel statistics, so they spread around\n"
            "the average as on a real model; adaptive and bitplane then hold exactly the same\n"
            "number of bytes, int4int8 more. The packed bytes are 64-byte aligned, as a\n"
            "container stores them.\n"
            "\n"
            "Four numbers per contender:\n"
            "  stream  the whole tensor into one rows x cols buffer (16 MiB by default, far\n"
            "          larger than L2): streaming from memory to memory, with the store\n"
            "          policy unpack_tensor_int8 uses (non-temporal stores for outputs of\n"
            "          8 MiB or more in the avx2/avx512 kernels, when aligned);\n"
            "  cached  the same with ordinary (cached) stores;\n"
            "  hot     the packed bytes first flushed from every cache level (as when they\n"
            "          were just read from flash), then the rows unpacked a few at a time\n"
            "          into one 16 KiB buffer that stays in L1, as the pipeline does: a\n"
            "          consumer that uses each chunk at once;\n"
            "  warm    the same, but each run of rows whose packed bytes fit in 256 KiB is\n"
            "          unpacked twice and only the second pass is timed: input in L2,\n"
            "          output in L1, the kernels' own speed with memory out of the way.\n"
            "Contenders are interleaved repetition by repetition; each gets at least 3\n"
            "repetitions, more while the time budget lasts (--seconds, default 20 for the\n"
            "whole run, at most 3600; --reps N, 1..1000000, fixes the count). Reports the median and best int8 output\n"
            "GB/s (10^9 bytes/s), the median and minimum core cycles per weight, and the\n"
            "raw counter ticks (x86 rdtsc, fixed rate) per weight. Core cycles come from the\n"
            "hardware cycle counter (perf_event_open) where the kernel offers it; otherwise\n"
            "(VMs, perf_event_paranoid) they are time x the core clock, measured in the run\n"
            "by a chain of dependent one-cycle adds; the output says which. Every\n"
            "output is checked against the codes that were packed before anything is timed.\n"
            "--json prints one object whose `results` array has, per kernel, encoding and\n"
            "mix: kernel, encoding, avg_bits, bytes_per_weight, gbps (median, stream),\n"
            "gbps_best, cycles_per_weight (median, stream), cycles_per_weight_min,\n"
            "ticks_per_weight, gbps_cached_stores, gbps_hot, gbps_hot_best, gbps_warm,\n"
            "gbps_warm_best.\n");
}

#if defined(__x86_64__)
static inline uint64_t ticks(void)
{
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}
static const char *const tick_name = "tsc";
#else
static inline uint64_t ticks(void)
{
    return sl_now_ns();
}
static const char *const tick_name = "ns";
#endif

/* The core clock in GHz: a chain of dependent one-cycle adds (8 per loop
 * iteration, so the loop's own instructions run beside it), timed against
 * the monotonic clock; the best of 60 short runs. This turns time into core cycles on
 * machines without readable cycle counters (VMs: perf_event_open gives no
 * hardware events here), and the TSC, which ticks at a fixed rate, into
 * something comparable across clocks. */
static double core_ghz(void)
{
    const uint64_t iters = 1000000; /* ~2 ms: short enough to fit between preemptions */
    uint64_t best = UINT64_MAX;
    for (int rep = 0; rep < 60; rep++) {
        uint64_t x = 0, t0 = sl_now_ns();
        for (uint64_t i = 0; i < iters; i++) {
#if defined(__x86_64__)
            __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
                             "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
                             : "+r"(x));
#elif defined(__aarch64__)
            __asm__ volatile("add %0, %0, #1\n\tadd %0, %0, #1\n\tadd %0, %0, #1\n\t"
                             "add %0, %0, #1\n\tadd %0, %0, #1\n\tadd %0, %0, #1\n\t"
                             "add %0, %0, #1\n\tadd %0, %0, #1"
                             : "+r"(x));
#else
            x += 8;
            __asm__ volatile("" : "+r"(x));
#endif
        }
        uint64_t dt = sl_now_ns() - t0;
        if (dt < best)
            best = dt;
    }
    return 8.0 * (double)iters / (double)(best ? best : 1);
}

/* This thread's hardware cycle counter, or -1. */
static int perf_cycles_open(void)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_HARDWARE;
    a.size = sizeof a;
    a.config = PERF_COUNT_HW_CPU_CYCLES;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
}

static uint64_t perf_cycles_read(int fd)
{
    uint64_t v = 0;
    if (fd < 0 || read(fd, &v, sizeof v) != (ssize_t)sizeof v)
        return 0;
    return v;
}

/* Ticks per nanosecond, measured against the monotonic clock. */
static double ticks_per_ns(void)
{
    uint64_t t0 = sl_now_ns(), c0 = ticks();
    while (sl_now_ns() - t0 < 50000000ull)
        ;
    return (double)(ticks() - c0) / (double)(sl_now_ns() - t0);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_normal(uint64_t *s)
{
    double u1 = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (double)(rng_next(s) >> 11) / 9007199254740992.0;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Per-row widths averaging exactly avg bits, from the greedy allocator on
 * the closed-form RE of channels whose crest factor max|w|/rms is spread as
 * in trained weights (log-normal around 3.5, a few heavy-tailed channels). */
static int make_widths(uint8_t *w, uint32_t rows, double avg, uint64_t *seed)
{
    double *re = malloc(sizeof(double) * rows * 9);
    if (!re)
        return -ENOMEM;
    for (uint32_t r = 0; r < rows; r++) {
        double crest = 3.5 * exp(0.35 * rng_normal(seed));
        if (rng_next(seed) % 20 == 0)
            crest *= exp(2.0 * (double)(rng_next(seed) >> 11) / 9007199254740992.0);
        for (uint32_t b = 1; b <= 8; b++)
            re[(size_t)r * 9 + b] = quantizer_re_proxy(crest, 1.0, b);
    }
    int ret = quantizer_allocate(rows, re, NULL, NULL, avg, w);
    free(re);
    return ret;
}

struct contender {
    enum unpack_kernel kernel;
    int enc;                  /* index into encs[] */
    double *gbps, *tpw, *cpw, *cached, *hot, *warm; /* per repetition; tpw: counter ticks per
                                                      weight, cpw: perf cycles per weight
                                                      (perf only) */
};

/* the fourth: adaptive with a multiplier 1..4 per block of 32 weights of a
 * row (header version 2; the same code bytes plus 2 bits per block) */
#define N_ENC 4
static const uint32_t encs[N_ENC] = {FORMAT_ENC_ADAPTIVE, FORMAT_ENC_INT4INT8, FORMAT_ENC_BITPLANE,
                                     FORMAT_ENC_ADAPTIVE};
static const char *const enc_labels[N_ENC] = {"adaptive", "int4int8", "bitplane", "adaptive+m"};
static const uint32_t avgs[4] = {4, 5, 6, 7};

struct run {
    uint32_t rows, cols, reps_fixed;
    double seconds, tpn, ghz; /* counter ticks per ns; core GHz */
    int perf_fd;              /* hardware cycle counter, or -1 */
    int8_t *q, *out, *hot;
    size_t hot_rows;
};

static double gbps_of(size_t n, uint64_t t0, uint64_t t1)
{
    return (double)n / (double)(t1 > t0 ? t1 - t0 : 1);
}

/* Writes back and drops n bytes at p from every cache level, so that the
 * next reads come from memory (x86 clflush, arm64 dc civac; elsewhere
 * nothing, and "hot" then means input wherever it happens to be). */
static void evict(const void *p, size_t n)
{
#if defined(__x86_64__)
    for (size_t i = 0; i < n; i += 64)
        _mm_clflush((const char *)p + i);
    _mm_mfence();
#elif defined(__aarch64__)
    for (size_t i = 0; i < n; i += 64)
        __asm__ volatile("dc civac, %0" : : "r"((const char *)p + i) : "memory");
    __asm__ volatile("dsb ish" : : : "memory");
#else
    (void)p;
    (void)n;
#endif
}

/* Rows [r0, r1) in pieces of hot_rows into the hot buffer. */
static void unpack_hot(struct run *R, const struct unpack_tensor *u, enum unpack_kernel k,
                       uint32_t r0, uint32_t r1)
{
    for (uint32_t r = r0; r < r1; r += (uint32_t)R->hot_rows) {
        uint32_t e = r + (uint32_t)R->hot_rows < r1 ? r + (uint32_t)R->hot_rows : r1;
        unpack_tensor_rows(u, k, r, e, R->hot, NULL);
    }
}

/* One repetition of one contender: stream (the store policy users get),
 * stream with cached stores, hot (input flushed), warm (input in L2). */
static void time_one(struct run *R, const struct unpack_tensor *u, struct contender *c,
                     uint32_t rep)
{
    size_t n = (size_t)R->rows * R->cols;
    uint64_t p0 = perf_cycles_read(R->perf_fd), t0 = sl_now_ns(), c0 = ticks();
    unpack_tensor_rows(u, c->kernel, 0, R->rows, R->out, NULL);
    uint64_t c1 = ticks(), t1 = sl_now_ns(), p1 = perf_cycles_read(R->perf_fd);
    c->cpw[rep] = (double)(p1 - p0) / (double)n;
    unpack_tensor_rows_store(u, c->kernel, 0, R->rows, R->out, NULL, UNPACK_STORE_CACHED);
    evict(u->layout.data, u->layout.data_len);
    uint64_t t2 = sl_now_ns();
    unpack_hot(R, u, c->kernel, 0, R->rows);
    uint64_t t3 = sl_now_ns(), warm_ns = 0;
    for (uint32_t r0 = 0, r1; r0 < R->rows; r0 = r1) {
        /* rows [r0, r1): the fewest from r0 holding 256 KiB of codes, or the rest */
        for (r1 = r0 + 1; r1 < R->rows && u->row_off[r1] - u->row_off[r0] < (256u << 10); r1++)
            ;
        unpack_hot(R, u, c->kernel, r0, r1);
        uint64_t w0 = sl_now_ns();
        unpack_hot(R, u, c->kernel, r0, r1);
        warm_ns += sl_now_ns() - w0;
    }
    c->gbps[rep] = gbps_of(n, t0, t1);
    c->tpw[rep] = (double)(c1 - c0) / (double)n;
    c->cached[rep] = gbps_of(n, t1, t2);
    c->hot[rep] = gbps_of(n, t2, t3);
    c->warm[rep] = gbps_of(n, 0, warm_ns);
}

/* Adds a contender's row; its stream, hot and warm medians into med3[0..2]
 * for the adaptive-versus-bitplane line. 0 or -ENOMEM. */
static int add_result(cJSON *arr, const struct contender *c, uint32_t avg, double bpw,
                      uint32_t reps, double ghz, int perf, int json, double med3[3])
{
    struct tools_stats g, t, h, ca, w, cy;
    int ret;
    if ((ret = tools_stats_compute(c->gbps, reps, &g)) < 0 ||
        (ret = tools_stats_compute(c->tpw, reps, &t)) < 0 ||
        (ret = tools_stats_compute(c->hot, reps, &h)) < 0 ||
        (ret = tools_stats_compute(c->cached, reps, &ca)) < 0 ||
        (ret = tools_stats_compute(c->warm, reps, &w)) < 0)
        return ret;
    double med = g.median, best = g.max, cached = ca.median;
    /* core cycles per weight: the counter, else ns per weight (1 / GB/s) x core GHz */
    double cpw = ghz / med, cpw_min = ghz / best;
    if (perf) {
        if ((ret = tools_stats_compute(c->cpw, reps, &cy)) < 0)
            return ret;
        cpw = cy.median;
        cpw_min = cy.min;
    }
    double hot = h.median, hot_best = h.max;
    double warm = w.median, warm_best = w.max;
    med3[0] = med;
    med3[1] = hot;
    med3[2] = warm;
    const char *enc = enc_labels[c->enc];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "kernel", unpack_kernel_name(c->kernel));
    cJSON_AddStringToObject(e, "encoding", enc);
    cJSON_AddNumberToObject(e, "avg_bits", avg);
    cJSON_AddNumberToObject(e, "bytes_per_weight", bpw);
    cJSON_AddNumberToObject(e, "gbps", med);
    cJSON_AddNumberToObject(e, "gbps_best", best);
    cJSON_AddNumberToObject(e, "cycles_per_weight", cpw);
    cJSON_AddNumberToObject(e, "cycles_per_weight_min", cpw_min);
    cJSON_AddNumberToObject(e, "ticks_per_weight", t.median);
    cJSON_AddNumberToObject(e, "gbps_cached_stores", cached);
    cJSON_AddNumberToObject(e, "gbps_hot", hot);
    cJSON_AddNumberToObject(e, "gbps_hot_best", hot_best);
    cJSON_AddNumberToObject(e, "gbps_warm", warm);
    cJSON_AddNumberToObject(e, "gbps_warm_best", warm_best);
    cJSON_AddNumberToObject(e, "reps", reps);
    cJSON_AddItemToArray(arr, e);
    if (!json)
        printf("%-9s %-7s %6.3f %8.2f %8.2f %8.3f %8.3f %8.2f %8.2f %8.2f %8.2f %8.2f\n", enc,
               unpack_kernel_name(c->kernel), bpw, med, best, cpw, cpw_min, cached, hot,
               hot_best, warm, warm_best);
    return 0;
}

/* One bit mix: widths, codes, the three encodings, all contenders. */
static int bench_mix(struct run *R, uint32_t avg, uint64_t *seed, cJSON *arr, int json)
{
    uint32_t rows = R->rows, cols = R->cols;
    size_t n = (size_t)rows * cols;
    enum unpack_kernel ks[UNPACK_KERNEL_COUNT];
    int nk = unpack_kernels_available(ks), nc = 0, ret = -ENOMEM;
    struct contender cs[N_ENC * UNPACK_KERNEL_COUNT];
    struct unpack_tensor ut[N_ENC];
    void *bytes[N_ENC] = {NULL, NULL, NULL, NULL};
    uint64_t len[N_ENC];
    uint32_t nb = format_packed_mult_blocks(cols);
    uint8_t *mult = malloc((size_t)rows * nb);
    int8_t *qt = malloc((size_t)rows * cols); /* what the multiplier tensor gives */
    uint8_t *w = malloc(rows);
    float *sc = malloc(sizeof(float) * rows);
    struct sl_err err = {{0}};
    memset(cs, 0, sizeof cs);
    memset(ut, 0, sizeof ut);
    if (!w || !sc || !qt || !mult)
        goto fail;
    if ((ret = make_widths(w, rows, avg, seed)) < 0) {
        fprintf(stderr, "sluice bench unpack: bit allocation failed (%s)\n", strerror(-ret));
        goto fail;
    }
    uint32_t hist[9] = {0};
    for (uint32_t r = 0; r < rows; r++) {
        hist[w[r]]++;
        sc[r] = 1.0f / 64;
        int m = (1 << (w[r] - 1)) - 1;
        for (uint32_t c = 0; c < cols; c++) {
            uint64_t x = rng_next(seed);
            R->q[(size_t)r * cols + c] =
                (int8_t)(w[r] == 1 ? (x & 1 ? 1 : -1) : (int)(x % (uint64_t)(2 * m + 1)) - m);
        }
    }
    for (size_t i = 0; i < (size_t)rows * nb; i++) /* multipliers 1..4, in turn */
        mult[i] = (uint8_t)(1 + (rng_next(seed) & 3));
    for (size_t i = 0; i < n; i++) {
        uint32_t r = (uint32_t)(i / cols), m = mult[(size_t)r * nb + (i % cols) / 32],
                 mx = format_packed_mult_max(w[r]);
        qt[i] = (int8_t)(R->q[i] * (m < mx ? m : mx));
    }
    for (int e = 0; e < N_ENC; e++) {
        /* the container stores every tensor at a 64-byte aligned offset and the
         * loader reads into page-aligned buffers: time the bytes aligned the
         * same way (malloc's 16-byte alignment would split vector loads) */
        void *packed = NULL;
        if ((ret = quantizer_pack_mult(encs[e], R->q, w, sc, rows, cols, e == 3 ? mult : NULL,
                                       &packed, &len[e], &err)) < 0) {
            fprintf(stderr, "sluice bench unpack: %s\n", err.msg);
            goto fail;
        }
        bytes[e] = sl_alloc_aligned(len[e], 64);
        if (bytes[e])
            memcpy(bytes[e], packed, len[e]);
        free(packed);
        if (!bytes[e]) {
            ret = -ENOMEM;
            fprintf(stderr, "sluice bench unpack: out of memory for a packed tensor\n");
            goto fail;
        }
        if ((ret = unpack_tensor_init(&ut[e], encs[e], bytes[e], len[e], rows, cols, &err)) < 0) {
            fprintf(stderr, "sluice bench unpack: %s\n", err.msg);
            goto fail;
        }
        for (int k = 0; k < nk; k++) {
            struct contender *c = &cs[nc++];
            c->kernel = ks[k];
            c->enc = e;
        }
    }
    /* check every contender, and time one round to size the repetitions */
    uint64_t t0 = sl_now_ns();
    for (int i = 0; i < nc; i++) {
        memset(R->out, 0x55, n);
        unpack_tensor_rows(&ut[cs[i].enc], cs[i].kernel, 0, rows, R->out, NULL);
        if (memcmp(R->out, cs[i].enc == 3 ? qt : R->q, n) != 0) {
            fprintf(stderr, "sluice bench unpack: kernel %s on %s does not return the packed "
                            "codes\n",
                    unpack_kernel_name(cs[i].kernel), enc_labels[cs[i].enc]);
            ret = -EIO;
            goto fail;
        }
    }
    double round_s = 5.0 * (double)(sl_now_ns() - t0) / 1e9; /* stream, cached, hot, 2 x warm */
    uint32_t reps = R->reps_fixed;
    if (!reps) {
        double r = R->seconds / 4 / (round_s > 1e-6 ? round_s : 1e-6);
        reps = r < 3 ? 3 : r > 201 ? 201 : (uint32_t)r;
    }
    for (int i = 0; i < nc; i++) {
        cs[i].gbps = calloc(reps, sizeof(double));
        cs[i].tpw = calloc(reps, sizeof(double));
        cs[i].cpw = calloc(reps, sizeof(double));
        cs[i].hot = calloc(reps, sizeof(double));
        cs[i].cached = calloc(reps, sizeof(double));
        cs[i].warm = calloc(reps, sizeof(double));
        if (!cs[i].gbps || !cs[i].tpw || !cs[i].cpw || !cs[i].hot || !cs[i].cached ||
            !cs[i].warm) {
            ret = -ENOMEM;
            goto fail;
        }
    }
    for (uint32_t rep = 0; rep < reps; rep++) /* contenders interleaved */
        for (int i = 0; i < nc; i++)
            time_one(R, &ut[cs[i].enc], &cs[i], rep);
    if (!json) {
        printf("\naverage %u bits: %u x %u, %u repetitions; channels per width 1..8:", avg, rows,
               cols, reps);
        for (int b = 1; b <= 8; b++)
            printf(" %u", hist[b]);
        printf("\n%-9s %-7s %6s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "encoding", "kernel",
               "B/w", "GB/s med", "best", "cyc/w", "min", "cached", "hot med", "best", "warm med",
               "best");
    }
    double med[N_ENC][UNPACK_KERNEL_COUNT][3];
    for (int i = 0; i < nc; i++) {
        ret = add_result(arr, &cs[i], avg, (double)ut[cs[i].enc].layout.data_len / (double)n,
                         reps, R->ghz, R->perf_fd >= 0, json, med[cs[i].enc][cs[i].kernel]);
        if (ret < 0)
            goto fail;
    }
    if (!json) {
        printf("adaptive vs bitplane (same bytes), median:");
        for (int k = 0; k < nk; k++)
            printf(" %s %.2fx stream, %.2fx hot, %.2fx warm;", unpack_kernel_name(ks[k]),
                   med[0][ks[k]][0] / med[2][ks[k]][0], med[0][ks[k]][1] / med[2][ks[k]][1],
                   med[0][ks[k]][2] / med[2][ks[k]][2]);
        printf("\n");
    }
    ret = 0;
fail:
    for (int i = 0; i < nc; i++) {
        free(cs[i].gbps);
        free(cs[i].tpw);
        free(cs[i].cpw);
        free(cs[i].hot);
        free(cs[i].cached);
        free(cs[i].warm);
    }
    for (int e = 0; e < N_ENC; e++) {
        unpack_tensor_fini(&ut[e]);
        sl_free_aligned(bytes[e]);
    }
    free(qt);
    free(mult);
    free(w);
    free(sc);
    return ret;
}

int bench_unpack(int argc, char **argv)
{
    struct run R = {.rows = 4096, .cols = 4096, .seconds = 20};
    int json = 0;
    struct tools_args args = {"sluice bench unpack", usage, argc, argv, 0};
    for (args.i = 1; args.i < argc; args.i++) {
        const char *a = argv[args.i];
        int bad = 0;
        if (tools_args_help(&args)) {
            return 0;
        } else if (!strcmp(a, "--rows")) {
            bad = tools_args_u32(&args, 1, 1u << 20, &R.rows);
        } else if (!strcmp(a, "--cols")) {
            bad = tools_args_u32(&args, 1, UNPACK_CORR_MAX_COLS, &R.cols);
        } else if (!strcmp(a, "--seconds")) {
            bad = tools_args_double(&args, 0, 3600, TOOLS_ARGS_ABOVE_MIN, &R.seconds);
        } else if (!strcmp(a, "--reps")) {
            bad = tools_args_u32(&args, 1, 1000000, &R.reps_fixed);
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else {
            bad = tools_args_unexpected(&args);
        }
        if (bad)
            return 2;
    }
    size_t n = (size_t)R.rows * R.cols;
    R.hot_rows = 16384 / R.cols ? 16384 / R.cols : 1;
    R.q = malloc(n);
    R.out = sl_alloc_aligned(n, 64);
    R.hot = sl_alloc_aligned(R.hot_rows * R.cols, 64);
    cJSON *o = cJSON_CreateObject();
    int status = 1;
    if (!R.q || !R.out || !R.hot || !o) {
        fprintf(stderr, "sluice bench unpack: out of memory for a %u x %u tensor\n", R.rows,
                R.cols);
        goto out;
    }
    memset(R.out, 0, n); /* fault the pages in before timing */
    R.tpn = ticks_per_ns();
    R.ghz = core_ghz();
    R.perf_fd = perf_cycles_open();
    const char *cycles = R.perf_fd >= 0 ? "hardware cycle counter (perf_event_open)"
                                        : "time x core clock measured by a dependent add chain "
                                          "(no hardware cycle counter here)";
    cJSON_AddNumberToObject(o, "rows", R.rows);
    cJSON_AddNumberToObject(o, "cols", R.cols);
    cJSON_AddNumberToObject(o, "hot_rows", (double)R.hot_rows);
    cJSON_AddStringToObject(o, "cycle_counter", tick_name);
    cJSON_AddNumberToObject(o, "cycle_counter_ghz", R.tpn);
    cJSON_AddNumberToObject(o, "core_ghz", R.ghz);
    cJSON_AddStringToObject(o, "cycles", cycles);
    cJSON_AddStringToObject(o, "best_kernel", unpack_kernel_name(unpack_kernel_best()));
    cJSON *arr = cJSON_AddArrayToObject(o, "results");
    if (!json)
        printf("sluice bench unpack: one core, clock %.2f GHz by a dependent-add chain, %s at "
               "%.3f GHz\nGB/s = 10^9 int8 weights out per second; cyc/w = core cycles per "
               "weight from the %s\n",
               R.ghz, tick_name, R.tpn, cycles);
    uint64_t seed = 0x5eed;
    for (int a = 0; a < 4; a++) {
        fprintf(stderr, "sluice bench unpack: %u-bit mix (%d of 4)\n", avgs[a], a + 1);
        if (bench_mix(&R, avgs[a], &seed, arr, json) < 0)
            goto out;
    }
    if (json) {
        char *s = cJSON_Print(o);
        if (s)
            printf("%s\n", s);
        free(s);
    }
    status = 0;
out:
    cJSON_Delete(o);
    if (R.perf_fd >= 0)
        close(R.perf_fd);
    free(R.q);
    sl_free_aligned(R.out);
    sl_free_aligned(R.hot);
    return status;
}
