// Verify and bench cases for SiLU forward and backward, and their registration: what `tessera
// verify|bench|profile silu` run.
#include <memory>
#include <string>
#include <vector>

#include "ops/elementwise/cases.hpp"
#include "ops/elementwise/silu_reference.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera::ops::elementwise {
namespace {

struct SiluSpec {
  Shape shape;
  Layout layout = Layout::contiguous;
  double lo = -8, hi = 8;  // input range
};

std::string op_name(bool backward) { return backward ? "silu_backward" : "silu"; }

VerifyResult run_silu(DType dt, bool backward, const SiluSpec& s) {
  cudaStream_t stream = nullptr;
  TestTensor x = make_tensor(dt, s.shape, s.layout);
  fill_random(x, s.lo, s.hi, stream);
  TestTensor dy;
  std::vector<double> ref;
  if (backward) {
    dy = make_tensor(dt, s.shape, s.layout == Layout::transposed ? Layout::contiguous : s.layout);
    fill_random(dy, -2, 2, stream);
    ref = reference::silu_backward(to_host(dy).view, to_host(x).view);
  } else {
    ref = reference::silu(to_host(x).view);
  }
  TestTensor out = make_tensor(dt, s.shape, s.layout == Layout::offset ? Layout::offset : Layout::contiguous);
  fill_poison(out, stream);
  if (backward) silu_backward(dy.view, x.view, out.view, stream);
  else silu(x.view, out.view, stream);
  std::string range;
  if (s.lo != -8 || s.hi != 8) range = " x in [" + std::to_string(s.lo).substr(0, 5) + ", " + std::to_string(s.hi).substr(0, 5) + ")";
  return compare(op_name(backward), std::string(dtype_name(dt)) + " " + shape_str(s.shape) + " " +
                                        layout_name(s.layout) + range,
                 out, ref, stream);
}

std::vector<VerifyCase> silu_cases(bool backward) {
  const std::vector<SiluSpec> specs = {
      {{1000003}}, {{7}}, {{1000003}, Layout::offset}, {{513, 257}, Layout::transposed},
      {{300, 1001}, Layout::strided}, {{0, 3}},
      // Large negative inputs: tiny outputs (and exp(-x) past float range below -88).
      {{100003}, Layout::contiguous, -120, -2},
  };
  std::vector<VerifyCase> cases;
  for (DType dt : kFloatTypes)
    for (const SiluSpec& s : specs)
      cases.push_back({std::string(dtype_name(dt)) + " " + shape_str(s.shape), false,
                       [=] { return run_silu(dt, backward, s); }});
  return cases;
}

// Forward: x in, out written. Backward: grad_out and x in, grad_in written.
BenchShape silu_shape(DType dt, int64_t n, bool backward) {
  return backward ? flat_shape(dt, n, 2, 3) : flat_shape(dt, n, 1, 2);
}

BenchCase silu_bench(DType dt, int64_t n, bool backward) {
  const BenchShape shape = silu_shape(dt, n, backward);
  struct State { TestTensor x, dy, out; };
  auto st = std::make_shared<State>();
  st->x = make_tensor(dt, shape.shapes.back(), Layout::contiguous);
  st->out = make_tensor(dt, shape.shapes.back(), Layout::contiguous);
  fill_random(st->x, -4, 4, nullptr);
  if (backward) {
    st->dy = make_tensor(dt, shape.shapes[0], Layout::contiguous);
    fill_random(st->dy, -1, 1, nullptr);
  }
  BenchCase c = bench_case(op_name(backward), dt, n, shape);
  State* s = st.get();
  if (backward) c.run = [s](cudaStream_t stream) { silu_backward(s->dy.view, s->x.view, s->out.view, stream); };
  else c.run = [s](cudaStream_t stream) { silu(s->x.view, s->out.view, stream); };
  c.state = st;
  return c;
}

const Registrar kRegistrar(25, [] {
  std::vector<OpInfo> ops;
  for (bool bwd : {false, true}) {
    OpInfo op = op_info(op_name(bwd));
    op.verify_cases = [bwd] { return silu_cases(bwd); };
    op.make_bench = [bwd](DType dt, int64_t n) { return silu_bench(dt, n, bwd); };
    op.bench_shape = [bwd](DType dt, int64_t n) { return silu_shape(dt, n, bwd); };
    ops.push_back(op);
  }
  return ops;
});

}  // namespace
}  // namespace tessera::ops::elementwise
