// rms_norm_float8 (RMSNorm, or add_rms_norm with a residual, whose output is also quantized for a
// float8 GEMM): the argument checks (no GPU), and on the GPU its outputs against rms_norm (or
// add_rms_norm) followed by float8_quantize, bit for bit, on the fused tier's rows (those of
// rms_norm's warp and prefetch tiers) and on rows it does not take (rms_norm's vpt8-group rows,
// longer ones, float32), with an inf and a row of zeros among the values.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "runtime/memory.hpp"
#include "testing.hpp"
#include "tessera/ops/matrix.hpp"
#include "tessera/ops/rowwise.hpp"

namespace {

using tessera::DType;
using tessera::ErrorKind;
using tessera::Float8Granularity;
using tessera::NormFloat8;
using tessera::TensorView;
using tessera::testing::cuda_tensor;
using tessera::testing::expect_error;

TEST(RmsNormFloat8Checks, NameTheArgument) {
  const TensorView x = cuda_tensor(0x10000, DType::bfloat16, {32, 64});
  const TensorView r = cuda_tensor(0x20000, DType::bfloat16, {32, 64});
  const TensorView w = cuda_tensor(0x30000, DType::bfloat16, {64});
  const TensorView out = cuda_tensor(0x40000, DType::bfloat16, {32, 64});
  const TensorView q = cuda_tensor(0x100000, DType::float8_e4m3fn, {32, 64});
  const TensorView s = cuda_tensor(0x200000, DType::float32, {32, 1});
  const TensorView qt = cuda_tensor(0x300000, DType::float8_e4m3fn, {64, 32});
  const TensorView st = cuda_tensor(0x400000, DType::float32, {1, 64});
  const auto call = [&](const TensorView* res, const TensorView& o, const TensorView* res_out, const NormFloat8& f8) {
    tessera::rms_norm_float8(x, res, &w, 1e-6, 0.0, o, res_out, nullptr, f8, nullptr);
  };
  const NormFloat8 rows{q, s, &qt, &st, Float8Granularity::row};
  const std::string op = "tessera.rms_norm_float8";
  expect_error([&] { call(&r, out, nullptr, rows); }, ErrorKind::value, {op, "'residual_out'"});
  const TensorView strided = TensorView::make(reinterpret_cast<void*>(0x40000), DType::bfloat16,
                                              std::vector<int64_t>{32, 64}.data(),
                                              std::vector<int64_t>{128, 1}.data(), 2, x.device);
  expect_error([&] { call(nullptr, strided, nullptr, rows); }, ErrorKind::value, {op, "'out'", "contiguous"});
  expect_error([&] { call(nullptr, out, nullptr, NormFloat8{q, s, &qt, &st, Float8Granularity::block}); },
               ErrorKind::value, {op, "'granularity'", "'row' or 'tensor'"});
  const TensorView q_wrong = cuda_tensor(0x100000, DType::float8_e4m3fn, {64, 32});
  expect_error([&] { call(nullptr, out, nullptr, NormFloat8{q_wrong, s, nullptr, nullptr}); }, ErrorKind::value,
               {op, "'q'"});
  expect_error([&] { call(nullptr, out, nullptr, NormFloat8{q, s, &qt, nullptr}); }, ErrorKind::value,
               {op, "'scale_t'"});
  const TensorView q_on_x = cuda_tensor(0x10000, DType::float8_e4m3fn, {32, 64});  // over the input's bytes
  expect_error([&] { call(nullptr, out, nullptr, NormFloat8{q_on_x, s, nullptr, nullptr}); }, ErrorKind::value,
               {op, "'q'", "'input'"});
  const TensorView x20 = cuda_tensor(0x10000, DType::bfloat16, {20, 64});
  const TensorView out20 = cuda_tensor(0x40000, DType::bfloat16, {20, 64});
  const TensorView q20 = cuda_tensor(0x100000, DType::float8_e4m3fn, {20, 64});
  const TensorView s20 = cuda_tensor(0x200000, DType::float32, {20, 1});
  const TensorView qt20 = cuda_tensor(0x300000, DType::float8_e4m3fn, {64, 20});
  expect_error([&] {
    tessera::rms_norm_float8(x20, nullptr, &w, 1e-6, 0.0, out20, nullptr, nullptr, NormFloat8{q20, s20, &qt20, &st},
                             nullptr);
  }, ErrorKind::value, {op, "'out'", "multiples of 16"});
}

std::vector<uint8_t> download(const void* p, size_t n) {
  std::vector<uint8_t> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// Values of dtype `dt` (bf16, fp16 or float32) as bytes.
std::vector<uint8_t> encode(const std::vector<float>& v, DType dt) {
  const size_t e = dt == DType::float32 ? 4 : 2;
  std::vector<uint8_t> out(v.size() * e);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::float32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else if (dt == DType::bfloat16) {
      const __nv_bfloat16 b = __float2bfloat16(v[i]);
      std::memcpy(&out[i * 2], &b, 2);
    } else {
      const __half h = __float2half(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

struct Case {
  DType dt;
  int64_t m, k;
  bool residual;
  Float8Granularity g;
  bool columns;
};

TEST(RmsNormFloat8Gpu, EqualsTheNormThenFloat8Quantize) {
  TESSERA_REQUIRE_GPU();
  using G = Float8Granularity;
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  std::vector<Case> cases;
  for (DType dt : {DType::bfloat16, DType::float16})
    for (bool res : {false, true})
      for (G g : {G::row, G::tensor})
        for (bool columns : {false, true}) cases.push_back({dt, 256, 4096, res, g, columns});
  cases.push_back({DType::bfloat16, 48, 2048, true, G::row, true});      // a few rows: groups of one row
  cases.push_back({DType::float16, 1040, 1024, false, G::row, true});    // several rows a group
  cases.push_back({DType::bfloat16, 64, 8176, false, G::row, true});     // the fused tier's longest rows
  cases.push_back({DType::bfloat16, 64, 8192, true, G::row, true});      // with a residual, fused
  cases.push_back({DType::bfloat16, 64, 8192, false, G::row, true});     // rms_norm's vpt8-group: the two ops
  cases.push_back({DType::float16, 32, 12288, true, G::row, true});      // longer: the two ops
  cases.push_back({DType::bfloat16, 64, 256, true, G::row, true});       // the warp tiers' rows
  cases.push_back({DType::float16, 128, 512, false, G::tensor, true});
  cases.push_back({DType::float32, 64, 1024, false, G::tensor, true});   // float32: the two ops
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(tessera::dtype_name(c.dt)) + " " + std::to_string(c.m) + " x " + std::to_string(c.k) +
                 (c.residual ? " residual" : "") + (c.g == G::row ? " row" : " tensor") +
                 (c.columns ? " columns" : ""));
    const int64_t m = c.m, k = c.k, n = m * k;
    const size_t e = c.dt == DType::float32 ? 4 : 2;
    std::vector<float> x(static_cast<size_t>(n)), r(static_cast<size_t>(n)), w(static_cast<size_t>(k));
    for (int64_t i = 0; i < n; ++i) {
      x[size_t(i)] = std::sin(float(i) * 0.37f) * float(1 + i % 29);
      r[size_t(i)] = std::cos(float(i) * 0.11f) * 0.5f;
    }
    for (int64_t j = 0; j < k; ++j) w[size_t(j)] = 0.5f + float(j % 7) * 0.25f;
    for (int64_t j = 0; j < k; ++j) x[size_t(3 * k + j)] = 0.f, r[size_t(3 * k + j)] = 0.f;  // a zero row
    x[size_t(5 * k + 11)] = std::numeric_limits<float>::infinity();  // row 5 and column 11: NaN scales
    tessera::runtime::DeviceBuffer bx(n * e), br(n * e), bw(k * e), by(n * e), bro(n * e), brs(m * 4), bq(n),
        bs(m * 4), bqt(n), bst(k * 4), ry(n * e), rro(n * e), rrs(m * 4), rq(n), rs(m * 4), rqt(n), rst(k * 4);
    for (auto [buf, v] : {std::pair{&bx, &x}, {&br, &r}, {&bw, &w}}) {
      const auto bytes = encode(*v, c.dt);
      ASSERT_EQ(cudaMemcpy(buf->data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    const auto t = [&](tessera::runtime::DeviceBuffer& b, DType dt, std::vector<int64_t> shape) {
      return TensorView::make(b.data(), dt, shape.data(), nullptr, int(shape.size()), dev);
    };
    const auto scale = [&](tessera::runtime::DeviceBuffer& b, int64_t a, int64_t bb) {
      return c.g == G::tensor ? t(b, DType::float32, {}) : t(b, DType::float32, {a, bb});
    };
    const TensorView tx = t(bx, c.dt, {m / 16, 16, k}), tr = t(br, c.dt, {m / 16, 16, k}), tw = t(bw, c.dt, {k});
    // fused
    const TensorView ty = t(by, c.dt, {m / 16, 16, k}), tro = t(bro, c.dt, {m / 16, 16, k});
    const TensorView trs = t(brs, DType::float32, {m / 16, 16});
    const TensorView tq = t(bq, DType::float8_e4m3fn, {m, k}), tqt = t(bqt, DType::float8_e4m3fn, {k, m});
    const TensorView ts = scale(bs, m, 1), tst = scale(bst, 1, k);
    // reference: the two ops
    const TensorView uy = t(ry, c.dt, {m / 16, 16, k}), uro = t(rro, c.dt, {m / 16, 16, k});
    const TensorView urs = t(rrs, DType::float32, {m / 16, 16});
    const TensorView uy2 = t(ry, c.dt, {m, k});
    const TensorView uq = t(rq, DType::float8_e4m3fn, {m, k}), uqt = t(rqt, DType::float8_e4m3fn, {k, m});
    const TensorView us = scale(rs, m, 1), ust = scale(rst, 1, k);
    for (auto* b : {&bq, &bqt, &rq, &rqt}) ASSERT_EQ(cudaMemset(b->data(), 0xa5, size_t(n)), cudaSuccess);
    for (int run = 0; run < 2; ++run)  // the amax words start from zero each call
      tessera::rms_norm_float8(tx, c.residual ? &tr : nullptr, &tw, 1e-6, 0.0, ty, c.residual ? &tro : nullptr, &trs,
                               NormFloat8{tq, ts, c.columns ? &tqt : nullptr, c.columns ? &tst : nullptr, c.g},
                               nullptr);
    if (c.residual) tessera::add_rms_norm(tx, tr, &tw, 1e-6, uy, uro, &urs, nullptr);
    else tessera::rms_norm(tx, 1, &tw, 1e-6, 0.0, uy, &urs, nullptr);
    tessera::float8_quantize(uy2, uq, us, c.columns ? &uqt : nullptr, c.columns ? &ust : nullptr, c.g, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const size_t sn = c.g == G::tensor ? 4 : size_t(m) * 4, stn = c.g == G::tensor ? 4 : size_t(k) * 4;
    EXPECT_EQ(download(by.data(), n * e), download(ry.data(), n * e));
    EXPECT_EQ(download(brs.data(), m * 4), download(rrs.data(), m * 4));
    if (c.residual) EXPECT_EQ(download(bro.data(), n * e), download(rro.data(), n * e));
    EXPECT_EQ(download(bq.data(), n), download(rq.data(), n));
    EXPECT_EQ(download(bs.data(), sn), download(rs.data(), sn));
    if (c.columns) {
      EXPECT_EQ(download(bqt.data(), n), download(rqt.data(), n));
      EXPECT_EQ(download(bst.data(), stn), download(rst.data(), stn));
    }
  }
}

}  // namespace
