// The row-wise family's verify and bench cases, one file per operator group.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/registry.hpp"

namespace tessera::ops::rowwise {

// For row-wise ops, the size of a bench case (`tessera bench softmax --size 4096`) is the row
// length N; the number of rows is min(4096, 2^26 / N), so that the sizes of the PERF.md tables
// come out exactly: 4096 x {256 .. 16384}, 2048 x 32768, 256 x 262144.
inline int64_t bench_rows(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>(4096, (int64_t(1) << 26) / std::max<int64_t>(n, 1)));
}
inline const std::vector<int64_t> kBenchColumns = {256, 1024, 4096, 16384, 32768, 262144};

void add_softmax_ops(std::vector<OpInfo>& ops);  // softmax_cases.cpp
void add_norm_ops(std::vector<OpInfo>& ops);     // norm_cases.cpp

}  // namespace tessera::ops::rowwise
