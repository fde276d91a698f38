// Verify and bench cases for add_layer_norm, add_rms_norm and their backward functions (the
// residual add fused with the norm; norm_cases.cpp has the plain norms'), and their registration.
// The shapes walk the kernels' tiers with a residual (forward: warp, prefetch, vpt4, stream;
// backward: staged, registers, long rows), the V = 1 path, every layout path (gathered input or
// residual, scattered outputs), the in-place forms and a backward without grad_residual_out.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/registry.hpp"
#include "ops/rowwise/cases.hpp"
#include "ops/rowwise/norm_reference.hpp"
#include "ops/verify.hpp"
#include "runtime/check.hpp"
#include "tessera/ops/rowwise.hpp"

namespace tessera::ops::rowwise {
namespace {

using Shape = std::vector<int64_t>;
constexpr double kEps = 1e-5;

struct Spec {
  Shape shape;
  Layout in = Layout::contiguous;   // input (backward: grad_output and residual_out)
  Layout res = Layout::contiguous;  // residual (backward: grad_residual_out)
  Layout out = Layout::contiguous;  // out and residual_out (backward: grad_input)
  bool weight = true, bias = true;  // bias: add_layer_norm only
  bool inplace = false;  // out is input, residual_out is residual (backward: grad_input is grad_residual_out)
  bool dres = true;      // backward: grad_residual_out given
  bool grad_in = true, grad_params = true;  // backward: which gradients are asked for
};

Shape last(const Spec& s) { return {s.shape.back()}; }
Shape leading(const Spec& s) { return Shape(s.shape.begin(), s.shape.end() - 1); }

std::string case_name(DType dt, const Spec& s, bool backward) {
  std::string name = std::string(dtype_name(dt)) + " " + shape_str(s.shape);
  if (s.in != Layout::contiguous) name += std::string(" in:") + layout_name(s.in);
  if (s.res != Layout::contiguous) name += std::string(" res:") + layout_name(s.res);
  if (s.out != Layout::contiguous) name += std::string(" out:") + layout_name(s.out);
  if (s.inplace) name += " in place";
  name += s.weight ? (s.bias ? " w+b" : " w") : " no w";
  if (backward && !s.dres) name += " no grad_residual_out";
  if (backward && !s.grad_in) name += " no grad_input";
  if (backward && !s.grad_params) name += " no grad_weight/bias";
  return name;
}

TestTensor random(DType dt, const Shape& shape, Layout layout, double lo, double hi) {
  TestTensor t = make_tensor(dt, shape, layout);
  fill_random(t, lo, hi, nullptr);
  return t;
}

TestTensor poisoned(DType dt, const Shape& shape, Layout layout) {
  TestTensor t = make_tensor(dt, shape, layout);
  fill_poison(t, nullptr);
  return t;
}

VerifyResult run_forward(bool rms, DType dt, const Spec& s) {
  const char* op = rms ? "add_rms_norm" : "add_layer_norm";
  cudaStream_t stream = nullptr;
  TestTensor x = random(dt, s.shape, s.in, -2, 4);
  TestTensor r = random(dt, s.shape, s.res, -1, 3);  // the sum's mean is not 0: the variance is tested
  const bool bias = s.bias && !rms;
  TestTensor w, b;
  if (s.weight) w = random(dt, last(s), Layout::contiguous, -1, 2);
  if (bias) b = random(dt, last(s), Layout::contiguous, -1, 1);
  const HostCopy hx = to_host(x), hr = to_host(r);
  HostCopy hw, hb;
  if (s.weight) hw = to_host(w);
  if (bias) hb = to_host(b);
  const auto ref = rms ? reference::add_rms_norm(hx.view, hr.view, s.weight ? &hw.view : nullptr, kEps)
                       : reference::add_layer_norm(hx.view, hr.view, s.weight ? &hw.view : nullptr,
                                                   bias ? &hb.view : nullptr, kEps);
  TestTensor own_out, own_res;  // in place: out is x and residual_out is r
  if (!s.inplace) own_out = poisoned(dt, s.shape, s.out), own_res = poisoned(dt, s.shape, s.out);
  const TestTensor& out = s.inplace ? x : own_out;
  const TestTensor& res_out = s.inplace ? r : own_res;
  TestTensor mean = poisoned(DType::float32, leading(s), Layout::contiguous);
  TestTensor rstd = poisoned(DType::float32, leading(s), Layout::contiguous);
  const std::string name = case_name(dt, s, false);
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

// residual_out is random data of the dtype (what a forward stores); its statistics come from the
// double reference rounded to float32 as the forward stores them, and the reference backward
// uses exactly what the operator is given.
VerifyResult run_backward(bool rms, DType dt, const Spec& s) {
  const char* op = rms ? "add_rms_norm_backward" : "add_layer_norm_backward";
  cudaStream_t stream = nullptr;
  TestTensor x = random(dt, s.shape, s.in, -2, 6);
  TestTensor dy = random(dt, s.shape, s.in, -1, 1);
  TestTensor dres, w;
  if (s.dres) dres = random(dt, s.shape, s.res, -1, 1);
  if (s.weight) w = random(dt, last(s), Layout::contiguous, -1, 2);
  const HostCopy hx = to_host(x), hdy = to_host(dy);
  HostCopy hdres, hw;
  if (s.dres) hdres = to_host(dres);
  if (s.weight) hw = to_host(w);
  const TensorView* wv = s.weight ? &hw.view : nullptr;
  const TensorView* dv = s.dres ? &hdres.view : nullptr;

  auto to_float = [](std::vector<double> v) {
    for (double& e : v) e = static_cast<float>(e);
    return v;
  };
  TestTensor mean, rstd;
  if (rms) {
    rstd = upload(DType::float32, leading(s), to_float(reference::rms_norm(hx.view, 1, wv, kEps).rstd));
  } else {
    const auto fwd = reference::layer_norm(hx.view, 1, wv, nullptr, kEps);
    mean = upload(DType::float32, leading(s), to_float(fwd.mean));
    rstd = upload(DType::float32, leading(s), to_float(fwd.rstd));
  }
  const HostCopy hrstd = to_host(rstd);

  TestTensor own_dx, dw, db;  // in place: grad_input is grad_residual_out
  if (s.grad_in && !s.inplace) own_dx = poisoned(dt, s.shape, s.out);
  const TestTensor& dx = s.inplace ? dres : own_dx;
  const bool want_dw = s.grad_params && s.weight, want_db = s.grad_params && !rms;
  if (want_dw) dw = poisoned(dt, last(s), Layout::contiguous);
  if (want_db) db = poisoned(dt, last(s), Layout::contiguous);

  const std::string name = case_name(dt, s, true);
  const ErrorModel m = row_sums(s.shape, s.shape.back());
  std::vector<std::pair<std::string, VerifyResult>> parts;
  std::vector<double> ref_in, ref_w, ref_b;
  if (rms) {
    auto ref = reference::add_rms_norm_backward(hdy.view, dv, hx.view, hrstd.view, wv);
    ref_in = std::move(ref.grad_in), ref_w = std::move(ref.grad_weight);
    add_rms_norm_backward(dy.view, s.dres ? &dres.view : nullptr, x.view, rstd.view, s.weight ? &w.view : nullptr,
                          s.grad_in ? &dx.view : nullptr, want_dw ? &dw.view : nullptr, stream);
  } else {
    const HostCopy hmean = to_host(mean);
    auto ref = reference::add_layer_norm_backward(hdy.view, dv, hx.view, hmean.view, hrstd.view, wv);
    ref_in = std::move(ref.grad_in), ref_w = std::move(ref.grad_weight), ref_b = std::move(ref.grad_bias);
    add_layer_norm_backward(dy.view, s.dres ? &dres.view : nullptr, x.view, mean.view, rstd.view,
                            s.weight ? &w.view : nullptr, s.grad_in ? &dx.view : nullptr,
                            want_dw ? &dw.view : nullptr, want_db ? &db.view : nullptr, stream);
  }
  if (s.grad_in) parts.push_back({"grad_input", compare(op, name, dx, ref_in, stream, m)});
  if (want_dw) parts.push_back({"grad_weight", compare(op, name, dw, ref_w, stream, m)});
  if (want_db) parts.push_back({"grad_bias", compare(op, name, db, ref_b, stream, m)});
  return fold(op, name, parts);
}

std::vector<Spec> specs(bool backward) {
  const Layout S = Layout::strided, T = Layout::transposed, O = Layout::offset, C = Layout::contiguous;
  Spec no_wb{{64, 1024}};
  no_wb.weight = no_wb.bias = false;
  Spec w_only{{19, 999}};  // odd N: the V = 1 path
  w_only.bias = false;
  Spec inplace{{64, 1024}};
  inplace.inplace = true;
  Spec inplace_long{{2, 70000}};
  inplace_long.inplace = true;
  Spec inplace_strided{{64, 1000}, S, S};  // gathered, computed in scratch, scattered back
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
      {{64, 1000}, S},        // strided input: gathered
      {{256, 384}, C, T},     // transposed residual: gathered
      {{37, 1024}, O},        // misaligned input: V = 1
      {{37, 1024}, C, O},     // misaligned residual only: V = 1
      {{16, 512}, C, C, S},   // strided outputs: scattered back
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
  const std::vector<Spec> more = {
      no_dres, no_dres_long, dx_only, params_only,
      {{9, 70000}},     // long rows: dres added by the column kernel
      {{301, 40000}},   // long rows over several row ranges
      {{4, 8192}},      // staged (sm_90) or registers
      {{5, 3001}},      // V = 1, 4 elements per thread
      {{3, 6001}},      // V = 1, 8 elements per thread
      {{700, 2048}},    // several groups per CTA, several rows per group
      {{64, 1024}, C, S},  // strided grad_residual_out: gathered
  };
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

std::vector<VerifyCase> cases(bool rms, bool backward) {
  std::vector<VerifyCase> c;
  for (DType dt : kFloatTypes)
    for (const Spec& s : specs(backward))
      c.push_back({case_name(dt, s, backward), false, [=] {
                     return backward ? run_backward(rms, dt, s) : run_forward(rms, dt, s);
                   }});
  if (!backward) {  // more than 2^31 elements: 64-bit offsets everywhere
    const Spec large{{(int64_t(1) << 31) / 4096 + 1, 4096}};
    c.push_back({case_name(DType::bfloat16, large, false), true, [=] { return run_forward(rms, DType::bfloat16, large); }});
  }
  return c;
}

// Forward: input and residual [rows, N], weight [N] (and bias [N]); input and residual read,
// out and residual_out written, the statistics written. Backward: grad_output,
// grad_residual_out and residual_out [rows, N], (mean and) rstd [rows] in float32, weight [N];
// those read, grad_input, grad_weight (and grad_bias) written.
BenchShape bench_shape(bool rms, bool backward, DType dt, int64_t n) {
  const int64_t rows = bench_rows(n);
  const double t = static_cast<double>(dtype_size(dt)), r = static_cast<double>(rows), nn = static_cast<double>(n);
  const double params = rms ? 1 : 2;  // weight (and bias), or their gradients
  const double stats = rms ? 1 : 2;   // rstd (and mean): 4 bytes per row each
  BenchShape s;
  s.shape = shape_str({rows, n});
  if (!backward) {
    s.shapes = {{rows, n}, {rows, n}, {n}};
    if (!rms) s.shapes.push_back({n});
    s.bytes = 4 * r * nn * t + params * nn * t + stats * 4 * r;
  } else {
    s.shapes = {{rows, n}, {rows, n}, {rows, n}};
    if (!rms) s.shapes.push_back({rows});
    s.shapes.push_back({rows});
    s.shapes.push_back({n});
    s.bytes = 4 * r * nn * t + nn * t + params * nn * t + stats * 4 * r;
  }
  return s;
}

BenchCase bench(bool rms, bool backward, DType dt, int64_t n) {
  const BenchShape shape = bench_shape(rms, backward, dt, n);
  const Shape rows_n = shape.shapes[0];
  const Shape params = {n}, stats = {rows_n[0]};
  struct State { TestTensor x, r, w, b, out, res, mean, rstd, dy, dres, dx, dw, db; };
  auto st = std::make_shared<State>();
  State* s = st.get();
  s->x = random(dt, rows_n, Layout::contiguous, -2, 4);
  s->r = random(dt, rows_n, Layout::contiguous, -1, 3);
  s->w = random(dt, params, Layout::contiguous, -1, 2);
  s->out = make_tensor(dt, rows_n, Layout::contiguous);
  s->res = make_tensor(dt, rows_n, Layout::contiguous);
  s->rstd = make_tensor(DType::float32, stats, Layout::contiguous);
  if (!rms) {
    s->b = random(dt, params, Layout::contiguous, -1, 1);
    s->mean = make_tensor(DType::float32, stats, Layout::contiguous);
  }
  auto forward = [s, rms](cudaStream_t q) {
    if (rms) add_rms_norm(s->x.view, s->r.view, &s->w.view, kEps, s->out.view, s->res.view, &s->rstd.view, q);
    else
      add_layer_norm(s->x.view, s->r.view, &s->w.view, &s->b.view, kEps, s->out.view, s->res.view, &s->mean.view,
                     &s->rstd.view, q);
  };
  BenchCase c = bench_case(std::string(rms ? "add_rms_norm" : "add_layer_norm") + (backward ? "_backward" : ""), dt,
                           n, shape);
  if (!backward) {
    c.run = forward;
  } else {
    s->dy = random(dt, rows_n, Layout::contiguous, -1, 1);
    s->dres = random(dt, rows_n, Layout::contiguous, -1, 1);
    s->dx = make_tensor(dt, rows_n, Layout::contiguous);
    s->dw = make_tensor(dt, params, Layout::contiguous);
    if (!rms) s->db = make_tensor(dt, params, Layout::contiguous);
    forward(nullptr);  // residual_out and the statistics the backward is given
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    if (rms)
      c.run = [s](cudaStream_t q) {
        add_rms_norm_backward(s->dy.view, &s->dres.view, s->res.view, s->rstd.view, &s->w.view, &s->dx.view,
                              &s->dw.view, q);
      };
    else
      c.run = [s](cudaStream_t q) {
        add_layer_norm_backward(s->dy.view, &s->dres.view, s->res.view, s->mean.view, s->rstd.view, &s->w.view,
                                &s->dx.view, &s->dw.view, &s->db.view, q);
      };
  }
  c.state = st;
  return c;
}

const Registrar kRegistrar(25, [] {
  struct Entry {
    const char* name;
    bool rms, backward;
    const char* summary;
  };
  const Entry entries[] = {
      {"add_layer_norm", false, false, "residual_out = input + residual, then LayerNorm of it over the last dimension"},
      {"add_layer_norm_backward", false, true,
       "add_layer_norm backward: grad_input (of input and residual), grad_weight, grad_bias (deterministic)"},
      {"add_rms_norm", true, false, "residual_out = input + residual, then RMSNorm of it over the last dimension"},
      {"add_rms_norm_backward", true, true,
       "add_rms_norm backward: grad_input (of input and residual), grad_weight (deterministic)"},
  };
  std::vector<OpInfo> ops;
  for (const Entry& e : entries) {
    OpInfo op = op_info(e.name, e.summary);
    op.bench_sizes = {1024, 4096, 8192, 16384};
    op.verify_cases = [e] { return cases(e.rms, e.backward); };
    op.make_bench = [e](DType dt, int64_t n) { return bench(e.rms, e.backward, dt, n); };
    op.bench_shape = [e](DType dt, int64_t n) { return bench_shape(e.rms, e.backward, dt, n); };
    ops.push_back(op);
  }
  return ops;
});

}  // namespace
}  // namespace tessera::ops::rowwise
