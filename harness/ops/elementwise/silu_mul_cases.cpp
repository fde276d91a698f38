// The gated products of a feed-forward, act(gate) * up, forward and backward (SwiGLU's silu_mul
// and GeGLU's geglu, one row each): their CPU references (double precision), verify and
// bench cases, and their registration: what `tessera verify|bench|profile silu_mul` run.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench/host.hpp"
#include "ops/elementwise/cases.hpp"
#include "ops/elementwise/gelu_reference.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera::ops::elementwise {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x * sigmoid(x); }
double silu_grad(double x) { return sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x))); }
double gelu_tanh(double x) { return reference::gelu(x, GeluApproximate::tanh); }
double gelu_tanh_grad(double x) { return reference::gelu_grad(x, GeluApproximate::tanh); }

// One gated product: its op's name (the backward's adds "_backward"), the library's two calls and
// the activation with its derivative in double precision.
struct Gate {
  const char* name;
  const char* summary;
  decltype(&silu_mul) forward;
  decltype(&silu_mul_backward) backward;
  double (*act)(double);
  double (*grad)(double);
};
const Gate kGates[] = {
    {"silu_mul", "SwiGLU's gate: silu(gate) * up", silu_mul, silu_mul_backward, silu, silu_grad},
    {"geglu", "GeGLU's gate: gelu_tanh(gate) * up", geglu, geglu_backward, gelu_tanh,
     gelu_tanh_grad},
};

struct Spec {
  Shape shape;
  Layout layout = Layout::contiguous;
};

std::string op_name(const Gate& g, bool backward) { return std::string(g.name) + (backward ? "_backward" : ""); }

VerifyResult run(const Gate& gt, DType dt, bool backward, const Spec& s) {
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
    gt.forward(gate.view, up.view, out.view, stream);
    const std::vector<double> ref = host::tabulate(g.view.numel(), [&](int64_t i) {
      return gt.act(host::load_double(g.view, i)) * host::load_double(u.view, i);
    });
    return compare(op_name(gt, false), name, out, ref, stream);
  }
  TestTensor dy = make_tensor(dt, s.shape, s.layout);
  fill_random(dy, -2, 2, stream);
  const HostCopy d = to_host(dy);
  TestTensor grad_gate = make_tensor(dt, s.shape, out_layout), grad_up = make_tensor(dt, s.shape, out_layout);
  fill_poison(grad_gate, stream);
  fill_poison(grad_up, stream);
  gt.backward(dy.view, gate.view, up.view, grad_gate.view, grad_up.view, stream);
  const std::vector<double> ref_gate = host::tabulate(g.view.numel(), [&](int64_t i) {
    return host::load_double(d.view, i) * host::load_double(u.view, i) * gt.grad(host::load_double(g.view, i));
  });
  const std::vector<double> ref_up = host::tabulate(g.view.numel(), [&](int64_t i) {
    return host::load_double(d.view, i) * gt.act(host::load_double(g.view, i));
  });
  VerifyResult r = compare(op_name(gt, true), name + " grad_gate", grad_gate, ref_gate, stream);
  keep_worst(r, compare(op_name(gt, true), name + " grad_up", grad_up, ref_up, stream));
  return r;
}

std::vector<VerifyCase> cases(const Gate& gt, bool backward) {
  const std::vector<Spec> specs = {
      {{1000003}}, {{7}}, {{1000003}, Layout::offset}, {{513, 257}, Layout::transposed},
      {{300, 1001}, Layout::strided}, {{0, 3}},
  };
  std::vector<VerifyCase> v;
  for (DType dt : kFloatTypes)
    for (const Spec& s : specs)
      v.push_back({std::string(dtype_name(dt)) + " " + shape_str(s.shape) + " " + layout_name(s.layout), false,
                   [=, &gt] { return run(gt, dt, backward, s); }});
  return v;
}

// Forward: gate and up in, out written. Backward: grad_output, gate and up in, two gradients
// written (one pass: 3 reads, 2 writes).
BenchShape shape(DType dt, int64_t n, bool backward) {
  return backward ? flat_shape(dt, n, 3, 5) : flat_shape(dt, n, 2, 3);
}

BenchCase bench(const Gate& gt, DType dt, int64_t n, bool backward) {
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
  BenchCase c = bench_case(op_name(gt, backward), dt, n, sh);
  State* s = st.get();
  if (backward)
    c.run = [s, &gt](cudaStream_t stream) { gt.backward(s->dy.view, s->gate.view, s->up.view, s->a.view, s->b.view, stream); };
  else
    c.run = [s, &gt](cudaStream_t stream) { gt.forward(s->gate.view, s->up.view, s->a.view, stream); };
  c.state = st;
  return c;
}

const Registrar kRegistrar(26, [] {
  std::vector<OpInfo> ops;
  for (const Gate& gt : kGates)
    for (bool bwd : {false, true}) {
      OpInfo op = op_info(op_name(gt, bwd), bwd ? std::string(gt.name) + " backward: grad_gate, grad_up" : gt.summary);
      op.verify_cases = [bwd, &gt] { return cases(gt, bwd); };
      op.make_bench = [bwd, &gt](DType dt, int64_t n) { return bench(gt, dt, n, bwd); };
      op.bench_shape = [bwd](DType dt, int64_t n) { return shape(dt, n, bwd); };
      ops.push_back(op);
    }
  return ops;
});

}  // namespace
}  // namespace tessera::ops::elementwise
