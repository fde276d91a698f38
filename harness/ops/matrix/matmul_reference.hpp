// CPU reference for matmul with its epilogue, in double precision. Inputs are host views with any
// strides, shaped as tessera::matmul takes them; the result is row-major over out's shape.
#pragma once

#include <vector>

#include "tessera/ops/matrix.hpp"
#include "tessera/tensor.hpp"

namespace tessera::reference {

double activation(double x, Activation a);

// activation(alpha * input @ other + bias) + residual + beta * out_before (out_before: out's
// contents before the call, read only where beta != 0). Activation swiglu pairs the product's
// columns: with z = alpha * input @ other + bias ([..., N]), out[..., 64 j + c] =
// silu(z[..., 128 j + c]) * z[..., 128 j + 64 + c] ([..., N / 2]; out_before gives only its shape).
std::vector<double> matmul(const TensorView& input, const TensorView& other,
                           const TensorView& out_before, const MatmulOptions& options);

}  // namespace tessera::reference
