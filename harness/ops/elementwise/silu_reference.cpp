#include "ops/elementwise/silu_reference.hpp"

#include <cmath>

#include "bench/host.hpp"

namespace tessera::reference {

namespace {
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

std::vector<double> silu(const TensorView& x) {
  return host::tabulate(x.numel(), [&](int64_t i) {
    const double v = host::load_double(x, i);
    return v * sigmoid(v);
  });
}

std::vector<double> silu_backward(const TensorView& grad_out, const TensorView& x) {
  return host::tabulate(x.numel(), [&](int64_t i) {
    const double v = host::load_double(x, i), s = sigmoid(v);
    return host::load_double(grad_out, i) * s * (1.0 + v * (1.0 - s));
  });
}

}  // namespace tessera::reference
