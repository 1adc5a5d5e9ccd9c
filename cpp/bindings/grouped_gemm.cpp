// Bindings of family A (ragged BF16 grouped GEMM). Python (cake_moe.grouped_gemm) validates
// dtypes, shapes, devices, strides and bounds and passes device addresses; the plan object owns
// the encoded kernel parameters.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <memory>
#include <mutex>

#include "bindings/common.hpp"
#include "host/grouped_gemm/grouped_gemm.hpp"

namespace cake_moe::bindings {
namespace {

using grouped_gemm::Launch;

// A prepared grouped GEMM. launch() enqueues on the given stream: no allocation, no sync.
struct GroupedGemmPlan {
  std::unique_ptr<Launch> launch;  // null when there is nothing to compute (no rows)
  // launch_to() points the launch at its output and enqueues it as one step: threads sharing a
  // kept plan must not interleave the two, whether or not the interpreter serialises calls.
  std::mutex retarget;
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

// An operand's outer element stride as Python passes it: 0 (= packed: the dim has at most one
// entry) or a positive multiple of 8 (16-byte TMA strides). Python checks the same; this keeps
// a bad stride from any tensor map.
int64_t outer_stride(int64_t s, const char* name) {
  if (s < 0 || s % 8 != 0)
    throw ValueError(std::string(name) + ": outer strides must be 0 or positive multiples of 8 elements, got " +
                     std::to_string(s));
  return s;
}

// A device address, checked for alignment (0 is allowed: an empty tensor's, where no kernel runs
// or nothing of it is read).
template <typename T>
T* address(std::uintptr_t ptr, std::uintptr_t alignment, const char* name) {
  if (ptr % alignment != 0)
    throw ValueError(std::string(name) + " must be " + std::to_string(alignment) + "-byte aligned");
  return reinterpret_cast<T*>(ptr);
}

// The operands arrive as device addresses and element strides, not as DLPack tensors: the
// Python layer has validated the tensors (dtype, device, shape, strides, bounds, overlap) and
// keeps them alive as long as the plan, and an import per tensor cost more host time than the
// rest of a one-shot call.
grouped_gemm::Problem problem(int op, int variant, int device, std::uintptr_t a, int64_t a_row_stride,
                              std::uintptr_t b, int64_t b_row_stride, int64_t b_expert_stride, std::uintptr_t out,
                              std::uintptr_t offs, bool leading_zero, int32_t num_groups, int32_t n, int32_t k,
                              int64_t rows, bool out_f32, std::uintptr_t workspace, int64_t workspace_bytes,
                              const std::string& form, bool zero_unrouted_rows) {
  grouped_gemm::Problem p = shape(op, variant, num_groups, n, k, rows, out_f32);
  if (device < 0) throw ValueError("device index must be >= 0");
  p.device = device;
  p.a = address<const void>(a, 16, "a");
  p.b = address<const void>(b, 16, "b");
  p.out = address<void>(out, 16, "out");
  p.offs = address<const int32_t>(offs, 4, "offs");
  p.a_row_stride = outer_stride(a_row_stride, "a");
  p.b_row_stride = outer_stride(b_row_stride, "b");
  p.b_expert_stride = p.op != grouped_gemm::Op::kWgrad ? outer_stride(b_expert_stride, "b") : 0;
  p.offs_leading_zero = leading_zero;
  p.form = form;
  p.zero_unrouted_rows = zero_unrouted_rows;
  if (workspace) {
    if (workspace_bytes < 0) throw ValueError("workspace_bytes must be >= 0");
    p.workspace = address<void>(workspace, 256, "workspace");
    p.workspace_bytes = workspace_bytes;
  }
  return p;
}

}  // namespace

void bind_grouped_gemm(nb::module_& m) {
  nb::class_<GroupedGemmPlan>(m, "GroupedGemmPlan")
      .def("launch", [](const GroupedGemmPlan& self, std::uintptr_t stream) {
        if (self.launch) self.launch->launch(stream);
      }, nb::arg("stream"))
      // the same launch into another output of the plan's shape and dtype, which the caller
      // checked (Python: a fresh tensor, or the one the plan was checked with)
      .def("launch_to", [](GroupedGemmPlan& self, std::uintptr_t stream, std::uintptr_t out) {
        if (!self.launch) return;
        void* target = address<void>(out, 16, "out");
        std::lock_guard<std::mutex> hold(self.retarget);
        self.launch->set_output(target);
        self.launch->launch(stream);
      }, nb::arg("stream"), nb::arg("out"))
      .def_prop_ro("form", [](const GroupedGemmPlan& self) {
        return self.launch ? self.launch->form() : std::string("none (no rows)");
      });

  m.def("grouped_gemm_prepare",
        [](int op, int variant, int device, std::uintptr_t a, int64_t a_row_stride, std::uintptr_t b,
           int64_t b_row_stride, int64_t b_expert_stride, std::uintptr_t out, std::uintptr_t offs, bool leading_zero,
           int32_t num_groups, int32_t n, int32_t k, int64_t rows, bool out_f32, std::uintptr_t workspace,
           int64_t workspace_bytes, const std::string& form, bool zero_unrouted_rows) {
          auto p = problem(op, variant, device, a, a_row_stride, b, b_row_stride, b_expert_stride, out, offs,
                           leading_zero, num_groups, n, k, rows, out_f32, workspace, workspace_bytes, form,
                           zero_unrouted_rows);
          auto plan = std::make_unique<GroupedGemmPlan>();
          plan->launch = grouped_gemm::prepare(p);
          return plan;
        },
        nb::arg("op"), nb::arg("variant"), nb::arg("device"), nb::arg("a"), nb::arg("a_row_stride"), nb::arg("b"),
        nb::arg("b_row_stride"), nb::arg("b_expert_stride"), nb::arg("out"), nb::arg("offs"),
        nb::arg("leading_zero"), nb::arg("num_groups"), nb::arg("n"), nb::arg("k"), nb::arg("rows"),
        nb::arg("out_f32"), nb::arg("workspace"), nb::arg("workspace_bytes"), nb::arg("form") = "",
        nb::arg("zero_unrouted_rows") = false);

  m.def("grouped_gemm_workspace_bytes",
        [](int op, int variant, int32_t num_groups, int32_t n, int32_t k, int64_t rows, bool out_f32, int device,
           const std::string& form) {
          grouped_gemm::Problem p = shape(op, variant, num_groups, n, k, rows, out_f32);
          p.device = device;
          p.form = form;
          return grouped_gemm::workspace_bytes(p);
        },
        nb::arg("op"), nb::arg("variant"), nb::arg("num_groups"), nb::arg("n"), nb::arg("k"), nb::arg("rows"),
        nb::arg("out_f32"), nb::arg("device"), nb::arg("form") = "");

  m.def("grouped_gemm_sm90_default_form",
        [](int op, int variant, int32_t num_groups, int32_t n, int32_t k, int64_t rows, bool out_f32, int sms,
           bool narrow_memory) {
          if (sms <= 0) throw ValueError("sms must be positive");
          return grouped_gemm::sm90_default_form(shape(op, variant, num_groups, n, k, rows, out_f32), sms,
                                                 narrow_memory);
        },
        nb::arg("op"), nb::arg("variant"), nb::arg("num_groups"), nb::arg("n"), nb::arg("k"), nb::arg("rows"),
        nb::arg("out_f32"), nb::arg("sms"), nb::arg("narrow_memory"),
        "the sm_90a form the default choice binds on a part with `sms` SMs (host facts only, no device)");
}

}  // namespace cake_moe::bindings
