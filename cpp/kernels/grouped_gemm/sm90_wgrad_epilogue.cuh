// The sm_90a weight-gradient epilogue (family A, wgrad): what a consumer warpgroup does with its
// 64 x kBN FP32 accumulator once a unit's mainloop is done.
//
//   split tiles (num_chunks > 1) meet in an FP32 workspace tile per consumer warpgroup:
//     kDet : chunk c waits for flag == c, then buf = buf + acc (chunk 0 stores), flag = c + 1;
//            the last chunk adds buf and writes dW: the sum order is chunk order.
//     kFast: every chunk red.global.add's its partial into buf and counts in; the last to
//            arrive reads buf and writes dW (arrival order: not bitwise repeatable).
//     The last chunk clears buf and its flag (the workspace is all zero between launches).
//   the store, bf16: each warpgroup's 64 x kBN tile, 128 columns per round, goes by stmatrix into
//     two 128B-swizzled 64 x 64 staging boxes (common/c_fragment.cuh) and out by TMA through a 3D
//     map over dW (the hardware clips rows past N and columns past K); the warps go on while the
//     TMA unit writes, and wait only before they refill the boxes. 32 KB of staging in all, so
//     the kernel keeps 4 ring stages (2026-12-01, H200: x1.100 / x1.101 against x1.086 / x1.090
//     with per-warp staging and lane stores, two passes; 64 KB of staging and 3 stages lost 4.6%).
//   the store, f32: each warp's 16 output rows pass through a 2 KB staging tile of its own, one
//     128-B chunk (32 columns) of every row at a time: 8-byte shared stores of the fragment, then
//     one 16-byte load per lane and row unit and predicated 16-byte stores, 8 lanes per 128-byte
//     row segment, never outside [0, N) x [0, K) of dW[e].
//
// Workspace layout and contract: wgrad_params.cuh.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/c_fragment.cuh"
#include "common/ptx/global_mem.cuh"
#include "common/ptx/mbarrier.cuh"
#include "common/ptx/smem.cuh"
#include "common/ptx/tma.cuh"
#include "grouped_gemm/wgrad_params.cuh"
#include "grouped_gemm/wgrad_scheduler.cuh"

namespace cake_moe {
namespace sm90 {

enum class WgradReduce : int { kDet = 0, kFast = 1 };

// kBN: the tile's output columns (one m64 x kBN accumulator per consumer warpgroup, kBN / 2
// FP32 registers per thread in wgmma C order); the tile has 128 rows (two warpgroups).
template <int kBN, WgradReduce kReduce, typename OutT>
struct WgradEpilogue {
  static constexpr int kAccRegs = kBN / 2;
  static constexpr bool kOutF32 = std::is_same<OutT, float>::value;
  static constexpr bool kDet = kReduce == WgradReduce::kDet;
  static constexpr uint32_t kTileFloats = 128 * kBN;   // one workspace tile
  static constexpr uint32_t kWgTileFloats = 64 * kBN;  // one consumer warpgroup's half
  // bf16: the warpgroup's 64 x kBN tile, kBN / 64 boxes of 64 rows x 128 B (128B swizzle), stored
  // by TMA; f32: per consumer warp 16 output rows x 128 B (32 columns at a time), stored by lanes
  static constexpr bool kTmaStore = !kOutF32;
  static constexpr int kChunkCols = 32;  // f32 columns per 128-byte row chunk
  static constexpr int kChunks = kBN / kChunkCols;
  static constexpr uint32_t kWarpTileBytes = 16 * 128;
  static constexpr uint32_t kBoxBytes = 64 * 128;
  // bf16: two boxes (128 columns) per warpgroup, stored in kBN / 128 rounds: 32 KB in all, so the
  // kernel keeps 4 ring stages
  static constexpr int kRoundBoxes = 2;
  static constexpr int kRounds = kBN / (64 * kRoundBoxes);
  static_assert(kBN % (64 * kRoundBoxes) == 0, "whole rounds of boxes");
  static constexpr uint32_t kWgStagingBytes = kTmaStore ? kRoundBoxes * kBoxBytes : 4 * kWarpTileBytes;
  static constexpr uint32_t kStagingBytes = 2 * kWgStagingBytes;  // both consumer warpgroups
  static constexpr uint32_t kStagingAlign = 1024;                  // 128B-swizzle atoms
  static_assert(kBN % kChunkCols == 0, "whole 128-B chunks per f32 row");
  static_assert(std::is_same<OutT, float>::value || std::is_same<OutT, __nv_bfloat16>::value, "out: bf16 or f32");

  int cw, tid_wg, lane, warp, g, q;  // consumer warpgroup, thread in it, lane, warp, lane / 4, lane % 4
  uint32_t staging;                  // this warpgroup's staging area (shared-window address)
  int32_t* bcast;                    // 2 words of shared memory (fast: the arrival count)
  uint32_t* flags;                   // workspace: per split slot, a flag per warpgroup
  float* bufs;                       // workspace: per split slot, an FP32 tile

  // Orders this warp's staging-tile writes before its reads. A named barrier of the warp's own
  // (ids 4-11) rather than __syncwarp: after a __syncwarp in the loop ptxas no longer keeps
  // the mainloop's stage and descriptors in uniform registers (an R2UR per wgmma operand).
  __device__ __forceinline__ void warp_sync() const { ptx::named_barrier_sync(4 + cw * 4 + warp, 32); }

  // F32 store of this warpgroup's 64 x kBN part of the tile: each warp's 16 rows pass through
  // its staging tile one 128-B chunk (32 columns) of every row at a time. The tile's 16-B units
  // are XOR-swizzled by row (unit u of row r at u ^ (r % 8)): the fragment writes and the row
  // reads are free of bank conflicts.
  __device__ __forceinline__ void store_rows(const float (&acc)[kAccRegs], const WgradUnit& w,
                                             const GroupedGemmWgradParams& p) {
    static_assert(kOutF32, "the bf16 forms store by TMA");
    float* out = reinterpret_cast<float*>(p.out) + static_cast<int64_t>(w.e) * p.n * p.k;
    const uint32_t tile = staging + warp * kWarpTileBytes;
    const int32_t row_w = w.n0 + cw * 64 + warp * 16;
    // the reads: lane -> unit lane % 8 of rows lane / 8 + 4 t
    const int u_rd = lane % 8, r_rd = lane / 8;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      warp_sync();  // the previous chunk's reads are done
      // 4 blocks of 8 columns; thread (g, q) holds columns 2q, 2q + 1 of rows g and g + 8
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int i = 4 * c + b;
        const uint32_t unit = static_cast<uint32_t>(2 * b + q / 2);
        const uint32_t off = (unit ^ static_cast<uint32_t>(g)) * 16 + (q % 2) * 8;
        ptx::st_shared_v2(tile + g * 128 + off, __float_as_uint(acc[4 * i]), __float_as_uint(acc[4 * i + 1]));
        ptx::st_shared_v2(tile + (g + 8) * 128 + off, __float_as_uint(acc[4 * i + 2]),
                          __float_as_uint(acc[4 * i + 3]));
      }
      warp_sync();
      const int32_t col = w.k0 + c * kChunkCols + u_rd * 4;
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int r = r_rd + 4 * t;
        const uint4 v = ptx::ld_shared_v4(tile + r * 128 + ((static_cast<uint32_t>(u_rd) ^ (r % 8)) * 16));
        const int32_t row = row_w + r;
        if (row < p.n && col < p.k)
          ptx::st_v4_u32(out + static_cast<int64_t>(row) * p.k + col, v.x, v.y, v.z, v.w);  // bound: store
      }
    }
  }

  // BF16 conversion of this warpgroup's 64 x kBN part, 128 columns (two 64 x 64 boxes) per round:
  // stmatrix into the staging boxes (one per two 8-column blocks; 16-B unit u of row r at
  // u ^ (r % 8), the TMA's 128B swizzle), then one thread stores the boxes by TMA (the hardware
  // clips rows past N and columns past K) and the warpgroup goes on. A round first waits until
  // the previous round's (or unit's) store has read the boxes.
  __device__ __forceinline__ void store_tma(const float (&acc)[kAccRegs], const WgradUnit& w,
                                            const GroupedGemmWgradParams& p) {
    const int32_t r0 = w.n0 + cw * 64;
    if (r0 >= p.n) return;  // uniform over the warpgroup: no row of this half is in dW
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      if (tid_wg == 0) ptx::tma_store_wait_read<0>();
      ptx::named_barrier_sync(1 + cw, 128);
      // blocks 16 round + i of the fragment into the round's two boxes: the helper places block
      // b in box b / 8 of its tile, so the tile passed starts 2 round boxes before the staging
#pragma unroll
      for (int i = 0; i < 8 * kRoundBoxes; i += 2)
        stmatrix_c_blocks<kBoxBytes>(staging - round * kRoundBoxes * kBoxBytes, warp * 16,
                                     8 * kRoundBoxes * round + i, acc, lane);
      ptx::fence_proxy_async_smem();  // the boxes, visible to the TMA unit
      ptx::named_barrier_sync(1 + cw, 128);
      if (tid_wg == 0) {
#pragma unroll
        for (int j = 0; j < kRoundBoxes; ++j) {
          const int32_t c0 = w.k0 + 64 * (kRoundBoxes * round + j);
          if (c0 < p.k) ptx::tma_store_3d(&p.tmap_out, staging + j * kBoxBytes, c0, r0, w.e);  // bound: store
        }
        ptx::tma_store_commit();
      }
    }
  }

  __device__ __forceinline__ void store(const float (&acc)[kAccRegs], const WgradUnit& w,
                                        const GroupedGemmWgradParams& p) {
    if constexpr (kTmaStore) {
      store_tma(acc, w, p);
    } else {
      store_rows(acc, w, p);
    }
  }

  // Before the CTA exits: its TMA stores have read their boxes (the shared memory goes away).
  // Every thread waits (a no-op where it issued none): a branch on the thread here made ptxas
  // move the det mainloop's descriptors out of the uniform registers.
  __device__ __forceinline__ void drain() const {
    if constexpr (kTmaStore) ptx::tma_store_wait_read<0>();
  }

  // A unit's epilogue: a chunk of a split tile adds into (or finishes) the workspace tile; the
  // unit that completes a tile (or holds it whole) stores it.
  __device__ __forceinline__ void run(float (&acc)[kAccRegs], const WgradUnit& w,
                                      const GroupedGemmWgradParams& p) {
    if (w.num_chunks > 1) {
      // this warpgroup's half of the slot's FP32 tile, in fragment order:
      // float4 i of thread t at (i * 128 + t) -- 512 contiguous bytes per warp access
      float* buf = bufs + static_cast<int64_t>(w.slot) * kTileFloats + cw * kWgTileFloats + tid_wg * 4;
      uint32_t* flag = flags + 2 * w.slot + cw;
      const bool last = w.chunk == w.num_chunks - 1;
      if constexpr (kDet) {
        if (w.chunk > 0) {
          if (tid_wg == 0) {
            while (ptx::ld_acquire_gpu(flag) != static_cast<uint32_t>(w.chunk)) __nanosleep(64);
          }
          ptx::named_barrier_sync(1 + cw, 128);
#pragma unroll
          for (int i = 0; i < kAccRegs / 4; ++i) {
            const float4 v = ptx::ld_cg_f4(buf + i * 512);
            // running sum in chunk order: (((p0 + p1) + p2) + ...)
            acc[4 * i + 0] = v.x + acc[4 * i + 0];
            acc[4 * i + 1] = v.y + acc[4 * i + 1];
            acc[4 * i + 2] = v.z + acc[4 * i + 2];
            acc[4 * i + 3] = v.w + acc[4 * i + 3];
          }
        }
        if (!last) {
#pragma unroll
          for (int i = 0; i < kAccRegs / 4; ++i)
            ptx::st_cg_f4(buf + i * 512, acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
          ptx::named_barrier_sync(1 + cw, 128);
          if (tid_wg == 0) {
            ptx::fence_acq_rel_gpu();
            ptx::st_relaxed_gpu(flag, static_cast<uint32_t>(w.chunk + 1));
          }
          return;
        }
        // last chunk: leave the slot clean for the next launch
#pragma unroll
        for (int i = 0; i < kAccRegs / 4; ++i) ptx::st_cg_f4(buf + i * 512, 0.f, 0.f, 0.f, 0.f);
        if (tid_wg == 0) ptx::st_relaxed_gpu(flag, 0u);
      } else {
#pragma unroll
        for (int i = 0; i < kAccRegs / 4; ++i)
          ptx::red_add_v4(buf + i * 512, acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
        ptx::named_barrier_sync(1 + cw, 128);
        if (tid_wg == 0) {
          ptx::fence_acq_rel_gpu();
          const uint32_t old = atomicAdd(flag, 1u);
          ptx::fence_acq_rel_gpu();
          bcast[cw] = static_cast<int32_t>(old);
        }
        ptx::named_barrier_sync(1 + cw, 128);
        if (bcast[cw] != w.num_chunks - 1) return;
        // last to arrive: buf holds every chunk's partial
#pragma unroll
        for (int i = 0; i < kAccRegs / 4; ++i) {
          const float4 v = ptx::ld_cg_f4(buf + i * 512);
          acc[4 * i + 0] = v.x;
          acc[4 * i + 1] = v.y;
          acc[4 * i + 2] = v.z;
          acc[4 * i + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < kAccRegs / 4; ++i) ptx::st_cg_f4(buf + i * 512, 0.f, 0.f, 0.f, 0.f);
        if (tid_wg == 0) ptx::st_relaxed_gpu(flag, 0u);
      }
    }
    store(acc, w, p);
  }
};

}  // namespace sm90
}  // namespace cake_moe
