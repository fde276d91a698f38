// softmax / log_softmax and their backward functions: references (CPU), argument checks and
// messages (CPU), and every verify case against the reference (GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "testing.hpp"
#include "ops/registry.hpp"
#include "ops/rowwise/cases.hpp"
#include "ops/rowwise/softmax_reference.hpp"
#include "tessera/tessera.hpp"

namespace {

using tessera::testing::cuda_tensor;
using tessera::testing::expect_error;
using tessera::testing::fake;

using tessera::DType;
using tessera::Error;
using tessera::ErrorKind;
using tessera::TensorView;
namespace ref = tessera::reference;

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const tessera::Device kCpu{tessera::DeviceType::cpu, 0};

TensorView host(std::vector<double>& v, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(v.data(), DType::float64, shape, kCpu);
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// ---- references --------------------------------------------------------------------------
TEST(SoftmaxReference, KnownValues) {
  std::vector<double> x = {1, 2, 3};
  expect_near_all(ref::softmax(host(x, {3}), -1), {0.09003057317038046, 0.24472847105479764, 0.6652409557748219}, 1e-15);
  expect_near_all(ref::log_softmax(host(x, {3}), 0),
                  {-2.4076059644443806, -1.4076059644443806, -0.4076059644443806}, 1e-15);
  // Shift invariance, and no overflow for large inputs.
  std::vector<double> big = {1001, 1002, 1003};
  expect_near_all(ref::softmax(host(big, {3}), 0), ref::softmax(host(x, {3}), 0), 1e-15);
}

TEST(SoftmaxReference, DimAndStrides) {
  // [2, 3] over dim 0: each column normalized on its own.
  std::vector<double> x = {0, 1, 2, 0, 3, 2};
  const auto r = ref::softmax(host(x, {2, 3}), 0);
  const double a = 1 / (1 + std::exp(2.0));
  expect_near_all(r, {0.5, a, 0.5, 0.5, 1 - a, 0.5}, 1e-15);
  // The same data seen transposed ([3, 2], strides (1, 3)) over dim 1 is the transpose of that.
  auto t = TensorView::strided(x.data(), DType::float64, {3, 2}, {1, 3}, kCpu);
  expect_near_all(ref::softmax(t, 1), {0.5, 0.5, a, 1 - a, 0.5, 0.5}, 1e-15);
  expect_near_all(ref::softmax(t, -1), ref::softmax(t, 1), 0);
  // A 0-d tensor is one row of one element.
  std::vector<double> s = {4.5};
  auto scalar = TensorView::make(s.data(), DType::float64, nullptr, nullptr, 0, kCpu);
  EXPECT_EQ(ref::softmax(scalar, 0), std::vector<double>{1.0});
  EXPECT_EQ(ref::log_softmax(scalar, -1), std::vector<double>{0.0});
  EXPECT_THROW(ref::softmax(scalar, 1), Error);
  EXPECT_THROW(ref::softmax(host(x, {2, 3}), -3), Error);
}

TEST(SoftmaxReference, InfinityAndNaNFollowTorch) {
  // -inf entries give 0 (log_softmax: -inf); the rest renormalize.
  std::vector<double> x = {0, -kInf, 0};
  EXPECT_EQ(ref::softmax(host(x, {3}), 0), (std::vector<double>{0.5, 0, 0.5}));
  const auto l = ref::log_softmax(host(x, {3}), 0);
  EXPECT_NEAR(l[0], -std::log(2.0), 1e-15);
  EXPECT_EQ(l[1], -kInf);
  // A row of all -inf, a row with NaN, a row with +inf: NaN rows. Other rows are unaffected.
  std::vector<double> rows = {-kInf, -kInf, -kInf, 1, kNaN, 2, 1, kInf, 2, 5, 5, 5};
  for (bool log : {false, true}) {
    const auto r = log ? ref::log_softmax(host(rows, {4, 3}), 1) : ref::softmax(host(rows, {4, 3}), 1);
    for (int i = 0; i < 9; ++i) EXPECT_TRUE(std::isnan(r[i])) << "log=" << log << " element " << i;
    for (int i = 9; i < 12; ++i) EXPECT_NEAR(r[i], log ? -std::log(3.0) : 1.0 / 3, 1e-15);
  }
}

// The backward references are the gradients of sum(g * f(x)): checked by central differences.
TEST(SoftmaxReference, BackwardMatchesFiniteDifferences) {
  std::vector<double> x = {0.3, -1.2, 2.0, 0.7, -0.4};
  std::vector<double> g = {0.5, -1.0, 0.25, 2.0, -0.75};
  for (bool log : {false, true}) {
    auto f = [&](std::vector<double> xv) {
      const auto y = log ? ref::log_softmax(host(xv, {5}), 0) : ref::softmax(host(xv, {5}), 0);
      double s = 0;
      for (int i = 0; i < 5; ++i) s += g[i] * y[i];
      return s;
    };
    std::vector<double> y = log ? ref::log_softmax(host(x, {5}), 0) : ref::softmax(host(x, {5}), 0);
    const auto grad = log ? ref::log_softmax_backward(host(g, {5}), host(y, {5}), 0)
                          : ref::softmax_backward(host(g, {5}), host(y, {5}), 0);
    for (int i = 0; i < 5; ++i) {
      const double h = 1e-6;
      auto xp = x, xm = x;
      xp[i] += h;
      xm[i] -= h;
      EXPECT_NEAR(grad[i], (f(xp) - f(xm)) / (2 * h), 1e-8) << "log=" << log << " i=" << i;
    }
  }
}

TEST(SoftmaxReference, RowGeometry) {
  auto t = TensorView::contiguous(nullptr, DType::float32, {2, 3, 4}, kCpu);
  const auto g = ref::row_geometry(t, 1);
  EXPECT_EQ(g.rows, 8);
  EXPECT_EQ(g.n, 3);
  EXPECT_EQ(g.inner, 4);
  EXPECT_EQ(g.index(5, 2), 1 * 12 + 2 * 4 + 1);  // row 5 = (outer 1, inner 1)
  EXPECT_EQ(ref::row_geometry(TensorView::contiguous(nullptr, DType::float32, {5, 0}, kCpu), -1).rows, 0);
}

// ---- argument checks (no GPU needed: they run before any CUDA call) -------------------------

TEST(SoftmaxChecks, CpuTensorRejected) {
  std::vector<float> h(4);
  auto x = TensorView::contiguous(h.data(), DType::float32, {4}, kCpu);
  auto o = cuda_tensor(0x2000, DType::float32, {4});
  expect_error([&] { tessera::softmax(x, -1, o, nullptr); }, ErrorKind::value,
               {"tessera.softmax: argument 'input'", "expected a CUDA tensor", "got a tensor on cpu"});
  expect_error([&] { tessera::log_softmax(o, -1, x, nullptr); }, ErrorKind::value,
               {"tessera.log_softmax: argument 'out'", "CUDA tensor"});
  expect_error([&] { tessera::softmax_backward(x, o, 0, o, nullptr); }, ErrorKind::value,
               {"tessera.softmax_backward: argument 'grad_output'", "CUDA tensor"});
  expect_error([&] { tessera::log_softmax_backward(o, x, 0, o, nullptr); }, ErrorKind::value,
               {"tessera.log_softmax_backward: argument 'output'", "CUDA tensor"});
}

TEST(SoftmaxChecks, Dtypes) {
  auto i = cuda_tensor(0x1000, DType::int32, {4});
  auto d = cuda_tensor(0x1000, DType::float64, {4});
  auto o = cuda_tensor(0x9000, DType::float32, {4});
  expect_error([&] { tessera::softmax(i, 0, i, nullptr); }, ErrorKind::type,
               {"argument 'input'", "dtype in {float32, float16, bfloat16}", "got int32"});
  expect_error([&] { tessera::log_softmax_backward(d, d, 0, d, nullptr); }, ErrorKind::type,
               {"argument 'grad_output'", "got float64"});
  auto h = cuda_tensor(0x1000, DType::float16, {4});
  expect_error([&] { tessera::softmax(h, 0, o, nullptr); }, ErrorKind::type,
               {"argument 'out'", "dtype float16 (that of 'input')", "got float32"});
  expect_error([&] { tessera::softmax_backward(o, h, 0, o, nullptr); }, ErrorKind::type,
               {"argument 'output'", "dtype float32 (that of 'grad_output')", "got float16"});
}

TEST(SoftmaxChecks, ShapesAndDevices) {
  auto x = cuda_tensor(0x1000, DType::float32, {4, 5});
  auto o = cuda_tensor(0x9000, DType::float32, {5, 4});
  expect_error([&] { tessera::softmax(x, -1, o, nullptr); }, ErrorKind::value,
               {"argument 'out'", "expected shape [4, 5] (that of 'input')", "got [5, 4]"});
  auto g = cuda_tensor(0x20000, DType::float32, {4, 5});
  expect_error([&] { tessera::softmax_backward(g, o, -1, x, nullptr); }, ErrorKind::value,
               {"argument 'output'", "shape [4, 5] (that of 'grad_output')", "got [5, 4]"});
  expect_error([&] { tessera::log_softmax_backward(g, x, -1, o, nullptr); }, ErrorKind::value,
               {"argument 'out'", "got [5, 4]"});
  auto other = cuda_tensor(0x9000, DType::float32, {4, 5}, 1);
  expect_error([&] { tessera::softmax(x, -1, other, nullptr); }, ErrorKind::value,
               {"argument 'out'", "device cuda:0 (that of 'input')", "got cuda:1"});
}

TEST(SoftmaxChecks, DimOutOfRange) {
  auto x = cuda_tensor(0x1000, DType::bfloat16, {4, 5});
  auto o = cuda_tensor(0x9000, DType::bfloat16, {4, 5});
  expect_error([&] { tessera::softmax(x, 2, o, nullptr); }, ErrorKind::value,
               {"tessera.softmax: argument 'dim'", "a dimension in [-2, 1] for a 2-d tensor", "got 2"});
  expect_error([&] { tessera::log_softmax(x, -3, o, nullptr); }, ErrorKind::value, {"argument 'dim'", "got -3"});
  auto g = cuda_tensor(0x20000, DType::bfloat16, {4, 5});
  expect_error([&] { tessera::softmax_backward(g, x, 7, o, nullptr); }, ErrorKind::value,
               {"tessera.softmax_backward: argument 'dim'", "got 7"});
  // A 0-d tensor has dims -1 and 0, as in torch.
  auto s = TensorView::make(fake(0x1000), DType::float32, nullptr, nullptr, 0, {tessera::DeviceType::cuda, 0});
  auto so = TensorView::make(fake(0x9000), DType::float32, nullptr, nullptr, 0, {tessera::DeviceType::cuda, 0});
  expect_error([&] { tessera::softmax(s, 1, so, nullptr); }, ErrorKind::value,
               {"a dimension in [-1, 0] for a 0-d tensor", "got 1"});
}

TEST(SoftmaxChecks, Overlap) {
  auto x = cuda_tensor(0x1000, DType::float32, {8, 64});
  auto shifted = cuda_tensor(0x1000 + 4 * 8, DType::float32, {8, 64});
  expect_error([&] { tessera::softmax(x, -1, shifted, nullptr); }, ErrorKind::value,
               {"tessera.softmax: argument 'out'", "does not overlap 'input'", "for in-place use", "got an overlapping tensor"});
  auto bcast = TensorView::strided(fake(0x40000), DType::float32, {8, 64}, {0, 1});
  expect_error([&] { tessera::log_softmax(x, -1, bcast, nullptr); }, ErrorKind::value,
               {"argument 'out'", "elements do not overlap", "stride 0 on dimension 0"});
  auto y = cuda_tensor(0x80000, DType::float32, {8, 64});
  auto g = cuda_tensor(0x100000, DType::float32, {8, 64});
  auto g_shifted = cuda_tensor(0x100000 + 4 * 8, DType::float32, {8, 64});
  expect_error([&] { tessera::softmax_backward(g, y, -1, g_shifted, nullptr); }, ErrorKind::value,
               {"argument 'out'", "does not overlap 'grad_output'", "for in-place use"});
  // grad_in may be grad_out itself, but not y.
  expect_error([&] { tessera::log_softmax_backward(g, y, -1, y, nullptr); }, ErrorKind::value,
               {"tessera.log_softmax_backward: argument 'out'", "does not overlap 'output'"});
}

TEST(SoftmaxChecks, EmptyTensorsReturnWithoutTouchingTheGpu) {
  for (auto shape : {std::initializer_list<int64_t>{0, 3}, std::initializer_list<int64_t>{5, 0}}) {
    auto t = TensorView::contiguous(nullptr, DType::float32, shape);
    EXPECT_NO_THROW(tessera::softmax(t, -1, t, nullptr));
    EXPECT_NO_THROW(tessera::log_softmax(t, 0, t, nullptr));
    EXPECT_NO_THROW(tessera::softmax_backward(t, t, -1, t, nullptr));
    EXPECT_NO_THROW(tessera::log_softmax_backward(t, t, 1, t, nullptr));
  }
}

TEST(SoftmaxRegistry, OpsCasesAndSizes) {
  for (const char* name : {"softmax", "log_softmax", "softmax_backward", "log_softmax_backward"}) {
    const auto* op = tessera::ops::find_op(name);
    ASSERT_NE(op, nullptr) << name;
    EXPECT_EQ(op->bench_sizes, tessera::ops::rowwise::kBenchColumns);
    int large = 0, normal = 0;
    for (const auto& c : op->verify_cases()) ++(c.large ? large : normal);
    EXPECT_EQ(large, 1) << name;
    EXPECT_GT(normal, 30) << name;
  }
  EXPECT_EQ(tessera::ops::select_ops("softmax").size(), 2u);      // softmax, softmax_backward
  EXPECT_EQ(tessera::ops::select_ops("log_softmax").size(), 2u);
}

TEST(SoftmaxGpu, BenchBytes) {
  TESSERA_REQUIRE_GPU();
  const auto fwd = tessera::ops::find_op("softmax")->make_bench(DType::bfloat16, 1024);
  EXPECT_EQ(fwd.shape, "[4096, 1024]");
  EXPECT_EQ(fwd.bytes, 2.0 * 4096 * 1024 * 2);
  const auto bwd = tessera::ops::find_op("log_softmax_backward")->make_bench(DType::float32, 262144);
  EXPECT_EQ(bwd.shape, "[256, 262144]");
  EXPECT_EQ(bwd.bytes, 3.0 * 256 * 262144 * 4);
}

}  // namespace
