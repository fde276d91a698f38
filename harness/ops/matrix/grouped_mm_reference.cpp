#include "ops/matrix/grouped_mm_reference.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "bench/host.hpp"

namespace tessera::reference {

namespace {

// A 2-d or 3-d host view as dense [batches][rows][cols] doubles; with `transpose`, each matrix
// stored [cols][rows] instead (other as [.., N, K]: both operands of a dot product contiguous).
struct Dense {
  int64_t batches = 1, rows = 0, cols = 0;
  std::vector<double> v;
  // Row r of batch b (a 2-d view's only matrix for any b): `cols` contiguous values.
  const double* row(int64_t b, int64_t r) const {
    return v.data() + ((batches == 1 ? 0 : b) * rows + r) * cols;
  }
};

Dense dense(const TensorView& t, bool transpose) {
  Dense d;
  d.batches = t.ndim == 3 ? t.shape[0] : 1;
  const int64_t r = t.shape[t.ndim - 2], c = t.shape[t.ndim - 1];
  d.rows = transpose ? c : r;
  d.cols = transpose ? r : c;
  d.v = host::tabulate(t.numel(), [&](int64_t i) {  // i: the dense index, row-major over d's shape
    const int64_t b = i / (r * c), x = i / d.cols % d.rows, y = i % d.cols;
    return host::load_double(t, (b * r + (transpose ? y : x)) * c + (transpose ? x : y));
  });
  return d;
}

double dot(const double* a, const double* b, int64_t begin, int64_t end) {
  double acc = 0;
  for (int64_t k = begin; k < end; ++k) acc += a[k] * b[k];
  return acc;
}

// The group of each of `extent` indices (rows or columns); -1 past the last end.
std::vector<int64_t> group_of(const std::vector<int64_t>& ends, int64_t extent) {
  std::vector<int64_t> g(static_cast<std::size_t>(extent), -1);
  int64_t begin = 0;
  for (std::size_t i = 0; i < ends.size(); ++i) {
    for (int64_t r = begin; r < ends[i]; ++r) g[static_cast<std::size_t>(r)] = static_cast<int64_t>(i);
    begin = ends[i];
  }
  return g;
}

}  // namespace

std::vector<int64_t> grouped_ends(const TensorView& offs, int64_t extent) {
  std::vector<int64_t> ends(static_cast<std::size_t>(offs.numel()));
  int64_t end = 0;
  for (std::size_t g = 0; g < ends.size(); ++g) {
    const auto o = static_cast<int64_t>(host::load_double(offs, static_cast<int64_t>(g)));
    end = std::min(std::max(o, end), extent);
    ends[g] = end;
  }
  return ends;
}

std::vector<double> grouped_mm(const TensorView& input, const TensorView& other, const TensorView* offs,
                               const TensorView& out, std::vector<char>* zeroed) {
  const Dense a = dense(input, false), bt = dense(other, true);  // bt: [.., N, K]
  const int64_t m = a.rows, k = a.cols, n = bt.rows, total = out.numel();
  const bool a3 = input.ndim == 3, b3 = other.ndim == 3;
  std::vector<char> zero(static_cast<std::size_t>(total), 0);
  std::vector<double> ref;
  if (a3 && b3) {  // batched: out[g] = input[g] @ other[g]
    ref = host::tabulate(total, [&](int64_t idx) {
      const int64_t g = idx / (m * n), i = idx / n % m, j = idx % n;
      return dot(a.row(g, i), bt.row(g, j), 0, k);
    });
  } else if (!a3 && b3) {  // rows: row i of group g times other[g]
    const std::vector<int64_t> group = group_of(grouped_ends(*offs, m), m);
    ref = host::tabulate(total, [&](int64_t idx) {
      const int64_t g = group[static_cast<std::size_t>(idx / n)];
      return g < 0 ? 0.0 : dot(a.row(0, idx / n), bt.row(g, idx % n), 0, k);
    });
    for (int64_t idx = 0; idx < total; ++idx) zero[static_cast<std::size_t>(idx)] = group[static_cast<std::size_t>(idx / n)] < 0;
  } else if (a3 && !b3) {  // columns: column j of group g is input[g] times other's column j
    const std::vector<int64_t> group = group_of(grouped_ends(*offs, n), n);
    ref = host::tabulate(total, [&](int64_t idx) {
      const int64_t g = group[static_cast<std::size_t>(idx % n)];
      return g < 0 ? 0.0 : dot(a.row(g, idx / n), bt.row(0, idx % n), 0, k);
    });
    for (int64_t idx = 0; idx < total; ++idx) zero[static_cast<std::size_t>(idx)] = group[static_cast<std::size_t>(idx % n)] < 0;
  } else {  // depth: out[g] = input[:, K_g] @ other[K_g, :]
    const std::vector<int64_t> ends = grouped_ends(*offs, k);
    ref = host::tabulate(total, [&](int64_t idx) {
      const auto g = static_cast<std::size_t>(idx / (m * n));
      const int64_t i = idx / n % m, j = idx % n;
      return dot(a.row(0, i), bt.row(0, j), g ? ends[g - 1] : 0, ends[g]);
    });
    for (int64_t idx = 0; idx < total; ++idx) {
      const auto g = static_cast<std::size_t>(idx / (m * n));
      zero[static_cast<std::size_t>(idx)] = (g ? ends[g - 1] : 0) == ends[g];
    }
  }
  if (zeroed) *zeroed = std::move(zero);
  return ref;
}

}  // namespace tessera::reference
