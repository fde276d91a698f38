// The gated products of a feed-forward, act(gate) * up, forward, backward and the backward that
// recomputes the forward's output (SwiGLU's silu_mul and GeGLU's geglu, one row each): their CPU references (double precision), verify and
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

// One gated product: its op's name (the backwards add "_backward" and "_backward_recompute"), the
// library's three calls and the activation with its derivative in double precision.
struct Gate {
  const char* name;
  decltype(&silu_mul) forward;
  decltype(&silu_mul_backward) backward;
  decltype(&silu_mul_backward_recompute) recompute;
  double (*act)(double);
  double (*grad)(double);
};
const Gate kGates[] = {
    {"silu_mul", silu_mul, silu_mul_backward, silu_mul_backward_recompute, silu, silu_grad},
    {"geglu", geglu, geglu_backward, geglu_backward_recompute, gelu_tanh, gelu_tanh_grad},
};

// The forward, the backward, and the backward that also recomputes the forward's output.
enum class Pass { forward, backward, recompute };
constexpr Pass kPasses[] = {Pass::forward, Pass::backward, Pass::recompute};

struct Spec {
  Shape shape;
  Layout layout = Layout::contiguous;
};

std::string op_name(const Gate& g, Pass pass) {
  return std::string(g.name) + (pass == Pass::forward ? "" : pass == Pass::backward ? "_backward" : "_backward_recompute");
}

VerifyResult run(const Gate& gt, DType dt, Pass pass, const Spec& s) {
  cudaStream_t stream = nullptr;
  TestTensor gate = make_tensor(dt, s.shape, s.layout), up = make_tensor(dt, s.shape, s.layout);
  fill_random(gate, -8, 8, stream);
  fill_random(up, -3, 3, stream);
  const HostCopy g = to_host(gate), u = to_host(up);
  const std::string name = std::string(dtype_name(dt)) + " " + shape_str(s.shape) + " " + layout_name(s.layout);
  const Layout out_layout = s.layout == Layout::offset ? Layout::offset : Layout::contiguous;
  const std::vector<double> ref_out = host::tabulate(g.view.numel(), [&](int64_t i) {
    return gt.act(host::load_double(g.view, i)) * host::load_double(u.view, i);
  });
  TestTensor out = make_tensor(dt, s.shape, out_layout);
  fill_poison(out, stream);
  if (pass == Pass::forward) {
    gt.forward(gate.view, up.view, out.view, stream);
    return compare(op_name(gt, pass), name, out, ref_out, stream);
  }
  TestTensor dy = make_tensor(dt, s.shape, s.layout);
  fill_random(dy, -2, 2, stream);
  const HostCopy d = to_host(dy);
  TestTensor grad_gate = make_tensor(dt, s.shape, out_layout), grad_up = make_tensor(dt, s.shape, out_layout);
  fill_poison(grad_gate, stream);
  fill_poison(grad_up, stream);
  if (pass == Pass::backward)
    gt.backward(dy.view, gate.view, up.view, grad_gate.view, grad_up.view, stream);
  else
    gt.recompute(dy.view, gate.view, up.view, grad_gate.view, grad_up.view, out.view, stream);
  const std::vector<double> ref_gate = host::tabulate(g.view.numel(), [&](int64_t i) {
    return host::load_double(d.view, i) * host::load_double(u.view, i) * gt.grad(host::load_double(g.view, i));
  });
  const std::vector<double> ref_up = host::tabulate(g.view.numel(), [&](int64_t i) {
    return host::load_double(d.view, i) * gt.act(host::load_double(g.view, i));
  });
  VerifyResult r = compare(op_name(gt, pass), name + " grad_gate", grad_gate, ref_gate, stream);
  keep_worst(r, compare(op_name(gt, pass), name + " grad_up", grad_up, ref_up, stream));
  if (pass == Pass::recompute) keep_worst(r, compare(op_name(gt, pass), name + " out", out, ref_out, stream));
  return r;
}

std::vector<VerifyCase> cases(const Gate& gt, Pass pass) {
  const std::vector<Spec> specs = {
      {{1000003}}, {{7}}, {{1000003}, Layout::offset}, {{513, 257}, Layout::transposed},
      {{300, 1001}, Layout::strided}, {{0, 3}},
  };
  std::vector<VerifyCase> v;
  for (DType dt : kFloatTypes)
    for (const Spec& s : specs)
      v.push_back({std::string(dtype_name(dt)) + " " + shape_str(s.shape) + " " + layout_name(s.layout), false,
                   [=, &gt] { return run(gt, dt, pass, s); }});
  return v;
}

// Forward: gate and up in, out written. Backward: grad_output, gate and up in, two gradients
// written (one pass: 3 reads, 2 writes); the recompute backward writes out too (3 writes).
BenchShape shape(DType dt, int64_t n, Pass pass) {
  return pass == Pass::forward ? flat_shape(dt, n, 2, 3) : flat_shape(dt, n, 3, pass == Pass::backward ? 5 : 6);
}

BenchCase bench(const Gate& gt, DType dt, int64_t n, Pass pass) {
  const BenchShape sh = shape(dt, n, pass);
  const bool backward = pass != Pass::forward;
  struct State { TestTensor dy, gate, up, a, b, c; };
  auto st = std::make_shared<State>();
  for (TestTensor* t : {&st->gate, &st->up, &st->a, &st->b, &st->c}) *t = make_tensor(dt, {n}, Layout::contiguous);
  fill_random(st->gate, -4, 4, nullptr);
  fill_random(st->up, -4, 4, nullptr);
  if (backward) {
    st->dy = make_tensor(dt, {n}, Layout::contiguous);
    fill_random(st->dy, -1, 1, nullptr);
  }
  BenchCase c = bench_case(op_name(gt, pass), dt, n, sh);
  State* s = st.get();
  if (pass == Pass::backward)
    c.run = [s, &gt](cudaStream_t stream) { gt.backward(s->dy.view, s->gate.view, s->up.view, s->a.view, s->b.view, stream); };
  else if (pass == Pass::recompute)
    c.run = [s, &gt](cudaStream_t stream) {
      gt.recompute(s->dy.view, s->gate.view, s->up.view, s->a.view, s->b.view, s->c.view, stream);
    };
  else
    c.run = [s, &gt](cudaStream_t stream) { gt.forward(s->gate.view, s->up.view, s->a.view, stream); };
  c.state = st;
  return c;
}

const Registrar kRegistrar(26, [] {
  std::vector<OpInfo> ops;
  for (const Gate& gt : kGates)
    for (Pass pass : kPasses) {
      OpInfo op = op_info(op_name(gt, pass));
      op.verify_cases = [pass, &gt] { return cases(gt, pass); };
      op.make_bench = [pass, &gt](DType dt, int64_t n) { return bench(gt, dt, n, pass); };
      op.bench_shape = [pass](DType dt, int64_t n) { return shape(dt, n, pass); };
      ops.push_back(op);
    }
  return ops;
});

}  // namespace
}  // namespace tessera::ops::elementwise
