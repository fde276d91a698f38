// CPU reference for GELU forward and backward, in double precision. Inputs are host views (any
// strides); results are row-major.
#pragma once

#include <vector>

#include "tessera/ops/elementwise.hpp"
#include "tessera/tensor.hpp"

namespace tessera::reference {

double gelu(double x, GeluApproximate approximate);
double gelu_grad(double x, GeluApproximate approximate);  // d gelu / dx

std::vector<double> gelu(const TensorView& x, GeluApproximate approximate);
std::vector<double> gelu_backward(const TensorView& grad_out, const TensorView& x,
                                  GeluApproximate approximate);

}  // namespace tessera::reference
