// Verify and bench cases for the norm family: layer_norm and rms_norm, plain or with the residual
// add fused (add_layer_norm, add_rms_norm: residual_out = input + residual, then its norm), and
// their backward functions, and their registration: what `tessera verify|bench|profile` run for
// them. The plain norms' shapes walk every configuration of norm.cu (warp and CTA row groups, the
// backward tiers, the streaming kernels, the V = 1 path) and every layout path (gathered inputs,
// scattered outputs, strided statistics), with and without weight/bias; the add-norms' walk the
// same tiers with a residual (add_specs).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/registry.hpp"
#include "ops/rowwise/cases.hpp"
#include "ops/rowwise/norm_reference.hpp"
#include "ops/verify.hpp"
#include "runtime/check.hpp"
#include "bench/host.hpp"
#include "tessera/ops/rowwise.hpp"

namespace tessera::ops::rowwise {
namespace {

using Shape = std::vector<int64_t>;
constexpr double kEps = 1e-5;

// A member of the family: RMSNorm or LayerNorm, with or without the residual add.
struct Kind {
  bool rms, add;
};

std::string op_name(Kind k, bool backward) {
  return std::string(k.add ? "add_" : "") + (k.rms ? "rms_norm" : "layer_norm") + (backward ? "_backward" : "");
}

struct Spec {
  Shape shape;
  int nnorm = 1;                       // normalized_ndim (the add-norms: 1)
  Layout in = Layout::contiguous;      // x (and grad_out; add backward: residual_out too)
  Layout out = Layout::contiguous;     // out (or grad_in; add: residual_out too)
  Layout stats = Layout::contiguous;   // mean and rstd
  Layout res = Layout::contiguous;     // add: residual (backward: grad_residual_out)
  bool weight = true, bias = true;     // bias: layer_norm only
  bool narrow = false;                 // x, grad_out, mean, rstd: views of dimension 1 cut short
                                       // by 2, so that rows are not uniformly strided
  bool grad_in = true, grad_params = true;  // backward: which gradients are asked for
  bool inplace = false;  // add: out is input, residual_out is residual (backward: grad_input is grad_residual_out)
  bool dres = true;      // add backward: grad_residual_out given
  bool dy = true;        // add backward: grad_output given
  double lo = -2, hi = 6;              // x's range: a non-zero mean exercises the variance
  double offset = 0;                   // rms_norm's weight_offset (Gemma's 1 + w)
};

// An add-norm's spec by its layouts: input, residual, outputs.
Spec add_spec(Shape shape, Layout in, Layout res = Layout::contiguous, Layout out = Layout::contiguous) {
  Spec s{std::move(shape)};
  s.in = in, s.res = res, s.out = out;
  return s;
}

Shape leading(const Spec& s) { return Shape(s.shape.begin(), s.shape.end() - s.nnorm); }
Shape normalized(const Spec& s) { return Shape(s.shape.end() - s.nnorm, s.shape.end()); }
ErrorModel sums_of(const Spec& s) {
  int64_t n = 1;
  for (int64_t d : normalized(s)) n *= d;
  return row_sums(s.shape, n);
}

std::string case_name(Kind k, DType dt, const Spec& s, bool backward) {
  std::string name = std::string(dtype_name(dt)) + " " + shape_str(s.shape);
  if (s.nnorm != 1) name += " normalized_ndim=" + std::to_string(s.nnorm);
  if (s.in != Layout::contiguous) name += std::string(" in:") + layout_name(s.in);
  if (s.res != Layout::contiguous) name += std::string(" res:") + layout_name(s.res);
  if (s.out != Layout::contiguous) name += std::string(" out:") + layout_name(s.out);
  if (s.stats != Layout::contiguous) name += std::string(" stats:") + layout_name(s.stats);
  if (s.narrow) name += " narrowed";
  if (s.inplace) name += " in place";
  name += s.weight ? (s.bias ? " w+b" : " w") : " no w";
  if (backward && k.add && !s.dres) name += " no grad_residual_out";
  if (backward && k.add && !s.dy) name += " no grad_output";
  if (backward && !s.grad_in) name += k.add ? " no grad_input" : " no grad_in";
  if (backward && !s.grad_params) name += " no grad_weight/bias";
  if (s.offset != 0) name += " weight_offset=" + std::to_string(s.offset).substr(0, 4);
  if (s.lo != -2 || s.hi != 6) name += " x in [" + std::to_string(s.lo).substr(0, 5) + ", " + std::to_string(s.hi).substr(0, 5) + ")";
  return name;
}

// A test tensor of `shape` in `layout`, or with s.narrow a view of a tensor one dimension larger
// in dimension 1 (needs ndim >= 2 there).
TestTensor make_input(DType dt, Shape shape, Layout layout, bool narrow) {
  if (!narrow || shape.size() < 2) return make_tensor(dt, shape, layout);
  const int64_t keep = shape[1];
  shape[1] += 2;
  TestTensor t = make_tensor(dt, shape, layout);
  t.view.shape[1] = keep;
  return t;
}

// A test tensor filled with the given values (row-major over its shape), NaN in any gaps.
TestTensor upload(DType dt, const Shape& shape, Layout layout, bool narrow, const std::vector<double>& values) {
  TestTensor t = make_input(dt, shape, layout, narrow);
  fill_poison(t, nullptr);
  HostCopy h = to_host(t);
  for (int64_t i = 0; i < t.view.numel(); ++i) host::store_double(h.view, i, values[static_cast<std::size_t>(i)]);
  to_device(t, h);
  return t;
}

TestTensor output(DType dt, const Shape& shape, Layout layout) {
  TestTensor t = make_tensor(dt, shape, layout);
  fill_poison(t, nullptr);
  return t;
}

TestTensor random_input(DType dt, const Shape& shape, Layout layout, double lo, double hi) {
  TestTensor t = make_tensor(dt, shape, layout);
  fill_random(t, lo, hi, nullptr);
  return t;
}

VerifyResult run_plain_forward(bool rms, DType dt, const Spec& s) {
  const char* op = rms ? "rms_norm" : "layer_norm";
  cudaStream_t stream = nullptr;
  TestTensor x = make_input(dt, s.shape, s.in, s.narrow);
  fill_random(x, s.lo, s.hi, stream);
  TestTensor w, b;
  if (s.weight) {
    w = make_tensor(dt, normalized(s), Layout::contiguous);
    fill_random(w, -1, 2, stream);
  }
  const bool bias = s.bias && !rms;
  if (bias) {
    b = make_tensor(dt, normalized(s), Layout::contiguous);
    fill_random(b, -1, 1, stream);
  }
  TestTensor out = output(dt, s.shape, s.out);
  TestTensor mean = make_input(DType::float32, leading(s), s.stats, s.narrow);
  TestTensor rstd = make_input(DType::float32, leading(s), s.stats, s.narrow);
  fill_poison(mean, stream);
  fill_poison(rstd, stream);

  const HostCopy hx = to_host(x);
  HostCopy hw, hb;
  if (s.weight) hw = to_host(w);
  if (bias) hb = to_host(b);
  const TensorView* wv = s.weight ? &hw.view : nullptr;
  const TensorView* bv = bias ? &hb.view : nullptr;
  const std::string name = case_name({rms, false}, dt, s, false);
  const ErrorModel m = sums_of(s);
  if (rms) {
    const auto ref = reference::rms_norm(hx.view, s.nnorm, wv, kEps, s.offset);
    rms_norm(x.view, s.nnorm, s.weight ? &w.view : nullptr, kEps, s.offset, out.view, &rstd.view, stream);
    return fold(op, name, {{"out", compare(op, name, out, ref.out, stream, m)},
                           {"rstd", compare(op, name, rstd, ref.rstd, stream, m)}});
  }
  const auto ref = reference::layer_norm(hx.view, s.nnorm, wv, bv, kEps);
  layer_norm(x.view, s.nnorm, s.weight ? &w.view : nullptr, bias ? &b.view : nullptr, kEps, out.view,
             &mean.view, &rstd.view, stream);
  return fold(op, name, {{"out", compare(op, name, out, ref.out, stream, m)},
                         {"mean", compare(op, name, mean, ref.mean, stream, m)},
                         {"rstd", compare(op, name, rstd, ref.rstd, stream, m)}});
}

// The statistics a forward stores for x (host copy hx): the double reference's rounded to float32,
// in the spec's layout, so that the reference backward uses exactly what the operator is given.
std::pair<TestTensor, TestTensor> saved_stats(bool rms, const Spec& s, const TensorView& hx, const TensorView* wv) {
  auto to_float = [](std::vector<double> v) {
    for (double& e : v) e = static_cast<float>(e);
    return v;
  };
  TestTensor mean, rstd;
  if (rms) {
    rstd = upload(DType::float32, leading(s), s.stats, s.narrow, to_float(reference::rms_norm(hx, s.nnorm, wv, kEps).rstd));
  } else {
    const auto fwd = reference::layer_norm(hx, s.nnorm, wv, nullptr, kEps);
    mean = upload(DType::float32, leading(s), s.stats, s.narrow, to_float(fwd.mean));
    rstd = upload(DType::float32, leading(s), s.stats, s.narrow, to_float(fwd.rstd));
  }
  return {std::move(mean), std::move(rstd)};
}

VerifyResult run_plain_backward(bool rms, DType dt, const Spec& s) {
  const char* op = rms ? "rms_norm_backward" : "layer_norm_backward";
  cudaStream_t stream = nullptr;
  TestTensor x = make_input(dt, s.shape, s.in, s.narrow);
  TestTensor dy = make_input(dt, s.shape, s.in, s.narrow);
  fill_random(x, s.lo, s.hi, stream);
  fill_random(dy, -1, 1, stream);
  TestTensor w;
  if (s.weight) {
    w = make_tensor(dt, normalized(s), Layout::contiguous);
    fill_random(w, -1, 2, stream);
  }
  const HostCopy hx = to_host(x), hdy = to_host(dy);
  HostCopy hw;
  if (s.weight) hw = to_host(w);
  const TensorView* wv = s.weight ? &hw.view : nullptr;

  auto [mean, rstd] = saved_stats(rms, s, hx.view, wv);
  const HostCopy hrstd = to_host(rstd);

  TestTensor dx, dw, db;
  if (s.grad_in) dx = output(dt, s.shape, s.out);
  const bool want_dw = s.grad_params && s.weight, want_db = s.grad_params && !rms;
  if (want_dw) dw = output(dt, normalized(s), Layout::contiguous);
  if (want_db) db = output(dt, normalized(s), Layout::contiguous);

  const std::string name = case_name({rms, false}, dt, s, true);
  const ErrorModel m = sums_of(s);
  std::vector<std::pair<std::string, VerifyResult>> parts;
  if (rms) {
    const auto ref = reference::rms_norm_backward(hdy.view, hx.view, s.nnorm, hrstd.view, wv, s.offset);
    rms_norm_backward(dy.view, x.view, s.nnorm, rstd.view, s.weight ? &w.view : nullptr, s.offset,
                      s.grad_in ? &dx.view : nullptr, want_dw ? &dw.view : nullptr, stream);
    if (s.grad_in) parts.push_back({"grad_in", compare(op, name, dx, ref.grad_in, stream, m)});
    if (want_dw) parts.push_back({"grad_weight", compare(op, name, dw, ref.grad_weight, stream, m)});
  } else {
    const HostCopy hmean = to_host(mean);
    const auto ref = reference::layer_norm_backward(hdy.view, hx.view, s.nnorm, hmean.view, hrstd.view, wv);
    layer_norm_backward(dy.view, x.view, s.nnorm, mean.view, rstd.view, s.weight ? &w.view : nullptr,
                        s.grad_in ? &dx.view : nullptr, want_dw ? &dw.view : nullptr,
                        want_db ? &db.view : nullptr, stream);
    if (s.grad_in) parts.push_back({"grad_in", compare(op, name, dx, ref.grad_in, stream, m)});
    if (want_dw) parts.push_back({"grad_weight", compare(op, name, dw, ref.grad_weight, stream, m)});
    if (want_db) parts.push_back({"grad_bias", compare(op, name, db, ref.grad_bias, stream, m)});
  }
  return fold(op, name, parts);
}

VerifyResult run_add_forward(bool rms, DType dt, const Spec& s) {
  const char* op = rms ? "add_rms_norm" : "add_layer_norm";
  cudaStream_t stream = nullptr;
  TestTensor x = random_input(dt, s.shape, s.in, -2, 4);
  TestTensor r = random_input(dt, s.shape, s.res, -1, 3);  // the sum's mean is not 0: the variance is tested
  const bool bias = s.bias && !rms;
  TestTensor w, b;
  if (s.weight) w = random_input(dt, normalized(s), Layout::contiguous, -1, 2);
  if (bias) b = random_input(dt, normalized(s), Layout::contiguous, -1, 1);
  const HostCopy hx = to_host(x), hr = to_host(r);
  HostCopy hw, hb;
  if (s.weight) hw = to_host(w);
  if (bias) hb = to_host(b);
  const auto ref = rms ? reference::add_rms_norm(hx.view, hr.view, s.weight ? &hw.view : nullptr, kEps)
                       : reference::add_layer_norm(hx.view, hr.view, s.weight ? &hw.view : nullptr,
                                                   bias ? &hb.view : nullptr, kEps);
  TestTensor own_out, own_res;  // in place: out is x and residual_out is r
  if (!s.inplace) own_out = output(dt, s.shape, s.out), own_res = output(dt, s.shape, s.out);
  const TestTensor& out = s.inplace ? x : own_out;
  const TestTensor& res_out = s.inplace ? r : own_res;
  TestTensor mean = output(DType::float32, leading(s), Layout::contiguous);
  TestTensor rstd = output(DType::float32, leading(s), Layout::contiguous);
  const std::string name = case_name({rms, true}, dt, s, false);
  const ErrorModel m = row_sums(s.shape, s.shape.back());
  if (rms) {
    add_rms_norm(x.view, r.view, s.weight ? &w.view : nullptr, kEps, out.view, res_out.view, &rstd.view, stream);
    return fold(op, name, {{"residual_out", compare(op, name, res_out, ref.residual_out, stream, m)},
                           {"out", compare(op, name, out, ref.out, stream, m)},
                           {"rstd", compare(op, name, rstd, ref.rstd, stream, m)}});
  }
  add_layer_norm(x.view, r.view, s.weight ? &w.view : nullptr, bias ? &b.view : nullptr, kEps, out.view,
                 res_out.view, &mean.view, &rstd.view, stream);
  return fold(op, name, {{"residual_out", compare(op, name, res_out, ref.residual_out, stream, m)},
                         {"out", compare(op, name, out, ref.out, stream, m)},
                         {"mean", compare(op, name, mean, ref.mean, stream, m)},
                         {"rstd", compare(op, name, rstd, ref.rstd, stream, m)}});
}

// residual_out is random data of the dtype (what a forward stores), its statistics saved_stats'.
VerifyResult run_add_backward(bool rms, DType dt, const Spec& s) {
  const char* op = rms ? "add_rms_norm_backward" : "add_layer_norm_backward";
  cudaStream_t stream = nullptr;
  TestTensor x = random_input(dt, s.shape, s.in, -2, 6);
  // Without grad_output the reference is given zeros, the op nullptr.
  TestTensor dy = random_input(dt, s.shape, s.in, s.dy ? -1 : 0, s.dy ? 1 : 0);
  TestTensor dres, w;
  if (s.dres) dres = random_input(dt, s.shape, s.res, -1, 1);
  if (s.weight) w = random_input(dt, normalized(s), Layout::contiguous, -1, 2);
  const HostCopy hx = to_host(x), hdy = to_host(dy);
  HostCopy hdres, hw;
  if (s.dres) hdres = to_host(dres);
  if (s.weight) hw = to_host(w);
  const TensorView* wv = s.weight ? &hw.view : nullptr;
  const TensorView* dv = s.dres ? &hdres.view : nullptr;

  auto [mean, rstd] = saved_stats(rms, s, hx.view, wv);
  const HostCopy hrstd = to_host(rstd);

  TestTensor own_dx, dw, db;  // in place: grad_input is grad_residual_out
  if (s.grad_in && !s.inplace) own_dx = output(dt, s.shape, s.out);
  const TestTensor& dx = s.inplace ? dres : own_dx;
  const bool want_dw = s.grad_params && s.weight, want_db = s.grad_params && !rms;
  if (want_dw) dw = output(dt, normalized(s), Layout::contiguous);
  if (want_db) db = output(dt, normalized(s), Layout::contiguous);

  const std::string name = case_name({rms, true}, dt, s, true);
  const ErrorModel m = row_sums(s.shape, s.shape.back());
  std::vector<std::pair<std::string, VerifyResult>> parts;
  std::vector<double> ref_in, ref_w, ref_b;
  if (rms) {
    auto ref = reference::add_rms_norm_backward(hdy.view, dv, hx.view, hrstd.view, wv);
    ref_in = std::move(ref.grad_in), ref_w = std::move(ref.grad_weight);
    add_rms_norm_backward(s.dy ? &dy.view : nullptr, s.dres ? &dres.view : nullptr, x.view, rstd.view, s.weight ? &w.view : nullptr,
                          s.grad_in ? &dx.view : nullptr, want_dw ? &dw.view : nullptr, stream);
  } else {
    const HostCopy hmean = to_host(mean);
    auto ref = reference::add_layer_norm_backward(hdy.view, dv, hx.view, hmean.view, hrstd.view, wv);
    ref_in = std::move(ref.grad_in), ref_w = std::move(ref.grad_weight), ref_b = std::move(ref.grad_bias);
    add_layer_norm_backward(s.dy ? &dy.view : nullptr, s.dres ? &dres.view : nullptr, x.view, mean.view, rstd.view,
                            s.weight ? &w.view : nullptr, s.grad_in ? &dx.view : nullptr,
                            want_dw ? &dw.view : nullptr, want_db ? &db.view : nullptr, stream);
  }
  if (s.grad_in) parts.push_back({"grad_input", compare(op, name, dx, ref_in, stream, m)});
  if (want_dw) parts.push_back({"grad_weight", compare(op, name, dw, ref_w, stream, m)});
  if (want_db) parts.push_back({"grad_bias", compare(op, name, db, ref_b, stream, m)});
  return fold(op, name, parts);
}

std::vector<Spec> plain_specs(bool rms, bool backward) {
  const Layout C = Layout::contiguous, T = Layout::transposed, S = Layout::strided, O = Layout::offset;
  Spec no_wb{{64, 1024}};
  no_wb.weight = no_wb.bias = false;
  Spec w_only{{19, 999}};  // odd N: the V = 1 path
  w_only.bias = false;
  Spec narrowed{{6, 5, 64}};
  narrowed.narrow = true;
  Spec centered{{3000, 256}};  // many rows: every CTA loops; x around 0
  centered.lo = -1, centered.hi = 1;
  std::vector<Spec> v = {
      {{64, 1024}},             // bf16: warp per row; fp32: two 64-thread groups per CTA
      no_wb,
      {{37, 1000}},             // N % V == 0, rows of a ragged group
      w_only,
      {{8, 4096}},              // CTA per row
      {{3, 16384}},             // fp32: 8 vectors per thread on sm_90; backward tiers 2 and 3
      {{5, 3000}},              // groups of 96 / 192 threads
      {{2, 3, 96}, 2},          // two normalized dimensions
      {{4, 5, 256}, 1, C, C, S},  // two leading dimensions, stride-2 mean/rstd
      {{96}},                   // no leading dimensions: 0-d mean/rstd
      {{1, 100003}},            // streaming kernels, V = 1
      {{2, 70000}},             // streaming kernels (fp32 and 16-bit), V = 16 / sizeof
      {{0, 256}},               // no rows (backward: grad_weight/bias are zeros)
      {{64, 1000}, 1, S},       // stride-2 x: gathered
      {{256, 384}, 1, T},       // transposed x: gathered
      {{37, 1024}, 1, O, O},    // misaligned rows: V = 1
      {{16, 512}, 1, C, S},     // strided output: scattered back
      narrowed,                 // rows (and statistics) not uniformly strided: gathered
      centered,
      {{40, 260}},              // N % 4 == 0, N % 8 != 0: V = 4 for fp32, V = 1 for 16-bit
      {{2, 20000}},             // fp32: 1024 x 8 vectors (sm_90); backward: streaming
      {{301, 40000}},           // long rows: forward two-pass CTAs; backward column kernel over
                                // several row ranges, the last one short
      // More rows than resident groups: the forward's persistent groups loop over several rows,
      // loading the next row while they finish the current one.
      {{30000, 256}}, {{20000, 1024}}, {{20000, 1000}}, {{5000, 4096}}, {{3000, 8192}},
  };
  if (rms)  // Gemma's 1 + w: the offset in every kernel (row groups, CTAs, streaming, staged, columns)
    for (Shape sh : {Shape{64, 1024}, Shape{8, 4096}, Shape{19, 999}, Shape{2, 70000}, Shape{301, 40000},
                     Shape{700, 2048}, Shape{3000, 8192}, Shape{4, 8192}}) {
      Spec g{sh};
      g.offset = 1;
      v.push_back(g);
    }
  if (!backward) return v;
  Spec dx_only{{64, 1024}};
  dx_only.grad_params = false;
  Spec params_only{{64, 1024}};
  params_only.grad_in = false;
  Spec dx_only_long{{9, 70000}};  // long rows, dx alone
  dx_only_long.grad_params = false;
  Spec params_only_long{{9, 70000}};  // long rows: no row means needed, column sums only
  params_only_long.grad_in = false;
  const std::vector<Spec> more = {
      dx_only,
      params_only,
      dx_only_long,
      params_only_long,
      {{4, 8192}},    // fp32: tier 2 (staggered prefetch); 16-bit: tier 1, one group of 1024
      {{5, 3001}},    // V = 1, 4 elements per thread
      {{3, 6001}},    // V = 1, 8 elements per thread
      {{700, 2048}},  // several groups per CTA, several rows per group: prefetch across rows
  };
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

// The add-norms' shapes walk the kernels' tiers with a residual (forward: warp, prefetch, vpt4,
// stream; backward: staged, registers, long rows), the V = 1 path, every layout path (gathered
// input or residual, scattered outputs), the in-place forms and a backward without
// grad_residual_out.
std::vector<Spec> add_specs(bool backward) {
  const Layout S = Layout::strided, T = Layout::transposed, O = Layout::offset, C = Layout::contiguous;
  Spec no_wb{{64, 1024}};
  no_wb.weight = no_wb.bias = false;
  Spec w_only{{19, 999}};  // odd N: the V = 1 path
  w_only.bias = false;
  Spec inplace{{64, 1024}};
  inplace.inplace = true;
  Spec inplace_long{{2, 70000}};
  inplace_long.inplace = true;
  Spec inplace_strided = add_spec({64, 1000}, S, S);  // gathered, computed in scratch, scattered back
  inplace_strided.inplace = true;
  std::vector<Spec> v = {
      {{64, 1024}},           // prefetch
      no_wb,
      w_only,
      {{37, 1000}},           // N % V == 0, rows of a ragged group
      {{8, 4096}},            // fp32: prefetch at its longest
      {{3, 16384}},           // vpt4 (fp32 too: the VPT-8 tiers take no residual)
      {{5, 3000}},
      {{4, 5, 256}},          // two leading dimensions
      {{96}},                 // 1-d: 0-d statistics
      {{1, 100003}},          // stream, V = 1
      {{2, 70000}},           // stream, 16-byte vectors
      {{2, 20000}},           // fp32: stream with a residual (vpt8-wide without)
      {{0, 256}},             // no rows (backward: grad_weight/bias are zeros)
      add_spec({64, 1000}, S),        // strided input: gathered
      add_spec({256, 384}, C, T),     // transposed residual: gathered
      add_spec({37, 1024}, O),        // misaligned input: V = 1
      add_spec({37, 1024}, C, O),     // misaligned residual only: V = 1
      add_spec({16, 512}, C, C, S),   // strided outputs: scattered back
      {{40, 260}},            // fp32 V = 4, 16-bit V = 1
      inplace, inplace_long, inplace_strided,
      // More rows than resident groups: persistent groups, the next row (and at VPT <= 2 its
      // residual) loaded ahead.
      {{30000, 256}}, {{20000, 1024}}, {{3000, 8192}},
  };
  if (!backward) return v;
  Spec no_dres{{64, 1024}};
  no_dres.dres = false;
  Spec no_dres_long{{9, 70000}};
  no_dres_long.dres = false;
  Spec dx_only{{64, 1024}};
  dx_only.grad_params = false;
  Spec params_only{{64, 1024}};  // grad_residual_out unused: nothing to add it to
  params_only.grad_in = false;
  Spec no_dy{{64, 1024}};  // only residual_out's gradient: grad_input is it, no pass
  no_dy.dy = false;
  Spec no_dy_strided = add_spec({64, 1000}, C, S, S);
  no_dy_strided.dy = false;
  Spec no_dy_inplace{{64, 1024}};
  no_dy_inplace.dy = false, no_dy_inplace.inplace = true;
  const std::vector<Spec> more = {
      no_dres, no_dres_long, dx_only, params_only, no_dy, no_dy_strided, no_dy_inplace,
      {{9, 70000}},     // long rows: dres added by the column kernel
      {{301, 40000}},   // long rows over several row ranges
      {{4, 8192}},      // staged (sm_90) or registers
      {{5, 3001}},      // V = 1, 4 elements per thread
      {{3, 6001}},      // V = 1, 8 elements per thread
      {{700, 2048}},    // several groups per CTA, several rows per group
      add_spec({64, 1024}, C, S),  // strided grad_residual_out: gathered
  };
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

VerifyResult run(Kind k, bool backward, DType dt, const Spec& s) {
  if (k.add) return backward ? run_add_backward(k.rms, dt, s) : run_add_forward(k.rms, dt, s);
  return backward ? run_plain_backward(k.rms, dt, s) : run_plain_forward(k.rms, dt, s);
}

std::vector<VerifyCase> cases(Kind k, bool backward) {
  std::vector<VerifyCase> c;
  for (DType dt : kFloatTypes)
    for (const Spec& s : k.add ? add_specs(backward) : plain_specs(k.rms, backward))
      c.push_back({case_name(k, dt, s, backward), false, [=] { return run(k, backward, dt, s); }});
  if (!backward) {  // more than 2^31 elements: 64-bit offsets everywhere
    const Spec large{{(int64_t(1) << 31) / 4096 + 1, 4096}};
    c.push_back({case_name(k, DType::bfloat16, large, false), true, [=] { return run(k, false, DType::bfloat16, large); }});
  }
  return c;
}

// The inputs in the order of the signature. Forward: x [rows, N] (add: and the residual), weight
// [N] (and bias [N]); x (and the residual) read, out (and residual_out) written, weight (and bias)
// read once, the statistics written. Backward: grad_out (add: grad_residual_out and
// residual_out) and x [rows, N], (mean and) rstd [rows] in float32, weight [N]; those read,
// grad_in, grad_weight (and grad_bias) written.
BenchShape bench_shape(Kind k, bool backward, DType dt, int64_t n) {
  const int64_t rows = bench_rows(n);
  const double t = static_cast<double>(dtype_size(dt)), r = static_cast<double>(rows), nn = static_cast<double>(n);
  const double params = k.rms ? 1 : 2;  // weight (and bias)
  const double stats = k.rms ? 1 : 2;   // rstd (and mean): 4 bytes per row each
  const int row_tensors = (backward ? 2 : 1) + (k.add ? 1 : 0);
  BenchShape s;
  s.shape = shape_str({rows, n});
  s.shapes.assign(static_cast<std::size_t>(row_tensors), Shape{rows, n});
  if (!backward) {
    s.shapes.push_back({n});
    if (!k.rms) s.shapes.push_back({n});
    s.bytes = (k.add ? 4 : 2) * r * nn * t + params * nn * t + stats * 4 * r;
  } else {
    if (!k.rms) s.shapes.push_back({rows});
    s.shapes.push_back({rows});
    s.shapes.push_back({n});
    s.bytes = (k.add ? 4 : 3) * r * nn * t + nn * t + params * nn * t + stats * 4 * r;
  }
  return s;
}

BenchCase bench(Kind k, bool backward, DType dt, int64_t n) {
  const BenchShape shape = bench_shape(k, backward, dt, n);
  const Shape rows_n = shape.shapes[0], params = {n}, stats = {rows_n[0]};
  struct State { TestTensor x, r, w, b, out, res, mean, rstd, dy, dres, dx, dw, db; };
  auto st = std::make_shared<State>();
  State* s = st.get();
  s->x = random_input(dt, rows_n, Layout::contiguous, -2, k.add ? 4 : 6);
  if (k.add) {
    s->r = random_input(dt, rows_n, Layout::contiguous, -1, 3);
    s->res = make_tensor(dt, rows_n, Layout::contiguous);
  }
  s->w = random_input(dt, params, Layout::contiguous, -1, 2);
  s->out = make_tensor(dt, rows_n, Layout::contiguous);
  s->rstd = make_tensor(DType::float32, stats, Layout::contiguous);
  if (!k.rms) {
    s->b = random_input(dt, params, Layout::contiguous, -1, 1);
    s->mean = make_tensor(DType::float32, stats, Layout::contiguous);
  }
  auto forward = [s, k](cudaStream_t q) {
    if (k.add && k.rms) add_rms_norm(s->x.view, s->r.view, &s->w.view, kEps, s->out.view, s->res.view, &s->rstd.view, q);
    else if (k.add)
      add_layer_norm(s->x.view, s->r.view, &s->w.view, &s->b.view, kEps, s->out.view, s->res.view, &s->mean.view,
                     &s->rstd.view, q);
    else if (k.rms) rms_norm(s->x.view, 1, &s->w.view, kEps, 0.0, s->out.view, &s->rstd.view, q);
    else layer_norm(s->x.view, 1, &s->w.view, &s->b.view, kEps, s->out.view, &s->mean.view, &s->rstd.view, q);
  };
  BenchCase c = bench_case(op_name(k, backward), dt, n, shape);
  c.state = st;
  if (!backward) {
    c.run = forward;
    return c;
  }
  s->dy = random_input(dt, rows_n, Layout::contiguous, -1, 1);
  if (k.add) s->dres = random_input(dt, rows_n, Layout::contiguous, -1, 1);
  s->dx = make_tensor(dt, rows_n, Layout::contiguous);
  s->dw = make_tensor(dt, params, Layout::contiguous);
  if (!k.rms) s->db = make_tensor(dt, params, Layout::contiguous);
  forward(nullptr);  // (residual_out and) the saved statistics the backward is given
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  c.run = [s, k](cudaStream_t q) {
    const TensorView* b = k.rms ? nullptr : &s->db.view;
    if (k.add && k.rms)
      add_rms_norm_backward(&s->dy.view, &s->dres.view, s->res.view, s->rstd.view, &s->w.view, &s->dx.view, &s->dw.view, q);
    else if (k.add)
      add_layer_norm_backward(&s->dy.view, &s->dres.view, s->res.view, s->mean.view, s->rstd.view, &s->w.view,
                              &s->dx.view, &s->dw.view, b, q);
    else if (k.rms)
      rms_norm_backward(s->dy.view, s->x.view, 1, s->rstd.view, &s->w.view, 0.0, &s->dx.view, &s->dw.view, q);
    else
      layer_norm_backward(s->dy.view, s->x.view, 1, s->mean.view, s->rstd.view, &s->w.view, &s->dx.view, &s->dw.view,
                          b, q);
  };
  return c;
}

const Registrar kRegistrar(20, [] {
  std::vector<OpInfo> ops;
  for (Kind kind : {Kind{false, false}, Kind{true, false}, Kind{false, true}, Kind{true, true}})
    for (bool backward : {false, true}) {
      OpInfo op = op_info(op_name(kind, backward));
      op.bench_sizes = {1024, 4096, 8192, 16384};
      op.verify_cases = [kind, backward] { return cases(kind, backward); };
      op.make_bench = [kind, backward](DType dt, int64_t n) { return bench(kind, backward, dt, n); };
      op.bench_shape = [kind, backward](DType dt, int64_t n) { return bench_shape(kind, backward, dt, n); };
      ops.push_back(op);
    }
  return ops;
});

}  // namespace
}  // namespace tessera::ops::rowwise
