// Verify and bench cases for jsd, and its registration: what `tessera verify|bench|profile jsd` run.
// The cases walk beta 0 (forward KL), 1 (reverse KL) and between (the mixture: a pass more),
// temperatures 1 and 2, vocabularies from 1 class to 128256 (rows on and off 16-byte boundaries;
// padded rows, whose gradient lies otherwise than the logits, on the scalar path), one row and
// none, ignored rows and no target, the gradient written over the student, and the loss alone.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bench/host.hpp"
#include "ops/loss/jsd_reference.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "tessera/ops/loss.hpp"

namespace tessera::ops {
namespace {

const std::vector<DType> kTypes = {DType::float32, DType::float16, DType::bfloat16};

struct Spec {
  int64_t rows = 0, classes = 0;
  double beta = 0.5, temperature = 1.0;
  bool no_target = false;  // target None: no row ignored (else every fifth row is)
  bool padded = false;     // student's and teacher's rows 3 elements longer than the classes
  bool inplace = false;    // the gradient written over the student
  bool loss_only = false;  // no gradient asked for
};

std::string describe(DType dt, const Spec& s) {
  std::string d = std::string(dtype_name(dt)) + " " + shape_str({s.rows, s.classes}) + " beta " +
                  std::to_string(s.beta).substr(0, 4) + " T " + std::to_string(s.temperature).substr(0, 3);
  if (s.no_target) d += " no target";
  if (s.padded) d += " padded rows";
  if (s.inplace) d += " in place";
  if (s.loss_only) d += " loss only";
  return d;
}

// Labels uniform over the classes, every fifth row ignored (-100).
std::vector<int64_t> targets(const Spec& s, unsigned seed) {
  std::mt19937_64 g(seed);
  std::vector<int64_t> t(size_t(s.rows));
  for (int64_t r = 0; r < s.rows; ++r) t[size_t(r)] = r % 5 == 2 ? -100 : int64_t(g() % uint64_t(s.classes));
  return t;
}

// A [rows, classes] view of random logits (rows padded where asked) and its values as held.
TestTensor logits(DType dt, const Spec& s, std::vector<double>& held) {
  TestTensor t = make_tensor(dt, {s.rows, s.classes + (s.padded ? 3 : 0)}, Layout::contiguous);
  fill_random(t, -8, 8, nullptr);
  t.view.shape[1] = s.classes;
  const HostCopy h = to_host(t);
  held.resize(size_t(s.rows * s.classes));
  for (int64_t i = 0; i < s.rows * s.classes; ++i) held[size_t(i)] = host::load_double(h.view, i);
  return t;
}

VerifyResult run_case(DType dt, const Spec& s) {
  cudaStream_t stream = nullptr;
  std::vector<double> x, y;
  TestTensor student = logits(dt, s, x), teacher = logits(dt, s, y);
  std::vector<int64_t> t;
  TestTensor target;
  if (!s.no_target) {
    t = targets(s, unsigned(case_seed(uint64_t(s.rows * 31 + s.classes))));
    target = upload(DType::int64, {s.rows}, std::vector<double>(t.begin(), t.end()));
  }
  TestTensor loss = make_tensor(DType::float32, {s.rows}, Layout::contiguous);
  TestTensor grad = make_tensor(dt, {s.rows, s.classes}, Layout::contiguous);
  for (TestTensor* o : {&loss, &grad}) fill_poison(*o, stream);
  JsdOptions o;
  o.beta = s.beta, o.temperature = s.temperature;
  TestTensor& g = s.inplace ? student : grad;
  jsd(student.view, teacher.view, s.no_target ? nullptr : &target.view, loss.view, s.loss_only ? nullptr : &g.view, o,
      stream);
  reference::JsdSpec rs;
  rs.beta = s.beta, rs.temperature = s.temperature;
  const reference::JsdRows ref = reference::jsd(x, y, t, s.rows, s.classes, rs);
  const std::string name = describe(dt, s);
  // Each output is a sum over the row's classes (the loss; the gradient's S and lse).
  ErrorModel m;
  m.k = s.classes;
  VerifyResult worst = compare("jsd", name + " loss", loss, ref.loss, stream, m);
  if (!s.loss_only) keep_worst(worst, compare("jsd", name + " grad", g, ref.grad, stream, m));
  worst.name = name;
  return worst;
}

std::vector<VerifyCase> cases() {
  std::vector<Spec> all;
  for (double beta : {0.0, 0.5, 1.0}) {
    all.push_back({64, 1000, beta, 1.0});                      // 16-byte vectors
    all.push_back({33, 131, beta, 2.0});                       // odd V: a scalar head and tail
    all.push_back({16, 1, beta, beta == 0.5 ? 2.0 : 1.0});     // one class: loss and gradient 0
    all.push_back({40, 4096, beta, 2.0, false, true});         // padded rows: the scalar path
    all.push_back({3, 128256, beta, 1.0, false, false, true}); // a Llama 3 vocabulary, in place
  }
  all.push_back({1, 4096, 0.25, 1.0, false, false, true});        // one row, in place
  all.push_back({0, 1000, 0.5, 1.0});                             // no rows
  all.push_back({300, 1000, 0.75, 2.0, true});                    // no target, many rows
  all.push_back({17, 50257, 0.25, 1.0, false, true, true});       // padded, in place: the split path
  all.push_back({64, 1000, 0.5, 1.0, false, false, false, true}); // the loss alone
  all.push_back({33, 131, 0.0, 2.0, false, false, false, true});
  all.push_back({5, 128256, 1.0, 2.0, true, false, false, true});
  std::vector<VerifyCase> c;
  for (DType dt : kTypes)
    for (const Spec& s : all) c.push_back({describe(dt, s), false, [=] { return run_case(dt, s); }});
  return c;
}

// V classes over 8192 rows (fewer where N V would pass 2^31), beta 0.5, the gradient in place:
// the bytes of both rows of logits read and the gradient written, once each.
BenchShape jsd_shape(DType dt, int64_t v) {
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(8192, (int64_t(1) << 31) / v));
  BenchShape s;
  s.shapes = {{rows, v}, {rows, v}, {rows}};
  s.shape = shape_str({rows, v});
  s.bytes = 3.0 * double(rows) * double(v) * double(dtype_size(dt));
  return s;
}

BenchCase jsd_bench(DType dt, int64_t v) {
  const BenchShape shape = jsd_shape(dt, v);
  struct State { TestTensor student, teacher, loss; };
  auto st = std::make_shared<State>();
  st->student = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  st->teacher = make_tensor(dt, shape.shapes[1], Layout::contiguous);
  for (TestTensor* t : {&st->student, &st->teacher}) fill_random(*t, -8, 8, nullptr);
  st->loss = make_tensor(DType::float32, shape.shapes[2], Layout::contiguous);
  BenchCase c = bench_case("jsd", dt, v, shape);
  State* p = st.get();
  // In place, as distillation runs it: each call overwrites the student with its gradient, as good
  // a set of logits as any for the next (the timing does not depend on the values).
  c.run = [p](cudaStream_t stream) {
    jsd(p->student.view, p->teacher.view, nullptr, p->loss.view, &p->student.view, {}, stream);
  };
  c.state = st;
  return c;
}

const Registrar kRegistrar(30, [] {
  OpInfo op;
  op.name = "jsd";
  op.bench_sizes = {1024, 8192, 32000, 50257, 128256, 256000};
  op.size_meaning = "classes V (rows: 8192, fewer where N V would pass 2^31)";
  op.tolerance = default_tolerance;
  op.verify_cases = cases;
  op.make_bench = jsd_bench;
  op.bench_shape = jsd_shape;
  return std::vector<OpInfo>{op};
});

}  // namespace
}  // namespace tessera::ops
