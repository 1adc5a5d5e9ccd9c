// Rows of one group of a ragged batch, read from device-side offsets: shared by every grouped
// GEMM scheduler (sm_90a fwd/dgrad, sm_90a wgrad, portable).
#pragma once
#include <cstdint>

namespace cake_moe {

// Rows [begin, end) of group e. `offs` holds E cumulative ends (leading_zero = 0) or E + 1
// entries m_indptr (1). Both bounds are clamped into [0, capacity] and end >= begin, so
// malformed offsets can never address outside the tensors (they stay a caller error).
__device__ __forceinline__ void ragged_group_rows(const int32_t* offs, int32_t e, int32_t leading_zero,
                                                  int32_t capacity, int32_t& begin, int32_t& end) {
  int32_t b, en;
  if (leading_zero) {
    b = __ldg(offs + e);
    en = __ldg(offs + e + 1);
  } else {
    b = e == 0 ? 0 : __ldg(offs + e - 1);
    en = __ldg(offs + e);
  }
  b = min(max(b, 0), capacity);
  en = min(max(en, b), capacity);
  begin = b;
  end = en;
}

}  // namespace cake_moe
