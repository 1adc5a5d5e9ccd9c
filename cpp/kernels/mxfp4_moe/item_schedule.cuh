// The token-tile schedule of the one-CTA-per-item mma.sync forms (mxfp4_moe_gemm.cuh): which
// item a CTA computes (the routing kernel's tile list), and the per-tile GEMM1 -> GEMM2 sync.
#pragma once
#include <cstdint>

#include "common/ptx/global_mem.cuh"
#include "common/ptx/mbarrier.cuh"
#include "moe/params.hpp"
#include "mxfp4_moe/epilogue.cuh"
#include "mxfp4_moe/params.hpp"

namespace cake_moe::mxfp4_moe {

template <typename Cfg>
struct Mxfp4MoeItemSchedule {
  static constexpr int kBN = Cfg::kBN, kBM = Cfg::kBM;
  using Tile = Mxfp4MoeEpilogue::Tile;

  // Tile sync (p.tile_done): GEMM1 lets GEMM2 launch once all its CTAs are resident and counts
  // each finished CTA per token tile; a GEMM2 CTA streams its first weight stages, then waits
  // only for its own tile's count, not for all of GEMM1 (docs/mxfp4_moe.md, "Tile sync"). Such a
  // GEMM2 CTA skips griddepcontrol.wait, so it reads the routing kernel's lists at L2 (that
  // kernel completed before GEMM1 passed its own wait).
  __device__ static __forceinline__ int tile_count(const GemmParams& p, bool at_l2) {
    return at_l2 ? ptx::ld_cg_s32(p.tile_count) : *p.tile_count;
  }

  // The work tile of unit `unit` (token tile unit / m_blocks < tile_count, m-block unit % m_blocks).
  __device__ static __forceinline__ Tile read_tile(const GemmParams& p, int unit, bool at_l2) {
    const int tile_index = int(uint32_t(unit) / uint32_t(p.m_blocks));  // (unsigned: the cheaper division)
    Tile t;
    int end;
    if (at_l2) {
      const int2 tt = ptx::ld_cg_s32x2(p.tiles + tile_index);
      t.expert = tt.x;
      t.row0 = tt.y;
      end = ptx::ld_cg_s32(p.offsets + t.expert + 1);
    } else {
      const moe::TokenTile tt = p.tiles[tile_index];
      t.expert = tt.expert;
      t.row0 = tt.row0;
      end = p.offsets[tt.expert + 1];
    }
    t.rows = end - t.row0 < kBN ? end - t.row0 : kBN;
    t.m0 = int(uint32_t(unit) % uint32_t(p.m_blocks)) * kBM;
    return t;
  }

  // Unit queue (GEMM1, p.unit_queue): the unit after this CTA's last, past the grid's first
  // units, in the order CTAs ask (as the block scheduler would hand a freed slot the next CTA).
  // Thread 0 takes it; a CTA barrier hands it to every thread and orders the finished unit's
  // shared-memory accesses (the K-split tail writes the ring) before the next unit's copies,
  // the TMA ones included (the proxy fence).
  __device__ static __forceinline__ int next_unit(const GemmParams& p) {
    __shared__ int next;
    if (threadIdx.x == 0) next = int(gridDim.x) + atomicAdd(p.unit_queue, 1);
    ptx::fence_proxy_async_smem();
    __syncthreads();
    return next;
  }

  // K halves (GEMM1 under tile sync, GemmParams::split_park). A short wave of units runs nearly
  // alone, each unit on a CTA whose per-stage chain sets its time; so when at most split_max
  // units lie past split_from (the resident CTAs: a short second wave), or there are at most
  // split_all_max units in all (fewer than the SMs: a short first wave), each of those units is
  // two pieces handed out one after the other, the first half of its K stages and the rest, and
  // both run at once. The half to finish first parks its partial sums; the other adds them to its
  // own and finishes the unit (SiTU, the tile's count). The sum is h0 + h1 whichever half parks
  // (FP32 addition commutes), so the bits follow from the split alone, not from the timing or
  // the grid (CAKE_MOE_UNIT_QUEUE). Which units split and which piece a CTA's turn is:
  // split_pieces.hpp (host-callable: ctest checks the cover).

  // After a half's mainloop: false when this CTA parked its partial sums (the other half
  // finishes the unit), true when acc now holds the unit's sums. Thread 0 claims the turn;
  // the first to claim parks (L2 stores, [accumulator][thread]: coalesced) and publishes,
  // the second waits for that (rarely: the halves end a stage apart) and adds.
  template <int kNBlocks>
  __device__ static bool meet_other_half(const GemmParams& p, int slot, float (&acc)[4][kNBlocks][4]) {
    constexpr int kAcc = 4 * kNBlocks * 4;
    static_assert(Cfg::kGemm1SplitsK && kAcc == Cfg::kAccPerLane, "a half's partial sums fit one parking slot");
    constexpr int32_t kPublished = 1 << 16;
    __shared__ int32_t claimed;
    int32_t* flag = p.split_flags + slot;
    float* park = p.split_park + int64_t(slot) * (moe::kSplitParkBytes / 4) + threadIdx.x;
    if (threadIdx.x == 0) claimed = atomicAdd(flag, 1);
    __syncthreads();
    if (claimed == 0) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) __stcg(park + i * Cfg::kThreads, acc[i / (4 * kNBlocks)][(i / 4) % kNBlocks][i % 4]);
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) atomicAdd(flag, kPublished);
      return false;
    }
    if (threadIdx.x == 0)
      while ((ptx::ld_acquire_gpu(reinterpret_cast<const uint32_t*>(flag)) & uint32_t(kPublished)) == 0u)
        __nanosleep(64);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      float& a = acc[i / (4 * kNBlocks)][(i / 4) % kNBlocks][i % 4];
      a += __ldcg(park + i * Cfg::kThreads);
    }
    return true;
  }

  // GEMM2 under tile sync: every GEMM1 CTA of the tile has counted itself in (acquire), so the
  // act rows of the tile are written before any thread of this CTA copies them.
  __device__ static __forceinline__ void await_tile(const GemmParams& p, int tile_index) {
    if (threadIdx.x == 0)
      while (ptx::ld_acquire_gpu(reinterpret_cast<const uint32_t*>(p.tile_done + tile_index)) <
             uint32_t(p.done_target))
        __nanosleep(128);
    __syncthreads();
  }

  // GEMM1 under tile sync: count this CTA in once every thread's act rows are written (release).
  __device__ static __forceinline__ void count_tile_done(const GemmParams& p, int tile_index) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(p.tile_done + tile_index, 1);
    }
  }
};

}  // namespace cake_moe::mxfp4_moe
