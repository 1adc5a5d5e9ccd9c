// Parameters of the shared MoE engine kernels (routing bookkeeping and finalize) and the
// workspace layout every routed-MoE plan carves. Plain data: g++ and nvcc both compile this.
#pragma once
#include <cstdint>

#include "common/host_device.hpp"

namespace cake_moe::moe {

// How topk_weights arrive (SPEC §5).
enum class RouteWeights : int32_t { kBf16 = 0, kF32 = 1, kPacked = 2 };

// One token tile of the grouped GEMMs: `rows` (<= block_n) consecutive sorted rows of one expert.
struct TokenTile {
  int32_t expert;   // local expert index
  int32_t row0;     // first sorted row
};

// Upper bound on the token tiles of R routes over L experts for tiles of block_n rows: every
// expert with a route contributes ceil(count / bn) <= count / bn + 1 tiles.
CAKE_HD constexpr int64_t token_tiles_bound(int64_t routes, int64_t num_local, int64_t block_n) {
  return routes / block_n + (num_local < routes ? num_local : routes);
}
// ... for every tile form (rows >= kMinBlockN): sizes the workspace's tile list.
constexpr int32_t kMinBlockN = 8;
CAKE_HD constexpr int64_t max_token_tiles(int64_t routes, int64_t num_local) {
  return token_tiles_bound(routes, num_local, kMinBlockN);
}

CAKE_HD constexpr int64_t align256(int64_t x) { return (x + 255) / 256 * 256; }

// GEMM1 units computed as two K halves by two CTAs (family B decode: mxfp4_moe
// GemmParams::split_from): at most kMaxSplitUnits per call (a second wave of up to half the
// SMs of a 256-SM GPU), each with one flag in the tile list's header and one parking slot of
// kSplitParkBytes (a 256-thread CTA's 16 FP32 accumulators per thread: the n8 forms).
constexpr int32_t kMaxSplitUnits = 128;
constexpr int64_t kSplitParkBytes = 16384;
// The tile list's header, in int32: [0] tile count, [1] GEMM1's unit queue, [2] the tile form the
// routing kernel chose (RouteParams::alt_block_n), [4, 4 + kMaxSplitUnits) the split flags; the
// routing kernel writes the count and the choice and zeroes the rest.
constexpr int32_t kTileHeaderInts = 4 + kMaxSplitUnits;
constexpr int32_t kTileChoiceAt = 2;
constexpr int32_t kSplitFlagsAt = 4;
// Split units a workspace holds for R routes: no more than GEMM1's units at 64 weight rows per
// CTA (the narrowest form) and 2I weight rows.
CAKE_HD constexpr int64_t split_park_units(int64_t routes, int64_t num_local, int64_t inter) {
  const int64_t units = max_token_tiles(routes, num_local) * ((2 * inter + 63) / 64);
  return units < kMaxSplitUnits ? units : kMaxSplitUnits;
}

// Routing over several CTAs (moe_route.cuh): from kRouteChunkMin * 4 routes on, the routes are
// cut into at most kMaxRouteChunks chunks of at least kRouteChunkMin routes, one CTA each.
constexpr int32_t kMaxRouteChunks = 64;
constexpr int32_t kRouteChunkMin = 4096;
CAKE_HD constexpr int32_t route_chunk_routes(int64_t routes) {  // 0: one CTA routes everything
  if (routes < int64_t(kRouteChunkMin) * 4) return 0;
  const int64_t even = (routes + kMaxRouteChunks - 1) / kMaxRouteChunks;
  return int32_t(even > kRouteChunkMin ? even : kRouteChunkMin);
}

// Byte offsets of the workspace segments for T tokens (capacity R = T * top_k). The layout does
// not depend on the tile form, so the size is monotonic in T. Python mirrors this function
// (cake_moe.mxfp4_moe._wrapper._workspace_bytes); tests compare the two.
struct WorkspaceLayout {
  int64_t offsets, row_token, route_row, tiles, tile_done, route_chunks, split_park, x_bf16, act, rows, alt_tiles,
      total;
};

CAKE_HD WorkspaceLayout workspace_layout(int64_t tokens, int64_t hidden, int64_t inter, int64_t num_local,
                                                int64_t top_k) {
  const int64_t r = tokens * top_k;
  WorkspaceLayout w{};
  int64_t at = 0;
  w.offsets = at;   at += align256((num_local + 1) * 4);
  w.row_token = at; at += align256(r * 4);
  w.route_row = at; at += align256(r * 4);
  w.tiles = at;     at += align256(max_token_tiles(r, num_local) * 8 + kTileHeaderInts * 4);  // after the header
  w.tile_done = at; at += align256(max_token_tiles(r, num_local) * 4);       // GEMM1 CTAs done per tile
  w.route_chunks = at; at += align256(int64_t(kMaxRouteChunks) * num_local * 4);  // per-chunk counts
  w.split_park = at; at += align256(split_park_units(r, num_local, inter) * kSplitParkBytes);  // GEMM1 K halves
  w.x_bf16 = at;    at += align256(tokens * hidden * 2);
  w.act = at;       at += align256(r * inter * 2);
  w.rows = at;      at += align256(r * hidden * 2);
  w.alt_tiles = at; at += align256(max_token_tiles(r, num_local) * 8 + kTileHeaderInts * 4);  // the split's second list
  w.total = at;
  return w;
}

// Route bookkeeping (moe_route.cuh): one CTA turns [T, k] expert ids into per-expert counts and
// offsets, the sorted route list and its inverse, and the token-tile list of the GEMMs.
struct RouteParams {
  const int32_t* topk_ids;  // [T * k] global ids, or packed routes (id << 16 | bf16 bits)
  int32_t* offsets;         // [L + 1] sorted-row offset of each local expert (leading 0)
  int32_t* row_token;       // [R] token of each sorted row
  int32_t* route_row;       // [T * k] sorted row of each route, -1: not local / out of range
  int32_t* tile_count;      // [kTileHeaderInts] the tile list's header: tile count, then GEMM1's counters (zeroed)
  TokenTile* tiles;         // [max_token_tiles]
  int32_t* tile_done;       // [max_token_tiles] zeroed for the listed tiles (GEMM1 -> GEMM2 counters)
  int32_t* chunk_rows;      // [kMaxRouteChunks, L] several-CTA routing: each chunk's count per expert,
                            //   then per expert the routes of the chunks before it
  int32_t chunk_routes;     // routes per chunk (route_chunk_routes), 0: the one-CTA kernel
  int32_t num_routes;       // T * k
  int32_t top_k;
  int32_t num_experts;      // E: ids outside [0, E) contribute nothing
  int32_t num_local;        // L
  int32_t local_offset;     // first local global id
  int32_t packed;           // topk_ids holds packed routes
  int32_t block_n;          // rows per token tile (the GEMM form's BN)
  // The token-tile size chosen on the device (0: none). With alt_block_n > 0 the plan has bound
  // two GEMM form pairs; from the actual counts the routing kernel lists tiles of block_n rows
  // (choice 0) or of alt_block_n rows (choice 1), whichever gives the smaller sum over experts of
  // ceil(count / rows) x the form's cost per tile (block_cost, alt_block_cost), ties to block_n,
  // and writes the choice at header[kTileChoiceAt]; the other pair's kernels exit at once.
  int32_t alt_block_n;
  int32_t block_cost, alt_block_cost;  // cost per token tile of each form, any common unit
  // The width per expert (route_scan_split only; nullptr otherwise): the alt pair reads a list
  // of its own, header alt_tile_count (count, and at kTileChoiceAt its pair's word: 0 = runs)
  // and alt_tiles, and the first pair's word is header[kTileChoiceAt] as before. Besides all
  // tiles at block_n (the alt pair's word 1) or all at alt_block_n (the first pair's word 1),
  // the kernel may list each expert's full tiles of the wider form there and its last,
  // partly filled tile in the narrower form's list when that fits it (both words 0), where
  // that costs less than either form alone by kSplitGainPct.
  int32_t* alt_tile_count;
  TokenTile* alt_tiles;
};
constexpr int32_t kSplitGainPct = 2;  // the split's second kernel pair: one more boundary and tail

// At most this many routes (one warp's worth: T = 1, 2 at top_k 16) take the few-route paths:
// the routing kernel's one-warp numbering (moe_route.cuh, route_few), its launch ahead of the
// activation dequantize (the family-B plan), and the GEMM1 lookahead below.
constexpr int32_t kMaxFewRoutes = 32;
// What a GEMM needs to name its token tile's local expert from the routes themselves, before the
// routing kernel has listed the tiles (moe_route.cuh, lookahead_tile_expert): at most
// kMaxFewRoutes routes. routes = 0: no lookahead.
struct RouteLookahead {
  const int32_t* topk_ids;  // as RouteParams::topk_ids (an input: no launch of the plan writes it)
  int32_t routes;           // T * k
  int32_t first_ctas;       // only CTAs below this index (those resident from the start) look ahead:
                            //   a later one starts after the routing kernel has finished
  int32_t num_experts, num_local, local_offset;
  int32_t packed;
};

constexpr int kRouteThreads = 1024;
constexpr int kMaxLocalExperts = 1024;

// Finalize (moe_finalize.cuh): out[t] = bf16(sum_s fma(rows[route_row[t*k+s]], weight[t, s], acc)).
struct FinalizeParams {
  const uint16_t* rows;       // [R, H] bf16 route rows (sorted order)
  const int32_t* route_row;   // [T * k]
  const void* weights;        // [T, k] bf16 / f32, or the packed routes
  uint16_t* out;              // [T, H] bf16
  int32_t tokens;
  int32_t hidden;             // multiple of 8
  int32_t top_k;
  int32_t weight_kind;        // RouteWeights
};

constexpr int kFinalizeThreads = 128;

}  // namespace cake_moe::moe
