// The grouped GEMM's device-side ragged schedulers, run from their own headers on the host (one
// CTA emulated by cta_emulator.hpp) against an enumeration written out here: the block scan,
// the fwd / dgrad tile scheduler (every tile once, in group / band / m / n order, saturation at
// the tile cap) and the wgrad unit scheduler (every tile's chunks partition its group's rows,
// split tiles own distinct workspace slots within the bound, the documented unit bound).
// Random problems include malformed offsets, E past the shared table, and both conventions.
#include "cta_emulator.hpp"  // first: the device headers below read its CUDA spellings

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/block_scan.cuh"
#include "grouped_gemm/scheduler.cuh"
#include "grouped_gemm/wgrad_scheduler.cuh"

#include "host_test.hpp"

using cake_moe::emu::Cta;

using cake_moe::host_test::uniform;

namespace {

// A ragged problem: offsets in either convention, the capacity the groups are clamped to.
struct Ragged {
  std::vector<int32_t> offs;
  int32_t groups = 0, capacity = 0, leading_zero = 0;

  // Rows [begin, end) of group e as docs/grouped_gemm.md states the clamping of malformed
  // offsets: both bounds clamped into [0, capacity], a decreasing entry an empty group.
  std::pair<int64_t, int64_t> rows(int32_t e) const {
    const int64_t b = leading_zero ? offs[e] : (e == 0 ? 0 : offs[e - 1]);
    const int64_t en = leading_zero ? offs[e + 1] : offs[e];
    const int64_t begin = std::clamp<int64_t>(b, 0, capacity);
    return {begin, std::clamp<int64_t>(en, begin, capacity)};
  }
};

Ragged from_sizes(const std::vector<int64_t>& sizes, int32_t pad, bool leading_zero) {
  Ragged r;
  r.groups = int32_t(sizes.size());
  r.leading_zero = leading_zero;
  int64_t end = 0;
  if (leading_zero) r.offs.push_back(0);
  for (int64_t s : sizes) r.offs.push_back(int32_t(end += s));
  r.capacity = int32_t(end + pad);
  return r;
}

// Group sizes drawn the ways the GPU tests draw them (and the ways a caller gets them wrong).
Ragged random_ragged(int32_t max_groups, int64_t max_rows) {
  const int kind = int(uniform(0, 9));
  const int32_t e = kind == 9 ? int32_t(uniform(1025, 3000)) : int32_t(uniform(0, max_groups));
  std::vector<int64_t> sizes(e);
  for (int64_t& s : sizes) {
    switch (kind % 4) {
      case 0: s = uniform(0, max_rows); break;                       // imbalanced
      case 1: s = uniform(0, 3) == 0 ? 0 : uniform(1, 3); break;     // empty and one-row groups
      case 2: s = uniform(0, 1) * uniform(100, 300); break;          // half empty
      default: s = uniform(120, 136); break;                         // around a tile's rows
    }
  }
  if (kind == 4 && e > 0) sizes[size_t(uniform(0, e - 1))] = max_rows * 8;  // one hot expert
  Ragged r = from_sizes(sizes, int32_t(uniform(0, 40)), uniform(0, 1) == 1);
  if (kind == 5 && r.capacity > 0) r.capacity = int32_t(uniform(0, r.capacity));  // groups past the rows
  if (kind == 6) {  // malformed: entries out of order, negative, past the capacity
    for (int32_t& o : r.offs)
      if (uniform(0, 3) == 0) o = int32_t(uniform(-50, int64_t(r.capacity) + 50));
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// block_inclusive_scan
// ---------------------------------------------------------------------------------------------

template <uint32_t kCap>
void check_scan(int threads, int32_t n, uint32_t max_value) {
  constexpr uint32_t kUntouched = 0xDEADBEEFu;  // entries past n must stay as they are
  std::vector<uint32_t> table(1024 + 32, kUntouched), chunk_total(32);
  std::vector<uint32_t> want(table);
  uint64_t sum = 0;
  for (int32_t i = 0; i < n; ++i) {
    table[i] = uint32_t(uniform(0, max_value));
    sum += table[i];
    want[i] = kCap ? uint32_t(std::min<uint64_t>(sum, kCap)) : uint32_t(sum);
  }
  Cta::run(threads, [&] { cake_moe::block_inclusive_scan<uint32_t, kCap>(table.data(), n, chunk_total.data()); });
  EXPECT(table == want);
}

void test_block_scan() {
  for (int round = 0; round < 60; ++round) {
    const int threads = 32 * int(uniform(1, 12));
    const int32_t n = round < 4 ? int32_t(round) : int32_t(uniform(0, 1024));
    check_scan<0u>(threads, n, 1u << 20);
    check_scan<(1u << 31) - (1u << 20)>(threads, n, round % 2 ? (1u << 31) - (1u << 20) : 1u << 22);  // saturating
  }
  std::vector<int32_t> prefix = {0, 0, 3, 3, 7};  // first_slot_above skips empty slots
  EXPECT(cake_moe::first_slot_above(prefix.data(), 5, 0) == 2 && cake_moe::first_slot_above(prefix.data(), 5, 3) == 4);
}

// ---------------------------------------------------------------------------------------------
// fwd / dgrad: RaggedTileScheduler
// ---------------------------------------------------------------------------------------------

using Tile = std::tuple<int32_t, int32_t, int32_t, int32_t>;  // group, row_end, m0, n0

template <int kBM, int kBN, int kRasterN>
std::vector<Tile> expected_tiles(const Ragged& r, int32_t n_out) {
  std::vector<Tile> tiles;
  const int32_t n_tiles = (n_out + kBN - 1) / kBN;
  const int32_t band = kRasterN == 0 ? n_tiles : kRasterN;
  for (int32_t e = 0; e < r.groups; ++e) {
    const auto [b, en] = r.rows(e);
    const int64_t m_tiles = (en - b + kBM - 1) / kBM;
    for (int32_t first = 0; first < n_tiles; first += band)   // bands of n-tiles, m-tile by m-tile
      for (int64_t m = 0; m < m_tiles; ++m)
        for (int32_t n = first; n < std::min(first + band, n_tiles); ++n)
          tiles.emplace_back(e, int32_t(en), int32_t(b + m * kBM), n * kBN);
  }
  return tiles;
}

template <int kBM, int kBN, int kRasterN, int kTable>
cake_moe::RaggedTileScheduler<kBM, kBN, kRasterN, kTable> init_tiles(const Ragged& r, int32_t n_out, int threads,
                                                                    std::vector<int32_t>& smem) {
  using Sched = cake_moe::RaggedTileScheduler<kBM, kBN, kRasterN, kTable>;
  smem.assign(kTable + 32, -1);
  Sched s{};
  Cta::run(threads, [&] {
    Sched mine;  // each thread's own, as in the kernels
    mine.init(smem.data(), r.offs.data(), r.groups, r.capacity, r.leading_zero, n_out);
    if (threadIdx.x == 0) s = mine;
  });
  return s;
}

template <int kBM, int kBN, int kRasterN, int kTable>
void check_tiles(const Ragged& r, int32_t n_out, int threads) {
  std::vector<int32_t> smem;
  const auto s = init_tiles<kBM, kBN, kRasterN, kTable>(r, n_out, threads, smem);
  const std::vector<Tile> want = expected_tiles<kBM, kBN, kRasterN>(r, n_out);
  EXPECT(s.total_tiles == int32_t(want.size()));
  if (s.total_tiles != int32_t(want.size())) {
    std::printf("  E=%d cap=%d n_out=%d lz=%d: %d tiles, want %zu\n", r.groups, r.capacity, n_out, r.leading_zero,
                s.total_tiles, want.size());
    return;
  }
  int mismatches = 0;
  for (int32_t i = 0; i < s.total_tiles; ++i) {
    const cake_moe::GroupTile t = s.tile(i);
    mismatches += Tile(t.group, t.row_end, t.m0, t.n0) != want[size_t(i)];
  }
  EXPECT(mismatches == 0);
}

template <int kBM, int kBN, int kRasterN, int kTable>
void check_tile_shape(int rounds) {
  for (int round = 0; round < rounds; ++round) {
    const Ragged r = random_ragged(40, 700);
    const int32_t n_out = 8 * int32_t(uniform(1, 160));
    check_tiles<kBM, kBN, kRasterN, kTable>(r, n_out, 32 * int(uniform(1, 12)));
  }
  for (const std::vector<int64_t>& sizes : std::vector<std::vector<int64_t>>{
           {300, 0, 1, 700}, {1, 257, 511, 4099, 0, 33}, {1, 2, 3, 0, 4}, {6145, 0, 12289}, {0, 0, 0}, {}}) {
    check_tiles<kBM, kBN, kRasterN, kTable>(from_sizes(sizes, 16, false), 1536, 384);
    check_tiles<kBM, kBN, kRasterN, kTable>(from_sizes(sizes, 0, true), 2056, 256);
  }
}

// Groups whose tiles add up past the cap (malformed: each spans every row) run no tile; just
// below it, the count is exact and the last tiles decode.
void test_tile_cap() {
  constexpr int32_t kCapacity = 1 << 30;
  using Sched = cake_moe::RaggedTileScheduler<128, 128, 8, 1024>;
  Ragged r;
  r.capacity = kCapacity;
  r.groups = 8;
  r.offs = {kCapacity, 0, kCapacity, 0, kCapacity, 0, kCapacity, 0};  // groups 0, 2, 4, 6 span every row
  std::vector<int32_t> smem;
  const int32_t n_out = 8192;                            // 2^23 x 64 = 2^29 tiles per full group
  EXPECT((init_tiles<128, 128, 8, 1024>(r, n_out, 64, smem).total_tiles == 0));  // 2^31 tiles
  r.groups = 6;  // 3 x 2^29, below the cap
  EXPECT((init_tiles<128, 128, 8, 1024>(r, n_out, 64, smem).total_tiles == 3 << 29));
  r.groups = 3;  // two full groups: 2^30 tiles
  const Sched s = init_tiles<128, 128, 8, 1024>(r, n_out, 64, smem);
  EXPECT(s.total_tiles == (1 << 30));
  const cake_moe::GroupTile last = s.tile((1 << 30) - 1), first_of_2 = s.tile(1 << 29);
  EXPECT(last.group == 2 && last.m0 == kCapacity - 128 && last.n0 == n_out - 128);
  EXPECT(first_of_2.group == 2 && first_of_2.m0 == 0 && first_of_2.n0 == 0);
  EXPECT(Sched::kTileCap == (1u << 31) - (1u << 20));
  // One table slot's groups past the cap on their own (32768 groups: 32 per slot): the slot's
  // count saturates too. Groups 0, 2, .., 30 span every row: 2^33 tiles, which a 32-bit count
  // would wrap to 0, leaving the 64 tiles of group 32 (slot 1) to run.
  r.groups = 32768;
  r.offs.assign(size_t(r.groups), 128);
  for (int e = 0; e < 32; ++e) r.offs[size_t(e)] = e % 2 ? 0 : kCapacity;
  EXPECT((init_tiles<128, 128, 8, 1024>(r, n_out, 64, smem).total_tiles == 0));
  r.offs[0] = 0;  // 15 full groups and group 32: as many tiles as 64 + 15 x 2^29, past the cap
  EXPECT((init_tiles<128, 128, 8, 1024>(r, n_out, 64, smem).total_tiles == 0));
}

// ---------------------------------------------------------------------------------------------
// wgrad: WgradScheduler
// ---------------------------------------------------------------------------------------------

// Returns the split tiles.
template <int kBM, int kBN, int kSplitQ, int kMinChunkKB, int kTable>
int check_wgrad(const Ragged& r, int32_t n, int32_t k, int32_t workers, int32_t slots, int threads) {
  using Sched = cake_moe::sm90::WgradScheduler<kBM, kBN, kSplitQ, kMinChunkKB, kTable>;
  struct {  // the fields of GroupedGemmWgradParams the scheduler reads
    const int32_t* offs;
    int32_t num_groups, sum_m_capacity, offs_has_leading_zero, n, k;
  } p{r.offs.data(), r.groups, r.capacity, r.leading_zero, n, k};
  std::vector<uint64_t> smem(Sched::kSmemBytes / 8, ~0ull);
  Sched s{};
  Cta::run(threads, [&] {
    Sched mine;
    mine.init(smem.data(), p, workers, slots);
    if (threadIdx.x == 0) s = mine;
  });
  const int32_t tiles_n = (n + kBM - 1) / kBM, tiles_k = (k + kBN - 1) / kBN, tiles_nk = tiles_n * tiles_k;
  // The chunk length wgrad_scheduler.cuh states: at most kb_chunk_max k-blocks, about kSplitQ units
  // per worker or more and no more split tiles than slots; no split without slots.
  int64_t rows = 0;
  for (int32_t e = 0; e < r.groups; ++e) rows += r.rows(e).second - r.rows(e).first;
  int64_t chunk_max = 0x7fffffff;
  if (slots > 0 && tiles_nk > 0) {
    const int64_t work = int64_t(tiles_nk) * rows, per_worker = int64_t(std::max(workers, 1)) * kSplitQ * 64;
    chunk_max = std::max<int64_t>({kMinChunkKB, (work + per_worker - 1) / per_worker, (work + slots * 64 - 1) / (slots * 64)});
    chunk_max = std::min<int64_t>(chunk_max, 0x7fffffff);
  }
  EXPECT(s.kb_chunk_max == chunk_max);
  // The unit bound the host checks against 2^31 (wgrad_params.cuh): E tiles + 8 per worker + slots.
  EXPECT(int64_t(s.total_units) <= int64_t(r.groups) * tiles_nk + int64_t(kSplitQ) * workers + std::max(slots, 0));

  // Decode every unit; group its chunks by (group, tile), and keep each (group, chunk)'s tiles
  // in unit order.
  std::vector<std::vector<cake_moe::sm90::WgradUnit>> per_tile(size_t(r.groups) * tiles_nk);
  std::vector<std::vector<std::vector<cake_moe::sm90::WgradUnit>>> per_chunk(size_t(r.groups));
  std::set<int32_t> slots_used;
  int bad_order = 0, bad_unit = 0, split_tiles = 0;
  cake_moe::sm90::WgradUnit prev{};
  for (int32_t u = 0; u < s.total_units; ++u) {
    const cake_moe::sm90::WgradUnit w = s.decode(u);
    if (w.e < 0 || w.e >= r.groups || w.n0 % kBM || w.k0 % kBN || w.n0 >= tiles_n * kBM || w.k0 >= tiles_k * kBN ||
        w.chunk < 0 || w.chunk >= w.num_chunks) {
      ++bad_unit;
      continue;
    }
    if (u > 0 && std::make_pair(w.e, w.chunk) < std::make_pair(prev.e, prev.chunk)) ++bad_order;  // group-major, then chunk
    prev = w;
    per_tile[size_t(w.e) * tiles_nk + (w.n0 / kBM) * tiles_k + w.k0 / kBN].push_back(w);
    auto& chunks = per_chunk[size_t(w.e)];
    if (chunks.size() <= size_t(w.chunk)) chunks.resize(size_t(w.chunk) + 1);
    chunks[size_t(w.chunk)].push_back(w);
  }
  // Inside a chunk: n-major tiles, or, where the group's chunks hold kBandMinKB k-blocks or more,
  // bands of kBandN tile rows, K-major inside a band.
  for (const auto& chunks : per_chunk) {
    if (chunks.empty() || chunks[0].empty()) continue;
    const int32_t band = chunks[0][0].kb >= Sched::kBandMinKB ? Sched::kBandN : 1;
    for (const auto& tiles : chunks)
      for (size_t i = 1; i < tiles.size(); ++i) {
        auto key = [&](const cake_moe::sm90::WgradUnit& w) {
          const int32_t n_idx = w.n0 / kBM;
          return std::make_tuple(n_idx / band, w.k0 / kBN, n_idx % band);
        };
        bad_order += !(key(tiles[i - 1]) < key(tiles[i]));
      }
  }
  EXPECT(bad_unit == 0 && bad_order == 0);

  int bad_chunks = 0;
  for (int32_t e = 0; e < r.groups; ++e) {
    const auto [b, en] = r.rows(e);
    const int64_t kb_total = (en - b + 63) / 64;
    for (int32_t t = 0; t < tiles_nk; ++t) {
      std::vector<cake_moe::sm90::WgradUnit>& chunks = per_tile[size_t(e) * tiles_nk + t];
      std::sort(chunks.begin(), chunks.end(), [](auto& x, auto& y) { return x.chunk < y.chunk; });
      const int32_t count = int32_t(chunks.size());
      if (count == 0 || chunks[0].num_chunks != count) {
        ++bad_chunks;
        continue;
      }
      // the chunks cover [b, en) in order, whole 64-row k-blocks but the last one's tail
      int64_t row = b;
      for (int32_t c = 0; c < count; ++c) {
        const cake_moe::sm90::WgradUnit& w = chunks[size_t(c)];
        const bool last = c == count - 1;
        const int64_t rows = w.kb == 0 ? 0 : int64_t(w.kb - 1) * 64 + w.tail;
        bad_chunks += w.chunk != c || w.num_chunks != count || w.row0 != row || w.tail < 1 || w.tail > 64 ||
                      (!last && w.tail != 64) || w.kb > s.kb_chunk_max || (w.kb == 0) != (kb_total == 0) ||
                      w.slot != chunks[0].slot || (count > 1) != (w.slot >= 0) || (!last && w.kb != chunks[0].kb);
        row += rows;
      }
      bad_chunks += row != en;
      if (count > 1) {
        ++split_tiles;
        slots_used.insert(chunks[0].slot);
        bad_chunks += chunks[0].slot >= slots;
      }
    }
  }
  EXPECT(bad_chunks == 0);
  EXPECT(int(slots_used.size()) == split_tiles);  // no two split tiles share a workspace slot
  if (slots <= 0) EXPECT(split_tiles == 0);
  if (bad_unit || bad_order || bad_chunks)
    std::printf("  E=%d cap=%d N=%d K=%d lz=%d workers=%d slots=%d: %d bad units, %d out of order, %d bad chunks\n",
                r.groups, r.capacity, n, k, r.leading_zero, workers, slots, bad_unit, bad_order, bad_chunks);
  return split_tiles;
}

template <int kBM, int kBN, int kTable>
void check_wgrad_shape(int rounds) {
  for (int round = 0; round < rounds; ++round) {
    // rows up to ~5e5 per group so that some groups split into chunks (>= 32 k-blocks)
    const Ragged r = random_ragged(24, round % 3 == 0 ? 200000 : 3000);
    const int64_t widest = round % 2 ? 32 : 512;  // one output tile (many chunks) or many
    const int32_t n = 8 * int32_t(uniform(1, widest)), k = 8 * int32_t(uniform(1, widest));
    const int32_t workers = int32_t(uniform(1, 132));
    const int32_t slots = round % 5 == 0 ? 0 : int32_t(uniform(1, 4 * 132));
    check_wgrad<kBM, kBN, 8, 32, kTable>(r, n, k, workers, slots, 32 * int(uniform(1, 12)));
  }
  // Many groups just past the chunk length (two chunks each), with slots to spare or too few: the
  // split tiles' slots stay distinct and within the workspace; with 300 groups the 128-entry table
  // walks several groups per slot.
  const std::vector<int64_t> sizes(300, 64 * 33 + 1);
  EXPECT((check_wgrad<kBM, kBN, 8, 32, kTable>(from_sizes(sizes, 0, false), 128, 256, 132, 528, 256) == 300));
  check_wgrad<kBM, kBN, 8, 32, kTable>(from_sizes(sizes, 0, true), 128, 256, 132, 7, 256);
  check_wgrad<kBM, kBN, 8, 32, kTable>(from_sizes(sizes, 0, false), 4096, 4096, 132, 7, 384);
  check_wgrad<kBM, kBN, 8, 32, kTable>(from_sizes({1 << 20}, 64, true), 256, 256, 132, 528, 384);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "all";
  if (cake_moe::host_test::selected(which, "block_scan")) test_block_scan();
  if (cake_moe::host_test::selected(which, "tile_scheduler")) {
    check_tile_shape<128, 128, 8, 1024>(150);   // gg_sm90_{fwd,dgrad}_128x128
    check_tile_shape<128, 256, 8, 1024>(100);   // _128x256
    check_tile_shape<128, 192, 8, 1024>(100);   // _128x192
    check_tile_shape<64, 128, 8, 1024>(100);    // _64x128
    check_tile_shape<128, 128, 0, 1024>(100);   // the portable forms (no bands)
    check_tile_shape<128, 128, 8, 64>(100);     // a small table: groups share slots sooner
    test_tile_cap();
  }
  if (cake_moe::host_test::selected(which, "wgrad_scheduler")) {
    check_wgrad_shape<128, 256, 1024>(120);     // gg_sm90_wgrad_{det,fast}, bf16 and f32
    check_wgrad_shape<256, 256, 1024>(60);      // the CTA-pair forms (a unit is 256 rows of N)
    check_wgrad_shape<128, 256, 128>(80);       // the bf16 forms' 128-entry table
  }
  return cake_moe::host_test::report(which);
}
