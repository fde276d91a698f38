// Verify and bench cases for the elementwise family: what `tessera verify|bench|profile` run.
#include <memory>

#include "ops/elementwise/reference.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "runtime/check.hpp"
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
}

}  // namespace tessera::ops
