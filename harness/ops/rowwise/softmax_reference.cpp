#include "ops/rowwise/softmax_reference.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "runtime/check.hpp"
#include "bench/host.hpp"

namespace tessera::reference {

RowGeometry row_geometry(const TensorView& t, int dim) {
  const int nd = t.ndim > 0 ? t.ndim : 1;
  if (dim < -nd || dim >= nd)
    detail::throw_arg(ErrorKind::value, "reference.softmax", "dim",
                      "a dimension in [" + std::to_string(-nd) + ", " + std::to_string(nd - 1) + "]",
                      std::to_string(dim));
  const int d = dim < 0 ? dim + nd : dim;
  RowGeometry g;
  g.n = t.ndim > 0 ? t.shape[d] : 1;
  for (int i = d + 1; i < t.ndim; ++i) g.inner *= t.shape[i];
  g.rows = g.n > 0 ? t.numel() / g.n : 0;
  return g;
}

namespace {

// Calls f(a_row, b_row, out_row) for every row (b_row empty without b) and scatters the results.
template <class F>
std::vector<double> per_row(const TensorView& a, const TensorView* b, int dim, F f) {
  const RowGeometry g = row_geometry(a, dim);
  std::vector<double> out(static_cast<std::size_t>(a.numel()));
  host::parallel_for(g.rows, [&](int64_t lo, int64_t hi) {
    std::vector<double> va(g.n), vb(b ? g.n : 0), vo(g.n);
    for (int64_t r = lo; r < hi; ++r) {
      for (int64_t k = 0; k < g.n; ++k) {
        va[k] = host::load_double(a, g.index(r, k));
        if (b) vb[k] = host::load_double(*b, g.index(r, k));
      }
      f(va, vb, vo);
      for (int64_t k = 0; k < g.n; ++k) out[g.index(r, k)] = vo[k];
    }
  });
  return out;
}

// The row's max as torch takes it: NaN if any element is NaN.
double row_max(const std::vector<double>& v) {
  double m = -std::numeric_limits<double>::infinity();
  for (double x : v) {
    if (std::isnan(x)) return x;
    m = std::max(m, x);
  }
  return m;
}

// Plain IEEE arithmetic from here: a max of -inf or +inf makes x - m NaN for the elements equal
// to it, and the NaN reaches every output through the sum.
template <bool Log>
std::vector<double> forward(const TensorView& x, int dim) {
  return per_row(x, nullptr, dim, [](const std::vector<double>& v, const std::vector<double>&, std::vector<double>& o) {
    const double m = row_max(v);
    double s = 0;
    for (double e : v) s += std::exp(e - m);
    for (std::size_t k = 0; k < v.size(); ++k) o[k] = Log ? (v[k] - m) - std::log(s) : std::exp(v[k] - m) / s;
  });
}

}  // namespace

std::vector<double> softmax(const TensorView& x, int dim) { return forward<false>(x, dim); }
std::vector<double> log_softmax(const TensorView& x, int dim) { return forward<true>(x, dim); }

std::vector<double> softmax_backward(const TensorView& grad_out, const TensorView& y, int dim) {
  return per_row(grad_out, &y, dim, [](const std::vector<double>& g, const std::vector<double>& yv, std::vector<double>& o) {
    double dot = 0;
    for (std::size_t k = 0; k < g.size(); ++k) dot += g[k] * yv[k];
    for (std::size_t k = 0; k < g.size(); ++k) o[k] = yv[k] * (g[k] - dot);
  });
}

std::vector<double> log_softmax_backward(const TensorView& grad_out, const TensorView& y, int dim) {
  return per_row(grad_out, &y, dim, [](const std::vector<double>& g, const std::vector<double>& yv, std::vector<double>& o) {
    double sum = 0;
    for (double e : g) sum += e;
    for (std::size_t k = 0; k < g.size(); ++k) o[k] = g[k] - std::exp(yv[k]) * sum;
  });
}

}  // namespace tessera::reference
