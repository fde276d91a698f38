// LayerNorm and RMSNorm: references (CPU: known values, gradients against finite differences),
// argument checks and messages (CPU), every verify case and run-to-run determinism of the
// parameter gradients (GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "testing.hpp"
#include "ops/registry.hpp"
#include "ops/rowwise/norm_reference.hpp"
#include "ops/verify.hpp"
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

const tessera::Device kCpu{tessera::DeviceType::cpu, 0};

TensorView host(std::vector<double>& v, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(v.data(), DType::float64, shape, kCpu);
}
TensorView host(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(v.data(), DType::float32, shape, kCpu);
}

// ---- references: known values ----------------------------------------------------------------
TEST(NormReference, LayerNormKnownValues) {
  std::vector<float> x = {1, 2, 3, 4, -1, -1, 5, 5};  // two rows
  std::vector<float> w = {1, 2, 0.5f, -1}, b = {0, 1, 0, 2};
  const TensorView xv = host(x, {2, 4}), wv = host(w, {4}), bv = host(b, {4});
  const auto r = ref::layer_norm(xv, 1, &wv, &bv, 0.0);
  const double rstd = 1 / std::sqrt(1.25);  // var of 1..4 is 1.25
  ASSERT_EQ(r.out.size(), 8u);
  EXPECT_DOUBLE_EQ(r.mean[0], 2.5);
  EXPECT_DOUBLE_EQ(r.rstd[0], rstd);
  const double expect0[] = {-1.5 * rstd, -0.5 * rstd * 2 + 1, 0.5 * rstd * 0.5, -1.5 * rstd + 2};
  for (int c = 0; c < 4; ++c) EXPECT_NEAR(r.out[c], expect0[c], 1e-15) << c;
  // Row 2: mean 2, var 9, rstd 1/3: x_hat = -1, -1, 1, 1.
  EXPECT_DOUBLE_EQ(r.mean[1], 2.0);
  EXPECT_NEAR(r.rstd[1], 1.0 / 3.0, 1e-15);
  const double expect1[] = {-1, -2 + 1, 0.5, -1 + 2};
  for (int c = 0; c < 4; ++c) EXPECT_NEAR(r.out[4 + c], expect1[c], 1e-15) << c;
  // eps enters under the root; no weight or bias means 1 and 0.
  const auto e = ref::layer_norm(xv, 1, nullptr, nullptr, 0.75);
  EXPECT_DOUBLE_EQ(e.rstd[0], 1 / std::sqrt(2.0));
  EXPECT_NEAR(e.out[3], 1.5 / std::sqrt(2.0), 1e-15);
}

TEST(NormReference, LayerNormVarianceAroundALargeMean) {
  // Rows far from 0: E[x^2] - E[x]^2 would lose everything here in float; the reference (and the
  // operator) sum squared deviations from the mean.
  std::vector<float> x = {10000.5f, 9999.5f, 10000.5f, 9999.5f};
  const auto r = ref::layer_norm(host(x, {1, 4}), 1, nullptr, nullptr, 0.0);
  EXPECT_DOUBLE_EQ(r.mean[0], 10000.0);
  EXPECT_DOUBLE_EQ(r.rstd[0], 2.0);
  EXPECT_DOUBLE_EQ(r.out[0], 1.0);
  EXPECT_DOUBLE_EQ(r.out[1], -1.0);
}

TEST(NormReference, RmsNormKnownValues) {
  std::vector<float> x = {1, 2, 3, 4}, w = {1, 2, 0.5f, -1};
  const TensorView wv = host(w, {4});
  const auto r = ref::rms_norm(host(x, {1, 4}), 1, &wv, 1e-6);
  const double rstd = 1 / std::sqrt(7.5 + 1e-6);  // mean of squares of 1..4 is 7.5
  EXPECT_DOUBLE_EQ(r.rstd[0], rstd);
  const double expect[] = {rstd, 4 * rstd, 1.5 * rstd, -4 * rstd};
  for (int c = 0; c < 4; ++c) EXPECT_NEAR(r.out[c], expect[c], 1e-15) << c;
}

TEST(NormReference, StridesAndNormalizedDims) {
  // x stored transposed: logical [3, 4] with strides (1, 3); and the same data as [3, 2, 2]
  // normalized over the last two dimensions.
  std::vector<float> rowmajor = {1, 5, -2, 0.5f, 3, 3, 4, -1, 0, 2, 7, 1};
  std::vector<float> transposed(12);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) transposed[c * 3 + r] = rowmajor[r * 4 + c];
  const TensorView t = TensorView::strided(transposed.data(), DType::float32, {3, 4}, {1, 3}, kCpu);
  const auto a = ref::layer_norm(host(rowmajor, {3, 4}), 1, nullptr, nullptr, 1e-5);
  const auto b = ref::layer_norm(t, 1, nullptr, nullptr, 1e-5);
  const auto c = ref::layer_norm(host(rowmajor, {3, 2, 2}), 2, nullptr, nullptr, 1e-5);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out, c.out);
  EXPECT_EQ(a.rstd, c.rstd);
  EXPECT_EQ(ref::rms_norm(t, 1, nullptr, 1e-5).out, ref::rms_norm(host(rowmajor, {3, 4}), 1, nullptr, 1e-5).out);
}

// ---- references: gradients against finite differences --------------------------------------
// Loss L = sum(g * out); dL/dx, dL/dw, dL/db by central differences of the double reference.
struct GradCase {
  std::vector<int64_t> shape;
  int nnorm;
  bool weight;
};

std::vector<double> pseudo_random(int64_t n, double lo, double hi, unsigned seed) {
  std::vector<double> v(static_cast<std::size_t>(n));
  unsigned s = seed;
  for (double& e : v) {
    s = s * 1664525u + 1013904223u;
    e = lo + (hi - lo) * (s >> 8) / double(1u << 24);
  }
  return v;
}

TensorView view_of(std::vector<double>& v, const std::vector<int64_t>& shape) {
  return TensorView::make(v.data(), DType::float64, shape.data(), nullptr, static_cast<int>(shape.size()), kCpu);
}

void check_gradients(bool rms, const GradCase& gc) {
  int64_t numel = 1, n = 1;
  for (std::size_t d = 0; d < gc.shape.size(); ++d) {
    numel *= gc.shape[d];
    if (d >= gc.shape.size() - gc.nnorm) n *= gc.shape[d];
  }
  const std::vector<int64_t> nshape(gc.shape.end() - gc.nnorm, gc.shape.end());
  const std::vector<int64_t> lshape(gc.shape.begin(), gc.shape.end() - gc.nnorm);
  std::vector<double> x = pseudo_random(numel, -2, 3, 1), g = pseudo_random(numel, -1, 1, 2);
  std::vector<double> w = pseudo_random(n, -1, 2, 3), b = pseudo_random(n, -1, 1, 4);
  const double eps = 1e-3;
  auto loss = [&] {
    const TensorView xv = view_of(x, gc.shape), wv = view_of(w, nshape), bv = view_of(b, nshape);
    const std::vector<double> out = rms ? ref::rms_norm(xv, gc.nnorm, gc.weight ? &wv : nullptr, eps).out
                                        : ref::layer_norm(xv, gc.nnorm, gc.weight ? &wv : nullptr, &bv, eps).out;
    double l = 0;
    for (std::size_t i = 0; i < out.size(); ++i) l += g[i] * out[i];
    return l;
  };
  auto fd = [&](std::vector<double>& v, std::size_t i) {
    const double h = 1e-6, keep = v[i];
    v[i] = keep + h;
    const double up = loss();
    v[i] = keep - h;
    const double down = loss();
    v[i] = keep;
    return (up - down) / (2 * h);
  };
  const TensorView xv = view_of(x, gc.shape), gv = view_of(g, gc.shape), wv = view_of(w, nshape),
                   bv = view_of(b, nshape);
  const TensorView* wp = gc.weight ? &wv : nullptr;
  std::vector<double> dx, dw, db;
  if (rms) {
    auto fwd = ref::rms_norm(xv, gc.nnorm, wp, eps);
    const auto grads = ref::rms_norm_backward(gv, xv, gc.nnorm, view_of(fwd.rstd, lshape), wp);
    dx = grads.grad_in;
    dw = grads.grad_weight;
  } else {
    auto fwd = ref::layer_norm(xv, gc.nnorm, wp, &bv, eps);
    const auto grads = ref::layer_norm_backward(gv, xv, gc.nnorm, view_of(fwd.mean, lshape),
                                                view_of(fwd.rstd, lshape), wp);
    dx = grads.grad_in;
    dw = grads.grad_weight;
    db = grads.grad_bias;
  }
  ASSERT_EQ(dx.size(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], fd(x, i), 1e-7) << "dx " << i;
  ASSERT_EQ(dw.size(), w.size());
  if (gc.weight)
    for (std::size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(dw[i], fd(w, i), 1e-7) << "dw " << i;
  if (!rms) {
    ASSERT_EQ(db.size(), b.size());
    for (std::size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(db[i], fd(b, i), 1e-7) << "db " << i;
  }
}

TEST(NormReference, LayerNormGradientsMatchFiniteDifferences) {
  check_gradients(false, {{3, 7}, 1, true});
  check_gradients(false, {{2, 3, 4}, 2, true});
  check_gradients(false, {{4, 5}, 1, false});
}

TEST(NormReference, RmsNormGradientsMatchFiniteDifferences) {
  check_gradients(true, {{3, 7}, 1, true});
  check_gradients(true, {{2, 3, 4}, 2, true});
  check_gradients(true, {{4, 5}, 1, false});
}

// ---- argument checks (no GPU needed: they run before any CUDA call) -------------------------

// Distinct, far-apart fake buffers for a [4, 8] problem.
struct Args {
  TensorView x = cuda_tensor(0x100000, DType::bfloat16, {4, 8});
  TensorView out = cuda_tensor(0x200000, DType::bfloat16, {4, 8});
  TensorView dy = cuda_tensor(0x300000, DType::bfloat16, {4, 8});
  TensorView w = cuda_tensor(0x400000, DType::bfloat16, {8});
  TensorView b = cuda_tensor(0x500000, DType::bfloat16, {8});
  TensorView mean = cuda_tensor(0x600000, DType::float32, {4});
  TensorView rstd = cuda_tensor(0x700000, DType::float32, {4});
  TensorView dw = cuda_tensor(0x800000, DType::bfloat16, {8});
  TensorView db = cuda_tensor(0x900000, DType::bfloat16, {8});
};

TEST(NormChecks, NormalizedNdimOutOfRange) {
  Args a;
  for (int nd : {0, 3, -1})
    expect_error([&] { tessera::layer_norm(a.x, nd, &a.w, &a.b, 1e-5, a.out, &a.mean, &a.rstd, nullptr); },
                 ErrorKind::value,
                 {"tessera.layer_norm: argument 'normalized_ndim'", "1 <= normalized_ndim <= x.ndim = 2",
                  "got " + std::to_string(nd)});
  expect_error([&] { tessera::rms_norm_backward(a.dy, a.x, 5, a.rstd, &a.w, 0.0, &a.out, nullptr, nullptr); },
               ErrorKind::value, {"tessera.rms_norm_backward: argument 'normalized_ndim'"});
}

TEST(NormChecks, WeightAndBiasMustHaveTheNormalizedShapeAndDtype) {
  Args a;
  const TensorView w7 = cuda_tensor(0x400000, DType::bfloat16, {7});
  expect_error([&] { tessera::layer_norm(a.x, 1, &w7, &a.b, 1e-5, a.out, nullptr, nullptr, nullptr); },
               ErrorKind::value,
               {"tessera.layer_norm: argument 'weight'", "shape [8] (the normalized shape of 'input')", "got [7]"});
  const TensorView b2 = cuda_tensor(0x500000, DType::bfloat16, {4, 8});
  expect_error([&] { tessera::layer_norm(a.x, 1, &a.w, &b2, 1e-5, a.out, nullptr, nullptr, nullptr); },
               ErrorKind::value, {"argument 'bias'", "got [4, 8]"});
  const TensorView wf = cuda_tensor(0x400000, DType::float32, {8});
  expect_error([&] { tessera::rms_norm(a.x, 1, &wf, 1e-5, 0.0, a.out, nullptr, nullptr); }, ErrorKind::type,
               {"tessera.rms_norm: argument 'weight'", "dtype bfloat16 (that of 'input')", "got float32"});
  // Two normalized dimensions: the weight has both.
  const TensorView x3 = cuda_tensor(0x100000, DType::float16, {2, 3, 4});
  const TensorView o3 = cuda_tensor(0x200000, DType::float16, {2, 3, 4});
  const TensorView w12 = cuda_tensor(0x400000, DType::float16, {12});
  expect_error([&] { tessera::rms_norm(x3, 2, &w12, 1e-5, 0.0, o3, nullptr, nullptr); }, ErrorKind::value,
               {"argument 'weight'", "shape [3, 4]", "got [12]"});
}

TEST(NormChecks, StatisticsMustBeFloat32OfTheLeadingShape) {
  Args a;
  const TensorView mean16 = cuda_tensor(0x600000, DType::float16, {4});
  expect_error([&] { tessera::layer_norm(a.x, 1, &a.w, &a.b, 1e-5, a.out, &mean16, &a.rstd, nullptr); },
               ErrorKind::type, {"argument 'mean'", "dtype in {float32}", "got float16"});
  const TensorView rstd5 = cuda_tensor(0x700000, DType::float32, {5});
  expect_error([&] { tessera::rms_norm(a.x, 1, &a.w, 1e-5, 0.0, a.out, &rstd5, nullptr); }, ErrorKind::value,
               {"tessera.rms_norm: argument 'rstd'", "shape [4] (the leading shape of 'input')", "got [5]"});
  expect_error([&] { tessera::layer_norm_backward(a.dy, a.x, 1, a.mean, rstd5, &a.w, &a.out, nullptr, nullptr, nullptr); },
               ErrorKind::value, {"tessera.layer_norm_backward: argument 'rstd'", "got [5]"});
  // Every dimension normalized: the statistics are 0-d.
  expect_error([&] { tessera::rms_norm(a.x, 2, nullptr, 1e-5, 0.0, a.out, &a.rstd, nullptr); }, ErrorKind::value,
               {"argument 'rstd'", "shape [] (the leading shape of 'input')", "got [4]"});
  // The backwards also take torch's statistics, the leading shape followed by 1s; no other shape.
  const TensorView rstd41 = cuda_tensor(0x700000, DType::float32, {4, 1}),
                   rstd42 = cuda_tensor(0x700000, DType::float32, {4, 2});
  expect_error([&] { tessera::layer_norm_backward(a.dy, a.x, 1, a.mean, rstd42, &a.w, &a.out, nullptr, nullptr, nullptr); },
               ErrorKind::value, {"tessera.layer_norm_backward: argument 'rstd'", "got [4, 2]"});
  expect_error([&] { tessera::layer_norm_backward(a.dy, a.x, 1, a.mean, rstd41, &a.w, &a.out, &a.out, nullptr, nullptr); },
               ErrorKind::value, {"argument 'grad_weight'"});  // rstd41 passed its check: the next one fails
}

TEST(NormChecks, Eps) {
  Args a;
  for (double eps : {-1e-5, std::nan(""), std::numeric_limits<double>::infinity(), 1e300})
    expect_error([&] { tessera::layer_norm(a.x, 1, nullptr, nullptr, eps, a.out, nullptr, nullptr, nullptr); },
                 ErrorKind::value, {"tessera.layer_norm: argument 'eps'", "a finite value >= 0"});
}

TEST(NormChecks, WeightOffset) {
  Args a;
  for (double off : {std::nan(""), std::numeric_limits<double>::infinity(), 1e300})
    expect_error([&] { tessera::rms_norm(a.x, 1, &a.w, 1e-5, off, a.out, nullptr, nullptr); }, ErrorKind::value,
                 {"tessera.rms_norm: argument 'weight_offset'", "a finite value"});
  expect_error([&] { tessera::rms_norm(a.x, 1, nullptr, 1e-5, 1.0, a.out, nullptr, nullptr); }, ErrorKind::value,
               {"tessera.rms_norm: argument 'weight_offset'", "0 when 'weight' is not given"});
  expect_error([&] { tessera::rms_norm_backward(a.dy, a.x, 1, a.rstd, nullptr, 1.0, &a.out, nullptr, nullptr); },
               ErrorKind::value, {"tessera.rms_norm_backward: argument 'weight_offset'"});
}

TEST(NormChecks, TensorsLikeX) {
  Args a;
  std::vector<float> h(32);
  const TensorView cpu = TensorView::contiguous(h.data(), DType::bfloat16, {4, 8}, kCpu);
  expect_error([&] { tessera::layer_norm(cpu, 1, nullptr, nullptr, 1e-5, a.out, nullptr, nullptr, nullptr); },
               ErrorKind::value, {"argument 'input'", "a CUDA tensor", "got a tensor on cpu"});
  const TensorView xi = cuda_tensor(0x100000, DType::int32, {4, 8});
  expect_error([&] { tessera::rms_norm(xi, 1, nullptr, 1e-5, 0.0, a.out, nullptr, nullptr); }, ErrorKind::type,
               {"argument 'input'", "dtype in {float32, float16, bfloat16}", "got int32"});
  const TensorView out48 = cuda_tensor(0x200000, DType::bfloat16, {8, 4});
  expect_error([&] { tessera::layer_norm(a.x, 1, nullptr, nullptr, 1e-5, out48, nullptr, nullptr, nullptr); },
               ErrorKind::value, {"argument 'out'", "shape [4, 8] (that of 'input')", "got [8, 4]"});
  const TensorView dyf = cuda_tensor(0x300000, DType::float32, {4, 8});
  expect_error([&] { tessera::layer_norm_backward(dyf, a.x, 1, a.mean, a.rstd, nullptr, &a.out, nullptr, nullptr, nullptr); },
               ErrorKind::type, {"argument 'grad_output'", "dtype bfloat16 (that of 'input')"});
  const TensorView w1 = cuda_tensor(0x400000, DType::bfloat16, {8}, 1);
  expect_error([&] { tessera::rms_norm(a.x, 1, &w1, 1e-5, 0.0, a.out, nullptr, nullptr); }, ErrorKind::value,
               {"argument 'weight'", "device cuda:0 (that of 'input')", "got cuda:1"});
}

TEST(NormChecks, GradientArguments) {
  Args a;
  expect_error([&] { tessera::layer_norm_backward(a.dy, a.x, 1, a.mean, a.rstd, nullptr, &a.out, &a.dw, nullptr, nullptr); },
               ErrorKind::value, {"argument 'grad_weight'", "nullptr when 'weight' is not given"});
  const TensorView dw4 = cuda_tensor(0x800000, DType::bfloat16, {4});
  expect_error([&] { tessera::rms_norm_backward(a.dy, a.x, 1, a.rstd, &a.w, 0.0, nullptr, &dw4, nullptr); },
               ErrorKind::value, {"tessera.rms_norm_backward: argument 'grad_weight'", "shape [8]", "got [4]"});
  const TensorView db16 = cuda_tensor(0x900000, DType::float16, {8});
  expect_error([&] { tessera::layer_norm_backward(a.dy, a.x, 1, a.mean, a.rstd, &a.w, nullptr, nullptr, &db16, nullptr); },
               ErrorKind::type, {"argument 'grad_bias'", "got float16"});
}

TEST(NormChecks, OutputsMustNotOverlap) {
  Args a;
  const TensorView shifted = cuda_tensor(0x100000 + 16, DType::bfloat16, {4, 8});  // x, 8 elements on
  expect_error([&] { tessera::layer_norm(a.x, 1, nullptr, nullptr, 1e-5, shifted, nullptr, nullptr, nullptr); },
               ErrorKind::value, {"argument 'out'", "does not overlap 'input'", "got an overlapping tensor"});
  expect_error([&] { tessera::layer_norm(a.x, 1, nullptr, nullptr, 1e-5, a.x, nullptr, nullptr, nullptr); },
               ErrorKind::value, {"argument 'out'", "does not overlap 'input'"});
  expect_error([&] { tessera::layer_norm(a.x, 1, &a.w, nullptr, 1e-5, a.out, &a.mean, &a.mean, nullptr); },
               ErrorKind::value, {"argument 'rstd'", "does not overlap 'mean'"});
  const TensorView on_w = cuda_tensor(0x400000, DType::float32, {4});
  expect_error([&] { tessera::rms_norm(a.x, 1, &a.w, 1e-5, 0.0, a.out, &on_w, nullptr); }, ErrorKind::value,
               {"argument 'rstd'", "does not overlap 'weight'"});
  expect_error([&] { tessera::rms_norm_backward(a.dy, a.x, 1, a.rstd, &a.w, 0.0, &a.dy, nullptr, nullptr); },
               ErrorKind::value, {"argument 'grad_input'", "does not overlap 'grad_output'"});
  expect_error([&] { tessera::layer_norm_backward(a.dy, a.x, 1, a.mean, a.rstd, &a.w, &a.out, &a.dw, &a.dw, nullptr); },
               ErrorKind::value, {"argument 'grad_bias'", "does not overlap 'grad_weight'"});
  const TensorView bcast = TensorView::strided(fake(0xa00000), DType::bfloat16, {4, 8}, {0, 1},
                                               tessera::Device{tessera::DeviceType::cuda, 0});
  expect_error([&] { tessera::rms_norm(a.x, 1, nullptr, 1e-5, 0.0, bcast, nullptr, nullptr); }, ErrorKind::value,
               {"argument 'out'", "elements do not overlap"});
}

TEST(NormChecks, EmptyTensorsReturnWithoutTouchingTheGpu) {
  const TensorView x = TensorView::contiguous(nullptr, DType::bfloat16, {0, 8});
  const TensorView s = TensorView::contiguous(nullptr, DType::float32, {0});
  const TensorView w = cuda_tensor(0x400000, DType::bfloat16, {8});
  EXPECT_NO_THROW(tessera::layer_norm(x, 1, &w, &w, 1e-5, x, &s, nullptr, nullptr));
  EXPECT_NO_THROW(tessera::rms_norm(x, 1, nullptr, 1e-5, 0.0, x, &s, nullptr));
  // No rows and no parameter gradients asked for: nothing to do. (With them, they are zeroed.)
  EXPECT_NO_THROW(tessera::layer_norm_backward(x, x, 1, s, s, &w, &x, nullptr, nullptr, nullptr));
  EXPECT_NO_THROW(tessera::rms_norm_backward(x, x, 1, s, nullptr, 0.0, &x, nullptr, nullptr));
  // Empty rows: every output is empty.
  const TensorView e = TensorView::contiguous(nullptr, DType::float32, {4, 0});
  const TensorView s4 = cuda_tensor(0x600000, DType::float32, {4});
  const TensorView w0 = TensorView::contiguous(nullptr, DType::float32, {0});
  EXPECT_NO_THROW(tessera::layer_norm_backward(e, e, 1, s4, s4, &w0, &e, &w0, &w0, nullptr));
}

TEST(NormRegistry, OpsAndCases) {
  for (const char* name : {"layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward"}) {
    const auto* op = tessera::ops::find_op(name);
    ASSERT_NE(op, nullptr) << name;
    EXPECT_EQ(op->family, "rowwise");
    EXPECT_EQ(op->bench_sizes, (std::vector<int64_t>{1024, 4096, 8192, 16384}));
    const auto cases = op->verify_cases();
    EXPECT_GT(cases.size(), 40u);
    int large = 0;
    for (const auto& c : cases) large += c.large;
    EXPECT_EQ(large, std::string(name).find("backward") == std::string::npos ? 1 : 0) << name;
  }
  EXPECT_EQ(tessera::ops::select_ops("layer_norm").size(), 2u);
  EXPECT_EQ(tessera::ops::select_ops("rms_norm").size(), 2u);
}

// ---- GPU: empty rows, determinism (the verify cases run in verify_test.cpp) -----------------

std::vector<unsigned char> bytes_of(const tessera::ops::TestTensor& t) {
  return tessera::ops::to_host(t).bytes;
}

// Rows of no elements (every dimension normalized, or a 0-sized one) have NaN statistics, as
// torch's; the outputs stay empty.
TEST(NormGpu, EmptyRowsHaveNaNStatistics) {
  TESSERA_REQUIRE_GPU();
  using tessera::ops::Layout;
  using tessera::ops::make_tensor;
  const TensorView x = TensorView::contiguous(nullptr, DType::float32, {3, 0});
  auto mean = make_tensor(DType::float32, {3}, Layout::contiguous), rstd = make_tensor(DType::float32, {3}, Layout::contiguous);
  auto one = make_tensor(DType::float32, {}, Layout::contiguous);
  for (auto* t : {&mean, &rstd, &one}) tessera::ops::fill_random(*t, 0, 1, nullptr);  // finite first
  tessera::layer_norm(x, 1, nullptr, nullptr, 1e-5, x, &mean.view, &rstd.view, nullptr);
  tessera::rms_norm(TensorView::contiguous(nullptr, DType::float32, {0, 8}), 2, nullptr, 1e-5, 0.0,
                    TensorView::contiguous(nullptr, DType::float32, {0, 8}), &one.view, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (const auto* t : {&mean, &rstd, &one}) {
    const std::vector<unsigned char> b = bytes_of(*t);
    for (size_t i = 0; i + 4 <= b.size(); i += 4) {
      float v;
      std::memcpy(&v, b.data() + i, 4);
      EXPECT_TRUE(std::isnan(v)) << "statistic " << i / 4 << ": " << v;
    }
  }
}

// The same backward twice on the same inputs: grad_weight and grad_bias bit for bit the same
// (fixed row-to-CTA assignment and summation order, no float atomics). Shapes cover the backward
// tiers, several row groups per CTA and the long-row kernels (several row ranges).
TEST(NormGpu, ParameterGradientsAreDeterministic) {
  TESSERA_REQUIRE_GPU();
  using tessera::ops::Layout;
  using tessera::ops::make_tensor;
  struct Shape {
    DType dt;
    int64_t rows, n;
  };
  const Shape shapes[] = {{DType::bfloat16, 1000, 1024}, {DType::float16, 333, 4096},
                          {DType::float32, 300, 8192},   {DType::bfloat16, 64, 16384},
                          {DType::float32, 64, 16384},   {DType::bfloat16, 5, 100003},
                          {DType::float32, 301, 40000},  {DType::float32, 2000, 96}};
  for (const Shape& s : shapes) {
    for (bool rms : {false, true}) {
      auto x = make_tensor(s.dt, {s.rows, s.n}, Layout::contiguous);
      auto dy = make_tensor(s.dt, {s.rows, s.n}, Layout::contiguous);
      auto w = make_tensor(s.dt, {s.n}, Layout::contiguous);
      auto y = make_tensor(s.dt, {s.rows, s.n}, Layout::contiguous);
      auto mean = make_tensor(DType::float32, {s.rows}, Layout::contiguous);
      auto rstd = make_tensor(DType::float32, {s.rows}, Layout::contiguous);
      tessera::ops::fill_random(x, -2, 6, nullptr);
      tessera::ops::fill_random(dy, -1, 1, nullptr);
      tessera::ops::fill_random(w, -1, 2, nullptr);
      if (rms) tessera::rms_norm(x.view, 1, &w.view, 1e-5, 0.0, y.view, &rstd.view, nullptr);
      else tessera::layer_norm(x.view, 1, &w.view, nullptr, 1e-5, y.view, &mean.view, &rstd.view, nullptr);
      std::vector<unsigned char> first_w, first_b;
      for (int run = 0; run < 2; ++run) {
        auto dx = make_tensor(s.dt, {s.rows, s.n}, Layout::contiguous);
        auto dw = make_tensor(s.dt, {s.n}, Layout::contiguous);
        auto db = make_tensor(s.dt, {s.n}, Layout::contiguous);
        tessera::ops::fill_poison(dw, nullptr);
        tessera::ops::fill_poison(db, nullptr);
        if (rms) tessera::rms_norm_backward(dy.view, x.view, 1, rstd.view, &w.view, 0.0, &dx.view, &dw.view, nullptr);
        else
          tessera::layer_norm_backward(dy.view, x.view, 1, mean.view, rstd.view, &w.view, &dx.view, &dw.view,
                                       &db.view, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        if (run == 0) {
          first_w = bytes_of(dw);
          if (!rms) first_b = bytes_of(db);
        } else {
          const std::string what = std::string(tessera::dtype_name(s.dt)) + " [" + std::to_string(s.rows) + ", " +
                                   std::to_string(s.n) + "]" + (rms ? " rms_norm" : " layer_norm");
          EXPECT_TRUE(bytes_of(dw) == first_w) << what << ": grad_weight differs between runs";
          if (!rms) EXPECT_TRUE(bytes_of(db) == first_b) << what << ": grad_bias differs between runs";
        }
      }
    }
  }
}

}  // namespace
