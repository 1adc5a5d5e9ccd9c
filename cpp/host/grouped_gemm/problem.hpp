// A ragged grouped-GEMM request as the host launchers see it (family A, SPEC §6), after
// Python validated shapes, dtypes, devices and 32-bit bounds.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace cake_moe::grouped_gemm {

enum class Op : int { kFwd = 0, kDgrad = 1, kWgrad = 2 };
enum class Variant : int { kDet = 0, kFast = 1 };

// The name Python gives the variant ("det" / "fast"), as form names and messages spell it.
inline const char* variant_name(Variant v) { return v == Variant::kFast ? "fast" : "det"; }

struct Problem {
  Op op = Op::kFwd;
  Variant variant = Variant::kDet;  // only the wgrad has a fast form
  const void* a = nullptr;    // fwd: x [cap, K]; dgrad and wgrad: g [cap, N]
  const void* b = nullptr;    // fwd and dgrad: w [E, N, K]; wgrad: x [cap, K]
  void* out = nullptr;        // fwd: y [cap, N]; dgrad: dx [cap, K]; wgrad: dw [E, N, K]
  const int32_t* offs = nullptr;
  bool offs_leading_zero = false;  // offs holds E + 1 entries (m_indptr)
  bool out_f32 = false;            // wgrad output dtype
  int32_t num_groups = 0;          // E
  int32_t n = 0;                   // weight rows (w [E, N, K])
  int32_t k = 0;                   // weight columns
  int64_t rows = 0;                // capacity of the packed row dimension (x.shape[0])
  // Element strides of the operands' outer dims (their last dim is contiguous; multiples of 8,
  // so 16-byte TMA strides). 0: packed (a: its width; b: K for rows, N * K for experts).
  int64_t a_row_stride = 0;        // between rows of a
  int64_t b_row_stride = 0;        // between rows of b (w: along N; wgrad's x: packed rows)
  int64_t b_expert_stride = 0;     // between experts of w (fwd, dgrad)
  void* workspace = nullptr;       // wgrad split-K scratch, from workspace_bytes()
  int64_t workspace_bytes = 0;
  int device = 0;
  bool zero_unrouted_rows = false; // fwd / dgrad: zero the output's rows past the last group end first
  std::string form;                // empty: the heuristic picks; else a form name to force
};

// A bound launch: tensor maps encoded and the kernel resolved once; launch() only enqueues.
// set_output() points it at another output of the same shape and dtype (the caller checked
// the address: 16-byte aligned, overlapping no operand); a launch already there is unchanged.
class Launch {
 public:
  virtual ~Launch() = default;
  virtual void launch(std::uintptr_t stream) const = 0;
  virtual void set_output(void* out) = 0;
  virtual const std::string& form() const = 0;
  // Launch as a programmatic dependent of the kernel enqueued just before, where the form waits
  // for it before touching memory (the sm_90a fwd / dgrad kernels); a no-op for the others.
  virtual void follow_as_dependent() {}
};

const char* op_name(Op op);

}  // namespace cake_moe::grouped_gemm
