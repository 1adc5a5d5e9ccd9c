// Persistent ragged tile scheduler of the grouped GEMM fwd / dgrad (the sm_90a kernels and the
// portable mma.sync ones).
//
// The tile space is the union over groups e of ceil(m_e / BM) x ceil(Nout / BN)
// output tiles, where m_e is the row count of group e read from `offs` on the
// device. Every CTA builds, in shared memory, the inclusive prefix sum of the
// per-group tile counts (no host sync, no preparation launch) and then maps a
// linear tile index to (group, m-tile, n-tile) by binary search. A CTA visits
// tiles blockIdx.x, blockIdx.x + gridDim.x, ...; every tile costs the same
// (same Kred), so this static stride balances as well as a dynamic queue and
// keeps the result independent of timing.
//
// Groups beyond the smem table: the table has kTableSize slots; when E is
// larger, each slot covers `span` = ceil(E / kTableSize) consecutive groups and
// the lookup finishes with a short linear walk over that slot's groups
// (reading their offsets from global memory / L1).
//
// Tile order: group-major, and inside a group bands of kRasterN n-tiles; a band
// is swept m-tile by m-tile with the n-tiles of the band innermost. CTAs that
// run together therefore cover about (132 / kRasterN) m-tiles x kRasterN
// n-tiles of one expert, sharing both the A rows and the weight tiles in L2.
// kRasterN = 0: no bands, all n-tiles of an m-tile innermost (the portable forms).
#pragma once

#include <cstdint>

#include "common/block_scan.cuh"
#include "grouped_gemm/group_rows.cuh"

namespace cake_moe {

struct GroupTile {
  int32_t group;    // expert index e
  int32_t row_end;  // one past the last row of the group (clamped to capacity)
  int32_t m0;       // first row of this tile (inside the group)
  int32_t n0;       // first output column of this tile
};

template <int kBM, int kBN, int kRasterN, int kTableSize>
struct RaggedTileScheduler {
  static_assert(kBM > 0 && kBN > 0 && kRasterN >= 0, "positive tile shape, raster width (0: no bands)");
  static_assert(kTableSize % 32 == 0 && kTableSize / 32 <= 32,
                "the two-level scan handles at most 32 chunks of 32 slots");
  // Tile counts saturate here and a total this large is refused (valid problems stay below it:
  // max_grouped_rows). 2^20 below 2^31: the CTAs' loops step their int32 tile index by the grid
  // past the total (and the sm_90a split tail adds up to half a grid of units) without wrapping.
  static constexpr uint32_t kTileCap = (1u << 31) - (1u << 20);
  // Shared memory the scheduler needs: the slot table plus 32 chunk totals.
  static constexpr uint32_t kSmemBytes = (kTableSize + 32) * sizeof(int32_t);

  const int32_t* table;  // smem: inclusive prefix of tile counts per slot
  const int32_t* offs;
  int32_t num_groups;
  int32_t capacity;
  int32_t leading_zero;
  int32_t n_tiles_n;
  int32_t span;       // groups per slot
  int32_t num_slots;  // used slots, <= kTableSize
  int32_t total_tiles;

  __device__ __forceinline__ void group_rows(int32_t e, int32_t& begin, int32_t& end) const { ragged_group_rows(offs, e, leading_zero, capacity, begin, end); }

  __device__ __forceinline__ int32_t group_m_tiles(int32_t e) const {
    int32_t b, en;
    group_rows(e, b, en);
    return (en - b + kBM - 1) / kBM;
  }

  // Collective: every thread of the CTA must call it (it contains
  // __syncthreads). smem_table holds kTableSize + 32 int32.
  // offs_: the device-side group ends; capacity_: rows of the operand (groups are clamped to it).
  __device__ __forceinline__ void init(int32_t* smem_table, const int32_t* offs_, int32_t num_groups_,
                                       int32_t capacity_, int32_t leading_zero_, int32_t n_out) {
    int32_t* chunk_total = smem_table + kTableSize;
    table = smem_table;
    offs = offs_;
    num_groups = max(num_groups_, 0);
    capacity = max(capacity_, 0);
    leading_zero = leading_zero_;
    n_tiles_n = (max(n_out, 0) + kBN - 1) / kBN;
    span = num_groups > 0 ? (num_groups + kTableSize - 1) / kTableSize : 1;
    num_slots = (num_groups + span - 1) / span;

    // 1) tile count of every slot and 2) their inclusive scan, both saturating at kTileCap:
    // valid offsets give fewer tiles in all, so a total that reaches it comes from malformed
    // offsets whose groups overlap (each may span every row). Then no tile runs, rather than
    // tiles decoded from a wrapped prefix (negative row starts). A group's own count fits: it is
    // at most the tiles of all the operand's rows.
    uint32_t* counts = reinterpret_cast<uint32_t*>(smem_table);
    for (int32_t j = threadIdx.x; j < num_slots; j += blockDim.x) {
      const int32_t e_end = min(num_groups, (j + 1) * span);
      uint32_t count = 0;
      for (int32_t e = j * span; e < e_end; ++e) count = min(count + uint32_t(group_m_tiles(e) * n_tiles_n), kTileCap);
      counts[j] = count;
    }
    __syncthreads();
    block_inclusive_scan<uint32_t, kTileCap>(counts, num_slots, reinterpret_cast<uint32_t*>(chunk_total));
    total_tiles = num_slots > 0 && counts[num_slots - 1] < kTileCap ? smem_table[num_slots - 1] : 0;
  }

  // Map a linear tile index in [0, total_tiles) to its tile.
  __device__ __forceinline__ GroupTile tile(int32_t linear) const {
    const int32_t lo = first_slot_above(table, num_slots, linear);
    int32_t local = linear - (lo > 0 ? table[lo - 1] : 0);
    int32_t e = lo * span;
    int32_t row_begin, row_end, m_tiles;
    for (;;) {  // at most `span` steps; terminates because linear < total_tiles
      group_rows(e, row_begin, row_end);
      m_tiles = (row_end - row_begin + kBM - 1) / kBM;
      const int32_t count = m_tiles * n_tiles_n;
      if (local < count) break;
      local -= count;
      ++e;
    }
    int32_t m_idx, n_idx;
    if constexpr (kRasterN == 0) {
      m_idx = local / n_tiles_n;
      n_idx = local - m_idx * n_tiles_n;
    } else {
      // raster inside the group: bands of kRasterN n-tiles (last band narrower)
      const int32_t band_tiles = kRasterN * m_tiles;
      const int32_t band = local / band_tiles;
      const int32_t rem = local - band * band_tiles;
      const int32_t width = min(kRasterN, n_tiles_n - band * kRasterN);
      m_idx = rem / width;
      n_idx = band * kRasterN + (rem - m_idx * width);
    }

    GroupTile t;
    t.group = e;
    t.row_end = row_end;
    t.m0 = row_begin + m_idx * kBM;
    t.n0 = n_idx * kBN;
    return t;
  }
};

}  // namespace cake_moe
