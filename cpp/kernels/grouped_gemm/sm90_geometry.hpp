// Geometry of one sm_90a grouped-GEMM form (fwd/dgrad), shared by the kernel template and its
// host launcher: shared-memory bytes, threads and TMA boxes follow from (BM, BN, stages). Each
// generated translation unit static_asserts that the kernel agrees with this (forms.py).
#pragma once
#include <cstdint>

#include "common/host_device.hpp"
#include "grouped_gemm/unit_slots_layout.hpp"

namespace cake_moe::sm90 {

struct GroupedGemmGeometry {
  int bm;
  int bn;
  int stages;
  bool split_tail = false;  // a short last wave as N halves (the fwd's half tiles: box_b_half_rows)
  int table = 1024;  // scheduler smem slots

  static constexpr int kBK = 64;  // one 128-byte swizzle row of bf16
  static constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups

  CAKE_HD constexpr int wg_tile_n() const { return bn / (2 / (bm / 64)); }
  CAKE_HD constexpr uint32_t smem_bytes() const {
    return uint32_t(stages) * uint32_t(bm + bn) * kBK * 2   // A and B stages
           + 2u * 64u * uint32_t(wg_tile_n()) * 2u          // two epilogue staging tiles
           + 2u * uint32_t(stages) * 8u                     // full/empty mbarriers
           + unit_slots_smem_bytes(unit_slot_count(stages), 16u)  // decoded tiles (GroupTile)
           + uint32_t(table + 32) * 4u                      // scheduler prefix table
           + 1024u;                                         // run-time 1024-B alignment of the base
  }
  CAKE_HD constexpr int box_a_rows() const { return bm; }
  CAKE_HD constexpr int box_b_rows(bool dgrad) const { return dgrad ? kBK : bn; }
  CAKE_HD constexpr int box_b_half_rows() const { return bn / 2; }
};

}  // namespace cake_moe::sm90

namespace cake_moe::sm90 {

// The sm_90a weight-gradient forms: 128 x 256 output tiles of 64 token rows per stage, 4 stages.
// The bf16 kernels stage each warpgroup's output for TMA stores in two rounds of 16 KB (their
// scheduler table holds 128 groups to make room: 232448 bytes, the sm_90 maximum); the f32
// kernels use a 2 KB row-staging tile per consumer warp.
struct GroupedGemmWgradGeometry {
  static constexpr int kBM = 128;
  static constexpr int kBN = 256;
  static constexpr int kThreads = 384;
  static constexpr int kStages = 4;
  static constexpr int kTableBf16 = 128;  // scheduler table entries (groups beyond them share slots)
  static constexpr int kTableF32 = 1024;
  // checked against the template in each form's TU
  static constexpr uint32_t kSmemBytesBf16 = 232448;
  static constexpr uint32_t kSmemBytesF32 = 223232;
  CAKE_HD static constexpr uint32_t smem_bytes(bool out_f32) { return out_f32 ? kSmemBytesF32 : kSmemBytesBf16; }
};

}  // namespace cake_moe::sm90
