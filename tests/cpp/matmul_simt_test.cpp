// The SIMT tier (forced, so that every GPU runs it): its float32 kernel on every operand layout
// it takes, with tails in M, N and K, batches, the epilogue and K split over CTAs where the tiles
// are few, against the CPU reference; the
// generic kernel for what the float32 one does not take, float8 inputs (scaled_mm) included.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench/host.hpp"
#include "gpu.hpp"
#include "ops/matrix/matmul_reference.hpp"
#include "ops/verify.hpp"
#include "runtime/device.hpp"
#include "runtime/tier.hpp"
#include "tessera/tessera.hpp"

namespace {

using tessera::Activation;
using tessera::DType;
using tessera::MatmulOptions;
using tessera::TensorView;
using tessera::ops::HostCopy;
using tessera::ops::Layout;
using tessera::ops::TestTensor;
using tessera::ops::make_tensor;

constexpr const char* kFast = "float32 128 x 128 tiles, 8 x 8 per thread";
constexpr const char* kGeneric = "generic 64 x 64 tiles through strides";

// An operand [batch, rows, cols] (batch 0: 2-d) with its rows contiguous (row-major) or its
// columns (column-major), the other dimension strided by `ld` elements.
TestTensor operand(DType dt, int64_t batch, int64_t rows, int64_t cols, bool row_major,
                   int64_t ld) {
  const int64_t outer = row_major ? rows : cols;
  TestTensor t = make_tensor(dt, {std::max<int64_t>(batch, 1) * std::max<int64_t>(outer, 1) * ld},
                             Layout::contiguous);
  const int64_t shape[3] = {batch, rows, cols};
  const int64_t strides[3] = {outer * ld, row_major ? ld : 1, row_major ? 1 : ld};
  const int nd = batch ? 3 : 2;
  t.view = TensorView::make(t.view.data, dt, shape + 3 - nd, strides + 3 - nd, nd, t.view.device);
  return t;
}

int64_t round4(int64_t v) { return (v + 3) / 4 * 4; }

struct Case {
  int64_t m, k, n;
  bool a_kmajor = true, b_kmajor = true;  // else M-major (column-major A) / N-major (row-major B)
  int64_t batch_a = 0, batch_b = 0;       // 0: 2-d (shared)
  bool bias = false, residual = false;
  Activation activation = Activation::none;
  double alpha = 1.0, beta = 0.0;
  bool padded = true;  // MN-major leading dimensions rounded up to 4 elements (16 bytes)
};

std::string name(const Case& c) {
  return "[" + std::to_string(c.batch_a) + "/" + std::to_string(c.batch_b) + "] " +
         std::to_string(c.m) + " x " + std::to_string(c.k) + " x " + std::to_string(c.n) + " A " +
         (c.a_kmajor ? "K" : "M") + "-major, B " + (c.b_kmajor ? "K" : "N") + "-major" +
         (c.bias ? " +bias" : "") + (c.residual ? " +residual" : "") + " act " +
         tessera::activation_name(c.activation) + " alpha " + std::to_string(c.alpha) + " beta " +
         std::to_string(c.beta);
}

struct Outcome {
  tessera::ops::VerifyResult r;
  std::string why;  // the tier trace: kWhen and the plan
};

// Runs the case through matmul (the SIMT tier forced) and compares with the CPU reference.
Outcome run_case(const Case& c) {
  const DType f = DType::float32;
  const int64_t batch = std::max(c.batch_a, c.batch_b);
  // Leading dimensions: K for a K-major operand; M or N, rounded up to 16 bytes where padded.
  const int64_t ld_k = std::max<int64_t>(c.k, 1);
  const auto ld = [&](int64_t v) { return c.padded ? round4(v) : std::max<int64_t>(v, 1); };
  TestTensor a = operand(f, c.batch_a, c.m, c.k, c.a_kmajor, c.a_kmajor ? ld_k : ld(c.m));
  TestTensor b = operand(f, c.batch_b, c.k, c.n, !c.b_kmajor, c.b_kmajor ? ld_k : ld(c.n));
  const std::vector<int64_t> out_shape = batch ? std::vector<int64_t>{batch, c.m, c.n}
                                               : std::vector<int64_t>{c.m, c.n};
  TestTensor out = make_tensor(f, out_shape, Layout::contiguous);
  tessera::ops::fill_random(a, -1, 1, nullptr);
  tessera::ops::fill_random(b, -1, 1, nullptr);
  TestTensor bias, residual;
  MatmulOptions o;
  o.activation = c.activation, o.alpha = c.alpha, o.beta = c.beta;
  if (c.bias) {
    bias = make_tensor(f, {c.n}, Layout::contiguous);
    tessera::ops::fill_random(bias, -1, 1, nullptr);
    o.bias = &bias.view;
  }
  if (c.residual) {
    residual = make_tensor(f, out_shape, Layout::transposed);
    tessera::ops::fill_random(residual, -1, 1, nullptr);
    o.residual = &residual.view;
  }
  if (c.beta != 0.0) tessera::ops::fill_random(out, -1, 1, nullptr);
  else tessera::ops::fill_poison(out, nullptr);
  const HostCopy ha = tessera::ops::to_host(a), hb = tessera::ops::to_host(b);
  const HostCopy hc = tessera::ops::to_host(out);
  const HostCopy hbias = c.bias ? tessera::ops::to_host(bias) : HostCopy{};
  const HostCopy hres = c.residual ? tessera::ops::to_host(residual) : HostCopy{};
  MatmulOptions ho = o;
  ho.bias = c.bias ? &hbias.view : nullptr;
  ho.residual = c.residual ? &hres.view : nullptr;
  const std::vector<double> ref = tessera::reference::matmul(ha.view, hb.view, hc.view, ho);
  tessera::runtime::set_tier_trace(true);
  tessera::matmul(a.view, b.view, out.view, o, nullptr);
  const auto trace = tessera::runtime::take_tier_trace();
  tessera::runtime::set_tier_trace(false);
  tessera::ops::ErrorModel model;  // dot products of length K
  model.k = std::max<int64_t>(c.k, 1);
  Outcome result{tessera::ops::compare("matmul", name(c), out, ref, nullptr, model), ""};
  if (!trace.empty()) result.why = trace.back().tier + ": " + trace.back().why;
  return result;
}

// Each case passes within 1e-5 (relative Frobenius norm) with every element written, and the
// trace names the kernel that ran.
void expect_case(const Case& c, const char* kernel) {
  const Outcome o = run_case(c);
  EXPECT_TRUE(o.r.passed) << name(c) << ": rel_err=" << o.r.rel_err
                          << " unwritten=" << o.r.unwritten << " " << o.r.detail;
  EXPECT_LE(o.r.rel_err, 1e-5) << name(c);
  EXPECT_EQ(o.r.unwritten, 0) << name(c);
  EXPECT_EQ(o.why.rfind("simt: ", 0), 0u) << name(c) << ": " << o.why;
  EXPECT_NE(o.why.find(kernel), std::string::npos) << name(c) << ": " << o.why;
}

class MatmulSimt : public ::testing::Test {
 protected:
  void SetUp() override {
    if (tessera::runtime::device_count() == 0)
      GTEST_SKIP() << "GPU test skipped: " << tessera::runtime::no_gpu_reason();
    if (tessera::runtime::device_props(0).major < 8)
      GTEST_SKIP() << "the float32 kernel is for sm_80 on";
    tessera::runtime::set_forced_tier("matmul", "simt");
    tessera::runtime::set_forced_tier("scaled_mm", "simt");
  }
  void TearDown() override {
    tessera::runtime::set_forced_tier("matmul", "");
    tessera::runtime::set_forced_tier("scaled_mm", "");
  }
};

// (A K-major, B K-major): row-major A or column-major A, column-major B or row-major B.
const std::vector<std::pair<bool, bool>> kLayouts = {
    {true, true}, {true, false}, {false, true}, {false, false}};
const std::vector<int64_t> kSizes = {1, 7, 127, 128, 129, 300};

TEST_F(MatmulSimt, Float32TailsInEveryDimensionAndLayout) {
  for (auto [ka, kb] : kLayouts) {
    for (int64_t s : kSizes) {
      expect_case({s, 127, 129, ka, kb}, kFast);
      expect_case({129, s, 127, ka, kb}, kFast);
      expect_case({127, 129, s, ka, kb}, kFast);
    }
    expect_case({300, 300, 300, ka, kb}, kFast);
    expect_case({1, 1, 1, ka, kb}, kFast);
    expect_case({7, 7, 7, ka, kb}, kFast);
    expect_case({256, 1000, 384, ka, kb}, kFast);  // many slices
  }
}

TEST_F(MatmulSimt, Float32Batches) {
  for (auto [ka, kb] : kLayouts) {
    expect_case({129, 72, 200, ka, kb, 3, 3}, kFast);
    expect_case({129, 72, 200, ka, kb, 3, 0}, kFast);  // other shared
    expect_case({129, 72, 200, ka, kb, 0, 2}, kFast);  // input shared
  }
}

TEST_F(MatmulSimt, Float32Epilogue) {
  using A = Activation;
  for (auto [ka, kb] : kLayouts) {
    expect_case({300, 200, 129, ka, kb, 0, 0, true, true, A::gelu, 0.5, 0.5}, kFast);
    expect_case({129, 64, 300, ka, kb, 2, 2, true, false, A::silu}, kFast);
    expect_case({200, 129, 130, ka, kb, 0, 0, true, false, A::relu, 2.0}, kFast);
    expect_case({127, 300, 127, ka, kb, 0, 0, false, true, A::gelu_tanh, 1.0, 1.0}, kFast);
  }
  expect_case({129, 0, 130, true, true, 0, 0, true, true, A::gelu, 1.0, 0.5}, kFast);  // K = 0
}

// Few tiles over a long K: K split over several CTAs a tile, the last one summing the chunks (in
// chunk order) and running the epilogue; chunks of whole slices and a last one with a tail.
TEST_F(MatmulSimt, Float32SplitsKWhereTheTilesAreFew) {
  using A = Activation;
  for (auto [ka, kb] : kLayouts) {
    expect_case({64, 256, 256, ka, kb}, "K split 4 ways of 64");
    expect_case({129, 999, 130, ka, kb, 2, 2, true, true, A::gelu, 0.5, 0.5}, "K split 4 ways of 256");
    expect_case({7, 140, 300, ka, kb, 0, 0, true, false, A::silu, 2.0, 1.0}, "K split 2 ways of 80");
  }
  expect_case({128, 4096, 128, true, true}, "K split 4 ways of 1024");
}

TEST_F(MatmulSimt, UnalignedRowsTakeTheGenericKernel) {
  // K-major rows take the float32 kernel at any alignment; MN-major rows need 16 bytes.
  using A = Activation;
  expect_case({129, 7, 130, true, true, 0, 0, false, false, A::none, 1.0, 0.0, false}, kFast);
  expect_case({7, 129, 130, false, true, 0, 0, false, false, A::none, 1.0, 0.0, false}, kGeneric);
  expect_case({129, 130, 7, true, false, 2, 2, true, false, A::relu, 1.0, 0.0, false}, kGeneric);
}

// Per-tensor scales, and row-wise ones (scale_a [M, 1], scale_b [1, N]) at odd M and N.
TEST_F(MatmulSimt, Float8TakesTheGenericKernel) {
  for (bool rowwise : {false, true})
  for (DType dt : {DType::float8_e4m3fn, DType::float8_e5m2})
    for (DType out_dt : {DType::bfloat16, DType::float32}) {
      const int64_t m = rowwise ? 131 : 130, k = 100, n = rowwise ? 71 : 72;
      TestTensor a = make_tensor(dt, {m, k}, Layout::contiguous);
      TestTensor b = make_tensor(dt, {k, n}, Layout::contiguous);  // N contiguous
      TestTensor out = make_tensor(out_dt, {m, n}, Layout::contiguous);
      using Shape = std::vector<int64_t>;
      TestTensor sa = make_tensor(DType::float32, rowwise ? Shape{m, 1} : Shape{1}, Layout::contiguous);
      TestTensor sb = make_tensor(DType::float32, rowwise ? Shape{1, n} : Shape{1}, Layout::contiguous);
      TestTensor bias = make_tensor(out_dt, {n}, Layout::contiguous);
      tessera::ops::fill_random(a, -2, 2, nullptr);
      tessera::ops::fill_random(b, -2, 2, nullptr);
      tessera::ops::fill_random(sa, 0.25, 0.5, nullptr);
      tessera::ops::fill_random(sb, 1, 2, nullptr);
      tessera::ops::fill_random(bias, -1, 1, nullptr);
      tessera::ops::fill_poison(out, nullptr);
      const HostCopy ha = tessera::ops::to_host(a), hb = tessera::ops::to_host(b);
      const HostCopy hc = tessera::ops::to_host(out), hbias = tessera::ops::to_host(bias);
      const HostCopy hsa = tessera::ops::to_host(sa), hsb = tessera::ops::to_host(sb);
      std::vector<double> ref = tessera::reference::matmul(ha.view, hb.view, hc.view, {});
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          ref[i * n + j] = ref[i * n + j] * tessera::host::load_double(hsa.view, rowwise ? i : 0) *
                               tessera::host::load_double(hsb.view, rowwise ? j : 0) +
                           tessera::host::load_double(hbias.view, j);
      tessera::runtime::set_tier_trace(true);
      tessera::scaled_mm(a.view, b.view, sa.view, sb.view, out.view, &bias.view, nullptr);
      const auto trace = tessera::runtime::take_tier_trace();
      tessera::runtime::set_tier_trace(false);
      const std::string what = std::string(tessera::dtype_name(dt)) + " -> " + tessera::dtype_name(out_dt) +
                               (rowwise ? ", row-wise scales" : "");
      const auto r = tessera::ops::compare("scaled_mm", what, out, ref, nullptr);
      EXPECT_TRUE(r.passed) << what << ": rel_err=" << r.rel_err << " " << r.detail;
      EXPECT_LE(r.rel_err, out_dt == DType::float32 ? 1e-5 : 1e-2) << what;
      EXPECT_EQ(r.unwritten, 0) << what;
      ASSERT_FALSE(trace.empty()) << what;
      EXPECT_EQ(trace.back().tier, "simt") << what;
      EXPECT_NE(trace.back().why.find(kGeneric), std::string::npos)
          << what << ": " << trace.back().why;
    }
}

}  // namespace
