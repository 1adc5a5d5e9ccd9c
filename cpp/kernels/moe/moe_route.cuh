// Route bookkeeping of the shared MoE engine: precomputed routes -> per-local-expert row
// offsets, the sorted route list (token of each row), its inverse (row of each route, -1 for a
// route that contributes nothing) and the token-tile list the grouped GEMMs walk.
//
// Up to 16383 routes one CTA of 1024 threads does everything (two passes over the T*k routes:
// count, then place; at most 32 routes, one warp's match), so no global counters need clearing
// and no grid-wide synchronisation is needed; more routes take three launches over several
// CTAs (route_count / route_scan / route_place below), which need none either.
// Same-expert lanes of a warp are aggregated with __match_any_sync before the shared-memory
// atomics, so one hot expert does not serialise the warp. Row order inside an expert follows
// the atomics (unspecified); nothing downstream depends on it (see docs/mxfp4_moe.md).
#pragma once
#include <cstdint>

#include "common/block_scan.cuh"
#include "common/ptx/grid_dependency.cuh"
#include "moe/params.hpp"

namespace cake_moe::moe {

// Local expert of a route's id word, or -1 (remote expert, id outside [0, E)).
__device__ __forceinline__ int32_t local_expert_of(int32_t id, int32_t packed, int32_t num_experts,
                                                   int32_t local_offset, int32_t num_local) {
  if (packed) id >>= 16;  // arithmetic shift: negative packed ids stay negative
  // The difference taken unsigned, so that it is defined for any id word (INT32_MIN included);
  // its value matters only where id >= 0.
  const int32_t local = int32_t(uint32_t(id) - uint32_t(local_offset));
  const bool ok = id >= 0 && id < num_experts && local >= 0 && local < num_local;
  return ok ? local : -1;
}
__device__ __forceinline__ int32_t local_expert(const RouteParams& p, int32_t route) {
  return local_expert_of(p.topk_ids[route], p.packed, p.num_experts, p.local_offset, p.num_local);
}

// Adds the lane's share of a warp-aggregated increment of counter[e] and returns the value the
// counter had before the lane's own unit (the lane's rank among the warp's same-expert lanes
// is added to the aggregated base).
__device__ __forceinline__ int32_t warp_aggregated_add(int32_t* counter, int32_t e) {
  const uint32_t lane = threadIdx.x & 31u;
  const uint32_t peers = __match_any_sync(0xFFFFFFFFu, e);
  const uint32_t leader = __ffs(peers) - 1u;
  int32_t base = 0;
  if (e >= 0 && lane == leader) base = atomicAdd(&counter[e], __popc(peers));
  base = __shfl_sync(0xFFFFFFFFu, base, leader);
  return base + __popc(peers & ((1u << lane) - 1u));
}

// Counts the routes [begin, end) per local expert into count (shared, zeroed by the caller).
__device__ __forceinline__ void count_routes(const RouteParams& p, int32_t begin, int32_t end, int32_t* count) {
  const int32_t rounds = (end - begin + kRouteThreads - 1) / kRouteThreads;
  for (int32_t r = 0; r < rounds; ++r) {  // uniform trip count: every lane reaches the match
    const int32_t route = begin + r * kRouteThreads + int32_t(threadIdx.x);
    const int32_t e = route < end ? local_expert(p, route) : -1;
    warp_aggregated_add(count, e);
  }
}

// Places the routes [begin, end): each local route takes the next row of its expert's cursor
// (shared) and writes its row and the row's token.
__device__ __forceinline__ void place_routes(const RouteParams& p, int32_t begin, int32_t end, int32_t* cursor) {
  const int32_t rounds = (end - begin + kRouteThreads - 1) / kRouteThreads;
  for (int32_t r = 0; r < rounds; ++r) {
    const int32_t route = begin + r * kRouteThreads + int32_t(threadIdx.x);
    const bool in = route < end;
    const int32_t e = in ? local_expert(p, route) : -1;
    const int32_t row = warp_aggregated_add(cursor, e);
    if (in) p.route_row[route] = e >= 0 ? row : -1;
    if (e >= 0) p.row_token[row] = route / p.top_k;
  }
}

// GEMM1's unit queue and split flags (the tile list's header past the count and the tile
// choice), zeroed by threads [0, n): the previous call has completed, nothing reads them now.
__device__ __forceinline__ void zero_gemm1_counters(const RouteParams& p, int32_t tid, int32_t n) {
  for (int32_t i = 1 + tid; i < kTileHeaderInts; i += n)
    if (i != kTileChoiceAt) p.tile_count[i] = 0;
}

// N tile counts summed over the local experts: `tiles_of(count, out)` adds one expert's N counts
// to out. Summed per warp, then one 32-bit shared add per warp and count: a 64-bit shared
// atomicAdd is a compare-and-swap loop on sm_90, and 896 threads contending on it took ~50 us.
// count: the per-expert counts (shared). Collective over the CTA; ends with a CTA barrier.
template <int N, typename TilesOf>
__device__ __forceinline__ void sum_expert_tiles(const int32_t* count, int32_t num_local, TilesOf tiles_of,
                                                 uint32_t (&total)[N]) {
  static_assert(kRouteThreads % 32 == 0, "whole warps");
  __shared__ uint32_t sum[N];  // each at most R / 8 + L
  if (threadIdx.x < N) sum[threadIdx.x] = 0;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) total[i] = 0;
  for (int32_t e = threadIdx.x; e < num_local; e += kRouteThreads) tiles_of(count[e], total);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    total[i] = __reduce_add_sync(0xFFFFFFFFu, total[i]);
    if ((threadIdx.x & 31u) == 0) atomicAdd(&sum[i], total[i]);
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) total[i] = sum[i];
}

// Each single form's tiles for `c` routes: {at block_n, at alt_block_n}.
__device__ __forceinline__ void add_single_form_tiles(const RouteParams& p, int32_t c, uint32_t* out) {
  out[0] += uint32_t((c + p.block_n - 1) / p.block_n);
  out[1] += uint32_t((c + p.alt_block_n - 1) / p.alt_block_n);
}

// 1 where the alt form's tiles cost less than the first form's (tiles x cost per tile), else 0.
__device__ __forceinline__ int32_t alt_is_cheaper(const RouteParams& p, const uint32_t* tiles) {
  return uint64_t(tiles[1]) * uint32_t(p.alt_block_cost) < uint64_t(tiles[0]) * uint32_t(p.block_cost) ? 1 : 0;
}

// The token-tile rows of this call: block_n, or alt_block_n where its tiles cost less (RouteParams).
// count: the per-expert counts (shared). Collective over the CTA; ends with a CTA barrier.
__device__ __forceinline__ int32_t choose_block_n(const RouteParams& p, const int32_t* count) {
  if (p.alt_block_n <= 0) return p.block_n;
  uint32_t tiles[2];
  sum_expert_tiles(count, p.num_local, [&](int32_t c, uint32_t(&out)[2]) { add_single_form_tiles(p, c, out); },
                   tiles);
  return alt_is_cheaper(p, tiles) ? p.alt_block_n : p.block_n;
}

// From the per-expert counts (shared): the offsets, the token-tile list and its done counters.
// Leaves count as its inclusive prefix; tiles_end and chunk_total are scratch. Ends with a
// CTA barrier.
__device__ __forceinline__ void publish_offsets(const RouteParams& p, int32_t* count, int32_t* tiles_end,
                                                int32_t* chunk_total) {
  const int32_t tid = threadIdx.x, L = p.num_local;
  const int32_t block_n = choose_block_n(p, count);
  // offsets (exclusive prefix of the counts) and per-expert token-tile ends (inclusive prefix)
  for (int32_t e = tid; e < L; e += kRouteThreads) tiles_end[e] = (count[e] + block_n - 1) / block_n;
  block_inclusive_scan(count, L, chunk_total);
  block_inclusive_scan(tiles_end, L, chunk_total);
  const int32_t num_tiles = L > 0 ? tiles_end[L - 1] : 0;
  for (int32_t e = tid; e <= L; e += kRouteThreads) p.offsets[e] = e == 0 ? 0 : count[e - 1];
  if (tid == 0) {
    p.tile_count[0] = num_tiles;
    p.tile_count[kTileChoiceAt] = block_n == p.block_n ? 0 : 1;
  }
  zero_gemm1_counters(p, tid, kRouteThreads);
  for (int32_t t = tid; t < num_tiles; t += kRouteThreads) {
    const int32_t e = first_slot_above(tiles_end, L, t);
    const int32_t first_tile = e == 0 ? 0 : tiles_end[e - 1];
    const int32_t row0 = (e == 0 ? 0 : count[e - 1]) + (t - first_tile) * block_n;
    p.tiles[t] = TokenTile{e, row0};
    p.tile_done[t] = 0;  // the previous call has completed: nothing reads it now
  }
  __syncthreads();
}

// ---- the width per expert (route_scan_split; RouteParams::alt_tile_count) -------------------
// An expert's tiles when its full tiles take the wider form and a last, partly filled tile of at
// most `narrow` rows takes the narrower one: {wider-form tiles, narrower-form tiles (0 or 1)}.
struct SplitTiles {
  int32_t wide, narrow;
};
__device__ __forceinline__ SplitTiles split_tiles(int32_t count, int32_t wide, int32_t narrow) {
  const int32_t full = count / wide, rest = count - full * wide;
  return {full + (rest > narrow ? 1 : 0), rest > 0 && rest <= narrow ? 1 : 0};
}

// Which listing costs least: 0 all tiles at block_n, 1 all at alt_block_n (ties to 0, as
// choose_block_n), 2 the split, where it saves more than kSplitGainPct of the cheaper of the two.
// count: the per-expert counts (shared). Collective over the CTA; ends with a CTA barrier.
__device__ __forceinline__ int32_t choose_listing(const RouteParams& p, const int32_t* count) {
  const bool alt_wider = p.alt_block_n > p.block_n;
  const int32_t wide = alt_wider ? p.alt_block_n : p.block_n, narrow = alt_wider ? p.block_n : p.alt_block_n;
  uint32_t tiles[4];  // tiles at block_n, at alt_block_n, the split's wide and narrow ones
  sum_expert_tiles(
      count, p.num_local,
      [&](int32_t c, uint32_t(&out)[4]) {
        add_single_form_tiles(p, c, out);
        const SplitTiles st = split_tiles(c, wide, narrow);
        out[2] += uint32_t(st.wide);
        out[3] += uint32_t(st.narrow);
      },
      tiles);
  const uint64_t cost = uint64_t(tiles[0]) * uint32_t(p.block_cost);
  const uint64_t alt_cost = uint64_t(tiles[1]) * uint32_t(p.alt_block_cost);
  const uint32_t wide_cost = uint32_t(alt_wider ? p.alt_block_cost : p.block_cost);
  const uint32_t narrow_cost = uint32_t(alt_wider ? p.block_cost : p.alt_block_cost);
  const uint64_t split_cost = uint64_t(tiles[2]) * wide_cost + uint64_t(tiles[3]) * narrow_cost;
  const uint64_t single = alt_cost < cost ? alt_cost : cost;
  if (split_cost * 100u < single * uint64_t(100 - kSplitGainPct)) return 2;
  return alt_is_cheaper(p, tiles);
}

// publish_offsets for the width per expert: the offsets, and the two pairs' tile lists with
// their choice words (RouteParams::alt_tile_count). Leaves count as its inclusive prefix;
// tiles_end, alt_end and chunk_total are scratch. Ends with a CTA barrier.
__device__ __forceinline__ void publish_offsets_split(const RouteParams& p, int32_t* count, int32_t* tiles_end,
                                                      int32_t* alt_end, int32_t* chunk_total) {
  const int32_t tid = threadIdx.x, L = p.num_local;
  const int32_t listing = choose_listing(p, count);
  const bool alt_wider = p.alt_block_n > p.block_n;
  const int32_t wide = alt_wider ? p.alt_block_n : p.block_n, narrow = alt_wider ? p.block_n : p.alt_block_n;
  for (int32_t e = tid; e < L; e += kRouteThreads) {
    const SplitTiles st = split_tiles(count[e], wide, narrow);
    tiles_end[e] = listing == 0 ? (count[e] + p.block_n - 1) / p.block_n
                   : listing == 1 ? 0 : (alt_wider ? st.narrow : st.wide);
    alt_end[e] = listing == 1 ? (count[e] + p.alt_block_n - 1) / p.alt_block_n
                 : listing == 0 ? 0 : (alt_wider ? st.wide : st.narrow);
  }
  block_inclusive_scan(count, L, chunk_total);
  block_inclusive_scan(tiles_end, L, chunk_total);
  block_inclusive_scan(alt_end, L, chunk_total);
  const int32_t num_tiles = L > 0 ? tiles_end[L - 1] : 0, num_alt = L > 0 ? alt_end[L - 1] : 0;
  for (int32_t e = tid; e <= L; e += kRouteThreads) p.offsets[e] = e == 0 ? 0 : count[e - 1];
  if (tid == 0) {
    p.tile_count[0] = num_tiles;
    p.tile_count[kTileChoiceAt] = listing == 1 ? 1 : 0;  // the first pair runs on 0
    p.alt_tile_count[0] = num_alt;
    p.alt_tile_count[kTileChoiceAt] = listing == 0 ? 1 : 0;  // the alt pair runs on 0
  }
  zero_gemm1_counters(p, tid, kRouteThreads);
  // Tile j of expert e in a list of `rows`-row tiles starts at its offset plus j * rows; the
  // narrower form's last tile of a split starts after the expert's full tiles of the wider one.
  // The first list's done counters are zeroed as publish_offsets zeroes them (a plan with two
  // pairs has no tile sync: nothing reads them, but a workspace holds no stale counts).
  auto list = [&](TokenTile* out, int32_t* done, const int32_t* ends, int32_t n, int32_t rows, bool after_full) {
    for (int32_t t = tid; t < n; t += kRouteThreads) {
      const int32_t e = first_slot_above(ends, L, t);
      const int32_t first_tile = e == 0 ? 0 : ends[e - 1], first_row = e == 0 ? 0 : count[e - 1];
      const int32_t skip = after_full ? (count[e] - first_row) / wide * wide : 0;
      out[t] = TokenTile{e, first_row + skip + (t - first_tile) * rows};
      if (done != nullptr) done[t] = 0;
    }
  };
  list(p.tiles, p.tile_done, tiles_end, num_tiles, p.block_n, listing == 2 && alt_wider);
  list(p.alt_tiles, nullptr, alt_end, num_alt, p.alt_block_n, listing == 2 && !alt_wider);
  __syncthreads();
}

// One warp's numbering of at most 32 routes (lane l: route l's local expert e, or -1) in the
// order publish_offsets lists the tiles (ascending local expert, ceil(count / block_n) tiles
// each): the lane's same-expert lanes, its expert's tiles (on the expert's first lane, else 0),
// the routes and the tiles of the smaller experts, and all tiles. `expert_of(l)` gives every
// lane route l's expert. Both the one-warp routing path and the GEMMs' lookahead number tiles
// with it, so they agree by construction.
struct FewRoutes {
  uint32_t peers;
  int32_t tiles, routes_below, tiles_below, num_tiles;
};
template <typename ExpertOf>
__device__ __forceinline__ FewRoutes number_few_routes(int32_t e, int32_t block_n, ExpertOf expert_of) {
  constexpr uint32_t kAll = 0xFFFFFFFFu;
  const int32_t lane = int32_t(threadIdx.x & 31u);
  FewRoutes r{__match_any_sync(kAll, e), 0, 0, 0, 0};
  if (e >= 0 && lane == int32_t(__ffs(r.peers)) - 1) r.tiles = (__popc(r.peers) + block_n - 1) / block_n;
#pragma unroll
  for (int32_t l = 0; l < 32; ++l) {
    const int32_t e_l = expert_of(l), tiles_l = __shfl_sync(kAll, r.tiles, l);
    r.routes_below += (e_l >= 0 && e_l < e) ? 1 : 0;
    r.tiles_below += e_l < e ? tiles_l : 0;
    r.num_tiles += tiles_l;
  }
  return r;
}

// The local expert of token tile `tile` in the list the routing kernel writes, computed by one
// warp from at most 32 routes (lane l reads route l), or -1 when there is no such tile. All 32
// lanes call it and get the answer. A GEMM uses it to request its first weight stages before
// the routing kernel has finished. `num_tiles`, if given, receives the list's tile count.
__device__ __forceinline__ int32_t lookahead_tile_expert(const RouteLookahead& r, int32_t block_n, int32_t tile,
                                                         int32_t* num_tiles = nullptr) {
  constexpr uint32_t kAll = 0xFFFFFFFFu;
  const int32_t lane = int32_t(threadIdx.x & 31u);
  const int32_t e = lane < r.routes ? local_expert_of(r.topk_ids[lane], r.packed, r.num_experts, r.local_offset,
                                                      r.num_local)
                                    : -1;
  const FewRoutes n = number_few_routes(e, block_n, [&](int32_t l) { return __shfl_sync(kAll, e, l); });
  const uint32_t hit = __ballot_sync(kAll, tile >= n.tiles_below && tile < n.tiles_below + n.tiles);
  if (num_tiles != nullptr) *num_tiles = n.num_tiles;
  return hit != 0u ? __shfl_sync(kAll, e, __ffs(hit) - 1) : -1;
}

// At most kMaxFewRoutes routes (T = 1, 2 at top_k 16), where this kernel is on GEMM1's
// critical path: warp 0 finds each route's expert, rank and tiles with one match, and the block
// writes the offsets; one barrier instead of the general path's ten. The same outputs as the
// general path with one warp of routes: rows in route order inside an expert, tiles in
// ascending expert order, ceil(count / block_n) each (as lookahead_tile_expert assumes).
__device__ __forceinline__ void route_few(const RouteParams& p) {
  __shared__ int32_t expert_of[32];  // local expert of route l, or -1
  const int32_t tid = threadIdx.x;
  if (tid < 32) expert_of[tid] = tid < p.num_routes ? local_expert(p, tid) : -1;
  __syncthreads();
  // offsets[e]: the routes whose local expert is below e
  for (int32_t e = tid; e <= p.num_local; e += kRouteThreads) {
    int32_t below = 0;
#pragma unroll
    for (int32_t l = 0; l < 32; ++l) below += (expert_of[l] >= 0 && expert_of[l] < e) ? 1 : 0;
    p.offsets[e] = below;
  }
  if (tid >= 32) return;
  const int32_t lane = tid, e = expert_of[lane];
  const FewRoutes n = number_few_routes(e, p.block_n, [&](int32_t l) { return expert_of[l]; });
  const int32_t row = n.routes_below + __popc(n.peers & ((1u << lane) - 1u));
  if (lane < p.num_routes) p.route_row[lane] = e >= 0 ? row : -1;
  if (e >= 0) p.row_token[row] = lane / p.top_k;
  for (int32_t j = 0; j < n.tiles; ++j) {
    p.tiles[n.tiles_below + j] = TokenTile{e, n.routes_below + j * p.block_n};
    p.tile_done[n.tiles_below + j] = 0;  // the previous call has completed: nothing reads it now
  }
  if (lane == 0) {
    p.tile_count[0] = n.num_tiles;
    p.tile_count[kTileChoiceAt] = 0;  // block_n: the plan binds no second form for so few routes
  }
  zero_gemm1_counters(p, lane, 32);
}

// Launch order (a plan's run): activation dequantize, this kernel as its dependent launch, the
// GEMMs. It reads nothing the dequantize writes, so it runs alongside it, and waits for it only
// before completing: the GEMMs' dependency wait on this grid then covers both. With at most 32
// routes the plan launches this kernel first (its wait is then a no-op) and the dequantize as
// its dependent launch, which waits for it (formats/dequantize.cuh).
__device__ __forceinline__ void route(const RouteParams& p) {
  ptx::allow_dependent_launch();  // GEMM1 may be scheduled; it waits for this grid to complete
  if (p.num_routes <= kMaxFewRoutes) {
    route_few(p);
    ptx::grid_dependency_wait();  // complete only after the activation dequantize has
    return;
  }
  __shared__ int32_t count[kMaxLocalExperts];   // counts, then their inclusive prefix
  __shared__ int32_t tiles_end[kMaxLocalExperts];  // tile ends, then placement cursors
  __shared__ int32_t chunk_total[32];
  const int32_t tid = threadIdx.x, L = p.num_local;

  for (int32_t e = tid; e < L; e += kRouteThreads) count[e] = 0;
  __syncthreads();
  count_routes(p, 0, p.num_routes, count);
  __syncthreads();
  publish_offsets(p, count, tiles_end, chunk_total);
  // placement cursors start at each expert's first row; tiles_end is free again
  int32_t* cursor = tiles_end;
  for (int32_t e = tid; e < L; e += kRouteThreads) cursor[e] = e == 0 ? 0 : count[e - 1];
  __syncthreads();
  place_routes(p, 0, p.num_routes, cursor);
  ptx::grid_dependency_wait();  // complete only after the activation dequantize has
}

// ---- several CTAs (p.chunk_routes > 0): count, scan, place ---------------------------------
// The single CTA spends ~2 us per 1000 routes when they spread over many experts (the shared
// atomics barely aggregate: 0.6 ms for tp8's 262144 routes over 896 experts), so large T cuts
// the routes into chunks of p.chunk_routes, one CTA each. Three dependent launches replace the
// one: route_count (per-chunk counts), route_scan (one CTA: offsets, tiles, and per expert the
// rows of the chunks before each chunk), route_place (each chunk places its routes from
// offsets[e] + its rows-before).
// Same outputs, same meaning; the row order inside an expert is unspecified, as above.
__device__ __forceinline__ int32_t chunk_end(const RouteParams& p, int32_t chunk) {
  const int64_t end = int64_t(chunk + 1) * p.chunk_routes;
  return end < p.num_routes ? int32_t(end) : p.num_routes;
}

__device__ __forceinline__ void route_count(const RouteParams& p) {
  ptx::allow_dependent_launch();  // the scan may be scheduled; it waits for this grid
  __shared__ int32_t count[kMaxLocalExperts];
  const int32_t tid = threadIdx.x, L = p.num_local, c = blockIdx.x;
  for (int32_t e = tid; e < L; e += kRouteThreads) count[e] = 0;
  __syncthreads();
  count_routes(p, c * p.chunk_routes, chunk_end(p, c), count);
  __syncthreads();
  for (int32_t e = tid; e < L; e += kRouteThreads) p.chunk_rows[c * L + e] = count[e];
  ptx::grid_dependency_wait();  // complete only after the activation dequantize has
}

// kSplit: route_scan_split, the width per expert (publish_offsets_split).
template <bool kSplit>
__device__ __forceinline__ void route_scan_listing(const RouteParams& p) {
  ptx::allow_dependent_launch();  // the placement may be scheduled; it waits for this grid
  __shared__ int32_t count[kMaxLocalExperts];
  __shared__ int32_t tiles_end[kMaxLocalExperts];
  __shared__ int32_t chunk_total[32];
  const int32_t tid = threadIdx.x, L = p.num_local;
  const int32_t chunks = (p.num_routes + p.chunk_routes - 1) / p.chunk_routes;
  ptx::grid_dependency_wait();  // the per-chunk counts
  // each expert's chunk counts -> their exclusive prefix over the chunks (8 loads in flight)
  constexpr int32_t kBatch = 8;
  for (int32_t e = tid; e < L; e += kRouteThreads) {
    int32_t running = 0;
    for (int32_t c0 = 0; c0 < chunks; c0 += kBatch) {
      int32_t v[kBatch];
#pragma unroll
      for (int32_t u = 0; u < kBatch; ++u) v[u] = c0 + u < chunks ? p.chunk_rows[(c0 + u) * L + e] : 0;
#pragma unroll
      for (int32_t u = 0; u < kBatch; ++u) {
        if (c0 + u < chunks) p.chunk_rows[(c0 + u) * L + e] = running;
        running += v[u];
      }
    }
    count[e] = running;
  }
  __syncthreads();
  if constexpr (kSplit) {
    __shared__ int32_t alt_end[kMaxLocalExperts];
    publish_offsets_split(p, count, tiles_end, alt_end, chunk_total);  // the placement adds offsets[e]
  } else {
    publish_offsets(p, count, tiles_end, chunk_total);  // the placement adds offsets[e]
  }
}
__device__ __forceinline__ void route_scan(const RouteParams& p) { route_scan_listing<false>(p); }
__device__ __forceinline__ void route_scan_split(const RouteParams& p) { route_scan_listing<true>(p); }

__device__ __forceinline__ void route_place(const RouteParams& p) {
  ptx::allow_dependent_launch();  // GEMM1 may be scheduled; it waits for this grid to complete
  __shared__ int32_t cursor[kMaxLocalExperts];
  const int32_t tid = threadIdx.x, L = p.num_local, c = blockIdx.x;
  ptx::grid_dependency_wait();  // the offsets and each chunk's rows before it, per expert
  for (int32_t e = tid; e < L; e += kRouteThreads) cursor[e] = p.offsets[e] + p.chunk_rows[c * L + e];
  __syncthreads();
  place_routes(p, c * p.chunk_routes, chunk_end(p, c), cursor);
}

}  // namespace cake_moe::moe
