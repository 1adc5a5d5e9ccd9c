// One CTA of device code run on the host, for ctest on machines without a GPU: every CUDA thread
// is a fiber (ucontext) of one OS thread, switched only where the device code synchronises
// (__syncthreads, warp shuffles), so the schedulers' collective set-up and index arithmetic run
// from their own headers, unchanged, in a deterministic order.
//
// Include it before any device header: it gives the CUDA spellings those headers use (qualifiers,
// threadIdx / blockDim, __ldg, min / max, the block barrier and the warp shuffles) host meanings.
// What it does not emulate (atomics, mbarriers, asm) fails to compile, by design.
#pragma once
#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#define __device__
#define __host__
#define __forceinline__ inline

namespace cake_moe::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

class Cta {
 public:
  // Runs body() as every thread of a CTA of `threads` threads (a multiple of 32) to completion.
  static void run(int threads, const std::function<void()>& body) {
    if (threads <= 0 || threads % 32 != 0) fail("a CTA of whole warps");
    Cta cta(threads, body);
    Cta* outer = current_cta();
    current_cta() = &cta;
    cta.schedule();
    current_cta() = outer;
  }

  static Cta& self() {
    if (current_cta() == nullptr) fail("device code called outside Cta::run");
    return *current_cta();
  }

  int thread() const { return running_; }
  int threads() const { return threads_; }

  // __syncthreads: every thread of the CTA.
  void block_barrier() { wait_at(block_); }

  // A warp's lanes exchange one value each: the value of lane `src_lane(lane)`. Two slot sets
  // used in turn need one barrier per exchange: a lane writing a set again has passed the next
  // exchange's barrier, which every lane reaches only after reading this one.
  template <typename T, typename SrcLane>
  T exchange(T v, SrcLane src_lane) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t), "a register-sized value");
    const int me = running_, warp = me / 32, lane = me % 32;
    uint64_t* slots = &slot_[size_t(parity_[me]) * threads_];
    parity_[me] ^= 1;
    std::memcpy(&slots[me], &v, sizeof(T));
    wait_at(warps_[warp]);  // every lane has written
    T out;
    std::memcpy(&out, &slots[warp * 32 + src_lane(lane)], sizeof(T));
    return out;
  }

 private:
  struct Barrier {
    int expected = 0, arrived = 0;
    unsigned generation = 0;
  };

  Cta(int threads, const std::function<void()>& body)
      : threads_(threads), body_(body), fibers_(threads), stacks_(threads), done_(threads, false),
        slot_(2 * size_t(threads), 0), parity_(threads, 0), warps_(threads / 32), waiting_(threads) {
    block_.expected = threads;
    for (Barrier& w : warps_) w.expected = 32;
  }

  static Cta*& current_cta() {
    static Cta* cta = nullptr;
    return cta;
  }
  [[noreturn]] static void fail(const char* what) {
    std::fprintf(stderr, "cta_emulator: %s\n", what);
    std::abort();
  }

  static void entry() {
    Cta& cta = self();
    cta.body_();
    cta.done_[cta.running_] = true;
  }  // returns to uc_link: the scheduler

  void wait_at(Barrier& b) {
    const unsigned generation = b.generation;
    if (++b.arrived == b.expected) {
      b.arrived = 0;
      ++b.generation;
      return;
    }
    waiting_[running_] = {&b, generation};
    swapcontext(&fibers_[running_], &scheduler_);  // resumed once the barrier opened
    waiting_[running_] = {nullptr, 0};
  }

  void schedule() {
    constexpr size_t kStack = 128 * 1024;  // (left uninitialised: only the pages a thread uses are touched)
    for (int t = 0; t < threads_; ++t) {
      stacks_[t].reset(new char[kStack]);
      getcontext(&fibers_[t]);
      fibers_[t].uc_stack.ss_sp = stacks_[t].get();
      fibers_[t].uc_stack.ss_size = kStack;
      fibers_[t].uc_link = &scheduler_;
      makecontext(&fibers_[t], &Cta::entry, 0);
    }
    // Round robin over the threads that can go on: a thread runs until it waits at a barrier or
    // ends. A pass in which none could go on, with some not ended, is a deadlock: threads wait at
    // barriers the others never reach.
    for (;;) {
      bool ran = false, all_done = true;
      for (running_ = 0; running_ < threads_; ++running_) {
        if (done_[running_]) continue;
        const auto [barrier, generation] = waiting_[running_];
        if (barrier == nullptr || barrier->generation != generation) {
          swapcontext(&scheduler_, &fibers_[running_]);
          ran = true;
        }
        all_done = all_done && done_[running_];
      }
      if (all_done) return;
      if (!ran) fail("deadlock: some threads wait at a barrier the others never reach");
    }
  }

  int threads_;
  std::function<void()> body_;
  std::vector<ucontext_t> fibers_;
  std::vector<std::unique_ptr<char[]>> stacks_;
  std::vector<bool> done_;
  std::vector<uint64_t> slot_;
  std::vector<uint8_t> parity_;  // the slot set of each thread's next exchange
  std::vector<Barrier> warps_;
  std::vector<std::pair<const Barrier*, unsigned>> waiting_;  // the barrier and generation a thread waits for
  Barrier block_;
  ucontext_t scheduler_{};
  int running_ = 0;
};

inline Dim3 thread_index() { return Dim3{unsigned(Cta::self().thread()), 0, 0}; }
inline Dim3 block_dim() { return Dim3{unsigned(Cta::self().threads()), 1, 1}; }

}  // namespace cake_moe::emu

#define threadIdx (::cake_moe::emu::thread_index())
#define blockDim (::cake_moe::emu::block_dim())
#define blockIdx (::cake_moe::emu::Dim3{0, 0, 0})
#define gridDim (::cake_moe::emu::Dim3{1, 1, 1})

inline void __syncthreads() { ::cake_moe::emu::Cta::self().block_barrier(); }

template <typename T>
T __ldg(const T* p) {
  return *p;
}

// CUDA's min / max overloads follow the usual arithmetic conversions of their two operands.
template <typename A, typename B>
std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return C(b) < C(a) ? C(b) : C(a);
}
template <typename A, typename B>
std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return C(a) < C(b) ? C(b) : C(a);
}

template <typename T>
T __shfl_up_sync(unsigned mask, T v, int delta) {
  if (mask != 0xffffffffu) std::abort();
  return ::cake_moe::emu::Cta::self().exchange(v, [delta](int lane) { return lane >= delta ? lane - delta : lane; });
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  if (mask != 0xffffffffu) std::abort();
  return ::cake_moe::emu::Cta::self().exchange(v, [lane_mask](int lane) { return (lane ^ lane_mask) & 31; });
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src) {
  if (mask != 0xffffffffu) std::abort();
  return ::cake_moe::emu::Cta::self().exchange(v, [src](int) { return src & 31; });
}
