// Work units of the sm_90a wgrad kernel (sm90_bf16_grouped_gemm_wgrad.cuh) and the ragged
// scheduler that numbers them on the device from the group offsets.
//
// Work units. Output tiles are BM (=128, along N) x BN (128 or 256, along K). A
// group whose token count is large is cut into `num_chunks` chunks of whole
// 64-row k-blocks; a unit is (group, chunk, tile). The chunk length is chosen on
// the device from offs (no host sync): at most kb_chunk_max k-blocks, where
//   kb_chunk_max = max(kMinChunkKB, ceil(tiles * R / (W * kSplitQ * 64)),
//                      ceil(tiles * R / (ws_slots * 64)))
// (tiles = ceil(N/BM) * ceil(K/BN), R = total rows, W = params.num_workers), so
// that there are about kSplitQ units per worker or more, and the number of split
// tiles never exceeds the workspace's ws_slots (each split group has more than
// 64 * kb_chunk_max rows, so fewer than R / (64 * kb_chunk_max) groups split).
// Units are ordered group-major, then chunk, then tile: the CTAs that run together
// read the same token rows of the same group (L2 reuse). Units of at least
// kBandMinKB k-blocks go in bands of kBandN tile rows (along N), K-major inside a
// band, so a wave of ~132 units covers ~16 x 8 tiles instead of a few full tile
// rows: with N = 4096, K = 7168, T = 65536 the n-major order re-read X from DRAM
// ~13x (Nsight, H200: 3.1 TB/s, L2 hit rate 52%). Short units stay n-major: their
// operands stay in L2 anyway, and consecutive tiles then write whole dW rows.
// The order changes no result: each tile's sums do not depend on when it runs.
#pragma once

#include <cstdint>

#include "common/block_scan.cuh"
#include "grouped_gemm/group_rows.cuh"

namespace cake_moe {
namespace sm90 {

// One work unit: a chunk of a group's token rows for one output tile.
struct WgradUnit {
  int32_t e;           // group
  int32_t row0;        // first token row of the chunk
  int32_t kb;          // 64-row k-blocks in the chunk (0: empty group -> zeros)
  int32_t tail;        // valid rows of the last k-block (1..64)
  int32_t n0, k0;      // output tile origin in dW[e]
  int32_t chunk;       // chunk index inside the group
  int32_t num_chunks;  // chunks of the group (> 1: split tile)
  int32_t slot;        // workspace slot of the split tile (num_chunks > 1)
};

// Ragged unit scheduler: per-CTA shared-memory prefix over groups of the packed
// (units | split tiles << 32) counts, built from offs on the device; a unit id
// maps to (group, chunk, tile) by binary search. More groups than kTableSize:
// each table slot covers `span` consecutive groups (short linear walk).
template <int kBM, int kBN, int kSplitQ, int kMinChunkKB, int kTableSize>
struct WgradScheduler {
  static_assert(kTableSize % 32 == 0 && kTableSize / 32 <= 32, "two-level scan: at most 32 chunks of 32 slots");
  // Tile rows per raster band: X tiles (BN = 256 wide) cost twice G tiles (BM = 128), so a
  // wave of 132 units is cheapest at ~sqrt(2 * 132) = 16 rows by 8 columns of tiles.
  static constexpr int32_t kBandN = 16;
  static constexpr int32_t kBandMinKB = 32;  // 2048 token rows per unit
  static constexpr int kScratch = 16;  // int64 words for the row-count reduction (<= 16 warps)
  static constexpr uint32_t kSmemBytes = (kTableSize + 32 + kScratch) * sizeof(uint64_t);

  const uint64_t* table;
  const int32_t* offs;
  int32_t num_groups, capacity, leading_zero;
  int32_t tiles_k, tiles_nk;
  int32_t span, num_slots;
  int32_t kb_chunk_max;
  int32_t total_units;

  __device__ __forceinline__ void group_rows(int32_t e, int32_t& begin, int32_t& end) const { ragged_group_rows(offs, e, leading_zero, capacity, begin, end); }

  // chunking of a group of m rows: num_chunks chunks of chunk_kb k-blocks (last shorter)
  __device__ __forceinline__ void split(int32_t m, int32_t& num_chunks, int32_t& chunk_kb) const {
    const int32_t kb = (m + 63) / 64;
    if (kb <= kb_chunk_max) {
      num_chunks = 1;
      chunk_kb = kb;
      return;
    }
    const int32_t s = (kb + kb_chunk_max - 1) / kb_chunk_max;
    chunk_kb = (kb + s - 1) / s;
    num_chunks = (kb + chunk_kb - 1) / chunk_kb;
  }

  __device__ __forceinline__ uint64_t packed_count(int32_t e) const {
    int32_t b, en, s, ckb;
    group_rows(e, b, en);
    split(en - b, s, ckb);
    return static_cast<uint64_t>(static_cast<uint32_t>(s * tiles_nk)) |
           (static_cast<uint64_t>(s > 1 ? tiles_nk : 0) << 32);
  }

  // Collective (all threads of the CTA; contains __syncthreads). Params: the kernel's
  // GroupedGemmWgradParams, or any type with its offs, num_groups, sum_m_capacity,
  // offs_has_leading_zero, n and k (the host-side tests run this code on one emulated CTA).
  template <typename Params>
  __device__ __forceinline__ void init(uint64_t* smem_table, const Params& p, int32_t workers, int32_t slots) {
    uint64_t* chunk_total = smem_table + kTableSize;
    int64_t* scratch = reinterpret_cast<int64_t*>(chunk_total + 32);
    table = smem_table;
    offs = p.offs;
    num_groups = max(p.num_groups, 0);
    capacity = max(p.sum_m_capacity, 0);
    leading_zero = p.offs_has_leading_zero;
    const int32_t tiles_n = (max(p.n, 0) + kBM - 1) / kBM;
    tiles_k = (max(p.k, 0) + kBN - 1) / kBN;
    tiles_nk = tiles_n * tiles_k;
    span = num_groups > 0 ? (num_groups + kTableSize - 1) / kTableSize : 1;
    num_slots = (num_groups + span - 1) / span;

    const int32_t lane = threadIdx.x & 31;
    const int32_t warp = threadIdx.x >> 5;
    const int32_t num_warps = blockDim.x >> 5;

    // 1) total rows R (exact sum of the clamped group sizes)
    int64_t part = 0;
    for (int32_t e = threadIdx.x; e < num_groups; e += blockDim.x) {
      int32_t b, en;
      group_rows(e, b, en);
      part += en - b;
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) part += __shfl_xor_sync(0xffffffffu, part, d);
    if (lane == 0 && warp < kScratch) scratch[warp] = part;
    __syncthreads();
    int64_t rows = 0;
    for (int32_t w = 0; w < num_warps && w < kScratch; ++w) rows += scratch[w];

    // 2) chunk length (k-blocks)
    if (slots <= 0 || tiles_nk == 0) {
      kb_chunk_max = 0x7fffffff;
    } else {
      const int64_t work = static_cast<int64_t>(tiles_nk) * rows;  // row-tiles
      const int64_t w = static_cast<int64_t>(max(workers, 1)) * kSplitQ * 64;
      const int64_t a = (work + w - 1) / w;
      const int64_t s = static_cast<int64_t>(slots) * 64;
      const int64_t b = (work + s - 1) / s;
      int64_t kb = a > b ? a : b;
      if (kb < kMinChunkKB) kb = kMinChunkKB;
      kb_chunk_max = kb > 0x7fffffff ? 0x7fffffff : static_cast<int32_t>(kb);
    }

    // 3) packed counts per table slot
    for (int32_t j = threadIdx.x; j < num_slots; j += blockDim.x) {
      const int32_t e_end = min(num_groups, (j + 1) * span);
      uint64_t c = 0;
      for (int32_t e = j * span; e < e_end; ++e) c += packed_count(e);
      smem_table[j] = c;
    }
    __syncthreads();

    // 4) inclusive scan of the packed counts. No wrap to guard, even with overlapping groups:
    // a group's first chunk adds tiles_nk units, E * tiles_nk stays below 2^31 (the host's
    // check_grouped_dims), and the chunk length bounds the later chunks to about
    // workers * kSplitQ units in all (kb_chunk_max >= tiles_nk * R / (workers * kSplitQ * 64)).
    block_inclusive_scan(smem_table, num_slots, chunk_total);
    total_units = num_slots > 0 ? static_cast<int32_t>(static_cast<uint32_t>(smem_table[num_slots - 1])) : 0;
  }

  __device__ __forceinline__ WgradUnit decode(int32_t u) const {
    const uint32_t uu = static_cast<uint32_t>(u);
    int32_t lo = 0, hi = num_slots - 1;
    while (lo < hi) {
      const int32_t mid = (lo + hi) >> 1;
      if (static_cast<uint32_t>(table[mid]) > uu) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const uint64_t prev = lo > 0 ? table[lo - 1] : 0;
    int32_t local = static_cast<int32_t>(uu - static_cast<uint32_t>(prev));
    int32_t split_base = static_cast<int32_t>(prev >> 32);
    int32_t e = lo * span;
    int32_t b, en, s, ckb;
    for (;;) {  // at most `span` steps; ends because u < total_units
      group_rows(e, b, en);
      split(en - b, s, ckb);
      const int32_t units = s * tiles_nk;
      if (local < units) break;
      local -= units;
      if (s > 1) split_base += tiles_nk;
      ++e;
    }
    const int32_t m = en - b;
    const int32_t c = local / tiles_nk;
    const int32_t t = local - c * tiles_nk;
    const int32_t band = ckb >= kBandMinKB ? kBandN : 1;            // tile rows per band
    const int32_t band_first = t / (band * tiles_k) * band;        // first tile row of t's band
    const int32_t band_rows = min(band, tiles_nk / tiles_k - band_first);
    const int32_t within = t - band_first * tiles_k;
    const int32_t n_idx = band_first + within % band_rows;
    const int32_t k_idx = within / band_rows;
    const int32_t kb_total = (m + 63) / 64;
    const int32_t kb_begin = c * ckb;
    WgradUnit w;
    w.e = e;
    w.row0 = b + kb_begin * 64;
    w.kb = min(ckb, kb_total - kb_begin);
    const int32_t rows_in_chunk = min(w.kb * 64, m - kb_begin * 64);
    w.tail = w.kb > 0 ? rows_in_chunk - (w.kb - 1) * 64 : 64;
    w.n0 = n_idx * kBM;
    w.k0 = k_idx * kBN;
    w.chunk = c;
    w.num_chunks = s;
    w.slot = s > 1 ? split_base + t : -1;
    return w;
  }
};

}  // namespace sm90
}  // namespace cake_moe
