// Block-wide inclusive prefix sum of a shared-memory table, and the search in it: the steps every
// ragged scheduler (sm_90a fwd/dgrad, sm_90a wgrad, portable) runs to turn per-slot work counts
// into offsets and a linear work index back into a slot.
#pragma once
#include <cstdint>

namespace cake_moe {

// a += b, or with kCap > 0 a = min(a + b, kCap) (block_inclusive_scan's saturating form).
template <typename T, T kCap>
__device__ __forceinline__ void scan_accumulate(T& a, T b) {
  if constexpr (kCap == T(0)) {
    a += b;
  } else {
    a = min(a + b, kCap);
  }
}

// table[0, n) in shared memory becomes its inclusive prefix sum (n <= 32 * 32). Warps scan
// 32-entry chunks with shuffles, warp 0 scans the chunk totals (`chunk_total`: 32 entries of
// shared memory), and the totals are added back. Every thread of the block must call it: it
// synchronises the block, also before returning.
//
// kCap > 0 (unsigned T, entries at most kCap, kCap + kCap not wrapping): the sums saturate at
// kCap instead, so a total past it reads as kCap, whatever the order of the additions.
template <typename T, T kCap = T(0)>
__device__ __forceinline__ void block_inclusive_scan(T* table, int32_t n, T* chunk_total) {
  static_assert(kCap == T(0) || (T(-1) > T(0) && kCap <= T(-1) / 2), "saturation needs an unsigned T, 2 kCap in range");
  const int32_t lane = threadIdx.x & 31;
  const int32_t warp = threadIdx.x >> 5;
  const int32_t num_warps = blockDim.x >> 5;
  const int32_t num_chunks = (n + 31) / 32;
  for (int32_t c = warp; c < num_chunks; c += num_warps) {
    const int32_t idx = c * 32 + lane;
    T v = idx < n ? table[idx] : T(0);
#pragma unroll
    for (int32_t d = 1; d < 32; d <<= 1) {
      const T up = __shfl_up_sync(0xffffffffu, v, d);
      if (lane >= d) scan_accumulate<T, kCap>(v, up);
    }
    if (idx < n) table[idx] = v;
    if (lane == 31) chunk_total[c] = v;
  }
  __syncthreads();
  if (warp == 0) {
    const T own = lane < num_chunks ? chunk_total[lane] : T(0);
    T v = own;
#pragma unroll
    for (int32_t d = 1; d < 32; d <<= 1) {
      const T up = __shfl_up_sync(0xffffffffu, v, d);
      if (lane >= d) scan_accumulate<T, kCap>(v, up);
    }
    if constexpr (kCap == T(0)) {
      chunk_total[lane] = v - own;
    } else {
      const T before = __shfl_up_sync(0xffffffffu, v, 1);  // v - own would undo a saturation
      chunk_total[lane] = lane > 0 ? before : T(0);
    }
  }
  __syncthreads();
  for (int32_t idx = threadIdx.x; idx < n; idx += blockDim.x) scan_accumulate<T, kCap>(table[idx], chunk_total[idx >> 5]);
  __syncthreads();
}

// The first index i of an inclusive prefix table[0, n) with table[i] > value (binary search;
// value must be below table[n - 1]): which slot a linear work index falls in.
__device__ __forceinline__ int32_t first_slot_above(const int32_t* table, int32_t n, int32_t value) {
  int32_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi) >> 1;
    if (table[mid] > value) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

}  // namespace cake_moe
