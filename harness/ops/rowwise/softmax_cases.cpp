// Verify and bench cases for softmax, log_softmax and their backward functions, and their
// registration: what `tessera verify|bench|profile` run for them. The shapes walk every path of softmax.cu (warp, CTA, cluster
// and split rows, misaligned rows, the column and gather paths) and torch's special values.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ops/registry.hpp"
#include "ops/rowwise/cases.hpp"
#include "ops/rowwise/softmax_reference.hpp"
#include "ops/verify.hpp"
#include "runtime/check.hpp"
#include "bench/host.hpp"
#include "tessera/ops/rowwise.hpp"

namespace tessera::ops::rowwise {
namespace {

using Shape = std::vector<int64_t>;

enum class Kind { softmax, log_softmax, softmax_backward, log_softmax_backward };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::softmax: return "softmax";
    case Kind::log_softmax: return "log_softmax";
    case Kind::softmax_backward: return "softmax_backward";
    case Kind::log_softmax_backward: return "log_softmax_backward";
  }
  return "?";
}
bool is_backward(Kind k) { return k == Kind::softmax_backward || k == Kind::log_softmax_backward; }
bool is_log(Kind k) { return k == Kind::log_softmax || k == Kind::log_softmax_backward; }

struct Spec {
  Shape shape;
  int dim = -1;
  Layout in = Layout::contiguous;   // x, or grad_out and y
  Layout out = Layout::contiguous;  // out or grad_in (unless in_place)
  bool in_place = false;            // out is x / grad_in is grad_out
  bool special = false;             // rows with -inf, all -inf, NaN, +inf (see set_special_rows)
  int64_t narrow = 0;               // inputs: views of dimension -2 cut short by this many, so
                                    // that rows are not uniformly strided
};

constexpr double kInf = std::numeric_limits<double>::infinity();

// Writes torch's special cases into the first six rows (along dim) of t's host copy and back:
// row 0 every third element -inf (those give 0), row 1 all -inf (NaN), row 2 one NaN (NaN row),
// row 3 one +inf (NaN row: exp(inf - inf) enters the sum), row 4 all -inf but its last element
// (one 1, zeros), row 5 -inf over its first three quarters but for one NaN (NaN row: whole CTAs
// and parts see only -inf and NaN, and must still pass the NaN on). Backward inputs get the
// outputs' special values in row 0 of y instead: 0 (softmax) or -inf (log_softmax) every third
// element.
void set_special_rows(TestTensor& t, int dim, Kind kind) {
  HostCopy h = to_host(t);
  const reference::RowGeometry g = reference::row_geometry(h.view, dim);
  auto set = [&](int64_t row, int64_t k, double v) { host::store_double(h.view, g.index(row, k), v); };
  if (is_backward(kind)) {
    for (int64_t k = 0; k < g.n; k += 3) set(0, k, kind == Kind::log_softmax_backward ? -kInf : 0.0);
  } else {
    for (int64_t k = 0; k < g.n; k += 3) set(0, k, -kInf);
    for (int64_t k = 0; k < g.n; ++k) set(1, k, -kInf);
    set(2, g.n / 2, std::numeric_limits<double>::quiet_NaN());
    set(3, g.n / 3, kInf);
    for (int64_t k = 0; k + 1 < g.n; ++k) set(4, k, -kInf);
    for (int64_t k = 0; k < g.n * 3 / 4; ++k) set(5, k, k == g.n / 4 ? std::numeric_limits<double>::quiet_NaN() : -kInf);
  }
  to_device(t, h);
}

std::string case_name(DType dt, const Spec& s) {
  std::string name = std::string(dtype_name(dt)) + " " + shape_str(s.shape) + " dim=" + std::to_string(s.dim);
  if (s.in != Layout::contiguous) name += std::string(" in:") + layout_name(s.in);
  if (!s.in_place && s.out != Layout::contiguous) name += std::string(" out:") + layout_name(s.out);
  if (s.narrow) name += " narrowed";
  if (s.in_place) name += " in-place";
  if (s.special) name += " special values";
  return name;
}

// softmax's backward, y * (g - sum(y g)), subtracts two terms that can nearly cancel (y near 1 in a
// short row): the error grows with the condition number ||y (|g| + sum(y |g|))|| / ||dx||, the
// terms' size over the result's, which the bound takes (at least 1). The terms' size is the
// reference evaluated at |g| and -y, where the minus becomes a plus.
double cancellation(const HostCopy& grad, HostCopy y, int dim, const std::vector<double>& dx) {
  HostCopy g = grad;
  g.view.data = g.bytes.data() + (static_cast<const unsigned char*>(grad.view.data) - grad.bytes.data());
  y.view.data = y.bytes.data() + (static_cast<const unsigned char*>(y.view.data) - y.bytes.data());
  for (int64_t i = 0; i < g.view.numel(); ++i) {
    host::store_double(g.view, i, std::fabs(host::load_double(g.view, i)));
    host::store_double(y.view, i, -host::load_double(y.view, i));
  }
  const std::vector<double> terms = reference::softmax_backward(g.view, y.view, dim);
  double t2 = 0, r2 = 0;
  for (size_t i = 0; i < dx.size(); ++i) {
    if (!std::isfinite(terms[i]) || !std::isfinite(dx[i])) continue;
    t2 += terms[i] * terms[i];
    r2 += dx[i] * dx[i];
  }
  return r2 > 0 ? std::max(1.0, std::sqrt(t2 / r2)) : 1.0;
}

VerifyResult run_case(Kind kind, DType dt, const Spec& s) {
  cudaStream_t stream = nullptr;
  const int nd = static_cast<int>(s.shape.size());
  Shape storage_shape = s.shape;
  if (s.narrow) storage_shape[nd - 2] += s.narrow;
  auto input = [&](double lo, double hi) {
    TestTensor t = make_tensor(dt, storage_shape, s.in);
    fill_random(t, lo, hi, stream);
    if (s.narrow) t.view.shape[nd - 2] = s.shape[nd - 2];
    return t;
  };
  // Backward inputs shaped like real ones: y a probability (softmax) or a log-probability.
  TestTensor a = is_backward(kind) ? input(-1, 1) : input(-8, 8);  // x, or grad_out
  TestTensor y;
  if (is_backward(kind)) y = is_log(kind) ? input(-4, 0) : input(0, 1);
  if (s.special) set_special_rows(is_backward(kind) ? y : a, s.dim, kind);

  std::vector<double> ref;
  const HostCopy ha = to_host(a);
  switch (kind) {
    case Kind::softmax: ref = reference::softmax(ha.view, s.dim); break;
    case Kind::log_softmax: ref = reference::log_softmax(ha.view, s.dim); break;
    case Kind::softmax_backward: ref = reference::softmax_backward(ha.view, to_host(y).view, s.dim); break;
    case Kind::log_softmax_backward: ref = reference::log_softmax_backward(ha.view, to_host(y).view, s.dim); break;
  }
  TestTensor out_storage;
  const TestTensor* out = &a;
  if (!s.in_place) {
    out_storage = make_tensor(dt, s.shape, s.out);
    fill_poison(out_storage, stream);
    out = &out_storage;
  }
  switch (kind) {
    case Kind::softmax: softmax(a.view, s.dim, out->view, stream); break;
    case Kind::log_softmax: log_softmax(a.view, s.dim, out->view, stream); break;
    case Kind::softmax_backward: softmax_backward(a.view, y.view, s.dim, out->view, stream); break;
    case Kind::log_softmax_backward: log_softmax_backward(a.view, y.view, s.dim, out->view, stream); break;
  }
  // compare() also checks the special rows: where the reference is NaN the output must be NaN,
  // and -inf (log_softmax of -inf) must be -inf.
  const int dim = s.dim < 0 ? s.dim + int(s.shape.size()) : s.dim;
  const int64_t row = s.shape.empty() ? 1 : s.shape[size_t(dim)];  // a 0-d tensor is one row of one
  ErrorModel m = row_sums(s.shape, row);
  if (kind == Kind::softmax_backward) m.c *= cancellation(ha, to_host(y), s.dim, ref);
  return compare(kind_name(kind), case_name(dt, s), *out, ref, stream, m);
}

std::vector<Spec> specs(Kind kind) {
  const Layout C = Layout::contiguous, T = Layout::transposed, S = Layout::strided, O = Layout::offset;
  std::vector<Spec> v = {
      {{37, 1001}},               // odd N: rows misaligned, read through aligned frames (warp)
      {{64, 256}},                // warp per row
      {{8, 4096}},                // CTA per row
      {{3, 32768}},               // fp32: cluster of 2 on sm_90; 16-bit: CTA of 512
      {{2, 100003}},              // cluster of 8 (fp32) / 4 (16-bit), odd N
      {{2, 262144}},              // cluster of 16 or 8 (fp32), 8 (16-bit)
      {{2, 1100007}},             // split rows (two kernels through scratch)
      {{0, 128}},                 // no rows
      {{5, 0}},                   // empty rows
      {{}},                       // 0-d: one element
      {{17}},                     // 1-d
      {{100, 1}},                 // rows of one element
      {{129, 65}, 0},             // reduced dim not dense, few rows: gathered
      {{16, 40000}, 0},           // reduced dim not dense, many rows: column path
      {{20000, 16}, -1, T},       // transposed input, column path
      {{65, 300}, -1, T},         // transposed input, gathered
      {{300, 65}, 0, T, T},       // both transposed: dense rows 300 apart (row path)
      {{64, 1000}, -1, S},        // stride-2 rows: gathered
      {{50, 512}, -1, O},         // misaligned input, aligned output: scalar CTA path
      {{50, 20000}, -1, O},       // the same, split
      {{50, 512}, -1, O, O},      // both misaligned alike: aligned frames
      {{64, 1000}, -1, C, C, true},             // in place
      {{6, 7, 64}, -1, C, C, false, false, 1},  // rows not uniformly strided
      {{16, 1000}, -1, C, C, false, true},      // special values (warp path)
      // More rows than resident groups: the pipelined paths' steady state (next row loading
      // while the current one is reduced and stored).
      {{20000, 256}}, {{5000, 300}}, {{4096, 1000}}, {{4096, 4096}}, {{3000, 4000}, -1, O, O},
  };
  if (is_backward(kind)) return v;
  const std::vector<Spec> more = {
      {{3, 7, 6000}, 1},                         // middle dim of 3: column path
      {{4, 6, 130}, -1, C, C, true, false, 3},   // in place, rows not uniformly strided
      {{6, 40000}, -1, C, C, false, true},       // special values, cluster path
      {{8, 20000}, 0, C, C, false, true},        // special values, column path
      {{9, 7}, 0, C, C, false, true},            // special values, gathered
      {{6, 1100007}, -1, C, C, false, true},     // special values, split path
  };
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

std::vector<VerifyCase> cases(Kind kind) {
  std::vector<VerifyCase> c;
  for (DType dt : kFloatTypes)
    for (const Spec& s : specs(kind))
      c.push_back({case_name(dt, s), false, [kind, dt, s] { return run_case(kind, dt, s); }});
  // More than 2^31 elements: 64-bit offsets everywhere.
  const Spec large{{(int64_t(1) << 31) / 4096 + 1, 4096}};
  c.push_back({case_name(DType::bfloat16, large), true, [kind, large] { return run_case(kind, DType::bfloat16, large); }});
  return c;
}

// Forward: x in, out written. Backward: grad_out and y in, grad_in written.
BenchShape bench_shape(Kind kind, DType dt, int64_t n) {
  const int64_t rows = bench_rows(n);
  BenchShape s;
  s.shapes.assign(is_backward(kind) ? 2 : 1, Shape{rows, n});
  s.shape = shape_str({rows, n});
  s.bytes = (is_backward(kind) ? 3.0 : 2.0) * static_cast<double>(rows * n) * static_cast<double>(dtype_size(dt));
  return s;
}

BenchCase bench(Kind kind, DType dt, int64_t n) {
  const BenchShape shape = bench_shape(kind, dt, n);
  struct State { TestTensor a, y, out; };
  auto st = std::make_shared<State>();
  st->a = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  st->out = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  fill_random(st->a, is_backward(kind) ? -1 : -8, is_backward(kind) ? 1 : 8, nullptr);
  if (is_backward(kind)) {
    st->y = make_tensor(dt, shape.shapes[1], Layout::contiguous);
    fill_random(st->y, is_log(kind) ? -4 : 0, is_log(kind) ? 0 : 1, nullptr);
  }
  BenchCase c = bench_case(kind_name(kind), dt, n, shape);
  State* s = st.get();
  switch (kind) {
    case Kind::softmax: c.run = [s](cudaStream_t q) { softmax(s->a.view, -1, s->out.view, q); }; break;
    case Kind::log_softmax: c.run = [s](cudaStream_t q) { log_softmax(s->a.view, -1, s->out.view, q); }; break;
    case Kind::softmax_backward:
      c.run = [s](cudaStream_t q) { softmax_backward(s->a.view, s->y.view, -1, s->out.view, q); };
      break;
    case Kind::log_softmax_backward:
      c.run = [s](cudaStream_t q) { log_softmax_backward(s->a.view, s->y.view, -1, s->out.view, q); };
      break;
  }
  c.state = st;
  return c;
}

const Registrar kRegistrar(10, [] {
  std::vector<OpInfo> ops;
  for (Kind kind : {Kind::softmax, Kind::log_softmax, Kind::softmax_backward, Kind::log_softmax_backward}) {
    OpInfo op = op_info(kind_name(kind));
    op.bench_sizes = kBenchColumns;
    op.verify_cases = [kind = kind] { return cases(kind); };
    op.make_bench = [kind = kind](DType dt, int64_t n) { return bench(kind, dt, n); };
    op.bench_shape = [kind = kind](DType dt, int64_t n) { return bench_shape(kind, dt, n); };
    ops.push_back(op);
  }
  return ops;
});

}  // namespace
}  // namespace tessera::ops::rowwise
