// The K-split tail of the mma.sync forms that split each stage's K over kWarpsK warps
// (mxfp4_moe_gemm.cuh): the partial sums meet in shared memory and the K warps share the item's
// epilogue.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "mxfp4_moe/epilogue.cuh"
#include "mxfp4_moe/params.hpp"

namespace cake_moe::mxfp4_moe {

template <GemmStage kStage, typename Cfg>
struct Mxfp4MoeKSplitTail {
  static constexpr int kBN = Cfg::kBN;
  static constexpr int kNBlocks = kBN / 8;
  using Epi = Mxfp4MoeEpilogue;  // SiTU, the MXFP8 block
  using Tile = Epi::Tile;

  // Every warp parks its partial sums in shared memory; then the kWarpsK warps of
  // a warp row wm share the epilogue of its 64 weight rows, each taking kBN / kWarpsK token rows
  // with one intermediate column (GEMM1) or two output columns (GEMM2) per lane. The partials
  // are added in warp order 0, 1, .. (the order the registers of warp 0 took before: same bits).
  // One warp doing the whole epilogue kept the other kWarpsK - 1 waiting: 17% of the stall
  // samples of n8_narrow at T = 1 sat at its barriers (Nsight source counters).
  static constexpr int kTailRows = kBN / Cfg::kWarpsK;  // token rows per warp in the tail
  static_assert(Cfg::kWarpsK == 1 || kBN % Cfg::kWarpsK == 0, "the tile's token rows split evenly over the K warps");

  // Float index of accumulator i of lane `lane` of warp (wm, wk) in the parking area. The lane is
  // XORed with the accumulator's m16 block (i / (4 kNBlocks)) so that the tail's reads (lanes
  // 4g + mb all reading lane 4g + q's value of block mb) fall in distinct banks.
  __device__ static __forceinline__ int park_index(int wk, int wm, int i, int lane) {
    return ((wk * Cfg::kWarpsM + wm) * Cfg::kAccPerLane + i) * 32 + (lane ^ (i / (4 * kNBlocks)));
  }

  __device__ static void park_partials(uint8_t* smem, int wm, int wk, const float (&acc)[4][kNBlocks][4]) {
    const int lane = threadIdx.x & 31;
    float* park = reinterpret_cast<float*>(smem);
    __syncthreads();  // the ring is no longer read
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int i = (mb * kNBlocks + nb) * 4 + j;
          park[park_index(wk, wm, i, lane)] = acc[mb][nb][j];
        }
    __syncthreads();
  }

  // For token row tr of the tile, the K-split sums of the C pair (c, 2 + c) that lane 4g + q of
  // m16 block mb = lane % 4 (g = lane / 4, tr = 8 nb + 2q + c) held: weight rows 16 mb + g and
  // + 8, i.e. GEMM1's up and gate of intermediate column 4g + mb, GEMM2's output columns
  // 8g + 2mb and + 1 (epilogue.cuh has the fragment layouts).
  __device__ static __forceinline__ float2 parked_pair(const float* park, int wm, int tr) {
    const int lane = threadIdx.x & 31, mb = lane & 3, g = lane >> 2;
    const int nb = tr >> 3, q = (tr & 7) >> 1, c = tr & 1;
    const int i = (mb * kNBlocks + nb) * 4 + c, src = 4 * g + q;
    float2 v = make_float2(park[park_index(0, wm, i, src)], park[park_index(0, wm, i + 2, src)]);
#pragma unroll
    for (int k = 1; k < Cfg::kWarpsK; ++k) {
      v.x += park[park_index(k, wm, i, src)];
      v.y += park[park_index(k, wm, i + 2, src)];
    }
    return v;
  }

  // GEMM1 tail: lane l computes intermediate column j0 + l of each of the warp's token rows; the
  // row's MXFP8 block is the warp's 32 lanes.
  __device__ static void tail_gemm1(const GemmParams& p, const Tile& t, const float* park, int wm, int wk) {
    using namespace numerics;
    const int lane = threadIdx.x & 31;
    const Epi::Situ s = Epi::situ_of(p, t.expert);
    const int inter = p.m / 2, j0 = (t.m0 + wm * 64) / 2;
#pragma unroll 1
    for (int r = 0; r < kTailRows; ++r) {
      const int tr = wk * kTailRows + r;
      if (tr >= t.rows) break;  // warp-uniform
      const float2 ug = parked_pair(park, wm, tr);
      const float v = Epi::situ(ug.y, ug.x, s);
      float amax = max_abs_nan(0.0f, v);
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) amax = max_abs_nan(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
      const float out = Epi::Mxfp8Block(amax).value(v);
      p.out[int64_t(t.row0 + tr) * inter + j0 + lane] = __bfloat16_as_ushort(__float2bfloat16_rn(out));
    }
  }

  // GEMM2 tail: lane l writes output columns h0 + 2l, + 1 of each of the warp's token rows.
  __device__ static void tail_gemm2(const GemmParams& p, const Tile& t, const float* park, int wm, int wk) {
    const int lane = threadIdx.x & 31;
    const int h0 = t.m0 + wm * 64;
#pragma unroll 1
    for (int r = 0; r < kTailRows; ++r) {
      const int tr = wk * kTailRows + r;
      if (tr >= t.rows) break;
      const float2 v = parked_pair(park, wm, tr);
      *reinterpret_cast<uint32_t*>(p.out + int64_t(t.row0 + tr) * p.m + h0 + 2 * lane) = pack_bf16x2(v.x, v.y);
    }
  }
};

}  // namespace cake_moe::mxfp4_moe
