// Verify and bench cases for grouped_mm, and its registration: what `tessera verify|bench|profile
// grouped_mm` run. The cases cover the four forms (rows, columns, depth, batched), both tiers of
// the rows form (the sm90 tier takes 16-bit operands whose rows are 16-byte aligned, K and N
// multiples of 8, other K- or N-contiguous; odd K or N fall back to the generic kernel), groups of
// every kind (unbalanced, empty first or last, one group holding every row, groups of one row,
// sizes not multiples of a tile, 128 groups), rows or columns past the last end (zeroed), bad
// offsets (a decreasing end, a negative one, an end past the extent: clamped), a float32 output
// for 16-bit inputs, and float32 inputs (exact FMAs). The reference multiplies the inputs as
// stored in double; the elements the rules make zero are checked to be exactly zero.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bench/host.hpp"
#include "ops/matrix/grouped_mm_reference.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "tessera/ops/matrix.hpp"

namespace tessera::ops {
namespace {

constexpr const char* kOp = "grouped_mm";
using Shape = std::vector<int64_t>;

enum class Form { rows, columns, depth, batched };

const char* form_name(Form f) {
  switch (f) {
    case Form::rows: return "rows";
    case Form::columns: return "columns";
    case Form::depth: return "depth";
    case Form::batched: return "batched";
  }
  return "?";
}

// The dtypes a spec runs on (a mask).
constexpr unsigned kF32 = 1, kF16 = 2, kBF16 = 4, k16 = kF16 | kBF16, kAll = kF32 | k16;

struct GroupedSpec {
  Form form;
  int64_t m, k, n;
  std::vector<int64_t> offs;      // as given: the groups' cumulative ends (batched: none)
  Layout a = Layout::contiguous;  // transposed: input's last two dimensions swapped (M contiguous)
  Layout b = Layout::transposed;  // transposed: other K-contiguous ([.., N, K] storage)
  bool out_f32 = false;
  std::string note;               // what the groups exercise, for the name
  unsigned dtypes = kAll;
  int64_t batch = 0;              // batched: the groups
};

// The cumulative ends of groups of `sizes`.
std::vector<int64_t> ends(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> e(sizes.size());
  int64_t at = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) e[i] = at += sizes[i];
  return e;
}

// `groups` groups of `size` each.
std::vector<int64_t> equal(int64_t groups, int64_t size) { return std::vector<int64_t>(std::size_t(groups), size); }

int64_t groups_of(const GroupedSpec& s) { return s.form == Form::batched ? s.batch : int64_t(s.offs.size()); }

Shape input_shape(const GroupedSpec& s) {
  return s.form == Form::columns || s.form == Form::batched ? Shape{groups_of(s), s.m, s.k} : Shape{s.m, s.k};
}
Shape other_shape(const GroupedSpec& s) {
  return s.form == Form::rows || s.form == Form::batched ? Shape{groups_of(s), s.k, s.n} : Shape{s.k, s.n};
}
Shape out_shape(const GroupedSpec& s) {
  return s.form == Form::depth || s.form == Form::batched ? Shape{groups_of(s), s.m, s.n} : Shape{s.m, s.n};
}

std::string describe(DType dt, const GroupedSpec& s) {
  std::string d = std::string(dtype_name(dt)) + " " + form_name(s.form) + " " + shape_str(input_shape(s)) + " " +
                  layout_name(s.a) + " @ " + shape_str(other_shape(s)) + " " + layout_name(s.b);
  if (s.form != Form::batched)
    d += s.offs.size() <= 8 ? " offs " + shape_str(s.offs) : " " + std::to_string(s.offs.size()) + " groups";
  if (s.out_f32) d += " -> float32";
  if (!s.note.empty()) d += " (" + s.note + ")";
  return d;
}

// The elements the rules make zero (rows or columns past the last end, out[g] of an empty K range)
// must be exactly zero: a small value left there would hardly move the relative error.
void check_zeroed(VerifyResult& r, const TestTensor& out, const std::vector<char>& zeroed) {
  const HostCopy h = to_host(out);
  int64_t wrong = 0, count = 0;
  for (int64_t i = 0; i < h.view.numel(); ++i)
    if (zeroed[std::size_t(i)]) {
      ++count;
      if (!(host::load_double(h.view, i) == 0.0)) ++wrong;
    }
  if (r.passed && wrong > 0) {
    r.passed = false;
    r.detail = std::to_string(wrong) + " of the " + std::to_string(count) +
               " elements outside every group (or of an empty K range) not zero";
  }
}

VerifyResult run(DType dt, const GroupedSpec& s) {
  cudaStream_t stream = nullptr;
  const DType out_dt = s.out_f32 ? DType::float32 : dt;
  TestTensor a = make_tensor(dt, input_shape(s), s.a), b = make_tensor(dt, other_shape(s), s.b);
  TestTensor out = make_tensor(out_dt, out_shape(s), Layout::contiguous);
  fill_random(a, -1, 1, stream);
  fill_random(b, -1, 1, stream);
  fill_poison(out, stream);
  const bool grouped = s.form != Form::batched;
  TestTensor offs;
  if (grouped) offs = upload(DType::int32, {groups_of(s)}, std::vector<double>(s.offs.begin(), s.offs.end()));
  const HostCopy ha = to_host(a), hb = to_host(b), hc = to_host(out);
  const HostCopy hoffs = grouped ? to_host(offs) : HostCopy{};
  std::vector<char> zeroed;
  const std::vector<double> ref =
      reference::grouped_mm(ha.view, hb.view, grouped ? &hoffs.view : nullptr, hc.view, &zeroed);
  grouped_mm(a.view, b.view, grouped ? &offs.view : nullptr, out.view, stream);
  // The sums behind an output are dot products of length K (the depth form: its group's range of K,
  // the longest), in float32, of the inputs as stored: as matmul's.
  ErrorModel model;
  model.k = s.k;
  if (s.form == Form::depth) {
    const std::vector<int64_t> e = reference::grouped_ends(hoffs.view, s.k);
    model.k = 0;
    for (std::size_t g = 0; g < e.size(); ++g) model.k = std::max(model.k, e[g] - (g ? e[g - 1] : 0));
  }
  VerifyResult r = compare(kOp, describe(dt, s), out, ref, stream, model);
  check_zeroed(r, out, zeroed);
  return r;
}

std::vector<VerifyCase> cases() {
  const Layout C = Layout::contiguous, T = Layout::transposed;
  const Form R = Form::rows, Co = Form::columns, D = Form::depth, B = Form::batched;
  const std::vector<int64_t> unbalanced = {0, 1, 300, 7, 129, 0, 64, 499};  // 1000 in all
  // 128 groups of 0 to 31 rows ((37 i + 3) mod 32: each size 4 times), 1984 in all.
  std::vector<int64_t> many(128);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = int64_t((37 * i + 3) % 32);
  const std::vector<GroupedSpec> specs = {
      // The rows form (a Mixture-of-Experts layer's forward): K and N multiples of 8 (the sm90
      // tier for 16-bit inputs), other K-contiguous (transposed) and N-contiguous.
      {R, 1000, 128, 256, ends(equal(8, 125)), C, T, false, "balanced"},
      {R, 1000, 128, 256, ends(equal(8, 125)), C, C, false, "balanced", k16},
      {R, 1000, 128, 256, ends(unbalanced), C, T, false, "unbalanced, empty groups"},
      {R, 1000, 128, 256, ends(unbalanced), C, C, false, "unbalanced, empty groups", k16},
      {R, 1000, 128, 256, ends(unbalanced), C, T, true, "unbalanced, empty groups", k16},
      // Rows of 200 or 144 bytes, K = 30: the generic kernel.
      {R, 1000, 100, 72, ends(unbalanced), C, T, false, "odd K and N", k16},
      {R, 1000, 100, 72, ends(unbalanced), C, C, false, "odd K and N"},
      {R, 1000, 100, 72, ends(unbalanced), C, C, true, "odd K and N", kBF16},
      {R, 300, 30, 72, ends({100, 50, 0, 150}), C, T, false, "K = 30", kBF16 | kF32},
      // Groups of every kind.
      {R, 512, 128, 256, ends({0, 200, 312, 0}), C, T, false, "empty first and last", kBF16},
      {R, 512, 128, 256, {0, 0, 512, 512}, C, T, false, "one group holds every row", kBF16},
      {R, 64, 128, 256, ends(equal(64, 1)), C, T, false, "one row each", kBF16},
      {R, 840, 256, 128, ends({130, 250, 390, 70}), C, C, false, "groups not multiples of 128", kBF16},
      {R, 333, 128, 256, {333}, C, T, false, "one group", kBF16},
      {R, 333, 128, 256, {200}, C, T, false, "one group, tail rows zero", kF16},
      {R, 1000, 128, 256, ends({200, 0, 300, 200}), C, T, false, "tail rows zero"},
      {R, 2000, 128, 256, ends(many), C, T, false, "0 to 31 rows, tail rows zero", k16},
      {R, 512, 128, 256, ends({0, 1, 200, 7, 129, 0, 64, 111}), T, T, false, "input column-major", kBF16},
      {R, 2048, 1024, 512, ends({0, 300, 17, 129, 256, 1, 64, 200, 255, 128, 0, 250, 97, 3, 200, 148}), C, T, false,
       "unbalanced, empty groups", kBF16},
      {R, 64, 0, 128, {30, 64}, C, T, false, "K = 0", kBF16},
      // Bad offsets, clamped: end[g] = min(max(offs[g], end[g - 1]), M).
      {R, 1000, 128, 256, {-4, 300, 200, 700}, C, T, false, "negative and decreasing ends, tail rows zero"},
      {R, 1000, 128, 256, {300, 700, 1200, 1500}, C, C, false, "ends past M", kBF16 | kF32},
      // The columns form: input[g] times other's columns of group g (the rows form on the
      // transposes); columns past the last end zero.
      {Co, 256, 128, 1000, ends(unbalanced), C, T, false, "unbalanced, empty groups"},
      {Co, 256, 128, 1000, ends(unbalanced), C, C, false, "unbalanced, empty groups", k16},
      {Co, 256, 128, 1000, ends(unbalanced), C, T, true, "unbalanced, empty groups", kBF16},
      {Co, 200, 100, 72, ends({30, 0, 30}), C, T, false, "odd K and N, tail columns zero"},
      {Co, 256, 128, 1000, {-1, 500, 400, 1200}, C, T, false, "negative and decreasing ends, an end past N", kBF16},
      // The depth form (the experts' weight gradient, input = x^T column-major): out[g] over
      // group g's range of K; an empty range gives zeros.
      {D, 128, 1000, 256, ends(unbalanced), T, C, false, "empty groups, K groups not multiples of 16"},
      {D, 128, 1000, 256, ends(unbalanced), C, T, false, "empty groups, K groups not multiples of 16", kBF16},
      {D, 128, 1000, 256, ends(unbalanced), T, C, true, "empty groups, K groups not multiples of 16", k16},
      {D, 100, 300, 72, {50, 40, 250, 400}, T, C, false, "a decreasing end, an end past K", kBF16 | kF32},
      {D, 64, 300, 128, {100, 100, 250}, T, C, false, "an empty group, K past the last end", kF16},
      {D, 256, 4096, 512, ends({512, 0, 1000, 33, 1024, 15, 900, 612}), T, C, false, "long K groups", kBF16},
      // The batched form (offs None): matmul's batched product.
      {B, 130, 96, 200, {}, C, T, false, "", kAll, 3},
      {B, 130, 96, 200, {}, C, T, true, "", kBF16, 3},
      {B, 256, 128, 256, {}, C, C, false, "", kBF16, 4},
  };
  std::vector<VerifyCase> v;
  for (DType dt : {DType::float32, DType::float16, DType::bfloat16}) {
    const unsigned bit = dt == DType::float32 ? kF32 : dt == DType::float16 ? kF16 : kBF16;
    for (const GroupedSpec& s : specs)
      if (s.dtypes & bit) v.push_back({describe(dt, s), false, [=] { return run(dt, s); }});
  }
  return v;
}

// The rows form at M = N = K = size in groups of 128 rows (G = size / 128, balanced: a
// Mixture-of-Experts layer's tokens, 128 an expert), other K-contiguous (the experts' weights
// stored [G, N, K], as torch keeps them). The bytes: input, the G weights and out, and the
// offsets; FLOPs 2 M K N (each row times one expert's weight).
int64_t bench_groups(int64_t n) { return std::max<int64_t>(1, n / 128); }

BenchShape shape(DType dt, int64_t n) {
  const int64_t g = bench_groups(n);
  BenchShape s;
  s.shapes = {{n, n}, {g, n, n}, {g}};
  const std::string d = std::to_string(n), gs = std::to_string(g);
  s.shape = "[" + d + ", " + d + "] @ [" + gs + ", " + d + ", " + d + "]^T offs [" + gs + "]";
  s.bytes = (2.0 + double(g)) * double(n) * double(n) * double(dtype_size(dt)) + 4.0 * double(g);
  s.flops = 2.0 * double(n) * double(n) * double(n);
  return s;
}

BenchCase bench(DType dt, int64_t n) {
  const BenchShape sh = shape(dt, n);
  const int64_t g = bench_groups(n);
  struct State { TestTensor a, b, offs, out; };
  auto st = std::make_shared<State>();
  st->a = make_tensor(dt, sh.shapes[0], Layout::contiguous);
  st->b = make_tensor(dt, sh.shapes[1], Layout::transposed);
  st->out = make_tensor(dt, {n, n}, Layout::contiguous);
  const std::vector<int64_t> e = ends(equal(g, n / g));
  std::vector<double> offs(e.begin(), e.end());
  offs.back() = double(n);  // the last group takes what n / g leaves
  st->offs = upload(DType::int32, {g}, offs);
  fill_random(st->a, -1, 1, nullptr);
  fill_random(st->b, -1, 1, nullptr);
  BenchCase c = bench_case(kOp, dt, n, sh);
  State* s = st.get();
  c.run = [s](cudaStream_t stream) { grouped_mm(s->a.view, s->b.view, &s->offs.view, s->out.view, stream); };
  c.state = st;
  return c;
}

const Registrar kRegistrar(12, [] {
  OpInfo op;
  op.name = kOp;
  op.bench_sizes = {1024, 2048, 4096};
  op.size_meaning = "M = N = K";
  op.tolerance = default_tolerance;
  op.verify_cases = cases;
  op.make_bench = bench;
  op.bench_shape = shape;
  return std::vector<OpInfo>{op};
});

}  // namespace
}  // namespace tessera::ops
