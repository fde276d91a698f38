// Verify and bench cases for linear_cross_entropy, and its registration. The cases cover one and
// several chunks (the last one short), a given workspace, bias, every reduction with and without a
// loss gradient, label smoothing, z-loss, soft-cap, class weights, int32 targets, an all-ignored
// batch and an odd vocabulary; the reference is cross_entropy's over logits formed in double and rounded to the
// dtype, as the op materialises each chunk's.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/host.hpp"
#include "ops/loss/cross_entropy_reference.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "tessera/ops/loss.hpp"

namespace tessera::ops {
namespace {

const std::vector<DType> kTypes = {DType::float32, DType::float16, DType::bfloat16};

struct Spec {
  int64_t n = 0, h = 0, v = 0, chunk = 0;
  Reduction reduction = Reduction::mean;
  reference::CrossEntropySpec ref;
  bool bias = false, workspace = false, int32 = false;
  double grad_loss = 0.0;  // 0: none given; else the scalar (mean, sum) or row r's 0.5 + r % 3 (none)
  bool all_ignored = false;
  bool class_weights = false;  // V weights in [0.25, 2)
};

std::string describe(DType dt, const Spec& s) {
  static const char* reductions[] = {"none", "mean", "sum"};
  std::string d = std::string(dtype_name(dt)) + " N " + std::to_string(s.n) + " H " + std::to_string(s.h) + " V " +
                  std::to_string(s.v) + " " + reductions[int(s.reduction)];
  if (s.chunk) d += " chunks of " + std::to_string(s.chunk);
  if (s.bias) d += " bias";
  if (s.workspace) d += " workspace";
  if (s.grad_loss != 0.0) d += " grad_loss";
  if (s.ref.label_smoothing > 0) d += " smoothing";
  if (s.ref.z_loss > 0) d += " z-loss";
  if (s.ref.softcap > 0) d += " softcap";
  if (s.int32) d += " int32 targets";
  if (s.all_ignored) d += " all ignored";
  if (s.class_weights) d += " class weights";
  return d;
}

std::vector<double> host_values(const TestTensor& t) {
  const HostCopy c = to_host(t);
  const int64_t n = c.view.numel();
  std::vector<double> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = host::load_double(c.view, i);
  return x;
}

VerifyResult run_case(DType dt, const Spec& s) {
  cudaStream_t stream = nullptr;
  TestTensor hidden = make_tensor(dt, {s.n, s.h}, Layout::contiguous), weight = make_tensor(dt, {s.v, s.h}, Layout::contiguous);
  TestTensor bias = make_tensor(dt, {s.v}, Layout::contiguous);
  fill_random(hidden, -1, 1, stream);
  fill_random(weight, -1, 1, stream);
  fill_random(bias, -1, 1, stream);
  std::mt19937_64 gen(case_seed(uint64_t(s.n * 131 + s.v)));
  std::vector<int64_t> t(size_t(s.n));
  for (int64_t r = 0; r < s.n; ++r)
    t[size_t(r)] = s.all_ignored || r % 5 == 3 ? s.ref.ignore_index : int64_t(gen() % uint64_t(s.v));
  std::vector<double> td(t.begin(), t.end());
  reference::CrossEntropySpec ref_spec = s.ref;
  if (s.class_weights) {
    ref_spec.weight.resize(size_t(s.v));
    for (double& w : ref_spec.weight) w = 0.25 + 1.75 * double(gen() % 1024) / 1024.0;
  }
  TestTensor class_weights = upload(DType::float32, {s.v}, s.class_weights ? ref_spec.weight : std::vector<double>(size_t(s.v), 1.0));
  TestTensor target = upload(s.int32 ? DType::int32 : DType::int64, {s.n}, td);
  const bool none = s.reduction == Reduction::none;
  std::vector<double> g_rows(size_t(s.n), 1.0);  // each row's loss gradient
  for (int64_t r = 0; r < s.n; ++r)
    if (s.grad_loss != 0.0) g_rows[size_t(r)] = none ? 0.5 + double(r % 3) : s.grad_loss;
  TestTensor grad_loss = none ? upload(DType::float32, {s.n}, g_rows) : upload(DType::float32, {}, {s.grad_loss});
  TestTensor loss = make_tensor(DType::float32, none ? std::vector<int64_t>{s.n} : std::vector<int64_t>{}, Layout::contiguous);
  TestTensor lse = make_tensor(DType::float32, {s.n}, Layout::contiguous);
  TestTensor dh = make_tensor(dt, {s.n, s.h}, Layout::contiguous), dw = make_tensor(dt, {s.v, s.h}, Layout::contiguous);
  TestTensor db = make_tensor(dt, {s.v}, Layout::contiguous);
  TestTensor ws = make_tensor(dt, {std::max<int64_t>(s.chunk, 1) * s.v + 5}, Layout::contiguous);
  for (TestTensor* o : {&loss, &lse, &dh, &dw, &db}) fill_poison(*o, stream);

  LinearCrossEntropyOptions o;
  o.ignore_index = s.ref.ignore_index, o.reduction = s.reduction, o.label_smoothing = s.ref.label_smoothing;
  o.z_loss = s.ref.z_loss, o.softcap = s.ref.softcap;
  o.chunk_rows = s.workspace ? 0 : s.chunk;
  o.workspace = s.workspace ? &ws.view : nullptr;
  o.weight = s.class_weights ? &class_weights.view : nullptr;
  LinearCrossEntropyGrads g;
  g.d_hidden = &dh.view, g.d_weight = &dw.view, g.d_bias = s.bias ? &db.view : nullptr;
  g.grad_loss = s.grad_loss != 0.0 ? &grad_loss.view : nullptr;
  linear_cross_entropy(hidden.view, weight.view, s.bias ? &bias.view : nullptr, target.view, loss.view, &lse.view, g, o,
                       stream);

  // The reference: logits in double, rounded to the dtype; cross_entropy's rows; the gradients
  // of the reduced loss times its gradient.
  const std::vector<double> x = host_values(hidden), w = host_values(weight), b = host_values(bias);
  std::vector<double> logits(size_t(s.n * s.v));
  host::parallel_for(s.n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < s.v; ++c) {
        double acc = s.bias ? b[size_t(c)] : 0.0;
        for (int64_t k = 0; k < s.h; ++k) acc += x[size_t(r * s.h + k)] * w[size_t(c * s.h + k)];
        logits[size_t(r * s.v + c)] = round_to(dt, acc);
      }
  });
  const reference::CrossEntropyRows ref = reference::cross_entropy(logits, t, s.n, s.v, ref_spec);
  const double mean = s.reduction == Reduction::mean ? 1.0 / ref.divisor : 1.0;
  std::vector<double> want_loss = ref.loss;
  if (!none) {
    double sum = 0;
    for (double l : ref.loss) sum += l;
    want_loss = {sum * mean};
  }
  std::vector<double> G = ref.grad;  // d loss / d logits
  for (int64_t r = 0; r < s.n; ++r)
    for (int64_t c = 0; c < s.v; ++c) G[size_t(r * s.v + c)] *= ref.valid ? g_rows[size_t(r)] * mean : 0.0;
  const std::vector<double> want_dh = host::tabulate(s.n * s.h, [&](int64_t i) {
    double acc = 0;
    for (int64_t c = 0; c < s.v; ++c) acc += G[size_t(i / s.h * s.v + c)] * w[size_t(c * s.h + i % s.h)];
    return acc;
  });
  const std::vector<double> want_dw = host::tabulate(s.v * s.h, [&](int64_t i) {
    double acc = 0;
    for (int64_t r = 0; r < s.n; ++r) acc += G[size_t(r * s.v + i / s.h)] * x[size_t(r * s.h + i % s.h)];
    return acc;
  });
  const std::vector<double> want_db = host::tabulate(s.v, [&](int64_t c) {
    double acc = 0;
    for (int64_t r = 0; r < s.n; ++r) acc += G[size_t(r * s.v + c)];
    return acc;
  });

  const std::string name = describe(dt, s);
  // The sums: logits over H, a row's exponentials over V, d_weight's over the N rows. Each chunk's
  // logits are stored in dt; the reference rounds them too, but a logit whose float32 sum lies near
  // a rounding boundary of dt rounds the other way, one step of dt.
  ErrorModel m;
  m.k = std::max({s.n, s.h, s.v});
  m.rounded = unit_roundoff(dt);
  VerifyResult worst = compare("linear_cross_entropy", name + " loss", loss, want_loss, stream, m);
  std::vector<std::tuple<TestTensor*, const std::vector<double>*, const char*>> outs = {
      {&lse, &ref.lse, " lse"}, {&dh, &want_dh, " d_hidden"}, {&dw, &want_dw, " d_weight"}};
  if (s.bias) outs.push_back({&db, &want_db, " d_bias"});
  for (const auto& [out, r, what] : outs) {
    keep_worst(worst, compare("linear_cross_entropy", name + what, *out, *r, stream, m));
  }
  worst.name = name;
  return worst;
}

std::vector<VerifyCase> cases() {
  reference::CrossEntropySpec plain, smooth, z, cap;
  smooth.label_smoothing = 0.1, z.z_loss = 1e-4, cap.softcap = 3.0;
  std::vector<Spec> all = {
      {77, 64, 1000, 0, Reduction::mean, plain},                               // one chunk
      {77, 64, 1000, 16, Reduction::mean, plain, true},                        // 5 chunks, the last short; bias
      {50, 48, 515, 12, Reduction::sum, z, false, true, false, 2.0},          // a workspace of 12 rows
      {40, 32, 777, 9, Reduction::none, smooth, true, false, true, 1.0},     // per-row loss gradients
      {33, 64, 300, 8, Reduction::mean, cap, false, false, true, 0.5},       // a scalar loss gradient
      {20, 32, 200, 8, Reduction::mean, plain, true, false, false, 0.0, true},  // all ignored: NaN, 0 gradients
      {6, 16, 50257, 4, Reduction::mean, plain},                                // an odd, large vocabulary
  };
  Spec weighted{77, 64, 1000, 16, Reduction::mean, smooth};  // 5 chunks; the mean over the rows' weights
  weighted.class_weights = true;
  all.push_back(weighted);
  weighted = {40, 32, 777, 9, Reduction::none, plain, true, false, false, 1.0};  // per-row loss gradients
  weighted.class_weights = true;
  all.push_back(weighted);
  weighted = {50, 48, 515, 12, Reduction::sum, cap, false, true, false, 2.0};  // a workspace; soft-cap
  weighted.class_weights = true;
  all.push_back(weighted);
  std::vector<VerifyCase> c;
  for (DType dt : kTypes)
    for (const Spec& s : all) c.push_back({describe(dt, s), false, [=] { return run_case(dt, s); }});
  return c;
}

// N = 8192 tokens of H = 4096 into V = size classes, forward and backward (d_hidden, d_weight):
// three GEMMs of 2 N V H FLOPs.
constexpr int64_t kTokens = 8192, kHidden = 4096;

BenchShape lce_shape(DType dt, int64_t v) {
  BenchShape s;
  s.shapes = {{kTokens, kHidden}, {v, kHidden}, {kTokens}};
  s.shape = "N " + std::to_string(kTokens) + " H " + std::to_string(kHidden) + " V " + std::to_string(v);
  s.bytes = double(dtype_size(dt)) * double(2 * kTokens * kHidden + 2 * v * kHidden);
  s.flops = 6.0 * double(kTokens) * double(v) * double(kHidden);
  return s;
}

BenchCase lce_bench(DType dt, int64_t v) {
  const BenchShape shape = lce_shape(dt, v);
  struct State { TestTensor hidden, weight, target, loss, dh, dw; };
  auto st = std::make_shared<State>();
  st->hidden = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  st->weight = make_tensor(dt, shape.shapes[1], Layout::contiguous);
  fill_random(st->hidden, -1, 1, nullptr);
  fill_random(st->weight, -0.05, 0.05, nullptr);
  std::vector<double> t(static_cast<size_t>(kTokens));
  for (int64_t r = 0; r < kTokens; ++r) t[size_t(r)] = double((r * 7919) % v);
  st->target = upload(DType::int64, {kTokens}, t);
  st->loss = make_tensor(DType::float32, {}, Layout::contiguous);
  st->dh = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  st->dw = make_tensor(dt, shape.shapes[1], Layout::contiguous);
  BenchCase c = bench_case("linear_cross_entropy", dt, v, shape);
  State* p = st.get();
  c.run = [p](cudaStream_t stream) {
    LinearCrossEntropyGrads g;
    g.d_hidden = &p->dh.view, g.d_weight = &p->dw.view;
    linear_cross_entropy(p->hidden.view, p->weight.view, nullptr, p->target.view, p->loss.view, nullptr, g, {}, stream);
  };
  c.state = st;
  return c;
}

const Registrar kRegistrar(20, [] {
  OpInfo op;
  op.name = "linear_cross_entropy";
  op.bench_sizes = {32000, 128256};
  op.size_meaning = "classes V (N 8192 tokens, H 4096)";
  op.tolerance = default_tolerance;
  op.verify_cases = cases;
  op.make_bench = lce_bench;
  op.bench_shape = lce_shape;
  return std::vector<OpInfo>{op};
});

}  // namespace
}  // namespace tessera::ops
