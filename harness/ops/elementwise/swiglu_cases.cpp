// swiglu_backward and geglu_blocks_backward (gate and up interleaved in blocks of 64 in one tensor,
// as matmul's gated activations store their product), and their _recompute forms (the forward's
// output too): the CPU reference (double precision), verify and bench cases, a row per gate.
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

// One gated activation: its op, the library's two backwards, and act and act' in double.
struct Gate {
  const char* op;
  void (*backward)(const TensorView&, const TensorView&, const TensorView&, cudaStream_t);
  void (*recompute)(const TensorView&, const TensorView&, const TensorView&, const TensorView&, cudaStream_t);
  double (*act)(double);
  double (*grad)(double);
};
const Gate kGates[] = {
    {"swiglu_backward", swiglu_backward, swiglu_backward_recompute, [](double g) { return g * sigmoid(g); },
     [](double g) { const double s = sigmoid(g); return s * (1.0 + g * (1.0 - s)); }},
    {"geglu_blocks_backward", geglu_blocks_backward, geglu_blocks_backward_recompute,
     [](double g) { return reference::gelu(g, GeluApproximate::tanh); },
     [](double g) { return reference::gelu_grad(g, GeluApproximate::tanh); }},
};

// input [rows, n] (n even; n / 2 not a multiple of 64: a last, shorter block), grad_output
// [rows, n / 2]; grad_input like input. Where
// `recompute`, the _recompute backward, whose forward output is checked too.
VerifyResult run(const Gate& gate, DType dt, int64_t rows, int64_t n, Layout layout, bool recompute) {
  cudaStream_t stream = nullptr;
  TestTensor x = make_tensor(dt, {rows, n}, layout), dy = make_tensor(dt, {rows, n / 2}, layout);
  fill_random(x, -8, 8, stream);
  fill_random(dy, -2, 2, stream);
  TestTensor dx = make_tensor(dt, {rows, n}, Layout::contiguous);
  fill_poison(dx, stream);
  TestTensor y = make_tensor(dt, {rows, n / 2}, Layout::contiguous);
  fill_poison(y, stream);
  if (recompute) gate.recompute(dy.view, x.view, dx.view, y.view, stream);
  else gate.backward(dy.view, x.view, dx.view, stream);
  const HostCopy hx = to_host(x), hd = to_host(dy);
  const int64_t f = n / 2;
  std::vector<double> ref(size_t(rows * n)), out(size_t(rows * f));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < f; ++j) {
      const int64_t gc = r * n + gated_gate_column(j, f), uc = gc + gated_block_width(j, f);
      const double g = host::load_double(hx.view, gc), u = host::load_double(hx.view, uc);
      const double d = host::load_double(hd.view, r * f + j);
      ref[size_t(gc)] = d * u * gate.grad(g), ref[size_t(uc)] = d * gate.act(g);
      out[size_t(r * f + j)] = gate.act(g) * u;
    }
  const std::string name = std::string(dtype_name(dt)) + " [" + std::to_string(rows) + ", " + std::to_string(n) +
                           "] " + layout_name(layout) + (recompute ? " +output" : "");
  VerifyResult worst = compare(gate.op, name, dx, ref, stream);
  if (!recompute) return worst;
  keep_worst(worst, compare(gate.op, name + " (output)", y, out, stream));
  return worst;
}

std::vector<VerifyCase> cases(const Gate& gate) {
  struct Spec {
    int64_t rows, n;
    Layout layout;
  };
  const std::vector<Spec> specs = {{1000, 1024, Layout::contiguous}, {7, 128, Layout::contiguous},
                                   {300, 200, Layout::contiguous}, {9, 80, Layout::strided},  // F % 64 != 0
                                   {300, 384, Layout::strided}, {0, 256, Layout::contiguous}};
  std::vector<VerifyCase> v;
  for (DType dt : kFloatTypes)
    for (const Spec& s : specs)
      for (bool recompute : {false, true})
        v.push_back({std::string(dtype_name(dt)) + " [" + std::to_string(s.rows) + ", " + std::to_string(s.n) + "] " +
                         layout_name(s.layout) + (recompute ? " +output" : ""),
                     false, [=, &gate] { return run(gate, dt, s.rows, s.n, s.layout, recompute); }});
  return v;
}

// n elements of the input (rows of 4096): grad_output (n / 2) and input (n) read, grad_input (n)
// written.
BenchShape shape(DType dt, int64_t n) {
  BenchShape s = flat_shape(dt, n, 2, 0);
  const int64_t cols = 4096, rows = std::max<int64_t>(1, n / cols);
  s.shapes = {Shape{rows, cols}, Shape{rows, cols / 2}};  // input (the main tensor), grad_output
  s.shape = shape_str({rows, cols});
  s.bytes = 2.5 * double(rows * cols) * double(dtype_size(dt));
  return s;
}

BenchCase bench(const Gate& gate, DType dt, int64_t n) {
  const BenchShape sh = shape(dt, n);
  struct State { TestTensor dy, x, dx; };
  auto st = std::make_shared<State>();
  st->x = make_tensor(dt, sh.shapes[0], Layout::contiguous);
  st->dx = make_tensor(dt, sh.shapes[0], Layout::contiguous);
  st->dy = make_tensor(dt, sh.shapes[1], Layout::contiguous);
  fill_random(st->dy, -1, 1, nullptr);
  fill_random(st->x, -4, 4, nullptr);
  BenchCase c = bench_case(gate.op, dt, n, sh);
  State* s = st.get();
  c.run = [s, &gate](cudaStream_t stream) { gate.backward(s->dy.view, s->x.view, s->dx.view, stream); };
  c.state = st;
  return c;
}

const Registrar kRegistrar(26, [] {
  std::vector<OpInfo> ops;
  for (const Gate& gate : kGates) {
    OpInfo op = op_info(gate.op);
    op.verify_cases = [&gate] { return cases(gate); };
    op.make_bench = [&gate](DType dt, int64_t n) { return bench(gate, dt, n); };
    op.bench_shape = shape;
    ops.push_back(op);
  }
  return ops;
});

}  // namespace
}  // namespace tessera::ops::elementwise
