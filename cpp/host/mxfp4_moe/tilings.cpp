#include "host/mxfp4_moe/tilings.hpp"

#include <vector>

#include "mxfp4_moe/params.hpp"
#include "runtime/errors.hpp"

namespace cake_moe::mxfp4_moe {
namespace {

template <typename Cfg>
constexpr TilingInfo info(const char* suffix, bool persistent = false, bool gemm2_only = false) {
  return {Cfg::kBN, Cfg::kBM, Cfg::kThreads, Cfg::kSmemBytes, suffix, persistent,
          Cfg::kTmaWeights ? Cfg::kWBoxBytes : 0, Cfg::kResidentB ? Cfg::kMaxResidentK : 0,
          !persistent && Cfg::kLooksAhead, Cfg::kGemm1CodeRing, Cfg::kGemm2CodeRing,
          gemm2_only || Cfg::kResidentB,
          !persistent && Cfg::kGemm1SplitsK, Cfg::kKStage};
}

}  // namespace

TilingInfo tiling_for(const std::string& tile) {
  static const std::vector<TilingInfo> kTilings = {
      info<DecodeTiling>("n8"),
      info<DecodeNarrowTiling>("n8_narrow"),
      info<DecodeNarrow4Tiling>("n8_narrow4"),
      info<DecodeShortKTiling>("n8_shortk"),
      info<DecodeShortK2Tiling>("n8_shortk2", false, true),
      info<MidTiling>("n32"),
      info<PrefillTiling>("n64"),
      info<Sm90PrefillTiling>("wg128", true),
      info<Sm90Prefill4WgTiling>("wg128x4", true),
      info<Sm90Mid4WgTiling>("wg64x4", true),
      info<Sm90Mid32Tiling>("wg32x4", true),
      info<Sm90Prefill160Tiling>("wg160x3", true),
      info<Sm90Mid96Tiling>("wg96x4", true),
      info<Sm90Prefill4WgResidentBTiling>("wg128x4_rb", true),
      info<Sm90Mid4WgResidentBTiling>("wg64x4_rb", true),
      info<Sm90Mid32ResidentBTiling>("wg32x4_rb", true),
      info<Sm90Prefill160ResidentBTiling>("wg160x3_rb", true),
      info<Sm90Mid96ResidentBTiling>("wg96x4_rb", true),
  };
  std::string names;
  for (const TilingInfo& t : kTilings) {
    if (t.suffix == tile) return t;
    names += names.empty() ? "" : ", ";
    names += t.suffix;
  }
  throw ValueError("tile must be one of " + names + ", got " + tile);
}

}  // namespace cake_moe::mxfp4_moe
