/* npu_est.h: the attention estimate's int8 GEMMs: on AMX (npu_est_amx.c,
 * any codes, where the CPU has it), and the AVX2 one for narrow activations (npu_est_avx2.c):
 * codes within +-63 or +-31 (npu_job.a_max), weight blocks within +-64 (not
 * wide). Attention's Q.K estimate (infer_attn_sparse.c) quantizes Q to 7 bits
 * for it. Internal to the npu module (the graphs call it; the tests check it
 * against its scalar twin and the scalar GEMM). */
#ifndef SLUICE_NPU_EST_H
#define SLUICE_NPU_EST_H

#include <stddef.h>
#include <stdint.h>

#include "npu_gemm_internal.h"

/* How many groups of 4 k values add up in int16 before one madd for
 * activations within +-amax: 4 for amax <= 31 (offset 32: (a + 32) <= 63,
 * 63 x 64 x 2 x 4 = 32256), 2 for amax <= 63 (offset 64: (a + 64) <= 127,
 * 127 x 64 x 2 x 2 = 32512), else 0 (the kernel does not apply). */
int npu_est_presum(uint32_t amax);

/* The offset that makes the codes unsigned for presum P (2 or 4). */
static inline int npu_est_offset(int P)
{
    return P == 4 ? 32 : 64;
}

/* Stages a [m][k] (row stride k) for the kernel with presum P (2 or 4):
 * bytes a + 64 (P 2) or a + 32 (P 4) as unsigned, [m][k4] (k padded with
 * zeros); out: npu_gemm_prep_bytes(k4, m). Returns 0, or -1 when a code is
 * beyond the presum's bound (+-63, +-31: then out is not usable). */
int npu_est_prep(const int8_t *a, uint32_t m, uint32_t k, uint32_t k4, int P, uint8_t *out);

/* Whether every 16-channel block of b covering [r0, r1) is within +-64. */
int npu_est_blocks_ok(const struct npu_gemm_b *b, uint32_t r0, uint32_t r1);

/* The GEMM of npu_gemm_args (a staged by npu_est_prep with the same P; tile
 * ignored): the AVX2 kernel, and its scalar twin, which computes the kernel's
 * own steps (maddubs' saturated int16 pair sums, P groups added in int16 with
 * wrap-around, then int32, less offset x rowsum), so the tests can tell that
 * those steps never saturate or wrap. Both give the scalar GEMM's int32 sums
 * and floats on operands within the bounds. */
void npu_est_gemm_avx2(const struct npu_gemm_args *g, int P);
void npu_est_gemm_ref(const struct npu_gemm_args *g, int P);

/* AMX (npu_est_amx.c, built where the compiler has AMX: SLUICE_KERNELS_AMX):
 * whether its int8 tiles may run here (sl_cpu_features' amx: CPU, OS and
 * the process's permission; off where SLUICE_SIMD forces a lower level); the staging, a [m][k] (row stride k) copied to [m16][k4] with
 * zeros beyond m and k (m16: m rounded up to 16; npu_gemm_prep_bytes(k4, m)
 * holds it); and the GEMM of npu_gemm_args on it (a staged so, k4 a multiple
 * of 64, any int8 codes, tile ignored): the scalar GEMM's int32 sums and
 * floats. */
int npu_est_amx_available(void);
void npu_est_amx_prep(const int8_t *a, uint32_t m, uint32_t k, uint32_t k4, uint8_t *out);
void npu_est_gemm_amx(const struct npu_gemm_args *g);

#endif
