/* npu_amx_cfg.h: the AMX tile configuration that LDTILECFG reads (palette 1:
 * 64 bytes, each tile's rows and bytes per row), shared by the AMX kernels
 * (npu_gemm_amx.c, npu_est_amx.c, npu_rowmajor_amx.c); each configures its
 * own tiles. */
#ifndef SLUICE_NPU_AMX_CFG_H
#define SLUICE_NPU_AMX_CFG_H

#include <stdint.h>

struct npu_tilecfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

#endif
