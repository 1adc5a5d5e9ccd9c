// The persistent ragged tile scheduler of the portable grouped GEMM (fwd / dgrad;
// portable_bf16_grouped_gemm.cuh): a per-CTA shared-memory prefix of tile counts over the
// groups, built from the device-side offsets, and the tile of a linear index.
#pragma once

#include <cstdint>

#include "common/block_scan.cuh"  // first_slot_above (the scan stays inline, see init)
#include "grouped_gemm/group_rows.cuh"

namespace cake_moe {
namespace portable {

struct PortableTile {
  int32_t group;    // e
  int32_t row_end;  // one past the group's last row
  int32_t m0;       // first row of the tile
  int32_t n0;       // first output column of the tile
};

// Tile space: groups in order; inside a group m-tiles in order, n-tiles
// innermost. The smem table holds, per slot, the inclusive prefix of tile
// counts; a slot covers `span` = ceil(E / kTableSize) consecutive groups (1
// while E <= kTableSize), and a lookup finishes with a walk over <= span groups.
template <int kBM, int kBN, int kTableSize>
struct PortableRaggedScheduler {
  static_assert(kTableSize % 32 == 0 && kTableSize <= 1024, "two-level scan: at most 32 chunks of 32 slots");
  static constexpr uint32_t kSmemBytes = (kTableSize + 32) * sizeof(int32_t);

  const int32_t* table;
  const int32_t* offs;
  int32_t num_groups;
  int32_t capacity;
  int32_t leading_zero;
  int32_t n_tiles;  // output column tiles
  int32_t span;
  int32_t num_slots;
  int32_t total_tiles;

  __device__ __forceinline__ int32_t group_tiles(int32_t e) const {
    int32_t b, en;
    ragged_group_rows(offs, e, leading_zero, capacity, b, en);
    return ((en - b + kBM - 1) / kBM) * n_tiles;
  }

  // Collective over the whole CTA (contains __syncthreads). smem: kTableSize + 32 int32.
  __device__ __forceinline__ void init(int32_t* smem, const int32_t* offs_, int32_t num_groups_, int32_t capacity_,
                                       int32_t leading_zero_, int32_t n_out) {
    int32_t* chunk_total = smem + kTableSize;
    table = smem;
    offs = offs_;
    num_groups = max(num_groups_, 0);
    capacity = max(capacity_, 0);
    leading_zero = leading_zero_;
    n_tiles = (max(n_out, 0) + kBN - 1) / kBN;
    span = num_groups > 0 ? (num_groups + kTableSize - 1) / kTableSize : 1;
    num_slots = (num_groups + span - 1) / span;

    for (int32_t s = threadIdx.x; s < num_slots; s += blockDim.x) {
      const int32_t e_end = min(num_groups, (s + 1) * span);
      int32_t count = 0;
      for (int32_t e = s * span; e < e_end; ++e) count += group_tiles(e);
      smem[s] = count;
    }
    __syncthreads();

    const int32_t lane = threadIdx.x & 31;
    const int32_t warp = threadIdx.x >> 5;
    const int32_t num_warps = blockDim.x >> 5;
    const int32_t num_chunks = (num_slots + 31) >> 5;
    // The same scan as block_scan.cuh (kept inline: switching to it changes this form's SASS, so
    // it waits for the next GPU validation run).
    for (int32_t c = warp; c < num_chunks; c += num_warps) {  // inclusive scan of each 32-slot chunk
      const int32_t idx = c * 32 + lane;
      int32_t v = idx < num_slots ? smem[idx] : 0;
#pragma unroll
      for (int32_t d = 1; d < 32; d <<= 1) {
        const int32_t up = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) v += up;
      }
      if (idx < num_slots) smem[idx] = v;
      if (lane == 31) chunk_total[c] = v;
    }
    __syncthreads();
    if (warp == 0) {  // exclusive scan of the chunk totals
      const int32_t own = lane < num_chunks ? chunk_total[lane] : 0;
      int32_t v = own;
#pragma unroll
      for (int32_t d = 1; d < 32; d <<= 1) {
        const int32_t up = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) v += up;
      }
      chunk_total[lane] = v - own;
    }
    __syncthreads();
    for (int32_t idx = threadIdx.x; idx < num_slots; idx += blockDim.x) smem[idx] += chunk_total[idx >> 5];
    __syncthreads();
    total_tiles = num_slots > 0 ? smem[num_slots - 1] : 0;
  }

  // linear in [0, total_tiles)
  __device__ __forceinline__ PortableTile tile(int32_t linear) const {
    const int32_t lo = first_slot_above(table, num_slots, linear);
    int32_t local = linear - (lo > 0 ? table[lo - 1] : 0);
    int32_t e = lo * span;
    const int32_t e_last = min(num_groups, (lo + 1) * span) - 1;
    int32_t begin, end, m_tiles;
    for (;;) {
      ragged_group_rows(offs, e, leading_zero, capacity, begin, end);
      m_tiles = (end - begin + kBM - 1) / kBM;
      const int32_t count = m_tiles * n_tiles;
      if (local < count || e >= e_last) break;  // e_last: defensive, unreachable for linear < total
      local -= count;
      ++e;
    }
    const int32_t m_idx = local / n_tiles;
    const int32_t n_idx = local - m_idx * n_tiles;
    PortableTile t;
    t.group = e;
    t.row_end = end;
    t.m0 = begin + m_idx * kBM;
    t.n0 = n_idx * kBN;
    return t;
  }
};

}  // namespace portable
}  // namespace cake_moe
