// Host side of the portable BF16 grouped GEMM (device: cpp/kernels/grouped_gemm/
// portable_bf16_grouped_gemm.cuh): mma.sync forms for arches without a native form (and the
// sm_90a weight gradient until its native form is bound).
#pragma once
#include <memory>

#include "host/grouped_gemm/problem.hpp"

namespace cake_moe::grouped_gemm {

std::unique_ptr<Launch> make_portable_launch(const Problem& p);

}  // namespace cake_moe::grouped_gemm
