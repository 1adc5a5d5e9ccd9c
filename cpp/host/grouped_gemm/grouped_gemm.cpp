#include "host/grouped_gemm/grouped_gemm.hpp"

#include <cstdlib>
#include <string>

#include "host/grouped_gemm/heuristics_sm90.hpp"
#include "host/grouped_gemm/portable_bf16_grouped_gemm.hpp"
#include "host/grouped_gemm/sm90_bf16_grouped_gemm.hpp"
#include "host/grouped_gemm/sm90_bf16_grouped_gemm_wgrad.hpp"
#include "host/grouped_gemm/unrouted_rows.hpp"
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
  // the schedulers round a group's rows up to whole tiles in 32 bits: 2^31 - 256 leaves a tile of headroom
  if (p.rows < 0 || p.rows > (int64_t(1) << 31) - 256) throw ValueError("the row count must be at most 2^31 - 256");
}
}  // namespace

// CAKE_MOE_GG_FORCE_PORTABLE=1 runs the portable forms on sm_90a too (validation of the path
// that serves the arches without a native form).
bool force_portable() {
  static const bool v = [] {
    const char* e = std::getenv("CAKE_MOE_GG_FORCE_PORTABLE");
    return e && e[0] == '1';
  }();
  return v;
}

bool native_sm90(int device) { return !force_portable() && runtime::device_arch(device) == "90a"; }

int64_t workspace_bytes(const Problem& p) {
  if (p.op != Op::kWgrad || runtime::device_arch(p.device) != "90a") return 0;
  // only the splitting sm_90a form holds a split-K workspace (by name, or the default's choice):
  // the cluster-pair form never splits a group and the portable form never splits K
  const bool split = p.form.empty() ? native_sm90(p.device) && !use_sm90_wgrad_pair(p.rows, p.num_groups, p.out_f32)
                                    : p.form == sm90_wgrad_form(p.variant, false);
  return split ? sm90_wgrad_workspace_bytes(p.device) : 0;
}

namespace {
// An explicitly requested form (benchmarks and tuning): gg_portable_<op>, gg_sm90_<op>_<BM>x<BN>,
// gg_sm90_wgrad_<variant>, gg_sm90_wgrad_<variant>_c2.
std::unique_ptr<Launch> prepare_form(const Problem& p) {
  const std::string op = op_name(p.op);
  if (p.form == "gg_portable_" + op) return make_portable_launch(p);
  if (runtime::device_arch(p.device) == "90a") {
    for (const bool pair : {false, true})
      if (p.op == Op::kWgrad && p.form == sm90_wgrad_form(p.variant, pair)) return make_sm90_wgrad_launch(p, pair);
    for (const Sm90Tile& t : kSm90Tiles)
      if (p.op != Op::kWgrad && p.form == sm90_form_name(p.op, t)) return make_sm90_launch(p, t);
    const Variant other = p.variant == Variant::kDet ? Variant::kFast : Variant::kDet;
    for (const bool pair : {false, true})
      if (p.op == Op::kWgrad && p.form == sm90_wgrad_form(other, pair))
        throw ValueError("form '" + p.form + "' is the " + variant_name(other) +
                         " variant's wgrad; this call asks for variant '" + variant_name(p.variant) + "'");
  }
  throw ValueError("form '" + p.form + "' does not serve grouped GEMM " + op + " on sm_" +
                   runtime::device_arch(p.device) + " (see `cake-moe info`)");
}

// The fwd / dgrad tile the default choice takes on sm_90a (the dgrad's output width is K).
Sm90Tile default_sm90_tile(const Problem& p, int sms, bool narrow_memory) {
  const int32_t n_out = p.op == Op::kDgrad ? p.k : p.n;
  return choose_sm90_tile(p.rows, p.num_groups, n_out, p.op == Op::kDgrad, sms, narrow_memory);
}

// The GEMM of a problem with rows and groups.
std::unique_ptr<Launch> prepare_gemm(const Problem& p) {
  if (!p.form.empty()) return prepare_form(p);
  if (native_sm90(p.device)) {
    if (p.op == Op::kWgrad) return make_sm90_wgrad_launch(p, use_sm90_wgrad_pair(p.rows, p.num_groups, p.out_f32));
    const runtime::DeviceInfo& dev = runtime::device_info(p.device);
    return make_sm90_launch(p, default_sm90_tile(p, dev.sm_count, dev.narrow_memory()));
  }
  return make_portable_launch(p);
}

}  // namespace

std::string sm90_default_form(const Problem& p, int sms, bool narrow_memory) {
  if (p.op == Op::kWgrad) return sm90_wgrad_form(p.variant, use_sm90_wgrad_pair(p.rows, p.num_groups, p.out_f32));
  return sm90_form_name(p.op, default_sm90_tile(p, sms, narrow_memory));
}

std::unique_ptr<Launch> prepare(const Problem& p) {
  check_bounds(p);
  if (p.zero_unrouted_rows && p.op == Op::kWgrad) throw ValueError("zero_unrouted_rows applies to fwd and dgrad");
  if (p.rows == 0) return nullptr;
  if (p.num_groups == 0 && !p.zero_unrouted_rows) return nullptr;  // Python zero-fills an empty wgrad
  std::unique_ptr<Launch> gemm = p.num_groups == 0 ? nullptr : prepare_gemm(p);
  return p.zero_unrouted_rows ? with_unrouted_rows_zeroed(std::move(gemm), p) : std::move(gemm);
}

}  // namespace cake_moe::grouped_gemm
