// Family A entry point on the host: picks the form for the device's arch and the problem, and
// returns a bound launch (prepared once, enqueued many times).
#pragma once
#include <memory>
#include <string>

#include "host/grouped_gemm/problem.hpp"

namespace cake_moe::grouped_gemm {

// Validates what keeps the launch memory-safe (Python validated the rest) and binds the form.
// Returns nullptr when there is nothing to launch (no rows; or no group, unless the problem
// zeroes the rows no group covers).
std::unique_ptr<Launch> prepare(const Problem& p);

// Scratch bytes the wgrad of this problem needs in `workspace` (0 for fwd/dgrad).
int64_t workspace_bytes(const Problem& p);

// The sm_90a form the default choice binds for the problem's op, variant and sizes on a part with
// `sms` SMs and narrow DRAM bandwidth per SM or not: host facts only, no device (what
// `cake-moe decide --grouped-gemm` prints).
std::string sm90_default_form(const Problem& p, int sms, bool narrow_memory);

}  // namespace cake_moe::grouped_gemm
