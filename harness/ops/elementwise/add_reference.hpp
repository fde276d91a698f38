// CPU reference for add, in double precision. Inputs are host views (any strides; broadcast
// inputs already expanded to the output shape with stride 0); the result is row-major over the
// output shape.
#pragma once

#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::reference {

std::vector<double> add(const TensorView& a, const TensorView& b, double alpha);
std::vector<double> add(const TensorView& a, double b, double alpha);

}  // namespace tessera::reference
