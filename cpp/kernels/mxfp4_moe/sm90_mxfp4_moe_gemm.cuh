// Family B prefill GEMMs on sm_90a: the MXFP4 weights are dequantized in registers and fed to
// wgmma as its register operand A (RS form); the routed token rows are B, gathered by cp.async
// into the 128-byte-swizzled K-major tiles wgmma reads from shared memory. The four-warpgroup
// forms take each stage's weight tile by TMA (one box, on the slot's mbarrier).
//
// A work item (token tile t, m-block mb) is weight rows [mb * kBM, +kBM) x the tile's kBN sorted
// rows; the grid is persistent (one CTA per SM walks the items). Three tilings (params.hpp):
// - `wg128`, two warpgroups: warpgroup g owns prepared 64-row groups 2g and 2g + 1; warp w of it
//   owns half w % 2 (two m16 blocks, 32 rows) of group 2g + w / 2, so one k16 step is two
//   m64n128k16 wgmmas (wgmma i takes m16 block i of every warp's half);
// - `wg128x4`, four warpgroups: warpgroup g owns group g, warp w of it m16 block w; one wgmma per
//   k16 step and 64 accumulators per thread. Four warps per scheduler instead of two hide more of
//   the conversion's latencies (Nsight on wg128: issue slots 34% busy, stalls spread over
//   fixed-latency waits, dispatch, instruction fetch and shared-memory loads); 7-10% faster.
// - `wg160x3`, three warpgroups on 192 weight rows, a warp per m16 block as in wg128x4: the 168
//   registers per thread of a 384-thread CTA hold the 80 accumulators of 160-token tiles, which
//   cover an expert's routes in fewer tiles where its count just passes a multiple of 128.
// N = 128 halves the dequantization per multiply-add against N = 64; the price is the GEMM1
// epilogue: an MXFP8 block (32 intermediate columns = one group) spans two or four warps, whose
// per-row amax partials meet in shared memory.
//
// Ring: kStages slots filled kStages - 2 stages ahead, as one stream of stages over the CTA's
// items (no drain between items). Each k16 step's wgmmas (kStepsPerGroup steps' on the BN 32 /
// 64 forms) are one commit group; the group before is retired right after a group is issued
// (kStepsInFlight), and a slot is refilled only after every wgmma that read it has completed.
// `wg128x4_rb` (GEMM2, K <= 512) keeps each token tile's rows resident and streams only the
// weights (Walk, load_resident_b). GEMM1 (and the `wg160x3` GEMM2) take their weights' scale
// codes four stages at a time into a ring of their own (sm90_code_ring.cuh).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/ptx/global_mem.cuh"
#include "common/ptx/grid_dependency.cuh"
#include "common/ptx/mbarrier.cuh"
#include "common/ptx/sm80.cuh"
#include "common/ptx/tma.cuh"
#include "common/ptx/wgmma.cuh"
#include "mxfp4_moe/mxfp4_moe_gemm.cuh"
#include "mxfp4_moe/sm90_code_ring.cuh"

namespace cake_moe::mxfp4_moe {

template <GemmStage kStage, typename Cfg>
struct Sm90Mxfp4MoeGemm {
  // Stage loader, weight reads, SiTU, requantization, GEMM2 epilogue. The loader's tiling names
  // the threads that issue a stage's copies (all of them, or the first warpgroups).
  using Base = Mxfp4MoeGemm<kStage, typename Cfg::LoaderTiling>;
  using Wgmma = ptx::WgmmaBf16RS<Cfg::kBN, 0>;  // B K-major
  static constexpr int kBN = Cfg::kBN, kStages = Cfg::kStages, kThreads = Cfg::kThreads;
  static constexpr int kCopyThreads = Cfg::LoaderTiling::kThreads;
  // m16 blocks per warp: the 256 weight rows over 4 (two warpgroups) or 16 warps (four).
  static constexpr int kMB = Cfg::kBM / 16 / (kThreads / 32);
  static constexpr int kGroupWarps = 4 / kMB;  // warps sharing a prepared 64-row group
  static_assert(kMB == 1 || kMB == 2, "a warp owns one or two m16 blocks of its 64-row group");
  static constexpr int kSmemBytes = Cfg::kSmemBytes;
  // Stages in flight ahead of the one computed. kStages - 1 would refill the slot stage ks - 1
  // read, so its last k16 step would have to retire before each barrier: measured 3-7% slower.
  static constexpr int kAhead = kStages - 2;
  // k16 steps whose wgmmas a warp keeps in flight, Cfg::kStepsPerGroup of them per commit group:
  // - three-warpgroup forms: three single steps (167 of their 168 registers; 2-4% faster than two);
  // - four-warpgroup BN 32 / 64: two groups of four steps (one fence and one wait per 64-wide
  //   unit). Pairs were 1.3-2.8% faster than single steps at T = 1024..2048
  //   (bench/results/2026-12-03_h200_mxfp4_moe_step_pairs.md), fours faster than pairs by
  //   0.9-1.6% on BN 32 (..._mxfp4_moe_exact_copies.md) and 1.5-4.2% on BN 64 at T = 2048,
  //   128 registers without spills (..._mxfp4_moe_steps_and_k_tests.md);
  // - the other four-warpgroup forms: two single steps. A third A set spills `wg128x4` GEMM1 at
  //   the 128-register cap; at BN 96 and in `wg128x4_rb` three steps or step pairs fit and
  //   measured no faster (..._mxfp4_moe_s3_wg96.md, ..._step_pairs.md), nor did three or four
  //   single steps at BN 32 / 64 (..._mxfp4_moe_issue_trims.md), nor step pairs on the
  //   three-warpgroup forms (0-1.2% slower, ..._mxfp4_moe_exact_copies.md).
  static constexpr int kStepsPerGroup = Cfg::kStepsPerGroup;
  static_assert(4 % kStepsPerGroup == 0, "whole groups per 64-wide unit");
  static constexpr int kStepsInFlight = kStepsPerGroup > 1 ? 2 * kStepsPerGroup : Cfg::kWarpGroups == 3 ? 3 : 2;
  static constexpr int kStepsPerStage = Cfg::kKStage / 16;
  static_assert(kStepsInFlight <= kStepsPerStage,
                "the steps in flight at a stage barrier all belong to the stage before: stage g - 2 has retired");
  static constexpr int kNBlocks = kBN / 8;
  static_assert(kAhead >= 1, "the ring needs a slot for the stage whose wgmmas are still running");
  static_assert(Cfg::kWarpsK == 1, "no K split: a warp owns whole k16 steps");
  // Resident token rows (GEMM2 of a short shard, params.hpp): a contiguous walk, the rows of
  // stage ks in slot ks, only the weights through the ring.
  static constexpr bool kResidentB = Cfg::kResidentB;
  static_assert(!kResidentB || (kStage == GemmStage::kGemm2 && Cfg::kMaxResidentK == kStages * Cfg::kKStage),
                "resident token rows: GEMM2 (its B rows are the tile's own sorted rows), one slot per stage");
  // The GEMM1 epilogue's amax exchange: a named barrier over all threads (id 0 is the ring's).
  static constexpr uint32_t kEpilogueBarrier = 1;
  static_assert(Wgmma::kAccRegs == 4 * kNBlocks, "the wgmma N is the token tile");

  using Acc = float[kMB][kNBlocks][4];  // [m16 block of the warp's rows][n8 block][mma.sync C order]

  // k16 step s of unit u: the four A registers of each of the warp's m16 blocks. kBig: the
  // two-multiply conversion (exact for every scale code), otherwise one multiply (codes <= 128).
  // The choice is made once per item from the expert's largest code (GemmParams::sf_max), so the
  // stage loop carries no vote or branch: a per-stage vote with a branch, as in the mma.sync
  // forms, measured 3.5-6% slower here than always multiplying twice.
  template <int kS, bool kBig>
  __device__ static __forceinline__ void fragments(uint32_t (&a)[kMB][4], const uint2 (&wrow)[kMB][2],
                                                   const uint32_t (&codes)[kMB][2]) {
#pragma unroll
    for (int i = 0; i < kMB; ++i) {
      const uint32_t cg = (codes[i][0] >> (8 * (kS / 2))) & 0xFFu, cg8 = (codes[i][1] >> (8 * (kS / 2))) & 0xFFu;
      a_fragment<kS, kBig>(a[i], wrow[i][0], wrow[i][1], cg, cg8);
    }
  }

  // B's descriptor: built once per stage and advanced per k16 step (one 64-bit add), or built
  // per step from the tile's address (~4 more uniform instructions per step). The four-warpgroup
  // forms are issue-bound and gain 1-1.5% from the add (tp8 / ep8 T = 512..2048, same process,
  // bench/results/2026-12-03_h200_mxfp4_moe_issue_trims.md); `wg160x3` measured even to 1.3%
  // slower with it, so it keeps the per-step build, as does the unmeasured two-warpgroup `wg128`.
  static constexpr bool kDescPerStep = Cfg::kWarpGroups != 4;

  // The wgmmas of k16 step kS for the warp's kMB m16 blocks, from A registers `a`.
  template <int kS>
  __device__ static __forceinline__ void issue(Acc& acc, const uint32_t (&a)[kMB][4], uint32_t b_tile,
                                               uint64_t b_desc) {
    const uint64_t desc = kDescPerStep ? ptx::make_desc_kmajor_sw128(b_tile + 32 * kS)
                                       : ptx::desc_advance(b_desc, 32 * kS);
#pragma unroll
    for (int i = 0; i < kMB; ++i) Wgmma::mma(reinterpret_cast<float(&)[4 * kNBlocks]>(acc[i]), a[i], desc, 1u);
  }

  // k16 steps kS + kI (kI = 0 .. kStepsPerGroup - 1) as one commit group: every step's A registers
  // converted, then one fence, the group's wgmmas, one commit and one wait that retires the group
  // before.
  template <int kS, bool kBig, int... kI>
  __device__ static __forceinline__ void step_group(Acc& acc, const uint2 (&wrow)[kMB][2],
                                                    const uint32_t (&codes)[kMB][2], uint32_t b_tile,
                                                    uint64_t b_desc, std::integer_sequence<int, kI...>) {
    uint32_t a[kStepsPerGroup][kMB][4];
    (fragments<kS + kI, kBig>(a[kI], wrow, codes), ...);
    ptx::wgmma_fence();  // the A registers were just written by ordinary instructions
    (issue<kS + kI>(acc, a[kI], b_tile, b_desc), ...);
    ptx::wgmma_commit();
    ptx::wgmma_wait<kStepsInFlight / kStepsPerGroup - 1>();  // the group before retired: its A registers may be reused
  }
  // The unit's four k16 steps, in groups of kStepsPerGroup.
  template <bool kBig, int... kG>
  __device__ static __forceinline__ void unit_steps(Acc& acc, const uint2 (&wrow)[kMB][2],
                                                    const uint32_t (&codes)[kMB][2], uint32_t b_tile,
                                                    uint64_t b_desc, std::integer_sequence<int, kG...>) {
    (step_group<kG * kStepsPerGroup, kBig>(acc, wrow, codes, b_tile, b_desc,
                                           std::make_integer_sequence<int, kStepsPerGroup>{}),
     ...);
  }

  // The weights' scale codes: each stage's words in the slot, or through the code ring
  // (sm90_code_ring.cuh), whose 4-stage copy needs kAhead + 4 <= its kCodeStages.
  using Codes = Sm90CodeRing<kStage, Cfg, Base>;
  static_assert(kAhead + 4 <= Cfg::kCodeStages, "a 4-stage copy never lands on words still to be read");

  // One stage (two 64-element units, four k16 steps each) for the warp's 16 kMB rows from row0:
  // the weights of ring slot `slot`, the token rows of slot `b_slot` (the same slot, or the
  // stage's resident slot), the codes of stream stage g.
  template <bool kBig>
  __device__ static __forceinline__ void compute_stage(const typename Base::Smem& sm, int slot, int b_slot, int row0,
                                                       typename Codes::Reads cr, Acc& acc) {
    const uint32_t b_stage = ptx::smem_addr(sm.b(b_slot));
    const uint64_t b_desc0 = ptx::make_desc_kmajor_sw128(b_stage);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint2 wrow[kMB][2];
      uint32_t codes[kMB][2];
      Base::template load_unit_words<kMB>(sm, slot, Base::unit_offsets(row0, 0, u).w, wrow);
      Base::template load_unit_codes<kMB>(cr.unit0 + 2 * u, cr.row_stride, codes);
      const uint32_t b_tile = b_stage + u * Cfg::kBTileBytes;
      const uint64_t b_desc = ptx::desc_advance(b_desc0, u * Cfg::kBTileBytes);
      unit_steps<kBig>(acc, wrow, codes, b_tile, b_desc, std::make_integer_sequence<int, 4 / kStepsPerGroup>{});
    }
  }

  // The GEMM1 epilogue's plain-gate SiTU path (Base::situ<true>) beside the present one: on the
  // four-warpgroup forms only (wg128x4 GEMM1 1.6-2.0% faster on the H100; wg160x3, whose kernel
  // holds both paths' code then, ran 0.8% slower).
  static constexpr bool kPlainGatePath = Cfg::kWarpGroups == 4;

  // SiTU of the warp's accumulators (into the up slots) and each token row's amax over the warp's
  // columns, into amax_rows.
  template <bool kPlainGate>
  __device__ static __forceinline__ void situ_rows(const typename Base::Situ& s, float* amax_rows, int warp, int g,
                                                   int q, Acc& acc) {
    using namespace numerics;
#pragma unroll
    for (int nb = 0; nb < kNBlocks; ++nb) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < kMB; ++i) {
          acc[i][nb][c] = Base::template situ<kPlainGate>(acc[i][nb][2 + c], acc[i][nb][c], s);
          amax = max_abs_nan(amax, acc[i][nb][c]);
        }
#pragma unroll
        for (int d = 4; d < 32; d <<= 1) amax = max_abs_nan(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
        if (g == 0) amax_rows[warp * kBN + nb * 8 + 2 * q + c] = amax;
      }
    }
  }

  // GEMM1 epilogue. Thread (g, q) of the group's warp w holds, for m16 block b = kMB w + i of the
  // group, up (c0, c1) and gate (c2, c3) of intermediate column j0 + 4g + b for token rows 2q,
  // 2q + 1 of each n8 block. The MXFP8 block of a row is the group's 32 columns: amax over i, the
  // 8 lanes g, and the group's other warps through shared memory, combined in warp order.
  // `warp`: the warp's index among the MMA warps.
  __device__ static void epilogue_gemm1(const GemmParams& p, const typename Base::Tile& t, uint8_t* smem, int group,
                                        int warp, Acc& acc) {
    using namespace numerics;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3, w = warp % kGroupWarps;
    const typename Base::Situ s = Base::situ_of(p, t.expert);
    float* amax_rows = reinterpret_cast<float*>(smem + Cfg::kAmaxOffset);  // [warp][token row]
    // The sigmoid's reciprocal without its slow path where no gate of the warp needs it (a gate
    // at or below -87, or NaN: practically never), the present code otherwise (Base::situ).
    if constexpr (kPlainGatePath) {
      bool plain = true;
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
          for (int i = 0; i < kMB; ++i) plain &= acc[i][nb][2 + c] > Base::kPlainGateMin;
      if (__all_sync(0xFFFFFFFFu, plain)) {
        situ_rows<true>(s, amax_rows, warp, g, q, acc);
      } else {
        situ_rows<false>(s, amax_rows, warp, g, q, acc);
      }
    } else {
      situ_rows<false>(s, amax_rows, warp, g, q, acc);
    }
    ptx::named_barrier_sync(kEpilogueBarrier, kThreads);
    const int j = (t.m0 + group * 64) / 2 + 4 * g + kMB * w;
    const typename Base::TileRows rows(p.out, t, p.m / 2, j, q);
    const bool column_in = j < p.m / 2;
    const float* partials = amax_rows + (warp - w) * kBN;  // the group's first warp
    // The 8 lanes g of a column q share their rows' block scales: lane g computes the codes of
    // n8 blocks g and g + 8 (a byte per row), the other lanes read them by shuffle.
    constexpr int kOwn = (kNBlocks + 7) / 8;  // n8 blocks whose scales a lane computes
    constexpr int kSources = kNBlocks < 8 ? kNBlocks : 8;
    constexpr int kWords = (2 * kOwn + 3) / 4;  // a lane's codes, a byte per row, in words
    uint32_t own[kWords] = {};
#pragma unroll
    for (int i = 0; i < kOwn; ++i) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int nb = g + 8 * i, row = nb * 8 + 2 * q + c;
        if (nb < kNBlocks) {
          float amax = partials[row];
#pragma unroll
          for (int v = 1; v < kGroupWarps; ++v) amax = max_abs_nan(amax, partials[v * kBN + row]);
          uint32_t code;
          float to_elem;
          formats::detail::block_scale<formats::Fmt::kMxfp8>(amax, int32_t(formats::ScaleRule::kRoundUp), 0.0f, code,
                                                             to_elem);
          own[(2 * i + c) / 4] |= code << (8 * ((2 * i + c) % 4));
        }
      }
    }
#pragma unroll
    for (int src = 0; src < kSources; ++src) {
      uint32_t codes[kWords];
#pragma unroll
      for (int v = 0; v < kWords; ++v) codes[v] = __shfl_sync(0xFFFFFFFFu, own[v], src * 4 + q);
#pragma unroll
      for (int i = 0; i < kOwn; ++i) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int nb = src + 8 * i;
          if (nb >= kNBlocks) continue;
          const uint32_t code = (codes[(2 * i + c) / 4] >> (8 * ((2 * i + c) % 4))) & 0xFFu;
          store_act(rows, column_in, code, acc, nb, c);
        }
      }
    }
  }

  // One token row's MXFP8 elements of the thread's columns j, j + 1 (kMB of them), requantized
  // with the row's block code and written as BF16 (row nb * 8 + 2q + c of `rows`, the thread's
  // column j). The factor into the element range is block_scale's for that code (round-up never
  // yields 0xFF: that code marks a NaN block).
  __device__ static __forceinline__ void store_act(const typename Base::TileRows& rows, bool column_in, uint32_t code,
                                                   const Acc& acc, int nb, int c) {
    using namespace numerics;
    // (codes 1..254; the zero and NaN blocks are selected in requant_value)
    const float to_elem = ue8m0_inverse(code), from_elem = __uint_as_float(code << 23);
    uint16_t out[kMB];
#pragma unroll
    for (int i = 0; i < kMB; ++i)
      out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(Base::requant_value(acc[i][nb][c], code, to_elem, from_elem)));
    if (rows.has(nb, c) && column_in) {
      if constexpr (kMB == 2) {
        *reinterpret_cast<uint32_t*>(rows.at(nb, c)) = uint32_t(out[0]) | (uint32_t(out[1]) << 16);
      } else {
        *reinterpret_cast<uint16_t*>(rows.at(nb, c)) = out[0];
      }
    }
  }

  // An item's place in the list: token tile `index`, m-block `mb` (item index * m_blocks + mb).
  struct Cursor {
    int index, mb;
  };
  // work >= 0 and m_blocks > 0: unsigned division and remainder (fewer instructions than signed).
  __device__ static Cursor cursor_of(const GemmParams& p, int work) {
    const int index = int(uint32_t(work) / uint32_t(p.m_blocks));
    return {index, work - index * p.m_blocks};
  }

  __device__ static typename Base::Tile tile_at(const GemmParams& p, Cursor c) {
    const moe::TokenTile tt = p.tiles[c.index];
    typename Base::Tile t;
    t.expert = tt.expert;
    t.row0 = tt.row0;
    const int end = p.offsets[tt.expert + 1];
    t.rows = end - tt.row0 < kBN ? end - tt.row0 : kBN;
    t.m0 = c.mb * Cfg::kBM;
    return t;
  }

  // Two warpgroups: every thread copies, with the lean pointer loader (sources resolved once per
  // item). Four: the first two warpgroups copy, with the row loader (the pointer loader fits
  // their 128 registers up to BN 96 but measured no faster: ..._mxfp4_moe_issue_trims.md).
  static constexpr bool kAllCopy = kCopyThreads == kThreads;
  // TMA weights (the four-warpgroup forms): thread 0 requests each stage's weight tile (one box
  // of kBM rows), completing on the slot's mbarrier; the copying threads take the scale codes
  // and token rows (the row loader skips the weights under kTmaWeights). Their cp.async copies of
  // the weights had cost the copying warps ~40 instructions per stage: 2.1-2.9% faster at
  // T = 1024, neutral within the spread at T = 2048..4096 (same process,
  // bench/results/2026-12-03_h200_mxfp4_moe_tma_weights.md). The three-warpgroup forms keep
  // cp.async: with the weights by TMA (Tiling's no-padding assert relaxed) they measured 1.7-3.3%
  // slower at T = 16384 (..._mxfp4_moe_wg160_tma_weights.md); the two-warpgroup form copies with
  // every thread (pointer loader).
  static constexpr bool kTmaW = Cfg::kTmaWeights;
  static_assert(!kTmaW || !kAllCopy, "TMA weights: the four-warpgroup forms (row loader)");
  __device__ static __forceinline__ uint64_t* ring_bars(const typename Base::Smem& sm) {
    return reinterpret_cast<uint64_t*>(sm.base + Cfg::kRingBarOffset);
  }
  using StageLoader = std::conditional_t<kAllCopy, typename Base::PointerLoader, typename Base::Loader>;
  __device__ static __forceinline__ bool copies() { return kAllCopy || int(threadIdx.x) < kCopyThreads; }
  __device__ static StageLoader make_stage_loader(const GemmParams& p, const typename Base::Tile& t) {
    if constexpr (kAllCopy) {
      return Base::make_pointer_loader(p, t);
    } else {
      return copies() ? Base::make_loader(p, t) : StageLoader{};
    }
  }

  // The items a CTA walks: first, first + step, ... below end. Interleaved (blockIdx.x, +
  // gridDim.x, ...: the CTAs that run together share token tiles, whose rows then come from L2),
  // or with resident token rows a contiguous range (consecutive items share a tile).
  struct Walk {
    int first, end, step;
  };
  __device__ static Walk walk_of(int items) {
    if constexpr (kResidentB) {
      const int per = (items + int(gridDim.x) - 1) / int(gridDim.x);
      const int first = int(blockIdx.x) * per;
      return {first, first + per < items ? first + per : items, 1};
    } else {
      return {int(blockIdx.x), items, int(gridDim.x)};
    }
  }
  // Moves the cursor to item `work`, the walk's next one, and its tile `t` with it; returns
  // whether the token tile changed. On the resident rows' contiguous walk the next item is
  // mostly the next m-block of the same token tile (m_blocks items in a row), which keeps the
  // tile's expert and rows instead of reading them again after a division (and the caller its
  // scale class); an interleaved walk reads every item's tile.
  __device__ static __forceinline__ bool step_to(const GemmParams& p, int work, Cursor& c, typename Base::Tile& t) {
    if constexpr (kResidentB) {
      if (++c.mb < p.m_blocks) {
        t.m0 = c.mb * Cfg::kBM;
        return false;
      }
      c = {c.index + 1, 0};
    } else {
      c = cursor_of(p, work);
    }
    t = tile_at(p, c);
    return true;
  }

  // The copying threads' place in the CTA's stream of stages, which runs on across items: item
  // `work` of the walk, its stage `ks`, and that item's loader. The next item's first stages are
  // copied during the current item's last ones, so a short K (GEMM2 of a TP shard: 3 stages per
  // item) keeps the ring full over item boundaries.
  struct Producer {
    Walk walk;
    int work, ks;
    StageLoader loader;
    typename Base::Tile tile;
    Cursor cursor;
  };

  // The copying threads' share of a stage. K is a multiple of 128 here, so kNoKTests drops the
  // per-stage K tests (BN 32: 0.9-1.7% faster at T = 512..1024, ..._mxfp4_moe_steps_and_k_tests.md),
  // and kNoZeroFill (BN 160) also copies token rows past the tile from row 0 instead of
  // zero-filling them per copy: 1.1-3.1% faster at T = 8192..16384; on wg32x4 the filler rows'
  // reads (most of a thin tile at T = 512) made it 2.9% slower (..._mxfp4_moe_exact_copies.md).
  static_assert(!Cfg::kNoKTests || !kAllCopy, "copies without K tests: the row loader");
  template <bool kWithSf>
  __device__ static __forceinline__ void copy_stage(const GemmParams& p, const typename Base::Smem& sm,
                                                    const StageLoader& l, int slot, int ks) {
    if constexpr (kAllCopy) {
      Base::template load_stage<!kResidentB, kWithSf>(p, l, sm, slot, ks);
    } else {
      Base::template load_stage<!kResidentB, kWithSf, Cfg::kNoKTests, Cfg::kNoZeroFill>(p, l, sm, slot, ks);
    }
  }

  // Stage g of the stream into ring slot g % kStages (nothing past the last item), one commit
  // group either way; then the producer moves on. With resident token rows only the weights.
  __device__ static void produce(const GemmParams& p, const typename Base::Smem& sm, Producer& pr, uint32_t g) {
    if (pr.work < pr.walk.end) {
      const int slot = int(g % kStages);
      if constexpr (kTmaW) {
        if (threadIdx.x == 0) Base::load_weights_tma(p, pr.tile, sm, &ring_bars(sm)[slot], slot, pr.ks);
      }
      if (copies()) {
        if (Codes::enabled(p)) {
          copy_stage<false>(p, sm, pr.loader, slot, pr.ks);
          Codes::load(p, sm, Codes::source(pr.loader), pr.ks, g);
        } else {
          copy_stage<true>(p, sm, pr.loader, slot, pr.ks);
        }
      }
      if (++pr.ks == p.k / Cfg::kKStage) {  // K is a multiple of 128
        pr.ks = 0;
        pr.work += pr.walk.step;
        if (pr.work < pr.walk.end) {
          step_to(p, pr.work, pr.cursor, pr.tile);
          pr.loader = make_stage_loader(p, pr.tile);
        }
      }
    }
    ptx::cp_async_commit();
  }

  // Resident token rows: every stage of tile t's rows (GEMM2: sorted rows t.row0.., K <=
  // kMaxResidentK) into the token-row area of slot ks, rows past the tile zero-filled; all threads.
  __device__ static void load_resident_b(const GemmParams& p, const typename Base::Tile& t,
                                         const typename Base::Smem& sm) {
    constexpr int kChunks = Cfg::kBRowBytes / 16;  // 16-byte chunks per row and stage
    const int num_k = p.k / Cfg::kKStage;
    for (int i = threadIdx.x; i < num_k * kBN * kChunks; i += kThreads) {
      const int ks = i / (kBN * kChunks), r = i / kChunks % kBN, c = i % kChunks;
      const bool ok = r < t.rows;
      ptx::cp_async_16(ptx::smem_addr(sm.b(ks)) + Cfg::b_offset(r, c),
                       ok ? p.b + int64_t(t.row0 + r) * p.k + ks * Cfg::kKStage + c * 8 : p.b, ok);
    }
    ptx::cp_async_commit();
  }

  // The mainloop over K of one item, whose first stage is stage g of the stream (its copies are
  // issued kAhead stages ahead); returns with every wgmma retired. The ring needs no drain: each
  // slot is refilled after the barrier that follows its last reader's stage.
  template <bool kBig>
  __device__ static void mainloop(const GemmParams& p, const typename Base::Smem& sm, Producer& pr, uint32_t& g,
                                  int row0, Acc& acc) {
#pragma unroll
    for (int i = 0; i < kMB; ++i)
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][nb][j] = 0.0f;
    const int num_k = p.k / Cfg::kKStage;
    for (int ks = 0; ks < num_k; ++ks, ++g) {
      ptx::cp_async_wait<kAhead - 1>();
      ptx::fence_proxy_async_smem();  // cp.async wrote B through the generic proxy; wgmma reads it
      __syncthreads();  // stage g landed; the stage that last used slot (g + kAhead) % kStages retired
      produce(p, sm, pr, g + kAhead);
      const int slot = int(g % kStages);
      if constexpr (kTmaW) ptx::mbar_wait_parity(&ring_bars(sm)[slot], (g / kStages) & 1u);
      compute_stage<kBig>(sm, slot, kResidentB ? ks : slot, row0, Codes::reads(p, sm, slot, row0, g), acc);
    }
    ptx::wgmma_wait<0>();
    ptx::reg_fence(reinterpret_cast<float(&)[kMB * kNBlocks * 4]>(acc));
  }

  // Persistent: a CTA walks its items (Walk); the next item's first stages are in flight while
  // the current item's epilogue runs (it does not touch the ring; the GEMM1 amax partials are
  // rewritten only after the next item's first stage barrier).
  __device__ static void run(const GemmParams& p) {
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    if (p.choice_at_start && ptx::ld_cg_s32(p.tile_choice) != p.choice) {
      // Not chosen, known before the wait: the next launch may start now, and one thread waits
      // so that this grid still completes after its predecessor (the next launch's wait covers
      // every launch before it); the other CTAs leave at once instead of each holding an SM's
      // registers and shared memory until then.
      ptx::allow_dependent_launch();
      if (blockIdx.x == 0 && threadIdx.x == 0) ptx::grid_dependency_wait();
      return;
    }
    ptx::grid_dependency_wait();  // the tile list and B rows come from the previous launches
    // The other form of the pair was chosen: nothing to do (having waited, this grid completes
    // after its predecessor, so the next launch's wait still covers every launch before it).
    if (p.tile_choice != nullptr && *p.tile_choice != p.choice) return;
    const Walk walk = walk_of(*p.tile_count * p.m_blocks);
    int work = walk.first;
    if (work >= walk.end) return;
    if constexpr (kResidentB) {
      if (p.k > Cfg::kMaxResidentK) __trap();  // the host binds this form only for such K
    }
    if (Codes::enabled(p) && p.k % 512 != 0) __trap();  // the host sets it only for such K
    static_assert(kThreads == 128 * Cfg::kWarpGroups, "MMA warpgroups, nothing else");
    const typename Base::Smem sm{smem_raw};
    const int warp = threadIdx.x >> 5;
    const int group = warp / kGroupWarps;  // prepared 64-row group of the warp in the CTA
    const int row0 = group * 64 + (warp % kGroupWarps) * 16 * kMB;
    Cursor cursor = cursor_of(p, work);
    typename Base::Tile t = tile_at(p, cursor);
    if constexpr (kTmaW) {
      if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) ptx::mbar_init(&ring_bars(sm)[s], 1);
        ptx::mbar_fence_init();
        ptx::tma_prefetch_desc(&p.tmap_w);
      }
      __syncthreads();
    }
    Producer pr{walk, work, 0, make_stage_loader(p, t), t, cursor};
    uint32_t g = 0;  // the stream's stage that the MMA warps compute next
#pragma unroll
    for (int s = 0; s < kAhead; ++s) produce(p, sm, pr, uint32_t(s));
    int resident = -1;  // the token tile whose rows are resident (kResidentB)
    bool big = expert_may_need_big(p.sf_max, t.expert);  // CTA-uniform, the expert's scale class
    while (true) {
      if constexpr (kResidentB) {
        if (cursor.index != resident) {  // CTA-uniform
          __syncthreads();  // every warp retired its wgmmas on the previous tile's rows
          load_resident_b(p, t, sm);
          ptx::cp_async_wait<0>();  // (the ring's prefetched stages too: once per tile)
          resident = cursor.index;  // the mainloop's first barrier publishes the rows
        }
      }
      Acc acc;
      if (big) {
        mainloop<true>(p, sm, pr, g, row0, acc);
      } else {
        mainloop<false>(p, sm, pr, g, row0, acc);
      }
      const int next = work + walk.step;
      // The next GEMM / finalize may start; it waits for us. Only ever after this grid's own wait:
      // a pair's later launches read the choice at their start on that (choice_at_start).
      if (next >= walk.end) ptx::allow_dependent_launch();
      if constexpr (kStage == GemmStage::kGemm1) {
        epilogue_gemm1(p, t, smem_raw, group, warp, acc);
      } else {
        Base::epilogue_gemm2(p, t, group * 64, 2 * kMB * (warp % kGroupWarps), acc);  // blocks kMB w + i
      }
      if (next >= walk.end) break;
      if (step_to(p, next, cursor, t)) big = expert_may_need_big(p.sf_max, t.expert);
      work = next;
    }
  }
};

}  // namespace cake_moe::mxfp4_moe
