// Attention's CPU reference (no GPU needed): known values, masks (causal bottom-right, sliding
// window, window sides past the keys, fully masked rows), soft-capping, ALiBi, GQA against
// repeated heads, varlen against padded sequences, the backward against central finite
// differences, and its argument checks (the library's too, where they need no GPU). The GPU
// kernels (the generic tier, and the sm90 tier on Hopper) against the reference over those
// variants, odd lengths and both layouts; the decode tier and the KV cache are in
// attention_decode_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "gpu.hpp"
#include "ops/attention/attention_reference.hpp"
#include "runtime/device.hpp"
#include "runtime/memory.hpp"
#include "tessera/ops/attention.hpp"
#include "testing.hpp"
#include "attention_testing.hpp"

namespace {

using tessera::DType;
using tessera::ErrorKind;
using tessera::TensorView;
using tessera::testing::expect_error;
namespace ref = tessera::reference;
using namespace tessera::testing::attention;

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

TEST(AttentionReference, KnownValuesAndSoftcap) {
  // One query against two keys, head_dim 1, scale 1: p = softmax([0, 1]).
  std::vector<double> q = {1}, k = {0, 1}, v = {0, 10};
  ref::AttentionSpec s;
  s.scale = 1;
  auto r = ref::attention_forward(host(q, {1, 1, 1, 1}), host(k, {1, 2, 1, 1}), host(v, {1, 2, 1, 1}), s);
  const double e = std::exp(1.0);
  expect_near_all(r.out, {10 * e / (1 + e)}, 1e-12);
  expect_near_all(r.lse, {std::log(1 + e)}, 1e-12);
  // Soft-capped: the second score is 0.5 * tanh(1 / 0.5).
  s.softcap = 0.5;
  r = ref::attention_forward(host(q, {1, 1, 1, 1}), host(k, {1, 2, 1, 1}), host(v, {1, 2, 1, 1}), s);
  const double c = std::exp(0.5 * std::tanh(2.0));
  expect_near_all(r.out, {10 * c / (1 + c)}, 1e-12);
}

TEST(AttentionReference, MasksAlignBottomRight) {
  // q = 0: every visible key scores 0, so each output row is the mean of the values it sees.
  std::vector<double> q(2, 0.0), k = randn(3, 1), v = {1, 2, 4};
  ref::AttentionSpec s;
  auto r = ref::attention_forward(host(q, {1, 2, 1, 1}), host(k, {1, 3, 1, 1}), host(v, {1, 3, 1, 1}), s);
  expect_near_all(r.out, {7.0 / 3, 7.0 / 3}, 1e-12);
  s.causal = true;  // 2 queries, 3 keys: the diagonal shifts by one (query 0 sees keys 0 and 1)
  r = ref::attention_forward(host(q, {1, 2, 1, 1}), host(k, {1, 3, 1, 1}), host(v, {1, 3, 1, 1}), s);
  expect_near_all(r.out, {1.5, 7.0 / 3}, 1e-12);
  expect_near_all(r.lse, {std::log(2.0), std::log(3.0)}, 1e-12);
  // Sliding window (1, 0) over 4 queries and 4 keys: query 3 sees keys 2 and 3.
  std::vector<double> q4(4, 0.0), k4 = randn(4, 2), v4 = {1, 2, 4, 8};
  s = {};
  s.window_left = 1;
  s.window_right = 0;
  r = ref::attention_forward(host(q4, {1, 4, 1, 1}), host(k4, {1, 4, 1, 1}), host(v4, {1, 4, 1, 1}), s);
  expect_near_all(r.out, {1, 1.5, 3, 6}, 1e-12);
}

TEST(AttentionReference, FullyMaskedRowsGiveZeroAndInfiniteLse) {
  // 3 queries, 1 key, causal: the diagonal shifts by -2, so queries 0 and 1 see nothing.
  std::vector<double> q = randn(3, 3), k = randn(1, 4), v = {5};
  ref::AttentionSpec s;
  s.causal = true;
  const auto r = ref::attention_forward(host(q, {1, 3, 1, 1}), host(k, {1, 1, 1, 1}), host(v, {1, 1, 1, 1}), s);
  expect_near_all(r.out, {0, 0, 5}, 0);
  EXPECT_EQ(r.lse[0], kInf);
  EXPECT_EQ(r.lse[1], kInf);
  EXPECT_NEAR(r.lse[2], q[2] * k[0], 1e-12);
  std::vector<double> g = {1, 1, 1};
  const auto grads = ref::attention_backward(host(g, {1, 3, 1, 1}), host(q, {1, 3, 1, 1}),
                                             host(k, {1, 1, 1, 1}), host(v, {1, 1, 1, 1}), s);
  expect_near_all(grads.dq, {0, 0, 0}, 0);  // no NaN: masked rows contribute nothing
  expect_near_all(grads.dv, {1}, 1e-12);
}

// A window side at or beyond the keys is unbounded (FlashAttention's reading): with 5 queries and
// 2 keys the diagonal starts 3 left of the first key, so a right side of 2 would otherwise hide
// every key from queries 0 and 1.
TEST(AttentionReference, WindowSidesPastTheKeysAreUnbounded) {
  std::vector<double> q = randn(5 * 2, 81), k = randn(2 * 2, 82), v = randn(2 * 2, 83);
  auto run = [&](int64_t left, int64_t right) {
    ref::AttentionSpec s;
    s.window_left = left, s.window_right = right;
    return ref::attention_forward(host(q, {1, 5, 1, 2}), host(k, {1, 2, 1, 2}), host(v, {1, 2, 1, 2}), s);
  };
  const auto all = run(-1, -1);
  for (auto [left, right] : {std::pair<int64_t, int64_t>{2, 2}, {7, 100}, {2, -1}, {-1, 2}}) {
    const auto r = run(left, right);
    expect_near_all(r.out, all.out, 0);
    expect_near_all(r.lse, all.lse, 0);
  }
  EXPECT_EQ(run(-1, 1).lse[0], kInf);  // a side below the keys' length still bounds
}

// ALiBi: q = 0 makes every score 0 but the bias, -slope |i + seq_k - seq_q - j|.
TEST(AttentionReference, AlibiKnownValues) {
  std::vector<double> q(2, 0.0), k = randn(3, 84), v = {1, 2, 4};
  ref::AttentionSpec s;
  s.alibi_slopes = {0.5};
  // 2 queries, 3 keys: query 0's diagonal is key 1, query 1's key 2.
  auto r = ref::attention_forward(host(q, {1, 2, 1, 1}), host(k, {1, 3, 1, 1}), host(v, {1, 3, 1, 1}), s);
  const double a = std::exp(-0.5), b = std::exp(-1.0);
  expect_near_all(r.out, {(a * 1 + 2 + a * 4) / (2 * a + 1), (b * 1 + a * 2 + 4) / (b + a + 1)}, 1e-12);
  expect_near_all(r.lse, {std::log(2 * a + 1), std::log(b + a + 1)}, 1e-12);
  s.causal = true;  // the bias of the keys a query sees is unchanged (lse keeps it)
  r = ref::attention_forward(host(q, {1, 2, 1, 1}), host(k, {1, 3, 1, 1}), host(v, {1, 3, 1, 1}), s);
  expect_near_all(r.out, {(a * 1 + 2) / (a + 1), (b * 1 + a * 2 + 4) / (b + a + 1)}, 1e-12);
  expect_near_all(r.lse, {std::log(a + 1), std::log(b + a + 1)}, 1e-12);
  // [batch, heads] slopes: sequence 1's own (0 there: the plain mean), not sequence 0's.
  std::vector<double> q2(4, 0.0), k2 = randn(6, 85), v2 = {1, 2, 4, 1, 2, 4};
  s = {};
  s.alibi_slopes = {0.5, 0.0};
  r = ref::attention_forward(host(q2, {2, 2, 1, 1}), host(k2, {2, 3, 1, 1}), host(v2, {2, 3, 1, 1}), s);
  expect_near_all(r.out, {(a * 1 + 2 + a * 4) / (2 * a + 1), (b * 1 + a * 2 + 4) / (b + a + 1), 7.0 / 3, 7.0 / 3},
                  1e-12);
}

TEST(AttentionReference, GqaIsRepeatedHeads) {
  // 4 query heads on 2 key/value heads equal 4 heads with each key/value head repeated twice.
  const int64_t b = 2, sq = 3, sk = 5, d = 4;
  std::vector<double> q = randn(b * sq * 4 * d, 4), k = randn(b * sk * 2 * d, 5), v = randn(b * sk * 2 * d, 6);
  std::vector<double> k4(b * sk * 4 * d), v4(k4.size());
  for (int64_t r = 0; r < b * sk; ++r)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t x = 0; x < d; ++x) {
        k4[(r * 4 + h) * d + x] = k[(r * 2 + h / 2) * d + x];
        v4[(r * 4 + h) * d + x] = v[(r * 2 + h / 2) * d + x];
      }
  ref::AttentionSpec s;
  s.causal = true;
  const auto gqa = ref::attention_forward(host(q, {b, sq, 4, d}), host(k, {b, sk, 2, d}), host(v, {b, sk, 2, d}), s);
  const auto mha = ref::attention_forward(host(q, {b, sq, 4, d}), host(k4, {b, sk, 4, d}), host(v4, {b, sk, 4, d}), s);
  expect_near_all(gqa.out, mha.out, 1e-12);
  expect_near_all(gqa.lse, mha.lse, 1e-12);
  std::vector<double> g = randn(gqa.out.size(), 7);
  const auto g2 = ref::attention_backward(host(g, {b, sq, 4, d}), host(q, {b, sq, 4, d}), host(k, {b, sk, 2, d}),
                                          host(v, {b, sk, 2, d}), s);
  const auto g4 = ref::attention_backward(host(g, {b, sq, 4, d}), host(q, {b, sq, 4, d}), host(k4, {b, sk, 4, d}),
                                          host(v4, {b, sk, 4, d}), s);
  expect_near_all(g2.dq, g4.dq, 1e-12);
  for (int64_t r = 0; r < b * sk; ++r)  // a shared head's gradient sums its group's
    for (int64_t x = 0; x < d; ++x)
      for (int64_t h = 0; h < 2; ++h) {
        EXPECT_NEAR(g2.dk[(r * 2 + h) * d + x], g4.dk[(r * 4 + 2 * h) * d + x] + g4.dk[(r * 4 + 2 * h + 1) * d + x], 1e-12);
        EXPECT_NEAR(g2.dv[(r * 2 + h) * d + x], g4.dv[(r * 4 + 2 * h) * d + x] + g4.dv[(r * 4 + 2 * h + 1) * d + x], 1e-12);
      }
}

TEST(AttentionReference, VarlenIsEachSequenceAlone) {
  const int64_t h = 2, d = 3;
  const std::vector<int64_t> cu_q = {0, 2, 5}, cu_k = {0, 3, 4};
  std::vector<double> q = randn(5 * h * d, 8), k = randn(4 * h * d, 9), v = randn(4 * h * d, 10);
  ref::AttentionSpec s;
  s.causal = true;
  s.alibi_slopes = {0.3, 0.7, 0.1, 0.2};  // [batch, heads]: each sequence its own lengths and slopes
  const auto packed = ref::attention_varlen_forward(host(q, {5, h, d}), host(k, {4, h, d}), host(v, {4, h, d}),
                                                    cu_q, cu_k, s);
  for (int b = 0; b < 2; ++b) {
    const int64_t lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
    std::vector<double> qb(q.begin() + cu_q[b] * h * d, q.begin() + cu_q[b + 1] * h * d);
    std::vector<double> kb(k.begin() + cu_k[b] * h * d, k.begin() + cu_k[b + 1] * h * d);
    std::vector<double> vb(v.begin() + cu_k[b] * h * d, v.begin() + cu_k[b + 1] * h * d);
    ref::AttentionSpec sb = s;
    sb.alibi_slopes = {s.alibi_slopes[size_t(b * h)], s.alibi_slopes[size_t(b * h + 1)]};
    const auto one =
        ref::attention_forward(host(qb, {1, lq, h, d}), host(kb, {1, lk, h, d}), host(vb, {1, lk, h, d}), sb);
    for (int64_t i = 0; i < lq * h * d; ++i) EXPECT_NEAR(packed.out[cu_q[b] * h * d + i], one.out[i], 1e-12);
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t i = 0; i < lq; ++i)
        EXPECT_EQ(packed.lse[hh * 5 + cu_q[b] + i], one.lse[hh * lq + i]);
  }
}

TEST(AttentionReference, BackwardMatchesFiniteDifferences) {
  const int64_t b = 1, sq = 3, sk = 4, hq = 2, hk = 1, d = 3;
  std::vector<double> q = randn(b * sq * hq * d, 11), k = randn(b * sk * hk * d, 12), v = randn(b * sk * hk * d, 13);
  std::vector<double> g = randn(q.size(), 14);
  ref::AttentionSpec s;
  s.causal = true;
  s.window_left = 2;
  s.softcap = 1.5;
  s.alibi_slopes = {0.25, 0.6};  // no gradient of its own; it shapes P, hence the others
  auto loss = [&] {  // sum(out * g)
    const auto r = ref::attention_forward(host(q, {b, sq, hq, d}), host(k, {b, sk, hk, d}), host(v, {b, sk, hk, d}), s);
    double l = 0;
    for (size_t i = 0; i < g.size(); ++i) l += r.out[i] * g[i];
    return l;
  };
  const auto grads = ref::attention_backward(host(g, {b, sq, hq, d}), host(q, {b, sq, hq, d}),
                                             host(k, {b, sk, hk, d}), host(v, {b, sk, hk, d}), s);
  const double h = 1e-6;
  for (auto [x, want] : {std::pair{&q, &grads.dq}, {&k, &grads.dk}, {&v, &grads.dv}})
    for (size_t i = 0; i < x->size(); ++i) {
      const double keep = (*x)[i];
      (*x)[i] = keep + h;
      const double up = loss();
      (*x)[i] = keep - h;
      const double down = loss();
      (*x)[i] = keep;
      EXPECT_NEAR((*want)[i], (up - down) / (2 * h), 1e-7) << "element " << i;
    }
}

TEST(AttentionReference, ArgumentChecks) {
  std::vector<double> q = randn(3 * 4, 15), k = randn(2 * 4, 16);
  ref::AttentionSpec s;
  expect_error([&] { ref::attention_forward(host(q, {1, 1, 3, 4}), host(k, {1, 1, 2, 4}), host(k, {1, 1, 2, 4}), s); },
               ErrorKind::value, {"'k'", "heads dividing q's 3"});
  expect_error([&] { ref::attention_forward(host(q, {1, 3, 4}), host(k, {1, 2, 4}), host(k, {1, 2, 4}), s); },
               ErrorKind::value, {"'q'", "4-d"});
  std::vector<double> q2 = randn(2 * 4, 17);
  expect_error([&] {
    ref::attention_varlen_forward(host(q2, {2, 1, 4}), host(k, {2, 1, 4}), host(k, {2, 1, 4}), {0, 2, 1}, {0, 1, 2}, s);
  }, ErrorKind::value, {"cu_seqlens_q"});
  s.alibi_slopes = {0.1, 0.2};
  expect_error([&] { ref::attention_forward(host(q, {1, 1, 3, 4}), host(q, {1, 1, 3, 4}), host(q, {1, 1, 3, 4}), s); },
               ErrorKind::value, {"'alibi_slopes'", "heads_q = 3 or batch * heads_q = 3"});
}

// ---- the GPU kernels against the reference (helpers: attention_testing.hpp) ------------------

TEST(AttentionGpu, GenericKernelMatchesTheReference) {
  TESSERA_REQUIRE_GPU();
  const std::vector<GpuCase> cases = {
      {2, 17, 17, 4, 4, 64, 64, spec(false, -1, -1, 0), false},
      {2, 17, 33, 4, 4, 64, 64, spec(true, -1, -1, 0), false},   // causal, seq_q < seq_k
      {1, 40, 7, 2, 2, 128, 128, spec(true, -1, -1, 0), false},  // causal, fully masked rows
      {1, 127, 127, 8, 2, 128, 128, spec(true, -1, -1, 0), true},  // GQA, SDPA layout
      {3, 1, 1000, 4, 1, 80, 48, spec(false, -1, -1, 0), false},   // decode-like, MQA, dv != d
      {1, 100, 100, 2, 2, 256, 256, spec(false, 16, 4, 0), true},  // sliding window, head_dim 256
      {2, 33, 65, 4, 2, 64, 64, spec(true, 8, -1, 30.0), false},   // window + soft-cap
      {1, 50, 20, 2, 2, 64, 64, spec(false, 30, 25, 0), false},    // window sides past the keys
      {2, 17, 33, 4, 2, 64, 64, with_alibi(spec(false, -1, -1, 0), 4), false},   // ALiBi [h], GQA
      {2, 40, 7, 2, 2, 128, 128, with_alibi(spec(true, -1, -1, 0), 4), true},    // ALiBi [b, h], masked rows
      {2, 33, 65, 4, 2, 64, 64, with_alibi(spec(true, 8, -1, 30.0), 8), false},  // ALiBi, window, soft-cap
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    run_gpu_case(c, DType::float32, 1e-5, tessera::AttentionTier::generic);
    run_gpu_case(c, DType::float16, 2e-3, tessera::AttentionTier::generic);
  }
}

// The backward (on `tier`) against the reference's dq, dk, dv; the forward's out and lse come
// from the GPU, as they do in training. Returns dq as computed.
std::vector<double> run_backward_case(const GpuCase& c, DType dt, double tol,
                                      tessera::AttentionTier tier = tessera::AttentionTier::generic,
                                      bool deterministic = false) {
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  std::vector<double> q = randn(c.b * c.sq * c.hq * c.d, 31), k = randn(c.b * c.sk * c.hk * c.d, 32),
                      v = randn(c.b * c.sk * c.hk * c.dv, 33), go = randn(c.b * c.sq * c.hq * c.dv, 34);
  tessera::runtime::DeviceBuffer bq, bk, bv, bgo, bo, bl, bdq, bdk, bdv, ba;
  const TensorView tq = upload(bq, q, dt, c.b, c.sq, c.hq, c.d, c.heads_major);
  const TensorView tk = upload(bk, k, dt, c.b, c.sk, c.hk, c.d, c.heads_major);
  const TensorView tv = upload(bv, v, dt, c.b, c.sk, c.hk, c.dv, c.heads_major);
  const TensorView tgo = upload(bgo, go, dt, c.b, c.sq, c.hq, c.dv, c.heads_major);
  const TensorView to = alloc(bo, {c.b, c.sq, c.hq, c.dv}, dt), tl = alloc(bl, {c.b, c.hq, c.sq}, DType::float32);
  const TensorView tdq = alloc(bdq, {c.b, c.sq, c.hq, c.d}, dt), tdk = alloc(bdk, {c.b, c.sk, c.hk, c.d}, dt),
                   tdv = alloc(bdv, {c.b, c.sk, c.hk, c.dv}, dt);
  TensorView ta;
  tessera::AttentionOptions o = options_of(c.spec);
  o.alibi_slopes = device_slopes(ba, ta, c.spec, c.hq);
  tessera::attention(tq, tk, tv, to, &tl, o, nullptr);
  o.tier = tier, o.deterministic = deterministic;
  tessera::attention_backward(tgo, tq, tk, tv, to, tl, tdq, tdk, tdv, o, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<double> rq = rounded(dt, q), rk = rounded(dt, k), rv = rounded(dt, v), rgo = rounded(dt, go);
  const auto want = ref::attention_backward(host(rgo, {c.b, c.sq, c.hq, c.dv}), host(rq, {c.b, c.sq, c.hq, c.d}),
                                            host(rk, {c.b, c.sk, c.hk, c.d}), host(rv, {c.b, c.sk, c.hk, c.dv}), c.spec);
  EXPECT_LE(rel_err(download(dt, bdq, want.dq.size()), want.dq), tol) << "dq";
  EXPECT_LE(rel_err(download(dt, bdk, want.dk.size()), want.dk), tol) << "dk";
  EXPECT_LE(rel_err(download(dt, bdv, want.dv.size()), want.dv), tol) << "dv";
  return download(dt, bdq, want.dq.size());
}

TEST(AttentionGpu, BackwardMatchesTheReference) {
  TESSERA_REQUIRE_GPU();
  const std::vector<GpuCase> cases = {
      {2, 17, 33, 4, 2, 64, 64, spec(true, -1, -1, 0), false},      // causal, GQA, seq_q < seq_k
      {1, 40, 7, 2, 2, 128, 128, spec(true, -1, -1, 0), false},     // fully masked rows
      {1, 127, 127, 8, 2, 128, 128, spec(true, -1, -1, 0), true},   // SDPA layout
      {3, 1, 300, 4, 1, 80, 48, spec(false, -1, -1, 0), false},     // MQA, dv != d
      {1, 100, 100, 2, 2, 256, 256, spec(false, 16, 4, 0), true},   // sliding window
      {2, 33, 65, 4, 2, 64, 64, spec(true, 8, -1, 30.0), false},    // window + soft-cap
      {1, 50, 20, 2, 2, 64, 64, spec(false, 30, 25, 0), false},     // window sides past the keys
      {2, 17, 33, 4, 2, 64, 64, with_alibi(spec(true, -1, -1, 0), 4), false},    // ALiBi [h]
      {3, 1, 300, 4, 1, 80, 48, with_alibi(spec(false, -1, -1, 0), 12), false},  // ALiBi [b, h], MQA
      {2, 33, 65, 4, 2, 64, 64, with_alibi(spec(true, 8, -1, 30.0), 8), false},  // ALiBi, window, soft-cap
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    run_backward_case(c, DType::float32, 1e-4);
    run_backward_case(c, DType::float16, 5e-3);
    run_backward_case(c, DType::bfloat16, 3e-2);
  }
}

// Packed sequences (lengths 5, 0, 300, 1, 130; keys 7, 3, 300, 64, 1) through attention_varlen
// and its backward against the reference's varlen forms: both tiers forward, the backward.
void run_varlen_case(DType dt, int64_t d, const ref::AttentionSpec& spec, double tol) {
  SCOPED_TRACE(spec.alibi_slopes.empty() ? "" : "alibi x" + std::to_string(spec.alibi_slopes.size()));
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  const std::vector<int64_t> cq = {0, 5, 5, 305, 306, 436}, ck = {0, 7, 10, 310, 374, 375};
  const int64_t tq = cq.back(), tk = ck.back(), hq = 4, hk = 2, b = int64_t(cq.size()) - 1;
  std::vector<double> q = randn(tq * hq * d, 41), k = randn(tk * hk * d, 42), v = randn(tk * hk * d, 43),
                      go = randn(tq * hq * d, 44);
  tessera::runtime::DeviceBuffer bq, bk, bv, bgo, bo, bl, bdq, bdk, bdv, bcq, bck, ba;
  // [total, heads, dim] is the upload of a batch of one, squeezed.
  auto packed = [&](tessera::runtime::DeviceBuffer& buf, const std::vector<double>& x, int64_t n, int64_t h) {
    TensorView t = upload(buf, x, dt, 1, n, h, d, false);
    return TensorView::make(t.data, dt, &t.shape[1], &t.strides[1], 3, dev);
  };
  const TensorView tq_ = packed(bq, q, tq, hq), tk_ = packed(bk, k, tk, hk), tv_ = packed(bv, v, tk, hk),
                   tgo = packed(bgo, go, tq, hq);
  const TensorView to = alloc(bo, {tq, hq, d}, dt), tl = alloc(bl, {hq, tq}, DType::float32),
                   tdq = alloc(bdq, {tq, hq, d}, dt), tdk = alloc(bdk, {tk, hk, d}, dt), tdv = alloc(bdv, {tk, hk, d}, dt);
  auto offsets = [&](tessera::runtime::DeviceBuffer& buf, const std::vector<int64_t>& c) {
    std::vector<int32_t> h(c.begin(), c.end());
    buf = tessera::runtime::DeviceBuffer(h.size() * 4);
    EXPECT_EQ(cudaMemcpy(buf.data(), h.data(), h.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    return TensorView::contiguous(buf.data(), DType::int32, {int64_t(h.size())}, dev);
  };
  const TensorView tcq = offsets(bcq, cq), tck = offsets(bck, ck);
  TensorView ta;
  tessera::AttentionOptions o = options_of(spec);
  o.alibi_slopes = device_slopes(ba, ta, spec, hq);
  tessera::attention_varlen(tq_, tk_, tv_, to, &tl, tcq, tck, 300, 300, o, nullptr);
  tessera::attention_varlen_backward(tgo, tq_, tk_, tv_, to, tl, tdq, tdk, tdv, tcq, tck, 300, 300, o, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<double> rq = rounded(dt, q), rk = rounded(dt, k), rv = rounded(dt, v), rgo = rounded(dt, go);
  const auto hq3 = host(rq, {tq, hq, d}), hk3 = host(rk, {tk, hk, d}), hv3 = host(rv, {tk, hk, d});
  const auto want = ref::attention_varlen_forward(hq3, hk3, hv3, cq, ck, spec);
  const auto grads = ref::attention_varlen_backward(host(rgo, {tq, hq, d}), hq3, hk3, hv3, cq, ck, spec);
  std::vector<float> lf(want.lse.size());
  ASSERT_EQ(cudaMemcpy(lf.data(), bl.data(), lf.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_LE(rel_err(download(dt, bo, want.out.size()), want.out), tol) << "out";
  EXPECT_LE(rel_err(std::vector<double>(lf.begin(), lf.end()), want.lse), 1e-5) << "lse";
  EXPECT_LE(rel_err(download(dt, bdq, grads.dq.size()), grads.dq), 3 * tol) << "dq";
  EXPECT_LE(rel_err(download(dt, bdk, grads.dk.size()), grads.dk), 3 * tol) << "dk";
  EXPECT_LE(rel_err(download(dt, bdv, grads.dv.size()), grads.dv), 3 * tol) << "dv";
  (void)b;
}

TEST(AttentionGpu, VarlenMatchesTheReference) {
  TESSERA_REQUIRE_GPU();
  // ALiBi per sequence and head (5 x 4 slopes), with each sequence's own lengths; and per head.
  for (const auto& sp : {spec(false, -1, -1, 0), spec(true, -1, -1, 0), spec(true, 32, -1, 20.0),
                         with_alibi(spec(false, -1, -1, 0), 20), with_alibi(spec(true, -1, -1, 0), 4),
                         with_alibi(spec(true, 32, 300, 20.0), 20)}) {
    SCOPED_TRACE(std::string(sp.causal ? "causal" : "full") + (sp.window_left >= 0 ? " window softcap" : ""));
    run_varlen_case(DType::float32, 64, sp, 1e-5);
    run_varlen_case(DType::bfloat16, 128, sp, 1e-2);
    run_varlen_case(DType::float16, 64, sp, 2e-3);
  }
}

// The offsets are checked before any launch, each error naming its argument.
TEST(AttentionChecks, VarlenOffsets) {
  TESSERA_REQUIRE_GPU();
  const auto dev = tessera::Device{tessera::DeviceType::cuda, 0};
  tessera::runtime::DeviceBuffer bq(40 * 2 * 64 * 2), bo(40 * 2 * 64 * 2), bc(4 * 4);
  const TensorView q = TensorView::contiguous(bq.data(), DType::bfloat16, {40, 2, 64}, dev);
  const TensorView o = TensorView::contiguous(bo.data(), DType::bfloat16, {40, 2, 64}, dev);
  const TensorView cu = TensorView::contiguous(bc.data(), DType::int32, {4}, dev);
  auto with = [&](std::vector<int32_t> h) {
    EXPECT_EQ(cudaMemcpy(bc.data(), h.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  };
  with({0, 10, 5, 40});
  expect_error([&] { tessera::attention_varlen(q, q, q, o, nullptr, cu, cu, 40, 40, {}, nullptr); }, ErrorKind::value,
               {"'cu_seqlens_q'", "non-decreasing"});
  with({0, 10, 20, 39});
  expect_error([&] { tessera::attention_varlen(q, q, q, o, nullptr, cu, cu, 40, 40, {}, nullptr); }, ErrorKind::value,
               {"'cu_seqlens_q'", "packed length 40"});
  with({0, 10, 20, 40});
  expect_error([&] { tessera::attention_varlen(q, q, q, o, nullptr, cu, cu, 15, 40, {}, nullptr); }, ErrorKind::value,
               {"'max_seqlen_q'", "sequence 2 of 20"});
  // ALiBi's [batch, heads] slopes count the sequences, 3 here.
  tessera::AttentionOptions alibi;
  const TensorView slopes = TensorView::contiguous(bc.data(), DType::float32, {2, 2}, dev);
  alibi.alibi_slopes = &slopes;
  expect_error([&] { tessera::attention_varlen(q, q, q, o, nullptr, cu, cu, 40, 40, alibi, nullptr); },
               ErrorKind::value, {"attention_varlen", "'alibi_slopes'", "[batch, heads_q] = [3, 2]", "[2, 2]"});
  const TensorView q4 = TensorView::contiguous(bq.data(), DType::bfloat16, {1, 40, 2, 64}, dev);
  expect_error([&] { tessera::attention_varlen(q4, q, q, o, nullptr, cu, cu, 40, 40, {}, nullptr); }, ErrorKind::value,
               {"'q'", "3-d"});
}

// The tensor-core tier: P goes through the tensor cores in the input's dtype, so the bound is a
// few units of its rounding (as FlashAttention's own); odd lengths cross every tile boundary.
TEST(AttentionGpu, Sm90KernelMatchesTheReference) {
  TESSERA_REQUIRE_GPU();
  if (tessera::runtime::device_props(0).major != 9) GTEST_SKIP() << "the sm90 tier is for sm_90";
  const std::vector<GpuCase> cases = {
      {1, 1, 1, 2, 2, 64, 64, spec(false, -1, -1, 0), false},
      {2, 17, 17, 4, 4, 64, 64, spec(false, -1, -1, 0), false},
      {2, 17, 33, 4, 4, 128, 128, spec(true, -1, -1, 0), false},    // causal, seq_q < seq_k
      {1, 40, 7, 2, 2, 128, 128, spec(true, -1, -1, 0), false},     // causal, fully masked rows
      {1, 127, 127, 8, 2, 128, 128, spec(true, -1, -1, 0), true},   // GQA, SDPA layout
      {1, 300, 1000, 4, 1, 128, 128, spec(false, -1, -1, 0), false},  // MQA, many key tiles
      {1, 1000, 1000, 2, 2, 64, 64, spec(true, -1, -1, 0), false},
      {1, 100, 100, 2, 2, 256, 256, spec(false, 16, 4, 0), true},   // sliding window, head_dim 256
      {1, 257, 300, 2, 1, 256, 256, spec(true, -1, -1, 0), false},
      {2, 33, 65, 4, 2, 64, 64, spec(true, 8, -1, 30.0), false},    // window + soft-cap
      {1, 300, 300, 2, 2, 128, 128, spec(false, 50, 50, 0), false}, // window on both sides
      {1, 4097, 200, 1, 1, 64, 64, spec(true, -1, -1, 0), false},   // many query tiles
      {1, 200, 4097, 1, 1, 128, 128, spec(false, -1, -1, 0), false},
      {1, 50, 20, 2, 2, 64, 64, spec(false, 30, 25, 0), false},     // window sides past the keys
      {2, 17, 33, 4, 4, 128, 128, with_alibi(spec(true, -1, -1, 0), 4), false},      // ALiBi [h]
      {2, 127, 127, 8, 2, 128, 128, with_alibi(spec(false, -1, -1, 0), 16), true},   // ALiBi [b, h], GQA
      {1, 100, 100, 2, 2, 256, 256, with_alibi(spec(false, 16, 4, 0), 2), true},     // ALiBi, window
      {2, 33, 65, 4, 2, 64, 64, with_alibi(spec(true, 8, -1, 30.0), 8), false},      // ALiBi, soft-cap
      {1, 300, 1000, 4, 1, 128, 128, with_alibi(spec(false, -1, -1, 0), 4), false},  // ALiBi, many key tiles
      {1, 4097, 200, 1, 1, 64, 64, with_alibi(spec(true, -1, -1, 0), 1), false},     // ALiBi, many query tiles
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    run_gpu_case(c, DType::float16, 2e-3, tessera::AttentionTier::sm90);
    run_gpu_case(c, DType::bfloat16, 1e-2, tessera::AttentionTier::sm90);
  }
}

// The tensor-core backward: P and dS enter the tensor cores in the input's dtype, and dq is summed
// across CTAs in float32; odd lengths cross every tile boundary, keys no query sees get zero
// gradients, GQA sums dk and dv over the group.
TEST(AttentionGpu, Sm90BackwardMatchesTheReference) {
  TESSERA_REQUIRE_GPU();
  if (tessera::runtime::device_props(0).major != 9) GTEST_SKIP() << "the sm90 tier is for sm_90";
  const std::vector<GpuCase> cases = {
      {1, 1, 5, 2, 2, 64, 64, spec(false, -1, -1, 0), false},
      {2, 17, 33, 4, 2, 64, 64, spec(true, -1, -1, 0), false},      // causal, GQA, seq_q < seq_k
      {1, 40, 7, 2, 2, 128, 128, spec(true, -1, -1, 0), false},     // fully masked rows
      {1, 127, 127, 8, 2, 128, 128, spec(true, -1, -1, 0), true},   // SDPA layout
      {1, 300, 1000, 4, 1, 128, 128, spec(false, -1, -1, 0), false},  // MQA, many key tiles
      {1, 1000, 1000, 2, 2, 64, 64, spec(true, -1, -1, 0), false},
      {2, 33, 65, 4, 2, 64, 64, spec(true, 8, -1, 30.0), false},    // window + soft-cap
      {1, 300, 300, 2, 2, 128, 128, spec(false, 50, 50, 0), false}, // window on both sides
      {1, 1000, 200, 1, 1, 64, 64, spec(true, -1, -1, 0), false},   // many query tiles, empty rows
      {1, 200, 1000, 2, 2, 128, 128, spec(false, -1, -1, 20.0), false},
      {1, 50, 20, 2, 2, 64, 64, spec(false, 30, 25, 0), false},     // window sides past the keys
      // ALiBi: each (soft-cap, ALiBi) kernel variant at both head dimensions, GQA walks
      {2, 17, 33, 4, 2, 64, 64, with_alibi(spec(true, -1, -1, 0), 4), false},
      {2, 127, 127, 8, 2, 128, 128, with_alibi(spec(false, -1, -1, 0), 16), true},
      {2, 33, 65, 4, 2, 64, 64, with_alibi(spec(true, 8, -1, 30.0), 8), false},
      {1, 300, 300, 2, 2, 128, 128, with_alibi(spec(false, 50, 50, 20.0), 2), false},
      {1, 200, 1000, 4, 1, 128, 128, with_alibi(spec(true, -1, -1, 0), 4), false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    run_backward_case(c, DType::float16, 1e-3, tessera::AttentionTier::sm90);
    run_backward_case(c, DType::bfloat16, 6e-3, tessera::AttentionTier::sm90);
  }
}

// deterministic: dq is added across key tiles in a fixed order, so two runs give the same bits;
// cases where many key tiles add into each query tile, a left window (whose runs of key tiles
// do not start at the first), GQA.
TEST(AttentionGpu, Sm90BackwardDeterministic) {
  TESSERA_REQUIRE_GPU();
  if (tessera::runtime::device_props(0).major != 9) GTEST_SKIP() << "the sm90 tier is for sm_90";
  const std::vector<GpuCase> cases = {
      {1, 1000, 1000, 4, 2, 64, 64, spec(true, -1, -1, 0), false},
      {1, 700, 900, 2, 2, 128, 128, spec(false, 300, 20, 0), false},
      {2, 300, 1100, 2, 1, 128, 128, spec(false, -1, -1, 0), false},
      {1, 700, 900, 2, 2, 64, 64, with_alibi(spec(true, -1, -1, 0), 2), false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    const auto first = run_backward_case(c, DType::bfloat16, 6e-3, tessera::AttentionTier::sm90, true);
    const auto second = run_backward_case(c, DType::bfloat16, 6e-3, tessera::AttentionTier::sm90, true);
    EXPECT_TRUE(first == second) << "dq differs between two deterministic runs";
  }
}

TEST(AttentionChecks, NameTheArgument) {
  using tessera::testing::cuda_tensor;
  const TensorView q = cuda_tensor(0x1000, DType::bfloat16, {1, 4, 6, 64});
  const TensorView k = cuda_tensor(0x100000, DType::bfloat16, {1, 5, 4, 64});
  const TensorView o = cuda_tensor(0x200000, DType::bfloat16, {1, 4, 6, 64});
  expect_error([&] { tessera::attention(q, k, k, o, nullptr, {}, nullptr); }, ErrorKind::value,
               {"tessera.attention: argument 'k'", "heads_kv dividing q's 6"});
  const TensorView k3 = cuda_tensor(0x100000, DType::bfloat16, {1, 5, 3, 64});
  const TensorView kf = cuda_tensor(0x100000, DType::float16, {1, 5, 3, 64});
  expect_error([&] { tessera::attention(q, kf, k3, o, nullptr, {}, nullptr); }, ErrorKind::type, {"'k'"});
  const TensorView big = cuda_tensor(0x1000, DType::bfloat16, {1, 4, 6, 512});
  const TensorView kbig = cuda_tensor(0x100000, DType::bfloat16, {1, 5, 3, 512});
  const TensorView obig = cuda_tensor(0x200000, DType::bfloat16, {1, 4, 6, 512});
  expect_error([&] { tessera::attention(big, kbig, kbig, obig, nullptr, {}, nullptr); }, ErrorKind::value,
               {"'q'", "at most 256"});
}

// ALiBi's slopes are checked before any launch (no GPU needed), each error naming the argument and
// what it expects: float32, [heads_q] or [batch, heads_q], a CUDA tensor on q's device; in the
// forward, the backward and the KV cache's call alike.
TEST(AttentionChecks, AlibiSlopesNameTheArgument) {
  using tessera::testing::cuda_tensor;
  const TensorView q = cuda_tensor(0x1000, DType::bfloat16, {2, 4, 6, 64});
  const TensorView k = cuda_tensor(0x100000, DType::bfloat16, {2, 5, 3, 64});
  const TensorView o = cuda_tensor(0x200000, DType::bfloat16, {2, 4, 6, 64});
  auto forward = [&](const TensorView& slopes) {
    tessera::AttentionOptions opt;
    opt.alibi_slopes = &slopes;
    tessera::attention(q, k, k, o, nullptr, opt, nullptr);
  };
  expect_error([&] { forward(cuda_tensor(0x300000, DType::float16, {6})); }, ErrorKind::type,
               {"tessera.attention: argument 'alibi_slopes'", "float32", "got float16"});
  expect_error([&] { forward(cuda_tensor(0x300000, DType::float32, {4})); }, ErrorKind::value,
               {"tessera.attention: argument 'alibi_slopes'",
                "a float32 tensor [heads_q] = [6] or [batch, heads_q] = [2, 6]", "got 1-d [4]"});
  expect_error([&] { forward(cuda_tensor(0x300000, DType::float32, {6, 2})); }, ErrorKind::value,
               {"'alibi_slopes'", "[batch, heads_q] = [2, 6]", "got 2-d [6, 2]"});
  expect_error([&] { forward(cuda_tensor(0x300000, DType::float32, {1, 2, 6})); }, ErrorKind::value,
               {"'alibi_slopes'", "got 3-d"});
  expect_error([&] { forward(TensorView::contiguous(tessera::testing::fake(0x300000), DType::float32, {6}, kCpu)); },
               ErrorKind::value, {"'alibi_slopes'", "a CUDA tensor"});
  expect_error([&] { forward(cuda_tensor(0x300000, DType::float32, {6}, 1)); }, ErrorKind::value,
               {"'alibi_slopes'", "(that of 'q')"});
  // The backward and the KV cache check them alike.
  const TensorView l = cuda_tensor(0x400000, DType::float32, {2, 6, 4});
  const TensorView g = cuda_tensor(0x500000, DType::bfloat16, {2, 4, 6, 64});
  const TensorView dq = cuda_tensor(0x600000, DType::bfloat16, {2, 4, 6, 64});
  const TensorView dk = cuda_tensor(0x700000, DType::bfloat16, {2, 5, 3, 64});
  const TensorView dv = cuda_tensor(0x800000, DType::bfloat16, {2, 5, 3, 64});
  const TensorView bad = cuda_tensor(0x300000, DType::float32, {3, 6});
  tessera::AttentionOptions opt;
  opt.alibi_slopes = &bad;
  expect_error([&] { tessera::attention_backward(g, q, k, k, o, l, dq, dk, dv, opt, nullptr); }, ErrorKind::value,
               {"tessera.attention_backward: argument 'alibi_slopes'", "[batch, heads_q] = [2, 6]"});
  const TensorView lens = cuda_tensor(0x900000, DType::int32, {2});
  expect_error([&] { tessera::attention_kvcache(q, k, k, o, nullptr, lens, nullptr, opt, nullptr); },
               ErrorKind::value, {"tessera.attention_kvcache: argument 'alibi_slopes'", "[batch, heads_q] = [2, 6]"});
}

// Naming a tier that cannot take the call is an error, not a silent fallback.
TEST(AttentionChecks, NamedTierMustApply) {
  TESSERA_REQUIRE_GPU();
  using tessera::testing::cuda_tensor;
  tessera::AttentionOptions sm90;
  sm90.tier = tessera::AttentionTier::sm90;
  const TensorView q80 = cuda_tensor(0x1000, DType::bfloat16, {1, 4, 6, 80});
  const TensorView k80 = cuda_tensor(0x100000, DType::bfloat16, {1, 5, 3, 80});
  const TensorView o80 = cuda_tensor(0x200000, DType::bfloat16, {1, 4, 6, 80});
  expect_error([&] { tessera::attention(q80, k80, k80, o80, nullptr, sm90, nullptr); }, ErrorKind::value,
               {"'tier'", "sm90 tier"});
  // The backward: sm90 takes head_dim 64 and 128 only; it has no decode tier.
  const TensorView l80 = cuda_tensor(0x300000, DType::float32, {1, 6, 4});
  const TensorView g80 = cuda_tensor(0x400000, DType::bfloat16, {1, 4, 6, 80});
  const TensorView dq = cuda_tensor(0x500000, DType::bfloat16, {1, 4, 6, 80});
  const TensorView dk = cuda_tensor(0x600000, DType::bfloat16, {1, 5, 3, 80});
  const TensorView dv = cuda_tensor(0x700000, DType::bfloat16, {1, 5, 3, 80});
  expect_error([&] { tessera::attention_backward(g80, q80, k80, k80, o80, l80, dq, dk, dv, sm90, nullptr); },
               ErrorKind::value, {"attention_backward", "'tier'", "sm90 tier"});
  tessera::AttentionOptions decode;
  decode.tier = tessera::AttentionTier::decode;
  expect_error([&] { tessera::attention_backward(g80, q80, k80, k80, o80, l80, dq, dk, dv, decode, nullptr); },
               ErrorKind::value, {"'tier'", "no decode tier"});
}

}  // namespace
