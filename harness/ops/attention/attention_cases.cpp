// Verify and bench cases for attention, and its registration: what `tessera verify|bench|profile
// attention` run. The cases walk the tiers (the sm90 tier takes bf16/fp16 at head_dim 64, 128
// and 256 on Hopper, the decode tier a few queries; everything else runs the generic kernel),
// every mask, ALiBi (slopes per head or per sequence and head, strided), GQA/MQA, odd lengths that
// cross tile boundaries, fully masked rows, window sides past the keys (unbounded) and torch's SDPA
// layout (a transposed view).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/host.hpp"
#include "ops/attention/attention_reference.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "tessera/ops/attention.hpp"

namespace tessera::ops {
namespace {

const std::vector<DType> kTypes = {DType::float32, DType::float16, DType::bfloat16};

struct Spec {
  int64_t b, sq, sk, hq, hk, d;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  double softcap = 0;
  bool heads_major = false;  // stored [batch, heads, seq, dim] (torch's layout), viewed as FA's
  int alibi = 0;             // ALiBi's slopes: 0 none, 1 [heads_q], 2 [batch, heads_q] (strided)
};

std::string describe(DType dt, const Spec& s) {
  std::string d = std::string(dtype_name(dt)) + " q " + shape_str({s.b, s.sq, s.hq, s.d}) + " kv " +
                  shape_str({s.b, s.sk, s.hk, s.d});
  if (s.causal) d += " causal";
  if (s.window_left >= 0 || s.window_right >= 0)
    d += " window (" + std::to_string(s.window_left) + ", " + std::to_string(s.window_right) + ")";
  if (s.softcap > 0) d += " softcap " + std::to_string(int(s.softcap));
  if (s.heads_major) d += " [b, h, s, d] storage";
  if (s.alibi) d += s.alibi == 1 ? " alibi [h]" : " alibi [b, h]";
  return d;
}

// [b, s, h, d] as the kernels take it; stored [b, h, s, d] where heads_major.
TestTensor bshd(DType dt, int64_t b, int64_t s, int64_t h, int64_t d, bool heads_major) {
  if (!heads_major) return make_tensor(dt, {b, s, h, d}, Layout::contiguous);
  TestTensor t = make_tensor(dt, {b, h, s, d}, Layout::contiguous);
  std::swap(t.view.shape[1], t.view.shape[2]);
  std::swap(t.view.strides[1], t.view.strides[2]);
  return t;
}

// ALiBi's slopes of a case (none where !s.alibi): random in [0.02, 0.5), [heads_q] or [batch,
// heads_q] (a transposed view: strided), and their values for the reference (b * heads_q + h).
struct Slopes {
  TestTensor t;
  std::vector<double> values;
};
Slopes slopes_of(const Spec& s, cudaStream_t stream) {
  Slopes sl;
  if (!s.alibi) return sl;
  sl.t = s.alibi == 1 ? make_tensor(DType::float32, {s.hq}, Layout::contiguous)
                      : make_tensor(DType::float32, {s.b, s.hq}, Layout::transposed);
  fill_random(sl.t, 0.02, 0.5, stream);
  const HostCopy h = to_host(sl.t);
  for (int64_t i = 0; i < sl.t.view.numel(); ++i) sl.values.push_back(host::load_double(h.view, i));
  return sl;
}

AttentionOptions options_of(const Spec& s, const Slopes& sl) {
  AttentionOptions o;
  o.causal = s.causal, o.window_left = s.window_left, o.window_right = s.window_right, o.softcap = s.softcap;
  o.alibi_slopes = s.alibi ? &sl.t.view : nullptr;
  return o;
}

reference::AttentionSpec reference_of(const Spec& s, const Slopes& sl) {
  reference::AttentionSpec rs;
  rs.causal = s.causal, rs.window_left = s.window_left, rs.window_right = s.window_right, rs.softcap = s.softcap;
  rs.alibi_slopes = sl.values;
  return rs;
}

// The sums: scores over head_dim, then P V over the keys (the backward's dk and dv over the
// queries); the probabilities (and the backward's dS) are stored in dt for the second product.
ErrorModel model_of(DType dt, const Spec& s, bool backward) {
  ErrorModel m;
  m.k = std::max({s.d, s.sk, backward ? s.sq : int64_t(1)});
  m.rounded = unit_roundoff(dt);
  return m;
}

VerifyResult run_attention(const std::string& op, DType dt, const Spec& s) {
  cudaStream_t stream = nullptr;
  TestTensor q = bshd(dt, s.b, s.sq, s.hq, s.d, s.heads_major), k = bshd(dt, s.b, s.sk, s.hk, s.d, s.heads_major),
             v = bshd(dt, s.b, s.sk, s.hk, s.d, s.heads_major), out = bshd(dt, s.b, s.sq, s.hq, s.d, false);
  for (TestTensor* t : {&q, &k, &v}) fill_random(*t, -2, 2, stream);
  fill_poison(out, stream);
  const Slopes sl = slopes_of(s, stream);
  HostCopy hq = to_host(q), hk = to_host(k), hv = to_host(v);
  const reference::AttentionOutput ref = reference::attention_forward(hq.view, hk.view, hv.view, reference_of(s, sl));
  attention(q.view, k.view, v.view, out.view, nullptr, options_of(s, sl), stream);
  return compare(op, describe(dt, s), out, ref.out, stream, model_of(dt, s, false));
}

// The backward: dq, dk, dv against the reference's, each compared as compare() does; the result
// is the worst of the three.
VerifyResult run_backward(DType dt, const Spec& s) {
  cudaStream_t stream = nullptr;
  TestTensor q = bshd(dt, s.b, s.sq, s.hq, s.d, s.heads_major), k = bshd(dt, s.b, s.sk, s.hk, s.d, s.heads_major),
             v = bshd(dt, s.b, s.sk, s.hk, s.d, s.heads_major), go = bshd(dt, s.b, s.sq, s.hq, s.d, false),
             out = bshd(dt, s.b, s.sq, s.hq, s.d, false), dq = bshd(dt, s.b, s.sq, s.hq, s.d, false),
             dk = bshd(dt, s.b, s.sk, s.hk, s.d, false), dv = bshd(dt, s.b, s.sk, s.hk, s.d, false);
  TestTensor lse = make_tensor(DType::float32, {s.b, s.hq, s.sq}, Layout::contiguous);
  for (TestTensor* t : {&q, &k, &v, &go}) fill_random(*t, -2, 2, stream);
  for (TestTensor* t : {&dq, &dk, &dv}) fill_poison(*t, stream);
  const Slopes sl = slopes_of(s, stream);
  attention(q.view, k.view, v.view, out.view, &lse.view, options_of(s, sl), stream);
  attention_backward(go.view, q.view, k.view, v.view, out.view, lse.view, dq.view, dk.view, dv.view,
                     options_of(s, sl), stream);
  HostCopy hq = to_host(q), hk = to_host(k), hv = to_host(v), hgo = to_host(go);
  const reference::AttentionGrads ref =
      reference::attention_backward(hgo.view, hq.view, hk.view, hv.view, reference_of(s, sl));
  const std::string name = describe(dt, s);
  const ErrorModel m = model_of(dt, s, true);
  VerifyResult worst = compare("attention_backward", name + " dq", dq, ref.dq, stream, m);
  for (const auto& [t, r, what] : {std::tuple<TestTensor*, const std::vector<double>*, const char*>{&dk, &ref.dk, " dk"},
                                   {&dv, &ref.dv, " dv"}}) {
    keep_worst(worst, compare("attention_backward", name + what, *t, *r, stream, m));
  }
  worst.name = name;
  return worst;
}

std::vector<Spec> specs(bool causal_only) {
  std::vector<Spec> all = {
      {2, 17, 17, 4, 4, 64},
      {1, 1, 1, 2, 2, 128},
      {2, 127, 127, 8, 2, 128, true, -1, -1, 0, true},  // GQA, causal, torch's layout
      {1, 40, 7, 2, 2, 128, true},                       // causal, fully masked rows
      {1, 300, 1000, 4, 1, 128},                         // MQA, seq_q < seq_k
      {1, 1000, 1000, 2, 2, 64, true},
      {1, 257, 300, 2, 1, 256, true},
      {1, 100, 100, 2, 2, 256, false, 16, 4},            // sliding window
      {2, 33, 65, 4, 2, 64, true, 8, -1, 30.0},          // window + soft-cap
      {1, 2, 1000, 4, 1, 80},                            // head_dim 80: the generic tier
      {1, 50, 20, 2, 2, 64, false, 30, 25},              // window sides past the keys: unbounded
      {2, 17, 33, 4, 2, 64, false, -1, -1, 0, false, 1},   // ALiBi [h], GQA, seq_q < seq_k
      {2, 127, 127, 8, 2, 128, true, -1, -1, 0, true, 2},  // ALiBi [b, h], causal, torch's layout
      {1, 40, 7, 2, 2, 128, true, -1, -1, 0, false, 1},    // ALiBi, fully masked rows
      {1, 100, 100, 2, 2, 256, false, 16, 4, 0, false, 2}, // ALiBi, sliding window
      {2, 33, 65, 4, 2, 64, true, 8, -1, 30.0, false, 2},  // ALiBi, window + soft-cap
      {1, 200, 300, 2, 1, 64, false, -1, -1, 0, false, 1}, // ALiBi, many key tiles
      {2, 3, 1000, 8, 2, 128, false, -1, -1, 0, false, 2}, // ALiBi, decode: GQA rows packed
      {1, 4, 777, 4, 4, 64, true, 100, -1, 0, false, 1},   // ALiBi, decode: causal, window
      {1, 2, 1000, 4, 1, 80, false, -1, -1, 0, false, 2},  // ALiBi, the generic tier
  };
  std::vector<Spec> out;
  for (const Spec& s : all)
    if (!causal_only || s.causal) out.push_back(s);
  return out;
}

std::vector<VerifyCase> cases(const std::string& op, bool causal_only) {
  std::vector<VerifyCase> c;
  for (DType dt : kTypes)
    for (const Spec& s : specs(causal_only)) c.push_back({describe(dt, s), false, [=] { return run_attention(op, dt, s); }});
  return c;
}

std::vector<VerifyCase> backward_cases() {
  std::vector<VerifyCase> c;
  for (DType dt : kTypes)
    for (const Spec& s : specs(false))
      if (s.sq * s.sk <= 300 * 300) c.push_back({describe(dt, s), false, [=] { return run_backward(dt, s); }});
  return c;
}

// Sequence length n at head_dim 128, batch x heads = (16384 / n, at least 1) x 32: 4 x 32 at 4096,
// 1 x 32 at 16384. FLOPs 4 b h n^2 d (the two products), half of that under the causal mask;
// bytes: Q, K, V read and O written once.
BenchShape attention_shape(DType dt, int64_t n, bool causal, bool backward = false) {
  const int64_t b = std::max<int64_t>(1, 16384 / n), h = 32, d = 128;
  BenchShape s;
  s.shapes = {{b, n, h, d}, {b, n, h, d}, {b, n, h, d}};
  s.shape = shape_str({b, n, h, d}) + (causal ? " causal" : "");
  s.bytes = 4.0 * double(b * n * h * d) * double(dtype_size(dt));
  s.flops = 4.0 * double(b * h) * double(n) * double(n) * double(d) * (causal ? 0.5 : 1.0);
  if (backward) {  // FlashAttention's count: 2.5 times the forward's (five products, not two)
    s.flops *= 2.5;
    s.bytes *= 2.0;  // q, k, v, out, grad_out read; dq, dk, dv written
  }
  return s;
}

BenchCase attention_bench(const std::string& op, DType dt, int64_t n, bool causal) {
  const BenchShape shape = attention_shape(dt, n, causal);
  struct State { TestTensor q, k, v, out; };
  auto st = std::make_shared<State>();
  st->q = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  st->k = make_tensor(dt, shape.shapes[1], Layout::contiguous);
  st->v = make_tensor(dt, shape.shapes[2], Layout::contiguous);
  st->out = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  for (TestTensor* t : {&st->q, &st->k, &st->v}) fill_random(*t, -2, 2, nullptr);
  BenchCase c = bench_case(op, dt, n, shape);
  AttentionOptions o;
  o.causal = causal;
  State* s = st.get();
  c.run = [s, o](cudaStream_t stream) { attention(s->q.view, s->k.view, s->v.view, s->out.view, nullptr, o, stream); };
  c.state = st;
  return c;
}

BenchCase backward_bench(DType dt, int64_t n) {
  const BenchShape shape = attention_shape(dt, n, false, true);
  struct State { TestTensor q, k, v, out, go, lse, dq, dk, dv; };
  auto st = std::make_shared<State>();
  for (TestTensor* t : {&st->q, &st->k, &st->v, &st->out, &st->go, &st->dq, &st->dk, &st->dv})
    *t = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  const auto& sh = shape.shapes[0];
  st->lse = make_tensor(DType::float32, {sh[0], sh[2], sh[1]}, Layout::contiguous);
  for (TestTensor* t : {&st->q, &st->k, &st->v, &st->go}) fill_random(*t, -2, 2, nullptr);
  attention(st->q.view, st->k.view, st->v.view, st->out.view, &st->lse.view, {}, nullptr);
  BenchCase c = bench_case("attention_backward", dt, n, shape);
  State* s = st.get();
  c.run = [s](cudaStream_t stream) {
    attention_backward(s->go.view, s->q.view, s->k.view, s->v.view, s->out.view, s->lse.view, s->dq.view, s->dk.view,
                       s->dv.view, {}, stream);
  };
  c.state = st;
  return c;
}

const Registrar kRegistrar(10, [] {
  OpInfo op;
  op.name = "attention";
  op.family = "attention";
  op.dtypes = kTypes;
  op.bench_sizes = {512, 1024, 2048, 4096, 8192, 16384};
  op.size_meaning = "sequence length n (batch x heads = max(1, 16384 / n) x 32, head_dim 128)";
  op.tolerance = default_tolerance;
  op.verify_cases = [] { return cases("attention", false); };
  op.make_bench = [](DType dt, int64_t n) { return attention_bench("attention", dt, n, false); };
  op.bench_shape = [](DType dt, int64_t n) { return attention_shape(dt, n, false); };

  OpInfo causal = op;
  causal.name = "attention_causal";
  causal.summary = "attention under the causal mask (its FLOPs counted as half)";
  causal.verify_cases = [] { return cases("attention_causal", true); };
  causal.make_bench = [](DType dt, int64_t n) { return attention_bench("attention_causal", dt, n, true); };
  causal.bench_shape = [](DType dt, int64_t n) { return attention_shape(dt, n, true); };

  OpInfo backward = op;
  backward.name = "attention_backward";
  backward.verify_cases = backward_cases;
  backward.make_bench = backward_bench;
  backward.bench_shape = [](DType dt, int64_t n) { return attention_shape(dt, n, false, true); };
  return std::vector<OpInfo>{op, causal, backward};
});

}  // namespace
}  // namespace tessera::ops
