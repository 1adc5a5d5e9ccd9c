// 8-element chunks: the unit of work of the format kernels. A chunk is 16 bytes of BF16 or 32
// bytes of FP32, so every load and store is a full-width vector access.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "formats/args.hpp"

namespace cake_moe::formats {

constexpr int kChunk = kChunkElems;

template <typename T>
__device__ __forceinline__ void load_chunk(const void* base, int64_t chunk, float (&v)[kChunk]);

template <>
__device__ __forceinline__ void load_chunk<__nv_bfloat16>(const void* base, int64_t chunk, float (&v)[kChunk]) {
  const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(base) + chunk);  // streamed once: no L1 allocation
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);          // BF16 -> FP32 is exact: the high half
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

template <>
__device__ __forceinline__ void load_chunk<float>(const void* base, int64_t chunk, float (&v)[kChunk]) {
  const float4* p = reinterpret_cast<const float4*>(base) + 2 * chunk;
  const float4 a = __ldcs(p), b = __ldcs(p + 1);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

template <typename T>
__device__ __forceinline__ void store_chunk(void* base, int64_t chunk, const float (&v)[kChunk]);

template <>
__device__ __forceinline__ void store_chunk<__nv_bfloat16>(void* base, int64_t chunk, const float (&v)[kChunk]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);  // .x (low) = even element
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  __stcs(reinterpret_cast<uint4*>(base) + chunk, make_uint4(w[0], w[1], w[2], w[3]));
}

template <>
__device__ __forceinline__ void store_chunk<float>(void* base, int64_t chunk, const float (&v)[kChunk]) {
  float4* p = reinterpret_cast<float4*>(base) + 2 * chunk;
  __stcs(p, make_float4(v[0], v[1], v[2], v[3]));
  __stcs(p + 1, make_float4(v[4], v[5], v[6], v[7]));
}

}  // namespace cake_moe::formats
