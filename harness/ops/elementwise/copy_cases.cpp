// Verify and bench cases for copy between layouts, and its registration: what `tessera
// verify|bench|profile copy` run.
#include <memory>
#include <string>
#include <vector>

#include "ops/elementwise/cases.hpp"
#include "ops/elementwise/copy_reference.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera::ops::elementwise {
namespace {

struct CopySpec {
  Shape shape;
  Layout src = Layout::contiguous, dst = Layout::contiguous;
};

VerifyResult run_copy(DType dt, const CopySpec& s) {
  cudaStream_t stream = nullptr;
  TestTensor src = make_tensor(dt, s.shape, s.src);
  fill_random(src, -4, 4, stream);
  const std::vector<double> ref = reference::copy(to_host(src).view);
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

// src in, dst written.
BenchShape copy_shape(DType dt, int64_t n) { return flat_shape(dt, n, 1, 2); }

BenchCase copy_bench(DType dt, int64_t n) {
  const BenchShape shape = copy_shape(dt, n);
  struct State { TestTensor src, dst; };
  auto st = std::make_shared<State>();
  st->src = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  st->dst = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  fill_random(st->src, -1, 1, nullptr);
  BenchCase c = bench_case("copy", dt, n, shape);
  State* s = st.get();
  c.run = [s](cudaStream_t stream) { copy(s->src.view, s->dst.view, stream); };
  c.state = st;
  return c;
}

const Registrar kRegistrar(40, [] {
  OpInfo op = op_info("copy");
  op.verify_cases = copy_cases;
  op.make_bench = copy_bench;
  op.bench_shape = copy_shape;
  return std::vector<OpInfo>{op};
});

}  // namespace
}  // namespace tessera::ops::elementwise
