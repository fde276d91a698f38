// CPU references for the elementwise family, in double precision. Inputs are host views (any
// strides; broadcast inputs already expanded to the output shape with stride 0); results are
// row-major over the output shape.
#pragma once

#include <vector>

#include "tessera/ops/elementwise.hpp"
#include "tessera/tensor.hpp"

namespace tessera::reference {

double gelu(double x, GeluApproximate approximate);
double gelu_grad(double x, GeluApproximate approximate);  // d gelu / dx

std::vector<double> add(const TensorView& a, const TensorView& b, double alpha);
std::vector<double> add(const TensorView& a, double b, double alpha);
std::vector<double> gelu(const TensorView& x, GeluApproximate approximate);
std::vector<double> gelu_backward(const TensorView& grad_out, const TensorView& x,
                                  GeluApproximate approximate);

}  // namespace tessera::reference
