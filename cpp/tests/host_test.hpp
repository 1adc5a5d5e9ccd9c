// What every host-side C++ test program shares: EXPECT (reports a failed condition and counts
// it; the program goes on), the choice of sections from the command line, the exit report, and
// a seeded random source.
#pragma once
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>

namespace cake_moe::host_test {

inline int failures = 0;
inline int sections_run = 0;

// Whether the program was asked for section `name` (argv[1] = `which`, or "all"); counts it.
inline bool selected(const std::string& which, const char* name) {
  const bool yes = which == name || which == "all";
  sections_run += yes ? 1 : 0;
  return yes;
}

// The program's last line and its exit status: `which` passed, FAILED, or named no section.
inline int report(const std::string& which) {
  if (sections_run == 0) {
    std::printf("%s: no such test section\n", which.c_str());
    return 2;
  }
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

// (flushed at once: a later abort, from the emulator or UBSan, must not lose the line)
#define EXPECT(cond)                                                                 \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::printf("FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);                  \
      std::fflush(stdout);                                                           \
      ++::cake_moe::host_test::failures;                                             \
    }                                                                                \
  } while (0)
