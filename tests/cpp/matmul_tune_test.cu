// matmul's autotuner side and its narrow inputs: the config spelling, the cache key, the candidate
// space (CPU); every candidate config computing the same product within bounds, TF32 and float8
// taking the tensor cores, and tuning on first use storing its choice (GPU). The cache file itself
// (corrupt, foreign, stale, concurrent writers) is tested in tune_cache_test.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/host.hpp"
#include "gpu.hpp"
#include "ops/matrix/gemm.cuh"
#include "ops/matrix/matmul_reference.hpp"
#include "ops/verify.hpp"
#include "runtime/device.hpp"
#include "runtime/tier.hpp"
#include "runtime/tuner.hpp"
#include "testing.hpp"
#include "tessera/tessera.hpp"

namespace {

using tessera::DType;
using tessera::ErrorKind;
using tessera::matrix::GemmArgs;
using tessera::matrix::GemmConfig;
using tessera::matrix::GemmCtx;
using tessera::ops::Layout;
using tessera::ops::make_tensor;
using tessera::ops::TestTensor;
using tessera::testing::cuda_tensor;
using tessera::testing::expect_error;

TEST(MatmulTune, ConfigSpellingRoundTrips) {
  for (const GemmConfig c : {GemmConfig{}, GemmConfig{1, 4, 1}, GemmConfig{2, 16, 8}}) {
    GemmConfig back;
    ASSERT_TRUE(tessera::matrix::parse_config(to_string(c), back)) << to_string(c);
    EXPECT_TRUE(back == c) << to_string(c);
  }
  EXPECT_EQ(to_string(GemmConfig{2, 8, 4}), "schedule=pingpong,group=8,splits=4");
  GemmConfig c;
  for (const char* bad : {"", "schedule=fast,group=8,splits=1", "schedule=auto,group=8",
                          "schedule=auto,group=8,splits=1x", "schedule=auto,group=-1,splits=1",
                          "schedule=auto,group=8,splits=999"})
    EXPECT_FALSE(tessera::matrix::parse_config(bad, c)) << bad;
}

GemmArgs args(DType dt, int64_t m, int64_t n, int64_t k) {
  GemmArgs g;
  g.dtype = g.out_dtype = dt;
  g.m = m, g.n = n, g.k = k;
  g.a_sm = k, g.a_sk = 1, g.b_sk = 1, g.b_sn = k, g.c_sm = n, g.c_sn = 1;
  return g;
}

TEST(MatmulTune, KeyNamesArchDtypesLayoutsAndBucket) {
  const GemmCtx h100{132, 9};
  GemmArgs g = args(DType::bfloat16, 3000, 4096, 4000);
  EXPECT_EQ(tessera::matrix::tune_key(g, h100), "sm90|bfloat16>bfloat16|akbk|m4096-n4096-k4096-b1");
  // Shapes of one bucket share a key; another bucket, layout or TF32 setting does not.
  GemmArgs same = args(DType::bfloat16, 2049, 4000, 3000);
  EXPECT_EQ(tessera::matrix::tune_key(same, h100), tessera::matrix::tune_key(g, h100));
  GemmArgs rows = g;
  rows.b_sk = 4096, rows.b_sn = 1;
  EXPECT_EQ(tessera::matrix::tune_key(rows, h100), "sm90|bfloat16>bfloat16|akbr|m4096-n4096-k4096-b1");
  GemmArgs f = args(DType::float32, 64, 64, 64);
  f.allow_tf32 = true;
  EXPECT_EQ(tessera::matrix::tune_key(f, GemmCtx{108, 8}), "sm80|float32+tf32>float32|akbk|m64-n64-k64-b1");
}

TEST(MatmulTune, CandidatesStartWithTheDefault) {
  // Off sm_90 (or where the sm90 tier declines) there is nothing to choose.
  const auto none = tessera::matrix::candidates(args(DType::bfloat16, 1024, 1024, 1024), GemmCtx{108, 8});
  ASSERT_EQ(none.size(), 1u);
  EXPECT_TRUE(none[0] == GemmConfig{});
}

TEST(MatmulArgs, ScaledMmChecksItsArguments) {
  // K = 256: two K blocks, so a row-wise pair is not also a block-wise one.
  const auto a = cuda_tensor(0x1000, DType::float8_e4m3fn, {64, 256});
  const auto b = cuda_tensor(0x100000, DType::float8_e4m3fn, {256, 48});
  const auto c = cuda_tensor(0x200000, DType::bfloat16, {64, 48});
  const auto s = cuda_tensor(0x300000, DType::float32, {1});
  expect_error([&] { tessera::scaled_mm(cuda_tensor(0x1000, DType::bfloat16, {64, 256}), b, s, s, c, nullptr, nullptr); },
               ErrorKind::type, {"tessera.scaled_mm: argument 'input'", "float8_e4m3fn", "got bfloat16"});
  expect_error([&] { tessera::scaled_mm(a, cuda_tensor(0x100000, DType::float8_e5m2, {256, 48}), s, s, c, nullptr, nullptr); },
               ErrorKind::type, {"argument 'other'", "got float8_e5m2"});
  expect_error([&] { tessera::scaled_mm(a, b, s, s, cuda_tensor(0x200000, DType::float8_e4m3fn, {64, 48}), nullptr, nullptr); },
               ErrorKind::type, {"argument 'out'", "got float8_e4m3fn"});
  expect_error([&] { tessera::scaled_mm(a, b, cuda_tensor(0x300000, DType::float32, {2}), s, c, nullptr, nullptr); },
               ErrorKind::value, {"argument 'scale_a'", "one element", "got 'scale_a' [2] and 'scale_b' [1]"});
  expect_error([&] { tessera::scaled_mm(a, b, s, cuda_tensor(0x300000, DType::float16, {1}), c, nullptr, nullptr); },
               ErrorKind::type, {"argument 'scale_b'", "got float16"});
  expect_error([&] { tessera::scaled_mm(cuda_tensor(0x1000, DType::float8_e4m3fn, {2, 64, 256}), b, s, s, c, nullptr, nullptr); },
               ErrorKind::value, {"argument 'input'", "a 2-d tensor"});
  // Row-wise: scale_a [M, 1] and scale_b [1, N], contiguous; block-wise: scale_a [M, K / 128]
  // and scale_b [K / 128, N / 128] or [K / 128, N]; not two kinds (as torch).
  const auto rows = cuda_tensor(0x300000, DType::float32, {64, 1}), cols = cuda_tensor(0x400000, DType::float32, {1, 48});
  const char* want = "both of one element (per-tensor); 'scale_a' [64, 1] and 'scale_b' [1, 48], contiguous (row-wise); "
                     "or 'scale_a' [64, 2] and 'scale_b' [2, 1] or [2, 48] (block-wise: 1 x 128 blocks, and 128 x 128 "
                     "or 1 x 128); not two kinds";
  expect_error([&] { tessera::scaled_mm(a, b, s, cols, c, nullptr, nullptr); },
               ErrorKind::value, {"tessera.scaled_mm: argument 'scale_b'", want, "got 'scale_a' [1] and 'scale_b' [1, 48]"});
  expect_error([&] { tessera::scaled_mm(a, b, rows, s, c, nullptr, nullptr); },
               ErrorKind::value, {"argument 'scale_b'", "got 'scale_a' [64, 1] and 'scale_b' [1]"});
  expect_error([&] { tessera::scaled_mm(a, b, cuda_tensor(0x300000, DType::float32, {64}), cols, c, nullptr, nullptr); },
               ErrorKind::value, {"argument 'scale_a'", want, "got 'scale_a' [64] and"});
  expect_error([&] { tessera::scaled_mm(a, b, rows, cuda_tensor(0x400000, DType::float32, {48, 1}), c, nullptr, nullptr); },
               ErrorKind::value, {"argument 'scale_b'", "'scale_b' [48, 1]"});
  expect_error([&] { tessera::scaled_mm(a, b, cuda_tensor(0x300000, DType::float32, {32, 1}), cols, c, nullptr, nullptr); },
               ErrorKind::value, {"argument 'scale_a'", "[64, 1] and 'scale_b' [1, 48]", "got 'scale_a' [32, 1]"});
  const auto strided = tessera::TensorView::strided(tessera::testing::fake(0x400000), DType::float32, {1, 48}, {96, 2},
                                                    tessera::Device{tessera::DeviceType::cuda, 0});
  expect_error([&] { tessera::scaled_mm(a, b, rows, strided, c, nullptr, nullptr); },
               ErrorKind::value, {"argument 'scale_b'", "'scale_b' [1, 48] (not contiguous)"});
  expect_error([&] { tessera::scaled_mm(a, b, rows, cuda_tensor(0x400000, DType::float16, {1, 48}), c, nullptr, nullptr); },
               ErrorKind::type, {"argument 'scale_b'", "got float16"});
  // Block-wise: one kind with the other is refused, and so is e5m2.
  const auto blocks = cuda_tensor(0x300000, DType::float32, {64, 2});
  expect_error([&] { tessera::scaled_mm(a, b, blocks, cols, c, nullptr, nullptr); },
               ErrorKind::value, {"argument 'scale_b'", want, "got 'scale_a' [64, 2] and 'scale_b' [1, 48]"});
  expect_error([&] { tessera::scaled_mm(a, b, blocks, cuda_tensor(0x400000, DType::float32, {2, 2}), c, nullptr, nullptr); },
               ErrorKind::value, {"argument 'scale_b'", "got 'scale_a' [64, 2] and 'scale_b' [2, 2]"});
  expect_error([&] {
    tessera::scaled_mm(cuda_tensor(0x1000, DType::float8_e5m2, {64, 256}), cuda_tensor(0x100000, DType::float8_e5m2, {256, 48}),
                       blocks, cuda_tensor(0x400000, DType::float32, {2, 1}), c, nullptr, nullptr);
  }, ErrorKind::type, {"argument 'input'", "float8_e4m3fn with block-wise scales", "got float8_e5m2"});
  // beta: with per-tensor and row-wise scales only.
  tessera::ScaledMmOptions accumulate;
  accumulate.beta = 1.0;
  expect_error([&] { tessera::scaled_mm(a, b, blocks, cuda_tensor(0x400000, DType::float32, {2, 1}), c, accumulate, nullptr); },
               ErrorKind::value, {"tessera.scaled_mm: argument 'beta'", "0 with block-wise scales", "got 1"});
}

// One problem, its reference, and the check of a result against it. float8: unit per-tensor
// scales, or row-wise ones (scale_a [M, 1], scale_b [1, N]).
struct Problem {
  DType dt, out_dt;
  bool tf32 = false, fp8 = false;
  TestTensor a, b, out, scale, scale_b;
  std::vector<double> ref;

  Problem(DType dt_, int64_t m, int64_t n, int64_t k, bool tf32_ = false, bool rowwise = false)
      : dt(dt_), out_dt(dt_ == DType::float8_e4m3fn ? DType::bfloat16 : dt_), tf32(tf32_),
        fp8(dt_ == DType::float8_e4m3fn) {
    a = make_tensor(dt, {m, k}, Layout::contiguous);
    b = make_tensor(dt, {k, n}, Layout::transposed);
    out = make_tensor(out_dt, {m, n}, Layout::contiguous);
    scale = make_tensor(DType::float32, rowwise ? std::vector<int64_t>{m, 1} : std::vector<int64_t>{1}, Layout::contiguous);
    scale_b = make_tensor(DType::float32, rowwise ? std::vector<int64_t>{1, n} : std::vector<int64_t>{1}, Layout::contiguous);
    tessera::ops::fill_random(a, -1, 1, nullptr);
    tessera::ops::fill_random(b, -1, 1, nullptr);
    tessera::ops::fill_random(scale, rowwise ? 0.5 : 1, rowwise ? 2 : 1, nullptr);
    tessera::ops::fill_random(scale_b, rowwise ? 0.5 : 1, rowwise ? 2 : 1, nullptr);
    auto ha = tessera::ops::to_host(a), hb = tessera::ops::to_host(b), hc = tessera::ops::to_host(out);
    ref = tessera::reference::matmul(ha.view, hb.view, hc.view, {});
    if (rowwise) {
      auto hsa = tessera::ops::to_host(scale), hsb = tessera::ops::to_host(scale_b);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          ref[i * n + j] *= tessera::host::load_double(hsa.view, i) * tessera::host::load_double(hsb.view, j);
    }
  }
  void run() {
    tessera::ops::fill_poison(out, nullptr);
    if (fp8) {
      tessera::scaled_mm(a.view, b.view, scale.view, scale_b.view, out.view, nullptr, nullptr);
    } else {
      tessera::MatmulOptions o;
      o.allow_tf32 = tf32;
      tessera::matmul(a.view, b.view, out.view, o, nullptr);
    }
  }
  tessera::ops::VerifyResult check(const std::string& name) {
    tessera::ops::ErrorModel model;  // dot products of length K, tf32 operands rounded first
    model.k = a.view.shape[1];
    if (tf32) model.rounded = tessera::ops::kTf32Roundoff;
    return tessera::ops::compare(fp8 ? "scaled_mm" : tf32 ? "matmul_tf32" : "matmul", name, out, ref, nullptr, model);
  }
  GemmArgs gemm_args() const {
    GemmArgs g = args(dt, a.view.shape[0], b.view.shape[1], a.view.shape[1]);
    g.out_dtype = out_dt, g.allow_tf32 = tf32;
    g.a = a.view.data, g.b = b.view.data, g.c = out.view.data;
    if (fp8) g.scale_a = static_cast<const float*>(scale.view.data), g.scale_b = static_cast<const float*>(scale_b.view.data);
    g.scale_rowwise = fp8 && scale.view.ndim == 2;
    return g;
  }
};

// The tier and plan a call ran, from the launcher's trace.
std::string traced(Problem& p) {
  tessera::runtime::set_tier_trace(true);
  p.run();
  const auto trace = tessera::runtime::take_tier_trace();
  tessera::runtime::set_tier_trace(false);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return trace.empty() ? "" : trace.back().tier + ": " + trace.back().why;
}

TEST(MatmulTuneGpu, EveryCandidateConfigComputesTheProduct) {
  TESSERA_REQUIRE_GPU();
  const auto& props = tessera::runtime::device_props(0);
  const GemmCtx ctx{props.multiProcessorCount, props.major};
  // K long enough for split candidates; tails in M and N.
  std::vector<Problem> problems;
  problems.emplace_back(DType::bfloat16, 200, 520, 1024);
  problems.emplace_back(DType::float16, 200, 520, 1024);
  problems.emplace_back(DType::float32, 200, 520, 1024, true);
  problems.emplace_back(DType::float8_e4m3fn, 200, 528, 1024);
  problems.emplace_back(DType::float8_e4m3fn, 200, 528, 1024, false, true);  // row-wise scales
  for (Problem& p : problems) {
    const auto configs = tessera::matrix::candidates(p.gemm_args(), ctx);
    if (props.major == 9) EXPECT_GE(configs.size(), 7u) << dtype_name(p.dt);
    for (const GemmConfig& c : configs) {
      tessera::matrix::set_config_override(c);
      const std::string tier = traced(p);
      const auto r = p.check(to_string(c));
      EXPECT_TRUE(r.passed) << dtype_name(p.dt) << " " << to_string(c) << " (" << tier
                            << "): rel_err " << r.rel_err << ", unwritten " << r.unwritten << " "
                            << r.detail;
    }
    tessera::matrix::set_config_override(std::nullopt);
  }
}

TEST(MatmulTuneGpu, Tf32AndFloat8TakeTheTensorCoresOnHopper) {
  TESSERA_REQUIRE_GPU();
  if (tessera::runtime::device_props(0).major != 9) GTEST_SKIP() << "the wgmma tier is for sm_90";
  Problem tf32(DType::float32, 256, 320, 192, true), exact(DType::float32, 256, 320, 192, false);
  Problem fp8(DType::float8_e4m3fn, 256, 320, 192);
  // Row-wise scales: TMA stores, and drain (odd M and N: rows TMA cannot store).
  Problem rows(DType::float8_e4m3fn, 256, 320, 192, false, true), odd(DType::float8_e4m3fn, 257, 321, 192, false, true);
  EXPECT_EQ(traced(tf32).rfind("sm90_wgmma", 0), 0u) << traced(tf32);
  EXPECT_EQ(traced(exact).rfind("simt", 0), 0u) << traced(exact);
  for (Problem* p : {&fp8, &rows, &odd}) EXPECT_EQ(traced(*p).rfind("sm90_wgmma", 0), 0u) << traced(*p);
  for (Problem* p : {&tf32, &exact, &fp8, &rows, &odd}) {
    p->run();
    EXPECT_TRUE(p->check("tier").passed) << dtype_name(p->dt);
  }
}

TEST(MatmulTuneGpu, TuningOnFirstUseStoresItsChoice) {
  TESSERA_REQUIRE_GPU();
  const auto& props = tessera::runtime::device_props(0);
  if (props.major != 9) GTEST_SKIP() << "configs are for the sm90 tiers";
  const GemmCtx ctx{props.multiProcessorCount, props.major};
  // An odd bucket, so that an earlier run's cache is unlikely to hold it already.
  Problem p(DType::float16, 72, 1000, 1088);
  const std::string key = tessera::matrix::tune_key(p.gemm_args(), ctx);
  const bool was = tessera::autotune_enabled();
  tessera::set_autotune(true);
  p.run();
  tessera::set_autotune(was);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto found = tessera::runtime::tune_cache(0).find("matmul", key);
  ASSERT_TRUE(found.has_value()) << key;
  GemmConfig c;
  EXPECT_TRUE(tessera::matrix::parse_config(found->config, c)) << found->config;
  EXPECT_TRUE(tessera::runtime::has_tuned(0, "matmul"));
  // The tuned call wrote the caller's output once, correctly (candidates ran into scratch).
  EXPECT_TRUE(p.check("tuned").passed);
}

}  // namespace
