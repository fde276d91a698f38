// Elementwise operators. Every function checks its arguments (throwing tessera::Error before any
// launch), returns at once for 0-element tensors, and enqueues its kernels on `stream`.
// Supported dtypes: float32, float16, bfloat16 (half types compute in float32).
#pragma once

#include <cuda_runtime_api.h>

#include "tessera/tensor.hpp"

namespace tessera {

// out = a + alpha * b. a and b broadcast to out's shape with torch's rules (a scalar, a tensor
// over leading dims, or any broadcastable shape); all three share one dtype and one device.
// out may be a itself (same layout) for in-place use; any other overlap with an input is refused.
void add(const TensorView& a, const TensorView& b, const TensorView& out, double alpha,
         cudaStream_t stream);
// out = a + alpha * b for a host scalar b.
void add(const TensorView& a, double b, const TensorView& out, double alpha, cudaStream_t stream);

enum class GeluApproximate { none, tanh };  // erf form, or torch's tanh approximation

// out = gelu(x); out has x's shape and dtype.
void gelu(const TensorView& x, const TensorView& out, GeluApproximate approximate,
          cudaStream_t stream);
// grad_in = grad_out * gelu'(x); all three share one shape and dtype.
void gelu_backward(const TensorView& grad_out, const TensorView& x, const TensorView& grad_in,
                   GeluApproximate approximate, cudaStream_t stream);

}  // namespace tessera
