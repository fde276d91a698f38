// The op table: one description per op, registered by its own cases file; the order of the table
// does not depend on static-initialization order; the descriptions Python reads (bench shapes,
// bytes, tolerances) hold what the bench cases and verify use.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "ops/registry.hpp"
#include "ops/verify.hpp"
#include "testing.hpp"
#include "tessera/op.hpp"

namespace {

using tessera::DType;
using tessera::ErrorKind;
using tessera::ops::all_ops;
using tessera::ops::find_op;
using Shapes = std::vector<std::vector<int64_t>>;

// Families in a fixed order, each contiguous; within one, files by their order key and each file's
// entries as it lists them. Checked on the ops that exist today as a subsequence, so that a new op
// needs no edit here.
TEST(Registry, OrderIsFamilyThenFileThenEntry) {
  std::vector<std::string> names, families;
  for (const auto& op : all_ops()) {
    names.push_back(op.name);
    if (families.empty() || families.back() != op.family) families.push_back(op.family);
  }
  EXPECT_EQ(families, (std::vector<std::string>{"elementwise", "rowwise", "matrix", "attention", "loss", "moe", "set"}));
  const std::vector<std::string> known = {
      "add", "gelu", "gelu_backward", "gelu_tanh", "gelu_tanh_backward", "dropout", "dropout_backward", "copy",
      "softmax", "log_softmax", "softmax_backward", "log_softmax_backward",
      "layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward", "matmul",
      "attention", "attention_causal", "attention_backward", "cross_entropy", "isin", "isin_brute_force", "isin_sort", "isin_hash", "isin_bitmap",
  };
  std::size_t at = 0;
  for (const auto& n : names)
    if (at < known.size() && n == known[at]) ++at;
  EXPECT_EQ(at, known.size()) << "the known ops are missing or out of order";
  for (std::size_t i = 0; i < names.size(); ++i)
    for (std::size_t j = i + 1; j < names.size(); ++j) EXPECT_NE(names[i], names[j]);
}

TEST(Registry, EveryDescriptionIsComplete) {
  const std::string rows = "row length N (rows = min(4096, 2^26 / N))";
  for (const auto& op : all_ops()) {
    SCOPED_TRACE(op.name);
    const bool rotary = op.name.rfind("rotary_embedding", 0) == 0;  // attention's family, no FLOPs counted
    EXPECT_FALSE(op.summary.empty());
    EXPECT_FALSE(op.dtypes.empty());
    EXPECT_FALSE(op.bench_sizes.empty());
    const std::string meaning = op.name == "mlp" ? "M = K = D = F (swiglu: w_in [2F, K], w_out [D, F])"
                                : op.name == "float8_quantize"
                                    ? "columns K (rows M = 8192), row-wise with the transposed copy"
                                : op.name == "float8_quantize_gated"
                                    ? "columns K (rows M = 8192), SwiGLU's product row-wise with the transposed copy"
                                : op.family == "rowwise" ? rows
                                : op.family == "set"    ? "elements of both elements and test_elements"
                                : op.family == "matrix" ? "M = N = K"
                                : rotary ? "tokens n (n / 2048 or 1 sequences; 32 query and 8 key heads of 128)"
                                : op.family == "attention"
                                    ? "sequence length n (batch x heads = max(1, 16384 / n) x 32, head_dim 128)"
                                : op.name == "linear_cross_entropy" ? "classes V (N 8192 tokens, H 4096)"
                                : op.family == "loss" ? "classes V (rows: 8192, fewer where N V would pass 2^31)"
                                : op.family == "moe"  ? "tokens (k = 8, H = 2048)"
                                                      : "elements";
    EXPECT_EQ(op.size_meaning, meaning);
    const bool exact = op.family == "set";
    for (DType dt : op.dtypes) {
      EXPECT_EQ(op.tolerance(dt, {}), exact ? 0.0 : tessera::ops::default_tolerance(dt)) << tessera::dtype_name(dt);
      for (int64_t n : op.bench_sizes) {
        const auto s = op.bench_shape(dt, n);
        ASSERT_FALSE(s.shapes.empty());
        int64_t main = 1;
        for (int64_t d : s.shapes[0]) main *= d;
        EXPECT_GE(main, n) << "the main tensor holds at least `size` elements";
        EXPECT_FALSE(s.shape.empty());
        EXPECT_GE(s.bytes, static_cast<double>(main) * tessera::dtype_size(dt));
        if (op.name == "mlp") EXPECT_EQ(s.flops, 6.0 * double(n) * double(n) * double(n));  // two products
        else if (op.name.rfind("float8_quantize", 0) == 0) EXPECT_EQ(s.flops, 0.0);  // the matrix family's, memory-bound
        else if (op.family == "matrix") EXPECT_EQ(s.flops, 2.0 * double(n) * double(n) * double(n));
        else if (op.family == "attention" && !rotary) EXPECT_GT(s.flops, 0.0);  // 4 b h n^2 d, halved or scaled
        else if (op.name == "linear_cross_entropy") EXPECT_EQ(s.flops, 6.0 * 8192 * 4096 * double(n));
        else EXPECT_EQ(s.flops, 0.0);
      }
    }
  }
}

// The output rules (tessera/op.hpp): leading dimensions, broadcasts, and the errors that name the
// op and the argument.
TEST(Registry, OutputShapesByRule) {
  namespace out = tessera::out;
  tessera::OpDesc op;
  op.name = "norm";
  using V = std::vector<int64_t>;
  EXPECT_EQ(tessera::output_shape(op, out::like("out", "x"), {4, 5, 6}, {}), (V{4, 5, 6}));
  EXPECT_EQ(tessera::output_shape(op, out::mask("out", "x"), {3}, {}), (V{3}));
  EXPECT_EQ(tessera::output_shape(op, out::stats("rstd", "x", "weight"), {4, 5, 6}, {6}), (V{4, 5}));
  EXPECT_EQ(tessera::output_shape(op, out::stats("rstd", "x", "weight"), {4, 5, 6}, {5, 6}), (V{4}));
  EXPECT_EQ(tessera::output_shape(op, out::stats("rstd", "x", "weight"), {6}, {6}), (V{}));
  EXPECT_EQ(tessera::output_shape(op, out::broadcast("out", "a", "b"), {4, 1, 6}, {5, 1}), (V{4, 5, 6}));
  EXPECT_EQ(tessera::output_shape(op, out::broadcast("out", "a", "b"), {}, {2, 3}), (V{2, 3}));
  tessera::testing::expect_error([&] { tessera::output_shape(op, out::stats("rstd", "x", "weight"), {6}, {2, 6}); },
               ErrorKind::value, {"norm", "weight", "at most the 1 dimensions of 'x'", "2 dimensions"});
  tessera::testing::expect_error([&] { tessera::output_shape(op, out::broadcast("out", "a", "b"), {4, 3}, {5, 3}); },
               ErrorKind::value, {"norm", "'b'", "broadcastable with a's [4, 3]", "got [5, 3]"});
  // A fixed count of trailing dimensions (the add norms' last one); what a 0-d input lacks is the
  // library's to name.
  EXPECT_EQ(tessera::output_shape(op, out::stats("rstd", "x", 1), {4, 5, 6}, {}), (V{4, 5}));
  EXPECT_EQ(tessera::output_shape(op, out::stats("rstd", "x", 1), {}, {}), (V{}));
  EXPECT_TRUE(out::stats("rstd", "x", 1).internal);
  EXPECT_EQ(out::like("grad_weight", "weight").when("output_mask", 1).mask_index, 1);
}

// A Trailing rule's int[] argument: the trailing dimensions of its tensor, at least one.
TEST(Registry, TrailingDimensionsChecked) {
  tessera::OpDesc op;
  op.name = "layer_norm";
  const tessera::OpDesc::Trailing t{"normalized_shape", "input"};
  const int64_t shape[] = {2, 3, 4}, last[] = {4}, two[] = {3, 4}, wrong[] = {2, 4};
  tessera::check_trailing(op, t, shape, 3, last, 1);
  tessera::check_trailing(op, t, shape, 3, two, 2);
  tessera::testing::expect_error([&] { tessera::check_trailing(op, t, shape, 3, wrong, 2); }, ErrorKind::value,
                                 {"layer_norm", "'normalized_shape'", "trailing dimensions of the input's shape [2, 3, 4]",
                                  "1 to 3 of them", "got [2, 4]"});
  tessera::testing::expect_error([&] { tessera::check_trailing(op, t, shape, 3, last, 0); }, ErrorKind::value,
                                 {"layer_norm", "got []"});
  tessera::testing::expect_error([&] { tessera::check_trailing(op, t, shape, 0, last, 1); }, ErrorKind::value,
                                 {"a 0-d input has none"});
}

// The harness adds cases to the library's descriptions, under their names: every described op has
// them, in its family and for the dtypes its description says its kernels take.
TEST(Registry, EveryDescribedOpHasCases) {
  for (const tessera::OpDesc& d : tessera::op_descriptions()) {
    SCOPED_TRACE(d.name);
    const auto* op = find_op(d.name);
    ASSERT_NE(op, nullptr) << "no cases for a described op";
    EXPECT_EQ(op->family, d.family);
    EXPECT_EQ(std::set<DType>(op->dtypes.begin(), op->dtypes.end()), std::set<DType>(d.dtypes.begin(), d.dtypes.end()));
  }
}

// The error model of DESIGN.md (Testing): c * (u(out) + rounded + accumulate * sqrt(k)).
TEST(Registry, DefaultTolerancesFollowTheErrorModel) {
  using tessera::ops::default_tolerance;
  using tessera::ops::ErrorModel;
  EXPECT_EQ(tessera::ops::unit_roundoff(DType::float32), std::ldexp(1.0, -24));
  EXPECT_EQ(tessera::ops::unit_roundoff(DType::float16), std::ldexp(1.0, -11));
  EXPECT_EQ(tessera::ops::unit_roundoff(DType::bfloat16), std::ldexp(1.0, -8));
  EXPECT_EQ(tessera::ops::unit_roundoff(DType::int64), 0.0);
  const double u32 = std::ldexp(1.0, -24), u16 = std::ldexp(1.0, -11), ubf = std::ldexp(1.0, -8);
  // One rounding and a sum of one term: c (u(out) + u32).
  EXPECT_DOUBLE_EQ(default_tolerance(DType::bfloat16), 4 * (ubf + u32));
  EXPECT_DOUBLE_EQ(default_tolerance(DType::float32), 4 * (u32 + u32));
  // A float32 sum of 4096 terms: sqrt(4096) = 64 roundings' worth.
  ErrorModel dot;
  dot.k = 4096;
  EXPECT_DOUBLE_EQ(default_tolerance(DType::float32, dot), 4 * (u32 + 64 * u32));
  // An intermediate stored in float16 (a chunk of logits) bounds a float32 output by float16's step.
  ErrorModel chunked = dot;
  chunked.rounded = u16;
  chunked.c = 2;
  EXPECT_DOUBLE_EQ(default_tolerance(DType::float32, chunked), 2 * (u32 + u16 + 64 * u32));
  // Subnormal outputs: the reference's own rounding floor replaces u(out) where it is larger.
  ErrorModel tiny;
  tiny.floor = 1e-2;
  EXPECT_DOUBLE_EQ(default_tolerance(DType::float16, tiny), 4 * (1e-2 + u32));
  tiny.floor = 1e-6;
  EXPECT_DOUBLE_EQ(default_tolerance(DType::float16, tiny), 4 * (u16 + u32));
  // The bound grows with every term and with c.
  EXPECT_GT(default_tolerance(DType::float16, chunked), default_tolerance(DType::float32, chunked));
  EXPECT_LT(default_tolerance(DType::float16, ErrorModel{}), default_tolerance(DType::bfloat16, ErrorModel{}));
}

// `tessera verify --seed`: one seed draws the same inputs every run, another seed other inputs;
// seed 0 keeps the fixed draws.
TEST(Registry, VerifySeeds) {
  using tessera::ops::case_seed;
  using tessera::ops::set_verify_seed;
  set_verify_seed(0);
  EXPECT_EQ(case_seed(5), 5u);
  set_verify_seed(1);
  const uint64_t one = case_seed(5);
  EXPECT_NE(one, case_seed(6));
  set_verify_seed(2);
  EXPECT_NE(one, case_seed(5));
  set_verify_seed(1);
  EXPECT_EQ(one, case_seed(5));
  set_verify_seed(0);
}

TEST(Registry, BenchShapes) {
  const int64_t m = 1 << 20;
  auto add = find_op("add")->bench_shape(DType::float32, m);
  EXPECT_EQ(add.shapes, (Shapes{{m}, {m}}));
  EXPECT_EQ(add.shape, "[1048576]");
  EXPECT_EQ(add.bytes, 3.0 * 4 * m);

  auto gelu_bwd = find_op("gelu_tanh_backward")->bench_shape(DType::bfloat16, m);
  EXPECT_EQ(gelu_bwd.shapes, (Shapes{{m}, {m}}));
  EXPECT_EQ(gelu_bwd.bytes, 3.0 * 2 * m);
  EXPECT_EQ(find_op("dropout")->bench_shape(DType::float16, m).bytes, 2.0 * 2 * m);

  auto softmax = find_op("softmax")->bench_shape(DType::bfloat16, 1024);
  EXPECT_EQ(softmax.shapes, (Shapes{{4096, 1024}}));
  EXPECT_EQ(softmax.shape, "[4096, 1024]");
  EXPECT_EQ(softmax.bytes, 2.0 * 4096 * 1024 * 2);
  auto lsm_bwd = find_op("log_softmax_backward")->bench_shape(DType::float32, 262144);
  EXPECT_EQ(lsm_bwd.shapes, (Shapes{{256, 262144}, {256, 262144}}));
  EXPECT_EQ(lsm_bwd.bytes, 3.0 * 256 * 262144 * 4);

  // layer_norm: x, weight, bias; backward: grad_out, x, mean, rstd, weight.
  const int64_t n = 8192, r = 4096;  // 2^26 / 8192 = 8192 rows, capped at 4096
  auto ln = find_op("layer_norm")->bench_shape(DType::bfloat16, n);
  EXPECT_EQ(ln.shapes, (Shapes{{r, n}, {n}, {n}}));
  EXPECT_EQ(ln.bytes, 2.0 * r * n * 2 + 2.0 * n * 2 + 2.0 * 4 * r);
  auto rms_bwd = find_op("rms_norm_backward")->bench_shape(DType::float32, n);
  EXPECT_EQ(rms_bwd.shapes, (Shapes{{r, n}, {r, n}, {r}, {n}}));
  EXPECT_EQ(rms_bwd.bytes, 3.0 * r * n * 4 + 2.0 * n * 4 + 4.0 * r);
  EXPECT_EQ(find_op("layer_norm_backward")->bench_shape(DType::float32, n).shapes,
            (Shapes{{r, n}, {r, n}, {r}, {r}, {n}}));

  auto isin = find_op("isin_sort")->bench_shape(DType::int32, 1024);
  EXPECT_EQ(isin.shapes, (Shapes{{1024}, {1024}}));
  EXPECT_EQ(isin.shape, "[1024] in [1024]");
  EXPECT_EQ(isin.bytes, 2.0 * 1024 * 4 + 1024);
}

TEST(Registry, CompareRefusesAnUnregisteredOp) {
  tessera::ops::TestTensor out;  // never touched: the name is checked first
  tessera::testing::expect_error([&] { tessera::ops::compare("no_such_op", "case", out, {}, nullptr); },
                                 ErrorKind::value, {"compare", "argument 'op'", "no_such_op"});
}

// ---- GPU: the bench cases are built from the descriptions ------------------------------------

TEST(RegistryGpu, BenchCasesMatchTheirShapes) {
  TESSERA_REQUIRE_GPU();
  for (const auto& op : all_ops()) {
    const int64_t n = op.bench_sizes.front();
    for (DType dt : op.dtypes) {
      const auto shape = op.bench_shape(dt, n);
      const auto c = op.make_bench(dt, n);
      EXPECT_EQ(c.op, op.name);
      EXPECT_EQ(c.dtype, tessera::dtype_name(dt));
      EXPECT_EQ(c.size, n);
      EXPECT_EQ(c.shape, shape.shape) << op.name;
      EXPECT_EQ(c.bytes, shape.bytes) << op.name;
      EXPECT_EQ(c.flops, shape.flops) << op.name;
    }
  }
}

}  // namespace
