// SHA-256 (FIPS 180-4) for verifying embedded kernel images before they reach the driver.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace cake_moe::runtime {

// Lower-case hex digest of `size` bytes at `data`.
std::string sha256_hex(const void* data, std::size_t size);

}  // namespace cake_moe::runtime
