// Layout of the unit slots (unit_slots.cuh), for the kernels and for the host launchers that size
// their shared memory.
#pragma once
#include <cstdint>

#include "common/host_device.hpp"

namespace cake_moe::sm90 {

// The smallest power of two >= n: a slot count for a ring of n stages.
CAKE_HD constexpr int unit_slot_count(int n) { return n <= 1 ? 1 : 2 * unit_slot_count((n + 1) / 2); }

// Shared-memory bytes of `slots` slots of `unit_bytes`-byte units: the free barriers, then the
// units, padded to 16 bytes.
CAKE_HD constexpr uint32_t unit_slots_smem_bytes(int slots, uint32_t unit_bytes) {
  return ((uint32_t(slots) * (8u + unit_bytes) + 15u) / 16u) * 16u;
}

}  // namespace cake_moe::sm90
