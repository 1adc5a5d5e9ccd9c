// Device code run on the host, for ctest on machines without a GPU: a launch's CTAs run one after
// the other, and every CUDA thread of a CTA is a fiber (ucontext) of one OS thread, switched only
// where the device code synchronises (__syncthreads, warp shuffles and votes), so the schedulers'
// and the routing's collective code runs from its own headers, unchanged, in a deterministic order.
// Atomics are plain read-modify-writes (no fiber switches inside one); __shared__ variables are
// function statics, shared by a CTA's fibers and left as the previous CTA wrote them.
//
// Include it before any device header: it gives the CUDA spellings those headers use (qualifiers,
// threadIdx / blockIdx / blockDim, __ldg, min / max, the block barrier, warp shuffles, votes and
// reductions, atomicAdd, uint4) host meanings. What it does not emulate (mbarriers, wgmma, TMA, inline
// PTX outside __CUDA_ARCH__ guards) fails to compile, by design.
#pragma once
#include <ucontext.h>

#include <array>
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
#define __shared__ static

namespace cake_moe::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

class Cta {
 public:
  // Runs body() as every thread of a CTA of `threads` threads (a multiple of 32) to completion.
  static void run(int threads, const std::function<void()>& body) { launch(1, threads, body); }

  // A launch of `blocks` CTAs, run one after the other (kernels that wait for other CTAs of
  // their own launch deadlock here).
  static void launch(int blocks, int threads, const std::function<void()>& body) {
    if (threads <= 0 || threads % 32 != 0) fail("a CTA of whole warps");
    if (blocks <= 0) fail("a launch of at least one CTA");
    for (int b = 0; b < blocks; ++b) {
      Cta cta(threads, b, blocks, body);
      Cta* outer = current_cta();
      current_cta() = &cta;
      cta.schedule();
      current_cta() = outer;
    }
  }

  static Cta& self() {
    if (current_cta() == nullptr) fail("device code called outside Cta::run");
    return *current_cta();
  }

  int thread() const { return running_; }
  int threads() const { return threads_; }
  int block() const { return block_index_; }
  int blocks() const { return blocks_; }

  // __syncthreads: every thread of the CTA.
  void block_barrier() { wait_at(block_); }

  // A warp's lanes exchange one value each: the value of lane `src_lane(lane)`. Two slot sets
  // used in turn need one barrier per exchange: a lane writing a set again has passed the next
  // exchange's barrier, which every lane reaches only after reading this one.
  template <typename T, typename SrcLane>
  T exchange(T v, SrcLane src_lane) {
    const uint64_t* slots = publish(v);
    T out;
    std::memcpy(&out, &slots[src_lane(running_ % 32)], sizeof(T));
    return out;
  }

  // Every lane's value, in lane order (votes, matches and reductions over the warp).
  template <typename T>
  std::array<T, 32> gather(T v) {
    std::array<T, 32> all;
    const uint64_t* slots = publish(v);
    for (size_t l = 0; l < 32; ++l) std::memcpy(&all[l], &slots[l], sizeof(T));
    return all;
  }

 private:
  // Writes the lane's value into its warp's next slot set and waits for every lane's: the set.
  template <typename T>
  const uint64_t* publish(T v) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t), "a register-sized value");
    const int me = running_, warp = me / 32;
    uint64_t* slots = &slot_[size_t(parity_[me]) * threads_ + size_t(warp) * 32];
    parity_[me] ^= 1;
    slots[me % 32] = 0;
    std::memcpy(&slots[me % 32], &v, sizeof(T));
    wait_at(warps_[warp]);  // every lane has written
    return slots;
  }

  struct Barrier {
    int expected = 0, arrived = 0;
    unsigned generation = 0;
  };

  Cta(int threads, int block, int blocks, const std::function<void()>& body)
      : threads_(threads), block_index_(block), blocks_(blocks), body_(body), fibers_(threads), stacks_(threads), done_(threads, false),
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

  int threads_, block_index_, blocks_;
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
inline Dim3 block_index() { return Dim3{unsigned(Cta::self().block()), 0, 0}; }
inline Dim3 grid_dim() { return Dim3{unsigned(Cta::self().blocks()), 1, 1}; }
inline void full_mask(unsigned mask) {
  if (mask != 0xffffffffu) std::abort();  // the device code here only uses whole-warp masks
}

}  // namespace cake_moe::emu

#define threadIdx (::cake_moe::emu::thread_index())
#define blockDim (::cake_moe::emu::block_dim())
#define blockIdx (::cake_moe::emu::block_index())
#define gridDim (::cake_moe::emu::grid_dim())

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
  ::cake_moe::emu::full_mask(mask);
  return ::cake_moe::emu::Cta::self().exchange(v, [delta](int lane) { return lane >= delta ? lane - delta : lane; });
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  ::cake_moe::emu::full_mask(mask);
  return ::cake_moe::emu::Cta::self().exchange(v, [lane_mask](int lane) { return (lane ^ lane_mask) & 31; });
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src) {
  ::cake_moe::emu::full_mask(mask);
  return ::cake_moe::emu::Cta::self().exchange(v, [src](int) { return src & 31; });
}
template <typename T>
unsigned __match_any_sync(unsigned mask, T v) {
  ::cake_moe::emu::full_mask(mask);
  const auto all = ::cake_moe::emu::Cta::self().gather(v);
  unsigned peers = 0;
  for (int l = 0; l < 32; ++l) peers |= all[size_t(l)] == v ? 1u << l : 0u;
  return peers;
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  ::cake_moe::emu::full_mask(mask);
  const auto all = ::cake_moe::emu::Cta::self().gather(predicate != 0);
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l) bits |= all[size_t(l)] ? 1u << l : 0u;
  return bits;
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
  ::cake_moe::emu::full_mask(mask);
  unsigned sum = 0;
  for (unsigned x : ::cake_moe::emu::Cta::self().gather(v)) sum += x;
  return sum;
}
inline int __ffs(int x) { return __builtin_ffs(x); }

// CUDA's 16-byte vector type (vector_types.h), for the device code's 16-byte stores.
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }

// No fiber switches inside: a read-modify-write is atomic to the other threads.
template <typename T>
T atomicAdd(T* address, T v) {
  const T old = *address;
  *address = T(old + v);
  return old;
}
