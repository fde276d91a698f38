// CPU reference for SiLU forward and backward, in double precision. Inputs are host views (any
// strides); results are row-major.
#pragma once

#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::reference {

std::vector<double> silu(const TensorView& x);
std::vector<double> silu_backward(const TensorView& grad_out, const TensorView& x);

}  // namespace tessera::reference
