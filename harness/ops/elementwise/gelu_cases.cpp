// Verify and bench cases for GELU (erf and tanh forms, forward and backward), and their
// registration: what `tessera verify|bench|profile gelu` run.
#include <memory>
#include <string>
#include <vector>

#include "ops/elementwise/cases.hpp"
#include "ops/elementwise/gelu_reference.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera::ops::elementwise {
namespace {

struct GeluSpec {
  Shape shape;
  Layout layout = Layout::contiguous;
  double lo = -6, hi = 6;  // input range
};

const char* approx_name(GeluApproximate a) { return a == GeluApproximate::tanh ? "tanh" : "none"; }

std::string op_name(GeluApproximate ap, bool backward) {
  return std::string(ap == GeluApproximate::tanh ? "gelu_tanh" : "gelu") + (backward ? "_backward" : "");
}

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
  std::string range;
  if (s.lo != -6 || s.hi != 6) range = " x in [" + std::to_string(s.lo).substr(0, 4) + ", " + std::to_string(s.hi).substr(0, 4) + ")";
  return compare(op_name(ap, backward), std::string(dtype_name(dt)) + " " + shape_str(s.shape) + " " +
                                            layout_name(s.layout) + " approximate=" + approx_name(ap) + range,
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

// Forward: x in, out written. Backward: grad_out and x in, grad_in written.
BenchShape gelu_shape(DType dt, int64_t n, bool backward) {
  return backward ? flat_shape(dt, n, 2, 3) : flat_shape(dt, n, 1, 2);
}

BenchCase gelu_bench(DType dt, int64_t n, GeluApproximate ap, bool backward) {
  const BenchShape shape = gelu_shape(dt, n, backward);
  struct State { TestTensor x, dy, out; };
  auto st = std::make_shared<State>();
  const Shape& x_shape = shape.shapes[backward ? 1 : 0];
  st->x = make_tensor(dt, x_shape, Layout::contiguous);
  st->out = make_tensor(dt, x_shape, Layout::contiguous);
  fill_random(st->x, -4, 4, nullptr);
  if (backward) {
    st->dy = make_tensor(dt, shape.shapes[0], Layout::contiguous);
    fill_random(st->dy, -1, 1, nullptr);
  }
  BenchCase c = bench_case(op_name(ap, backward), dt, n, shape);
  State* s = st.get();
  if (backward)
    c.run = [s, ap](cudaStream_t stream) { gelu_backward(s->dy.view, s->x.view, s->out.view, ap, stream); };
  else
    c.run = [s, ap](cudaStream_t stream) { gelu(s->x.view, s->out.view, ap, stream); };
  c.state = st;
  return c;
}

const Registrar kRegistrar(20, [] {
  std::vector<OpInfo> ops;
  for (GeluApproximate ap : {GeluApproximate::none, GeluApproximate::tanh})
    for (bool bwd : {false, true}) {
      // The tanh form's own ops (gelu_tanh, gelu_tanh_backward) are the harness's: the library's
      // gelu takes approximate='tanh'.
      OpInfo op = ap == GeluApproximate::none
                      ? op_info(op_name(ap, bwd))
                      : op_info(op_name(ap, bwd), std::string("GELU ") + (bwd ? "backward" : "forward") +
                                                      ", approximate='tanh'");
      op.verify_cases = [ap, bwd] { return gelu_cases(ap, bwd); };
      op.make_bench = [ap, bwd](DType dt, int64_t n) { return gelu_bench(dt, n, ap, bwd); };
      op.bench_shape = [bwd](DType dt, int64_t n) { return gelu_shape(dt, n, bwd); };
      ops.push_back(op);
    }
  return ops;
});

}  // namespace
}  // namespace tessera::ops::elementwise
