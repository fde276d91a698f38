// Verify and bench cases for layer_norm, rms_norm and their backward functions, and their
// registration: what `tessera verify|bench|profile` run for them. The shapes walk every configuration of norm.cu (warp and
// CTA row groups, the backward tiers, the streaming kernels, the V = 1 path) and every layout
// path (gathered inputs, scattered outputs, strided statistics), with and without weight/bias.
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

struct Spec {
  Shape shape;
  int nnorm = 1;                       // normalized_ndim
  Layout in = Layout::contiguous;      // x (and grad_out)
  Layout out = Layout::contiguous;     // out (or grad_in)
  Layout stats = Layout::contiguous;   // mean and rstd
  bool weight = true, bias = true;     // bias: layer_norm only
  bool narrow = false;                 // x, grad_out, mean, rstd: views of dimension 1 cut short
                                       // by 2, so that rows are not uniformly strided
  bool grad_in = true, grad_params = true;  // backward: which gradients are asked for
  double lo = -2, hi = 6;              // x's range: a non-zero mean exercises the variance
  double offset = 0;                   // rms_norm's weight_offset (Gemma's 1 + w)
};

Shape leading(const Spec& s) { return Shape(s.shape.begin(), s.shape.end() - s.nnorm); }
Shape normalized(const Spec& s) { return Shape(s.shape.end() - s.nnorm, s.shape.end()); }
ErrorModel sums_of(const Spec& s) {
  int64_t n = 1;
  for (int64_t d : normalized(s)) n *= d;
  return row_sums(s.shape, n);
}

std::string case_name(DType dt, const Spec& s, bool backward) {
  std::string name = std::string(dtype_name(dt)) + " " + shape_str(s.shape);
  if (s.nnorm != 1) name += " normalized_ndim=" + std::to_string(s.nnorm);
  if (s.in != Layout::contiguous) name += std::string(" in:") + layout_name(s.in);
  if (s.out != Layout::contiguous) name += std::string(" out:") + layout_name(s.out);
  if (s.stats != Layout::contiguous) name += std::string(" stats:") + layout_name(s.stats);
  if (s.narrow) name += " narrowed";
  name += s.weight ? (s.bias ? " w+b" : " w") : " no w";
  if (backward && !s.grad_in) name += " no grad_in";
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

VerifyResult run_forward(bool rms, DType dt, const Spec& s) {
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
  const std::string name = case_name(dt, s, false);
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

// The saved statistics come from the double reference, rounded to float32 as the forward
// stores them; the reference backward then uses exactly what the operator is given.
VerifyResult run_backward(bool rms, DType dt, const Spec& s) {
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

  auto to_float = [](std::vector<double> v) {
    for (double& e : v) e = static_cast<float>(e);
    return v;
  };
  TestTensor mean, rstd;
  if (rms) {
    rstd = upload(DType::float32, leading(s), s.stats, s.narrow, to_float(reference::rms_norm(hx.view, s.nnorm, wv, kEps).rstd));
  } else {
    const auto fwd = reference::layer_norm(hx.view, s.nnorm, wv, nullptr, kEps);
    mean = upload(DType::float32, leading(s), s.stats, s.narrow, to_float(fwd.mean));
    rstd = upload(DType::float32, leading(s), s.stats, s.narrow, to_float(fwd.rstd));
  }
  const HostCopy hrstd = to_host(rstd);

  TestTensor dx, dw, db;
  if (s.grad_in) dx = output(dt, s.shape, s.out);
  const bool want_dw = s.grad_params && s.weight, want_db = s.grad_params && !rms;
  if (want_dw) dw = output(dt, normalized(s), Layout::contiguous);
  if (want_db) db = output(dt, normalized(s), Layout::contiguous);

  const std::string name = case_name(dt, s, true);
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

std::vector<Spec> specs(bool rms, bool backward) {
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

std::vector<VerifyCase> cases(bool rms, bool backward) {
  std::vector<VerifyCase> c;
  for (DType dt : kFloatTypes)
    for (const Spec& s : specs(rms, backward))
      c.push_back({case_name(dt, s, backward), false, [=] {
                     return backward ? run_backward(rms, dt, s) : run_forward(rms, dt, s);
                   }});
  if (!backward) {  // more than 2^31 elements: 64-bit offsets everywhere
    const Spec large{{(int64_t(1) << 31) / 4096 + 1, 4096}};
    c.push_back({case_name(DType::bfloat16, large, false), true, [=] { return run_forward(rms, DType::bfloat16, large); }});
  }
  return c;
}

// The inputs in the order of the signature. Forward: x [rows, N], weight [N] (and bias [N]).
// Backward: grad_out and x [rows, N], (mean and) rstd [rows] in float32, weight [N].
BenchShape bench_shape(bool rms, bool backward, DType dt, int64_t n) {
  const int64_t rows = bench_rows(n);
  const double t = static_cast<double>(dtype_size(dt)), r = static_cast<double>(rows), nn = static_cast<double>(n);
  const double params = rms ? 1 : 2;  // weight (and bias)
  const double stats = rms ? 1 : 2;   // rstd (and mean): 4 bytes per row each
  BenchShape s;
  s.shape = shape_str({rows, n});
  if (!backward) {
    s.shapes = {{rows, n}, {n}};
    if (!rms) s.shapes.push_back({n});
    // x read, out written; weight (and bias) read once; the statistics written.
    s.bytes = 2 * r * nn * t + params * nn * t + stats * 4 * r;
  } else {
    s.shapes = {{rows, n}, {rows, n}};
    if (!rms) s.shapes.push_back({rows});
    s.shapes.push_back({rows});
    s.shapes.push_back({n});
    // x and grad_out read, grad_in written; weight read; grad_weight (and grad_bias) written;
    // the statistics read.
    s.bytes = 3 * r * nn * t + nn * t + params * nn * t + stats * 4 * r;
  }
  return s;
}

BenchCase bench(bool rms, bool backward, DType dt, int64_t n) {
  const BenchShape shape = bench_shape(rms, backward, dt, n);
  const Shape rows_n = shape.shapes[backward ? 1 : 0];                        // x
  const Shape params = backward ? shape.shapes.back() : shape.shapes[1];      // weight, bias
  const Shape stats = {rows_n[0]};                                            // mean, rstd
  struct State { TestTensor x, w, b, out, mean, rstd, dy, dx, dw, db; };
  auto st = std::make_shared<State>();
  State* s = st.get();
  s->x = make_tensor(dt, rows_n, Layout::contiguous);
  s->w = make_tensor(dt, params, Layout::contiguous);
  s->out = make_tensor(dt, rows_n, Layout::contiguous);
  s->rstd = make_tensor(DType::float32, stats, Layout::contiguous);
  fill_random(s->x, -2, 6, nullptr);
  fill_random(s->w, -1, 2, nullptr);
  if (!rms) {
    s->b = make_tensor(dt, params, Layout::contiguous);
    s->mean = make_tensor(DType::float32, stats, Layout::contiguous);
    fill_random(s->b, -1, 1, nullptr);
  }
  auto forward = [s, rms](cudaStream_t q) {
    if (rms) rms_norm(s->x.view, 1, &s->w.view, kEps, 0.0, s->out.view, &s->rstd.view, q);
    else layer_norm(s->x.view, 1, &s->w.view, &s->b.view, kEps, s->out.view, &s->mean.view, &s->rstd.view, q);
  };
  BenchCase c = bench_case(std::string(rms ? "rms_norm" : "layer_norm") + (backward ? "_backward" : ""), dt, n, shape);
  if (!backward) {
    c.run = forward;
  } else {
    s->dy = make_tensor(dt, rows_n, Layout::contiguous);
    s->dx = make_tensor(dt, rows_n, Layout::contiguous);
    s->dw = make_tensor(dt, params, Layout::contiguous);
    fill_random(s->dy, -1, 1, nullptr);
    if (!rms) s->db = make_tensor(dt, params, Layout::contiguous);
    forward(nullptr);  // the saved statistics the backward is given
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    if (rms)
      c.run = [s](cudaStream_t q) {
        rms_norm_backward(s->dy.view, s->x.view, 1, s->rstd.view, &s->w.view, 0.0, &s->dx.view, &s->dw.view, q);
      };
    else
      c.run = [s](cudaStream_t q) {
        layer_norm_backward(s->dy.view, s->x.view, 1, s->mean.view, s->rstd.view, &s->w.view, &s->dx.view,
                            &s->dw.view, &s->db.view, q);
      };
  }
  c.state = st;
  return c;
}

const Registrar kRegistrar(20, [] {
  struct Entry {
    const char* name;
    bool rms, backward;
    const char* summary;
  };
  const Entry entries[] = {
      {"layer_norm", false, false, "LayerNorm over the trailing dimensions, as torch.nn.functional.layer_norm"},
      {"layer_norm_backward", false, true, "LayerNorm backward: grad_in, grad_weight, grad_bias (deterministic)"},
      {"rms_norm", true, false, "RMSNorm over the trailing dimensions, as torch.nn.functional.rms_norm"},
      {"rms_norm_backward", true, true, "RMSNorm backward: grad_in, grad_weight (deterministic)"},
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
