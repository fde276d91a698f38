// Set family (isin): the CPU reference, the path choice, argument checks and messages (CPU), and
// every verify case of every path against the reference (GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "testing.hpp"
#include "ops/registry.hpp"
#include "ops/set/isin_reference.hpp"
#include "tessera/tessera.hpp"

namespace {

using tessera::testing::cuda_tensor;
using tessera::testing::expect_error;
using tessera::testing::fake;

using tessera::DType;
using tessera::Error;
using tessera::ErrorKind;
using tessera::IsinOptions;
using tessera::IsinPath;
using tessera::TensorView;

TensorView host_view(void* p, DType dt, int64_t n) {
  return TensorView::contiguous(p, dt, {n}, tessera::Device{tessera::DeviceType::cpu, 0});
}

TEST(SetReference, IntegersWithDuplicatesAndInvert) {
  std::vector<int32_t> e = {1, 2, 3, 4, 2, -7, 2147483647};
  std::vector<int32_t> t = {2, 2, 9, -7, 2147483647};
  const auto r = tessera::reference::isin(host_view(e.data(), DType::int32, 7), host_view(t.data(), DType::int32, 5), false);
  EXPECT_EQ(r, (std::vector<double>{0, 1, 0, 0, 1, 1, 1}));
  const auto inv = tessera::reference::isin(host_view(e.data(), DType::int32, 7), host_view(t.data(), DType::int32, 5), true);
  EXPECT_EQ(inv, (std::vector<double>{1, 0, 1, 1, 0, 0, 0}));
}

TEST(SetReference, FloatsNaNNeverFoundAndSignedZerosEqual) {
  std::vector<float> e = {NAN, 0.0f, -0.0f, 1.5f, INFINITY, -INFINITY};
  std::vector<float> t = {NAN, -0.0f, INFINITY, 2.0f};
  const auto r = tessera::reference::isin(host_view(e.data(), DType::float32, 6), host_view(t.data(), DType::float32, 4), false);
  EXPECT_EQ(r, (std::vector<double>{0, 1, 1, 0, 1, 0}));
}

TEST(SetReference, Int64BeyondDoublePrecision) {
  std::vector<int64_t> e = {(int64_t(1) << 60) + 1, (int64_t(1) << 60)};
  std::vector<int64_t> t = {(int64_t(1) << 60) + 1};
  const auto r = tessera::reference::isin(host_view(e.data(), DType::int64, 2), host_view(t.data(), DType::int64, 1), false);
  EXPECT_EQ(r, (std::vector<double>{1, 0}));
}

TEST(SetDispatch, ChoosesByDtypeAndSize) {
  using tessera::isin_choose_path;
  EXPECT_EQ(isin_choose_path(DType::int32, 1 << 10, 1 << 10), IsinPath::brute_force);
  EXPECT_EQ(isin_choose_path(DType::int32, 1 << 20, 1 << 20), IsinPath::hash);
  EXPECT_EQ(isin_choose_path(DType::int16, 1 << 20, 1 << 20), IsinPath::bitmap);
  EXPECT_EQ(isin_choose_path(DType::int32, 1 << 20, 1 << 6), IsinPath::brute_force);
  EXPECT_EQ(isin_choose_path(DType::int32, 1 << 20, 1 << 8), IsinPath::hash);
  EXPECT_EQ(isin_choose_path(DType::int32, 1 << 24, 1 << 14), IsinPath::hash);
  IsinOptions sort_below;
  sort_below.hash_min_test = 1 << 18;
  EXPECT_EQ(isin_choose_path(DType::int32, 1 << 24, 1 << 14, sort_below), IsinPath::sort);
  IsinOptions forced;
  forced.path = IsinPath::sort;
  EXPECT_EQ(isin_choose_path(DType::int32, 10, 10, forced), IsinPath::sort);
  IsinOptions tuned;
  tuned.brute_force_max_test = 0;
  EXPECT_NE(isin_choose_path(DType::int32, 1 << 10, 1 << 10, tuned), IsinPath::brute_force);
}

TEST(SetChecks, Messages) {
  const auto e = cuda_tensor(0x1000, DType::int32, {10});
  const auto t = cuda_tensor(0x2000, DType::int32, {5});
  const auto out = cuda_tensor(0x3000, DType::bool_, {10});
  expect_error([&] { tessera::isin(e, cuda_tensor(0x2000, DType::int64, {5}), out, false, false, nullptr); },
               ErrorKind::type, {"tessera.isin", "'test_elements'", "int32", "int64"});
  expect_error([&] { tessera::isin(e, t, cuda_tensor(0x3000, DType::int32, {10}), false, false, nullptr); },
               ErrorKind::type, {"'out'", "bool"});
  expect_error([&] { tessera::isin(e, t, cuda_tensor(0x3000, DType::bool_, {9}), false, false, nullptr); },
               ErrorKind::value, {"'out'", "[10]", "[9]"});
  TensorView cpu = e;
  cpu.device = tessera::Device{tessera::DeviceType::cpu, 0};
  expect_error([&] { tessera::isin(cpu, t, out, false, false, nullptr); }, ErrorKind::value, {"'elements'", "CUDA"});
  IsinOptions bitmap;
  bitmap.path = IsinPath::bitmap;
  expect_error([&] { tessera::isin(e, t, out, false, false, nullptr, bitmap); }, ErrorKind::value, {"bitmap", "int32"});
  expect_error([&] { tessera::isin(e, t, cuda_tensor(0x1000, DType::bool_, {10}), false, false, nullptr); },
               ErrorKind::value, {"'out'", "overlap"});
}

}  // namespace
