// sm_90a ragged BF16 grouped GEMM (family A): forward and input gradient.
//
//   fwd  : Y[g_e]  = X[g_e] @ W[e]^T   (B = W[e] as [N, K], K-major)
//   dgrad: dX[g_e] = G[g_e] @ W[e]     (B = W[e] read in place, N-major)
//
// FP32 accumulation in wgmma, one rounding to BF16 in the epilogue.
//
// Structure (one CTA per SM, persistent, warp specialised, 384 threads):
//   warpgroup 0      producer: one thread issues TMA loads of A (BM x 64) and
//                    B (BN x 64) k-blocks into a kStages-deep smem ring, guarded
//                    by full/empty mbarriers; the warpgroup gives registers
//                    back with setmaxnreg.dec.
//   warpgroups 1, 2  consumers: wgmma m64 x kWgTileN x k16 from smem, one
//                    wgmma group kept in flight; setmaxnreg.inc. With BM = 128
//                    they split M (64 rows each); with BM = 64 they split N.
//   epilogue         each consumer warpgroup converts its 64 x kWgTileN
//                    accumulator to BF16 into a 128B-swizzled smem tile
//                    (stmatrix, four 8x8 blocks per instruction); if all
//                    64 rows lie inside the group it is written by TMA store
//                    (the hardware clips the N tail), otherwise by predicated
//                    16-byte stores limited to the group's rows and [0, Nout).
//                    The producer keeps prefetching the next tile meanwhile.
//                    (Flushing tile i's epilogue under tile i+1's first wgmma
//                    groups, with two accumulator sets, was correct and not
//                    faster on the H200: the staging stores compete with wgmma
//                    for shared memory. Removed; it is in the history.)
//   scheduler        scheduler.cuh: per-CTA prefix of ragged tile counts. The
//                    producer decodes each tile and hands it to the consumers
//                    with the tile's first stage (unit_slots.cuh), so they
//                    start a tile without a decode of their own.
//   split tail       (kSplitTail) when the last wave holds at most half the
//                    grid's CTAs, its tiles run as two halves along N, each
//                    on its own CTA (the consumer warpgroups on m64 x kWgTileN/2),
//                    so the kernel ends after half a tile instead of a whole
//                    one. The tile count is known only here, so every thread
//                    decides from it; a half computes its output columns with
//                    the same k16 steps in the same order: the same bits.
//
// Every output element is produced by one CTA with a fixed reduction order:
// results are bitwise reproducible run to run.
//
// Parameters and tensor-map contract: params.cuh.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "common/ptx/grid_dependency.cuh"
#include "common/ptx/mbarrier.cuh"
#include "common/c_fragment.cuh"
#include "common/ptx/smem.cuh"
#include "common/ptx/tma.cuh"
#include "common/ptx/wgmma.cuh"
#include "grouped_gemm/params.cuh"
#include "grouped_gemm/scheduler.cuh"
#include "grouped_gemm/unit_slots.cuh"

namespace cake_moe {
namespace sm90 {

enum class GroupedGemmOp : int { kFwd = 0, kDgrad = 1 };

// kSplitTail: a short last wave runs as N halves (above).
// kRasterN: n-tiles per raster band of the scheduler (L2 reuse).
// kTableSize: scheduler smem slots (groups per slot grow beyond it).
template <GroupedGemmOp kOp, int kBM, int kBN, int kStages, bool kSplitTail = false, int kRasterN = 8,
          int kTableSize = 1024>
struct GroupedGemmKernel {
  // ---- tiling -----------------------------------------------------------------
  // 64 bf16 = 128 bytes: exactly one row of the 128-byte swizzle atom, so one TMA
  // box row and one smem row per tile row (K-major) or per k (N-major).
  static constexpr int kBK = 64;
  static constexpr int kKSteps = kBK / 16;  // wgmma k16 steps per k-block
  static constexpr int kNumConsumerWG = 2;
  static constexpr int kNumThreads = 128 * (1 + kNumConsumerWG);
  static constexpr int kWgM = kBM / 64;               // consumer warpgroups along M
  static constexpr int kWgN = kNumConsumerWG / kWgM;  // ... and along N
  static constexpr int kWgTileN = kBN / kWgN;         // wgmma N of one warpgroup
  static constexpr bool kBNMajor = kOp == GroupedGemmOp::kDgrad;
  // the form's parameters, for hosts and harnesses
  static constexpr GroupedGemmOp kOperation = kOp;
  static constexpr int kBlockM = kBM;
  static constexpr int kBlockN = kBN;
  static constexpr int kNumStages = kStages;
  static constexpr bool kSplitsTail = kSplitTail;
  static constexpr int kHalfN = kWgTileN / 2;  // a warpgroup's N on a half tile

  static_assert(kBM == 64 || kBM == 128, "BM: one m64 wgmma per consumer warpgroup (128) or a shared m64 (64)");
  static_assert(kWgM * kWgN == kNumConsumerWG, "consumer warpgroups must tile the CTA tile exactly");
  static_assert(kBN % 64 == 0 && kBN <= 256, "BN: multiple of 64 (TMA store / N-major chunks), TMA box <= 256");
  static_assert(kWgTileN == 64 || kWgTileN == 128 || kWgTileN == 192 || kWgTileN == 256,
                "wgmma N instantiated for 64/128/192/256");
  static_assert(kWgTileN % 64 == 0, "a warpgroup's N range must be whole 64-column chunks (N-major LBO, stores)");
  static_assert(kStages >= 2, "need at least double buffering");
  static_assert(kRasterN >= 1, "raster width");
  static_assert(!kSplitTail || (kBM == 128 && kHalfN % 64 == 0),
                "a half tile is whole 64-column chunks of both 64-row slices (stores, N-major boxes)");

  // ---- shared memory ------------------------------------------------------------
  static constexpr uint32_t kABytes = kBM * kBK * 2;  // one A stage
  static constexpr uint32_t kBBytes = kBN * kBK * 2;  // one B stage
  static constexpr uint32_t kBChunkBytes = 64 * kBK * 2;  // one 64-column N-major box (dgrad)
  static constexpr uint32_t kDBytesPerWG = 64 * kWgTileN * 2;
  static constexpr uint32_t kDChunkBytes = 64 * 64 * 2;  // 64 rows x 64 cols bf16 = one store box
  using Scheduler = RaggedTileScheduler<kBM, kBN, kRasterN, kTableSize>;
  using Slots = UnitSlots<GroupTile, unit_slot_count(kStages), kNumConsumerWG * 128>;  // decoded tiles

  static constexpr uint32_t kOffA = 0;
  static constexpr uint32_t kOffB = kOffA + kStages * kABytes;
  static constexpr uint32_t kOffD = kOffB + kStages * kBBytes;
  static constexpr uint32_t kOffBar = kOffD + kNumConsumerWG * kDBytesPerWG;
  static constexpr uint32_t kOffSlots = kOffBar + 2 * kStages * 8;
  static constexpr uint32_t kOffTable = kOffSlots + Slots::kSmemBytes;
  static constexpr uint32_t kSmemUsed = kOffTable + Scheduler::kSmemBytes;
  // +1024: the dynamic smem base is aligned up to 1024 B at run time.
  static constexpr uint32_t kSmemBytes = kSmemUsed + 1024;

  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0 && kBChunkBytes % 1024 == 0,
                "every stage buffer must start on a 1024-B swizzle-atom boundary (descriptor base offset 0)");
  static_assert(kDBytesPerWG % 1024 == 0 && kDChunkBytes % 1024 == 0,
                "epilogue tiles are 128B-swizzled like TMA boxes, atom aligned");
  static_assert((64 * 128) % 1024 == 0, "the second m64 slice of A starts on an atom boundary");
  static_assert(kSmemBytes <= 232448, "exceeds the 227 KB of dynamic shared memory per block on sm_90");

  // ---- TMA boxes (host encodes the tensor maps with these) -------------------------
  static constexpr int kBoxAInner = kBK, kBoxARows = kBM;
  static constexpr int kBoxBInner = 64, kBoxBRows = kBNMajor ? kBK : kBN;
  // fwd with kSplitTail: a half tile's B through tmap_b_half, boxes of kBN / 2 rows (loading a
  // whole tile's B as two such boxes instead cost the fwd 1-3% at large T on the H200)
  static constexpr int kBoxBHalfRows = kBN / 2;
  static constexpr int kBoxDInner = 64, kBoxDRows = 64;
  static_assert(kBoxARows <= 256 && kBoxBRows <= 256, "TMA box dims are limited to 256");

  // ---- registers ---------------------------------------------------------------
  static constexpr uint32_t kProducerRegs = 40;
  static constexpr uint32_t kConsumerRegs = 232;
  static_assert(128 * kProducerRegs + 128 * kNumConsumerWG * kConsumerRegs <=
                    kNumThreads * ptx::launch_regs_per_thread(kNumThreads),
                "setmaxnreg budgets must fit the CTA's launch allocation");

  // Per-thread state and steps of a consumer warpgroup.
  struct Consumer {
    int cw, wm, wn, tid_wg, lane;
    uint32_t a_base, b_base;  // smem addresses of this warpgroup's slices in stage 0
    uint8_t* sd;              // this warpgroup's epilogue staging tile
    uint64_t* full_bar;
    uint64_t* empty_bar;
    int32_t k_blocks;
    uint32_t stage, phase;
    Slots slots;
    typename Slots::Reader tile_reader;

    // The next tile, published by the producer with the tile's first stage (waited here; the
    // mainloop's own wait on it then returns at once).
    __device__ __forceinline__ GroupTile next_tile() {
      ptx::mbar_wait_parity(&full_bar[stage], phase);
      return tile_reader.read(slots);
    }

    // Accumulate one tile (kN = kWgTileN) or half tile (kHalfN) into `acc`.
    template <int kN>
    __device__ __forceinline__ void mainloop(float (&acc)[kN / 2]) {
      using Mma = ptx::WgmmaBf16SS<kN, kBNMajor ? 1 : 0>;
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
      ptx::reg_fence(acc);
      uint32_t prev_stage = 0;
      for (int32_t kb = 0; kb < k_blocks; ++kb) {
        ptx::mbar_wait_parity(&full_bar[stage], phase);
        const uint32_t a_addr = a_base + stage * kABytes;
        const uint32_t b_addr = b_base + stage * kBBytes;
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
          // K-major: a k16 step is 32 B along the 128-B row (inside the atom).
          // N-major: a k16 step is 16 rows of 128 B = 2 whole atoms.
          const uint64_t da = ptx::make_desc_kmajor_sw128(a_addr + kk * 32);
          const uint64_t db = kBNMajor ? ptx::make_desc_mnmajor_sw128(b_addr + kk * 16 * 128, kBChunkBytes)
                                       : ptx::make_desc_kmajor_sw128(b_addr + kk * 32);
          Mma::mma(acc, da, db, 1u);  // bound: mma
        }
        ptx::wgmma_commit();
        ptx::reg_fence(acc);
        // keep this k-block's group in flight; the previous one is done now
        ptx::wgmma_wait<1>();
        ptx::reg_fence(acc);
        if (kb > 0 && lane == 0) ptx::mbar_arrive(&empty_bar[prev_stage]);
        prev_stage = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1u;
        }
      }
      ptx::wgmma_wait<0>();
      ptx::reg_fence(acc);
      if (k_blocks > 0 && lane == 0) ptx::mbar_arrive(&empty_bar[prev_stage]);
    }

    // BF16 conversion and store of this warpgroup's 64 x kN part of `tile`.
    template <int kN>
    __device__ __forceinline__ void epilogue(float (&acc)[kN / 2], const GroupTile& tile,
                                             const GroupedGemmParams& p) {
      const int32_t r0 = tile.m0 + wm * 64;
      const int32_t c0 = tile.n0 + wn * kN;
      const int32_t rows_valid = min(max(tile.row_end - r0, 0), 64);
      if (rows_valid <= 0 || c0 >= p.n_out) return;  // uniform over the warpgroup
      // the previous TMA store must have finished reading the staging tile
      if (tid_wg == 0) ptx::tma_store_wait_read<0>();
      ptx::named_barrier_sync(1 + cw, 128);

      // one stmatrix.x4 per two 8-column blocks of the warp's 16 rows (common/c_fragment.cuh)
      const uint32_t sd_addr = ptx::smem_addr(sd);
#pragma unroll
      for (int i = 0; i < kN / 8; i += 2)
        stmatrix_c_blocks<kDChunkBytes>(sd_addr, (tid_wg / 32) * 16, i, acc, lane);
      ptx::fence_proxy_async_smem();  // make the tile visible to the TMA store
      ptx::named_barrier_sync(1 + cw, 128);

      if (rows_valid == 64) {
        if (tid_wg == 0) {
#pragma unroll
          for (int j = 0; j < kN / 64; ++j)
            if (c0 + j * 64 < p.n_out)
              ptx::tma_store_2d(&p.tmap_d, sd + j * kDChunkBytes, c0 + j * 64, r0);  // bound: store
          ptx::tma_store_commit();
        }
      } else {
        // group-boundary tile: only the group's rows, only columns < Nout
        // (Nout % 8 == 0, so a 16-B unit is wholly inside or outside).
        constexpr int kUnitsPerRow = kN / 8;
        __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out);
        for (int idx = tid_wg; idx < rows_valid * kUnitsPerRow; idx += 128) {
          const int row = idx / kUnitsPerRow;
          const int u = idx % kUnitsPerRow;
          const int32_t col = c0 + u * 8;
          if (col < p.n_out) {
            const uint4 v = *reinterpret_cast<const uint4*>(sd + (u / 8) * kDChunkBytes + row * 128 +
                                                            (((u % 8) ^ (row % 8)) * 16));
            *reinterpret_cast<uint4*>(out + static_cast<int64_t>(r0 + row) * p.n_out + col) = v;  // bound: store
          }
        }
      }
    }

    // One tile (or half tile) from its first stage to its stores; each width has its own
    // accumulators (their live ranges do not meet).
    template <int kN>
    __device__ __forceinline__ void run_tile(const GroupTile& tile, const GroupedGemmParams& p) {
      float acc[kN / 2];
      mainloop<kN>(acc);
      epilogue<kN>(acc, tile, p);
    }
  };

  // The work units of a launch: the scheduler's tiles, except that a last wave of at most half
  // the grid runs as two N halves per tile (units split_from + 2 i and + 2 i + 1 are the halves
  // of tile split_from + i). Every thread computes it alike from the tile count and the grid.
  struct Units {
    int32_t count;
    int32_t split_from;
    __device__ __forceinline__ Units(int32_t tiles, int32_t grid, bool enabled) {
      const int32_t last = tiles % grid;
      const bool split = kSplitTail && enabled && last > 0 && 2 * last <= grid;
      split_from = split ? tiles - last : tiles;
      count = split ? tiles + last : tiles;
    }
    __device__ __forceinline__ bool half(int32_t u) const { return kSplitTail && u >= split_from; }
    // the tile of unit u, n0 moved to the half's first column
    __device__ __forceinline__ GroupTile tile(const Scheduler& sched, int32_t u) const {
      if (!half(u)) return sched.tile(u);
      GroupTile t = sched.tile(split_from + (u - split_from) / 2);
      t.n0 += ((u - split_from) & 1) * (kBN / 2);
      return t;
    }
  };

  // -------------------------------------------------------------------------------
  __device__ static __forceinline__ void run(const GroupedGemmParams& p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    extern __shared__ __align__(1024) uint8_t cake_gg_smem_raw[];
    const uint32_t raw_addr = ptx::smem_addr(cake_gg_smem_raw);
    uint8_t* smem = cake_gg_smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
    const uint32_t smem_base = ptx::smem_addr(smem);

    uint64_t* full_bar = reinterpret_cast<uint64_t*>(smem + kOffBar);
    uint64_t* empty_bar = full_bar + kStages;
    int32_t* table = reinterpret_cast<int32_t*>(smem + kOffTable);
    const Slots tile_slots = Slots::at(smem + kOffSlots);

    const int warpgroup = ptx::warpgroup_index();  // warp-uniform for the compiler: uniform descriptors
    const int tid_wg = threadIdx.x % 128;

    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        ptx::mbar_init(&full_bar[s], 1);                       // producer's expect_tx arrival
        ptx::mbar_init(&empty_bar[s], kNumConsumerWG * 4);     // one arrival per consumer warp
      }
      tile_slots.init();
      ptx::mbar_fence_init();
      ptx::tma_prefetch_desc(&p.tmap_a);
      ptx::tma_prefetch_desc(&p.tmap_b);
      ptx::tma_prefetch_desc(&p.tmap_d);
      if (kSplitTail && !kBNMajor) ptx::tma_prefetch_desc(&p.tmap_b_half);
    }
    // Launched as a dependent only after grouped_mm's zeroing kernel (a no-op otherwise): the
    // launch and the set-up above overlap it, and nothing global is touched before it is done
    // (the tiles' stores must land after its zeros, for offsets that give a group rows past the
    // last end).
    ptx::grid_dependency_wait();
    Scheduler sched;
    // collective; its __syncthreads also publish the barrier init
    sched.init(table, p.offs, p.num_groups, p.sum_m_capacity, p.offs_has_leading_zero, p.n_out);

    const int32_t k_blocks = (p.k_red + kBK - 1) / kBK;
    const Units units(sched.total_tiles, int32_t(gridDim.x), p.split_tail != 0);

    if (warpgroup == 0) {
      // ============================ producer ============================
      ptx::setmaxnreg_dec<kProducerRegs>();
      if (tid_wg == 0) {
        uint32_t stage = 0, phase = 0;
        typename Slots::Writer tiles;
        for (int32_t t = blockIdx.x; t < units.count; t += gridDim.x) {
          const GroupTile tile = units.tile(sched, t);
          const int32_t b_rows = units.half(t) ? kBN / 2 : kBN;  // a half tile's B: its columns only
          // dgrad: skip 64-column B chunks that lie wholly past Nout. Their smem
          // keeps stale data, which only feeds output columns that are never
          // stored (column c of the product depends on column c of B alone).
          int32_t b_chunks = b_rows / 64;
          if (kBNMajor) b_chunks = min(b_chunks, (p.n_out - tile.n0 + 63) / 64);
          const uint32_t tx_bytes = kABytes + (kBNMajor ? b_chunks * kBChunkBytes : uint32_t(b_rows) * kBK * 2);
          for (int32_t kb = 0; kb < k_blocks; ++kb) {
            ptx::mbar_wait_parity(&empty_bar[stage], phase ^ 1u);
            if (kb == 0) tiles.publish(tile_slots, tile);  // k_blocks >= 1: the host refuses K = 0
            uint8_t* sa = smem + kOffA + stage * kABytes;
            uint8_t* sb = smem + kOffB + stage * kBBytes;
            ptx::mbar_arrive_expect_tx(&full_bar[stage], tx_bytes);
            // A rows past the group end belong to the next group (harmless for
            // loads); rows past the tensor end are zero filled by TMA.
            ptx::tma_load_2d(&p.tmap_a, &full_bar[stage], sa, kb * kBK, tile.m0);
            if (kBNMajor) {
              for (int32_t j = 0; j < b_chunks; ++j)
                ptx::tma_load_3d(&p.tmap_b, &full_bar[stage], sb + j * kBChunkBytes, tile.n0 + j * 64, kb * kBK,
                                 tile.group);
            } else {
              const CUtensorMap* map = units.half(t) ? &p.tmap_b_half : &p.tmap_b;
              ptx::tma_load_3d(map, &full_bar[stage], sb, kb * kBK, tile.n0, tile.group);
            }
            if (++stage == kStages) {
              stage = 0;
              phase ^= 1u;
            }
          }
        }
      }
    } else {
      // ============================ consumers ============================
      ptx::setmaxnreg_inc<kConsumerRegs>();
      Consumer c;
      c.cw = warpgroup - 1;
      c.wm = kWgM == 2 ? c.cw : 0;
      c.wn = kWgN == 2 ? c.cw : 0;
      c.tid_wg = tid_wg;
      c.lane = tid_wg % 32;
      // A slice: 64 rows x 128 B; B slice: kWgTileN rows (K-major) or
      // kWgTileN/64 boxes of 8 KB (N-major) -- both are kWgTileN * 128 bytes in.
      c.a_base = smem_base + kOffA + static_cast<uint32_t>(c.wm) * 64u * 128u;
      c.b_base = smem_base + kOffB + static_cast<uint32_t>(c.wn) * kWgTileN * 128u;
      c.sd = smem + kOffD + c.cw * kDBytesPerWG;
      c.full_bar = full_bar;
      c.empty_bar = empty_bar;
      c.k_blocks = k_blocks;
      c.stage = 0;
      c.phase = 0;
      c.slots = tile_slots;
      c.tile_reader = {};

      const int32_t stride = gridDim.x;
      for (int32_t t = blockIdx.x; t < units.count; t += stride) {
        const GroupTile tile = c.next_tile();
        if constexpr (kSplitTail) {
          if (units.half(t)) {
            c.template run_tile<kHalfN>(tile, p);
            continue;
          }
        }
        c.template run_tile<kWgTileN>(tile, p);
      }
      // outstanding TMA stores must complete before the CTA (and its smem) goes away
      if (tid_wg == 0) ptx::tma_store_wait_all<0>();
    }
#endif
  }
};

}  // namespace sm90
}  // namespace cake_moe

// Defines one extern "C" kernel entry for a form. The runtime looks entries up
// by name; launch with Kernel::kNumThreads threads and Kernel::kSmemBytes of
// dynamic shared memory.
#define CAKE_GG_SM90_DEFINE_KERNEL(NAME, OP, BM, BN, STAGES)                                           \
  extern "C" __global__ void __launch_bounds__(                                                        \
      ::cake_moe::sm90::GroupedGemmKernel<::cake_moe::sm90::GroupedGemmOp::OP, BM, BN, STAGES>::kNumThreads, 1) \
      NAME(const __grid_constant__ ::cake_moe::sm90::GroupedGemmParams p) {                            \
    ::cake_moe::sm90::GroupedGemmKernel<::cake_moe::sm90::GroupedGemmOp::OP, BM, BN, STAGES>::run(p);   \
  }
