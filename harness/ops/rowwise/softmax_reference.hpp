// CPU references for softmax and log_softmax, forward and backward, in double precision, with
// torch's semantics (a row of all -inf, or one holding NaN or +inf, gives NaN). Inputs are host
// views with any strides; `dim` counts from the end when negative, and a 0-d tensor is one row of
// one element. Results are row-major over the input's shape.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::reference {

std::vector<double> softmax(const TensorView& x, int dim);
std::vector<double> log_softmax(const TensorView& x, int dim);
// y * (grad_out - sum_dim(grad_out * y))
std::vector<double> softmax_backward(const TensorView& grad_out, const TensorView& y, int dim);
// grad_out - exp(y) * sum_dim(grad_out)
std::vector<double> log_softmax_backward(const TensorView& grad_out, const TensorView& y, int dim);

// How a tensor splits into rows along `dim`: row r holds the elements with row-major logical
// index (r / inner * n + k) * inner + r % inner, k = 0 .. n - 1.
struct RowGeometry {
  int64_t rows = 0;
  int64_t n = 0;      // elements per row
  int64_t inner = 1;  // product of the sizes after dim
  int64_t index(int64_t row, int64_t k) const { return (row / inner * n + k) * inner + row % inner; }
};
RowGeometry row_geometry(const TensorView& t, int dim);

}  // namespace tessera::reference
