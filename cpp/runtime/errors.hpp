// Exceptions that cross into Python. nanobind maps std::invalid_argument to ValueError and
// std::runtime_error to RuntimeError; NotImplemented is registered as NotImplementedError.
#pragma once
#include <stdexcept>
#include <string>

namespace cake_moe {

struct ValueError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A well-formed request that this build does not serve (missing form, unbuilt arch).
struct NotImplemented : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Driver or device problem; the message carries the CUDA error name and the op/form.
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace cake_moe
