#include "ops/loss/cross_entropy_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace tessera::reference {
namespace {

void check_sizes(const std::vector<double>& logits, int64_t rows, int64_t classes, const CrossEntropySpec& spec) {
  if (int64_t(logits.size()) != rows * classes || classes < 1)
    throw std::invalid_argument("reference::cross_entropy: logits must be rows x classes, classes >= 1");
  if (!spec.weight.empty() && int64_t(spec.weight.size()) != classes)
    throw std::invalid_argument("reference::cross_entropy: weight must have one entry per class");
}

double weight_of(const CrossEntropySpec& spec, int64_t j) { return spec.weight.empty() ? 1.0 : spec.weight[size_t(j)]; }

// Row r as torch writes the loss, sum_j c_j (lse - y_j) with c_j the weight on class j's -log p_j,
// plus the z-loss z lse^2 times sum_j c_j (the row's weight on lse); its gradient
// p_j (sum c) (1 + 2 z lse) - c_j, through the cap. Writes lse always, loss and grad.
void row(const double* x, const std::vector<double>& c, int64_t classes, const CrossEntropySpec& spec, double& loss,
         double& lse, double* grad) {
  const double cap = spec.softcap, z = spec.z_loss;
  std::vector<double> y(size_t(classes), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < classes; ++j) {
    y[size_t(j)] = cap > 0 ? cap * std::tanh(x[j] / cap) : x[j];
    m = std::max(m, y[size_t(j)]);
  }
  double s = 0.0;
  for (double v : y) s += std::exp(v - m);
  lse = m + std::log(s);
  double mass = 0.0;
  loss = 0.0;
  for (int64_t j = 0; j < classes; ++j) {
    mass += c[size_t(j)];
    if (c[size_t(j)] != 0.0) loss += c[size_t(j)] * (lse - y[size_t(j)]);
  }
  loss += z * mass * lse * lse;
  for (int64_t j = 0; j < classes; ++j) {
    const double yj = y[size_t(j)];
    double d = std::exp(yj - lse) * mass * (1 + 2 * z * lse) - c[size_t(j)];
    if (cap > 0) d *= 1 - (yj / cap) * (yj / cap);
    grad[j] = d;
  }
}

}  // namespace

CrossEntropyRows cross_entropy(const std::vector<double>& logits, const std::vector<int64_t>& target, int64_t rows,
                               int64_t classes, const CrossEntropySpec& spec) {
  check_sizes(logits, rows, classes, spec);
  if (int64_t(target.size()) != rows) throw std::invalid_argument("reference::cross_entropy: target must be rows long");
  const double e = spec.label_smoothing, nan = std::nan("");
  CrossEntropyRows out;
  out.loss.assign(size_t(rows), 0.0), out.lse.assign(size_t(rows), 0.0), out.grad.assign(size_t(rows * classes), 0.0);
  std::vector<double> c(static_cast<size_t>(classes)), scratch(static_cast<size_t>(classes));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = target[size_t(r)];
    const bool ignored = t == spec.ignore_index, bad = !ignored && (t < 0 || t >= classes);
    // (1 - e) w_t on the target, e / V w_j on every class (torch's smoothing term, weighted).
    for (int64_t j = 0; j < classes; ++j) c[size_t(j)] = e / double(classes) * weight_of(spec, j);
    if (!ignored && !bad) c[size_t(t)] += (1 - e) * weight_of(spec, t);
    double loss = 0.0;
    row(&logits[size_t(r * classes)], c, classes, spec, loss, out.lse[size_t(r)], scratch.data());
    if (ignored) continue;
    ++out.valid;
    if (!bad) out.divisor += spec.weight.empty() ? 1.0 : weight_of(spec, t);
    else if (spec.weight.empty()) out.divisor += 1.0;
    out.loss[size_t(r)] = bad ? nan : loss;
    for (int64_t j = 0; j < classes; ++j) out.grad[size_t(r * classes + j)] = bad ? nan : scratch[size_t(j)];
  }
  return out;
}

CrossEntropyRows cross_entropy_probs(const std::vector<double>& logits, const std::vector<double>& probs, int64_t rows,
                                     int64_t classes, const CrossEntropySpec& spec) {
  check_sizes(logits, rows, classes, spec);
  if (int64_t(probs.size()) != rows * classes)
    throw std::invalid_argument("reference::cross_entropy_probs: probs must be rows x classes");
  const double e = spec.label_smoothing;
  CrossEntropyRows out;
  out.loss.assign(size_t(rows), 0.0), out.lse.assign(size_t(rows), 0.0), out.grad.assign(size_t(rows * classes), 0.0);
  out.valid = rows, out.divisor = double(rows);
  std::vector<double> c(static_cast<size_t>(classes));
  for (int64_t r = 0; r < rows; ++r) {
    // torch's smoothed target (1 - e) q + e / V, times the class weights.
    for (int64_t j = 0; j < classes; ++j)
      c[size_t(j)] = weight_of(spec, j) * ((1 - e) * probs[size_t(r * classes + j)] + e / double(classes));
    row(&logits[size_t(r * classes)], c, classes, spec, out.loss[size_t(r)], out.lse[size_t(r)],
        &out.grad[size_t(r * classes)]);
  }
  return out;
}

}  // namespace tessera::reference
