// Host-side tests of the runtime's pure parts: SHA-256 against FIPS 180-4 vectors, and the
// scale layout rules that the device code and the Python references share.
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <vector>
#include <string>

#include "host_test.hpp"

#include "common/fast_divmod.hpp"
#include "formats/args.hpp"
#include "host/grouped_gemm/heuristics_sm90.hpp"
#include "moe/params.hpp"
#include "mxfp4_moe/split_pieces.hpp"
#include "runtime/device_info.hpp"
#include "runtime/sha256.hpp"

using namespace cake_moe;

static void test_sha256() {
  using runtime::sha256_hex;
  EXPECT(sha256_hex("", 0) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT(sha256_hex("abc", 3) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char* two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  // 448 bits
  EXPECT(sha256_hex(two_blocks, std::strlen(two_blocks)) ==
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  std::string million(1000000, 'a');
  EXPECT(sha256_hex(million.data(), million.size()) ==
         "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // lengths around the padding boundary (55, 56, 63, 64 bytes) must differ from each other
  std::set<std::string> seen;
  for (size_t n : {55, 56, 63, 64, 65}) seen.insert(sha256_hex(million.data(), n));
  EXPECT(seen.size() == 5);
}

static void test_swizzle() {
  using formats::swizzled_scale_offset;
  // Spot values from the SPEC formula.
  EXPECT(swizzled_scale_offset(0, 0, 4) == 0);
  EXPECT(swizzled_scale_offset(1, 0, 4) == 16);
  EXPECT(swizzled_scale_offset(32, 0, 4) == 4);
  EXPECT(swizzled_scale_offset(0, 3, 4) == 3);
  EXPECT(swizzled_scale_offset(0, 4, 8) == 512);
  EXPECT(swizzled_scale_offset(128, 0, 8) == 1024);
  EXPECT(swizzled_scale_offset(127, 7, 8) == 512 + 31 * 16 + 3 * 4 + 3);
  // A bijection of the padded [rows_p, cols_p] grid onto [0, rows_p * cols_p).
  for (int64_t rows_p : {128, 256, 384})
    for (int64_t cols_p : {4, 8, 12, 56}) {
      std::set<int64_t> offs;
      for (int64_t r = 0; r < rows_p; ++r)
        for (int64_t c = 0; c < cols_p; ++c) {
          int64_t o = swizzled_scale_offset(r, c, cols_p);
          EXPECT(o >= 0 && o < rows_p * cols_p);
          offs.insert(o);
        }
      EXPECT(int64_t(offs.size()) == rows_p * cols_p);
    }
}

static void test_geometry() {
  using formats::Fmt;
  EXPECT(formats::block_size(Fmt::kMxfp8) == 32 && formats::block_size(Fmt::kMxfp4) == 32);
  EXPECT(formats::block_size(Fmt::kNvfp4) == 16);
  EXPECT(formats::elems_per_byte(Fmt::kMxfp8) == 1 && formats::elems_per_byte(Fmt::kNvfp4) == 2);
  EXPECT(formats::round_up(1, 128) == 128 && formats::round_up(128, 128) == 128 && formats::round_up(0, 4) == 0);
}

static void test_fast_divmod() {
  const uint32_t divisors[] = {1, 2, 3, 7, 12, 56, 224, 896, 1000, 4096, 65535, 65537, 0x7FFFFFFF, 0xFFFFFFFF};
  const uint32_t values[] = {0, 1, 2, 3, 100, 895, 896, 897, 65536, 123456789, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE,
                             0xFFFFFFFF};
  for (uint32_t d : divisors) {
    FastDivmod f(d);
    for (uint32_t n : values) EXPECT(f.div(n) == n / d);
    for (uint64_t n = 0xFFFFFFFFull; n > 0xFFFFFFFFull - 1000; --n) EXPECT(f.div(uint32_t(n)) == uint32_t(n) / d);
    uint32_t x = 12345;
    for (int i = 0; i < 20000; ++i) {  // xorshift sample of the whole range
      x ^= x << 13; x ^= x >> 17; x ^= x << 5;
      uint32_t q = f.div(x);
      EXPECT(q == x / d && f.mod(x, q) == x % d);
    }
  }
  bool refused = false;
  try {
    FastDivmod zero(0);
  } catch (const std::invalid_argument&) {
    refused = true;
  }
  EXPECT(refused);   // (it used to divide by zero on the host)
}

// The sm_90a grouped-GEMM tile choice on rows of the benchmark grid whose fastest tile was
// measured by a clear margin (H200, 132 SMs; dgrad: the 2026-12-01 sweep with 128x192,
// bench/results/2026-12-01_h200_grouped_gemm_sweep_128x192.json, and the same-call A/B of the
// default path, ..._grouped_gemm_128x192_ab.md; fwd: the earlier sweep, ..._grouped_gemm.json).
static void test_grouped_gemm_tiles() {
  using grouped_gemm::choose_sm90_tile;
  using grouped_gemm::Sm90Tile;
  const int sms = 132;
  struct Row { int64_t rows; int32_t groups, n_out; bool dgrad; int bn; };
  const Row rows[] = {
      {4096, 8, 1536, true, 256},     // dgrad (2048,1536,8) w2: 51.7 vs 54.2 (128) / 56.5 (192) us
      {4096, 8, 2048, true, 192},     // dgrad (2048,1536,8) w13: 83.8 vs 97.7 (128) us; A/B x1.409 vs x1.251
      {4096, 9, 2048, true, 128},     // dgrad (4096,2048,9) w2: 128.0 vs 145.3 (192) us
      {4096, 16, 2048, true, 128},    // dgrad (2048,768,16) w13: 54.0 vs 58.4 (192) us
      {4096, 8, 7168, true, 256},     // dgrad (7168,2048,8) w13: x1.169 vs x1.153 (192) in the A/B
      {16384, 16, 2048, true, 256},   // dgrad (2048,768,16) w13: x1.089 vs x1.078 (192) in the A/B
      {65536, 8, 2048, true, 256},    // dgrad (7168,2048,8) w2: x1.068 vs x1.022 (192) in the A/B
      {4096, 8, 3072, false, 128},    // fwd (2048,1536,8) w13: 96.6 vs 107.6 us
      {4096, 8, 2048, false, 192},    // fwd (2048,1536,8) w2: x1.436 vs x1.312 (128) in the A/B
      {4096, 8, 7168, false, 128},    // fwd (7168,2048,8) w2: x1.245 vs x1.183 (192) in the A/B
      {65536, 8, 4096, false, 256},   // fwd (7168,2048,8) w13: 5914 vs 6287 us
  };
  for (const Row& r : rows) EXPECT(choose_sm90_tile(r.rows, r.groups, r.n_out, r.dgrad, sms).bn == r.bn);
  EXPECT(choose_sm90_tile(2048, 64, 4096, true, sms).bm == 64);  // 32 rows per group
  EXPECT(choose_sm90_tile(2048, 64, 4096, false, sms).bm == 64);
  // 64 rows per group: 128-row tiles (2026-12-04 small-T sweeps, five runs each: fwd (2048, 768, 16)
  // w13 T = 1024 128x192 ahead of 64x128 by 20-23%, dgrad (7168, 2048, 8) w13 T = 512 128x256 by 23-29%)
  EXPECT(choose_sm90_tile(1024, 16, 1536, false, sms).bn == 192);
  const Sm90Tile dgrad_64_rows = choose_sm90_tile(512, 8, 7168, true, sms);
  EXPECT(dgrad_64_rows.bm == 128 && dgrad_64_rows.bn == 256);
  // Under 300 rows per group 128x192 at a cost of 0.87 of 128x128 (2026-12-04 A/B, draws 4 and 5):
  // fwd (4096, 2048, 9) w2 T = 768 and dgrad (2048, 768, 16) w13 T = 2048 take 128x192; with 300 or
  // more rows per group the 0.85 margin keeps 128x128 at the same cost ratio.
  EXPECT(choose_sm90_tile(768, 9, 4096, false, sms).bn == 192);
  EXPECT(choose_sm90_tile(2048, 16, 2048, true, sms).bn == 192);
  EXPECT(choose_sm90_tile(3168, 8, 1536, false, sms).bn == 128);  // 396 rows per group, 0.87
  // Under 48 rows per group: 128x192 where it needs one wave and 64x128 two (2026-12-04 A/B, draws
  // 4-6: dgrad (4096, 2048, 9) w2 T = 384 x1.07-1.32, fwd (2048, 768, 16) w13 T = 256 x1.03);
  // 64x128 where 128x192 saves only one wave of three (fwd (4096, 2048, 9) w2 T = 256).
  EXPECT(choose_sm90_tile(384, 9, 2048, true, sms).bn == 192);
  EXPECT(choose_sm90_tile(256, 16, 1536, false, sms).bn == 192);
  EXPECT(choose_sm90_tile(256, 9, 4096, false, sms).bm == 64);
}

// Where DRAM bandwidth per SM is narrow (an H100 SXM, 3.35 TB/s on 132 SMs; not an H200, 4.8 TB/s)
// the wider tiles win more rows: three sweeps of the grid on an H100 (2026-12-05,
// bench/results/2026-12-05_h100_grouped_gemm_tiles.md), time against 128x128 in each.
static void test_grouped_gemm_tiles_narrow_memory() {
  using grouped_gemm::choose_sm90_tile;
  const int sms = 132;
  const auto narrow = [](double bytes_per_s, int sm_count) {
    return runtime::DeviceInfo{"90a", sm_count, bytes_per_s}.narrow_memory();
  };
  EXPECT(narrow(3.35e12, sms) && !narrow(4.81e12, sms));
  EXPECT(!narrow(0, sms) && !narrow(3.35e12, 0));  // unknown: the H200's rule
  struct Row { int64_t rows; int32_t groups, n_out; bool dgrad; int wide_bn, narrow_bn; };
  const Row rows[] = {
      {16384, 9, 4096, false, 128, 256},  // fwd (4096,2048,9) w2: 128x256 0.925 / 0.912 / 0.944
      {16384, 16, 1536, false, 128, 256}, // fwd (2048,768,16) w13: 0.972 / 0.983 / 0.902
      {4096, 8, 4096, false, 128, 192},   // fwd (7168,2048,8) w13: 128x192 0.870 / 0.871 / 0.868
      {4096, 9, 4096, true, 128, 256},    // dgrad (4096,2048,9) w13: 128x256 0.968 / 0.958 / 0.964
      {65536, 8, 4096, false, 256, 256},  // large groups: 128x256 either way
      {4096, 8, 3072, false, 128, 128},   // fwd (2048,1536,8) w13: 128x128 within 1.5% of the others
      // a fwd of 30 or more 128x128 waves chooses by the wave cost (kSm90ManyWaves; layers of 32-128
      // experts, 2026-12-06 sweep): 128x256 ran x1.127 / x1.104 the speed of 128x192, x1.19 / x1.34 of 128x128
      {16384, 32, 4096, false, 128, 256}, // fwd (7168,2048,32) w13 T = 16384: 35 waves of 128x128
      {65536, 128, 3072, false, 128, 256},// fwd (4096,1536,128) w13 T = 65536: 105 waves
  };
  for (const Row& r : rows) {
    EXPECT(choose_sm90_tile(r.rows, r.groups, r.n_out, r.dgrad, sms, false).bn == r.wide_bn);
    EXPECT(choose_sm90_tile(r.rows, r.groups, r.n_out, r.dgrad, sms, true).bn == r.narrow_bn);
  }
  // under 30 waves the fwd keeps 128x192 (fwd (7168,2048,8) w13 T = 4096 above: 9 waves of 128x128)
  EXPECT(grouped_gemm::sm90_tile_cost(4096, 8, 4096, 128, 128, sms) < grouped_gemm::kSm90ManyWaves);
  // under 48 rows per group the choice does not depend on the memory
  for (const int32_t groups : {32, 64, 128})
    EXPECT(choose_sm90_tile(1024, groups, 4096, false, sms, true).bn ==
           choose_sm90_tile(1024, groups, 4096, false, sms, false).bn);
}

// Family B's GEMM1 pieces under K halves (mxfp4_moe/params.hpp, piece_of): over random unit
// counts and split settings, the pieces cover each unit's K stages exactly once, as the whole
// unit or as its two halves handed out one after the other (one parking slot each, the slots
// distinct and inside the workspace's kMaxSplitUnits), in unit order.
struct SplitSettings {   // GemmParams' split fields (mxfp4_moe/params.hpp needs the CUDA headers)
  float* split_park;
  int32_t split_from, split_max, split_all_max;
};

static void test_split_pieces() {
  using GemmParams = SplitSettings;
  using mxfp4_moe::Piece;
  float park = 0.0f;
  for (int draw = 0; draw < 20000; ++draw) {
    GemmParams p{};
    p.split_park = host_test::uniform(0, 9) ? &park : nullptr;
    p.split_from = int32_t(host_test::uniform(0, 300));
    p.split_max = int32_t(host_test::uniform(0, moe::kMaxSplitUnits));
    p.split_all_max = int32_t(host_test::uniform(0, moe::kMaxSplitUnits));
    const int units = int(host_test::uniform(0, 400)), num_k = int(host_test::uniform(2, 64));
    const int split = mxfp4_moe::split_units(p, units), pieces = mxfp4_moe::num_pieces(p, units);
    // The rule as documented (params.hpp's split fields), written out here: with a parking
    // area, all units where they are at most split_all_max, else those from split_from on
    // where they are at most split_max.
    const bool all_split = units <= p.split_all_max;
    const int first = all_split ? 0 : p.split_from;
    const int want = p.split_park == nullptr || units <= 0  ? 0
                     : all_split                             ? units
                     : units - p.split_from > p.split_max || units <= p.split_from ? 0
                                                             : units - p.split_from;
    EXPECT(split == want && pieces == units + split && split <= moe::kMaxSplitUnits);
    std::map<int, std::vector<Piece>> of_unit;
    std::set<int> slots;
    int last_unit = -1;
    for (int q = 0; q < pieces; ++q) {
      const Piece pc = mxfp4_moe::piece_of(p, q, units, num_k);
      EXPECT(pc.unit >= 0 && pc.unit < units && pc.unit >= last_unit);
      last_unit = pc.unit;
      of_unit[pc.unit].push_back(pc);
      if (pc.half >= 0) slots.insert(pc.slot);
    }
    EXPECT(int(of_unit.size()) == units && int(slots.size()) == split);
    for (const int slot : slots) EXPECT(slot >= 0 && slot < split);
    for (const auto& [unit, got] : of_unit) {
      if (got.size() == 1) {
        EXPECT(got[0].half == -1 && got[0].k_first == 0 && got[0].k_stages == num_k && got[0].slot == -1);
        EXPECT(unit < first || unit >= first + split);
      } else {
        EXPECT(unit >= first && unit < first + split);
        EXPECT(got.size() == 2 && got[0].half == 0 && got[1].half == 1 && got[0].slot == got[1].slot);
        EXPECT(got[0].k_first == 0 && got[0].k_stages > 0 && got[1].k_first == got[0].k_stages &&
               got[1].k_stages > 0 && got[0].k_stages + got[1].k_stages == num_k);
      }
    }
  }
  GemmParams none{};   // no parking area: nothing splits
  none.split_all_max = moe::kMaxSplitUnits;
  EXPECT(mxfp4_moe::num_pieces(none, 40) == 40 && mxfp4_moe::piece_of(none, 7, 40, 8).half == -1);
  GemmParams all{};    // a short first wave: every unit from unit 0
  all.split_park = &park;
  all.split_all_max = 132;
  all.split_from = 132;
  const Piece second = mxfp4_moe::piece_of(all, 1, 16, 7);
  EXPECT(mxfp4_moe::num_pieces(all, 16) == 32 && second.unit == 0 && second.half == 1 && second.k_first == 4 &&
         second.k_stages == 3);
}

int main(int argc, char** argv) {
  std::string which = argc > 1 ? argv[1] : "all";
  if (host_test::selected(which, "sha256")) test_sha256();
  if (host_test::selected(which, "swizzle")) test_swizzle();
  if (host_test::selected(which, "geometry")) test_geometry();
  if (host_test::selected(which, "fastdiv")) test_fast_divmod();
  if (host_test::selected(which, "gg_tiles")) test_grouped_gemm_tiles();
  if (host_test::selected(which, "gg_tiles_narrow")) test_grouped_gemm_tiles_narrow_memory();
  if (host_test::selected(which, "split_pieces")) test_split_pieces();
  return host_test::report(which);
}
