// Verify and bench cases for mlp, and its registration: what `tessera verify|bench|profile mlp`
// run. The reference is two products in double precision (matmul's reference), the hidden
// activation rounded to the inputs' dtype between them as the op stores it; each activation,
// batched and 2-d inputs, odd sizes, sizes where swiglu runs in the sm90 tier's epilogue and where
// the skinny tier takes the first product, the pre-activation output, and the hidden activation
// in a workspace given or in tessera's scratch pool.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench/host.hpp"
#include "ops/matrix/matmul_reference.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "tessera/ops/matrix.hpp"

namespace tessera::ops {
namespace {

constexpr const char* kOp = "mlp";
using Shape = std::vector<int64_t>;

struct MlpSpec {
  int64_t batch, m, k, n, d;  // batch 0: a 2-d input; n: w_in's rows (2F for swiglu)
  Activation activation = Activation::swiglu;
  bool preact = false, workspace = false;
};

int64_t hidden_of(const MlpSpec& s) { return is_gated(s.activation) ? s.n / 2 : s.n; }

Shape rows(const MlpSpec& s, int64_t cols) { return s.batch ? Shape{s.batch, s.m, cols} : Shape{s.m, cols}; }

std::string describe(DType dt, const MlpSpec& s) {
  std::string d = std::string(dtype_name(dt)) + " " + shape_str(rows(s, s.k)) + " w_in " + shape_str({s.n, s.k}) +
                  " w_out " + shape_str({s.d, hidden_of(s)}) + " " + activation_name(s.activation);
  if (s.preact) d += " +preactivation";
  if (s.workspace) d += " +workspace";
  return d;
}

TensorView transposed(const TensorView& w) {
  return TensorView::strided(w.data, w.dtype, {w.shape[1], w.shape[0]}, {w.strides[1], w.strides[0]}, w.device);
}

TensorView host_view(void* data, DType dt, const Shape& shape) {
  return TensorView::make(data, dt, shape.data(), nullptr, static_cast<int>(shape.size()), Device{DeviceType::cpu, 0});
}

VerifyResult run(DType dt, const MlpSpec& s) {
  cudaStream_t stream = nullptr;
  const int64_t hidden = hidden_of(s);
  TestTensor x = make_tensor(dt, rows(s, s.k), Layout::contiguous);
  TestTensor w_in = make_tensor(dt, {s.n, s.k}, Layout::contiguous), w_out = make_tensor(dt, {s.d, hidden}, Layout::contiguous);
  TestTensor out = make_tensor(dt, rows(s, s.d), Layout::contiguous);
  fill_random(x, -1, 1, stream);
  fill_random(w_in, -1, 1, stream);
  fill_random(w_out, -1, 1, stream);
  fill_poison(out, stream);
  MlpOptions o;
  o.activation = s.activation;
  TestTensor z, ws;
  if (s.preact) {
    z = make_tensor(dt, rows(s, s.n), Layout::contiguous);
    fill_poison(z, stream);
    o.preactivation = &z.view;
  }
  if (s.workspace) {
    ws = make_tensor(dt, {std::max<int64_t>(1, s.batch) * s.m * hidden + 7}, Layout::contiguous);
    o.hidden = &ws.view;
  }
  const HostCopy hx = to_host(x), hw_in = to_host(w_in), hw_out = to_host(w_out);
  MatmulOptions first;
  first.activation = s.activation;
  const Shape hshape = rows(s, hidden);
  std::vector<double> h = reference::matmul(hx.view, transposed(hw_in.view), host_view(nullptr, DType::float64, hshape), first);
  for (double& v : h) v = round_to(dt, v);
  const std::vector<double> ref = reference::matmul(host_view(h.data(), DType::float64, hshape), transposed(hw_out.view),
                                                    host_view(nullptr, DType::float64, rows(s, s.d)), MatmulOptions{});
  mlp(x.view, w_in.view, w_out.view, out.view, o, stream);
  // Two products, K then hidden long, the hidden activation stored in dt between them (the
  // reference rounds it too, but a value near a rounding boundary can round the other way).
  ErrorModel second, first_only;
  second.k = std::max(s.k, hidden);
  second.rounded = unit_roundoff(dt);
  first_only.k = s.k;
  VerifyResult worst = compare(kOp, describe(dt, s), out, ref, stream, second);
  if (s.preact)
    keep_worst(worst, compare(kOp, describe(dt, s) + " (pre-activation)", z,
                              reference::matmul(hx.view, transposed(hw_in.view),
                                                host_view(nullptr, DType::float64, rows(s, s.n)), MatmulOptions{}),
                              stream, first_only));
  return worst;
}

std::vector<VerifyCase> cases() {
  using A = Activation;
  const std::vector<MlpSpec> specs = {
      {0, 256, 128, 512, 192},                              // swiglu, one tile
      {2, 100, 96, 256, 72, A::swiglu, true},               // batched, odd rows
      {0, 1000, 256, 1408, 256, A::swiglu, true, true},     // swiglu in the sm90 epilogue, half a tile
      {0, 16, 512, 256, 128, A::swiglu, true},              // the skinny tier: product, then swiglu
      {0, 1000, 256, 1408, 256, A::geglu, true, true},      // geglu in the sm90 epilogue
      {2, 100, 96, 256, 72, A::geglu, true},                // and not (float32, odd rows)
      {0, 70, 96, 200, 100, A::swiglu, false, true},        // F = 100: a last gate/up block of 36
      {0, 70, 96, 80, 40, A::geglu, true},                  // F = 40: no whole block
      {0, 300, 200, 520, 136, A::gelu, true, true},         // tails in every dimension
      {0, 64, 64, 128, 64, A::gelu_tanh},
      {3, 77, 128, 200, 96, A::silu, true},
      {0, 130, 64, 96, 40, A::relu, false, true},
      {0, 64, 80, 48, 32, A::none},
      {0, 0, 64, 128, 32},                                  // no rows
      {0, 64, 0, 128, 32, A::gelu, true},                   // K = 0: activation(0) @ w_out^T
  };
  std::vector<VerifyCase> v;
  for (DType dt : {DType::float32, DType::float16, DType::bfloat16})
    for (const MlpSpec& s : specs) {
      if (dt == DType::float32 && s.m * s.n > 1 << 18) continue;  // the SIMT tier: the small ones
      v.push_back({describe(dt, s), false, [=] { return run(dt, s); }});
    }
  return v;
}

// M = K = D = F = size, swiglu: input [M, K], w_in [2F, K], w_out [D, F]. The bytes that must move:
// the three inputs read and the output written (the hidden activation's round trip is the
// op's own); FLOPs 2 M K 2F + 2 M F D.
BenchShape shape(DType dt, int64_t n) {
  BenchShape s;
  s.shapes = {{n, n}, {2 * n, n}, {n, n}};
  const std::string d = std::to_string(n), d2 = std::to_string(2 * n);
  s.shape = "[" + d + ", " + d + "] w_in [" + d2 + ", " + d + "] w_out [" + d + ", " + d + "] swiglu";
  s.bytes = 5.0 * double(n) * double(n) * double(dtype_size(dt));
  s.flops = 6.0 * double(n) * double(n) * double(n);
  return s;
}

BenchCase bench(DType dt, int64_t n) {
  const BenchShape sh = shape(dt, n);
  struct State { TestTensor x, w_in, w_out, out, hidden; };
  auto st = std::make_shared<State>();
  st->x = make_tensor(dt, sh.shapes[0], Layout::contiguous);
  st->w_in = make_tensor(dt, sh.shapes[1], Layout::contiguous);
  st->w_out = make_tensor(dt, sh.shapes[2], Layout::contiguous);
  st->out = make_tensor(dt, {n, n}, Layout::contiguous);
  st->hidden = make_tensor(dt, {n * n}, Layout::contiguous);
  const double scale = 1.0 / std::sqrt(double(n));
  fill_random(st->x, -1, 1, nullptr);
  fill_random(st->w_in, -scale, scale, nullptr);
  fill_random(st->w_out, -scale, scale, nullptr);
  BenchCase c = bench_case(kOp, dt, n, sh);
  State* s = st.get();
  MlpOptions o;
  o.hidden = &s->hidden.view;
  c.run = [s, o](cudaStream_t stream) { mlp(s->x.view, s->w_in.view, s->w_out.view, s->out.view, o, stream); };
  c.state = st;
  return c;
}

const Registrar kRegistrar(15, [] {
  OpInfo op;
  op.name = kOp;
  op.bench_sizes = {1024, 2048, 4096};
  op.size_meaning = "M = K = D = F (swiglu: w_in [2F, K], w_out [D, F])";
  op.tolerance = default_tolerance;
  op.verify_cases = cases;
  op.make_bench = bench;
  op.bench_shape = shape;
  return std::vector<OpInfo>{op};
});

}  // namespace
}  // namespace tessera::ops
