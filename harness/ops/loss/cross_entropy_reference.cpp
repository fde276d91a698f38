#include "ops/loss/cross_entropy_reference.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace tessera::reference {

CrossEntropyRows cross_entropy(const std::vector<double>& logits, const std::vector<int64_t>& target, int64_t rows,
                               int64_t classes, const CrossEntropySpec& spec) {
  if (int64_t(logits.size()) != rows * classes || int64_t(target.size()) != rows || classes < 1)
    throw std::invalid_argument("reference::cross_entropy: logits must be rows x classes and target rows long");
  const double e = spec.label_smoothing, z = spec.z_loss, cap = spec.softcap, nan = std::nan("");
  CrossEntropyRows out;
  out.loss.assign(size_t(rows), 0.0), out.lse.assign(size_t(rows), 0.0), out.grad.assign(size_t(rows * classes), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> y(static_cast<size_t>(classes));
    double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (int64_t j = 0; j < classes; ++j) {
      const double x = logits[size_t(r * classes + j)];
      y[size_t(j)] = cap > 0 ? cap * std::tanh(x / cap) : x;
      m = std::max(m, y[size_t(j)]);
      sum += y[size_t(j)];
    }
    double s = 0.0;
    for (double v : y) s += std::exp(v - m);
    const double lse = m + std::log(s);
    out.lse[size_t(r)] = lse;
    const int64_t t = target[size_t(r)];
    if (t == spec.ignore_index) continue;
    ++out.valid;
    const bool bad = t < 0 || t >= classes;
    out.loss[size_t(r)] = bad ? nan : lse - (1 - e) * y[size_t(t)] - e / double(classes) * sum + z * lse * lse;
    for (int64_t j = 0; j < classes; ++j) {
      const double yj = y[size_t(j)];
      double d = std::exp(yj - lse) * (1 + 2 * z * lse) - e / double(classes) - (j == t ? 1 - e : 0.0);
      if (cap > 0) d *= 1 - (yj / cap) * (yj / cap);
      out.grad[size_t(r * classes + j)] = bad ? nan : d;
    }
  }
  return out;
}

}  // namespace tessera::reference
