// Elementwise family: references (CPU), argument checks and messages (CPU), and every verify case
// of add / gelu / gelu_backward against the reference (GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "testing.hpp"
#include "ops/elementwise/add_reference.hpp"
#include "ops/elementwise/gelu_reference.hpp"
#include "ops/registry.hpp"
#include "tessera/tessera.hpp"

namespace {

using tessera::testing::cuda_tensor;
using tessera::testing::expect_error;
using tessera::testing::fake;

using tessera::DType;
using tessera::Error;
using tessera::ErrorKind;
using tessera::GeluApproximate;
using tessera::TensorView;

// ---- references --------------------------------------------------------------------------
TEST(ElementwiseReference, GeluKnownValues) {
  EXPECT_NEAR(tessera::reference::gelu(1.0, GeluApproximate::none), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(tessera::reference::gelu(-1.0, GeluApproximate::none), -0.15865525393145707, 1e-15);
  EXPECT_NEAR(tessera::reference::gelu(1.0, GeluApproximate::tanh), 0.8411919906082768, 1e-15);
  EXPECT_NEAR(tessera::reference::gelu(-3.0, GeluApproximate::tanh), -0.0036373920817729943, 1e-15);
  EXPECT_EQ(tessera::reference::gelu(0.0, GeluApproximate::none), 0.0);
}

TEST(ElementwiseReference, GeluGradMatchesFiniteDifference) {
  for (auto ap : {GeluApproximate::none, GeluApproximate::tanh})
    for (double x = -6; x <= 6; x += 0.37) {
      const double h = 1e-6;
      const double fd = (tessera::reference::gelu(x + h, ap) - tessera::reference::gelu(x - h, ap)) / (2 * h);
      EXPECT_NEAR(tessera::reference::gelu_grad(x, ap), fd, 1e-8) << "x=" << x;
    }
}

TEST(ElementwiseReference, AddBroadcastAndStrides) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};  // [2, 3]
  std::vector<float> b = {10, 20, 30};        // [3] broadcast over rows
  const tessera::Device cpu{tessera::DeviceType::cpu, 0};
  auto av = TensorView::contiguous(a.data(), DType::float32, {2, 3}, cpu);
  auto bv = TensorView::strided(b.data(), DType::float32, {2, 3}, {0, 1}, cpu);
  auto r = tessera::reference::add(av, bv, 0.5);
  EXPECT_EQ(r, (std::vector<double>{6, 12, 18, 9, 15, 21}));
  auto at = TensorView::strided(a.data(), DType::float32, {3, 2}, {1, 3}, cpu);  // transposed
  EXPECT_EQ(tessera::reference::add(at, 1.0, -2.0), (std::vector<double>{-1, 2, 0, 3, 1, 4}));
}

// ---- argument checks (no GPU needed: they run before any CUDA call) -------------------------
TEST(ElementwiseChecks, CpuTensorRejected) {
  std::vector<float> host(4);
  auto a = TensorView::contiguous(host.data(), DType::float32, {4}, {tessera::DeviceType::cpu, 0});
  auto o = cuda_tensor(0x2000, DType::float32, {4});
  expect_error([&] { tessera::add(a, o, o, 1.0, nullptr); }, ErrorKind::value,
               {"tessera.add: argument 'input'", "expected a CUDA tensor", "got a tensor on cpu"});
  expect_error([&] { tessera::gelu(a, o, GeluApproximate::none, nullptr); }, ErrorKind::value,
               {"tessera.gelu: argument 'input'", "CUDA tensor"});
}

TEST(ElementwiseChecks, ShapesThatDoNotBroadcast) {
  auto a = cuda_tensor(0x1000, DType::float32, {4, 5});
  auto b = cuda_tensor(0x9000, DType::float32, {3});
  auto o = cuda_tensor(0x20000, DType::float32, {4, 5});
  expect_error([&] { tessera::add(a, b, o, 1.0, nullptr); }, ErrorKind::value,
               {"argument 'other'", "broadcastable with input's [4, 5]", "got [3]"});
}

TEST(ElementwiseChecks, OutOfWrongShape) {
  auto a = cuda_tensor(0x1000, DType::float32, {4, 5});
  auto b = cuda_tensor(0x9000, DType::float32, {5});
  auto o = cuda_tensor(0x20000, DType::float32, {5, 4});
  expect_error([&] { tessera::add(a, b, o, 1.0, nullptr); }, ErrorKind::value,
               {"argument 'out'", "expected shape [4, 5]", "got [5, 4]"});
  auto x = cuda_tensor(0x1000, DType::bfloat16, {8});
  auto y = cuda_tensor(0x9000, DType::bfloat16, {9});
  expect_error([&] { tessera::gelu(x, y, GeluApproximate::tanh, nullptr); }, ErrorKind::value,
               {"tessera.gelu: argument 'out'", "shape [8]", "got [9]"});
  expect_error([&] { tessera::gelu_backward(y, x, x, GeluApproximate::none, nullptr); }, ErrorKind::value,
               {"tessera.gelu_backward: argument 'grad_output'", "shape [8]", "got [9]"});
}

TEST(ElementwiseChecks, DtypesThatDoNotMatch) {
  auto a = cuda_tensor(0x1000, DType::float32, {4});
  auto b = cuda_tensor(0x9000, DType::float16, {4});
  auto o = cuda_tensor(0x20000, DType::float32, {4});
  expect_error([&] { tessera::add(a, b, o, 1.0, nullptr); }, ErrorKind::type,
               {"argument 'other'", "dtype float32 (that of 'input')", "got float16"});
  auto o16 = cuda_tensor(0x20000, DType::bfloat16, {4});
  expect_error([&] { tessera::gelu(a, o16, GeluApproximate::none, nullptr); }, ErrorKind::type,
               {"argument 'out'", "got bfloat16"});
}

TEST(ElementwiseChecks, UnsupportedDtype) {
  auto a = cuda_tensor(0x1000, DType::int32, {4});
  expect_error([&] { tessera::add(a, a, a, 1.0, nullptr); }, ErrorKind::type,
               {"argument 'input'", "dtype in {float32, float16, bfloat16}", "got int32"});
  auto d = cuda_tensor(0x1000, DType::float64, {4});
  expect_error([&] { tessera::gelu(d, d, GeluApproximate::none, nullptr); }, ErrorKind::type, {"got float64"});
}

TEST(ElementwiseChecks, DevicesThatDoNotMatch) {
  auto a = cuda_tensor(0x1000, DType::float32, {4}, 0);
  auto b = cuda_tensor(0x9000, DType::float32, {4}, 1);
  expect_error([&] { tessera::add(a, b, a, 1.0, nullptr); }, ErrorKind::value,
               {"argument 'other'", "device cuda:0 (that of 'input')", "got cuda:1"});
}

TEST(ElementwiseChecks, NullPointer) {
  auto a = TensorView::contiguous(nullptr, DType::float16, {4});
  auto o = cuda_tensor(0x9000, DType::float16, {4});
  expect_error([&] { tessera::add(a, o, o, 1.0, nullptr); }, ErrorKind::value,
               {"argument 'input'", "non-null data pointer", "got nullptr"});
  expect_error([&] { tessera::gelu(o, a, GeluApproximate::none, nullptr); }, ErrorKind::value,
               {"argument 'out'", "non-null"});
}

TEST(ElementwiseChecks, OutOverlappingAnInput) {
  auto a = cuda_tensor(0x1000, DType::float32, {64});
  auto b = cuda_tensor(0x9000, DType::float32, {64});
  auto shifted = cuda_tensor(0x1000 + 4 * 8, DType::float32, {64});  // a, 8 elements on
  expect_error([&] { tessera::add(a, b, shifted, 1.0, nullptr); }, ErrorKind::value,
               {"argument 'out'", "does not overlap 'input'", "got an overlapping tensor"});
  expect_error([&] { tessera::add(b, a, shifted, 1.0, nullptr); }, ErrorKind::value, {"does not overlap 'other'"});
  expect_error([&] { tessera::gelu(a, shifted, GeluApproximate::none, nullptr); }, ErrorKind::value,
               {"tessera.gelu: argument 'out'", "does not overlap 'input'"});
  auto bcast = TensorView::strided(fake(0x40000), DType::float32, {64}, {0});
  expect_error([&] { tessera::add(a, b, bcast, 1.0, nullptr); }, ErrorKind::value,
               {"argument 'out'", "elements do not overlap", "stride 0"});
}

TEST(ElementwiseChecks, EmptyTensorsReturnWithoutTouchingTheGpu) {
  auto a = TensorView::contiguous(nullptr, DType::float32, {0, 3});
  EXPECT_NO_THROW(tessera::add(a, a, a, 1.0, nullptr));
  EXPECT_NO_THROW(tessera::add(a, 2.0, a, 1.0, nullptr));
  EXPECT_NO_THROW(tessera::gelu(a, a, GeluApproximate::tanh, nullptr));
  EXPECT_NO_THROW(tessera::gelu_backward(a, a, a, GeluApproximate::none, nullptr));
}

TEST(ElementwiseRegistry, OpsAndVariants) {
  for (const char* name : {"add", "gelu", "gelu_tanh", "gelu_backward", "gelu_tanh_backward"})
    EXPECT_NE(tessera::ops::find_op(name), nullptr) << name;
  EXPECT_EQ(tessera::ops::select_ops("gelu").size(), 4u);
  EXPECT_EQ(tessera::ops::select_ops("add").size(), 1u);
  EXPECT_TRUE(tessera::ops::select_ops("gel").empty());
  for (const auto& op : tessera::ops::all_ops()) {
    EXPECT_FALSE(op.verify_cases().empty()) << op.name;
    EXPECT_FALSE(op.bench_sizes.empty()) << op.name;
  }
}

}  // namespace
