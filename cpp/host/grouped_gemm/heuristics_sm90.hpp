// Form choice of the sm_90a grouped GEMM (fwd / dgrad tiles, the wgrad's CTA pairs). Only
// host-side facts are available (the group sizes live on the device): the row capacity, the group
// count and the output width.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "grouped_gemm/sm90_geometry.hpp"

namespace cake_moe::grouped_gemm {

struct Sm90Tile {
  int bm, bn, stages;
};

// The forms compiled for sm_90a (cpp/kernels/forms.py, SM90_GG_TILES).
inline constexpr Sm90Tile kSm90Tiles[] = {{128, 128, 5}, {128, 256, 3}, {64, 128, 8}, {128, 192, 4}};

// Expected cost of a tile width: whole waves of persistent CTAs over the tiles, times each tile's
// work, with the wider tiles' better efficiency per FLOP (they read fewer operand bytes per FLOP:
// 128x192 0.87, 128x256 0.93 of 128x128's time per FLOP, fitted to the 2026-12-01 H200 sweeps of
// the grid). The host does not know the group sizes: each group is taken to end in half a partial
// 128-row tile.
inline double sm90_tile_cost(int64_t rows, int32_t num_groups, int32_t n_out, int bn, int sms) {
  const double tiles = (double(rows) / 128.0 + 0.5 * num_groups) * double((n_out + bn - 1) / bn);
  const double waves = std::ceil(tiles / double(sms > 0 ? sms : 1));
  const double per_flop = bn == 256 ? 0.93 : bn == 192 ? 0.87 : 1.0;
  return waves * (bn / 128.0) * per_flop;
}

// Groups averaging under 48 rows: each nonempty group has at least one M tile, so the tiles are
// counted as max(groups, rows / bm + half a tile per group). A wave of 64x128 tiles costs ~0.8 of
// a 128x128 wave (fitted to the 2026-12-04 small-T sweeps: they took 0.69-0.86 of it where
// 128x192 was the alternative), a 128x192 wave 1.5 x 0.87 of it as above.
inline double sm90_small_group_cost(int64_t rows, int32_t num_groups, int32_t n_out, int bm, int bn, int sms) {
  const double m_tiles = std::max(double(num_groups), double(rows) / bm + 0.5 * num_groups);
  const double waves = std::ceil(m_tiles * double((n_out + bn - 1) / bn) / double(sms > 0 ? sms : 1));
  return waves * (bm == 64 ? 0.8 : (bn / 128.0) * 0.87);
}

// Measured on the H200 (docs/grouped_gemm_experiments.md). 64-row tiles pay off only when groups
// average under 48 rows, where a 128-row tile would be mostly padding: at 48-96 rows per group
// the 128-row tiles were 3-27% faster on 21 of 24 rows, even on two, 3.6% slower on one (tile
// sweeps of the grid's layers at T = 256..4096, five runs over three group draws,
// bench/results/2026-12-04_h200_grouped_gemm_small_t.md). Between 128 and 256
// columns the fwd goes by the rows per group (128x256 once each group has thousands of rows),
// the dgrad by the wave cost above. 128x192 then replaces that choice only on groups of fewer
// than 1024 rows and at a clear margin (cost below 0.85 of it): at 0.78 it won by 9-16% in every
// same-call A/B of the default path; at 0.87-0.96 it won or lost up to 5%, and on longer groups it
// lost 1-7% although the tile sweep had it ahead (bench/results/2026-12-01_h200_grouped_gemm_128x192_ab.md).
// Below 300 rows per group the margin is 0.9, which takes in the 0.87 rows (two whole waves of
// 128x192 where 128x128 needs three): on 46 such rows of two fresh group draws at T = 512..3072 the
// default path with 128x192 ran 4.5% faster (geomean; 40 faster, 6 slower by up to 10.5%, where
// the actual 128-row tiles fill their waves: the host cannot see that), same-call A/B,
// bench/results/2026-12-04_h200_grouped_gemm_192_margin_ab.md. No grid row changes.
// Under 48 rows per group, 128x192 replaces 64x128 where it needs fewer whole waves at a lower
// cost (sm90_small_group_cost): e.g. one wave against two. In a same-call A/B on three fresh
// draws at T = 256..512 the 18 rows this changes ran 3-31% faster (geomean x1.086), none slower
// (bench/results/2026-12-04_h200_grouped_gemm_small_groups_ab.md).
inline Sm90Tile choose_sm90_tile(int64_t rows, int32_t num_groups, int32_t n_out, bool dgrad, int sms) {
  const int64_t per_group = num_groups > 0 ? rows / num_groups : rows;
  if (per_group < 48) {
    const bool wider = sm90_small_group_cost(rows, num_groups, n_out, 128, 192, sms) <
                       sm90_small_group_cost(rows, num_groups, n_out, 64, 128, sms);
    return wider ? kSm90Tiles[3] : kSm90Tiles[2];
  }
  const auto cost = [&](const Sm90Tile& t) { return sm90_tile_cost(rows, num_groups, n_out, t.bn, sms); };
  Sm90Tile best = kSm90Tiles[0];
  if (dgrad ? cost(kSm90Tiles[1]) < cost(best) : per_group >= 2048 && n_out >= 512) best = kSm90Tiles[1];
  const double margin_192 = per_group < 300 ? 0.9 : 0.85;
  if (per_group < 1024 && cost(kSm90Tiles[3]) < margin_192 * cost(best)) best = kSm90Tiles[3];
  return best;
}

// The wgrad on CTA pairs (gg_sm90_wgrad_<variant>_c2: X multicast into both CTAs, no split) when
// groups average at most 512 rows: no group of that size gains from the default form's split, and
// reading X once per pair wins 1-9% there (det, every T = 4096 row of the grid, H200 2026-12-02,
// bench/results/2026-12-02_h200_grouped_gemm_wgrad_pair_ab.md); at 1024 rows per group the two
// are even (-2..+1%), from ~1800 on the split's balance wins (up to 9%). bf16 output only.
inline bool use_sm90_wgrad_pair(int64_t rows, int32_t num_groups, bool out_f32) {
  return !out_f32 && num_groups > 0 && rows <= 512 * int64_t(num_groups);
}

}  // namespace cake_moe::grouped_gemm
