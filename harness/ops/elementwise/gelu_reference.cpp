#include "ops/elementwise/gelu_reference.hpp"

#include <cmath>

#include "bench/host.hpp"

namespace tessera::reference {

namespace {
constexpr double kBeta = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kKappa = 0.044715;
}  // namespace

double gelu(double x, GeluApproximate approximate) {
  if (approximate == GeluApproximate::tanh)
    return 0.5 * x * (1.0 + std::tanh(kBeta * (x + kKappa * x * x * x)));
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}

double gelu_grad(double x, GeluApproximate approximate) {
  if (approximate == GeluApproximate::tanh) {
    const double t = std::tanh(kBeta * (x + kKappa * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kBeta * (1.0 + 3.0 * kKappa * x * x);
  }
  const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * pdf;
}

std::vector<double> gelu(const TensorView& x, GeluApproximate approximate) {
  return host::tabulate(x.numel(), [&](int64_t i) { return gelu(host::load_double(x, i), approximate); });
}

std::vector<double> gelu_backward(const TensorView& grad_out, const TensorView& x,
                                  GeluApproximate approximate) {
  return host::tabulate(x.numel(), [&](int64_t i) {
    return host::load_double(grad_out, i) * gelu_grad(host::load_double(x, i), approximate);
  });
}

}  // namespace tessera::reference
