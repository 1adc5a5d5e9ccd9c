// The grouped-GEMM Launch interface over a runtime::BoundKernel: the launchers fill `bound_`.
#pragma once
#include <cstdint>
#include <string>

#include "host/grouped_gemm/problem.hpp"
#include "runtime/bound_kernel.hpp"

namespace cake_moe::grouped_gemm {

template <typename Params>
class BoundKernel : public Launch {
 public:
  void launch(std::uintptr_t stream) const override { bound_.launch(stream); }
  const std::string& form() const override { return bound_.form; }

 protected:
  runtime::BoundKernel<Params> bound_;
};

}  // namespace cake_moe::grouped_gemm
