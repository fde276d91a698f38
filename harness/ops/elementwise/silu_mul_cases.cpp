// SwiGLU's gate, silu(gate) * up, forward and backward: its CPU reference (double precision),
// verify and bench cases, and their registration: what `tessera verify|bench|profile silu_mul` run.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench/host.hpp"
#include "ops/elementwise/cases.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera::ops::elementwise {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct Spec {
  Shape shape;
  Layout layout = Layout::contiguous;
};

std::string op_name(bool backward) { return backward ? "silu_mul_backward" : "silu_mul"; }

VerifyResult run(DType dt, bool backward, const Spec& s) {
  cudaStream_t stream = nullptr;
  TestTensor gate = make_tensor(dt, s.shape, s.layout), up = make_tensor(dt, s.shape, s.layout);
  fill_random(gate, -8, 8, stream);
  fill_random(up, -3, 3, stream);
  const HostCopy g = to_host(gate), u = to_host(up);
  const std::string name = std::string(dtype_name(dt)) + " " + shape_str(s.shape) + " " + layout_name(s.layout);
  const Layout out_layout = s.layout == Layout::offset ? Layout::offset : Layout::contiguous;
  if (!backward) {
    TestTensor out = make_tensor(dt, s.shape, out_layout);
    fill_poison(out, stream);
    silu_mul(gate.view, up.view, out.view, stream);
    const std::vector<double> ref = host::tabulate(g.view.numel(), [&](int64_t i) {
      const double x = host::load_double(g.view, i);
      return x * sigmoid(x) * host::load_double(u.view, i);
    });
    return compare(op_name(false), name, out, ref, stream);
  }
  TestTensor dy = make_tensor(dt, s.shape, s.layout);
  fill_random(dy, -2, 2, stream);
  const HostCopy d = to_host(dy);
  TestTensor grad_gate = make_tensor(dt, s.shape, out_layout), grad_up = make_tensor(dt, s.shape, out_layout);
  fill_poison(grad_gate, stream);
  fill_poison(grad_up, stream);
  silu_mul_backward(dy.view, gate.view, up.view, grad_gate.view, grad_up.view, stream);
  const std::vector<double> ref_gate = host::tabulate(g.view.numel(), [&](int64_t i) {
    const double x = host::load_double(g.view, i), sg = sigmoid(x);
    return host::load_double(d.view, i) * host::load_double(u.view, i) * sg * (1.0 + x * (1.0 - sg));
  });
  const std::vector<double> ref_up = host::tabulate(g.view.numel(), [&](int64_t i) {
    const double x = host::load_double(g.view, i);
    return host::load_double(d.view, i) * x * sigmoid(x);
  });
  VerifyResult r = compare(op_name(true), name + " grad_gate", grad_gate, ref_gate, stream);
  keep_worst(r, compare(op_name(true), name + " grad_up", grad_up, ref_up, stream));
  return r;
}

std::vector<VerifyCase> cases(bool backward) {
  const std::vector<Spec> specs = {
      {{1000003}}, {{7}}, {{1000003}, Layout::offset}, {{513, 257}, Layout::transposed},
      {{300, 1001}, Layout::strided}, {{0, 3}},
  };
  std::vector<VerifyCase> v;
  for (DType dt : kFloatTypes)
    for (const Spec& s : specs)
      v.push_back({std::string(dtype_name(dt)) + " " + shape_str(s.shape) + " " + layout_name(s.layout), false,
                   [=] { return run(dt, backward, s); }});
  return v;
}

// Forward: gate and up in, out written. Backward: grad_output, gate and up in, two gradients
// written (one pass: 3 reads, 2 writes).
BenchShape shape(DType dt, int64_t n, bool backward) {
  return backward ? flat_shape(dt, n, 3, 5) : flat_shape(dt, n, 2, 3);
}

BenchCase bench(DType dt, int64_t n, bool backward) {
  const BenchShape sh = shape(dt, n, backward);
  struct State { TestTensor dy, gate, up, a, b; };
  auto st = std::make_shared<State>();
  for (TestTensor* t : {&st->gate, &st->up, &st->a, &st->b}) *t = make_tensor(dt, {n}, Layout::contiguous);
  fill_random(st->gate, -4, 4, nullptr);
  fill_random(st->up, -4, 4, nullptr);
  if (backward) {
    st->dy = make_tensor(dt, {n}, Layout::contiguous);
    fill_random(st->dy, -1, 1, nullptr);
  }
  BenchCase c = bench_case(op_name(backward), dt, n, sh);
  State* s = st.get();
  if (backward)
    c.run = [s](cudaStream_t stream) { silu_mul_backward(s->dy.view, s->gate.view, s->up.view, s->a.view, s->b.view, stream); };
  else
    c.run = [s](cudaStream_t stream) { silu_mul(s->gate.view, s->up.view, s->a.view, stream); };
  c.state = st;
  return c;
}

const Registrar kRegistrar(26, [] {
  std::vector<OpInfo> ops;
  for (bool bwd : {false, true}) {
    OpInfo op = op_info(op_name(bwd), bwd ? "silu_mul backward: grad_gate, grad_up" : "SwiGLU's gate: silu(gate) * up");
    op.verify_cases = [bwd] { return cases(bwd); };
    op.make_bench = [bwd](DType dt, int64_t n) { return bench(dt, n, bwd); };
    op.bench_shape = [bwd](DType dt, int64_t n) { return shape(dt, n, bwd); };
    ops.push_back(op);
  }
  return ops;
});

}  // namespace
}  // namespace tessera::ops::elementwise
