// The portable tensor-core matmul tier (sm80_mma), forced: that it takes every row- or
// column-major layout of both 16-bit dtypes (from the launcher's tier trace), and its results
// against the CPU reference for tails in M, N and K, batches, and the fused epilogue.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "ops/matrix/matmul_reference.hpp"
#include "ops/verify.hpp"
#include "runtime/device.hpp"
#include "runtime/memory.hpp"
#include "runtime/tier.hpp"
#include "tessera/tessera.hpp"

namespace {

using tessera::Activation;
using tessera::DType;
using tessera::MatmulOptions;
using tessera::ops::fill_random;
using tessera::ops::HostCopy;
using tessera::ops::Layout;
using tessera::ops::make_tensor;
using tessera::ops::TestTensor;
using Shape = std::vector<int64_t>;

constexpr const char* kTier = "sm80_mma";

// Column-major: the last two dimensions stored swapped (M resp. N contiguous).
struct Spec {
  int64_t m, k, n;
  int64_t batch_a = 0, batch_b = 0;  // 0: a 2-d operand (shared by every batch)
  bool a_cols = false, b_cols = true;
  bool bias = false, residual = false, out_f32 = false;
  Activation activation = Activation::none;
  double alpha = 1.0, beta = 0.0;
};

Shape shape_of(int64_t batch, int64_t rows, int64_t cols) {
  return batch ? Shape{batch, rows, cols} : Shape{rows, cols};
}

std::string describe(DType dt, const Spec& s) {
  const auto dims = [](int64_t b, int64_t r, int64_t c, bool cols) {
    return "[" + std::to_string(b) + "," + std::to_string(r) + "," + std::to_string(c) + "]" +
           (cols ? "T" : "N");
  };
  std::string d = std::string(tessera::dtype_name(dt)) + " " + dims(s.batch_a, s.m, s.k, s.a_cols) +
                  " @ " + dims(s.batch_b, s.k, s.n, s.b_cols);
  if (s.out_f32) d += " -> float32";
  if (s.bias) d += " +bias";
  if (s.activation != Activation::none)
    d += std::string(" ") + tessera::activation_name(s.activation);
  if (s.residual) d += " +residual";
  if (s.beta != 0.0) d += " beta";
  return d;
}

// A [batch,] rows x cols matrix whose contiguous dimension is padded to a multiple of 8 elements,
// so that every row (column) starts 16-byte aligned whatever its length: the tier's alignment.
TestTensor matrix(DType dt, int64_t batch, int64_t rows, int64_t cols, bool col_major) {
  const int64_t inner = col_major ? rows : cols, outer = col_major ? cols : rows;
  const int64_t ld = (inner + 7) / 8 * 8;
  std::vector<int64_t> shape, strides;
  if (batch) shape.push_back(batch), strides.push_back(outer * ld);
  shape.push_back(rows), shape.push_back(cols);
  strides.push_back(col_major ? 1 : ld), strides.push_back(col_major ? ld : 1);
  TestTensor t;
  t.storage_elems = std::max<int64_t>(batch, 1) * outer * ld;
  t.storage =
      tessera::runtime::DeviceBuffer(std::size_t(t.storage_elems) * tessera::dtype_size(dt));
  int dev = 0;
  EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
  t.view = tessera::TensorView::make(t.storage.data(), dt, shape.data(), strides.data(),
                                     int(shape.size()),
                                     tessera::Device{tessera::DeviceType::cuda, dev});
  return t;
}

struct Outcome {
  std::string tier;
  tessera::ops::VerifyResult result;
};

// Runs the spec with the tier forced (tensors from `make`), returns the tier that ran and the
// comparison with the reference.
template <class Make>
Outcome run(DType dt, const Spec& s, Make make) {
  const DType out_dt = s.out_f32 ? DType::float32 : dt;
  const int64_t batch = std::max(s.batch_a, s.batch_b);
  TestTensor a = make(dt, s.batch_a, s.m, s.k, s.a_cols);
  TestTensor b = make(dt, s.batch_b, s.k, s.n, s.b_cols);
  TestTensor out = make_tensor(out_dt, shape_of(batch, s.m, s.n), Layout::contiguous);
  fill_random(a, -1, 1, nullptr);
  fill_random(b, -1, 1, nullptr);
  TestTensor bias, residual;
  MatmulOptions o;
  o.activation = s.activation, o.alpha = s.alpha, o.beta = s.beta;
  if (s.bias) {
    bias = make_tensor(out_dt, {s.n}, Layout::contiguous);
    fill_random(bias, -1, 1, nullptr);
    o.bias = &bias.view;
  }
  if (s.residual) {
    residual = make_tensor(out_dt, shape_of(batch, s.m, s.n), Layout::transposed);
    fill_random(residual, -1, 1, nullptr);
    o.residual = &residual.view;
  }
  if (s.beta != 0.0) fill_random(out, -1, 1, nullptr);
  else tessera::ops::fill_poison(out, nullptr);
  const HostCopy ha = to_host(a), hb = to_host(b), hc = to_host(out);
  const HostCopy hbias = s.bias ? to_host(bias) : HostCopy{};
  const HostCopy hres = s.residual ? to_host(residual) : HostCopy{};
  MatmulOptions ho = o;
  ho.bias = s.bias ? &hbias.view : nullptr;
  ho.residual = s.residual ? &hres.view : nullptr;
  const std::vector<double> ref = tessera::reference::matmul(ha.view, hb.view, hc.view, ho);

  struct Forced {  // lifted however the call ends, so that no other test runs forced
    Forced() {
      tessera::runtime::set_forced_tier("matmul", kTier);
      tessera::runtime::set_tier_trace(true);
    }
    ~Forced() {
      tessera::runtime::set_tier_trace(false);
      tessera::runtime::set_forced_tier("matmul", "");
    }
  };
  std::vector<tessera::runtime::TierChoice> trace;
  {
    const Forced forced;
    tessera::matmul(a.view, b.view, out.view, o, nullptr);
    trace = tessera::runtime::take_tier_trace();
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Outcome r;
  r.tier = trace.empty() ? "" : trace.back().tier;
  r.result = tessera::ops::compare("matmul", describe(dt, s), out, ref, nullptr);
  return r;
}

TestTensor compact(DType dt, int64_t batch, int64_t rows, int64_t cols, bool col_major) {
  return make_tensor(dt, shape_of(batch, rows, cols),
                     col_major ? Layout::transposed : Layout::contiguous);
}

// The bound on the relative Frobenius error: that of the input dtype's rounding.
double bound(DType dt) { return dt == DType::float16 ? 5e-3 : 1e-2; }

// Runs the spec on the forced tier and expects that tier to have run it, correctly.
void expect_sm80(DType dt, const Spec& s, bool pad = true) {
  const Outcome r = pad ? run(dt, s, matrix) : run(dt, s, compact);
  const auto& v = r.result;
  EXPECT_EQ(r.tier, kTier) << v.name;
  EXPECT_TRUE(v.passed) << v.name << ": rel_err=" << v.rel_err << " max_abs=" << v.max_abs
                        << " unwritten=" << v.unwritten << " " << v.detail;
  EXPECT_LE(v.rel_err, bound(dt)) << v.name;
}

#define TESSERA_REQUIRE_SM80()                                    \
  do {                                                            \
    TESSERA_REQUIRE_GPU();                                        \
    if (tessera::runtime::device_props(0).major < 8)              \
      GTEST_SKIP() << "the mma.sync tier is for sm_80 on";        \
  } while (0)

const DType kTypes[] = {DType::bfloat16, DType::float16};

TEST(MatmulSm80, TakesEveryLayoutOfBothDtypes) {
  TESSERA_REQUIRE_SM80();
  for (DType dt : kTypes)
    for (bool ac : {false, true})
      for (bool bc : {false, true}) {
        Spec s{256, 192, 320};
        s.a_cols = ac, s.b_cols = bc;
        expect_sm80(dt, s, false);  // unpadded: every stride a multiple of 8 already
      }
}

TEST(MatmulSm80, TailsInEveryDimension) {
  TESSERA_REQUIRE_SM80();
  const int64_t sizes[] = {1, 17, 127, 128, 200, 1000};
  for (DType dt : kTypes)
    for (bool ac : {false, true})
      for (bool bc : {false, true})
        for (int64_t x : sizes)
          for (int d = 0; d < 3; ++d) {
            Spec s{d == 0 ? x : 127, d == 1 ? x : 200, d == 2 ? x : 17};
            s.a_cols = ac, s.b_cols = bc;
            expect_sm80(dt, s);
          }
  for (DType dt : kTypes) {
    expect_sm80(dt, Spec{1000, 1000, 1000});
    expect_sm80(dt, Spec{17, 1, 1, 0, 0, true, false});
  }
}

TEST(MatmulSm80, Batched) {
  TESSERA_REQUIRE_SM80();
  for (DType dt : kTypes) {
    expect_sm80(dt, Spec{130, 96, 200, 3, 3});
    expect_sm80(dt, Spec{130, 96, 200, 4, 0, true, false});   // shared other
    expect_sm80(dt, Spec{130, 97, 201, 0, 2, false, false});  // shared input, tails
    expect_sm80(dt, Spec{136, 96, 200, 3, 3, true, true}, false);
    expect_sm80(dt, Spec{300, 200, 520, 16, 16});  // a tile for every SM: the 4-warp shape
  }
}

TEST(MatmulSm80, FusedEpilogue) {
  TESSERA_REQUIRE_SM80();
  for (DType dt : kTypes) {
    Spec s{200, 136, 333, 2, 2, false, true, true, true, false, Activation::gelu};
    expect_sm80(dt, s);
    s.out_f32 = true;
    expect_sm80(dt, s);
    s.a_cols = true, s.b_cols = false, s.batch_a = 0;
    expect_sm80(dt, s);
    for (Activation act : {Activation::relu, Activation::gelu_tanh, Activation::silu}) {
      Spec e{256, 128, 384, 0, 0, false, true, true, false, false, act, 0.5, 0.5};
      expect_sm80(dt, e);
    }
    Spec f{1000, 200, 4200, 0, 0, true, true, false, false, true};  // float32 out, many tiles
    expect_sm80(dt, f);
  }
}

// What the tier cannot take (rows not 16-byte aligned) falls through to another tier, correctly.
TEST(MatmulSm80, UnalignedRowsFallThrough) {
  TESSERA_REQUIRE_SM80();
  const Outcome r = run(DType::bfloat16, Spec{64, 100, 72}, compact);
  EXPECT_NE(r.tier, kTier);
  EXPECT_TRUE(r.result.passed) << r.result.name << ": rel_err=" << r.result.rel_err;
}

}  // namespace
