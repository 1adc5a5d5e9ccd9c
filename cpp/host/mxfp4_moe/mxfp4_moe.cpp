#include "host/mxfp4_moe/mxfp4_moe.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "formats/args.hpp"
#include "host/formats/formats.hpp"
#include "host/mxfp4_moe/tilings.hpp"
#include "moe/params.hpp"
#include "mxfp4_moe/params.hpp"
#include "runtime/bound_kernel.hpp"
#include "runtime/driver.hpp"
#include "runtime/errors.hpp"
#include "runtime/images.hpp"
#include "runtime/launch.hpp"
#include "runtime/tensor_map.hpp"

namespace cake_moe::mxfp4_moe {
namespace {

// CAKE_MOE_LOOKAHEAD_SKEW=1 shifts the GEMM1 lookahead's expert numbering by one, so that its
// early weight requests name the wrong experts: validation of the kernel's reload and drain
// paths, which the routing kernel's own order never takes (the results must not change).
bool lookahead_skew() {
  const char* e = std::getenv("CAKE_MOE_LOOKAHEAD_SKEW");
  return e && e[0] == '1';
}

// The integer value of environment variable `name`, or `fallback` where it is unset or empty.
int64_t env_or(const char* name, int64_t fallback) {
  const char* e = std::getenv(name);
  return (e == nullptr || e[0] == '\0') ? fallback : std::atoll(e);
}

// GEMM1's unit queue under tile sync (GemmParams::unit_queue): by default the grid is the CTAs
// resident at once. CAKE_MOE_UNIT_QUEUE=0 launches the routing's worst case instead (one CTA per
// unit, idle CTAs exit); =N > 0 caps the grid at N CTAs, so that tests reach CTAs taking several
// units on small shapes (the results must not change).
int64_t unit_queue_ctas(int64_t resident) { return std::max<int64_t>(0, env_or("CAKE_MOE_UNIT_QUEUE", resident)); }

// GemmParams::code_ring of a GEMM with reduction k whose form has the code ring (`ring`): the
// scale codes four stages per copy wherever k allows it. CAKE_MOE_CODE_RING=0 turns it off
// (same-build comparisons; the bits do not change).
int32_t code_ring(bool ring, int32_t k) {
  if (!ring || k % 512 != 0) return 0;
  const char* e = std::getenv("CAKE_MOE_CODE_RING");
  return (e != nullptr && e[0] == '0') ? 0 : 1;
}

// The weights [L * m rows, k / 2 bytes] as a TMA tensor read in boxes of `box_bytes` x `rows`
// with the swizzle of the box width (the kernel's w_offset reads them back).
CUtensorMap weight_map(const uint8_t* w, int64_t num_local, int32_t m, int32_t k, int box_bytes, int rows) {
  runtime::TensorMapSpec s;
  s.dtype = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  s.base = const_cast<uint8_t*>(w);
  s.dims = {uint64_t(k / 2), uint64_t(num_local) * uint64_t(m)};
  s.strides = {uint64_t(k / 2)};
  s.box = {uint32_t(box_bytes), uint32_t(rows)};
  s.swizzle = box_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  return runtime::encode_tiled(s);
}

// The workspace's segments (moe::WorkspaceLayout) as the kernels' typed pointers.
struct Buffers {
  int32_t *offsets, *row_token, *route_row, *tile_count, *tile_done, *chunk_rows, *alt_tile_count;
  moe::TokenTile *tiles, *alt_tiles;
  uint16_t *x_bf16, *act, *rows;
  float* split_park;
};

Buffers buffers_of(uint8_t* base, const moe::WorkspaceLayout& ws) {
  Buffers b;
  b.offsets = reinterpret_cast<int32_t*>(base + ws.offsets);
  b.row_token = reinterpret_cast<int32_t*>(base + ws.row_token);
  b.route_row = reinterpret_cast<int32_t*>(base + ws.route_row);
  b.tile_count = reinterpret_cast<int32_t*>(base + ws.tiles);
  b.tiles = reinterpret_cast<moe::TokenTile*>(base + ws.tiles + moe::kTileHeaderInts * 4);
  b.tile_done = reinterpret_cast<int32_t*>(base + ws.tile_done);
  b.chunk_rows = reinterpret_cast<int32_t*>(base + ws.route_chunks);
  b.split_park = reinterpret_cast<float*>(base + ws.split_park);
  b.x_bf16 = reinterpret_cast<uint16_t*>(base + ws.x_bf16);
  b.act = reinterpret_cast<uint16_t*>(base + ws.act);
  b.rows = reinterpret_cast<uint16_t*>(base + ws.rows);
  b.alt_tile_count = reinterpret_cast<int32_t*>(base + ws.alt_tiles);
  b.alt_tiles = reinterpret_cast<moe::TokenTile*>(base + ws.alt_tiles + moe::kTileHeaderInts * 4);
  return b;
}

// The GEMM forms' tilings: the table's pair, and (alt1.suffix set) a second sm_90a pair.
struct PairTilings {
  TilingInfo gemm1, gemm2, alt1{}, alt2{};
  bool has_alt() const { return alt1.suffix != nullptr; }
};

// The sizes a plan accepts (beyond Python's checks): the workspace, the local experts, and the
// activation operands the stage loaders address in 32-bit counts of 16-byte chunks
// (stage_loader.cuh), each under 64 GiB.
void check_sizes(const Problem& p, const moe::WorkspaceLayout& ws) {
  if (p.workspace_bytes < ws.total)
    throw ValueError("workspace has " + std::to_string(p.workspace_bytes) + " bytes, needs " +
                     std::to_string(ws.total));
  if (p.num_local > moe::kMaxLocalExperts) throw ValueError("at most 1024 local experts");
  // (mxfp4_moe/params.hpp says what depends on it; the wrapper's MAX_DIM)
  if (p.hidden > kMaxLayerDim || p.inter > kMaxLayerDim)
    throw ValueError("H and the intermediate shard must be at most 2^19, got " + std::to_string(p.hidden) +
                     " and " + std::to_string(p.inter));
  constexpr int64_t kMaxOperandBytes = int64_t(16) << 32;
  const int64_t x_bytes = int64_t(p.tokens) * p.hidden * 2, act_bytes = int64_t(p.tokens) * p.top_k * p.inter * 2;
  if (x_bytes >= kMaxOperandBytes || act_bytes >= kMaxOperandBytes)
    throw ValueError("T = " + std::to_string(p.tokens) + ": a GEMM activation operand (x as BF16 " +
                     std::to_string(x_bytes) + " B, intermediate " + std::to_string(act_bytes) +
                     " B) reaches 64 GiB, past what the kernels address; split the batch");
}

// The tilings of the problem's forms, refused where they do not make a pair: one token-tile size
// per pair; a GEMM2-only form as GEMM2; a resident-rows GEMM2 only for a shard it holds. A second
// pair: two persistent (sm_90a wgmma) pairs of different token tiles, chosen on the device by the
// routing kernel's full path (more than kMaxFewRoutes routes), no tile sync.
PairTilings pair_tilings(const Problem& p, int64_t routes) {
  PairTilings t{tiling_for(p.gemm1_tile), tiling_for(p.gemm2_tile)};
  if (t.gemm1.bn != t.gemm2.bn) throw ValueError("GEMM1 and GEMM2 tiles must share one token-tile size (block_n)");
  if (t.gemm1.gemm2_only) throw ValueError(p.gemm1_tile + " is a GEMM2 form");
  auto check_gemm2 = [&](const TilingInfo& g2, const std::string& name) {
    if (g2.resident_k > 0 && p.inter > g2.resident_k)
      throw ValueError(name + " keeps every stage of K resident: intermediate shard <= " +
                       std::to_string(g2.resident_k));
  };
  check_gemm2(t.gemm2, p.gemm2_tile);
  if (p.gemm1_alt_tile.empty() && p.gemm2_alt_tile.empty()) return t;
  t.alt1 = tiling_for(p.gemm1_alt_tile);
  t.alt2 = tiling_for(p.gemm2_alt_tile);
  if (t.alt1.bn != t.alt2.bn || t.alt1.bn == t.gemm1.bn)
    throw ValueError("a second GEMM pair shares one token-tile size, other than the first pair's");
  if (!(t.gemm1.persistent && t.gemm2.persistent && t.alt1.persistent && t.alt2.persistent) || t.alt1.gemm2_only)
    throw ValueError("a second GEMM pair is for the persistent sm_90a wgmma forms");
  check_gemm2(t.alt2, p.gemm2_alt_tile);
  if (p.tile_sync || routes <= moe::kMaxFewRoutes || p.tile_cost <= 0 || p.alt_tile_cost <= 0)
    throw ValueError("a second GEMM pair needs more than 32 routes, no tile sync and both costs per tile > 0");
  return t;
}

class Mxfp4MoePlan final : public Plan {
 public:
  explicit Mxfp4MoePlan(const Problem& p) : device_(p.device), tokens_(p.tokens) {
    const moe::WorkspaceLayout ws = moe::workspace_layout(p.tokens, p.hidden, p.inter, p.num_local, p.top_k);
    check_sizes(p, ws);
    const int64_t routes = int64_t(p.tokens) * p.top_k;
    const PairTilings t = pair_tilings(p, routes);
    has_alt_ = t.has_alt();
    const Buffers buf = buffers_of(p.workspace, ws);
    runtime::ScopedDevice scope(p.device);
    const moe::RouteParams route = bind_routing(p, t, buf, routes);
    // 2. activations to BF16 (exact: docs/mxfp4_moe.md)
    dequant_ = formats::bind_dequantize(formats::Fmt::kMxfp8, true, false,
                                        formats::DequantizeArgs{p.x, p.x_sf, nullptr, buf.x_bf16, p.tokens, p.hidden, {}},
                                        p.device);
    bind_gemms(p, t, buf, routes, route.packed);
    bind_finalize(p, buf);
    order_launches(route.chunk_routes == 0 && routes <= moe::kMaxFewRoutes);
  }

  void run(std::uintptr_t stream) const override {
    if (tokens_ == 0) return;
    runtime::ScopedDevice scope(device_);  // once for the five to nine launches
    if (!route_first_) dequant_.launch_in_scope(stream);
    for (int i = 0; i < route_launches_; ++i) route_[i].launch_in_scope(stream);
    if (route_first_) dequant_.launch_in_scope(stream);
    gemm1_.launch_in_scope(stream);
    if (has_alt_) gemm1_alt_.launch_in_scope(stream);
    gemm2_.launch_in_scope(stream);
    if (has_alt_) gemm2_alt_.launch_in_scope(stream);
    finalize_.launch_in_scope(stream);
  }

  const std::string& forms() const override { return forms_; }
  bool split_width() const override { return split_width_; }

 private:
  // 1. routing bookkeeping: one CTA, or count / scan / place over chunks of the routes.
  moe::RouteParams bind_routing(const Problem& p, const PairTilings& t, const Buffers& buf, int64_t routes) {
    const int32_t chunk_routes = moe::route_chunk_routes(routes);
    // The width per expert (moe::RouteParams::alt_tile_count): with two pairs bound and the
    // several-CTA routing, the scan may list each expert's full tiles for the wider pair and its
    // last tile for the narrower one; each pair then reads a list and a choice word of its own.
    // On by default (the layer at T = 16384 on the H200: ep8 -3.1%, tp8 -3.6%);
    // CAKE_MOE_TILE_SPLIT=0 keeps one list (same-build comparisons; the bits do not change).
    split_width_ = has_alt_ && chunk_routes > 0 && env_or("CAKE_MOE_TILE_SPLIT", 1) != 0;
    moe::RouteParams route{p.topk_ids, buf.offsets, buf.row_token, buf.route_row, buf.tile_count, buf.tiles,
                           buf.tile_done, buf.chunk_rows, chunk_routes, int32_t(routes), p.top_k, p.num_experts,
                           p.num_local, p.local_offset,
                           p.weight_kind == int32_t(moe::RouteWeights::kPacked) ? 1 : 0, t.gemm1.bn,
                           has_alt_ ? t.alt1.bn : 0, p.tile_cost, p.alt_tile_cost, nullptr, nullptr};
    if (split_width_) {
      route.alt_tile_count = buf.alt_tile_count;
      route.alt_tiles = buf.alt_tiles;
    }
    const unsigned chunks = chunk_routes > 0 ? unsigned((routes + chunk_routes - 1) / chunk_routes) : 1u;
    if (chunk_routes == 0) {
      bind_route(route_[0], "cake_moe_route", 1, route);
    } else {
      bind_route(route_[0], "cake_moe_route_count", chunks, route);
      bind_route(route_[1], split_width_ ? "cake_moe_route_scan_split" : "cake_moe_route_scan", 1, route);
      bind_route(route_[2], "cake_moe_route_place", chunks, route);
    }
    route_launches_ = chunk_routes == 0 ? 1 : 3;
    return route;
  }

  // The CTAs of GEMM1's form resident at once (by shared memory and threads per SM): a later CTA
  // starts after the routing kernel has finished, and its lookahead would only delay its exit
  // (the dependent GEMM2 launches once every GEMM1 CTA has passed its wait). Registers are left
  // out: they allow as many CTAs as this for every form that looks ahead (n8 1, n8_narrow 2,
  // n8_narrow4 4, n8_shortk 3 per H200 SM), and a miscount only moves which CTAs look ahead.
  int64_t resident_ctas(const TilingInfo& t1) const {
    constexpr int kCtaSmemReserve = 1024, kMaxThreadsPerSm = 2048;
    const int per_sm = std::max(1, std::min(runtime::device_smem_per_sm(device_) / (t1.smem + kCtaSmemReserve),
                                            kMaxThreadsPerSm / t1.threads));
    return runtime::device_sm_count(device_) * per_sm;
  }

  // Under tile sync, GEMM1's K halves (Mxfp4MoeItemSchedule, "K halves"; forms whose partial
  // sums fit a parking slot, K of two stages or more): by default the units past the CTAs
  // resident at once (the second wave) when they are at most half the SMs, so that each half
  // can have an SM to itself (a larger second wave shares the SMs with GEMM2 already: its
  // halves would only take GEMM2's slots). CAKE_MOE_SPLIT_FROM=N moves the first split unit to
  // N, =-1 splits none; CAKE_MOE_SPLIT_MAX=M allows M (<= moe::kMaxSplitUnits). The bits may
  // change with them (the sums are added in another order, as another form's are). And when
  // GEMM1 has fewer units than SMs (a short first wave: ep8 T = 1 with one local expert),
  // every unit is split; CAKE_MOE_SPLIT_ALL_MAX=N moves that bound (0: never).
  void set_k_halves(GemmParams& gemm1, const Problem& p, const TilingInfo& t1, const Buffers& buf, bool tile_sync,
                    int64_t resident) const {
    const int64_t sms = runtime::device_sm_count(device_);
    const int64_t split_from = tile_sync ? env_or("CAKE_MOE_SPLIT_FROM", resident) : -1;
    const int64_t split_max = std::min<int64_t>(env_or("CAKE_MOE_SPLIT_MAX", sms / 2), moe::kMaxSplitUnits);
    if (split_from >= 0 && split_from < 0x7FFFFFFF && split_max > 0 && t1.splits_k && p.hidden >= 2 * t1.k_stage) {
      gemm1.split_park = buf.split_park;
      gemm1.split_flags = buf.tile_count + moe::kSplitFlagsAt;
      gemm1.split_from = int32_t(split_from);
      gemm1.split_max = int32_t(split_max);
      gemm1.split_all_max = int32_t(std::clamp<int64_t>(env_or("CAKE_MOE_SPLIT_ALL_MAX", sms), 0, moe::kMaxSplitUnits));
    }
  }

  // 3, 4. the GEMMs: grid = worst-case token tiles x m-blocks (idle CTAs exit at once; the bound
  // for the form's BN; no list has more tiles than routes either).
  void bind_gemms(const Problem& p, const PairTilings& t, const Buffers& buf, int64_t routes, int32_t packed) {
    const int64_t max_tiles = std::min(routes, moe::token_tiles_bound(routes, p.num_local, t.gemm1.bn));
    // With tile_sync, two one-CTA-per-item forms (mma.sync) synchronize per token tile: GEMM2's
    // CTAs wait for their tile's GEMM1 CTAs, not for all of GEMM1 (the persistent wgmma forms walk
    // items in their own order and keep the launch-wide wait).
    const bool tile_sync = p.tile_sync && !t.gemm1.persistent && !t.gemm2.persistent;
    const int32_t gemm1_m_blocks = int32_t((2 * p.inter + t.gemm1.bm - 1) / t.gemm1.bm);
    int32_t* done = tile_sync ? buf.tile_done : nullptr;
    // With at most 32 routes a BN 8 GEMM1 with TMA weights names its tile's expert from the routes
    // and requests its first weight stages before its dependency wait (Mxfp4MoeGemm, lookahead),
    // on the CTAs resident from the start.
    const bool lookahead = routes <= moe::kMaxFewRoutes && t.gemm1.looks_ahead;
    const int64_t resident = resident_ctas(t.gemm1);
    const moe::RouteLookahead gemm1_lookahead{p.topk_ids, lookahead ? int32_t(routes) : 0, int32_t(resident),
                                              p.num_experts, p.num_local,
                                              p.local_offset + (lookahead_skew() ? 1 : 0), packed};
    // Under tile sync GEMM1 runs on the CTAs resident at once, each taking the next unit from
    // a queue when done with its own: GEMM2's dependent launch (which waits until every GEMM1 CTA
    // has started or exited) then follows GEMM1's start, not the passage of the routing's
    // worst case of idle CTAs (ep8 T = 1: 1536 CTAs for ~288 units) through the slots GEMM1's
    // first wave frees.
    const int64_t queue_ctas = tile_sync ? unit_queue_ctas(resident) : 0;
    GemmParams gemm1{p.w1, p.w1_sf, p.w1_sf_max, buf.x_bf16, buf.row_token, buf.offsets, buf.tile_count, buf.tiles,
                     done, buf.act, p.beta, p.linear_beta, 2 * p.inter, p.hidden, 0, gemm1_m_blocks, gemm1_lookahead};
    gemm1.code_ring = code_ring(t.gemm1.gemm1_ring, p.hidden);
    set_k_halves(gemm1, p, t.gemm1, buf, tile_sync, resident);
    // The most work items GEMM1 can have (units, and one more per split unit: all of at most
    // split_all_max units, or at most split_max past split_from); the workspace's
    // moe::split_park_units slots cover every split unit.
    const int64_t gemm1_units = max_tiles * gemm1_m_blocks;
    const int64_t gemm1_pieces = [&] {
      int64_t most = gemm1_units;
      for (const int64_t u : {std::min<int64_t>(gemm1_units, int64_t(gemm1.split_from) + gemm1.split_max),
                              std::min<int64_t>(gemm1_units, gemm1.split_all_max)})
        most = std::max(most, u + split_units(gemm1, u));
      return most;
    }();
    const bool queue = queue_ctas > 0 && queue_ctas < gemm1_pieces;
    gemm1.unit_queue = queue ? buf.tile_count + 1 : nullptr;
    GemmParams gemm2{p.w2, p.w2_sf, p.w2_sf_max, buf.act, nullptr, buf.offsets, buf.tile_count, buf.tiles, done,
                     buf.rows, nullptr, nullptr, p.hidden, p.inter, 0, gemm1_m_blocks};
    gemm2.code_ring = code_ring(t.gemm2.gemm2_ring, p.inter);
    if (has_alt_) bind_alt_pair(p, t, buf, routes, gemm1, gemm2);
    bind_gemm(gemm1_, "mxfp4_moe_gemm1_", t.gemm1, max_tiles, p.num_local, gemm1, queue ? queue_ctas : 0, gemm1_pieces);
    bind_gemm(gemm2_, "mxfp4_moe_gemm2_", t.gemm2, max_tiles, p.num_local, gemm2);
  }

  // The second pair: each pair runs only under its choice (the routing kernel's word), or with
  // the width per expert both run, each on a list of its own; the alternative's launches follow
  // the first's. `gemm1` / `gemm2` are the first pair's parameters (their choice word is set here).
  void bind_alt_pair(const Problem& p, const PairTilings& t, const Buffers& buf, int64_t routes, GemmParams& gemm1,
                     GemmParams& gemm2) {
    gemm1.tile_choice = gemm2.tile_choice = buf.tile_count + moe::kTileChoiceAt;
    const int64_t alt_tiles = std::min(routes, moe::token_tiles_bound(routes, p.num_local, t.alt1.bn));
    GemmParams alt1 = gemm1, alt2 = gemm2;
    alt1.choice = alt2.choice = 1;
    if (split_width_) {  // the alt pair's own list and word (0: it runs)
      alt1.tile_count = alt2.tile_count = buf.alt_tile_count;
      alt1.tiles = alt2.tiles = buf.alt_tiles;
      alt1.tile_choice = alt2.tile_choice = buf.alt_tile_count + moe::kTileChoiceAt;
      alt1.choice = alt2.choice = 0;
    }
    // Launch order GEMM1, its alternative, GEMM2, its alternative: all but the first follow a
    // GEMM launch and may read the choice before their dependency wait.
    alt1.choice_at_start = alt2.choice_at_start = gemm2.choice_at_start = 1;
    alt1.code_ring = code_ring(t.alt1.gemm1_ring, p.hidden);
    alt2.code_ring = code_ring(t.alt2.gemm2_ring, p.inter);
    bind_gemm(gemm1_alt_, "mxfp4_moe_gemm1_", t.alt1, alt_tiles, p.num_local, alt1);
    bind_gemm(gemm2_alt_, "mxfp4_moe_gemm2_", t.alt2, alt_tiles, p.num_local, alt2);
  }

  // 5. the finalize: a CTA per token and block of columns.
  void bind_finalize(const Problem& p, const Buffers& buf) {
    finalize_.form = "moe_finalize";
    finalize_.device = p.device;
    finalize_.kernel = runtime::get_kernel(finalize_.form, "cake_moe_finalize", p.device);
    finalize_.cfg.grid[0] = unsigned(p.tokens);
    finalize_.cfg.grid[1] = unsigned((p.hidden / 8 + moe::kFinalizeThreads - 1) / moe::kFinalizeThreads);
    finalize_.cfg.block[0] = moe::kFinalizeThreads;
    *finalize_.params = moe::FinalizeParams{buf.rows, buf.route_row,
                                           p.weight_kind == int32_t(moe::RouteWeights::kPacked)
                                               ? static_cast<const void*>(p.topk_ids)
                                               : p.topk_weights,
                                           p.out, p.tokens, p.hidden, p.top_k, p.weight_kind};
  }

  // Launch order: dequantize (ordinary), routing, GEMM1, GEMM2, finalize, each of the last four
  // a dependent launch that starts while its predecessor drains and waits (griddepcontrol.wait)
  // before reading its outputs (a second GEMM pair: each GEMM followed by its alternative,
  // also dependent; the one not chosen exits once it has waited, or, past the first GEMM launch,
  // releases the next launch first and waits in one thread). The routing kernel reads nothing
  // the dequantize writes: it runs alongside it and waits for it only before completing, so
  // GEMM1's wait covers both. With at most 32 routes (`route_first`) the routing kernel (then
  // GEMM1's gate: the lookahead has requested the first weights) goes first instead, and the
  // dequantize, released at its start, waits for it before completing: the routing kernel no
  // longer starts a dependent-launch latency late.
  void order_launches(bool route_first) {
    route_first_ = route_first;
    for (auto& r : route_) r.cfg.pdl = !route_first_;
    dequant_.cfg.pdl = route_first_;
    gemm1_.cfg.pdl = gemm2_.cfg.pdl = finalize_.cfg.pdl = gemm1_alt_.cfg.pdl = gemm2_alt_.cfg.pdl = true;
    forms_ = dequant_.form + ", " + route_[0].form + ", " + gemm1_.form + (has_alt_ ? ", " + gemm1_alt_.form : "") +
             ", " + gemm2_.form + (has_alt_ ? ", " + gemm2_alt_.form : "") + ", " + finalize_.form;
  }

  void bind_route(runtime::BoundKernel<moe::RouteParams>& b, const char* kernel, unsigned grid,
                  const moe::RouteParams& params) {
    b.form = "moe_route";
    b.device = device_;
    b.kernel = runtime::get_kernel(b.form, kernel, device_);
    b.cfg.grid[0] = grid;
    b.cfg.block[0] = moe::kRouteThreads;
    *b.params = params;
  }

  // max_grid > 0: at most this many CTAs (GEMM1's unit queue takes the rest of the units);
  // pieces > 0: the worst case of GEMM1's work items (units, one more per K-halved unit).
  void bind_gemm(runtime::BoundKernel<GemmParams>& b, const std::string& prefix, const TilingInfo& tl, int64_t max_tiles,
                 int64_t num_local, GemmParams params, int64_t max_grid = 0, int64_t pieces = 0) {
    const std::string form = prefix + tl.suffix;
    params.m_blocks = (params.m + tl.bm - 1) / tl.bm;
    if (tl.w_box_bytes > 0) params.tmap_w = weight_map(params.w, num_local, params.m, params.k, tl.w_box_bytes, tl.bm);
    const int64_t ctas = pieces > 0 ? pieces : max_tiles * params.m_blocks;
    if (ctas > int64_t(0x7FFFFFFF)) throw ValueError("too many tiles for one launch");
    b.form = form;
    b.device = device_;
    b.kernel = runtime::get_kernel(form, ("cake_" + form).c_str(), device_);
    runtime::set_max_dynamic_smem(b.kernel, device_, unsigned(tl.smem));
    int64_t grid = tl.persistent ? std::min<int64_t>(ctas, runtime::device_sm_count(device_)) : ctas;
    if (max_grid > 0) grid = std::min(grid, max_grid);
    b.cfg.grid[0] = unsigned(std::max<int64_t>(grid, 1));
    b.cfg.block[0] = unsigned(tl.threads);
    b.cfg.smem_bytes = unsigned(tl.smem);
    *b.params = params;
  }

  int device_;
  int32_t tokens_;
  runtime::BoundKernel<moe::RouteParams> route_[3];  // one kernel, or count / scan / place
  int route_launches_ = 1;
  runtime::BoundKernel<formats::DequantizeArgs> dequant_;
  bool route_first_ = false;  // the routing kernel before the dequantize (at most 32 routes)
  runtime::BoundKernel<GemmParams> gemm1_, gemm2_;
  bool has_alt_ = false;  // a second GEMM pair, chosen on the device (Problem::gemm1_alt_tile)
  runtime::BoundKernel<GemmParams> gemm1_alt_, gemm2_alt_;
  runtime::BoundKernel<moe::FinalizeParams> finalize_;
  bool split_width_ = false;  // the width per expert: each pair its own tile list
  std::string forms_;
};

}  // namespace

std::unique_ptr<Plan> make_plan(const Problem& p) { return std::make_unique<Mxfp4MoePlan>(p); }

int64_t workspace_bytes(int64_t tokens, int64_t hidden, int64_t inter, int64_t num_local, int64_t top_k) {
  return moe::workspace_layout(tokens, hidden, inter, num_local, top_k).total;
}

}  // namespace cake_moe::mxfp4_moe
