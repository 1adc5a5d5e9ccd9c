// The CTA emulator itself (cta_emulator.hpp): the warp operations give CUDA's values, the order
// of CTAs and threads follows CAKE_EMU_ORDER, and the two device bugs it reports instead of
// running on (threads of a warp in different warp operations, a barrier some threads never
// reach) end the program with their message (ctest matches it).
#include "cta_emulator.hpp"

#include <string>
#include <vector>

#include "host_test.hpp"

using cake_moe::emu::Cta;

namespace {

void test_warp_operations() {
  const int threads = 96;
  std::vector<int> up(threads), xr(threads), bc(threads), far(threads);
  std::vector<unsigned> match(threads), ballot(threads), sum(threads);
  Cta::run(threads, [&] {
    const int t = int(threadIdx.x), lane = t % 32;
    up[t] = __shfl_up_sync(0xffffffffu, t, 3);
    xr[t] = __shfl_xor_sync(0xffffffffu, t, 5);
    far[t] = __shfl_xor_sync(0xffffffffu, t, 33);  // a source past the warp: the caller's own value
    bc[t] = __shfl_sync(0xffffffffu, t, 7);
    match[t] = __match_any_sync(0xffffffffu, lane / 4);
    ballot[t] = __ballot_sync(0xffffffffu, lane % 3 == 0);
    sum[t] = __reduce_add_sync(0xffffffffu, 0x80000000u + unsigned(lane));
  });
  bool ok = true;
  for (int t = 0; t < threads; ++t) {
    const int lane = t % 32, base = t - lane;
    unsigned want_ballot = 0;
    for (int l = 0; l < 32; l += 3) want_ballot |= 1u << l;
    ok = ok && up[t] == (lane >= 3 ? t - 3 : t) && xr[t] == base + (lane ^ 5) && far[t] == t &&
         bc[t] == base + 7 && match[t] == 0xFu << (lane / 4 * 4) && ballot[t] == want_ballot &&
         sum[t] == 496u;  // 32 x 2^31 wraps to 0, plus 0 + .. + 31
  }
  EXPECT(ok);
}

void test_order() {
  std::vector<int> blocks, threads;
  Cta::launch(3, 64, [&] {
    if (threadIdx.x == 0) blocks.push_back(int(blockIdx.x));
    if (blockIdx.x == 0) threads.push_back(int(threadIdx.x));
    __syncthreads();
  });
  const bool reverse = Cta::reversed();
  EXPECT(blocks == (reverse ? std::vector<int>{2, 1, 0} : std::vector<int>{0, 1, 2}));
  EXPECT(threads.size() == 64 && threads.front() == (reverse ? 63 : 0) && threads.back() == (reverse ? 0 : 63));
}

// Both end the program with the emulator's message.
void mismatched_warp_operations() {
  Cta::run(32, [&] {
    if (threadIdx.x < 16) {
      (void)__shfl_sync(0xffffffffu, 1, 0);
    } else {
      (void)__ballot_sync(0xffffffffu, 1);
    }
  });
}
void barrier_not_reached() {
  Cta::run(64, [&] {
    if (threadIdx.x < 32) __syncthreads();
  });
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "all";
  if (cake_moe::host_test::selected(which, "warp_operations")) test_warp_operations();
  if (cake_moe::host_test::selected(which, "order")) test_order();
  if (which == "mismatched_warp_operations") mismatched_warp_operations();
  if (which == "barrier_not_reached") barrier_not_reached();
  return cake_moe::host_test::report(which);
}
