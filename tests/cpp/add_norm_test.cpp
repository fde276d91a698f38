// add_layer_norm and add_rms_norm (the residual add fused with the norm): references (CPU: the
// rounded sum, gradients of input and residual against finite differences), argument checks and
// messages (CPU), and on the GPU run-to-run determinism of the parameter gradients and the
// in-place forms against the out-of-place ones, bit for bit (the verify cases run in
// verify_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "ops/registry.hpp"
#include "ops/rowwise/norm_reference.hpp"
#include "ops/verify.hpp"
#include "testing.hpp"
#include "tessera/tessera.hpp"

namespace {

using tessera::DType;
using tessera::ErrorKind;
using tessera::TensorView;
using tessera::testing::cuda_tensor;
using tessera::testing::expect_error;
namespace ref = tessera::reference;

const tessera::Device kCpu{tessera::DeviceType::cpu, 0};

TensorView host(std::vector<double>& v, const std::vector<int64_t>& shape) {
  return TensorView::make(v.data(), DType::float64, shape.data(), nullptr, static_cast<int>(shape.size()), kCpu);
}

// ---- references ---------------------------------------------------------------------------------
TEST(AddNormReference, IsTheNormOfTheSum) {
  std::vector<double> x = {1, 2, 3, 4, -1, -1, 5, 5}, r = {0.5, -1, 2, 0, 1, 1, -2, -2}, w = {1, 2, 0.5, -1},
                      b = {0, 1, 0, 2};
  std::vector<double> s(8);
  for (int i = 0; i < 8; ++i) s[i] = x[i] + r[i];
  const TensorView xv = host(x, {2, 4}), rv = host(r, {2, 4}), sv = host(s, {2, 4}), wv = host(w, {4}),
                   bv = host(b, {4});
  const auto ln = ref::add_layer_norm(xv, rv, &wv, &bv, 1e-5);
  const auto want = ref::layer_norm(sv, 1, &wv, &bv, 1e-5);
  EXPECT_EQ(ln.residual_out, s);
  EXPECT_EQ(ln.out, want.out);
  EXPECT_EQ(ln.mean, want.mean);
  EXPECT_EQ(ln.rstd, want.rstd);
  const auto rms = ref::add_rms_norm(xv, rv, nullptr, 1e-6);
  const auto want_rms = ref::rms_norm(sv, 1, nullptr, 1e-6);
  EXPECT_EQ(rms.residual_out, s);
  EXPECT_EQ(rms.out, want_rms.out);
  EXPECT_EQ(rms.rstd, want_rms.rstd);
  EXPECT_TRUE(rms.mean.empty());
}

TEST(AddNormReference, TheSumIsRoundedToTheInputDtype) {
  // bfloat16 keeps 8 significant bits: 1 + 2^-9 is 1, as torch's bf16 x + r gives; the norm then
  // sees 1, not 1 + 2^-9.
  std::vector<float> x = {1.0f, 3.0f}, r = {0.001953125f, 0.0f};  // 2^-9
  std::vector<uint16_t> xb(2), rb(2);
  for (int i = 0; i < 2; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    xb[i] = static_cast<uint16_t>(u >> 16);
    std::memcpy(&u, &r[i], 4);
    rb[i] = static_cast<uint16_t>(u >> 16);
  }
  const TensorView xv = TensorView::contiguous(xb.data(), DType::bfloat16, {1, 2}, kCpu);
  const TensorView rv = TensorView::contiguous(rb.data(), DType::bfloat16, {1, 2}, kCpu);
  const auto got = ref::add_rms_norm(xv, rv, nullptr, 0.0);
  EXPECT_EQ(got.residual_out, (std::vector<double>{1.0, 3.0}));
  EXPECT_DOUBLE_EQ(got.rstd[0], 1 / std::sqrt(5.0));
}

std::vector<double> pseudo_random(int64_t n, double lo, double hi, unsigned seed) {
  std::vector<double> v(static_cast<std::size_t>(n));
  unsigned s = seed;
  for (double& e : v) {
    s = s * 1664525u + 1013904223u;
    e = lo + (hi - lo) * (s >> 8) / double(1u << 24);
  }
  return v;
}

// L = sum(g * out) + sum(h * residual_out): dL/dinput and dL/dresidual by central differences
// of the double reference, against the backward's grad_input (given h as grad_residual_out); and
// dL/dweight, dL/dbias.
void check_gradients(bool rms, bool with_dres) {
  const std::vector<int64_t> shape = {3, 7}, wshape = {7}, lshape = {3};
  std::vector<double> x = pseudo_random(21, -2, 3, 1), r = pseudo_random(21, -1, 2, 5);
  std::vector<double> g = pseudo_random(21, -1, 1, 2), h = pseudo_random(21, -1, 1, 6);
  std::vector<double> w = pseudo_random(7, -1, 2, 3), b = pseudo_random(7, -1, 1, 4);
  const double eps = 1e-3;
  auto loss = [&] {
    const TensorView xv = host(x, shape), rv = host(r, shape), wv = host(w, wshape), bv = host(b, wshape);
    const auto f = rms ? ref::add_rms_norm(xv, rv, &wv, eps) : ref::add_layer_norm(xv, rv, &wv, &bv, eps);
    double l = 0;
    for (std::size_t i = 0; i < f.out.size(); ++i) l += g[i] * f.out[i] + (with_dres ? h[i] * f.residual_out[i] : 0);
    return l;
  };
  auto fd = [&](std::vector<double>& v, std::size_t i) {
    const double step = 1e-6, keep = v[i];
    v[i] = keep + step;
    const double up = loss();
    v[i] = keep - step;
    const double down = loss();
    v[i] = keep;
    return (up - down) / (2 * step);
  };
  const TensorView xv = host(x, shape), rv = host(r, shape), gv = host(g, shape), hv = host(h, shape),
                   wv = host(w, wshape), bv = host(b, wshape);
  auto fwd = rms ? ref::add_rms_norm(xv, rv, &wv, eps) : ref::add_layer_norm(xv, rv, &wv, &bv, eps);
  const TensorView sv = host(fwd.residual_out, shape), rs = host(fwd.rstd, lshape);
  std::vector<double> dx, dw, db;
  if (rms) {
    const auto grads = ref::add_rms_norm_backward(gv, with_dres ? &hv : nullptr, sv, rs, &wv);
    dx = grads.grad_in, dw = grads.grad_weight;
  } else {
    const auto grads = ref::add_layer_norm_backward(gv, with_dres ? &hv : nullptr, sv, host(fwd.mean, lshape), rs, &wv);
    dx = grads.grad_in, dw = grads.grad_weight, db = grads.grad_bias;
  }
  ASSERT_EQ(dx.size(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(dx[i], fd(x, i), 1e-7) << "d input " << i;
    EXPECT_NEAR(dx[i], fd(r, i), 1e-7) << "d residual " << i;
  }
  for (std::size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(dw[i], fd(w, i), 1e-7) << "dw " << i;
  if (!rms)
    for (std::size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(db[i], fd(b, i), 1e-7) << "db " << i;
}

TEST(AddNormReference, GradientsMatchFiniteDifferences) {
  for (bool rms : {false, true})
    for (bool with_dres : {false, true}) {
      SCOPED_TRACE(std::string(rms ? "add_rms_norm" : "add_layer_norm") + (with_dres ? " with" : " without") +
                   " grad_residual_out");
      check_gradients(rms, with_dres);
    }
}

// ---- argument checks (no GPU needed: they run before any CUDA call) -----------------------------

// Distinct, far-apart fake buffers for a [4, 8] problem.
struct Args {
  TensorView x = cuda_tensor(0x100000, DType::bfloat16, {4, 8});
  TensorView r = cuda_tensor(0x200000, DType::bfloat16, {4, 8});
  TensorView out = cuda_tensor(0x300000, DType::bfloat16, {4, 8});
  TensorView res = cuda_tensor(0x400000, DType::bfloat16, {4, 8});
  TensorView w = cuda_tensor(0x500000, DType::bfloat16, {8});
  TensorView b = cuda_tensor(0x600000, DType::bfloat16, {8});
  TensorView mean = cuda_tensor(0x700000, DType::float32, {4});
  TensorView rstd = cuda_tensor(0x800000, DType::float32, {4});
  TensorView dy = cuda_tensor(0x900000, DType::bfloat16, {4, 8});
  TensorView dres = cuda_tensor(0xa00000, DType::bfloat16, {4, 8});
  TensorView dx = cuda_tensor(0xb00000, DType::bfloat16, {4, 8});
  TensorView dw = cuda_tensor(0xc00000, DType::bfloat16, {8});
};

TEST(AddNormChecks, ResidualMustMatchInput) {
  Args a;
  const TensorView r48 = cuda_tensor(0x200000, DType::bfloat16, {8, 4});
  expect_error([&] { tessera::add_rms_norm(a.x, r48, &a.w, 1e-6, a.out, a.res, &a.rstd, nullptr); },
               ErrorKind::value,
               {"tessera.add_rms_norm: argument 'residual'", "shape [4, 8] (that of 'input')", "got [8, 4]"});
  const TensorView rf = cuda_tensor(0x200000, DType::float32, {4, 8});
  expect_error([&] { tessera::add_layer_norm(a.x, rf, &a.w, &a.b, 1e-5, a.out, a.res, &a.mean, &a.rstd, nullptr); },
               ErrorKind::type,
               {"tessera.add_layer_norm: argument 'residual'", "dtype bfloat16 (that of 'input')", "got float32"});
  const TensorView r1 = cuda_tensor(0x200000, DType::bfloat16, {4, 8}, 1);
  expect_error([&] { tessera::add_rms_norm(a.x, r1, nullptr, 1e-6, a.out, a.res, nullptr, nullptr); },
               ErrorKind::value, {"argument 'residual'", "device cuda:0 (that of 'input')", "got cuda:1"});
  const TensorView res16 = cuda_tensor(0x400000, DType::float16, {4, 8});
  expect_error([&] { tessera::add_rms_norm(a.x, a.r, nullptr, 1e-6, a.out, res16, nullptr, nullptr); },
               ErrorKind::type, {"tessera.add_rms_norm: argument 'residual_out'", "dtype bfloat16 (that of 'input')"});
  const TensorView res3 = cuda_tensor(0x400000, DType::bfloat16, {4, 3});
  expect_error([&] { tessera::add_layer_norm(a.x, a.r, nullptr, nullptr, 1e-5, a.out, res3, nullptr, nullptr, nullptr); },
               ErrorKind::value, {"argument 'residual_out'", "shape [4, 8]", "got [4, 3]"});
}

TEST(AddNormChecks, TheLastDimensionIsNormalized) {
  Args a;
  const TensorView x0 = cuda_tensor(0x100000, DType::bfloat16, {});
  const TensorView o0 = cuda_tensor(0x300000, DType::bfloat16, {});
  expect_error([&] { tessera::add_rms_norm(x0, x0, nullptr, 1e-6, o0, o0, nullptr, nullptr); }, ErrorKind::value,
               {"tessera.add_rms_norm: argument 'input'", "at least 1 dimension", "got a 0-d tensor"});
  // weight and bias: the last dimension's size, not the trailing shape of a norm over more.
  const TensorView w32 = cuda_tensor(0x500000, DType::bfloat16, {4, 8});
  expect_error([&] { tessera::add_rms_norm(a.x, a.r, &w32, 1e-6, a.out, a.res, nullptr, nullptr); },
               ErrorKind::value, {"argument 'weight'", "shape [8] (the normalized shape of 'input')", "got [4, 8]"});
  const TensorView b7 = cuda_tensor(0x600000, DType::bfloat16, {7});
  expect_error([&] { tessera::add_layer_norm(a.x, a.r, &a.w, &b7, 1e-5, a.out, a.res, nullptr, nullptr, nullptr); },
               ErrorKind::value, {"tessera.add_layer_norm: argument 'bias'", "got [7]"});
  // Statistics: the leading shape.
  const TensorView rstd8 = cuda_tensor(0x800000, DType::float32, {8});
  expect_error([&] { tessera::add_rms_norm(a.x, a.r, nullptr, 1e-6, a.out, a.res, &rstd8, nullptr); },
               ErrorKind::value, {"argument 'rstd'", "shape [4] (the leading shape of 'input')", "got [8]"});
  expect_error([&] { tessera::add_rms_norm(a.x, a.r, nullptr, -1.0, a.out, a.res, nullptr, nullptr); },
               ErrorKind::value, {"tessera.add_rms_norm: argument 'eps'"});
}

TEST(AddNormChecks, InPlaceOnlyAsVllmDoes) {
  Args a;
  // out may be input and residual_out residual (same views); any other overlap is refused.
  expect_error([&] { tessera::add_rms_norm(a.x, a.r, nullptr, 1e-6, a.r, a.res, nullptr, nullptr); },
               ErrorKind::value, {"argument 'out'", "does not overlap 'residual'"});
  expect_error([&] { tessera::add_rms_norm(a.x, a.r, nullptr, 1e-6, a.out, a.x, nullptr, nullptr); },
               ErrorKind::value, {"argument 'residual_out'", "does not overlap 'input'"});
  const TensorView shifted = cuda_tensor(0x200000 + 16, DType::bfloat16, {4, 8});  // residual, 8 elements on
  expect_error([&] { tessera::add_layer_norm(a.x, a.r, nullptr, nullptr, 1e-5, a.out, shifted, nullptr, nullptr, nullptr); },
               ErrorKind::value, {"argument 'residual_out'", "does not overlap 'residual'"});
  const TensorView x_t = TensorView::strided(tessera::testing::fake(0x100000), DType::bfloat16, {4, 8}, {1, 4},
                                             tessera::Device{tessera::DeviceType::cuda, 0});
  expect_error([&] { tessera::add_rms_norm(a.x, a.r, nullptr, 1e-6, x_t, a.res, nullptr, nullptr); },
               ErrorKind::value, {"argument 'out'", "does not overlap 'input'"});  // input's memory, another view
  expect_error([&] { tessera::add_rms_norm(a.x, a.r, nullptr, 1e-6, a.out, a.out, nullptr, nullptr); },
               ErrorKind::value, {"argument 'residual_out'", "does not overlap 'out'"});
  const TensorView on_w = cuda_tensor(0x500000, DType::float32, {4});
  expect_error([&] { tessera::add_rms_norm(a.x, a.r, &a.w, 1e-6, a.out, a.res, &on_w, nullptr); },
               ErrorKind::value, {"argument 'rstd'", "does not overlap 'weight'"});
}

TEST(AddNormChecks, BackwardArguments) {
  Args a;
  const TensorView dres48 = cuda_tensor(0xa00000, DType::bfloat16, {8, 4});
  expect_error([&] { tessera::add_rms_norm_backward(&a.dy, &dres48, a.res, a.rstd, &a.w, &a.dx, &a.dw, nullptr); },
               ErrorKind::value,
               {"tessera.add_rms_norm_backward: argument 'grad_residual_out'", "shape [4, 8] (that of 'residual_out')",
                "got [8, 4]"});
  const TensorView dyf = cuda_tensor(0x900000, DType::float32, {4, 8});
  expect_error([&] { tessera::add_layer_norm_backward(&dyf, &a.dres, a.res, a.mean, a.rstd, nullptr, &a.dx, nullptr, nullptr, nullptr); },
               ErrorKind::type, {"argument 'grad_output'", "dtype bfloat16 (that of 'residual_out')"});
  const TensorView rstd5 = cuda_tensor(0x800000, DType::float32, {5});
  expect_error([&] { tessera::add_rms_norm_backward(&a.dy, nullptr, a.res, rstd5, nullptr, &a.dx, nullptr, nullptr); },
               ErrorKind::value, {"argument 'rstd'", "shape [4] (the leading shape of 'residual_out')", "got [5]"});
  const TensorView s0 = cuda_tensor(0x400000, DType::bfloat16, {});
  expect_error([&] { tessera::add_rms_norm_backward(&s0, nullptr, s0, a.rstd, nullptr, &a.dx, nullptr, nullptr); },
               ErrorKind::value, {"tessera.add_rms_norm_backward: argument 'residual_out'", "at least 1 dimension"});
  expect_error([&] { tessera::add_layer_norm_backward(&a.dy, nullptr, a.res, a.mean, a.rstd, nullptr, &a.dx, &a.dw, nullptr, nullptr); },
               ErrorKind::value, {"argument 'grad_weight'", "nullptr when 'weight' is not given"});
  // grad_input may be grad_residual_out (same view), nothing else it reads.
  expect_error([&] { tessera::add_rms_norm_backward(&a.dy, &a.dres, a.res, a.rstd, nullptr, &a.dy, nullptr, nullptr); },
               ErrorKind::value, {"argument 'grad_input'", "does not overlap 'grad_output'"});
  expect_error([&] { tessera::add_rms_norm_backward(&a.dy, &a.dres, a.res, a.rstd, nullptr, &a.res, nullptr, nullptr); },
               ErrorKind::value, {"argument 'grad_input'", "does not overlap 'residual_out'"});
  const TensorView shifted = cuda_tensor(0xa00000 + 16, DType::bfloat16, {4, 8});
  expect_error([&] { tessera::add_rms_norm_backward(&a.dy, &a.dres, a.res, a.rstd, nullptr, &shifted, nullptr, nullptr); },
               ErrorKind::value, {"argument 'grad_input'", "does not overlap 'grad_residual_out'"});
}

TEST(AddNormChecks, EmptyTensorsReturnWithoutTouchingTheGpu) {
  const TensorView x = TensorView::contiguous(nullptr, DType::bfloat16, {0, 8});
  const TensorView s = TensorView::contiguous(nullptr, DType::float32, {0});
  const TensorView w = cuda_tensor(0x500000, DType::bfloat16, {8});
  EXPECT_NO_THROW(tessera::add_layer_norm(x, x, &w, &w, 1e-5, x, x, &s, &s, nullptr));
  EXPECT_NO_THROW(tessera::add_rms_norm(x, x, nullptr, 1e-6, x, x, &s, nullptr));
  EXPECT_NO_THROW(tessera::add_rms_norm_backward(&x, &x, x, s, nullptr, &x, nullptr, nullptr));
  EXPECT_NO_THROW(tessera::add_layer_norm_backward(&x, nullptr, x, s, s, &w, &x, nullptr, nullptr, nullptr));
}

TEST(AddNormRegistry, OpsAndCases) {
  for (const char* name : {"add_layer_norm", "add_layer_norm_backward", "add_rms_norm", "add_rms_norm_backward"}) {
    const auto* op = tessera::ops::find_op(name);
    ASSERT_NE(op, nullptr) << name;
    EXPECT_EQ(op->family, "rowwise");
    const auto cases = op->verify_cases();
    EXPECT_GT(cases.size(), 60u) << name;
    int large = 0;
    for (const auto& c : cases) large += c.large;
    EXPECT_EQ(large, std::string(name).find("backward") == std::string::npos ? 1 : 0) << name;
    // What the bench credits: input and residual read, out and residual_out written (backward:
    // grad_output, grad_residual_out and residual_out read, grad_input written), plus the
    // parameters and statistics.
    const auto s = op->bench_shape(DType::bfloat16, 4096);
    const bool rms = std::string(name).find("rms") != std::string::npos;
    const bool backward = std::string(name).find("backward") != std::string::npos;
    const double params = (rms ? 1 : 2) + (backward ? 1 : 0), stats = rms ? 1 : 2;
    EXPECT_EQ(s.bytes, 4.0 * 4096 * 4096 * 2 + params * 4096 * 2 + stats * 4 * 4096) << name;
  }
  // "add" is the elementwise op and its variants only.
  EXPECT_EQ(tessera::ops::select_ops("add").size(), 1u);
  EXPECT_EQ(tessera::ops::select_ops("add_rms_norm").size(), 2u);
  EXPECT_EQ(tessera::ops::select_ops("add_layer_norm").size(), 2u);
}

// ---- GPU ---------------------------------------------------------------------------------------

std::vector<unsigned char> bytes_of(const tessera::ops::TestTensor& t) { return tessera::ops::to_host(t).bytes; }

// grad_weight and grad_bias bit for bit the same from run to run with grad_residual_out given, and
// the in-place forms (out over input, residual_out over residual; grad_input over
// grad_residual_out) the same bits as the out-of-place ones. Shapes: the forward's prefetch,
// vpt4 and stream tiers; the backward's registers, staged and long-row tiers.
TEST(AddNormGpu, DeterministicAndInPlaceAsOutOfPlace) {
  TESSERA_REQUIRE_GPU();
  using tessera::ops::Layout;
  using tessera::ops::make_tensor;
  using tessera::ops::TestTensor;
  struct Shape {
    DType dt;
    int64_t rows, n;
  };
  const Shape shapes[] = {{DType::bfloat16, 1000, 1024}, {DType::float16, 333, 4096}, {DType::float32, 300, 8192},
                          {DType::bfloat16, 5, 100003},  {DType::float32, 301, 40000}, {DType::float32, 2000, 96}};
  for (const Shape& s : shapes) {
    for (bool rms : {false, true}) {
      const std::string what = std::string(tessera::dtype_name(s.dt)) + " [" + std::to_string(s.rows) + ", " +
                               std::to_string(s.n) + "]" + (rms ? " add_rms_norm" : " add_layer_norm");
      SCOPED_TRACE(what);
      auto rand = [&](std::vector<int64_t> shape, double lo, double hi) {
        TestTensor t = make_tensor(s.dt, shape, Layout::contiguous);
        tessera::ops::fill_random(t, lo, hi, nullptr);
        return t;
      };
      TestTensor x = rand({s.rows, s.n}, -2, 4), r = rand({s.rows, s.n}, -1, 3), w = rand({s.n}, -1, 2);
      TestTensor out = make_tensor(s.dt, {s.rows, s.n}, Layout::contiguous);
      TestTensor res = make_tensor(s.dt, {s.rows, s.n}, Layout::contiguous);
      TestTensor mean = make_tensor(DType::float32, {s.rows}, Layout::contiguous);
      TestTensor rstd = make_tensor(DType::float32, {s.rows}, Layout::contiguous);
      auto forward = [&](const TensorView& in, const TensorView& resid, const TensorView& o, const TensorView& ro) {
        if (rms) tessera::add_rms_norm(in, resid, &w.view, 1e-6, o, ro, &rstd.view, nullptr);
        else tessera::add_layer_norm(in, resid, &w.view, nullptr, 1e-5, o, ro, &mean.view, &rstd.view, nullptr);
      };
      forward(x.view, r.view, out.view, res.view);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto want_out = bytes_of(out), want_res = bytes_of(res);
      forward(x.view, r.view, x.view, r.view);  // in place
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_TRUE(bytes_of(x) == want_out) << "out in place differs";
      EXPECT_TRUE(bytes_of(r) == want_res) << "residual_out in place differs";

      TestTensor dy = rand({s.rows, s.n}, -1, 1), dres = rand({s.rows, s.n}, -1, 1);
      std::vector<unsigned char> first_dx, first_dw, first_db;
      for (int run = 0; run < 3; ++run) {  // twice out of place, then grad_input over grad_residual_out
        TestTensor dx = make_tensor(s.dt, {s.rows, s.n}, Layout::contiguous);
        TestTensor dw = make_tensor(s.dt, {s.n}, Layout::contiguous), db = make_tensor(s.dt, {s.n}, Layout::contiguous);
        const TensorView& gi = run == 2 ? dres.view : dx.view;
        if (rms)
          tessera::add_rms_norm_backward(&dy.view, &dres.view, res.view, rstd.view, &w.view, &gi, &dw.view, nullptr);
        else
          tessera::add_layer_norm_backward(&dy.view, &dres.view, res.view, mean.view, rstd.view, &w.view, &gi, &dw.view,
                                           &db.view, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got_dx = bytes_of(run == 2 ? dres : dx);
        if (run == 0) {
          first_dx = got_dx, first_dw = bytes_of(dw);
          if (!rms) first_db = bytes_of(db);
          continue;
        }
        EXPECT_TRUE(got_dx == first_dx) << "grad_input differs, run " << run;
        EXPECT_TRUE(bytes_of(dw) == first_dw) << "grad_weight differs, run " << run;
        if (!rms) EXPECT_TRUE(bytes_of(db) == first_db) << "grad_bias differs, run " << run;
      }
    }
  }
}

}  // namespace
