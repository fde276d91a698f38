// Verify and bench cases for isin, and its registration: what `tessera verify|bench|profile isin`
// run. "isin" takes the automatic dispatch; isin_brute_force, isin_sort, isin_hash and isin_bitmap
// force one path, so that every path is checked on every case it supports.
#include <cuda_runtime_api.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ops/registry.hpp"
#include "ops/set/isin_reference.hpp"
#include "ops/verify.hpp"
#include "runtime/check.hpp"
#include "bench/host.hpp"
#include "tessera/ops/set.hpp"

namespace tessera::ops {
namespace {

using Shape = std::vector<int64_t>;
const std::vector<DType> kAllTypes = {DType::int32, DType::int64, DType::int8, DType::int16, DType::uint8,
                                      DType::float16, DType::bfloat16, DType::float32, DType::float64};

struct IsinSpec {
  Shape elements, test;
  Layout layout = Layout::contiguous;  // of elements
  double range = 0;                    // values drawn from [-range/2, range/2); 0: 4x the larger size
  bool invert = false;
  bool specials = false;               // NaN, -0.0, 0.0 and the dtype's extremes written into both
};

std::string op_name(IsinPath path) {
  return std::string("isin") + (path == IsinPath::automatic ? "" : std::string("_") + isin_path_name(path));
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Writes `values` over the first elements (row-major) of a test tensor, through a host copy.
void poke(TestTensor& t, const std::vector<long double>& values) {
  HostCopy h = to_host(t);
  const int64_t n = std::min<int64_t>(t.view.numel(), static_cast<int64_t>(values.size()));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t off = host::element_offset(h.view, i) * static_cast<int64_t>(dtype_size(t.view.dtype));
    const int64_t base = static_cast<const char*>(h.view.data) - reinterpret_cast<const char*>(h.bytes.data());
    void* p = h.bytes.data() + base + off;
    switch (t.view.dtype) {
      case DType::int8: *static_cast<int8_t*>(p) = static_cast<int8_t>(values[i]); break;
      case DType::int16: *static_cast<int16_t*>(p) = static_cast<int16_t>(values[i]); break;
      case DType::int32: *static_cast<int32_t*>(p) = static_cast<int32_t>(values[i]); break;
      case DType::int64: *static_cast<int64_t*>(p) = static_cast<int64_t>(values[i]); break;
      case DType::uint8: *static_cast<uint8_t*>(p) = static_cast<uint8_t>(values[i]); break;
      default: {
        host::store_double(h.view, i, static_cast<double>(values[i]));
      }
    }
  }
  to_device(t, h);
}

// Extremes of the dtype (the all-ones key of the integer types is its maximum), NaN, signed zeros.
std::vector<long double> specials_for(DType dt, bool for_test) {
  switch (dt) {
    case DType::int8: return {127, -128, 0, 5};
    case DType::int16: return {32767, -32768, 0, 5};
    case DType::int32: return {2147483647.0, -2147483648.0, 0, 5};
    case DType::int64: return {9223372036854775807.0L, -9223372036854775808.0L, 0, 5};  // exact in long double
    case DType::uint8: return {255, 0, 5};
    default:
      // test: NaN, -0.0, +inf; elements: NaN, +0.0, -0.0, +inf, -inf
      if (for_test) return {NAN, -0.0L, HUGE_VALL};
      return {NAN, 0.0L, -0.0L, HUGE_VALL, -HUGE_VALL};
  }
}

VerifyResult run_isin(DType dt, IsinPath path, const IsinSpec& s) {
  cudaStream_t stream = nullptr;
  TestTensor e = make_tensor(dt, s.elements, s.layout);
  TestTensor t = make_tensor(dt, s.test, Layout::contiguous);
  const double larger = static_cast<double>(std::max(numel(s.elements), numel(s.test)));
  double range = s.range > 0 ? s.range : 4 * larger;
  if (dt == DType::int8) range = std::min(range, 250.0);
  if (dt == DType::uint8) range = std::min(range, 250.0);
  if (dt == DType::int16 || dt == DType::float16 || dt == DType::bfloat16) range = std::min(range, 60000.0);
  const double lo = dt == DType::uint8 ? 0 : -range / 2;
  fill_random(e, lo, lo + range, stream);
  fill_random(t, lo, lo + range, stream);
  if (is_floating(dt)) {  // integral values in a float type, so that matches happen
    HostCopy he = to_host(e), ht = to_host(t);
    std::vector<long double> ve, vt;
    for (int64_t i = 0; i < e.view.numel(); ++i) ve.push_back(std::floor(host::load_double(he.view, i)));
    for (int64_t i = 0; i < t.view.numel(); ++i) vt.push_back(std::floor(host::load_double(ht.view, i)));
    poke(e, ve);
    poke(t, vt);
  }
  if (s.specials) {
    poke(e, specials_for(dt, false));
    poke(t, specials_for(dt, true));
  }
  TestTensor out = make_tensor(DType::bool_, s.elements, Layout::contiguous);
  fill_poison(out, stream);
  const std::vector<double> ref = reference::isin(to_host(e).view, to_host(t).view, s.invert);
  IsinOptions o;
  o.path = path;
  isin(e.view, t.view, out.view, false, s.invert, stream, o);
  std::string name = std::string(dtype_name(dt)) + " " + shape_str(s.elements) + " " + layout_name(s.layout) +
                     " in " + shape_str(s.test);
  if (s.invert) name += " invert";
  if (s.specials) name += " specials";
  if (s.range > 0) name += " range " + std::to_string(static_cast<long long>(s.range));
  VerifyResult r = compare(op_name(path), name, out, ref, stream);
  if (r.passed && r.max_abs != 0) {  // exact: one wrong bool fails
    r.passed = false;
    r.detail = "some outputs differ from the reference";
  }
  return r;
}

std::vector<VerifyCase> isin_cases(IsinPath path) {
  std::vector<IsinSpec> specs = {
      {{1000}, {1000}},
      {{1000003}, {1024}},
      {{100003}, {77777}},
      {{1 << 16}, {300}, Layout::contiguous, 64},          // many duplicates in both
      {{257, 129}, {1000}, Layout::transposed},           // non-contiguous elements
      {{64, 100}, {55}, Layout::strided, 0, true},        // strided, invert
      {{5000}, {3000}, Layout::contiguous, 0, false, true},  // NaN, -0.0, extremes
      {{5000}, {3000}, Layout::contiguous, 0, true, true},
      {{}, {1000}},                                       // 0-d elements
      {{1000}, {}},                                       // 0-d test_elements
      {{0}, {10}},                                        // empty elements
      {{100}, {0}},                                       // empty test_elements
      {{100}, {0}, Layout::contiguous, 0, true},
      {{3000}, {5000}, Layout::offset},
  };
  std::vector<VerifyCase> cases;
  for (DType dt : kAllTypes) {
    if (path == IsinPath::bitmap && dtype_size(dt) > 2) continue;
    for (const IsinSpec& s : specs)
      cases.push_back({std::string(dtype_name(dt)) + " " + shape_str(s.elements), false,
                       [=] { return run_isin(dt, path, s); }});
  }
  if (path == IsinPath::automatic || path == IsinPath::hash || path == IsinPath::sort) {
    cases.push_back({"int32 [2^24] in [2^24]", false,
                     [=] { return run_isin(DType::int32, path, {{1 << 24}, {1 << 24}}); }});
    cases.push_back({"int32 [2^31+17] in [2^16]", true,
                     [=] { return run_isin(DType::int32, path, {{(int64_t(1) << 31) + 17}, {1 << 16}}); }});
  }
  return cases;
}

// Bench: `size` is the number of elements; test_elements has as many (the square case of the
// PERF.md table). Both inputs read, the bools written.
BenchShape isin_shape(DType dt, int64_t n) {
  BenchShape s;
  s.shapes = {{n}, {n}};
  s.shape = shape_str({n}) + " in " + shape_str({n});
  s.bytes = 2.0 * static_cast<double>(n) * static_cast<double>(dtype_size(dt)) + static_cast<double>(n);
  return s;
}

// Values from a range 4x the size, so about a quarter are found.
BenchCase isin_bench(DType dt, int64_t n, IsinPath path) {
  const BenchShape shape = isin_shape(dt, n);
  struct State { TestTensor e, t, out; };
  auto st = std::make_shared<State>();
  st->e = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  st->t = make_tensor(dt, shape.shapes[1], Layout::contiguous);
  st->out = make_tensor(DType::bool_, shape.shapes[0], Layout::contiguous);
  const double range = std::min(4.0 * n, dtype_size(dt) == 1 ? 250.0 : dtype_size(dt) == 2 ? 60000.0 : 4.0 * n);
  fill_random(st->e, -range / 2, range / 2, nullptr);
  fill_random(st->t, -range / 2, range / 2, nullptr);
  BenchCase c = bench_case(op_name(path), dt, n, shape);
  State* s = st.get();
  IsinOptions o;
  o.path = path;
  c.run = [s, o](cudaStream_t stream) { isin(s->e.view, s->t.view, s->out.view, false, false, stream, o); };
  c.state = st;
  return c;
}

const Registrar kRegistrar(10, [] {
  std::vector<OpInfo> ops;
  for (IsinPath path : {IsinPath::automatic, IsinPath::brute_force, IsinPath::sort, IsinPath::hash, IsinPath::bitmap}) {
    OpInfo op;
    op.name = op_name(path);
    op.family = "set";
    if (path != IsinPath::automatic)  // isin's own is its description's
      op.summary = std::string("isin forced onto the ") + isin_path_name(path) + " path";
    op.dtypes = path == IsinPath::bitmap
                    ? std::vector<DType>{DType::int8, DType::int16, DType::uint8, DType::float16, DType::bfloat16}
                    : kAllTypes;
    op.bench_sizes = path == IsinPath::brute_force ? std::vector<int64_t>{1 << 10, 1 << 14, 1 << 16}  // M x N compares
                                                   : std::vector<int64_t>{1 << 10, 1 << 16, 1 << 20, 1 << 24};
    op.verify_cases = [path] { return isin_cases(path); };
    op.make_bench = [path](DType dt, int64_t n) { return isin_bench(dt, n, path); };
    op.size_meaning = "elements of both elements and test_elements";
    op.bench_shape = isin_shape;
    op.tolerance = [](DType, const ErrorModel&) { return 0.0; };  // exact: one wrong bool fails
    ops.push_back(op);
  }
  return ops;
});

}  // namespace
}  // namespace tessera::ops
