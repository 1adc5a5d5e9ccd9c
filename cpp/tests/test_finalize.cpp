// The shared MoE engine's finalize (moe/moe_finalize.cuh), run from its own header on emulated
// launches against SPEC §5 written out here: per token, in slot order, acc = fma(BF16 route row,
// FP32 weight, acc) over the slots with a local route, rounded once to BF16; exact zeros for a
// token without one; weights BF16, FP32 or packed in the route words (and tokens whose two slots
// cancel, which tell the fused multiply-add from a product rounded first); top_k 1 to 32 (the kernel
// loads slots eight at a time); hidden sizes that leave the last column block partly idle. The
// outputs must match bit for bit, and nothing outside them may be written.
#include "cta_emulator.hpp"  // first: the device header below reads its CUDA spellings

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "host_test.hpp"
#include "moe/moe_finalize.cuh"

using cake_moe::emu::Cta;
using cake_moe::host_test::uniform;
using namespace cake_moe::moe;

namespace {

float bf16_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
uint16_t bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

// A value of varied sign, full mantissa and magnitudes 2^-16 .. 2^16 apart, so that the FP32
// sums round, and differently in another order or without the fused multiply-add (now and then
// an exact zero).
float random_value() {
  if (uniform(0, 15) == 0) return 0.f;
  const float mag = std::ldexp(float(uniform(1 << 23, (1 << 24) - 1)), int(uniform(-16, 16)) - 23);
  return uniform(0, 1) ? mag : -mag;
}
uint16_t random_bf16() { return bf16_bits(random_value()); }

void check(int32_t tokens, int32_t hidden, int32_t top_k, RouteWeights kind, int32_t rows) {
  // route rows [rows, hidden], each route's row or -1, weights of the kind asked
  std::vector<uint16_t> route_rows(size_t(rows) * hidden);
  for (uint16_t& v : route_rows) v = random_bf16();
  std::vector<int32_t> route_row(size_t(tokens) * top_k), packed(route_row.size());
  std::vector<uint16_t> w_bf16(route_row.size());
  std::vector<float> w_f32(route_row.size());
  // Row 1 is row 0 negated: a token whose two first slots take them with one weight sums to the
  // residual x w - FP32(x w) with the fused multiply-add, to zero without it (FP32 weights).
  if (rows >= 2)
    for (int32_t c = 0; c < hidden; ++c) route_rows[size_t(hidden) + size_t(c)] = route_rows[size_t(c)] ^ 0x8000u;
  for (size_t i = 0; i < route_row.size(); ++i) {
    const int32_t t = int32_t(i) / top_k, s = int32_t(i) % top_k;
    const bool local = rows > 0 && t % 7 != 3 && uniform(0, 4) != 0;  // token 3, 10, ..: no local route
    route_row[i] = local ? int32_t(uniform(0, rows - 1)) : -1;
    w_bf16[i] = random_bf16();
    w_f32[i] = random_value();
    if (t % 5 == 1 && rows >= 2 && top_k >= 2) {  // the cancelling pair
      route_row[i] = s < 2 ? s : -1;
      if (s == 1) {
        w_f32[i] = w_f32[i - 1];
        w_bf16[i] = w_bf16[i - 1];
      }
    }
    packed[i] = int32_t(uint32_t(uniform(0, 895)) << 16 | w_bf16[i]);
  }
  const void* weights = kind == RouteWeights::kF32 ? static_cast<const void*>(w_f32.data())
                        : kind == RouteWeights::kBf16 ? static_cast<const void*>(w_bf16.data())
                                                      : static_cast<const void*>(packed.data());
  constexpr uint16_t kPoison = 0x7FC1;  // a NaN no result has
  constexpr size_t kGuard = 64;
  std::vector<uint16_t> out(size_t(tokens) * hidden + 2 * kGuard, kPoison);
  const FinalizeParams p{route_rows.data(), route_row.data(), weights, out.data() + kGuard, tokens, hidden, top_k,
                         int32_t(kind)};
  const int column_blocks = (hidden / 8 + kFinalizeThreads - 1) / kFinalizeThreads;
  Cta::launch(tokens, kFinalizeThreads, [&] { finalize(p); }, column_blocks);

  bool same = true;
  for (int32_t t = 0; t < tokens; ++t)
    for (int32_t c = 0; c < hidden; ++c) {
      float acc = 0.f;
      for (int32_t s = 0; s < top_k; ++s) {
        const size_t route = size_t(t) * top_k + size_t(s);
        if (route_row[route] < 0) continue;
        const float w = kind == RouteWeights::kF32 ? w_f32[route] : bf16_to_float(w_bf16[route]);
        acc = std::fma(bf16_to_float(route_rows[size_t(route_row[route]) * hidden + size_t(c)]), w, acc);
      }
      same = same && out[kGuard + size_t(t) * hidden + size_t(c)] == bf16_bits(acc);
    }
  for (size_t i = 0; i < kGuard; ++i) same = same && out[i] == kPoison && out[out.size() - 1 - i] == kPoison;
  EXPECT(same);
  if (!same) std::printf("  tokens=%d hidden=%d top_k=%d kind=%d rows=%d\n", tokens, hidden, top_k, int(kind), rows);
}

void test_finalize() {
  for (const RouteWeights kind : {RouteWeights::kBf16, RouteWeights::kF32, RouteWeights::kPacked})
    for (const int32_t top_k : {1, 2, 8, 9, 16, 32}) {
      check(5, 1024, top_k, kind, 40);   // 128 threads x 8 columns: one whole column block
      check(3, 1032, top_k, kind, 12);   // a second block with one thread's columns
      check(2, 8, top_k, kind, 3);       // one thread per token
      check(4, 136, top_k, kind, 0);     // no local route at all: zeros
    }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "all";
  if (cake_moe::host_test::selected(which, "finalize")) test_finalize();
  return cake_moe::host_test::report(which);
}
