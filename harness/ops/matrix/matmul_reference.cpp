#include "ops/matrix/matmul_reference.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

#include "bench/host.hpp"
#include "ops/elementwise/gelu_reference.hpp"

namespace tessera::reference {

double activation(double x, Activation a) {
  switch (a) {
    case Activation::relu: return x > 0 || std::isnan(x) ? x : 0.0;
    case Activation::gelu: return gelu(x, GeluApproximate::none);
    case Activation::gelu_tanh: return gelu(x, GeluApproximate::tanh);
    case Activation::silu: return x / (1.0 + std::exp(-x));
    default: return x;
  }
}

namespace {

// A 2-d or 3-d host view as a dense row-major [batches, rows, cols] array of doubles.
struct Dense {
  int64_t batches = 1, rows = 0, cols = 0;
  std::vector<double> v;
  // Batch b of a view whose batch dimension is 1 or absent is its only matrix.
  double at(int64_t b, int64_t i, int64_t j) const {
    return v[((batches == 1 ? 0 : b) * rows + i) * cols + j];
  }
};

Dense dense(const TensorView& t) {
  Dense d;
  d.batches = t.ndim == 3 ? t.shape[0] : 1;
  d.rows = t.shape[t.ndim - 2];
  d.cols = t.shape[t.ndim - 1];
  d.v = host::tabulate(t.numel(), [&](int64_t i) { return host::load_double(t, i); });
  return d;
}

}  // namespace

std::vector<double> matmul(const TensorView& a, const TensorView& b, const TensorView& c,
                           const MatmulOptions& o) {
  const Dense da = dense(a), db = dense(b);
  const Dense dr = o.residual ? dense(*o.residual) : Dense{};
  const Dense dc = o.beta != 0 ? dense(c) : Dense{};
  const std::vector<double> bias =
      o.bias ? host::tabulate(o.bias->numel(), [&](int64_t i) { return host::load_double(*o.bias, i); })
             : std::vector<double>{};
  const int64_t m = c.shape[c.ndim - 2], n = db.cols, k = da.cols;
  const int64_t batch = c.ndim == 3 ? c.shape[0] : 1;
  const auto product = [&](int64_t bi, int64_t i, int64_t j) {  // alpha * acc + bias
    double acc = 0;
    for (int64_t kk = 0; kk < k; ++kk) acc += da.at(bi, i, kk) * db.at(bi, kk, j);
    return o.alpha * acc + (o.bias ? bias[j] : 0.0);
  };
  if (is_gated(o.activation)) {
    const int64_t h = n / 2;
    const Activation gate_act = o.activation == Activation::geglu ? Activation::gelu_tanh : Activation::silu;
    return host::tabulate(batch * m * h, [&](int64_t idx) {
      const int64_t bi = idx / (m * h), i = idx / h % m, j = idx % h, gate = gated_gate_column(j, h);
      return activation(product(bi, i, gate), gate_act) * product(bi, i, gate + gated_block_width(j, h));
    });
  }
  return host::tabulate(batch * m * n, [&](int64_t idx) {
    const int64_t bi = idx / (m * n), i = idx / n % m, j = idx % n;
    double v = activation(product(bi, i, j), o.activation);
    if (o.residual) v += dr.at(bi, i, j);
    if (o.beta != 0) v += o.beta * dc.at(bi, i, j);
    return v;
  });
}

}  // namespace tessera::reference
