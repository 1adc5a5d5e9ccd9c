// Bindings of family A (ragged BF16 grouped GEMM). Python (cake_moe.grouped_gemm) validates
// dtypes, shapes, devices and bounds; the plan object owns the encoded kernel parameters.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <memory>
#include <optional>

#include "bindings/common.hpp"
#include "host/grouped_gemm/grouped_gemm.hpp"

namespace cake_moe::bindings {
namespace {

using grouped_gemm::Launch;

// A prepared grouped GEMM. launch() enqueues on the given stream: no allocation, no sync.
struct GroupedGemmPlan {
  std::unique_ptr<Launch> launch;  // null when there is nothing to compute (no rows)
};

// The op, variant and sizes of a request (no tensors yet).
grouped_gemm::Problem shape(int op, int variant, int32_t num_groups, int32_t n, int32_t k, int64_t rows, bool out_f32) {
  if (op < 0 || op > 2) throw ValueError("op must be 0 (fwd), 1 (dgrad) or 2 (wgrad)");
  if (variant < 0 || variant > 1) throw ValueError("variant must be 0 (det) or 1 (fast)");
  grouped_gemm::Problem p;
  p.op = grouped_gemm::Op(op);
  p.variant = grouped_gemm::Variant(variant);
  p.num_groups = num_groups;
  p.n = n;
  p.k = k;
  p.rows = rows;
  p.out_f32 = out_f32;
  return p;
}

// The element stride of dim `dim` of an operand whose last dim is contiguous: a positive
// multiple of 8 (16-byte TMA strides), or 0 (= packed) where the dim has at most one entry and
// its stride is never used. Python checks the same; this keeps a bad stride from any map.
int64_t outer_stride(const Tensor& t, size_t dim, const char* name) {
  if (t.ndim() == 0 || (t.shape(t.ndim() - 1) > 1 && t.stride(t.ndim() - 1) != 1))
    throw ValueError(std::string(name) + " must have a unit last-axis stride");
  if (t.shape(dim) <= 1) return 0;
  const int64_t s = t.stride(dim);
  if (s <= 0 || s % 8 != 0)
    throw ValueError(std::string(name) + ": outer strides must be positive multiples of 8 elements, got " +
                     std::to_string(s));
  return s;
}

grouped_gemm::Problem problem(int op, int variant, Tensor a, Tensor b, Tensor out, Tensor offs, bool leading_zero,
                              int32_t num_groups, int32_t n, int32_t k, int64_t rows, bool out_f32,
                              std::optional<Tensor> workspace, const std::string& form) {
  grouped_gemm::Problem p = shape(op, variant, num_groups, n, k, rows, out_f32);
  p.device = tensor_device(out, "out");
  tensor_device(a, "a", p.device);
  tensor_device(b, "b", p.device);
  tensor_device(offs, "offs", p.device);
  for (const Tensor* t : {&a, &b, &out}) require_aligned(*t, "operand", 16);
  p.a = a.data();
  p.b = b.data();
  p.a_row_stride = outer_stride(a, 0, "a");
  const bool weights = p.op != grouped_gemm::Op::kWgrad;  // b is w [E, N, K], else x [rows, K]
  p.b_row_stride = outer_stride(b, weights ? 1 : 0, "b");
  p.b_expert_stride = weights ? outer_stride(b, 0, "b") : 0;
  p.out = out.data();
  p.offs = static_cast<const int32_t*>(offs.data());
  p.offs_leading_zero = leading_zero;
  p.form = form;
  if (workspace) {
    tensor_device(*workspace, "workspace", p.device);
    require_aligned(*workspace, "workspace", 256);
    p.workspace = workspace->data();
    p.workspace_bytes = nbytes(*workspace);
  }
  return p;
}

}  // namespace

void bind_grouped_gemm(nb::module_& m) {
  nb::class_<GroupedGemmPlan>(m, "GroupedGemmPlan")
      .def("launch", [](const GroupedGemmPlan& self, std::uintptr_t stream) {
        if (self.launch) self.launch->launch(stream);
      }, nb::arg("stream"))
      .def_prop_ro("form", [](const GroupedGemmPlan& self) {
        return self.launch ? self.launch->form() : std::string("none (no rows)");
      });

  m.def("grouped_gemm_prepare",
        [](int op, int variant, Tensor a, Tensor b, Tensor out, Tensor offs, bool leading_zero, int32_t num_groups,
           int32_t n, int32_t k, int64_t rows, bool out_f32, std::optional<Tensor> workspace, const std::string& form) {
          auto p = problem(op, variant, a, b, out, offs, leading_zero, num_groups, n, k, rows, out_f32, workspace, form);
          auto plan = std::make_unique<GroupedGemmPlan>();
          plan->launch = grouped_gemm::prepare(p);
          return plan;
        },
        nb::arg("op"), nb::arg("variant"), nb::arg("a"), nb::arg("b"), nb::arg("out"), nb::arg("offs"),
        nb::arg("leading_zero"), nb::arg("num_groups"), nb::arg("n"), nb::arg("k"), nb::arg("rows"),
        nb::arg("out_f32"), nb::arg("workspace").none(), nb::arg("form") = "");

  m.def("grouped_gemm_workspace_bytes",
        [](int op, int variant, int32_t num_groups, int32_t n, int32_t k, int64_t rows, bool out_f32, int device) {
          grouped_gemm::Problem p = shape(op, variant, num_groups, n, k, rows, out_f32);
          p.device = device;
          return grouped_gemm::workspace_bytes(p);
        });
}

}  // namespace cake_moe::bindings
