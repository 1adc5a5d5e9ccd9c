// Finalize of the shared MoE engine (SPEC §5): out[t] = BF16(acc) with, in slot order
// s = 0..k-1, acc = fma(route row (BF16), weight (FP32), acc) over the token's local routes.
// Grid (tokens, column blocks): each thread owns 8 consecutive columns of one token (16-byte
// loads and stores), so even one token spreads over several SMs with all its slots' loads in
// flight. No atomics: the sum order is fixed, so the output is bitwise repeatable. A token without a local
// route gets exact zeros.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "common/ptx/grid_dependency.cuh"
#include "moe/params.hpp"

namespace cake_moe::moe {

__device__ __forceinline__ float route_weight(const FinalizeParams& p, int64_t route) {
  switch (RouteWeights(p.weight_kind)) {
    case RouteWeights::kBf16:
      return __uint_as_float(uint32_t(static_cast<const uint16_t*>(p.weights)[route]) << 16);
    case RouteWeights::kF32:
      return static_cast<const float*>(p.weights)[route];
    default:  // packed: the low 16 bits are the BF16 weight
      return __uint_as_float(uint32_t(static_cast<const int32_t*>(p.weights)[route]) << 16);
  }
}

// Route rows are loaded kBatch slots at a time, all in flight together, then added in slot order.
constexpr int kFinalizeBatch = 8;

__device__ __forceinline__ void finalize(const FinalizeParams& p) {
  __shared__ int32_t rows[32];
  __shared__ float weights[32];
  const int32_t t = blockIdx.x;
  // The route rows' positions (routing kernel) and the weights (inputs) are not written by the
  // launch this one depends on: read them before the wait, which only the rows themselves need.
  if (threadIdx.x < p.top_k) {
    const int64_t route = int64_t(t) * p.top_k + threadIdx.x;
    rows[threadIdx.x] = p.route_row[route];
    weights[threadIdx.x] = route_weight(p, route);
  }
  __syncthreads();
  ptx::grid_dependency_wait();  // the route rows come from GEMM2
  const int32_t c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c < p.hidden / 8) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int32_t s0 = 0; s0 < p.top_k; s0 += kFinalizeBatch) {
      uint4 v[kFinalizeBatch];
#pragma unroll
      for (int b = 0; b < kFinalizeBatch; ++b) {
        const int32_t row = s0 + b < p.top_k ? rows[s0 + b] : -1;
        v[b] = row < 0 ? make_uint4(0u, 0u, 0u, 0u)
                       : *reinterpret_cast<const uint4*>(p.rows + int64_t(row) * p.hidden + 8 * c);
      }
#pragma unroll
      for (int b = 0; b < kFinalizeBatch; ++b) {
        if (s0 + b >= p.top_k || rows[s0 + b] < 0) continue;  // a slot without a local route adds nothing
        const uint32_t w[4] = {v[b].x, v[b].y, v[b].z, v[b].w};
        const float wt = weights[s0 + b];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[2 * i] = __fmaf_rn(__uint_as_float(w[i] << 16), wt, acc[2 * i]);
          acc[2 * i + 1] = __fmaf_rn(__uint_as_float(w[i] & 0xFFFF0000u), wt, acc[2 * i + 1]);
        }
      }
    }
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      o[i] = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(acc[2 * i]))) |
             (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(acc[2 * i + 1]))) << 16);
    *reinterpret_cast<uint4*>(p.out + int64_t(t) * p.hidden + 8 * c) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

}  // namespace cake_moe::moe
