// cross_entropy: the CPU reference on known values (torch's own, for class weights and
// probability targets), the argument checks (no GPU), and on the GPU the cases torch's semantics
// single out (every verify case runs in VerifyGpu): all rows ignored, a target out of range, no
// rows, class weights that sum to 0.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gpu.hpp"
#include "ops/loss/cross_entropy_reference.hpp"
#include "runtime/memory.hpp"
#include "tessera/ops/loss.hpp"
#include "testing.hpp"

namespace {

using tessera::DType;
using tessera::ErrorKind;
using tessera::TensorView;
using tessera::testing::cuda_tensor;
using tessera::testing::expect_error;
namespace ref = tessera::reference;

TEST(CrossEntropyReference, KnownValues) {
  // Two equal logits: log 2, gradient (1/2 - 1, 1/2) toward the target.
  auto r = ref::cross_entropy({3.0, 3.0}, {0}, 1, 2, {});
  EXPECT_NEAR(r.loss[0], std::log(2.0), 1e-12);
  EXPECT_NEAR(r.grad[0], -0.5, 1e-12);
  EXPECT_NEAR(r.grad[1], 0.5, 1e-12);
  // Label smoothing e: (1 - e) of the target's -log p plus e / V of every class's.
  ref::CrossEntropySpec s;
  s.label_smoothing = 0.2;
  const std::vector<double> x = {1.0, -2.0, 0.5};
  r = ref::cross_entropy(x, {2}, 1, 3, s);
  const double lse = std::log(std::exp(1.0) + std::exp(-2.0) + std::exp(0.5));
  EXPECT_NEAR(r.loss[0], 0.8 * (lse - 0.5) + 0.2 / 3 * ((lse - 1.0) + (lse + 2.0) + (lse - 0.5)), 1e-12);
  // The gradient sums to 0 over the classes (without z-loss).
  EXPECT_NEAR(r.grad[0] + r.grad[1] + r.grad[2], 0.0, 1e-12);
  // Ignored rows: 0, not counted; a target out of range: NaN.
  r = ref::cross_entropy({1.0, 2.0, 1.0, 2.0}, {-100, 5}, 2, 2, {});
  EXPECT_EQ(r.loss[0], 0.0);
  EXPECT_EQ(r.valid, 1);
  EXPECT_TRUE(std::isnan(r.loss[1]) && std::isnan(r.grad[2]));
}

TEST(CrossEntropyReference, GradientMatchesFiniteDifferences) {
  ref::CrossEntropySpec s;
  s.label_smoothing = 0.1, s.z_loss = 1e-2, s.softcap = 3.0;
  std::vector<double> x = {0.3, -1.2, 2.5, 0.0, 4.0};
  const auto r = ref::cross_entropy(x, {1}, 1, 5, s);
  for (size_t j = 0; j < x.size(); ++j) {
    std::vector<double> hi = x, lo = x;
    hi[j] += 1e-6, lo[j] -= 1e-6;
    const double fd = (ref::cross_entropy(hi, {1}, 1, 5, s).loss[0] - ref::cross_entropy(lo, {1}, 1, 5, s).loss[0]) / 2e-6;
    EXPECT_NEAR(r.grad[j], fd, 1e-6) << j;
  }
}

// The logits and targets of the values below, which torch gave (F.cross_entropy in float64).
const std::vector<double> kX = {1.0, -2.0, 0.5, 0.25, 3.0, -1.0, 2.0, 0.0, -0.5};
const std::vector<double> kW = {0.5, 2.0, 1.5};
const std::vector<int64_t> kT = {2, -100, 0};
const std::vector<double> kQ = {0.2, 0.3, 0.5, 1.0, 0.0, 0.0, 0.1, 0.1, 0.8};

double mean_of(const ref::CrossEntropyRows& r) {
  double s = 0;
  for (double v : r.loss) s += v;
  return s / r.divisor;
}

TEST(CrossEntropyReference, ClassWeightsAsTorch) {
  ref::CrossEntropySpec s;
  s.weight = kW;
  auto r = ref::cross_entropy(kX, kT, 3, 3, s);
  EXPECT_NEAR(r.loss[0], 1.506895353513425, 1e-12);
  EXPECT_EQ(r.loss[1], 0.0);
  EXPECT_NEAR(r.loss[2], 0.09836704845980856, 1e-12);
  EXPECT_NEAR(r.divisor, 1.5 + 0.5, 1e-15);  // the targets' weights of the rows not ignored
  EXPECT_NEAR(mean_of(r), 0.8026312009866168, 1e-12);
  s.label_smoothing = 0.2;  // torch's smoothing term weights each class too
  r = ref::cross_entropy(kX, kT, 3, 3, s);
  EXPECT_NEAR(r.loss[0], 1.7900754567686823, 1e-12);
  EXPECT_NEAR(r.loss[2], 0.6478227312797447, 1e-12);
  EXPECT_NEAR(mean_of(r), 1.2189490940242136, 1e-12);
  // Weights of 1 are no weights (the divisor then counts rows).
  ref::CrossEntropySpec ones, none;
  ones.weight = {1.0, 1.0, 1.0};
  ones.label_smoothing = none.label_smoothing = 0.1;
  const auto a = ref::cross_entropy(kX, kT, 3, 3, ones), b = ref::cross_entropy(kX, kT, 3, 3, none);
  for (size_t i = 0; i < a.grad.size(); ++i) EXPECT_NEAR(a.grad[i], b.grad[i], 1e-15);
  EXPECT_EQ(a.divisor, 2.0);
  EXPECT_EQ(b.divisor, 2.0);
}

TEST(CrossEntropyReference, ProbabilitiesAsTorch) {
  ref::CrossEntropySpec s;
  s.weight = kW;
  auto r = ref::cross_entropy_probs(kX, kQ, 3, 3, s);
  EXPECT_NEAR(r.loss[0], 2.9066655083963107, 1e-12);
  EXPECT_NEAR(r.loss[1], 1.4145181007020498, 1e-12);
  EXPECT_NEAR(r.loss[2], 3.6852644405334445, 1e-12);
  EXPECT_EQ(r.divisor, 3.0);  // the mean over rows, weights or not
  s.label_smoothing = 0.2;
  r = ref::cross_entropy_probs(kX, kQ, 3, 3, s);
  EXPECT_NEAR(r.loss[1], 1.644357467602733, 1e-12);
  EXPECT_NEAR(mean_of(r), 2.690529897738793, 1e-12);
  // One-hot probabilities are class indices.
  ref::CrossEntropySpec plain;
  plain.label_smoothing = 0.1, plain.z_loss = 1e-2;
  const auto a = ref::cross_entropy_probs(kX, {0, 0, 1, 1, 0, 0, 0, 1, 0}, 3, 3, plain);
  const auto b = ref::cross_entropy(kX, {2, 0, 1}, 3, 3, plain);
  for (size_t i = 0; i < a.loss.size(); ++i) EXPECT_NEAR(a.loss[i], b.loss[i], 1e-12);
  for (size_t i = 0; i < a.grad.size(); ++i) EXPECT_NEAR(a.grad[i], b.grad[i], 1e-12);
}

TEST(CrossEntropyReference, WeightedGradientsMatchFiniteDifferences) {
  ref::CrossEntropySpec s;
  s.label_smoothing = 0.15, s.z_loss = 1e-2, s.softcap = 3.0, s.weight = {0.3, 1.7, 0.9, 1.1, 2.0};
  const std::vector<double> x = {0.3, -1.2, 2.5, 0.0, 4.0}, q = {0.1, 0.4, 0.2, 0.05, 0.25};
  for (bool probs : {false, true}) {
    const auto at = [&](const std::vector<double>& v) {
      return probs ? ref::cross_entropy_probs(v, q, 1, 5, s) : ref::cross_entropy(v, {3}, 1, 5, s);
    };
    const auto r = at(x);
    for (size_t j = 0; j < x.size(); ++j) {
      std::vector<double> hi = x, lo = x;
      hi[j] += 1e-6, lo[j] -= 1e-6;
      EXPECT_NEAR(r.grad[j], (at(hi).loss[0] - at(lo).loss[0]) / 2e-6, 1e-6) << probs << " " << j;
    }
  }
}

TEST(CrossEntropyChecks, NameTheArgument) {
  const TensorView x = cuda_tensor(0x1000, DType::bfloat16, {8, 100});
  const TensorView t = cuda_tensor(0x100000, DType::int64, {8});
  const TensorView l0 = cuda_tensor(0x200000, DType::float32, {});
  const TensorView l1 = cuda_tensor(0x200000, DType::float32, {8});
  tessera::CrossEntropyOptions none;
  none.reduction = tessera::Reduction::none;
  expect_error([&] { tessera::cross_entropy(x, cuda_tensor(0x100000, DType::float32, {8}), l0, nullptr, nullptr, {}, nullptr); },
               ErrorKind::type, {"tessera.cross_entropy", "'target'"});
  expect_error([&] { tessera::cross_entropy(x, cuda_tensor(0x100000, DType::int64, {7}), l0, nullptr, nullptr, {}, nullptr); },
               ErrorKind::value, {"'target'", "N = 8"});
  expect_error([&] { tessera::cross_entropy(x, t, l1, nullptr, nullptr, {}, nullptr); }, ErrorKind::value,
               {"'loss'", "0-d"});
  expect_error([&] { tessera::cross_entropy(x, t, l0, nullptr, nullptr, none, nullptr); }, ErrorKind::value,
               {"'loss'", "reduction none"});
  expect_error([&] { tessera::cross_entropy(cuda_tensor(0x1000, DType::bfloat16, {8, 100, 2}), t, l0, nullptr, nullptr, {},
                                            nullptr); },
               ErrorKind::value, {"'logits'", "2-d"});
  const TensorView g = cuda_tensor(0x300000, DType::float16, {8, 100});
  expect_error([&] { tessera::cross_entropy(x, t, l0, nullptr, &g, {}, nullptr); }, ErrorKind::type, {"'grad'"});
  tessera::CrossEntropyOptions bad;
  bad.label_smoothing = 1.5;
  expect_error([&] { tessera::cross_entropy(x, t, l0, nullptr, nullptr, bad, nullptr); }, ErrorKind::value,
               {"'label_smoothing'", "[0, 1]"});
}

TEST(CrossEntropyChecks, ClassWeightsAndProbabilities) {
  const TensorView x = cuda_tensor(0x1000, DType::bfloat16, {8, 100});
  const TensorView t = cuda_tensor(0x100000, DType::int64, {8});
  const TensorView l0 = cuda_tensor(0x200000, DType::float32, {});
  const auto with_weight = [](const TensorView& w) {
    tessera::CrossEntropyOptions o;
    o.weight = &w;
    return o;
  };
  // weight: float32 [V], contiguous, on the logits' device.
  const TensorView short_w = cuda_tensor(0x300000, DType::float32, {99});
  expect_error([&] { tessera::cross_entropy(x, t, l0, nullptr, nullptr, with_weight(short_w), nullptr); },
               ErrorKind::value, {"tessera.cross_entropy", "'weight'", "V = 100", "[99]"});
  const TensorView half_w = cuda_tensor(0x300000, DType::bfloat16, {100});
  expect_error([&] { tessera::cross_entropy(x, t, l0, nullptr, nullptr, with_weight(half_w), nullptr); },
               ErrorKind::type, {"'weight'", "float32"});
  const TensorView other_device = cuda_tensor(0x300000, DType::float32, {100}, 1);
  expect_error([&] { tessera::cross_entropy(x, t, l0, nullptr, nullptr, with_weight(other_device), nullptr); },
               ErrorKind::value, {"'weight'"});
  TensorView strided = cuda_tensor(0x300000, DType::float32, {100});
  strided.strides[0] = 2;
  expect_error([&] { tessera::cross_entropy(x, t, l0, nullptr, nullptr, with_weight(strided), nullptr); },
               ErrorKind::value, {"'weight'", "contiguous"});
  // Probabilities: the logits' shape and dtype; ignore_index negative (torch's rule).
  const TensorView q = cuda_tensor(0x400000, DType::bfloat16, {8, 100});
  expect_error([&] { tessera::cross_entropy(x, cuda_tensor(0x400000, DType::float32, {8, 100}), l0, nullptr, nullptr, {},
                                            nullptr); },
               ErrorKind::type, {"'target'", "probabilities", "bfloat16"});
  expect_error([&] { tessera::cross_entropy(x, cuda_tensor(0x400000, DType::int64, {8, 100}), l0, nullptr, nullptr, {},
                                            nullptr); },
               ErrorKind::type, {"'target'", "probabilities"});
  expect_error([&] { tessera::cross_entropy(x, cuda_tensor(0x400000, DType::bfloat16, {8, 99}), l0, nullptr, nullptr, {},
                                            nullptr); },
               ErrorKind::value, {"'target'", "[8, 100]"});
  tessera::CrossEntropyOptions ignore3;
  ignore3.ignore_index = 3;
  expect_error([&] { tessera::cross_entropy(x, q, l0, nullptr, nullptr, ignore3, nullptr); }, ErrorKind::value,
               {"'ignore_index'", "negative", "3"});
  // The fused loss's class weights: V float32 values.
  const TensorView h = cuda_tensor(0x1000, DType::bfloat16, {8, 16}), pw = cuda_tensor(0x10000, DType::bfloat16, {100, 16});
  const TensorView w99 = cuda_tensor(0x300000, DType::float32, {99}), w = cuda_tensor(0x300000, DType::float32, {100});
  tessera::LinearCrossEntropyOptions lo;
  lo.weight = &w99;
  expect_error([&] { tessera::linear_cross_entropy(h, pw, nullptr, t, l0, nullptr, {}, lo, nullptr); },
               ErrorKind::value, {"tessera.linear_cross_entropy", "class weights", "V = 100"});
}

// Device values of a float32 buffer.
std::vector<float> download(const tessera::runtime::DeviceBuffer& b, size_t n) {
  std::vector<float> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), b.data(), n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(CrossEntropyGpu, TorchsEdgeCases) {
  TESSERA_REQUIRE_GPU();
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  const int64_t n = 4, v = 10;
  tessera::runtime::DeviceBuffer bx(n * v * 4), bt(n * 8), bl(n * 4), bg(n * v * 4);
  const std::vector<float> x(size_t(n * v), 0.5f);
  ASSERT_EQ(cudaMemcpy(bx.data(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const TensorView tx = TensorView::contiguous(bx.data(), DType::float32, {n, v}, dev);
  const TensorView tt = TensorView::contiguous(bt.data(), DType::int64, {n}, dev);
  const TensorView scalar = TensorView::contiguous(bl.data(), DType::float32, {}, dev);
  const TensorView rows = TensorView::contiguous(bl.data(), DType::float32, {n}, dev);
  const TensorView tg = TensorView::contiguous(bg.data(), DType::float32, {n, v}, dev);
  auto targets = [&](std::vector<int64_t> t) {
    ASSERT_EQ(cudaMemcpy(bt.data(), t.data(), 32, cudaMemcpyHostToDevice), cudaSuccess);
  };
  // Every row ignored: the mean is 0 / 0 = NaN, the sum 0, the gradient 0 (as torch).
  targets({-100, -100, -100, -100});
  tessera::cross_entropy(tx, tt, scalar, nullptr, &tg, {}, nullptr);
  EXPECT_TRUE(std::isnan(download(bl, 1)[0]));
  for (float g : download(bg, size_t(n * v))) EXPECT_EQ(g, 0.0f);
  tessera::CrossEntropyOptions sum;
  sum.reduction = tessera::Reduction::sum;
  tessera::cross_entropy(tx, tt, scalar, nullptr, &tg, sum, nullptr);
  EXPECT_EQ(download(bl, 1)[0], 0.0f);
  // A target out of range: that row's loss and gradient NaN, the others untouched.
  targets({1, 10, -1, 3});
  tessera::CrossEntropyOptions none;
  none.reduction = tessera::Reduction::none;
  tessera::cross_entropy(tx, tt, rows, nullptr, &tg, none, nullptr);
  const auto loss = download(bl, size_t(n)), grad = download(bg, size_t(n * v));
  EXPECT_NEAR(loss[0], std::log(10.0), 1e-5);
  EXPECT_TRUE(std::isnan(loss[1]) && std::isnan(loss[2]));
  EXPECT_NEAR(loss[3], std::log(10.0), 1e-5);
  EXPECT_TRUE(std::isnan(grad[size_t(v)]) && !std::isnan(grad[0]) && !std::isnan(grad[size_t(3 * v)]));
  // No rows: the mean NaN, the sum 0.
  const TensorView empty = TensorView::contiguous(bx.data(), DType::float32, {0, v}, dev);
  const TensorView no_t = TensorView::contiguous(bt.data(), DType::int64, {0}, dev);
  tessera::cross_entropy(empty, no_t, scalar, nullptr, nullptr, {}, nullptr);
  EXPECT_TRUE(std::isnan(download(bl, 1)[0]));
  tessera::cross_entropy(empty, no_t, scalar, nullptr, nullptr, sum, nullptr);
  EXPECT_EQ(download(bl, 1)[0], 0.0f);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CrossEntropyGpu, ClassWeightEdgeCases) {
  TESSERA_REQUIRE_GPU();
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  const int64_t n = 4, v = 10;
  tessera::runtime::DeviceBuffer bx(n * v * 4), bt(n * 8), bl(4), bg(n * v * 4), bw(v * 4), bq(n * v * 4);
  std::vector<float> x(size_t(n * v));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) * 0.5f;
  ASSERT_EQ(cudaMemcpy(bx.data(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const TensorView tx = TensorView::contiguous(bx.data(), DType::float32, {n, v}, dev);
  const TensorView tt = TensorView::contiguous(bt.data(), DType::int64, {n}, dev);
  const TensorView scalar = TensorView::contiguous(bl.data(), DType::float32, {}, dev);
  const TensorView tg = TensorView::contiguous(bg.data(), DType::float32, {n, v}, dev);
  const TensorView tw = TensorView::contiguous(bw.data(), DType::float32, {v}, dev);
  const auto upload = [](tessera::runtime::DeviceBuffer& b, const auto& h) {
    ASSERT_EQ(cudaMemcpy(b.data(), h.data(), h.size() * sizeof(h[0]), cudaMemcpyHostToDevice), cudaSuccess);
  };
  upload(bt, std::vector<int64_t>{-100, -100, -100, -100});
  upload(bw, std::vector<float>(size_t(v), 0.5f));
  tessera::CrossEntropyOptions o;
  o.weight = &tw;
  for (double e : {0.0, 0.1}) {  // the plain kernel and the per-class one
    // Every row ignored: the mean 0 / 0 = NaN, the gradient 0 (as torch).
    o.label_smoothing = e;
    tessera::cross_entropy(tx, tt, scalar, nullptr, &tg, o, nullptr);
    EXPECT_TRUE(std::isnan(download(bl, 1)[0])) << e;
    for (float g : download(bg, size_t(n * v))) EXPECT_EQ(g, 0.0f) << e;
  }
  // Targets whose weights sum to 0: the mean and its gradient NaN (as torch).
  upload(bt, std::vector<int64_t>{1, 2, 3, 4});
  upload(bw, std::vector<float>(size_t(v), 0.0f));
  o.label_smoothing = 0.0;
  tessera::cross_entropy(tx, tt, scalar, nullptr, &tg, o, nullptr);
  EXPECT_TRUE(std::isnan(download(bl, 1)[0]));
  EXPECT_TRUE(std::isnan(download(bg, 1)[0]));
  // Probabilities: the mean divides by the rows whatever the weights; one-hot rows are indices.
  std::vector<float> q(size_t(n * v), 0.0f), w(static_cast<size_t>(v), 0.0f);
  for (int64_t r = 0; r < n; ++r) q[size_t(r * v + r + 1)] = 1.0f;
  for (int64_t j = 0; j < v; ++j) w[size_t(j)] = 0.25f * float(j + 1);
  upload(bq, q);
  upload(bw, w);
  const TensorView tq = TensorView::contiguous(bq.data(), DType::float32, {n, v}, dev);
  tessera::cross_entropy(tx, tq, scalar, nullptr, nullptr, o, nullptr);
  const float by_rows = download(bl, 1)[0];
  tessera::cross_entropy(tx, tt, scalar, nullptr, nullptr, o, nullptr);
  const float by_weights = download(bl, 1)[0];
  const float weight_sum = w[1] + w[2] + w[3] + w[4];
  EXPECT_NEAR(by_rows * float(n), by_weights * weight_sum, 1e-5f * by_rows * float(n));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
