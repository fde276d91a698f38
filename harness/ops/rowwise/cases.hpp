// What the row-wise family's <op>_cases.cpp files share: how a bench size becomes a shape, the
// description fields every row-wise op has, and one result for a case of several outputs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/registry.hpp"

namespace tessera::ops::rowwise {

// For row-wise ops, the size of a bench case (`tessera bench softmax --size 4096`) is the row
// length N; the number of rows is min(4096, 2^26 / N), so that the sizes of the PERF.md tables
// come out exactly: 4096 x {256 .. 16384}, 2048 x 32768, 256 x 262144.
inline int64_t bench_rows(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>(4096, (int64_t(1) << 26) / std::max<int64_t>(n, 1)));
}
inline constexpr const char* kSizeMeaning = "row length N (rows = min(4096, 2^26 / N))";
inline const std::vector<int64_t> kBenchColumns = {256, 1024, 4096, 16384, 32768, 262144};
inline const std::vector<DType> kFloatTypes = {DType::float32, DType::float16, DType::bfloat16};

// The fields every row-wise op shares: float dtypes, the size meaning above, the default
// tolerance. The caller adds the bench sizes, the cases and the bench; a summary only for an op
// the library does not describe (a described op's family, summary and dtypes are its
// description's).
inline OpInfo op_info(std::string name, std::string summary = {}) {
  OpInfo op;
  op.name = std::move(name);
  op.family = "rowwise";
  op.summary = std::move(summary);
  op.dtypes = kFloatTypes;
  op.size_meaning = kSizeMeaning;
  op.tolerance = default_tolerance;
  return op;
}

// A row-wise op's sums: along a row of `row_length`, and (the weight gradients) down the rows.
inline ErrorModel row_sums(const std::vector<int64_t>& shape, int64_t row_length) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  ErrorModel m;
  m.k = std::max<int64_t>({1, row_length, numel / std::max<int64_t>(row_length, 1)});
  return m;
}

// One VerifyResult for several outputs: fails if any fails (the detail names which), the worst
// relative error (as a fraction of its tolerance) is the one reported.
inline VerifyResult fold(const std::string& op, const std::string& name,
                         const std::vector<std::pair<std::string, VerifyResult>>& parts) {
  VerifyResult r;
  r.op = op;
  r.name = name;
  r.passed = true;
  double worst = -1;
  for (const auto& [label, v] : parts) {
    r.unwritten += v.unwritten;
    r.max_abs = std::max(r.max_abs, v.max_abs);
    const double ratio = v.tolerance > 0 ? v.rel_err / v.tolerance : v.rel_err;
    if (!(ratio <= worst)) {  // NaN counts as worst
      worst = ratio;
      r.rel_err = v.rel_err;
      r.tolerance = v.tolerance;
    }
    if (!v.passed) {
      r.passed = false;
      r.detail += (r.detail.empty() ? "" : "; ") + label + ": " + v.detail;
    }
  }
  return r;
}

}  // namespace tessera::ops::rowwise
