// What every host-side C++ test program shares: EXPECT (reports a failed condition and counts
// it; the program goes on), the exit report, and a seeded random source.
#pragma once
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>

namespace cake_moe::host_test {

inline int failures = 0;

// The program's last line and its exit status: `which` passed or FAILED.
inline int report(const std::string& which) {
  std::printf("%s: %s\n", which.c_str(), failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}

// One seeded generator per program: the draws repeat run to run.
inline std::mt19937_64& generator() {
  static std::mt19937_64 rng(20261204);
  return rng;
}
// A uniform integer in [lo, hi].
inline int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(generator()); }

}  // namespace cake_moe::host_test

#define EXPECT(cond)                                                                 \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::printf("FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);                  \
      ++::cake_moe::host_test::failures;                                             \
    }                                                                                \
  } while (0)
