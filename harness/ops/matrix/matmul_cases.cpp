// Verify and bench cases for matmul, and its registration: what `tessera verify|bench|profile
// matmul` run. The cases cover both tiers (the tensor-core tier takes 16-bit inputs with K or the
// rows contiguous in each operand, TMA-aligned; everything else goes to the SIMT tier), tails in
// every dimension, batches (each operand batched or shared), layouts, and each piece of the
// epilogue. The gated activations (swiglu, geglu) have variants of their own (matmul_swiglu: fused
// into the sm90 tier's epilogue where it takes the call; matmul_swiglu_unfused: the product, then
// tessera::swiglu or geglu_blocks).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bench/cublas.hpp"
#include "bench/host.hpp"
#include "ops/matrix/matmul_reference.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tessera/ops/matrix.hpp"

namespace tessera::ops {
namespace {

using Shape = std::vector<int64_t>;
// Hopper's float8 tensor cores keep about 14 mantissa bits in the accumulator.
constexpr double kFp8AccumulateRoundoff = 0x1p-14;
const std::vector<DType> kFloatTypes = {DType::float32, DType::float16, DType::bfloat16};

struct MatmulSpec {
  int64_t m, k, n;
  int64_t batch_a = 0, batch_b = 0;  // 0: a 2-d operand
  Layout a = Layout::contiguous;     // transposed: column-major
  Layout b = Layout::transposed;     // transposed: column-major, i.e. K contiguous
  bool bias = false, residual = false, out_f32 = false;
  Activation activation = Activation::none;
  double alpha = 1.0, beta = 0.0;
  bool tf32 = false;  // float32 inputs on the TF32 tensor cores (the matmul_tf32 variant)
  bool preact = false;  // the pre-activation output too (MatmulOptions::preactivation)
  bool rowwise = false;  // scaled_mm: scale_a [M, 1] and scale_b [1, N] (else one element each)
  // scaled_mm: scale_a [M, K / 128] (`a_scales` its layout) and scale_b [K / 128, N / 128]
  bool blockwise = false, b_columns = false;  // b_columns: scale_b [K / 128, N] (1 x 128 blocks)
  Layout a_scales = Layout::contiguous;
};

Shape shape_of(int64_t batch, int64_t rows, int64_t cols) {
  return batch ? Shape{batch, rows, cols} : Shape{rows, cols};
}

std::string describe(DType dt, const MatmulSpec& s) {
  std::string d = std::string(dtype_name(dt)) + " " + shape_str(shape_of(s.batch_a, s.m, s.k)) + " " +
                  layout_name(s.a) + " @ " + shape_str(shape_of(s.batch_b, s.k, s.n)) + " " +
                  layout_name(s.b);
  if (s.out_f32) d += " -> float32";
  if (s.bias) d += " +bias";
  if (s.activation != Activation::none) d += std::string(" ") + activation_name(s.activation);
  if (s.residual) d += " +residual";
  if (s.alpha != 1.0) d += " alpha=" + std::to_string(s.alpha).substr(0, 4);
  if (s.beta != 0.0) d += " beta=" + std::to_string(s.beta).substr(0, 4);
  if (s.preact) d += " +preactivation";
  if (s.rowwise) d += " row-wise scales";
  if (s.blockwise) d += std::string(" block-wise scales") + (s.a_scales == Layout::transposed ? " (scale_a M-major)" : "") +
                        (s.b_columns ? " (scale_b per column)" : "");
  return d;
}

// The sums behind an output are dot products of length K; TF32 rounds the operands to a 10-bit
// mantissa first.
ErrorModel model_of(const MatmulSpec& s) {
  ErrorModel m;
  m.k = s.k;
  if (s.tf32) m.rounded = kTf32Roundoff;
  return m;
}

VerifyResult run_matmul(DType dt, const MatmulSpec& s) {
  cudaStream_t stream = nullptr;
  const DType out_dt = s.out_f32 ? DType::float32 : dt;
  const int64_t batch = std::max(s.batch_a, s.batch_b);
  const int64_t out_n = is_gated(s.activation) ? s.n / 2 : s.n;  // gate and up pairs of columns
  TestTensor a = make_tensor(dt, shape_of(s.batch_a, s.m, s.k), s.a);
  TestTensor b = make_tensor(dt, shape_of(s.batch_b, s.k, s.n), s.b);
  TestTensor out = make_tensor(out_dt, shape_of(batch, s.m, out_n), Layout::contiguous);
  fill_random(a, -1, 1, stream);
  fill_random(b, -1, 1, stream);
  TestTensor bias, residual;
  MatmulOptions o;
  o.activation = s.activation, o.alpha = s.alpha, o.beta = s.beta, o.allow_tf32 = s.tf32;
  if (s.bias) {
    bias = make_tensor(out_dt, {s.n}, Layout::contiguous);
    fill_random(bias, -1, 1, stream);
    o.bias = &bias.view;
  }
  if (s.residual) {
    residual = make_tensor(out_dt, shape_of(batch, s.m, s.n), Layout::transposed);
    fill_random(residual, -1, 1, stream);
    o.residual = &residual.view;
  }
  // With beta the output's old contents are an input; otherwise poison, to catch unwritten ones.
  if (s.beta != 0.0) fill_random(out, -1, 1, stream);
  else fill_poison(out, stream);
  HostCopy ha = to_host(a), hb = to_host(b), hc = to_host(out);
  HostCopy hbias = s.bias ? to_host(bias) : HostCopy{}, hres = s.residual ? to_host(residual) : HostCopy{};
  MatmulOptions ho = o;
  ho.bias = s.bias ? &hbias.view : nullptr;
  ho.residual = s.residual ? &hres.view : nullptr;
  const std::vector<double> ref = reference::matmul(ha.view, hb.view, hc.view, ho);
  const char* op = s.tf32 ? "matmul_tf32" : is_gated(s.activation) ? "matmul_swiglu" : "matmul";
  TestTensor z;
  if (!s.preact) {
    matmul(a.view, b.view, out.view, o, stream);
    return compare(op, describe(dt, s), out, ref, stream, model_of(s));
  }
  z = make_tensor(out_dt, shape_of(batch, s.m, s.n), Layout::contiguous);
  fill_poison(z, stream);
  o.preactivation = &z.view;
  matmul(a.view, b.view, out.view, o, stream);
  MatmulOptions hz;  // alpha * input @ other + bias alone
  hz.alpha = o.alpha, hz.bias = ho.bias;
  VerifyResult worst = compare(op, describe(dt, s), out, ref, stream, model_of(s));
  keep_worst(worst, compare(op, describe(dt, s) + " (pre-activation)", z,
                            reference::matmul(ha.view, hb.view, hc.view, hz), stream, model_of(s)));
  return worst;
}

// scaled_mm: float8 inputs (input row-major, other K-contiguous unless `s` says otherwise),
// per-tensor or row-wise scales, out in `out_dt`; the reference multiplies the float8 values as
// stored, then scales each element by its row's and column's scales.
// The block-wise reference: each 128-deep block of K summed on its own (float8 values as stored,
// in double), scaled by its row's and its column block's scales, and the blocks added.
std::vector<double> block_scaled_reference(const HostCopy& ha, const HostCopy& hb, const HostCopy& hsa,
                                           const HostCopy& hsb, const MatmulSpec& s) {
  const int64_t kb = (s.k + 127) / 128;
  const std::vector<double> a = host::tabulate(s.m * s.k, [&](int64_t i) { return host::load_double(ha.view, i); });
  const std::vector<double> b = host::tabulate(s.k * s.n, [&](int64_t i) { return host::load_double(hb.view, i); });
  const std::vector<double> sa = host::tabulate(s.m * kb, [&](int64_t i) { return host::load_double(hsa.view, i); });
  const std::vector<double> sb =
      host::tabulate(hsb.view.numel(), [&](int64_t i) { return host::load_double(hsb.view, i); });
  const int64_t nb = s.b_columns ? s.n : (s.n + 127) / 128, per = s.b_columns ? 1 : 128;
  return host::tabulate(s.m * s.n, [&](int64_t e) {
    const int64_t i = e / s.n, j = e % s.n;
    double total = 0;
    for (int64_t q = 0; q < kb; ++q) {
      double block = 0;
      for (int64_t k = 128 * q; k < std::min(s.k, 128 * (q + 1)); ++k) block += a[i * s.k + k] * b[k * s.n + j];
      total += block * sa[i * kb + q] * sb[q * nb + j / per];
    }
    return total;
  });
}

VerifyResult run_scaled_mm(DType dt, DType out_dt, const MatmulSpec& s) {
  cudaStream_t stream = nullptr;
  const int64_t out_n = is_gated(s.activation) ? s.n / 2 : s.n;  // gate and up pairs of columns
  TestTensor a = make_tensor(dt, {s.m, s.k}, s.a), b = make_tensor(dt, {s.k, s.n}, s.b);
  TestTensor out = make_tensor(out_dt, {s.m, out_n}, Layout::contiguous);
  const int64_t kb = (s.k + 127) / 128, nb = (s.n + 127) / 128;
  TestTensor sa = make_tensor(DType::float32, s.blockwise ? Shape{s.m, kb} : s.rowwise ? Shape{s.m, 1} : Shape{1},
                              s.blockwise ? s.a_scales : Layout::contiguous);
  TestTensor sb = make_tensor(DType::float32, s.blockwise ? Shape{kb, s.b_columns ? s.n : nb} : s.rowwise ? Shape{1, s.n} : Shape{1},
                              Layout::contiguous);
  fill_random(a, -2, 2, stream);
  fill_random(b, -2, 2, stream);
  fill_random(sa, 0.25, 0.5, stream);
  fill_random(sb, 1, 2, stream);
  TestTensor bias, residual, z;
  if (s.bias) {
    bias = make_tensor(out_dt, {s.n}, Layout::contiguous);
    fill_random(bias, -1, 1, stream);
  }
  if (s.residual) {
    residual = make_tensor(out_dt, {s.m, s.n}, Layout::contiguous);
    fill_random(residual, -4, 4, stream);
  }
  // With beta the output's old contents are an input; otherwise poison, to catch unwritten ones.
  if (s.beta != 0.0) fill_random(out, -1, 1, stream);
  else fill_poison(out, stream);
  HostCopy ha = to_host(a), hb = to_host(b), hc = to_host(out), hsa = to_host(sa), hsb = to_host(sb);
  HostCopy hbias = s.bias ? to_host(bias) : HostCopy{}, hres = s.residual ? to_host(residual) : HostCopy{};
  // zr: the scaled product plus bias, [M, N]; then the epilogue's activation, residual and beta.
  std::vector<double> zr = s.blockwise ? block_scaled_reference(ha, hb, hsa, hsb, s)
                                       : reference::matmul(ha.view, hb.view, hc.view, {});
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j)
      zr[i * s.n + j] = (s.blockwise ? zr[i * s.n + j]
                                     : zr[i * s.n + j] * host::load_double(hsa.view, s.rowwise ? i : 0) *
                                           host::load_double(hsb.view, s.rowwise ? j : 0)) +
                        (s.bias ? host::load_double(hbias.view, j) : 0.0);
  const Activation gate_act = s.activation == Activation::geglu ? Activation::gelu_tanh : Activation::silu;
  const std::vector<double> ref = host::tabulate(s.m * out_n, [&](int64_t e) {
    const int64_t i = e / out_n, j = e % out_n;
    if (is_gated(s.activation)) {
      const int64_t gate = gated_gate_column(j, out_n);
      return reference::activation(zr[i * s.n + gate], gate_act) * zr[i * s.n + gate + gated_block_width(j, out_n)];
    }
    return reference::activation(zr[e], s.activation) + (s.residual ? host::load_double(hres.view, e) : 0.0) +
           (s.beta != 0.0 ? s.beta * host::load_double(hc.view, e) : 0.0);
  });
  ScaledMmOptions o;
  o.bias = s.bias ? &bias.view : nullptr, o.beta = s.beta;
  o.residual = s.residual ? &residual.view : nullptr, o.activation = s.activation;
  if (s.preact) {
    z = make_tensor(out_dt, {s.m, s.n}, Layout::contiguous);
    fill_poison(z, stream);
    o.preactivation = &z.view;
  }
  scaled_mm(a.view, b.view, sa.view, sb.view, out.view, o, stream);
  std::string name = describe(dt, s) + " -> " + dtype_name(out_dt);
  // The reference takes the float8 inputs as stored, so only the sum's rounding is measured: the
  // tensor cores add float8 products into an accumulator of about 14 mantissa bits, not float32's
  // 24 (what torch calls use_fast_accum).
  // Block-wise scales promote each block's sum out of the tensor core into float32, so only a
  // block's 128 products share the narrow accumulator: the bound is K / 128 times tighter, which
  // the long-K cases show.
  ErrorModel m;
  m.k = s.blockwise ? std::min<int64_t>(s.k, 128) : s.k;
  m.accumulate = kFp8AccumulateRoundoff;
  VerifyResult worst = compare("scaled_mm", name, out, ref, stream, m);
  if (s.preact) keep_worst(worst, compare("scaled_mm", name + " (pre-activation)", z, zr, stream, m));
  return worst;
}

std::vector<VerifyCase> matmul_cases() {
  using A = Activation;
  const Layout C = Layout::contiguous, T = Layout::transposed;
  const std::vector<MatmulSpec> specs = {
      {128, 64, 256},                        // one tile
      {300, 200, 520},                       // tails in M, N and K
      {1, 4096, 1},                          // a dot product
      {1000, 1000, 777},                     // many tiles, odd N
      {2048, 64, 2304},                      // more tiles than SMs: several per CTA
      {64, 0, 64},                           // K = 0
      {130, 96, 200, 3, 3},                  // batched
      {130, 96, 200, 4, 0},                  // batched input, shared other
      {130, 96, 200, 0, 2},                  // shared input, batched other
      {200, 150, 300, 0, 0, C, C},           // other row-major (N contiguous)
      {200, 150, 300, 0, 0, T, T},           // input column-major
      {64, 100, 72},                         // rows of 200 bytes: not TMA-aligned
      {256, 192, 320, 0, 0, C, C},           // row-major other (N contiguous)
      {256, 192, 320, 0, 0, T, T},           // column-major input (M contiguous)
      {328, 200, 520, 0, 0, T, C},           // both M/N contiguous, tails in M, N and K
      {136, 96, 200, 3, 3, T, C},            // the same, batched
      {256, 128, 384, 0, 0, C, T, true, false, false, A::gelu, 0.5},
      {256, 128, 384, 0, 0, C, T, false, true, false, A::none, 1.0, 0.5},
      {256, 128, 384, 2, 2, C, T, true, true, false, A::silu},
      {256, 128, 384, 0, 0, C, T, true, false, false, A::relu},
      {256, 128, 384, 0, 0, C, T, true, false, false, A::gelu_tanh},
      {256, 192, 320, 0, 0, C, T, false, false, true},  // float32 output
      {300, 200, 520, 0, 0, C, T, true, true},          // bias and residual by TMA, tails
      {130, 96, 200, 3, 3, C, T, false, true},          // a batched residual by TMA
      {256, 192, 320, 0, 0, C, T, false, true, true},   // a residual, float32 output
      {1, 4096, 1000},                                  // split K: one row, a tail in N
      {70, 2048, 384, 0, 0, C, T, true, true, false, A::gelu, 0.5, 0.5},  // split K, epilogue
      {16, 3584, 256, 0, 0, T, C},                      // split K, M/N-contiguous operands
      {8, 2048, 256, 0, 0, C, T, false, false, true},   // split K, float32 output
      {64, 0, 64, 0, 0, C, T, true, true, false, A::gelu, 1.0, 0.5},  // K = 0 with an epilogue
      // The skinny tier (M <= 32, other K-contiguous): one chunk, K split, tails in N and K.
      {1, 4096, 4096},                                   // a decode step: K split
      {5, 1000, 777},                                    // odd N, K not a multiple of the step
      {16, 256, 64},                                     // one piece, fewer columns than a CTA
      {32, 1536, 200, 0, 0, T, T, true, false, false, A::gelu},  // M padded to 32, A strided
      {24, 4104, 136, 0, 0, C, T, false, true, true, A::none, 1.0, 0.5},  // f32 out, beta
      {12, 8200, 520, 0, 0, C, T, true, true, false, A::silu, 0.5},  // many chunks, an epilogue
      {2, 3000, 20000},                                  // no split: several pieces of K
      // The GEMV tier (sm_90, M <= 16, both operands K-contiguous, K a multiple of 64; the cases
      // above of that shape take it too): segments of K, tails in N and K, epilogues.
      {16, 8192, 100, 0, 0, C, T, true, false, false, A::gelu, 0.5},     // 8 stages split, N tail
      {3, 512, 4104, 0, 0, C, T, false, true, true, A::none, 1.0, 0.5},  // residual, f32 out, beta; K < a stage
      {7, 2112, 200, 0, 0, C, T, true, false, false, A::silu},          // K's last stage 64 long
      // The pre-activation beside the output: TMA stores, split tiles, batched, drain (residual,
      // beta), the skinny and GEMV tiers.
      {256, 128, 384, 0, 0, C, T, true, false, false, A::gelu, 0.5, 0.0, false, true},
      {70, 2048, 384, 0, 0, C, T, true, false, false, A::silu, 1.0, 0.0, false, true},
      {130, 96, 200, 3, 3, C, T, true, false, false, A::relu, 1.0, 0.0, false, true},
      {256, 128, 384, 0, 0, C, T, true, true, false, A::gelu_tanh, 1.0, 0.5, false, true},
      {300, 200, 520, 0, 0, C, T, false, false, true, A::gelu, 1.0, 0.0, false, true},
      {12, 8200, 520, 0, 0, C, T, true, true, false, A::silu, 0.5, 0.0, false, true},
      {4, 768, 300, 0, 0, C, T, true, false, false, A::gelu_tanh, 1.0, 0.0, false, true},  // GEMV
  };
  std::vector<VerifyCase> cases;
  for (DType dt : kFloatTypes)
    for (const MatmulSpec& s : specs) {
      if (s.out_f32 && dt == DType::float32) continue;
      cases.push_back({describe(dt, s), false, [=] { return run_matmul(dt, s); }});
    }
  return cases;
}

// Activation swiglu (N even; out has N / 2 columns). On sm_90 the 16-bit cases with
// K-major operands that the sm90 tier takes run it in the epilogue: pingpong (few tiles) and
// cooperative (66 to 132 tiles of 128 x 256 on 132 SMs, or more than a wave), a last tile half
// beyond N, tails in M, batched (3-d maps), the pre-activation beside it. The others take the
// product, then tessera::swiglu: other layouts, few rows (the skinny tier), rows that are not
// 16-byte aligned, a float32 output or inputs, K = 0, N / 2 not a multiple of 64 (a last, shorter
// gate/up block). Activation geglu (GeGLU's gate, tanh-GELU)
// takes the same kernels: the fused epilogue's cases again with it.
std::vector<VerifyCase> matmul_swiglu_cases() {
  const Activation S = Activation::swiglu;
  const Layout C = Layout::contiguous, T = Layout::transposed;
  std::vector<MatmulSpec> specs = {
      {512, 256, 1024, 0, 0, C, T, false, false, false, S},                 // pingpong
      {512, 256, 1024, 0, 0, C, T, true, false, false, S, 1.0, 0.0, false, true},
      {1000, 256, 2944, 0, 0, C, T, true, false, false, S},                 // cooperative, half a tile
      {1000, 256, 2944, 0, 0, C, T, true, false, false, S, 0.5, 0.0, false, true},
      {2048, 128, 5632, 0, 0, C, T, true, false, false, S},                 // several tiles a CTA
      {2048, 64, 5632, 0, 0, C, T, false, false, false, S, 1.0, 0.0, false, true},
      {300, 192, 640, 2, 2, C, T, true, false, false, S, 1.0, 0.0, false, true},  // batched
      {300, 192, 640, 3, 0, C, T, true, false, false, S},                   // shared other
      {77, 192, 384, 0, 0, C, T, true, false, false, S},                    // odd M
      {77, 192, 384, 0, 0, T, C, true, false, false, S},                    // M/N-major: unfused
      {256, 160, 384, 0, 0, C, C, false, false, false, S, 1.0, 0.0, false, true},
      {16, 256, 256, 0, 0, C, T, true, false, false, S},                    // skinny: unfused
      {7, 1000, 128, 0, 0, C, T, true, false, false, S, 1.0, 0.0, false, true},
      {64, 100, 256, 0, 0, C, T, true, false, false, S},                    // rows of 200 bytes
      {256, 128, 384, 0, 0, C, T, true, false, true, S},                    // float32 output
      {64, 0, 256, 0, 0, C, T, true, false, false, S},                      // K = 0
      {77, 96, 200, 0, 0, C, T, true, false, false, S},                     // F = 100: a last block of 36
      {77, 96, 80, 0, 0, C, T, false, false, false, S, 1.0, 0.0, false, true},  // F = 40: no whole block
  };
  for (std::size_t i : {0, 1, 2, 3, 4, 6, 8, 9, 11, 16}) {
    MatmulSpec g = specs[i];
    g.activation = Activation::geglu;
    specs.push_back(g);
  }
  std::vector<VerifyCase> cases;
  for (DType dt : kFloatTypes)
    for (const MatmulSpec& s : specs) {
      if (dt == DType::float32 && (s.out_f32 || s.m * s.n > 1 << 20)) continue;  // the SIMT tier
      cases.push_back({describe(dt, s), false, [=] { return run_matmul(dt, s); }});
    }
  return cases;
}

// The same result from the product into a [.., M, N] buffer (matmul, no activation), then
// tessera::swiglu over it: matmul_swiglu_unfused, the composition the fused epilogue replaces.
VerifyResult run_gated_unfused(DType dt, const MatmulSpec& s) {
  cudaStream_t stream = nullptr;
  TestTensor a = make_tensor(dt, {s.m, s.k}, s.a), b = make_tensor(dt, {s.k, s.n}, s.b);
  TestTensor z = make_tensor(dt, {s.m, s.n}, Layout::contiguous);
  TestTensor out = make_tensor(dt, {s.m, s.n / 2}, Layout::contiguous);
  fill_random(a, -1, 1, stream);
  fill_random(b, -1, 1, stream);
  fill_poison(out, stream);
  HostCopy ha = to_host(a), hb = to_host(b), hc = to_host(out);
  MatmulOptions o;
  o.activation = s.activation;
  const std::vector<double> ref = reference::matmul(ha.view, hb.view, hc.view, o);
  matmul(a.view, b.view, z.view, MatmulOptions{}, stream);
  if (s.activation == Activation::geglu) geglu_blocks(z.view, out.view, stream);
  else swiglu(z.view, out.view, stream);
  ErrorModel m = model_of(s);
  m.rounded = unit_roundoff(dt);  // the product, stored in dt before the activation
  return compare("matmul_swiglu_unfused", describe(dt, s), out, ref, stream, m);
}

std::vector<VerifyCase> matmul_swiglu_unfused_cases() {
  std::vector<VerifyCase> cases;
  for (Activation act : {Activation::swiglu, Activation::geglu}) {
    const MatmulSpec s{512, 256, 1024, 0, 0, Layout::contiguous, Layout::transposed, false, false, false, act};
    for (DType dt : kFloatTypes)
      cases.push_back({describe(dt, s), false, [=] { return run_gated_unfused(dt, s); }});
  }
  return cases;
}

// float32 with TF32 allowed: the tensor cores, with an operand that is not K-contiguous copied
// K-contiguous first; the exact kernel where rows are not 16-byte aligned (within the same bound).
std::vector<VerifyCase> matmul_tf32_cases() {
  using A = Activation;
  const Layout C = Layout::contiguous, T = Layout::transposed;
  std::vector<MatmulSpec> specs = {
      {128, 32, 256},                                            // one tile, one stage
      {300, 200, 520},                                           // tails in M, N and K
      {1000, 1000, 777},                                         // many tiles
      {130, 96, 200, 3, 3},                                      // batched
      {256, 128, 384, 0, 0, C, T, true, true, false, A::gelu, 0.5, 0.0},
      {1, 4096, 1000},                                           // split K
      {200, 150, 300, 0, 0, C, C},  // not K-contiguous, rows not 16-byte aligned: exact
      {256, 192, 320, 0, 0, C, C},  // other row-major: copied K-contiguous
      {256, 192, 320, 0, 0, T, T},  // input column-major: copied
      {136, 96, 200, 3, 3, T, C},   // both copied, batched
      {130, 96, 200, 0, 2, C, C},   // shared input, batched other copied
  };
  std::vector<VerifyCase> cases;
  for (MatmulSpec s : specs) {
    s.tf32 = true;
    cases.push_back({describe(DType::float32, s) + " tf32", false,
                     [=] { return run_matmul(DType::float32, s); }});
  }
  return cases;
}

std::vector<VerifyCase> scaled_mm_cases() {
  const Layout C = Layout::contiguous, T = Layout::transposed;
  std::vector<MatmulSpec> specs = {
      {128, 128, 256},                         // one tile, one stage
      {300, 208, 528},                         // tails in M and N; K in 16-byte rows
      {1000, 1024, 784},                       // many tiles
      {256, 512, 384, 0, 0, C, T, true},       // bias
      {16, 4096, 512},                         // split K
      {200, 96, 136, 0, 0, C, C},              // other N-contiguous: the slower kernel
      {64, 100, 72},                           // rows of 100 bytes: not TMA-aligned
  };
  // Row-wise scales on each path: TMA stores, drain (odd N), bias, split K, the SIMT tier.
  std::vector<MatmulSpec> rowwise = {
      {300, 208, 528},                         // TMA stores
      {333, 256, 517},                         // odd M and N: drain
      {256, 512, 384, 0, 0, C, T, true},       // bias
      {16, 4096, 512},                         // split K
      {1000, 1024, 784},                       // many tiles
      {201, 96, 137, 0, 0, C, C},              // other N-contiguous, odd N: the SIMT tier
      {63, 100, 71},                           // rows of 100 bytes, odd M and N: the SIMT tier
  };
  for (MatmulSpec& s : rowwise) s.rowwise = true;
  specs.insert(specs.end(), rowwise.begin(), rowwise.end());
  // beta (a product accumulated into out over calls): row-wise on TMA stores, drain, split K and
  // the SIMT tier; per-tensor once.
  for (MatmulSpec s : {MatmulSpec{300, 208, 528}, MatmulSpec{333, 256, 517}, MatmulSpec{16, 4096, 512},
                       MatmulSpec{201, 96, 137, 0, 0, C, C}}) {
    s.rowwise = true, s.beta = 1.0;
    specs.push_back(s);
  }
  MatmulSpec tensor_beta{300, 208, 528};
  tensor_beta.beta = 0.5;
  specs.push_back(tensor_beta);
  // matmul's epilogue on the scaled product: activations (TMA stores, drain, the SIMT tier), the
  // residual, the pre-activation output, swiglu and geglu (the product, then the gated op), on
  // each kind of scales.
  const auto epilogue = [](MatmulSpec s, Activation act, bool rowwise, bool blockwise, bool residual, bool preact) {
    s.activation = act, s.rowwise = rowwise, s.blockwise = blockwise, s.residual = residual, s.preact = preact;
    return s;
  };
  for (const MatmulSpec& s :
       {epilogue({300, 208, 528}, Activation::gelu_tanh, true, false, false, false),
        epilogue({333, 256, 517}, Activation::relu, true, false, true, false),
        epilogue({256, 512, 384, 0, 0, C, T, true}, Activation::silu, false, false, false, true),
        epilogue({201, 96, 137, 0, 0, C, C}, Activation::gelu, true, false, true, false),
        epilogue({300, 256, 512}, Activation::swiglu, true, false, false, true),
        epilogue({256, 384, 256}, Activation::geglu, false, false, false, false),
        epilogue({300, 208, 528}, Activation::silu, false, true, true, true),
        epilogue({300, 384, 512}, Activation::swiglu, false, true, false, false)})
    specs.push_back(s);
  // Block-wise scales (e4m3): the block-scaled sm90 kernel (whole and partial tiles, a last
  // partial block of K and of N, scale_a either way round, long K under the tighter bound), the
  // SIMT tier.
  std::vector<MatmulSpec> blockwise = {
      {128, 128, 128},                         // one tile, one block
      {300, 208, 528},                         // tails in M and N; a partial last block of K
      {1000, 1024, 784},                       // many tiles
      {256, 512, 384, 0, 0, C, T, true},       // bias
      {128, 16384, 256},                       // long K: the promotion's bound
      {200, 96, 136, 0, 0, C, C},              // other N-contiguous: the SIMT tier
  };
  for (MatmulSpec& s : blockwise) s.blockwise = true;
  MatmulSpec m_major = {300, 384, 260};
  m_major.blockwise = true, m_major.a_scales = T;
  blockwise.push_back(m_major);
  // scale_b per column (the weight gradient's 1 x 128 blocks of both operands): sm90 with the
  // scales copied with the stages (N a multiple of 4; a partial last block of K), sm90 loading
  // them (odd N), SIMT.
  for (MatmulSpec c : {MatmulSpec{300, 4096, 520}, MatmulSpec{256, 336, 516}, MatmulSpec{256, 640, 333},
                       MatmulSpec{96, 200, 72, 0, 0, C, C}}) {
    c.blockwise = true, c.b_columns = true, c.a_scales = T;
    blockwise.push_back(c);
  }
  specs.insert(specs.end(), blockwise.begin(), blockwise.end());
  std::vector<VerifyCase> cases;
  for (DType dt : {DType::float8_e4m3fn, DType::float8_e5m2})
    for (DType out : {DType::bfloat16, DType::float16, DType::float32})
      for (const MatmulSpec& s : specs) {
        if (out != DType::bfloat16 && s.m != 300) continue;  // other outputs: one case each
        if (s.blockwise && dt != DType::float8_e4m3fn) continue;
        cases.push_back({describe(dt, s) + " -> " + dtype_name(out), false,
                         [=] { return run_scaled_mm(dt, out, s); }});
      }
  return cases;
}

// Square problems, M = N = K = size, input row-major and other K-contiguous (x @ W^T, the layout
// of a linear layer).
BenchShape matmul_shape(DType dt, int64_t n) {
  BenchShape s;
  s.shapes = {{n, n}, {n, n}};
  const std::string d = std::to_string(n);
  s.shape = "[" + d + ", " + d + "] @ [" + d + ", " + d + "]^T";
  s.bytes = 3.0 * double(n) * double(n) * double(dtype_size(dt));
  s.flops = 2.0 * double(n) * double(n) * double(n);
  return s;
}

// op: "matmul", "matmul_tf32" (float32 with TF32 allowed) or "scaled_mm" (float8 inputs, unit
// scales, bfloat16 out); on cuBLAS where `cublas` (matmul and matmul_tf32).
BenchCase gemm_bench(const std::string& op, DType dt, int64_t n, bool cublas = false) {
  const BenchShape shape = matmul_shape(dt, n);
  struct State { TestTensor a, b, out, scale; };
  auto st = std::make_shared<State>();
  const bool fp8 = op == "scaled_mm";
  st->a = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  st->b = make_tensor(dt, shape.shapes[1], Layout::transposed);
  st->out = make_tensor(fp8 ? DType::bfloat16 : dt, {n, n}, Layout::contiguous);
  st->scale = make_tensor(DType::float32, {1}, Layout::contiguous);
  fill_random(st->a, -1, 1, nullptr);
  fill_random(st->b, -1, 1, nullptr);
  fill_random(st->scale, 1, 1.0001, nullptr);
  BenchCase c = bench_case(op, dt, n, shape);
  State* s = st.get();
  MatmulOptions o;
  o.allow_tf32 = op == "matmul_tf32";
  if (cublas) {
    auto gemm = std::make_shared<bench::CublasGemm>();
    const bool tf32 = o.allow_tf32;
    c.run = [s, gemm, tf32, dt, n](cudaStream_t stream) {
      gemm->run(dt, tf32, n, n, n, s->a.view.data, s->b.view.data, s->out.view.data, stream);
    };
  } else if (fp8)
    c.run = [s](cudaStream_t stream) {
      scaled_mm(s->a.view, s->b.view, s->scale.view, s->scale.view, s->out.view, nullptr, stream);
    };
  else
    c.run = [s, o](cudaStream_t stream) { matmul(s->a.view, s->b.view, s->out.view, o, stream); };
  c.state = st;
  return c;
}

BenchCase cublas_bench(const std::string& op, DType dt, int64_t n) {
  return gemm_bench(op, dt, n, true);
}

// Activation swiglu at M = N = K = size (N the product's columns; x @ W^T as matmul_shape): A and B
// read, the N / 2 outputs written; the unfused composition also writes and reads the product.
BenchShape swiglu_shape(DType dt, int64_t n) {
  BenchShape s = matmul_shape(dt, n);
  s.shape += " swiglu";
  s.bytes = 2.5 * double(n) * double(n) * double(dtype_size(dt));
  return s;
}

// op: "matmul_swiglu" (matmul's activation swiglu: fused where the sm90 tier takes it) or
// "matmul_swiglu_unfused" (matmul into a product buffer, then tessera::swiglu).
BenchCase swiglu_bench(const std::string& op, DType dt, int64_t n) {
  const BenchShape shape = swiglu_shape(dt, n);
  struct State { TestTensor a, b, z, out; };
  auto st = std::make_shared<State>();
  const bool fused = op == "matmul_swiglu";
  st->a = make_tensor(dt, shape.shapes[0], Layout::contiguous);
  st->b = make_tensor(dt, shape.shapes[1], Layout::transposed);
  st->out = make_tensor(dt, {n, n / 2}, Layout::contiguous);
  if (!fused) st->z = make_tensor(dt, {n, n}, Layout::contiguous);
  fill_random(st->a, -1, 1, nullptr);
  fill_random(st->b, -1, 1, nullptr);
  BenchCase c = bench_case(op, dt, n, shape);
  State* s = st.get();
  if (fused) {
    MatmulOptions o;
    o.activation = Activation::swiglu;
    c.run = [s, o](cudaStream_t stream) { matmul(s->a.view, s->b.view, s->out.view, o, stream); };
  } else {
    c.run = [s](cudaStream_t stream) {
      matmul(s->a.view, s->b.view, s->z.view, MatmulOptions{}, stream);
      swiglu(s->z.view, s->out.view, stream);
    };
  }
  c.state = st;
  return c;
}

const Registrar kRegistrar(10, [] {
  OpInfo op;
  op.name = "matmul";
  op.family = "matrix";
  op.dtypes = kFloatTypes;
  op.bench_sizes = {256, 512, 1024, 2048, 4096, 8192};
  op.size_meaning = "M = N = K";
  op.tolerance = default_tolerance;
  op.verify_cases = matmul_cases;
  op.make_bench = [](DType dt, int64_t n) { return gemm_bench("matmul", dt, n); };
  op.make_baseline = [](DType dt, int64_t n) { return cublas_bench("matmul", dt, n); };
  op.bench_shape = matmul_shape;

  OpInfo tf32 = op;
  tf32.name = "matmul_tf32";
  tf32.summary = "matmul of float32 inputs with TF32 allowed (torch's allow_tf32)";
  tf32.dtypes = {DType::float32};
  tf32.verify_cases = matmul_tf32_cases;
  tf32.make_bench = [](DType dt, int64_t n) { return gemm_bench("matmul_tf32", dt, n); };
  tf32.make_baseline = [](DType dt, int64_t n) { return cublas_bench("matmul_tf32", dt, n); };

  OpInfo fp8 = op;
  fp8.name = "scaled_mm";
  fp8.dtypes = {DType::float8_e4m3fn, DType::float8_e5m2};
  fp8.verify_cases = scaled_mm_cases;
  fp8.make_bench = [](DType dt, int64_t n) { return gemm_bench("scaled_mm", dt, n); };
  fp8.make_baseline = nullptr;  // cublasGemmEx takes no float8; torch._scaled_mm is the peer

  // `tessera bench matmul_swiglu` times both, side by side.
  OpInfo swiglu = op;
  swiglu.name = "matmul_swiglu";
  swiglu.summary = "matmul with activation swiglu or geglu (gate and up in blocks of 64 columns, N / 2 "
                   "outputs), in the sm90 tier's epilogue where it takes the call";
  swiglu.bench_sizes = {1024, 2048, 4096, 8192};
  swiglu.verify_cases = matmul_swiglu_cases;
  swiglu.make_bench = [](DType dt, int64_t n) { return swiglu_bench("matmul_swiglu", dt, n); };
  swiglu.make_baseline = nullptr;
  swiglu.bench_shape = swiglu_shape;
  OpInfo unfused = swiglu;
  unfused.name = "matmul_swiglu_unfused";
  unfused.summary = "matmul_swiglu's composition without the fused epilogue: matmul, then tessera::swiglu";
  unfused.verify_cases = matmul_swiglu_unfused_cases;
  unfused.make_bench = [](DType dt, int64_t n) { return swiglu_bench("matmul_swiglu_unfused", dt, n); };
  return std::vector<OpInfo>{op, tf32, fp8, swiglu, unfused};
});

}  // namespace
}  // namespace tessera::ops
