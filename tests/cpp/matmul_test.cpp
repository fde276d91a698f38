// matmul: argument checks and messages (CPU), and which kernel tier each layout takes (GPU; the
// results of every verify case are checked by Op/VerifyGpu.MatchesReference/matmul).
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "gpu.hpp"
#include "ops/matrix/matmul_reference.hpp"
#include "ops/verify.hpp"
#include "runtime/device.hpp"
#include "runtime/tier.hpp"
#include "testing.hpp"
#include "tessera/tessera.hpp"

namespace {

using tessera::DType;
using tessera::ErrorKind;
using tessera::MatmulOptions;
using tessera::TensorView;
using tessera::ops::Layout;
using tessera::ops::make_tensor;
using tessera::testing::cuda_tensor;
using tessera::testing::expect_error;

TEST(MatmulArgs, ShapesDtypesAndEpilogueAreChecked) {
  const auto a = cuda_tensor(0x1000, DType::bfloat16, {64, 32});
  const auto b = cuda_tensor(0x100000, DType::bfloat16, {32, 48});
  const auto c = cuda_tensor(0x200000, DType::bfloat16, {64, 48});
  const MatmulOptions none;
  expect_error([&] { tessera::matmul(a, cuda_tensor(0x100000, DType::bfloat16, {31, 48}), c, none, nullptr); },
               ErrorKind::value, {"tessera.matmul: argument 'other'", "K = 32 rows", "got [31, 48]"});
  expect_error([&] { tessera::matmul(a, cuda_tensor(0x100000, DType::float16, {32, 48}), c, none, nullptr); },
               ErrorKind::type, {"argument 'other'", "bfloat16", "got float16"});
  expect_error([&] { tessera::matmul(a, b, cuda_tensor(0x200000, DType::float16, {64, 48}), none, nullptr); },
               ErrorKind::type, {"argument 'out'", "bfloat16 (that of 'input') or float32", "got float16"});
  expect_error([&] { tessera::matmul(a, b, cuda_tensor(0x200000, DType::bfloat16, {64, 47}), none, nullptr); },
               ErrorKind::value, {"argument 'out'", "[..., 64, 48]", "got [64, 47]"});
  expect_error([&] { tessera::matmul(cuda_tensor(0x1000, DType::bfloat16, {64}), b, c, none, nullptr); },
               ErrorKind::value, {"argument 'input'", "a 2-d or 3-d tensor", "got 1-d [64]"});
  expect_error([&] { tessera::matmul(cuda_tensor(0x1000, DType::int32, {64, 32}), b, c, none, nullptr); },
               ErrorKind::type, {"argument 'input'", "got int32"});
  const auto bias = cuda_tensor(0x300000, DType::bfloat16, {47});
  MatmulOptions o;
  o.bias = &bias;
  expect_error([&] { tessera::matmul(a, b, c, o, nullptr); }, ErrorKind::value,
               {"argument 'bias'", "shape [48] (N)", "got [47]"});
  const auto res = cuda_tensor(0x300000, DType::bfloat16, {64, 47});
  MatmulOptions r;
  r.residual = &res;
  expect_error([&] { tessera::matmul(a, b, c, r, nullptr); }, ErrorKind::value,
               {"argument 'residual'", "shape [64, 48]"});
  expect_error([&] { tessera::matmul(a, b, cuda_tensor(0x1000, DType::bfloat16, {64, 48}), none, nullptr); },
               ErrorKind::value, {"argument 'out'", "overlap 'input'"});
  const auto z_f32 = cuda_tensor(0x400000, DType::float32, {64, 48});
  const auto z_shape = cuda_tensor(0x400000, DType::bfloat16, {48, 64});
  MatmulOptions z;
  z.preactivation = &z_f32;
  expect_error([&] { tessera::matmul(a, b, c, z, nullptr); }, ErrorKind::type,
               {"argument 'preactivation'", "bfloat16", "got float32"});
  z.preactivation = &z_shape;
  expect_error([&] { tessera::matmul(a, b, c, z, nullptr); }, ErrorKind::value,
               {"argument 'preactivation'", "[64, 48]", "got [48, 64]"});
  z.preactivation = &c;
  expect_error([&] { tessera::matmul(a, b, c, z, nullptr); }, ErrorKind::value,
               {"argument 'preactivation'", "overlap 'out'"});
  expect_error([&] {
    tessera::matmul(cuda_tensor(0x1000, DType::bfloat16, {3, 64, 32}), cuda_tensor(0x100000, DType::bfloat16, {2, 32, 48}),
                    cuda_tensor(0x200000, DType::bfloat16, {3, 64, 48}), none, nullptr);
  }, ErrorKind::value, {"argument 'other'", "a batch of 3"});
}

// Activation swiglu: out has N / 2 columns, the pre-activation N; no residual or beta; N even
// (gate and up of 64 features a block, the last block shorter).
TEST(MatmulArgs, SwigluShapesAreChecked) {
  const auto a = cuda_tensor(0x1000, DType::bfloat16, {64, 32});
  const auto b = cuda_tensor(0x100000, DType::bfloat16, {32, 256});
  const auto c = cuda_tensor(0x200000, DType::bfloat16, {64, 128});
  MatmulOptions o;
  o.activation = tessera::Activation::swiglu;
  expect_error([&] { tessera::matmul(a, cuda_tensor(0x100000, DType::bfloat16, {32, 193}), c, o, nullptr); },
               ErrorKind::value, {"argument 'other'", "N even", "got [32, 193]"});
  expect_error([&] { tessera::matmul(a, b, cuda_tensor(0x200000, DType::bfloat16, {64, 256}), o, nullptr); },
               ErrorKind::value, {"argument 'out'", "N / 2 = 128 columns", "got [64, 256]"});
  expect_error([&] { tessera::matmul(a, b, cuda_tensor(0x200000, DType::bfloat16, {63, 128}), o, nullptr); },
               ErrorKind::value, {"argument 'out'", "[..., 64, 128] (M of 'input', N / 2 of 'other')", "got [63, 128]"});
  const auto bias_half = cuda_tensor(0x300000, DType::bfloat16, {128});
  MatmulOptions bias = o;
  bias.bias = &bias_half;
  expect_error([&] { tessera::matmul(a, b, c, bias, nullptr); }, ErrorKind::value,
               {"argument 'bias'", "shape [256] (N)", "got [128]"});
  const auto res = cuda_tensor(0x300000, DType::bfloat16, {64, 128});
  MatmulOptions r = o;
  r.residual = &res;
  expect_error([&] { tessera::matmul(a, b, c, r, nullptr); }, ErrorKind::value,
               {"argument 'residual'", "none with activation 'swiglu'"});
  MatmulOptions beta = o;
  beta.beta = 1.0;
  expect_error([&] { tessera::matmul(a, b, c, beta, nullptr); }, ErrorKind::value,
               {"argument 'beta'", "0 with activation 'swiglu'"});
  const auto z_narrow = cuda_tensor(0x400000, DType::bfloat16, {64, 128});
  const auto z_f32 = cuda_tensor(0x400000, DType::float32, {64, 256});
  const auto z_over = cuda_tensor(0x200000 + 64 * 128 * 2 - 2, DType::bfloat16, {64, 256});
  MatmulOptions z = o;
  z.preactivation = &z_narrow;
  expect_error([&] { tessera::matmul(a, b, c, z, nullptr); }, ErrorKind::value,
               {"argument 'preactivation'", "[64, 256] (out's, with N columns)", "got [64, 128]"});
  z.preactivation = &z_f32;
  expect_error([&] { tessera::matmul(a, b, c, z, nullptr); }, ErrorKind::type,
               {"argument 'preactivation'", "bfloat16", "got float32"});
  z.preactivation = &z_over;
  expect_error([&] { tessera::matmul(a, b, c, z, nullptr); }, ErrorKind::value,
               {"argument 'preactivation'", "overlap 'out'"});
  const auto z_in = cuda_tensor(0x1000, DType::bfloat16, {64, 256});
  z.preactivation = &z_in;
  expect_error([&] { tessera::matmul(a, b, c, z, nullptr); }, ErrorKind::value,
               {"argument 'preactivation'", "overlap 'input'"});
}

// The tier the launcher chose for a call (the first it recorded: a tier that runs others, such as
// the relayout, records theirs after its own), from its trace.
tessera::runtime::TierChoice choice_of(DType dt, Layout la, Layout lb, int64_t m, int64_t k, int64_t n,
                                       bool tf32 = false) {
  auto a = make_tensor(dt, {m, k}, la), b = make_tensor(dt, {k, n}, lb);
  auto c = make_tensor(dt, {m, n}, Layout::contiguous);
  MatmulOptions o;
  o.allow_tf32 = tf32;
  tessera::runtime::set_tier_trace(true);
  tessera::matmul(a.view, b.view, c.view, o, nullptr);
  const auto trace = tessera::runtime::take_tier_trace();
  tessera::runtime::set_tier_trace(false);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return trace.empty() ? tessera::runtime::TierChoice{} : trace.front();
}

std::string tier_of(DType dt, Layout la, Layout lb, int64_t m, int64_t k, int64_t n, bool tf32 = false) {
  return choice_of(dt, la, lb, m, k, n, tf32).tier;
}

TEST(MatmulGpu, EveryRowOrColumnMajorLayoutTakesTheTensorCoresOnHopper) {
  TESSERA_REQUIRE_GPU();
  if (tessera::runtime::device_props(0).major != 9) GTEST_SKIP() << "the wgmma tier is for sm_90";
  const Layout C = Layout::contiguous, T = Layout::transposed;
  for (DType dt : {DType::bfloat16, DType::float16})
    for (Layout la : {C, T})
      for (Layout lb : {C, T})
        EXPECT_EQ(tier_of(dt, la, lb, 256, 192, 320), "sm90_wgmma")
            << tessera::dtype_name(dt) << " " << layout_name(la) << " @ " << layout_name(lb);
  // Few rows against a K-contiguous weight stream it: on the GEMV tier where the input's K is
  // contiguous too, else on the skinny tier; in the other layouts, few output tiles against a
  // long K are split over K to fill the SMs.
  for (Layout la : {C, T}) {
    EXPECT_EQ(tier_of(DType::bfloat16, la, T, 16, 4096, 512), la == C ? "gemv_sm90" : "skinny") << layout_name(la);
    const auto split = choice_of(DType::bfloat16, la, C, 16, 4096, 512);
    EXPECT_EQ(split.tier, "sm90_wgmma") << layout_name(la);
    EXPECT_NE(split.why.find("chunks of K"), std::string::npos) << split.why;
  }
  EXPECT_EQ(tier_of(DType::bfloat16, C, T, 33, 4096, 512), "sm90_wgmma");  // M over the skinny tier's
  EXPECT_EQ(tier_of(DType::bfloat16, C, C, 16, 4000, 512), "sm90_wgmma");  // K not in 64-blocks
  // TF32 in every layout: an operand whose K is not contiguous is copied K-contiguous first.
  for (Layout la : {C, T})
    for (Layout lb : {C, T})
      EXPECT_EQ(tier_of(DType::float32, la, lb, 256, 192, 320, true), la == C && lb == T ? "sm90_wgmma" : "sm90_relayout")
          << layout_name(la) << " @ " << layout_name(lb);
  // float32, strided operands and rows that are not 16-byte multiples take the SIMT tier.
  EXPECT_EQ(tier_of(DType::float32, C, T, 256, 192, 320), "simt");
  EXPECT_EQ(tier_of(DType::bfloat16, Layout::strided, T, 256, 192, 320), "simt");
  EXPECT_EQ(tier_of(DType::bfloat16, C, T, 64, 100, 72), "simt");
}

// Activation swiglu: one kernel where the sm90 tier takes it (the trace names its epilogue), else
// the product on the tier that takes it, then tessera::swiglu; a forced tier runs the product.
TEST(MatmulGpu, SwigluRunsInTheSm90EpilogueWhereItCan) {
  TESSERA_REQUIRE_GPU();
  if (tessera::runtime::device_props(0).major != 9) GTEST_SKIP() << "the wgmma tier is for sm_90";
  const auto trace_of = [](int64_t m, int64_t k, int64_t n, bool preact) {
    auto a = make_tensor(DType::bfloat16, {m, k}, Layout::contiguous);
    auto b = make_tensor(DType::bfloat16, {k, n}, Layout::transposed);
    auto c = make_tensor(DType::bfloat16, {m, n / 2}, Layout::contiguous);
    auto z = make_tensor(DType::bfloat16, {m, n}, Layout::contiguous);
    MatmulOptions o;
    o.activation = tessera::Activation::swiglu;
    if (preact) o.preactivation = &z.view;
    tessera::runtime::set_tier_trace(true);
    tessera::matmul(a.view, b.view, c.view, o, nullptr);
    const auto trace = tessera::runtime::take_tier_trace();
    tessera::runtime::set_tier_trace(false);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return trace;
  };
  for (bool preact : {false, true}) {
    for (auto [m, k, n] : {std::tuple{512, 256, 1024}, std::tuple{2048, 128, 5632}}) {
      const auto fused = trace_of(m, k, n, preact);
      ASSERT_FALSE(fused.empty());
      EXPECT_EQ(fused.front().tier, "sm90_wgmma");
      EXPECT_NE(fused.front().why.find("gated activation in the epilogue"), std::string::npos) << fused.front().why;
      EXPECT_EQ(fused.front().why.find("chunks of K"), std::string::npos) << fused.front().why;
    }
    const auto few_rows = trace_of(16, 256, 256, preact);  // the product on the GEMV tier, then swiglu
    ASSERT_FALSE(few_rows.empty());
    EXPECT_EQ(few_rows.front().tier, "gemv_sm90");
  }
  tessera::runtime::set_forced_tier("matmul", "sm80_mma");
  const auto forced = trace_of(512, 256, 1024, false);
  tessera::runtime::set_forced_tier("matmul", "");
  ASSERT_FALSE(forced.empty());
  EXPECT_EQ(forced.front().tier, "sm80_mma");
}

// A tile split over K is summed in chunk order, whichever chunk arrives last: two runs of the same
// call give the same bits, and the product. With a 16-bit output the tiles here are split into
// more chunks than they have 128-byte column blocks, so some chunks store nothing.
TEST(MatmulGpu, SplitTilesGiveTheSameBitsEveryRun) {
  TESSERA_REQUIRE_GPU();
  if (tessera::runtime::device_props(0).major != 9) GTEST_SKIP() << "the wgmma tier is for sm_90";
  const Layout C = Layout::contiguous;
  for (DType out : {DType::bfloat16, DType::float32}) {
    auto a = make_tensor(DType::bfloat16, {96, 8192}, C), b = make_tensor(DType::bfloat16, {8192, 1000}, C);
    tessera::ops::fill_random(a, -1, 1, nullptr), tessera::ops::fill_random(b, -1, 1, nullptr);
    std::vector<tessera::ops::HostCopy> runs;
    for (int run = 0; run < 2; ++run) {
      auto c = make_tensor(out, {96, 1000}, C);
      tessera::ops::fill_poison(c, nullptr);
      tessera::runtime::set_tier_trace(true);
      tessera::matmul(a.view, b.view, c.view, MatmulOptions{}, nullptr);
      const auto trace = tessera::runtime::take_tier_trace();
      tessera::runtime::set_tier_trace(false);
      ASSERT_FALSE(trace.empty());
      EXPECT_NE(trace.front().why.find("chunks of K"), std::string::npos) << trace.front().why;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      runs.push_back(tessera::ops::to_host(c));
    }
    EXPECT_TRUE(runs[0].bytes == runs[1].bytes) << tessera::dtype_name(out);
    auto c = make_tensor(out, {96, 1000}, C);
    const auto ha = tessera::ops::to_host(a), hb = tessera::ops::to_host(b), hc = tessera::ops::to_host(c);
    tessera::ops::to_device(c, runs[0]);
    tessera::ops::ErrorModel model;  // dot products of length K
    model.k = 8192;
    const auto r = tessera::ops::compare("matmul", "split", c,
                                         tessera::reference::matmul(ha.view, hb.view, hc.view, {}), nullptr, model);
    EXPECT_TRUE(r.passed) << tessera::dtype_name(out) << ": rel_err " << r.rel_err << " " << r.detail;
  }
}

}  // namespace
