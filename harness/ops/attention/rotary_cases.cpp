// rotary_embedding and its backward: the CPU reference (double precision), verify and bench
// cases, and their registration: what `tessera verify|bench|profile rotary_embedding` run.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench/host.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "tessera/ops/attention.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera::ops {
namespace {

using Shape = std::vector<int64_t>;

struct Spec {
  int64_t batch, seq, heads, kv_heads, dim, half, positions;
  RotaryLayout layout = RotaryLayout::bshd;
  bool interleaved = false;
  int64_t offset = 0;
  bool per_batch = false;   // offsets per batch (int32) and angles per batch (3-d cos and sin)
  bool cos_like_q = false;  // cos and sin in q's dtype, else float32
  Layout layout_kind = Layout::contiguous;
  bool packed = false;      // q and k views into one (batch, seq, heads + kv_heads, dim) tensor
};

Shape dims_of(const Spec& s, int64_t heads) {
  return s.layout == RotaryLayout::bshd ? Shape{s.batch, s.seq, heads, s.dim} : Shape{s.batch, heads, s.seq, s.dim};
}

std::string describe(DType dt, const Spec& s) {
  std::string d = std::string(dtype_name(dt)) + (s.layout == RotaryLayout::bshd ? " bshd " : " bhsd ") +
                  shape_str(dims_of(s, s.heads)) + " kv " + std::to_string(s.kv_heads) + " rotary " +
                  std::to_string(2 * s.half) + (s.interleaved ? " interleaved" : "");
  if (s.offset) d += " offset " + std::to_string(s.offset);
  if (s.per_batch) d += " per-batch";
  if (s.cos_like_q) d += " cos in q's dtype";
  if (s.packed) d += " packed qkv";
  if (s.layout_kind != Layout::contiguous) d += std::string(" ") + layout_name(s.layout_kind);
  return d;
}

// The reference: x (logical (b, s|h, h|s, d) order) rotated as the header says, by -angle for the
// backward.
std::vector<double> reference(const Spec& s, const TensorView& x, int64_t heads, const TensorView& c,
                              const TensorView& sn, const std::vector<int64_t>& offs, bool backward) {
  std::vector<double> r(static_cast<size_t>(x.numel()));
  const bool bshd = s.layout == RotaryLayout::bshd;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t q = 0; q < s.seq; ++q)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t row = bshd ? (b * s.seq + q) * heads + h : (b * heads + h) * s.seq + q;
        const int64_t pos = s.offset + q + (offs.empty() ? 0 : offs[size_t(b)]);
        const int64_t a0 = (s.per_batch ? b * s.positions : 0) * s.half + pos * s.half;
        auto at = [&](int64_t i) { return host::load_double(x, row * s.dim + i); };
        for (int64_t i = 0; i < s.dim; ++i) r[size_t(row * s.dim + i)] = at(i);
        for (int64_t j = 0; j < s.half; ++j) {
          const int64_t i1 = s.interleaved ? 2 * j : j, i2 = s.interleaved ? 2 * j + 1 : j + s.half;
          const double cs = host::load_double(c, a0 + j), si = (backward ? -1 : 1) * host::load_double(sn, a0 + j);
          r[size_t(row * s.dim + i1)] = at(i1) * cs - at(i2) * si;
          r[size_t(row * s.dim + i2)] = at(i1) * si + at(i2) * cs;
        }
      }
  return r;
}

VerifyResult run(DType dt, bool backward, const Spec& s) {
  cudaStream_t stream = nullptr;
  const std::string op = backward ? "rotary_embedding_backward" : "rotary_embedding";
  TestTensor qt, kt, packed;
  TensorView q, k;
  if (s.packed) {  // (batch, seq, heads + kv_heads, dim): q the first heads, k the rest
    packed = make_tensor(dt, {s.batch, s.seq, s.heads + s.kv_heads, s.dim}, Layout::contiguous);
    fill_random(packed, -2, 2, stream);
    q = k = packed.view;
    q.shape[2] = s.heads, k.shape[2] = s.kv_heads;
    k.data = static_cast<char*>(k.data) + s.heads * s.dim * int64_t(dtype_size(dt));
  } else {
    qt = make_tensor(dt, dims_of(s, s.heads), s.layout_kind);
    kt = make_tensor(dt, dims_of(s, s.kv_heads), s.layout_kind);
    fill_random(qt, -2, 2, stream);
    fill_random(kt, -2, 2, stream);
    q = qt.view, k = kt.view;
  }
  const DType ct = s.cos_like_q ? dt : DType::float32;
  const Shape angles = s.per_batch ? Shape{s.batch, s.positions, s.half} : Shape{s.positions, s.half};
  TestTensor c = make_tensor(ct, angles, Layout::contiguous), sn = make_tensor(ct, angles, Layout::contiguous);
  fill_random(c, -1, 1, stream);
  fill_random(sn, -1, 1, stream);
  std::vector<int64_t> offs;
  TestTensor offsets;
  if (s.per_batch) {
    for (int64_t b = 0; b < s.batch; ++b) offs.push_back((b * 7) % (s.positions - s.seq - s.offset + 1));
    offsets = upload(DType::int32, {s.batch}, std::vector<double>(offs.begin(), offs.end()));
  }
  TestTensor qo = make_tensor(dt, dims_of(s, s.heads), Layout::contiguous);
  TestTensor ko = make_tensor(dt, dims_of(s, s.kv_heads), Layout::contiguous);
  fill_poison(qo, stream);
  fill_poison(ko, stream);
  const TensorView* op_offsets = s.per_batch ? &offsets.view : nullptr;
  (backward ? rotary_embedding_backward : rotary_embedding)(q, k, c.view, sn.view, s.layout, s.interleaved, s.offset,
                                                          op_offsets, qo.view, ko.view, stream);
  // The inputs as the reference reads them: contiguous copies in their logical order.
  auto logical = [&](const TensorView& v) {
    TestTensor t = make_tensor(dt, Shape(v.shape, v.shape + v.ndim), Layout::contiguous);
    tessera::copy(v, t.view, stream);
    return to_host(t);
  };
  const HostCopy hq = logical(q), hk = logical(k), hc = to_host(c), hs = to_host(sn);
  const std::string name = describe(dt, s);
  VerifyResult r = compare(op, name + " q", qo, reference(s, hq.view, s.heads, hc.view, hs.view, offs, backward), stream);
  keep_worst(r, compare(op, name + " k", ko, reference(s, hk.view, s.kv_heads, hc.view, hs.view, offs, backward), stream));
  return r;
}

std::vector<VerifyCase> cases(bool backward) {
  using L = RotaryLayout;
  const std::vector<Spec> specs = {
      {2, 37, 8, 2, 128, 64, 40},                                    // Llama: full rotary, GQA
      {2, 37, 8, 2, 128, 32, 40, L::bshd, true},                     // GPT-J pairs, half the dims
      {1, 19, 4, 4, 64, 32, 64, L::bhsd, false, 5},                  // SDPA's layout, an offset
      {3, 9, 4, 1, 128, 64, 32, L::bshd, false, 2, true, true},      // decode: per-batch offsets
      {2, 11, 3, 1, 40, 12, 11, L::bshd, false, 0, false, false, Layout::offset},  // unaligned
      {2, 11, 5, 3, 40, 12, 11, L::bshd, true, 0, false, false, Layout::offset},   // unaligned GPT-J pairs
      {2, 7, 9, 3, 64, 32, 9, L::bhsd, false, 0},                    // a head group of one
      {2, 13, 6, 2, 64, 16, 13, L::bshd, true, 0, false, false, Layout::contiguous, true},  // packed
      {1, 0, 4, 2, 64, 32, 8},                                       // nothing to do
  };
  std::vector<VerifyCase> v;
  for (DType dt : {DType::float32, DType::float16, DType::bfloat16})
    for (Spec s : specs) {
      s.cos_like_q = s.cos_like_q && dt != DType::float32;
      v.push_back({describe(dt, s), false, [=] { return run(dt, backward, s); }});
    }
  return v;
}

// Size n: tokens; (n / 2048 or 1) sequences of min(n, 2048), 32 query heads and 8 key heads of 128.
BenchShape shape(DType dt, int64_t n) {
  const int64_t seq = std::min<int64_t>(n, 2048), batch = std::max<int64_t>(1, n / 2048);
  BenchShape s;
  s.shapes = {{batch, seq, 32, 128}, {batch, seq, 8, 128}};
  s.shape = shape_str(s.shapes[0]) + " + " + shape_str(s.shapes[1]);
  s.bytes = 2.0 * double(batch * seq * 40 * 128) * double(dtype_size(dt));  // q and k read and written
  return s;
}

BenchCase bench(DType dt, int64_t n, bool backward) {
  const BenchShape sh = shape(dt, n);
  struct State { TestTensor q, k, qo, ko, c, s; };
  auto st = std::make_shared<State>();
  st->q = make_tensor(dt, sh.shapes[0], Layout::contiguous), st->qo = make_tensor(dt, sh.shapes[0], Layout::contiguous);
  st->k = make_tensor(dt, sh.shapes[1], Layout::contiguous), st->ko = make_tensor(dt, sh.shapes[1], Layout::contiguous);
  st->c = make_tensor(DType::float32, {sh.shapes[0][1], 64}, Layout::contiguous);
  st->s = make_tensor(DType::float32, {sh.shapes[0][1], 64}, Layout::contiguous);
  for (TestTensor* t : {&st->q, &st->k, &st->c, &st->s}) fill_random(*t, -1, 1, nullptr);
  BenchCase c = bench_case(backward ? "rotary_embedding_backward" : "rotary_embedding", dt, n, sh);
  State* s = st.get();
  c.run = [s, backward](cudaStream_t stream) {
    (backward ? rotary_embedding_backward : rotary_embedding)(s->q.view, s->k.view, s->c.view, s->s.view,
                                                            RotaryLayout::bshd, false, 0, nullptr, s->qo.view,
                                                            s->ko.view, stream);
  };
  c.state = st;
  return c;
}

const Registrar kRegistrar(30, [] {
  std::vector<OpInfo> ops;
  for (bool bwd : {false, true}) {
    OpInfo op;
    op.name = bwd ? "rotary_embedding_backward" : "rotary_embedding";
    op.bench_sizes = {1024, 4096, 16384, 65536};
    op.size_meaning = "tokens n (n / 2048 or 1 sequences; 32 query and 8 key heads of 128)";
    op.tolerance = default_tolerance;
    op.verify_cases = [bwd] { return cases(bwd); };
    op.make_bench = [bwd](DType dt, int64_t n) { return bench(dt, n, bwd); };
    op.bench_shape = [](DType dt, int64_t n) { return shape(dt, n); };
    ops.push_back(op);
  }
  return ops;
});

}  // namespace
}  // namespace tessera::ops
