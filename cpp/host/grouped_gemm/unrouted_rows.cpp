#include "host/grouped_gemm/unrouted_rows.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "grouped_gemm/unrouted_rows_params.hpp"
#include "runtime/bound_kernel.hpp"
#include "runtime/driver.hpp"
#include "runtime/images.hpp"

namespace cake_moe::grouped_gemm {
namespace {

// Two CTAs per SM, a warp per row: the kernel reads the bounds on the device, so the grid is
// sized for every row, and when every row is in a group each CTA only reads the bounds.
constexpr int64_t kCtasPerSm = 2;

class UnroutedRowsZeroed final : public Launch {
 public:
  UnroutedRowsZeroed(std::unique_ptr<Launch> gemm, const Problem& p) : gemm_(std::move(gemm)) {
    if (gemm_) gemm_->follow_as_dependent();  // its launch overlaps the zeroing, its work follows
    const int64_t width = p.op == Op::kFwd ? p.n : p.k;  // bf16 columns of the output
    UnroutedRowsParams& z = *zero_.params;
    z.out = p.out;
    z.offs = p.offs;
    z.row_bytes = width * 2;
    z.row_chunks = int32_t(width / 8);
    z.rows = int32_t(p.rows);
    z.num_offs = p.num_groups == 0 ? 0 : p.num_groups + (p.offs_leading_zero ? 1 : 0);
    z.leading_zero = p.offs_leading_zero ? 1 : 0;
    zero_.device = p.device;
    zero_.form = "gg_unrouted_rows";
    zero_.kernel = runtime::get_kernel(zero_.form, "cake_gg_zero_unrouted_rows", p.device);  // (in p.device's context)
    const int64_t ctas = kCtasPerSm * runtime::device_sm_count(p.device);
    constexpr int64_t kRowsPerCta = kUnroutedRowsThreads / 32;
    zero_.cfg.grid[0] = unsigned(std::max<int64_t>(1, std::min(ctas, (p.rows + kRowsPerCta - 1) / kRowsPerCta)));
    zero_.cfg.block[0] = kUnroutedRowsThreads;
  }

  // The zeroing first: malformed offsets may give a group rows past the last end, and those
  // keep the GEMM's values (a dependent GEMM waits for the zeroing before its first access).
  void launch(std::uintptr_t stream) const override {
    zero_.launch(stream);
    if (gemm_) gemm_->launch(stream);
  }
  // The GEMM's first: it may throw (a tensor map to encode), and then neither kernel moves.
  void set_output(void* out) override {
    if (gemm_) gemm_->set_output(out);
    zero_.params->out = out;
  }
  const std::string& form() const override { return gemm_ ? gemm_->form() : zero_.form; }

 private:
  std::unique_ptr<Launch> gemm_;
  runtime::BoundKernel<UnroutedRowsParams> zero_;
};

}  // namespace

std::unique_ptr<Launch> with_unrouted_rows_zeroed(std::unique_ptr<Launch> gemm, const Problem& p) {
  return std::make_unique<UnroutedRowsZeroed>(std::move(gemm), p);
}

}  // namespace cake_moe::grouped_gemm
