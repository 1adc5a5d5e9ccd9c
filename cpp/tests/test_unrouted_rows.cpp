// grouped_mm's zeroing of the rows in no group (grouped_gemm/unrouted_rows.cuh), run from its own
// header on emulated launches: rows before m_indptr's first entry and from the last group end on,
// [0, clamp(offs[0])) and [clamp(offs[num_offs - 1]), rows), become +0, every other byte of the
// output and the guard bytes around it stay as they were, for both offset conventions, first
// starts above 0 and past the last end, last ends inside, at and past the rows or negative, no
// group (every row), rows of fewer and more than 32 16-byte chunks, and grids from one CTA to
// more than the rows need.
#include "cta_emulator.hpp"  // first: the device header below reads its CUDA spellings

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "grouped_gemm/unrouted_rows.cuh"

#include "host_test.hpp"

using cake_moe::emu::Cta;

namespace {

constexpr uint8_t kOutside = 0xAB, kBefore = 0xCD;
constexpr size_t kGuard = 256;  // bytes either side of the output

void check(int32_t rows, int32_t cols, std::vector<int32_t> offs, bool leading_zero, int blocks) {
  const int64_t row_bytes = int64_t(cols) * 2;
  std::vector<uint8_t> buf(2 * kGuard + size_t(rows) * row_bytes + 16, kOutside);
  // 16-byte aligned output, as the launcher requires
  uint8_t* out = buf.data() + kGuard + (16 - reinterpret_cast<uintptr_t>(buf.data() + kGuard) % 16) % 16;
  std::fill(out, out + rows * row_bytes, kBefore);
  const cake_moe::UnroutedRowsParams p{out, offs.data(), row_bytes, cols / 8, rows, int32_t(offs.size()),
                                       leading_zero ? 1 : 0};
  Cta::launch(blocks, cake_moe::kUnroutedRowsThreads, [&] { cake_moe::zero_unrouted_rows(p); });

  const int64_t last = offs.empty() ? 0 : offs.back();
  const int64_t kept_from = leading_zero && !offs.empty() ? std::clamp<int64_t>(offs[0], 0, rows) : 0;
  const int64_t zero_from = std::clamp<int64_t>(last, 0, rows);  // rows [kept_from, zero_from) keep their bytes
  bool ok = true;
  for (const uint8_t* b = buf.data(); b < out; ++b) ok = ok && *b == kOutside;
  for (int64_t i = 0; i < rows * row_bytes; ++i) {
    const int64_t r = i / row_bytes;
    ok = ok && out[i] == (r >= kept_from && r < zero_from ? kBefore : 0);
  }
  for (const uint8_t* b = out + rows * row_bytes; b < buf.data() + buf.size(); ++b) ok = ok && *b == kOutside;
  EXPECT(ok);
  if (!ok)
    std::printf("  rows=%d cols=%d offs=%zu leading_zero=%d last=%lld blocks=%d\n", rows, cols, offs.size(),
                int(leading_zero), (long long)last, blocks);
}

void test_zeroing() {
  for (const int32_t rows : {0, 1, 7, 100, 613})
    for (const int32_t cols : {8, 64, 264, 2048}) {  // 1, 8, 33 and 256 chunks a row
      const int32_t end = rows * 2 / 3;
      const std::vector<std::pair<std::vector<int32_t>, bool>> conventions = {
          {{end / 2, end}, false},               // [E] cumulative ends
          {{0, end / 3, end / 2, end}, true},    // [E + 1] m_indptr
          {{end / 3, end / 2, end}, true},       // m_indptr whose first group starts past row 0
          {{end / 3, end / 2, end}, false},      // the same entries as [E] ends: row 0 on
          {{end / 2, rows}, false},              // the groups cover every row
          {{5, rows + 99}, false},               // the last end past the rows
          {{rows + 7, rows + 9}, true},          // the first start past the rows: every row
          {{50, 60, -5}, false},                 // a negative last end: every row
          {{50, 60, -5}, true},                  // ... and a first start past it
          {{-3, end}, true},                     // a negative first start: from row 0
          {{}, false},                           // no group: every row
      };
      for (const auto& [offs, leading_zero] : conventions)
        for (const int blocks : {1, 3, std::max(1, std::min(2 * 132, (rows + 7) / 8))})
          check(rows, cols, offs, leading_zero, blocks);
    }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "all";
  if (cake_moe::host_test::selected(which, "zeroing")) test_zeroing();
  return cake_moe::host_test::report(which);
}
