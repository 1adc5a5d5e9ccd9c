// 8-element chunks: the unit of work of the format kernels. A chunk is 16 bytes of BF16 or 32
// bytes of FP32, so every load and store is a full-width vector access.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "common/numerics.cuh"
#include "formats/args.hpp"

namespace cake_moe::formats {

constexpr int kChunk = kChunkElems;

// A loaded input chunk, as the quantizers hold it from their loads to their element encoding.
// BF16 stays packed for the FP4 quantizers (16 bytes: half the registers of its FP32 values, so
// more threads fit on an SM) and gives its amax with packed max instructions; FP32 is kept as
// values, and so is BF16 for MXFP8 (WidenedBf16Chunk below).
template <typename T>
struct InputChunk;

template <>
struct InputChunk<__nv_bfloat16> {
  uint4 raw;

  __device__ __forceinline__ void load(const void* base, int64_t chunk) {
    raw = __ldcs(reinterpret_cast<const uint4*>(base) + chunk);  // streamed once: no L1 allocation
  }
  __device__ __forceinline__ void zero() { raw = make_uint4(0u, 0u, 0u, 0u); }

  // max |x| over the chunk as FP32, NaN if any element is NaN: three packed maxima
  // (max.NaN.xorsign.abs: the magnitude is max(|a|, |b|), the sign is dropped below), then
  // the two halves.
  __device__ __forceinline__ float amax() const {
    uint32_t m;
    asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(raw.x), "r"(raw.y));
    asm("max.NaN.xorsign.abs.bf16x2 %0, %0, %1;" : "+r"(m) : "r"(raw.z));
    asm("max.NaN.xorsign.abs.bf16x2 %0, %0, %1;" : "+r"(m) : "r"(raw.w));
    return numerics::max_abs_nan(fabsf(__uint_as_float(m << 16)), __uint_as_float(m & 0xFFFF0000u));
  }

  __device__ __forceinline__ void values(float (&v)[kChunk]) const {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);          // BF16 -> FP32 is exact: the high half
      v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
  }
};

template <>
struct InputChunk<float> {
  float v[kChunk];

  __device__ __forceinline__ void load(const void* base, int64_t chunk) {
    const float4* p = reinterpret_cast<const float4*>(base) + 2 * chunk;
    const float4 a = __ldcs(p), b = __ldcs(p + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = 0.0f;
  }

  // max |x| over the chunk, NaN if any element is NaN (max.NaN)
  __device__ __forceinline__ float amax() const {
    float r = 0.0f;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) r = numerics::max_abs_nan(r, v[i]);
    return r;
  }

  __device__ __forceinline__ void values(float (&out)[kChunk]) const {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) out[i] = v[i];
  }
};

// BF16 input widened to FP32 at its load (the form the MXFP8 quantizer measured faster with:
// its FP8 encode takes FP32 pairs, so the packed form's late unpacking only moved work).
struct WidenedBf16Chunk : InputChunk<float> {
  __device__ __forceinline__ void load(const void* base, int64_t chunk) {
    InputChunk<__nv_bfloat16> packed;
    packed.load(base, chunk);
    packed.values(v);
  }
};

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
