// Verify and bench cases for a Mixture-of-Experts layer's permutes, moe_permute (tokens [T, H] to
// their k pair rows [T k, H] in expert order), moe_unpermute (the pairs summed back into tokens)
// and their backwards, and their registration: what `tessera verify|bench|profile moe_permute` run.
// The cases cover the models' hidden sizes (Qwen3-MoE 2048, gpt-oss 2880, DeepSeek-V3 7168), an H
// that is no multiple of 8 and rows that are not 16-byte aligned (the kernels' one-element path),
// row strides wider than H, a misaligned base, k > 8 (the gather's dots in a second pass), no
// routing weights, float32 weights or the input's dtype, no grad_weight, rows out of range (their
// pairs dropped) and no tokens at all. The reference (double) moves the inputs as stored.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/host.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "runtime/check.hpp"
#include "tessera/ops/moe.hpp"

namespace tessera::ops {
namespace {

using Shape = std::vector<int64_t>;

// One op: its name and the library's call (a forward's or a backward's), and its direction.
struct Variant {
  const char* name;
  decltype(&tessera::moe_permute) forward;            // nullptr for a backward
  decltype(&tessera::moe_permute_backward) backward;  // nullptr for a forward
  bool scatter;  // token rows read, pair rows written (moe_permute's direction); else pairs gathered
};
const Variant kVariants[] = {
    {"moe_permute", tessera::moe_permute, nullptr, true},
    {"moe_permute_backward", nullptr, tessera::moe_permute_backward, false},
    {"moe_unpermute", tessera::moe_unpermute, nullptr, false},
    {"moe_unpermute_backward", nullptr, tessera::moe_unpermute_backward, true},
};

enum class Weight { none, float32, same };  // same: the input's dtype

struct Spec {
  int64_t t, k, h;
  Weight weight = Weight::float32;
  bool grad_weight = true;             // backwards: grad_weight given (weight's dtype; float32 without one)
  int64_t pad_in = 0, pad_out = 0;     // the [*, H] inputs' / outputs' row stride is H + pad
  Layout layout = Layout::contiguous;  // of the [*, H] inputs (offset: one element past 16 bytes)
  bool drop = false;                   // two rows out of range (-1, T k + 5): their pairs dropped
  bool backward_only = false;          // what it varies only the backwards see
};

DType weight_dtype(DType dt, Weight w) { return w == Weight::same ? dt : DType::float32; }

std::string describe(DType dt, const Spec& s, bool backward) {
  std::string d = std::string(dtype_name(dt)) + " " + shape_str({s.t, s.h}) + " k=" + std::to_string(s.k) +
                  " weight:" + (s.weight == Weight::none ? "none" : dtype_name(weight_dtype(dt, s.weight)));
  if (s.pad_in) d += " in stride " + std::to_string(s.h + s.pad_in);
  if (s.pad_out) d += " out stride " + std::to_string(s.h + s.pad_out);
  if (s.layout != Layout::contiguous) d += std::string(" ") + layout_name(s.layout);
  if (s.drop) d += " dropped pairs";
  if (backward && !s.grad_weight) d += " no grad_weight";
  if (backward && s.grad_weight && s.weight == Weight::none) d += " grad_weight:float32";
  return d;
}

// [n, h] with a row stride of h + pad.
TestTensor rows_of(DType dt, int64_t n, int64_t h, int64_t pad, Layout layout) {
  TestTensor t = make_tensor(dt, {n, h + pad}, layout);
  t.view.shape[1] = h;
  return t;
}

// rows [T, k]: a seeded shuffle of [0, T k); `drop` puts two pairs out of range.
std::vector<double> routing(int64_t t, int64_t k, uint64_t seed, bool drop) {
  std::vector<double> rows(std::size_t(t * k));
  std::iota(rows.begin(), rows.end(), 0.0);
  std::shuffle(rows.begin(), rows.end(), std::mt19937_64(seed));
  if (drop && rows.size() >= 2) rows[1] = -1.0, rows[rows.size() - 2] = double(t * k + 5);
  return rows;
}

VerifyResult run(const Variant& v, DType dt, const Spec& s) {
  cudaStream_t stream = nullptr;
  const int64_t T = s.t, K = s.k, H = s.h, R = T * K;
  const int64_t x_rows = v.scatter ? T : R, out_rows = v.scatter ? R : T;
  const bool backward = v.backward != nullptr, weighted = s.weight != Weight::none;
  const bool want_gw = backward && s.grad_weight;
  // x: the rows moved (the forward's input, the backward's grad_output); y: the backward's input,
  // of out's shape, the other side of grad_weight's dots.
  TestTensor x = rows_of(dt, x_rows, H, s.pad_in, s.layout), y, w, gw;
  fill_random(x, -1, 1, stream);
  if (backward) {
    y = rows_of(dt, out_rows, H, s.pad_in, s.layout);
    fill_random(y, -1, 1, stream);
  }
  const TestTensor rows =
      upload(DType::int32, {T, K}, routing(T, K, case_seed(uint64_t(T * 1000003 + K * 7919 + H)), s.drop));
  const DType wdt = weight_dtype(dt, s.weight);
  if (weighted) {
    w = make_tensor(wdt, {T, K}, Layout::contiguous);
    fill_random(w, 0, 1, stream);
  }
  if (want_gw) {
    gw = make_tensor(wdt, {T, K}, Layout::contiguous);
    fill_poison(gw, stream);
  }
  // The pair rows that no valid row names are written nowhere: zeroed beforehand, expected zero.
  TestTensor out = rows_of(dt, out_rows, H, s.pad_out, Layout::contiguous);
  if (s.drop && v.scatter) {
    TESSERA_CUDA_CHECK(cudaMemsetAsync(out.storage.data(), 0, out.storage.bytes(), stream));
  } else {
    fill_poison(out, stream);
  }
  const HostCopy hx = to_host(x), hr = to_host(rows);
  const HostCopy hy = backward ? to_host(y) : HostCopy{}, hw = weighted ? to_host(w) : HostCopy{};
  std::vector<double> ref(std::size_t(out_rows * H), 0.0), ref_gw(std::size_t(R), 0.0);
  double terms2 = 0, dots2 = 0;  // sum over the dots of sum_h (x y)^2, and of dot^2
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t p = t * K + j, r = int64_t(host::load_double(hr.view, p));
      if (r < 0 || r >= R) continue;  // dropped: written nowhere, read as zero (grad_weight 0)
      const double wt = weighted ? host::load_double(hw.view, p) : 1.0;
      const int64_t from = v.scatter ? t : r, to = v.scatter ? r : t;
      double dot = 0;
      for (int64_t c = 0; c < H; ++c) {
        const double xv = host::load_double(hx.view, from * H + c);
        ref[std::size_t(to * H + c)] += wt * xv;
        if (!want_gw) continue;
        const double term = xv * host::load_double(hy.view, to * H + c);
        dot += term;
        terms2 += term * term;
      }
      ref_gw[std::size_t(p)] = dot;
      dots2 += dot * dot;
    }
  const TensorView* wp = weighted ? &w.view : nullptr;
  if (backward)
    v.backward(x.view, y.view, rows.view, wp, out.view, want_gw ? &gw.view : nullptr, stream);
  else
    v.forward(x.view, rows.view, wp, out.view, stream);
  const std::string name = describe(dt, s, backward);
  // A gathered row is a float32 sum of k products, a scattered one a single product; grad_weight
  // a float32 dot of H terms, whose rounding errors the model takes as a random walk beside a
  // result as large as the terms' own, sqrt(sum_h (x y)^2). Where the dots cancel below that (a
  // single short dot near zero), c takes the ratio (at least 1; about 1 over many random dots).
  ErrorModel sums, dots;
  sums.k = v.scatter ? 1 : K;
  dots.k = H;
  if (dots2 > 0) dots.c *= std::max(1.0, std::sqrt(terms2 / dots2));
  VerifyResult r = compare(v.name, backward ? name + " grad_input" : name, out, ref, stream, sums);
  if (want_gw) keep_worst(r, compare(v.name, name + " grad_weight", gw, ref_gw, stream, dots));
  return r;
}

std::vector<VerifyCase> cases(const Variant& v) {
  const Weight N = Weight::none, F = Weight::float32, S = Weight::same;
  const Layout C = Layout::contiguous;
  const std::vector<Spec> specs = {
      {1, 1, 8, F},
      {7, 8, 2048, S},                               // Qwen3-MoE's hidden
      {7, 8, 2048, F, false, 0, 0, C, false, true},  // no grad_weight
      {33, 2, 4096, N, false},
      {5, 4, 2880, F},                               // gpt-oss
      {3, 8, 7168, S},                               // DeepSeek-V3
      {12, 16, 1024, F},                             // k > 8: the gather's dots in a second pass
      {9, 3, 1001, S},                               // H not a multiple of 8: one element at a time
      {16, 4, 512, F, true, 8},                      // wider rows, still 16-byte aligned
      {16, 4, 512, S, true, 3, 5},                   // rows not 16-byte aligned
      {10, 2, 256, N, true, 0, 0, Layout::offset},   // a misaligned base; grad_weight without weight
      {6, 4, 128, S, true, 0, 0, C, true},           // rows -1 and T k + 5
      {0, 8, 2048, F},                               // no tokens
  };
  const bool backward = v.backward != nullptr;
  std::vector<VerifyCase> c;
  for (DType dt : {DType::float32, DType::float16, DType::bfloat16})
    for (const Spec& s : specs)
      if (backward || !s.backward_only)
        c.push_back({describe(dt, s, backward), false, [=, &v] { return run(v, dt, s); }});
  return c;
}

// n tokens at Qwen3-MoE's k = 8, H = 2048, float32 routing weights, rows a seeded shuffle. The
// bytes: the rows read and written once (tokens T H, pairs T k H), rows and weight; a backward
// reads the dots' other operand too and writes grad_weight (float32).
constexpr int64_t kBenchK = 8, kBenchH = 2048;

BenchShape shape(const Variant& v, DType dt, int64_t n) {
  const Shape tokens{n, kBenchH}, pairs{n * kBenchK, kBenchH}, small{n, kBenchK};
  const Shape& moved = v.scatter ? tokens : pairs;  // read
  const Shape& other = v.scatter ? pairs : tokens;  // written (and a backward's input)
  const bool backward = v.backward != nullptr;
  const double es = double(dtype_size(dt)), tok = double(n * kBenchH) * es, pair = tok * double(kBenchK);
  const double routing_bytes = double(n * kBenchK) * (4.0 + 4.0);  // int32 rows, float32 weight
  BenchShape s;
  s.shapes = backward ? std::vector<Shape>{moved, other, small, small} : std::vector<Shape>{moved, small, small};
  s.shape = shape_str(moved) + " -> " + shape_str(other);
  s.bytes = tok + pair + routing_bytes;
  if (backward) s.bytes += (v.scatter ? pair : tok) + double(n * kBenchK) * 4.0;
  return s;
}

BenchCase bench(const Variant& v, DType dt, int64_t n) {
  const BenchShape sh = shape(v, dt, n);
  const bool backward = v.backward != nullptr;
  const Shape out_shape = v.scatter ? Shape{n * kBenchK, kBenchH} : Shape{n, kBenchH};
  struct State { TestTensor x, y, rows, weight, out, grad_weight; };
  auto st = std::make_shared<State>();
  st->x = make_tensor(dt, sh.shapes[0], Layout::contiguous);
  fill_random(st->x, -1, 1, nullptr);
  st->out = make_tensor(dt, out_shape, Layout::contiguous);
  if (backward) {
    st->y = make_tensor(dt, out_shape, Layout::contiguous);
    fill_random(st->y, -1, 1, nullptr);
    st->grad_weight = make_tensor(DType::float32, {n, kBenchK}, Layout::contiguous);
  }
  st->weight = make_tensor(DType::float32, {n, kBenchK}, Layout::contiguous);
  fill_random(st->weight, 0, 1, nullptr);
  st->rows = upload(DType::int32, {n, kBenchK}, routing(n, kBenchK, uint64_t(n), false));
  BenchCase c = bench_case(v.name, dt, n, sh);
  State* s = st.get();
  if (backward)
    c.run = [s, &v](cudaStream_t stream) {
      v.backward(s->x.view, s->y.view, s->rows.view, &s->weight.view, s->out.view, &s->grad_weight.view, stream);
    };
  else
    c.run = [s, &v](cudaStream_t stream) { v.forward(s->x.view, s->rows.view, &s->weight.view, s->out.view, stream); };
  c.state = st;
  return c;
}

const Registrar kRegistrar(16, [] {
  std::vector<OpInfo> ops;
  for (const Variant& v : kVariants) {
    OpInfo op;
    op.name = v.name;
    op.bench_sizes = {1024, 4096, 8192, 16384};
    op.size_meaning = "tokens (k = 8, H = 2048)";
    op.tolerance = default_tolerance;
    op.verify_cases = [&v] { return cases(v); };
    op.make_bench = [&v](DType dt, int64_t n) { return bench(v, dt, n); };
    op.bench_shape = [&v](DType dt, int64_t n) { return shape(v, dt, n); };
    ops.push_back(op);
  }
  return ops;
});

}  // namespace
}  // namespace tessera::ops
