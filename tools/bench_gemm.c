/* bench_gemm.c: `sluice bench gemm`: int8 GEMM throughput of the emulated
 * NPU's kernels on the prefill shapes of real models, as a fraction of the
 * machine's int8 peak measured in the same run, one core. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer.h"
#include "sluice.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench gemm [--seconds S] [--m LIST] [--json]\n\n"
            "Times the int8 GEMM kernels (scalar, avx2, avx512vnni, avxvnni: those this CPU\n"
            "has) on the projections of TinyLlama-1.1B and Llama-3-8B (m rows of a prefill\n"
            "chunk x k inputs x n outputs; default m = 1, 32, 128, 256, 512) on one core, and\n"
            "reports GOPS (2 ops per multiply-add) and the fraction of the peak, measured in\n"
            "the same run by a register-only loop of vpdpbusd (16 independent chains, no\n"
            "memory traffic). The scalar reference runs on m <= 32 only (it is ~100x slower).\n"
            "Each point is the best of repetitions within S seconds (default 0.3).\n");
}

struct shape {
    const char *model, *proj;
    uint32_t k, n;
};

static const struct shape shapes[] = {
    {"tinyllama-1.1b", "q,o", 2048, 2048},   {"tinyllama-1.1b", "k,v", 2048, 256},
    {"tinyllama-1.1b", "gate,up", 2048, 5632}, {"tinyllama-1.1b", "down", 5632, 2048},
    {"llama3-8b", "q,o", 4096, 4096},        {"llama3-8b", "k,v", 4096, 1024},
    {"llama3-8b", "gate,up", 4096, 14336},   {"llama3-8b", "down", 14336, 4096},
};

int bench_gemm(int argc, char **argv)
{
    double seconds = 0.3;
    int json = 0;
    uint32_t ms[16] = {1, 32, 128, 256, 512};
    int nm = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
            if (tools_parse_double(argv[++i], &seconds) || seconds <= 0) {
                fprintf(stderr, "sluice bench gemm: bad --seconds\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--m") && i + 1 < argc) {
            char *list = argv[++i], *tok, *save = NULL;
            nm = 0;
            for (tok = strtok_r(list, ",", &save); tok && nm < 16; tok = strtok_r(NULL, ",", &save))
                if (tools_parse_u32(tok, &ms[nm++]) || ms[nm - 1] == 0) {
                    fprintf(stderr, "sluice bench gemm: bad --m\n");
                    return 2;
                }
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else {
            usage(stderr);
            return 2;
        }
    }
    double peak = npu_gemm_peak_gops(NPU_KERNEL_AVX512VNNI, 0.5);
    const char *peak_kind = "avx512vnni vpdpbusd";
    if (peak == 0) {
        peak = npu_gemm_peak_gops(NPU_KERNEL_AVX2, 0.5);
        peak_kind = "avx2 maddubs step";
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "peak_gops", peak);
    cJSON_AddStringToObject(o, "peak_kernel", peak_kind);
    cJSON *arr = cJSON_AddArrayToObject(o, "results");
    if (!json)
        printf("measured peak: %.1f GOPS on one core (%s)\n\n%-15s %-8s %5s %6s %6s %-11s %9s "
               "%8s\n",
               peak, peak_kind, "model", "proj", "m", "k", "n", "kernel", "GOPS", "of peak");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const struct shape *sh = &shapes[s];
        int8_t *b = malloc((size_t)sh->n * sh->k);
        uint32_t mmax = 0;
        for (int i = 0; i < nm; i++)
            mmax = ms[i] > mmax ? ms[i] : mmax;
        int8_t *a = malloc((size_t)mmax * sh->k);
        int32_t *c = malloc(sizeof(int32_t) * (size_t)mmax * sh->n);
        if (!a || !b || !c) {
            fprintf(stderr, "sluice bench gemm: out of memory\n");
            return 1;
        }
        uint64_t seed = 99;
        for (size_t i = 0; i < (size_t)sh->n * sh->k; i++) {
            seed = seed * 6364136223846793005ull + 1;
            b[i] = (int8_t)((int)((seed >> 33) % 255) - 127);
        }
        for (size_t i = 0; i < (size_t)mmax * sh->k; i++) {
            seed = seed * 6364136223846793005ull + 1;
            a[i] = (int8_t)((int)((seed >> 33) % 255) - 127);
        }
        struct npu_gemm_b *pb;
        if (npu_gemm_b_create(b, sh->n, sh->k, &pb) < 0) {
            fprintf(stderr, "sluice bench gemm: out of memory\n");
            return 1;
        }
        for (int mi = 0; mi < nm; mi++) {
            uint32_t m = ms[mi];
            for (int kern = 0; kern < NPU_KERNEL_COUNT; kern++) {
                if (!npu_kernel_available((enum npu_kernel)kern))
                    continue;
                if (kern == NPU_KERNEL_SCALAR && m > 32)
                    continue;
                double ops = 2.0 * m * sh->k * sh->n, best = 0;
                uint64_t end = sl_now_ns() + (uint64_t)(seconds * 1e9);
                uint32_t reps = 0;
                do {
                    uint64_t t0 = sl_now_ns();
                    npu_gemm_s8_kernel((enum npu_kernel)kern, pb, a, m, 0, sh->n, c, sh->n);
                    double g = ops / (double)(sl_now_ns() - t0);
                    best = g > best ? g : best;
                    reps++;
                } while (sl_now_ns() < end || reps < 2);
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "model", sh->model);
                cJSON_AddStringToObject(e, "proj", sh->proj);
                cJSON_AddNumberToObject(e, "m", m);
                cJSON_AddNumberToObject(e, "k", sh->k);
                cJSON_AddNumberToObject(e, "n", sh->n);
                cJSON_AddStringToObject(e, "kernel", npu_kernel_name((enum npu_kernel)kern));
                cJSON_AddNumberToObject(e, "gops", best);
                cJSON_AddNumberToObject(e, "fraction_of_peak", peak > 0 ? best / peak : 0);
                cJSON_AddItemToArray(arr, e);
                if (!json)
                    printf("%-15s %-8s %5u %6u %6u %-11s %9.1f %7.1f%%\n", sh->model, sh->proj, m,
                           sh->k, sh->n, npu_kernel_name((enum npu_kernel)kern), best,
                           peak > 0 ? 100 * best / peak : 0);
            }
        }
        npu_gemm_b_destroy(pb);
        free(a);
        free(b);
        free(c);
    }
    if (json) {
        char *s = cJSON_Print(o);
        printf("%s\n", s);
        free(s);
    }
    cJSON_Delete(o);
    return 0;
}
