// Host side of the sm_90a BF16 grouped GEMM weight gradient (device: cpp/kernels/grouped_gemm/
// sm90_bf16_grouped_gemm_wgrad.cuh, contract: wgrad_params.cuh). The Args own the two tensor
// maps; the caller owns the zero-initialised workspace (every launch leaves it zero again).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "host/grouped_gemm/problem.hpp"

namespace cake_moe::grouped_gemm {

// Workspace bytes of the split-K reduction on `device` (4 split-tile slots per SM).
int64_t sm90_wgrad_workspace_bytes(int device);

// The form name of the wgrad variant, one-CTA or cluster-pair: gg_sm90_wgrad_<det|fast>[_c2]
// (the one spelling that the launch, `form=` requests and the workspace size all use).
std::string sm90_wgrad_form(Variant variant, bool pair);

// pair: the cluster-pair form (gg_sm90_wgrad_<variant>_c2: CTA pairs multicast X; bf16 output,
// no split, no workspace); the default on short groups (use_sm90_wgrad_pair, heuristics_sm90.hpp).
std::unique_ptr<Launch> make_sm90_wgrad_launch(const Problem& p, bool pair = false);

}  // namespace cake_moe::grouped_gemm
