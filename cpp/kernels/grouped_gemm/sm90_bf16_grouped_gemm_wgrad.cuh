// sm_90a ragged BF16 grouped GEMM, weight gradient (family A, wgrad):
//
//   dW[e] = G[g_e]^T @ X[g_e]      G [sum_m, N], X [sum_m, K] bf16, dW [E, N, K] bf16|f32
//
// The ragged dimension (the group's token rows) is the reduction. Both wgmma
// operands are MN-major: A = G_e^T (M = output rows along N, the 64 N-columns of
// a G row are contiguous) and B = X_e (N = output columns along K); a TMA box of
// 64 token rows x 64 columns lands as one 128B-swizzled 8 KB atom column, which
// is exactly the MN-major SW128 layout (wgmma transpose bits set for A and B).
// FP32 accumulation, one rounding at the end.
//
// Work units (group, chunk of token rows, output tile) and their order:
// wgrad_scheduler.cuh. Persistent CTAs (one per SM) take units from an atomic
// counter in the workspace (dynamic: the load is balanced whatever the group
// sizes), or, without a workspace, stride over them statically (then nothing is
// split). The decomposition never depends on the grid or on timing.
//
// Split tiles (num_chunks > 1) are reduced through an FP32 tile in the
// workspace, per consumer warpgroup (each owns 64 output rows): in chunk order
// (kDet, bitwise deterministic) or by red.add (kFast); sm90_wgrad_epilogue.cuh.
// A det chunk only waits for a lower-numbered unit, which a running CTA has
// already taken from the counter, so the chain cannot deadlock (no co-residency
// assumption).
//
// Structure (384 threads): warpgroup 0 = producer (one thread: takes units,
// decodes each into a unit slot that completes with the unit's first ring stage,
// so a consumer starts a unit without a decode of its own -- worth 8-14% at
// T = 4096, where units are 4-8 k-blocks; issues TMA loads into a kStages ring;
// setmaxnreg.dec), warpgroups 1, 2 = consumers (wgmma m64 x BN x k16, one group
// in flight; each owns 64 output rows). A unit's last k-block with a tail is
// loaded ending at the unit's last row when the 64 rows before it are still the
// group's (shifted_tail): each warpgroup zeroes the repeated G rows of its own
// A chunk. Otherwise (units of < 64 rows) the rows past the group end are zeroed
// in both operands, shared by the two warpgroups. (The repeated X rows meet zeroed
// G rows: an Inf in them would turn that dW column's Inf into NaN.)
// Epilogue (sm90_wgrad_epilogue.cuh): the split-tile reduction, then the store:
// bf16 by TMA from 32 KB of staging boxes (3D map over dW), f32 by each warp's 16
// rows through a 2 KB staging tile into whole-row 16-byte stores; never outside
// [0, N) x [0, K) of dW[e]. Empty groups store exact zeros.
//
// Measured: docs/grouped_gemm.md (H200 against torch._grouped_mm, 2026-12-01: det
// bf16 x1.089 in the df423b0 grid, x1.100 with the TMA stores in a same-run A/B).
// det design: split chunks through the FP32 workspace in chunk order (semaphore
// chain) + dynamic unit counter; never splitting (ws_slots = 0, owner-computes)
// gave the same geomean (497) but lost up to 11% on rows with one dominant group
// at T=65536 and won up to 13% on a few T=16384 rows; fast (unordered red.add)
// is within noise of det, because det's chain waits are short.
//
// Parameters, tensor maps and workspace contract: wgrad_params.cuh.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/ptx/cluster.cuh"
#include "common/ptx/mbarrier.cuh"
#include "common/ptx/smem.cuh"
#include "common/ptx/tma.cuh"
#include "common/ptx/wgmma.cuh"
#include "grouped_gemm/sm90_wgrad_epilogue.cuh"
#include "grouped_gemm/unit_slots.cuh"
#include "grouped_gemm/wgrad_params.cuh"
#include "grouped_gemm/wgrad_scheduler.cuh"

namespace cake_moe {
namespace sm90 {

// kBN: output tile width along K (128 or 256); BM is 128 (two m64 consumer
// warpgroups). OutT: __nv_bfloat16 or float. kTableSize: scheduler smem slots.
// kSplitQ / kMinChunkKB: chunking (see above; H200, 2026: chunks shorter than
// 32 k-blocks = 2048 rows cost more in workspace round trips than they gain in
// balance -- min 4 was 5-30% slower at T <= 16384 -- while splitting groups
// longer than that gains up to 18% at T = 65536 over never splitting).
// kPair: CTA pairs (clusters of 2, ranks 0 and 1) take the two 128-row halves of one 256 x kBN
// tile; each loads its own G rows and half of the X boxes, multicast to both, so a pair reads
// X once (32 of a stage's 48 KB). The pair forms never split a group (no workspace) and stride
// statically over the units: both CTAs of a pair walk the same units in the same order.
template <int kBN, int kStages, WgradReduce kReduce, typename OutT, int kTableSize = 1024, int kSplitQ = 8,
          int kMinChunkKB = 32, bool kPair = false>
struct GroupedGemmWgradKernel {
  static constexpr int kBM = 128;
  static constexpr int kBK = 64;  // token rows per stage (one 128-B swizzle row per token per 64 columns)
  static constexpr int kNumConsumerWG = 2;
  static constexpr int kNumThreads = 128 * (1 + kNumConsumerWG);
  static constexpr int kAccRegs = kBN / 2;
  static constexpr int kAChunks = kBM / 64;
  static constexpr int kBChunks = kBN / 64;
  static constexpr bool kOutF32 = std::is_same<OutT, float>::value;
  static constexpr bool kDet = kReduce == WgradReduce::kDet;
  static constexpr int kClusterSize = kPair ? 2 : 1;
  static_assert(kBN == 128 || kBN == 256, "BN: 128 or 256 (wgmma n, 64-column TMA boxes)");
  static_assert(!kPair || kBN / 64 % 2 == 0, "pairs: each CTA multicasts half of the X boxes");
  static_assert(kStages >= 2, "need at least double buffering");
  static_assert(std::is_same<OutT, float>::value || std::is_same<OutT, __nv_bfloat16>::value, "out: bf16 or f32");
  // the form's parameters, for hosts and harnesses
  static constexpr int kBlockM = kBM;
  static constexpr int kBlockN = kBN;
  static constexpr int kNumStages = kStages;
  static constexpr bool kDeterministic = kDet;
  static constexpr bool kOutputF32 = kOutF32;
  static constexpr int kBoxInner = 64, kBoxRows = kBK;  // both tensor maps

  // ---- shared memory ------------------------------------------------------------
  static constexpr uint32_t kChunkBytes = 64 * 128;  // 64 token rows x 64 columns bf16 (one TMA box)
  static constexpr uint32_t kABytes = kAChunks * kChunkBytes;
  static constexpr uint32_t kBBytes = kBChunks * kChunkBytes;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;
  using Scheduler = WgradScheduler<kBM * kClusterSize, kBN, kSplitQ, kMinChunkKB, kTableSize>;
  static constexpr uint32_t kOffBar = kStages * kStageBytes;
  // decoded units, producer -> consumers (unit_slots.cuh)
  using Slots = UnitSlots<WgradUnit, unit_slot_count(kStages), kNumConsumerWG * 128>;
  static constexpr uint32_t kOffSlots = kOffBar + 2 * kStages * 8;
  static constexpr uint32_t kOffBcast = kOffSlots + Slots::kSmemBytes;
  static constexpr uint32_t kOffTable = kOffBcast + 16;
  using Epilogue = WgradEpilogue<kBN, kReduce, OutT>;
  static constexpr uint32_t kOffEpi = (kOffTable + Scheduler::kSmemBytes + Epilogue::kStagingAlign - 1) /
                                      Epilogue::kStagingAlign * Epilogue::kStagingAlign;  // staging
  static constexpr uint32_t kSmemUsed = kOffEpi + Epilogue::kStagingBytes;
  static constexpr uint32_t kSmemBytes = kSmemUsed + 1024;  // base aligned up to 1024 B at run time
  static_assert(kChunkBytes % 1024 == 0 && kStageBytes % 1024 == 0, "stage buffers on 1024-B atom boundaries");
  static_assert(kOffTable % 16 == 0, "table alignment");
  static_assert(kSmemBytes <= 232448, "exceeds the 227 KB of dynamic shared memory per block on sm_90");

  // ---- registers ---------------------------------------------------------------
  static constexpr uint32_t kProducerRegs = 40;
  static constexpr uint32_t kConsumerRegs = 232;
  // the budgets must fit the CTA's launch allocation (168 per thread at 384 threads), not the
  // whole register file: more hangs in the consumers' setmaxnreg.inc
  static_assert(128 * kProducerRegs + 128 * kNumConsumerWG * kConsumerRegs <=
                    kNumThreads * ptx::launch_regs_per_thread(kNumThreads),
                "register budget");

  using Mma = ptx::WgmmaBf16SSAB<kBN, 1, 1>;

  // A unit's last k-block with a tail is loaded from row (unit end - 64) when that row is still
  // in the group (a unit of >= 64 rows, or a later chunk): every loaded row is then the group's
  // own, so X needs no zeroing and each consumer warpgroup zeroes only the G rows that repeat
  // the previous k-block, in its own A chunk, without waiting for the other warpgroup. Shorter
  // units keep the shared zeroing of both operands (zero_tail).
  __device__ static __forceinline__ bool shifted_tail(const WgradUnit& w) {
    return w.tail < kBK && (w.kb > 1 || w.chunk > 0);
  }

  // ---------------------------------------------------------------------------------
  struct Consumer {
    int cw, tid_wg, lane;
    uint32_t smem_base;
    uint64_t* full_bar;
    uint64_t* empty_bar;
    Slots slots;
    typename Slots::Reader unit_reader;
    uint32_t stage, phase;
    uint32_t peer_empty;  // kPair: the other CTA's empty_bar[0] (shared::cluster address)
    Epilogue epi;

    // Stage `s` read (lane 0 of each warp): one arrival on this CTA's empty barrier, and for
    // pairs one on the other CTA's, whose producer multicasts into this CTA's stage too.
    __device__ __forceinline__ void release(uint32_t s) const {
      ptx::mbar_arrive(&empty_bar[s]);
      if constexpr (kPair) ptx::mbar_arrive_cluster(peer_empty + s * 8u);
    }

    __device__ __forceinline__ void advance() {
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1u;
      }
    }

    // Zero token rows [tail, 64) of the current stage (this warpgroup's half of
    // the boxes), make it visible to the async proxy, sync both warpgroups.
    __device__ __forceinline__ void zero_tail(int32_t tail) {
      const uint32_t base = smem_base + stage * kStageBytes;
      const int32_t nrows = 64 - tail;
      const int32_t per_chunk = nrows * 8;  // 16-B units
      constexpr int kMyChunks = 1 + kBChunks / 2;
      for (int32_t idx = tid_wg; idx < kMyChunks * per_chunk; idx += 128) {
        const int32_t j = idx / per_chunk;
        const int32_t r = idx - j * per_chunk;
        const uint32_t chunk_addr = j == 0 ? base + cw * kChunkBytes
                                           : base + kABytes + (cw * (kBChunks / 2) + (j - 1)) * kChunkBytes;
        // whole 128-B rows: the swizzle only permutes 16-B units inside a row
        ptx::st_shared_zero16(chunk_addr + (tail + r / 8) * 128 + (r % 8) * 16);
      }
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_sync(3, 256);
    }

    // Zero token rows [0, nrows) of this warpgroup's own G chunk (the rows of a shifted last
    // k-block that repeat the previous one) and sync this warpgroup only: no other warpgroup
    // reads that chunk.
    __device__ __forceinline__ void zero_head_own(int32_t nrows) {
      const uint32_t chunk_addr = smem_base + stage * kStageBytes + cw * kChunkBytes;
      for (int32_t idx = tid_wg; idx < nrows * 8; idx += 128)
        ptx::st_shared_zero16(chunk_addr + (idx / 8) * 128 + (idx % 8) * 16);
      ptx::fence_proxy_async_smem();
      ptx::named_barrier_sync(1 + cw, 128);
    }

    __device__ __forceinline__ void mainloop(float (&acc)[kAccRegs], const WgradUnit& w) {
#pragma unroll
      for (int i = 0; i < kAccRegs; ++i) acc[i] = 0.0f;
      ptx::reg_fence(acc);
      uint32_t prev_stage = 0;
      for (int32_t i = 0; i < w.kb; ++i) {
        if (i > 0) ptx::mbar_wait_parity(&full_bar[stage], phase);
        if (i == w.kb - 1 && w.tail < kBK) {
          if (shifted_tail(w)) {
            zero_head_own(kBK - w.tail);
          } else {
            zero_tail(w.tail);
          }
        }
        // the stage through a constant-lane shuffle: warp-uniform for the compiler, so the
        // descriptors stay in uniform registers whatever the epilogue holds
        const uint32_t st = __shfl_sync(0xffffffffu, stage, 0);
        const uint32_t a_addr = smem_base + st * kStageBytes + cw * kChunkBytes;
        const uint32_t b_addr = smem_base + st * kStageBytes + kABytes;
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          // MN-major: a k16 step is 16 token rows of 128 B = two swizzle atoms;
          // LBO = 8 KB between 64-column boxes (B spans kBChunks of them).
          const uint64_t da = ptx::make_desc_mnmajor_sw128(a_addr + kk * 2048, kChunkBytes);
          const uint64_t db = ptx::make_desc_mnmajor_sw128(b_addr + kk * 2048, kChunkBytes);
          Mma::mma(acc, da, db, 1u);  // bound: mma
        }
        ptx::wgmma_commit();
        ptx::reg_fence(acc);
        ptx::wgmma_wait<1>();
        ptx::reg_fence(acc);
        if (i > 0 && lane == 0) release(prev_stage);
        prev_stage = stage;
        advance();
      }
      ptx::wgmma_wait<0>();
      ptx::reg_fence(acc);
      if (w.kb > 0 && lane == 0) release(prev_stage);
    }

  };

  // -------------------------------------------------------------------------------
  __device__ static __forceinline__ void run(const GroupedGemmWgradParams& p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    extern __shared__ __align__(1024) uint8_t cake_ggw_smem_raw[];
    const uint32_t raw_addr = ptx::smem_addr(cake_ggw_smem_raw);
    uint8_t* smem = cake_ggw_smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
    const uint32_t smem_base = ptx::smem_addr(smem);

    uint64_t* full_bar = reinterpret_cast<uint64_t*>(smem + kOffBar);
    uint64_t* empty_bar = full_bar + kStages;
    const Slots unit_slots = Slots::at(smem + kOffSlots);
    int32_t* bcast = reinterpret_cast<int32_t*>(smem + kOffBcast);
    uint64_t* table = reinterpret_cast<uint64_t*>(smem + kOffTable);

    const int warpgroup = ptx::warpgroup_index();  // warp-uniform for the compiler: uniform descriptors
    const int tid_wg = threadIdx.x % 128;

    // workspace: [control 256 B][flags][FP32 tiles]
    uint8_t* ws = reinterpret_cast<uint8_t*>(p.workspace);
    const bool dynamic = !kPair && ws != nullptr && p.workspace_bytes >= kWgradWsControlBytes;
    int32_t slots = 0;
    if (dynamic) {
      const int fit = grouped_gemm_wgrad_slots_that_fit(kBM, kBN, p.workspace_bytes);
      slots = min(max(p.ws_slots, 0), fit);
    }
    uint32_t* ctrl = reinterpret_cast<uint32_t*>(ws);
    uint32_t* flags = reinterpret_cast<uint32_t*>(ws + kWgradWsControlBytes);
    float* bufs = reinterpret_cast<float*>(ws + kWgradWsControlBytes + grouped_gemm_wgrad_ws_flags_bytes(slots));
    const int32_t workers = p.num_workers > 0 ? p.num_workers : static_cast<int32_t>(gridDim.x);

    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        ptx::mbar_init(&full_bar[s], 1);                    // producer's (expect_tx) arrival
        ptx::mbar_init(&empty_bar[s], kClusterSize * kNumConsumerWG * 4);  // a consumer warp's (both CTAs')
      }
      unit_slots.init();
      ptx::mbar_fence_init();
      ptx::tma_prefetch_desc(&p.tmap_g);
      ptx::tma_prefetch_desc(&p.tmap_x);
      if (Epilogue::kTmaStore && p.num_groups > 0) ptx::tma_prefetch_desc(&p.tmap_out);
    }
    Scheduler sched;
    sched.init(table, p, workers, slots);  // collective; its __syncthreads publish the barrier init
    if constexpr (kPair) ptx::cluster_sync();  // the other CTA's barriers are initialised too

    if (warpgroup == 0) {
      // ============================ producer ============================
      ptx::setmaxnreg_dec<kProducerRegs>();
      if (tid_wg == 0) {
        uint32_t stage = 0, phase = 0;
        typename Slots::Writer units;
        const uint32_t total = static_cast<uint32_t>(sched.total_units);
        for (uint32_t iter = 0;; ++iter) {
          // pairs: cluster c = CTAs 2c and 2c + 1 (cluster dims {2, 1, 1}); a unit is one 256-row tile
          const uint32_t u = dynamic ? atomicAdd(&ctrl[0], 1u)
                                     : blockIdx.x / kClusterSize + iter * (gridDim.x / kClusterSize);
          if (u >= total) break;
          WgradUnit w = sched.decode(static_cast<int32_t>(u));
          if constexpr (kPair) w.n0 += static_cast<int32_t>(ptx::cluster_ctarank()) * kBM;  // this CTA's half
          if (w.kb == 0) {
            // empty group: no data, the consumers store zeros
            ptx::mbar_wait_parity(&empty_bar[stage], phase ^ 1u);
            units.publish(unit_slots, w);
            ptx::mbar_arrive(&full_bar[stage]);
            if (++stage == kStages) {
              stage = 0;
              phase ^= 1u;
            }
            continue;
          }
          // boxes wholly past N / K are skipped: their stale smem only feeds
          // output rows / columns that are never stored
          int32_t na = min(kAChunks, (p.n - w.n0 + 63) / 64);
          if constexpr (kPair) na = max(na, 0);  // a pair's second half may lie past N
          const int32_t nb = min(kBChunks, (p.k - w.k0 + 63) / 64);
          const uint32_t tx = static_cast<uint32_t>(na + nb) * kChunkBytes;
          for (int32_t i = 0; i < w.kb; ++i) {
            ptx::mbar_wait_parity(&empty_bar[stage], phase ^ 1u);
            if (i == 0) units.publish(unit_slots, w);
            ptx::mbar_arrive_expect_tx(&full_bar[stage], tx);
            uint8_t* sa = smem + stage * kStageBytes;
            uint8_t* sb = sa + kABytes;
            const int32_t row = w.row0 + i * kBK - (i == w.kb - 1 && shifted_tail(w) ? kBK - w.tail : 0);
            for (int32_t j = 0; j < na; ++j)
              ptx::tma_load_2d(&p.tmap_g, &full_bar[stage], sa + j * kChunkBytes, w.n0 + 64 * j, row);
            if constexpr (kPair) {
              // X box j comes from rank j / (kBChunks / 2), into both CTAs' stage
              const int32_t rank = static_cast<int32_t>(ptx::cluster_ctarank());
              for (int32_t j = rank * (kBChunks / 2); j < min(nb, (rank + 1) * (kBChunks / 2)); ++j)
                ptx::tma_load_2d_multicast(&p.tmap_x, &full_bar[stage], sb + j * kChunkBytes, w.k0 + 64 * j, row,
                                           static_cast<uint16_t>(0x3));
            } else {
              for (int32_t j = 0; j < nb; ++j)
                ptx::tma_load_2d(&p.tmap_x, &full_bar[stage], sb + j * kChunkBytes, w.k0 + 64 * j, row);
            }
            if (++stage == kStages) {
              stage = 0;
              phase ^= 1u;
            }
          }
        }
        // end marker for the consumers
        ptx::mbar_wait_parity(&empty_bar[stage], phase ^ 1u);
        WgradUnit end{};
        end.kb = -1;
        units.publish(unit_slots, end);
        ptx::mbar_arrive(&full_bar[stage]);
        if (dynamic) {
          // the last CTA to finish taking units resets the counters for the next launch
          __threadfence();
          const uint32_t done = atomicAdd(&ctrl[1], 1u);
          if (done == gridDim.x - 1) {
            __threadfence();
            atomicExch(&ctrl[0], 0u);
            atomicExch(&ctrl[1], 0u);
          }
        }
      }
    } else {
      // ============================ consumers ============================
      ptx::setmaxnreg_inc<kConsumerRegs>();
      Consumer c;
      c.cw = warpgroup - 1;
      c.tid_wg = tid_wg;
      c.lane = tid_wg % 32;
      c.smem_base = smem_base;
      c.full_bar = full_bar;
      c.empty_bar = empty_bar;
      c.slots = unit_slots;
      c.unit_reader = {};
      c.stage = 0;
      c.phase = 0;
      if constexpr (kPair) c.peer_empty = ptx::map_shared_rank(ptx::smem_addr(empty_bar), ptx::cluster_ctarank() ^ 1u);
      c.epi.cw = c.cw;
      c.epi.tid_wg = tid_wg;
      c.epi.lane = c.lane;
      c.epi.warp = tid_wg / 32;
      c.epi.g = c.lane / 4;
      c.epi.q = c.lane % 4;
      c.epi.staging = smem_base + kOffEpi + c.cw * Epilogue::kWgStagingBytes;
      c.epi.bcast = bcast;
      c.epi.flags = flags;
      c.epi.bufs = bufs;
      float acc[kAccRegs];
      for (;;) {
        ptx::mbar_wait_parity(&full_bar[c.stage], c.phase);
        const WgradUnit w = c.unit_reader.read(c.slots);
        if (w.kb < 0) {
          c.epi.drain();
          break;
        }
        if (w.kb == 0) {
          if (c.lane == 0) c.release(c.stage);
          c.advance();
#pragma unroll
          for (int i = 0; i < kAccRegs; ++i) acc[i] = 0.0f;
        } else {
          c.mainloop(acc, w);
        }
        c.epi.run(acc, w, p);
      }
    }
    // pairs: no CTA leaves while the other may still arrive on its barriers or multicast into it
    if constexpr (kPair) ptx::cluster_sync();
#endif
  }
};

}  // namespace sm90
}  // namespace cake_moe

// Defines one extern "C" kernel entry for a wgrad form.
#define CAKE_GGW_SM90_DEFINE_KERNEL(NAME, KERNEL)                                                        \
  extern "C" __global__ void __launch_bounds__(KERNEL::kNumThreads, 1)                                  \
      NAME(const __grid_constant__ ::cake_moe::sm90::GroupedGemmWgradParams p) {                       \
    KERNEL::run(p);                                                                                     \
  }
