// cross_entropy: the CPU reference on known values, the argument checks (no GPU), and on the GPU
// the cases torch's semantics single out (every verify case runs in VerifyGpu): all rows
// ignored, a target out of range, no rows.
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

}  // namespace
