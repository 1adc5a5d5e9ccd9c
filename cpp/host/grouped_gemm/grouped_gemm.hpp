// Family A entry point on the host: picks the form for the device's arch and the problem, and
// returns a bound launch (prepared once, enqueued many times).
#pragma once
#include <memory>

#include "host/grouped_gemm/problem.hpp"

namespace cake_moe::grouped_gemm {

// Validates what keeps the launch memory-safe (Python validated the rest) and binds the form.
// Returns nullptr when there is nothing to launch (no rows; or no group, unless the problem
// zeroes the rows no group covers).
std::unique_ptr<Launch> prepare(const Problem& p);

// Scratch bytes the wgrad of this problem needs in `workspace` (0 for fwd/dgrad).
int64_t workspace_bytes(const Problem& p);

}  // namespace cake_moe::grouped_gemm
