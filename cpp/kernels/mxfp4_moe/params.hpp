// Parameters and tilings of the MXFP4-weight grouped GEMMs of family B (kernels:
// mxfp4_moe_gemm.cuh). Plain data shared by the device code and its host launcher.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "moe/params.hpp"
#include "mxfp4_moe/split_pieces.hpp"

namespace cake_moe::mxfp4_moe {

// The layer's H and intermediate shard are at most this (the host refuses larger): a bank's row
// coordinates (L x 2I, L x H rows) stay int32, the finalize's column blocks a grid dimension
// (< 2^16), and an item's route-row offsets 32-bit (epilogue.cuh).
constexpr int64_t kMaxLayerDim = int64_t(1) << 19;
// The largest token tile of any form (the sm_90a wg160x3 forms).
constexpr int kMaxTileRows = 160;

enum class GemmStage : int32_t {
  kGemm1 = 1,  // act = MXFP8(SiTU(x W1^T)) as BF16, rows gathered by token
  kGemm2 = 2,  // rows = act W2^T as BF16 route rows
};

struct GemmParams {
  const uint8_t* w;             // [L, m, k/2] prepared MXFP4 (layout cake_mma_v3, docs/mxfp4_moe.md)
  const uint8_t* w_sf;          // [L, m, k/32] UE8M0, rows permuted like w
  const uint8_t* sf_max;        // [L] the largest code of each expert's w_sf (prepare), or null. The
                                //   sm_90a forms convert an expert whose codes are all <= 128 with one
                                //   multiply per bf16x2, any other (or every one, when null) with two;
                                //   the mma.sync forms skip their per-stage big-code vote for it
  const uint16_t* b;            // BF16 rows of length k: GEMM1 x [T, H] (gathered), GEMM2 act [R, I]
  const int32_t* row_token;     // GEMM1: token of each sorted row; GEMM2: unused (B row = sorted row)
  const int32_t* offsets;       // [L + 1] sorted-row offsets per local expert
  const int32_t* tile_count;    // number of valid entries of `tiles`
  const moe::TokenTile* tiles;  // token tiles (block_n rows each) from the routing kernel
  int32_t* tile_done;           // null, or GEMM1 CTAs finished per token tile: GEMM1 counts itself in,
                                //   GEMM2 waits for done_target instead of for all of GEMM1
  uint16_t* out;                // GEMM1: act [R, m/2]; GEMM2: rows [R, m]; BF16
  const float* beta;            // GEMM1: SiTU beta per local expert
  const float* linear_beta;     // GEMM1: SiTU linear beta per local expert
  int32_t m;                    // weight rows per expert: 2I (GEMM1) or H (GEMM2); multiple of 64
  int32_t k;                    // reduction: H (GEMM1) or I (GEMM2); multiple of 128
  int32_t m_blocks;             // ceil(m / Tiling::kBM): the grid is tiles x m_blocks CTAs
  int32_t done_target;          // GEMM1's m_blocks (with tile_done)
  moe::RouteLookahead lookahead;  // GEMM1 of a TMA-weight form, few routes: name the tile's expert
                                  //   from the routes and request the first weight stages before
                                  //   the dependency wait (routes = 0: after it)
  int32_t* unit_queue;          // GEMM1 under tile sync: null, or a counter the routing kernel zeroes;
                                //   the grid is the CTAs resident at once, and a CTA done with its
                                //   unit takes the next one past the grid from it (no idle CTAs
                                //   stand between GEMM1's first wave and GEMM2's dependent launch)
  CUtensorMap tmap_w;           // w as a 2D uint8 tensor [L * m rows, k / 2 bytes] (mma.sync forms: the
                                //   weight tiles arrive by TMA in Tiling::kWBoxBytes wide boxes)
  int32_t code_ring;            // sm_90a forms whose tiling has the ring for this GEMM, k a multiple
                                //   of 512: 1 = the scale codes four stages per copy into a ring of
                                //   their own (sm90_code_ring.cuh), 0 = each stage's with its weights
  float* split_park;            // GEMM1 under tile sync: null, or (moe::kMaxSplitUnits parking slots)
                                //   the units from split_from on, if few, are computed as two K
                                //   halves by two CTAs (split_units); the half to finish first parks
                                //   its partial sums here, the other adds them (item_schedule.cuh)
  int32_t* split_flags;         // [moe::kMaxSplitUnits] arrivals per split unit (zeroed by the routing)
  int32_t split_from;           // the first unit split; units before it (the first wave) stay whole
  int32_t split_max;            // <= moe::kMaxSplitUnits: with more units from split_from on, none is split
  int32_t split_all_max;        // <= moe::kMaxSplitUnits: with at most this many units (a short first
                                //   wave, fewer units than SMs) every unit is split, from unit 0
  const int32_t* tile_choice;   // null, or (an sm_90a wgmma form bound beside another one) the tile
                                //   form the routing kernel chose (header[moe::kTileChoiceAt]): the
  int32_t choice;               //   kernel exits at once unless it equals `choice`
  int32_t choice_at_start;      // 1: the launch follows another GEMM launch, so the routing has completed
                                //   when it starts (every GEMM launch releases its dependents only after
                                //   its own dependency wait, or, not chosen, once it has read the choice
                                //   itself) and the choice may be read before the wait
};

// A CTA computes kBM weight rows x kBN sorted rows. Warps: kWarpsM along M (64 rows each, four
// m16 blocks) x kWarpsK splitting each pipeline stage's K (128 each, reduced in warp order).
// kTmaWeights: a stage's weight tile arrives by TMA (boxes of kWBoxBytes x kBM rows with the
// matching 128- or 64-byte swizzle, completion on an mbarrier) instead of 16-byte cp.async.
template <int kBN_, int kWarpsM_, int kWarpsK_, int kStages_, bool kTmaWeights_ = false>
struct Tiling {
  static constexpr int kBN = kBN_, kWarpsM = kWarpsM_, kWarpsK = kWarpsK_, kStages = kStages_;
  static constexpr bool kTmaWeights = kTmaWeights_;
  static_assert(kBN_ <= kMaxTileRows, "kMaxTileRows bounds every form's token tile");
  // As GEMM1 with few routes, the tiling requests its first weight stages before the dependency
  // wait (GemmParams::lookahead; the host binds one only where this holds).
  static constexpr bool kLooksAhead = kTmaWeights && kBN_ == 8;
  // Each stage's scale codes come with the stage (the sm_90a tilings' ring: Sm90Tiling).
  static constexpr bool kGemm1CodeRing = false, kGemm2CodeRing = false;
  static constexpr int kBM = 64 * kWarpsM;
  static constexpr int kKWarp = 128;                  // K per warp per stage: 4 UE8M0 blocks
  static constexpr int kKStage = kKWarp * kWarpsK;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsK;
  static constexpr int kWRowBytes = kKStage / 2;      // prepared FP4 bytes per row per stage
  static constexpr int kSfRowBytes = kKStage / 32;
  static constexpr int kBRowBytes = kKStage * 2;      // BF16 activations per row per stage
  // A stage: the weight rows, their scales, then the token rows from a 1024-byte boundary (the
  // swizzle atom of the sm_90a B tiles). Padding appears only for 192 weight rows (13056 bytes of
  // weights and scales -> 13312); every other tiling's offset is already a multiple of 1024.
  static constexpr int kBOffset = (kBM * (kWRowBytes + kSfRowBytes) + 1023) / 1024 * 1024;
  static constexpr int kStageBytes = kBOffset + kBN * kBRowBytes;
  static constexpr int kAccPerLane = 4 * (kBN / 8) * 4;  // 4 m16 blocks x n8 blocks x 4
  // As GEMM1, units may run as two K halves (item_schedule.cuh, "K halves"): a CTA's partial
  // sums fit one parking slot (the n8 forms).
  static constexpr bool kGemm1SplitsK = kThreads * kAccPerLane * 4 <= moe::kSplitParkBytes;
  // token rows resident over a tile's items (Sm90Tiling's GEMM2 forms): none here
  static constexpr bool kResidentB = false;
  static constexpr int kMaxResidentK = 0;
  static constexpr int kReduceBytes = kWarpsK > 1 ? kWarpsK * kWarpsM * 32 * kAccPerLane * 4 : 0;  // K-split tail
  static constexpr int kWBoxBytes = kWRowBytes >= 128 ? 128 : kWRowBytes;  // one swizzle span
  static constexpr int kWBoxes = kWRowBytes / kWBoxBytes;
  // The ring (or the K-split reduction that reuses it), then one mbarrier per stage and a spare
  // (the lookahead's reload, Mxfp4MoeGemm::reload_first_weights); with TMA weights the dynamic
  // shared memory is rounded up to the 1024-byte swizzle atom in the kernel.
  static constexpr int kBarOffset = kStages * kStageBytes > kReduceBytes ? kStages * kStageBytes : kReduceBytes;
  static constexpr int kSmemBytes = kTmaWeights ? kBarOffset + 8 * (kStages + 1) + 1024 : kBarOffset;
  static_assert(!kTmaWeights || kWBoxBytes == 128 || kWBoxBytes == 64, "a weight box is one 64- or 128-byte swizzle row");
  static_assert(!kTmaWeights || (kBM * kWRowBytes % 1024 == 0 && kStageBytes % 1024 == 0 &&
                                  kBOffset == kBM * (kWRowBytes + kSfRowBytes)),
                "every stage's weight tile starts on a 1024-byte swizzle atom");
  static_assert(kBN % 8 == 0 && kBN >= moe::kMinBlockN, "token tiles are whole n8 blocks");
  static_assert(kWRowBytes % 64 == 0, "weight rows are whole 64-byte units per stage");

  // Byte offset of 16-byte chunk `chunk` of token row `row` in a stage's activation tile: rows
  // of kBRowBytes, chunks XOR-swizzled by the row so the ldmatrix reads of 8 rows are conflict-free.
  static constexpr int b_offset(int row, int chunk) { return row * kBRowBytes + 16 * (chunk ^ (row & 7)); }
};

// sm_90a wgmma forms (sm90_mxfp4_moe_gemm.cuh): a CTA computes kRowGroups x 64 weight rows x kBN
// token rows by RS wgmma m64nNk16 (dequantized weights from registers as A, the token rows from
// shared memory as B), on two warpgroups (two m16 blocks per warp) or one warpgroup per 64-row
// group (one m16 block per warp: four warps per scheduler hide more of the conversion's
// latencies). A stage's token rows are two K-major tiles (one per 64-wide K half) in the
// 128-byte swizzle wgmma reads: kBN rows x 128 B, 8-row atoms. Past the ring: each warp's per-row
// MXFP8 amax partials for the GEMM1 epilogue, then the scale-code ring, then (kTmaWeights) one
// mbarrier per slot. The first two warpgroups issue the cp.async copies (LoaderTiling: the stage
// loader's view); with kTmaWeights the weight tile comes by TMA (one box of kBM rows x 64 B,
// 64-byte swizzle).
// kResidentB (GEMM2 of a short shard, K <= kStages * 128): a CTA walks a contiguous range of
// items, so consecutive items share a token tile; the tile's rows for every stage stay in the
// slots' token-row areas (stage ks in slot ks) while only the weights stream through the ring.
// Three row groups (192 weight rows) on three warpgroups leave 168 registers per thread, room
// for the 80 accumulators of a 160-token tile: an expert's routes then take fewer tiles (292
// routes: two instead of three), and each weight is converted once per tile.
//
// A form's knobs are named in a shape: a type deriving from Sm90Shape that sets kBN and overrides
// the defaults it changes (C++17 has no class-type template arguments, so the knobs are static
// members). The defaults: two warpgroups over four 64-row groups, cp.async weights, one k16 step
// per commit group, K-tested and zero-filled stage copies.
struct Sm90Shape {
  static constexpr int kWarpGroups = 2;       // 2 (a warp owns two m16 blocks) or kRowGroups
  static constexpr int kRowGroups = 4;        // 64-row weight groups: kBM = 64 x kRowGroups
  static constexpr bool kResidentB = false;   // token rows resident over a tile's items (GEMM2)
  static constexpr bool kTmaWeights = false;  // the weight tile by TMA instead of cp.async
  // k16 steps per wgmma commit group: one fence and one wait per group; 4 where their A
  // registers fit (BN 32 / 64, sm90_mxfp4_moe_gemm.cuh)
  static constexpr int kStepsPerGroup = 1;
  // The copying threads' stage loads drop their per-stage K tests (this kernel runs K as a
  // multiple of 128): the BN 32 and 160 forms (on BN 64 slower, on BN 96 / 128 within 0.3%).
  static constexpr bool kNoKTests = false;
  // With kNoKTests: token rows past a tile are copied from row 0 instead of zero-filled per
  // copy (those columns are computed and never stored). The BN 160 forms; on BN 32, where most
  // of a tile is filler at T = 512, the extra reads cost more than the predicate.
  static constexpr bool kNoZeroFill = false;
};
template <class S> struct ResidentB : S { static constexpr bool kResidentB = true; };
// The stage loader's view of a form (LoaderTiling): its weight rows and token tile, with the
// default knobs (the copies' K tests and fill come from the form itself).
template <class S> struct Sm90LoaderShape : Sm90Shape {
  static constexpr int kBN = S::kBN, kRowGroups = S::kRowGroups;
  static constexpr bool kTmaWeights = S::kTmaWeights;
};

template <class Shape>
struct Sm90Tiling : Tiling<Shape::kBN, Shape::kRowGroups, 1, 4, Shape::kTmaWeights> {
  using Base = Tiling<Shape::kBN, Shape::kRowGroups, 1, 4, Shape::kTmaWeights>;
  using LoaderTiling = Sm90Tiling<Sm90LoaderShape<Shape>>;
  static constexpr int kWarpGroups = Shape::kWarpGroups;
  static constexpr int kStepsPerGroup = Shape::kStepsPerGroup;
  static constexpr bool kNoZeroFill = Shape::kNoZeroFill;
  static constexpr bool kNoKTests = Shape::kNoKTests;
  static constexpr bool kResidentB = Shape::kResidentB;
  static constexpr int kMaxResidentK = Base::kStages * Base::kKStage;
  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr bool kGemm1SplitsK = false;  // (persistent: no unit queue)
  static constexpr int kBTileBytes = Base::kBN * 128;  // one K half of a stage's token rows
  static constexpr int kAmaxOffset = Base::kStages * Base::kStageBytes;
  // Then the scale codes' ring (sm90_code_ring.cuh; the slots' scale areas then go unused, and
  // a GEMM that keeps them leaves the ring unused): per row the 4-byte words of kCodeStages
  // consecutive stages.
  static constexpr int kCodeStages = 8;
  // Which GEMMs take it (measured, sm90_code_ring.cuh): GEMM1 (the resident-row tilings serve
  // GEMM2 only), and GEMM2 of the three-warpgroup form that streams its token rows. A tiling none
  // of whose GEMMs takes it has no ring area.
  static constexpr bool kGemm1CodeRing = !kResidentB;
  static constexpr bool kGemm2CodeRing = Shape::kRowGroups == 3 && !kResidentB;
  static constexpr int kCodeRowBytes = kCodeStages * Base::kSfRowBytes;
  static constexpr int kCodeOffset = kAmaxOffset + kThreads / 32 * Base::kBN * 4;
  // Then, with TMA weights, one mbarrier per ring slot (the weights' arrival).
  static constexpr int kRingBarOffset = kCodeOffset + (kGemm1CodeRing || kGemm2CodeRing ? Base::kBM * kCodeRowBytes : 0);
  static constexpr int kSmemBytes = kRingBarOffset + (Base::kTmaWeights ? 8 * Base::kStages : 0);
  static constexpr int b_offset(int row, int chunk) {
    return (chunk / 8) * kBTileBytes + row * 128 + 16 * ((chunk % 8) ^ (row & 7));
  }
  static_assert(Base::kKStage == 128, "a stage is two 64-wide K halves");
  static_assert(kWarpGroups == 2 || kWarpGroups == Shape::kRowGroups,
                "two warpgroups (a warp owns two m16 blocks) or one per 64-row group (one m16 block)");
  static_assert(Base::kBOffset % 1024 == 0 && Base::kStageBytes % 1024 == 0 && kBTileBytes % 1024 == 0,
                "every B tile starts on a 1024-byte swizzle atom");
  static_assert(kSmemBytes <= 232448, "fits the sm_90 shared memory of one CTA");
  static_assert(Base::kSfRowBytes == 4 && kCodeOffset % 16 == 0,
                "a stage's codes are one word per row, copied up to 16 bytes at a time");
};

// The shipped sm_90a shapes, by form suffix (forms.py; `_rb`: the same shape with ResidentB, a
// GEMM2 form for K <= 512).
struct Wg128Shape : Sm90Shape {  // wg128
  static constexpr int kBN = 128;
};
struct Wg128x4Shape : Sm90Shape {  // wg128x4, wg128x4_rb
  static constexpr int kBN = 128, kWarpGroups = 4;
  static constexpr bool kTmaWeights = true;
};
struct Wg96x4Shape : Sm90Shape {  // wg96x4, wg96x4_rb
  static constexpr int kBN = 96, kWarpGroups = 4;
  static constexpr bool kTmaWeights = true;
};
struct Wg64x4Shape : Sm90Shape {  // wg64x4, wg64x4_rb
  static constexpr int kBN = 64, kWarpGroups = 4, kStepsPerGroup = 4;
  static constexpr bool kTmaWeights = true;
};
struct Wg32x4Shape : Sm90Shape {  // wg32x4, wg32x4_rb
  static constexpr int kBN = 32, kWarpGroups = 4, kStepsPerGroup = 4;
  static constexpr bool kTmaWeights = true, kNoKTests = true;
};
struct Wg160x3Shape : Sm90Shape {  // wg160x3, wg160x3_rb
  static constexpr int kBN = 160, kWarpGroups = 3, kRowGroups = 3;
  static constexpr bool kNoKTests = true, kNoZeroFill = true;
};
using Sm90PrefillTiling = Sm90Tiling<Wg128Shape>;
using Sm90Prefill4WgTiling = Sm90Tiling<Wg128x4Shape>;
using Sm90Mid4WgTiling = Sm90Tiling<Wg64x4Shape>;
using Sm90Mid32Tiling = Sm90Tiling<Wg32x4Shape>;
using Sm90Prefill4WgResidentBTiling = Sm90Tiling<ResidentB<Wg128x4Shape>>;
using Sm90Mid4WgResidentBTiling = Sm90Tiling<ResidentB<Wg64x4Shape>>;
using Sm90Mid32ResidentBTiling = Sm90Tiling<ResidentB<Wg32x4Shape>>;
using Sm90Prefill160Tiling = Sm90Tiling<Wg160x3Shape>;
using Sm90Prefill160ResidentBTiling = Sm90Tiling<ResidentB<Wg160x3Shape>>;
using Sm90Mid96Tiling = Sm90Tiling<Wg96x4Shape>;
using Sm90Mid96ResidentBTiling = Sm90Tiling<ResidentB<Wg96x4Shape>>;

// The shipped tilings (forms.py instantiates them; the decision table in Python picks one per
// GEMM by expected rows per expert and K). Decode streams each expert's weights once with 8-row token tiles,
// eight warps per CTA: 128 weight rows x 4-way K split; with very few routes (T * k <= 32) a
// launch has only a few hundred CTAs, and 64 rows x 8-way K split keeps more SMs streaming.
// With a short K (GEMM2 of a TP shard) one CTA covers 256 weight rows so each CTA still has a
// few stages to pipeline. Prefill reuses a 256-row weight tile over 64 tokens.
using DecodeTiling = Tiling<8, 2, 4, 2, true>;
using DecodeNarrowTiling = Tiling<8, 1, 8, 2, true>;
using DecodeNarrow4Tiling = Tiling<8, 1, 4, 2, true>;
using DecodeShortKTiling = Tiling<8, 4, 1, 3, true>;
using DecodeShortK2Tiling = Tiling<8, 4, 2, 2, true>;  // (GEMM2) 256 rows, K stages of 256 over two warps
using MidTiling = Tiling<32, 2, 2, 3, true>;
using PrefillTiling = Tiling<64, 4, 1, 3, true>;

}  // namespace cake_moe::mxfp4_moe
