// Verify and bench cases for float8_quantize and float8_quantize_gated, and their registration:
// what `tessera verify|bench|profile float8_quantize[_gated]` run. Every output is compared byte
// for byte (q, q_t) and bit for bit (the scales) with the reference: the rules fix each one
// exactly. The cases walk the four
// granularities with and without the transposed copy (the block ones: partial 1 x 128 blocks,
// several 128 x 128 tiles, one tile, a K of one half tile), each input dtype, odd M and K (rows only
// and tensor: any; the transposed copy needs multiples of 16), partial tiles, rows off 16-byte
// boundaries and padded rows (the element-wise path), and special rows and columns: all zeros
// (an amax under the 1e-12 floor), an inf, a NaN (NaN scales and NaN bytes), values of magnitude
// near and above 448, one large value beside small ones (products in e4m3's subnormal range), and
// products exactly halfway between two e4m3 values (rounded to the even one); and the columns alone
// (float8_quantize_transposed); and a gated product quantized in the pass that computes it
// (float8_quantize_gated), against the gated op's output quantized.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/host.hpp"
#include "ops/matrix/float8_quantize_reference.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "runtime/check.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tessera/ops/matrix.hpp"

namespace tessera::ops {
namespace {

struct Spec {
  int64_t rows = 0, cols = 0;
  Float8Granularity g = Float8Granularity::row;
  bool columns = false;  // the transposed copy too
  int pad = 0;           // elements after each row (the row stride is cols + pad)
  bool offset = false;   // the first element one past a 16-byte boundary
  bool special = true;   // the special rows and columns (else uniform values only)
  bool nonfinite = true; // among them an inf and a NaN (which make every scale of a tensor NaN)
  bool with_q = true;    // q and scale (false: the columns alone, float8_quantize_transposed)
  Activation gate = Activation::none;  // silu or gelu_tanh: float8_quantize_gated, the input the gate
};

const char* granularity_name(Float8Granularity g) {
  switch (g) {
    case Float8Granularity::tensor: return "tensor";
    case Float8Granularity::row: return "row";
    case Float8Granularity::block: return "block";
    default: return "block2d";
  }
}

std::string describe(DType dt, const Spec& s) {
  std::string d = std::string(dtype_name(dt)) + " " + shape_str({s.rows, s.cols}) + " " + granularity_name(s.g);
  if (s.columns) d += s.with_q ? " columns" : " columns only";
  if (s.pad) d += " padded rows +" + std::to_string(s.pad);
  if (s.offset) d += " offset";
  if (!s.special) d += " uniform";
  else if (!s.nonfinite) d += " finite";
  if (s.gate != Activation::none) d += std::string(" gated ") + activation_name(s.gate);
  return d;
}

// The value at (i, j): uniform in [-8, 8), and for `special` inputs rows 1..6 (and columns 1..2,
// where there are several rows) as the file's comment says.
double value(const Spec& s, std::mt19937_64& g, int64_t i, int64_t j) {
  const double inf = std::numeric_limits<double>::infinity();
  const double u = std::uniform_real_distribution<double>(-8, 8)(g);
  if (!s.special || s.rows * s.cols < 4) return u;
  const int64_t k = s.cols;
  if (i == 1 || (s.rows > 8 && j == 1)) return 0.0;                         // a zero row and column
  if (s.nonfinite && i == 2 && j == k / 2) return -inf;                     // an inf
  if (s.nonfinite && i == 3 && j == k - 1) return std::nan("");             // a NaN
  if (i == 4) return (j % 2 ? -1 : 1) * (440.0 + double(j % 17));           // near 448 and above it
  if (i == 5) return j == 0 ? 30000.0 : u * 1e-2;                           // subnormal products
  if (i == 6 && j > 0)  // multiplier 1 (448 at j = 0): products exactly halfway between e4m3 values
    return (j % 2 ? -1 : 1) * std::ldexp(1.0 + double(2 * (j % 8) + 1) / 16.0, int(j % 13) - 6);
  if (i == 6) return 448.0;
  if (s.rows > 8 && j == 2) return i % 3 ? u * 1e-3 : 1e4 + double(i);     // a column of mixed scales
  return u;
}

// The input and its values as float32 (what the kernels read; each dtype converts exactly).
// `stream` picks another draw of the uniform values (a gated case's up).
TestTensor input(DType dt, const Spec& s, std::vector<float>& held, uint64_t stream = 0) {
  const int64_t stride = s.cols + s.pad;
  TestTensor t = make_tensor(dt, {s.rows, stride}, s.offset ? Layout::offset : Layout::contiguous);
  HostCopy h = to_host(t);
  std::mt19937_64 g(case_seed(uint64_t(s.rows * 131 + s.cols * 7 + s.pad) + stream * 1000003));
  held.assign(size_t(s.rows * s.cols), 0.f);
  for (int64_t i = 0; i < s.rows; ++i)
    for (int64_t j = 0; j < stride; ++j) {
      host::store_double(h.view, i * stride + j, j < s.cols ? value(s, g, i, j) : 7.0);
      if (j < s.cols) held[size_t(i * s.cols + j)] = float(host::load_double(h.view, i * stride + j));
    }
  to_device(t, h);
  t.view.shape[1] = s.cols;
  return t;
}

// A device output filled with a byte no correct output has everywhere (0xa5: -0.40625 in e4m3).
TestTensor output(DType dt, const std::vector<int64_t>& shape) {
  TestTensor t = make_tensor(dt, shape, Layout::contiguous);
  TESSERA_CUDA_CHECK(cudaMemset(t.storage.data(), 0xa5, size_t(t.storage_elems) * dtype_size(dt)));
  return t;
}

// Fails `r` unless `out`'s bytes equal `want`'s (q: bytes; scales: float bits, NaN's included).
template <class E>
void check_bytes(VerifyResult& r, const char* what, const TestTensor& out, const std::vector<E>& want, int64_t cols) {
  const HostCopy h = to_host(out);
  const size_t n = want.size() * sizeof(E);
  if (h.bytes.size() < n) {
    r.passed = false, r.detail = std::string(what) + ": output smaller than the reference";
    return;
  }
  const auto* got = h.bytes.data();
  const auto* ref = reinterpret_cast<const unsigned char*>(want.data());
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(got + i * sizeof(E), ref + i * sizeof(E), sizeof(E)) != 0)
      differ += 1, first = first < 0 ? int64_t(i) : first;
  if (differ == 0) return;
  r.max_abs = std::max(r.max_abs, double(differ));
  if (!r.passed) return;
  r.passed = false;
  uint32_t g = 0, w = 0;
  std::memcpy(&g, got + size_t(first) * sizeof(E), sizeof(E));
  std::memcpy(&w, ref + size_t(first) * sizeof(E), sizeof(E));
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s: %lld of %zu elements differ; first at [%lld, %lld]: 0x%x, want 0x%x", what,
                (long long)differ, want.size(), (long long)(first / cols), (long long)(first % cols), g, w);
  r.detail = buf;
}

// A device tensor's elements, as the reference vectors hold them.
template <class E>
std::vector<E> host_elements(const TestTensor& t) {
  const HostCopy h = to_host(t);
  std::vector<E> v(h.bytes.size() / sizeof(E));
  std::memcpy(v.data(), h.bytes.data(), v.size() * sizeof(E));
  return v;
}

// float8_quantize_gated's reference: the gated op's output (silu_mul or geglu, itself verified
// against float64) quantized by float8_quantize (verified against float8_quantize's reference
// above), both on the device: the fused call must give their bytes exactly.
reference::Float8Quantized gated_reference(DType dt, const Spec& s, const TestTensor& gate, const TestTensor& up) {
  TestTensor product = make_tensor(dt, {s.rows, s.cols}, Layout::contiguous);
  if (s.gate == Activation::silu) silu_mul(gate.view, up.view, product.view, nullptr);
  else geglu(gate.view, up.view, product.view, nullptr);
  const Float8ScaleShapes shapes = float8_scale_shapes(s.rows, s.cols, s.g);
  TestTensor q = output(DType::float8_e4m3fn, {s.rows, s.cols}), scale = output(DType::float32, shapes.scale);
  TestTensor qt, st;
  if (s.columns) qt = output(DType::float8_e4m3fn, {s.cols, s.rows}), st = output(DType::float32, shapes.scale_t);
  float8_quantize(product.view, q.view, scale.view, s.columns ? &qt.view : nullptr, s.columns ? &st.view : nullptr,
                  s.g, nullptr);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  reference::Float8Quantized r;
  r.q = host_elements<uint8_t>(q), r.scale = host_elements<float>(scale);
  if (s.columns) r.q_t = host_elements<uint8_t>(qt), r.scale_t = host_elements<float>(st);
  return r;
}

VerifyResult run_case(DType dt, const Spec& s) {
  std::vector<float> x, u;
  const TestTensor in = input(dt, s, x);
  const bool gated = s.gate != Activation::none;
  TestTensor up;
  if (gated) {
    Spec plain = s;
    plain.special = false;  // the gate's special values already reach the product
    up = input(dt, plain, u, 1);
  }
  const int64_t mb = (s.rows + 127) / 128, kb = (s.cols + 127) / 128;
  const auto shapes = [&](bool columns) -> std::vector<int64_t> {
    switch (s.g) {
      case Float8Granularity::tensor: return {};
      case Float8Granularity::row: return columns ? std::vector<int64_t>{1, s.cols} : std::vector<int64_t>{s.rows, 1};
      case Float8Granularity::block: return columns ? std::vector<int64_t>{mb, s.cols} : std::vector<int64_t>{s.rows, kb};
      default: return {mb, kb};
    }
  };
  TestTensor q = output(DType::float8_e4m3fn, {s.rows, s.cols});
  TestTensor scale = output(DType::float32, shapes(false));
  TestTensor qt, st;
  if (s.columns) {
    qt = output(DType::float8_e4m3fn, {s.cols, s.rows});
    st = output(DType::float32, shapes(true));
  }
  if (gated)
    float8_quantize_gated(in.view, up.view, s.gate, q.view, scale.view, s.columns ? &qt.view : nullptr,
                          s.columns ? &st.view : nullptr, s.g, nullptr);
  else if (s.with_q)
    float8_quantize(in.view, q.view, scale.view, s.columns ? &qt.view : nullptr, s.columns ? &st.view : nullptr, s.g,
                    nullptr);
  else
    float8_quantize_transposed(in.view, qt.view, st.view, s.g, nullptr);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  const reference::Float8Quantized ref =
      gated ? gated_reference(dt, s, in, up) : reference::float8_quantize(x, s.rows, s.cols, s.g, s.columns);
  VerifyResult r;
  r.op = gated ? "float8_quantize_gated" : "float8_quantize";
  r.name = describe(dt, s);
  r.passed = true;
  const auto last = [](const std::vector<int64_t>& shape) { return shape.empty() ? int64_t(1) : shape.back(); };
  if (s.with_q) {
    check_bytes(r, "q", q, ref.q, s.cols);
    check_bytes(r, "scale", scale, ref.scale, last(shapes(false)));
  }
  if (s.columns) {
    check_bytes(r, "q_t", qt, ref.q_t, s.rows);
    check_bytes(r, "scale_t", st, ref.scale_t, last(shapes(true)));
  }
  return r;
}

// float8_quantize's cases, or (gated) float8_quantize_gated's.
std::vector<VerifyCase> cases(bool gated) {
  std::vector<Spec> all;
  for (Float8Granularity g : {Float8Granularity::row, Float8Granularity::tensor}) {
    all.push_back({64, 1000, g});                              // 16-byte fragments, partial tiles
    all.push_back({33, 131, g});                               // odd M and K: element by element
    all.push_back({1, 1, g});                                  // one element
    all.push_back({7, 14336, g});                              // long rows
    all.push_back({40, 4096, g, false, 3});                    // padded rows (unaligned): elements
    all.push_back({40, 512, g, false, 8});                     // padded rows, still 16-byte aligned
    all.push_back({17, 256, g, false, 0, true});               // rows off 16-byte boundaries
    all.push_back({300, 1024, g, false, 0, false, false});     // uniform: no NaN to hide behind
    for (int64_t m : {16, 80, 256})                            // the transposed copy, partial tiles
      all.push_back({m, m == 80 ? 48 : 1024, g, true});
    all.push_back({1008, 528, g, true});                       // partial tiles on both sides
    all.push_back({16, 16, g, true});                          // the smallest transposed copy
    all.push_back({128, 64, g, true});                         // one whole 128 x 64 tile
    all.push_back({384, 208, g, true, 0, true});               // whole row tiles, off 16 bytes
    all.push_back({272, 336, g, true, 4});                     // rows 16-byte aligned for fp32 only
    all.push_back({64, 640, g, true, 8});                      // padded rows, transposed
    all.push_back({48, 96, g, true, 0, true});                 // off 16-byte boundaries, transposed
    all.push_back({256, 512, g, true, 0, false, false});       // uniform, transposed
    all.push_back({33, 131, g, false, 0, false, true, false}); // zeros, near 448, subnormals
    all.push_back({80, 48, g, true, 0, false, true, false});
  }
  // The block granularities (one pass over 128 x 128 tiles).
  for (Float8Granularity g : {Float8Granularity::block, Float8Granularity::block2d}) {
    const bool b2 = g == Float8Granularity::block2d;
    all.push_back({256, 384, g});                              // whole tiles
    all.push_back({384, 256, g, true});                        // whole tiles, transposed
    all.push_back({128, 128, g, true, 0, false, false});       // one tile, uniform
    all.push_back({128, 640, g, true, 8});                     // padded rows, transposed
    all.push_back({256, 128, g, false, 0, true});              // rows off 16-byte boundaries
    all.push_back({256, 256, g, true, 0, false, true, false}); // zeros, near 448, subnormals
    if (b2) continue;
    all.push_back({33, 131, g});                               // odd M and K: partial blocks, element by element
    all.push_back({64, 1000, g});                              // a partial last block of each row
    all.push_back({7, 14336, g});                              // long rows
    all.push_back({80, 48, g, true});                          // K of less than half a tile, transposed
    all.push_back({1008, 528, g, true});                       // partial tiles on both sides
    all.push_back({272, 336, g, true, 4});                     // rows 16-byte aligned for fp32 only
  }
  // The columns alone (a weight's copy for dgrad): every granularity, partial tiles, off 16 bytes.
  for (Float8Granularity g : {Float8Granularity::row, Float8Granularity::tensor, Float8Granularity::block,
                              Float8Granularity::block2d}) {
    const bool b2 = g == Float8Granularity::block2d;
    all.push_back({b2 ? 256 : 1008, b2 ? 384 : 528, g, true, 0, false, true, true, false});
    all.push_back({b2 ? 128 : 48, b2 ? 640 : 96, g, true, 0, true, true, true, false});
  }
  // A gated product (float8_quantize_gated): the two-pass granularities (the product left for pass
  // 2) and the one-pass ones, rows alone and with the transposed copy, partial tiles, odd shapes
  // (element by element), padded rows and rows off 16-byte boundaries.
  for (Float8Granularity g : {Float8Granularity::row, Float8Granularity::tensor, Float8Granularity::block,
                              Float8Granularity::block2d}) {
    const bool b2 = g == Float8Granularity::block2d;
    auto gated = [&](Spec s, Activation a = Activation::silu) { s.gate = a, all.push_back(s); };
    gated({b2 ? 256 : 1008, b2 ? 384 : 528, g, true});
    gated({b2 ? 128 : 64, b2 ? 256 : 1000, g}, Activation::gelu_tanh);
    gated({b2 ? 128 : 48, b2 ? 640 : 96, g, true, 0, true});
    gated({b2 ? 128 : 80, b2 ? 640 : 64, g, true, 8}, Activation::gelu_tanh);
    if (!b2) gated({33, 131, g});
  }
  all.push_back({0, 64});                                      // no rows: nothing to do
  all.push_back({0, 64, Float8Granularity::row, false, 0, false, true, true, true, Activation::silu});
  std::vector<VerifyCase> c;
  for (DType dt : {DType::float32, DType::float16, DType::bfloat16})
    for (const Spec& s : all)
      if ((s.gate != Activation::none) == gated) c.push_back({describe(dt, s), false, [=] { return run_case(dt, s); }});
  return c;
}

// size K over 8192 rows, row-wise with the transposed copy (what a backward's gradient takes):
// x read once, q and q_t written once each.
BenchShape float8_quantize_shape(DType dt, int64_t k) {
  const int64_t m = 8192;
  BenchShape s;
  s.shapes = {{m, k}};
  s.shape = shape_str({m, k});
  s.bytes = double(m) * double(k) * (double(dtype_size(dt)) + 2.0) + 4.0 * double(m + k);
  return s;
}

// The gated product's: gate and up read instead of x.
BenchShape float8_quantize_gated_shape(DType dt, int64_t k) {
  BenchShape s = float8_quantize_shape(dt, k);
  s.shapes.push_back(s.shapes[0]);
  s.bytes += double(s.shapes[0][0]) * double(k) * double(dtype_size(dt));
  return s;
}

BenchCase quantize_bench(DType dt, int64_t k, bool gated) {
  const BenchShape shape = gated ? float8_quantize_gated_shape(dt, k) : float8_quantize_shape(dt, k);
  const int64_t m = shape.shapes[0][0];
  struct State { TestTensor x, up, q, scale, qt, st; };
  auto st = std::make_shared<State>();
  st->x = make_tensor(dt, {m, k}, Layout::contiguous);
  fill_random(st->x, -8, 8, nullptr);
  if (gated) {
    st->up = make_tensor(dt, {m, k}, Layout::contiguous);
    fill_random(st->up, -8, 8, nullptr);
  }
  st->q = make_tensor(DType::float8_e4m3fn, {m, k}, Layout::contiguous);
  st->qt = make_tensor(DType::float8_e4m3fn, {k, m}, Layout::contiguous);
  st->scale = make_tensor(DType::float32, {m, 1}, Layout::contiguous);
  st->st = make_tensor(DType::float32, {1, k}, Layout::contiguous);
  BenchCase c = bench_case(gated ? "float8_quantize_gated" : "float8_quantize", dt, k, shape);
  State* p = st.get();
  c.run = [p, gated](cudaStream_t stream) {
    if (gated)
      float8_quantize_gated(p->x.view, p->up.view, Activation::silu, p->q.view, p->scale.view, &p->qt.view,
                            &p->st.view, Float8Granularity::row, stream);
    else
      float8_quantize(p->x.view, p->q.view, p->scale.view, &p->qt.view, &p->st.view, Float8Granularity::row, stream);
  };
  c.state = st;
  return c;
}

const Registrar kRegistrar(15, [] {
  OpInfo op;
  op.name = "float8_quantize";
  op.bench_sizes = {1024, 4096, 8192, 14336};
  op.size_meaning = "columns K (rows M = 8192), row-wise with the transposed copy";
  op.tolerance = default_tolerance;
  op.verify_cases = [] { return cases(false); };
  op.make_bench = [](DType dt, int64_t k) { return quantize_bench(dt, k, false); };
  op.bench_shape = float8_quantize_shape;
  OpInfo gated = op;
  gated.name = "float8_quantize_gated";
  gated.size_meaning = "columns K (rows M = 8192), SwiGLU's product row-wise with the transposed copy";
  gated.verify_cases = [] { return cases(true); };
  gated.make_bench = [](DType dt, int64_t k) { return quantize_bench(dt, k, true); };
  gated.bench_shape = float8_quantize_gated_shape;
  return std::vector<OpInfo>{op, gated};
});

}  // namespace
}  // namespace tessera::ops
