// Rows of a fwd / dgrad output that no group covers, [last group end, rows), set to zero.
// grouped_mm runs it before its GEMMs, so that y and x.grad are defined everywhere: the
// gradient of an input row that no expert reads is zero (a fresh output's rows would otherwise
// keep whatever the allocator held, and a NaN there poisons whatever sums over the rows later).
// Generic CUDA (every arch); the GEMM kernels are untouched.
#pragma once
#include <cstdint>

#include "grouped_gemm/unrouted_rows_params.hpp"

namespace cake_moe {

// The last group end is offs[num_offs - 1] for both conventions ([E] cumulative ends, [E + 1]
// m_indptr), clamped into [0, rows] as the schedulers clamp every end. Running before the GEMM
// on the same stream, this leaves to the GEMM any row that malformed offsets give to a group
// past a smaller last end.
__device__ __forceinline__ void zero_unrouted_rows(const UnroutedRowsParams& p) {
  const int32_t last = p.num_offs > 0 ? __ldg(p.offs + p.num_offs - 1) : 0;
  const int32_t end = min(max(last, 0), p.rows);
  // 64-bit rows: rows may reach 2^31 - 256, and one more grid step past the last would wrap
  for (int64_t r = int64_t(end) + blockIdx.x; r < p.rows; r += gridDim.x) {
    uint4* row = reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.out) + r * p.row_bytes);
    for (int32_t c = int32_t(threadIdx.x); c < p.row_chunks; c += int32_t(blockDim.x)) row[c] = make_uint4(0u, 0u, 0u, 0u);
  }
}

}  // namespace cake_moe
