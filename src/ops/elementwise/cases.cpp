// Verify and bench cases for the elementwise family: what `tessera verify|bench|profile` run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>

#include "ops/elementwise/reference.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "runtime/check.hpp"
#include "runtime/host.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera::ops {
namespace {

using Shape = std::vector<int64_t>;
const std::vector<DType> kFloatTypes = {DType::float32, DType::float16, DType::bfloat16};
constexpr int64_t kOverInt32 = (int64_t(1) << 31) + 17;  // one tensor of more than 2^31 elements


// ---- add ------------------------------------------------------------------------------------
struct AddSpec {
  Shape a, b;  // b empty with host_scalar
  Layout la = Layout::contiguous, lb = Layout::contiguous;
  double alpha = 1.0;
  bool host_scalar = false;
  bool in_place = false;
};

VerifyResult run_add(DType dt, const AddSpec& s) {
  cudaStream_t stream = nullptr;
  TestTensor a = make_tensor(dt, s.a, s.la);
  fill_random(a, -4, 4, stream);
  TestTensor b;
  const double scalar = 1.75;
  TensorView out_shape = a.view;
  if (!s.host_scalar) {
    b = make_tensor(dt, s.b, s.lb);
    fill_random(b, -4, 4, stream);
    out_shape.ndim = detail::broadcast_shapes("add", a.view, b.view, out_shape.shape);
  }
  std::string name = std::string(dtype_name(dt)) + " a" + shape_str(s.a) + " " + layout_name(s.la);
  name += s.host_scalar ? " + scalar" : " + b" + shape_str(s.b) + " " + layout_name(s.lb);
  if (s.alpha != 1.0) name += " alpha=" + std::to_string(s.alpha).substr(0, 5);
  if (s.in_place) name += " in-place";

  const HostCopy ha = to_host(a);
  std::vector<double> ref;
  if (s.host_scalar) {
    ref = reference::add(ha.view, scalar, s.alpha);
  } else {
    const HostCopy hb = to_host(b);
    ref = reference::add(detail::broadcast_to("add", "a", ha.view, out_shape),
                         detail::broadcast_to("add", "b", hb.view, out_shape), s.alpha);
  }
  TestTensor out_storage;
  const TestTensor* out = &a;
  if (!s.in_place) {
    out_storage = make_tensor(dt, Shape(out_shape.shape, out_shape.shape + out_shape.ndim), Layout::contiguous);
    fill_poison(out_storage, stream);
    out = &out_storage;
  }
  if (s.host_scalar) add(a.view, scalar, out->view, s.alpha, stream);
  else add(a.view, b.view, out->view, s.alpha, stream);
  return compare("add", name, *out, ref, stream);
}

std::vector<VerifyCase> add_cases() {
  std::vector<AddSpec> specs = {
      {{1000003}, {1000003}},                                        // odd size: vector tail
      {{1 << 16}, {1 << 16}},                                        // launch-bound size
      {{3, 5}, {3, 5}},                                              // smaller than a vector
      {{1000003}, {1000003}, Layout::offset, Layout::contiguous},    // scalar-width path
      {{257, 129}, {257, 129}, Layout::transposed, Layout::contiguous},
      {{64, 1000}, {64, 1000}, Layout::strided, Layout::strided},
      {{333, 96}, {96}},                                             // bias over rows, vector path
      {{333, 97}, {97}},                                             // bias over rows, scalar path
      {{40, 96}, {96}, Layout::contiguous, Layout::strided},         // strided bias: general path
      {{4, 1}, {1, 5}},                                              // two-sided broadcast
      {{5}, {4, 5}},                                                 // a broadcast
      {{1000003}, {1}},                                              // device scalar
      {{1000}, {}},                                                  // 0-d b
      {{1000003}, {}, Layout::contiguous, Layout::contiguous, -0.5, true},  // host scalar
      {{1001, 3}, {1001, 3}, Layout::transposed, Layout::contiguous, -0.5, true},
      {{1000003}, {1000003}, Layout::contiguous, Layout::contiguous, 2.5},
      {{100003}, {100003}, Layout::contiguous, Layout::contiguous, 1.0, false, true},
      {{0, 7}, {0, 7}},                                              // empty
      {{0}, {1}},
  };
  std::vector<VerifyCase> cases;
  for (DType dt : kFloatTypes)
    for (const AddSpec& s : specs)
      cases.push_back({std::string(dtype_name(dt)) + " " + shape_str(s.a), false, [dt, s] { return run_add(dt, s); }});
  cases.push_back({"float16 a[2^31+17] + b[2^31+17]", true,
                   [] { return run_add(DType::float16, {{kOverInt32}, {kOverInt32}}); }});
  return cases;
}

BenchCase add_bench(DType dt, int64_t n) {
  struct State { TestTensor a, b, out; };
  auto st = std::make_shared<State>();
  st->a = make_tensor(dt, {n}, Layout::contiguous);
  st->b = make_tensor(dt, {n}, Layout::contiguous);
  st->out = make_tensor(dt, {n}, Layout::contiguous);
  fill_random(st->a, -1, 1, nullptr);
  fill_random(st->b, -1, 1, nullptr);
  BenchCase c;
  c.op = "add";
  c.dtype = dtype_name(dt);
  c.shape = shape_str({n});
  c.size = n;
  c.bytes = 3.0 * n * dtype_size(dt);
  State* s = st.get();
  c.run = [s](cudaStream_t stream) { add(s->a.view, s->b.view, s->out.view, 1.0, stream); };
  c.state = st;
  return c;
}

// ---- gelu -----------------------------------------------------------------------------------
struct GeluSpec {
  Shape shape;
  Layout layout = Layout::contiguous;
  double lo = -6, hi = 6;  // input range
};

const char* approx_name(GeluApproximate a) { return a == GeluApproximate::tanh ? "tanh" : "none"; }

VerifyResult run_gelu(DType dt, GeluApproximate ap, bool backward, const GeluSpec& s) {
  cudaStream_t stream = nullptr;
  TestTensor x = make_tensor(dt, s.shape, s.layout);
  fill_random(x, s.lo, s.hi, stream);
  TestTensor dy;
  std::vector<double> ref;
  const HostCopy hx = to_host(x);
  if (backward) {
    dy = make_tensor(dt, s.shape, s.layout == Layout::transposed ? Layout::contiguous : s.layout);
    fill_random(dy, -2, 2, stream);
    ref = reference::gelu_backward(to_host(dy).view, hx.view, ap);
  } else {
    ref = reference::gelu(hx.view, ap);
  }
  TestTensor out = make_tensor(dt, s.shape, s.layout == Layout::offset ? Layout::offset : Layout::contiguous);
  fill_poison(out, stream);
  if (backward) gelu_backward(dy.view, x.view, out.view, ap, stream);
  else gelu(x.view, out.view, ap, stream);
  const std::string op = backward ? "gelu_backward" : "gelu";
  std::string range;
  if (s.lo != -6 || s.hi != 6) range = " x in [" + std::to_string(s.lo).substr(0, 4) + ", " + std::to_string(s.hi).substr(0, 4) + ")";
  return compare(op, std::string(dtype_name(dt)) + " " + shape_str(s.shape) + " " + layout_name(s.layout) +
                         " approximate=" + approx_name(ap) + range,
                 out, ref, stream);
}

std::vector<VerifyCase> gelu_cases(GeluApproximate ap, bool backward) {
  const std::vector<GeluSpec> specs = {
      {{1000003}}, {{1 << 16}}, {{7}}, {{1000003}, Layout::offset}, {{513, 257}, Layout::transposed},
      {{300, 1001}, Layout::strided}, {{2, 3, 4, 5, 6}}, {{0, 3}},
      // Negative inputs only: small outputs, where cancellation in 1 + tanh or 1 + erf would
      // show as a large relative error that the mixed-sign cases hide.
      {{100003}, Layout::contiguous, -14, -1.5},
  };
  std::vector<VerifyCase> cases;
  for (DType dt : kFloatTypes)
    for (const GeluSpec& s : specs)
      cases.push_back({std::string(dtype_name(dt)) + " " + shape_str(s.shape), false,
                       [=] { return run_gelu(dt, ap, backward, s); }});
  cases.push_back({"bfloat16 [2^31+17]", true,
                   [=] { return run_gelu(DType::bfloat16, ap, backward, {{kOverInt32}}); }});
  return cases;
}

BenchCase gelu_bench(DType dt, int64_t n, GeluApproximate ap, bool backward) {
  struct State { TestTensor x, dy, out; };
  auto st = std::make_shared<State>();
  st->x = make_tensor(dt, {n}, Layout::contiguous);
  st->out = make_tensor(dt, {n}, Layout::contiguous);
  fill_random(st->x, -4, 4, nullptr);
  if (backward) {
    st->dy = make_tensor(dt, {n}, Layout::contiguous);
    fill_random(st->dy, -1, 1, nullptr);
  }
  BenchCase c;
  c.op = std::string(ap == GeluApproximate::tanh ? "gelu_tanh" : "gelu") + (backward ? "_backward" : "");
  c.dtype = dtype_name(dt);
  c.shape = shape_str({n});
  c.size = n;
  c.bytes = (backward ? 3.0 : 2.0) * n * dtype_size(dt);
  State* s = st.get();
  if (backward)
    c.run = [s, ap](cudaStream_t stream) { gelu_backward(s->dy.view, s->x.view, s->out.view, ap, stream); };
  else
    c.run = [s, ap](cudaStream_t stream) { gelu(s->x.view, s->out.view, ap, stream); };
  c.state = st;
  return c;
}

// ---- exact results (dropout, copy) -------------------------------------------------------
// v rounded to dtype the way the kernels round: to float first, then to the storage type.
double round_to(DType dt, double v) {
  const auto f = static_cast<float>(v);
  switch (dt) {
    case DType::float16: return __half2float(__float2half_rn(f));
    case DType::bfloat16: return __bfloat162float(__float2bfloat16_rn(f));
    default: return f;
  }
}

// Operators whose every output element is determined exactly (a copy; a dropout, whose kept
// elements are x * scale in float rounded once to the storage type): fails `r` unless every
// element equals its reference rounded to the output dtype, and counts the elements whose zero /
// non-zero state (the keep decision, for a dropout) differs. The relative-norm check that
// compare() makes cannot see one flipped element among a million; this one can.
void check_exact(VerifyResult& r, const TestTensor& out, const std::vector<double>& ref) {
  const HostCopy h = to_host(out);
  const int64_t n = out.view.numel();
  std::mutex mu;
  int64_t differ = 0, flipped = 0;
  double max_abs = 0;
  runtime::parallel_for(n, [&](int64_t b, int64_t e) {
    int64_t ld = 0, lf = 0;
    double lm = 0;
    for (int64_t i = b; i < e; ++i) {
      const double v = runtime::load_double(h.view, i), want = round_to(out.view.dtype, ref[i]);
      if (!(v == want)) {
        ++ld;
        lm = std::max(lm, std::isnan(v) ? INFINITY : std::fabs(v - want));
      }
      if ((v == 0) != (ref[i] == 0)) ++lf;
    }
    std::lock_guard<std::mutex> lock(mu);
    differ += ld;
    flipped += lf;
    max_abs = std::max(max_abs, lm);
  });
  r.max_abs = max_abs;
  if (r.passed && differ > 0) {
    r.passed = false;
    r.detail = std::to_string(differ) + " elements differ from the exact result in " +
               dtype_name(out.view.dtype) + " (" + std::to_string(flipped) + " zero where it should not be or not zero where it should)";
  }
}

// ---- dropout --------------------------------------------------------------------------------
struct DropoutSpec {
  Shape shape;
  Layout layout = Layout::contiguous;  // of x (or grad_out)
  double p = 0.5;
  uint64_t offset = 0;
  uint64_t seed = 0x243f6a8885a308d3ull;
  Layout out_layout = Layout::contiguous;
  bool in_place = false;
};

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
  return buf;
}

VerifyResult run_dropout(DType dt, bool backward, const DropoutSpec& s) {
  cudaStream_t stream = nullptr;
  TestTensor x = make_tensor(dt, s.shape, s.layout);
  fill_random(x, -4, 4, stream);
  const HostCopy hx = to_host(x);
  const std::vector<double> ref = backward ? reference::dropout_backward(hx.view, s.p, s.seed, s.offset)
                                           : reference::dropout(hx.view, s.p, s.seed, s.offset);
  TestTensor out_storage;
  const TestTensor* out = &x;
  if (!s.in_place) {
    out_storage = make_tensor(dt, s.shape, s.out_layout);
    fill_poison(out_storage, stream);
    out = &out_storage;
  }
  if (backward) dropout_backward(x.view, out->view, s.p, s.seed, s.offset, stream);
  else dropout(x.view, out->view, s.p, s.seed, s.offset, stream);
  std::string name = std::string(dtype_name(dt)) + " " + shape_str(s.shape) + " " + layout_name(s.layout);
  if (s.in_place) name += " in-place";
  else if (s.out_layout != Layout::contiguous) name += " -> " + std::string(layout_name(s.out_layout));
  name += " p=" + std::to_string(s.p).substr(0, 4) + " seed=" + hex(s.seed) + " offset=" + hex(s.offset);
  VerifyResult r = compare(backward ? "dropout_backward" : "dropout", name, *out, ref, stream);
  check_exact(r, *out, ref);
  return r;
}

std::vector<VerifyCase> dropout_cases(bool backward) {
  constexpr uint64_t kCarry = (uint64_t(1) << 32) - 1000;  // counters cross into the high word
  const std::vector<DropoutSpec> specs = {
      {{1000003}, Layout::contiguous, 0.1},                      // odd size: vector tail
      {{7}, Layout::contiguous, 0.5},                            // smaller than a vector
      {{33}, Layout::contiguous, 0.3, 5},                        // one group of 4 split by the end
      {{1 << 16}, Layout::contiguous, 0.5, 3},
      {{2, 3, 4, 5, 6}, Layout::contiguous, 0.5, 11},
      {{1000003}, Layout::offset, 0.5, 12345, 0x0123456789abcdefull, Layout::offset},  // scalar path
      {{4099}, Layout::offset, 0.25, 1, 7},                       // misaligned x, aligned out
      {{513, 257}, Layout::transposed, 0.1, 99},                 // mask from the logical index
      {{300, 1001}, Layout::strided, 0.9, 1 << 20},
      {{257, 129}, Layout::contiguous, 0.5, 0, 42, Layout::transposed},  // strided output
      {{1000003}, Layout::contiguous, 0.0},                      // exact copy
      {{1000003}, Layout::contiguous, 1.0},                      // all zeros
      {{1000003}, Layout::contiguous, 0.9, kCarry, 0xfedcba9876543210ull},
      {{100003}, Layout::contiguous, 0.5, 77, 1, Layout::contiguous, true},  // in place
      {{100003}, Layout::strided, 0.5, 78, 2, Layout::strided, true},         // in place, strided
      {{0, 5}, Layout::contiguous, 0.5},
  };
  std::vector<VerifyCase> cases;
  for (DType dt : kFloatTypes)
    for (const DropoutSpec& s : specs)
      cases.push_back({std::string(dtype_name(dt)) + " " + shape_str(s.shape), false,
                       [=] { return run_dropout(dt, backward, s); }});
  cases.push_back({"bfloat16 [2^31+17]", true, [=] {
                     return run_dropout(DType::bfloat16, backward, {{kOverInt32}, Layout::contiguous, 0.5, kCarry});
                   }});
  return cases;
}

BenchCase dropout_bench(DType dt, int64_t n, bool backward) {
  struct State { TestTensor x, out; };
  auto st = std::make_shared<State>();
  st->x = make_tensor(dt, {n}, Layout::contiguous);
  st->out = make_tensor(dt, {n}, Layout::contiguous);
  fill_random(st->x, -1, 1, nullptr);
  BenchCase c;
  c.op = backward ? "dropout_backward" : "dropout";
  c.dtype = dtype_name(dt);
  c.shape = shape_str({n});
  c.size = n;
  c.bytes = 2.0 * n * dtype_size(dt);  // x in, out out: the mask is regenerated, never stored
  State* s = st.get();
  constexpr double p = 0.1;
  constexpr uint64_t seed = 1234, offset = 0;
  if (backward)
    c.run = [s](cudaStream_t stream) { dropout_backward(s->x.view, s->out.view, p, seed, offset, stream); };
  else
    c.run = [s](cudaStream_t stream) { dropout(s->x.view, s->out.view, p, seed, offset, stream); };
  c.state = st;
  return c;
}

// ---- copy -----------------------------------------------------------------------------------
struct CopySpec {
  Shape shape;
  Layout src = Layout::contiguous, dst = Layout::contiguous;
};

VerifyResult run_copy(DType dt, const CopySpec& s) {
  cudaStream_t stream = nullptr;
  TestTensor src = make_tensor(dt, s.shape, s.src);
  fill_random(src, -4, 4, stream);
  const HostCopy hs = to_host(src);
  std::vector<double> ref(static_cast<std::size_t>(src.view.numel()));
  runtime::parallel_for(src.view.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) ref[i] = runtime::load_double(hs.view, i);
  });
  TestTensor dst = make_tensor(dt, s.shape, s.dst);
  fill_poison(dst, stream);
  copy(src.view, dst.view, stream);
  VerifyResult r = compare("copy", std::string(dtype_name(dt)) + " " + shape_str(s.shape) + " " +
                                       layout_name(s.src) + " -> " + layout_name(s.dst),
                           dst, ref, stream);
  check_exact(r, dst, ref);
  return r;
}

std::vector<VerifyCase> copy_cases() {
  const std::vector<CopySpec> specs = {
      {{513, 257}, Layout::transposed, Layout::contiguous},
      {{300, 1001}, Layout::strided, Layout::contiguous},
      {{513, 257}, Layout::contiguous, Layout::transposed},
      {{7, 9, 11}, Layout::transposed, Layout::strided},
      {{64, 1000}, Layout::strided, Layout::strided},
      {{1000003}, Layout::offset, Layout::contiguous},     // dense: one memcpy
      {{1000003}, Layout::contiguous, Layout::offset},
      {{1000003}, Layout::contiguous, Layout::strided},
      {{1}, Layout::contiguous, Layout::strided},
      {{0, 4}, Layout::transposed, Layout::contiguous},
  };
  std::vector<VerifyCase> cases;
  for (DType dt : kFloatTypes)
    for (const CopySpec& s : specs)
      cases.push_back({std::string(dtype_name(dt)) + " " + shape_str(s.shape), false, [=] { return run_copy(dt, s); }});
  return cases;
}

BenchCase copy_bench(DType dt, int64_t n) {
  struct State { TestTensor src, dst; };
  auto st = std::make_shared<State>();
  st->src = make_tensor(dt, {n}, Layout::contiguous);
  st->dst = make_tensor(dt, {n}, Layout::contiguous);
  fill_random(st->src, -1, 1, nullptr);
  BenchCase c;
  c.op = "copy";
  c.dtype = dtype_name(dt);
  c.shape = shape_str({n});
  c.size = n;
  c.bytes = 2.0 * n * dtype_size(dt);
  State* s = st.get();
  c.run = [s](cudaStream_t stream) { copy(s->src.view, s->dst.view, stream); };
  c.state = st;
  return c;
}

std::vector<int64_t> pow2_sizes(int lo, int hi, int step) {
  std::vector<int64_t> v;
  for (int k = lo; k <= hi; k += step) v.push_back(int64_t(1) << k);
  return v;
}

}  // namespace

void register_elementwise(std::vector<OpInfo>& ops) {
  const auto sizes = pow2_sizes(16, 28, 2);
  ops.push_back({"add", "elementwise", "out = a + alpha * b with broadcasting", kFloatTypes, sizes,
                 add_cases, add_bench});
  for (GeluApproximate ap : {GeluApproximate::none, GeluApproximate::tanh}) {
    const std::string base = ap == GeluApproximate::tanh ? "gelu_tanh" : "gelu";
    for (bool bwd : {false, true}) {
      ops.push_back({base + (bwd ? "_backward" : ""), "elementwise",
                     std::string("GELU ") + (bwd ? "backward" : "forward") + ", approximate='" +
                         approx_name(ap) + "'",
                     kFloatTypes, sizes, [ap, bwd] { return gelu_cases(ap, bwd); },
                     [ap, bwd](DType dt, int64_t n) { return gelu_bench(dt, n, ap, bwd); }});
    }
  }
  for (bool bwd : {false, true})
    ops.push_back({bwd ? "dropout_backward" : "dropout", "elementwise",
                   bwd ? "seeded dropout backward: grad_out * mask(seed, offset) / (1 - p)"
                       : "seeded inverted dropout on Philox4x32-10, mask regenerated, never stored",
                   kFloatTypes, sizes, [bwd] { return dropout_cases(bwd); },
                   [bwd](DType dt, int64_t n) { return dropout_bench(dt, n, bwd); }});
  ops.push_back({"copy", "elementwise", "dst = src between any two layouts of one shape", kFloatTypes,
                 sizes, copy_cases, copy_bench});
}

}  // namespace tessera::ops
