// Verify and bench cases for cross_entropy, and its registration: what `tessera verify|bench|profile
// cross_entropy` run. The cases walk vocabularies from 1 class to 128256 (rows on and off 16-byte
// boundaries, and the scalar path where the gradient's rows lie otherwise than the logits'),
// padded rows, int32 and int64 targets with ignored rows, every reduction, label smoothing,
// z-loss and soft-cap, the gradient written over the logits, class weights (alone, which scale
// rows, and with smoothing, which take the per-class kernel) and probability targets.
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
  int64_t rows = 0, classes = 0;
  Reduction reduction = Reduction::mean;
  reference::CrossEntropySpec ref;
  bool padded = false;    // rows 3 elements longer than the classes (a strided view)
  bool inplace = false;   // the gradient written over the logits
  bool int32 = false;     // int32 targets
  bool weighted = false;  // class weights, random in [0.25, 2]
  bool probs = false;     // probability targets (random rows summing to 1), laid out as the logits
  bool loss_only = false; // no gradient asked for (a mean then counts its divisor in its sum's launch)
};

std::string describe(DType dt, const Spec& s) {
  static const char* reductions[] = {"none", "mean", "sum"};
  std::string d = std::string(dtype_name(dt)) + " " + shape_str({s.rows, s.classes}) + " " +
                  reductions[int(s.reduction)];
  if (s.ref.label_smoothing > 0) d += " smoothing " + std::to_string(s.ref.label_smoothing).substr(0, 4);
  if (s.ref.z_loss > 0) d += " z-loss";
  if (s.ref.softcap > 0) d += " softcap";
  if (s.padded) d += " padded rows";
  if (s.inplace) d += " in place";
  if (s.int32) d += " int32 targets";
  if (s.weighted) d += " class weights";
  if (s.probs) d += " probabilities";
  if (s.ref.ignore_index != -100) d += " ignore_index " + std::to_string(s.ref.ignore_index);
  if (s.loss_only) d += " loss only";
  return d;
}

// Targets uniform over the classes, every fifth row ignored.
std::vector<int64_t> targets(const Spec& s, unsigned seed) {
  std::mt19937_64 g(seed);
  std::vector<int64_t> t(size_t(s.rows));
  for (int64_t r = 0; r < s.rows; ++r) t[size_t(r)] = r % 5 == 3 ? s.ref.ignore_index : int64_t(g() % uint64_t(s.classes));
  return t;
}

TestTensor upload_targets(const std::vector<int64_t>& t, bool int32) {
  return upload(int32 ? DType::int32 : DType::int64, {int64_t(t.size())}, std::vector<double>(t.begin(), t.end()));
}

// Rows of class probabilities (exponentials of uniform numbers, normalized), padded as the logits
// are; the values the device holds (rounded to dt) come back for the reference.
TestTensor upload_probs(DType dt, const Spec& s, unsigned seed, std::vector<double>& held) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(-3.0, 3.0);
  const int64_t width = s.classes + (s.padded ? 3 : 0);
  std::vector<double> p(size_t(s.rows * width), 0.0);
  for (int64_t r = 0; r < s.rows; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < s.classes; ++j) sum += p[size_t(r * width + j)] = std::exp(u(g));
    for (int64_t j = 0; j < s.classes; ++j) p[size_t(r * width + j)] /= sum;
  }
  TestTensor t = upload(dt, {s.rows, width}, p);
  t.view.shape[1] = s.classes;
  held.assign(size_t(s.rows * s.classes), 0.0);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t j = 0; j < s.classes; ++j) held[size_t(r * s.classes + j)] = round_to(dt, p[size_t(r * width + j)]);
  return t;
}

VerifyResult run_case(DType dt, const Spec& spec) {
  cudaStream_t stream = nullptr;
  Spec s = spec;
  TestTensor logits = make_tensor(dt, {s.rows, s.classes + (s.padded ? 3 : 0)}, Layout::contiguous);
  fill_random(logits, -8, 8, stream);
  if (s.padded) logits.view.shape[1] = s.classes;
  const unsigned seed = unsigned(case_seed(uint64_t(s.rows * 31 + s.classes)));
  const std::vector<int64_t> t = targets(s, seed);
  std::vector<double> q;
  TestTensor target = s.probs ? upload_probs(dt, s, seed + 1, q) : upload_targets(t, s.int32);
  TestTensor weight;
  if (s.weighted) {
    std::mt19937_64 g(seed + 2);
    std::uniform_real_distribution<double> u(0.25, 2.0);
    s.ref.weight.resize(size_t(s.classes));
    for (double& w : s.ref.weight) w = round_to(DType::float32, u(g));
    weight = upload(DType::float32, {s.classes}, s.ref.weight);
  }
  const bool none = s.reduction == Reduction::none;
  TestTensor loss = none ? make_tensor(DType::float32, {s.rows}, Layout::contiguous)
                         : make_tensor(DType::float32, {}, Layout::contiguous);
  TestTensor lse = make_tensor(DType::float32, {s.rows}, Layout::contiguous);
  TestTensor grad = make_tensor(dt, {s.rows, s.classes}, Layout::contiguous);
  for (TestTensor* o : {&loss, &lse, &grad}) fill_poison(*o, stream);
  const HostCopy hx = to_host(logits);
  std::vector<double> x(size_t(s.rows * s.classes));
  for (int64_t i = 0; i < s.rows * s.classes; ++i) x[size_t(i)] = host::load_double(hx.view, i);
  CrossEntropyOptions o;
  o.ignore_index = s.ref.ignore_index, o.reduction = s.reduction, o.label_smoothing = s.ref.label_smoothing;
  o.z_loss = s.ref.z_loss, o.softcap = s.ref.softcap;
  o.weight = s.weighted ? &weight.view : nullptr;
  const TensorView& g = s.inplace ? logits.view : grad.view;
  cross_entropy(logits.view, target.view, loss.view, &lse.view, s.loss_only ? nullptr : &g, o, stream);
  // The reference's per-row losses and gradients, reduced and scaled as the reduction asks.
  const reference::CrossEntropyRows ref = s.probs ? reference::cross_entropy_probs(x, q, s.rows, s.classes, s.ref)
                                                  : reference::cross_entropy(x, t, s.rows, s.classes, s.ref);
  const double scale = s.reduction == Reduction::mean ? 1.0 / ref.divisor : 1.0;
  std::vector<double> want_grad = ref.grad;
  for (double& v : want_grad) v *= scale;
  std::vector<double> want_loss = ref.loss;
  if (!none) {
    double sum = 0;
    for (double v : ref.loss) sum += v;
    want_loss = {sum * scale};
  }
  const std::string name = describe(dt, s);
  // The sums: a row's exponentials over the classes, the reduction's over the rows.
  ErrorModel m;
  m.k = std::max(s.rows, s.classes);
  VerifyResult worst = compare("cross_entropy", name + " loss", loss, want_loss, stream, m);
  TestTensor* grad_out = &grad;
  if (s.inplace) grad_out = &logits;  // compared over the logits' storage (its padding untouched)
  for (const auto& [t_, r, what] : {std::tuple<TestTensor*, const std::vector<double>*, const char*>{grad_out, &want_grad, " grad"},
                                    {&lse, &ref.lse, " lse"}}) {
    if (s.loss_only && t_ == grad_out) continue;  // no gradient written (the poison stays)
    keep_worst(worst, compare("cross_entropy", name + what, *t_, *r, stream, m));
  }
  worst.name = name;
  return worst;
}

std::vector<VerifyCase> cases() {
  std::vector<Spec> all;
  reference::CrossEntropySpec plain, smooth, z, cap, mixed, ignore3;
  smooth.label_smoothing = 0.1, z.z_loss = 1e-4, cap.softcap = 30.0;
  mixed.label_smoothing = 0.2, mixed.z_loss = 1e-3, mixed.softcap = 20.0;
  ignore3.ignore_index = 3;
  all.push_back({64, 1, Reduction::mean, plain});
  all.push_back({33, 3, Reduction::none, plain, false, false, true});
  all.push_back({17, 50257, Reduction::mean, smooth});                      // odd V: a scalar head and tail
  all.push_back({40, 4096, Reduction::sum, z, true});                       // padded rows: the scalar path
  all.push_back({9, 128256, Reduction::mean, cap, false, true});            // in place
  all.push_back({300, 1000, Reduction::none, smooth, false, false, true});  // many rows, int32
  // Class weights alone (rows scaled in the plain kernels), with smoothing (the per-class kernel),
  // with an ignore_index that is a class; probabilities on every tier, with every option.
  all.push_back({200, 1000, Reduction::mean, plain, false, false, false, true});
  all.push_back({50, 4096, Reduction::mean, ignore3, false, false, true, true});
  all.push_back({17, 50257, Reduction::mean, smooth, false, false, false, true});
  all.push_back({40, 4096, Reduction::sum, mixed, true, false, false, true});        // scalar path
  all.push_back({64, 4096, Reduction::mean, plain, false, false, false, false, true});
  all.push_back({17, 50257, Reduction::none, mixed, false, true, false, true, true});  // split, in place
  all.push_back({33, 3, Reduction::sum, smooth, true, false, false, false, true});      // padded: scalar
  all.push_back({5, 128256, Reduction::mean, cap, false, false, false, true, true});
  // The loss alone: a mean over ignored rows, over class weights (an ignore_index that is a class)
  // and over probabilities; a sum.
  all.push_back({300, 1000, Reduction::mean, smooth, false, false, true, false, false, true});
  all.push_back({50, 4096, Reduction::mean, ignore3, false, false, false, true, false, true});
  all.push_back({17, 50257, Reduction::mean, mixed, true, false, false, false, true, true});
  all.push_back({64, 4096, Reduction::sum, plain, false, false, false, false, false, true});
  std::vector<VerifyCase> c;
  for (DType dt : kTypes)
    for (const Spec& s : all) c.push_back({describe(dt, s), false, [=] { return run_case(dt, s); }});
  return c;
}

// V classes over 8192 rows (fewer where the logits would pass 2^31 elements), the gradient in
// place: bytes the logits read and the gradient written, once each.
BenchShape ce_shape(DType dt, int64_t v) {
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(8192, (int64_t(1) << 31) / v));
  BenchShape s;
  s.shapes = {{rows, v}, {rows}};
  s.shape = shape_str({rows, v});
  s.bytes = 2.0 * double(rows) * double(v) * double(dtype_size(dt));
  return s;
}

BenchCase ce_bench(DType dt, int64_t v) {
  const BenchShape shape = ce_shape(dt, v);
  struct State { TestTensor logits, target, loss; };
  auto st = std::make_shared<State>();
  st->logits = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  fill_random(st->logits, -8, 8, nullptr);
  Spec s;
  s.rows = shape.shapes[0][0], s.classes = v;
  st->target = upload_targets(targets(s, 7), false);
  st->loss = make_tensor(DType::float32, {}, Layout::contiguous);
  BenchCase c = bench_case("cross_entropy", dt, v, shape);
  State* p = st.get();
  // In place, as training runs it: each call overwrites the logits with the gradient, which is
  // as good a set of logits as any for the next (the timing does not depend on the values).
  c.run = [p](cudaStream_t stream) {
    cross_entropy(p->logits.view, p->target.view, p->loss.view, nullptr, &p->logits.view, {}, stream);
  };
  c.state = st;
  return c;
}

const Registrar kRegistrar(10, [] {
  OpInfo op;
  op.name = "cross_entropy";
  op.bench_sizes = {1024, 8192, 32000, 50257, 128256, 256000};
  op.size_meaning = "classes V (rows: 8192, fewer where N V would pass 2^31)";
  op.tolerance = default_tolerance;
  op.verify_cases = cases;
  op.make_bench = ce_bench;
  op.bench_shape = ce_shape;
  return std::vector<OpInfo>{op};
});

}  // namespace
}  // namespace tessera::ops
