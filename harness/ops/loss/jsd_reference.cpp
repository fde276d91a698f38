#include "ops/loss/jsd_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace tessera::reference {
namespace {

// log_softmax(x / T) of one row.
std::vector<double> log_softmax(const double* x, int64_t n, double t) {
  std::vector<double> l(static_cast<size_t>(n));
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, l[size_t(j)] = x[j] / t);
  double s = 0.0;
  for (double v : l) s += std::exp(v - m);
  const double lse = m + std::log(s);
  for (double& v : l) v -= lse;
  return l;
}

// w (a - b), 0 where the weight w is 0 (0 log 0 = 0: a masked class).
double term(double w, double a, double b) { return w == 0.0 ? 0.0 : w * (a - b); }

double logaddexp(double a, double b) {
  const double hi = std::max(a, b);
  return hi == -std::numeric_limits<double>::infinity() ? hi : hi + std::log1p(std::exp(std::min(a, b) - hi));
}

}  // namespace

JsdRows jsd(const std::vector<double>& student, const std::vector<double>& teacher, const std::vector<int64_t>& target,
            int64_t rows, int64_t classes, const JsdSpec& spec) {
  if (classes < 1 || int64_t(student.size()) != rows * classes || teacher.size() != student.size())
    throw std::invalid_argument("reference::jsd: student and teacher must be rows x classes, classes >= 1");
  if (!target.empty() && int64_t(target.size()) != rows)
    throw std::invalid_argument("reference::jsd: target must be rows long (or empty)");
  const double b = spec.beta, t = spec.temperature;
  JsdRows out;
  out.loss.assign(size_t(rows), 0.0), out.grad.assign(size_t(rows * classes), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (!target.empty() && target[size_t(r)] == spec.ignore_index) continue;
    const std::vector<double> lq = log_softmax(&student[size_t(r * classes)], classes, t);
    const std::vector<double> lp = log_softmax(&teacher[size_t(r * classes)], classes, t);
    double* g = &out.grad[size_t(r * classes)];
    double loss = 0.0;
    if (b == 0.0) {  // KL(P || Q); d / d s = Q - P
      for (int64_t j = 0; j < classes; ++j) {
        loss += term(std::exp(lp[size_t(j)]), lp[size_t(j)], lq[size_t(j)]);
        g[j] = (std::exp(lq[size_t(j)]) - std::exp(lp[size_t(j)])) / t;
      }
    } else if (b == 1.0) {  // KL(Q || P); d / d s = Q (lQ - lP - loss)
      for (int64_t j = 0; j < classes; ++j) loss += term(std::exp(lq[size_t(j)]), lq[size_t(j)], lp[size_t(j)]);
      for (int64_t j = 0; j < classes; ++j)
        g[j] = term(std::exp(lq[size_t(j)]), lq[size_t(j)] - lp[size_t(j)], loss) / t;
    } else {  // beta KL(P || M) + (1 - beta) KL(Q || M); d / d s = Q (g - sum Q g), g = (1 - beta)(lQ - lM)
      std::vector<double> gj(static_cast<size_t>(classes));
      double s = 0.0;
      for (int64_t j = 0; j < classes; ++j) {
        const double p = std::exp(lp[size_t(j)]), q = std::exp(lq[size_t(j)]);
        const double lm = logaddexp(lp[size_t(j)] + std::log(b), lq[size_t(j)] + std::log1p(-b));
        loss += b * term(p, lp[size_t(j)], lm) + (1 - b) * term(q, lq[size_t(j)], lm);
        gj[size_t(j)] = (1 - b) * (lq[size_t(j)] - lm);
        s += term(q, gj[size_t(j)], 0.0);
      }
      for (int64_t j = 0; j < classes; ++j) g[j] = term(std::exp(lq[size_t(j)]), gj[size_t(j)], s) / t;
    }
    out.loss[size_t(r)] = loss;
  }
  return out;
}

}  // namespace tessera::reference
