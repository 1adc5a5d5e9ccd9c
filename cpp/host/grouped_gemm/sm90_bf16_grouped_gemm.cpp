#include "host/grouped_gemm/sm90_bf16_grouped_gemm.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "host/grouped_gemm/bound_kernel.hpp"
#include "runtime/driver.hpp"
#include "runtime/errors.hpp"
#include "runtime/images.hpp"
#include "runtime/launch.hpp"
#include "runtime/tensor_map.hpp"

namespace cake_moe::grouped_gemm {
namespace {

// CAKE_MOE_GG_SPLIT_TAIL=0 keeps a short last wave in whole tiles (same bits; for comparisons),
// read when a launch is prepared.
bool split_tail_enabled() {
  const char* e = std::getenv("CAKE_MOE_GG_SPLIT_TAIL");
  return !(e && e[0] == '0');
}

class Sm90Launch final : public BoundKernel<sm90::GroupedGemmParams> {
 public:
  Sm90Launch(const Problem& p, Sm90Tile tile) : n_out_(p.op == Op::kDgrad ? p.k : p.n), rows_(p.rows) {
    // Tensor-map encoding needs a current context: autograd's backward runs on its own threads.
    runtime::ScopedDevice scope(p.device);
    const bool dgrad = p.op == Op::kDgrad;
    const sm90::GroupedGemmGeometry geo{tile.bm, tile.bn, tile.stages, tile.split_tail};
    bound_.form = sm90_form_name(p.op, tile);
    const std::string kernel = "cake_" + bound_.form + "x64_s" + std::to_string(tile.stages);  // forms.py's entry
    const int64_t k_red = dgrad ? p.n : p.k;
    std::memset(bound_.params.get(), 0, sizeof(sm90::GroupedGemmParams));
    sm90::GroupedGemmParams& q = *bound_.params;
    q.tmap_a = runtime::encode_bf16_rows(p.a, k_red, p.rows, uint32_t(geo.box_a_rows()), p.a_row_stride);
    q.tmap_b = runtime::encode_bf16_experts(p.b, p.num_groups, p.n, p.k, uint32_t(geo.box_b_rows(dgrad)),
                                           p.b_row_stride, p.b_expert_stride);  // w [E, N, K]
    q.tmap_d = output_map(p.out);
    if (tile.split_tail && !dgrad)
      q.tmap_b_half = runtime::encode_bf16_experts(p.b, p.num_groups, p.n, p.k, uint32_t(geo.box_b_half_rows()),
                                                   p.b_row_stride, p.b_expert_stride);
    q.out = p.out;
    q.offs = p.offs;
    q.num_groups = p.num_groups;
    q.sum_m_capacity = int32_t(p.rows);
    q.n_out = int32_t(n_out_);
    q.k_red = int32_t(k_red);
    q.offs_has_leading_zero = p.offs_leading_zero ? 1 : 0;
    q.split_tail = tile.split_tail && split_tail_enabled() ? 1 : 0;

    bound_.kernel = runtime::get_kernel(bound_.form, kernel.c_str(), p.device);
    runtime::set_max_dynamic_smem(bound_.kernel, p.device, geo.smem_bytes());
    // Persistent: one CTA per SM at most; the tile count is only known on the device, so the
    // grid is min(SMs, an upper bound on work units) and surplus CTAs exit at once (with the
    // split tail a unit may be half a tile).
    const int64_t n_tiles = (n_out_ + tile.bn - 1) / tile.bn;
    const int64_t upper = ((p.rows + tile.bm - 1) / tile.bm + p.num_groups) * n_tiles * (tile.split_tail ? 2 : 1);
    bound_.cfg.grid[0] = unsigned(std::max<int64_t>(1, std::min<int64_t>(runtime::device_sm_count(p.device), upper)));
    bound_.cfg.block[0] = sm90::GroupedGemmGeometry::kThreads;
    bound_.cfg.smem_bytes = geo.smem_bytes();
    bound_.device = p.device;
  }

  void follow_as_dependent() override { bound_.cfg.pdl = true; }

  void set_output(void* out) override {
    sm90::GroupedGemmParams& q = *bound_.params;
    if (q.out == out) return;
    runtime::ScopedDevice scope(bound_.device);
    q.tmap_d = output_map(out);
    q.out = out;
  }

 private:
  int64_t n_out_, rows_;
  CUtensorMap output_map(void* out) const { return runtime::encode_bf16_rows(out, n_out_, rows_, 64); }
};

}  // namespace

std::string sm90_form_name(Op op, const Sm90Tile& tile) {
  return std::string("gg_sm90_") + op_name(op) + "_" + std::to_string(tile.bm) + "x" + std::to_string(tile.bn);
}

std::unique_ptr<Launch> make_sm90_launch(const Problem& p, Sm90Tile tile) {
  if (p.op == Op::kWgrad) throw NotImplemented("the sm_90a fwd/dgrad launcher does not run wgrad");
  return std::make_unique<Sm90Launch>(p, tile);
}

}  // namespace cake_moe::grouped_gemm
