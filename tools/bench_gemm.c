/* bench_gemm.c: `sluice bench gemm`: int8 GEMM throughput of the emulated
 * NPU's kernels on the prefill shapes of real models, as a fraction of the
 * machine's int8 peak measured in the same run, on one core. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "sluice.h"
#include "tools_util.h"

/* The scalar reference is timed only up to this many multiply-adds per call. */
#define SCALAR_MAX_MACS (1ull << 28)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench gemm [--seconds S] [--m LIST] [--bits B] [--json]\n\n"
            "Times the int8 GEMM kernels of the emulated NPU (scalar, avx2, avx512vnni,\n"
            "avxvnni, amx: those this CPU has) on one core, on the linear layers of TinyLlama-1.1B\n"
            "and Llama-3-8B: m rows of a prefill chunk x k inputs x n outputs (default m = 1,\n"
            "32, 128, 256, 512; --m 256,64 to choose). Each call includes staging the\n"
            "activations, as the NPU device does for every job. A kernel with several\n"
            "register tilings is timed with each, and its best is reported (the device picks\n"
            "a tiling per graph shape the same way). GOPS count 2 ops per multiply-add.\n"
            "The peak is measured in the same run: the fastest kernel's register-only loop\n"
            "(no memory traffic), wall time, one core: with AMX four independent TDPBSSD\n"
            "tile chains (the vpdpbusd peak printed beside it), else 16 independent\n"
            "vpdpbusd zmm chains; fraction_of_peak is GOPS / peak. Without AVX-512 VNNI\n"
            "the peak is the AVX2 kernel's fastest inner step (the narrow one, below;\n"
            "8-bit codes take a slower one).\n"
            "The scalar reference runs only where m*k*n <= 2^28 (it is ~100x slower).\n"
            "Each point is the best of repeated calls within S seconds (default 0.3, split\n"
            "among the tilings; at most 600). Progress goes to stderr; --json prints one\n"
            "object with peak_gops and results [{model, proj, m, k, n, kernel, tile, gops,\n"
            "fraction_of_peak}].\n"
            "--bits B: weight codes of B bits, in [-(2^(B-1) - 1), 2^(B-1) - 1] (2..8,\n"
            "default 8): the AVX2 kernel takes a shorter step where every code of a\n"
            "16-channel block is within +-64 (B <= 7), as 5-bit quantized weights are,\n"
            "and a shorter one still where every code is within +-16 (B <= 5: four\n"
            "maddubs added in int16 per madd), which can exceed the peak above.\n");
}

struct shape {
    const char *model, *proj;
    uint32_t k, n;
};

static const struct shape shapes[] = {
    {"tinyllama-1.1b", "q,o", 2048, 2048},     {"tinyllama-1.1b", "k,v", 2048, 256},
    {"tinyllama-1.1b", "gate,up", 2048, 5632}, {"tinyllama-1.1b", "down", 5632, 2048},
    {"llama3-8b", "q,o", 4096, 4096},          {"llama3-8b", "k,v", 4096, 1024},
    {"llama3-8b", "gate,up", 4096, 14336},     {"llama3-8b", "down", 14336, 4096},
};

/* xorshift bytes in [-127, 127] */
static void fill(int8_t *x, size_t n, uint64_t *st)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t v = *st;
        v ^= v << 13, v ^= v >> 7, v ^= v << 17;
        *st = v;
        x[i] = (int8_t)((int)(v >> 56) % 255 - 127);
    }
}

/* Best GOPS of one kernel and tiling within `seconds` (at least 2 calls). */
static double time_point(enum npu_kernel kern, int tile, const struct npu_gemm_b *pb,
                         const int8_t *a, uint32_t m, uint32_t n, uint32_t k, int32_t *c,
                         double seconds)
{
    double ops = 2.0 * m * k * n, best = 0;
    uint64_t end = sl_now_ns() + (uint64_t)(seconds * 1e9);
    uint32_t reps = 0;
    do {
        uint64_t t0 = sl_now_ns();
        npu_gemm_s8_tile(kern, tile, pb, a, m, 0, n, c, n);
        double g = ops / (double)(sl_now_ns() - t0);
        best = g > best ? g : best;
        reps++;
    } while (sl_now_ns() < end || reps < 2);
    return best;
}

int bench_gemm(int argc, char **argv)
{
    double seconds = 0.3;
    uint32_t bits = 8;
    int json = 0;
    uint32_t ms[16] = {1, 32, 128, 256, 512};
    int nm = 5;
    struct tools_args args = {"sluice bench gemm", usage, argc, argv, 0};
    for (args.i = 1; args.i < argc; args.i++) {
        const char *a = argv[args.i];
        if (tools_args_help(&args)) {
            return 0;
        } else if (!strcmp(a, "--seconds")) {
            if (tools_args_double(&args, 0, 600, TOOLS_ARGS_ABOVE_MIN, &seconds) < 0)
                return 2;
        } else if (!strcmp(a, "--m")) {
            const char *value;
            if (tools_args_value(&args, &value) < 0)
                return 2;
            char list[256], *tok, *save = NULL;
            int too_long = snprintf(list, sizeof list, "%s", value) >= (int)sizeof list;
            nm = 0;
            for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (too_long || nm == 16 || tools_parse_u32(tok, &ms[nm]) || ms[nm] == 0 || ms[nm] > 8192) {
                    fprintf(stderr, "sluice bench gemm: --m wants up to 16 row counts in "
                                    "1..8192, comma-separated, not '%s'\n", value);
                    return 2;
                }
                nm++;
            }
            if (nm == 0) {
                fprintf(stderr, "sluice bench gemm: --m is empty\n");
                return 2;
            }
        } else if (!strcmp(a, "--bits")) {
            if (tools_args_u32(&args, 2, 8, &bits) < 0)
                return 2;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else {
            tools_args_unexpected(&args);
            return 2;
        }
    }
    fprintf(stderr, "sluice bench gemm: measuring the peak\n");
    enum npu_kernel pk;
    double peak = npu_gemm_peak_best(0.5, &pk);
    const char *peak_kind = pk == NPU_KERNEL_AMX          ? "amx tdpbssd, 4 tile chains"
                            : pk == NPU_KERNEL_AVX512VNNI ? "avx512vnni vpdpbusd zmm"
                            : pk == NPU_KERNEL_AVX2 ? "avx2 maddubs/madd/add step (codes within +-64)"
                                                    : "none";
    /* the VNNI peak beside it, where AMX has the highest (the VNNI kernels'
     * own fraction) */
    double peak_vnni = pk == NPU_KERNEL_AMX ? npu_gemm_peak_gops(NPU_KERNEL_AVX512VNNI, 0.5) : 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "peak_gops", peak);
    cJSON_AddStringToObject(o, "peak_kernel", peak_kind);
    if (peak_vnni > 0)
        cJSON_AddNumberToObject(o, "peak_gops_avx512vnni", peak_vnni);
    cJSON *arr = cJSON_AddArrayToObject(o, "results");
    char beside[64] = "";
    if (peak_vnni > 0)
        snprintf(beside, sizeof beside, "; avx512vnni vpdpbusd zmm %.1f GOPS", peak_vnni);
    if (!json)
        printf("measured peak: %.1f GOPS on one core (%s)%s\n\n%-15s %-8s %5s %6s %6s %-11s %-6s "
               "%9s %8s\n",
               peak, peak_kind, beside, "model", "proj", "m", "k", "n", "kernel", "tile", "GOPS",
               "of peak");
    uint32_t mmax = 0;
    for (int i = 0; i < nm; i++)
        mmax = ms[i] > mmax ? ms[i] : mmax;
    int rc = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const struct shape *sh = &shapes[s];
        fprintf(stderr, "sluice bench gemm: %s %s (k=%u n=%u), shape %zu of %zu\n", sh->model,
                sh->proj, sh->k, sh->n, s + 1, sizeof shapes / sizeof shapes[0]);
        int8_t *b = malloc((size_t)sh->n * sh->k);
        int8_t *a = malloc((size_t)mmax * sh->k);
        int32_t *c = malloc(sizeof(int32_t) * (size_t)mmax * sh->n);
        struct npu_gemm_b *pb = NULL;
        uint64_t seed = 99 + s;
        if (a && b && c) {
            fill(b, (size_t)sh->n * sh->k, &seed);
            for (size_t i = 0; bits < 8 && i < (size_t)sh->n * sh->k; i++)
                b[i] = (int8_t)(b[i] % (1 << (bits - 1))); /* |b| <= 2^(bits-1) - 1 */
            fill(a, (size_t)mmax * sh->k, &seed);
        }
        if (!a || !b || !c || npu_gemm_b_create(b, sh->n, sh->k, &pb) < 0) {
            fprintf(stderr, "sluice bench gemm: out of memory for %s %s\n", sh->model, sh->proj);
            free(a), free(b), free(c);
            rc = 1;
            break;
        }
        for (int mi = 0; mi < nm; mi++) {
            uint32_t m = ms[mi];
            for (int kern = 0; kern < NPU_KERNEL_COUNT; kern++) {
                if (!npu_kernel_available((enum npu_kernel)kern))
                    continue;
                if (kern == NPU_KERNEL_SCALAR && (uint64_t)m * sh->k * sh->n > SCALAR_MAX_MACS)
                    continue;
                int tiles = npu_kernel_tiles((enum npu_kernel)kern), bt = 0;
                double best = 0;
                for (int t = 0; t < tiles; t++) {
                    double g = time_point((enum npu_kernel)kern, t, pb, a, m, sh->n, sh->k, c,
                                          seconds / tiles);
                    if (g > best)
                        best = g, bt = t;
                }
                const char *tn = npu_kernel_tile_name((enum npu_kernel)kern, bt);
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "model", sh->model);
                cJSON_AddStringToObject(e, "proj", sh->proj);
                cJSON_AddNumberToObject(e, "m", m);
                cJSON_AddNumberToObject(e, "k", sh->k);
                cJSON_AddNumberToObject(e, "n", sh->n);
                cJSON_AddStringToObject(e, "kernel", npu_kernel_name((enum npu_kernel)kern));
                cJSON_AddStringToObject(e, "tile", tn);
                cJSON_AddNumberToObject(e, "gops", best);
                cJSON_AddNumberToObject(e, "fraction_of_peak", peak > 0 ? best / peak : 0);
                cJSON_AddItemToArray(arr, e);
                if (!json) {
                    printf("%-15s %-8s %5u %6u %6u %-11s %-6s %9.1f %7.1f%%\n", sh->model,
                           sh->proj, m, sh->k, sh->n, npu_kernel_name((enum npu_kernel)kern), tn,
                           best, peak > 0 ? 100 * best / peak : 0);
                    fflush(stdout);
                }
            }
        }
        npu_gemm_b_destroy(pb);
        free(a);
        free(b);
        free(c);
    }
    if (json && rc == 0) {
        char *str = cJSON_Print(o);
        printf("%s\n", str);
        free(str);
    }
    cJSON_Delete(o);
    return rc;
}
