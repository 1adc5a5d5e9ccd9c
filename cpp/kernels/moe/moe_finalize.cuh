// Finalize of the shared MoE engine (SPEC §5): out[t] = BF16(acc) with, in slot order
// s = 0..k-1, acc = fma(route row (BF16), weight (FP32), acc) over the token's local routes.
// Grid (tokens, column blocks): each thread owns 8 consecutive columns of one token (16-byte
// loads and stores), so even one token spreads over several SMs with all its slots' loads in
// flight. No atomics: the sum order is fixed, so the output is bitwise repeatable. A token without a local
// route gets exact zeros.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "common/ptx/sm80.cuh"
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

__device__ __forceinline__ void finalize(const FinalizeParams& p) {
  __shared__ int32_t rows[32];
  __shared__ float weights[32];
  const int32_t t = blockIdx.x;
  ptx::grid_dependency_wait();  // the route rows come from GEMM2
  if (threadIdx.x < p.top_k) {
    const int64_t route = int64_t(t) * p.top_k + threadIdx.x;
    rows[threadIdx.x] = p.route_row[route];
    weights[threadIdx.x] = route_weight(p, route);
  }
  __syncthreads();
  const int32_t c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c < p.hidden / 8) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int32_t s = 0; s < p.top_k; ++s) {
      const int32_t row = rows[s];
      if (row < 0) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(p.rows + int64_t(row) * p.hidden + 8 * c);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      const float wt = weights[s];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[2 * i] = __fmaf_rn(__uint_as_float(w[i] << 16), wt, acc[2 * i]);
        acc[2 * i + 1] = __fmaf_rn(__uint_as_float(w[i] & 0xFFFF0000u), wt, acc[2 * i + 1]);
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
