// The family-B GEMM tilings as the host sees them: one entry per form suffix (forms.py
// MXFP4_MOE_TILINGS, MXFP4_MOE_SM90_TILINGS), read from the device-side tiling types so the launch
// geometry (threads, shared memory, CTA rows) never drifts from what the kernels were built with.
#pragma once
#include <string>

namespace cake_moe::mxfp4_moe {

struct TilingInfo {
  int bn, bm, threads, smem;
  const char* suffix;  // form name suffix (forms.py MXFP4_MOE_TILINGS)
  bool persistent;     // one CTA per SM walks the work items (else one CTA per item)
  int w_box_bytes;     // > 0: the weight tiles arrive by TMA in boxes this wide (x bm rows)
  int resident_k;      // > 0: a GEMM2 form keeping the token rows resident, for K up to this
  bool looks_ahead;    // as GEMM1, can request its first weight stages before its wait (Tiling::kLooksAhead)
  bool gemm1_ring, gemm2_ring;  // the GEMM's scale codes through the code ring (Sm90Tiling)
  bool gemm2_only;     // compiled as GEMM2 only (forms.py): the resident-row forms, `n8_shortk2`
  bool splits_k;       // as GEMM1, can compute units as two K halves (Tiling::kGemm1SplitsK)
  int k_stage;         // K per pipeline stage
};

// The tiling of a GEMM form suffix; ValueError naming the known suffixes for any other. The wg*
// forms are sm_90a only (Python checks the device); the *_rb ones serve GEMM2 at K <= 512.
TilingInfo tiling_for(const std::string& tile);

}  // namespace cake_moe::mxfp4_moe
