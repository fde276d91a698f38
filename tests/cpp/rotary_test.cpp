// rotary_embedding's argument checks (CPU: fake device pointers; no launch happens before they
// pass). Its results are checked on the GPU by its verify cases (harness/ops/attention).
#include <gtest/gtest.h>

#include "tessera/ops/attention.hpp"
#include "testing.hpp"

namespace {

using tessera::DType;
using tessera::ErrorKind;
using tessera::RotaryLayout;
using tessera::TensorView;
using tessera::testing::cuda_tensor;
using tessera::testing::expect_error;

struct Call {
  TensorView q = cuda_tensor(0x1000000, DType::bfloat16, {2, 8, 4, 64});
  TensorView k = cuda_tensor(0x2000000, DType::bfloat16, {2, 8, 2, 64});
  TensorView cos = cuda_tensor(0x3000000, DType::float32, {8, 32});
  TensorView sin = cuda_tensor(0x4000000, DType::float32, {8, 32});
  TensorView q_out = cuda_tensor(0x5000000, DType::bfloat16, {2, 8, 4, 64});
  TensorView k_out = cuda_tensor(0x6000000, DType::bfloat16, {2, 8, 2, 64});
  int64_t offset = 0;
  void forward() const {
    tessera::rotary_embedding(q, k, cos, sin, RotaryLayout::bshd, false, offset, nullptr, q_out, k_out);
  }
  void backward() const {
    tessera::rotary_embedding_backward(q, k, cos, sin, RotaryLayout::bshd, false, offset, nullptr, q_out, k_out);
  }
};

TEST(Rotary, ErrorsNameTheArgument) {
  Call c;
  c.q = cuda_tensor(0x1000000, DType::bfloat16, {2, 8, 64});
  expect_error([&] { c.forward(); }, ErrorKind::value, {"tessera.rotary_embedding", "'q'", "4-d"});
  c = Call{};
  c.k = cuda_tensor(0x2000000, DType::bfloat16, {2, 8, 2, 32});
  expect_error([&] { c.forward(); }, ErrorKind::value, {"'k'", "head_dim"});
  c = Call{};
  c.cos = cuda_tensor(0x3000000, DType::float16, {8, 32});
  expect_error([&] { c.forward(); }, ErrorKind::type, {"'cos'", "float32", "bfloat16"});
  c = Call{};
  c.offset = 3;  // positions 3 .. 10 of 8 rows
  expect_error([&] { c.forward(); }, ErrorKind::value, {"'cos'", "11"});
  c = Call{};
  c.cos = c.sin = cuda_tensor(0x3000000, DType::float32, {8, 40});  // rotary_dim 80 > head_dim 64
  expect_error([&] { c.forward(); }, ErrorKind::value, {"'cos'", "rotary_dim"});
  c = Call{};
  c.k_out = c.q_out;
  expect_error([&] { c.forward(); }, ErrorKind::value, {"'k_out'"});
}

TEST(Rotary, BackwardErrorsNameItsOwnArguments) {
  Call c;
  c.k = cuda_tensor(0x2000000, DType::float16, {2, 8, 2, 64});
  expect_error([&] { c.backward(); }, ErrorKind::type, {"tessera.rotary_embedding_backward", "'grad_k'", "'grad_q'"});
}

TEST(Rotary, LayoutNames) {
  RotaryLayout l{};
  tessera::parse("rotary_embedding", "bhsd", l);
  EXPECT_EQ(l, RotaryLayout::bhsd);
  expect_error([&] { tessera::parse("rotary_embedding", "sbhd", l); }, ErrorKind::value,
               {"'layout'", "'bshd' or 'bhsd'", "'sbhd'"});
}

}  // namespace
