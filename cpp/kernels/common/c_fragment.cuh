// An mma / wgmma C fragment on its way out: BF16 rounding of an FP32 pair, and the stmatrix store
// of a warp's 16 fragment rows into a 128B-swizzled staging tile (the layout a TMA box of 64 BF16
// columns has: row r of a box at r * 128 bytes, its 16-byte unit u at u ^ (r % 8)). Shared by the
// grouped-GEMM epilogues.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "common/ptx/smem.cuh"

namespace cake_moe {

// lo, hi rounded to BF16 (round to nearest even) and packed, lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// One stmatrix.x4: 8-column blocks i and i + 1 of a warp's 16 rows, from the C fragment `acc`
// (block i at acc[4 i ..]: columns 2q, 2q + 1 of rows g and g + 8, g = lane / 4, q = lane % 4),
// into a tile of 64-column boxes kBoxBytes apart whose row `row0` is the warp's first. Lane l
// gives the row address of matrix l / 8 (block i + l / 16, rows 0-7 or 8-15), row l % 8; with the
// swizzle the 8 rows of a matrix hit distinct units, so the store has no bank conflicts.
template <uint32_t kBoxBytes, int kRegs>
__device__ __forceinline__ void stmatrix_c_blocks(uint32_t tile, int row0, int i, const float (&acc)[kRegs], int lane) {
  const int m = lane / 8;
  const int row = row0 + (lane % 8) + 8 * (m % 2);  // row0 % 8 == 0: row % 8 == lane % 8
  const int blk = i + m / 2;
  ptx::stmatrix_x4(tile + (blk / 8) * kBoxBytes + row * 128 + (((blk % 8) ^ (lane % 8)) * 16),
                   pack_bf16x2(acc[4 * i + 0], acc[4 * i + 1]), pack_bf16x2(acc[4 * i + 2], acc[4 * i + 3]),
                   pack_bf16x2(acc[4 * i + 4], acc[4 * i + 5]), pack_bf16x2(acc[4 * i + 6], acc[4 * i + 7]));
}

}  // namespace cake_moe
