// jsd: the CPU reference on values computed by hand and against finite differences, the
// description and the argument checks (no GPU), and on the GPU what the verify cases (run in
// VerifyGpu) leave out: every row ignored, masked classes, the generic kernel's call.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "gpu.hpp"
#include "ops/loss/jsd_reference.hpp"
#include "runtime/memory.hpp"
#include "tessera/op.hpp"
#include "tessera/ops/loss.hpp"
#include "testing.hpp"

namespace {

using tessera::DType;
using tessera::ErrorKind;
using tessera::TensorView;
using tessera::testing::cuda_tensor;
using tessera::testing::expect_error;
namespace ref = tessera::reference;

ref::JsdSpec spec(double beta, double temperature = 1.0) {
  ref::JsdSpec s;
  s.beta = beta, s.temperature = temperature;
  return s;
}

TEST(JsdReference, KnownValues) {
  // Q = (1/2, 1/2), P = (3/4, 1/4).
  const std::vector<double> x = {0.0, 0.0}, y = {std::log(3.0), 0.0};
  const double kl_pq = 0.75 * std::log(1.5) + 0.25 * std::log(0.5);
  const double kl_qp = 0.5 * std::log(2.0 / 3.0) + 0.5 * std::log(2.0);
  EXPECT_NEAR(ref::jsd(x, y, {}, 1, 2, spec(0.0)).loss[0], kl_pq, 1e-14);
  EXPECT_NEAR(ref::jsd(x, y, {}, 1, 2, spec(1.0)).loss[0], kl_qp, 1e-14);
  // beta 1/2: the mixture M = (5/8, 3/8).
  const double js = 0.5 * (0.75 * std::log(1.2) + 0.25 * std::log(2.0 / 3.0)) + 0.5 * (0.5 * std::log(0.8) + 0.5 * std::log(4.0 / 3.0));
  EXPECT_NEAR(ref::jsd(x, y, {}, 1, 2, spec(0.5)).loss[0], js, 1e-14);
  // Forward KL's gradient is Q - P; equal rows give 0 at every beta.
  const auto f = ref::jsd(x, y, {}, 1, 2, spec(0.0));
  EXPECT_NEAR(f.grad[0], 0.5 - 0.75, 1e-14);
  EXPECT_NEAR(f.grad[1], 0.5 - 0.25, 1e-14);
  for (double beta : {0.0, 0.3, 1.0}) {
    const auto same = ref::jsd({1.0, -2.0, 0.5}, {1.0, -2.0, 0.5}, {}, 1, 3, spec(beta));
    EXPECT_NEAR(same.loss[0], 0.0, 1e-15) << beta;
    for (double g : same.grad) EXPECT_NEAR(g, 0.0, 1e-15) << beta;
  }
}

TEST(JsdReference, TemperatureScalesLogitsAndGradient) {
  const std::vector<double> x = {0.3, -1.2, 2.5, 0.0}, y = {1.0, 0.5, -0.5, 2.0};
  std::vector<double> xs, ys;
  for (double v : x) xs.push_back(v / 2.0);
  for (double v : y) ys.push_back(v / 2.0);
  for (double beta : {0.0, 0.4, 1.0}) {
    const auto a = ref::jsd(x, y, {}, 1, 4, spec(beta, 2.0)), b = ref::jsd(xs, ys, {}, 1, 4, spec(beta));
    EXPECT_NEAR(a.loss[0], b.loss[0], 1e-14) << beta;
    for (size_t j = 0; j < x.size(); ++j) EXPECT_NEAR(a.grad[j], b.grad[j] / 2.0, 1e-14) << beta;
  }
}

TEST(JsdReference, GradientMatchesFiniteDifferences) {
  const std::vector<double> x = {0.3, -1.2, 2.5, 0.0, 4.0}, y = {1.0, 0.5, -0.5, 2.0, -3.0};
  for (double beta : {0.0, 0.3, 0.5, 1.0}) {
    const ref::JsdSpec s = spec(beta, 1.5);
    const auto r = ref::jsd(x, y, {}, 1, 5, s);
    for (size_t j = 0; j < x.size(); ++j) {
      std::vector<double> hi = x, lo = x;
      hi[j] += 1e-6, lo[j] -= 1e-6;
      const double fd = (ref::jsd(hi, y, {}, 1, 5, s).loss[0] - ref::jsd(lo, y, {}, 1, 5, s).loss[0]) / 2e-6;
      EXPECT_NEAR(r.grad[j], fd, 1e-7) << beta << " " << j;
    }
  }
}

TEST(JsdReference, IgnoredRowsAndMaskedClasses) {
  const std::vector<double> x = {1.0, 2.0, 0.5, -1.0}, y = {0.0, 1.0, 2.0, 0.0};
  ref::JsdSpec s = spec(0.5);
  s.ignore_index = 7;
  const auto r = ref::jsd(x, y, {7, 1}, 2, 2, s);
  EXPECT_EQ(r.loss[0], 0.0);
  EXPECT_EQ(r.grad[0], 0.0);
  EXPECT_GT(r.loss[1], 0.0);
  // A class masked (-inf) in both rows adds nothing: the loss of the others alone.
  const double inf = std::numeric_limits<double>::infinity();
  for (double beta : {0.0, 0.5, 1.0}) {
    const auto masked = ref::jsd({1.0, -inf, 2.0}, {0.0, -inf, 1.5}, {}, 1, 3, spec(beta));
    const auto two = ref::jsd({1.0, 2.0}, {0.0, 1.5}, {}, 1, 2, spec(beta));
    EXPECT_NEAR(masked.loss[0], two.loss[0], 1e-15) << beta;
    EXPECT_EQ(masked.grad[1], 0.0) << beta;
  }
}

TEST(JsdDescription, SchemasAndOverload) {
  const tessera::OpDesc* d = tessera::find_op_description("jsd");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->family, "loss");
  ASSERT_EQ(d->schemas.size(), 2u);
  EXPECT_EQ(d->schemas[0],
            "jsd(Tensor student, Tensor teacher, Tensor? target=None, *, float beta=0.5, float temperature=1.0, "
            "int ignore_index=-100, bool with_grad=False) -> (Tensor, Tensor)");
  EXPECT_EQ(d->schemas[1],
            "jsd.inplace(Tensor(a!) student, Tensor teacher, Tensor? target=None, *, float beta=0.5, "
            "float temperature=1.0, int ignore_index=-100) -> Tensor");
  ASSERT_EQ(d->outputs.size(), 2u);
  EXPECT_EQ(d->outputs[1].mask, "with_grad");
  ASSERT_EQ(d->overloads.size(), 1u);
  EXPECT_EQ(d->overloads[0].params.back(), "student");  // the gradient written over the student
  EXPECT_TRUE(d->backward.empty());
}

TEST(JsdChecks, NameTheArgument) {
  const TensorView s = cuda_tensor(0x1000, DType::bfloat16, {8, 100});
  const TensorView t = cuda_tensor(0x100000, DType::bfloat16, {8, 100});
  const TensorView target = cuda_tensor(0x200000, DType::int64, {8});
  const TensorView loss = cuda_tensor(0x300000, DType::float32, {8});
  const tessera::JsdOptions o;
  const auto call = [&](const TensorView& s_, const TensorView& t_, const TensorView* tg, const TensorView& l,
                        const TensorView* g, const tessera::JsdOptions& opt) { tessera::jsd(s_, t_, tg, l, g, opt, nullptr); };
  expect_error([&] { call(cuda_tensor(0x1000, DType::bfloat16, {8, 100, 2}), t, nullptr, loss, nullptr, o); },
               ErrorKind::value, {"tessera.jsd", "'student'", "2-d"});
  expect_error([&] { call(cuda_tensor(0x1000, DType::int32, {8, 100}), t, nullptr, loss, nullptr, o); }, ErrorKind::type,
               {"'student'", "bfloat16"});
  expect_error([&] { call(s, cuda_tensor(0x100000, DType::float16, {8, 100}), nullptr, loss, nullptr, o); },
               ErrorKind::type, {"'teacher'", "bfloat16"});
  expect_error([&] { call(s, cuda_tensor(0x100000, DType::bfloat16, {8, 99}), nullptr, loss, nullptr, o); },
               ErrorKind::value, {"'teacher'", "[8, 100]"});
  expect_error([&] { call(s, cuda_tensor(0x100000, DType::bfloat16, {8, 100}, 1), nullptr, loss, nullptr, o); },
               ErrorKind::value, {"'teacher'", "device"});
  TensorView strided = t;
  strided.strides[1] = 2;
  expect_error([&] { call(s, strided, nullptr, loss, nullptr, o); }, ErrorKind::value, {"'teacher'", "contiguous"});
  const TensorView t32 = cuda_tensor(0x200000, DType::int32, {8}), t7 = cuda_tensor(0x200000, DType::int64, {7});
  expect_error([&] { call(s, t, &t32, loss, nullptr, o); }, ErrorKind::type, {"'target'", "int64"});
  expect_error([&] { call(s, t, &t7, loss, nullptr, o); }, ErrorKind::value, {"'target'", "N = 8"});
  expect_error([&] { call(s, t, &target, cuda_tensor(0x300000, DType::float32, {}), nullptr, o); }, ErrorKind::value,
               {"'loss'", "N = 8"});
  expect_error([&] { call(s, t, &target, cuda_tensor(0x300000, DType::bfloat16, {8}), nullptr, o); }, ErrorKind::type,
               {"'loss'", "float32"});
  const TensorView g16 = cuda_tensor(0x400000, DType::float16, {8, 100});
  expect_error([&] { call(s, t, &target, loss, &g16, o); }, ErrorKind::type, {"'grad'"});
  expect_error([&] { call(s, t, &target, loss, &t, o); }, ErrorKind::value, {"'grad'", "'teacher'"});
  const TensorView inside = cuda_tensor(0x1000 + 200, DType::bfloat16, {8, 100});  // overlaps the student
  expect_error([&] { call(s, t, &target, loss, &inside, o); }, ErrorKind::value, {"'grad'", "'student'"});
  tessera::JsdOptions bad;
  bad.beta = 1.5;
  expect_error([&] { call(s, t, &target, loss, nullptr, bad); }, ErrorKind::value, {"'beta'", "[0, 1]"});
  bad.beta = 0.5, bad.temperature = 0.0;
  expect_error([&] { call(s, t, &target, loss, nullptr, bad); }, ErrorKind::value, {"'temperature'", "> 0"});
  bad.temperature = std::nan("");
  expect_error([&] { call(s, t, &target, loss, nullptr, bad); }, ErrorKind::value, {"'temperature'"});
}

// Device values of a float32 buffer.
std::vector<float> download(const tessera::runtime::DeviceBuffer& b, size_t n) {
  std::vector<float> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), b.data(), n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(JsdGpu, IgnoredRowsAndMaskedClasses) {
  TESSERA_REQUIRE_GPU();
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  const int64_t n = 4, v = 10;
  tessera::runtime::DeviceBuffer bx(n * v * 4), by(n * v * 4), bt(n * 8), bl(n * 4), bg(n * v * 4);
  std::vector<float> x(size_t(n * v)), y(size_t(n * v));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) * 0.5f, y[i] = float(i % 3) - 1.f;
  // Row 3: class 4 masked in both rows, class 5 in the teacher's only.
  const float inf = std::numeric_limits<float>::infinity();
  x[3 * v + 4] = y[3 * v + 4] = y[3 * v + 5] = -inf;
  const auto upload = [](tessera::runtime::DeviceBuffer& b, const auto& h) {
    ASSERT_EQ(cudaMemcpy(b.data(), h.data(), h.size() * sizeof(h[0]), cudaMemcpyHostToDevice), cudaSuccess);
  };
  upload(bx, x), upload(by, y);
  const TensorView tx = TensorView::contiguous(bx.data(), DType::float32, {n, v}, dev);
  const TensorView ty = TensorView::contiguous(by.data(), DType::float32, {n, v}, dev);
  const TensorView tt = TensorView::contiguous(bt.data(), DType::int64, {n}, dev);
  const TensorView tl = TensorView::contiguous(bl.data(), DType::float32, {n}, dev);
  const TensorView tg = TensorView::contiguous(bg.data(), DType::float32, {n, v}, dev);
  // Every row ignored: losses and gradients 0.
  upload(bt, std::vector<int64_t>(size_t(n), -100));
  tessera::jsd(tx, ty, &tt, tl, &tg, {}, nullptr);
  for (float l : download(bl, size_t(n))) EXPECT_EQ(l, 0.0f);
  for (float g : download(bg, size_t(n * v))) EXPECT_EQ(g, 0.0f);
  // No row ignored: the reference's values. The class masked in both rows adds nothing; the one
  // masked in the teacher's alone makes KL(Q || P) (beta 1) infinite, and nothing else.
  upload(bt, std::vector<int64_t>{0, 1, 2, 3});
  std::vector<double> xd(x.begin(), x.end()), yd(y.begin(), y.end());
  for (double beta : {0.0, 0.5, 1.0}) {
    tessera::JsdOptions o;
    o.beta = beta, o.temperature = 2.0;
    tessera::jsd(tx, ty, &tt, tl, &tg, o, nullptr);
    const auto want = ref::jsd(xd, yd, {0, 1, 2, 3}, n, v, spec(beta, 2.0));
    const auto loss = download(bl, size_t(n)), grad = download(bg, size_t(n * v));
    for (int64_t r = 0; r < n; ++r) {
      if (std::isinf(want.loss[size_t(r)])) EXPECT_EQ(loss[size_t(r)], want.loss[size_t(r)]) << beta << " " << r;
      else EXPECT_NEAR(loss[size_t(r)], want.loss[size_t(r)], 1e-5 * (1 + std::fabs(want.loss[size_t(r)]))) << beta << " " << r;
    }
    for (size_t i = 0; i < grad.size(); ++i)
      if (std::isfinite(want.grad[i])) EXPECT_NEAR(grad[i], want.grad[i], 1e-5) << beta << " " << i;
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The description's generic kernel: jsd.inplace writes the gradient over the student.
TEST(JsdGpu, InplaceOverloadThroughTheDescription) {
  TESSERA_REQUIRE_GPU();
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  const int64_t n = 3, v = 37;
  tessera::runtime::DeviceBuffer bx(n * v * 4), by(n * v * 4), bl(n * 4), bl2(n * 4), bg(n * v * 4);
  std::vector<float> x(size_t(n * v)), y(size_t(n * v));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 11) * 0.3f - 1.f, y[i] = float(i % 5) * 0.7f;
  ASSERT_EQ(cudaMemcpy(bx.data(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(by.data(), y.data(), y.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const TensorView tx = TensorView::contiguous(bx.data(), DType::float32, {n, v}, dev);
  const TensorView ty = TensorView::contiguous(by.data(), DType::float32, {n, v}, dev);
  const TensorView tl = TensorView::contiguous(bl.data(), DType::float32, {n}, dev);
  const TensorView tl2 = TensorView::contiguous(bl2.data(), DType::float32, {n}, dev);
  const TensorView tg = TensorView::contiguous(bg.data(), DType::float32, {n, v}, dev);
  tessera::JsdOptions o;
  o.beta = 0.25, o.temperature = 1.5;
  tessera::jsd(tx, ty, nullptr, tl, &tg, o, nullptr);
  const tessera::OpDesc& inplace = tessera::find_op_description("jsd")->overloads.at(0);
  std::vector<tessera::Arg> args(inplace.params.size());
  const auto tensor = [](const TensorView& t) {
    tessera::Arg a;
    a.kind = tessera::Arg::Kind::tensor, a.tensor = t;
    return a;
  };
  args[0] = tensor(tx), args[1] = tensor(ty);  // target (args[2]) None
  args[3].kind = tessera::Arg::Kind::real, args[3].real = 0.25;
  args[4].kind = tessera::Arg::Kind::real, args[4].real = 1.5;
  args[5].kind = tessera::Arg::Kind::integer, args[5].integer = -100;
  args[6] = tensor(tl2), args[7] = tensor(tx);
  inplace.call("jsd.inplace", args.data(), nullptr);
  EXPECT_EQ(download(bl, size_t(n)), download(bl2, size_t(n)));
  EXPECT_EQ(download(bg, size_t(n * v)), download(bx, size_t(n * v)));  // the same bits, in place
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
