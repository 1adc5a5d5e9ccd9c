// Device code run on the host, for ctest on machines without a GPU: a launch's CTAs run one after
// the other, and every CUDA thread of a CTA is a fiber (ucontext) of one OS thread, switched only
// where the device code synchronises (__syncthreads, warp shuffles and votes), so the schedulers'
// and the routing's collective code runs from its own headers, unchanged, in a deterministic order.
//
// What the order can hide, and how the tests meet it: __shared__ variables are function statics
// (a CTA finds them as the previous CTA left them) and threads run between barriers in index
// order, so a missing initialisation or barrier can pass in one order. CAKE_EMU_ORDER=reverse
// runs the CTAs of a launch and the threads of a CTA in the opposite order; ctest runs every
// emulated test both ways. Not emulated: dependent launches (a launch starts after the one before
// it has completed, so griddepcontrol.wait orders nothing here), memory ordering and fences
// (atomics are plain read-modify-writes, with no fiber switch inside one), and partial warps
// (a warp operation names the whole warp).
//
// Include it before any device header: it gives the CUDA spellings those headers use (qualifiers,
// threadIdx / blockIdx / blockDim, __ldg, min / max, the block barrier, warp shuffles, votes and
// reductions, atomicAdd, uint4, __uint_as_float, __fmaf_rn) host meanings (cpp/tests/shim/ holds the
// few cuda_bf16.h names the device code uses). What it does not emulate (mbarriers, wgmma, TMA,
// inline PTX outside __CUDA_ARCH__ guards) fails to compile, by design.
#pragma once
#include <ucontext.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
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

// The warp operations: all lanes of a warp must be in the same one (a device bug otherwise).
enum class WarpOp : int { kShfl, kShflUp, kShflXor, kMatchAny, kBallot, kReduceAdd };

// Ends the program (status 3) with the message: no destructors run, since the caller may be a
// fiber whose stack they would free.
[[noreturn]] inline void fail(const std::string& what) {
  std::fflush(stdout);  // the test's earlier lines first
  std::fprintf(stderr, "cta_emulator: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

class Cta {
 public:
  // Runs body() as every thread of a CTA of `threads` threads (a multiple of 32) to completion.
  static void run(int threads, const std::function<void()>& body) { launch(1, threads, body); }

  // A launch of `blocks` CTAs (a grid of blocks x rows), run one after the other (kernels that
  // wait for other CTAs of their own launch deadlock here).
  static void launch(int blocks, int threads, const std::function<void()>& body, int rows = 1) {
    if (threads <= 0 || threads % 32 != 0) fail("a CTA of whole warps");
    if (blocks <= 0 || rows <= 0) fail("a launch of at least one CTA");
    const int ctas = blocks * rows;
    for (int i = 0; i < ctas; ++i) {
      const int c = reversed() ? ctas - 1 - i : i;
      Cta cta(threads, Dim3{unsigned(c % blocks), unsigned(c / blocks), 0}, Dim3{unsigned(blocks), unsigned(rows), 1},
              body);
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

  // CAKE_EMU_ORDER=reverse: CTAs and threads in descending index order.
  static bool reversed() {
    static const bool r = [] {
      const char* v = std::getenv("CAKE_EMU_ORDER");
      return v != nullptr && std::string(v) == "reverse";
    }();
    return r;
  }

  int thread() const { return running_; }
  int threads() const { return threads_; }
  Dim3 block() const { return block_index_; }
  Dim3 grid() const { return grid_; }

  // __syncthreads: every thread of the CTA.
  void block_barrier() { wait_at(block_, "__syncthreads"); }

  // A warp's lanes exchange one value each: the value of lane `src_lane(lane)`.
  template <typename T, typename SrcLane>
  T exchange(WarpOp op, T v, SrcLane src_lane) {
    const uint64_t* slots = publish(op, v);
    T out;
    std::memcpy(&out, &slots[src_lane(running_ % 32)], sizeof(T));
    return out;
  }

  // Every lane's value, in lane order (votes, matches and reductions over the warp).
  template <typename T>
  std::array<T, 32> gather(WarpOp op, T v) {
    std::array<T, 32> all;
    const uint64_t* slots = publish(op, v);
    for (size_t l = 0; l < 32; ++l) std::memcpy(&all[l], &slots[l], sizeof(T));
    return all;
  }

 private:
  struct Barrier {
    int expected = 0, arrived = 0;
    unsigned generation = 0;
  };

  // Writes the lane's value into its warp's slot set for this operation and waits for every
  // lane's: the set. A warp's k-th operation opens its barrier's generation k, so two sets used
  // by generation parity need one barrier per operation: a lane that writes a set again has
  // passed the next operation's barrier, which opens only after every lane has read this one.
  template <typename T>
  const uint64_t* publish(WarpOp op, T v) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t), "a register-sized value");
    const int me = running_, warp = me / 32;
    Barrier& b = warps_[size_t(warp)];
    if (b.arrived == 0) {
      warp_op_[size_t(warp)] = op;
    } else if (warp_op_[size_t(warp)] != op) {
      fail("thread " + std::to_string(me) + " of CTA " + std::to_string(block_index_.x) +
           " is in another warp operation than its warp's other lanes");
    }
    uint64_t* slots = &slot_[size_t(b.generation & 1u) * size_t(threads_) + size_t(warp) * 32];
    slots[me % 32] = 0;
    std::memcpy(&slots[me % 32], &v, sizeof(T));
    wait_at(b, "a warp operation");  // every lane has written
    return slots;
  }

  Cta(int threads, Dim3 block, Dim3 grid, const std::function<void()>& body)
      : threads_(threads), block_index_(block), grid_(grid), body_(body), fibers_(size_t(threads)),
        done_(size_t(threads), false), slot_(2 * size_t(threads), 0), warps_(size_t(threads / 32)),
        warp_op_(size_t(threads / 32)), waiting_(size_t(threads)) {
    block_.expected = threads;
    for (Barrier& w : warps_) w.expected = 32;
  }

  static Cta*& current_cta() {
    static Cta* cta = nullptr;
    return cta;
  }
  // Fiber stacks, kept for the next CTA (left uninitialised: only the pages a thread uses are
  // touched; the device code here uses ~2 KB).
  static char* stack(int thread) {
    static std::vector<std::unique_ptr<char[]>> pool;
    while (pool.size() <= size_t(thread)) pool.emplace_back(new char[kStack]);
    return pool[size_t(thread)].get();
  }
  static constexpr size_t kStack = 128 * 1024;

  static void entry() {
    Cta& cta = self();
    cta.body_();
    cta.done_[size_t(cta.running_)] = true;
  }  // returns to uc_link: the scheduler

  struct Waiting {
    const Barrier* barrier = nullptr;
    unsigned generation = 0;
    const char* what = nullptr;
  };

  void wait_at(Barrier& b, const char* what) {
    const unsigned generation = b.generation;
    if (++b.arrived == b.expected) {
      b.arrived = 0;
      ++b.generation;
      return;
    }
    waiting_[size_t(running_)] = {&b, generation, what};
    swapcontext(&fibers_[size_t(running_)], &scheduler_);  // resumed once the barrier opened
    waiting_[size_t(running_)] = {};
  }

  // A fiber that starts in entry() and returns to the scheduler. (getcontext only fills the
  // context here: it never returns a second time.)
  __attribute__((noinline)) void make_fiber(int t) {
    ucontext_t& f = fibers_[size_t(t)];
    getcontext(&f);
    f.uc_stack.ss_sp = stack(t);
    f.uc_stack.ss_size = kStack;
    f.uc_link = &scheduler_;
    makecontext(&f, &Cta::entry, 0);
  }

  void schedule() {
    for (int t = 0; t < threads_; ++t) make_fiber(t);
    // Round robin over the threads that can go on: a thread runs until it waits at a barrier or
    // ends. A pass in which none could go on, with some not ended, is a deadlock: threads wait at
    // barriers the others never reach.
    for (;;) {
      bool ran = false, all_done = true;
      for (int i = 0; i < threads_; ++i) {
        running_ = reversed() ? threads_ - 1 - i : i;
        if (done_[size_t(running_)]) continue;
        const Waiting& w = waiting_[size_t(running_)];
        if (w.barrier == nullptr || w.barrier->generation != w.generation) {
          swapcontext(&scheduler_, &fibers_[size_t(running_)]);
          ran = true;
        }
        all_done = all_done && done_[size_t(running_)];
      }
      if (all_done) return;
      if (!ran) fail(deadlock());
    }
  }

  std::string deadlock() const {
    std::string s = "deadlock in CTA " + std::to_string(block_index_.x) + ": threads wait at barriers the others never reach;";
    int listed = 0;
    for (int t = 0; t < threads_ && listed < 8; ++t)
      if (!done_[size_t(t)]) {
        s += " thread " + std::to_string(t) + " at " + waiting_[size_t(t)].what + ",";
        ++listed;
      }
    int ended = 0;
    for (int t = 0; t < threads_; ++t) ended += done_[size_t(t)] ? 1 : 0;
    return s + " " + std::to_string(ended) + " ended";
  }

  int threads_;
  Dim3 block_index_, grid_;
  std::function<void()> body_;
  std::vector<ucontext_t> fibers_;
  std::vector<bool> done_;
  std::vector<uint64_t> slot_;  // [2 sets][threads]: each lane's value of a warp operation
  std::vector<Barrier> warps_;
  std::vector<WarpOp> warp_op_;  // the operation each warp's lanes are in
  std::vector<Waiting> waiting_;  // the barrier and generation a thread waits for
  Barrier block_;
  ucontext_t scheduler_{};
  int running_ = 0;
};

inline Dim3 thread_index() { return Dim3{unsigned(Cta::self().thread()), 0, 0}; }
inline Dim3 block_dim() { return Dim3{unsigned(Cta::self().threads()), 1, 1}; }
inline Dim3 block_index() { return Cta::self().block(); }
inline Dim3 grid_dim() { return Cta::self().grid(); }
inline void require_full_mask(unsigned mask) {
  if (mask != 0xffffffffu) fail("a warp operation with a partial mask (not emulated)");
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

// Warp shuffles (width 32): a source lane outside the warp gives the caller its own value.
template <typename T>
T __shfl_up_sync(unsigned mask, T v, int delta) {
  using ::cake_moe::emu::WarpOp;
  ::cake_moe::emu::require_full_mask(mask);
  return ::cake_moe::emu::Cta::self().exchange(WarpOp::kShflUp, v,
                                               [delta](int lane) { return lane >= delta ? lane - delta : lane; });
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  using ::cake_moe::emu::WarpOp;
  ::cake_moe::emu::require_full_mask(mask);
  return ::cake_moe::emu::Cta::self().exchange(WarpOp::kShflXor, v, [lane_mask](int lane) {
    const int src = lane ^ lane_mask;
    return src >= 0 && src < 32 ? src : lane;
  });
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src) {
  using ::cake_moe::emu::WarpOp;
  ::cake_moe::emu::require_full_mask(mask);
  return ::cake_moe::emu::Cta::self().exchange(WarpOp::kShfl, v, [src](int) { return src & 31; });
}
template <typename T>
unsigned __match_any_sync(unsigned mask, T v) {
  ::cake_moe::emu::require_full_mask(mask);
  const auto all = ::cake_moe::emu::Cta::self().gather(::cake_moe::emu::WarpOp::kMatchAny, v);
  unsigned peers = 0;
  for (int l = 0; l < 32; ++l) peers |= all[size_t(l)] == v ? 1u << l : 0u;
  return peers;
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  ::cake_moe::emu::require_full_mask(mask);
  const auto all = ::cake_moe::emu::Cta::self().gather(::cake_moe::emu::WarpOp::kBallot, predicate != 0);
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l) bits |= all[size_t(l)] ? 1u << l : 0u;
  return bits;
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {  // (wraps modulo 2^32, as on the device)
  ::cake_moe::emu::require_full_mask(mask);
  unsigned sum = 0;
  for (unsigned x : ::cake_moe::emu::Cta::self().gather(::cake_moe::emu::WarpOp::kReduceAdd, v)) sum += x;
  return sum;
}
inline int __ffs(int x) { return __builtin_ffs(x); }
inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }  // one rounding, as on the device
inline int __popc(unsigned x) { return __builtin_popcount(x); }

// CUDA's 16-byte vector type (vector_types.h), for the device code's 16-byte stores.
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

// No fiber switch inside: a read-modify-write is atomic to the other threads.
template <typename T>
T atomicAdd(T* address, T v) {
  const T old = *address;
  *address = T(old + v);
  return old;
}
