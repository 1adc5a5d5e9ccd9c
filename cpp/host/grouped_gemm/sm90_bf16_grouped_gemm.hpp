// Host side of the sm_90a BF16 grouped GEMM, fwd and dgrad (device: cpp/kernels/grouped_gemm/
// sm90_bf16_grouped_gemm.cuh). The Args object owns the kernel parameters, tensor maps included,
// encoded once at construction; launch() is a single cuLaunchKernelEx.
#pragma once
#include <memory>
#include <string>

#include "grouped_gemm/params.cuh"
#include "host/grouped_gemm/heuristics_sm90.hpp"
#include "host/grouped_gemm/problem.hpp"

namespace cake_moe::grouped_gemm {

std::unique_ptr<Launch> make_sm90_launch(const Problem& p, Sm90Tile tile);

// The form name of a tile: gg_sm90_<op>_<BM>x<BN>.
std::string sm90_form_name(Op op, const Sm90Tile& tile);

}  // namespace cake_moe::grouped_gemm
