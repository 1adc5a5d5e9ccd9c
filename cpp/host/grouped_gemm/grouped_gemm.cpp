#include "host/grouped_gemm/grouped_gemm.hpp"

#include <string>

#include "host/grouped_gemm/heuristics_sm90.hpp"
#include "host/grouped_gemm/sm90_bf16_grouped_gemm.hpp"
#include "runtime/driver.hpp"
#include "runtime/errors.hpp"

namespace cake_moe::grouped_gemm {

const char* op_name(Op op) {
  switch (op) {
    case Op::kFwd: return "fwd";
    case Op::kDgrad: return "dgrad";
    default: return "wgrad";
  }
}

namespace {
void check_bounds(const Problem& p) {
  if (p.n <= 0 || p.k <= 0 || p.n % 8 || p.k % 8) throw ValueError("N and K must be positive multiples of 8");
  if (p.num_groups < 0) throw ValueError("the group count must be >= 0");
  if (p.rows < 0 || p.rows >= (int64_t(1) << 31)) throw ValueError("the row count must be below 2^31");
}
}  // namespace

int64_t workspace_bytes(const Problem&) { return 0; }

std::unique_ptr<Launch> prepare(const Problem& p) {
  check_bounds(p);
  if (p.op != Op::kWgrad && (p.rows == 0 || p.num_groups == 0)) return nullptr;
  const std::string arch = runtime::device_arch(p.device);
  if (arch == "90a" && p.op != Op::kWgrad) {
    const int32_t n_out = p.op == Op::kDgrad ? p.k : p.n;
    return make_sm90_launch(p, choose_sm90_tile(p.rows, p.num_groups, n_out));
  }
  throw NotImplemented(std::string("grouped GEMM ") + op_name(p.op) + " has no form for sm_" + arch + " in this build");
}

}  // namespace cake_moe::grouped_gemm
