// Rows of a fwd / dgrad output in no group, before the first group's start (m_indptr's first
// entry, [0, first)) and past the last group end ([last end, rows)), set to zero.
// grouped_mm runs it before its GEMMs, so that y and x.grad are defined there: the gradient of
// an input row that no expert reads is zero (a fresh output's rows would otherwise keep
// whatever the allocator held, and a NaN there poisons whatever sums over the rows later).
// Generic CUDA (every arch); the GEMM kernels are untouched.
#pragma once
#include <cstdint>

#include "common/ptx/grid_dependency.cuh"
#include "grouped_gemm/unrouted_rows_params.hpp"

namespace cake_moe {

// The last group end is offs[num_offs - 1] for both conventions ([E] cumulative ends, [E + 1]
// m_indptr), the first group's start 0 or m_indptr's offs[0], each clamped into [0, rows] as the
// schedulers clamp every bound. Running before the GEMM on the same stream, this leaves to the
// GEMM any row that malformed offsets give to a group outside [first, last end).
__device__ __forceinline__ void zero_unrouted_rows(const UnroutedRowsParams& p) {
  ptx::allow_dependent_launch();  // the sm_90a GEMM after it may start; it waits before any access
  const int32_t last = p.num_offs > 0 ? __ldg(p.offs + p.num_offs - 1) : 0;
  const int32_t first_start = p.num_offs > 0 && p.leading_zero ? __ldg(p.offs) : 0;
  const int64_t head = min(max(first_start, 0), p.rows);  // rows [0, head), then [tail, rows)
  const int64_t tail = max(int64_t(min(max(last, 0), p.rows)), head);
  // A warp per row, its lanes over the row's 16-byte chunks: no division per store (the kernel
  // issues little else; rows of fewer than 32 chunks leave lanes idle, a CTA per row left most
  // of its threads idle); 64-bit row indices (the tail may hold nearly 2^31 rows).
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t v = warp; v < head + (p.rows - tail); v += warps) {
    const int64_t r = v < head ? v : tail + (v - head);
    uint4* row = reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.out) + r * p.row_bytes);
    for (int32_t c = int32_t(threadIdx.x & 31u); c < p.row_chunks; c += 32) row[c] = make_uint4(0u, 0u, 0u, 0u);
  }
}

}  // namespace cake_moe
