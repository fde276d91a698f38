// float8_quantize: the CPU reference's e4m3 encoding and scales on values worked by hand, the
// description and the argument checks (no GPU), and on the GPU a call of each kernel against the
// reference beyond the verify cases (run in VerifyGpu): the same input twice gives the same bytes,
// and a CUDA stream other than the default one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gpu.hpp"
#include "ops/matrix/float8_quantize_reference.hpp"
#include "runtime/memory.hpp"
#include "tessera/op.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tessera/ops/matrix.hpp"
#include "testing.hpp"

namespace {

using tessera::DType;
using tessera::ErrorKind;
using tessera::Float8Granularity;
using tessera::TensorView;
using tessera::testing::cuda_tensor;
using tessera::testing::expect_error;
namespace ref = tessera::reference;

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

TEST(Float8QuantizeReference, E4m3RoundsToNearestEvenAndSaturates) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(ref::e4m3_byte(0.0f), 0x00);
  EXPECT_EQ(ref::e4m3_byte(-0.0f), 0x80);
  EXPECT_EQ(ref::e4m3_byte(1.0f), 0x38);                 // exponent 7 (bias 7), mantissa 0
  EXPECT_EQ(ref::e4m3_byte(1.0625f), 0x38);              // halfway between 1 and 1.125: the even one
  EXPECT_EQ(ref::e4m3_byte(1.1875f), 0x3a);              // halfway between 1.125 and 1.25: the even one
  EXPECT_EQ(ref::e4m3_byte(448.0f), 0x7e);               // the largest finite value
  EXPECT_EQ(ref::e4m3_byte(-448.0f), 0xfe);
  EXPECT_EQ(ref::e4m3_byte(464.0f), 0x7e);               // past 448: saturated, never NaN
  EXPECT_EQ(ref::e4m3_byte(-1e30f), 0xfe);
  EXPECT_EQ(ref::e4m3_byte(inf), 0x7e);
  EXPECT_EQ(ref::e4m3_byte(std::nanf("")), 0x7f);
  EXPECT_EQ(ref::e4m3_byte(std::ldexp(1.0f, -9)), 0x01);     // the smallest subnormal
  EXPECT_EQ(ref::e4m3_byte(std::ldexp(1.0f, -10)), 0x00);    // half of it: ties to even, 0
  EXPECT_EQ(ref::e4m3_byte(std::ldexp(3.0f, -10)), 0x02);    // 1.5 steps: ties to even, 2
  EXPECT_EQ(ref::e4m3_byte(std::ldexp(1.0f, -6)), 0x08);     // the smallest normal
  EXPECT_EQ(ref::e4m3_byte(std::ldexp(15.0f, -10)), 0x08);   // 7.5 subnormal steps round up into it
}

TEST(Float8QuantizeReference, ScalesAndGroups) {
  // scale = 1 / m, m = 448 / max(amax, 1e-12) rounded to float32
  EXPECT_FLOAT_EQ(ref::float8_scale(0.0f, true), 1e-12f / 448.0f);
  EXPECT_EQ(ref::float8_multiplier(0.0f, true), float(448.0 / 1e-12));
  EXPECT_EQ(ref::float8_scale(448.0f, true), 1.0f);
  EXPECT_EQ(ref::float8_multiplier(3.0f, true), float(448.0 / 3.0));
  EXPECT_EQ(ref::float8_scale(3.0f, true), 1.0f / float(448.0 / 3.0));
  EXPECT_EQ(bits(ref::float8_multiplier(1.0f, false)), 0x7fc00000u);
  EXPECT_EQ(bits(ref::float8_scale(1.0f, false)), 0x7fc00000u);
  const float inf = std::numeric_limits<float>::infinity();
  // rows: (1, -2, 0.5), zeros, (inf, 1, 0)
  const std::vector<float> x = {1.f, -2.f, 0.5f, 0.f, 0.f, 0.f, inf, 1.f, 0.f};
  const auto r = ref::float8_quantize(x, 3, 3, Float8Granularity::row, true);
  ASSERT_EQ(r.scale.size(), 3u);
  EXPECT_EQ(r.scale[0], 1.0f / 224.0f);
  EXPECT_FLOAT_EQ(r.scale[1], 1e-12f / 448.0f);
  EXPECT_TRUE(std::isnan(r.scale[2]));
  EXPECT_EQ(r.q[0], ref::e4m3_byte(224.f));  // 1 * 448 / 2
  EXPECT_EQ(r.q[0], 0x76);
  EXPECT_EQ(r.q[1], 0xfe);  // -448
  for (int j = 0; j < 3; ++j) EXPECT_EQ(r.q[size_t(3 + j)], 0x00) << j;
  for (int j = 0; j < 3; ++j) EXPECT_EQ(r.q[size_t(6 + j)], 0x7f) << j;  // NaN throughout
  // columns: (1, 0, inf) NaN, (-2, 0, 1) amax 2, (0.5, 0, 0) amax 0.5; q_t [3, 3] their rows
  ASSERT_EQ(r.scale_t.size(), 3u);
  EXPECT_TRUE(std::isnan(r.scale_t[0]));
  EXPECT_EQ(r.scale_t[1], 1.0f / 224.0f);
  EXPECT_EQ(r.scale_t[2], 1.0f / 896.0f);
  EXPECT_EQ(r.q_t[3 + 0], 0xfe);                            // x[0][1] = -2 by column 1's scale
  EXPECT_EQ(r.q_t[3 + 2], ref::e4m3_byte(224.f));
  EXPECT_EQ(r.q_t[6 + 0], 0x7e);                            // 0.5 by its own amax: 448
  const auto t = ref::float8_quantize({1.f, -4.f, 2.f, 0.f}, 2, 2, Float8Granularity::tensor, true);
  ASSERT_EQ(t.scale.size(), 1u);
  EXPECT_EQ(t.scale[0], 1.0f / 112.0f);
  EXPECT_EQ(t.scale_t, t.scale);
  EXPECT_EQ(t.q[1], 0xfe);
  EXPECT_EQ(t.q_t[1], t.q[2]);  // q_t[0][1] is x[1][0]
}

// Blocks: 1 x 128 of a row (a last one of fewer its own), 128 x 1 of a column, 128 x 128.
TEST(Float8QuantizeReference, Blocks) {
  const int64_t m = 130, k = 200;  // 2 x 2 blocks, the last ones partial
  std::vector<float> x(size_t(m * k), 0.f);
  x[0 * k + 5] = 7.f;      // row 0's first block, column 5's first
  x[0 * k + 150] = -3.f;   // row 0's second block
  x[129 * k + 5] = 14.f;   // column 5's second block (row 129)
  const auto b = ref::float8_quantize(x, m, k, Float8Granularity::block, true);
  ASSERT_EQ(b.scale.size(), size_t(m * 2));
  EXPECT_EQ(b.scale[0], 1.f / 64.f);
  EXPECT_EQ(b.scale[1], 1.f / float(448.0 / 3.0));
  EXPECT_FLOAT_EQ(b.scale[2], 1e-12f / 448.f);  // row 1: zeros
  EXPECT_EQ(b.scale[129 * 2], 1.f / 32.f);
  EXPECT_EQ(b.q[150], 0xfe);   // -3 by its own block's scale: -448
  ASSERT_EQ(b.scale_t.size(), size_t(2 * k));
  EXPECT_EQ(b.scale_t[5], 1.f / 64.f);       // column 5, rows 0..127
  EXPECT_EQ(b.scale_t[k + 5], 1.f / 32.f);  // column 5, rows 128..129
  EXPECT_EQ(b.q_t[5 * m + 0], 0x7e);          // x[0][5] by its column block: 448
  EXPECT_EQ(b.q_t[5 * m + 129], 0x7e);
  const std::vector<float> y(256 * 256, 1.f);
  std::vector<float> z = y;
  z[200 * 256 + 3] = 896.f;  // block (1, 0)
  const auto d = ref::float8_quantize(z, 256, 256, Float8Granularity::block2d, true);
  ASSERT_EQ(d.scale.size(), 4u);
  EXPECT_EQ(d.scale[0], 1.f / 448.f);
  EXPECT_EQ(d.scale[2], 2.f);
  EXPECT_EQ(d.scale_t, d.scale);
  EXPECT_EQ(d.q_t[3 * 256 + 200], d.q[200 * 256 + 3]);
}

TEST(Float8QuantizeOp, Description) {
  const tessera::OpDesc* d = tessera::find_op_description("float8_quantize");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->family, "matrix");
  ASSERT_EQ(d->schemas.size(), 3u);
  EXPECT_EQ(d->schemas[0], "float8_quantize(Tensor input, *, str granularity='row') -> (Tensor, Tensor)");
  EXPECT_EQ(d->schemas[1],
            "float8_quantize.columns(Tensor input, *, str granularity='row') -> (Tensor, Tensor, Tensor, Tensor)");
  EXPECT_EQ(d->schemas[2], "float8_quantize.transposed(Tensor input, *, str granularity='row') -> (Tensor, Tensor)");
  EXPECT_EQ(d->call, nullptr);  // outputs allocated by hand (python/src/torch/matrix.cpp)
  const tessera::OpDesc* g = tessera::find_op_description("float8_quantize_gated");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->family, "matrix");
  ASSERT_EQ(g->schemas.size(), 2u);
  EXPECT_EQ(g->schemas[1], "float8_quantize_gated.columns(Tensor gate, Tensor up, *, str activation='silu', "
                           "str granularity='row') -> (Tensor, Tensor, Tensor, Tensor)");
  EXPECT_EQ(g->call, nullptr);
}

TEST(Float8QuantizeChecks, NameTheArgument) {
  const TensorView x = cuda_tensor(0x10000, DType::bfloat16, {32, 64});
  const TensorView q = cuda_tensor(0x100000, DType::float8_e4m3fn, {32, 64});
  const TensorView s = cuda_tensor(0x200000, DType::float32, {32, 1});
  const TensorView qt = cuda_tensor(0x300000, DType::float8_e4m3fn, {64, 32});
  const TensorView st = cuda_tensor(0x400000, DType::float32, {1, 64});
  const auto row = Float8Granularity::row, tensor = Float8Granularity::tensor;
  const auto call = [](const TensorView& x_, const TensorView& q_, const TensorView& s_, const TensorView* qt_,
                       const TensorView* st_, Float8Granularity g) {
    tessera::float8_quantize(x_, q_, s_, qt_, st_, g, nullptr);
  };
  expect_error([&] { call(cuda_tensor(0x10000, DType::int32, {32, 64}), q, s, nullptr, nullptr, row); },
               ErrorKind::type, {"tessera.float8_quantize", "'input'", "bfloat16"});
  expect_error([&] { call(cuda_tensor(0x10000, DType::bfloat16, {2, 16, 64}), q, s, nullptr, nullptr, row); },
               ErrorKind::value, {"'input'", "2-d"});
  TensorView cpu = x;
  cpu.device = tessera::Device{tessera::DeviceType::cpu, 0};
  expect_error([&] { call(cpu, q, s, nullptr, nullptr, row); }, ErrorKind::value, {"'input'"});
  TensorView strided = x;
  strided.strides[1] = 2;
  expect_error([&] { call(strided, q, s, nullptr, nullptr, row); }, ErrorKind::value, {"'input'", "K contiguous"});
  expect_error([&] { call(cuda_tensor(0x10000, DType::bfloat16, {32, 0}), q, s, nullptr, nullptr, row); },
               ErrorKind::value, {"'input'", "1 <= K"});
  expect_error([&] { call(x, cuda_tensor(0x100000, DType::float8_e5m2, {32, 64}), s, nullptr, nullptr, row); },
               ErrorKind::type, {"'q'", "float8_e4m3fn"});
  expect_error([&] { call(x, cuda_tensor(0x100000, DType::float8_e4m3fn, {64, 32}), s, nullptr, nullptr, row); },
               ErrorKind::value, {"'q'", "[32, 64]"});
  expect_error([&] { call(x, cuda_tensor(0x100001, DType::float8_e4m3fn, {32, 64}), s, nullptr, nullptr, row); },
               ErrorKind::value, {"'q'", "16-byte aligned"});
  expect_error([&] { call(x, q, cuda_tensor(0x200000, DType::float32, {32}), nullptr, nullptr, row); },
               ErrorKind::value, {"'scale'", "[32, 1]"});
  expect_error([&] { call(x, q, cuda_tensor(0x200000, DType::bfloat16, {32, 1}), nullptr, nullptr, row); },
               ErrorKind::type, {"'scale'", "float32"});
  expect_error([&] { call(x, q, s, nullptr, nullptr, tensor); }, ErrorKind::value, {"'scale'", "one element"});
  // The transposed copy: both outputs or neither, their shapes, M and K multiples of 16.
  expect_error([&] { call(x, q, s, &qt, nullptr, row); }, ErrorKind::value, {"'scale_t'", "both or neither"});
  expect_error([&] { call(x, q, s, &q, &st, row); }, ErrorKind::value, {"'q_t'", "[64, 32]"});
  expect_error([&] { call(x, q, s, &qt, &s, row); }, ErrorKind::value, {"'scale_t'", "[1, 64]"});
  const TensorView x20 = cuda_tensor(0x10000, DType::float32, {20, 64});
  const TensorView q20 = cuda_tensor(0x100000, DType::float8_e4m3fn, {20, 64});
  const TensorView s20 = cuda_tensor(0x200000, DType::float32, {20, 1});
  const TensorView qt20 = cuda_tensor(0x300000, DType::float8_e4m3fn, {64, 20});
  expect_error([&] { call(x20, q20, s20, &qt20, &st, row); }, ErrorKind::value,
               {"'input'", "multiples of 16", "[20, 64]"});
  // The columns alone: their shapes, M and K multiples of 16.
  expect_error([&] { tessera::float8_quantize_transposed(x, q, st, row, nullptr); }, ErrorKind::value,
               {"'q_t'", "[64, 32]"});
  expect_error([&] { tessera::float8_quantize_transposed(x, qt, s, row, nullptr); }, ErrorKind::value,
               {"'scale_t'", "[1, 64]"});
  expect_error([&] { tessera::float8_quantize_transposed(x20, qt20, st, row, nullptr); }, ErrorKind::value,
               {"'input'", "multiples of 16", "[20, 64]"});
  const TensorView one = cuda_tensor(0x200000, DType::float32, {});
  expect_error([&] { call(x, q, one, &qt, &st, tensor); }, ErrorKind::value, {"'scale_t'", "one element"});
  const TensorView inside = cuda_tensor(0x10000 + 64, DType::float8_e4m3fn, {32, 64});  // overlaps the input
  expect_error([&] { call(x, inside, s, nullptr, nullptr, row); }, ErrorKind::value, {"'q'", "'input'"});
  // Blocks: scale [M, K / 128] and scale_t [M / 128, K] (block), [M / 128, K / 128] (block2d,
  // whole blocks only).
  const auto block = Float8Granularity::block, block2d = Float8Granularity::block2d;
  expect_error([&] { call(x, q, cuda_tensor(0x200000, DType::float32, {32, 2}), nullptr, nullptr, block); },
               ErrorKind::value, {"'scale'", "[32, 1]", "got 2-d [32, 2]"});
  const TensorView x256 = cuda_tensor(0x10000, DType::bfloat16, {256, 384});
  const TensorView q256 = cuda_tensor(0x100000, DType::float8_e4m3fn, {256, 384});
  const TensorView qt256 = cuda_tensor(0x300000, DType::float8_e4m3fn, {384, 256});
  const TensorView s23 = cuda_tensor(0x200000, DType::float32, {2, 3});
  expect_error([&] { call(x256, q256, s23, nullptr, nullptr, block); }, ErrorKind::value, {"'scale'", "[256, 3]"});
  expect_error([&] { call(x256, q256, s23, &qt256, &s23, block); }, ErrorKind::value, {"'scale'", "[256, 3]"});
  expect_error([&] { call(x256, q256, cuda_tensor(0x200000, DType::float32, {256, 3}), &qt256, &s23, block); },
               ErrorKind::value, {"'scale_t'", "[2, 384]"});
  expect_error([&] { call(x256, q256, cuda_tensor(0x200000, DType::float32, {256, 3}), nullptr, nullptr, block2d); },
               ErrorKind::value, {"'scale'", "[2, 3]"});
  const TensorView s32 = cuda_tensor(0x400000, DType::float32, {3, 2});
  expect_error([&] { call(x256, q256, s23, &qt256, &s32, block2d); },
               ErrorKind::value, {"'scale_t'", "[2, 3]"});
  expect_error([&] { call(x, q, cuda_tensor(0x200000, DType::float32, {1, 1}), nullptr, nullptr, block2d); },
               ErrorKind::value, {"'input'", "multiples of 128", "[32, 64]"});
  Float8Granularity g;
  expect_error([&] { tessera::parse("float8_quantize", "blocks", g); }, ErrorKind::value,
               {"'granularity'", "'row', 'tensor', 'block' or 'block2d'", "'blocks'"});
  tessera::parse("float8_quantize", "tensor", g);
  EXPECT_EQ(g, Float8Granularity::tensor);
  tessera::parse("float8_quantize", "block2d", g);
  EXPECT_EQ(g, Float8Granularity::block2d);
  // Rows alone and one scale take any M and K; no rows is nothing to do, checked all the same.
  call(cuda_tensor(0x10000, DType::bfloat16, {0, 64}), cuda_tensor(0x100000, DType::float8_e4m3fn, {0, 64}),
       cuda_tensor(0x200000, DType::float32, {0, 1}), nullptr, nullptr, row);
}

TEST(Float8QuantizeChecks, GatedNamesTheArgument) {
  const TensorView gate = cuda_tensor(0x10000, DType::bfloat16, {32, 64});
  const TensorView up = cuda_tensor(0x20000, DType::bfloat16, {32, 64});
  const TensorView q = cuda_tensor(0x100000, DType::float8_e4m3fn, {32, 64});
  const TensorView s = cuda_tensor(0x200000, DType::float32, {32, 1});
  const TensorView qt = cuda_tensor(0x300000, DType::float8_e4m3fn, {64, 32});
  const TensorView st = cuda_tensor(0x400000, DType::float32, {1, 64});
  const auto call = [&](const TensorView& g_, const TensorView& u_, tessera::Activation a, const TensorView& q_) {
    tessera::float8_quantize_gated(g_, u_, a, q_, s, &qt, &st, Float8Granularity::row, nullptr);
  };
  const auto silu = tessera::Activation::silu;
  expect_error([&] { call(cuda_tensor(0x10000, DType::int32, {32, 64}), up, silu, q); }, ErrorKind::type,
               {"tessera.float8_quantize_gated", "'gate'", "bfloat16"});
  expect_error([&] { call(gate, cuda_tensor(0x20000, DType::float16, {32, 64}), silu, q); }, ErrorKind::type,
               {"tessera.float8_quantize_gated", "'up'"});
  expect_error([&] { call(gate, cuda_tensor(0x20000, DType::bfloat16, {32, 32}), silu, q); }, ErrorKind::value,
               {"'up'"});
  TensorView padded = up;
  padded.strides[0] = 72;
  expect_error([&] { call(gate, padded, silu, q); }, ErrorKind::value, {"'up'", "gate's strides (64, 1)", "(72, 1)"});
  expect_error([&] { call(gate, up, tessera::Activation::relu, q); }, ErrorKind::value,
               {"'activation'", "'silu' or 'gelu_tanh'", "'relu'"});
  expect_error([&] { call(gate, up, silu, cuda_tensor(0x100000, DType::float8_e4m3fn, {64, 32})); }, ErrorKind::value,
               {"tessera.float8_quantize_gated", "'q'", "[32, 64]"});
  const TensorView over_up = cuda_tensor(0x20000 + 64, DType::float8_e4m3fn, {32, 64});  // overlaps up
  expect_error([&] { call(gate, up, silu, over_up); }, ErrorKind::value, {"'q'", "'up'"});
}

// Device bytes of a buffer.
std::vector<uint8_t> download(const tessera::runtime::DeviceBuffer& b, size_t n) {
  std::vector<uint8_t> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), b.data(), n, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

std::vector<uint8_t> as_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Each kernel (rows alone; the tiles with the transposed copy, per row and per tensor; the block
// kernel) on a stream of its own, twice: the reference's bytes both times.
TEST(Float8QuantizeGpu, EachKernelMatchesTheReferenceOnAStream) {
  TESSERA_REQUIRE_GPU();
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  const int64_t m = 256, k = 384;  // whole 128 x 128 blocks, for block2d
  std::vector<float> x(size_t(m * k));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.37f) * float(1 + i % 29) * 3.f;
  x[5 * k + 7] = std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < k; ++j) x[size_t(9 * k + j)] = 0.f;
  tessera::runtime::DeviceBuffer bx(x.size() * 4), bq(x.size()), bqt(x.size()), bs(m * 4 * 4), bst(k * 4 * 4);
  ASSERT_EQ(cudaMemcpy(bx.data(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const TensorView tx = TensorView::contiguous(bx.data(), DType::float32, {m, k}, dev);
  const TensorView tq = TensorView::contiguous(bq.data(), DType::float8_e4m3fn, {m, k}, dev);
  const TensorView tqt = TensorView::contiguous(bqt.data(), DType::float8_e4m3fn, {k, m}, dev);
  using G = Float8Granularity;
  for (G g : {G::row, G::tensor, G::block, G::block2d})
    for (int mode : {0, 1, 2}) {  // rows; rows and columns; the columns alone
      const bool columns = mode > 0, rows = mode < 2;
      SCOPED_TRACE(std::to_string(int(g)) + (columns ? rows ? " columns" : " columns only" : ""));
      const auto scales = [&](void* p, int64_t a, int64_t b) {
        return g == G::tensor ? TensorView::contiguous(p, DType::float32, {}, dev)
                              : TensorView::contiguous(p, DType::float32, {a, b}, dev);
      };
      const int64_t mb = m / 128, kb = k / 128;
      const TensorView ts = g == G::block ? scales(bs.data(), m, kb) : g == G::block2d ? scales(bs.data(), mb, kb)
                                                                                       : scales(bs.data(), m, 1);
      const TensorView tst = g == G::block ? scales(bst.data(), mb, k) : g == G::block2d ? scales(bst.data(), mb, kb)
                                                                                         : scales(bst.data(), 1, k);
      const auto want = ref::float8_quantize(x, m, k, g, columns);
      for (int run = 0; run < 2; ++run) {
        ASSERT_EQ(cudaMemset(bq.data(), 0xa5, x.size()), cudaSuccess);
        ASSERT_EQ(cudaMemset(bqt.data(), 0xa5, x.size()), cudaSuccess);
        if (rows)
          tessera::float8_quantize(tx, tq, ts, columns ? &tqt : nullptr, columns ? &tst : nullptr, g, stream);
        else
          tessera::float8_quantize_transposed(tx, tqt, tst, g, stream);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        if (rows) {
          EXPECT_EQ(download(bq, x.size()), want.q);
          EXPECT_EQ(download(bs, want.scale.size() * 4), as_bytes(want.scale));
        }
        if (columns) {
          EXPECT_EQ(download(bqt, x.size()), want.q_t);
          EXPECT_EQ(download(bst, want.scale_t.size() * 4), as_bytes(want.scale_t));
        }
      }
    }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(Float8QuantizeChecks, GatedBackwardNamesTheArgument) {
  const TensorView dy = cuda_tensor(0x10000, DType::bfloat16, {32, 64});
  const TensorView gate = cuda_tensor(0x20000, DType::bfloat16, {32, 64});
  const TensorView up = cuda_tensor(0x30000, DType::bfloat16, {32, 64});
  const TensorView dg = cuda_tensor(0x40000, DType::bfloat16, {32, 64});
  const TensorView du = cuda_tensor(0x50000, DType::bfloat16, {32, 64});
  const TensorView q = cuda_tensor(0x100000, DType::float8_e4m3fn, {32, 64});
  const TensorView s = cuda_tensor(0x200000, DType::float32, {32, 1});
  const TensorView q2 = cuda_tensor(0x300000, DType::float8_e4m3fn, {32, 64});
  const TensorView s2 = cuda_tensor(0x400000, DType::float32, {32, 1});
  using tessera::Activation;
  using tessera::Float8Copy;
  const auto call = [&](const TensorView& g, const TensorView& grad_gate, const Float8Copy& cg, Activation act,
                        Float8Granularity gr) {
    tessera::float8_quantize_gated_backward(dy, g, up, act, grad_gate, du, cg, Float8Copy{q2, s2}, gr, nullptr);
  };
  const std::string op = "tessera.float8_quantize_gated_backward";
  const Float8Copy cg{q, s};
  expect_error([&] { call(gate, dg, cg, Activation::silu, Float8Granularity::block); }, ErrorKind::value,
               {op, "'granularity'", "'row' or 'tensor'"});
  expect_error([&] { call(gate, dg, cg, Activation::relu, Float8Granularity::row); }, ErrorKind::value,
               {op, "'activation'", "'silu' or 'gelu_tanh'"});
  expect_error([&] { call(cuda_tensor(0x20000, DType::bfloat16, {32, 32}), dg, cg, Activation::silu,
                          Float8Granularity::row); },
               ErrorKind::value, {op, "'gate'"});
  expect_error([&] { call(gate, cuda_tensor(0x40000, DType::float16, {32, 64}), cg, Activation::silu,
                          Float8Granularity::row); },
               ErrorKind::type, {op, "'grad_gate'"});
  expect_error([&] { call(gate, dg, Float8Copy{q, cuda_tensor(0x200000, DType::float32, {64, 1})}, Activation::silu,
                          Float8Granularity::row); },
               ErrorKind::value, {op, "'scale'"});
  expect_error([&] { call(gate, dg, Float8Copy{q2, s}, Activation::silu, Float8Granularity::row); },
               ErrorKind::value, {op, "overlap"});  // grad_gate's q over grad_up's
}

// float8_quantize_gated_backward against the gated backward op then float8_quantize on each
// gradient, bit for bit: both activations, rows and tensor, bf16 and fp16, a shape with partial
// tiles and strips, an inf in one gradient.
TEST(Float8QuantizeGpu, GatedBackwardIsTheTwoOps) {
  TESSERA_REQUIRE_GPU();
  using tessera::Activation;
  using tessera::Float8Copy;
  using G = Float8Granularity;
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  for (DType dt : {DType::bfloat16, DType::float16})
    for (const auto& [m, k] : {std::pair<int64_t, int64_t>{256, 768}, {48, 272}})
      for (Activation act : {Activation::silu, Activation::gelu_tanh})
        for (G g : {G::row, G::tensor}) {
          SCOPED_TRACE(std::string(tessera::dtype_name(dt)) + " " + std::to_string(m) + " x " + std::to_string(k) +
                       " " + tessera::activation_name(act) + (g == G::row ? " row" : " tensor"));
          const int64_t n = m * k;
          std::vector<uint16_t> host(size_t(3 * n));
          for (size_t i = 0; i < host.size(); ++i) {  // finite 16-bit values of moderate size, both signs
            const uint16_t exp_bits = dt == DType::bfloat16 ? uint16_t((120 + i % 12) << 7) : uint16_t((10 + i % 8) << 10);
            host[i] = uint16_t(exp_bits | (i * 2654435761u >> 20 & (dt == DType::bfloat16 ? 0x7f : 0x3ff)) |
                               (i % 3 == 0 ? 0x8000 : 0));
          }
          host[size_t(5 * k + 3)] = dt == DType::bfloat16 ? 0x7f80 : 0x7c00;  // an inf in grad_output
          tessera::runtime::DeviceBuffer in(size_t(3 * n) * 2), outs(size_t(4 * n) * 2), q(size_t(4 * n)),
              sc(size_t(4 * (m + k)) * 4);
          ASSERT_EQ(cudaMemcpy(in.data(), host.data(), host.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
          const auto t = [&](void* p, DType d, std::vector<int64_t> shape) {
            return TensorView::make(p, d, shape.data(), nullptr, int(shape.size()), dev);
          };
          auto* ib = static_cast<uint8_t*>(in.data());
          auto* ob = static_cast<uint8_t*>(outs.data());
          auto* qb = static_cast<uint8_t*>(q.data());
          auto* sb = static_cast<float*>(sc.data());
          const TensorView dy = t(ib, dt, {m, k}), gate = t(ib + 2 * n, dt, {m, k}), up = t(ib + 4 * n, dt, {m, k});
          // [0]: fused, [1]: the two ops; each a gate's and an up's gradient, copies and scales
          std::vector<TensorView> grads, qs, qts, ss, sts;
          tessera::runtime::DeviceBuffer qt(size_t(4 * n));
          for (int i = 0; i < 4; ++i) {
            grads.push_back(t(ob + i * 2 * n, dt, {m, k}));
            qs.push_back(t(qb + i * n, DType::float8_e4m3fn, {m, k}));
            qts.push_back(t(static_cast<uint8_t*>(qt.data()) + i * n, DType::float8_e4m3fn, {k, m}));
          }
          for (int i = 0; i < 4; ++i) {
            float* p = sb + i * (m + k);
            ss.push_back(g == G::tensor ? t(p, DType::float32, {}) : t(p, DType::float32, {m, 1}));
            sts.push_back(g == G::tensor ? t(p + m, DType::float32, {}) : t(p + m, DType::float32, {1, k}));
          }
          ASSERT_EQ(cudaMemset(q.data(), 0xa5, size_t(4 * n)), cudaSuccess);
          ASSERT_EQ(cudaMemset(qt.data(), 0xa5, size_t(4 * n)), cudaSuccess);
          tessera::float8_quantize_gated_backward(dy, gate, up, act, grads[0], grads[1],
                                                  Float8Copy{qs[0], ss[0], &qts[0], &sts[0]},
                                                  Float8Copy{qs[1], ss[1], &qts[1], &sts[1]}, g, nullptr);
          if (act == Activation::silu) tessera::silu_mul_backward(dy, gate, up, grads[2], grads[3], nullptr);
          else tessera::geglu_backward(dy, gate, up, grads[2], grads[3], nullptr);
          for (int i = 2; i < 4; ++i) tessera::float8_quantize(grads[i], qs[i], ss[i], &qts[i], &sts[i], g, nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const auto bytes = [&](const void* p, size_t size) {
            std::vector<uint8_t> h(size);
            EXPECT_EQ(cudaMemcpy(h.data(), p, size, cudaMemcpyDeviceToHost), cudaSuccess);
            return h;
          };
          const size_t scale_n = g == G::tensor ? 4 : size_t(m) * 4, scale_t_n = g == G::tensor ? 4 : size_t(k) * 4;
          for (int i = 0; i < 2; ++i) {
            SCOPED_TRACE(i ? "grad_up" : "grad_gate");
            EXPECT_EQ(bytes(grads[i].data, size_t(n) * 2), bytes(grads[i + 2].data, size_t(n) * 2));
            EXPECT_EQ(bytes(qs[i].data, size_t(n)), bytes(qs[i + 2].data, size_t(n)));
            EXPECT_EQ(bytes(qts[i].data, size_t(n)), bytes(qts[i + 2].data, size_t(n)));
            EXPECT_EQ(bytes(ss[i].data, scale_n), bytes(ss[i + 2].data, scale_n));
            EXPECT_EQ(bytes(sts[i].data, scale_t_n), bytes(sts[i + 2].data, scale_t_n));
          }
        }
}

}  // namespace
