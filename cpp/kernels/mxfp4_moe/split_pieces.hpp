// GEMM1's units computed as two K halves (family B decode, GemmParams::split_park): which units
// split, and which piece of the work a CTA's turn q is. Templates over the parameter struct (the
// kernels' GemmParams; a host test's stand-in with the same split fields), so that ctest checks
// the cover without the CUDA headers GemmParams needs.
#pragma once
#include <cstdint>

#include "common/host_device.hpp"

namespace cake_moe::mxfp4_moe {

// The first GEMM1 unit computed as K halves (GemmParams::split_park) when `units` has any: unit 0
// for a short first wave, else split_from.
template <class Params>
CAKE_HD int32_t split_first(const Params& p, int64_t units) { return units <= p.split_all_max ? 0 : p.split_from; }

// Units of `units` GEMM1 units computed as K halves: all of them when at most split_all_max,
// else those from split_from on if at most split_max; each adds one CTA's work item ("piece").
template <class Params>
CAKE_HD int32_t split_units(const Params& p, int64_t units) {
  if (p.split_park == nullptr || units <= 0) return 0;
  if (units <= p.split_all_max) return int32_t(units);
  if (units <= p.split_from || units - p.split_from > p.split_max) return 0;
  return int32_t(units - p.split_from);
}

// A CTA's share of GEMM1 under K halves (item_schedule.cuh, "K halves"): a whole unit, or one of
// the two halves of a split unit, which are handed out one after the other.
struct Piece {
  int unit;      // the GEMM1 unit (token tile x m-block)
  int k_first;   // its first K stage
  int k_stages;  // its K stages
  int half;      // -1: the whole unit, else 0 or 1
  int slot;      // a half's parking slot and flag (the unit's place among the split ones)
};
// Pieces of `units` GEMM1 units: one per unit and one more per split unit.
template <class Params>
CAKE_HD int num_pieces(const Params& p, int units) { return units + split_units(p, units); }
// Piece q of `units` units of num_k K stages: the units before split_first whole, then each
// split unit as its two halves (the first (num_k + 1) / 2 stages, then the rest), then the
// remaining units whole. Host-callable: ctest checks that the pieces cover every unit's K
// stages once.
template <class Params>
CAKE_HD Piece piece_of(const Params& p, int q, int units, int num_k) {
  const int split = split_units(p, units), first = split_first(p, units);
  const int j = q - first;
  if (split == 0 || j < 0) return {q, 0, num_k, -1, -1};
  if (j >= 2 * split) return {q - split, 0, num_k, -1, -1};  // (a guard: the split units are the last ones)
  const int half = j & 1, first_half = (num_k + 1) / 2;
  return {first + (j >> 1), half ? first_half : 0, half ? num_k - first_half : first_half, half, j >> 1};
}

}  // namespace cake_moe::mxfp4_moe
