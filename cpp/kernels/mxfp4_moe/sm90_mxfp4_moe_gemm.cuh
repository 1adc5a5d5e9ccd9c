// Family B prefill GEMMs on sm_90a: the MXFP4 weights are dequantized in registers and fed to
// wgmma as its register operand A (RS form); the routed token rows are B, gathered by cp.async
// into the 128-byte-swizzled K-major tiles wgmma reads from shared memory.
//
// A work item (token tile t, m-block mb) is weight rows [mb * 256, +256) x the tile's 128 sorted
// rows; the grid is persistent (one CTA per SM walks the items). Warpgroup g owns prepared
// 64-row groups 2g and 2g + 1; warp w of it owns half w % 2 (two m16 blocks, 32 rows) of group
// 2g + w / 2, so one k16 step is two m64n128k16 wgmmas (wgmma i takes m16 block i of every
// warp's half). N = 128 halves the dequantization per multiply-add against N = 64; the price is
// the GEMM1 epilogue: an MXFP8 block (32 intermediate columns = one group) spans two warps, whose
// per-row amax partials meet in shared memory.
//
// Ring: kStages slots filled kStages - 2 stages ahead. Each k16 step's wgmmas are one commit
// group, and the previous group is retired right after a step is issued: at most two steps' A
// registers are live (more starves the 128 accumulators and ptxas serializes the wgmmas), and a
// slot is refilled only after every wgmma that read it has completed.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "common/ptx/mbarrier.cuh"
#include "common/ptx/sm80.cuh"
#include "common/ptx/wgmma.cuh"
#include "mxfp4_moe/mxfp4_moe_gemm.cuh"

namespace cake_moe::mxfp4_moe {

template <GemmStage kStage, typename Cfg>
struct Sm90Mxfp4MoeGemm {
  using Base = Mxfp4MoeGemm<kStage, Cfg>;  // pointer stage loader, weight reads, SiTU, requantization, GEMM2 epilogue
  using Wgmma = ptx::WgmmaBf16RS<Cfg::kBN, 0>;  // B K-major
  static constexpr int kBN = Cfg::kBN, kStages = Cfg::kStages, kThreads = Cfg::kThreads;
  static constexpr int kSmemBytes = Cfg::kSmemBytes;
  // Stages in flight ahead of the one computed. kStages - 1 would refill the slot stage ks - 1
  // read, so its last k16 step would have to retire before each barrier: measured 3-7% slower.
  static constexpr int kAhead = kStages - 2;
  static constexpr int kNBlocks = kBN / 8;
  static_assert(kAhead >= 1, "the ring needs a slot for the stage whose wgmmas are still running");
  static_assert(Cfg::kWarpsK == 1 && kThreads == 128 * Cfg::kWarpGroups, "whole warpgroups, no K split");
  static_assert(Wgmma::kAccRegs == 4 * kNBlocks, "the wgmma N is the token tile");

  using Acc = float[2][kNBlocks][4];  // [m16 block of the warp's half][n8 block][mma.sync C order]

  // k16 step s of unit u: the four A registers of each of the warp's two m16 blocks. Always the
  // two-multiply conversion (exact for every scale code): a branch to the one-multiply form for
  // codes <= 128, as in the portable kernels, measured 3.5-6% slower here (a second copy of the
  // unrolled mainloop, the warp vote and the branch cost more than one HMUL2 per bf16x2).
  template <int kS>
  __device__ static __forceinline__ void fragments(uint32_t (&a)[2][4], const uint2 (&wrow)[2][2],
                                                   const uint32_t (&codes)[2][2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t cg = (codes[i][0] >> (8 * (kS / 2))) & 0xFFu, cg8 = (codes[i][1] >> (8 * (kS / 2))) & 0xFFu;
      a_fragment<kS, true>(a[i], wrow[i][0], wrow[i][1], cg, cg8);
    }
  }

  template <int kS>
  __device__ static __forceinline__ void step(Acc& acc, const uint2 (&wrow)[2][2], const uint32_t (&codes)[2][2],
                                              uint32_t b_tile) {
    uint32_t a[2][4];
    fragments<kS>(a, wrow, codes);
    ptx::wgmma_fence();  // the A registers were just written by ordinary instructions
    const uint64_t desc = ptx::make_desc_kmajor_sw128(b_tile + 32 * kS);
#pragma unroll
    for (int i = 0; i < 2; ++i) Wgmma::mma(reinterpret_cast<float(&)[4 * kNBlocks]>(acc[i]), a[i], desc, 1u);
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();  // step s - 1 retired: its A registers may be reused by step s + 1
  }

  // One stage (two 64-element units, four k16 steps each) for the warp's 32 rows from row0.
  __device__ static __forceinline__ void compute_stage(const typename Base::Smem& sm, int slot, int row0, Acc& acc) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint2 wrow[2][2];
      uint32_t codes[2][2];
      Base::load_unit_weights(sm, slot, row0, 0, u, wrow, codes);
      const uint32_t b_tile = ptx::smem_addr(sm.b(slot)) + u * Cfg::kBTileBytes;
      step<0>(acc, wrow, codes, b_tile);
      step<1>(acc, wrow, codes, b_tile);
      step<2>(acc, wrow, codes, b_tile);
      step<3>(acc, wrow, codes, b_tile);
    }
  }

  // GEMM1 epilogue. Thread (g, q) holds, for m16 block b = 2 half + i of its group, up (c0, c1)
  // and gate (c2, c3) of intermediate column j0 + 4g + b for token rows 2q, 2q + 1 of each n8
  // block. The MXFP8 block of a row is the group's 32 columns: amax over i, the 8 lanes g, and
  // the partner warp (the group's other half) through shared memory, combined in warp order.
  __device__ static void epilogue_gemm1(const GemmParams& p, const typename Base::Tile& t, uint8_t* smem, int group,
                                        Acc& acc) {
    using namespace numerics;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3, half = warp & 1;
    const float beta = p.beta[t.expert], lbeta = p.linear_beta[t.expert];
    float* amax_rows = reinterpret_cast<float*>(smem + Cfg::kAmaxOffset);  // [warp][token row]
#pragma unroll
    for (int nb = 0; nb < kNBlocks; ++nb) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          acc[i][nb][c] = Base::situ(acc[i][nb][2 + c], acc[i][nb][c], beta, lbeta);
          amax = max_abs_nan(amax, acc[i][nb][c]);
        }
#pragma unroll
        for (int d = 4; d < 32; d <<= 1) amax = max_abs_nan(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
        if (g == 0) amax_rows[warp * kBN + nb * 8 + 2 * q + c] = amax;
      }
    }
    __syncthreads();
    const int inter = p.m / 2;
    const int j = (t.m0 + group * 64) / 2 + 4 * g + 2 * half;
    const float* even = amax_rows + (warp & ~1) * kBN;
    const float* odd = even + kBN;
#pragma unroll
    for (int nb = 0; nb < kNBlocks; ++nb) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int row = nb * 8 + 2 * q + c;
        uint32_t code;
        float to_elem;
        formats::detail::block_scale<formats::Fmt::kMxfp8>(max_abs_nan(even[row], odd[row]),
                                                           int32_t(formats::ScaleRule::kRoundUp), 0.0f, code, to_elem);
        const float from_elem = ue8m0_value(code);
        const float lo = Base::requant_value(acc[0][nb][c], code, to_elem, from_elem);
        const float hi = Base::requant_value(acc[1][nb][c], code, to_elem, from_elem);
        const uint32_t out = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
                             (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
        if (row < t.rows && j < inter) *reinterpret_cast<uint32_t*>(p.out + int64_t(t.row0 + row) * inter + j) = out;
      }
    }
  }

  __device__ static typename Base::Tile tile_of(const GemmParams& p, int work) {
    const moe::TokenTile tt = p.tiles[work / p.m_blocks];
    typename Base::Tile t;
    t.expert = tt.expert;
    t.row0 = tt.row0;
    const int end = p.offsets[tt.expert + 1];
    t.rows = end - tt.row0 < kBN ? end - tt.row0 : kBN;
    t.m0 = (work % p.m_blocks) * Cfg::kBM;
    return t;
  }

  // The first kAhead stages of an item into ring slots 0..kAhead-1 (the ring must be free).
  __device__ static void prologue(const GemmParams& p, const typename Base::Smem& sm,
                                  const typename Base::PointerLoader& loader) {
    const int num_k = p.k / Cfg::kKStage;  // K is a multiple of 128
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (s < num_k) Base::load_stage(p, loader, sm, s, s);
      ptx::cp_async_commit();
    }
  }

  // The mainloop over K of an item whose prologue is issued; returns with every wgmma retired,
  // every copy landed and the ring free for the next item's prologue.
  __device__ static void mainloop(const GemmParams& p, const typename Base::Smem& sm,
                                  const typename Base::PointerLoader& loader, int row0, Acc& acc) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][nb][j] = 0.0f;
    const int num_k = p.k / Cfg::kKStage;
    for (int ks = 0; ks < num_k; ++ks) {
      ptx::cp_async_wait<kAhead - 1>();
      ptx::fence_proxy_async_smem();  // cp.async wrote B through the generic proxy; wgmma reads it
      __syncthreads();  // stage ks landed; the stage that last used slot (ks + kAhead) % kStages retired
      const int next = ks + kAhead;
      if (next < num_k) Base::load_stage(p, loader, sm, next % kStages, next);
      ptx::cp_async_commit();
      compute_stage(sm, ks % kStages, row0, acc);
    }
    ptx::wgmma_wait<0>();
    ptx::reg_fence(reinterpret_cast<float(&)[2 * kNBlocks * 4]>(acc));
    ptx::cp_async_wait<0>();
    __syncthreads();  // every warp is done with the ring
  }

  // Persistent: a CTA walks items blockIdx.x, + gridDim.x, ...; the next item's first stages
  // are in flight while the current item's epilogue runs (it does not touch the ring).
  __device__ static void run(const GemmParams& p) {
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    ptx::grid_dependency_wait();  // the tile list and B rows come from the previous launches
    const int items = *p.tile_count * p.m_blocks;
    int work = blockIdx.x;
    if (work >= items) return;
    const typename Base::Smem sm{smem_raw};
    const int warp = threadIdx.x >> 5;
    const int group = 2 * (warp / 4) + (warp % 4) / 2;  // prepared 64-row group of the warp in the CTA
    const int row0 = group * 64 + (warp & 1) * 32;
    typename Base::Tile t = tile_of(p, work);
    typename Base::PointerLoader loader = Base::make_pointer_loader(p, t);
    prologue(p, sm, loader);
    while (true) {
      Acc acc;
      mainloop(p, sm, loader, row0, acc);
      const int next = work + int(gridDim.x);
      typename Base::Tile next_t{};
      if (next < items) {
        next_t = tile_of(p, next);
        loader = Base::make_pointer_loader(p, next_t);
        prologue(p, sm, loader);
      } else {
        ptx::allow_dependent_launch();  // the next GEMM / finalize may start; it waits for us
      }
      if constexpr (kStage == GemmStage::kGemm1) {
        epilogue_gemm1(p, t, smem_raw, group, acc);
      } else {
        Base::epilogue_gemm2(p, t, group * 64, 4 * (warp & 1), acc);  // the warp's half: blocks 2 half + i
      }
      if (next >= items) break;
      t = next_t;
      work = next;
    }
  }
};

}  // namespace cake_moe::mxfp4_moe
