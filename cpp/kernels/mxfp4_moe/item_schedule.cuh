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
