// What the elementwise family's <op>_cases.cpp files share: the dtypes, the bench sizes and the
// description fields every elementwise op has.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/registry.hpp"
#include "ops/verify.hpp"

namespace tessera::ops::elementwise {

using Shape = std::vector<int64_t>;
inline const std::vector<DType> kFloatTypes = {DType::float32, DType::float16, DType::bfloat16};
inline constexpr int64_t kOverInt32 = (int64_t(1) << 31) + 17;  // one tensor of more than 2^31 elements

// A bench case over `inputs` flat tensors of n elements, of which (inputs and outputs together)
// `moved` must each cross HBM once.
inline BenchShape flat_shape(DType dt, int64_t n, int inputs, int moved) {
  BenchShape s;
  s.shapes.assign(static_cast<std::size_t>(inputs), Shape{n});
  s.shape = shape_str({n});
  s.bytes = static_cast<double>(moved) * static_cast<double>(n) * static_cast<double>(dtype_size(dt));
  return s;
}

// The fields every elementwise op shares: float dtypes, sizes 2^16 .. 2^28 elements (launch-bound
// to HBM-bound), the default tolerance. The caller adds the cases and the bench; a summary only
// for an op the library does not describe (a described op's family, summary and dtypes are its
// description's).
inline OpInfo op_info(std::string name, std::string summary = {}) {
  OpInfo op;
  op.name = std::move(name);
  op.family = "elementwise";
  op.summary = std::move(summary);
  op.dtypes = kFloatTypes;
  for (int k = 16; k <= 28; k += 2) op.bench_sizes.push_back(int64_t(1) << k);
  op.size_meaning = "elements";
  op.tolerance = default_tolerance;
  return op;
}

}  // namespace tessera::ops::elementwise
