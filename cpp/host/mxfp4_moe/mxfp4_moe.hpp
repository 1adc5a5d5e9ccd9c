// Host side of family B (MXFP4 x MXFP8 SiTU routed MoE): a plan binds the caller's buffers once,
// resolves its kernels (five forms, seven with a second GEMM pair; the routing is one launch or
// three), and run() only enqueues them (no allocation, no sync).
// Python (cake_moe.mxfp4_moe) has validated every shape, dtype, device and overlap.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace cake_moe::mxfp4_moe {

struct Problem {
  const uint8_t* x = nullptr;         // [T, H] E4M3
  const uint8_t* x_sf = nullptr;      // [T, H/32] UE8M0
  const int32_t* topk_ids = nullptr;  // [T, k] ids, or packed routes
  const void* topk_weights = nullptr; // [T, k] bf16 / f32; null when packed
  int32_t weight_kind = 0;            // moe::RouteWeights
  const uint8_t* w1 = nullptr;        // prepared [L, 2I, H/2]
  const uint8_t* w1_sf = nullptr;     // [L, 2I, H/32]
  const uint8_t* w2 = nullptr;        // prepared [L, H, I/2]
  const uint8_t* w2_sf = nullptr;     // [L, H, I/32]
  const uint8_t* w1_sf_max = nullptr; // [L] largest code of each expert's w1_sf, or null (GemmParams::sf_max)
  const uint8_t* w2_sf_max = nullptr; // [L] same for w2_sf
  const float* beta = nullptr;        // [L]
  const float* linear_beta = nullptr; // [L]
  uint8_t* workspace = nullptr;
  int64_t workspace_bytes = 0;
  uint16_t* out = nullptr;            // [T, H] bf16
  int32_t tokens = 0, hidden = 0, inter = 0, num_experts = 0, num_local = 0, local_offset = 0, top_k = 0;
  std::string gemm1_tile = "n8";      // GEMM form suffixes from the decision table (Python _decide:
  std::string gemm2_tile = "n8";      // n8, n8_narrow, n8_narrow4, n8_shortk, n32, n64, wg128, wg128x4,
                                      // wg64x4, wg32x4); both share one block_n
  bool tile_sync = false;             // GEMM2 waits per token tile, not for all of GEMM1 (the decision
                                      // table's; honoured only when both forms are one-CTA-per-item)
  // A second sm_90a wgmma GEMM pair (empty: none), launched after each GEMM of the first: the routing
  // kernel picks one pair from the actual counts (moe::RouteParams::alt_block_n), the other exits.
  std::string gemm1_alt_tile, gemm2_alt_tile;
  int32_t tile_cost = 0, alt_tile_cost = 0;  // cost per token tile of each pair (> 0 with a second pair)
  int device = 0;
};

class Plan {
 public:
  virtual ~Plan() = default;
  virtual void run(std::uintptr_t stream) const = 0;
  virtual const std::string& forms() const = 0;
  // The width per expert: each GEMM pair reads its own tile list (two pairs, several-CTA routing,
  // CAKE_MOE_TILE_SPLIT not 0). Python reads it to find the second pair's choice word.
  virtual bool split_width() const = 0;
};

std::unique_ptr<Plan> make_plan(const Problem& p);

int64_t workspace_bytes(int64_t tokens, int64_t hidden, int64_t inter, int64_t num_local, int64_t top_k);

}  // namespace cake_moe::mxfp4_moe
