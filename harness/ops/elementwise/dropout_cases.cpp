// Verify and bench cases for seeded dropout, forward and backward, and their registration: what
// `tessera verify|bench|profile dropout` run.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ops/elementwise/cases.hpp"
#include "ops/elementwise/dropout_reference.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera::ops::elementwise {
namespace {

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

const char* op_name(bool backward) { return backward ? "dropout_backward" : "dropout"; }

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
  VerifyResult r = compare(op_name(backward), name, *out, ref, stream);
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

// x (or grad_out) in, out written: the mask is regenerated, never stored.
BenchShape dropout_shape(DType dt, int64_t n) { return flat_shape(dt, n, 1, 2); }

BenchCase dropout_bench(DType dt, int64_t n, bool backward) {
  const BenchShape shape = dropout_shape(dt, n);
  struct State { TestTensor x, out; };
  auto st = std::make_shared<State>();
  st->x = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  st->out = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  fill_random(st->x, -1, 1, nullptr);
  BenchCase c = bench_case(op_name(backward), dt, n, shape);
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

const Registrar kRegistrar(30, [] {
  std::vector<OpInfo> ops;
  for (bool bwd : {false, true}) {
    OpInfo op = op_info(op_name(bwd));
    op.verify_cases = [bwd] { return dropout_cases(bwd); };
    op.make_bench = [bwd](DType dt, int64_t n) { return dropout_bench(dt, n, bwd); };
    op.bench_shape = dropout_shape;
    ops.push_back(op);
  }
  return ops;
});

}  // namespace
}  // namespace tessera::ops::elementwise
