// Form choice of the sm_90a grouped GEMM (fwd / dgrad tiles, the wgrad's CTA pairs). Only
// host-side facts are available (the group sizes live on the device): the row capacity, the group
// count, the output width, and the part's SM count and DRAM bandwidth.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "grouped_gemm/sm90_geometry.hpp"

namespace cake_moe::grouped_gemm {

struct Sm90Tile {
  int bm, bn, stages;
  bool split_tail = false;  // a short last wave as N halves (sm90_bf16_grouped_gemm.cuh)
};

// The forms compiled for sm_90a (cpp/kernels/forms.py, SM90_GG_TILES).
inline constexpr Sm90Tile kSm90Tiles[] = {{128, 128, 5}, {128, 256, 3, true}, {64, 128, 8}, {128, 192, 4}};

// Time of one wave of a tile form against a wave of 128x128 tiles, as (tile width) x (time per
// FLOP). The wider tiles read fewer operand bytes per FLOP: 128x192 0.87, 128x256 0.93 of
// 128x128's time per FLOP on the H200 (the 2026-12-01 sweeps of the grid), 0.80 / 0.85 where
// memory is narrow (three sweeps of the grid on an H100, 2026-12-05,
// ..._h100_grouped_gemm_tiles.md). A 64x128 wave costs ~0.8 of a 128x128 one (0.69-0.86 in the
// 2026-12-04 small-T sweeps, ..._grouped_gemm_small_t.md).
inline double sm90_wave_width(int bm, int bn) { return bm == 64 ? 1.0 : bn / 128.0; }
inline double sm90_wave_per_flop(int bm, int bn, bool narrow_memory = false) {
  if (bm == 64) return 0.8;
  if (bn == 256) return narrow_memory ? 0.85 : 0.93;
  if (bn == 192) return narrow_memory ? 0.80 : 0.87;
  return 1.0;
}

// Expected cost of a tile form: whole waves of persistent CTAs over the tiles, times the wave's
// cost. The host does not know the group sizes: each group is taken to end in half a partial
// tile, and, where groups are small (`small`), to have at least one.
inline double sm90_tile_cost(int64_t rows, int32_t num_groups, int32_t n_out, int bm, int bn, int sms,
                             bool small = false, bool narrow_memory = false) {
  double m_tiles = double(rows) / bm + 0.5 * num_groups;
  if (small) m_tiles = std::max(m_tiles, double(num_groups));
  const double waves = std::ceil(m_tiles * double((n_out + bn - 1) / bn) / double(sms > 0 ? sms : 1));
  return waves * sm90_wave_width(bm, bn) * sm90_wave_per_flop(bm, bn, narrow_memory);
}

// The fwd / dgrad tile, from measurements on the H200 (docs/grouped_gemm.md, "Forms" and "Below
// the grid"; each threshold's same-call A/B is in bench/results/):
// - under 48 rows per group 64x128 (a 128-row tile would be mostly padding), or 128x192 where it
//   needs fewer whole waves at a lower cost (..._grouped_gemm_small_groups_ab.md);
// - else 128x128, or 128x256: the fwd once groups have thousands of rows, the dgrad by the wave
//   cost (it picked the faster tile on every grid row);
// - then 128x192 on groups under 1024 rows at a clear margin: cost below 0.85 of that choice
//   (..._grouped_gemm_128x192_ab.md; closer ratios won or lost up to 5%), 0.9 under 300 rows per
//   group, where 128x192's two whole waves against 128x128's three won on 40 of 46 rows
//   (..._grouped_gemm_192_margin_ab.md).
// Where memory is narrow (an H100) the 128-row tiles' wave costs take the narrow constants and the
// fwd takes 128x256 from 1024 rows per group: 128x256 was 0.2-10% faster than 128x128 on each of
// the five grid rows of 1024-1820 rows per group (..._h100_grouped_gemm_tiles.md). There, too, a
// fwd of many waves (kSm90ManyWaves of 128x128 tiles or more) chooses 128x256 by the wave cost as
// the dgrad does: 128x192's narrow credit was fitted where few waves make their rounding count,
// and with many it took 128x192 where 128x256 was 4-13% faster (layers of 32-128 experts at
// T = 16384 and 65536, 2026-12-06, ..._h100_grouped_gemm_layers_sweep_ee4a31b.md: five of the
// eight rows it changes 3.5-13% faster, three 0.4-2.2% slower; no row of the grid or below it
// changes, `python ci/gg_rule_change.py`). The small-group choice keeps the H200's constants: it
// was not measured on an H100.
inline constexpr int kSm90ManyWaves = 30;
inline Sm90Tile choose_sm90_tile(int64_t rows, int32_t num_groups, int32_t n_out, bool dgrad, int sms,
                                 bool narrow_memory = false) {
  const int64_t per_group = num_groups > 0 ? rows / num_groups : rows;
  const bool small = per_group < 48;
  const auto cost = [&](const Sm90Tile& t) {
    return sm90_tile_cost(rows, num_groups, n_out, t.bm, t.bn, sms, small, narrow_memory && !small);
  };
  if (small) return cost(kSm90Tiles[3]) < cost(kSm90Tiles[2]) ? kSm90Tiles[3] : kSm90Tiles[2];
  Sm90Tile best = kSm90Tiles[0];
  const int64_t fwd_wide_rows = narrow_memory ? 1024 : 2048;
  const bool by_cost = dgrad || (narrow_memory && cost(kSm90Tiles[0]) >= kSm90ManyWaves);  // 128x128: 1 a wave
  if (by_cost ? cost(kSm90Tiles[1]) < cost(best) : per_group >= fwd_wide_rows && n_out >= 512) best = kSm90Tiles[1];
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
