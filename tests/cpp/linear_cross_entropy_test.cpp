// linear_cross_entropy: the argument checks (no GPU), and on the GPU what the verify cases (run in
// VerifyGpu) do not: no tokens at all, and the workspace deciding the chunk.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gpu.hpp"
#include "runtime/memory.hpp"
#include "tessera/ops/loss.hpp"
#include "testing.hpp"

namespace {

using tessera::DType;
using tessera::ErrorKind;
using tessera::TensorView;
using tessera::testing::cuda_tensor;
using tessera::testing::expect_error;

TEST(LinearCrossEntropyChecks, NameTheArgument) {
  const TensorView h = cuda_tensor(0x1000, DType::bfloat16, {8, 64});
  const TensorView w = cuda_tensor(0x100000, DType::bfloat16, {100, 64});
  const TensorView t = cuda_tensor(0x200000, DType::int64, {8});
  const TensorView l = cuda_tensor(0x300000, DType::float32, {});
  const auto run = [&](const TensorView& hh, const TensorView& ww, const TensorView* b, const TensorView& tt,
                       const TensorView& ll, const tessera::LinearCrossEntropyGrads& g,
                       const tessera::LinearCrossEntropyOptions& o) {
    tessera::linear_cross_entropy(hh, ww, b, tt, ll, nullptr, g, o, nullptr);
  };
  expect_error([&] { run(h, cuda_tensor(0x100000, DType::bfloat16, {100, 32}), nullptr, t, l, {}, {}); },
               ErrorKind::value, {"tessera.linear_cross_entropy", "'weight'", "H = 64"});
  expect_error([&] { run(h, cuda_tensor(0x100000, DType::float16, {100, 64}), nullptr, t, l, {}, {}); },
               ErrorKind::type, {"'weight'"});
  expect_error([&] { run(h, w, nullptr, cuda_tensor(0x200000, DType::int64, {7}), l, {}, {}); }, ErrorKind::value,
               {"'target'", "N = 8"});
  const TensorView b = cuda_tensor(0x400000, DType::bfloat16, {99});
  expect_error([&] { run(h, w, &b, t, l, {}, {}); }, ErrorKind::value, {"'bias'", "V = 100"});
  expect_error([&] { run(h, w, nullptr, t, cuda_tensor(0x300000, DType::float32, {8}), {}, {}); }, ErrorKind::value,
               {"'loss'", "0-d"});
  tessera::LinearCrossEntropyGrads g;
  const TensorView dw = cuda_tensor(0x500000, DType::bfloat16, {100, 32});
  g.d_weight = &dw;
  expect_error([&] { run(h, w, nullptr, t, l, g, {}); }, ErrorKind::value, {"'d_weight'"});
  const TensorView dw16 = cuda_tensor(0x500000, DType::float16, {100, 64});  // bf16 or float32 only
  g.d_weight = &dw16;
  expect_error([&] { run(h, w, nullptr, t, l, g, {}); }, ErrorKind::type, {"'d_weight'", "float32"});
  g = {};
  const TensorView dh_over = cuda_tensor(0x1000, DType::bfloat16, {8, 64});
  g.d_hidden = &dh_over;
  expect_error([&] { run(h, w, nullptr, t, l, g, {}); }, ErrorKind::value, {"'d_hidden'", "'hidden'"});
  g = {};
  const TensorView gl = cuda_tensor(0x600000, DType::float32, {8});
  g.grad_loss = &gl;
  expect_error([&] { run(h, w, nullptr, t, l, g, {}); }, ErrorKind::value, {"'grad_loss'", "0-d"});
  tessera::LinearCrossEntropyOptions o;
  const TensorView small = cuda_tensor(0x700000, DType::bfloat16, {99});
  o.workspace = &small;
  expect_error([&] { run(h, w, nullptr, t, l, {}, o); }, ErrorKind::value, {"'workspace'", "V = 100"});
  const TensorView overlapping = cuda_tensor(0x100000, DType::bfloat16, {200});
  o.workspace = &overlapping;
  expect_error([&] { run(h, w, nullptr, t, l, {}, o); }, ErrorKind::value, {"'workspace'", "'weight'"});
  o = {};
  o.chunk_rows = -1;
  expect_error([&] { run(h, w, nullptr, t, l, {}, o); }, ErrorKind::value, {"'chunk_rows'"});
}

std::vector<float> download(const void* p, size_t n) {
  std::vector<float> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(LinearCrossEntropyGpu, NoTokensAndAOneRowWorkspace) {
  TESSERA_REQUIRE_GPU();
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  const int64_t n = 3, h = 4, v = 5;
  tessera::runtime::DeviceBuffer bh(n * h * 4), bw(v * h * 4), bb(v * 4), bt(n * 8), bl(4), bdh(n * h * 4),
      bdw(v * h * 4), bdb(v * 4), bws(v * 4);
  const std::vector<float> hid(size_t(n * h), 0.25f), wt(size_t(v * h), 0.5f), poison(size_t(v * h), NAN);
  const std::vector<int64_t> tg = {0, 4, 2};
  ASSERT_EQ(cudaMemcpy(bh.data(), hid.data(), hid.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(bw.data(), wt.data(), wt.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(bb.data(), wt.data(), v * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(bt.data(), tg.data(), n * 8, cudaMemcpyHostToDevice), cudaSuccess);
  const TensorView w = TensorView::contiguous(bw.data(), DType::float32, {v, h}, dev);
  const TensorView b = TensorView::contiguous(bb.data(), DType::float32, {v}, dev);
  const TensorView loss = TensorView::contiguous(bl.data(), DType::float32, {}, dev);
  const TensorView dw = TensorView::contiguous(bdw.data(), DType::float32, {v, h}, dev);
  const TensorView db = TensorView::contiguous(bdb.data(), DType::float32, {v}, dev);
  tessera::LinearCrossEntropyGrads g;
  g.d_weight = &dw, g.d_bias = &db;

  // No tokens: the mean is NaN (0 / 0, as torch), d_weight and d_bias 0.
  ASSERT_EQ(cudaMemcpy(bdw.data(), poison.data(), poison.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(bdb.data(), poison.data(), v * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const TensorView none_h = TensorView::contiguous(bh.data(), DType::float32, {0, h}, dev);
  const TensorView none_t = TensorView::contiguous(bt.data(), DType::int64, {0}, dev);
  tessera::linear_cross_entropy(none_h, w, &b, none_t, loss, nullptr, g, {}, nullptr);
  EXPECT_TRUE(std::isnan(download(bl.data(), 1)[0]));
  for (float x : download(bdw.data(), size_t(v * h))) EXPECT_EQ(x, 0.0f);
  for (float x : download(bdb.data(), size_t(v))) EXPECT_EQ(x, 0.0f);

  // Equal logits (every weight row the same): loss log V; a workspace of one row runs three chunks,
  // and d_bias = (sum over rows of softmax - one-hot) / N.
  const TensorView hidden = TensorView::contiguous(bh.data(), DType::float32, {n, h}, dev);
  const TensorView target = TensorView::contiguous(bt.data(), DType::int64, {n}, dev);
  const TensorView ws = TensorView::contiguous(bws.data(), DType::float32, {v}, dev);
  tessera::LinearCrossEntropyOptions o;
  o.workspace = &ws;
  tessera::linear_cross_entropy(hidden, w, &b, target, loss, nullptr, g, o, nullptr);
  EXPECT_NEAR(download(bl.data(), 1)[0], std::log(double(v)), 1e-5);
  const auto dbias = download(bdb.data(), size_t(v));
  for (int64_t c = 0; c < v; ++c) {
    const double hits = double((c == 0) + (c == 4) + (c == 2));
    EXPECT_NEAR(dbias[size_t(c)], (double(n) / double(v) - hits) / double(n), 1e-6) << c;
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
