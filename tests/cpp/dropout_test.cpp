// Dropout and copy: Philox known answers, reference semantics and statistics, argument checks
// (CPU); every verify case of dropout / dropout_backward / copy, determinism, counter arithmetic,
// mask statistics and the backward's mask (GPU).
#include <gtest/gtest.h>

#include <cuda_bf16.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "testing.hpp"
#include "ops/elementwise/dropout_reference.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "bench/host.hpp"
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

// Uniform of a word as the contract defines it: the top 24 bits times 2^-24.
float uniform(uint32_t w) { return static_cast<float>(w >> 8) / 16777216.0f; }

// ---- Philox known answers (the Random123 distribution's kat_vectors, philox4x32_10) ------------
TEST(Philox, KnownAnswers) {
  using W4 = std::array<uint32_t, 4>;
  EXPECT_EQ(ref::philox4x32_10({0, 0, 0, 0}, {0, 0}), (W4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(ref::philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (W4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(ref::philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (W4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// Elements 0..3 of a call with seed 0 at offset 0 draw the words of the first known answer:
// uniforms 0.399, 0.880, 0.736, 0.605.
TEST(DropoutReference, KeepFollowsTheKnownAnswer) {
  const std::array<uint32_t, 4> words = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
  for (double p : {0.0, 0.3, 0.5, 0.7, 0.9, 1.0})
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(ref::dropout_keep(0, 0, i, p), uniform(words[i]) >= static_cast<float>(p)) << "p=" << p << " i=" << i;
  EXPECT_FALSE(ref::dropout_keep(0, 0, 0, 0.5));
  EXPECT_TRUE(ref::dropout_keep(0, 0, 1, 0.5));
  EXPECT_FALSE(ref::dropout_keep(0, 0, 3, 0.7));
}

// Counter = offset + i / 4 as one 64-bit value, low word first; key = seed, low word first.
TEST(DropoutReference, CounterAndKeyLayout) {
  const uint64_t seed = 0x299f31d0a4093822ull, offset = 0x00000005fffffffeull;
  for (int64_t i : {0, 3, 4, 9, 1000}) {
    const uint64_t c = offset + static_cast<uint64_t>(i) / 4;
    const auto w = ref::philox4x32_10({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0, 0},
                                      {0xa4093822, 0x299f31d0});
    for (double p : {0.25, 0.5, 0.75})
      EXPECT_EQ(ref::dropout_keep(seed, offset, i, p), uniform(w[i % 4]) >= static_cast<float>(p)) << i;
  }
  // A call that starts dropout_offset_increment(k) counters later sees element i - k as the
  // earlier call saw element i (k a multiple of 4): that is what lets a caller split a tensor.
  for (int64_t i = 64; i < 256; ++i)
    EXPECT_EQ(ref::dropout_keep(7, 100, i, 0.5),
              ref::dropout_keep(7, 100 + tessera::dropout_offset_increment(64), i - 64, 0.5));
}

TEST(DropoutReference, Scale) {
  EXPECT_EQ(ref::dropout_scale(0.0), 1.0f);
  EXPECT_EQ(ref::dropout_scale(0.5), 2.0f);
  EXPECT_EQ(ref::dropout_scale(0.1), static_cast<float>(1.0 / 0.9));
  EXPECT_EQ(ref::dropout_scale(1.0), 0.0f);
  EXPECT_EQ(ref::dropout_scale(1.0 - 1e-9), 0.0f);  // p rounds to 1 in float: nothing is kept
}

TEST(DropoutReference, ZeroAndOneAndScaling) {
  std::vector<float> x(1001);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f + 0.01f * static_cast<float>(i);
  auto xv = TensorView::contiguous(x.data(), DType::float32, {1001}, kCpu);
  const auto copy = ref::dropout(xv, 0.0, 123, 456);
  const auto zeros = ref::dropout(xv, 1.0, 123, 456);
  const auto half = ref::dropout(xv, 0.5, 123, 456);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(copy[i], x[i]);
    EXPECT_EQ(zeros[i], 0.0);
    EXPECT_TRUE(half[i] == 0.0 || half[i] == 2.0 * x[i]) << i;
    EXPECT_EQ(half[i] != 0.0, ref::dropout_keep(123, 456, static_cast<int64_t>(i), 0.5)) << i;
  }
  EXPECT_EQ(ref::dropout_backward(xv, 0.5, 123, 456), half);  // the same mask and scale
}

// The mask follows the logical index: a transposed view gives what a contiguous copy of the same
// logical values gives.
TEST(DropoutReference, MaskFollowsTheLogicalIndex) {
  const int rows = 37, cols = 23;
  std::vector<float> storage(rows * cols), logical(rows * cols);
  for (int i = 0; i < rows * cols; ++i) storage[i] = 1.0f + static_cast<float>(i);
  // View [rows, cols] with strides (1, rows): element (r, c) at storage[c * rows + r].
  auto t = TensorView::strided(storage.data(), DType::float32, {rows, cols}, {1, rows}, kCpu);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) logical[r * cols + c] = storage[c * rows + r];
  auto l = TensorView::contiguous(logical.data(), DType::float32, {rows, cols}, kCpu);
  EXPECT_EQ(ref::dropout(t, 0.3, 9, 1), ref::dropout(l, 0.3, 9, 1));
}

// Kept fraction within 4 sigma of 1 - p, and masks at different offsets or seeds agree only as
// often as independent masks do (p^2 + (1 - p)^2).
TEST(DropoutReference, Statistics) {
  const int64_t n = int64_t(1) << 20;
  for (double p : {0.1, 0.5, 0.9}) {
    int64_t kept = 0, same_offset = 0, same_seed = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool k = ref::dropout_keep(42, 1000, i, p);
      kept += k;
      same_offset += k == ref::dropout_keep(42, 1001 + static_cast<uint64_t>(n), i, p);
      same_seed += k == ref::dropout_keep(43, 1000, i, p);
    }
    const double sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(static_cast<double>(kept) / n, 1 - p, 4 * sigma) << "p=" << p;
    const double agree = p * p + (1 - p) * (1 - p), s2 = std::sqrt(agree * (1 - agree) / n);
    EXPECT_NEAR(static_cast<double>(same_offset) / n, agree, 4 * s2) << "p=" << p;
    EXPECT_NEAR(static_cast<double>(same_seed) / n, agree, 4 * s2) << "p=" << p;
  }
}

TEST(DropoutOffset, Increment) {
  EXPECT_EQ(tessera::dropout_offset_increment(0), 0u);
  EXPECT_EQ(tessera::dropout_offset_increment(1), 1u);
  EXPECT_EQ(tessera::dropout_offset_increment(4), 1u);
  EXPECT_EQ(tessera::dropout_offset_increment(5), 2u);
  EXPECT_EQ(tessera::dropout_offset_increment((int64_t(1) << 31) + 17), (uint64_t(1) << 29) + 5);
  EXPECT_EQ(tessera::dropout_offset_increment(std::numeric_limits<int64_t>::max()), uint64_t(1) << 61);
  expect_error([] { tessera::dropout_offset_increment(-1); }, ErrorKind::value,
               {"tessera.dropout_offset_increment: argument 'numel'", "got -1"});
}

// ---- argument checks (no GPU needed: they run before any CUDA call) ---------------------------
TEST(DropoutChecks, ProbabilityOutOfRange) {
  auto x = cuda_tensor(0x1000, DType::float32, {64});
  auto o = cuda_tensor(0x9000, DType::float32, {64});
  for (double p : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::infinity()})
    expect_error([&] { tessera::dropout(x, o, p, 1, 0, nullptr); }, ErrorKind::value,
                 {"tessera.dropout: argument 'p'", "expected a probability in [0, 1]", "got "});
  expect_error([&] { tessera::dropout(x, o, -0.1, 1, 0, nullptr); }, ErrorKind::value,
               {"tessera.dropout: argument 'p': expected a probability in [0, 1], got -0.1"});
  expect_error([&] { tessera::dropout(x, o, 1.0000001, 1, 0, nullptr); }, ErrorKind::value, {"got 1.0000001"});
  expect_error([&] { tessera::dropout(x, o, std::numeric_limits<double>::quiet_NaN(), 1, 0, nullptr); },
               ErrorKind::value, {"got nan"});
  expect_error([&] { tessera::dropout_backward(x, o, -1.0, 1, 0, nullptr); }, ErrorKind::value,
               {"tessera.dropout_backward: argument 'p'", "got -1"});
  // Checked before the empty-tensor early return, too.
  auto empty = TensorView::contiguous(nullptr, DType::float32, {0, 3});
  expect_error([&] { tessera::dropout(empty, empty, 2.0, 1, 0, nullptr); }, ErrorKind::value, {"argument 'p'"});
}

TEST(DropoutChecks, DtypesAndShapes) {
  auto i32 = cuda_tensor(0x1000, DType::int32, {4});
  expect_error([&] { tessera::dropout(i32, i32, 0.5, 1, 0, nullptr); }, ErrorKind::type,
               {"tessera.dropout: argument 'input'", "dtype in {float32, float16, bfloat16}", "got int32"});
  auto f64 = cuda_tensor(0x1000, DType::float64, {4});
  expect_error([&] { tessera::dropout_backward(f64, f64, 0.5, 1, 0, nullptr); }, ErrorKind::type,
               {"tessera.dropout_backward: argument 'grad_output'", "got float64"});
  auto x = cuda_tensor(0x1000, DType::bfloat16, {8, 4});
  auto o16 = cuda_tensor(0x9000, DType::float16, {8, 4});
  expect_error([&] { tessera::dropout(x, o16, 0.5, 1, 0, nullptr); }, ErrorKind::type,
               {"argument 'out'", "dtype bfloat16 (that of 'input')", "got float16"});
  auto wrong = cuda_tensor(0x9000, DType::bfloat16, {4, 8});
  expect_error([&] { tessera::dropout(x, wrong, 0.5, 1, 0, nullptr); }, ErrorKind::value,
               {"tessera.dropout: argument 'out'", "shape [8, 4] (that of 'input')", "got [4, 8]"});
  expect_error([&] { tessera::dropout_backward(x, wrong, 0.5, 1, 0, nullptr); }, ErrorKind::value,
               {"tessera.dropout_backward: argument 'out'", "shape [8, 4] (that of 'grad_output')"});
}

TEST(DropoutChecks, DevicesPointersAndOverlap) {
  std::vector<float> host(64);
  auto h = TensorView::contiguous(host.data(), DType::float32, {64}, kCpu);
  auto x = cuda_tensor(0x1000, DType::float32, {64});
  expect_error([&] { tessera::dropout(h, x, 0.5, 1, 0, nullptr); }, ErrorKind::value,
               {"tessera.dropout: argument 'input'", "expected a CUDA tensor", "got a tensor on cpu"});
  expect_error([&] { tessera::dropout(x, h, 0.5, 1, 0, nullptr); }, ErrorKind::value,
               {"argument 'out'", "CUDA tensor"});
  auto other = cuda_tensor(0x9000, DType::float32, {64}, 1);
  expect_error([&] { tessera::dropout(x, other, 0.5, 1, 0, nullptr); }, ErrorKind::value,
               {"argument 'out'", "device cuda:0 (that of 'input')", "got cuda:1"});
  auto null = TensorView::contiguous(nullptr, DType::float32, {64});
  expect_error([&] { tessera::dropout(null, x, 0.5, 1, 0, nullptr); }, ErrorKind::value,
               {"argument 'input'", "non-null data pointer"});
  auto shifted = cuda_tensor(0x1000 + 4 * 8, DType::float32, {64});
  expect_error([&] { tessera::dropout(x, shifted, 0.5, 1, 0, nullptr); }, ErrorKind::value,
               {"tessera.dropout: argument 'out'", "does not overlap 'input'"});
  expect_error([&] { tessera::dropout_backward(x, shifted, 0.5, 1, 0, nullptr); }, ErrorKind::value,
               {"tessera.dropout_backward: argument 'out'", "does not overlap 'grad_output'"});
  auto bcast = TensorView::strided(fake(0x40000), DType::float32, {64}, {0});
  expect_error([&] { tessera::dropout(x, bcast, 0.5, 1, 0, nullptr); }, ErrorKind::value,
               {"argument 'out'", "stride 0"});
}

TEST(DropoutChecks, EmptyTensorsReturnWithoutTouchingTheGpu) {
  auto a = TensorView::contiguous(nullptr, DType::float32, {0, 3});
  EXPECT_NO_THROW(tessera::dropout(a, a, 0.5, 1, 0, nullptr));
  EXPECT_NO_THROW(tessera::dropout_backward(a, a, 1.0, 1, 0, nullptr));
  EXPECT_NO_THROW(tessera::copy(a, a, nullptr));
}

TEST(DropoutRegistry, OpsAndVariants) {
  for (const char* name : {"dropout", "dropout_backward", "copy"}) {
    const auto* op = tessera::ops::find_op(name);
    ASSERT_NE(op, nullptr) << name;
    EXPECT_FALSE(op->verify_cases().empty()) << name;
    bool large = false;
    for (const auto& c : op->verify_cases()) large = large || c.large;
    EXPECT_EQ(large, std::string(name) != "copy") << name;  // dropout covers > 2^31 elements
  }
  EXPECT_EQ(tessera::ops::select_ops("dropout").size(), 2u);
  EXPECT_EQ(tessera::ops::select_ops("copy").size(), 1u);
}

// ---- GPU ------------------------------------------------------------------------------------
using tessera::ops::Layout;
using tessera::ops::TestTensor;

// Output elements of a device tensor as doubles (logical order).
std::vector<double> values(const TestTensor& t) {
  const auto h = tessera::ops::to_host(t);
  std::vector<double> v(static_cast<size_t>(t.view.numel()));
  for (int64_t i = 0; i < t.view.numel(); ++i) v[i] = tessera::host::load_double(h.view, i);
  return v;
}

TestTensor random_tensor(DType dt, int64_t n, double lo, double hi) {
  TestTensor t = tessera::ops::make_tensor(dt, {n}, Layout::contiguous);
  tessera::ops::fill_random(t, lo, hi, nullptr);
  return t;
}

TestTensor poisoned(DType dt, int64_t n) {
  TestTensor t = tessera::ops::make_tensor(dt, {n}, Layout::contiguous);
  tessera::ops::fill_poison(t, nullptr);
  return t;
}

TEST(DropoutGpu, SameSeedAndOffsetAreBitIdentical) {
  TESSERA_REQUIRE_GPU();
  const int64_t n = (int64_t(1) << 20) + 3;
  for (DType dt : {DType::float32, DType::bfloat16}) {
    TestTensor x = random_tensor(dt, n, 0.5, 2.0), a = poisoned(dt, n), b = poisoned(dt, n), c = poisoned(dt, n),
               d = poisoned(dt, n);
    tessera::dropout(x.view, a.view, 0.5, 99, 1000, nullptr);
    tessera::dropout(x.view, b.view, 0.5, 99, 1000, nullptr);
    tessera::dropout(x.view, c.view, 0.5, 99, 1001, nullptr);  // next counter
    tessera::dropout(x.view, d.view, 0.5, 100, 1000, nullptr);  // next seed
    const auto ha = tessera::ops::to_host(a), hb = tessera::ops::to_host(b);
    EXPECT_EQ(std::memcmp(ha.bytes.data(), hb.bytes.data(), ha.bytes.size()), 0) << tessera::dtype_name(dt);
    const auto va = values(a), vc = values(c), vd = values(d);
    int64_t differ_offset = 0, differ_seed = 0;
    for (int64_t i = 0; i < n; ++i) {
      differ_offset += (va[i] == 0) != (vc[i] == 0);
      differ_seed += (va[i] == 0) != (vd[i] == 0);
    }
    // Independent masks at p = 0.5 differ in half the positions.
    EXPECT_GT(differ_offset, n * 0.45) << tessera::dtype_name(dt);
    EXPECT_GT(differ_seed, n * 0.45) << tessera::dtype_name(dt);
  }
}

// Two calls over the halves of a tensor, the second at offset + dropout_offset_increment(first
// half), give what one call over the whole tensor gives, whatever the alignment of the second half.
TEST(DropoutGpu, SplitCallsMatchOneCall) {
  TESSERA_REQUIRE_GPU();
  const int64_t n = 100003;
  for (int64_t m : {int64_t(50000), int64_t(50004), int64_t(4)}) {  // 16-byte and 8-byte aligned splits
    TestTensor x = random_tensor(DType::float16, n, -2, 2), whole = poisoned(DType::float16, n),
               parts = poisoned(DType::float16, n);
    tessera::dropout(x.view, whole.view, 0.3, 5, 77, nullptr);
    auto head = [&](const TestTensor& t) { return TensorView::contiguous(t.view.data, DType::float16, {m}, t.view.device); };
    auto tail = [&](const TestTensor& t) {
      return TensorView::contiguous(static_cast<char*>(t.view.data) + 2 * m, DType::float16, {n - m}, t.view.device);
    };
    tessera::dropout(head(x), head(parts), 0.3, 5, 77, nullptr);
    tessera::dropout(tail(x), tail(parts), 0.3, 5, 77 + tessera::dropout_offset_increment(m), nullptr);
    const auto hw = tessera::ops::to_host(whole), hp = tessera::ops::to_host(parts);
    EXPECT_EQ(std::memcmp(hw.bytes.data(), hp.bytes.data(), hw.bytes.size()), 0) << "split at " << m;
  }
}

// 2^24 elements: the kept fraction is within 4 sigma of 1 - p, every kept element is x * scale
// as the kernel computes it (float product, rounded to the storage type) and every dropped one 0.
TEST(DropoutGpu, Statistics) {
  TESSERA_REQUIRE_GPU();
  const int64_t n = int64_t(1) << 24;
  for (DType dt : {DType::float32, DType::bfloat16}) {
    TestTensor x = random_tensor(dt, n, 1.0, 2.0);  // never 0: a kept element is never 0
    const auto vx = values(x);
    for (double p : {0.1, 0.5, 0.9}) {
      TestTensor out = poisoned(dt, n);
      tessera::dropout(x.view, out.view, p, 0x5eed, 123456789, nullptr);
      const auto vo = values(out);
      const float scale = static_cast<float>(1.0 / (1.0 - p));
      int64_t kept = 0, wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float prod = static_cast<float>(vx[i]) * scale;
        const double want = dt == DType::float32 ? prod : __bfloat162float(__float2bfloat16_rn(prod));
        if (vo[i] != 0) {
          ++kept;
          wrong += vo[i] != want;
        }
        // else: dropped, exactly 0 (poison is NaN, which is != 0 and counted as kept-and-wrong).
      }
      const double sigma = std::sqrt(p * (1 - p) / n);
      EXPECT_NEAR(static_cast<double>(kept) / n, 1 - p, 4 * sigma) << tessera::dtype_name(dt) << " p=" << p;
      EXPECT_EQ(wrong, 0) << tessera::dtype_name(dt) << " p=" << p;
    }
  }
}

// The backward with the forward's (p, seed, offset) zeroes exactly the positions the forward
// dropped and scales the rest.
TEST(DropoutGpu, BackwardUsesTheForwardMask) {
  TESSERA_REQUIRE_GPU();
  const int64_t n = (int64_t(1) << 22) + 5;
  for (DType dt : {DType::float32, DType::bfloat16}) {
    TestTensor x = random_tensor(dt, n, 0.5, 3.0), g = random_tensor(dt, n, 0.5, 3.0);
    TestTensor y = poisoned(dt, n), gi = poisoned(dt, n);
    const uint64_t seed = 0xabcdef, offset = (uint64_t(1) << 32) - 7;
    tessera::dropout(x.view, y.view, 0.4, seed, offset, nullptr);
    tessera::dropout_backward(g.view, gi.view, 0.4, seed, offset, nullptr);
    const auto vy = values(y), vg = values(g), vgi = values(gi);
    const float scale = static_cast<float>(1.0 / 0.6);
    int64_t mismatched = 0, wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      mismatched += (vy[i] == 0) != (vgi[i] == 0);
      if (vgi[i] != 0) {
        const float prod = static_cast<float>(vg[i]) * scale;
        const double want = dt == DType::float32 ? prod : __bfloat162float(__float2bfloat16_rn(prod));
        wrong += vgi[i] != want;
      }
    }
    EXPECT_EQ(mismatched, 0) << tessera::dtype_name(dt);
    EXPECT_EQ(wrong, 0) << tessera::dtype_name(dt);
  }
}

}  // namespace
