// CPU reference for isin: exact, on the values as stored (integers as int64, floats as double,
// where -0.0 == 0.0 and NaN equals nothing).
#pragma once

#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::reference {

// 1 where elements[i] (row-major over elements' shape) is in test_elements (0 with invert).
std::vector<double> isin(const TensorView& elements, const TensorView& test_elements, bool invert);

}  // namespace tessera::reference
