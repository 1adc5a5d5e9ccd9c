// The shared MoE engine's routing kernels (moe_route.cuh), run from their own header on emulated
// CTAs (cta_emulator.hpp: each launch's CTAs one after the other) against the routing SPEC §5
// and RouteParams describe, written out here: per-expert offsets, every local route on a row of
// its expert (the few-route path in route order), each row's token, -1 for remote and
// out-of-range ids, the token-tile lists (one form, the cheaper of two, or the width per
// expert), their header words, and the GEMMs' lookahead naming the same experts. All three
// paths: one warp (<= 32 routes), one CTA, and count / scan / place over several CTAs.
#include "cta_emulator.hpp"  // first: the device header below reads its CUDA spellings

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "moe/moe_route.cuh"

#include "host_test.hpp"

using cake_moe::emu::Cta;
using namespace cake_moe::moe;

using cake_moe::host_test::failures;
using cake_moe::host_test::uniform;

namespace {

constexpr int32_t kPoison = 0x5A5A5A5A;  // every output starts as this: a slot left alone shows

struct Routing {
  std::vector<int32_t> ids;  // [T * k] global ids, or packed routes
  int32_t top_k = 1, experts = 1, local = 1, offset = 0;
  bool packed = false;
  int32_t block_n = 8, alt_block_n = 0, block_cost = 100, alt_block_cost = 100;
  bool split = false;         // route_scan_split (needs the several-CTA path)
  int32_t chunk_routes = -1;  // -1: route_chunk_routes(R), as the plans choose
  int32_t routes() const { return int32_t(ids.size()); }
};

// A buffer the kernels write, poisoned, with poisoned guard elements either side: a write
// outside it shows as a guard that changed (instead of a corrupted heap).
template <typename T>
class Guarded {
 public:
  Guarded(size_t n, T poison) : all_(n + 2 * kGuard, poison), n_(n), poison_(poison) {}
  T* data() { return all_.data() + kGuard; }
  const T& operator[](size_t i) const { return all_[kGuard + i]; }
  std::vector<T> inner() const { return {all_.begin() + kGuard, all_.begin() + kGuard + long(n_)}; }
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (std::memcmp(&all_[i], &poison_, sizeof(T)) || std::memcmp(&all_[kGuard + n_ + i], &poison_, sizeof(T)))
        return false;
    return true;
  }

 private:
  static constexpr size_t kGuard = 64;
  std::vector<T> all_;
  size_t n_;
  T poison_;
};

struct Routed {
  Routed(int32_t routes, int32_t local)
      : offsets(size_t(local) + 1, kPoison), row_token(size_t(routes), kPoison), route_row(size_t(routes), kPoison),
        header(kTileHeaderInts, kPoison), alt_header(kTileHeaderInts, kPoison),
        tile_done(size_t(max_token_tiles(routes, local)), kPoison),
        chunk_rows(size_t(kMaxRouteChunks) * size_t(local), kPoison),
        tiles(size_t(max_token_tiles(routes, local)), TokenTile{kPoison, kPoison}),
        alt_tiles(size_t(max_token_tiles(routes, local)), TokenTile{kPoison, kPoison}) {}
  bool guards_intact() const {
    return offsets.guards_intact() && row_token.guards_intact() && route_row.guards_intact() &&
           header.guards_intact() && alt_header.guards_intact() && tile_done.guards_intact() &&
           chunk_rows.guards_intact() && tiles.guards_intact() && alt_tiles.guards_intact();
  }
  Guarded<int32_t> offsets, row_token, route_row, header, alt_header, tile_done, chunk_rows;
  Guarded<TokenTile> tiles, alt_tiles;
  int32_t chunk_routes = 0;
};

Routed run_routing(const Routing& in) {
  const int32_t r = in.routes(), l = in.local;
  Routed out(r, l);
  out.chunk_routes = in.chunk_routes >= 0 ? in.chunk_routes : route_chunk_routes(r);

  RouteParams p{};
  p.topk_ids = in.ids.data();
  p.offsets = out.offsets.data();
  p.row_token = out.row_token.data();
  p.route_row = out.route_row.data();
  p.tile_count = out.header.data();
  p.tiles = out.tiles.data();
  p.tile_done = out.tile_done.data();
  p.chunk_rows = out.chunk_rows.data();
  p.chunk_routes = out.chunk_routes;
  p.num_routes = r;
  p.top_k = in.top_k;
  p.num_experts = in.experts;
  p.num_local = l;
  p.local_offset = in.offset;
  p.packed = in.packed;
  p.block_n = in.block_n;
  p.alt_block_n = in.alt_block_n;
  p.block_cost = in.block_cost;
  p.alt_block_cost = in.alt_block_cost;
  p.alt_tile_count = in.split ? out.alt_header.data() : nullptr;
  p.alt_tiles = in.split ? out.alt_tiles.data() : nullptr;

  if (p.chunk_routes == 0) {
    Cta::launch(1, kRouteThreads, [&] { route(p); });
  } else {
    const int32_t chunks = (r + p.chunk_routes - 1) / p.chunk_routes;
    Cta::launch(chunks, kRouteThreads, [&] { route_count(p); });
    Cta::launch(1, kRouteThreads, [&] { in.split ? route_scan_split(p) : route_scan(p); });
    Cta::launch(chunks, kRouteThreads, [&] { route_place(p); });
  }
  return out;
}

// SPEC §5: a route's local expert, or -1 (remote, or an id outside [0, E)).
int32_t local_of(const Routing& in, int32_t route) {
  int64_t id = in.ids[size_t(route)];
  if (in.packed) id = id >= 0 ? id / 65536 : -((-id + 65535) / 65536);  // the arithmetic shift
  const int64_t local = id - in.offset;
  return id >= 0 && id < in.experts && local >= 0 && local < in.local ? int32_t(local) : -1;
}

int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

// The listing RouteParams describes: 0 all tiles at block_n, 1 all at alt_block_n (the cheaper
// by tiles x cost, ties to block_n), 2 with the width per expert each expert's full tiles of the
// wider form and a last tile of at most the narrower form's rows in its list, where that costs
// less than the cheaper single form by more than kSplitGainPct.
int32_t expected_listing(const Routing& in, const std::vector<int32_t>& count) {
  if (in.routes() <= kMaxFewRoutes || in.alt_block_n <= 0) return 0;
  const bool alt_wider = in.alt_block_n > in.block_n;
  const int32_t wide = std::max(in.block_n, in.alt_block_n), narrow = std::min(in.block_n, in.alt_block_n);
  const int64_t wide_cost = alt_wider ? in.alt_block_cost : in.block_cost;
  const int64_t narrow_cost = alt_wider ? in.block_cost : in.alt_block_cost;
  int64_t cost = 0, alt_cost = 0, split_cost = 0;
  for (int32_t c : count) {
    cost += int64_t(ceil_div(c, in.block_n)) * in.block_cost;
    alt_cost += int64_t(ceil_div(c, in.alt_block_n)) * in.alt_block_cost;
    const int32_t rest = c % wide;
    split_cost += int64_t(c / wide + (rest > narrow)) * wide_cost + int64_t(rest > 0 && rest <= narrow) * narrow_cost;
  }
  if (in.split && split_cost * 100 < std::min(cost, alt_cost) * (100 - kSplitGainPct)) return 2;
  return alt_cost < cost ? 1 : 0;
}

// The count and choice word; in the first list's header also GEMM1's unit queue and split flags
// zeroed (the alt pair of the width per expert, persistent wgmma forms, uses neither).
void check_header(const Guarded<int32_t>& header, int32_t count, int32_t choice, bool counters) {
  EXPECT(header[0] == count && header[kTileChoiceAt] == choice);
  if (!counters) return;
  bool zeroed = true;
  for (int32_t i = 1; i < kTileHeaderInts; ++i) zeroed = zeroed && (i == kTileChoiceAt || header[size_t(i)] == 0);
  EXPECT(zeroed);
}

void check_list(const Guarded<TokenTile>& got, const std::vector<TokenTile>& want, const Guarded<int32_t>* done) {
  bool same = true;
  for (size_t t = 0; t < want.size(); ++t) {
    same = same && got[t].expert == want[t].expert && got[t].row0 == want[t].row0;
    if (done != nullptr) same = same && (*done)[t] == 0;
  }
  EXPECT(same);
}

int listings_seen[2][3] = {};  // [split][listing]: the draws reach every listing

void check_routing(const Routing& in, const char* what) {
  const int failed_before = failures;
  const Routed out = run_routing(in);
  const int32_t r = in.routes(), l = in.local;
  std::vector<int32_t> count(size_t(l), 0);
  for (int32_t i = 0; i < r; ++i)
    if (local_of(in, i) >= 0) ++count[size_t(local_of(in, i))];
  std::vector<int32_t> offsets(size_t(l) + 1, 0);
  for (int32_t e = 0; e < l; ++e) offsets[size_t(e) + 1] = offsets[size_t(e)] + count[size_t(e)];
  EXPECT(out.guards_intact());
  EXPECT(out.offsets.inner() == offsets);

  // every local route on a row of its expert, each row once, its token on it; in route order
  // inside an expert on the few-route path (the GEMMs' lookahead assumes it)
  const int32_t rows = offsets[size_t(l)];
  std::vector<int32_t> rank(size_t(l), 0), seen(size_t(rows), 0);
  bool rows_ok = true;
  for (int32_t i = 0; i < r; ++i) {
    const int32_t e = local_of(in, i), row = out.route_row[size_t(i)];
    if (e < 0) {
      rows_ok = rows_ok && row == -1;
      continue;
    }
    const bool in_expert = row >= offsets[size_t(e)] && row < offsets[size_t(e) + 1];
    rows_ok = rows_ok && in_expert && !seen[size_t(row)]++ && out.row_token[size_t(row)] == i / in.top_k;
    if (r <= kMaxFewRoutes) rows_ok = rows_ok && row == offsets[size_t(e)] + rank[size_t(e)]++;
  }
  EXPECT(rows_ok);

  // the token-tile lists and their header words
  const int32_t listing = expected_listing(in, count);
  ++listings_seen[in.split][listing];
  const bool alt_wider = in.alt_block_n > in.block_n;
  const int32_t wide = std::max(in.block_n, in.alt_block_n), narrow = std::min(in.block_n, in.alt_block_n);
  std::vector<TokenTile> first, alt;
  for (int32_t e = 0; e < l; ++e) {
    const int32_t c = count[size_t(e)], row0 = offsets[size_t(e)];
    if (listing == 2) {
      const int32_t full = c / wide, rest = c - full * wide;
      std::vector<TokenTile>& wide_list = alt_wider ? alt : first;
      std::vector<TokenTile>& narrow_list = alt_wider ? first : alt;
      for (int32_t j = 0; j < full + (rest > narrow); ++j) wide_list.push_back({e, row0 + j * wide});
      if (rest > 0 && rest <= narrow) narrow_list.push_back({e, row0 + full * wide});
    } else {
      const int32_t rows_per_tile = listing == 1 ? in.alt_block_n : in.block_n;
      std::vector<TokenTile>& list = listing == 1 ? alt : first;
      for (int32_t j = 0; j < ceil_div(c, rows_per_tile); ++j) list.push_back({e, row0 + j * rows_per_tile});
    }
  }
  if (in.split) {
    check_header(out.header, int32_t(first.size()), listing == 1 ? 1 : 0, true);  // a pair runs on word 0
    check_header(out.alt_header, int32_t(alt.size()), listing == 0 ? 1 : 0, false);
    check_list(out.alt_tiles, alt, nullptr);
  } else {
    std::vector<TokenTile>& listed = listing == 1 ? alt : first;
    check_header(out.header, int32_t(listed.size()), listing, true);
    first = listed;
  }
  check_list(out.tiles, first, &out.tile_done);
  if (failures != failed_before)
    std::printf("  %s: R=%d E=%d L=%d offset=%d packed=%d bn=%d alt=%d split=%d chunk=%d listing %d\n", what, r,
                in.experts, l, in.offset, int(in.packed), in.block_n, in.alt_block_n, int(in.split),
                out.chunk_routes, listing);

  // The GEMMs' lookahead (<= 32 routes) names each listed tile's expert from the routes alone.
  if (r <= kMaxFewRoutes && !in.split) {
    const RouteLookahead la{in.ids.data(), r, 0, in.experts, l, in.offset, int32_t(in.packed)};
    const size_t tiles = first.size() + 2;  // and two past the list
    std::vector<int32_t> named(tiles * 32, kPoison), totals(tiles * 32, kPoison);  // [tile][lane]
    Cta::run(32, [&] {
      for (size_t t = 0; t < tiles; ++t) {
        int32_t total = -1;
        const size_t at = t * 32 + threadIdx.x;
        named[at] = lookahead_tile_expert(la, in.block_n, int32_t(t), &total);
        totals[at] = total;
      }
    });
    bool same = true;  // every lane gets the answer
    for (size_t i = 0; i < named.size(); ++i)
      same = same && named[i] == (i / 32 < first.size() ? first[i / 32].expert : -1) && totals[i] == int32_t(first.size());
    EXPECT(same);
  }
}

// Routes of T tokens, k slots each, drawn as the GPU tests draw them.
enum class Draw { kBalanced, kAllRemote, kOneHot, kSkewed, kDuplicates, kOutOfRange };

Routing draw(Draw how, int32_t tokens, int32_t top_k, int32_t experts, int32_t local, int32_t offset, bool packed) {
  Routing in;
  in.top_k = top_k;
  in.experts = experts;
  in.local = local;
  in.offset = offset;
  in.packed = packed;
  in.ids.resize(size_t(tokens) * top_k);
  int32_t previous = 0;  // the slot before's id (before packing)
  for (size_t i = 0; i < in.ids.size(); ++i) {
    int32_t id = int32_t(uniform(0, experts - 1));
    switch (how) {
      case Draw::kBalanced: break;
      case Draw::kAllRemote:  // every id outside [offset, offset + local)
        id = local == experts ? -1 : int32_t((offset + local + uniform(0, experts - local - 1)) % experts);
        break;
      case Draw::kOneHot: id = i % size_t(top_k) == 0 ? offset : id; break;
      case Draw::kSkewed: id = int32_t(std::min<int64_t>(experts - 1, offset + uniform(0, 3) * uniform(0, 7))); break;
      case Draw::kDuplicates: id = i % size_t(top_k) == 1 ? previous : id; break;
      case Draw::kOutOfRange:  // (unpacked ids: also the extremes of int32, whose difference from the offset wraps)
        id = uniform(0, 3) == 0 ? int32_t(uniform(0, 1) ? uniform(-40000, -1) : uniform(experts, 40000)) : id;
        if (!packed && uniform(0, 15) == 0) id = uniform(0, 1) ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int32_t>::max();
        break;
    }
    in.ids[i] = packed ? int32_t(uint32_t(id) << 16 | uint32_t(uniform(0, 0xFFFF))) : id;
    previous = id;
  }
  return in;
}

void test_routing_paths() {
  struct Layout { int32_t experts, local, offset, top_k; };
  const Layout layouts[] = {{896, 112, 336, 16}, {896, 896, 0, 16}, {64, 64, 0, 4}, {40, 1, 7, 2}, {1024, 1024, 0, 32}};
  const Draw draws[] = {Draw::kBalanced, Draw::kAllRemote, Draw::kOneHot, Draw::kSkewed, Draw::kDuplicates,
                        Draw::kOutOfRange};
  const int32_t forms[][2] = {{8, 0}, {32, 64}, {128, 160}, {160, 96}, {64, 32}};  // block_n, alt_block_n
  // (tokens per layout's top_k): one warp, one CTA, and the several-CTA path at the plans' chunking
  for (const Layout& lay : layouts)
    for (int32_t tokens : {1, 2, 3, 64 / lay.top_k + 1, 1025 / lay.top_k + 1}) {
      for (const Draw how : draws) {
        const int32_t* f = forms[uniform(0, 4)];
        Routing in = draw(how, tokens, lay.top_k, lay.experts, lay.local, lay.offset, uniform(0, 1) == 1);
        in.block_n = f[0];
        in.alt_block_n = f[1];
        in.alt_block_cost = int32_t(uniform(60, 160));
        check_routing(in, "one CTA");
      }
    }
  // several CTAs: forced small chunks (and the plans' own at 16384 routes), one listing or the
  // width per expert
  for (const Layout& lay : layouts) {
    for (const Draw how : draws) {
      for (const bool split : {false, true}) {
        const int32_t* f = forms[uniform(1, 4)];
        Routing in = draw(how, int32_t(uniform(40, 400)), lay.top_k, lay.experts, lay.local, lay.offset,
                          uniform(0, 1) == 1);
        in.block_n = f[0];
        in.alt_block_n = f[1];
        in.alt_block_cost = int32_t(uniform(60, 160));
        in.split = split;
        in.chunk_routes = int32_t(uniform(300, 3000));
        if (in.routes() > int64_t(in.chunk_routes) * kMaxRouteChunks) in.chunk_routes = ceil_div(in.routes(), kMaxRouteChunks);
        check_routing(in, "several CTAs");
      }
    }
  }
  Routing plans = draw(Draw::kBalanced, 1024, 16, 896, 896, 0, false);  // tp8 T = 1024: 16384 routes
  plans.block_n = 128;
  plans.alt_block_n = 160;
  plans.alt_block_cost = 130;
  plans.split = true;
  check_routing(plans, "the plans' chunking");
  EXPECT(route_chunk_routes(plans.routes()) == kRouteChunkMin);
  Routing most = draw(Draw::kBalanced, 16384, 16, 896, 896, 0, true);  // tp8 T = 16384: 64 chunks, the most
  most.block_n = 160;
  most.alt_block_n = 128;
  most.block_cost = 130;
  most.split = true;
  EXPECT((most.routes() + route_chunk_routes(most.routes()) - 1) / route_chunk_routes(most.routes()) == kMaxRouteChunks);
  check_routing(most, "the plans' chunking, 64 chunks");
  // (the split listing, 2, needs counts just past the wider form's multiples: test_width_per_expert)
  EXPECT(listings_seen[0][0] && listings_seen[0][1] && listings_seen[1][0] && listings_seen[1][1]);
}

// The width per expert where it wins by construction: every local expert's 200-223 routes take
// two 160-row tiles (cost 260), three 96-row ones (255), or a 160-row and a 96-row one (215);
// among them remote and out-of-range ids, packed or not, the wider form first or second.
void test_width_per_expert() {
  for (const bool packed : {false, true})
    for (const bool alt_wider : {false, true}) {
      Routing in;
      in.top_k = 4;
      in.experts = 40;
      in.local = 24;
      in.offset = 8;
      in.packed = packed;
      std::vector<int32_t> ids, count(size_t(in.local));
      for (int32_t e = 0; e < in.local; ++e) {
        count[size_t(e)] = 200 + e;
        ids.insert(ids.end(), size_t(count[size_t(e)]), in.offset + e);
      }
      for (int32_t i = 0; i < 600; ++i) ids.push_back(i % 3 == 0 ? int32_t(uniform(0, 7)) : i % 3 == 1 ? 32 + i % 8 : -1 - i);
      std::shuffle(ids.begin(), ids.end(), cake_moe::host_test::generator());
      for (int32_t id : ids) in.ids.push_back(packed ? int32_t(uint32_t(id) << 16 | uint32_t(uniform(0, 0xFFFF))) : id);
      in.ids.resize(in.ids.size() / 4 * 4);  // whole tokens
      for (int32_t e = 0; e < in.local; ++e) count[size_t(e)] = 0;
      for (int32_t i = 0; i < in.routes(); ++i)
        if (local_of(in, i) >= 0) ++count[size_t(local_of(in, i))];
      in.block_n = alt_wider ? 96 : 160;
      in.alt_block_n = alt_wider ? 160 : 96;
      in.block_cost = alt_wider ? 85 : 130;
      in.alt_block_cost = alt_wider ? 130 : 85;
      in.split = true;
      in.chunk_routes = 1000;
      EXPECT(expected_listing(in, count) == 2);
      check_routing(in, "width per expert");
    }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "all";
  if (cake_moe::host_test::selected(which, "paths")) test_routing_paths();
  if (cake_moe::host_test::selected(which, "split")) test_width_per_expert();
  return cake_moe::host_test::report(which);
}
