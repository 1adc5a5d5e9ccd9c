// Dequantization of MXFP8 / MXFP4 / NVFP4 to BF16 or FP32: value = element * scale, computed
// in FP32 (MX: exact; NVFP4: (e2m1 * s) / q in SPEC's order, the product exact and the quotient
// rounded once), then rounded once to the output type.
#pragma once
#include "common/numerics.cuh"
#include "common/ptx/grid_dependency.cuh"
#include "formats/args.hpp"
#include "formats/chunk_io.cuh"

namespace cake_moe::formats {

// Chunk c (kChunk consecutive elements of one row) of a.q -> a.out.
template <Fmt F, typename Out, bool kSwizzled>
__device__ __forceinline__ void dequantize_chunk(const DequantizeArgs& a, int64_t c) {
  using namespace numerics;
  constexpr int kBlock = block_size(F);
  const uint32_t r = a.chunks_per_row.div(uint32_t(c));
  const int64_t cols_sf = a.cols / kBlock;
  const uint32_t sc = a.chunks_per_row.mod(uint32_t(c), r) / (kBlock / kChunk);
  const uint32_t code = a.scale[kSwizzled ? swizzled_scale_offset(r, sc, round_up(cols_sf, 4)) : r * cols_sf + sc];

  float v[kChunk];
  if constexpr (F == Fmt::kMxfp8) {
    const uint2 q = __ldcs(reinterpret_cast<const uint2*>(a.q) + c);
    const float s = ue8m0_value(code);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = __fmul_rn(e4m3_decode(((i < 4 ? q.x : q.y) >> (8 * (i % 4))) & 0xFFu), s);
  } else {
    const uint32_t q = __ldcs(reinterpret_cast<const unsigned int*>(a.q) + c);
    // element i's exact product e2m1 * s, computed where each loop uses it
    const auto scaled = [q](int i, float s) { return __fmul_rn(e2m1_decode((q >> (4 * i)) & 0xFu), s); };
    if constexpr (F == Fmt::kMxfp4) {
      const float s = ue8m0_value(code);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] = scaled(i, s);
    } else {
      // (e2m1 * s) / q: the product is exact, the quotient rounded once. For q in [2^-100,
      // 2^100] (the same for every thread) a reciprocal and one correction per element divide
      // exactly (e2m1 * s is 0 or in [2^-10, 2688], so nothing leaves the normal range);
      // other global scales take IEEE division. (The product stays inside each loop: one
      // product loop shared with MXFP4 ahead of the division ran 3.5% slower from BF16.)
      const float s = e4m3_decode(code), g = *a.global_scale;
      if (g >= 0x1p-100f && g <= 0x1p100f) {
        const float y = __frcp_rn(g);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) v[i] = div_by_reciprocal(scaled(i, s), g, y);
      } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) v[i] = __fdiv_rn(scaled(i, s), g);
      }
    }
  }
  store_chunk<Out>(a.out, c, v);
}

// In a family-B plan with more than 32 routes this runs first and the routing kernel, its
// dependent launch, may start at once (it reads nothing written here and waits for this grid
// before it completes). With at most 32 routes the routing kernel runs first and this kernel,
// its dependent launch, waits for it before completing, so that GEMM1's wait on this grid covers
// both. Standalone (no dependent launch, no prerequisite grid) both calls are no-ops.
template <Fmt F, typename Out, bool kSwizzled>
__device__ __forceinline__ void dequantize(const DequantizeArgs& a) {
  ptx::allow_dependent_launch();
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < a.rows * a.cols / kChunk) dequantize_chunk<F, Out, kSwizzled>(a, c);
  ptx::grid_dependency_wait();
}

}  // namespace cake_moe::formats
