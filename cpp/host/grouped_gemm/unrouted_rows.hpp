// The launch that zeroes a fwd / dgrad output's rows that no group covers, then runs its GEMM.
#pragma once
#include <memory>

#include "host/grouped_gemm/problem.hpp"

namespace cake_moe::grouped_gemm {

// `gemm` may be null (no group: every row is zeroed). set_output() moves both kernels.
std::unique_ptr<Launch> with_unrouted_rows_zeroed(std::unique_ptr<Launch> gemm, const Problem& p);

}  // namespace cake_moe::grouped_gemm
