#include "ops/rowwise/norm_reference.hpp"

#include <cmath>
#include <cstdint>
#include <mutex>

#include "bench/host.hpp"

namespace tessera::reference {
namespace {

struct Rows {
  int64_t rows = 1, n = 1;
};

Rows rows_of(const TensorView& x, int normalized_ndim) {
  Rows r;
  for (int d = 0; d < x.ndim; ++d) (d < x.ndim - normalized_ndim ? r.rows : r.n) *= x.shape[d];
  return r;
}

// Element c of an optional per-column parameter (`dflt` when absent).
double param(const TensorView* t, int64_t c, double dflt) { return t ? host::load_double(*t, c) : dflt; }

// Runs fn(begin, end) over the rows; the partial column sums of each chunk are added into
// `sums` (nsums vectors of n) under a lock.
template <class F>
void over_rows(const Rows& r, int nsums, std::vector<std::vector<double>>& sums, F fn) {
  sums.assign(nsums, std::vector<double>(static_cast<std::size_t>(r.n), 0.0));
  std::mutex mu;
  // parallel_for splits by element count: give it elements, hand out whole rows.
  host::parallel_for(r.rows, [&](int64_t b, int64_t e) {
    std::vector<std::vector<double>> local(nsums, std::vector<double>(static_cast<std::size_t>(r.n), 0.0));
    std::vector<double> xs(static_cast<std::size_t>(r.n));
    for (int64_t row = b; row < e; ++row) fn(row, xs, local);
    std::lock_guard<std::mutex> lock(mu);
    for (int s = 0; s < nsums; ++s)
      for (int64_t c = 0; c < r.n; ++c) sums[s][c] += local[s][c];
  });
}

}  // namespace

LayerNormResult layer_norm(const TensorView& x, int normalized_ndim, const TensorView* weight,
                           const TensorView* bias, double eps) {
  const Rows r = rows_of(x, normalized_ndim);
  LayerNormResult res;
  res.out.resize(static_cast<std::size_t>(r.rows * r.n));
  res.mean.resize(static_cast<std::size_t>(r.rows));
  res.rstd.resize(static_cast<std::size_t>(r.rows));
  std::vector<std::vector<double>> unused;
  over_rows(r, 0, unused, [&](int64_t row, std::vector<double>& xs, auto&) {
    double sum = 0;
    for (int64_t c = 0; c < r.n; ++c) sum += xs[c] = host::load_double(x, row * r.n + c);
    const double mean = sum / static_cast<double>(r.n);
    double sq = 0;
    for (int64_t c = 0; c < r.n; ++c) sq += (xs[c] - mean) * (xs[c] - mean);
    const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(r.n) + eps);
    for (int64_t c = 0; c < r.n; ++c)
      res.out[row * r.n + c] = (xs[c] - mean) * rstd * param(weight, c, 1.0) + param(bias, c, 0.0);
    res.mean[row] = mean;
    res.rstd[row] = rstd;
  });
  return res;
}

LayerNormGrads layer_norm_backward(const TensorView& grad_out, const TensorView& x, int normalized_ndim,
                                   const TensorView& mean, const TensorView& rstd, const TensorView* weight) {
  const Rows r = rows_of(x, normalized_ndim);
  LayerNormGrads g;
  g.grad_in.resize(static_cast<std::size_t>(r.rows * r.n));
  std::vector<std::vector<double>> sums;
  over_rows(r, 2, sums, [&](int64_t row, std::vector<double>& xh, auto& local) {
    const double mu = host::load_double(mean, row), rs = host::load_double(rstd, row);
    std::vector<double> dy(static_cast<std::size_t>(r.n));
    double a = 0, b = 0;  // sum(w dy), sum(w dy xhat)
    for (int64_t c = 0; c < r.n; ++c) {
      xh[c] = (host::load_double(x, row * r.n + c) - mu) * rs;
      dy[c] = host::load_double(grad_out, row * r.n + c);
      const double wdy = param(weight, c, 1.0) * dy[c];
      a += wdy;
      b += wdy * xh[c];
      local[0][c] += dy[c] * xh[c];
      local[1][c] += dy[c];
    }
    a /= static_cast<double>(r.n);
    b /= static_cast<double>(r.n);
    for (int64_t c = 0; c < r.n; ++c)
      g.grad_in[row * r.n + c] = rs * (param(weight, c, 1.0) * dy[c] - a - xh[c] * b);
  });
  g.grad_weight = std::move(sums[0]);
  g.grad_bias = std::move(sums[1]);
  return g;
}

RmsNormResult rms_norm(const TensorView& x, int normalized_ndim, const TensorView* weight, double eps,
                       double weight_offset) {
  const Rows r = rows_of(x, normalized_ndim);
  RmsNormResult res;
  res.out.resize(static_cast<std::size_t>(r.rows * r.n));
  res.rstd.resize(static_cast<std::size_t>(r.rows));
  std::vector<std::vector<double>> unused;
  over_rows(r, 0, unused, [&](int64_t row, std::vector<double>& xs, auto&) {
    double sq = 0;
    for (int64_t c = 0; c < r.n; ++c) {
      xs[c] = host::load_double(x, row * r.n + c);
      sq += xs[c] * xs[c];
    }
    const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(r.n) + eps);
    for (int64_t c = 0; c < r.n; ++c) res.out[row * r.n + c] = xs[c] * rstd * (param(weight, c, 1.0) + weight_offset);
    res.rstd[row] = rstd;
  });
  return res;
}

RmsNormGrads rms_norm_backward(const TensorView& grad_out, const TensorView& x, int normalized_ndim,
                               const TensorView& rstd, const TensorView* weight, double weight_offset) {
  const Rows r = rows_of(x, normalized_ndim);
  RmsNormGrads g;
  g.grad_in.resize(static_cast<std::size_t>(r.rows * r.n));
  std::vector<std::vector<double>> sums;
  over_rows(r, 1, sums, [&](int64_t row, std::vector<double>& xh, auto& local) {
    const double rs = host::load_double(rstd, row);
    std::vector<double> dy(static_cast<std::size_t>(r.n));
    double b = 0;  // sum(w dy xhat)
    for (int64_t c = 0; c < r.n; ++c) {
      xh[c] = host::load_double(x, row * r.n + c) * rs;
      dy[c] = host::load_double(grad_out, row * r.n + c);
      b += (param(weight, c, 1.0) + weight_offset) * dy[c] * xh[c];
      local[0][c] += dy[c] * xh[c];
    }
    b /= static_cast<double>(r.n);
    for (int64_t c = 0; c < r.n; ++c)
      g.grad_in[row * r.n + c] = rs * ((param(weight, c, 1.0) + weight_offset) * dy[c] - xh[c] * b);
  });
  g.grad_weight = std::move(sums[0]);
  return g;
}

namespace {

// input + residual rounded to input's dtype, row-major, in `storage`.
TensorView rounded_sum(const TensorView& x, const TensorView& r, std::vector<unsigned char>& storage) {
  storage.assign(static_cast<std::size_t>(x.numel()) * dtype_size(x.dtype), 0);
  const TensorView s = TensorView::make(storage.data(), x.dtype, x.shape, nullptr, x.ndim, x.device);
  host::parallel_for(x.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) host::store_double(s, i, host::load_double(x, i) + host::load_double(r, i));
  });
  return s;
}

std::vector<double> values(const TensorView& t) {
  return host::tabulate(t.numel(), [&](int64_t i) { return host::load_double(t, i); });
}

void add_into(std::vector<double>& g, const TensorView* d) {
  if (!d) return;
  for (std::size_t i = 0; i < g.size(); ++i) g[i] += host::load_double(*d, static_cast<int64_t>(i));
}

}  // namespace

AddNormResult add_layer_norm(const TensorView& input, const TensorView& residual, const TensorView* weight,
                             const TensorView* bias, double eps) {
  std::vector<unsigned char> storage;
  const TensorView s = rounded_sum(input, residual, storage);
  LayerNormResult r = layer_norm(s, 1, weight, bias, eps);
  return {values(s), std::move(r.out), std::move(r.mean), std::move(r.rstd)};
}

AddNormResult add_rms_norm(const TensorView& input, const TensorView& residual, const TensorView* weight,
                           double eps) {
  std::vector<unsigned char> storage;
  const TensorView s = rounded_sum(input, residual, storage);
  RmsNormResult r = rms_norm(s, 1, weight, eps);
  return {values(s), std::move(r.out), {}, std::move(r.rstd)};
}

LayerNormGrads add_layer_norm_backward(const TensorView& grad_out, const TensorView* grad_residual_out,
                                       const TensorView& residual_out, const TensorView& mean,
                                       const TensorView& rstd, const TensorView* weight) {
  LayerNormGrads g = layer_norm_backward(grad_out, residual_out, 1, mean, rstd, weight);
  add_into(g.grad_in, grad_residual_out);
  return g;
}

RmsNormGrads add_rms_norm_backward(const TensorView& grad_out, const TensorView* grad_residual_out,
                                   const TensorView& residual_out, const TensorView& rstd, const TensorView* weight) {
  RmsNormGrads g = rms_norm_backward(grad_out, residual_out, 1, rstd, weight);
  add_into(g.grad_in, grad_residual_out);
  return g;
}

}  // namespace tessera::reference
