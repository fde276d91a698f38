// Verify and bench cases for add, and its registration: what `tessera verify|bench|profile add` run.
#include <memory>
#include <string>
#include <vector>

#include "ops/elementwise/add_reference.hpp"
#include "ops/elementwise/cases.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera::ops::elementwise {
namespace {

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
    out_shape.ndim = detail::broadcast_shapes("add", "input", a.view, "other", b.view, out_shape.shape);
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
    ref = reference::add(detail::broadcast_to("add", "input", ha.view, out_shape),
                         detail::broadcast_to("add", "other", hb.view, out_shape), s.alpha);
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

// a and b in, out written.
BenchShape add_shape(DType dt, int64_t n) { return flat_shape(dt, n, 2, 3); }

BenchCase add_bench(DType dt, int64_t n) {
  const BenchShape shape = add_shape(dt, n);
  struct State { TestTensor a, b, out; };
  auto st = std::make_shared<State>();
  st->a = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  st->b = make_tensor(dt, shape.shapes[1], Layout::contiguous);
  st->out = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  fill_random(st->a, -1, 1, nullptr);
  fill_random(st->b, -1, 1, nullptr);
  BenchCase c = bench_case("add", dt, n, shape);
  State* s = st.get();
  c.run = [s](cudaStream_t stream) { add(s->a.view, s->b.view, s->out.view, 1.0, stream); };
  c.state = st;
  return c;
}

const Registrar kRegistrar(10, [] {
  OpInfo op = op_info("add");
  op.verify_cases = add_cases;
  op.make_bench = add_bench;
  op.bench_shape = add_shape;
  return std::vector<OpInfo>{op};
});

}  // namespace
}  // namespace tessera::ops::elementwise
