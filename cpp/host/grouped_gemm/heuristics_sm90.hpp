// Tile choice of the sm_90a grouped GEMM (fwd, dgrad). Only host-side facts are available (the
// group sizes live on the device): the row capacity, the group count and the output width.
#pragma once
#include <cstdint>

#include "grouped_gemm/sm90_geometry.hpp"

namespace cake_moe::grouped_gemm {

struct Sm90Tile {
  int bm, bn, stages;
};

// The forms compiled for sm_90a (cpp/kernels/forms.py, SM90_GG_TILES).
inline constexpr Sm90Tile kSm90Tiles[] = {{128, 128, 5}, {128, 256, 3}, {64, 128, 8}};

// Measured on the H200 (2026-11-30, see docs/grouped_gemm.md): 128x256 leads once each group
// has thousands of rows, 128x128 below; 64-row tiles pay off only when groups average a few
// dozen rows, where a 128-row tile would be mostly padding.
inline Sm90Tile choose_sm90_tile(int64_t rows, int32_t num_groups, int32_t n_out) {
  const int64_t per_group = num_groups > 0 ? rows / num_groups : rows;
  if (per_group < 96) return kSm90Tiles[2];
  if (per_group >= 2048 && n_out >= 512) return kSm90Tiles[1];
  return kSm90Tiles[0];
}

}  // namespace cake_moe::grouped_gemm
