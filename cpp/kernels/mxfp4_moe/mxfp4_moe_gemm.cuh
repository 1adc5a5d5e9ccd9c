// Family B grouped GEMMs with MXFP4 weights dequantized in the mainloop (portable: mma.sync,
// ldmatrix, cp.async and 2D TMA loads, which every sm_90+ arch runs; docs/mxfp4_moe.md has the
// design).
//
// Swap-AB: the weight rows of one expert are the MMA's M side (64 per warp, four m16 blocks),
// the expert's routed token rows the N side (a token tile of kBN sorted rows from the routing
// kernel). CTA (tile t, m-block mb) computes weight rows [mb * kBM, +kBM) x the tile's rows:
//   GEMM1: acc = W1[e] . x[token]        -> SiTU(gate, up) -> MXFP8 (round-up) -> BF16 act row
//   GEMM2: acc = W2[e] . act[row]        -> BF16 route row
// Mainloop: a kStages ring (stage_loader.cuh); each stage holds kKStage of K for the CTA's
// weight rows (raw prepared FP4 by TMA, completing on the stage's mbarrier, in the shipped
// tilings; UE8M0 bytes by cp.async) and token rows (BF16, gathered by cp.async). Warp (wm, wk)
// owns rows wm*64.. and K slice wk*128.. of every stage; the kWarpsK partial sums are added in
// warp order through shared memory at the end (a fixed order: results do not depend on
// timing), and the K warps share that tail's epilogue (ksplit_tail.cuh). Epilogues:
// epilogue.cuh; which item a CTA computes and the per-tile GEMM1 -> GEMM2 sync: item_schedule.cuh.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "common/ptx/global_mem.cuh"
#include "common/ptx/grid_dependency.cuh"
#include "common/ptx/mbarrier.cuh"
#include "common/ptx/sm80.cuh"
#include "moe/moe_route.cuh"
#include "mxfp4_moe/epilogue.cuh"
#include "mxfp4_moe/item_schedule.cuh"
#include "mxfp4_moe/ksplit_tail.cuh"
#include "mxfp4_moe/params.hpp"
#include "mxfp4_moe/stage_loader.cuh"
#include "mxfp4_moe/weight_fragments.cuh"

namespace cake_moe::mxfp4_moe {

template <GemmStage kStage, typename Cfg>
struct Mxfp4MoeGemm : Mxfp4MoeEpilogue,
                      Mxfp4MoeKSplitTail<kStage, Cfg>,
                      Mxfp4MoeItemSchedule<Cfg>,
                      Mxfp4MoeStageLoader<kStage, Cfg> {
  static constexpr int kBN = Cfg::kBN, kBM = Cfg::kBM, kStages = Cfg::kStages;
  static constexpr int kNBlocks = kBN / 8;
  static constexpr int kThreads = Cfg::kThreads;
  static constexpr int kSmemBytes = Cfg::kSmemBytes;
  static_assert(kStages >= 2, "a ring needs two stages");
  // GEMM1 units may be computed as two K halves (item_schedule.cuh, "K halves"); the host binds
  // split_park only for such a tiling.
  static constexpr bool kSplitsK = kStage == GemmStage::kGemm1 && Cfg::kGemm1SplitsK;

  // The stage layout and the stage loaders (stage_loader.cuh), named here for the mainloop.
  using Loaders = Mxfp4MoeStageLoader<kStage, Cfg>;
  using Smem = typename Loaders::Smem;
  using Loader = typename Loaders::Loader;
  using PointerLoader = typename Loaders::PointerLoader;
  using Loaders::b_chunk;
  using Loaders::load_stage;
  using Loaders::load_weights_tma;
  using Loaders::make_loader;
  using Loaders::make_pointer_loader;
  using Loaders::w_offset;
  // The K-split tail (ksplit_tail.cuh) and the token-tile schedule (item_schedule.cuh).
  using Tail = Mxfp4MoeKSplitTail<kStage, Cfg>;
  using Schedule = Mxfp4MoeItemSchedule<Cfg>;
  using Tail::park_partials;
  using Tail::tail_gemm1;
  using Tail::tail_gemm2;
  using Schedule::await_tile;
  using Schedule::count_tile_done;
  using Schedule::meet_other_half;
  using Schedule::next_unit;
  using Schedule::read_tile;
  using Schedule::tile_count;
  using Tile = Mxfp4MoeEpilogue::Tile;  // (the schedule's and the tail's name the same type)

  // Rows of a stage's weight tile apart in bytes. The swizzles of w_offset depend on row % 8
  // (128-byte boxes), (row / 2) % 4 (64-byte boxes) or row / kRowsPerLine % 4 (no TMA), all
  // unchanged by a multiple of 8 rows: the reads of m16 block mb, half h of a warp sit at a
  // fixed distance from those of block 0, half 0.
  static constexpr int kWRowStride = Cfg::kTmaWeights ? Cfg::kWBoxBytes : Cfg::kWRowBytes;

  // A thread's read offsets inside a ring slot for its rows from row0 (block 0, row g) and K
  // slice wk: unit u's weight words (the chunk swizzle differs per unit) and code half-word.
  // They do not change from stage to stage, so the decode mainloop computes them once.
  struct UnitOffsets {
    int w, sf;
  };
  __device__ static __forceinline__ UnitOffsets unit_offsets(int row0, int wk, int u) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int chunk = (wk * 128 + u * 64) / 32;  // first 16-byte chunk of the unit in the row
    return {w_offset(row0 + g, chunk + (q >> 1)) + 8 * (q & 1), (row0 + g) * Cfg::kSfRowBytes + wk * 4 + u * 2};
  }

  // kMB m16 blocks of weight rows (block mb: rows g + 16 mb, + 8 from the offsets' row) of one
  // 64-element unit in ring slot `slot`: per block the two prepared words of rows g and g + 8
  // (load_unit_words) and their two UE8M0 codes (byte i: k32 block i), read from `sfs` with
  // rows `stride` bytes apart (load_unit_codes: the slot's scale area, or the sm_90a forms'
  // code ring).
  template <int kMB>
  __device__ static __forceinline__ void load_unit_words(const Smem& sm, int slot, int w_off, uint2 (&wrow)[kMB][2]) {
    const uint8_t* ws = sm.w(slot) + w_off;
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb)
#pragma unroll
      for (int h = 0; h < 2; ++h) wrow[mb][h] = *reinterpret_cast<const uint2*>(ws + (mb * 16 + 8 * h) * kWRowStride);
  }
  template <int kMB>
  __device__ static __forceinline__ void load_unit_codes(const uint8_t* sfs, int stride, uint32_t (&codes)[kMB][2]) {
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb)
#pragma unroll
      for (int h = 0; h < 2; ++h) codes[mb][h] = *reinterpret_cast<const uint16_t*>(sfs + (mb * 16 + 8 * h) * stride);
  }
  template <int kMB>
  __device__ static __forceinline__ void load_unit(const Smem& sm, int slot, UnitOffsets o, uint2 (&wrow)[kMB][2],
                                                   uint32_t (&codes)[kMB][2]) {
    load_unit_words<kMB>(sm, slot, o.w, wrow);
    load_unit_codes<kMB>(sm.sf(slot) + o.sf, Cfg::kSfRowBytes, codes);
  }

  // The decode mainloop's read offsets (unit_offsets of both units, and the ldmatrix row
  // address of each k32 pair sp of unit 0: unit 1 is 8 chunks on, whose bit 3 the row XOR
  // never touches; n8 block nb is 8 rows on, same XOR).
  struct FragOffsets {
    UnitOffsets unit[2];
    int b[2];
  };
  __device__ static __forceinline__ FragOffsets frag_offsets(int wm, int wk) {
    const int lane = threadIdx.x & 31, row = lane & 7;
    FragOffsets f;
#pragma unroll
    for (int u = 0; u < 2; ++u) f.unit[u] = unit_offsets(wm * 64, wk, u);
#pragma unroll
    for (int sp = 0; sp < 2; ++sp) f.b[sp] = row * Cfg::kBRowBytes + 16 * b_chunk(row, (wk * 128 + sp * 32) / 8 + (lane >> 3));
    return f;
  }

  // Whether any UE8M0 code of the warp's 64 rows and K slice in this stage needs the
  // two-multiply conversion (code > 128): one vote per stage on the four code bytes of each row
  // (rows l and l + 32 for lane l), instead of one per unit on the codes held for the
  // conversion (two compares per code). Per byte b: (b & 0x7F) + 0x7F sets bit 7 exactly when
  // b & 0x7F != 0, and never carries into the next byte (0x7F + 0x7F < 0x100).
  __device__ static __forceinline__ bool warp_stage_needs_big(const Smem& sm, int slot, int wm, int wk) {
    static_assert(Cfg::kSfRowBytes % 4 == 0 && Cfg::kKWarp == 128, "a warp's codes of a stage are one word per row");
    static_assert(kBigScaleCode == 0x80, "the byte test finds the codes above 0x80");
    const int lane = threadIdx.x & 31;
    const uint8_t* sfs = sm.sf(slot) + (wm * 64 + lane) * Cfg::kSfRowBytes + wk * 4;
    const uint32_t c0 = *reinterpret_cast<const uint32_t*>(sfs);
    const uint32_t c1 = *reinterpret_cast<const uint32_t*>(sfs + 32 * Cfg::kSfRowBytes);
    const uint32_t big = (((c0 & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) & c0) | (((c1 & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) & c1);
    return __any_sync(0xFFFFFFFFu, (big & 0x80808080u) != 0u);
  }

  // One stage of the warp's K slice: two 64-element units, four k16 sub-steps each. A big code
  // anywhere in the warp's stage sends both units to the two-multiply form (exact for all codes);
  // `may_be_big` false (the expert's largest code is <= 128, GemmParams::sf_max) skips the vote.
  __device__ static __forceinline__ void compute_stage(const Smem& sm, int slot, int wm, int wk, const FragOffsets& f,
                                                       bool may_be_big, float (&acc)[4][kNBlocks][4]) {
    const bool big = may_be_big && warp_stage_needs_big(sm, slot, wm, wk);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint2 wrow[4][2];
      uint32_t codes[4][2];
      load_unit<4>(sm, slot, f.unit[u], wrow, codes);
      if (big) {
        compute_unit<true>(sm, slot, u, f, wrow, codes, acc);
      } else {
        compute_unit<false>(sm, slot, u, f, wrow, codes, acc);
      }
    }
  }

  template <bool kBig>
  __device__ static __forceinline__ void compute_unit(const Smem& sm, int slot, int u, const FragOffsets& f,
                                                      const uint2 (&wrow)[4][2], const uint32_t (&codes)[4][2],
                                                      float (&acc)[4][kNBlocks][4]) {
    const uint32_t bs = ptx::smem_addr(sm.b(slot)) + u * 8 * 16;
#pragma unroll
    for (int sp = 0; sp < 2; ++sp) {  // pairs of k16 sub-steps: one ldmatrix.x4 per n8 block
      uint32_t bfrag[kNBlocks][4];
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb) ptx::ldmatrix_x4(bfrag[nb], bs + f.b[sp] + nb * 8 * Cfg::kBRowBytes);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int mb = 0; mb < 4; ++mb) {
          // sub-step s = 2 sp + half; UE8M0 block sp of the unit (byte sp of the codes)
          const uint32_t cg = (codes[mb][0] >> (8 * sp)) & 0xFFu, cg8 = (codes[mb][1] >> (8 * sp)) & 0xFFu;
          uint32_t a[4];
          if (sp == 0 && half == 0) a_fragment<0, kBig>(a, wrow[mb][0], wrow[mb][1], cg, cg8);
          if (sp == 0 && half == 1) a_fragment<1, kBig>(a, wrow[mb][0], wrow[mb][1], cg, cg8);
          if (sp == 1 && half == 0) a_fragment<2, kBig>(a, wrow[mb][0], wrow[mb][1], cg, cg8);
          if (sp == 1 && half == 1) a_fragment<3, kBig>(a, wrow[mb][0], wrow[mb][1], cg, cg8);
#pragma unroll
          for (int nb = 0; nb < kNBlocks; ++nb)
            ptx::mma_bf16_16816(acc[mb][nb], a, bfrag[nb][2 * half], bfrag[nb][2 * half + 1]);
        }
      }
    }
  }

  // The item's epilogue: from the parked partials shared by the K warps (K split), else from
  // each warp's own accumulators.
  __device__ static __forceinline__ void finish_item(const GemmParams& p, const Tile& t, const uint8_t* smem, int wm,
                                                     int wk, float (&acc)[4][kNBlocks][4]) {
    const float* park = reinterpret_cast<const float*>(smem);
    if constexpr (Cfg::kWarpsK > 1 && kStage == GemmStage::kGemm1) {
      tail_gemm1(p, t, park, wm, wk);
    } else if constexpr (Cfg::kWarpsK > 1) {
      tail_gemm2(p, t, park, wm, wk);
    } else if constexpr (kStage == GemmStage::kGemm1) {
      epilogue_gemm1(p, t, wm, acc);
    } else {
      epilogue_gemm2(p, t, wm * 64, 0, acc);
    }
  }

  // Lookahead (GEMM1 of the TMA-weight forms, at most 32 routes: GemmParams::lookahead). Before
  // its dependency wait the CTA names its tile's expert from the routes (the routing kernel's
  // tile order) and thread 0 requests the weights of the ring's first stages, which then stream
  // while the routing kernel finishes. The routing kernel's list decides: should it name
  // another expert, thread 0 waits for the early boxes and reloads the slots through the spare
  // barrier (the stage barriers keep their phases), before the first stage barrier.
  static constexpr bool kLooksAhead = kStage == GemmStage::kGemm1 && Cfg::kLooksAhead;
  static constexpr int kFirstStages = kStages - 1;  // the stages the prologue requests
  __device__ static __forceinline__ int num_k_stages(const GemmParams& p) {
    return (p.k + Cfg::kKStage - 1) / Cfg::kKStage;
  }

  // (the first of a piece's num_k stages from K stage k_first: Piece, params.hpp)
  __device__ static __forceinline__ void load_first_weights(const GemmParams& p, const Tile& t, const Smem& sm,
                                                            uint64_t* bars, int num_k, uint32_t g = 0,
                                                            int k_first = 0) {
    if constexpr (Cfg::kTmaWeights)
      for (int s = 0; s < kFirstStages && s < num_k; ++s) {
        const int slot = int((g + s) % kStages);  // stage s of a unit starting at stream stage g
        load_weights_tma(p, t, sm, &bars[slot], slot, k_first + s);  // bound: load,wload
      }
  }
  __device__ static void drain_first_weights(uint64_t* bars, int num_k) {
    for (int s = 0; s < kFirstStages && s < num_k; ++s) ptx::mbar_wait_parity(&bars[s], 0);
  }
  __device__ static void reload_first_weights(const GemmParams& p, const Tile& t, const Smem& sm, uint64_t* bars,
                                              int num_k) {
    if constexpr (Cfg::kTmaWeights) {
      drain_first_weights(bars, num_k);
      for (int s = 0; s < kFirstStages && s < num_k; ++s) {
        load_weights_tma(p, t, sm, &bars[kStages], s, s);
        ptx::mbar_wait_parity(&bars[kStages], uint32_t(s) & 1u);
      }
    }
  }

  // Before the dependency wait (kLooksAhead): returns, in thread 0, the expert whose first
  // weight stages it requested for this CTA's tile (-1: none, or no lookahead bound).
  // (Only CTAs whose first piece is a whole unit, below split_from and no short first wave: a
  // half's unit and K stages are another matter.)
  __device__ static int request_early_weights(const GemmParams& p, uint8_t* smem_raw, uint64_t* bars) {
    if (p.lookahead.routes == 0 || int(blockIdx.x) >= p.lookahead.first_ctas || threadIdx.x >= 32) return -1;
    const bool splits = kSplitsK && p.split_park != nullptr;
    if (splits && int(blockIdx.x) >= p.split_from) return -1;
    int32_t tiles = 0;
    const int early = moe::lookahead_tile_expert(p.lookahead, kBN, int(blockIdx.x) / p.m_blocks, &tiles);
    if (splits && int64_t(tiles) * p.m_blocks <= p.split_all_max) return -1;
    if (threadIdx.x == 0 && early >= 0)
      load_first_weights(p, Tile{early, 0, 0, int(blockIdx.x % p.m_blocks) * kBM}, Smem{smem_raw}, bars,
                         num_k_stages(p));
    return early;
  }

  // One piece (a unit, token tile x m-block, or one of its K halves) from its first weights to
  // its epilogue. The ring continues the CTA's stream of stages: stage ks of the piece is stream
  // stage g + ks (slot and barrier phase) and K stage pc.k_first + ks; `early` is the expert
  // whose first weight stages the lookahead requested (the CTA's first unit only), -1 otherwise.
  __device__ static __forceinline__ void run_unit(const GemmParams& p, uint8_t* smem_raw, uint64_t* bars,
                                                  const Piece& pc, int early, bool awaits_tile, uint32_t g) {
    constexpr bool kGemm2 = kStage == GemmStage::kGemm2;
    const bool tile_sync = p.tile_done != nullptr;
    const int unit = pc.unit;
    const int tile_index = int(uint32_t(unit) / uint32_t(p.m_blocks));
    const Tile t = read_tile(p, unit, awaits_tile);

    const Smem sm{smem_raw};
    const int warp = threadIdx.x >> 5;
    const int wm = warp % Cfg::kWarpsM, wk = warp / Cfg::kWarpsM;
    const bool warp_rows = t.m0 + wm * 64 < p.m;

    float acc[4][kNBlocks][4];
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[mb][nb][j] = 0.0f;

    const int num_k = pc.k_stages, k0 = pc.k_first;
    const FragOffsets frag = frag_offsets(wm, wk);
    const bool may_be_big = expert_may_need_big(p.sf_max, t.expert);  // CTA-uniform
    const Loader loader = make_loader(p, t);
    if constexpr (Cfg::kTmaWeights) {  // the weights first: they depend on no launch
      if (threadIdx.x == 0 && (!kLooksAhead || early != t.expert)) {
        if (!kLooksAhead || early < 0) {
          load_first_weights(p, t, sm, bars, num_k, g, k0);
        } else {
          // the routes named another expert than the list
          reload_first_weights(p, t, sm, bars, num_k);  // bound: load,wload
        }
      }
    }
    if (awaits_tile) await_tile(p, tile_index);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_k) load_stage(p, loader, sm, int((g + s) % kStages), k0 + s);  // bound: load
      ptx::cp_async_commit();
    }
    for (int ks = 0; ks < num_k; ++ks) {
      const uint32_t gs = g + uint32_t(ks);  // the stream's stage
      ptx::cp_async_wait<kStages - 2>();
      if constexpr (Cfg::kTmaWeights) ptx::mbar_wait_parity(&bars[gs % kStages], (gs / kStages) & 1u);  // bound: load,wload
      __syncthreads();  // stage ks landed for every thread; slot (gs - 1) % kStages is free
      const int next = ks + kStages - 1;
      if (next < num_k) {
        const int slot = int((gs + kStages - 1) % kStages);
        load_stage(p, loader, sm, slot, k0 + next);  // bound: load
        if constexpr (Cfg::kTmaWeights)
          if (threadIdx.x == 0) load_weights_tma(p, t, sm, &bars[slot], slot, k0 + next);  // bound: load,wload
      }
      ptx::cp_async_commit();
      if (warp_rows && (k0 + ks) * Cfg::kKStage + wk * Cfg::kKWarp < p.k)
        compute_stage(sm, int(gs % kStages), wm, wk, frag, may_be_big, acc);
    }
    ptx::cp_async_wait<0>();
    if (kGemm2 || !tile_sync) ptx::allow_dependent_launch();  // the next launch may start; it waits for us
    if constexpr (kSplitsK)
      if (pc.half >= 0 && !meet_other_half(p, pc.slot, acc)) return;  // the other half finishes it
    if constexpr (Cfg::kWarpsK > 1) park_partials(smem_raw, wm, wk, acc);
    if (warp_rows) finish_item(p, t, smem_raw, wm, wk, acc);
    if (!kGemm2 && tile_sync) count_tile_done(p, tile_index);
  }

  __device__ static void run(const GemmParams& p) {
    extern __shared__ __align__(128) uint8_t smem_dyn[];
    // TMA weights: the ring starts on a 1024-byte swizzle atom (kSmemBytes has the slack)
    uint8_t* smem_raw = smem_dyn;
    if constexpr (Cfg::kTmaWeights) smem_raw += (1024u - (ptx::smem_addr(smem_dyn) & 1023u)) & 1023u;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem_raw + Cfg::kBarOffset);
    if constexpr (Cfg::kTmaWeights) {
      if (threadIdx.x == 0) {
        for (int s = 0; s < kStages + (kLooksAhead ? 1 : 0); ++s) ptx::mbar_init(&bars[s], 1);  // (+ the spare)
        ptx::mbar_fence_init();
        ptx::tma_prefetch_desc(&p.tmap_w);
      }
      __syncthreads();  // the barriers exist before any thread waits on them
    }
    int early = -1;  // thread 0: the expert whose first weight stages it requested before the wait
    if constexpr (kLooksAhead) early = request_early_weights(p, smem_raw, bars);
    constexpr bool kGemm2 = kStage == GemmStage::kGemm2;
    const bool tile_sync = p.tile_done != nullptr;  // item_schedule.cuh, "Tile sync"
    const bool awaits_tile = kGemm2 && tile_sync;
    if (!awaits_tile) ptx::grid_dependency_wait();  // the tile list and B rows come from earlier launches
    if (!kGemm2 && tile_sync) ptx::allow_dependent_launch();
    // the grid covers the worst case of the routing, or (unit queue) the CTAs resident at once
    const int units = tile_count(p, awaits_tile) * p.m_blocks;
    const int num_k = num_k_stages(p);
    const int pieces = kSplitsK ? num_pieces(p, units) : units;
    if (int(blockIdx.x) >= pieces) {
      if (kLooksAhead && threadIdx.x == 0 && early >= 0)  // no copy outlives the CTA
        drain_first_weights(bars, num_k_stages(p));  // bound: load,wload
      return;
    }
    if constexpr (kGemm2) {
      run_unit(p, smem_raw, bars, Piece{int(blockIdx.x), 0, num_k, -1, -1}, early, awaits_tile, 0u);
    } else {
      uint32_t g = 0;
      for (int q = int(blockIdx.x); q < pieces; early = -1) {
        const Piece pc = kSplitsK ? piece_of(p, q, units, num_k) : Piece{q, 0, num_k, -1, -1};
        run_unit(p, smem_raw, bars, pc, early, awaits_tile, g);
        if (p.unit_queue == nullptr) break;
        g += uint32_t(pc.k_stages);
        q = next_unit(p);
      }
    }
  }
};

}  // namespace cake_moe::mxfp4_moe
