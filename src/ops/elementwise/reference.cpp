#include "ops/elementwise/reference.hpp"

#include <cmath>

#include "runtime/host.hpp"

namespace tessera::reference {

namespace {
constexpr double kBeta = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kKappa = 0.044715;

template <class F>
std::vector<double> map(int64_t n, F f) {
  std::vector<double> out(static_cast<std::size_t>(n));
  runtime::parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = f(i);
  });
  return out;
}
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

std::vector<double> add(const TensorView& a, const TensorView& b, double alpha) {
  return map(a.numel(), [&](int64_t i) {
    return runtime::load_double(a, i) + alpha * runtime::load_double(b, i);
  });
}

std::vector<double> add(const TensorView& a, double b, double alpha) {
  return map(a.numel(), [&](int64_t i) { return runtime::load_double(a, i) + alpha * b; });
}

std::vector<double> gelu(const TensorView& x, GeluApproximate approximate) {
  return map(x.numel(), [&](int64_t i) { return gelu(runtime::load_double(x, i), approximate); });
}

std::vector<double> gelu_backward(const TensorView& grad_out, const TensorView& x,
                                  GeluApproximate approximate) {
  return map(x.numel(), [&](int64_t i) {
    return runtime::load_double(grad_out, i) * gelu_grad(runtime::load_double(x, i), approximate);
  });
}

}  // namespace tessera::reference
