// Hand-over of decoded work units from a warp-specialised kernel's producer thread to its
// consumer threads, through a small ring of shared-memory slots (one per unit, in order).
//
// Why: a consumer that decodes its next unit itself (a binary search over the scheduler's prefix
// table, then the group offsets from global memory) does so while the tensor pipe waits; on the
// H200 that path bounded the wgrad at short units (4-8 k-blocks). The producer decodes every unit
// anyway to issue its loads, so it writes the unit into a slot before the arrival that completes
// the unit's first ring stage; a consumer that has waited for that stage loads the slot.
//
// Protocol: slot i % kSlots carries unit i. The producer waits for the slot's free barrier before
// writing it; every reading thread arrives on that barrier itself after its load, so each load is
// ordered before the next write (compute-sanitizer racecheck holds a lane's load against the
// write unless that lane's own arrival orders them). kSlots >= the ring's stage count suffices:
// every unit holds at least one stage, so at most kStages units are published and unread.
#pragma once

#include <cstdint>

#include "common/ptx/mbarrier.cuh"
#include "grouped_gemm/unit_slots_layout.hpp"

namespace cake_moe {
namespace sm90 {

template <typename Unit, int kSlots, int kReaders>
struct UnitSlots {
  // the writer numbers slots and phases from a 32-bit count of published units, which stays
  // consistent across its wrap-around only for a power-of-two slot count
  static_assert(kSlots > 0 && (kSlots & (kSlots - 1)) == 0, "slots are numbered modulo kSlots (a power of two)");
  static_assert(sizeof(Unit) % 4 == 0, "units are whole words");
  // shared memory: kSlots free barriers, then kSlots units (16-B multiple in all)
  static constexpr uint32_t kSmemBytes = unit_slots_smem_bytes(kSlots, sizeof(Unit));

  uint64_t* free_bar;
  Unit* units;

  __device__ __forceinline__ static UnitSlots at(uint8_t* smem) {
    UnitSlots s;
    s.free_bar = reinterpret_cast<uint64_t*>(smem);
    s.units = reinterpret_cast<Unit*>(smem + kSlots * 8);
    return s;
  }

  // one thread, with the kernel's other barrier initialisations (before their fence and sync)
  __device__ __forceinline__ void init() const {
    for (int s = 0; s < kSlots; ++s) ptx::mbar_init(&free_bar[s], kReaders);
  }

  // the producer thread's side
  struct Writer {
    uint32_t published = 0;
    // Call before the arrival that completes the unit's first stage.
    __device__ __forceinline__ void publish(const UnitSlots& s, const Unit& u) {
      const uint32_t slot = published % kSlots;
      ptx::mbar_wait_parity(&s.free_bar[slot], ((published / kSlots) & 1u) ^ 1u);
      s.units[slot] = u;
      ++published;
    }
  };

  // every consumer thread's side
  struct Reader {
    uint32_t slot = 0;
    // Call once the unit's first stage is complete (its full barrier waited). The __syncwarp tells
    // the compiler that the warp is converged after that barrier's spin loop, so the loaded unit
    // is warp-uniform: loop bounds and wgmma descriptors derived from it stay in uniform
    // registers (a lane-0 load shared by shuffles loses that: ~6% at large T on the wgrad).
    __device__ __forceinline__ Unit read(const UnitSlots& s) {
      const Unit u = s.units[slot];
      __syncwarp();
      ptx::mbar_arrive(&s.free_bar[slot]);
      slot = (slot + 1) % kSlots;
      return u;
    }
  };
};

}  // namespace sm90
}  // namespace cake_moe
